//! SLO evaluation over event time: per SLO and per (machine class, site, model, model version),
//! compliance and error budget over the period, burn rates over each alert window, which alerts
//! fire, and what the error-budget policy says.
//!
//! Definitions (window `w` ends at the evaluation time, see [`crate::series`] for `increase`):
//! - `error_ratio(w) = Σ increase(bad, w) / Σ increase(total, w)` over the group's series: a ratio
//!   of sums, never an average of ratios. No events in `w` → no ratio (`None`).
//! - compliance = `1 − error_ratio(period)`; budget = `1 − objective`;
//!   budget remaining = `1 − error_ratio(period) / budget` (negative once overspent).
//! - burn rate(w) = `error_ratio(w) / budget`. An alert fires when the burn rate exceeds its
//!   factor over both its long and its short window (no `for` delay).
//! - incomplete = the samples of the counters the SLO reads that the gateway refused over the
//!   period (`edgewatch_refused_samples_total`, attributed by `Sli::reads_refused`); `None`
//!   when there were none. A group with refusals has a row even when nothing of it was stored.
//! - A deadline SLO's row is computed by one [`Semantics`], the first of completion, ABI 1
//!   probe, older agent whose counters hold samples of the group in the period: every number of
//!   the row (and so its alerts and policy) reads those counters only, so no row mixes two
//!   meanings of a miss. A row of an ABI 1 probe measures no bad events: no compliance, budget,
//!   burn rate, alert or policy action. The activations of the period that no deadline judged
//!   are counted per cause beside the numbers (`activations_not_judged`).
//!
//! Invariants:
//! - Late samples need no special path: compliance over the period includes every sample whose
//!   event time falls in it, while a short window only sees samples stamped inside it.
//! - Rows come in catalog order, then by group.
//! - A row whose bad events are not measured never shows a compliance, budget or burn rate.

use crate::GroupKey;
use crate::calendar::{format_duration, format_rfc3339};
use crate::catalog::{
    Bad, Catalog, Computation, PolicyCondition, Selector, Semantics, Severity, Slo, fill_template,
};
use crate::series::{Series, SeriesSet, Window};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// Every SLO row at one evaluation time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SloReport {
    /// Evaluation time, Unix ms.
    pub evaluated_at_ms: i64,
    /// Evaluation time, RFC 3339 UTC.
    pub evaluated_at: String,
    /// One row per SLO and group that has any matching series.
    pub rows: Vec<SloRow>,
}

/// One SLO for one group.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SloRow {
    /// SLO name.
    pub slo: String,
    /// The group.
    #[serde(flatten)]
    pub group: GroupKey,
    /// Objective, percent.
    pub objective_percent: f64,
    /// Period, e.g. `30d`.
    pub period: String,
    /// What judged the row's events, for a deadline SLO (`None` for other SLOs, and for a
    /// row of which nothing was stored): every number of the row reads these semantics only.
    pub semantics: Option<Semantics>,
    /// All events over the period.
    pub total_events: f64,
    /// Bad events over the period; `None` when the row's semantics measure none (an ABI 1
    /// probe).
    pub bad_events: Option<f64>,
    /// Good share over the period; `None` without events, or when bad events are not measured.
    pub compliance: Option<f64>,
    /// Share of the period's error budget left (1 = untouched, ≤ 0 = exhausted).
    pub budget_remaining: Option<f64>,
    /// Samples of this row's counters the gateway refused over the period: the row's numbers
    /// leave them out. `None` when the row's data is complete.
    pub incomplete: Option<u64>,
    /// A deadline SLO's activations over the period that no deadline judged, per cause: the
    /// row's numbers leave them out unless its semantics are theirs. `None` when there were
    /// none.
    pub activations_not_judged: Option<NotJudged>,
    /// One entry per alert window, in catalog order.
    pub burn_rates: Vec<BurnRate>,
    /// Names of the alerts firing (e.g. `SloErrorBudgetBurn1h5m`).
    pub alerts_firing: Vec<String>,
    /// Actions of every matching policy rule, in catalog order; empty means "ok".
    pub policy_actions: Vec<String>,
}

