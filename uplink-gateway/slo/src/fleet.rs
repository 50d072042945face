//! The fleet view's data: one row per machine (the machines table) and one machine's detail,
//! from the series of `docs/series.md` ("Fleet series", and the loss, throttle, autonomy and
//! deadline counters). `edgewatch-gateway fleet` prints these structures and the fleet page
//! renders them, so both show the same numbers.
//!
//! Needs → fetch → compute, as for the SLO report: [`table_needs`] (or [`detail_needs`]) says
//! which series to read and how, the gateway reads them from the embedded store or from
//! Prometheus into one [`SeriesSet`], and [`table`] (or [`detail`]) computes.
//!
//! ```text
//! Read::Latest   each series' latest sample in (end − range, end], handed over stamped at end
//!                (PromQL: last_over_time(m[range]) at end, which gives the value only)
//! Read::Samples  every raw sample in (end − range, end] (PromQL: m[range] at end)
//! ```
//!
//! Invariants:
//! - Pure: no I/O, no clock; the evaluation time is an argument.
//! - Nothing depends on the time of a `Latest` sample: a time the view shows is the value of a
//!   series that holds a time (`*_timestamp_seconds`), or the time of a raw sample. So both
//!   sources, which agree on values, give the same table.
//! - Gauges are read by their latest value, counters only through the increase rule over the
//!   window ([`crate::series::increase`], as the report does); series are summed in the order
//!   of their labels, so the same samples always give the same sums.
//! - A value the machine never reported is `None` (printed `-`), never 0.
//! - Label values are data: copied verbatim, never interpreted or escaped here (the page
//!   escapes what it renders; JSON keeps every character).
//! - Rows come in one order for a [`SortKey`], ties broken by machine id.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;

use edgewatch_conventions::duration::DurationKey;
use serde::Serialize;

use crate::calendar::{format_duration, format_rfc3339};
use crate::names::{label, metric, value};
use crate::series::{Series, SeriesSet, Window};

/// Throttled time and autonomous hours are summed over this window by default: the last day.
pub const DEFAULT_WINDOW_MS: i64 = 86_400_000;
/// How far back the latest state of a machine is looked for by default: a machine silent for
/// longer is not listed (Prometheus keeps 15 days by default; a gateway's store keeps
/// everything).
pub const DEFAULT_LOOKBACK_MS: i64 = 30 * 86_400_000;
/// Buckets of a machine's detail over its range, by default.
pub const DEFAULT_DETAIL_BUCKETS: i64 = 24;

/// The window of throttled time and autonomous hours (`--window`, `?window=`).
pub const WINDOW: DurationKey = DurationKey::new(
    "window",
    Duration::from_secs(60),
    Duration::from_secs(366 * 86_400),
);
/// How far back the latest state is looked for (`--lookback`, `?lookback=`).
pub const LOOKBACK: DurationKey = DurationKey::new(
    "lookback",
    Duration::from_secs(3_600),
    Duration::from_secs(3_650 * 86_400),
);

/// What one view is evaluated at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct FleetQuery {
    /// Evaluation time, Unix ms: every read ends here.
    pub at_ms: i64,
    /// Throttled time and autonomous hours are their increase over `(at − window, at]`; a
    /// machine's detail covers the same range.
    pub window_ms: i64,
    /// Latest states are looked for in `(at − lookback, at]`.
    pub lookback_ms: i64,
    /// The increase rule's base lookback (the catalog's `base_lookback`).
    pub increase_lookback_ms: i64,
}

impl FleetQuery {
    /// A query at `at_ms` with the default window and lookback.
    pub fn at(at_ms: i64, increase_lookback_ms: i64) -> Self {
        Self {
            at_ms,
            window_ms: DEFAULT_WINDOW_MS,
            lookback_ms: DEFAULT_LOOKBACK_MS,
            increase_lookback_ms,
        }
    }

    fn window(&self) -> Window {
        Window::ending_at(self.at_ms, self.window_ms)
    }
}

/// How a need is read (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Read {
    /// Each series' latest sample in the range, stamped at the range's end.
    Latest,
    /// Every raw sample in the range.
    Samples,
}

