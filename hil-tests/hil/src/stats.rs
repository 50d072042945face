//! Pure statistics of the HIL levels: latency summaries, the randomized block order, the paired
//! bootstrap, the interference gate and its evidence rule, and the footprint level's comparison
//! of the agent's preemptions with a reference process's.
//!
//! Invariants:
//! - No I/O and no clock; randomness comes only from a seeded [`SplitMix64`], so a run's
//!   verdict is reproducible from its seed and its measurements.
//! - The gate never decides on too little evidence: fewer clean pairs than the rule asks for, a
//!   machine where most pairs were disturbed, or an interval that holds the allowance (noise
//!   wider than the effect it must bound) is a [`Verdict::Skip`] with the reason, never a pass
//!   and never a fail.
//! - Preemption is judged against what a reference process suffered in the same window: the
//!   neighbours' load raises both alike and never fails the agent.

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
    bootstrap_median_bounds(values, resamples, confidence, rng).map(|(_, upper)| upper)
}

/// One-sided lower and upper bounds of the median of `values` by the percentile bootstrap, each
/// at `confidence`: the `1 − confidence` and `confidence` quantiles of the medians of
/// `resamples` resamples drawn with replacement. `None` when `values` is empty.
pub fn bootstrap_median_bounds(
    values: &[f64],
    resamples: usize,
    confidence: f64,
    rng: &mut SplitMix64,
) -> Option<(f64, f64)> {
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
    let at = |q: f64| medians[((q * resamples as f64).ceil() as usize).clamp(1, resamples) - 1];
    Some((at(1.0 - confidence), at(confidence)))
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
    /// A smaller share of clean pairs among the pairs run: no verdict (SKIP).
    pub min_clean_fraction: f64,
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
    /// Pass if the upper 95% bound of the median paired Δp99 is within max(25 µs, 25% of the
    /// baseline), fail if its lower 95% bound exceeds it, and otherwise decide nothing; decide
    /// only on at least 20 clean pairs that are at least 40% of the pairs run.
    ///
    /// Why 20: the one-sided 95% bound of a median of n pairs is, distribution-free, its k-th
    /// smallest value with k the 95% quantile of Binomial(n, ½): the 9th of 10, the 14th of 20.
    /// With 10 pairs two disturbed pairs decide the bound; with 20 it takes seven. Why 40%: when
    /// most seconds of a run saw steal or lost cycles on the loop's CPU, the pairs that escaped
    /// are the survivors of a noisy machine, not a sample of a quiet one (a run on a busy
    /// runner kept a third of its pairs and its Δp99 was the neighbours').
    fn default() -> Self {
        Self {
            min_clean_pairs: 20,
            min_clean_fraction: 0.4,
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
    /// The agent's effect is bounded below the allowance: the upper bound is within it.
    Pass(GateNumbers),
    /// The agent's effect exceeds the allowance: even the lower bound is above it.
    Fail(GateNumbers),
    /// Not enough clean evidence to decide, or an interval too wide for either (a noisy machine).
    Skip {
        /// Why, in a sentence.
        reason: String,
        /// The gate's numbers when it ran but could not decide.
        numbers: Option<GateNumbers>,
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
    /// Lower bound of the median Δp99.
    pub lower_bound_us: f64,
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

    /// The gate's numbers, when it ran.
    pub fn numbers(&self) -> Option<&GateNumbers> {
        match self {
            Verdict::Pass(n) | Verdict::Fail(n) => Some(n),
            Verdict::Skip { numbers, .. } => numbers.as_ref(),
        }
    }
}

/// What the interference level does after a round of pairs.
#[derive(Debug, Clone, PartialEq)]
pub enum Evidence {
    /// Enough clean pairs, and a large enough share of the pairs run: the gate decides.
    Enough,
    /// Not yet: run this many more pairs.
    MorePairs(usize),
    /// Not enough and no more pairs may run (or even clean ones could not make it enough).
    Insufficient {
        /// Why, in a sentence.
        reason: String,
    },
}

/// The sequential evidence rule of the interference level, applied after each round: with
/// `clean` of `run` pairs clean so far, decide when [`GateRule`]'s count and share hold; else run
/// another round of `round` pairs while at most `max_pairs` have run and all of them clean
/// could still meet the rule; else give up with the reason.
pub fn evidence(
    clean: usize,
    run: usize,
    round: usize,
    max_pairs: usize,
    rule: &GateRule,
) -> Evidence {
    let meets = |clean: usize, run: usize| {
        clean >= rule.min_clean_pairs && clean as f64 >= rule.min_clean_fraction * run as f64
    };
    if run > 0 && meets(clean, run) {
        return Evidence::Enough;
    }
    let remaining = max_pairs.saturating_sub(run);
    // Adding clean pairs only raises the count and the share, so the best case is every
    // remaining pair clean.
    if remaining > 0 && round > 0 && meets(clean + remaining, run + remaining) {
        return Evidence::MorePairs(round.min(remaining));
    }
    Evidence::Insufficient {
        reason: format!(
            "only {clean} of {run} pairs were clean (a verdict needs at least {} clean pairs and at least {:.0}% of the pairs run, within {max_pairs} pairs); the machine was too noisy",
            rule.min_clean_pairs,
            rule.min_clean_fraction * 100.0
        ),
    }
}

/// What the interference level does after a round of pairs: the evidence rule, then the gate.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Run this many more pairs.
    MorePairs(usize),
    /// The level's verdict.
    Decide(Verdict),
}

/// The interference level's decision after a round: with `clean` pairs clean of `run` run, ask
/// [`evidence`]; once there is enough, ask [`interference_gate`], and when its interval is too
/// wide to pass or fail, run another round of `round` pairs while `max_pairs` allows (more
/// pairs narrow the interval). Out of pairs, the undecided gate is the SKIP it gave.
pub fn after_round(
    clean: &[PairP99],
    run: usize,
    round: usize,
    max_pairs: usize,
    rule: &GateRule,
    seed: u64,
) -> Step {
    match evidence(clean.len(), run, round, max_pairs, rule) {
        Evidence::MorePairs(more) => Step::MorePairs(more),
        Evidence::Insufficient { reason } => Step::Decide(Verdict::Skip {
            reason,
            numbers: None,
        }),
        Evidence::Enough => match interference_gate(clean, rule, seed) {
            Verdict::Skip { .. } if round > 0 && run < max_pairs => {
                Step::MorePairs(round.min(max_pairs - run))
            }
            verdict => Step::Decide(verdict),
        },
    }
}

/// The interference gate over the clean pairs: PASS when the upper bound of the median paired
/// Δp99 is within the allowance, FAIL when its lower bound exceeds it, SKIP otherwise (the
/// interval holds the allowance: the pairs are too noisy to tell which side the agent is on),
/// and SKIP with fewer clean pairs than the rule asks for.
pub fn interference_gate(clean: &[PairP99], rule: &GateRule, seed: u64) -> Verdict {
    if clean.len() < rule.min_clean_pairs {
        return Verdict::Skip {
            reason: format!(
                "only {} clean pairs (at least {} are needed to decide); the machine was too noisy",
                clean.len(),
                rule.min_clean_pairs
            ),
            numbers: None,
        };
    }
    let deltas: Vec<f64> = clean.iter().map(|p| p.on_us - p.off_us).collect();
    let mut offs: Vec<f64> = clean.iter().map(|p| p.off_us).collect();
    let baseline_us = median(&mut offs).unwrap_or(0.0);
    let median_delta_us = median(&mut deltas.clone()).unwrap_or(0.0);
    let mut rng = SplitMix64::new(seed);
    let (lower_bound_us, upper_bound_us) =
        bootstrap_median_bounds(&deltas, rule.resamples, rule.confidence, &mut rng)
            .unwrap_or((f64::NEG_INFINITY, f64::INFINITY));
    let allowance_us = rule.floor_us.max(rule.fraction_of_baseline * baseline_us);
    let numbers = GateNumbers {
        pairs: clean.len(),
        baseline_us,
        median_delta_us,
        lower_bound_us,
        upper_bound_us,
        allowance_us,
    };
    if upper_bound_us <= allowance_us {
        Verdict::Pass(numbers)
    } else if lower_bound_us > allowance_us {
        Verdict::Fail(numbers)
    } else {
        Verdict::Skip {
            reason: format!(
                "the {} clean pairs were too noisy to decide: the median paired Δp99 lies between {lower_bound_us:+.1} and {upper_bound_us:+.1} µs ({:.0}% bounds), an interval that holds the allowance of {allowance_us:.1} µs",
                clean.len(),
                rule.confidence * 100.0
            ),
            numbers: Some(numbers),
        }
    }
}

/// A process's scheduling over a window: what `/proc` says of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Scheduling {
    /// Time on a CPU (schedstat), ns.
    pub run_ns: u64,
    /// Voluntary context switches (the process slept: one per wake-up).
    pub voluntary: u64,
    /// Involuntary context switches (the process was preempted while it could run).
    pub nonvoluntary: u64,
}

/// How the agent's preemptions are judged against the reference's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PreemptionRule {
    /// Allowance beyond the neighbours' share, per voluntary switch of the agent.
    pub per_voluntary: f64,
    /// Constant part of the allowance (start-of-window effects).
    pub slack: u64,
    /// One-sided confidence of the upper bound on the neighbours' preemption rate.
    pub confidence: f64,
}