/// Activations no deadline judged, per cause.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct NotJudged {
    /// Counted by agents from before deadline semantics ([`Semantics::LegacyAgent`]).
    pub legacy_agent: f64,
    /// Counted from probes from before deadlines, ABI 1 ([`Semantics::LegacyProbe`]).
    pub legacy_probe: f64,
}

impl NotJudged {
    /// `(count, cause)` of each cause with activations.
    pub fn causes(&self) -> impl Iterator<Item = (f64, &'static str)> {
        [
            (self.legacy_agent, Semantics::LegacyAgent),
            (self.legacy_probe, Semantics::LegacyProbe),
        ]
        .into_iter()
        .filter(|(n, _)| *n > 0.0)
        .filter_map(|(n, semantics)| Some((n, semantics.unjudged_because()?)))
    }
}

impl SloRow {
    /// The policy outcome as one line: the actions joined by `; `, `ok`, or `-` when the row's
    /// bad events are not measured (no budget to judge).
    pub fn policy_outcome(&self) -> String {
        if !self.policy_actions.is_empty() {
            self.policy_actions.join("; ")
        } else if self.bad_events.is_none() {
            "-".to_owned()
        } else {
            "ok".to_owned()
        }
    }
}

/// Burn rates over one alert window pair.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BurnRate {
    /// `1h/5m`.
    pub window: String,
    /// Alert name.
    pub alert: String,
    /// Page or ticket.
    pub severity: Severity,
    /// Threshold both burn rates must exceed.
    pub factor: f64,
    /// Burn rate over the long window.
    pub long: Option<f64>,
    /// Burn rate over the short window.
    pub short: Option<f64>,
    /// Both above the factor.
    pub firing: bool,
}

/// Evaluates every SLO of `catalog` on `series` at event time `now_ms`.
pub fn evaluate(catalog: &Catalog, series: &SeriesSet, now_ms: i64) -> SloReport {
    let mut evaluation = Evaluation::new(catalog, now_ms);
    for s in series.iter() {
        evaluation.add(s);
    }
    evaluation.finish()
}

/// [`evaluate`] one series at a time, so a fleet's samples never need to be in memory at once:
/// a source can fetch one machine's series, add them, drop them and go on. Each series must be
/// added whole (all its samples in the needed range, in one call): increases add up across
/// series, not across pieces of one series.
#[derive(Debug)]
pub struct Evaluation<'a> {
    catalog: &'a Catalog,
    now_ms: i64,
    slos: Vec<SloSums>,
}

/// Running sums for one SLO: per group, one entry per window length.
#[derive(Debug)]
struct SloSums {
    lengths: Vec<i64>,
    /// Index of the period in `lengths`.
    period: usize,
    /// One per computation of the SLI, in order of precedence.
    computations: Vec<ComputationSums>,
    /// Activations no deadline judged over the period, per cause (deadline SLOs).
    unjudged: Vec<(Semantics, Selector, BTreeMap<GroupKey, f64>)>,
    /// Refused samples of the SLO's counters over the period.
    refused: BTreeMap<GroupKey, f64>,
}

/// Running sums of one computation: per group, one entry per window length.
#[derive(Debug)]
struct ComputationSums {
    computation: Computation,
    total: BTreeMap<GroupKey, Vec<f64>>,
    /// Bad events (`Bad::Counter`) or good events (`Bad::TotalMinusGood`).
    counted: BTreeMap<GroupKey, Vec<f64>>,
}

impl ComputationSums {
    /// Whether the group has samples of this computation's counters.
    fn holds(&self, group: &GroupKey) -> bool {
        self.total.contains_key(group)
            || matches!(self.computation.bad, Some(Bad::Counter(_)))
                && self.counted.contains_key(group)
    }
}

