//! Normalization: events of a validated batch become cumulative counter samples stamped with event
//! time, named and labelled as `docs/series.md` says, with the names of [`edgewatch_slo::names`]
//! (the SLO core reads by the same constants). Pure: no I/O, no clock (arrival is an argument).
//!
//! Invariants:
//! - Only the labels of the contract are produced: base labels (`machine_id`, `site`,
//!   `machine_class`) plus the metric's own; never ids, sequence numbers, timestamps or free text.
//!   A label value that is not a short id-like string (see [`label_value`]) drops the event
//!   (counted), so a hostile agent cannot mint series with arbitrary text.
//! - A series key is canonical: `metric{name="value",...}` with label names sorted, so equal
//!   series always have equal keys, byte for byte.
//! - Events later than `arrival + max_future_skew`, at or before the Unix epoch, and values that
//!   are negative or not finite produce no sample; each is counted in [`NormalizeStats`].

use std::fmt::Write as _;

use edgewatch_proto::topic::validate_id;
use edgewatch_proto::v1::{self, Batch, event};
use edgewatch_slo::names::{label, metric, value};

/// One sample of one series.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Canonical series key (see [`SeriesKey`]).
    pub series: String,
    /// Timestamp, milliseconds since the Unix epoch.
    pub ts_ms: i64,
    /// Counter value.
    pub value: f64,
}

/// Why events or values were dropped during normalization.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NormalizeStats {
    /// Events stamped later than arrival + the allowed skew.
    pub future_events: u64,
    /// Events with an event time at or before the Unix epoch.
    pub bad_time_events: u64,
    /// Events whose label values are not acceptable (empty kinds, long or odd strings).
    pub bad_label_events: u64,
    /// Values that are negative, NaN or infinite.
    pub bad_values: u64,
}

/// Builds canonical series keys.
#[derive(Debug, Clone)]
pub struct SeriesKey;

impl SeriesKey {
    /// `metric{a="x",b="y"}` with labels sorted by name (values are escaped like PromQL strings).
    pub fn build(metric: &str, labels: &mut [(&str, &str)]) -> String {
        labels.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let mut key = String::with_capacity(metric.len() + 16 * labels.len());
        key.push_str(metric);
        key.push('{');
        for (index, (name, value)) in labels.iter().enumerate() {
            if index > 0 {
                key.push(',');
            }
            let _ = write!(key, "{name}=\"");
            for c in value.chars() {
                match c {
                    '\\' => key.push_str("\\\\"),
                    '"' => key.push_str("\\\""),
                    '\n' => key.push_str("\\n"),
                    _ => key.push(c),
                }
            }
            key.push('"');
        }
        key.push('}');
        key
    }

    /// Splits a canonical key into its metric name and labels (sorted by name).
    pub fn parse(key: &str) -> Option<(String, Vec<(String, String)>)> {
        let open = key.find('{')?;
        let metric = key[..open].to_owned();
        let body = key[open + 1..].strip_suffix('}')?;
        let mut labels = Vec::new();
        let mut chars = body.chars().peekable();
        while chars.peek().is_some() {
            let mut name = String::new();
            for c in chars.by_ref() {
                if c == '=' {
                    break;
                }
                name.push(c);
            }
            if chars.next() != Some('"') {
                return None;
            }
            let mut value = String::new();
            loop {
                match chars.next()? {
                    '\\' => match chars.next()? {
                        'n' => value.push('\n'),
                        other => value.push(other),
                    },
                    '"' => break,
                    other => value.push(other),
                }
            }
            labels.push((name, value));
            match chars.next() {
                None => break,
                Some(',') => {}
                Some(_) => return None,
            }
        }
        Some((metric, labels))
    }

    /// The metric name of a canonical key.
    pub fn metric(key: &str) -> &str {
        key.split('{').next().unwrap_or(key)
    }
}

/// A label value from agent-supplied text: a valid id (`[A-Za-z0-9._-]`, 1 to 64 bytes), or
/// `"unknown"` when empty. `None` for anything else.
pub fn label_value(text: &str) -> Option<&str> {
    if text.is_empty() {
        return Some(value::UNKNOWN);
    }
    validate_id(text).ok().map(|()| text)
}

/// The machine's base labels.
#[derive(Debug, Clone, Copy)]
pub struct BaseLabels<'a> {
    /// `machine_id`.
    pub machine: &'a str,
    /// `site`.
    pub site: &'a str,
    /// `machine_class` (`"unknown"` when the batch has none).
    pub class: &'a str,
}

