//! Fixed-bucket histogram of cycle response time (completion minus release). Pure.
//!
//! Invariants:
//! - Capacity is in the type: at most [`MAX_BOUNDS`] finite buckets plus one overflow bucket;
//!   recording never allocates.
//! - Bounds are inclusive upper bounds, strictly increasing; `counts()` has one more entry than
//!   `bounds()`, the last counting everything above the last bound (the wire's
//!   `LatencyHistogram`).

use super::config::MAX_BOUNDS;

/// A cumulative response-time histogram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Histogram {
    /// Inclusive upper bounds, ns.
    bounds: heapless::Vec<u64, MAX_BOUNDS>,
    /// Counts; only the first `bounds.len() + 1` are used.
    counts: [u64; MAX_BOUNDS + 1],
}

impl Histogram {
    /// An empty histogram over `bounds` (strictly increasing, as resolved by the config).
    pub fn new(bounds: &heapless::Vec<u64, MAX_BOUNDS>) -> Histogram {
        Histogram {
            bounds: bounds.clone(),
            counts: [0; MAX_BOUNDS + 1],
        }
    }

    /// Counts one response time.
    #[inline]
    pub fn record(&mut self, response_ns: u64) {
        let i = self.bounds.partition_point(|b| *b < response_ns);
        if let Some(c) = self.counts.get_mut(i) {
            *c = c.saturating_add(1);
        }
    }

    /// Inclusive upper bounds, ns.
    pub fn bounds(&self) -> &[u64] {
        &self.bounds
    }

    /// Counts per bucket, one more than the bounds.
    pub fn counts(&self) -> &[u64] {
        self.counts
            .get(..self.bounds.len() + 1)
            .unwrap_or(&self.counts)
    }

    /// Takes `counts` (kept by an earlier run) if they fit these bounds (one more than the
    /// bounds); otherwise the histogram is left as it is. Returns whether they were taken.
    pub fn set_counts(&mut self, counts: &[u64]) -> bool {
        let n = self.bounds.len() + 1;
        match self.counts.get_mut(..n) {
            Some(dst) if counts.len() == n => {
                dst.copy_from_slice(counts);
                true
            }
            _ => false,
        }
    }

    /// Records counted.
    pub fn total(&self) -> u64 {
        self.counts().iter().sum()
    }
}

/// Response time of a cycle: wake-up latency plus execution, i.e. completion minus release.
#[inline]
pub fn response_time_ns(release_ns: u64, start_ns: u64, duration_ns: u64) -> u64 {
    start_ns
        .saturating_sub(release_ns)
        .saturating_add(duration_ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(bounds: &[u64]) -> Histogram {
        Histogram::new(&bounds.iter().copied().collect())
    }

    #[test]
    fn a_value_on_a_bound_counts_in_that_bound_s_bucket() {
        let mut x = h(&[10, 20, 30]);
        for v in [0, 10, 11, 20, 30, 31, u64::MAX] {
            x.record(v);
        }
        assert_eq!(x.counts(), &[2, 2, 1, 2]);
        assert_eq!(x.total(), 7);
    }

    #[test]
    fn response_time_is_completion_minus_release() {
        assert_eq!(response_time_ns(1_000, 1_300, 500), 800);
        assert_eq!(
            response_time_ns(1_000, 900, 500),
            500,
            "an early start is no latency"
        );
    }
}
