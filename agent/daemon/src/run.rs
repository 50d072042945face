//! `edgewatch-agent run`: places the process, opens the queue, and runs every task on one
//! current-thread runtime until SIGTERM.
//!
//! ```text
//! placement (cores, SCHED_IDLE, idle I/O) ─► queue open (quarantine if corrupt) ─► runtime:
//!   flusher   group commit: ≤ 10 ms for safety appends, ≤ 1 s for the rest; publishes durable seqs
//!   uplink    drains the queue over MQTT
//!   ingest    the local socket
//!   samplers  probes, thermal, model (each on its own timer)
//!   reporter  status file every second, agent health to the debug tier every minute, watchdog
//! SIGTERM ─► stop accepting ─► uplink waits briefly for PUBACKs ─► final flush ─► exit 0
//! ```
//!
//! Invariants:
//! - The agent never runs on a control-loop core and never runs at normal priority when
//!   `scheduling.idle_priority` is set: placement failures stop it before anything starts.
//! - One thread does all the work; the queue is shared by reference inside it, never locked.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use edgewatch_proto::v1::Tier;
use edgewatch_queue::Queue;
use tokio::sync::watch;

use edgewatch_samplers::deadline::{DeadlineConfig, DeadlineSampler};
use edgewatch_samplers::model::{ModelConfig, ModelWatcher};
use edgewatch_samplers::thermal::{
    SysfsInventory, SysfsReader, TegrastatsSource, ThermalConfig, ThermalSampler,
};

use crate::clock::{self, Periodic};
use crate::config::Config;
use crate::drain::{Drain, DrainStats};
use crate::ingest::{IngestServer, IngestStats};
use crate::placement;
use crate::spool::{SamplerSink, Spool};
use crate::status::{SnapshotView, SourceListWriter, SourceStatus, StatusWriter};
use crate::systemd::Notifier;