/// One read the view needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FleetNeed {
    /// Metric name.
    pub metric: &'static str,
    /// How.
    pub read: Read,
    /// Length of the range, ms.
    pub range_ms: i64,
    /// End of the range (the evaluation time), Unix ms.
    pub end_ms: i64,
    /// Only the series of this machine (label `machine_id`); `None`: every machine.
    pub machine: Option<String>,
}

/// The series the machines table reads at `query`.
pub fn table_needs(query: &FleetQuery) -> Vec<FleetNeed> {
    let need = |metric, read, range_ms| FleetNeed {
        metric,
        read,
        range_ms,
        end_ms: query.at_ms,
        machine: None,
    };
    let latest = [
        metric::MACHINE_ONLINE,
        metric::MACHINE_LAST_EVENT,
        metric::MACHINE_LAST_ARRIVAL,
        metric::MODEL_VERSION_FIRST_EVENT,
        metric::MODEL_VERSION_LAST_EVENT,
        metric::QUEUE_BACKLOG_RECORDS,
        metric::QUEUE_BACKLOG_BYTES,
        metric::AGENT_HEALTH_TIMESTAMP,
    ];
    let mut needs: Vec<FleetNeed> = latest
        .into_iter()
        .map(|m| need(m, Read::Latest, query.lookback_ms))
        .collect();
    // Loss reports are rare: their raw samples say when the latest was made.
    needs.push(need(
        metric::QUEUE_LOST_RECORDS,
        Read::Samples,
        query.lookback_ms,
    ));
    let counted = query.window_ms + query.increase_lookback_ms;
    for m in [metric::THROTTLE_SECONDS, metric::AUTONOMY_SECONDS] {
        needs.push(need(m, Read::Samples, counted));
    }
    needs
}

/// The machines table at one instant.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FleetTable {
    /// Evaluation time, Unix ms.
    pub evaluated_at_ms: i64,
    /// Evaluation time, RFC 3339 UTC.
    pub evaluated_at: String,
    /// The window of throttled time and autonomous hours, e.g. `1d`.
    pub window: String,
    /// How far back latest states were looked for, e.g. `30d`.
    pub lookback: String,
    /// One row per machine with any fleet series in the lookback, in the order asked for.
    pub machines: Vec<MachineRow>,
}

/// One machine.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MachineRow {
    /// `machine_id` label.
    pub machine_id: String,
    /// `machine_class` label (of its latest arrival's series).
    pub machine_class: String,
    /// `site` label.
    pub site: String,
    /// Per model name, the version with the newest event: what the machine runs.
    pub models: Vec<RunningModel>,
    /// Its last status: online, offline (last will), or never reported (`None`).
    pub online: Option<bool>,
    /// Newest event time received from it, Unix ms.
    pub last_event_ms: Option<i64>,
    /// The same, RFC 3339.
    pub last_event: Option<String>,
    /// Arrival of its latest batch, Unix ms.
    pub last_arrival_ms: Option<i64>,
    /// The same, RFC 3339.
    pub last_arrival: Option<String>,
    /// Evaluation time minus the last arrival, ms.
    pub silent_for_ms: Option<i64>,
    /// Its queue's backlog as of its latest health report.
    pub backlog: Option<Backlog>,
    /// Records its queue lost, as of its latest loss report.
    pub losses: Option<Losses>,
    /// Throttled seconds over the window, per component (`cpu`, `gpu`, `soc`); `None` when it
    /// reported no throttle counters in the window.
    pub throttled_seconds: Option<BTreeMap<String, f64>>,
    /// Hours in mode `autonomous` over the window; `None` without autonomy counters in it.
    pub autonomous_hours: Option<f64>,
}

/// A model version a machine runs (or ran last under that model name).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunningModel {
    /// `model` label.
    pub model: String,
    /// `model_version` label.
    pub model_version: String,
    /// Oldest event time stored under this version, Unix ms (`None` when that was written
    /// before the lookback).
    pub first_event_ms: Option<i64>,
    /// Newest event time stored under this version, Unix ms.
    pub last_event_ms: i64,
}

