//! The fleet page's views, rendered from what the SLO and fleet cores returned: pure functions
//! from reports to HTML (no I/O, no clock: the evaluation time is in the reports).
//!
//! Invariants:
//! - Every value goes through [`Html::text`] (escaped); markup is static.
//! - Every figure the overview shows also carries its exact value in `data-value` (Rust's
//!   shortest round-trip form of the same `f64` that `report --json` prints), so a test can
//!   compare the page with the report exactly.
//! - No script and no inline style: charts are inline SVG drawn with presentation attributes,
//!   sorting is a link (`?sort=`), the instant is a GET form (`?at=`); every link keeps `?at=`.
//! - Wide tables sit in a `.scroll` box, which scrolls on its own: the page never overflows
//!   horizontally.

use std::collections::{BTreeMap, HashMap};

use edgewatch_slo::cost::{CostLine, CostReport};
use edgewatch_slo::fleet::{FleetTable, MachineDetail, MachineRow, SortKey};
use edgewatch_slo::names::value;
use edgewatch_slo::slo::SloRow;
use edgewatch_slo::{GroupKey, SloReport, format_rfc3339};

use super::html::Html;
use crate::http::percent_encode;

/// The stylesheet, served same-origin at [`STYLESHEET_PATH`] (the CSP allows `style-src 'self'`).
pub const STYLESHEET: &str = "\
*{box-sizing:border-box}\
body{margin:0;font:14px/1.4 system-ui,-apple-system,'Segoe UI',sans-serif;color:#1d2329;background:#f6f7f9}\
header{background:#1d2329;color:#fff;padding:.5rem 1rem;display:flex;flex-wrap:wrap;gap:.5rem 1.5rem;align-items:center}\
header a{color:#cfe3ff;text-decoration:none}\
header a[aria-current]{color:#fff;font-weight:700;text-decoration:underline}\
header strong{font-size:1.1rem}\
nav{display:flex;flex-wrap:wrap;gap:.25rem 1rem}\
form{display:flex;flex-wrap:wrap;gap:.25rem;align-items:center;margin:0}\
input{font:inherit;width:13rem;max-width:100%}\
main{padding:.5rem 1rem 2rem;max-width:100%}\
h1{font-size:1.3rem;margin:.5rem 0}\
h2{font-size:1.1rem;margin:1.25rem 0 .5rem}\
.scroll{overflow-x:auto;max-width:100%;border:1px solid #dde1e6;background:#fff}\
table{border-collapse:collapse}\
th,td{padding:.25rem .5rem;border-bottom:1px solid #e6e9ed;text-align:left;white-space:nowrap;vertical-align:middle}\
th{background:#eef1f4;font-weight:600}\
td.num{text-align:right;font-variant-numeric:tabular-nums}\
tr.offline td{background:#fdecea}\
.offline-tag,.bad{color:#a0001c;font-weight:600}\
.ok{color:#1b6e20}\
.muted{color:#5f6b76}\
dl{display:grid;grid-template-columns:max-content 1fr;gap:.15rem 1rem;margin:.25rem 0}\
dt{color:#5f6b76}dd{margin:0}\
svg{vertical-align:middle}\
";

/// Where the stylesheet is served.
pub const STYLESHEET_PATH: &str = "/style.css";

/// The page's icon (browsers ask for one; a 404 would be a console error).
pub const ICON: &str = "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 16 16\">\
<rect width=\"16\" height=\"16\" rx=\"3\" fill=\"#1d2329\"/>\
<polyline points=\"2,11 6,7 9,9 14,3\" fill=\"none\" stroke=\"#cfe3ff\" stroke-width=\"2\"/></svg>\n";

/// Where the icon is served.
pub const ICON_PATH: &str = "/favicon.svg";

/// Points of each burn-rate sparkline.
pub const SPARK_POINTS: usize = 12;

/// The instant a page shows: `?at=` as given (kept in every link), or now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct At {
    /// `?at=` as the request gave it (RFC 3339); `None`: now.
    pub given: Option<String>,
    /// The instant, Unix ms.
    pub ms: i64,
}

impl At {
    /// The query string for a link to `path` with `params`, keeping `?at=`.
    fn link(&self, path: &str, params: &[(&str, &str)]) -> String {
        let mut query: Vec<String> = params
            .iter()
            .map(|(k, v)| format!("{k}={}", percent_encode(v)))
            .collect();
        if let Some(at) = &self.given {
            query.push(format!("at={}", percent_encode(at)));
        }
        if query.is_empty() {
            path.to_owned()
        } else {
            format!("{path}?{}", query.join("&"))
        }
    }
}

