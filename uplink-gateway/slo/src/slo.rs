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
//!
//! Invariants:
//! - Late samples need no special path: compliance over the period includes every sample whose
//!   event time falls in it, while a short window only sees samples stamped inside it.
//! - Rows come in catalog order, then by group.

use crate::GroupKey;
use crate::calendar::{format_duration, format_rfc3339};
use crate::catalog::{Bad, Catalog, PolicyCondition, Selector, Severity, Slo, fill_template};
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
    /// All events over the period.
    pub total_events: f64,
    /// Bad events over the period.
    pub bad_events: f64,
    /// Good share over the period; `None` without events.
    pub compliance: Option<f64>,
    /// Share of the period's error budget left (1 = untouched, ≤ 0 = exhausted).
    pub budget_remaining: Option<f64>,
    /// Samples of this row's counters the gateway refused over the period: the row's numbers
    /// leave them out. `None` when the row's data is complete.
    pub incomplete: Option<u64>,
    /// One entry per alert window, in catalog order.
    pub burn_rates: Vec<BurnRate>,
    /// Names of the alerts firing (e.g. `SloErrorBudgetBurn1h5m`).
    pub alerts_firing: Vec<String>,
    /// Actions of every matching policy rule, in catalog order; empty means "ok".
    pub policy_actions: Vec<String>,
}

impl SloRow {
    /// The policy outcome as one line: the actions joined by `; `, or `ok`.
    pub fn policy_outcome(&self) -> String {
        if self.policy_actions.is_empty() {
            "ok".to_owned()
        } else {
            self.policy_actions.join("; ")
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
    total_selector: Selector,
    bad: Bad,
    lengths: Vec<i64>,
    total: BTreeMap<GroupKey, Vec<f64>>,
    /// Bad events (`Bad::Counter`) or good events (`Bad::TotalMinusGood`).
    counted: BTreeMap<GroupKey, Vec<f64>>,
    /// Refused samples of the SLO's counters over the period.
    refused: BTreeMap<GroupKey, f64>,
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
                SloSums {
                    total_selector: slo.sli.total(),
                    bad: slo.sli.bad(),
                    lengths: lengths.into_iter().collect(),
                    total: BTreeMap::new(),
                    counted: BTreeMap::new(),
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
        for (slo, sums) in self.catalog.slos.iter().zip(&mut self.slos) {
            if slo.sli.reads_refused(series) {
                let period = Window::ending_at(self.now_ms, slo.period_ms);
                *sums.refused.entry(GroupKey::of(series)).or_insert(0.0) +=
                    series.increase(period, lookback);
                continue;
            }
            let counted_selector = match &sums.bad {
                Bad::Counter(sel) | Bad::TotalMinusGood(sel) => sel,
            };
            let target = if sums.total_selector.matches(series) {
                &mut sums.total
            } else if counted_selector.matches(series) {
                &mut sums.counted
            } else {
                continue;
            };
            let entry = target
                .entry(GroupKey::of(series))
                .or_insert_with(|| vec![0.0; sums.lengths.len()]);
            for (slot, len) in entry.iter_mut().zip(&sums.lengths) {
                *slot += series.increase(Window::ending_at(self.now_ms, *len), lookback);
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

/// (total, bad) of one group over one window length.
fn counts(sums: &SloSums, group: &GroupKey, len: i64) -> (f64, f64) {
    let i = sums.lengths.iter().position(|l| *l == len).unwrap_or(0);
    let get = |map: &BTreeMap<GroupKey, Vec<f64>>| map.get(group).map_or(0.0, |v| v[i]);
    let total = get(&sums.total);
    let bad = match sums.bad {
        Bad::Counter(_) => get(&sums.counted),
        Bad::TotalMinusGood(_) => total - get(&sums.counted),
    };
    (total, bad)
}

fn error_ratio(sums: &SloSums, group: &GroupKey, len: i64) -> Option<f64> {
    let (total, bad) = counts(sums, group, len);
    (total > 0.0).then(|| bad / total)
}

fn evaluate_slo(catalog: &Catalog, slo: &Slo, sums: &SloSums) -> Vec<SloRow> {
    // Groups come from the total counter; a bad counter without totals still shows (no ratio),
    // and so does a group whose samples were refused.
    let mut groups: BTreeSet<&GroupKey> = sums.total.keys().collect();
    if let Bad::Counter(_) = sums.bad {
        groups.extend(sums.counted.keys());
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
        .map(|group| {
            let (total_events, bad_events) = counts(sums, group, slo.period_ms);
            let period_ratio = error_ratio(sums, group, slo.period_ms);
            let burn = |len: i64| error_ratio(sums, group, len).map(|r| r / budget);
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
            SloRow {
                slo: slo.name.clone(),
                group: group.clone(),
                objective_percent: slo.objective_percent,
                period: format_duration(slo.period_ms),
                total_events,
                bad_events,
                compliance: period_ratio.map(|r| 1.0 - r),
                budget_remaining,
                incomplete: sums
                    .refused
                    .get(group)
                    .filter(|n| **n > 0.0)
                    .map(|n| n.round() as u64),
                alerts_firing: burn_rates
                    .iter()
                    .filter(|b| b.firing)
                    .map(|b| b.alert.clone())
                    .collect(),
                burn_rates,
                policy_actions,
            }
        })
        .collect()
}
