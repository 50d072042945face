//! Plain-text tables of an [`SloReport`], a [`CostReport`] and a [`FleetTable`], for the gateway
//! to print. The JSON form of each is its `serde::Serialize` (e.g.
//! `serde_json::to_string_pretty`).
//!
//! Invariants:
//! - Columns are aligned for any content; a missing value prints as `-`, never as NaN.
//! - A row whose samples the gateway refused says `incomplete N` in its DATA column, and a
//!   deadline row whose activations no deadline judged says how many and why there too.
//! - A deadline row says in its SEMANTICS column what its numbers count; one whose bad events
//!   are not measured shows `-` for compliance, budget, burn rates and policy, never 100 %.
//! - The text ends with a newline and holds no trailing spaces.
//! - A label value is printed as it is, except that control characters are written as
//!   `\u{..}` escapes, so a crafted value cannot drive the terminal.

use crate::calendar::format_rfc3339;
use crate::cost::{CostReport, CostSummary};
use crate::fleet::{FleetTable, MachineDetail, MachineRow};
use crate::names::value;
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

/// A label value for a terminal: control characters escaped, `-` when empty.
fn label_text(text: &str) -> String {
    if text.is_empty() {
        return "-".to_owned();
    }
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// `2d 3h`, `4h 10m`, `12m 5s`, `40s`.
fn elapsed(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    let (d, h, m) = (s / 86_400, s % 86_400 / 3_600, s % 3_600 / 60);
    if d > 0 {
        format!("{d}d {h}h")
    } else if h > 0 {
        format!("{h}h {m}m")
    } else if m > 0 {
        format!("{m}m {}s", s % 60)
    } else {
        format!("{s}s")
    }
}

/// An integer as is, anything else with one decimal.
fn number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// `1.5 MB`-style byte counts (powers of 1000).
fn bytes(n: u64) -> String {
    let units = ["B", "kB", "MB", "GB", "TB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1000.0 && unit + 1 < units.len() {
        v /= 1000.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", units[unit])
    }
}

fn or_none<T>(v: Option<T>, f: impl FnOnce(T) -> String) -> String {
    v.map_or_else(|| "-".to_owned(), f)
}

fn fleet_row(row: &MachineRow, tiers: &[&str]) -> Vec<String> {
    let models: Vec<String> = row
        .models
        .iter()
        .map(|m| format!("{} {}", label_text(&m.model), label_text(&m.model_version)))
        .collect();
    let per_tier = |get: &dyn Fn(&str) -> Option<String>| -> String {
        tiers
            .iter()
            .map(|t| get(t).unwrap_or_else(|| "-".to_owned()))
            .collect::<Vec<_>>()
            .join("/")
    };
    let backlog = row.backlog.as_ref();
    let losses = row.losses.as_ref();
    vec![
        label_text(&row.machine_id),
        label_text(&row.machine_class),
        label_text(&row.site),
        if models.is_empty() {
            "-".to_owned()
        } else {
            models.join(", ")
        },
        match row.online {
            Some(true) => "online".to_owned(),
            Some(false) => "offline".to_owned(),
            None => "-".to_owned(),
        },
        or_none(row.last_event.clone(), |t| t),
        or_none(row.last_arrival.clone(), |t| t),
        or_none(row.silent_for_ms, elapsed),
        or_none(backlog, |b| {
            per_tier(&|t| b.tiers.get(t)?.records.map(|r| r.to_string()))
        }),
        or_none(backlog, |b| {
            bytes(b.tiers.values().filter_map(|t| t.bytes).sum())
        }),
        or_none(backlog.and_then(|b| b.as_of.clone()), |t| t),
        or_none(losses, |l| {
            per_tier(&|t| l.tiers.get(t).map(|n| n.to_string()))
        }),
        or_none(row.throttled_seconds.as_ref(), |seconds| {
            value::COMPONENTS
                .iter()
                .map(|c| {
                    seconds
                        .get(*c)
                        .map_or_else(|| "-".to_owned(), |v| number(*v))
                })
                .collect::<Vec<_>>()
                .join("/")
        }),
        or_none(row.autonomous_hours, |h| format!("{h:.2}")),
    ]
}

/// The machines table, tiers in the order given (the wire format's: safety, SLO, debug).
pub fn render_fleet_text(table_data: &FleetTable, tiers: &[&str]) -> String {
    let mut out = format!(
        "Machines at {} (throttled and autonomous over the last {}; silent machines looked for over {})\n",
        table_data.evaluated_at, table_data.window, table_data.lookback
    );
    if table_data.machines.is_empty() {
        out.push_str("No machine has reported within the lookback.\n");
        return out;
    }
    let tier_names = tiers.join("/");
    let backlog = format!("BACKLOG {tier_names}");
    let lost = format!("LOST {tier_names}");
    let throttled = format!("THROTTLED S {}", value::COMPONENTS.join("/"));
    let headers = [
        ("MACHINE", Align::Left),
        ("CLASS", Align::Left),
        ("SITE", Align::Left),
        ("MODEL", Align::Left),
        ("STATUS", Align::Left),
        ("LAST EVENT", Align::Left),
        ("LAST ARRIVAL", Align::Left),
        ("SILENT", Align::Right),
        (backlog.as_str(), Align::Right),
        ("BYTES", Align::Right),
        ("BACKLOG AS OF", Align::Left),
        (lost.as_str(), Align::Right),
        (throttled.as_str(), Align::Right),
        ("AUTONOMOUS H", Align::Right),
    ];
    let rows: Vec<Vec<String>> = table_data
        .machines
        .iter()
        .map(|row| fleet_row(row, tiers))
        .collect();
    table(&mut out, &headers, &rows);
    out
}

/// A machine's detail: its model versions, its partitions, its counters per bucket and its
/// health reports, tiers in the order given.
pub fn render_detail_text(detail: &MachineDetail, tiers: &[&str]) -> String {
    let mut out = format!(
        "Machine {} ({} at {}) from {} to {}\n",
        label_text(&detail.machine_id),
        label_text(&detail.machine_class),
        label_text(&detail.site),
        detail.from,
        detail.to
    );
    let _ = writeln!(
        out,
        "status {}; last event {}; last arrival {}",
        match detail.online {
            Some(true) => "online",
            Some(false) => "offline",
            None => "-",
        },
        or_none(detail.last_event_ms, format_rfc3339),
        or_none(detail.last_arrival_ms, format_rfc3339),
    );
    out.push('\n');
    let versions: Vec<Vec<String>> = detail
        .model_versions
        .iter()
        .map(|m| {
            vec![
                label_text(&m.model),
                label_text(&m.model_version),
                or_none(m.first_event_ms, format_rfc3339),
                format_rfc3339(m.last_event_ms),
            ]
        })
        .collect();
    let headers = [
        ("MODEL", Align::Left),
        ("VERSION", Align::Left),
        ("FIRST EVENT", Align::Left),
        ("LAST EVENT", Align::Left),
    ];
    table(&mut out, &headers, &versions);
    out.push('\n');
    let partitions: Vec<Vec<String>> = detail
        .partitions
        .iter()
        .map(|p| {
            vec![
                format_rfc3339(p.offline_ms),
                or_none(p.online_again_ms, format_rfc3339),
            ]
        })
        .collect();
    table(
        &mut out,
        &[("OFFLINE", Align::Left), ("ONLINE AGAIN", Align::Left)],
        &partitions,
    );
    out.push('\n');
    let sum = |map: &std::collections::BTreeMap<String, f64>| number(map.values().sum());
    let buckets: Vec<Vec<String>> = detail
        .buckets
        .iter()
        .map(|b| {
            let mut row = vec![
                format_rfc3339(b.end_ms),
                sum(&b.activations),
                sum(&b.deadline_misses),
            ];
            row.extend(value::COMPONENTS.iter().map(|c| {
                b.throttled_seconds
                    .get(*c)
                    .map_or_else(|| "-".to_owned(), |v| number(*v))
            }));
            row.extend(value::MODES.iter().map(|m| {
                b.mode_seconds
                    .get(*m)
                    .map_or_else(|| "-".to_owned(), |v| number(*v))
            }));
            row
        })
        .collect();
    let mut headers = vec![
        ("BUCKET END", Align::Left),
        ("ACTIVATIONS", Align::Right),
        ("DEADLINE MISSES", Align::Right),
    ];
    let throttled: Vec<String> = value::COMPONENTS
        .iter()
        .map(|c| format!("THROTTLED {c} S"))
        .collect();
    let modes: Vec<String> = value::MODES.iter().map(|m| format!("{m} S")).collect();
    headers.extend(throttled.iter().map(|h| (h.as_str(), Align::Right)));
    headers.extend(modes.iter().map(|h| (h.as_str(), Align::Right)));
    table(&mut out, &headers, &buckets);
    out.push('\n');
    let points: Vec<Vec<String>> = detail
        .backlog
        .iter()
        .map(|p| {
            let mut row = vec![format_rfc3339(p.at_ms)];
            row.extend(tiers.iter().map(|t| {
                p.tiers
                    .get(*t)
                    .and_then(|b| b.records)
                    .map_or_else(|| "-".to_owned(), |r| r.to_string())
            }));
            row
        })
        .collect();
    let tier_headers: Vec<String> = tiers.iter().map(|t| format!("BACKLOG {t}")).collect();
    let mut headers = vec![("HEALTH REPORT", Align::Left)];
    headers.extend(tier_headers.iter().map(|h| (h.as_str(), Align::Right)));
    table(&mut out, &headers, &points);
    out
}
