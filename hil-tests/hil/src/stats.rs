//! Pure statistics of the HIL levels: latency summaries, the randomized block order, the paired
//! bootstrap and the interference gate.
//!
//! Invariants:
//! - No I/O and no clock; randomness comes only from a seeded [`SplitMix64`], so a run's
//!   verdict is reproducible from its seed and its measurements.
//! - The gate never passes on too little evidence: fewer clean pairs than asked for is a
//!   [`Verdict::Skip`] with the reason, never a pass.

/// SplitMix64 (Steele, Lea, Flood 2014): a tiny seeded generator, good enough for block order and
/// bootstrap resampling, and the same on every platform and toolchain.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator starting at `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A value in `0..n` (`n > 0`); the modulo bias is below 2⁻³² for the sizes used here.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// The order of each pair's two blocks: `true` runs the agent-on block first.
pub fn block_order(pairs: usize, rng: &mut SplitMix64) -> Vec<bool> {
    (0..pairs).map(|_| rng.next_u64() & 1 == 1).collect()
}

/// Nearest-rank percentile of sorted values: the smallest value with at least `p` percent of the
/// values at or below it. `None` when empty.
pub fn percentile(sorted: &[u64], p: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// The median of `values` (the mean of the middle two for an even count); `None` when empty.
/// Reorders `values`.
pub fn median(values: &mut [f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    Some(if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    })
}

/// Wake-up latencies of one set of cycles, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LatencySummary {
    /// Cycles.
    pub count: u64,
    /// Smallest latency.
    pub min_ns: u64,
    /// Median.
    pub p50_ns: u64,
    /// 99th percentile.
    pub p99_ns: u64,
    /// 99.9th percentile.
    pub p999_ns: u64,
    /// Largest latency (logged, never gated on a shared machine).
    pub max_ns: u64,
    /// Mean, rounded down.
    pub mean_ns: u64,
}

impl LatencySummary {
    /// Summarizes `latencies` (sorted in place).
    pub fn of(latencies: &mut [u64]) -> Self {
        latencies.sort_unstable();
        let at = |p| percentile(latencies, p).unwrap_or(0);
        let sum: u128 = latencies.iter().map(|&l| u128::from(l)).sum();
        Self {
            count: latencies.len() as u64,
            min_ns: latencies.first().copied().unwrap_or(0),
            p50_ns: at(50.0),
            p99_ns: at(99.0),
            p999_ns: at(99.9),
            max_ns: latencies.last().copied().unwrap_or(0),
            mean_ns: sum
                .checked_div(latencies.len() as u128)
                .map_or(0, |m| m as u64),
        }
    }
}

/// One-sided upper bound of the median of `values` by the percentile bootstrap: the
/// `confidence` quantile of the medians of `resamples` resamples drawn with replacement.
/// `None` when `values` is empty.
pub fn bootstrap_median_upper(
    values: &[f64],
    resamples: usize,
    confidence: f64,
    rng: &mut SplitMix64,
) -> Option<f64> {
    if values.is_empty() || resamples == 0 {
        return None;
    }
    let mut sample = vec![0.0; values.len()];
    let mut medians = Vec::with_capacity(resamples);
    for _ in 0..resamples {
        for slot in sample.iter_mut() {
            *slot = values[rng.below(values.len())];
        }
        medians.push(median(&mut sample)?);
    }
    medians.sort_by(f64::total_cmp);
    let rank = ((confidence * resamples as f64).ceil() as usize).clamp(1, resamples);
    Some(medians[rank - 1])
}

/// One agent-on/agent-off pair of blocks, as the gate sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PairP99 {
    /// p99 wake-up latency with the agent running, µs.
    pub on_us: f64,
    /// p99 wake-up latency with the agent stopped, µs.
    pub off_us: f64,
}