/// A queue's backlog from one health report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Backlog {
    /// The report's event time, Unix ms (`None` when its time series is missing).
    pub as_of_ms: Option<i64>,
    /// The same, RFC 3339.
    pub as_of: Option<String>,
    /// Per tier (`safety`, `slo`, `debug`), what waited.
    pub tiers: BTreeMap<String, TierBacklog>,
}

/// What waited in one tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TierBacklog {
    /// Records.
    pub records: Option<u64>,
    /// Bytes.
    pub bytes: Option<u64>,
}

/// Records a machine's queue lost: the agent's running totals.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Losses {
    /// Event time of the latest loss report, Unix ms.
    pub as_of_ms: i64,
    /// The same, RFC 3339.
    pub as_of: String,
    /// Per tier, every cause summed.
    pub tiers: BTreeMap<String, u64>,
}

impl MachineRow {
    fn new(machine_id: &str) -> Self {
        Self {
            machine_id: machine_id.to_owned(),
            machine_class: String::new(),
            site: String::new(),
            models: Vec::new(),
            online: None,
            last_event_ms: None,
            last_event: None,
            last_arrival_ms: None,
            last_arrival: None,
            silent_for_ms: None,
            backlog: None,
            losses: None,
            throttled_seconds: None,
            autonomous_hours: None,
        }
    }

    /// Records waiting, every tier summed; `None` without a health report.
    pub fn backlog_records(&self) -> Option<u64> {
        let backlog = self.backlog.as_ref()?;
        Some(backlog.tiers.values().filter_map(|t| t.records).sum())
    }

    /// Records lost, every tier summed; `None` without a loss report.
    pub fn lost_records(&self) -> Option<u64> {
        Some(self.losses.as_ref()?.tiers.values().sum())
    }

    /// Throttled seconds, every component summed.
    pub fn throttled_total(&self) -> Option<f64> {
        Some(self.throttled_seconds.as_ref()?.values().sum())
    }
}

/// Seconds (a `*_timestamp_seconds` value) to Unix ms.
fn seconds_to_ms(seconds: f64) -> i64 {
    (seconds * 1000.0).round() as i64
}

fn latest(series: &Series) -> Option<f64> {
    series.samples().last().map(|&(_, v)| v)
}

/// Series of `name` sorted by their labels: sums over them do not depend on fetch order.
fn sorted<'a>(set: &'a SeriesSet, name: &'a str) -> Vec<&'a Series> {
    let mut out: Vec<&Series> = set.metric(name).collect();
    out.sort_by(|a, b| a.labels().cmp(b.labels()));
    out
}

/// Rows by machine id, created on first sight.
struct Rows {
    rows: BTreeMap<String, MachineRow>,
    /// Per machine, the (class, site) of the series that named it best so far, with its rank
    /// (lower is better) and the value deciding within that rank.
    identity: BTreeMap<String, (u8, f64)>,
}

impl Rows {
    fn row(&mut self, series: &Series) -> &mut MachineRow {
        let id = series.label(label::MACHINE_ID);
        self.rows
            .entry(id.to_owned())
            .or_insert_with(|| MachineRow::new(id))
    }

    /// Takes class and site from the machine's series: its latest arrival's first, then its
    /// last event's, then any other (first by label order).
    fn name(&mut self, series: &Series, rank: u8, value: f64) {
        let id = series.label(label::MACHINE_ID).to_owned();
        let better = match self.identity.get(&id) {
            None => true,
            Some(&(r, v)) => rank < r || (rank == r && value > v),
        };
        if better {
            self.identity.insert(id, (rank, value));
            let row = self.row(series);
            row.machine_class = series.label(label::MACHINE_CLASS).to_owned();
            row.site = series.label(label::SITE).to_owned();
        }
    }
}

