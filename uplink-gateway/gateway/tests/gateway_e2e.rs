//! End-to-end ingest through the real `edgewatch-gateway` binary and a real Mosquitto: framed
//! batches published with rumqttc land in the embedded store once, re-sends are dropped, hostile
//! payloads and foreign identities are dead-lettered and counted, a gateway killed before or
//! after its commit gets the batch again without counting it twice, and Prometheus 2.42's
//! "too old" 500 is dead-lettered instead of retried forever.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

mod util;

use std::time::Duration;

use edgewatch_gateway::store::Store;
use edgewatch_harness::mosquitto::Mosquitto;
use edgewatch_harness::prometheus::Prometheus;
use edgewatch_proto::v1::Batch;
use prost::Message as _;
use util::*;

use edgewatch_slo::names::metric::CONTROL_CYCLES as CYCLES;

fn samples_of(store: &Store, metric: &str) -> Vec<(i64, f64)> {
    store
        .query(metric, 0, i64::MAX)
        .unwrap()
        .into_iter()
        .flat_map(|series| series.samples)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_published_over_mqtt_are_stored_once_even_when_re_sent() {
    let broker = Mosquitto::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut gateway = Gateway::start(dir.path(), &GatewaySpec::new(broker.addr(), "gw-e2e"));
    let start = now_ns() - 2 * HOUR_NS;
    let batches: Vec<Batch> = (0..5)
        .map(|i| {
            slo_batch(
                "truck-17",
                7,
                1 + i * 4,
                4,
                start + i as i64 * 40_000_000_000,
            )
        })
        .collect();
    let mut messages: Vec<_> = batches.iter().map(message).collect();
    // Two whole re-sends and one batch overlapping the last two events of batch 5 by half.
    messages.push(message(&batches[0]));
    messages.push(message(&batches[3]));
    messages.push(message(&slo_batch(
        "truck-17",
        7,
        19,
        4,
        start + 180_000_000_000,
    )));
    publish_all(broker.addr(), "agent-17", &messages).await;
    gateway.wait_metric("edgewatch_gateway_messages_acked_total", |v| v == 8.0);
    assert_eq!(
        gateway.metric("edgewatch_gateway_batches_duplicate_total"),
        Some(2.0)
    );
    assert_eq!(gateway.metric("edgewatch_gateway_events_total"), Some(22.0));
    assert_eq!(
        gateway.metric("edgewatch_gateway_events_duplicate_total"),
        Some(10.0)
    );
    gateway.stop();

    let store = Store::open_path(&gateway.store_path()).unwrap();
    let samples = samples_of(&store, CYCLES);
    assert_eq!(samples.len(), 22, "one cycles sample per distinct event");
    assert_eq!(samples.last().unwrap().1, 250.0 * 22.0);
    let streams = store.dedup_streams().unwrap();
    assert_eq!(streams.len(), 1);
    assert_eq!(streams[0].ranges, vec![(1, 22)]);
    assert!(store.dead_letters().unwrap().is_empty());
}

/// A zstd frame that declares (and holds) 5 MiB of zeros: over the decompressed limit.
fn zstd_bomb() -> Vec<u8> {
    zstd::bulk::compress(&vec![0u8; 5 * 1024 * 1024], 3).unwrap()
}

/// A well-framed batch that declares schema version 2.
fn future_schema_batch() -> Vec<u8> {
    let mut batch = slo_batch("truck-17", 7, 1, 1, now_ns());
    batch.schema_version = 2;
    zstd::bulk::compress(&batch.encode_to_vec(), 3).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_payloads_and_foreign_identities_are_dead_lettered_and_counted() {
    let broker = Mosquitto::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut gateway = Gateway::start(dir.path(), &GatewaySpec::new(broker.addr(), "gw-hostile"));
    let topic = "edgewatch/v1/pit-3/truck-17/slo".to_owned();
    let (_, foreign) = message(&slo_batch("truck-18", 1, 1, 2, now_ns()));
    let good = message(&slo_batch("truck-17", 1, 1, 2, now_ns() - HOUR_NS));
    let hostile = vec![
        (topic.clone(), b"definitely not zstd".to_vec()),
        (topic.clone(), zstd_bomb()),
        (topic.clone(), future_schema_batch()),
        (topic.clone(), foreign),
        (
            "edgewatch/v1/pit-3/truck-17/telemetry".to_owned(),
            good.1.clone(),
        ),
        (
            "edgewatch/v1/pit-3/truck-17/status".to_owned(),
            vec![0xff; 64],
        ),
        (
            "edgewatch/v1/pit-3/truck-17/safety".to_owned(),
            good.1.clone(),
        ),
        good.clone(),
    ];
    publish_all(broker.addr(), "agent-hostile", &hostile).await;
    gateway.wait_metric("edgewatch_gateway_messages_acked_total", |v| v == 8.0);
    let count = |reason: &str| {
        gateway
            .metric(&format!(
                "edgewatch_gateway_dead_letters_total{{reason=\"{reason}\"}}"
            ))
            .unwrap()
    };
    assert_eq!(count("undecodable"), 1.0);
    assert_eq!(count("too_large"), 1.0);
    assert_eq!(count("schema_version"), 1.0);
    assert_eq!(count("identity_mismatch"), 1.0);
    assert_eq!(count("bad_topic"), 1.0);
    assert_eq!(count("bad_status"), 1.0);
    assert_eq!(count("tier_mismatch"), 1.0);
    assert_eq!(
        gateway.metric("edgewatch_gateway_batches_accepted_total"),
        Some(1.0)
    );
    gateway.stop();

    let store = Store::open_path(&gateway.store_path()).unwrap();
    let letters = store.dead_letters().unwrap();
    assert_eq!(letters.len(), 7);
    assert!(letters[0].reason.starts_with("undecodable"));
    assert_eq!(letters[0].payload, b"definitely not zstd");
    assert!(letters[3].reason.starts_with("identity_mismatch"));
    assert_eq!(
        samples_of(&store, CYCLES).len(),
        2,
        "the good batch after them was stored"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_killed_before_its_commit_gets_the_batch_again() {
    let broker = Mosquitto::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut gateway = Gateway::start(dir.path(), &GatewaySpec::new(broker.addr(), "gw-crash"));
    // Frozen, the gateway cannot read, commit or acknowledge what the broker sends it.
    gateway.signal(libc::SIGSTOP);
    let batch = slo_batch("truck-17", 3, 1, 5, now_ns() - HOUR_NS);
    publish_all(broker.addr(), "agent-crash", &[message(&batch)]).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    gateway.kill();
    {
        let store = Store::open_path(&gateway.store_path()).unwrap();
        assert!(
            samples_of(&store, CYCLES).is_empty(),
            "nothing was committed before the kill"
        );
    }
    // Same client id, same store: the broker redelivers the unacknowledged message.
    gateway.restart();
    gateway.wait_metric("edgewatch_gateway_messages_acked_total", |v| v == 1.0);
    gateway.stop();
    let store = Store::open_path(&gateway.store_path()).unwrap();
    assert_eq!(samples_of(&store, CYCLES).len(), 5);
    assert_eq!(store.dedup_streams().unwrap()[0].ranges, vec![(1, 5)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_killed_after_its_commit_but_before_its_ack_counts_the_batch_once() {
    let broker = Mosquitto::start().unwrap();
    let prometheus = Prometheus::start().unwrap();
    // A remote-write endpoint that accepts connections and never answers: the gateway commits
    // locally, then waits on the sink, so the message stays unacknowledged.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_url = format!("http://{}/api/v1/write", silent.local_addr().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let mut spec = GatewaySpec::new(broker.addr(), "gw-commit");
    spec.remote_write_url = Some(silent_url);
    let mut gateway = Gateway::start(dir.path(), &spec);
    let batch = safety_batch("truck-17", 3, 1, 4, now_ns() - 3 * DAY_NS);
    publish_all(broker.addr(), "agent-commit", &[message(&batch)]).await;
    gateway.wait_metric("edgewatch_gateway_commits_total", |v| v == 1.0);
    assert_eq!(
        gateway.metric("edgewatch_gateway_messages_acked_total"),
        Some(0.0)
    );
    gateway.kill();
    // Four safe stops: each its total and, a millisecond before, the total before it.
    {
        let store = Store::open_path(&gateway.store_path()).unwrap();
        assert_eq!(samples_of(&store, "edge_safe_stops_total").len(), 8);
        assert_eq!(
            store.outbox().unwrap().len(),
            1,
            "the request waits in the outbox"
        );
    }

    // Restart against a working sink: the outbox goes first, the redelivered batch is a duplicate.
    let config = std::fs::read_to_string(&gateway.config_file).unwrap();
    let config = config
        .lines()
        .map(|line| {
            if line.starts_with("url = ") {
                format!("url = \"{}\"", prometheus.remote_write_url())
            } else {
                line.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&gateway.config_file, config).unwrap();
    gateway.restart();
    gateway.wait_metric("edgewatch_gateway_messages_acked_total", |v| v == 1.0);
    assert_eq!(
        gateway.metric("edgewatch_gateway_batches_duplicate_total"),
        Some(1.0)
    );
    assert_eq!(
        gateway.metric("edgewatch_gateway_remote_write_requests_total"),
        Some(1.0)
    );
    gateway.stop();

    let store = Store::open_path(&gateway.store_path()).unwrap();
    assert_eq!(samples_of(&store, "edge_safe_stops_total").len(), 8);
    assert!(store.outbox().unwrap().is_empty());
    // The gateway's own counter, from zero a millisecond before its first sample.
    assert_eq!(
        samples_of(&store, "edgewatch_safety_events_received_total"),
        {
            let ts = samples_of(&store, "edgewatch_safety_events_received_total")[1].0;
            vec![(ts - 1, 0.0), (ts, 4.0)]
        }
    );
    let now_ms = now_ns() / 1_000_000;
    let remote = edgewatch_gateway::prometheus::query_raw(
        &prometheus.base_url(),
        "edge_safe_stops_total",
        now_ms - 10 * 86_400_000,
        now_ms,
    )
    .unwrap();
    assert_eq!(remote.len(), 1);
    assert_eq!(
        remote[0].samples.len(),
        8,
        "each sample reached Prometheus once"
    );
    drop(silent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn samples_prometheus_refuses_as_too_old_are_dead_lettered_not_retried_forever() {
    let broker = Mosquitto::start().unwrap();
    // Prometheus' out-of-order window is 30 d; the gateway is (mis)configured to send up to 60 d.
    let prometheus = Prometheus::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut spec = GatewaySpec::new(broker.addr(), "gw-too-old");
    spec.remote_write_url = Some(prometheus.remote_write_url());
    spec.rw_max_sample_age = "60d";
    let mut gateway = Gateway::start(dir.path(), &spec);
    // A recent sample first: an empty TSDB takes any time; "too old" is relative to its head.
    let recent = slo_batch("truck-18", 3, 1, 1, now_ns() - HOUR_NS);
    publish_all(broker.addr(), "agent-recent", &[message(&recent)]).await;
    gateway.wait_metric("edgewatch_gateway_remote_write_requests_total", |v| {
        v == 1.0
    });
    let batch = slo_batch("truck-17", 3, 1, 3, now_ns() - 40 * DAY_NS);
    publish_all(broker.addr(), "agent-old", &[message(&batch)]).await;
    gateway.wait_metric("edgewatch_gateway_messages_acked_total", |v| v == 2.0);
    assert_eq!(
        gateway.metric("edgewatch_gateway_remote_write_refused_total"),
        Some(1.0)
    );
    gateway.stop();
    let store = Store::open_path(&gateway.store_path()).unwrap();
    assert_eq!(
        samples_of(&store, CYCLES).len(),
        4,
        "kept in the embedded store"
    );
    let letters = store.dead_letters().unwrap();
    assert_eq!(letters.len(), 1);
    assert!(
        letters[0].reason.starts_with("remote_write_refused"),
        "{}",
        letters[0].reason
    );
    assert!(
        letters[0].reason.contains("HTTP 500"),
        "{}",
        letters[0].reason
    );
    assert!(store.outbox().unwrap().is_empty());
}
