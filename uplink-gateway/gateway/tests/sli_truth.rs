//! The SLO report's numbers stay true through a rollout, an impossible counter, a machine's first
//! batch and the first event of a series, and say so when data was refused. Real batches go
//! through a real Mosquitto into the real gateway binary at its packaged default configuration
//! (only the PROVISION lines filled in), a real Prometheus is fed by remote-write, and every
//! number is compared exactly with the ground truth the test injected, from `report --json` on
//! the embedded store and, where a test has a Prometheus, with `--prometheus` too.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

mod util;

use edgewatch_gateway::prometheus::query_raw;
use edgewatch_gateway::store::{RawSeries, Store};
use edgewatch_harness::mosquitto::Mosquitto;
use edgewatch_harness::prometheus::Prometheus;
use edgewatch_proto::v1::{
    AutonomySeconds, Batch, ComponentSeconds, DeadlineCounters, DeadlineSemantics, EnergyCounters,
    Event, Intervention, LoopRef, ModeSeconds, ModelVersion, QueueLoss, RailEnergy, SafeStop,
    SafetyFallback, ThrottleCounters, Tier, event,
};
use edgewatch_slo::series::{Window, increase};
use serde_json::Value;
use util::*;

const MINUTE_NS: i64 = 60_000_000_000;
const MODEL: &str = "haul-perception";
const CLASS: &str = "haul-truck";
/// The catalog's default lookback, for increases computed here from raw samples.
const LOOKBACK_MS: i64 = 10 * 60_000;

fn model(version: &str) -> Option<ModelVersion> {
    Some(ModelVersion {
        name: MODEL.into(),
        version: version.into(),
        ..Default::default()
    })
}

fn at(seq: u64, time_ns: i64, kind: event::Kind) -> Event {
    Event {
        seq,
        event_time_unix_ns: time_ns,
        monotonic_ns: seq,
        kind: Some(kind),
    }
}

/// Cumulative deadline counters of one (loop, model version) series started at `start_ns`.
fn counters(
    loop_name: &str,
    version: &str,
    start_ns: i64,
    cycles: u64,
    misses: u64,
) -> event::Kind {
    event::Kind::DeadlineCounters(DeadlineCounters {
        control_loop: Some(LoopRef {
            loop_id: 1,
            loop_name: loop_name.into(),
        }),
        model: model(version),
        start_time_unix_ns: start_ns,
        cycles,
        misses,
        ..Default::default()
    })
}

/// The same from an agent with deadline semantics: `activations` and `deadline_misses`
/// (completion), with no overrun and no skipped activation, so the old fields carry the same
/// counts as cycles and zero misses.
fn completion_counters(
    loop_name: &str,
    version: &str,
    start_ns: i64,
    activations: u64,
    deadline_misses: u64,
) -> event::Kind {
    let event::Kind::DeadlineCounters(mut c) =
        counters(loop_name, version, start_ns, activations, 0)
    else {
        unreachable!("deadline counters")
    };
    c.activations = Some(activations);
    c.deadline_misses = Some(deadline_misses);
    c.overruns = Some(0);
    c.deadline_ns = 40_000_000;
    c.semantics = DeadlineSemantics::Completion as i32;
    event::Kind::DeadlineCounters(c)
}

fn on_site(mut batch: Batch, site: &str) -> Batch {
    batch.site_id = site.into();
    batch
}

/// `report --json` at `at_ms`, from the embedded store or from `prometheus`.
fn report(gateway: &Gateway, at_ms: i64, prometheus: Option<&str>) -> Value {
    let at = edgewatch_slo::format_rfc3339(at_ms);
    let mut args = vec!["report", "--json", "--at", &at];
    if let Some(url) = prometheus {
        args.extend(["--prometheus", url]);
    }
    serde_json::from_str(&gateway.command(&args)).unwrap()
}