/// The machines table at `query`, from the samples [`table_needs`] named, sorted by `sort`.
pub fn table(set: &SeriesSet, query: &FleetQuery, sort: SortKey) -> FleetTable {
    let mut rows = Rows {
        rows: BTreeMap::new(),
        identity: BTreeMap::new(),
    };
    // Every machine any series names is listed; the connection series name it best.
    for (rank, name) in [
        metric::MACHINE_LAST_ARRIVAL,
        metric::MACHINE_LAST_EVENT,
        metric::MACHINE_ONLINE,
        metric::AGENT_HEALTH_TIMESTAMP,
        metric::QUEUE_BACKLOG_RECORDS,
        metric::QUEUE_BACKLOG_BYTES,
        metric::MODEL_VERSION_LAST_EVENT,
        metric::MODEL_VERSION_FIRST_EVENT,
        metric::QUEUE_LOST_RECORDS,
        metric::THROTTLE_SECONDS,
        metric::AUTONOMY_SECONDS,
    ]
    .into_iter()
    .enumerate()
    {
        for series in sorted(set, name) {
            let value = latest(series).unwrap_or(0.0);
            rows.name(series, rank as u8, value);
        }
    }

    for series in sorted(set, metric::MACHINE_LAST_ARRIVAL) {
        if let Some(v) = latest(series) {
            let row = rows.row(series);
            let ms = seconds_to_ms(v);
            row.last_arrival_ms = Some(row.last_arrival_ms.map_or(ms, |m| m.max(ms)));
        }
    }
    for series in sorted(set, metric::MACHINE_LAST_EVENT) {
        if let Some(v) = latest(series) {
            let row = rows.row(series);
            let ms = seconds_to_ms(v);
            row.last_event_ms = Some(row.last_event_ms.map_or(ms, |m| m.max(ms)));
        }
    }
    for series in sorted(set, metric::MACHINE_ONLINE) {
        let (class, site) = (
            series.label(label::MACHINE_CLASS).to_owned(),
            series.label(label::SITE).to_owned(),
        );
        if let Some(v) = latest(series) {
            let row = rows.row(series);
            // Of several (a machine whose class changed), the one under its current labels.
            if row.online.is_none() || (row.machine_class == class && row.site == site) {
                row.online = Some(v > 0.5);
            }
        }
    }

    // Model versions: per model name, the version with the newest event.
    let mut firsts: BTreeMap<(String, String, String), i64> = BTreeMap::new();
    for series in sorted(set, metric::MODEL_VERSION_FIRST_EVENT) {
        if let Some(v) = latest(series) {
            firsts.insert(model_key(series), seconds_to_ms(v));
        }
    }
    for series in sorted(set, metric::MODEL_VERSION_LAST_EVENT) {
        let Some(v) = latest(series) else { continue };
        let key = model_key(series);
        let running = RunningModel {
            model: key.1.clone(),
            model_version: key.2.clone(),
            first_event_ms: firsts.get(&key).copied(),
            last_event_ms: seconds_to_ms(v),
        };
        let row = rows.row(series);
        match row.models.iter_mut().find(|m| m.model == running.model) {
            Some(known) if known.last_event_ms >= running.last_event_ms => {}
            Some(known) => *known = running,
            None => row.models.push(running),
        }
    }

    // The backlog, as of the latest health report.
    for (name, records) in [
        (metric::QUEUE_BACKLOG_RECORDS, true),
        (metric::QUEUE_BACKLOG_BYTES, false),
    ] {
        for series in sorted(set, name) {
            let Some(v) = latest(series) else { continue };
            let tier = series.label(label::TIER).to_owned();
            let backlog = rows.row(series).backlog.get_or_insert_with(empty_backlog);
            let slot = backlog.tiers.entry(tier).or_insert(TierBacklog {
                records: None,
                bytes: None,
            });
            if records {
                slot.records = Some(v as u64);
            } else {
                slot.bytes = Some(v as u64);
            }
        }
    }
    for series in sorted(set, metric::AGENT_HEALTH_TIMESTAMP) {
        if let Some(v) = latest(series) {
            let ms = seconds_to_ms(v);
            let backlog = rows.row(series).backlog.get_or_insert_with(empty_backlog);
            if backlog.as_of_ms.is_none_or(|m| ms > m) {
                backlog.as_of_ms = Some(ms);
                backlog.as_of = Some(format_rfc3339(ms));
            }
        }
    }

    // Losses: the agent's running totals per (tier, cause), as of the latest report.
    for series in sorted(set, metric::QUEUE_LOST_RECORDS) {
        let Some(&(t, v)) = series
            .samples()
            .iter()
            .rev()
            .find(|(t, _)| *t <= query.at_ms)
        else {
            continue;
        };
        let tier = series.label(label::TIER).to_owned();
        let losses = rows.row(series).losses.get_or_insert_with(|| Losses {
            as_of_ms: t,
            as_of: String::new(),
            tiers: BTreeMap::new(),
        });
        losses.as_of_ms = losses.as_of_ms.max(t);
        *losses.tiers.entry(tier).or_insert(0) += v as u64;
    }

    // Throttled time and autonomous hours over the window: the increase rule, as the report.
    let window = query.window();
    for series in sorted(set, metric::THROTTLE_SECONDS) {
        let increase = series.increase(window, query.increase_lookback_ms);
        let component = series.label(label::COMPONENT).to_owned();
        let row = rows.row(series);
        *row.throttled_seconds
            .get_or_insert_with(BTreeMap::new)
            .entry(component)
            .or_insert(0.0) += increase;
    }
    let mut autonomous: BTreeMap<String, f64> = BTreeMap::new();
    for series in sorted(set, metric::AUTONOMY_SECONDS) {
        let seconds = if series.label(label::MODE) == value::AUTONOMOUS {
            series.increase(window, query.increase_lookback_ms)
        } else {
            0.0
        };
        rows.row(series);
        *autonomous
            .entry(series.label(label::MACHINE_ID).to_owned())
            .or_insert(0.0) += seconds;
    }

    let mut machines: Vec<MachineRow> = rows
        .rows
        .into_values()
        .map(|mut row| {
            row.last_event = row.last_event_ms.map(format_rfc3339);
            row.last_arrival = row.last_arrival_ms.map(format_rfc3339);
            row.silent_for_ms = row.last_arrival_ms.map(|m| query.at_ms - m);
            if let Some(losses) = &mut row.losses {
                losses.as_of = format_rfc3339(losses.as_of_ms);
            }
            row.autonomous_hours = autonomous.get(&row.machine_id).map(|s| s / 3600.0);
            row.models.sort_by(|a, b| a.model.cmp(&b.model));
            row
        })
        .collect();
    sort.sort(&mut machines);
    FleetTable {
        evaluated_at_ms: query.at_ms,
        evaluated_at: format_rfc3339(query.at_ms),
        window: format_duration(query.window_ms),
        lookback: format_duration(query.lookback_ms),
        machines,
    }
}

