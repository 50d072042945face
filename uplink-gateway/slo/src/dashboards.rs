//! Grafana dashboards for a catalog and price book: fleet overview, SLO burn, machine detail and
//! cost, as JSON for Grafana's file provisioning over one Prometheus data source, with the
//! provisioning files for the dashboards and the data source.
//!
//! ```text
//! dashboards(catalog, prices, uid) ─► Dashboard { uid, json } ─► <out>/dashboards/<uid>.json
//! datasource_provisioning(uid, url) ──────────────────────────► <out>/provisioning/datasources/
//! dashboard_provisioning(path) ───────────────────────────────► <out>/provisioning/dashboards/
//! ```
//!
//! Invariants:
//! - Every PromQL target is built from [`crate::names`] and the catalog; burn rates and budgets
//!   read the series the generated rules record, by the names [`crate::rules`] gives them, so the
//!   dashboards and the `rules` output of one configuration agree on every name. No metric name
//!   is written here.
//! - Costs follow [`crate::cost`]: the same components and prices (written into the queries from
//!   the price book), per UTC day. Where a day's samples reach its edges PromQL's `increase()`
//!   equals the increase rule, so the figures equal the report's; elsewhere it extrapolates.
//! - Within a dashboard, panel ids are unique, every panel lies inside the 24 grid columns without
//!   overlapping another, and every panel and target names the one data source by its uid.
//! - The output is deterministic for a configuration; the module reads no clock and no file.

use crate::calendar::{MS_PER_DAY, format_duration};
use crate::catalog::{Catalog, Sli, Slo};
use crate::cost::{
    AMORTIZATION_SERVICE, ENERGY_SERVICE, JOULES_PER_KWH, PriceBook, SECONDS_PER_HOUR, Share,
};
use crate::names::{GROUP_LABELS, label, metric, prometheus, value};
use crate::rules::{
    BUDGET_REMAINING_RECORD, error_ratio_record, number, promql_string, quote, regex_literal,
};
use edgewatch_conventions::config::ConfigError;
use serde_json::{Value, json};

/// The dashboard JSON model targeted: Grafana's classic model at schema version 41, which
/// Grafana 11.6 and 12 write natively. Grafana 13 migrates it to 42, a step that only concerns
/// field overrides hiding a series from the visualization, which these dashboards do not use, so
/// they load unchanged from 11.6 on. File provisioning reads the classic model in every version.
pub const SCHEMA_VERSION: u64 = 41;
/// The data source uid the dashboards name unless told otherwise.
pub const DEFAULT_DATASOURCE_UID: &str = "edgewatch-prometheus";
/// The provisioned data source's display name.
pub const DATASOURCE_NAME: &str = "edgewatch Prometheus";
/// The tag of every dashboard (their links list the dashboards with it) and the folder they go to.
pub const TAG: &str = "edgewatch";
/// The template variable of the machine detail dashboard: one `machine_id`.
pub const MACHINE_VARIABLE: &str = "machine";
/// Grafana grid columns.
pub const GRID_COLUMNS: u64 = 24;

/// Dashboard uids: stable, so links and bookmarks survive regeneration.
pub mod uid {
    /// Fleet overview.
    pub const FLEET: &str = "edgewatch-fleet";
    /// SLO burn rates and budgets.
    pub const SLO_BURN: &str = "edgewatch-slo-burn";
    /// One machine, chosen by the `machine` variable.
    pub const MACHINE: &str = "edgewatch-machine";
    /// Cost per autonomous machine-hour.
    pub const COST: &str = "edgewatch-cost";
}

/// Rolling window of the "per hour" panels.
const HOUR_MS: i64 = 3_600_000;
/// How long a machine may have been silent and still count as seen.
const WEEK_MS: i64 = 7 * MS_PER_DAY;

/// One generated dashboard.
#[derive(Debug, Clone, PartialEq)]
pub struct Dashboard {
    /// Its uid (see [`uid`]).
    pub uid: &'static str,
    /// Its title.
    pub title: String,
    /// The dashboard JSON model.
    pub json: Value,
}

impl Dashboard {
    /// The file it is provisioned from, `<uid>.json`.
    pub fn file_name(&self) -> String {
        format!("{}.json", self.uid)
    }
}

/// Checks a Grafana data source uid given under `key`: 1 to 40 of `A-Z a-z 0-9 - _`.
pub fn check_datasource_uid(key: &str, uid: &str) -> Result<(), ConfigError> {
    let ok = !uid.is_empty()
        && uid.len() <= 40
        && uid
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(ConfigError::new(
            key,
            format!("`{uid}` is not a Grafana uid (1 to 40 of A-Z, a-z, 0-9, '-', '_')"),
        ))
    }
}

/// The four dashboards, reading the Prometheus data source `datasource_uid`. Without a price
/// book the cost dashboard shows usage only, and says why.
pub fn dashboards(
    catalog: &Catalog,
    prices: Option<&PriceBook>,
    datasource_uid: &str,
) -> Vec<Dashboard> {
    vec![
        fleet(catalog, datasource_uid),
        slo_burn(catalog, datasource_uid),
        machine(datasource_uid),
        cost(prices, datasource_uid),
    ]
}

/// Grafana's data source provisioning file: one Prometheus at `url`, with `uid`.
pub fn datasource_provisioning(uid: &str, url: &str) -> String {
    format!(
        "# Generated by edgewatch-gateway dashboards; regenerate rather than edit.\n\
         apiVersion: 1\n\
         datasources:\n  \
           - name: {}\n    \
             uid: {}\n    \
             type: \"prometheus\"\n    \
             access: \"proxy\"\n    \
             url: {}\n    \
             isDefault: false\n    \
             editable: false\n    \
             jsonData:\n      \
               httpMethod: \"POST\"\n",
        quote(DATASOURCE_NAME),
        quote(uid),
        quote(url),
    )
}

/// Grafana's dashboard provisioning file: the dashboards in `path` (the directory holding the
/// JSON files, as Grafana sees it), in the folder [`TAG`], not editable in the UI.
pub fn dashboard_provisioning(path: &str) -> String {
    format!(
        "# Generated by edgewatch-gateway dashboards; regenerate rather than edit.\n\
         apiVersion: 1\n\
         providers:\n  \
           - name: {}\n    \
             folder: {}\n    \
             type: \"file\"\n    \
             disableDeletion: true\n    \
             allowUiUpdates: false\n    \
             updateIntervalSeconds: 60\n    \
             options:\n      \
               path: {}\n      \
               foldersFromFilesStructure: false\n",
        quote(TAG),
        quote(TAG),
        quote(path),
    )
}

// ---------------------------------------------------------------------------------------------
// PromQL, from the names.

/// `metric{l1="v1", …}`, values escaped.
fn sel(metric: &str, matchers: &[(&str, &str)]) -> String {
    if matchers.is_empty() {
        return metric.to_owned();
    }
    let inner: Vec<String> = matchers
        .iter()
        .map(|(l, v)| format!("{l}={}", promql_string(v)))
        .collect();
    format!("{metric}{{{}}}", inner.join(", "))
}

/// `increase(<selector>[<window>])`.
fn increase(selector: &str, window_ms: i64) -> String {
    format!("increase({selector}[{}])", format_duration(window_ms))
}

/// `sum by (<labels>) (<expr>)`, or `sum(<expr>)` without labels.
fn sum_by(labels: &[&str], expr: &str) -> String {
    if labels.is_empty() {
        format!("sum({expr})")
    } else {
        format!("sum by ({}) ({expr})", labels.join(", "))
    }
}

