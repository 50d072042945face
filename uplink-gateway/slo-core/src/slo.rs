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
//!
//! Invariants:
//! - Late samples need no special path: compliance over the period includes every sample whose
//!   event time falls in it, while a short window only sees samples stamped inside it.
//! - Rows come in catalog order, then by group.

use crate::GroupKey;
use crate::calendar::{format_duration, format_rfc3339};
use crate::catalog::{Bad, Catalog, PolicyCondition, Selector, Severity, Slo, fill_template};
use crate::series::{SeriesSet, Window};
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
    let mut rows = Vec::new();
    for slo in &catalog.slos {
        rows.extend(evaluate_slo(catalog, slo, series, now_ms));
    }
    SloReport {
        evaluated_at_ms: now_ms,
        evaluated_at: format_rfc3339(now_ms),
        rows,
    }
}

/// Σ increase per group of the series `selector` matches.
fn sum_by_group(
    series: &SeriesSet,
    selector: &Selector,
    window: Window,
    lookback_ms: i64,
) -> BTreeMap<GroupKey, f64> {
    let mut sums = BTreeMap::new();
    for s in series
        .metric(selector.metric)
        .filter(|s| selector.matches(s))
    {
        *sums.entry(GroupKey::of(s)).or_insert(0.0) += s.increase(window, lookback_ms);
    }
    sums
}

/// (total, bad) per group over one window.
struct WindowCounts {
    total: BTreeMap<GroupKey, f64>,
    bad: BTreeMap<GroupKey, f64>,
}

impl WindowCounts {
    fn new(slo: &Slo, series: &SeriesSet, window: Window, lookback_ms: i64) -> Self {
        let total = sum_by_group(series, &slo.sli.total(), window, lookback_ms);
        let bad = match slo.sli.bad() {
            Bad::Counter(sel) => sum_by_group(series, &sel, window, lookback_ms),
            Bad::TotalMinusGood(sel) => {
                let good = sum_by_group(series, &sel, window, lookback_ms);
                total
                    .iter()
                    .map(|(g, t)| (g.clone(), t - good.get(g).copied().unwrap_or(0.0)))
                    .collect()
            }
        };
        Self { total, bad }
    }

    fn get(&self, group: &GroupKey) -> (f64, f64) {
        (
            self.total.get(group).copied().unwrap_or(0.0),
            self.bad.get(group).copied().unwrap_or(0.0),
        )
    }

    fn error_ratio(&self, group: &GroupKey) -> Option<f64> {
        let (total, bad) = self.get(group);
        (total > 0.0).then(|| bad / total)
    }
}

fn evaluate_slo(catalog: &Catalog, slo: &Slo, series: &SeriesSet, now_ms: i64) -> Vec<SloRow> {
    let lookback = catalog.lookback_ms;
    let mut lengths: BTreeSet<i64> = BTreeSet::from([slo.period_ms]);
    for w in &catalog.alert_windows {
        lengths.extend([w.long_ms, w.short_ms]);
    }
    let counts: BTreeMap<i64, WindowCounts> = lengths
        .iter()
        .map(|&len| {
            let window = Window::ending_at(now_ms, len);
            (len, WindowCounts::new(slo, series, window, lookback))
        })
        .collect();
    let groups: BTreeSet<&GroupKey> = counts
        .values()
        .flat_map(|c| c.total.keys().chain(c.bad.keys()))
        .collect();
    let budget = slo.budget();

    groups
        .into_iter()
        .map(|group| {
            let period = &counts[&slo.period_ms];
            let (total_events, bad_events) = period.get(group);
            let period_ratio = period.error_ratio(group);
            let burn = |len: i64| counts[&len].error_ratio(group).map(|r| r / budget);
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