/// The gateway's own health, when the page is served by the gateway that ingests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Health {
    /// The broker acknowledged the subscription on the current connection.
    pub subscribed: bool,
    /// Unix time (s) of the last committed group; 0: none since start.
    pub last_commit_unix_s: i64,
    /// Remote-write requests not yet delivered.
    pub outbox_pending: u64,
    /// Messages dead-lettered since start (every reason, and refused remote-write requests).
    pub dead_letters: u64,
}

/// The page's views.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum View {
    /// `/`.
    Overview,
    /// `/machines` and `/machines/<id>`.
    Machines,
    /// `/rollouts`.
    Rollouts,
    /// `/cost`.
    Cost,
}

const VIEWS: [(View, &str, &str); 4] = [
    (View::Overview, "/", "Overview"),
    (View::Machines, "/machines", "Machines"),
    (View::Rollouts, "/rollouts", "Rollouts"),
    (View::Cost, "/cost", "Cost"),
];

/// The whole document around `body`: header with the views and the `?at=` form.
pub fn document(title: &str, view: Option<View>, at: &At, path: &str, body: &Html) -> String {
    let mut h = Html::new();
    h.raw("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">")
        .raw("<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">")
        .raw("<title>")
        .text(title)
        .raw(" · edgewatch</title><link rel=\"stylesheet\" href=\"")
        .raw(STYLESHEET_PATH)
        .raw("\"><link rel=\"icon\" type=\"image/svg+xml\" href=\"")
        .raw(ICON_PATH)
        .raw("\"></head><body><header><strong>edgewatch fleet</strong><nav>");
    for (v, href, name) in VIEWS {
        h.raw("<a href=\"").text(&at.link(href, &[])).raw("\"");
        if Some(v) == view {
            h.raw(" aria-current=\"page\"");
        }
        h.raw(">").text(name).raw("</a>");
    }
    h.raw("</nav><form method=\"get\" action=\"")
        .text(path)
        .raw("\"><label for=\"at\">at</label><input id=\"at\" name=\"at\" placeholder=\"now (RFC 3339 UTC)\" value=\"")
        .text(at.given.as_deref().unwrap_or(""))
        .raw("\"><button type=\"submit\">show</button></form><span class=\"muted\">event time ")
        .text(&format_rfc3339(at.ms))
        .raw("</span></header><main>")
        .html(body)
        .raw("</main></body></html>\n");
    h.into_string()
}

/// A page saying what went wrong (a bad `?at=`, an unknown machine, a failed read).
pub fn message(heading: &str, text: &str) -> Html {
    let mut h = Html::new();
    h.raw("<h1>")
        .text(heading)
        .raw("</h1><p>")
        .text(text)
        .raw("</p>");
    h
}

fn or_dash(text: &str) -> &str {
    if text.is_empty() { "-" } else { text }
}

fn percent(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{:.decimals$}%", v * 100.0))
}

fn fixed(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.decimals$}"))
}

/// A duration in its two largest units, e.g. `2d 3h`, `5m 12s`.
pub fn age(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    let (d, h, m, s) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m {s}s"),
        (0, _, _) => format!("{h}h {m}m"),
        _ => format!("{d}d {h}h"),
    }
}

/// A figure cell: its text, and its exact value in `data-value` (absent when there is none).
fn figure(h: &mut Html, field: &str, value: Option<f64>, text: &str) {
    h.raw("<td class=\"num\" data-field=\"")
        .text(field)
        .raw("\"");
    if let Some(v) = value {
        h.raw(" data-value=\"").text(&v.to_string()).raw("\"");
    }
    h.raw(">").text(text).raw("</td>");
}

/// An inline SVG bar of `share` (0..1, clamped) of its width.
fn bar(h: &mut Html, share: Option<f64>) {
    let Some(share) = share else {
        return;
    };
    let width = (share.clamp(0.0, 1.0) * 80.0).round();
    let fill = if share <= 0.0 {
        "#a0001c"
    } else if share < 0.25 {
        "#d97706"
    } else {
        "#1b6e20"
    };
    h.raw("<svg width=\"80\" height=\"10\" viewBox=\"0 0 80 10\" role=\"img\" aria-label=\"budget left\">")
        .raw("<rect width=\"80\" height=\"10\" fill=\"#e6e9ed\"/><rect height=\"10\" width=\"")
        .text(&width.to_string())
        .raw("\" fill=\"")
        .text(fill)
        .raw("\"/></svg> ");
}

