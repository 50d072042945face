//! Plain-text tables of an [`SloReport`] and a [`CostReport`], for the gateway to print. The JSON
//! form of both reports is their `serde::Serialize` (e.g. `serde_json::to_string_pretty`).
//!
//! Invariants:
//! - Columns are aligned for any content; a missing value prints as `-`, never as NaN.
//! - A row whose samples the gateway refused says `incomplete N` in its DATA column, and a
//!   deadline row whose activations no deadline judged says how many and why there too.
//! - A deadline row says in its SEMANTICS column what its numbers count; one whose bad events
//!   are not measured shows `-` for compliance, budget, burn rates and policy, never 100 %.
//! - The text ends with a newline and holds no trailing spaces.

use crate::cost::{CostReport, CostSummary};
use crate::slo::{SloReport, SloRow};
use std::fmt::Write as _;

/// Alignment of a column.
#[derive(Clone, Copy, PartialEq)]
enum Align {
    Left,
    Right,
}

fn table(out: &mut String, headers: &[(&str, Align)], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|(h, _)| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut text = String::new();
        for (i, cell) in cells.enumerate() {
            if i > 0 {
                text.push_str("  ");
            }
            let pad = widths[i].saturating_sub(cell.chars().count());
            match headers[i].1 {
                Align::Left => {
                    text.push_str(cell);
                    text.extend(std::iter::repeat_n(' ', pad));
                }
                Align::Right => {
                    text.extend(std::iter::repeat_n(' ', pad));
                    text.push_str(cell);
                }
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&mut headers.iter().map(|(h, _)| *h));
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
}

fn or_dash(text: &str) -> String {
    if text.is_empty() {
        "-".to_owned()
    } else {
        text.to_owned()
    }
}

fn percent(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{:.decimals$}%", v * 100.0))
}

fn burn(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"))
}

/// The DATA cell: `complete` or `incomplete N`, then the activations no deadline judged, per
/// cause.
fn data(row: &SloRow) -> String {
    let mut text = row
        .incomplete
        .map_or_else(|| "complete".to_owned(), |n| format!("incomplete {n}"));
    for (n, cause) in row.activations_not_judged.iter().flat_map(|n| n.causes()) {
        let _ = write!(text, "; {n:.0} activations not judged ({cause})");
    }
    text
}

/// The SLO table: one line per SLO and (class, site, model, version).
pub fn render_slo_text(report: &SloReport) -> String {
    let mut out = format!("SLOs at {} (event time)\n", report.evaluated_at);
    if report.rows.is_empty() {
        out.push_str("No series match any SLO.\n");
        return out;
    }
    let windows: Vec<String> = report.rows[0]
        .burn_rates
        .iter()
        .map(|b| format!("BURN {} ({}x)", b.window, b.factor))
        .collect();
    let mut headers: Vec<(&str, Align)> = vec![
        ("SLO", Align::Left),
        ("CLASS", Align::Left),
        ("SITE", Align::Left),
        ("MODEL", Align::Left),
        ("VERSION", Align::Left),
        ("TARGET", Align::Right),
        ("PERIOD", Align::Right),
        ("SEMANTICS", Align::Left),
        ("COMPLIANCE", Align::Right),
        ("BUDGET LEFT", Align::Right),
        ("DATA", Align::Left),
    ];
    headers.extend(windows.iter().map(|w| (w.as_str(), Align::Right)));
    headers.extend([("ALERTS", Align::Left), ("POLICY", Align::Left)]);
    let rows: Vec<Vec<String>> = report
        .rows
        .iter()
        .map(|r| {
            let mut row = vec![
                r.slo.clone(),
                or_dash(&r.group.machine_class),
                or_dash(&r.group.site),
                or_dash(&r.group.model),
                or_dash(&r.group.model_version),
                format!("{}%", r.objective_percent),
                r.period.clone(),
                r.semantics.map_or("-", |s| s.describe()).to_owned(),
                percent(r.compliance, 4),
                percent(r.budget_remaining, 1),
                data(r),
            ];
            row.extend(
                r.burn_rates
                    .iter()
                    .map(|b| format!("{}/{}", burn(b.long), burn(b.short))),
            );
            let alerts: Vec<String> = r
                .burn_rates
                .iter()
                .filter(|b| b.firing)
                .map(|b| format!("{} {}", b.severity.as_str(), b.window))
                .collect();
            row.push(if alerts.is_empty() {
                "-".to_owned()
            } else {
                alerts.join(", ")
            });
            row.push(r.policy_outcome());
            row
        })
        .collect();
    table(&mut out, &headers, &rows);
    out
}

fn money(v: f64) -> String {
    format!("{v:.2}")
}

fn summary_rows(summaries: &[CostSummary]) -> Vec<Vec<String>> {
    summaries
        .iter()
        .map(|s| {
            vec![
                or_dash(&s.by),
                format!("{:.2}", s.autonomous_hours),
                money(s.amortization),
                money(s.energy),
                money(s.cloud_inference),
                money(s.training),
                money(s.total),
                s.cost_per_autonomous_hour
                    .map_or_else(|| "-".to_owned(), money),
            ]
        })
        .collect()
}

/// The cost tables: per machine, per site, per model version, and the total.
pub fn render_cost_text(report: &CostReport) -> String {
    let mut out = format!(
        "Cost from {} to {} ({})\n",
        report.period_start, report.period_end, report.currency
    );
    for (title, summaries) in [
        ("MACHINE", &report.by_machine),
        ("SITE", &report.by_site),
        ("MODEL VERSION", &report.by_model_version),
    ] {
        out.push('\n');
        let headers = [
            (title, Align::Left),
            ("AUTONOMOUS H", Align::Right),
            ("AMORTIZATION", Align::Right),
            ("ENERGY", Align::Right),
            ("CLOUD INFERENCE", Align::Right),
            ("TRAINING", Align::Right),
            ("TOTAL", Align::Right),
            ("PER AUTONOMOUS H", Align::Right),
        ];
        let mut rows = summary_rows(summaries);
        rows.extend(summary_rows(std::slice::from_ref(&report.total)));
        table(&mut out, &headers, &rows);
    }
    if !report.missing_prices.is_empty() {
        let _ = writeln!(
            out,
            "\nNo price for: {} (counted as 0).",
            report.missing_prices.join(", ")
        );
    }
    let unallocated: f64 = report.unallocated.iter().map(|u| u.amount).sum();
    if unallocated > 0.0 {
        let _ = writeln!(
            out,
            "\nUnallocated shares: {} {} on days without autonomous hours in scope.",
            money(unallocated),
            report.currency
        );
    }
    out
}
