//! Deadline-miss bursts: k misses in a row, or m misses within a window of w cycles. Pure: fed
//! one record at a time, and the skipped activations between records as one run; reports are
//! taken by the caller, which rate-limits them.
//!
//! Invariants:
//! - No allocation: the window keeps at most [`MAX_WINDOW_MISSES`] miss positions inline.
//! - Each miss is counted into at most one report per rule: bursts found while a report is
//!   pending merge into it (misses add up, the cycle range widens, the worst duration is the
//!   maximum), so a loop that misses every cycle yields one report per rule per take.
//! - "In a row" means consecutive activations: skipped activations fed with
//!   [`BurstDetector::skipped`] are misses of the run (they never ran, so no duration), and
//!   skipped activations not fed (the caller's choice for probes without deadlines) neither count
//!   nor break a run; a met deadline, or records lost to a ring overrun, break it.
//! - A run of skipped activations costs the same whatever its length: the consecutive rule adds
//!   it at once, the window rule walks at most 2m of its activations.
//! - The caller may hold a report while its run is still open ([`BurstDetector::run_open`]), so
//!   that one run is one report when it ends soon.
//! - The window rule looks at cycle numbers: m misses whose first and last cycles are less than
//!   w apart. Misses already counted into a report are not counted again.

use edgewatch_proto::v1::BurstRule;

use super::config::{BurstRules, MAX_WINDOW_MISSES};

/// One burst report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Burst {
    /// The rule that fired.
    pub rule: BurstRule,
    /// Misses counted into this report.
    pub misses: u64,
    /// The rule's window: k for the consecutive rule, w for the window rule.
    pub window_cycles: u64,
    /// First and last missed cycle in the report.
    pub first_cycle: u64,
    /// Last missed cycle.
    pub last_cycle: u64,
    /// Longest duration among the counted misses.
    pub worst_duration_ns: u64,
}

impl Burst {
    fn new(rule: BurstRule, window_cycles: u64, cycle: u64) -> Burst {
        Burst {
            rule,
            misses: 0,
            window_cycles,
            first_cycle: cycle,
            last_cycle: cycle,
            worst_duration_ns: 0,
        }
    }

    fn add(&mut self, cycle: u64, duration_ns: u64) {
        self.add_run(cycle, cycle, 1, duration_ns);
    }

    /// Adds `n` misses from `first` to `last`, the longest `worst_ns`.
    fn add_run(&mut self, first: u64, last: u64, n: u64, worst_ns: u64) {
        self.misses += n;
        self.first_cycle = self.first_cycle.min(first);
        self.last_cycle = self.last_cycle.max(last);
        self.worst_duration_ns = self.worst_duration_ns.max(worst_ns);
    }
}

/// Burst state of one loop.
#[derive(Debug, Clone)]
pub struct BurstDetector {
    rules: BurstRules,
    /// Current run of misses: length, first cycle, longest duration.
    run_len: u64,
    run_first: u64,
    run_worst: u64,
    /// The run reached k; further misses of it go straight into the report.
    in_burst: bool,
    /// (cycle, duration) of the latest misses, oldest first; at most m.
    window: heapless::Deque<(u64, u64), MAX_WINDOW_MISSES>,
    /// Misses at or before this cycle were counted into a window report.
    counted_through: Option<u64>,
    consecutive: Option<Burst>,
    windowed: Option<Burst>,
}

impl BurstDetector {
    /// A detector with these rules (validated: m ≤ [`MAX_WINDOW_MISSES`], m ≤ w).
    pub fn new(rules: BurstRules) -> BurstDetector {
        BurstDetector {
            rules,
            run_len: 0,
            run_first: 0,
            run_worst: 0,
            in_burst: false,
            window: heapless::Deque::new(),
            counted_through: None,
            consecutive: None,
            windowed: None,
        }
    }

    /// Forgets runs and windows (a new producer, or records lost); pending reports stay.
    pub fn reset(&mut self) {
        self.break_run();
        self.window.clear();
        self.counted_through = None;
    }

    /// Records were lost: a run cannot be known to continue across the gap.
    pub fn gap(&mut self) {
        self.break_run();
    }

    fn break_run(&mut self) {
        self.run_len = 0;
        self.in_burst = false;
    }