/// An inline SVG sparkline of `values` (oldest first; `None` leaves a gap), with the dashed
/// threshold `factor`.
fn sparkline(h: &mut Html, values: &[Option<f64>], factor: f64, title: &str) {
    const W: f64 = 72.0;
    const H: f64 = 18.0;
    let top = values
        .iter()
        .flatten()
        .fold(factor, |a, &b| if b.is_finite() { a.max(b) } else { a })
        .max(f64::MIN_POSITIVE);
    let step = if values.len() > 1 {
        W / (values.len() - 1) as f64
    } else {
        0.0
    };
    let y = |v: f64| H - (v / top).clamp(0.0, 1.0) * (H - 2.0) - 1.0;
    let mut points = String::new();
    for (i, v) in values.iter().enumerate() {
        if let Some(v) = v.filter(|v| v.is_finite()) {
            points.push_str(&format!("{:.1},{:.1} ", i as f64 * step, y(v)));
        }
    }
    h.raw("<svg width=\"72\" height=\"18\" viewBox=\"0 0 72 18\" role=\"img\"><title>")
        .text(title)
        .raw("</title><line x1=\"0\" x2=\"72\" stroke=\"#a0001c\" stroke-width=\"1\" stroke-dasharray=\"2 2\" y1=\"")
        .text(&format!("{:.1}", y(factor)))
        .raw("\" y2=\"")
        .text(&format!("{:.1}", y(factor)))
        .raw("\"/><polyline fill=\"none\" stroke=\"#2563eb\" stroke-width=\"1.5\" points=\"")
        .text(points.trim_end())
        .raw("\"/></svg> ");
}

/// The overview's incomplete-data cell: `complete`, or `incomplete` with the refused samples
/// and the activations no deadline judged.
fn data_cell(h: &mut Html, row: &SloRow) {
    h.raw("<td data-field=\"data\"");
    if let Some(n) = row.incomplete {
        h.raw(" data-value=\"")
            .text(&n.to_string())
            .raw("\" class=\"bad\">incomplete: ");
        h.text(&format!("{n} samples refused"));
    } else {
        h.raw(">complete");
    }
    for (n, cause) in row.activations_not_judged.iter().flat_map(|n| n.causes()) {
        h.raw("; ")
            .text(&format!("{n:.0} activations not judged ({cause})"));
    }
    h.raw("</td>");
}

/// Burn rates of one row at each sparkline instant: `[window pair][instant]`, long window.
pub type Sparks = HashMap<(String, GroupKey), Vec<Vec<Option<f64>>>>;

/// The sparklines of every row of `reports` (oldest first, one report per instant).
pub fn sparks(reports: &[SloReport]) -> Sparks {
    let mut out: Sparks = HashMap::new();
    for (i, report) in reports.iter().enumerate() {
        for row in &report.rows {
            let entry = out
                .entry((row.slo.clone(), row.group.clone()))
                .or_insert_with(|| vec![vec![None; reports.len()]; row.burn_rates.len()]);
            for (pair, burn) in entry.iter_mut().zip(&row.burn_rates) {
                pair[i] = burn.long;
            }
        }
    }
    out
}

/// What the overview knows of the newest data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Newest {
    /// Newest event time received from any machine, Unix ms.
    pub event_ms: Option<i64>,
    /// Newest arrival, Unix ms.
    pub arrival_ms: Option<i64>,
}

impl Newest {
    /// The newest event and arrival of a machines table.
    pub fn of(table: &FleetTable) -> Self {
        Self {
            event_ms: table.machines.iter().filter_map(|m| m.last_event_ms).max(),
            arrival_ms: table
                .machines
                .iter()
                .filter_map(|m| m.last_arrival_ms)
                .max(),
        }
    }
}