fn empty_backlog() -> Backlog {
    Backlog {
        as_of_ms: None,
        as_of: None,
        tiers: BTreeMap::new(),
    }
}

/// (machine, model, model version) of a model-version series.
fn model_key(series: &Series) -> (String, String, String) {
    (
        series.label(label::MACHINE_ID).to_owned(),
        series.label(label::MODEL).to_owned(),
        series.label(label::MODEL_VERSION).to_owned(),
    )
}

/// The order of the machines table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SortKey {
    /// Silent for longest first (oldest last arrival; never arrived first).
    #[default]
    Silent,
    /// Machine id.
    Machine,
    /// Machine class.
    Class,
    /// Site.
    Site,
    /// Model name and version.
    Model,
    /// Offline first, then never reported, then online.
    Online,
    /// Oldest last event first (none first).
    LastEvent,
    /// Largest backlog (records, every tier) first.
    Backlog,
    /// Most records lost first.
    Losses,
    /// Most throttled seconds (every component) first.
    Throttled,
    /// Most autonomous hours first.
    Autonomy,
}

impl SortKey {
    /// Every key, by its name.
    pub const ALL: [(&'static str, SortKey); 11] = [
        ("silent", SortKey::Silent),
        ("machine", SortKey::Machine),
        ("class", SortKey::Class),
        ("site", SortKey::Site),
        ("model", SortKey::Model),
        ("online", SortKey::Online),
        ("last-event", SortKey::LastEvent),
        ("backlog", SortKey::Backlog),
        ("losses", SortKey::Losses),
        ("throttled", SortKey::Throttled),
        ("autonomy", SortKey::Autonomy),
    ];

    /// Its name (`--sort`, `?sort=`).
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, key)| *key == self)
            .map_or("silent", |(name, _)| name)
    }

    /// Sorts `rows` by this key, ties by machine id.
    pub fn sort(self, rows: &mut [MachineRow]) {
        use std::cmp::Ordering;
        // Descending with `None` last, for sizes.
        fn desc<T: PartialOrd>(a: Option<T>, b: Option<T>) -> Ordering {
            match (a, b) {
                (Some(a), Some(b)) => b.partial_cmp(&a).unwrap_or(Ordering::Equal),
                (Some(_), None) => Ordering::Less,
                (None, Some(_)) => Ordering::Greater,
                (None, None) => Ordering::Equal,
            }
        }
        let model = |row: &MachineRow| {
            row.models
                .first()
                .map(|m| (m.model.clone(), m.model_version.clone()))
        };
        rows.sort_by(|a, b| {
            let by = match self {
                // Never arrived counts as silent for ever.
                SortKey::Silent => a.last_arrival_ms.cmp(&b.last_arrival_ms),
                SortKey::Machine => Ordering::Equal,
                SortKey::Class => a.machine_class.cmp(&b.machine_class),
                SortKey::Site => a.site.cmp(&b.site),
                SortKey::Model => model(a).cmp(&model(b)),
                SortKey::Online => {
                    let rank = |row: &MachineRow| match row.online {
                        Some(false) => 0,
                        None => 1,
                        Some(true) => 2,
                    };
                    rank(a).cmp(&rank(b))
                }
                SortKey::LastEvent => a.last_event_ms.cmp(&b.last_event_ms),
                SortKey::Backlog => desc(a.backlog_records(), b.backlog_records()),
                SortKey::Losses => desc(a.lost_records(), b.lost_records()),
                SortKey::Throttled => desc(a.throttled_total(), b.throttled_total()),
                SortKey::Autonomy => desc(a.autonomous_hours, b.autonomous_hours),
            };
            by.then_with(|| a.machine_id.cmp(&b.machine_id))
        });
    }
}

