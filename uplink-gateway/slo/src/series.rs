//! Raw samples of cumulative counters, and their increase over an event-time window.
//!
//! Every number this crate reports is a sum of [`increase`]s over raw samples, so a report fed from
//! the embedded store and one fed from Prometheus (`/api/v1/query?query=<metric>[<range>]`) agree
//! as long as both hand over the samples in `(end − range, end]` (see [`crate::SeriesNeed`]).
//!
//! ## The increase rule
//! `increase(samples, (start, end], lookback)`, with no extrapolation:
//! 1. The samples that count are those with `start < t ≤ end`.
//! 2. The *base* is the last sample with `start − lookback < t ≤ start`, when there is one. Without
//!    a base, the first sample inside the window is the base and its own value is not counted (as
//!    PromQL does: a series first seen inside a window contributes only what it grew after that).
//! 3. Walking from the base through the counted samples, each step adds `v − prev` when the counter
//!    did not go down, and `v` (the counter restarted from zero) when it did.
//!
//! The lookback keeps the result independent of how much history the source returned, and its
//! left-open edge makes Prometheus 2.x (closed range selectors) and 3.x (left-open) agree.
//!
//! Invariants:
//! - A [`Series`] holds samples strictly ordered by timestamp, each finite and non-negative.
//! - [`increase`] is never negative, and is additive over a partition of a window whenever the
//!   lookback spans the largest gap between samples.
//! - Adding the same samples again, or in another order, leaves a [`SeriesSet`] unchanged: late
//!   data is just samples with old timestamps.

use std::collections::BTreeMap;

/// Label name → value; includes `__name__`, the metric name.
pub type Labels = BTreeMap<String, String>;

/// Label holding the metric name.
pub const METRIC_NAME_LABEL: &str = "__name__";

/// An event-time window `(start_ms, end_ms]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Exclusive start, Unix milliseconds.
    pub start_ms: i64,
    /// Inclusive end, Unix milliseconds.
    pub end_ms: i64,
}

impl Window {
    /// The window of `length_ms` that ends at `end_ms`.
    pub fn ending_at(end_ms: i64, length_ms: i64) -> Self {
        Self {
            start_ms: end_ms.saturating_sub(length_ms),
            end_ms,
        }
    }
}

/// One cumulative counter series: its labels and its samples in time order.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    labels: Labels,
    samples: Vec<(i64, f64)>,
}

impl Series {
    /// Builds a series from samples in any order. Samples that are not finite or are negative are
    /// dropped (a counter is neither; Prometheus stale markers are NaN). Of several samples with
    /// one timestamp the last given wins: the gateway never emits two values for one timestamp.
    pub fn new(labels: Labels, samples: impl IntoIterator<Item = (i64, f64)>) -> Self {
        let mut series = Self {
            labels,
            samples: Vec::new(),
        };
        series.add(samples);
        series
    }

    /// Merges more samples (late or not) into the series, keeping the order invariant.
    pub fn add(&mut self, samples: impl IntoIterator<Item = (i64, f64)>) {
        let before = self.samples.len();
        self.samples.extend(
            samples
                .into_iter()
                .filter(|(_, v)| v.is_finite() && *v >= 0.0),
        );
        let new = &self.samples[before..];
        let in_order = new.windows(2).all(|w| w[0].0 < w[1].0)
            && before
                .checked_sub(1)
                .is_none_or(|last| new.first().is_none_or(|f| f.0 > self.samples[last].0));
        if in_order {
            // The common case (a source hands over a series in time order): nothing to merge.
            return;
        }
        // Stable sort, then keep the last of equal timestamps: newer input wins.
        self.samples.sort_by_key(|(t, _)| *t);
        let mut out: Vec<(i64, f64)> = Vec::with_capacity(self.samples.len());
        for sample in self.samples.drain(..) {
            match out.last_mut() {
                Some(last) if last.0 == sample.0 => *last = sample,
                _ => out.push(sample),
            }
        }
        self.samples = out;
    }

    /// All labels, `__name__` included.
    pub fn labels(&self) -> &Labels {
        &self.labels
    }

    /// The value of `name`, or `""` when the series lacks it (as PromQL treats a missing label).
    pub fn label(&self, name: &str) -> &str {
        self.labels.get(name).map_or("", String::as_str)
    }