/// `/`: the SLO rows, the gateway's health and the age of the newest data.
pub fn overview(
    report: &SloReport,
    sparks: &Sparks,
    span: &str,
    health: Option<&Health>,
    newest: Newest,
    at: &At,
) -> Html {
    let mut h = Html::new();
    h.raw("<h1>Overview</h1><h2>Gateway</h2><dl>");
    match health {
        Some(health) => {
            h.raw("<dt>subscription</dt><dd data-field=\"subscribed\">")
                .raw(if health.subscribed {
                    "<span class=\"ok\">subscribed</span>"
                } else {
                    "<span class=\"bad\">not subscribed</span>"
                })
                .raw("</dd><dt>last commit</dt><dd>");
            if health.last_commit_unix_s > 0 {
                h.text(&format_rfc3339(
                    health.last_commit_unix_s.saturating_mul(1000),
                ));
            } else {
                h.raw("none since start");
            }
            h.raw("</dd><dt>remote-write outbox</dt><dd data-field=\"outbox\">")
                .text(&health.outbox_pending.to_string())
                .raw(" pending</dd><dt>dead letters</dt><dd data-field=\"dead_letters\">")
                .text(&health.dead_letters.to_string())
                .raw(" since start</dd>");
        }
        None => {
            h.raw("<dt>health</dt><dd class=\"muted\">this page is served by a reader, not by \
                   the gateway that ingests: its health is on that gateway's own page and /metrics</dd>");
        }
    }
    h.raw("<dt>newest event</dt><dd data-field=\"newest_event\">");
    match newest.event_ms {
        Some(ms) => {
            h.text(&format_rfc3339(ms))
                .raw(" (")
                .text(&age(at.ms - ms))
                .raw(" before the page's instant)");
        }
        None => {
            h.raw("none within the lookback");
        }
    }
    h.raw("</dd><dt>newest arrival</dt><dd>");
    match newest.arrival_ms {
        Some(ms) => {
            h.text(&format_rfc3339(ms));
        }
        None => {
            h.raw("-");
        }
    }
    h.raw("</dd></dl><h2>SLOs at ")
        .text(&report.evaluated_at)
        .raw("</h2>");
    if report.rows.is_empty() {
        h.raw("<p>No series match any SLO.</p>");
        return h;
    }
    h.raw("<div class=\"scroll\"><table id=\"slos\"><thead><tr><th>SLO</th><th>class</th><th>site</th>\
           <th>model</th><th>version</th><th>objective</th><th>compliance</th><th>budget left</th>");
    for burn in &report.rows[0].burn_rates {
        h.raw("<th>burn ")
            .text(&burn.window)
            .raw(" (")
            .text(&format!("{}×", burn.factor))
            .raw(")</th>");
    }
    h.raw("<th>alerts firing</th><th>policy</th><th>data</th></tr></thead><tbody>");
    for (i, row) in report.rows.iter().enumerate() {
        h.raw("<tr data-row=\"")
            .text(&i.to_string())
            .raw("\"><td>")
            .text(&row.slo);
        for part in [
            &row.group.machine_class,
            &row.group.site,
            &row.group.model,
            &row.group.model_version,
        ] {
            h.raw("</td><td>").text(or_dash(part));
        }
        h.raw("</td>");
        figure(
            &mut h,
            "objective_percent",
            Some(row.objective_percent),
            &format!("{}%", row.objective_percent),
        );
        figure(
            &mut h,
            "compliance",
            row.compliance,
            &percent(row.compliance, 4),
        );
        h.raw("<td class=\"num\" data-field=\"budget_remaining\"");
        if let Some(v) = row.budget_remaining {
            h.raw(" data-value=\"").text(&v.to_string()).raw("\"");
        }
        h.raw(">");
        bar(&mut h, row.budget_remaining);
        h.text(&percent(row.budget_remaining, 1)).raw("</td>");
        let key = (row.slo.clone(), row.group.clone());
        for (pair, burn) in row.burn_rates.iter().enumerate() {
            h.raw("<td class=\"num\" data-field=\"burn\" data-window=\"")
                .text(&burn.window)
                .raw("\"");
            for (name, value) in [("data-long", burn.long), ("data-short", burn.short)] {
                if let Some(v) = value {
                    h.raw(" ")
                        .text(name)
                        .raw("=\"")
                        .text(&v.to_string())
                        .raw("\"");
                }
            }
            h.raw(">");
            if let Some(points) = sparks.get(&key).and_then(|s| s.get(pair)) {
                sparkline(
                    &mut h,
                    points,
                    burn.factor,
                    &format!("long-window burn rate over the last {span}"),
                );
            }
            if burn.firing {
                h.raw("<span class=\"bad\">");
            } else {
                h.raw("<span>");
            }
            h.text(&format!("{}/{}", fixed(burn.long, 2), fixed(burn.short, 2)))
                .raw("</span></td>");
        }
        h.raw("<td data-field=\"alerts\">");
        if row.alerts_firing.is_empty() {
            h.raw("-");
        } else {
            h.raw("<span class=\"bad\">")
                .text(&row.alerts_firing.join(", "))
                .raw("</span>");
        }
        h.raw("</td><td data-field=\"policy\">")
            .text(&row.policy_outcome())
            .raw("</td>");
        data_cell(&mut h, row);
        h.raw("</tr>");
    }
    h.raw("</tbody></table></div><p class=\"muted\">Burn: long/short window burn rates at the instant; \
           the sparkline draws the long window's over the last ")
        .text(span)
        .raw(" against the alert's threshold (dashed).</p>");
    h
}

