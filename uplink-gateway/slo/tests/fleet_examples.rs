//! The fleet view's machines table and a machine's detail against hand-built series: every
//! column from the series that carry it, `None` for what was never reported, the orders of
//! every sort key, label values kept verbatim, and the text table.
#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

use edgewatch_slo::fleet::{
    self, FleetQuery, MachineRow, Partition, Read, SortKey, TierBacklog, detail, table,
};
use edgewatch_slo::names::{label, metric};
use edgewatch_slo::{Labels, SeriesSet, parse_rfc3339, render_fleet_text};

const MIN: i64 = 60_000;
const HOUR: i64 = 60 * MIN;
const LOOKBACK: i64 = 10 * MIN;

fn at() -> i64 {
    parse_rfc3339("2026-11-10T12:00:00Z").unwrap()
}

fn labels(metric: &str, machine: &str, extra: &[(&str, &str)]) -> Labels {
    let mut labels: Labels = [
        ("__name__", metric),
        (label::MACHINE_ID, machine),
        (label::MACHINE_CLASS, "haul"),
        (label::SITE, "pit-a"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    for (k, v) in extra {
        labels.insert((*k).to_owned(), (*v).to_owned());
    }
    labels
}

/// A latest read: one value, handed over at the evaluation time.
fn latest(set: &mut SeriesSet, metric: &str, machine: &str, extra: &[(&str, &str)], v: f64) {
    set.add(labels(metric, machine, extra), [(at(), v)]);
}

fn seconds(ms: i64) -> f64 {
    ms as f64 / 1000.0
}

/// truck-1: online, running det 2.0 (after 1.0) and a second model, a health report, losses,
/// throttling and autonomy over the window. truck-2: offline for two hours, silent longer.
/// truck-3: a status and nothing else.
fn fleet_series() -> SeriesSet {
    let t = at();
    let mut set = SeriesSet::new();
    latest(&mut set, metric::MACHINE_ONLINE, "truck-1", &[], 1.0);
    latest(
        &mut set,
        metric::MACHINE_LAST_ARRIVAL,
        "truck-1",
        &[],
        seconds(t - 5_000),
    );
    latest(
        &mut set,
        metric::MACHINE_LAST_EVENT,
        "truck-1",
        &[],
        seconds(t - 9_123),
    );
    let det = |v| [(label::MODEL, "det"), (label::MODEL_VERSION, v)];
    latest(
        &mut set,
        metric::MODEL_VERSION_FIRST_EVENT,
        "truck-1",
        &det("1.0"),
        seconds(t - 5 * HOUR),
    );
    latest(
        &mut set,
        metric::MODEL_VERSION_LAST_EVENT,
        "truck-1",
        &det("1.0"),
        seconds(t - 3 * HOUR),
    );
    latest(
        &mut set,
        metric::MODEL_VERSION_FIRST_EVENT,
        "truck-1",
        &det("2.0"),
        seconds(t - 3 * HOUR + 1),
    );
    latest(
        &mut set,
        metric::MODEL_VERSION_LAST_EVENT,
        "truck-1",
        &det("2.0"),
        seconds(t - 9_123),
    );
    let lane = [(label::MODEL, "lane"), (label::MODEL_VERSION, "7")];
    latest(
        &mut set,
        metric::MODEL_VERSION_LAST_EVENT,
        "truck-1",
        &lane,
        seconds(t - 60_000),
    );
    for (tier, records, bytes) in [
        ("safety", 0.0, 0.0),
        ("slo", 12.0, 4_096.0),
        ("debug", 900.0, 2_500_000.0),
    ] {
        latest(
            &mut set,
            metric::QUEUE_BACKLOG_RECORDS,
            "truck-1",
            &[(label::TIER, tier)],
            records,
        );
        latest(
            &mut set,
            metric::QUEUE_BACKLOG_BYTES,
            "truck-1",
            &[(label::TIER, tier)],
            bytes,
        );
    }
    latest(
        &mut set,
        metric::AGENT_HEALTH_TIMESTAMP,
        "truck-1",
        &[],
        seconds(t - 30_000),
    );
    // Losses: raw samples, each report a baseline and the running total.
    let debug_evicted = labels(
        metric::QUEUE_LOST_RECORDS,
        "truck-1",
        &[(label::TIER, "debug"), (label::CAUSE, "evicted")],
    );
    set.add(
        debug_evicted,
        [
            (t - 2 * HOUR - 1, 0.0),
            (t - 2 * HOUR, 40.0),
            (t - HOUR - 1, 40.0),
            (t - HOUR, 55.0),
        ],
    );
    let slo_expired = labels(
        metric::QUEUE_LOST_RECORDS,
        "truck-1",
        &[(label::TIER, "slo"), (label::CAUSE, "expired")],
    );
    set.add(slo_expired, [(t - 3 * HOUR - 1, 0.0), (t - 3 * HOUR, 2.0)]);
    // Throttled: gpu 30 s inside the window (and 100 s before it), cpu a run that restarted.
    let gpu = labels(
        metric::THROTTLE_SECONDS,
        "truck-1",
        &[
            (label::COMPONENT, "gpu"),
            (label::MODEL, "det"),
            (label::MODEL_VERSION, "2.0"),
        ],
    );
    set.add(
        gpu,
        [
            (t - 25 * HOUR, 0.0),
            (t - 24 * HOUR - MIN, 100.0),
            (t - HOUR, 130.0),
        ],
    );
    let cpu = labels(
        metric::THROTTLE_SECONDS,
        "truck-1",
        &[
            (label::COMPONENT, "cpu"),
            (label::MODEL, "det"),
            (label::MODEL_VERSION, "2.0"),
        ],
    );
    set.add(
        cpu,
        [
            (t - 2 * HOUR, 5.0),
            (t - HOUR, 8.0),
            (t - HOUR + 1, 0.0),
            (t - MIN, 4.5),
        ],
    );
    // Autonomy: 2 h autonomous under 1.0, 1.5 h under 2.0; manual time does not count.
    for (version, from, to, hours) in [("1.0", 5, 3, 2.0), ("2.0", 3, 0, 1.5)] {
        let auto = labels(
            metric::AUTONOMY_SECONDS,
            "truck-1",
            &[
                (label::MODE, "autonomous"),
                (label::MODEL, "det"),
                (label::MODEL_VERSION, version),
            ],
        );
        set.add(
            auto,
            [(t - from * HOUR - 1, 0.0), (t - to * HOUR, hours * 3600.0)],
        );
        let manual = labels(
            metric::AUTONOMY_SECONDS,
            "truck-1",
            &[
                (label::MODE, "manual"),
                (label::MODEL, "det"),
                (label::MODEL_VERSION, version),
            ],
        );
        set.add(manual, [(t - from * HOUR - 1, 0.0), (t - to * HOUR, 999.0)]);
    }

    latest(&mut set, metric::MACHINE_ONLINE, "truck-2", &[], 0.0);
    latest(
        &mut set,
        metric::MACHINE_LAST_ARRIVAL,
        "truck-2",
        &[],
        seconds(t - 2 * HOUR),
    );
    latest(
        &mut set,
        metric::MACHINE_LAST_EVENT,
        "truck-2",
        &[],
        seconds(t - 2 * HOUR - 7),
    );

    latest(&mut set, metric::MACHINE_ONLINE, "truck-3", &[], 1.0);
    set
}

fn query() -> FleetQuery {
    FleetQuery::at(at(), LOOKBACK)
}

fn row<'a>(rows: &'a [MachineRow], id: &str) -> &'a MachineRow {
    rows.iter().find(|r| r.machine_id == id).unwrap()
}