    /// The metric name (`__name__`).
    pub fn metric(&self) -> &str {
        self.label(METRIC_NAME_LABEL)
    }

    /// Samples `(timestamp_ms, value)`, strictly increasing in time.
    pub fn samples(&self) -> &[(i64, f64)] {
        &self.samples
    }

    /// [`increase`] of this series over `window`.
    pub fn increase(&self, window: Window, lookback_ms: i64) -> f64 {
        increase(&self.samples, window, lookback_ms)
    }
}

/// The raw samples a report is computed from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SeriesSet {
    series: Vec<Series>,
    /// Labels → position in `series`, so adding to a fleet-sized set stays O(log n).
    index: BTreeMap<Labels, usize>,
}

impl SeriesSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds samples to the series with exactly these labels, creating it when new. Samples with
    /// old timestamps simply land in the past of the series (late data).
    pub fn add(&mut self, labels: Labels, samples: impl IntoIterator<Item = (i64, f64)>) {
        match self.index.get(&labels) {
            Some(&i) => self.series[i].add(samples),
            None => {
                self.index.insert(labels.clone(), self.series.len());
                self.series.push(Series::new(labels, samples));
            }
        }
    }

    /// Every series, in insertion order.
    pub fn iter(&self) -> impl Iterator<Item = &Series> {
        self.series.iter()
    }

    /// The series of one metric.
    pub fn metric<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Series> + 'a {
        self.series.iter().filter(move |s| s.metric() == name)
    }

    /// Number of series.
    pub fn len(&self) -> usize {
        self.series.len()
    }

    /// True when there is no series.
    pub fn is_empty(&self) -> bool {
        self.series.is_empty()
    }
}

impl FromIterator<Series> for SeriesSet {
    fn from_iter<I: IntoIterator<Item = Series>>(iter: I) -> Self {
        let mut set = Self::new();
        for series in iter {
            set.add(series.labels, series.samples);
        }
        set
    }
}