impl<'a> BaseLabels<'a> {
    /// Base labels of a batch; `None` if its machine class is not a valid label value.
    pub fn of(batch: &'a Batch) -> Option<Self> {
        Some(Self {
            machine: &batch.machine_id,
            site: &batch.site_id,
            class: label_value(&batch.machine_class)?,
        })
    }

    /// A series key of this machine.
    pub fn key(&self, metric: &str, extra: &[(&str, &str)]) -> String {
        let mut labels: Vec<(&str, &str)> = Vec::with_capacity(3 + extra.len());
        labels.push((label::MACHINE_ID, self.machine));
        labels.push((label::SITE, self.site));
        labels.push((label::MACHINE_CLASS, self.class));
        labels.extend_from_slice(extra);
        SeriesKey::build(metric, &mut labels)
    }
}

fn model_labels(model: Option<&v1::ModelVersion>) -> Option<(&str, &str)> {
    match model {
        None => Some((value::UNKNOWN, value::UNKNOWN)),
        Some(model) => Some((label_value(&model.name)?, label_value(&model.version)?)),
    }
}

fn component_label(value: i32) -> Option<&'static str> {
    match v1::Component::try_from(value).ok()? {
        v1::Component::Cpu => Some(value::CPU),
        v1::Component::Gpu => Some(value::GPU),
        v1::Component::Soc => Some(value::SOC),
        v1::Component::Unspecified => None,
    }
}

fn mode_label(value: i32) -> Option<&'static str> {
    match v1::AutonomyMode::try_from(value).ok()? {
        v1::AutonomyMode::Autonomous => Some(value::AUTONOMOUS),
        v1::AutonomyMode::Manual => Some(value::MANUAL),
        v1::AutonomyMode::Teleoperated => Some(value::TELEOPERATED),
        v1::AutonomyMode::Idle => Some(value::IDLE),
        v1::AutonomyMode::Unspecified => None,
    }
}

/// The `source` of an intervention or a safe stop: `Some(None)` for what counts nothing, a socket
/// submission from an agent before sources (no source, total 0), which must not interleave with
/// the probe's totals; `None` for an unknown source.
fn source_label(source: i32, total: u64) -> Option<Option<&'static str>> {
    match v1::EventSource::try_from(source).ok()? {
        v1::EventSource::Local => Some(Some(value::LOCAL)),
        v1::EventSource::Probe => Some(Some(value::PROBE)),
        v1::EventSource::Unspecified if total > 0 => Some(Some(value::PROBE)),
        v1::EventSource::Unspecified => Some(None),
    }
}

fn tier_label(value: i32) -> Option<&'static str> {
    edgewatch_proto::tier::name(v1::Tier::try_from(value).ok()?)
}

fn cause_label(value: i32) -> Option<&'static str> {
    match v1::LossCause::try_from(value).ok()? {
        v1::LossCause::Evicted => Some("evicted"),
        v1::LossCause::Expired => Some("expired"),
        v1::LossCause::Corrupt => Some("corrupt"),
        v1::LossCause::DiskFull => Some("disk_full"),
        v1::LossCause::Quarantined => Some("quarantined"),
        v1::LossCause::BufferOverflow => Some("buffer_overflow"),
        v1::LossCause::Refused => Some("refused"),
        v1::LossCause::Unspecified => None,
    }
}

/// Whether an event time is acceptable for a sample, given arrival (both ns since the epoch).
pub fn event_time_ok(
    event_time_ns: i64,
    arrival_ns: i64,
    max_future_skew_ns: i64,
) -> Result<(), TimeProblem> {
    if event_time_ns <= 0 {
        return Err(TimeProblem::BeforeEpoch);
    }
    if event_time_ns > arrival_ns.saturating_add(max_future_skew_ns) {
        return Err(TimeProblem::Future);
    }
    Ok(())
}

/// What is wrong with an event time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeProblem {
    /// At or before the Unix epoch.
    BeforeEpoch,
    /// Later than arrival plus the allowed skew.
    Future,
}

/// Milliseconds from nanoseconds, rounding down (also for negative values).
pub fn ns_to_ms(ns: i64) -> i64 {
    ns.div_euclid(1_000_000)
}

