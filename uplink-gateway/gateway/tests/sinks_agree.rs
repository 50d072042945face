//! The same events, written through both sinks (the embedded store and remote-write into a real
//! Prometheus 2.42 with an out-of-order window), read back the same: raw samples of every metric
//! agree, and `report` gives the same numbers from the store and with `--prometheus`.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

mod util;

use edgewatch_gateway::prometheus::query_raw;
use edgewatch_gateway::store::Store;
use edgewatch_harness::mosquitto::Mosquitto;
use edgewatch_harness::prometheus::Prometheus;
use edgewatch_proto::v1::{
    AutonomySeconds, ComponentSeconds, DeadlineCounters, DeadlineSemantics, EnergyCounters, Event,
    LoopRef, ModeSeconds, ModelVersion, RailEnergy, ThrottleCounters, Tier, event,
};
use util::*;

const PRICES: &str = r#"
[prices]
currency = "USD"
[prices.machine_classes.haul-truck]
purchase_price = 4200.0
lifetime_hours = 30000.0
[prices.sites.pit-3]
energy_price_per_kwh = 0.19
"#;

fn model() -> Option<ModelVersion> {
    Some(ModelVersion {
        name: "haul-perception".into(),
        version: "4.2.1".into(),
        ..Default::default()
    })
}