/// The gate's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GateRule {
    /// Fewer clean pairs than this: no verdict (SKIP).
    pub min_clean_pairs: usize,
    /// Absolute allowance on the paired Δp99, µs.
    pub floor_us: f64,
    /// Relative allowance, as a fraction of the baseline (median agent-off p99).
    pub fraction_of_baseline: f64,
    /// Bootstrap resamples.
    pub resamples: usize,
    /// One-sided confidence of the bound.
    pub confidence: f64,
}

impl Default for GateRule {
    /// Fail only if the upper 95% bound of the median paired Δp99 exceeds max(25 µs, 25% of the
    /// baseline); at least 10 clean pairs.
    fn default() -> Self {
        Self {
            min_clean_pairs: 10,
            floor_us: 25.0,
            fraction_of_baseline: 0.25,
            resamples: 10_000,
            confidence: 0.95,
        }
    }
}

/// What the gate found.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// The agent's effect is bounded below the allowance.
    Pass(GateNumbers),
    /// The agent's effect may exceed the allowance.
    Fail(GateNumbers),
    /// Not enough clean evidence to decide.
    Skip {
        /// Why, in a sentence.
        reason: String,
    },
}

/// The numbers behind a verdict, µs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GateNumbers {
    /// Clean pairs used.
    pub pairs: usize,
    /// Median agent-off p99.
    pub baseline_us: f64,
    /// Median paired Δp99 (on − off).
    pub median_delta_us: f64,
    /// Upper bound of the median Δp99.
    pub upper_bound_us: f64,
    /// max(floor, fraction × baseline).
    pub allowance_us: f64,
}

impl Verdict {
    /// `PASS`, `FAIL` or `SKIP`.
    pub fn word(&self) -> &'static str {
        match self {
            Verdict::Pass(_) => "PASS",
            Verdict::Fail(_) => "FAIL",
            Verdict::Skip { .. } => "SKIP",
        }
    }

    /// The numbers, unless skipped.
    pub fn numbers(&self) -> Option<&GateNumbers> {
        match self {
            Verdict::Pass(n) | Verdict::Fail(n) => Some(n),
            Verdict::Skip { .. } => None,
        }
    }
}

