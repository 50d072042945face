//! SLO & cost core of the uplink gateway: event-time compliance, error budgets, burn-rate alerts,
//! the error-budget policy, cost per autonomous machine-hour with FOCUS rows, the Prometheus
//! rules for the same catalog, and the fleet view's machines table. Pure logic: it reads no
//! clock, no file and no network; the gateway fetches raw samples (embedded store or
//! Prometheus) and prints what this crate returns.
//!
//! Layout:
//! - [`names`]: series names, label names and shared label values of `docs/series.md`, which the
//!   gateway writes by.
//! - [`series`]: raw counter samples ([`SeriesSet`]) and the one increase rule every number uses.
//! - [`catalog`]: the SLO catalog in config ([`RawCatalog`] → [`Catalog`]), defaults included.
//! - [`slo`]: [`evaluate`] → [`SloReport`]: compliance, budget, burn rates, alerts, policy;
//!   [`Evaluation`] does the same one series at a time, for bounded memory at fleet scale.
//! - [`mod@cost`]: the price book ([`RawPriceBook`] → [`PriceBook`]) and [`cost()`] → [`CostReport`]
//!   (or [`Costing`], one series at a time).
//! - [`focus`]: FOCUS CSV rows, corrections for restated closed days, the denominator table.
//! - [`fleet`]: the fleet view: [`fleet::table_needs`] → [`fleet::table`] (one row per
//!   machine: online state, last event and arrival, backlog, losses, throttled time,
//!   autonomous hours, model versions) and [`fleet::detail_needs`] → [`fleet::detail`].
//! - [`rules`]: [`render_rules`]: Prometheus recording and multi-window burn-rate alerting rules.
//! - [`dashboards`]: Grafana dashboards (fleet overview, SLO burn, machine detail, cost) and their
//!   provisioning files, reading the series of [`names`] and the records of [`rules`].
//! - [`report`]: plain-text tables of both reports and of the machines table (JSON comes from
//!   their `Serialize`).
//! - `calendar`: UTC days, months, RFC 3339 and Prometheus durations.
//!
//! Invariants:
//! - Every number is computed from raw samples with [`series::increase`], so any source that
//!   returns the samples named by [`required_series`] / [`cost_required_series`] yields the same
//!   report.
//! - Time is event time and always an argument.
//!
//! Metric names and labels follow `docs/series.md`, through [`names`].

pub mod catalog;
pub mod cost;
pub mod dashboards;
pub mod fleet;
pub mod focus;
pub mod names;
pub mod report;
pub mod rules;
pub mod series;
pub mod slo;

mod calendar;

pub use calendar::{MS_PER_DAY, format_rfc3339, parse_rfc3339};
pub use catalog::{Catalog, RawCatalog};
pub use cost::{CostReport, Costing, Period, PriceBook, RawPriceBook, cost};
pub use focus::{FocusRow, focus_rows};
pub use report::{render_cost_text, render_detail_text, render_fleet_text, render_slo_text};
pub use rules::render_rules;
pub use series::{Labels, Series, SeriesSet, Window};
pub use slo::{Evaluation, SloReport, evaluate};

use names::{label, metric};
use serde::Serialize;

/// One (machine class, site, model, model version) cell: the values of [`names::GROUP_LABELS`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct GroupKey {
    /// `machine_class` label.
    pub machine_class: String,
    /// `site` label.
    pub site: String,
    /// `model` label (empty for gateway series, which carry no model).
    pub model: String,
    /// `model_version` label (empty for gateway series).
    pub model_version: String,
}

impl GroupKey {
    pub(crate) fn of(series: &Series) -> Self {
        Self {
            machine_class: series.label(label::MACHINE_CLASS).to_owned(),
            site: series.label(label::SITE).to_owned(),
            model: series.label(label::MODEL).to_owned(),
            model_version: series.label(label::MODEL_VERSION).to_owned(),
        }
    }
}

/// Raw samples a report needs: every series of `metric` with samples in
/// `(end_ms − range_ms, end_ms]`, e.g. Prometheus `GET /api/v1/query?query=<metric>[<range>]&time=<end>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SeriesNeed {
    /// Metric name.
    pub metric: &'static str,
    /// Length of the range, ms (longest window plus the base lookback).
    pub range_ms: i64,
    /// End of the range (evaluation time), Unix ms.
    pub end_ms: i64,
}

impl SeriesNeed {
    /// The PromQL range selector, e.g. `edge_control_cycles_total[30d10m]` written in one unit.
    pub fn promql(&self) -> String {
        format!(
            "{}[{}]",
            self.metric,
            calendar::format_duration(self.range_ms)
        )
    }
}

fn merge_need(needs: &mut Vec<SeriesNeed>, metric: &'static str, range_ms: i64, end_ms: i64) {
    match needs.iter_mut().find(|n| n.metric == metric) {
        Some(need) => need.range_ms = need.range_ms.max(range_ms),
        None => needs.push(SeriesNeed {
            metric,
            range_ms,
            end_ms,
        }),
    }
}

/// Which metrics and ranges [`evaluate`] needs at `now_ms`, one entry per metric.
pub fn required_series(catalog: &Catalog, now_ms: i64) -> Vec<SeriesNeed> {
    let mut needs = Vec::new();
    let longest_window = catalog
        .alert_windows
        .iter()
        .map(|w| w.long_ms)
        .max()
        .unwrap_or(0);
    for slo in &catalog.slos {
        let range = slo.period_ms.max(longest_window) + catalog.lookback_ms;
        for metric in slo.sli.metrics() {
            merge_need(&mut needs, metric, range, now_ms);
        }
    }
    needs
}

/// Which metrics and ranges [`cost()`] needs for `period`, one entry per metric.
pub fn cost_required_series(book: &PriceBook, period: Period) -> Vec<SeriesNeed> {
    let range = period.end_ms - period.start_ms + book.lookback_ms;
    let mut needs = Vec::new();
    for metric in [metric::AUTONOMY_SECONDS, metric::ENERGY_JOULES] {
        merge_need(&mut needs, metric, range, period.end_ms);
    }
    needs
}