/// The machine chosen by the template variable.
fn this_machine() -> (&'static str, &'static str) {
    (label::MACHINE_ID, "$machine")
}

/// `{{label}} …` for a legend.
fn legend(labels: &[&str]) -> String {
    labels
        .iter()
        .map(|l| format!("{{{{{l}}}}}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Samples, per machine, of the series every agent writes (deadline steps and machine time)
/// within `window_ms`: one series per machine that sent anything then.
fn machines_seen(window_ms: i64) -> String {
    let w = format_duration(window_ms);
    let any: Vec<String> = [metric::CONTROL_CYCLES, metric::AUTONOMY_SECONDS]
        .iter()
        .map(|m| format!("count_over_time({m}[{w}])"))
        .collect();
    format!("count by ({}) ({})", label::MACHINE_ID, any.join(" or "))
}

/// Autonomous seconds (`mode="autonomous"`, and `extra` matchers) over `window_ms`.
fn autonomous_seconds(extra: &[(&str, &str)], window_ms: i64) -> String {
    let mut matchers = vec![(label::MODE, value::AUTONOMOUS)];
    matchers.extend_from_slice(extra);
    increase(&sel(metric::AUTONOMY_SECONDS, &matchers), window_ms)
}

/// The legend of an SLO row: its group, and the semantics for deadline SLOs.
fn row_legend(slo: &Slo) -> String {
    let mut labels = GROUP_LABELS.to_vec();
    if matches!(slo.sli, Sli::ControlDeadline { .. }) {
        labels.push(label::SEMANTICS);
    }
    legend(&labels)
}

/// `<record>{slo="<name>"}`.
fn recorded(record: &str, slo: &Slo) -> String {
    sel(record, &[(label::SLO, &slo.name)])
}

// ---------------------------------------------------------------------------------------------
// Panels and their layout.

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Row,
    TimeSeries,
    Bars,
    Stat,
    BarGauge,
    Table,
    StateTimeline,
    Text,
}

impl Kind {
    fn type_name(self) -> &'static str {
        match self {
            Self::Row => "row",
            Self::TimeSeries | Self::Bars => "timeseries",
            Self::Stat => "stat",
            Self::BarGauge => "bargauge",
            Self::Table => "table",
            Self::StateTimeline => "state-timeline",
            Self::Text => "text",
        }
    }
}

#[derive(Debug, Clone)]
struct Target {
    expr: String,
    legend: String,
}

/// A panel before it is placed: what it shows and how big it is.
#[derive(Debug, Clone)]
struct Panel {
    kind: Kind,
    title: String,
    description: String,
    width: u64,
    height: u64,
    unit: String,
    decimals: Option<u64>,
    max: Option<f64>,
    targets: Vec<Target>,
    instant: bool,
    /// Grafana's minimum step (`interval`), e.g. `1d` for one bar per UTC day.
    interval: Option<String>,
    /// Threshold steps above the base colour, `(value, colour)`.
    thresholds: Vec<(f64, &'static str)>,
    base_colour: &'static str,
    stacked: bool,
    /// Table columns: a name per target's value, in target order.
    columns: Vec<String>,
    /// Markdown of a text panel.
    text: String,
}

impl Panel {
    fn new(kind: Kind, title: impl Into<String>, width: u64, height: u64) -> Self {
        Self {
            kind,
            title: title.into(),
            description: String::new(),
            width,
            height,
            unit: "short".to_owned(),
            decimals: None,
            max: None,
            targets: Vec::new(),
            instant: matches!(kind, Kind::Stat | Kind::BarGauge | Kind::Table),
            interval: None,
            thresholds: Vec::new(),
            base_colour: "green",
            stacked: false,
            columns: Vec::new(),
            text: String::new(),
        }
    }

    fn about(mut self, description: impl Into<String>) -> Self {
        self.description = description.into();
        self
    }

    fn unit(mut self, unit: impl Into<String>) -> Self {
        self.unit = unit.into();
        self
    }

    fn decimals(mut self, decimals: u64) -> Self {
        self.decimals = Some(decimals);
        self
    }

    fn max(mut self, max: f64) -> Self {
        self.max = Some(max);
        self
    }

    fn target(mut self, expr: impl Into<String>, legend: impl Into<String>) -> Self {
        self.targets.push(Target {
            expr: expr.into(),
            legend: legend.into(),
        });
        self
    }

    fn interval(mut self, interval_ms: i64) -> Self {
        self.interval = Some(format_duration(interval_ms));
        self
    }

    fn threshold(mut self, at: f64, colour: &'static str) -> Self {
        self.thresholds.push((at, colour));
        self
    }

    fn base(mut self, colour: &'static str) -> Self {
        self.base_colour = colour;
        self
    }

    fn stacked(mut self) -> Self {
        self.stacked = true;
        self
    }

    fn column(mut self, name: impl Into<String>) -> Self {
        self.columns.push(name.into());
        self
    }

    fn text(mut self, markdown: impl Into<String>) -> Self {
        self.text = markdown.into();
        self
    }
}

/// `A`, `B`, …, `Z`, `AA`, …: Grafana's query reference ids.
fn ref_id(mut i: usize) -> String {
    let mut id = Vec::new();
    loop {
        id.push(b'A' + (i % 26) as u8);
        if i < 26 {
            break;
        }
        i = i / 26 - 1;
    }
    id.reverse();
    String::from_utf8_lossy(&id).into_owned()
}

/// A dashboard being laid out: panels flow left to right and wrap at 24 columns; a row starts
/// on a line of its own.
struct Board {
    uid: &'static str,
    title: String,
    description: String,
    time_from: &'static str,
    datasource: Value,
    variables: Vec<Value>,
    panels: Vec<Value>,
    next_id: u64,
    x: u64,
    y: u64,
    line_height: u64,
}

impl Board {
    fn new(
        uid: &'static str,
        title: &str,
        description: &str,
        time_from: &'static str,
        datasource_uid: &str,
    ) -> Self {
        Self {
            uid,
            title: title.to_owned(),
            description: description.to_owned(),
            time_from,
            datasource: json!({ "type": "prometheus", "uid": datasource_uid }),
            variables: Vec::new(),
            panels: Vec::new(),
            next_id: 1,
            x: 0,
            y: 0,
            line_height: 0,
        }
    }

    fn new_line(&mut self) {
        self.y += self.line_height;
        self.x = 0;
        self.line_height = 0;
    }

    fn place(&mut self, width: u64, height: u64) -> Value {
        let width = width.clamp(1, GRID_COLUMNS);
        if self.x + width > GRID_COLUMNS {
            self.new_line();
        }
        let grid = json!({ "h": height, "w": width, "x": self.x, "y": self.y });
        self.x += width;
        self.line_height = self.line_height.max(height);
        grid
    }

    fn id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    fn row(&mut self, title: impl Into<String>) {
        self.new_line();
        let id = self.id();
        let grid = self.place(GRID_COLUMNS, 1);
        self.new_line();
        self.panels.push(json!({
            "id": id,
            "type": Kind::Row.type_name(),
            "title": title.into(),
            "collapsed": false,
            "gridPos": grid,
            "panels": [],
        }));
    }

    fn add(&mut self, panel: Panel) {
        let id = self.id();
        let grid = self.place(panel.width, panel.height);
        let value = self.panel_json(&panel, id, grid);
        self.panels.push(value);
    }

    fn panel_json(&self, p: &Panel, id: u64, grid: Value) -> Value {
        if p.kind == Kind::Text {
            return json!({
                "id": id,
                "type": p.kind.type_name(),
                "title": p.title,
                "description": p.description,
                "gridPos": grid,
                "options": { "mode": "markdown", "content": p.text },
            });
        }
        let table = p.kind == Kind::Table;
        let targets: Vec<Value> = p
            .targets
            .iter()
            .enumerate()
            .map(|(i, t)| {
                json!({
                    "refId": ref_id(i),
                    "datasource": self.datasource,
                    "editorMode": "code",
                    "expr": t.expr,
                    "legendFormat": t.legend,
                    "range": !p.instant,
                    "instant": p.instant,
                    "format": if table { "table" } else { "time_series" },
                })
            })
            .collect();
        let mut steps = vec![json!({ "color": p.base_colour, "value": null })];
        steps.extend(
            p.thresholds
                .iter()
                .map(|(at, colour)| json!({ "color": colour, "value": at })),
        );
        let mut defaults = json!({
            "unit": p.unit,
            "thresholds": { "mode": "absolute", "steps": steps },
            "color": { "mode": match p.kind {
                Kind::Stat | Kind::BarGauge => "thresholds",
                _ => "palette-classic",
            } },
        });
        if let Some(decimals) = p.decimals {
            defaults["decimals"] = json!(decimals);
        }
        if let Some(max) = p.max {
            defaults["max"] = json!(max);
        }
        let reduce = json!({ "calcs": ["lastNotNull"], "fields": "", "values": false });
        let legend = json!({ "displayMode": "list", "placement": "bottom", "showLegend": true });
        let options = match p.kind {
            Kind::TimeSeries | Kind::Bars => {
                let bars = p.kind == Kind::Bars;
                defaults["custom"] = json!({
                    "drawStyle": if bars { "bars" } else { "line" },
                    "lineWidth": 1,
                    "fillOpacity": if bars { 80 } else { 10 },
                    "showPoints": "never",
                    "spanNulls": false,
                    "stacking": { "mode": if p.stacked { "normal" } else { "none" }, "group": "A" },
                    "thresholdsStyle": {
                        "mode": if p.thresholds.is_empty() { "off" } else { "line" },
                    },
                });
                json!({ "legend": legend, "tooltip": { "mode": "multi", "sort": "desc" } })
            }
            Kind::Stat => json!({
                "reduceOptions": reduce,
                "colorMode": "value",
                "graphMode": "none",
                "justifyMode": "auto",
                "orientation": "auto",
                "textMode": "auto",
            }),
            Kind::BarGauge => json!({
                "reduceOptions": reduce,
                "orientation": "horizontal",
                "displayMode": "basic",
                "showUnfilled": true,
            }),
            Kind::Table => json!({ "showHeader": true, "cellHeight": "sm" }),
            Kind::StateTimeline => {
                defaults["custom"] = json!({ "lineWidth": 0, "fillOpacity": 80 });
                json!({
                    "mergeValues": true,
                    "showValue": "never",
                    "alignValue": "left",
                    "rowHeight": 0.9,
                    "legend": legend,
                    "tooltip": { "mode": "single", "sort": "none" },
                })
            }
            Kind::Row | Kind::Text => json!({}),
        };
        let mut panel = json!({
            "id": id,
            "type": p.kind.type_name(),
            "title": p.title,
            "description": p.description,
            "gridPos": grid,
            "datasource": self.datasource,
            "targets": targets,
            "fieldConfig": { "defaults": defaults, "overrides": self.overrides(p) },
            "options": options,
        });
        if let Some(interval) = &p.interval {
            panel["interval"] = json!(interval);
        }
        if table {
            panel["transformations"] = table_transformations(p);
        }
        panel
    }

    /// A `machine_id` column links to the machine detail dashboard.
    fn overrides(&self, p: &Panel) -> Value {
        if p.kind != Kind::Table {
            return json!([]);
        }
        json!([{
            "matcher": { "id": "byName", "options": label::MACHINE_ID },
            "properties": [{
                "id": "links",
                "value": [{
                    "title": "Machine detail",
                    "url": format!(
                        "/d/{}?var-{MACHINE_VARIABLE}=${{__value.raw}}&${{__url_time_range}}",
                        uid::MACHINE
                    ),
                }],
            }],
        }])
    }

    fn variable(&mut self, variable: Value) {
        self.variables.push(variable);
    }

    fn finish(self) -> Dashboard {
        let json = json!({
            "uid": self.uid,
            "title": self.title,
            "description": self.description,
            "tags": [TAG],
            "editable": false,
            "schemaVersion": SCHEMA_VERSION,
            "version": 1,
            "timezone": "utc",
            "weekStart": "",
            "fiscalYearStartMonth": 0,
            "liveNow": false,
            "graphTooltip": 1,
            "refresh": "1m",
            "time": { "from": self.time_from, "to": "now" },
            "timepicker": {},
            "annotations": { "list": [] },
            "links": [{
                "title": "edgewatch",
                "type": "dashboards",
                "tags": [TAG],
                "asDropdown": false,
                "includeVars": false,
                "keepTime": true,
                "targetBlank": false,
                "icon": "external link",
                "tooltip": "",
                "url": "",
            }],
            "templating": { "list": self.variables },
            "panels": self.panels,
        });
        Dashboard {
            uid: self.uid,
            title: self.title,
            json,
        }
    }
}

/// Instant table targets merged on their labels, the time column hidden, value columns named.
fn table_transformations(p: &Panel) -> Value {
    let mut rename = serde_json::Map::new();
    for (i, name) in p.columns.iter().enumerate() {
        let column = if p.targets.len() == 1 {
            "Value".to_owned()
        } else {
            format!("Value #{}", ref_id(i))
        };
        rename.insert(column, json!(name));
    }
    let mut steps = Vec::new();
    if p.targets.len() > 1 {
        steps.push(json!({ "id": "merge", "options": {} }));
    }
    steps.push(json!({
        "id": "organize",
        "options": { "excludeByName": { "Time": true }, "renameByName": rename },
    }));
    Value::Array(steps)
}

/// Every dashboard's description.
const GENERATED: &str = "Generated by `edgewatch-gateway dashboards` from the SLO catalog and \
                         price book; regenerate rather than edit.";

// ---------------------------------------------------------------------------------------------
// Fleet overview.

fn fleet(catalog: &Catalog, datasource_uid: &str) -> Dashboard {
    let mut b = Board::new(
        uid::FLEET,
        "edgewatch: fleet overview",
        GENERATED,
        "now-2d",
        datasource_uid,
    );
    b.row("Fleet");
    b.add(
        Panel::new(Kind::Stat, "Machines reporting, last hour", 6, 4)
            .about("Machines with deadline or machine-time samples stamped in the last hour.")
            .target(
                format!("count({}) or vector(0)", machines_seen(HOUR_MS)),
                "",
            ),
    );
    b.add(
        Panel::new(Kind::Stat, "Machines seen, last 7 days", 6, 4)
            .about("Machines with samples stamped in the last week.")
            .target(
                format!("count({}) or vector(0)", machines_seen(WEEK_MS)),
                "",
            ),
    );
    b.add(
        Panel::new(Kind::Stat, "Silent for over an hour", 6, 4)
            .about(
                "Machines seen in the last week with no sample stamped in the last hour: \
                 offline, or not yet drained.",
            )
            .threshold(1.0, "orange")
            .target(
                format!(
                    "count({} unless {}) or vector(0)",
                    machines_seen(WEEK_MS),
                    machines_seen(HOUR_MS)
                ),
                "",
            ),
    );
    let alert_names: Vec<String> = catalog
        .alert_windows
        .iter()
        .map(|w| regex_literal(&w.alert_name()))
        .collect();
    b.add(
        Panel::new(Kind::Stat, "Burn-rate alerts firing", 6, 4)
            .about(
                "Multi-window burn-rate alerts of the generated rules firing now (live, on \
                 wall-clock windows).",
            )
            .threshold(1.0, "red")
            .target(
                format!(
                    "count({}{{{}={}, {}=~{}}}) or vector(0)",
                    prometheus::ALERTS,
                    prometheus::ALERTSTATE,
                    promql_string(prometheus::FIRING),
                    prometheus::ALERTNAME,
                    promql_string(&alert_names.join("|")),
                ),
                "",
            ),
    );

    b.row("SLOs");
    let mut budget = Panel::new(
        Kind::BarGauge,
        "Error budget left, worst row of each SLO",
        8,
        8,
    )
    .about(
        "The lowest share of the period's error budget left among each SLO's rows (class, \
             site, model version), from the recorded rules. Negative: overspent.",
    )
    .unit("percentunit")
    .max(1.0)
    .base("red")
    .threshold(0.0, "orange")
    .threshold(0.25, "green");
    for slo in &catalog.slos {
        budget = budget.target(
            format!("min({})", recorded(BUDGET_REMAINING_RECORD, slo)),
            slo.name.clone(),
        );
    }
    if !catalog.slos.is_empty() {
        b.add(budget);
        let compliance: Vec<String> = catalog
            .slos
            .iter()
            .map(|slo| {
                format!(
                    "(1 - {})",
                    recorded(&error_ratio_record(slo.period_ms), slo)
                )
            })
            .collect();
        let left: Vec<String> = catalog
            .slos
            .iter()
            .map(|slo| recorded(BUDGET_REMAINING_RECORD, slo))
            .collect();
        b.add(
            Panel::new(
                Kind::Table,
                "SLO rows: compliance and budget over the period",
                16,
                8,
            )
            .about(
                "Every row of every SLO, from the recorded rules (live, wall-clock windows). \
                     The event-time figures after late data come from `edgewatch-gateway report`.",
            )
            .unit("percentunit")
            .decimals(3)
            .target(compliance.join(" or "), "")
            .column("compliance")
            .target(left.join(" or "), "")
            .column("budget left"),
        );
    }

    b.row("Activity");
    b.add(
        Panel::new(
            Kind::TimeSeries,
            "Autonomous machine-hours per hour, by class",
            12,
            8,
        )
        .unit("h")
        .target(
            format!(
                "{} / {}",
                sum_by(&[label::MACHINE_CLASS], &autonomous_seconds(&[], HOUR_MS)),
                number(SECONDS_PER_HOUR)
            ),
            legend(&[label::MACHINE_CLASS]),
        ),
    );
    b.add(
        Panel::new(
            Kind::TimeSeries,
            "Deadline misses per hour, by class and loop",
            12,
            8,
        )
        .about(
            "Activations that completed after their deadline or never ran (completion semantics).",
        )
        .target(
            sum_by(
                &[label::MACHINE_CLASS, label::LOOP],
                &increase(metric::CONTROL_ACTIVATIONS_MISSED, HOUR_MS),
            ),
            legend(&[label::MACHINE_CLASS, label::LOOP]),
        ),
    );
    b.add(
        Panel::new(
            Kind::TimeSeries,
            "Thermally throttled seconds per hour, by component",
            12,
            8,
        )
        .unit("s")
        .target(
            sum_by(
                &[label::COMPONENT],
                &increase(metric::THROTTLE_SECONDS, HOUR_MS),
            ),
            legend(&[label::COMPONENT]),
        ),
    );
    b.add(
        Panel::new(
            Kind::TimeSeries,
            "Safety events at the gateway per hour",
            12,
            8,
        )
        .about(
            "Safety-tier events the gateway accepted, and those within the freshness limit of \
                 their machine's reconnect (stamped at arrival).",
        )
        .target(
            sum_by(&[], &increase(metric::SAFETY_EVENTS_RECEIVED, HOUR_MS)),
            "received",
        )
        .target(
            sum_by(&[], &increase(metric::SAFETY_EVENTS_FRESH, HOUR_MS)),
            "fresh",
        ),
    );
    b.add(
        Panel::new(
            Kind::TimeSeries,
            "Samples refused by the gateway per hour, by reason",
            12,
            8,
        )
        .about(
            "Stamped with the refused sample's event time; an SLO row they belong to says \
                 `incomplete` in the report.",
        )
        .target(
            sum_by(
                &[label::REASON],
                &increase(metric::REFUSED_SAMPLES, HOUR_MS),
            ),
            legend(&[label::REASON]),
        ),
    );
    b.add(
        Panel::new(
            Kind::TimeSeries,
            "Queue records lost on machines per hour",
            12,
            8,
        )
        .about("Records the agents' queues lost, by tier and cause.")
        .target(
            sum_by(
                &[label::TIER, label::CAUSE],
                &increase(metric::QUEUE_LOST_RECORDS, HOUR_MS),
            ),
            legend(&[label::TIER, label::CAUSE]),
        ),
    );
    let per_machine = [label::MACHINE_ID, label::MACHINE_CLASS, label::SITE];
    b.add(
        Panel::new(Kind::Table, "Machines, last 24 hours", 24, 10)
            .about("Per machine, over the last day of event time; a machine id opens its detail.")
            .target(
                format!(
                    "{} / {}",
                    sum_by(&per_machine, &autonomous_seconds(&[], MS_PER_DAY)),
                    number(SECONDS_PER_HOUR)
                ),
                "",
            )
            .column("autonomous hours")
            .target(
                sum_by(
                    &per_machine,
                    &increase(metric::CONTROL_ACTIVATIONS_MISSED, MS_PER_DAY),
                ),
                "",
            )
            .column("deadline misses")
            .target(
                sum_by(
                    &per_machine,
                    &increase(metric::THROTTLE_SECONDS, MS_PER_DAY),
                ),
                "",
            )
            .column("throttled seconds"),
    );
    b.finish()
}

// ---------------------------------------------------------------------------------------------
// SLO burn.

fn slo_burn(catalog: &Catalog, datasource_uid: &str) -> Dashboard {
    let mut b = Board::new(
        uid::SLO_BURN,
        "edgewatch: SLO burn",
        GENERATED,
        "now-2d",
        datasource_uid,
    );
    for slo in &catalog.slos {
        burn_panels(&mut b, catalog, slo);
    }
    b.finish()
}

/// One SLO's set: a row, a burn-rate panel per alert window pair, and the budget left.
fn burn_panels(b: &mut Board, catalog: &Catalog, slo: &Slo) {
    let period = format_duration(slo.period_ms);
    let budget = number(slo.budget());
    b.row(format!(
        "{}: {}% over {period}",
        slo.name,
        number(slo.objective_percent)
    ));
    let rows = row_legend(slo);
    for w in &catalog.alert_windows {
        let (long, short) = (format_duration(w.long_ms), format_duration(w.short_ms));
        let factor = w.factor(slo.period_ms);
        b.add(
            Panel::new(
                Kind::TimeSeries,
                format!("{}: burn rate over {long} and {short}", slo.name),
                8,
                8,
            )
            .about(format!(
                "Error ratio over each window divided by the budget ({budget}). {} `{}` when both \
                 exceed {}x: {}% of the period's budget in {long}.",
                match w.severity.as_str() {
                    "page" => "Pages",
                    _ => "Opens a ticket",
                },
                w.alert_name(),
                number(factor),
                number(w.budget_percent),
            ))
            .unit("suffix:x")
            .threshold(factor, "red")
            .target(
                format!(
                    "{} / {budget}",
                    recorded(&error_ratio_record(w.long_ms), slo)
                ),
                format!("{long} {rows}"),
            )
            .target(
                format!(
                    "{} / {budget}",
                    recorded(&error_ratio_record(w.short_ms), slo)
                ),
                format!("{short} {rows}"),
            ),
        );
    }
    b.add(
        Panel::new(
            Kind::BarGauge,
            format!("{}: error budget left over {period}", slo.name),
            8,
            8,
        )
        .about(format!(
            "{} Share of the period's budget left per row, from the recorded rules; negative \
             when overspent.",
            if slo.description.is_empty() {
                String::new()
            } else {
                format!("{}.", slo.description)
            }
        ))
        .unit("percentunit")
        .max(1.0)
        .base("red")
        .threshold(0.0, "orange")
        .threshold(0.25, "green")
        .target(recorded(BUDGET_REMAINING_RECORD, slo), rows),
    );
}

// ---------------------------------------------------------------------------------------------
// Machine detail.

fn machine(datasource_uid: &str) -> Dashboard {
    let mut b = Board::new(
        uid::MACHINE,
        "edgewatch: machine detail",
        GENERATED,
        "now-2d",
        datasource_uid,
    );
    let query = format!("label_values({})", label::MACHINE_ID);
    b.variable(json!({
        "name": MACHINE_VARIABLE,
        "label": "Machine",
        "type": "query",
        "datasource": b.datasource,
        "query": query,
        "definition": query,
        "refresh": 2,
        "sort": 1,
        "multi": false,
        "includeAll": false,
        "hide": 0,
        "regex": "",
        "current": {},
        "options": [],
    }));
    let m = this_machine();
    let per_loop = [label::LOOP];
    b.add(
        Panel::new(
            Kind::TimeSeries,
            "Deadline misses and overruns per hour, by loop",
            12,
            8,
        )
        .about(
            "Deadline misses: activations completed after release + deadline, or never run \
                 (completion semantics). Overruns: steps longer than their budget, from every \
                 agent (a diagnostic).",
        )
        .target(
            sum_by(
                &per_loop,
                &increase(&sel(metric::CONTROL_ACTIVATIONS_MISSED, &[m]), HOUR_MS),
            ),
            format!("{} deadline misses", legend(&per_loop)),
        )
        .target(
            sum_by(
                &per_loop,
                &increase(&sel(metric::CONTROL_MISSED, &[m]), HOUR_MS),
            ),
            format!("{} overruns", legend(&per_loop)),
        ),
    );
    b.add(
        Panel::new(Kind::TimeSeries, "Activations per hour, by loop", 12, 8)
            .about("Activations judged against their deadline, and steps recorded (every agent).")
            .target(
                sum_by(
                    &per_loop,
                    &increase(&sel(metric::CONTROL_ACTIVATIONS, &[m]), HOUR_MS),
                ),
                format!("{} activations", legend(&per_loop)),
            )
            .target(
                sum_by(
                    &per_loop,
                    &increase(&sel(metric::CONTROL_CYCLES, &[m]), HOUR_MS),
                ),
                format!("{} steps recorded", legend(&per_loop)),
            ),
    );
    b.add(
        Panel::new(
            Kind::TimeSeries,
            "Deadline miss ratio over the hour, by loop",
            12,
            8,
        )
        .unit("percentunit")
        .target(
            format!(
                "{} / {}",
                sum_by(
                    &per_loop,
                    &increase(&sel(metric::CONTROL_ACTIVATIONS_MISSED, &[m]), HOUR_MS)
                ),
                sum_by(
                    &per_loop,
                    &increase(&sel(metric::CONTROL_ACTIVATIONS, &[m]), HOUR_MS)
                ),
            ),
            legend(&per_loop),
        ),
    );
    b.add(
        Panel::new(
            Kind::TimeSeries,
            "Thermally throttled seconds per hour, by component",
            12,
            8,
        )
        .unit("s")
        .target(
            sum_by(
                &[label::COMPONENT],
                &increase(&sel(metric::THROTTLE_SECONDS, &[m]), HOUR_MS),
            ),
            legend(&[label::COMPONENT]),
        ),
    );
    b.add(
        Panel::new(
            Kind::TimeSeries,
            "Autonomy mode: hours per hour, by mode",
            12,
            8,
        )
        .about("Machine time in each mode over the hour (stacked: the hours the machine reported).")
        .unit("h")
        .stacked()
        .target(
            format!(
                "{} / {}",
                sum_by(
                    &[label::MODE],
                    &increase(&sel(metric::AUTONOMY_SECONDS, &[m]), HOUR_MS)
                ),
                number(SECONDS_PER_HOUR)
            ),
            legend(&[label::MODE]),
        ),
    );
    let version = [label::MODEL, label::MODEL_VERSION];
    let w = format_duration(HOUR_MS);
    b.add(
        Panel::new(Kind::StateTimeline, "Model versions reporting", 12, 8)
            .about(
                "Each model version the machine sent deadline or machine-time samples under, \
                 hour by hour.",
            )
            .target(
                format!(
                    "group by ({}) (count_over_time({}[{w}]) or count_over_time({}[{w}]))",
                    version.join(", "),
                    sel(metric::CONTROL_CYCLES, &[m]),
                    sel(metric::AUTONOMY_SECONDS, &[m]),
                ),
                legend(&version),
            ),
    );
    b.add(
        Panel::new(Kind::TimeSeries, "Energy per hour, by rail", 12, 8)
            .unit("kwatth")
            .target(
                format!(
                    "{} / {}",
                    sum_by(
                        &[label::RAIL],
                        &increase(&sel(metric::ENERGY_JOULES, &[m]), HOUR_MS)
                    ),
                    number(JOULES_PER_KWH)
                ),
                legend(&[label::RAIL]),
            ),
    );
    b.add(
        Panel::new(
            Kind::TimeSeries,
            "Safety fallbacks, interventions and safe stops per hour",
            12,
            8,
        )
        .target(
            sum_by(
                &per_loop,
                &increase(&sel(metric::SAFETY_FALLBACKS, &[m]), HOUR_MS),
            ),
            format!("{} fallbacks", legend(&per_loop)),
        )
        .target(
            sum_by(
                &[label::SOURCE],
                &increase(&sel(metric::INTERVENTIONS, &[m]), HOUR_MS),
            ),
            format!("interventions ({})", legend(&[label::SOURCE])),
        )
        .target(
            sum_by(
                &[label::SOURCE],
                &increase(&sel(metric::SAFE_STOPS, &[m]), HOUR_MS),
            ),
            format!("safe stops ({})", legend(&[label::SOURCE])),
        ),
    );
    b.add(
        Panel::new(
            Kind::TimeSeries,
            "Queue records lost per hour, by tier and cause",
            12,
            8,
        )
        .target(
            sum_by(
                &[label::TIER, label::CAUSE],
                &increase(&sel(metric::QUEUE_LOST_RECORDS, &[m]), HOUR_MS),
            ),
            legend(&[label::TIER, label::CAUSE]),
        ),
    );
    b.add(
        Panel::new(
            Kind::TimeSeries,
            "Samples refused by the gateway per hour",
            12,
            8,
        )
        .about("By the refused series and the reason.")
        .target(
            sum_by(
                &[label::SERIES, label::REASON],
                &increase(&sel(metric::REFUSED_SAMPLES, &[m]), HOUR_MS),
            ),
            legend(&[label::SERIES, label::REASON]),
        ),
    );
    b.finish()
}

// ---------------------------------------------------------------------------------------------
// Cost.

/// PromQL for the cost components of a price book, per UTC day, grouped by some labels.
struct CostQueries<'a> {
    book: &'a PriceBook,
}

impl CostQueries<'_> {
    /// A vector of one series per priced `label` value:
    /// `label_replace(vector(<price>), …) or …`.
    fn price_vector<'p>(
        label: &str,
        prices: impl Iterator<Item = (&'p String, String)>,
    ) -> Option<String> {
        let terms: Vec<String> = prices
            .map(|(key, price)| {
                // `$` in a replacement refers to a capture group; `$$` is a literal `$`.
                let literal = promql_string(&key.replace('$', "$$"));
                format!(
                    "label_replace(vector({price}), {}, {literal}, \"\", \"\")",
                    promql_string(label)
                )
            })
            .collect();
        (!terms.is_empty()).then(|| format!("({})", terms.join(" or ")))
    }

    /// Autonomous hours of the day, by `by`.
    fn autonomous_hours(by: &[&str]) -> String {
        format!(
            "{} / {}",
            sum_by(by, &autonomous_seconds(&[], MS_PER_DAY)),
            number(SECONDS_PER_HOUR)
        )
    }

    /// Amortization of the day: machine hours (every mode) × the class's hourly rate.
    fn amortization(&self, by: &[&str]) -> Option<String> {
        let rates = Self::price_vector(
            label::MACHINE_CLASS,
            self.book.machine_classes.iter().map(|(class, hw)| {
                (
                    class,
                    format!("{} / {}", hw.purchase_price, hw.lifetime_hours),
                )
            }),
        )?;
        Some(format!(
            "{} / {}",
            sum_by(
                by,
                &format!(
                    "{} * on ({}) group_left () {rates}",
                    increase(metric::AUTONOMY_SECONDS, MS_PER_DAY),
                    label::MACHINE_CLASS
                )
            ),
            number(SECONDS_PER_HOUR)
        ))
    }

    /// Energy of the day: kWh × the site's tariff.
    fn energy(&self, by: &[&str]) -> Option<String> {
        let tariffs = Self::price_vector(
            label::SITE,
            self.book
                .sites
                .iter()
                .map(|(site, p)| (site, format!("{}", p.energy_price_per_kwh))),
        )?;
        Some(format!(
            "{} / {}",
            sum_by(
                by,
                &format!(
                    "{} * on ({}) group_left () {tariffs}",
                    increase(metric::ENERGY_JOULES, MS_PER_DAY),
                    label::SITE
                )
            ),
            number(JOULES_PER_KWH)
        ))
    }

    /// A share's slice of the day, allocated by autonomous hours within its scope, while the day
    /// lies in its period. The bar at `t` is the day `(t − 1d, t]`, so the day starting at
    /// midnight `D` is in the period when `start + 1d ≤ t < end + 1d`.
    fn share(share: &Share, by: &[&str]) -> String {
        let c = &share.config;
        let mut scope: Vec<(&str, &str)> = Vec::new();
        if let Some(model) = &c.model {
            scope.push((label::MODEL, model));
        }
        if let Some(version) = &c.model_version {
            scope.push((label::MODEL_VERSION, version));
        }
        if let Some(class) = &c.machine_class {
            scope.push((label::MACHINE_CLASS, class));
        }
        let hours = autonomous_seconds(&scope, MS_PER_DAY);
        let from_s = (share.period.start_ms + MS_PER_DAY) / 1000;
        let until_s = (share.period.end_ms + MS_PER_DAY) / 1000;
        format!(
            "(({} / {}) * {} / on () group_left () ({} > 0) and on () (vector(time()) >= {from_s}) \
             and on () (vector(time()) < {until_s}))",
            c.amount,
            share.period.day_count(),
            sum_by(by, &hours),
            sum_by(&[], &hours),
        )
    }

    /// Every component, each defaulting to 0 for the groups with autonomous hours.
    fn components(&self, by: &[&str]) -> Vec<String> {
        let zero = format!("0 * {}", Self::autonomous_hours(by));
        let mut out: Vec<String> = self
            .amortization(by)
            .into_iter()
            .chain(self.energy(by))
            .chain(self.book.shares.iter().map(|s| Self::share(s, by)))
            .map(|term| format!("({term} or {zero})"))
            .collect();
        if out.is_empty() {
            out.push(zero);
        }
        out
    }

    /// Cost per autonomous machine-hour of the day, by `by`.
    fn per_autonomous_hour(&self, by: &[&str]) -> String {
        format!(
            "({}) / ({} > 0)",
            self.components(by).join(" + "),
            Self::autonomous_hours(by)
        )
    }
}