/// Increase of a counter over `window`, following the rule in the module doc.
///
/// `samples` must be in strictly increasing time order (as a [`Series`] keeps them).
pub fn increase(samples: &[(i64, f64)], window: Window, lookback_ms: i64) -> f64 {
    let first_inside = samples.partition_point(|(t, _)| *t <= window.start_ms);
    let end = samples.partition_point(|(t, _)| *t <= window.end_ms);
    if first_inside >= end {
        return 0.0;
    }
    let base_floor = window.start_ms.saturating_sub(lookback_ms);
    let (mut prev, counted) = match first_inside.checked_sub(1).map(|i| samples[i]) {
        Some((t, v)) if t > base_floor => (v, &samples[first_inside..end]),
        _ => (samples[first_inside].1, &samples[first_inside + 1..end]),
    };
    let mut total = 0.0;
    for &(_, v) in counted {
        total += if v >= prev { v - prev } else { v };
        prev = v;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn w(start_ms: i64, end_ms: i64) -> Window {
        Window { start_ms, end_ms }
    }

    #[test]
    fn increase_uses_the_last_sample_at_or_before_start_as_base() {
        let s = [(0, 10.0), (10, 15.0), (20, 30.0), (30, 31.0)];
        // (10, 30]: base 15 at t=10; counted 30, 31 → 15 + 1 = 16.
        assert_eq!(increase(&s, w(10, 30), 100), 16.0);
        // (5, 25]: base 10 at t=0; counted 15, 30 → 20.
        assert_eq!(increase(&s, w(5, 25), 100), 20.0);
        // Same window, lookback 5 ms: t=0 is not after 5 − 5 = 0, so 15 becomes the base → 15.
        assert_eq!(increase(&s, w(5, 25), 5), 15.0);
        // Nothing inside the window → 0, whatever lies around it.
        assert_eq!(increase(&s, w(31, 100), 100), 0.0);
        assert_eq!(increase(&s, w(11, 19), 100), 0.0);
    }

    #[test]
    fn a_counter_that_goes_down_restarted_from_zero() {
        // 100 → 130 (+30), drop to 5 (restart: +5), → 12 (+7), drop to 0 (+0) → 42.
        let s = [(0, 100.0), (1, 130.0), (2, 5.0), (3, 12.0), (4, 0.0)];
        assert_eq!(increase(&s, w(0, 4), 10), 42.0);
    }

    #[test]
    fn a_series_first_seen_inside_the_window_counts_only_its_growth() {
        let s = [(50, 1000.0), (60, 1010.0)];
        assert_eq!(increase(&s, w(0, 100), 10), 10.0);
    }

    #[test]
    fn late_samples_merge_into_place_and_identical_resends_are_no_ops() {
        let mut set = SeriesSet::new();
        let labels = Labels::from([(METRIC_NAME_LABEL.into(), "m".into())]);
        set.add(labels.clone(), [(0, 1.0), (30, 4.0)]);
        set.add(
            labels.clone(),
            [(10, 2.0), (20, 3.0), (25, f64::NAN), (26, -1.0)],
        );
        set.add(labels.clone(), [(10, 2.0)]);
        assert_eq!(set.len(), 1);
        let s = set.metric("m").next().unwrap();
        assert_eq!(s.samples(), &[(0, 1.0), (10, 2.0), (20, 3.0), (30, 4.0)]);
    }

    /// Samples with integer values (exact in f64) and gaps of 1..=`max_gap` ms.
    fn samples(max_gap: i64) -> impl Strategy<Value = Vec<(i64, f64)>> {
        prop::collection::vec((1..=max_gap, 0u32..1_000_000), 0..60).prop_map(|steps| {
            let mut t = -100;
            steps
                .into_iter()
                .map(|(gap, v)| {
                    t += gap;
                    (t, f64::from(v))
                })
                .collect()
        })
    }

    proptest! {
        #[test]
        fn increase_is_never_negative(s in samples(50), a in -200i64..2000, len in 0i64..2000, lb in 0i64..100) {
            prop_assert!(increase(&s, w(a, a + len), lb) >= 0.0);
        }

        #[test]
        fn increase_over_a_window_is_the_sum_over_any_partition_of_it(
            s in samples(50),
            mut cuts in prop::collection::vec(-200i64..2500, 2..8),
        ) {
            cuts.sort_unstable();
            // Lookback 50 spans every gap, so each part finds the previous part's last sample.
            let whole = increase(&s, w(cuts[0], *cuts.last().unwrap()), 50);
            let parts: f64 = cuts.windows(2).map(|c| increase(&s, w(c[0], c[1]), 50)).sum();
            prop_assert_eq!(whole, parts);
        }

        #[test]
        fn increase_of_a_counter_that_never_resets_is_last_minus_base(
            steps in prop::collection::vec((1i64..20, 0u32..1000), 1..60),
            a in -50i64..500,
            len in 0i64..800,
        ) {
            let mut t = 0;
            let mut v = 0.0;
            let s: Vec<(i64, f64)> = steps.into_iter().map(|(gap, inc)| { t += gap; v += f64::from(inc); (t, v) }).collect();
            let inside: Vec<_> = s.iter().filter(|(t, _)| *t > a && *t <= a + len).collect();
            let base = s.iter().rev().find(|(t, _)| *t <= a).or(inside.first().copied());
            let expected = match (base, inside.last()) {
                (Some(b), Some(l)) => l.1 - b.1,
                _ => 0.0,
            };
            prop_assert_eq!(increase(&s, w(a, a + len), i64::MAX), expected);
        }

        #[test]
        fn samples_added_in_any_order_and_split_give_the_same_series(
            s in samples(30),
            order in prop::collection::vec(any::<prop::sample::Index>(), 0..60),
            split in any::<prop::sample::Index>(),
        ) {
            let labels = Labels::from([(METRIC_NAME_LABEL.into(), "m".into())]);
            let once = Series::new(labels.clone(), s.clone());
            let mut shuffled = s.clone();
            for (i, idx) in order.iter().enumerate() {
                if !shuffled.is_empty() {
                    let n = shuffled.len();
                    shuffled.swap(i % n, idx.index(n));
                }
            }
            let at = if shuffled.is_empty() { 0 } else { split.index(shuffled.len()) };
            let mut set = SeriesSet::new();
            set.add(labels.clone(), shuffled[at..].to_vec());
            set.add(labels.clone(), shuffled[..at].to_vec());
            // Re-sending everything is a no-op.
            set.add(labels, s);
            prop_assert_eq!(set.iter().next().unwrap(), &once);
        }
    }
}