    /// Feeds one record.
    pub fn record(&mut self, cycle: u64, missed: bool, duration_ns: u64) {
        if !missed {
            self.break_run();
            return;
        }
        self.consecutive_misses(cycle, 1, duration_ns);
        self.window_miss(cycle, duration_ns);
    }

    /// Feeds `count` skipped activations from cycle `first` on: misses that never ran.
    pub fn skipped(&mut self, first: u64, count: u64) {
        if count == 0 {
            return;
        }
        self.consecutive_misses(first, count, 0);
        // Only the window's first and last m misses can share a window with misses outside
        // the run; every one between lies in a window of m of the run's own (m ≤ w), so it is
        // counted into the report at once.
        let m = u64::from(self.rules.window_misses);
        if count <= 2 * m {
            for c in first..first + count {
                self.window_miss(c, 0);
            }
            return;
        }
        for c in first..first + m {
            self.window_miss(c, 0);
        }
        let (block_first, block_last) = (first + m, first + count - m - 1);
        let w = u64::from(self.rules.window_cycles);
        self.windowed
            .get_or_insert_with(|| Burst::new(BurstRule::Window, w, block_first))
            .add_run(block_first, block_last, block_last - block_first + 1, 0);
        self.counted_through = Some(block_last);
        for c in block_last + 1..first + count {
            self.window_miss(c, 0);
        }
    }

    /// `n` misses in a row from cycle `first`, the longest `duration_ns`.
    fn consecutive_misses(&mut self, first: u64, n: u64, duration_ns: u64) {
        let k = u64::from(self.rules.consecutive);
        let last = first + (n - 1);
        if self.in_burst {
            self.consecutive
                .get_or_insert_with(|| Burst::new(BurstRule::Consecutive, k, first))
                .add_run(first, last, n, duration_ns);
            return;
        }
        if self.run_len == 0 {
            self.run_first = first;
            self.run_worst = 0;
        }
        self.run_len += n;
        self.run_worst = self.run_worst.max(duration_ns);
        if self.run_len >= k {
            let b = self
                .consecutive
                .get_or_insert_with(|| Burst::new(BurstRule::Consecutive, k, self.run_first));
            b.add_run(self.run_first, last, self.run_len, self.run_worst);
            self.in_burst = true;
        }
    }

    fn window_miss(&mut self, cycle: u64, duration_ns: u64) {
        let w = u64::from(self.rules.window_cycles);
        let m = self.rules.window_misses as usize;
        while let Some(&(c, _)) = self.window.front() {
            if cycle.saturating_sub(c) >= w || self.window.len() >= m {
                self.window.pop_front();
            } else {
                break;
            }
        }
        // Cannot fail: m ≤ capacity and the loop above made room.
        let _ = self.window.push_back((cycle, duration_ns));
        if self.window.len() < m {
            return;
        }
        let through = self.counted_through;
        let report = self
            .windowed
            .get_or_insert_with(|| Burst::new(BurstRule::Window, w, cycle));
        for &(c, d) in self.window.iter() {
            if through.is_none_or(|t| c > t) {
                report.add(c, d);
            }
        }
        self.counted_through = Some(cycle);
    }

    /// Whether a run that already made a burst is still going (its report may still grow).
    pub fn run_open(&self) -> bool {
        self.in_burst
    }

    /// Whether a report is waiting.
    pub fn pending(&self) -> bool {
        self.consecutive.is_some() || self.windowed.is_some()
    }