/// The row of `slo` for (site, model version) (model version "" for gateway series).
fn row<'a>(report: &'a Value, slo: &str, site: &str, version: &str) -> &'a Value {
    let rows = report["slo"]["rows"].as_array().unwrap();
    let found: Vec<&Value> = rows
        .iter()
        .filter(|r| r["slo"] == slo && r["site"] == site && r["model_version"] == version)
        .collect();
    assert_eq!(
        found.len(),
        1,
        "rows of {slo} for {site} {version:?}: {rows:#?}"
    );
    found[0]
}

/// Increase over the last day (event time, the report's rule) of the one series of `metric`
/// with `labels`, from raw samples.
fn increase_of(series: &[RawSeries], labels: &[(&str, &str)], end_ms: i64) -> f64 {
    let found: Vec<&RawSeries> = series
        .iter()
        .filter(|s| {
            labels
                .iter()
                .all(|(n, v)| s.labels.iter().any(|(ln, lv)| ln == n && lv == v))
        })
        .collect();
    assert_eq!(found.len(), 1, "series {labels:?} in {series:#?}");
    let window = Window::ending_at(end_ms, 86_400_000);
    increase(&found[0].samples, window, LOOKBACK_MS)
}

/// What a rollout injected for one (model version, loop): activations and deadline misses.
struct Injected {
    version: String,
    loop_name: String,
    activations: u64,
    misses: u64,
}

/// One machine's SLO and safety batches through a rollout, from an agent with deadline
/// semantics (the most series a loop has): every version runs for two hours, with all three
/// loops, autonomy, throttle and energy counters every five minutes (each series starting at the
/// version's start), and one fallback per loop, an intervention and a safe stop per version.
/// Returns the batches in the order an agent sends them live, and per version and loop the
/// injected (activations, deadline misses).
fn rollout(machine: &str, versions: &[&str], t0: i64) -> (Vec<Batch>, Vec<Injected>) {
    const LOOPS: [&str; 3] = ["safety", "assistive", "planner"];
    const SNAPSHOTS: i64 = 24;
    let step = 5 * MINUTE_NS;
    let (mut slo_seq, mut safety_seq) = (0u64, 0u64);
    let mut batches = Vec::new();
    let mut truth = Vec::new();
    for (k, version) in versions.iter().enumerate() {
        let start = t0 + k as i64 * SNAPSHOTS * step;
        let k = k as u64;
        for i in 1..=SNAPSHOTS as u64 {
            let time = start + i as i64 * step;
            let mut events = Vec::new();
            let mut push = |kind| {
                slo_seq += 1;
                events.push(at(slo_seq, time, kind));
            };
            for (j, loop_name) in LOOPS.iter().enumerate() {
                let misses = (k + 1) * (j as u64 + 1) * i;
                push(completion_counters(
                    loop_name,
                    version,
                    start,
                    7_500 * i,
                    misses,
                ));
            }
            push(event::Kind::AutonomySeconds(AutonomySeconds {
                start_time_unix_ns: start,
                modes: (1..=4)
                    .map(|mode| ModeSeconds {
                        mode,
                        seconds: (60 * mode as u64 * i) as f64,
                    })
                    .collect(),
                model: model(version),
            }));
            push(event::Kind::ThrottleCounters(ThrottleCounters {
                start_time_unix_ns: start,
                components: (1..=3)
                    .map(|component| ComponentSeconds {
                        component,
                        throttled_seconds: (component as u64 * i) as f64,
                    })
                    .collect(),
                model: model(version),
            }));
            push(event::Kind::EnergyCounters(EnergyCounters {
                start_time_unix_ns: start,
                rails: (1..=6)
                    .map(|r| RailEnergy {
                        rail: format!("VDD_RAIL_{r}"),
                        joules: (900 * r * i) as f64,
                    })
                    .collect(),
                model: model(version),
            }));
            batches.push(batch(machine, 5, Tier::Slo, events));
            if i == 6 {
                // Half an hour into the version: a fallback per loop, an intervention and a safe
                // stop (the probe's counters: cumulative over the producer's life).
                let mut events = Vec::new();
                let mut push = |kind| {
                    safety_seq += 1;
                    events.push(at(safety_seq, time + 1_000_000_000, kind));
                };
                for loop_name in LOOPS {
                    push(event::Kind::SafetyFallback(SafetyFallback {
                        control_loop: Some(LoopRef {
                            loop_id: 1,
                            loop_name: loop_name.into(),
                        }),
                        model: model(version),
                        total: k + 1,
                        delta: 1,
                        ..Default::default()
                    }));
                }
                push(event::Kind::Intervention(Intervention {
                    total: k + 1,
                    delta: 1,
                    model: model(version),
                    ..Default::default()
                }));
                push(event::Kind::SafeStop(SafeStop {
                    total: k + 1,
                    delta: 1,
                    model: model(version),
                    ..Default::default()
                }));
                batches.push(batch(machine, 5, Tier::Safety, events));
            }
        }
        for (j, loop_name) in LOOPS.iter().enumerate() {
            let n = SNAPSHOTS as u64;
            truth.push(Injected {
                version: version.to_string(),
                loop_name: loop_name.to_string(),
                activations: 7_500 * n,
                misses: (k + 1) * (j as u64 + 1) * n,
            });
        }
    }
    (batches, truth)
}

