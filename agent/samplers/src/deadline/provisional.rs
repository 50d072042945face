//! Deadline counts that do not wait for a hung loop to recover: the activations a live but
//! silent producer owes are counted from its last release, its period, its deadline and the
//! agent's CLOCK_MONOTONIC, and the probe's own counts take over when it records again. Pure:
//! the time is an argument.
//!
//! ```text
//!   last record          overdue (counted provisionally)                 now
//!   r_last ──┬─────────────┬─────────────┬─────────────┬── … ──┬──────────┤
//!            r_last+T+D    r_last+2T+D   r_last+3T+D                       │
//!            └─ an activation is counted once its absolute deadline is one period behind now
//! ```
//!
//! Invariants:
//! - Counted values are `max(counted, probe + overdue)`: never lowered, never below the probe's
//!   own count, and computed from the probe's latest totals rather than added up, so when the
//!   loop records again (its gap becomes skipped activations, or its late steps late
//!   completions) the probe's counts replace the provisional ones without counting twice.
//! - Only a producer that holds its lock is counted provisionally; a dead one owes nothing more.
//! - Nothing is counted before the producer's first record (the loop may not have begun), nor
//!   for a probe without deadlines (ABI 1), whose deadline misses are not measured at all.
//! - An activation is overdue only once its absolute deadline lies [`GRACE_PERIODS`] periods in
//!   the past: a record is published just after its step completes, so an activation that met
//!   its deadline a moment ago may not be visible yet, and must not be counted as a miss.
//! - Releases are periodic: activation `last + j` is released at `r_last + j·T`.

/// Periods past an activation's absolute deadline before it counts as overdue.
pub const GRACE_PERIODS: u64 = 1;

/// Activations released after the last record (at `last_release_ns`) whose absolute deadline
/// `release + deadline_ns` lies more than [`GRACE_PERIODS`] periods before `now_ns`.
pub fn overdue_activations(
    now_ns: u64,
    last_release_ns: u64,
    period_ns: u64,
    deadline_ns: u64,
) -> u64 {
    let period = period_ns.max(1);
    // Activation `last + j` is overdue when last_release + j·T + D + grace < now, i.e. when
    // j·T < x; the count of j ≥ 1 satisfying that is (x - 1) / T.
    let x = now_ns
        .saturating_sub(last_release_ns)
        .saturating_sub(deadline_ns)
        .saturating_sub(period.saturating_mul(GRACE_PERIODS));
    x.saturating_sub(1) / period
}

/// Activations and deadline misses the agent has counted of one producer epoch, in the probe's
/// terms (totals since the producer started, including what was provisionally counted).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counted {
    /// Activations counted.
    pub activations: u64,
    /// Deadline misses counted (0 for a probe without deadlines).
    pub deadline_misses: u64,
}

/// What a poll adds to the counted values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Increase {
    /// New activations.
    pub activations: u64,
    /// New deadline misses.
    pub deadline_misses: u64,
}

impl Counted {
    /// The counts at first sight of a producer already running: its totals plus what it owed
    /// then, so that neither is attributed later.
    pub fn at_first_sight(activations: u64, deadline_misses: Option<u64>, overdue: u64) -> Counted {
        Counted {
            activations: activations.saturating_add(overdue),
            deadline_misses: deadline_misses.map_or(0, |m| m.saturating_add(overdue)),
        }
    }

    /// Takes the probe's totals (`deadline_misses` `None`: not measured) and the activations
    /// overdue now (0 unless the producer holds its lock); returns what that adds.
    pub fn advance(
        &mut self,
        activations: u64,
        deadline_misses: Option<u64>,
        overdue: u64,
    ) -> Increase {
        let a = self.activations.max(activations.saturating_add(overdue));
        let m = match deadline_misses {
            Some(m) => self.deadline_misses.max(m.saturating_add(overdue)),
            None => self.deadline_misses,
        };
        let increase = Increase {
            activations: a - self.activations,
            deadline_misses: m - self.deadline_misses,
        };
        self.activations = a;
        self.deadline_misses = m;
        increase
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: u64 = 40_000_000;

    #[test]
    fn an_activation_is_overdue_once_its_deadline_is_a_period_behind_now() {
        let r = 1_000_000_000;
        // Activation last+1 has its deadline at r + 2T (D = T); overdue after r + 3T.
        assert_eq!(overdue_activations(r + 3 * T, r, T, T), 0);
        assert_eq!(overdue_activations(r + 3 * T + 1, r, T, T), 1);
        assert_eq!(overdue_activations(r + 4 * T, r, T, T), 1);
        assert_eq!(overdue_activations(r + 4 * T + 1, r, T, T), 2);
        // A shorter deadline makes them overdue sooner.
        assert_eq!(overdue_activations(r + 3 * T, r, T, T / 2), 1);
        // A healthy loop owes nothing, and a clock behind the release owes nothing.
        assert_eq!(overdue_activations(r + T + T / 2, r, T, T), 0);
        assert_eq!(overdue_activations(r - 5, r, T, T), 0);
    }

    #[test]
    fn a_two_second_hang_at_25_hz_owes_48_activations_just_before_it_ends() {
        let r_last = 5_000_000_000;
        // The hang swallows releases r_last + T .. r_last + 50T; the loop records again at
        // r_last + 51T. Just before, 48 deadlines lie more than a period in the past.
        assert_eq!(overdue_activations(r_last + 51 * T - 1, r_last, T, T), 48);
    }

    #[test]
    fn provisional_counts_are_taken_over_by_the_probe_without_counting_twice() {
        let mut c = Counted::default();
        // 100 activations, 2 misses; then silent, owing 30; then 10 more owed.
        assert_eq!(
            c.advance(100, Some(2), 0),
            Increase {
                activations: 100,
                deadline_misses: 2
            }
        );
        assert_eq!(c.advance(100, Some(2), 30).activations, 30);
        assert_eq!(c.advance(100, Some(2), 40).deadline_misses, 10);
        // It recovers: 50 skipped and one recorded cycle. The probe says 151 and 52.
        let inc = c.advance(151, Some(52), 0);
        assert_eq!(
            (inc.activations, inc.deadline_misses),
            (11, 10),
            "only what the provisional count did not have"
        );
        assert_eq!(
            c,
            Counted {
                activations: 151,
                deadline_misses: 52
            }
        );
    }

    #[test]
    fn counted_values_never_go_down() {
        let mut c = Counted::default();
        c.advance(10, Some(1), 20);
        // The producer died without recording again: nothing overdue is counted any more, and
        // what was counted stays.
        assert_eq!(c.advance(10, Some(1), 0), Increase::default());
        assert_eq!((c.activations, c.deadline_misses), (30, 21));
    }

    #[test]
    fn a_probe_without_deadlines_counts_activations_but_no_misses() {
        let mut c = Counted::at_first_sight(1_000, None, 0);
        let inc = c.advance(1_050, None, 0);
        assert_eq!((inc.activations, inc.deadline_misses), (50, 0));
    }

    #[test]
    fn what_a_producer_owed_at_first_sight_is_not_attributed_later() {
        let mut c = Counted::at_first_sight(1_000, Some(10), 25);
        // Still hung: 5 more owed since first sight.
        assert_eq!(c.advance(1_000, Some(10), 30).deadline_misses, 5);
        // Recovers: the probe counts the 40 skipped activations and one cycle.
        let inc = c.advance(1_041, Some(50), 0);
        assert_eq!((inc.activations, inc.deadline_misses), (11, 10));
    }
}