const SORTABLE: [(&str, SortKey); 11] = [
    ("machine", SortKey::Machine),
    ("class", SortKey::Class),
    ("site", SortKey::Site),
    ("model", SortKey::Model),
    ("status", SortKey::Online),
    ("last event", SortKey::LastEvent),
    ("last arrival", SortKey::Silent),
    ("backlog", SortKey::Backlog),
    ("lost", SortKey::Losses),
    ("throttled s", SortKey::Throttled),
    ("autonomous h", SortKey::Autonomy),
];

fn tier_records<'a>(
    tiers: impl Iterator<Item = &'a str>,
    of: impl Fn(&str) -> Option<u64>,
) -> String {
    tiers
        .map(|t| of(t).map_or_else(|| "-".to_owned(), |n| n.to_string()))
        .collect::<Vec<_>>()
        .join("/")
}

fn status(h: &mut Html, online: Option<bool>) {
    match online {
        Some(true) => h.raw("<td data-field=\"status\" data-value=\"online\" class=\"ok\">online</td>"),
        Some(false) => h.raw(
            "<td data-field=\"status\" data-value=\"offline\"><span class=\"offline-tag\">offline</span></td>",
        ),
        None => h.raw("<td data-field=\"status\" data-value=\"unknown\" class=\"muted\">-</td>"),
    };
}

fn machine_row(h: &mut Html, row: &MachineRow, at: &At, tiers: &[&str]) {
    h.raw("<tr data-machine=\"").text(&row.machine_id).raw("\"");
    if row.online == Some(false) {
        h.raw(" class=\"offline\"");
    }
    h.raw("><td><a href=\"")
        .text(&at.link(
            &format!("/machines/{}", percent_encode(&row.machine_id)),
            &[],
        ))
        .raw("\">")
        .text(&row.machine_id)
        .raw("</a></td><td>")
        .text(or_dash(&row.machine_class))
        .raw("</td><td>")
        .text(or_dash(&row.site))
        .raw("</td><td>");
    let models: Vec<String> = row
        .models
        .iter()
        .map(|m| format!("{} {}", m.model, m.model_version))
        .collect();
    h.text(or_dash(&models.join(", "))).raw("</td>");
    status(h, row.online);
    h.raw("<td>")
        .text(row.last_event.as_deref().unwrap_or("-"))
        .raw("</td><td>")
        .text(row.last_arrival.as_deref().unwrap_or("-"))
        .raw("</td><td class=\"num\">")
        .text(&row.silent_for_ms.map_or_else(|| "-".to_owned(), age))
        .raw("</td><td class=\"num\">");
    match &row.backlog {
        Some(backlog) => {
            h.text(&tier_records(tiers.iter().copied(), |t| {
                backlog.tiers.get(t).and_then(|b| b.records)
            }))
            .raw("</td><td>")
            .text(backlog.as_of.as_deref().unwrap_or("-"));
        }
        None => {
            h.raw("-</td><td>-");
        }
    }
    h.raw("</td><td class=\"num\">");
    match &row.losses {
        Some(losses) => {
            h.text(&tier_records(tiers.iter().copied(), |t| {
                losses.tiers.get(t).copied()
            }));
        }
        None => {
            h.raw("-");
        }
    }
    h.raw("</td><td class=\"num\">")
        .text(&fixed(row.throttled_total(), 0))
        .raw("</td><td class=\"num\">")
        .text(&fixed(row.autonomous_hours, 2))
        .raw("</td></tr>");
}

/// `/machines`: the machines table, sorted by `sort`, each header a link to its order.
pub fn machines(table: &FleetTable, sort: SortKey, at: &At, tiers: &[&str]) -> Html {
    let mut h = Html::new();
    h.raw("<h1>Machines</h1><p class=\"muted\">")
        .text(&format!(
            "{} machines at {}; throttled time and autonomous hours over the last {}; silent machines looked for over {}. Sorted by {}.",
            table.machines.len(),
            table.evaluated_at,
            table.window,
            table.lookback,
            sort.name()
        ))
        .raw("</p>");
    if table.machines.is_empty() {
        h.raw("<p>No machine has reported within the lookback.</p>");
        return h;
    }
    h.raw("<div class=\"scroll\"><table id=\"machines\"><thead><tr>");
    let tier_names = tiers.join("/");
    for (i, (name, key)) in SORTABLE.iter().enumerate() {
        h.raw("<th");
        if *key == sort {
            h.raw(" aria-sort=\"ascending\"");
        }
        h.raw("><a href=\"")
            .text(&at.link("/machines", &[("sort", key.name())]))
            .raw("\" data-sort=\"")
            .text(key.name())
            .raw("\">")
            .text(name);
        if *key == SortKey::Backlog || *key == SortKey::Losses {
            h.raw(" ").text(&tier_names);
        }
        h.raw("</a></th>");
        if i == 6 {
            h.raw("<th>silent for</th>");
        }
        if *key == SortKey::Backlog {
            h.raw("<th>backlog as of</th>");
        }
    }
    h.raw("</tr></thead><tbody>");
    for row in &table.machines {
        machine_row(&mut h, row, at, tiers);
    }
    h.raw("</tbody></table></div>");
    h
}

