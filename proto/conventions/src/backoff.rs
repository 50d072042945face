//! Exponential backoff with jitter: the one rule for every reconnect, retry and restart of the
//! agent and the gateway.
//!
//! The ceiling starts at `min` and doubles after every wait up to `max`; a success ([`reset`])
//! starts it again from `min`, and so does a run that lasted at least `max` ([`after_run`]). Each
//! wait is drawn below the ceiling by the caller's [`Jitter`], from a uniform random number `r`
//! in `[0, 1)` that the caller draws:
//!
//! ```text
//! ceiling after n waits = min(min · 2ⁿ, max)
//! Jitter::None      wait = ceiling
//! Jitter::Full(r)   wait = ceiling · r            uniform in [0, ceiling]
//! Jitter::Equal(r)  wait = ceiling · (1/2 + r/2)  uniform in [ceiling/2, ceiling]
//! ```
//!
//! A fleet that loses its site link reconnects together when it returns; full jitter spreads the
//! storm over the whole window instead of synchronizing it (AWS architecture blog, "Exponential
//! Backoff And Jitter"); equal jitter keeps at least half the ceiling between attempts.
//!
//! Invariants:
//! - A wait is never above the ceiling, and the ceiling never above `max` (nor below `min`, a
//!   `max` below `min` being taken as `min`).
//! - The ceiling never shrinks except by [`reset`] or [`after_run`], and then to exactly `min`.
//! - Pure: no clock and no random source; `r` outside `[0, 1]` is clamped into it.
//!
//! [`reset`]: Backoff::reset
//! [`after_run`]: Backoff::after_run

use std::time::Duration;

/// How a wait is drawn below the ceiling, with the caller's uniform random number in `[0, 1)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Jitter {
    /// The wait is the ceiling: deterministic delays (a local child process, nobody to spread).
    None,
    /// Uniform in `[0, ceiling]`: the widest spread, for fleets reconnecting to one broker.
    Full(f64),
    /// Uniform in `[ceiling/2, ceiling]`: spread, yet never much shorter than the ceiling.
    Equal(f64),
}

impl Jitter {
    /// The wait this jitter draws below `ceiling`.
    fn apply(self, ceiling: Duration) -> Duration {
        match self {
            Self::None => ceiling,
            Self::Full(unit_random) => ceiling.mul_f64(unit_random.clamp(0.0, 1.0)),
            Self::Equal(unit_random) => ceiling.mul_f64(0.5 + unit_random.clamp(0.0, 1.0) / 2.0),
        }
    }
}

/// Exponential backoff between `min` and `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    ceiling: Duration,
}

