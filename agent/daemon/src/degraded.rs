//! Degraded mode: what the agent tells about a queue store it cannot use (a failing eMMC's EIO, a
//! full disk, a directory it cannot create), while it keeps running instead of exiting into a
//! restart loop.
//!
//! ```text
//! store fails to open or commit ─► queue: safety held in memory (queue.safety_hold_records),
//!                                         SLO/debug refused and counted, reopen with backoff
//!        │                                 (the flusher attempts when the queue says)
//!        ├─► status file `store` section, every second          ([`StoreView`])
//!        ├─► local clients: "unavailable … held in memory"      (ingest, via `spool`)
//!        └─► one AgentHealth naming the fault, in the safety tier ([`FaultReports`]): held with
//!            the safety events, sent once the store is back and a link exists
//! store back ─► held safety events written once, losses reported, health back to debug
//! ```
//!
//! Invariants:
//! - Nothing here decides about the store: the queue holds, refuses, counts and retries; this
//!   module only reports what the queue says ([`edgewatch_queue::Queue::store_fault`]).
//! - One health report per fault goes to the safety tier (so that it is held, not refused);
//!   every other report stays in the debug tier.
//! - Building the status view allocates nothing: it borrows from the queue.

use std::time::SystemTime;

use edgewatch_proto::v1::Tier;
use edgewatch_queue::StoreFault;
use serde::Serialize;

use crate::clock::unix_ms;

/// The `store` section of the status file, borrowed from the queue.
#[derive(Debug, Serialize)]
pub struct StoreView<'a> {
    /// False while the store cannot be opened or written.
    pub available: bool,
    /// What failed last (empty while available).
    pub fault: &'a str,
    /// When it became unavailable (ms since the Unix epoch).
    pub since_unix_ms: Option<u64>,
    /// Failed attempts to open or write it since then.
    pub attempts: u32,
    /// When the next attempt to reopen it is due (ms since the Unix epoch).
    pub next_attempt_unix_ms: Option<u64>,
    /// Safety events held in memory, and the most that are held.
    pub held_safety: usize,
    /// `queue.safety_hold_records`.
    pub hold_capacity: usize,
    /// True until the store was opened once since the agent started (no epoch yet).
    pub never_opened: bool,
}

impl<'a> StoreView<'a> {
    /// The view of `fault` (`None`: the store works), with the hold's capacity.
    pub fn of(fault: Option<StoreFault<'a>>, hold_capacity: usize) -> Self {
        match fault {
            None => Self {
                available: true,
                fault: "",
                since_unix_ms: None,
                attempts: 0,
                next_attempt_unix_ms: None,
                held_safety: 0,
                hold_capacity,
                never_opened: false,
            },
            Some(fault) => Self {
                available: false,
                fault: fault.reason,
                since_unix_ms: Some(unix_ms(fault.since)),
                attempts: fault.attempts,
                next_attempt_unix_ms: Some(unix_ms(fault.next_attempt)),
                held_safety: fault.held_safety,
                hold_capacity: fault.hold_capacity,
                never_opened: fault.never_opened,
            },
        }
    }
}

/// Routes the agent's health reports: the first one while the store is unavailable goes to the
/// safety tier (held in memory, so the fault reaches the cloud once the store is back), every
/// other one to the tier health reports usually travel in.
#[derive(Debug, Default)]
pub struct FaultReports {
    /// The fault (by its start) already reported in the safety tier.
    reported: Option<SystemTime>,
}

impl FaultReports {
    /// True if `fault` has not been reported in the safety tier yet.
    pub fn is_new(&self, fault: &StoreFault<'_>) -> bool {
        self.reported != Some(fault.since)
    }

    /// The tier of the next health report, given the store's fault now and the tier health
    /// reports `usually` travel in.
    pub fn tier(&mut self, fault: Option<&StoreFault<'_>>, usually: Tier) -> Tier {
        match fault {
            Some(fault) if self.reported != Some(fault.since) => {
                self.reported = Some(fault.since);
                Tier::Safety
            }
            _ => usually,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn fault(since_s: u64) -> StoreFault<'static> {
        let since = SystemTime::UNIX_EPOCH + Duration::from_secs(since_s);
        StoreFault {
            reason: "store I/O failed: Input/output error (os error 5)",
            since,
            attempts: 2,
            next_attempt: since + Duration::from_secs(3),
            held_safety: 7,
            hold_capacity: 4096,
            never_opened: false,
        }
    }

    #[test]
    fn one_health_report_per_fault_goes_to_the_safety_tier() {
        let mut reports = FaultReports::default();
        assert_eq!(reports.tier(None, Tier::Slo), Tier::Slo);
        assert!(reports.is_new(&fault(100)));
        assert_eq!(reports.tier(Some(&fault(100)), Tier::Slo), Tier::Safety);
        assert!(!reports.is_new(&fault(100)));
        assert_eq!(reports.tier(Some(&fault(100)), Tier::Slo), Tier::Slo);
        assert_eq!(reports.tier(None, Tier::Slo), Tier::Slo);
        assert_eq!(
            reports.tier(Some(&fault(500)), Tier::Slo),
            Tier::Safety,
            "a new fault"
        );
    }

    #[test]
    fn the_status_view_shows_the_fault_as_the_queue_tracks_it() {
        let view = StoreView::of(Some(fault(100)), 4096);
        assert!(!view.available);
        assert_eq!(view.since_unix_ms, Some(100_000));
        assert_eq!(view.next_attempt_unix_ms, Some(103_000));
        assert_eq!((view.attempts, view.held_safety), (2, 7));
        let view = StoreView::of(None, 4096);
        assert!(view.available && view.fault.is_empty());
        assert_eq!(view.hold_capacity, 4096);
    }
}