/// An inline SVG bar chart of `values` (one bar per bucket), with a title naming its maximum.
fn bars(h: &mut Html, values: &[f64], title: &str) {
    const W: f64 = 480.0;
    const H: f64 = 60.0;
    let top = values.iter().copied().fold(0.0_f64, f64::max);
    let n = values.len().max(1) as f64;
    let width = W / n;
    h.raw("<figure><figcaption>")
        .text(&format!("{title} (max {top:.1} per bucket)"))
        .raw("</figcaption><svg viewBox=\"0 0 480 60\" width=\"100%\" height=\"60\" preserveAspectRatio=\"none\" role=\"img\"><title>")
        .text(title)
        .raw("</title><rect width=\"480\" height=\"60\" fill=\"#f0f2f5\"/>");
    for (i, v) in values.iter().enumerate() {
        let height = if top > 0.0 { v / top * (H - 2.0) } else { 0.0 };
        h.raw("<rect fill=\"#2563eb\" x=\"")
            .text(&format!("{:.1}", i as f64 * width + 1.0))
            .raw("\" width=\"")
            .text(&format!("{:.1}", (width - 2.0).max(1.0)))
            .raw("\" y=\"")
            .text(&format!("{:.1}", H - height))
            .raw("\" height=\"")
            .text(&format!("{height:.1}"))
            .raw("\"/>");
    }
    h.raw("</svg></figure>");
}

/// `/machines/<id>`: one machine over the detail's range.
pub fn machine(detail: &MachineDetail, at: &At, tiers: &[&str]) -> Html {
    let mut h = Html::new();
    h.raw("<h1>Machine ")
        .text(&detail.machine_id)
        .raw("</h1><dl><dt>class</dt><dd>")
        .text(or_dash(&detail.machine_class))
        .raw("</dd><dt>site</dt><dd>")
        .text(or_dash(&detail.site))
        .raw("</dd><dt>status</dt><dd data-field=\"status\">")
        .raw(match detail.online {
            Some(true) => "<span class=\"ok\">online</span>",
            Some(false) => "<span class=\"offline-tag\">offline</span>",
            None => "-",
        })
        .raw("</dd><dt>last event</dt><dd>")
        .text(
            &detail
                .last_event_ms
                .map_or_else(|| "-".to_owned(), format_rfc3339),
        )
        .raw("</dd><dt>last arrival</dt><dd>")
        .text(
            &detail
                .last_arrival_ms
                .map_or_else(|| "-".to_owned(), format_rfc3339),
        )
        .raw("</dd><dt>range</dt><dd>")
        .text(&format!("{} to {}", detail.from, detail.to))
        .raw("</dd></dl><h2>Over time</h2>");
    let sum = |f: fn(&edgewatch_slo::fleet::Bucket) -> &BTreeMap<String, f64>| -> Vec<f64> {
        detail.buckets.iter().map(|b| f(b).values().sum()).collect()
    };
    bars(&mut h, &sum(|b| &b.deadline_misses), "deadline misses");
    bars(
        &mut h,
        &sum(|b| &b.throttled_seconds),
        "throttled seconds (every component)",
    );
    for mode in value::MODES {
        let values: Vec<f64> = detail
            .buckets
            .iter()
            .map(|b| b.mode_seconds.get(mode).copied().unwrap_or(0.0))
            .collect();
        bars(&mut h, &values, &format!("seconds in mode {mode}"));
    }
    h.raw("<h2>Queue backlog (health reports)</h2>");
    if detail.backlog.is_empty() {
        h.raw("<p>No health report in the range.</p>");
    } else {
        for tier in tiers {
            let values: Vec<f64> = detail
                .backlog
                .iter()
                .map(|p| {
                    p.tiers
                        .get(*tier)
                        .and_then(|b| b.records)
                        .map_or(0.0, |r| r as f64)
                })
                .collect();
            bars(&mut h, &values, &format!("backlog records, tier {tier}"));
        }
        h.raw("<p class=\"muted\">")
            .text(&format!(
                "{} reports, the last at {}",
                detail.backlog.len(),
                detail
                    .backlog
                    .last()
                    .map_or_else(|| "-".to_owned(), |p| format_rfc3339(p.at_ms))
            ))
            .raw("</p>");
    }
    h.raw("<h2>Model versions</h2><div class=\"scroll\"><table><thead><tr><th>model</th><th>version</th>\
           <th>first event</th><th>last event</th></tr></thead><tbody>");
    for m in &detail.model_versions {
        h.raw("<tr><td>")
            .text(&m.model)
            .raw("</td><td>")
            .text(&m.model_version)
            .raw("</td><td>")
            .text(
                &m.first_event_ms
                    .map_or_else(|| "-".to_owned(), format_rfc3339),
            )
            .raw("</td><td>")
            .text(&format_rfc3339(m.last_event_ms))
            .raw("</td></tr>");
    }
    h.raw("</tbody></table></div><h2>Partitions</h2>");
    if detail.partitions.is_empty() {
        h.raw("<p>None in the range.</p>");
    } else {
        h.raw("<div class=\"scroll\"><table id=\"partitions\"><thead><tr><th>offline</th><th>online again</th>\
               <th>for</th></tr></thead><tbody>");
        for p in &detail.partitions {
            h.raw("<tr><td>")
                .text(&format_rfc3339(p.offline_ms))
                .raw("</td><td>")
                .text(
                    &p.online_again_ms
                        .map_or_else(|| "still offline".to_owned(), format_rfc3339),
                )
                .raw("</td><td class=\"num\">")
                .text(&age(p.online_again_ms.unwrap_or(at.ms) - p.offline_ms))
                .raw("</td></tr>");
        }
        h.raw("</tbody></table></div>");
    }
    h
}