/// The interference gate over the clean pairs.
pub fn interference_gate(clean: &[PairP99], rule: &GateRule, seed: u64) -> Verdict {
    if clean.len() < rule.min_clean_pairs {
        return Verdict::Skip {
            reason: format!(
                "only {} clean pairs (at least {} are needed to decide); the machine was too noisy",
                clean.len(),
                rule.min_clean_pairs
            ),
        };
    }
    let deltas: Vec<f64> = clean.iter().map(|p| p.on_us - p.off_us).collect();
    let mut offs: Vec<f64> = clean.iter().map(|p| p.off_us).collect();
    let baseline_us = median(&mut offs).unwrap_or(0.0);
    let median_delta_us = median(&mut deltas.clone()).unwrap_or(0.0);
    let mut rng = SplitMix64::new(seed);
    let upper_bound_us = bootstrap_median_upper(&deltas, rule.resamples, rule.confidence, &mut rng)
        .unwrap_or(f64::INFINITY);
    let allowance_us = rule.floor_us.max(rule.fraction_of_baseline * baseline_us);
    let numbers = GateNumbers {
        pairs: clean.len(),
        baseline_us,
        median_delta_us,
        upper_bound_us,
        allowance_us,
    };
    if upper_bound_us > allowance_us {
        Verdict::Fail(numbers)
    } else {
        Verdict::Pass(numbers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles_pick_real_values() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50.0), Some(50));
        assert_eq!(percentile(&v, 99.0), Some(99));
        assert_eq!(percentile(&v, 100.0), Some(100));
        assert_eq!(percentile(&v, 0.0), Some(1));
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&[7], 99.9), Some(7));
    }

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&mut [5.0, 1.0, 3.0]), Some(3.0));
        assert_eq!(median(&mut []), None);
    }

    #[test]
    fn a_summary_reports_the_tail_of_a_thousand_cycles() {
        let mut l: Vec<u64> = (0..1000)
            .map(|i| if i < 990 { 10_000 } else { 500_000 })
            .collect();
        let s = LatencySummary::of(&mut l);
        assert_eq!(s.count, 1000);
        assert_eq!(s.p50_ns, 10_000);
        assert_eq!(s.p99_ns, 10_000);
        assert_eq!(s.p999_ns, 500_000);
        assert_eq!(s.max_ns, 500_000);
        assert_eq!(s.mean_ns, (990 * 10_000 + 10 * 500_000) / 1000);
    }

    #[test]
    fn the_same_seed_gives_the_same_order_and_both_orders_occur() {
        let a = block_order(64, &mut SplitMix64::new(42));
        let b = block_order(64, &mut SplitMix64::new(42));
        assert_eq!(a, b);
        assert!(a.iter().any(|&x| x) && a.iter().any(|&x| !x));
        assert_ne!(a, block_order(64, &mut SplitMix64::new(43)));
    }

    #[test]
    fn the_bootstrap_bound_of_a_constant_is_that_constant() {
        let mut rng = SplitMix64::new(1);
        assert_eq!(
            bootstrap_median_upper(&[3.0; 12], 500, 0.95, &mut rng),
            Some(3.0)
        );
    }

    #[test]
    fn the_bootstrap_bound_lies_above_the_median_for_spread_data() {
        let values: Vec<f64> = (0..31).map(f64::from).collect();
        let upper = bootstrap_median_upper(&values, 5000, 0.95, &mut SplitMix64::new(9)).unwrap();
        assert!(upper > 15.0 && upper <= 30.0, "{upper}");
    }

    fn pairs(deltas: &[f64], baseline: f64) -> Vec<PairP99> {
        deltas
            .iter()
            .map(|d| PairP99 {
                on_us: baseline + d,
                off_us: baseline,
            })
            .collect()
    }

    #[test]
    fn no_effect_passes_and_a_clear_effect_fails() {
        let rule = GateRule::default();
        let noise = [
            -3.0, 2.0, 0.5, -1.0, 4.0, -2.5, 1.5, 0.0, -0.5, 3.0, -4.0, 1.0,
        ];
        let verdict = interference_gate(&pairs(&noise, 60.0), &rule, 7);
        assert_eq!(verdict.word(), "PASS", "{verdict:?}");
        let shifted: Vec<f64> = noise.iter().map(|d| d + 40.0).collect();
        let verdict = interference_gate(&pairs(&shifted, 60.0), &rule, 7);
        assert_eq!(verdict.word(), "FAIL", "{verdict:?}");
    }

    #[test]
    fn the_allowance_is_a_quarter_of_a_large_baseline() {
        let rule = GateRule::default();
        // Baseline 400 µs: allowance 100 µs, so a 60 µs shift passes and 150 µs fails.
        let verdict = interference_gate(&pairs(&[60.0; 12], 400.0), &rule, 1);
        let numbers = *verdict.numbers().unwrap();
        assert_eq!(numbers.allowance_us, 100.0);
        assert_eq!(verdict.word(), "PASS");
        assert_eq!(
            interference_gate(&pairs(&[150.0; 12], 400.0), &rule, 1).word(),
            "FAIL"
        );
        // Baseline 40 µs: the 25 µs floor applies.
        let verdict = interference_gate(&pairs(&[26.0; 12], 40.0), &rule, 1);
        assert_eq!(verdict.numbers().unwrap().allowance_us, 25.0);
        assert_eq!(verdict.word(), "FAIL");
    }

    #[test]
    fn too_few_clean_pairs_skip_with_the_count_in_the_reason() {
        let verdict = interference_gate(&pairs(&[0.0; 9], 50.0), &GateRule::default(), 1);
        match verdict {
            Verdict::Skip { reason } => assert!(reason.contains("only 9 clean pairs"), "{reason}"),
            other => panic!("{other:?}"),
        }
    }
}
