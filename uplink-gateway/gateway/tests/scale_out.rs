//! Scale-out: two gateway processes (the real binary) share one subscription group on a real
//! Mosquitto, each with its own embedded store, both remote-writing into one real Prometheus.
//! One is SIGKILLed mid-stream and restarted with the same client id: every batch is counted
//! exactly once across the two stores, and Prometheus (the shared sink) holds every sample once.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

mod util;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use edgewatch_gateway::prometheus::query_raw;
use edgewatch_gateway::store::Store;
use edgewatch_harness::mosquitto::Mosquitto;
use edgewatch_harness::prometheus::Prometheus;
use util::*;

const MACHINES: u64 = 20;
const BATCHES_PER_MACHINE: u64 = 10;
const EVENTS_PER_BATCH: u64 = 5;
use edgewatch_slo::names::metric::CONTROL_CYCLES as CYCLES;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_on_a_shared_subscription_count_every_batch_once_across_a_kill() {
    let broker = Mosquitto::start().unwrap();
    let prometheus = Prometheus::start().unwrap();
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let spec = |client_id| {
        let mut spec = GatewaySpec::new(broker.addr(), client_id);
        spec.shared_group = Some("edgewatch");
        spec.remote_write_url = Some(prometheus.remote_write_url());
        spec
    };
    let mut a = Gateway::start(dirs[0].path(), &spec("gw-a"));
    let mut b = Gateway::start(dirs[1].path(), &spec("gw-b"));

    let start = now_ns() - 2 * DAY_NS;
    let mut messages = Vec::new();
    for round in 0..BATCHES_PER_MACHINE {
        for m in 0..MACHINES {
            let first = 1 + round * EVENTS_PER_BATCH;
            let time = start + round as i64 * EVENTS_PER_BATCH as i64 * 10_000_000_000;
            let machine = format!("truck-{m:02}");
            messages.push(message(&slo_batch(
                &machine,
                5,
                first,
                EVENTS_PER_BATCH,
                time,
            )));
        }
    }
    let split = messages.len() * 2 / 5;
    publish_all(broker.addr(), "agents-1", &messages[..split]).await;
    // Mid-stream: gw-a is still working through its share when it dies.
    a.kill();
    publish_all(broker.addr(), "agents-2", &messages[split..]).await;
    // Same client id, same store: the broker hands back gw-a's unacknowledged and queued share.
    a.restart();

    let expected = (MACHINES * BATCHES_PER_MACHINE * EVENTS_PER_BATCH) as usize;
    let now_ms = now_ns() / 1_000_000 + 60_000;
    let from_ms = now_ms - 5 * 86_400_000;
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut in_prometheus = 0;
    while Instant::now() < deadline {
        in_prometheus = query_raw(&prometheus.base_url(), CYCLES, from_ms, now_ms)
            .unwrap()
            .iter()
            .map(|s| s.samples.len())
            .sum();
        if in_prometheus >= expected {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        in_prometheus, expected,
        "every sample reached Prometheus once"
    );
    assert!(
        a.metric("edgewatch_gateway_messages_received_total")
            .unwrap()
            > 0.0,
        "the restarted instance got back the share queued for its session"
    );
    // Both instances drain what they hold, then stop cleanly.
    for gateway in [&a, &b] {
        gateway.wait_metric("edgewatch_gateway_remote_write_outbox_pending", |v| {
            v == 0.0
        });
    }
    a.stop();
    b.stop();

    let mut per_store_samples = Vec::new();
    let mut union: BTreeSet<(Vec<(String, String)>, i64)> = BTreeSet::new();
    let mut seqs: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for gateway in [&a, &b] {
        let store = Store::open_path(&gateway.store_path()).unwrap();
        let series = store.query(CYCLES, 0, i64::MAX).unwrap();
        per_store_samples.push(series.iter().map(|s| s.samples.len()).sum::<usize>());
        for s in &series {
            for &(ts, _) in &s.samples {
                union.insert((s.labels.clone(), ts));
            }
        }
        for stream in store.dedup_streams().unwrap() {
            let list = seqs.entry(stream.machine).or_default();
            for (first, last) in stream.ranges {
                list.extend(first..=last);
            }
        }
    }
    assert!(
        per_store_samples.iter().all(|&n| n > 0),
        "the shared subscription split the work: {per_store_samples:?}"
    );
    assert_eq!(
        per_store_samples.iter().sum::<usize>(),
        expected,
        "no sample stored by both instances"
    );
    assert_eq!(union.len(), expected, "no sample missing from the union");
    assert_eq!(seqs.len(), MACHINES as usize);
    for (machine, mut list) in seqs {
        let received = list.len();
        list.sort_unstable();
        list.dedup();
        assert_eq!(
            received,
            list.len(),
            "{machine}: a batch was committed by both instances"
        );
        assert_eq!(
            list,
            (1..=BATCHES_PER_MACHINE * EVENTS_PER_BATCH).collect::<Vec<_>>(),
            "{machine}: a batch is missing"
        );
    }
}
