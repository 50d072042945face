//! The sampling loop: the samplers and their sources driven from one task. Control-loop probes
//! and the model manifest are polled on the deadline sampler's interval, sysfs on its own,
//! tegrastats lines handled as they come; what the samplers emit goes to the spool.
//!
//! ```text
//! Periodic tick ─┬─ probes due? ─► model watcher tick, deadline poll, thermal tick ─┐
//!  (the shorter  └─ sysfs due?  ─► thermal on_sysfs ───────────────────────────────┤
//!   interval)                                                                      ├─► SamplerSink
//! tegrastats line ───────────────► thermal on_tegrastats ──────────────────────────┘     (spool)
//! ```
//!
//! Invariants:
//! - One timer for probes and sysfs; each is polled when its own interval is due, and intervals
//!   missed while the loop was busy are skipped, not caught up.
//! - A source that cannot be opened (sysfs, tegrastats) is logged once and sampling goes on
//!   without it.
//! - The source list for the status file is rewritten at most once a second, in place: no
//!   allocation once the list has its shape.
//! - Every sampler hands back what it holds on shutdown, before the daemon's last flush: the
//!   deadline sampler reads the probes once more and emits every series and the autonomy
//!   seconds, the thermal sampler its counters; then the tegrastats child is stopped.
//! - At start the samplers take back what an earlier run kept in the queue's key-value area, so
//!   that a loop still run by the same producer is counted on exactly; each pass makes room in
//!   the queue first, so its events and the states kept after them are committed together.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use edgewatch_samplers::deadline::{DeadlineConfig, DeadlineSampler, DeadlineSemantics};
use edgewatch_samplers::model::{ModelConfig, ModelWatcher};
use edgewatch_samplers::thermal::{
    SysfsInventory, SysfsReader, TegrastatsSource, ThermalConfig, ThermalSampler,
};
use tokio::sync::watch;

use crate::clock::{self, Periodic};
use crate::spool::{SamplerSink, Spool};
use crate::status::{SourceListWriter, SourceStatus};

/// The samplers and their sources, driven from one task: control-loop probes and the model
/// manifest on the deadline sampler's interval, sysfs on its own, tegrastats lines as they come.
pub async fn sample_loop(
    deadline: DeadlineConfig,
    model: Option<ModelConfig>,
    thermal: ThermalConfig,
    spool: Spool,
    sources: Rc<RefCell<Vec<SourceStatus>>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut sampler = DeadlineSampler::new(deadline, clock::now());
    let mut watcher = model.map(ModelWatcher::new);
    {
        let queue = spool.queue();
        sampler.restore(|key| queue.kv(key));
        if let Some(watcher) = watcher.as_mut() {
            watcher.restore(queue.kv(ModelWatcher::KEPT_KEY));
        }
    }
    let mut sink = SamplerSink::new(spool);
    let mut sysfs = match SysfsReader::open(&thermal.sysfs) {
        Ok(reader) => Some(reader),
        Err(error) => {
            tracing::warn!(%error, "sysfs cannot be read; thermal sampling uses tegrastats only.");
            None
        }
    };
    let mut tegrastats = match TegrastatsSource::new(&thermal.tegrastats) {
        Ok(source) => Some(source),
        Err(error) => {
            tracing::warn!(%error, "tegrastats cannot be used; thermal sampling uses sysfs only.");
            None
        }
    };
    let empty_inventory = SysfsInventory::default();
    let mut thermal_sampler = ThermalSampler::new(
        &thermal,
        sysfs
            .as_ref()
            .map_or(&empty_inventory, SysfsReader::inventory),
        clock::now(),
        None,
    );
    // One clock for the probes and sysfs, each polled when its interval is due.
    let probe_interval = sampler.poll_interval();
    let sysfs_interval = thermal.sysfs.poll_interval;
    let period = match sysfs {
        Some(_) => probe_interval.min(sysfs_interval),
        None => probe_interval,
    };
    let armed_at = clock::instant();
    let mut tick = Periodic::new(period);
    let mut probes_due = armed_at + probe_interval;
    let mut sysfs_due = armed_at + sysfs_interval;
    let mut last_status = clock::instant() - Duration::from_secs(1);
    let mut last_line_at: Option<Instant> = None;
    loop {
        let stop = tokio::select! {
            () = tick.tick() => {
                let at = clock::instant();
                if at >= probes_due {
                    probes_due = next_due(probes_due, probe_interval, at);
                    sink.make_room();
                    let now = clock::now();
                    if let Some(watcher) = watcher.as_mut() {
                        watcher.tick(now, &mut sink);
                    }
                    let model = watcher.as_ref().and_then(ModelWatcher::current);
                    sampler.poll(now, model, &mut sink);
                    thermal_sampler.tick(now, model, &mut sink);
                }
                if let Some(reader) = sysfs.as_mut().filter(|_| at >= sysfs_due) {
                    sysfs_due = next_due(sysfs_due, sysfs_interval, at);
                    sink.make_room();
                    let model = watcher.as_ref().and_then(ModelWatcher::current);
                    thermal_sampler.on_sysfs(reader.read(), clock::now(), model, &mut sink);
                }
                false
            }
            event = async {
                match tegrastats.as_mut() {
                    Some(source) => source.next().await,
                    None => std::future::pending().await,
                }
            } => {
                let model = watcher.as_ref().and_then(ModelWatcher::current);
                thermal_sampler.on_tegrastats(&event, model, &mut sink);
                last_line_at = Some(clock::instant());
                false
            }
            _ = shutdown.changed() => true,
        };
        if stop {
            sink.make_room();
            let now = clock::now();
            let model = watcher.as_ref().and_then(ModelWatcher::current);
            sampler.flush(now, model, &mut sink);
            thermal_sampler.flush(now, model, &mut sink);
            if let Some(source) = tegrastats.as_mut() {
                source.shutdown().await;
            }
            return;
        }
        if last_status.elapsed() >= Duration::from_secs(1) {
            last_status = clock::instant();
            let mut list = sources.borrow_mut();
            write_sources(
                &mut SourceListWriter::new(&mut list),
                &sampler,
                watcher.as_ref(),
                tegrastats.as_ref(),
                sysfs.as_ref(),
                last_line_at,
            );
        }
    }
}