/// Appends the samples of one event to `out`; what it drops is counted in `stats`.
pub fn normalize_event(
    base: &BaseLabels<'_>,
    event: &v1::Event,
    arrival_ns: i64,
    max_future_skew_ns: i64,
    stats: &mut NormalizeStats,
    out: &mut Vec<Sample>,
) {
    let Some(kind) = &event.kind else {
        return;
    };
    // Only counter events become samples; check the time only for those, so that a debug log line
    // with an odd clock is not counted as a bad sample.
    let is_counter = matches!(
        kind,
        event::Kind::DeadlineCounters(_)
            | event::Kind::SafetyFallback(_)
            | event::Kind::Intervention(_)
            | event::Kind::SafeStop(_)
            | event::Kind::ThrottleCounters(_)
            | event::Kind::AutonomySeconds(_)
            | event::Kind::EnergyCounters(_)
            | event::Kind::QueueLoss(_)
    );
    if !is_counter {
        return;
    }
    match event_time_ok(event.event_time_unix_ns, arrival_ns, max_future_skew_ns) {
        Ok(()) => {}
        Err(TimeProblem::Future) => {
            stats.future_events += 1;
            return;
        }
        Err(TimeProblem::BeforeEpoch) => {
            stats.bad_time_events += 1;
            return;
        }
    }
    let ts_ms = ns_to_ms(event.event_time_unix_ns);
    let mut push = |series: String, value: f64, stats: &mut NormalizeStats| {
        if value.is_finite() && value >= 0.0 {
            out.push(Sample {
                series,
                ts_ms,
                value,
            });
        } else {
            stats.bad_values += 1;
        }
    };
    let bad_label = |stats: &mut NormalizeStats| stats.bad_label_events += 1;
    match kind {
        event::Kind::DeadlineCounters(c) => {
            let (Some((model, version)), Some(loop_name)) = (
                model_labels(c.model.as_ref()),
                label_value(c.control_loop.as_ref().map_or("", |l| l.loop_name.as_str())),
            ) else {
                return bad_label(stats);
            };
            let labels = [
                (label::LOOP, loop_name),
                (label::MODEL, model),
                (label::MODEL_VERSION, version),
            ];
            push(
                base.key(metric::CONTROL_CYCLES, &labels),
                c.cycles as f64,
                stats,
            );
            push(
                base.key(metric::CONTROL_MISSED, &labels),
                c.misses as f64,
                stats,
            );
            push(
                base.key(metric::CONTROL_SKIPPED, &labels),
                c.skipped as f64,
                stats,
            );
        }
        event::Kind::SafetyFallback(f) => {
            let (Some((model, version)), Some(loop_name)) = (
                model_labels(f.model.as_ref()),
                label_value(f.control_loop.as_ref().map_or("", |l| l.loop_name.as_str())),
            ) else {
                return bad_label(stats);
            };
            let labels = [
                (label::LOOP, loop_name),
                (label::MODEL, model),
                (label::MODEL_VERSION, version),
            ];
            push(
                base.key(metric::SAFETY_FALLBACKS, &labels),
                f.total as f64,
                stats,
            );
        }
        event::Kind::Intervention(i) => {
            let (Some((model, version)), Some(source)) = (
                model_labels(i.model.as_ref()),
                source_label(i.source, i.total),
            ) else {
                return bad_label(stats);
            };
            let Some(source) = source else { return };
            let labels = [
                (label::MODEL, model),
                (label::MODEL_VERSION, version),
                (label::SOURCE, source),
            ];
            push(
                base.key(metric::INTERVENTIONS, &labels),
                i.total as f64,
                stats,
            );
        }
        event::Kind::SafeStop(s) => {
            let (Some((model, version)), Some(source)) = (
                model_labels(s.model.as_ref()),
                source_label(s.source, s.total),
            ) else {
                return bad_label(stats);
            };
            let Some(source) = source else { return };
            let labels = [
                (label::MODEL, model),
                (label::MODEL_VERSION, version),
                (label::SOURCE, source),
            ];
            push(base.key(metric::SAFE_STOPS, &labels), s.total as f64, stats);
        }
        event::Kind::ThrottleCounters(t) => {
            let Some((model, version)) = model_labels(t.model.as_ref()) else {
                return bad_label(stats);
            };
            for c in &t.components {
                let Some(component) = component_label(c.component) else {
                    bad_label(stats);
                    continue;
                };
                let labels = [
                    (label::COMPONENT, component),
                    (label::MODEL, model),
                    (label::MODEL_VERSION, version),
                ];
                push(
                    base.key(metric::THROTTLE_SECONDS, &labels),
                    c.throttled_seconds,
                    stats,
                );
            }
        }
        event::Kind::AutonomySeconds(a) => {
            let Some((model, version)) = model_labels(a.model.as_ref()) else {
                return bad_label(stats);
            };
            for m in &a.modes {
                let Some(mode) = mode_label(m.mode) else {
                    bad_label(stats);
                    continue;
                };
                let labels = [
                    (label::MODE, mode),
                    (label::MODEL, model),
                    (label::MODEL_VERSION, version),
                ];
                push(
                    base.key(metric::AUTONOMY_SECONDS, &labels),
                    m.seconds,
                    stats,
                );
            }
        }
        event::Kind::EnergyCounters(e) => {
            let Some((model, version)) = model_labels(e.model.as_ref()) else {
                return bad_label(stats);
            };
            for r in &e.rails {
                let Some(rail) = label_value(&r.rail).filter(|rail| *rail != value::UNKNOWN) else {
                    bad_label(stats);
                    continue;
                };
                let labels = [
                    (label::MODEL, model),
                    (label::MODEL_VERSION, version),
                    (label::RAIL, rail),
                ];
                push(base.key(metric::ENERGY_JOULES, &labels), r.joules, stats);
            }
        }
        event::Kind::QueueLoss(q) => {
            let (Some(tier), Some(cause)) = (tier_label(q.tier), cause_label(q.cause)) else {
                return bad_label(stats);
            };
            let labels = [(label::CAUSE, cause), (label::TIER, tier)];
            push(
                base.key(metric::QUEUE_LOST_RECORDS, &labels),
                q.total as f64,
                stats,
            );
        }
        _ => {}
    }
}