#[test]
fn every_column_comes_from_the_series_that_carry_it() {
    let t = at();
    let fleet = table(&fleet_series(), &query(), SortKey::Silent);
    assert_eq!(fleet.window, "1d");
    assert_eq!(fleet.lookback, "30d");
    let one = row(&fleet.machines, "truck-1");
    assert_eq!(
        (one.machine_class.as_str(), one.site.as_str()),
        ("haul", "pit-a")
    );
    assert_eq!(one.online, Some(true));
    assert_eq!(one.last_arrival_ms, Some(t - 5_000));
    assert_eq!(one.last_arrival.as_deref(), Some("2026-11-10T11:59:55Z"));
    assert_eq!(one.last_event_ms, Some(t - 9_123));
    assert_eq!(one.last_event.as_deref(), Some("2026-11-10T11:59:50.877Z"));
    assert_eq!(one.silent_for_ms, Some(5_000));
    // Per model name, the version with the newest event.
    let models: Vec<(&str, &str, Option<i64>, i64)> = one
        .models
        .iter()
        .map(|m| {
            (
                m.model.as_str(),
                m.model_version.as_str(),
                m.first_event_ms,
                m.last_event_ms,
            )
        })
        .collect();
    assert_eq!(
        models,
        vec![
            ("det", "2.0", Some(t - 3 * HOUR + 1), t - 9_123),
            ("lane", "7", None, t - 60_000),
        ]
    );
    let backlog = one.backlog.as_ref().unwrap();
    assert_eq!(backlog.as_of_ms, Some(t - 30_000));
    assert_eq!(
        backlog.tiers["debug"],
        TierBacklog {
            records: Some(900),
            bytes: Some(2_500_000)
        }
    );
    assert_eq!(backlog.tiers["slo"].records, Some(12));
    assert_eq!(one.backlog_records(), Some(912));
    let losses = one.losses.as_ref().unwrap();
    assert_eq!(losses.as_of_ms, t - HOUR);
    assert_eq!(losses.tiers.get("debug"), Some(&55));
    assert_eq!(losses.tiers.get("slo"), Some(&2));
    let throttled = one.throttled_seconds.as_ref().unwrap();
    assert_eq!(throttled["gpu"], 30.0);
    // 3 s, then a restart from zero: 4.5 more.
    assert_eq!(throttled["cpu"], 7.5);
    assert_eq!(one.autonomous_hours, Some(3.5));

    let two = row(&fleet.machines, "truck-2");
    assert_eq!(two.online, Some(false));
    assert_eq!(two.silent_for_ms, Some(2 * HOUR));
    assert_eq!(two.models, vec![]);
    // Never reported is not zero.
    assert_eq!(
        (
            two.backlog.as_ref(),
            two.losses.as_ref(),
            two.throttled_seconds.as_ref(),
            two.autonomous_hours
        ),
        (None, None, None, None)
    );
    let three = row(&fleet.machines, "truck-3");
    assert_eq!(
        (three.online, three.last_arrival_ms, three.silent_for_ms),
        (Some(true), None, None)
    );
}