/// An unknown sort key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown sort key `{0}`; expected one of {names}", names = SortKey::ALL.map(|(n, _)| n).join(", "))]
pub struct UnknownSortKey(pub String);

impl FromStr for SortKey {
    type Err = UnknownSortKey;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .iter()
            .find(|(name, _)| *name == text)
            .map(|(_, key)| *key)
            .ok_or_else(|| UnknownSortKey(text.to_owned()))
    }
}

/// The series a machine's detail reads: its counters and backlog over `(at − window, at]` in
/// [`MachineDetail::buckets`] of `window / buckets`, its online state over the range (and
/// before it, back to the lookback), and the event times of its model versions.
pub fn detail_needs(query: &FleetQuery, machine: &str) -> Vec<FleetNeed> {
    let need = |metric, read, range_ms| FleetNeed {
        metric,
        read,
        range_ms,
        end_ms: query.at_ms,
        machine: Some(machine.to_owned()),
    };
    let counted = query.window_ms + query.increase_lookback_ms;
    let mut needs: Vec<FleetNeed> = [
        metric::CONTROL_ACTIVATIONS,
        metric::CONTROL_ACTIVATIONS_MISSED,
        metric::THROTTLE_SECONDS,
        metric::AUTONOMY_SECONDS,
    ]
    .into_iter()
    .map(|m| need(m, Read::Samples, counted))
    .collect();
    for m in [metric::QUEUE_BACKLOG_RECORDS, metric::QUEUE_BACKLOG_BYTES] {
        needs.push(need(m, Read::Samples, query.window_ms));
    }
    needs.push(need(
        metric::MACHINE_ONLINE,
        Read::Samples,
        query.window_ms + query.lookback_ms,
    ));
    for m in [
        metric::MODEL_VERSION_FIRST_EVENT,
        metric::MODEL_VERSION_LAST_EVENT,
        metric::MACHINE_LAST_EVENT,
        metric::MACHINE_LAST_ARRIVAL,
    ] {
        needs.push(need(m, Read::Latest, query.lookback_ms));
    }
    needs
}