impl Backoff {
    /// Backoff between `min` and `max` (a `max` below `min` is taken as `min`).
    pub fn new(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max: max.max(min),
            ceiling: min,
        }
    }

    /// The ceiling of the next wait (the next wait itself with [`Jitter::None`]).
    pub fn ceiling(&self) -> Duration {
        self.ceiling
    }

    /// The next wait, drawn by `jitter`; the ceiling then doubles, up to the maximum.
    pub fn next_wait(&mut self, jitter: Jitter) -> Duration {
        let wait = jitter.apply(self.ceiling);
        self.ceiling = self.ceiling.saturating_mul(2).min(self.max);
        wait
    }

    /// The wait after an attempt that ran for `ran_for` before it failed (zero when it never
    /// started): a run of at least the maximum counts as a success and starts again from the
    /// minimum.
    pub fn after_run(&mut self, ran_for: Duration, jitter: Jitter) -> Duration {
        if ran_for >= self.max {
            self.reset();
        }
        self.next_wait(jitter)
    }

    /// An attempt succeeded: start again from the minimum.
    pub fn reset(&mut self) {
        self.ceiling = self.min;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_ceiling_doubles_up_to_the_maximum_and_resets() {
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(10));
        let ceilings: Vec<u64> = (0..6)
            .map(|_| {
                let ceiling = backoff.ceiling().as_secs();
                backoff.next_wait(Jitter::Full(0.5));
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
        assert_eq!(backoff.next_wait(Jitter::Full(0.0)), Duration::ZERO);
        assert_eq!(backoff.next_wait(Jitter::Full(0.5)), Duration::from_secs(2));
        assert_eq!(backoff.next_wait(Jitter::Full(1.5)), Duration::from_secs(8));
    }

    #[test]
    fn many_attempts_never_overflow() {
        let mut backoff = Backoff::new(Duration::from_millis(1), Duration::from_secs(300));
        for _ in 0..1000 {
            assert!(backoff.next_wait(Jitter::Full(0.999)) <= Duration::from_secs(300));
        }
    }

    fn unjittered(min_ms: u64, max_ms: u64) -> Backoff {
        Backoff::new(Duration::from_millis(min_ms), Duration::from_millis(max_ms))
    }

    #[test]
    fn the_restart_delay_doubles_per_quick_exit_up_to_the_maximum() {
        let mut b = unjittered(100, 1_000);
        let delays: Vec<u64> = (0..6)
            .map(|_| {
                b.after_run(Duration::from_millis(10), Jitter::None)
                    .as_millis() as u64
            })
            .collect();
        assert_eq!(delays, [100, 200, 400, 800, 1_000, 1_000]);
    }

    #[test]
    fn a_run_as_long_as_the_maximum_delay_resets_the_backoff() {
        let mut b = unjittered(100, 1_000);
        b.after_run(Duration::ZERO, Jitter::None);
        b.after_run(Duration::ZERO, Jitter::None);
        assert_eq!(b.ceiling(), Duration::from_millis(400));
        assert_eq!(
            b.after_run(Duration::from_secs(1), Jitter::None),
            Duration::from_millis(100)
        );
        assert_eq!(b.ceiling(), Duration::from_millis(200));
    }

    #[test]
    fn equal_jitter_waits_between_half_the_ceiling_and_the_ceiling() {
        let mut backoff = Backoff::new(Duration::from_millis(250), Duration::from_secs(30));
        assert_eq!(
            backoff.next_wait(Jitter::Equal(0.0)),
            Duration::from_millis(125)
        );
        assert_eq!(
            backoff.next_wait(Jitter::Equal(0.5)),
            Duration::from_millis(375)
        );
        assert_eq!(
            backoff.next_wait(Jitter::Equal(1.0)),
            Duration::from_millis(1_000)
        );
    }

    #[test]
    fn a_maximum_below_the_minimum_is_taken_as_the_minimum() {
        let mut backoff = Backoff::new(Duration::from_secs(5), Duration::from_secs(1));
        assert_eq!(backoff.next_wait(Jitter::None), Duration::from_secs(5));
        assert_eq!(backoff.next_wait(Jitter::None), Duration::from_secs(5));
    }

    /// One step a user of the backoff may take.
    #[derive(Debug, Clone)]
    enum Step {
        Wait(Jitter),
        AfterRun(Duration, Jitter),
        Reset,
    }

    fn jitter() -> impl Strategy<Value = Jitter> {
        prop_oneof![
            Just(Jitter::None),
            (0.0..1.0f64).prop_map(Jitter::Full),
            (0.0..1.0f64).prop_map(Jitter::Equal),
        ]
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => jitter().prop_map(Step::Wait),
            2 => (0..u64::MAX, jitter()).prop_map(|(ns, j)| Step::AfterRun(Duration::from_nanos(ns), j)),
            1 => Just(Step::Reset),
        ]
    }

    proptest! {
        /// Against a model that counts the waits since the last reset and computes the ceiling
        /// as `min(min · 2ⁿ, max)` in exact arithmetic.
        #[test]
        fn every_wait_is_within_its_bounds_and_the_ceiling_follows_the_model(
            min_ns in 0..u64::MAX,
            max_ns in 0..u64::MAX,
            steps in proptest::collection::vec(step(), 0..200),
        ) {
            let (min, max) = (Duration::from_nanos(min_ns), Duration::from_nanos(max_ns));
            let top = max.max(min);
            let mut backoff = Backoff::new(min, max);
            let mut waits_since_reset = 0u32;
            let model = |n: u32| -> Duration {
                let doubled = match (n, min_ns) {
                    (_, 0) => 0,
                    (0..64, _) => u128::from(min_ns) << n,
                    _ => u128::MAX,
                };
                Duration::from_nanos(doubled.min(top.as_nanos()) as u64)
            };
            for step in steps {
                let (wait, jitter, ceiling) = match step {
                    Step::Wait(jitter) => {
                        let ceiling = backoff.ceiling();
                        (backoff.next_wait(jitter), jitter, ceiling)
                    }
                    Step::AfterRun(ran_for, jitter) => {
                        let long_run = ran_for >= top;
                        let ceiling = if long_run { min } else { backoff.ceiling() };
                        if long_run {
                            waits_since_reset = 0;
                        }
                        (backoff.after_run(ran_for, jitter), jitter, ceiling)
                    }
                    Step::Reset => {
                        backoff.reset();
                        waits_since_reset = 0;
                        prop_assert_eq!(backoff.ceiling(), min);
                        continue;
                    }
                };
                waits_since_reset += 1;
                prop_assert!(wait <= ceiling);
                prop_assert!(ceiling <= top && ceiling >= min);
                match jitter {
                    Jitter::None => prop_assert_eq!(wait, ceiling),
                    Jitter::Equal(_) => prop_assert!(wait + Duration::from_nanos(1) >= ceiling / 2),
                    Jitter::Full(_) => {}
                }
                prop_assert!(backoff.ceiling() >= ceiling);
                prop_assert_eq!(backoff.ceiling(), model(waits_since_reset));
            }
        }
    }
}