impl<'a> Evaluation<'a> {
    /// Starts an evaluation at event time `now_ms`.
    pub fn new(catalog: &'a Catalog, now_ms: i64) -> Self {
        let slos = catalog
            .slos
            .iter()
            .map(|slo| {
                let mut lengths: BTreeSet<i64> = BTreeSet::from([slo.period_ms]);
                for w in &catalog.alert_windows {
                    lengths.extend([w.long_ms, w.short_ms]);
                }
                let lengths: Vec<i64> = lengths.into_iter().collect();
                SloSums {
                    period: lengths
                        .iter()
                        .position(|l| *l == slo.period_ms)
                        .unwrap_or(0),
                    lengths,
                    computations: slo
                        .sli
                        .computations()
                        .into_iter()
                        .map(|computation| ComputationSums {
                            computation,
                            total: BTreeMap::new(),
                            counted: BTreeMap::new(),
                        })
                        .collect(),
                    unjudged: slo
                        .sli
                        .unjudged()
                        .into_iter()
                        .flatten()
                        .map(|(semantics, sel)| (semantics, sel, BTreeMap::new()))
                        .collect(),
                    refused: BTreeMap::new(),
                }
            })
            .collect();
        Self {
            catalog,
            now_ms,
            slos,
        }
    }

    /// Adds one whole series; series no SLO reads are ignored.
    pub fn add(&mut self, series: &Series) {
        let lookback = self.catalog.lookback_ms;
        let now_ms = self.now_ms;
        for (slo, sums) in self.catalog.slos.iter().zip(&mut self.slos) {
            if slo.sli.reads_refused(series) {
                let period = Window::ending_at(now_ms, slo.period_ms);
                *sums.refused.entry(GroupKey::of(series)).or_insert(0.0) +=
                    series.increase(period, lookback);
                continue;
            }
            let reads = |sel: &Selector| sel.matches(series);
            let read = sums.computations.iter().any(|c| {
                reads(&c.computation.total)
                    || c.computation
                        .bad
                        .as_ref()
                        .is_some_and(|b| reads(b.selector()))
            }) || sums.unjudged.iter().any(|(_, sel, _)| reads(sel));
            if !read {
                continue;
            }
            // Increases over every window length, once for all the counters this series is (a
            // probe's activations are a computation's total and a cause of activations not
            // judged).
            let increases: Vec<f64> = sums
                .lengths
                .iter()
                .map(|len| series.increase(Window::ending_at(now_ms, *len), lookback))
                .collect();
            let group = GroupKey::of(series);
            for c in &mut sums.computations {
                let counted = c.computation.bad.as_ref().map(Bad::selector);
                let target = if reads(&c.computation.total) {
                    &mut c.total
                } else if counted.is_some_and(reads) {
                    &mut c.counted
                } else {
                    continue;
                };
                let entry = target
                    .entry(group.clone())
                    .or_insert_with(|| vec![0.0; increases.len()]);
                for (slot, inc) in entry.iter_mut().zip(&increases) {
                    *slot += inc;
                }
            }
            for (_, sel, by_group) in &mut sums.unjudged {
                if reads(sel) {
                    *by_group.entry(group.clone()).or_insert(0.0) += increases[sums.period];
                }
            }
        }
    }

    /// The report.
    pub fn finish(self) -> SloReport {
        let mut rows = Vec::new();
        for (slo, sums) in self.catalog.slos.iter().zip(&self.slos) {
            rows.extend(evaluate_slo(self.catalog, slo, sums));
        }
        SloReport {
            evaluated_at_ms: self.now_ms,
            evaluated_at: format_rfc3339(self.now_ms),
            rows,
        }
    }
}

/// (total, bad) of one group over one window length; bad is `None` when not measured.
fn counts(sums: &SloSums, c: &ComputationSums, group: &GroupKey, len: i64) -> (f64, Option<f64>) {
    let i = sums.lengths.iter().position(|l| *l == len).unwrap_or(0);
    let get = |map: &BTreeMap<GroupKey, Vec<f64>>| map.get(group).map_or(0.0, |v| v[i]);
    let total = get(&c.total);
    let bad = match c.computation.bad {
        None => None,
        Some(Bad::Counter(_)) => Some(get(&c.counted)),
        Some(Bad::TotalMinusGood(_)) => Some(total - get(&c.counted)),
    };
    (total, bad)
}

