//! The agent's ingest rate: one token bucket per tier, shared by every connection of the local
//! socket (sans-IO: time is an argument).
//!
//! ```text
//! connection 1 ─┐                       ┌─ safety bucket ─┐
//! connection 2 ─┼─ reserve(tier, now) ──┼─ slo bucket     ├─► wait, then admit
//! connection n ─┘                       └─ debug bucket ──┘
//! ```
//!
//! Invariants:
//! - Over any interval T, a tier admits at most `burst + rate·T` submissions, however many
//!   connections submit: a connection waits the time its reservation returns before admitting.
//! - Tiers never share a bucket: a flood of SLO or debug submissions takes nothing from safety.
//! - A frame that names no tier (unreadable, or refused before a tier is known) is charged to
//!   debug's bucket, so garbage cannot hold back safety either.
//! - Connections are served in the order they reserved.

use std::time::{Duration, Instant};

use edgewatch_proto::tier::{self, PerTier};
use edgewatch_proto::v1::Tier;

use crate::pacing::token_bucket::TokenBucket;

/// The per-tier buckets of the whole agent.
#[derive(Debug, Clone)]
pub struct IngestRate {
    buckets: PerTier<TokenBucket>,
}

impl IngestRate {
    /// Full buckets of `burst` refilling at `rate_per_s`, one per tier.
    pub fn new(rate_per_s: u32, burst: u32, now: Instant) -> Self {
        Self {
            buckets: PerTier::all(TokenBucket::new(
                u64::from(rate_per_s),
                u64::from(burst),
                now,
            )),
        }
    }

    /// Reserves one submission of `tier` (`None`: a frame naming no tier, charged to debug) and
    /// returns how long the caller must wait before admitting it.
    pub fn reserve(&mut self, tier: Option<Tier>, now: Instant) -> Duration {
        let ix = tier.and_then(tier::index).unwrap_or(tier::DEBUG);
        self.buckets.at_mut(ix).reserve(1, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Admission times of `connections` clients each submitting `each` submissions of `tier`,
    /// every one reserving when its previous submission was admitted (in time order, as the
    /// runtime would run them).
    fn admissions(
        rate: &mut IngestRate,
        tier: Tier,
        connections: usize,
        each: usize,
        start: Instant,
    ) -> Vec<Instant> {
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;
        let mut ready: BinaryHeap<Reverse<(Instant, usize)>> =
            (0..connections).map(|c| Reverse((start, c))).collect();
        let mut left = vec![each; connections];
        let mut admitted = Vec::new();
        while let Some(Reverse((at, c))) = ready.pop() {
            let admitted_at = at + rate.reserve(Some(tier), at);
            admitted.push(admitted_at);
            left[c] -= 1;
            if left[c] > 0 {
                ready.push(Reverse((admitted_at, c)));
            }
        }
        admitted.sort();
        admitted
    }

    #[test]
    fn four_connections_together_get_one_rate() {
        let start = Instant::now();
        let mut rate = IngestRate::new(1000, 100, start);
        let admitted = admissions(&mut rate, Tier::Debug, 4, 1000, start);
        // 4,000 submissions at 1,000/s after a burst of 100: 3.9 s, not a quarter of it.
        let span = *admitted.last().unwrap() - start;
        assert!(
            span.abs_diff(Duration::from_millis(3900)) < Duration::from_millis(1),
            "{span:?}"
        );
        // Over any window: at most burst + rate * length.
        for (i, first) in admitted.iter().enumerate() {
            for (j, last) in admitted.iter().enumerate().skip(i).step_by(97) {
                let allowed = 100.0 + 1000.0 * (*last - *first).as_secs_f64() + 1e-6;
                assert!((j - i + 1) as f64 <= allowed + 1.0, "{i}..{j}");
            }
        }
    }

    #[test]
    fn a_debug_flood_takes_nothing_from_safety() {
        let start = Instant::now();
        let mut rate = IngestRate::new(1000, 100, start);
        // Debug is in debt for seconds...
        admissions(&mut rate, Tier::Debug, 4, 1000, start);
        // ...and safety still goes at once, up to its own burst.
        for _ in 0..100 {
            assert_eq!(rate.reserve(Some(Tier::Safety), start), Duration::ZERO);
        }
        assert_eq!(rate.reserve(Some(Tier::Slo), start), Duration::ZERO);
    }

    #[test]
    fn a_frame_naming_no_tier_is_charged_to_debug() {
        let start = Instant::now();
        let mut rate = IngestRate::new(10, 1, start);
        assert_eq!(rate.reserve(None, start), Duration::ZERO);
        assert!(rate.reserve(Some(Tier::Debug), start) > Duration::ZERO);
        assert_eq!(rate.reserve(Some(Tier::Safety), start), Duration::ZERO);
    }
}