/// `/rollouts`: per model version, the machines running it and its burn across classes and
/// sites.
pub fn rollouts(table: &FleetTable, report: &SloReport, at: &At) -> Html {
    let mut versions: BTreeMap<(String, String), Vec<&MachineRow>> = BTreeMap::new();
    for row in &table.machines {
        for m in &row.models {
            versions
                .entry((m.model.clone(), m.model_version.clone()))
                .or_default()
                .push(row);
        }
    }
    for row in &report.rows {
        if !row.group.model_version.is_empty() {
            versions
                .entry((row.group.model.clone(), row.group.model_version.clone()))
                .or_default();
        }
    }
    let mut h = Html::new();
    h.raw("<h1>Rollouts</h1>");
    if versions.is_empty() {
        h.raw("<p>No model version within the lookback.</p>");
        return h;
    }
    for ((model, version), machines) in &versions {
        h.raw("<section data-model-version=\"")
            .text(version)
            .raw("\"><h2>")
            .text(&format!("{model} {version}"))
            .raw("</h2><p>")
            .text(&match machines.len() {
                1 => "1 machine running it".to_owned(),
                n => format!("{n} machines running it"),
            });
        let offline = machines.iter().filter(|m| m.online == Some(false)).count();
        if offline > 0 {
            h.raw(" (<span class=\"offline-tag\">")
                .text(&format!("{offline} offline"))
                .raw("</span>)");
        }
        h.raw(": ");
        for (i, m) in machines.iter().enumerate() {
            if i > 0 {
                h.raw(", ");
            }
            h.raw("<a href=\"")
                .text(&at.link(&format!("/machines/{}", percent_encode(&m.machine_id)), &[]))
                .raw("\">")
                .text(&m.machine_id)
                .raw("</a>");
        }
        h.raw("</p>");
        let rows: Vec<&SloRow> = report
            .rows
            .iter()
            .filter(|r| &r.group.model == model && &r.group.model_version == version)
            .collect();
        if rows.is_empty() {
            h.raw("<p class=\"muted\">No SLO row for this version.</p></section>");
            continue;
        }
        h.raw(
            "<div class=\"scroll\"><table><thead><tr><th>SLO</th><th>class</th><th>site</th>\
               <th>compliance</th><th>budget left</th>",
        );
        for burn in &rows[0].burn_rates {
            h.raw("<th>burn ").text(&burn.window).raw("</th>");
        }
        h.raw("<th>alerts firing</th><th>policy</th></tr></thead><tbody>");
        for row in rows {
            h.raw("<tr><td>")
                .text(&row.slo)
                .raw("</td><td>")
                .text(or_dash(&row.group.machine_class))
                .raw("</td><td>")
                .text(or_dash(&row.group.site))
                .raw("</td>");
            figure(
                &mut h,
                "compliance",
                row.compliance,
                &percent(row.compliance, 4),
            );
            figure(
                &mut h,
                "budget_remaining",
                row.budget_remaining,
                &percent(row.budget_remaining, 1),
            );
            for burn in &row.burn_rates {
                h.raw(if burn.firing {
                    "<td class=\"num bad\">"
                } else {
                    "<td class=\"num\">"
                })
                .text(&format!("{}/{}", fixed(burn.long, 2), fixed(burn.short, 2)))
                .raw("</td>");
            }
            h.raw("<td>")
                .text(or_dash(&row.alerts_firing.join(", ")))
                .raw("</td><td>")
                .text(&row.policy_outcome())
                .raw("</td></tr>");
        }
        h.raw("</tbody></table></div></section>");
    }
    h
}