fn error_ratio(sums: &SloSums, c: &ComputationSums, group: &GroupKey, len: i64) -> Option<f64> {
    match counts(sums, c, group, len) {
        (total, Some(bad)) if total > 0.0 => Some(bad / total),
        _ => None,
    }
}

fn evaluate_slo(catalog: &Catalog, slo: &Slo, sums: &SloSums) -> Vec<SloRow> {
    // Groups come from every computation's total counter; a bad counter without totals still
    // shows (no ratio), and so does a group whose samples were refused.
    let mut groups: BTreeSet<&GroupKey> = BTreeSet::new();
    for c in &sums.computations {
        groups.extend(c.total.keys());
        if let Some(Bad::Counter(_)) = c.computation.bad {
            groups.extend(c.counted.keys());
        }
    }
    for (_, _, by_group) in &sums.unjudged {
        groups.extend(by_group.keys());
    }
    groups.extend(
        sums.refused
            .iter()
            .filter(|(_, n)| **n > 0.0)
            .map(|(group, _)| group),
    );
    let budget = slo.budget();

    groups
        .into_iter()
        .filter_map(|group| {
            // The first computation that holds the group; with none (nothing stored), the
            // first, which then counts nothing.
            let chosen = sums.computations.iter().find(|c| c.holds(group));
            let c = chosen.or_else(|| sums.computations.first())?;
            let (total_events, bad_events) = counts(sums, c, group, slo.period_ms);
            let period_ratio = error_ratio(sums, c, group, slo.period_ms);
            let burn = |len: i64| error_ratio(sums, c, group, len).map(|r| r / budget);
            let burn_rates: Vec<BurnRate> = catalog
                .alert_windows
                .iter()
                .map(|w| {
                    let factor = w.factor(slo.period_ms);
                    let (long, short) = (burn(w.long_ms), burn(w.short_ms));
                    BurnRate {
                        window: w.label(),
                        alert: w.alert_name(),
                        severity: w.severity,
                        factor,
                        long,
                        short,
                        firing: long.is_some_and(|b| b > factor)
                            && short.is_some_and(|b| b > factor),
                    }
                })
                .collect();
            let budget_remaining = period_ratio.map(|r| 1.0 - r / budget);
            let policy_actions = catalog
                .policy
                .iter()
                .filter(|rule| match rule.condition {
                    PolicyCondition::BudgetExhausted => budget_remaining.is_some_and(|b| b <= 0.0),
                    PolicyCondition::BudgetBelow(limit) => {
                        budget_remaining.is_some_and(|b| b < limit)
                    }
                    PolicyCondition::AlertFiring(severity) => burn_rates
                        .iter()
                        .any(|b| b.firing && b.severity == severity),
                })
                .map(|rule| fill_template(&rule.action, &slo.name, group))
                .collect();
            let unjudged = |cause: Semantics| {
                sums.unjudged
                    .iter()
                    .filter(|(semantics, _, _)| *semantics == cause)
                    .filter_map(|(_, _, by_group)| by_group.get(group))
                    .sum::<f64>()
            };
            let not_judged = NotJudged {
                legacy_agent: unjudged(Semantics::LegacyAgent),
                legacy_probe: unjudged(Semantics::LegacyProbe),
            };
            Some(SloRow {
                slo: slo.name.clone(),
                group: group.clone(),
                objective_percent: slo.objective_percent,
                period: format_duration(slo.period_ms),
                semantics: chosen.and_then(|c| c.computation.semantics),
                total_events,
                bad_events,
                compliance: period_ratio.map(|r| 1.0 - r),
                budget_remaining,
                incomplete: sums
                    .refused
                    .get(group)
                    .filter(|n| **n > 0.0)
                    .map(|n| n.round() as u64),
                activations_not_judged: (not_judged.causes().next().is_some())
                    .then_some(not_judged),
                alerts_firing: burn_rates
                    .iter()
                    .filter(|b| b.firing)
                    .map(|b| b.alert.clone())
                    .collect(),
                burn_rates,
                policy_actions,
            })
        })
        .collect()
}
