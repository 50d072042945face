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
use std::time::{Duration, SystemTime};

use edgewatch_proto::tier;
use edgewatch_proto::v1::{Event, Tier};
use edgewatch_queue::{FlushOutcome, PerTier, Queue};
use tokio::sync::{Notify, watch};

use edgewatch_samplers::deadline::{DeadlineConfig, DeadlineSampler};
use edgewatch_samplers::model::{ModelConfig, ModelWatcher};
use edgewatch_samplers::thermal::{
    SysfsInventory, SysfsReader, TegrastatsSource, ThermalConfig, ThermalSampler,
};
use edgewatch_samplers::{EventSink, Now};

use crate::config::Config;
use crate::ingest::{IngestServer, IngestStats};
use crate::placement;
use crate::status::{SnapshotView, SourceListWriter, SourceStatus, StatusWriter};
use crate::systemd::Notifier;
use crate::ticker::Ticker;
use crate::uplink::{Uplink, UplinkStats};

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
    /// The uplink could not start.
    #[error("uplink: {0}")]
    Uplink(#[from] crate::uplink::UplinkError),
    /// The local socket could not be opened.
    #[error("ingest socket: {0}")]
    Ingest(std::io::Error),
}

/// Durable sequence numbers per tier, as of the last flush.
pub type Durable = watch::Receiver<PerTier<u64>>;

/// The queue and the signals around it, shared by the tasks of the runtime.
#[derive(Clone)]
pub struct Shared {
    /// The queue itself.
    pub queue: Rc<RefCell<Queue>>,
    /// Wakes the flusher after an append.
    pub appended: Rc<Notify>,
    /// Wakes the uplink when new records became durable.
    pub durable_changed: Rc<Notify>,
    /// Durable sequence numbers.
    pub durable: Durable,
}

impl Shared {
    /// Appends an event and wakes the flusher. Errors are logged and counted by the queue.
    pub fn append(&self, tier: Tier, event: &Event) -> Result<u64, edgewatch_queue::AppendError> {
        let result = self
            .queue
            .borrow_mut()
            .append(tier, event, SystemTime::now());
        self.appended.notify_one();
        result
    }

    /// Waits until `seq` of `tier` is durable.
    pub async fn wait_durable(&self, tier: Tier, seq: u64) {
        let mut durable = self.durable.clone();
        let _ = durable
            .wait_for(|durable| {
                // Tier::Unspecified waits for debug's durability.
                let reached = *durable.at(tier::index(tier).unwrap_or(tier::DEBUG));
                reached >= seq
            })
            .await;
    }
}