/// The next due time after `at`: one interval on, or more when ticks were missed (skipped, not
/// caught up).
fn next_due(due: Instant, interval: Duration, at: Instant) -> Instant {
    let next = due + interval;
    if next > at { next } else { at + interval }
}

/// Refreshes the source list for the status file, rewriting its strings in place (no
/// allocation once the list has its shape).
fn write_sources(
    list: &mut SourceListWriter<'_>,
    sampler: &DeadlineSampler,
    watcher: Option<&ModelWatcher>,
    tegrastats: Option<&TegrastatsSource>,
    sysfs: Option<&SysfsReader>,
    last_line_at: Option<Instant>,
) {
    use std::fmt::Write as _;
    let now = clock::now();
    for source in sampler.status(now) {
        let entry = list.entry();
        let _ = write!(entry.name, "probe:{}", source.loop_name);
        let _ = write!(entry.state, "{:?}", source.state);
        entry.state.make_ascii_lowercase();
        if source.semantics == DeadlineSemantics::Legacy {
            entry
                .state
                .push_str(" (probe ABI 1: deadline misses not measured)");
        }
        entry.last_sample_age_s = source.last_sample_age.map(|age| age.as_secs_f64());
    }
    if let Some(watcher) = watcher {
        let status = watcher.status();
        let entry = list.entry();
        let _ = write!(entry.name, "model:{}", status.manifest.display());
        let _ = match (status.problem, status.hashing, status.current) {
            (Some(problem), _, _) => entry.state.write_str(problem),
            (None, Some(_), _) => entry.state.write_str("hashing"),
            (None, None, Some(current)) => {
                write!(entry.state, "{} {}", current.name, current.version)
            }
            (None, None, None) => entry.state.write_str("waiting"),
        };
    }
    if let Some(source) = tegrastats {
        let status = source.status();
        let entry = list.entry();
        entry.name.push_str("tegrastats");
        let _ = write!(
            entry.state,
            "{} (samples {}, malformed {}, restarts {})",
            if status.running { "running" } else { "stopped" },
            status.samples,
            status.malformed,
            status.restarts
        );
        entry.last_sample_age_s = last_line_at.map(|at| at.elapsed().as_secs_f64());
    }
    if let Some(reader) = sysfs {
        let status = reader.status();
        let entry = list.entry();
        entry.name.push_str("sysfs");
        let _ = write!(
            entry.state,
            "polls {}, read errors {}, files {}",
            status.polls, status.read_errors, status.open_files
        );
    }
}
