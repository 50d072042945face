//! The agent's own health, reported upstream: an `AgentHealth` event in [`HEALTH_TIER`] every
//! [`HEALTH_INTERVAL`], so an operator sees a machine's queue, uplink and footprint without
//! logging in to it (the gateway keeps its backlog figures as series for the fleet view).
//! [`HealthReporter`] builds the event; [`report_loop`] is the task that queues it. While the
//! queue's store is unavailable the event names the fault, and the first such event goes to the
//! safety tier (held in memory until the store is back: [`crate::degraded`]).
//!
//! Invariants:
//! - Health reports travel in the SLO tier, never the debug tier: the debug tier is drained last
//!   and evicted first, so a machine back from a partition (or with a refused debug topic) would
//!   report its backlog last, or lose the reports to eviction, exactly when they matter.
//! - The event is built in one reused structure: after the first report, reporting does not
//!   allocate.
//! - Reading the process's own figures costs two small reads (`/proc/self/statm`, `getrusage`).

use std::cell::RefCell;
use std::io::Read;
use std::rc::Rc;
use std::time::{Duration, SystemTime};

use edgewatch_proto::tier::TIERS;
use edgewatch_proto::v1::{AgentHealth, Event, Tier, TierHealth, event};
use edgewatch_queue::{QueueStatus, StoreFault};
use tokio::sync::watch;

use crate::clock;
use crate::degraded::FaultReports;
use crate::drain::DrainStats;
use crate::ingest::IngestStats;
use crate::spool::Spool;

/// How often the agent reports its health.
pub const HEALTH_INTERVAL: Duration = Duration::from_secs(60);
/// How soon a store fault is reported after the queue notices it.
pub const FAULT_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// The tier health reports travel in: drained after safety records and with the SLO counters,
/// in order, and evicted only after the debug tier (`docs/events.md`, "Agent health").
pub const HEALTH_TIER: Tier = Tier::Slo;

/// Builds `AgentHealth` events.
pub struct HealthReporter {
    started: SystemTime,
    event: Event,
    statm: Vec<u8>,
}

impl HealthReporter {
    /// A reporter for an agent started at `started`.
    pub fn new(started: SystemTime) -> Self {
        let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|id| id.trim().to_owned())
            .unwrap_or_default();
        let tiers = TIERS
            .map(|tier| TierHealth {
                tier: tier as i32,
                ..TierHealth::default()
            })
            .to_vec();
        Self {
            started,
            event: Event {
                kind: Some(event::Kind::AgentHealth(AgentHealth {
                    agent_version: env!("CARGO_PKG_VERSION").to_owned(),
                    boot_id,
                    tiers,
                    ..AgentHealth::default()
                })),
                ..Event::default()
            },
            statm: Vec::with_capacity(128),
        }
    }

    /// The health event as of `now`.
    pub fn build(
        &mut self,
        now: SystemTime,
        monotonic_ns: u64,
        queue: &QueueStatus,
        store_fault: Option<&StoreFault<'_>>,
        drain: &DrainStats,
        ingest: &IngestStats,
    ) -> &Event {
        let rss_bytes = self.rss_bytes();
        self.event.event_time_unix_ns = clock::unix_ns(now);
        self.event.monotonic_ns = monotonic_ns;
        if let Some(event::Kind::AgentHealth(health)) = &mut self.event.kind {
            health.uptime_seconds = now
                .duration_since(self.started)
                .map_or(0.0, |d| d.as_secs_f64());
            health.rss_bytes = rss_bytes;
            health.cpu_seconds = cpu_seconds();
            health.offline_window_seconds = queue
                .offline_window
                .map_or(f64::INFINITY, |window| window.as_secs_f64());
            health.publishes_refused = drain.refused;
            health.reconnects = drain.disconnects;
            health.local_rejected = ingest.rejected;
            health.store_fault.clear();
            health.store_fault_seconds = 0.0;
            health.store_held_safety = 0;
            if let Some(fault) = store_fault {
                health.store_fault.push_str(fault.reason);
                health.store_fault_seconds = now
                    .duration_since(fault.since)
                    .map_or(0.0, |d| d.as_secs_f64());
                health.store_held_safety = fault.held_safety as u64;
            }
            for (slot, (_, tier)) in health.tiers.iter_mut().zip(queue.tiers.iter()) {
                slot.records = tier.records;
                slot.bytes = tier.bytes;
                slot.oldest_age_seconds = tier.oldest_age.map_or(0.0, |age| age.as_secs_f64());
                slot.evicted = tier.evicted;
                slot.expired = tier.expired;
                slot.corrupt = tier.corrupt;
            }
        }
        &self.event
    }

    /// The event the last [`HealthReporter::build`] built.
    pub fn event(&self) -> &Event {
        &self.event
    }

    fn rss_bytes(&mut self) -> u64 {
        self.statm.clear();
        let read = std::fs::File::open("/proc/self/statm")
            .and_then(|mut file| file.read_to_end(&mut self.statm));
        if read.is_err() {
            return 0;
        }
        // Second field: resident pages.
        let resident = std::str::from_utf8(&self.statm)
            .ok()
            .and_then(|text| text.split_ascii_whitespace().nth(1))
            .and_then(|pages| pages.parse::<u64>().ok())
            .unwrap_or(0);
        // SAFETY: sysconf has no memory preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        resident * u64::try_from(page).unwrap_or(4096)
    }
}