impl Default for PreemptionRule {
    /// "Near zero" beyond the neighbours' share: at most one preemption per 100 wake-ups plus 5,
    /// over the 99.9% upper bound of what the reference's rate predicts.
    fn default() -> Self {
        Self {
            per_voluntary: 0.01,
            slack: 5,
            confidence: 0.999,
        }
    }
}

/// The agent's preemptions set against the reference's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Preemption {
    /// The reference's preemptions per second on a CPU.
    pub reference_rate_per_s: f64,
    /// Upper bound of the preemptions the neighbours explain for the agent's time on a CPU: the
    /// upper confidence bound of the reference's rate times the agent's run time.
    pub neighbours_upper: f64,
    /// The agent's preemptions beyond that bound (0 when within).
    pub excess: f64,
    /// What the rule allows beyond it.
    pub allowance: u64,
    /// `excess <= allowance`.
    pub pass: bool,
}

/// Compares the agent's involuntary switches with a reference process's in the same window, on
/// the same CPUs, at the same (SCHED_IDLE) policy. A task at that policy is preempted whenever
/// another task wakes on its CPU while it runs, so its preemptions are a count over its time on a
/// CPU at the neighbours' wake-up rate: the reference measures that rate, and the agent is
/// charged only with what exceeds it. What the agent controls, its time on a CPU and its
/// wake-ups, is gated on its own. `None` when the reference did not run at all.
pub fn preemption_beyond_reference(
    agent: &Scheduling,
    reference: &Scheduling,
    rule: &PreemptionRule,
) -> Option<Preemption> {
    if reference.run_ns == 0 {
        return None;
    }
    let reference_s = reference.run_ns as f64 / 1e9;
    let agent_s = agent.run_ns as f64 / 1e9;
    let rate_upper = poisson_upper(reference.nonvoluntary, rule.confidence) / reference_s;
    let neighbours_upper = rate_upper * agent_s;
    let excess = (agent.nonvoluntary as f64 - neighbours_upper).max(0.0);
    let allowance = (agent.voluntary as f64 * rule.per_voluntary) as u64 + rule.slack;
    Some(Preemption {
        reference_rate_per_s: reference.nonvoluntary as f64 / reference_s,
        neighbours_upper,
        excess,
        allowance,
        pass: excess <= allowance as f64,
    })
}

