//! Helpers shared by the thermal tests: captures by path, times, and event filters.

use std::path::PathBuf;

use edgewatch_proto::v1::{
    EnergyCounters, Event, LogRecord, OverCurrent, Throttle, ThrottleCounters, Tier, event::Kind,
};
use edgewatch_samplers::{CollectingSink, Now};

/// A real capture of the parser's test data, by file name.
pub fn capture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tegrastats-parser/tests/data")
        .join(name)
}

/// `now` moved on by `seconds`.
pub fn later(now: Now, seconds: f64) -> Now {
    let ns = (seconds * 1e9) as u64;
    Now {
        wall_unix_ns: now.wall_unix_ns + ns as i64,
        monotonic_ns: now.monotonic_ns + ns,
    }
}

/// A throttle event as (tier, started?, payload).
pub type ThrottleEvent = (Tier, bool, Throttle);

pub fn throttles(events: &[(Tier, Event)]) -> Vec<ThrottleEvent> {
    events
        .iter()
        .filter_map(|(tier, e)| match &e.kind {
            Some(Kind::ThrottleStarted(t)) => Some((*tier, true, t.clone())),
            Some(Kind::ThrottleEnded(t)) => Some((*tier, false, t.clone())),
            _ => None,
        })
        .collect()
}

pub fn over_currents(events: &[(Tier, Event)]) -> Vec<(Tier, OverCurrent)> {
    events
        .iter()
        .filter_map(|(tier, e)| match &e.kind {
            Some(Kind::OverCurrent(oc)) => Some((*tier, oc.clone())),
            _ => None,
        })
        .collect()
}

pub fn energy(sink: &CollectingSink) -> Vec<(Tier, EnergyCounters)> {
    sink.events
        .iter()
        .filter_map(|(tier, e)| match &e.kind {
            Some(Kind::EnergyCounters(c)) => Some((*tier, c.clone())),
            _ => None,
        })
        .collect()
}

pub fn throttle_counters(sink: &CollectingSink) -> Vec<(Tier, ThrottleCounters)> {
    sink.events
        .iter()
        .filter_map(|(tier, e)| match &e.kind {
            Some(Kind::ThrottleCounters(c)) => Some((*tier, c.clone())),
            _ => None,
        })
        .collect()
}

pub fn logs(sink: &CollectingSink) -> Vec<(Tier, LogRecord)> {
    sink.events
        .iter()
        .filter_map(|(tier, e)| match &e.kind {
            Some(Kind::Log(l)) => Some((*tier, l.clone())),
            _ => None,
        })
        .collect()
}

/// Joules of one rail of the last `EnergyCounters`.
pub fn joules(sink: &CollectingSink, rail: &str) -> f64 {
    let all = energy(sink);
    let (_, last) = all.last().expect("no EnergyCounters emitted");
    last.rails
        .iter()
        .find(|r| r.rail == rail)
        .unwrap_or_else(|| panic!("no rail {rail}"))
        .joules
}

pub fn assert_close(actual: f64, expected: f64) {
    assert!(
        (actual - expected).abs() < 1e-9,
        "{actual} is not {expected}"
    );
}