/// Why the agent stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The process could not be placed as configured.
    #[error("placement: {0}")]
    Placement(#[from] placement::PlacementError),
    /// The queue could not be opened (even after quarantining a bad store).
    #[error("queue: {0}")]
    Queue(#[from] edgewatch_queue::QueueError),
    /// The runtime could not be built.
    #[error("runtime: {0}")]
    Runtime(std::io::Error),
    /// The drain could not start.
    #[error("uplink: {0}")]
    Drain(#[from] crate::drain::DrainError),
    /// The local socket could not be opened.
    #[error("ingest socket: {0}")]
    Ingest(std::io::Error),
}

/// Runs the agent until SIGTERM or SIGINT.
pub fn run(config: Config) -> Result<(), RunError> {
    placement::apply(&config.scheduling)?;
    let (queue, report) = Queue::open(config.queue.queue.get().clone(), clock::wall())?;
    if let Some(quarantined) = &report.quarantined {
        tracing::error!(moved_to = %quarantined.moved_to.display(), reason = %quarantined.reason, epoch = report.epoch, "The queue store would not open; it was moved aside and a new queue started.");
    }
    tracing::info!(
        epoch = report.epoch,
        safety = report.records.safety,
        slo = report.records.slo,
        debug = report.records.debug,
        "Queue open."
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(RunError::Runtime)?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, serve(config, queue, report.epoch))
}

async fn serve(config: Config, queue: Queue, epoch: u64) -> Result<(), RunError> {
    let (spool, flusher) = Spool::new(queue);
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let uplink_stats = Rc::new(RefCell::new(DrainStats::default()));
    let ingest_stats = Rc::new(RefCell::new(IngestStats::default()));

    let uplink = Drain::new(
        config.uplink.clone(),
        config.machine.clone(),
        epoch,
        spool.clone(),
        Rc::clone(&uplink_stats),
    )?;
    let ingest = IngestServer::bind(&config.ingest, spool.clone(), Rc::clone(&ingest_stats))
        .map_err(RunError::Ingest)?;

    let flusher = tokio::task::spawn_local(flusher.run(shutdown_rx.clone()));
    let uplink_task = tokio::task::spawn_local(uplink.run(shutdown_rx.clone()));
    let ingest_task = tokio::task::spawn_local(ingest.serve(shutdown_rx.clone()));
    let sources = Rc::new(RefCell::new(Vec::new()));
    let sampler = tokio::task::spawn_local(sample_loop(
        config.deadline.clone(),
        config.model.clone(),
        config.thermal.clone(),
        spool.clone(),
        Rc::clone(&sources),
        shutdown_rx.clone(),
    ));
    let health = tokio::task::spawn_local(health_loop(
        spool.clone(),
        Rc::clone(&uplink_stats),
        Rc::clone(&ingest_stats),
        shutdown_rx.clone(),
    ));
    let status = StatusWriter::new(config.status_file.clone());
    let reporter = tokio::task::spawn_local(report_loop(
        spool.clone(),
        status,
        Rc::clone(&uplink_stats),
        Rc::clone(&ingest_stats),
        Rc::clone(&sources),
        shutdown_rx.clone(),
    ));

    let notifier = Notifier::from_env();
    notifier.ready();
    tracing::info!(machine = %config.machine.id, site = %config.machine.site, "The agent is running.");
    wait_for_signal(&notifier).await;
    notifier.stopping();
    tracing::info!("Stopping: finishing in-flight work.");
    let _ = shutdown_tx.send(true);

    let _ = ingest_task.await;
    let _ = sampler.await;
    let _ = health.await;
    if let Ok(Err(error)) = uplink_task.await {
        tracing::warn!(%error, "The uplink stopped with an error.");
    }
    let _ = reporter.await;
    let _ = flusher.await;
    // Whatever the tasks left pending becomes durable before exit.
    if let Err(error) = spool.queue_mut().flush(clock::wall()) {
        tracing::error!(%error, "The final flush failed.");
    }
    tracing::info!("Stopped.");
    Ok(())
}

/// Writes the status file every second.
async fn report_loop(
    spool: Spool,
    mut status: StatusWriter,
    uplink: Rc<RefCell<DrainStats>>,
    ingest: Rc<RefCell<IngestStats>>,
    sources: Rc<RefCell<Vec<SourceStatus>>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let started = clock::wall();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        spool.queue_mut().refresh_status_snapshot(clock::wall());
        let (uplink, ingest, sources) = (uplink.borrow(), ingest.borrow(), sources.borrow());
        let snapshot = SnapshotView::now(started, &uplink, &ingest, &sources);
        if let Err(error) = status.write(&snapshot) {
            tracing::warn!(%error, "The status file could not be written.");
        }
    }
}

/// Sends an `AgentHealth` event to the debug tier every minute.
async fn health_loop(
    spool: Spool,
    uplink: Rc<RefCell<DrainStats>>,
    ingest: Rc<RefCell<IngestStats>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut reporter = crate::health::HealthReporter::new(clock::wall());
    let mut tick = tokio::time::interval(crate::health::HEALTH_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is immediate: report once at start.
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        let now = clock::wall();
        let queue = spool.queue().status(now);
        let event = reporter.build(
            now,
            clock::monotonic_ns(),
            &queue,
            &uplink.borrow(),
            &ingest.borrow(),
        );
        if let Err(error) = spool.append(Tier::Debug, event) {
            tracing::debug!(%error, "The health report was not queued.");
        }
    }
}

/// The samplers and their sources, driven from one task: control-loop probes and the model
/// manifest on the deadline sampler's interval, sysfs on its own, tegrastats lines as they come.
async fn sample_loop(
    deadline: DeadlineConfig,
    model: Option<ModelConfig>,
    thermal: ThermalConfig,
    spool: Spool,
    sources: Rc<RefCell<Vec<SourceStatus>>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut sampler = DeadlineSampler::new(deadline, clock::now());
    let mut watcher = model.map(ModelWatcher::new);
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
    let mut last_line_at: Option<std::time::Instant> = None;
    loop {
        let stop = tokio::select! {
            () = tick.tick() => {
                let at = clock::instant();
                if at >= probes_due {
                    probes_due = next_due(probes_due, probe_interval, at);
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
            let model = watcher.as_ref().and_then(ModelWatcher::current);
            thermal_sampler.flush(clock::now(), model, &mut sink);
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
fn next_due(
    due: std::time::Instant,
    interval: Duration,
    at: std::time::Instant,
) -> std::time::Instant {
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
    last_line_at: Option<std::time::Instant>,
) {
    use std::fmt::Write as _;
    let now = clock::now();
    for source in sampler.status(now) {
        let entry = list.entry();
        let _ = write!(entry.name, "probe:{}", source.loop_name);
        let _ = write!(entry.state, "{:?}", source.state);
        entry.state.make_ascii_lowercase();
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

async fn wait_for_signal(notifier: &Notifier) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("Signal handlers could not be installed; running until killed.");
        std::future::pending::<()>().await;
        return;
    };
    let mut watchdog = notifier.watchdog_interval().map(tokio::time::interval);
    loop {
        tokio::select! {
            _ = term.recv() => return,
            _ = int.recv() => return,
            _ = async {
                match &mut watchdog {
                    Some(interval) => { interval.tick().await; }
                    None => std::future::pending().await,
                }
            } => notifier.watchdog(),
        }
    }
}