    /// Takes the pending reports (consecutive, window).
    pub fn take(&mut self) -> [Option<Burst>; 2] {
        [self.consecutive.take(), self.windowed.take()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn det(k: u32, w: u32, m: u32) -> BurstDetector {
        BurstDetector::new(BurstRules {
            consecutive: k,
            window_cycles: w,
            window_misses: m,
        })
    }

    fn feed(d: &mut BurstDetector, misses: &[u64], upto: u64) {
        for c in 0..upto {
            d.record(
                c,
                misses.contains(&c),
                if misses.contains(&c) { 100 + c } else { 1 },
            );
        }
    }

    #[test]
    fn k_misses_in_a_row_make_one_consecutive_burst_that_grows_with_the_run() {
        let mut d = det(3, 1000, 64);
        feed(&mut d, &[10, 11, 12, 13, 14, 20, 21], 30);
        let [c, w] = d.take();
        let c = c.unwrap();
        assert_eq!(
            (c.misses, c.first_cycle, c.last_cycle, c.worst_duration_ns),
            (5, 10, 14, 114)
        );
        assert_eq!(c.window_cycles, 3);
        assert!(w.is_none());
        assert!(!d.pending());
    }

    #[test]
    fn a_run_shorter_than_k_is_no_burst() {
        let mut d = det(3, 1000, 64);
        feed(&mut d, &[1, 2, 4, 5, 7, 8], 10);
        assert_eq!(d.take(), [None, None]);
    }

    #[test]
    fn a_run_continuing_after_a_take_is_reported_from_where_the_last_report_ended() {
        let mut d = det(2, 1000, 64);
        for c in 0..5 {
            d.record(c, true, 7);
        }
        let first = d.take()[0].unwrap();
        assert_eq!(
            (first.misses, first.first_cycle, first.last_cycle),
            (5, 0, 4)
        );
        for c in 5..8 {
            d.record(c, true, 7);
        }
        let second = d.take()[0].unwrap();
        assert_eq!(
            (second.misses, second.first_cycle, second.last_cycle),
            (3, 5, 7)
        );
    }

    #[test]
    fn lost_records_break_a_run() {
        let mut d = det(3, 1000, 64);
        d.record(1, true, 5);
        d.record(2, true, 5);
        d.gap();
        d.record(50, true, 5);
        assert!(d.take()[0].is_none());
    }

    #[test]
    fn m_misses_within_w_cycles_make_a_window_burst_counting_each_miss_once() {
        let mut d = det(100, 10, 3);
        // 0, 4, 8 are within 10 cycles; 12 and 15 extend it (8, 12, 15 within 10 too).
        feed(&mut d, &[0, 4, 8, 12, 15, 40, 60], 70);
        let w = d.take()[1].unwrap();
        assert_eq!((w.misses, w.first_cycle, w.last_cycle), (5, 0, 15));
        assert_eq!(w.window_cycles, 10);
        assert_eq!(w.worst_duration_ns, 115);
    }

    #[test]
    fn skipped_activations_are_misses_of_the_run_they_fall_in() {
        let mut d = det(3, 1000, 64);
        d.record(9, false, 1);
        d.record(10, true, 50);
        d.skipped(11, 2);
        d.record(13, false, 1);
        let c = d.take()[0].unwrap();
        assert_eq!(
            (c.misses, c.first_cycle, c.last_cycle, c.worst_duration_ns),
            (3, 10, 12, 50),
            "a late step and the two activations skipped after it"
        );
    }

    #[test]
    fn a_long_hang_is_one_burst_per_rule_counting_every_skipped_activation_once() {
        let mut d = det(3, 100, 5);
        d.record(0, true, 9);
        d.record(1, false, 1);
        d.record(2, true, 9);
        // A hang of 10,000 activations, then a late step.
        d.skipped(3, 10_000);
        d.record(10_003, true, 7);
        d.record(10_004, false, 1);
        let [c, w] = d.take();
        let c = c.unwrap();
        assert_eq!((c.misses, c.first_cycle, c.last_cycle), (10_002, 2, 10_003));
        let w = w.unwrap();
        assert_eq!(
            (w.misses, w.first_cycle, w.last_cycle),
            (10_003, 0, 10_003),
            "each miss once, the one before the late step's window too"
        );
        // The same run fed one activation at a time gives the same reports.
        let mut one = det(3, 100, 5);
        one.record(0, true, 9);
        one.record(1, false, 1);
        one.record(2, true, 9);
        for c in 3..10_003 {
            one.skipped(c, 1);
        }
        one.record(10_003, true, 7);
        one.record(10_004, false, 1);
        assert_eq!(one.take(), [Some(c), Some(w)]);
    }

    #[test]
    fn misses_spread_wider_than_the_window_are_no_burst() {
        let mut d = det(100, 10, 3);
        feed(&mut d, &[0, 6, 12, 18, 24], 30);
        assert_eq!(d.take(), [None, None]);
    }
}
