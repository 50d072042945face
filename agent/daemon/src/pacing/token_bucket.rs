//! Bandwidth cap: a token bucket in bytes, for LTE and satellite links billed or limited by volume.
//!
//! Invariants:
//! - Over any interval of length T, at most `burst + rate·T` bytes are released.
//! - Pure: the caller passes the time.

use std::time::{Duration, Instant};

/// A token bucket.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate_per_s: f64,
    burst: f64,
    tokens: f64,
    updated: Instant,
}

impl TokenBucket {
    /// A full bucket refilling at `rate_per_s` up to `burst`.
    pub fn new(rate_per_s: u64, burst: u64, now: Instant) -> Self {
        Self {
            rate_per_s: rate_per_s.max(1) as f64,
            burst: burst.max(1) as f64,
            tokens: burst.max(1) as f64,
            updated: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.updated).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate_per_s).min(self.burst);
        // Never backwards: a time earlier than the last one refills nothing, twice.
        self.updated = self.updated.max(now);
    }

    /// How long until `bytes` may be sent (zero when they may go now).
    pub fn wait_for(&mut self, bytes: u64, now: Instant) -> Duration {
        self.refill(now);
        // A request above the burst is served once the bucket is full, then drives it negative.
        let needed = (bytes as f64).min(self.burst);
        if self.tokens >= needed {
            Duration::ZERO
        } else {
            Duration::from_secs_f64((needed - self.tokens) / self.rate_per_s)
        }
    }

    /// Takes `bytes` (which may leave the bucket in debt, repaid before the next send).
    pub fn take(&mut self, bytes: u64, now: Instant) {
        self.refill(now);
        self.tokens -= bytes as f64;
    }

    /// Takes `amount` now, into debt if need be, and returns how long until the debt is repaid.
    /// Callers that each wait that long before going ahead stay within `burst + rate·T` together,
    /// and are served in the order they reserved.
    pub fn reserve(&mut self, amount: u64, now: Instant) -> Duration {
        self.take(amount, now);
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.rate_per_s)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sending_at_the_cap_never_exceeds_burst_plus_rate_times_time() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(10_000, 20_000, start);
        let mut now = start;
        let mut sent = 0u64;
        for _ in 0..1000 {
            now += bucket.wait_for(3_000, now);
            bucket.take(3_000, now);
            sent += 3_000;
        }
        let elapsed = now.duration_since(start).as_secs_f64();
        assert!(sent as f64 <= 20_000.0 + 10_000.0 * elapsed + 1.0);
        // And the cap is actually used: within one message of the limit.
        assert!(sent as f64 >= 10_000.0 * elapsed);
    }

    #[test]
    fn reservations_in_turn_are_served_in_order_at_the_rate() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(100, 10, start);
        let waits: Vec<Duration> = (0..30).map(|_| bucket.reserve(1, start)).collect();
        assert!(waits[..10].iter().all(Duration::is_zero));
        for (k, wait) in waits[10..].iter().enumerate() {
            let expected = Duration::from_secs_f64((k + 1) as f64 / 100.0);
            assert!(
                wait.abs_diff(expected) < Duration::from_micros(1),
                "{k}: {wait:?}"
            );
        }
    }

    #[test]
    fn an_oversized_send_waits_for_a_full_bucket_then_goes_into_debt() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(1_000, 1_000, start);
        bucket.take(1_000, start);
        assert_eq!(bucket.wait_for(5_000, start), Duration::from_secs(1));
        let later = start + Duration::from_secs(1);
        bucket.take(5_000, later);
        assert_eq!(bucket.wait_for(1, later), Duration::from_secs_f64(4.001));
    }
}