/// One machine over a range: what the detail page draws.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MachineDetail {
    /// `machine_id`.
    pub machine_id: String,
    /// `machine_class` (of its latest arrival's series; empty when it has none).
    pub machine_class: String,
    /// `site`.
    pub site: String,
    /// Start of the range (exclusive), Unix ms.
    pub from_ms: i64,
    /// End of the range (inclusive, the evaluation time), Unix ms.
    pub to_ms: i64,
    /// The same, RFC 3339.
    pub from: String,
    /// The same, RFC 3339.
    pub to: String,
    /// Newest event time received from it, Unix ms.
    pub last_event_ms: Option<i64>,
    /// Arrival of its latest batch, Unix ms.
    pub last_arrival_ms: Option<i64>,
    /// The range in equal buckets, oldest first.
    pub buckets: Vec<Bucket>,
    /// Every model version it ran (within the lookback), oldest first event first.
    pub model_versions: Vec<RunningModel>,
    /// Its health reports in the range, oldest first.
    pub backlog: Vec<BacklogPoint>,
    /// Its online state at the end of the range (`None`: no status within the lookback).
    pub online: Option<bool>,
    /// The periods it was offline that overlap the range, oldest first.
    pub partitions: Vec<Partition>,
}

/// One bucket of a machine's detail: increases over `(start, end]`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Bucket {
    /// Start (exclusive), Unix ms.
    pub start_ms: i64,
    /// End (inclusive), Unix ms.
    pub end_ms: i64,
    /// Activations judged against their deadline, per loop.
    pub activations: BTreeMap<String, f64>,
    /// Of those, deadline misses, per loop.
    pub deadline_misses: BTreeMap<String, f64>,
    /// Throttled seconds per component.
    pub throttled_seconds: BTreeMap<String, f64>,
    /// Seconds per autonomy mode.
    pub mode_seconds: BTreeMap<String, f64>,
}

/// A queue's backlog at one health report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BacklogPoint {
    /// The report's event time, Unix ms.
    pub at_ms: i64,
    /// Per tier.
    pub tiers: BTreeMap<String, TierBacklog>,
}

/// A period a machine was offline: from its last will (or offline status) to its next online
/// status, both as the gateway received them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Partition {
    /// When it went offline, Unix ms.
    pub offline_ms: i64,
    /// When it came back, Unix ms; `None`: still offline at the end of the range.
    pub online_again_ms: Option<i64>,
}