#[test]
fn the_silent_for_longest_come_first_and_every_key_sorts() {
    let set = fleet_series();
    let order = |key: SortKey| -> Vec<String> {
        table(&set, &query(), key)
            .machines
            .into_iter()
            .map(|r| r.machine_id)
            .collect()
    };
    // Never arrived is silent for ever.
    assert_eq!(order(SortKey::Silent), ["truck-3", "truck-2", "truck-1"]);
    assert_eq!(order(SortKey::default()), order(SortKey::Silent));
    assert_eq!(order(SortKey::Machine), ["truck-1", "truck-2", "truck-3"]);
    assert_eq!(order(SortKey::Online), ["truck-2", "truck-1", "truck-3"]);
    assert_eq!(order(SortKey::LastEvent), ["truck-3", "truck-2", "truck-1"]);
    // Sizes: largest first, none last.
    for key in [
        SortKey::Backlog,
        SortKey::Losses,
        SortKey::Throttled,
        SortKey::Autonomy,
    ] {
        assert_eq!(order(key), ["truck-1", "truck-2", "truck-3"], "{key:?}");
    }
    for (name, key) in SortKey::ALL {
        assert_eq!(name.parse::<SortKey>().unwrap(), key);
        assert_eq!(key.name(), name);
    }
    let error = "newest".parse::<SortKey>().unwrap_err().to_string();
    assert!(error.contains("silent, machine"), "{error}");
}

