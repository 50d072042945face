//! `edgewatch-agent run`: places the process, opens the queue, and runs every task on one
//! current-thread runtime until SIGTERM. Wiring only: each task lives in its own module; this one
//! starts them in order and stops them in order.
//!
//! ```text
//! placement (cores, SCHED_IDLE, idle I/O) ─► queue open (quarantine if corrupt; without its
//!                                              store if it cannot be opened: degraded) ─► runtime:
//!   spool::Flusher         group commit (≤ 10 ms for safety appends by default); durable signal;
//!                          reopens an unavailable store when the queue says
//!   drain::Drain           drains the queue over MQTT
//!   compaction             compacts the queue file after a backlog, the copy on its own thread
//!   ingest::IngestServer   the local socket
//!   sampling::sample_loop  probes, model and sysfs on one tick, tegrastats lines as they come
//!   status::write_loop     status file every second
//!   health::report_loop    agent health to the SLO tier every minute
//!   this task              SIGTERM/SIGINT, systemd READY and WATCHDOG
//! SIGTERM ─► the socket stops accepting and reading; samplers hand in what they hold; the
//!            flusher commits every append at once; drain waits briefly for PUBACKs
//!         ─► every accepted submission answered once durable ─► flusher stops: final flush
//!         ─► exit 0
//! ```
//!
//! Invariants:
//! - The agent never runs on a control-loop core and never runs at normal priority when
//!   `scheduling.idle_priority` is set: placement failures stop it before anything starts.
//! - A queue store that cannot be opened or written (not corruption) never stops the agent:
//!   it runs degraded ([`crate::degraded`]) until the store is back. Only a bad configuration
//!   and another agent on the same queue stop it.
//! - One thread does all the work; the queue is shared by reference inside it (the [`Spool`]),
//!   never locked. It and the blocking threads (the compaction's) share one malloc arena
//!   ([`MALLOC_ARENAS`]), so that what either freed is used again, not kept per thread.
//! - Whatever the tasks left pending is flushed after they stopped, before the process exits:
//!   the samplers' last counters and the states they keep for the next run among it.
//! - The flusher stops last: every task that waits for durability (the socket's replies above
//!   all) has finished before it, so no accepted submission goes unanswered on SIGTERM.

use std::cell::RefCell;
use std::rc::Rc;

use edgewatch_queue::Queue;
use tokio::sync::watch;

use crate::clock;
use crate::compaction;
use crate::config::Config;
use crate::drain::{Drain, DrainError, DrainStats};
use crate::ingest::{IngestServer, IngestStats};
use crate::placement;
use crate::spool::Spool;
use crate::status::StatusWriter;
use crate::systemd::Notifier;
use crate::{health, sampling, status};

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
    Drain(#[from] DrainError),
    /// The local socket could not be opened.
    #[error("ingest socket: {0}")]
    Ingest(std::io::Error),
}

/// Runs the agent until SIGTERM or SIGINT.
pub fn run(config: Config) -> Result<(), RunError> {
    limit_malloc_arenas();
    placement::apply(&config.scheduling)?;
    let (queue, report) = Queue::open_or_hold(config.queue.queue.get().clone(), clock::wall())?;
    if let Some(reason) = &report.unavailable {
        tracing::error!(%reason, "The queue store cannot be opened; the agent runs without it, \
            holding safety events in memory, and retries it with backoff.");
    }
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

/// Most malloc arenas glibc may create: one, shared by the runtime's thread and the blocking
/// threads (the compaction's copy, closing a replaced store), so that what either freed is used
/// again by the other.
pub const MALLOC_ARENAS: i32 = 1;

/// Caps glibc's malloc arenas at [`MALLOC_ARENAS`]. By default a thread that meets contention
/// gets an arena of its own (up to 8 per core), which keeps what it freed: draining a 1 GiB
/// backlog, through a compaction, 9 anonymous mappings outside the main heap held 19.9 MiB, and
/// the agent peaked at 37–40 MiB; with one arena, 30 MiB. Two arenas (the runtime's, and one for
/// every blocking thread) saved nothing: the blocking threads' arena held the same 19.9 MiB
/// (`docs/benchmarks.md`, "Where the agent's memory goes"). The cost is one lock for both sides'
/// allocations past the per-thread cache, held for the length of one malloc or free. No effect
/// with another libc.
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt takes no pointers and is thread-safe; it sets a parameter that applies to
    // arenas created afterwards, and runs before the runtime's blocking threads exist.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, MALLOC_ARENAS);
    }
}

async fn serve(config: Config, queue: Queue, epoch: u64) -> Result<(), RunError> {
    let (spool, flusher) = Spool::new(queue);
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let (stop_flusher, flusher_stop) = watch::channel(false);
    let drain_stats = Rc::new(RefCell::new(DrainStats::default()));
    let ingest_stats = Rc::new(RefCell::new(IngestStats::default()));

    let drain = Drain::new(
        config.uplink.clone(),
        config.machine.clone(),
        epoch,
        spool.clone(),
        Rc::clone(&drain_stats),
    )?;
    let ingest = IngestServer::bind(&config.ingest, spool.clone(), Rc::clone(&ingest_stats))
        .map_err(RunError::Ingest)?;

    let flusher_task = tokio::task::spawn_local(flusher.run(shutdown_rx.clone(), flusher_stop));
    let drain_task = tokio::task::spawn_local(drain.run(shutdown_rx.clone()));
    let ingest_task = tokio::task::spawn_local(ingest.serve(shutdown_rx.clone()));
    let sources = Rc::new(RefCell::new(Vec::new()));
    let sampling_task = tokio::task::spawn_local(sampling::sample_loop(
        config.deadline.clone(),
        config.model.clone(),
        config.thermal.clone(),
        spool.clone(),
        Rc::clone(&sources),
        shutdown_rx.clone(),
    ));
    let compaction_task = tokio::task::spawn_local(compaction::compaction_loop(
        spool.clone(),
        shutdown_rx.clone(),
    ));
    let health_task = tokio::task::spawn_local(health::report_loop(
        spool.clone(),
        Rc::clone(&drain_stats),
        Rc::clone(&ingest_stats),
        shutdown_rx.clone(),
    ));
    let status = StatusWriter::new(config.status_file.clone());
    let status_task = tokio::task::spawn_local(status::write_loop(
        spool.clone(),
        status,
        Rc::clone(&drain_stats),
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
    let _ = sampling_task.await;
    let _ = health_task.await;
    if let Ok(Err(error)) = drain_task.await {
        tracing::warn!(%error, "The uplink stopped with an error.");
    }
    let _ = status_task.await;
    let _ = compaction_task.await;
    // Whatever the tasks left pending becomes durable before exit: the flusher's final flush.
    let _ = stop_flusher.send(true);
    let _ = flusher_task.await;
    drop(spool);
    tracing::info!("Stopped.");
    Ok(())
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