/// Runs the agent until SIGTERM or SIGINT.
pub fn run(config: Config) -> Result<(), RunError> {
    placement::apply(&config.scheduling)?;
    let (queue, report) = Queue::open(config.queue.queue.get().clone(), SystemTime::now())?;
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
    let (durable_tx, durable_rx) = watch::channel(durable_of(&queue));
    let shared = Shared {
        queue: Rc::new(RefCell::new(queue)),
        appended: Rc::new(Notify::new()),
        durable_changed: Rc::new(Notify::new()),
        durable: durable_rx,
    };
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let uplink_stats = Rc::new(RefCell::new(UplinkStats::default()));
    let ingest_stats = Rc::new(RefCell::new(IngestStats::default()));

    let uplink = Uplink::new(
        config.uplink.clone(),
        config.machine.clone(),
        epoch,
        Rc::clone(&shared.queue),
        Rc::clone(&shared.durable_changed),
        Rc::clone(&uplink_stats),
    )?;
    let ingest = IngestServer::bind(&config.ingest, shared.clone(), Rc::clone(&ingest_stats))
        .map_err(RunError::Ingest)?;

    let flusher =
        tokio::task::spawn_local(flush_loop(shared.clone(), durable_tx, shutdown_rx.clone()));
    let uplink_task = tokio::task::spawn_local(uplink.run(shutdown_rx.clone()));
    let ingest_task = tokio::task::spawn_local(ingest.serve(shutdown_rx.clone()));
    let sources = Rc::new(RefCell::new(Vec::new()));
    let sampler = tokio::task::spawn_local(sample_loop(
        config.deadline.clone(),
        config.model.clone(),
        config.thermal.clone(),
        shared.clone(),
        Rc::clone(&sources),
        shutdown_rx.clone(),
    ));
    let health = tokio::task::spawn_local(health_loop(
        shared.clone(),
        Rc::clone(&uplink_stats),
        Rc::clone(&ingest_stats),
        shutdown_rx.clone(),
    ));
    let status = StatusWriter::new(config.status_file.clone());
    let reporter = tokio::task::spawn_local(report_loop(
        Rc::clone(&shared.queue),
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
    if let Err(error) = shared.queue.borrow_mut().flush(SystemTime::now()) {
        tracing::error!(%error, "The final flush failed.");
    }
    tracing::info!("Stopped.");
    Ok(())
}

fn durable_of(queue: &Queue) -> PerTier<u64> {
    PerTier {
        safety: queue.durable_seq(Tier::Safety),
        slo: queue.durable_seq(Tier::Slo),
        debug: queue.durable_seq(Tier::Debug),
    }
}

/// Group commit: flushes when the queue says a flush is due, wakes waiters and the uplink.
async fn flush_loop(
    shared: Shared,
    durable: watch::Sender<PerTier<u64>>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let next = shared.queue.borrow().next_flush_at();
        let wait = next.map(|at| {
            at.duration_since(SystemTime::now())
                .unwrap_or(Duration::ZERO)
        });
        tokio::select! {
            () = async {
                match wait {
                    Some(wait) => tokio::time::sleep(wait).await,
                    // Nothing pending: wait for an append, but wake now and then for expiry,
                    // status snapshots and store retries.
                    None => { let _ = tokio::time::timeout(Duration::from_secs(1), shared.appended.notified()).await; }
                }
            } => {}
            _ = shutdown.changed() => return,
        }
        let now = SystemTime::now();
        if !shared.queue.borrow().flush_due(now) {
            continue;
        }
        let outcome: Result<FlushOutcome, _> = shared.queue.borrow_mut().flush(now);
        match outcome {
            Ok(outcome) => {
                durable.send_if_modified(|current| {
                    let changed = *current != outcome.durable;
                    *current = outcome.durable;
                    changed
                });
                if outcome.committed {
                    shared.durable_changed.notify_one();
                }
            }
            Err(error) => {
                tracing::warn!(%error, "A queue flush failed; it is retried.");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Writes the status file every second.
async fn report_loop(
    queue: Rc<RefCell<Queue>>,
    mut status: StatusWriter,
    uplink: Rc<RefCell<UplinkStats>>,
    ingest: Rc<RefCell<IngestStats>>,
    sources: Rc<RefCell<Vec<SourceStatus>>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let started = SystemTime::now();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        queue
            .borrow_mut()
            .refresh_status_snapshot(SystemTime::now());
        let (uplink, ingest, sources) = (uplink.borrow(), ingest.borrow(), sources.borrow());
        let snapshot = SnapshotView::now(started, &uplink, &ingest, &sources);
        if let Err(error) = status.write(&snapshot) {
            tracing::warn!(%error, "The status file could not be written.");
        }
    }
}

/// Sends an `AgentHealth` event to the debug tier every minute.
async fn health_loop(
    shared: Shared,
    uplink: Rc<RefCell<UplinkStats>>,
    ingest: Rc<RefCell<IngestStats>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut reporter = crate::health::HealthReporter::new(SystemTime::now());
    let mut tick = tokio::time::interval(crate::health::HEALTH_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is immediate: report once at start.
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        let now = SystemTime::now();
        let queue = shared.queue.borrow().status(now);
        let event = reporter.build(
            now,
            crate::ingest::monotonic_ns(),
            &queue,
            &uplink.borrow(),
            &ingest.borrow(),
        );
        if let Err(error) = shared.append(Tier::Debug, event) {
            tracing::debug!(%error, "The health report was not queued.");
        }
    }
}

/// The queue as the samplers' sink.
struct QueueSink {
    shared: Shared,
    refused: u64,
}

impl EventSink for QueueSink {
    fn emit(&mut self, tier: Tier, event: &Event) {
        if let Err(error) = self.shared.append(tier, event) {
            // The queue counts and reports what it refuses; one log line per hundred here.
            if self.refused.is_multiple_of(100) {
                tracing::warn!(%error, ?tier, refused = self.refused, "The queue refused a sampled event.");
            }
            self.refused += 1;
        }
    }
}

/// Wall and monotonic time, read once per tick.
pub fn now() -> Now {
    Now {
        wall_unix_ns: SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)),
        monotonic_ns: crate::ingest::monotonic_ns(),
    }
}

/// The samplers and their sources, driven from one task: control-loop probes and the model
/// manifest on the deadline sampler's interval, sysfs on its own, tegrastats lines as they come.
async fn sample_loop(
    deadline: DeadlineConfig,
    model: Option<ModelConfig>,
    thermal: ThermalConfig,
    shared: Shared,
    sources: Rc<RefCell<Vec<SourceStatus>>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut sampler = DeadlineSampler::new(deadline, now());
    let mut watcher = model.map(ModelWatcher::new);
    let mut sink = QueueSink { shared, refused: 0 };
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
        now(),
        None,
    );
    // One clock for the probes and sysfs, each polled when its interval is due.
    let probe_interval = sampler.poll_interval();
    let sysfs_interval = thermal.sysfs.poll_interval;
    let period = match sysfs {
        Some(_) => probe_interval.min(sysfs_interval),
        None => probe_interval,
    };
    let armed_at = std::time::Instant::now();
    let mut clock = SampleClock::new(period);
    let mut probes_due = armed_at + probe_interval;
    let mut sysfs_due = armed_at + sysfs_interval;
    let mut last_status = std::time::Instant::now() - Duration::from_secs(1);
    let mut last_line_at: Option<std::time::Instant> = None;
    loop {
        let stop = tokio::select! {
            () = clock.tick() => {
                let at = std::time::Instant::now();
                if at >= probes_due {
                    probes_due = next_due(probes_due, probe_interval, at);
                    let now = now();
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
                    thermal_sampler.on_sysfs(reader.read(), now(), model, &mut sink);
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
                last_line_at = Some(std::time::Instant::now());
                false
            }
            _ = shutdown.changed() => true,
        };
        if stop {
            let model = watcher.as_ref().and_then(ModelWatcher::current);
            thermal_sampler.flush(now(), model, &mut sink);
            if let Some(source) = tegrastats.as_mut() {
                source.shutdown().await;
            }
            return;
        }
        if last_status.elapsed() >= Duration::from_secs(1) {
            last_status = std::time::Instant::now();
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

/// The sampling loop's clock: a timerfd (see [`crate::ticker`]), or tokio's interval if the
/// kernel refuses one.
enum SampleClock {
    TimerFd(Ticker),
    Tokio(tokio::time::Interval),
}

impl SampleClock {
    fn new(period: Duration) -> Self {
        match Ticker::new(period) {
            Ok(ticker) => Self::TimerFd(ticker),
            Err(error) => {
                tracing::warn!(%error, "No timerfd; sampling on the runtime's timers.");
                let mut interval = tokio::time::interval(period.max(crate::ticker::MIN_PERIOD));
                interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                Self::Tokio(interval)
            }
        }
    }

    async fn tick(&mut self) {
        match self {
            Self::TimerFd(ticker) => {
                if let Err(error) = ticker.tick().await {
                    tracing::warn!(%error, "The sampling timerfd failed; sampling on the runtime's timers.");
                    *self = Self::Tokio(tokio::time::interval(ticker.period()));
                }
            }
            Self::Tokio(interval) => {
                interval.tick().await;
            }
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
    let now = now();
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