/// Whether a safety event arriving at `arrival_ns` is fresh: `arrival − max(event_time, reconnect)
/// ≤ limit` (docs/series.md).
pub fn is_fresh(arrival_ns: i64, event_time_ns: i64, reconnect_ns: i64, limit_ns: i64) -> bool {
    arrival_ns.saturating_sub(event_time_ns.max(reconnect_ns)) <= limit_ns
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgewatch_proto::v1::{
        AutonomySeconds, DeadlineCounters, Event, LoopRef, ModeSeconds, ModelVersion, Tier,
    };

    const ARRIVAL: i64 = 1_800_000_000_000_000_000;

    fn batch() -> Batch {
        Batch {
            schema_version: 1,
            machine_id: "truck-17".into(),
            site_id: "pit-3".into(),
            agent_epoch: 7,
            tier: Tier::Slo as i32,
            first_seq: 1,
            last_seq: 1,
            sent_time_unix_ns: ARRIVAL,
            events: vec![],
            machine_class: "haul-truck".into(),
            agent_version: "0.1.0".into(),
        }
    }

    fn counters(time: i64, loop_name: &str) -> Event {
        Event {
            seq: 1,
            event_time_unix_ns: time,
            monotonic_ns: 0,
            kind: Some(event::Kind::DeadlineCounters(DeadlineCounters {
                control_loop: Some(LoopRef {
                    loop_id: 1,
                    loop_name: loop_name.into(),
                }),
                model: Some(ModelVersion {
                    name: "haul-perception".into(),
                    version: "4.2.1".into(),
                    ..Default::default()
                }),
                cycles: 90_000,
                misses: 3,
                skipped: 1,
                ..Default::default()
            })),
        }
    }

    #[test]
    fn deadline_counters_become_three_series_with_the_contract_labels() {
        let batch = batch();
        let base = BaseLabels::of(&batch).unwrap();
        let mut stats = NormalizeStats::default();
        let mut out = Vec::new();
        let event = counters(ARRIVAL - 1_500_000_000, "planner");
        normalize_event(&base, &event, ARRIVAL, 0, &mut stats, &mut out);
        assert_eq!(out.len(), 3);
        assert_eq!(
            out[0].series,
            "edge_control_cycles_total{loop=\"planner\",machine_class=\"haul-truck\",machine_id=\"truck-17\",model=\"haul-perception\",model_version=\"4.2.1\",site=\"pit-3\"}"
        );
        assert_eq!(out[0].ts_ms, (ARRIVAL - 1_500_000_000) / 1_000_000);
        assert_eq!(out[0].value, 90_000.0);
        assert_eq!(out[1].value, 3.0);
        assert_eq!(stats, NormalizeStats::default());
    }

    #[test]
    fn future_events_and_free_text_labels_produce_no_sample() {
        let batch = batch();
        let base = BaseLabels::of(&batch).unwrap();
        let mut stats = NormalizeStats::default();
        let mut out = Vec::new();
        normalize_event(
            &base,
            &counters(ARRIVAL + 10_000_000_000, "planner"),
            ARRIVAL,
            5_000_000_000,
            &mut stats,
            &mut out,
        );
        normalize_event(
            &base,
            &counters(ARRIVAL, "a loop with spaces"),
            ARRIVAL,
            0,
            &mut stats,
            &mut out,
        );
        normalize_event(
            &base,
            &counters(0, "planner"),
            ARRIVAL,
            0,
            &mut stats,
            &mut out,
        );
        assert!(out.is_empty());
        assert_eq!(stats.future_events, 1);
        assert_eq!(stats.bad_label_events, 1);
        assert_eq!(stats.bad_time_events, 1);
    }

    #[test]
    fn unspecified_modes_are_skipped_and_nan_values_refused() {
        let batch = batch();
        let base = BaseLabels::of(&batch).unwrap();
        let event = Event {
            seq: 2,
            event_time_unix_ns: ARRIVAL,
            monotonic_ns: 0,
            kind: Some(event::Kind::AutonomySeconds(AutonomySeconds {
                start_time_unix_ns: 1,
                modes: vec![
                    ModeSeconds {
                        mode: 1,
                        seconds: 3600.0,
                    },
                    ModeSeconds {
                        mode: 0,
                        seconds: 1.0,
                    },
                    ModeSeconds {
                        mode: 2,
                        seconds: f64::NAN,
                    },
                ],
                model: None,
            })),
        };
        let mut stats = NormalizeStats::default();
        let mut out = Vec::new();
        normalize_event(&base, &event, ARRIVAL, 0, &mut stats, &mut out);
        assert_eq!(out.len(), 1);
        assert!(out[0].series.contains("mode=\"autonomous\""));
        assert!(out[0].series.contains("model=\"unknown\""));
        assert_eq!(stats.bad_label_events, 1);
        assert_eq!(stats.bad_values, 1);
    }

    #[test]
    fn interventions_of_the_probe_and_of_the_socket_are_separate_series() {
        use edgewatch_proto::v1::{EventSource, Intervention};
        let batch = batch();
        let base = BaseLabels::of(&batch).unwrap();
        let intervention = |total, source: EventSource| Event {
            seq: 1,
            event_time_unix_ns: ARRIVAL,
            monotonic_ns: 0,
            kind: Some(event::Kind::Intervention(Intervention {
                total,
                delta: 1,
                source: source as i32,
                ..Intervention::default()
            })),
        };
        let mut stats = NormalizeStats::default();
        let mut out = Vec::new();
        for (total, source) in [
            (2, EventSource::Probe),
            (5, EventSource::Local),
            (3, EventSource::Unspecified),
            // A submission through an agent from before sources: it counts nothing.
            (0, EventSource::Unspecified),
        ] {
            normalize_event(
                &base,
                &intervention(total, source),
                ARRIVAL,
                0,
                &mut stats,
                &mut out,
            );
        }
        let sources: Vec<(&str, f64)> = out
            .iter()
            .map(|s| {
                let source = if s.series.contains("source=\"local\"") {
                    "local"
                } else if s.series.contains("source=\"probe\"") {
                    "probe"
                } else {
                    "none"
                };
                (source, s.value)
            })
            .collect();
        assert_eq!(sources, [("probe", 2.0), ("local", 5.0), ("probe", 3.0)]);
        assert_eq!(stats, NormalizeStats::default());
    }

    #[test]
    fn series_keys_parse_back_to_their_labels() {
        let key = SeriesKey::build("m", &mut [("b", "x\"y"), ("a", "1\\2")]);
        assert_eq!(key, "m{a=\"1\\\\2\",b=\"x\\\"y\"}");
        let (metric, labels) = SeriesKey::parse(&key).unwrap();
        assert_eq!(metric, "m");
        assert_eq!(
            labels,
            vec![("a".into(), "1\\2".into()), ("b".into(), "x\"y".into())]
        );
        assert_eq!(SeriesKey::metric(&key), "m");
    }

    #[test]
    fn freshness_counts_from_the_later_of_event_time_and_reconnect() {
        let hour = 3_600_000_000_000i64;
        // Happened 3 days ago, machine reconnected an hour ago: fresh.
        assert!(is_fresh(100 * hour, 28 * hour, 99 * hour, 24 * hour));
        // Machine reconnected 25 h ago and the event only arrives now: stale.
        assert!(!is_fresh(100 * hour, 28 * hour, 75 * hour, 24 * hour));
    }
}
