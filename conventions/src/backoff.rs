//! Reconnect pacing: full-jitter exponential backoff and a random delay before the first connect.
//!
//! A fleet that loses its site link reconnects together when it returns; full jitter (each wait
//! drawn uniformly in `[0, min(max, min·2ⁿ)]`) spreads the storm over the whole window instead of
//! synchronizing it (AWS architecture blog, "Exponential Backoff And Jitter").
//!
//! Invariants:
//! - A wait is never above the configured maximum, and the ceiling never shrinks until `reset`.
//! - Pure: the random source is passed in.

use std::time::Duration;

/// Exponential backoff with full jitter.
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    attempt: u32,
}

impl Backoff {
    /// Backoff between `min` and `max`.
    pub fn new(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max: max.max(min),
            attempt: 0,
        }
    }

    /// The ceiling of the next wait.
    pub fn ceiling(&self) -> Duration {
        let factor = 1u32.checked_shl(self.attempt.min(31)).unwrap_or(u32::MAX);
        self.min.saturating_mul(factor).min(self.max)
    }

    /// The next wait, given a uniform random number in `[0, 1)`.
    pub fn next_wait(&mut self, unit_random: f64) -> Duration {
        let wait = self.ceiling().mul_f64(unit_random.clamp(0.0, 1.0));
        self.attempt = self.attempt.saturating_add(1);
        wait
    }

    /// A connection succeeded: start again from the minimum.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ceiling_doubles_up_to_the_maximum_and_resets() {
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(10));
        let ceilings: Vec<u64> = (0..6)
            .map(|_| {
                let ceiling = backoff.ceiling().as_secs();
                backoff.next_wait(0.5);
                ceiling
            })
            .collect();
        assert_eq!(ceilings, [1, 2, 4, 8, 10, 10]);
        backoff.reset();
        assert_eq!(backoff.ceiling(), Duration::from_secs(1));
    }

    #[test]
    fn waits_are_drawn_below_the_ceiling() {
        let mut backoff = Backoff::new(Duration::from_secs(2), Duration::from_secs(60));
        assert_eq!(backoff.next_wait(0.0), Duration::ZERO);
        assert_eq!(backoff.next_wait(0.5), Duration::from_secs(2));
        assert_eq!(backoff.next_wait(1.5), Duration::from_secs(8));
    }

    #[test]
    fn many_attempts_never_overflow() {
        let mut backoff = Backoff::new(Duration::from_millis(1), Duration::from_secs(300));
        for _ in 0..1000 {
            assert!(backoff.next_wait(0.999) <= Duration::from_secs(300));
        }
    }
}