#[test]
fn hostile_label_values_stay_data_in_json_and_cannot_drive_a_terminal() {
    let hostile = "<script>alert(1)</script>\u{1b}[2J";
    let mut set = SeriesSet::new();
    let mut labels = labels(metric::MACHINE_LAST_ARRIVAL, hostile, &[]);
    labels.insert(label::SITE.to_owned(), "\"pit\" & <b>".to_owned());
    set.add(labels, [(at(), seconds(at() - 1_000))]);
    let fleet = table(&set, &query(), SortKey::Silent);
    assert_eq!(fleet.machines[0].machine_id, hostile);
    let json: serde_json::Value = serde_json::to_value(&fleet).unwrap();
    assert_eq!(json["machines"][0]["machine_id"], hostile);
    assert_eq!(json["machines"][0]["site"], "\"pit\" & <b>");
    let text = render_fleet_text(&fleet, &["safety", "slo", "debug"]);
    assert!(
        text.contains("<script>alert(1)</script>\\u{1b}[2J"),
        "{text}"
    );
    assert!(!text.contains('\u{1b}'));
}

#[test]
fn the_text_table_shows_every_column_and_dashes_for_what_was_never_reported() {
    let fleet = table(&fleet_series(), &query(), SortKey::Silent);
    let text = render_fleet_text(&fleet, &["safety", "slo", "debug"]);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[1].starts_with("MACHINE"), "{text}");
    assert!(lines[1].contains("BACKLOG safety/slo/debug"), "{text}");
    assert!(lines[1].contains("THROTTLED S cpu/gpu/soc"), "{text}");
    let one = lines.iter().find(|l| l.starts_with("truck-1")).unwrap();
    for cell in [
        "det 2.0, lane 7",
        "online",
        "2026-11-10T11:59:50.877Z",
        "2026-11-10T11:59:55Z",
        "5s",
        "0/12/900",
        "2.5 MB",
        "2026-11-10T11:59:30Z",
        "-/2/55",
        "7.5/30/-",
        "3.50",
    ] {
        assert!(one.contains(cell), "{cell:?} not in {one:?}");
    }
    let three = lines.iter().find(|l| l.starts_with("truck-3")).unwrap();
    // Model, last event, last arrival, silent, backlog, bytes, as of, lost, throttled,
    // autonomous: never reported.
    assert_eq!(
        three.split_whitespace().filter(|c| *c == "-").count(),
        10,
        "{three}"
    );
    assert!(text.lines().all(|l| l == l.trim_end()));
    assert!(text.ends_with('\n'));
}

#[test]
fn the_table_reads_latest_states_over_the_lookback_and_counters_over_the_window() {
    let q = FleetQuery {
        window_ms: 2 * HOUR,
        increase_lookback_ms: 3 * HOUR,
        ..query()
    };
    let needs = fleet::table_needs(&q);
    let of = |m: &str| needs.iter().find(|n| n.metric == m).unwrap();
    assert_eq!(of(metric::MACHINE_ONLINE).read, Read::Latest);
    assert_eq!(of(metric::MACHINE_ONLINE).range_ms, q.lookback_ms);
    assert_eq!(of(metric::QUEUE_LOST_RECORDS).read, Read::Samples);
    assert_eq!(of(metric::THROTTLE_SECONDS).read, Read::Samples);
    assert_eq!(of(metric::THROTTLE_SECONDS).range_ms, 5 * HOUR);
    assert!(
        needs
            .iter()
            .all(|n| n.end_ms == at() && n.machine.is_none())
    );
    // A two-hour window: 2.0's autonomy counts from its zero before the window, 1.0's lies
    // before it; the gpu has no sample within the increase rule's lookback before the window,
    // so its first sample inside is its base, as the report counts it.
    let fleet = table(&fleet_series(), &q, SortKey::Silent);
    let one = row(&fleet.machines, "truck-1");
    assert_eq!(one.autonomous_hours, Some(1.5));
    assert_eq!(one.throttled_seconds.as_ref().unwrap()["gpu"], 0.0);
}