fn cost(prices: Option<&PriceBook>, datasource_uid: &str) -> Dashboard {
    let mut b = Board::new(
        uid::COST,
        "edgewatch: cost per autonomous machine-hour",
        GENERATED,
        "now-30d",
        datasource_uid,
    );
    b.row("Usage per UTC day");
    let class = [label::MACHINE_CLASS];
    b.add(
        Panel::new(
            Kind::Bars,
            "Autonomous machine-hours per UTC day, by class",
            8,
            8,
        )
        .about(
            "The denominator of cost per autonomous machine-hour. Each bar is the UTC day \
                 ending at its time.",
        )
        .unit("h")
        .interval(MS_PER_DAY)
        .stacked()
        .target(CostQueries::autonomous_hours(&class), legend(&class)),
    );
    b.add(
        Panel::new(Kind::Bars, "Machine-hours per UTC day, by mode", 8, 8)
            .about(
                "Machine time in every mode: what the edge computer's amortization is charged on.",
            )
            .unit("h")
            .interval(MS_PER_DAY)
            .stacked()
            .target(
                format!(
                    "{} / {}",
                    sum_by(
                        &[label::MODE],
                        &increase(metric::AUTONOMY_SECONDS, MS_PER_DAY)
                    ),
                    number(SECONDS_PER_HOUR)
                ),
                legend(&[label::MODE]),
            ),
    );
    b.add(
        Panel::new(Kind::Bars, "Energy per UTC day, by site", 8, 8)
            .unit("kwatth")
            .interval(MS_PER_DAY)
            .stacked()
            .target(
                format!(
                    "{} / {}",
                    sum_by(&[label::SITE], &increase(metric::ENERGY_JOULES, MS_PER_DAY)),
                    number(JOULES_PER_KWH)
                ),
                legend(&[label::SITE]),
            ),
    );
    let Some(book) = prices else {
        b.add(Panel::new(Kind::Text, "No price book", 24, 4).text(
            "The gateway's configuration has no `[prices]` table, so these dashboards show \
                 usage only. Add the price book (`docs/slo-catalog.md`, \"Cost\") and run \
                 `edgewatch-gateway dashboards` again for cost per autonomous machine-hour.",
        ));
        return b.finish();
    };
    let q = CostQueries { book };
    let unit = format!("suffix: {}/h", book.currency);
    b.row(format!(
        "Cost per autonomous machine-hour per UTC day ({})",
        book.currency
    ));
    let about = "Amortization, energy and allocated shares of the UTC day ending at each bar, over \
                 the day's autonomous hours, with the prices of the price book. A class or site \
                 without a price costs 0, as in the report, which lists it.";
    for (title, by) in [
        ("by machine class", vec![label::MACHINE_CLASS]),
        ("by site", vec![label::SITE]),
        ("by model version", vec![label::MODEL, label::MODEL_VERSION]),
    ] {
        b.add(
            Panel::new(
                Kind::Bars,
                format!("Cost per autonomous machine-hour, {title}"),
                8,
                8,
            )
            .about(about)
            .unit(unit.clone())
            .interval(MS_PER_DAY)
            .target(q.per_autonomous_hour(&by), legend(&by)),
        );
    }
    let mut components = Panel::new(Kind::Bars, "Cost per UTC day, by component", 24, 8)
        .about("The day's cost of the whole fleet, by FOCUS service.")
        .unit(format!("suffix: {}", book.currency))
        .interval(MS_PER_DAY)
        .stacked();
    if let Some(amortization) = q.amortization(&[]) {
        components = components.target(amortization, AMORTIZATION_SERVICE);
    }
    if let Some(energy) = q.energy(&[]) {
        components = components.target(energy, ENERGY_SERVICE);
    }
    let mut services: Vec<_> = book.shares.iter().map(|s| s.config.service).collect();
    services.sort();
    services.dedup();
    for service in services {
        let terms: Vec<String> = book
            .shares
            .iter()
            .filter(|s| s.config.service == service)
            .map(|s| format!("({} or vector(0))", CostQueries::share(s, &[])))
            .collect();
        components = components.target(terms.join(" + "), service.service_name());
    }
    if !components.targets.is_empty() {
        b.add(components);
    }
    b.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{LoopsSli, RawCatalog, RawSli};
    use crate::cost::RawPriceBook;
    use std::collections::BTreeSet;

    fn book() -> PriceBook {
        let raw: RawPriceBook = serde_json::from_value(json!({
            "currency": "EUR",
            "machine_classes": {
                "haul-truck": { "purchase_price": 4200.0, "lifetime_hours": 30000.0 },
            },
            "sites": { "pit-3": { "energy_price_per_kwh": 0.19 } },
            "shares": [
                {
                    "service": "cloud-inference", "amount": 300.0,
                    "start": "2026-11-01T00:00:00Z", "end": "2026-12-01T00:00:00Z",
                },
                {
                    "service": "training", "amount": 90.0,
                    "start": "2026-11-01T00:00:00Z", "end": "2026-11-04T00:00:00Z",
                    "model_version": "4.3.0",
                },
            ],
        }))
        .unwrap();
        raw.validate().unwrap()
    }

    fn all(catalog: &Catalog, prices: Option<&PriceBook>) -> Vec<Dashboard> {
        dashboards(catalog, prices, DEFAULT_DATASOURCE_UID)
    }

    fn panels(d: &Dashboard) -> &Vec<Value> {
        d.json["panels"].as_array().unwrap()
    }

    fn exprs(d: &Dashboard) -> Vec<String> {
        panels(d)
            .iter()
            .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
            .map(|t| t["expr"].as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn every_panel_has_a_unique_id_and_fits_the_grid_without_overlap() {
        for d in all(&Catalog::default(), Some(&book())) {
            let mut ids = BTreeSet::new();
            let mut cells = BTreeSet::new();
            for p in panels(&d) {
                assert!(ids.insert(p["id"].as_u64().unwrap()), "{} twice", p["id"]);
                let g = &p["gridPos"];
                let (x, y, w, h) = (
                    g["x"].as_u64().unwrap(),
                    g["y"].as_u64().unwrap(),
                    g["w"].as_u64().unwrap(),
                    g["h"].as_u64().unwrap(),
                );
                assert!(
                    w > 0 && h > 0 && x + w <= GRID_COLUMNS,
                    "{}: {g}",
                    p["title"]
                );
                for cell in (x..x + w).flat_map(|cx| (y..y + h).map(move |cy| (cx, cy))) {
                    assert!(cells.insert(cell), "{} overlaps at {cell:?}", p["title"]);
                }
            }
            assert_eq!(d.json["schemaVersion"], json!(SCHEMA_VERSION));
            assert_eq!(d.json["uid"], json!(d.uid));
        }
    }

    #[test]
    fn every_panel_and_target_names_the_one_data_source() {
        let ds = json!({ "type": "prometheus", "uid": "site-prom" });
        for d in dashboards(&Catalog::default(), Some(&book()), "site-prom") {
            for p in panels(&d).iter().filter(|p| p["targets"].is_array()) {
                assert_eq!(p["datasource"], ds, "{}", p["title"]);
                let targets = p["targets"].as_array().unwrap();
                assert!(!targets.is_empty(), "{} has no target", p["title"]);
                let refs: BTreeSet<&str> = targets
                    .iter()
                    .map(|t| t["refId"].as_str().unwrap())
                    .collect();
                assert_eq!(refs.len(), targets.len(), "{}", p["title"]);
                for t in targets {
                    assert_eq!(t["datasource"], ds);
                }
            }
            for v in d.json["templating"]["list"].as_array().unwrap() {
                assert_eq!(v["datasource"], ds);
            }
        }
    }

    /// Every name a target reads: series of `names`, records of `rules`, or Prometheus' own.
    #[test]
    fn every_target_reads_only_the_names_and_the_recorded_rules() {
        let catalog = Catalog::default();
        let mut known: BTreeSet<String> = [
            metric::CONTROL_CYCLES,
            metric::CONTROL_MISSED,
            metric::CONTROL_ACTIVATIONS,
            metric::CONTROL_ACTIVATIONS_MISSED,
            metric::SAFETY_FALLBACKS,
            metric::INTERVENTIONS,
            metric::SAFE_STOPS,
            metric::THROTTLE_SECONDS,
            metric::AUTONOMY_SECONDS,
            metric::ENERGY_JOULES,
            metric::QUEUE_LOST_RECORDS,
            metric::SAFETY_EVENTS_RECEIVED,
            metric::SAFETY_EVENTS_FRESH,
            metric::REFUSED_SAMPLES,
            BUDGET_REMAINING_RECORD,
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        let rules = crate::render_rules(&catalog);
        for slo in &catalog.slos {
            known.insert(error_ratio_record(slo.period_ms));
            for w in &catalog.alert_windows {
                known.insert(error_ratio_record(w.long_ms));
                known.insert(error_ratio_record(w.short_ms));
            }
        }
        for record in known.iter().filter(|n| n.starts_with("slo:")) {
            assert!(
                rules.contains(&format!("record: \"{record}\"")),
                "{record} is not recorded"
            );
        }
        for d in all(&catalog, Some(&book())) {
            for expr in exprs(&d) {
                let names: Vec<&str> = expr
                    .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                    .filter(|w| {
                        w.starts_with("edge_")
                            || w.starts_with("edgewatch_")
                            || w.starts_with("slo:")
                    })
                    .collect();
                for name in names {
                    assert!(known.contains(name), "{name} in {expr}");
                }
            }
        }
    }

    #[test]
    fn one_more_slo_in_the_catalog_adds_one_more_set_of_burn_panels() {
        let mut raw = RawCatalog::default();
        let before = raw.validate().unwrap();
        raw.slos.push(crate::catalog::RawSlo {
            name: "planner-control".into(),
            description: "Planner steps within their deadline".into(),
            objective_percent: 99.5,
            period: "30d".into(),
            sli: RawSli::ControlDeadline(LoopsSli {
                loops: vec!["planner".into()],
            }),
        });
        let after = raw.validate().unwrap();
        let burn = |c: &Catalog| slo_burn(c, DEFAULT_DATASOURCE_UID);
        let (old, new) = (burn(&before), burn(&after));
        let set = 1 + before.alert_windows.len() + 1;
        assert_eq!(panels(&old).len(), before.slos.len() * set);
        assert_eq!(panels(&new).len(), panels(&old).len() + set);
        // The new set is the last one and is about the new SLO only.
        let added = &panels(&new)[panels(&old).len()..];
        assert_eq!(added[0]["type"], "row");
        assert_eq!(added[0]["title"], "planner-control: 99.5% over 30d");
        for p in &added[1..] {
            for t in p["targets"].as_array().unwrap() {
                assert!(
                    t["expr"]
                        .as_str()
                        .unwrap()
                        .contains("{slo=\"planner-control\"}")
                );
            }
        }
        let burn_rates: Vec<&str> = added[1..=before.alert_windows.len()]
            .iter()
            .map(|p| p["targets"][0]["expr"].as_str().unwrap())
            .collect();
        assert_eq!(
            burn_rates,
            [
                "slo:sli_error:ratio_rate1h{slo=\"planner-control\"} / 0.005",
                "slo:sli_error:ratio_rate6h{slo=\"planner-control\"} / 0.005",
                "slo:sli_error:ratio_rate3d{slo=\"planner-control\"} / 0.005",
            ]
        );
        // The overview's budget and compliance cover it too.
        let overview = fleet(&after, DEFAULT_DATASOURCE_UID);
        assert!(
            exprs(&overview)
                .iter()
                .any(|e| e.contains("planner-control"))
        );
        // Its thresholds are the catalog's factors: 14.4, 6 and 1 for 30 days.
        let factors: Vec<f64> = added[1..=before.alert_windows.len()]
            .iter()
            .map(|p| {
                p["fieldConfig"]["defaults"]["thresholds"]["steps"][1]["value"]
                    .as_f64()
                    .unwrap()
            })
            .collect();
        assert_eq!(factors, [14.4, 6.0, 1.0]);
    }

    #[test]
    fn the_machine_dashboard_filters_every_target_by_its_variable() {
        let d = machine(DEFAULT_DATASOURCE_UID);
        let variables = d.json["templating"]["list"].as_array().unwrap();
        assert_eq!(variables.len(), 1);
        assert_eq!(variables[0]["name"], MACHINE_VARIABLE);
        assert_eq!(variables[0]["query"], "label_values(machine_id)");
        for expr in exprs(&d) {
            let selectors = expr.matches('{').count();
            assert!(selectors > 0, "{expr}");
            assert_eq!(
                expr.matches("machine_id=\"$machine\"").count(),
                selectors,
                "{expr}"
            );
        }
    }

    #[test]
    fn cost_queries_carry_the_price_book_and_shares_only_in_their_period_and_scope() {
        let b = book();
        let q = CostQueries { book: &b };
        let amortization = q.amortization(&[label::SITE]).unwrap();
        assert_eq!(
            amortization,
            "sum by (site) (increase(edge_autonomy_seconds_total[1d]) * on (machine_class) \
             group_left () (label_replace(vector(4200 / 30000), \"machine_class\", \
             \"haul-truck\", \"\", \"\"))) / 3600"
        );
        let energy = q.energy(&[]).unwrap();
        assert!(
            energy.contains("label_replace(vector(0.19), \"site\", \"pit-3\", \"\", \"\")"),
            "{energy}"
        );
        assert!(energy.ends_with("/ 3600000"), "{energy}");
        // 2026-11-01 is day 20,758: + 1 d = 1,793,577,600 s; 2026-11-04 + 1 d = 1,793,836,800 s.
        let training = CostQueries::share(&b.shares[1], &[label::MACHINE_CLASS]);
        assert!(
            training.starts_with(
                "((90 / 3) * sum by (machine_class) (increase(edge_autonomy_seconds_total\
                 {mode=\"autonomous\", model_version=\"4.3.0\"}[1d]))"
            ),
            "{training}"
        );
        assert!(
            training.contains("vector(time()) >= 1793577600"),
            "{training}"
        );
        assert!(
            training.contains("vector(time()) < 1793836800"),
            "{training}"
        );
        let per_hour = q.per_autonomous_hour(&[label::SITE]);
        assert_eq!(per_hour.matches(" or 0 * ").count(), 4, "{per_hour}");
        assert!(
            per_hour.ends_with(
                "/ (sum by (site) (increase(edge_autonomy_seconds_total{mode=\"autonomous\"}\
                 [1d])) / 3600 > 0)"
            ),
            "{per_hour}"
        );
    }

    #[test]
    fn a_price_key_cannot_reach_into_a_replacement_or_out_of_its_string() {
        let term = CostQueries::price_vector(
            label::SITE,
            [(&"a$1\"b".to_owned(), "1".to_owned())].into_iter(),
        )
        .unwrap();
        assert_eq!(
            term,
            "(label_replace(vector(1), \"site\", \"a$$1\\\"b\", \"\", \"\"))"
        );
    }

    #[test]
    fn without_prices_the_cost_dashboard_shows_usage_and_says_why() {
        let d = cost(None, DEFAULT_DATASOURCE_UID);
        let kinds: Vec<&str> = panels(&d)
            .iter()
            .map(|p| p["type"].as_str().unwrap())
            .collect();
        assert_eq!(
            kinds,
            ["row", "timeseries", "timeseries", "timeseries", "text"]
        );
        assert!(exprs(&d).iter().all(|e| !e.contains("label_replace")));
        let with = cost(Some(&book()), DEFAULT_DATASOURCE_UID);
        assert_eq!(panels(&with).len(), 4 + 1 + 3 + 1);
    }

    #[test]
    fn dashboards_are_the_same_every_time() {
        let catalog = Catalog::default();
        assert_eq!(all(&catalog, Some(&book())), all(&catalog, Some(&book())));
    }

    #[test]
    fn provisioning_files_name_the_uid_url_and_path_as_quoted_scalars() {
        let ds = datasource_provisioning("edgewatch-prometheus", "http://prom:9090");
        assert!(ds.contains("\n    uid: \"edgewatch-prometheus\"\n"), "{ds}");
        assert!(ds.contains("\n    url: \"http://prom:9090\"\n"), "{ds}");
        assert!(ds.contains("\n    type: \"prometheus\"\n"), "{ds}");
        let dashboards = dashboard_provisioning("/var/lib/grafana/dashboards/edgewatch");
        assert!(dashboards.contains("\n      path: \"/var/lib/grafana/dashboards/edgewatch\"\n"));
        assert!(dashboards.contains("\n    type: \"file\"\n"));
    }

    #[test]
    fn a_datasource_uid_is_checked_and_the_error_names_the_key() {
        assert!(check_datasource_uid("--datasource-uid", "edgewatch-prometheus").is_ok());
        assert!(check_datasource_uid("--datasource-uid", &"a".repeat(40)).is_ok());
        for bad in ["", "a b", "prom/1", &"a".repeat(41)] {
            let error = check_datasource_uid("--datasource-uid", bad).unwrap_err();
            assert_eq!(error.key(), "--datasource-uid");
        }
    }

    #[test]
    fn reference_ids_go_on_after_z() {
        assert_eq!(ref_id(0), "A");
        assert_eq!(ref_id(25), "Z");
        assert_eq!(ref_id(26), "AA");
        assert_eq!(ref_id(27), "AB");
    }
}