/// A machine's detail at `query` over `(at − window, at]` in `buckets` buckets (at least one),
/// from the samples [`detail_needs`] named.
pub fn detail(set: &SeriesSet, query: &FleetQuery, machine: &str, buckets: i64) -> MachineDetail {
    let of_machine = |name| {
        sorted(set, name)
            .into_iter()
            .filter(move |s| s.label(label::MACHINE_ID) == machine)
    };
    let range = query.window();
    let buckets = buckets.max(1);
    let step = (query.window_ms / buckets).max(1);
    let mut out = MachineDetail {
        machine_id: machine.to_owned(),
        machine_class: String::new(),
        site: String::new(),
        from_ms: range.start_ms,
        to_ms: range.end_ms,
        from: format_rfc3339(range.start_ms),
        to: format_rfc3339(range.end_ms),
        last_event_ms: None,
        last_arrival_ms: None,
        buckets: (0..buckets)
            .map(|i| {
                let start_ms = range.start_ms + i * step;
                let end_ms = if i + 1 == buckets {
                    range.end_ms
                } else {
                    start_ms + step
                };
                Bucket {
                    start_ms,
                    end_ms,
                    activations: BTreeMap::new(),
                    deadline_misses: BTreeMap::new(),
                    throttled_seconds: BTreeMap::new(),
                    mode_seconds: BTreeMap::new(),
                }
            })
            .collect(),
        model_versions: Vec::new(),
        backlog: Vec::new(),
        online: None,
        partitions: Vec::new(),
    };
    for series in of_machine(metric::MACHINE_LAST_ARRIVAL) {
        if let Some(v) = latest(series) {
            out.last_arrival_ms = Some(seconds_to_ms(v));
            out.machine_class = series.label(label::MACHINE_CLASS).to_owned();
            out.site = series.label(label::SITE).to_owned();
        }
    }
    for series in of_machine(metric::MACHINE_LAST_EVENT) {
        if let Some(v) = latest(series) {
            out.last_event_ms = Some(seconds_to_ms(v));
        }
    }

    // Counters per bucket, through the increase rule.
    for (name, label_name) in [
        (metric::CONTROL_ACTIVATIONS, label::LOOP),
        (metric::CONTROL_ACTIVATIONS_MISSED, label::LOOP),
        (metric::THROTTLE_SECONDS, label::COMPONENT),
        (metric::AUTONOMY_SECONDS, label::MODE),
    ] {
        for series in of_machine(name) {
            let key = series.label(label_name).to_owned();
            for bucket in &mut out.buckets {
                let window = Window {
                    start_ms: bucket.start_ms,
                    end_ms: bucket.end_ms,
                };
                let increase = series.increase(window, query.increase_lookback_ms);
                let map = match name {
                    metric::CONTROL_ACTIVATIONS => &mut bucket.activations,
                    metric::CONTROL_ACTIVATIONS_MISSED => &mut bucket.deadline_misses,
                    metric::THROTTLE_SECONDS => &mut bucket.throttled_seconds,
                    _ => &mut bucket.mode_seconds,
                };
                *map.entry(key.clone()).or_insert(0.0) += increase;
            }
        }
    }

    // Health reports: one point per report time.
    let mut points: BTreeMap<i64, BTreeMap<String, TierBacklog>> = BTreeMap::new();
    for (name, records) in [
        (metric::QUEUE_BACKLOG_RECORDS, true),
        (metric::QUEUE_BACKLOG_BYTES, false),
    ] {
        for series in of_machine(name) {
            let tier = series.label(label::TIER).to_owned();
            for &(t, v) in series.samples() {
                if t <= range.start_ms || t > range.end_ms {
                    continue;
                }
                let slot =
                    points
                        .entry(t)
                        .or_default()
                        .entry(tier.clone())
                        .or_insert(TierBacklog {
                            records: None,
                            bytes: None,
                        });
                if records {
                    slot.records = Some(v as u64);
                } else {
                    slot.bytes = Some(v as u64);
                }
            }
        }
    }
    out.backlog = points
        .into_iter()
        .map(|(at_ms, tiers)| BacklogPoint { at_ms, tiers })
        .collect();

    // Online state changes, up to the end of the range: partitions overlapping it.
    let mut changes: BTreeMap<i64, bool> = BTreeMap::new();
    for series in of_machine(metric::MACHINE_ONLINE) {
        for &(t, v) in series.samples() {
            if t <= range.end_ms {
                changes.insert(t, v > 0.5);
            }
        }
    }
    let mut state: Option<bool> = None;
    let mut offline_since: Option<i64> = None;
    for (&t, &online) in &changes {
        if state == Some(online) {
            continue;
        }
        state = Some(online);
        if online {
            if let Some(since) = offline_since.take()
                && t > range.start_ms
            {
                out.partitions.push(Partition {
                    offline_ms: since,
                    online_again_ms: Some(t),
                });
            }
        } else {
            offline_since = Some(t);
        }
    }
    if let Some(since) = offline_since {
        out.partitions.push(Partition {
            offline_ms: since,
            online_again_ms: None,
        });
    }
    out.online = state;

    // Model versions, by first event.
    let mut firsts: BTreeMap<(String, String, String), i64> = BTreeMap::new();
    for series in of_machine(metric::MODEL_VERSION_FIRST_EVENT) {
        if let Some(v) = latest(series) {
            firsts.insert(model_key(series), seconds_to_ms(v));
        }
    }
    for series in of_machine(metric::MODEL_VERSION_LAST_EVENT) {
        let Some(v) = latest(series) else { continue };
        let key = model_key(series);
        out.model_versions.push(RunningModel {
            first_event_ms: firsts.get(&key).copied(),
            model: key.1,
            model_version: key.2,
            last_event_ms: seconds_to_ms(v),
        });
    }
    out.model_versions
        .sort_by_key(|m| (m.first_event_ms.unwrap_or(m.last_event_ms), m.last_event_ms));
    out
}