/// Publishes a rollout to a gateway at the packaged defaults and checks every version's row of
/// both control SLOs against the injected counts; returns how many series retired.
async fn check_rollout(client_id: &str, versions: &[&str]) -> f64 {
    let broker = Mosquitto::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let gateway = Gateway::start_packaged(dir.path(), broker.addr(), client_id, None);
    let t0 = now_ns() - (versions.len() as i64 * 2 + 1) * HOUR_NS;
    let (batches, truth) = rollout("truck-40", versions, t0);
    let messages: Vec<_> = batches.iter().map(message).collect();
    let total = messages.len() as f64;
    publish_all(broker.addr(), "agent-40", &messages).await;
    gateway.wait_metric("edgewatch_gateway_messages_acked_total", |v| v == total);

    let report = report(&gateway, now_ns() / 1_000_000, None);
    // Every version has its rows, and nothing was refused...
    assert_eq!(
        gateway.metric("edgewatch_gateway_series_refused_total"),
        Some(0.0),
        "samples refused by the series budget"
    );
    for version in versions {
        for slo in ["safety-control", "assistive-control"] {
            row(&report, slo, SITE, version);
        }
    }
    // ...and each row counts exactly what was injected.
    for Injected {
        version,
        loop_name,
        activations,
        misses,
    } in truth
    {
        let slo = match loop_name.as_str() {
            "safety" => "safety-control",
            "assistive" => "assistive-control",
            _ => continue,
        };
        let row = row(&report, slo, SITE, &version);
        assert_eq!(row["machine_class"], CLASS);
        assert_eq!(row["semantics"], "completion");
        assert_eq!(
            row["total_events"].as_f64().unwrap(),
            activations as f64,
            "{slo} {version}: every activation, from the version's first snapshot"
        );
        assert_eq!(
            row["bad_events"].as_f64().unwrap(),
            misses as f64,
            "{slo} {version}: every miss"
        );
        // JSON numbers parse back to within a unit in the last place.
        let compliance = row["compliance"].as_f64().unwrap();
        assert!((compliance - (1.0 - misses as f64 / activations as f64)).abs() < 1e-12);
        assert!(row["incomplete"].is_null(), "{slo} {version}: {row:#}");
    }
    gateway
        .metric("edgewatch_gateway_series_retired_total")
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_loop_machine_rolled_through_three_model_versions_keeps_every_versions_misses() {
    // 3 × 36 series fit the default budget at once: nothing needs to retire.
    let retired = check_rollout("gw-rollout-3", &["4.2.1", "4.3.0", "4.4.0"]).await;
    assert_eq!(retired, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_model_versions_in_a_row_fit_the_default_budget_because_old_versions_retire() {
    // 6 × 36 series: more than the default budget holds at once, so the versions switched away
    // from must retire to make room.
    let retired = check_rollout(
        "gw-rollout-6",
        &["4.2.1", "4.3.0", "4.4.0", "4.5.0", "4.6.0", "4.7.0"],
    )
    .await;
    assert!(retired >= 36.0, "{retired} series retired");
}

/// Six hours of the safety loop every ten minutes, no misses.
fn clean_history(machine: &str, site: &str, t0: i64) -> Vec<Batch> {
    (1..=36u64)
        .map(|i| {
            let time = t0 + i as i64 * 10 * MINUTE_NS;
            let events = vec![at(i, time, counters("safety", "4.2.1", t0, 15_000 * i, 0))];
            on_site(batch(machine, 9, Tier::Slo, events), site)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_with_more_misses_than_cycles_is_dead_lettered_and_moves_no_slo() {
    let broker = Mosquitto::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let gateway = Gateway::start_packaged(dir.path(), broker.addr(), "gw-invariant", None);
    let t0 = now_ns() - 7 * HOUR_NS;
    // Two machines with the same history on two sites; one also sends an impossible event in
    // the middle of it.
    let mut messages: Vec<_> = clean_history("truck-a", "pit-a", t0)
        .iter()
        .chain(&clean_history("truck-b", "pit-b", t0))
        .map(message)
        .collect();
    let cycles = 15_000 * 18 + 7_500;
    let impossible = at(
        37,
        t0 + 185 * MINUTE_NS,
        counters("safety", "4.2.1", t0, cycles, cycles + 30),
    );
    messages.push(message(&on_site(
        batch("truck-a", 9, Tier::Slo, vec![impossible]),
        "pit-a",
    )));
    let total = messages.len() as f64;
    publish_all(broker.addr(), "agents-ab", &messages).await;
    gateway.wait_metric("edgewatch_gateway_messages_acked_total", |v| v == total);

    let report = report(&gateway, now_ns() / 1_000_000, None);
    let (a, b) = (
        row(&report, "safety-control", "pit-a", "4.2.1"),
        row(&report, "safety-control", "pit-b", "4.2.1"),
    );
    for field in [
        "total_events",
        "bad_events",
        "compliance",
        "budget_remaining",
        "burn_rates",
        "alerts_firing",
        "policy_actions",
    ] {
        assert_eq!(a[field], b[field], "{field}: {a:#} against {b:#}");
    }
    assert_eq!(b["total_events"].as_f64().unwrap(), 15_000.0 * 36.0);
    assert_eq!(b["compliance"].as_f64().unwrap(), 1.0);
    // The refused event is data: its cycles and misses samples, on its own row only.
    assert_eq!(a["incomplete"], 2, "{a:#}");
    assert!(b["incomplete"].is_null(), "{b:#}");
    assert_eq!(
        gateway.metric("edgewatch_gateway_events_refused_total{reason=\"bad_over_total\"}"),
        Some(1.0)
    );
    drop(gateway);
    let store = Store::open_path(&dir.path().join("store.redb")).unwrap();
    let letters = store.dead_letters().unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert!(
        letters[0].reason.starts_with("bad_over_total"),
        "{}",
        letters[0].reason
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machines_first_safety_batch_counts_in_freshness_from_both_sources() {
    let broker = Mosquitto::start().unwrap();
    let prometheus = Prometheus::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let url = prometheus.remote_write_url();
    let gateway = Gateway::start_packaged(dir.path(), broker.addr(), "gw-fresh", Some(&url));
    let base = prometheus.base_url();

    let first = safety_batch("truck-f", 2, 1, 5, now_ns() - MINUTE_NS);
    publish_all(broker.addr(), "agent-f", &[message(&first)]).await;
    gateway.wait_metric("edgewatch_gateway_messages_acked_total", |v| v == 1.0);
    let at_ms = now_ns() / 1_000_000 + 1_000;
    for source in [None, Some(base.as_str())] {
        let report = report(&gateway, at_ms, source);
        let fresh = row(&report, "safety-event-freshness", SITE, "");
        assert_eq!(fresh["total_events"], 5.0, "{source:?}: {fresh:#}");
        assert_eq!(fresh["bad_events"], 0.0, "{source:?}");
        assert_eq!(fresh["compliance"], 1.0, "{source:?}");
    }

    let second = safety_batch("truck-f", 2, 6, 3, now_ns() - MINUTE_NS);
    publish_all(broker.addr(), "agent-f", &[message(&second)]).await;
    gateway.wait_metric("edgewatch_gateway_messages_acked_total", |v| v == 2.0);
    let at_ms = now_ns() / 1_000_000 + 1_000;
    let from_store = report(&gateway, at_ms, None);
    let from_prometheus = report(&gateway, at_ms, Some(&base));
    assert_eq!(from_store, from_prometheus);
    let fresh = row(&from_store, "safety-event-freshness", SITE, "");
    assert_eq!(fresh["total_events"], 8.0, "{fresh:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_fallback_intervention_and_queue_loss_of_a_new_series_count_in_both_sinks() {
    let broker = Mosquitto::start().unwrap();
    let prometheus = Prometheus::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let url = prometheus.remote_write_url();
    let gateway = Gateway::start_packaged(dir.path(), broker.addr(), "gw-first", Some(&url));
    let t = now_ns() - HOUR_NS;
    let fallback = |version: &str, total: u64| {
        event::Kind::SafetyFallback(SafetyFallback {
            control_loop: Some(LoopRef {
                loop_id: 1,
                loop_name: "safety".into(),
            }),
            model: model(version),
            total,
            delta: 1,
            ..Default::default()
        })
    };
    let safety = vec![
        at(1, t, fallback("4.2.1", 1)),
        at(
            2,
            t,
            event::Kind::Intervention(Intervention {
                total: 1,
                delta: 1,
                model: model("4.2.1"),
                ..Default::default()
            }),
        ),
        at(3, t + 10 * MINUTE_NS, fallback("4.2.1", 2)),
        // The model changed while the producer ran: the new version's series starts at the
        // producer's running total, and counts only its own fallback.
        at(4, t + 20 * MINUTE_NS, fallback("4.3.0", 3)),
    ];
    let loss = vec![at(
        1,
        t,
        event::Kind::QueueLoss(QueueLoss {
            tier: Tier::Debug as i32,
            cause: 1,
            count: 4,
            total: 4,
            ..Default::default()
        }),
    )];
    let messages = [
        message(&batch("truck-d", 4, Tier::Safety, safety)),
        message(&batch("truck-d", 4, Tier::Slo, loss)),
    ];
    publish_all(broker.addr(), "agent-d", &messages).await;
    gateway.wait_metric("edgewatch_gateway_messages_acked_total", |v| v == 2.0);

    let end_ms = now_ns() / 1_000_000;
    let store = Store::open_read_only(&dir.path().join("store.redb")).unwrap();
    for (metric, labels, expected) in [
        (
            "edge_safety_fallbacks_total",
            vec![("model_version", "4.2.1")],
            2.0,
        ),
        (
            "edge_safety_fallbacks_total",
            vec![("model_version", "4.3.0")],
            1.0,
        ),
        (
            "edge_interventions_total",
            vec![("model_version", "4.2.1")],
            1.0,
        ),
        (
            "edge_queue_lost_records_total",
            vec![("tier", "debug"), ("cause", "evicted")],
            4.0,
        ),
    ] {
        let local = store
            .query(metric, end_ms - 2 * 86_400_000, end_ms)
            .unwrap();
        let remote = query_raw(
            &prometheus.base_url(),
            metric,
            end_ms - 2 * 86_400_000,
            end_ms,
        )
        .unwrap();
        assert_eq!(
            increase_of(&local, &labels, end_ms),
            expected,
            "{metric} {labels:?} in the store"
        );
        assert_eq!(
            increase_of(&remote, &labels, end_ms),
            expected,
            "{metric} {labels:?} in Prometheus"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_data_shows_as_incomplete_on_its_own_row_from_both_sources() {
    let broker = Mosquitto::start().unwrap();
    let prometheus = Prometheus::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let url = prometheus.remote_write_url();
    let gateway = Gateway::start_packaged(dir.path(), broker.addr(), "gw-refusals", Some(&url));
    let t0 = now_ns() - 3 * HOUR_NS;
    let site = "pit-r";
    let snapshot = |seq: u64, i: u64, loop_name: &str| {
        at(
            seq,
            t0 + i as i64 * 10 * MINUTE_NS,
            counters(loop_name, "5.0.0", t0, 15_000 * i, i / 4),
        )
    };
    let history: Vec<Event> = (1..=12u64).map(|i| snapshot(i, i, "safety")).collect();
    let refused = vec![
        // Misses above cycles, on the safety loop: 2 samples the row reads (cycles, misses).
        at(
            13,
            t0 + 35 * MINUTE_NS,
            counters("safety", "5.0.0", t0, 50_000, 50_100),
        ),
        // Stamped an hour after its arrival: 2 more.
        at(
            14,
            now_ns() + HOUR_NS,
            counters("safety", "5.0.0", t0, 200_000, 3),
        ),
        // A second value at a time the series already holds: 2 more.
        at(
            15,
            t0 + 50 * MINUTE_NS,
            counters("safety", "5.0.0", t0, 75_123, 1),
        ),
        // Refused too, but on a loop no SLO reads: on no row.
        at(
            16,
            t0 + 35 * MINUTE_NS,
            counters("planner", "5.0.0", t0, 10, 20),
        ),
    ];
    let messages = [
        message(&on_site(batch("truck-r", 6, Tier::Slo, history), site)),
        message(&on_site(batch("truck-r", 6, Tier::Slo, refused), site)),
    ];
    publish_all(broker.addr(), "agent-r", &messages).await;
    gateway.wait_metric("edgewatch_gateway_messages_acked_total", |v| v == 2.0);

    let at_ms = now_ns() / 1_000_000 + 60_000;
    let from_store = report(&gateway, at_ms, None);
    let from_prometheus = report(&gateway, at_ms, Some(&prometheus.base_url()));
    assert_eq!(from_store, from_prometheus);
    let safety = row(&from_store, "safety-control", site, "5.0.0");
    assert_eq!(safety["incomplete"], 6, "{safety:#}");
    // What was stored is counted exactly: the history, from its start.
    assert_eq!(safety["total_events"], 15_000.0 * 12.0);
    assert_eq!(safety["bad_events"], 3.0);
    let rows = from_store["slo"]["rows"].as_array().unwrap();
    assert!(
        rows.iter()
            .filter(|r| r != &safety)
            .all(|r| r["incomplete"].is_null()),
        "{rows:#?}"
    );

    // The table says it on the same row.
    let at = edgewatch_slo::format_rfc3339(at_ms);
    let url = prometheus.base_url();
    for args in [
        vec!["report", "--at", &at],
        vec!["report", "--at", &at, "--prometheus", &url],
    ] {
        let text = gateway.command(&args);
        let line = text
            .lines()
            .find(|l| l.starts_with("safety-control") && l.contains(site))
            .unwrap_or_else(|| panic!("no safety-control row for {site}:\n{text}"));
        assert!(line.contains("incomplete 6"), "{line}");
    }
}