/// What a cost line is grouped by.
type LineKey = fn(&CostLine) -> String;

/// Cost and autonomous hours of the lines grouped by `(day, key)`.
fn per_day(
    lines: &[CostLine],
    key: impl Fn(&CostLine) -> String,
) -> BTreeMap<(i64, String), (f64, f64)> {
    let mut out: BTreeMap<(i64, String), (f64, f64)> = BTreeMap::new();
    for line in lines {
        let cell = out.entry((line.key.day_start_ms, key(line))).or_default();
        cell.0 += line.total();
        cell.1 += line.autonomous_hours;
    }
    out
}

/// `/cost`: cost per autonomous machine-hour by class, site and model version, per UTC day.
pub fn cost(report: Option<&CostReport>) -> Html {
    let mut h = Html::new();
    h.raw("<h1>Cost</h1>");
    let Some(report) = report else {
        h.raw(
            "<p>No price book: the gateway's configuration has no <code>[prices]</code> table \
               (docs/slo-catalog.md).</p>",
        );
        return h;
    };
    h.raw("<p class=\"muted\">")
        .text(&format!(
            "Cost per autonomous machine-hour in {}, UTC days from {} to {} (exclusive).",
            report.currency, report.period_start, report.period_end
        ))
        .raw("</p>");
    if !report.missing_prices.is_empty() {
        h.raw("<p class=\"bad\">")
            .text(&format!(
                "No price for: {}",
                report.missing_prices.join(", ")
            ))
            .raw("</p>");
    }
    let dimensions: [(&str, &str, LineKey); 3] = [
        ("class", "by machine class", |l| l.key.machine_class.clone()),
        ("site", "by site", |l| l.key.site.clone()),
        ("model_version", "by model version", |l| {
            format!("{} {}", l.key.model, l.key.model_version)
        }),
    ];
    for (id, title, key) in dimensions {
        let cells = per_day(&report.lines, key);
        h.raw("<h2>").text(title).raw("</h2>");
        if cells.is_empty() {
            h.raw("<p>No autonomous hours in the period.</p>");
            continue;
        }
        h.raw("<div class=\"scroll\"><table data-by=\"")
            .text(id)
            .raw("\"><thead><tr><th>UTC day</th><th>")
            .text(id)
            .raw("</th><th>autonomous h</th><th>cost</th><th>per autonomous h</th></tr></thead><tbody>");
        for ((day, name), (total, hours)) in cells.iter().rev() {
            let per_hour = (*hours > 0.0).then(|| total / hours);
            h.raw("<tr><td>")
                .text(&format_rfc3339(*day)[..10])
                .raw("</td><td>")
                .text(or_dash(name))
                .raw("</td>");
            figure(
                &mut h,
                "autonomous_hours",
                Some(*hours),
                &format!("{hours:.2}"),
            );
            figure(&mut h, "total", Some(*total), &format!("{total:.2}"));
            figure(&mut h, "per_hour", per_hour, &fixed(per_hour, 2));
            h.raw("</tr>");
        }
        h.raw("</tbody></table></div>");
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_in_their_two_largest_units() {
        assert_eq!(age(0), "0s");
        assert_eq!(age(61_000), "1m 1s");
        assert_eq!(age(2 * 3_600_000 + 5 * 60_000), "2h 5m");
        assert_eq!(age(2 * 86_400_000 + 3 * 3_600_000 + 1), "2d 3h");
        assert_eq!(age(-5), "0s");
    }

    #[test]
    fn links_keep_the_instant_encoded() {
        let at = At {
            given: Some("2026-01-02T03:04:05Z".to_owned()),
            ms: 0,
        };
        assert_eq!(
            at.link("/machines", &[("sort", "site")]),
            "/machines?sort=site&at=2026-01-02T03%3A04%3A05Z"
        );
        let now = At { given: None, ms: 0 };
        assert_eq!(now.link("/", &[]), "/");
    }
}