/// One SLO batch per machine-hour of history: both loops' deadline counters (completion
/// semantics), throttle, autonomy and energy counters, all cumulative, stamped
/// `start_ns + i × 10 min`.
fn history(machine: &str, start_ns: i64, batches: u64) -> Vec<edgewatch_proto::v1::Batch> {
    let mut seq = 0u64;
    (0..batches)
        .map(|b| {
            let mut events = Vec::new();
            for step in 0..6u64 {
                let i = b * 6 + step;
                let time = start_ns + i as i64 * 600_000_000_000;
                let mut push = |kind| {
                    seq += 1;
                    events.push(Event {
                        seq,
                        event_time_unix_ns: time,
                        monotonic_ns: seq,
                        kind: Some(kind),
                    });
                };
                for (loop_name, miss_every) in [("safety", 40_000u64), ("assistive", 900)] {
                    let cycles = 15_000 * (i + 1);
                    let overruns = cycles / miss_every + i / 3;
                    let skipped = i / 5;
                    push(event::Kind::DeadlineCounters(DeadlineCounters {
                        control_loop: Some(LoopRef {
                            loop_id: 1,
                            loop_name: loop_name.into(),
                        }),
                        model: model(),
                        start_time_unix_ns: start_ns,
                        cycles,
                        misses: overruns,
                        skipped,
                        activations: Some(cycles + skipped),
                        deadline_misses: Some(overruns / 2 + skipped),
                        overruns: Some(overruns),
                        deadline_ns: 40_000_000,
                        semantics: DeadlineSemantics::Completion as i32,
                        ..Default::default()
                    }));
                }
                push(event::Kind::ThrottleCounters(ThrottleCounters {
                    start_time_unix_ns: start_ns,
                    components: vec![ComponentSeconds {
                        component: 2,
                        throttled_seconds: 1.5 * i as f64,
                    }],
                    model: model(),
                }));
                push(event::Kind::AutonomySeconds(AutonomySeconds {
                    start_time_unix_ns: start_ns,
                    modes: vec![
                        ModeSeconds {
                            mode: 1,
                            seconds: 500.0 * (i + 1) as f64,
                        },
                        ModeSeconds {
                            mode: 2,
                            seconds: 100.0 * (i + 1) as f64,
                        },
                    ],
                    model: model(),
                }));
                push(event::Kind::EnergyCounters(EnergyCounters {
                    start_time_unix_ns: start_ns,
                    rails: vec![RailEnergy {
                        rail: "VDD_GPU_SOC".into(),
                        joules: 9_000.0 * (i + 1) as f64,
                    }],
                    model: model(),
                }));
            }
            batch(machine, 11, Tier::Slo, events)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_sinks_return_the_same_samples_and_the_same_report() {
    let broker = Mosquitto::start().unwrap();
    let prometheus = Prometheus::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut spec = GatewaySpec::new(broker.addr(), "gw-sinks");
    spec.remote_write_url = Some(prometheus.remote_write_url());
    spec.extra_tables = PRICES.to_owned();
    let gateway = Gateway::start(dir.path(), &spec);

    let now = now_ns();
    let mut messages = Vec::new();
    // Two machines back from a partition: 2 days of history from 9 and 4 days ago.
    for (machine, days_ago) in [("truck-17", 9), ("truck-18", 4)] {
        for batch in history(machine, now - days_ago * DAY_NS, 48) {
            messages.push(message(&batch));
        }
        messages.push(message(&safety_batch(
            machine,
            11,
            1,
            5,
            now - (days_ago - 1) * DAY_NS,
        )));
    }
    // A re-send of one batch: a no-op in both sinks.
    messages.push(messages[3].clone());
    let total = messages.len() as f64;
    publish_all(broker.addr(), "agents", &messages).await;
    gateway.wait_metric("edgewatch_gateway_messages_acked_total", |v| v == total);
    assert_eq!(
        gateway.metric("edgewatch_gateway_remote_write_refused_total"),
        Some(0.0)
    );
    assert_eq!(
        gateway.metric("edgewatch_gateway_samples_conflicting_total"),
        Some(0.0)
    );

    // Raw samples: every metric, the last 20 days, from both sinks (the store read alongside
    // the running gateway).
    let store = Store::open_read_only(&gateway.store_path()).unwrap();
    let now_ms = now / 1_000_000 + 60_000;
    let from_ms = now_ms - 20 * 86_400_000;
    let metrics = store.metrics().unwrap();
    // Deadline counters under both names (the old fields and the completion semantics),
    // throttle, autonomy, energy, safe stops, the gateway's freshness pair, and the fleet
    // view's last event and arrival and model-version event times.
    assert_eq!(metrics.len(), 16, "{metrics:?}");
    let mut compared = 0;
    for metric in &metrics {
        let mut local = store.query(metric, from_ms + 1, now_ms).unwrap();
        local.sort_by(|a, b| a.labels.cmp(&b.labels));
        let remote = query_raw(&prometheus.base_url(), metric, from_ms, now_ms).unwrap();
        assert_eq!(local.len(), remote.len(), "series of {metric}");
        for (l, r) in local.iter().zip(&remote) {
            assert_eq!(l.labels, r.labels);
            assert_eq!(l.samples, r.samples, "samples of {metric}");
            compared += l.samples.len();
        }
    }
    assert!(compared > 3000, "{compared} samples compared");
    drop(store);

    // The reports: same evaluation time and cost period, two sources.
    let at = edgewatch_slo::format_rfc3339(now_ms);
    let day_ms = 86_400_000;
    let to = edgewatch_slo::format_rfc3339((now_ms / day_ms + 1) * day_ms);
    let from = edgewatch_slo::format_rfc3339((now_ms / day_ms - 12) * day_ms);
    let args = [
        "report", "--json", "--at", &at, "--from", &from, "--to", &to,
    ];
    let from_store = gateway.command(&args);
    let url = prometheus.base_url();
    let mut with_prometheus = args.to_vec();
    with_prometheus.extend(["--prometheus", &url]);
    let from_prometheus = gateway.command(&with_prometheus);
    assert_eq!(from_store, from_prometheus);
    let report: serde_json::Value = serde_json::from_str(&from_store).unwrap();
    let rows = report["slo"]["rows"].as_array().unwrap();
    assert!(
        rows.len() >= 4,
        "rows for control, freshness and throttle SLOs"
    );
    assert!(
        report["cost"]["lines"].as_array().unwrap().len() >= 4,
        "cost lines for both machines on several days"
    );
}