/// Sends an `AgentHealth` event to [`HEALTH_TIER`] every [`HEALTH_INTERVAL`], the first at once,
/// and one to the safety tier within [`FAULT_CHECK_INTERVAL`] of a store fault, until
/// `shutdown` turns true.
pub async fn report_loop(
    spool: Spool,
    drain: Rc<RefCell<DrainStats>>,
    ingest: Rc<RefCell<IngestStats>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut reporter = HealthReporter::new(clock::wall());
    let mut fault_reports = FaultReports::default();
    let mut tick = tokio::time::interval(HEALTH_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut look = tokio::time::interval(FAULT_CHECK_INTERVAL);
    look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is immediate: report once at start. Both intervals are ready at once then;
    // the report's tick goes first, so a store already faulted at start gets the one report (to
    // the safety tier) instead of a fault report and then a regular one that the store refuses.
    loop {
        let due = tokio::select! {
            biased;
            _ = tick.tick() => true,
            _ = look.tick() => false,
            _ = shutdown.changed() => return,
        };
        // Besides every interval, at once when the queue's store becomes unavailable.
        let new_fault = spool
            .queue()
            .store_fault()
            .is_some_and(|fault| fault_reports.is_new(&fault));
        if !due && !new_fault {
            continue;
        }
        let now = clock::wall();
        let tier = {
            let queue = spool.queue();
            let fault = queue.store_fault();
            reporter.build(
                now,
                clock::monotonic_ns(),
                &queue.status(now),
                fault.as_ref(),
                &drain.borrow(),
                &ingest.borrow(),
            );
            fault_reports.tier(fault.as_ref(), HEALTH_TIER)
        };
        if let Err(error) = spool.append(tier, reporter.event()) {
            tracing::debug!(%error, "The health report was not queued.");
        }
    }
}

/// User plus system CPU time of the process so far.
pub fn cpu_seconds() -> f64 {
    // SAFETY: rusage is plain data; getrusage fills the one we pass.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a valid pointer.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0.0;
    }
    let seconds = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_reports_the_process_and_the_queue() {
        let mut reporter = HealthReporter::new(SystemTime::now() - Duration::from_secs(5));
        let mut queue = QueueStatus::default();
        queue.tiers.debug.records = 42;
        let drain = DrainStats {
            refused: 2,
            ..DrainStats::default()
        };
        let event = reporter.build(
            SystemTime::now(),
            1,
            &queue,
            None,
            &drain,
            &IngestStats::default(),
        );
        let Some(event::Kind::AgentHealth(health)) = &event.kind else {
            panic!("not a health event");
        };
        assert!(health.uptime_seconds >= 5.0);
        assert!(health.rss_bytes > 1024 * 1024);
        assert_eq!(health.tiers[2].records, 42);
        assert_eq!(health.publishes_refused, 2);
        assert_eq!(health.agent_version, env!("CARGO_PKG_VERSION"));
    }
}