/// Exact one-sided upper confidence bound of a Poisson mean after observing `k` events: the
/// mean at which `P(X ≤ k) = 1 − confidence` (Garwood), found by bisection.
pub fn poisson_upper(k: u64, confidence: f64) -> f64 {
    let target = 1.0 - confidence;
    let k_f = k as f64;
    let (mut lo, mut hi) = (k_f, k_f + 20.0 + 10.0 * k_f.sqrt());
    while poisson_cdf(k, hi) > target {
        hi *= 2.0;
    }
    for _ in 0..200 {
        let mid = (lo + hi) / 2.0;
        if poisson_cdf(k, mid) > target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    hi
}

/// `P(X ≤ k)` for `X ~ Poisson(mean)`, summed in log space (exact for the counts a window gives).
fn poisson_cdf(k: u64, mean: f64) -> f64 {
    if mean <= 0.0 {
        return 1.0;
    }
    let ln_mean = mean.ln();
    let mut ln_term = -mean; // ln P(X = 0)
    let mut sum = ln_term.exp();
    for i in 1..=k {
        ln_term += ln_mean - (i as f64).ln();
        sum += ln_term.exp();
    }
    sum.min(1.0)
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
            -3.0, 2.0, 0.5, -1.0, 4.0, -2.5, 1.5, 0.0, -0.5, 3.0, -4.0, 1.0, //
            2.5, -1.5, 0.0, 1.0, -3.5, 3.5, -0.5, 0.5, -2.0, 2.0, 1.5, -1.0,
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
        let verdict = interference_gate(&pairs(&[60.0; 24], 400.0), &rule, 1);
        let numbers = *verdict.numbers().unwrap();
        assert_eq!(numbers.allowance_us, 100.0);
        assert_eq!(verdict.word(), "PASS");
        assert_eq!(
            interference_gate(&pairs(&[150.0; 24], 400.0), &rule, 1).word(),
            "FAIL"
        );
        // Baseline 40 µs: the 25 µs floor applies.
        let verdict = interference_gate(&pairs(&[26.0; 24], 40.0), &rule, 1);
        assert_eq!(verdict.numbers().unwrap().allowance_us, 25.0);
        assert_eq!(verdict.word(), "FAIL");
    }

    #[test]
    fn too_few_clean_pairs_skip_with_the_count_in_the_reason() {
        let verdict = interference_gate(&pairs(&[0.0; 9], 50.0), &GateRule::default(), 1);
        match verdict {
            Verdict::Skip { reason, .. } => {
                assert!(reason.contains("only 9 clean pairs"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    }

    /// The pairs of a run on a busy runner: 10 of 30 clean, their Δp99 spread by the neighbours
    /// (median +56.7 µs) over a 60 µs baseline.
    fn busy_runner_pairs() -> Vec<PairP99> {
        let deltas = [
            -38.0, 151.0, 12.5, 96.0, 56.2, 57.2, -4.0, 130.0, 88.0, 21.0,
        ];
        pairs(&deltas, 60.0)
    }

    #[test]
    fn ten_clean_pairs_of_thirty_are_too_few_to_pass_or_fail() {
        let verdict = interference_gate(&busy_runner_pairs(), &GateRule::default(), 3);
        match verdict {
            Verdict::Skip { reason, .. } => {
                assert!(reason.contains("only 10 clean pairs"), "{reason}")
            }
            other => panic!("a third of the pairs decided: {other:?}"),
        }
    }

    /// The 25 clean pairs (p99 off, p99 on, µs) of a run on a 2-core machine shared with other
    /// builds: no steal and no lost cycle, yet agent-off p99s from 42 to 306 µs, so paired
    /// differences of ±300 µs around a median of +13.5 µs. A fixed-bound gate failed it (upper
    /// bound +42.6 µs, allowance 25 µs).
    fn shared_machine_pairs() -> Vec<PairP99> {
        [
            (82.6, 58.9),
            (114.7, 282.1),
            (48.2, 68.1),
            (162.4, 118.0),
            (118.4, 67.9),
            (88.3, 489.2),
            (41.9, 281.4),
            (46.7, 52.4),
            (120.1, 127.9),
            (43.5, 212.0),
            (72.7, 94.6),
            (87.6, 59.8),
            (143.6, 270.6),
            (85.8, 82.6),
            (64.9, 78.4),
            (217.1, 62.4),
            (63.8, 66.3),
            (110.8, 59.1),
            (156.1, 53.9),
            (306.4, 68.9),
            (58.4, 191.8),
            (55.5, 98.1),
            (191.5, 489.3),
            (61.5, 212.5),
            (67.5, 86.2),
        ]
        .iter()
        .map(|&(off_us, on_us)| PairP99 { on_us, off_us })
        .collect()
    }

    #[test]
    fn pairs_too_noisy_to_bound_the_effect_neither_pass_nor_fail() {
        let rule = GateRule::default();
        let verdict = interference_gate(&shared_machine_pairs(), &rule, 1_796_151_133_058_237_690);
        assert_eq!(verdict.word(), "SKIP", "{verdict:?}");
        let numbers = *verdict
            .numbers()
            .expect("the gate ran and says why it could not decide");
        assert_eq!(numbers.pairs, 25);
        assert!(
            numbers.lower_bound_us <= numbers.allowance_us
                && numbers.allowance_us < numbers.upper_bound_us,
            "{numbers:?}"
        );
        match verdict {
            Verdict::Skip { reason, .. } => {
                assert!(reason.contains("25 clean pairs were too noisy"), "{reason}");
                assert!(reason.contains("allowance of 25.0 µs"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_undecided_gate_runs_another_round_and_skips_once_the_pairs_are_spent() {
        let rule = GateRule::default();
        let noisy = shared_machine_pairs();
        // 25 clean of 30: enough evidence, but the interval holds the allowance.
        assert_eq!(
            after_round(&noisy, 30, 30, 90, &rule, 1),
            Step::MorePairs(30)
        );
        // The last round is cut to what the maximum leaves; then the gate's SKIP stands.
        assert_eq!(
            after_round(&noisy, 50, 30, 60, &rule, 1),
            Step::MorePairs(10)
        );
        match after_round(&noisy, 60, 30, 60, &rule, 1) {
            Step::Decide(Verdict::Skip {
                numbers: Some(n), ..
            }) => assert_eq!(n.pairs, 25),
            other => panic!("{other:?}"),
        }
        // Quiet pairs decide at once, either way.
        let quiet = pairs(&[1.0, -1.0, 0.5, -0.5, 2.0].repeat(5), 60.0);
        assert!(matches!(
            after_round(&quiet, 30, 30, 90, &rule, 1),
            Step::Decide(Verdict::Pass(_))
        ));
        let harmful = pairs(&[41.0, 39.0, 40.5, 39.5, 42.0].repeat(5), 60.0);
        assert!(matches!(
            after_round(&harmful, 30, 30, 90, &rule, 1),
            Step::Decide(Verdict::Fail(_))
        ));
        // Too few clean pairs: the evidence rule speaks first.
        assert_eq!(
            after_round(&quiet[..10], 30, 30, 90, &rule, 1),
            Step::MorePairs(30)
        );
        assert!(matches!(
            after_round(&quiet[..10], 90, 30, 90, &rule, 1),
            Step::Decide(Verdict::Skip { numbers: None, .. })
        ));
    }

    #[test]
    fn the_bootstrap_bounds_enclose_the_median_of_spread_data() {
        let values: Vec<f64> = (0..31).map(f64::from).collect();
        let (lower, upper) =
            bootstrap_median_bounds(&values, 5000, 0.95, &mut SplitMix64::new(9)).unwrap();
        assert!(
            (0.0..15.0).contains(&lower) && upper > 15.0 && upper <= 30.0,
            "{lower} {upper}"
        );
        assert_eq!(
            bootstrap_median_bounds(&[3.0; 12], 500, 0.95, &mut SplitMix64::new(9)),
            Some((3.0, 3.0))
        );
    }

    #[test]
    fn a_third_of_the_pairs_clean_runs_more_rounds_then_skips_with_the_counts() {
        let rule = GateRule::default();
        assert_eq!(evidence(10, 30, 30, 90, &rule), Evidence::MorePairs(30));
        assert_eq!(evidence(20, 60, 30, 90, &rule), Evidence::MorePairs(30));
        match evidence(30, 90, 30, 90, &rule) {
            Evidence::Insufficient { reason } => {
                assert!(reason.contains("only 30 of 90 pairs"), "{reason}");
                assert!(reason.contains("at least 20 clean pairs"), "{reason}");
                assert!(reason.contains("40%"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_quiet_round_decides_at_once_and_a_disturbed_one_earns_another_round() {
        let rule = GateRule::default();
        assert_eq!(evidence(30, 30, 30, 90, &rule), Evidence::Enough);
        assert_eq!(evidence(20, 30, 30, 90, &rule), Evidence::Enough);
        // 14 of 30 (the run of an earlier committed report): too few, but a second round may make it.
        assert_eq!(evidence(14, 30, 30, 90, &rule), Evidence::MorePairs(30));
        assert_eq!(evidence(28, 60, 30, 90, &rule), Evidence::Enough);
        // Enough clean pairs, but too small a share of the pairs run.
        assert_eq!(evidence(22, 60, 30, 90, &rule), Evidence::MorePairs(30));
    }

    #[test]
    fn no_round_runs_that_even_all_clean_could_not_make_enough() {
        let rule = GateRule::default();
        // 0 of 60: the last 30 all clean would be 30 of 90, a third.
        assert!(matches!(
            evidence(0, 60, 30, 90, &rule),
            Evidence::Insufficient { .. }
        ));
        // The last round is cut to what the maximum leaves.
        assert_eq!(evidence(20, 70, 30, 90, &rule), Evidence::MorePairs(20));
        assert!(matches!(
            evidence(0, 0, 30, 0, &rule),
            Evidence::Insufficient { .. }
        ));
    }

    #[test]
    fn the_poisson_upper_bound_matches_its_closed_forms() {
        // k = 0: P(X = 0) = e^-m, so m = -ln(1 - confidence).
        assert!((poisson_upper(0, 0.999) - 1000f64.ln()).abs() < 1e-9);
        assert!((poisson_upper(0, 0.95) - 20f64.ln()).abs() < 1e-9);
        // k = 1: e^-m (1 + m) = 0.05 at m = 4.7439 (Garwood's table).
        assert!((poisson_upper(1, 0.95) - 4.7439).abs() < 1e-3);
        // k = 10: 16.962 (Garwood's table).
        assert!((poisson_upper(10, 0.95) - 16.962).abs() < 1e-2);
        // Large counts: about k + z sqrt(k), z = 3.09 at 99.9%.
        let upper = poisson_upper(2000, 0.999);
        assert!(upper > 2000.0 + 3.0 * 2000f64.sqrt() && upper < 2000.0 + 3.3 * 2000f64.sqrt());
    }

    fn scheduling(run_ms: u64, voluntary: u64, nonvoluntary: u64) -> Scheduling {
        Scheduling {
            run_ns: run_ms * 1_000_000,
            voluntary,
            nonvoluntary,
        }
    }

    #[test]
    fn the_busy_runners_74_preemptions_are_the_neighbours_when_the_reference_suffered_alike() {
        // The failed run: 74 involuntary against a fixed bound of 35, at 0.56% of a core.
        let agent = scheduling(336, 3000, 74);
        let reference = scheduling(330, 3010, 70);
        let p =
            preemption_beyond_reference(&agent, &reference, &PreemptionRule::default()).unwrap();
        assert!(p.pass, "{p:?}");
        assert_eq!(p.excess, 0.0);
        assert_eq!(p.allowance, 35);
        // A much busier neighbourhood: thousands, for both.
        let agent = scheduling(520, 3600, 2100);
        let reference = scheduling(500, 3600, 2000);
        let p =
            preemption_beyond_reference(&agent, &reference, &PreemptionRule::default()).unwrap();
        assert!(p.pass, "{p:?}");
    }

    #[test]
    fn an_agent_preempted_beyond_an_unpreempted_reference_fails() {
        let reference = scheduling(500, 3600, 0);
        let p = preemption_beyond_reference(
            &scheduling(520, 3586, 60),
            &reference,
            &PreemptionRule::default(),
        )
        .unwrap();
        // The neighbours explain at most ln(1000) / 0.5 s × 0.52 s = 7.2.
        assert!((p.neighbours_upper - 1000f64.ln() / 0.5 * 0.52).abs() < 1e-6);
        assert!(!p.pass, "{p:?}");
        // A quiet machine's run (one preemption in 3586 wake-ups) passes.
        let p = preemption_beyond_reference(
            &scheduling(522, 3586, 1),
            &reference,
            &PreemptionRule::default(),
        )
        .unwrap();
        assert!(p.pass, "{p:?}");
    }

    #[test]
    fn an_agent_preempted_per_wake_up_fails_beside_a_reference_preempted_per_hundred() {
        let p = preemption_beyond_reference(
            &scheduling(520, 3600, 3600),
            &scheduling(500, 3600, 36),
            &PreemptionRule::default(),
        )
        .unwrap();
        assert!(!p.pass, "{p:?}");
    }

    #[test]
    fn without_a_reference_there_is_no_comparison() {
        assert_eq!(
            preemption_beyond_reference(
                &scheduling(520, 3600, 3),
                &Scheduling::default(),
                &PreemptionRule::default()
            ),
            None
        );
    }
}