#[test]
fn a_machines_detail_has_its_counters_per_bucket_its_versions_backlog_and_partitions() {
    let t = at();
    // Sparse samples: an increase lookback that reaches the previous one.
    let q = FleetQuery {
        window_ms: 4 * HOUR,
        increase_lookback_ms: 3 * HOUR,
        ..query()
    };
    let needs = fleet::detail_needs(&q, "truck-1");
    assert!(
        needs
            .iter()
            .all(|n| n.machine.as_deref() == Some("truck-1"))
    );
    let mut set = fleet_series();
    // Raw online samples: offline an hour before the range, back inside it; offline again
    // inside it and still offline at its end.
    let online = labels(metric::MACHINE_ONLINE, "truck-9", &[]);
    set.add(
        online,
        [
            (t - 6 * HOUR, 1.0),
            (t - 5 * HOUR, 0.0),
            (t - 3 * HOUR, 1.0),
            (t - 2 * HOUR, 1.0),
            (t - HOUR, 0.0),
        ],
    );
    let activations = labels(
        metric::CONTROL_ACTIVATIONS,
        "truck-9",
        &[(label::LOOP, "safety")],
    );
    set.add(
        activations,
        [
            (t - 5 * HOUR, 0.0),
            (t - 3 * HOUR, 1_000.0),
            (t - HOUR, 3_000.0),
        ],
    );
    let misses = labels(
        metric::CONTROL_ACTIVATIONS_MISSED,
        "truck-9",
        &[(label::LOOP, "safety")],
    );
    set.add(
        misses,
        [(t - 5 * HOUR, 0.0), (t - 3 * HOUR, 1.0), (t - HOUR, 4.0)],
    );
    for (at_ms, records) in [
        (t - 3 * HOUR, 10.0),
        (t - 2 * HOUR, 20.0),
        (t - 5 * HOUR, 99.0),
    ] {
        set.add(
            labels(
                metric::QUEUE_BACKLOG_RECORDS,
                "truck-9",
                &[(label::TIER, "debug")],
            ),
            [(at_ms, records)],
        );
    }
    let d = detail(&set, &q, "truck-9", 4);
    assert_eq!((d.from_ms, d.to_ms), (t - 4 * HOUR, t));
    assert_eq!(d.buckets.len(), 4);
    let misses: Vec<f64> = d
        .buckets
        .iter()
        .map(|b| b.deadline_misses["safety"])
        .collect();
    // (t−4h, t−3h]: 1 (from the zero at t−5h); (t−3h, t−2h] and (t−2h, t−h]: 3 over both.
    assert_eq!(misses, [1.0, 0.0, 3.0, 0.0]);
    let activations: Vec<f64> = d.buckets.iter().map(|b| b.activations["safety"]).collect();
    assert_eq!(activations, [1_000.0, 0.0, 2_000.0, 0.0]);
    let backlog: Vec<(i64, Option<u64>)> = d
        .backlog
        .iter()
        .map(|p| (p.at_ms, p.tiers["debug"].records))
        .collect();
    assert_eq!(
        backlog,
        [(t - 3 * HOUR, Some(10)), (t - 2 * HOUR, Some(20))]
    );
    assert_eq!(
        d.partitions,
        [
            Partition {
                offline_ms: t - 5 * HOUR,
                online_again_ms: Some(t - 3 * HOUR)
            },
            Partition {
                offline_ms: t - HOUR,
                online_again_ms: None
            },
        ]
    );
    assert_eq!(d.online, Some(false));

    let one = detail(&set, &q, "truck-1", 4);
    let versions: Vec<(&str, &str)> = one
        .model_versions
        .iter()
        .map(|m| (m.model.as_str(), m.model_version.as_str()))
        .collect();
    assert_eq!(versions, [("det", "1.0"), ("det", "2.0"), ("lane", "7")]);
    assert_eq!(one.last_arrival_ms, Some(t - 5_000));
    assert_eq!(one.machine_class, "haul");
}
