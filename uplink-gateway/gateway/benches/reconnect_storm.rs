//! Reconnect storm: 1,000 simulated machines come back at once, each draining a backlog of
//! batches, into the real gateway binary through a real Mosquitto. The machines are simulated by
//! publishing their batches through 8 MQTT connections (each carries 125 machines' backlogs in
//! order, QoS 1, the broker's Receive Maximum of 20 in flight), not by 1,000 connections: the
//! gateway sees the same topics and payloads either way. Reports the time from the first publish
//! until the gateway acknowledged the last batch, and the gateway's peak RSS (VmHWM); medians of
//! several runs.
//!
//! The machines' batches are the gateway tests' own (`tests/util`: safe stops, then deadline
//! counters), and the gateway runs under `edgewatch_harness::gateway`.
//!
//! Run: `cargo bench -p edgewatch-gateway --bench reconnect_storm`

#![allow(clippy::unwrap_used, clippy::print_stdout)]

#[path = "../tests/util/mod.rs"]
mod util;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use edgewatch_harness::gateway::GatewayProcess;
use edgewatch_harness::mosquitto::Mosquitto;
use edgewatch_harness::process::Launch;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::Packet;
use rumqttc::v5::{AsyncClient, Event as MqttEvent};

const MACHINES: usize = 1_000;
const BACKLOG_BATCHES: u64 = 10;
const EVENTS_PER_BATCH: u64 = 20;
const CONNECTIONS: usize = 8;
const RUNS: usize = 3;

/// One machine's backlog, as the agent drains it: safety first (one batch of three safe stops),
/// then the SLO backlog, in the tests' batches (epoch 3, site `pit-3`).
fn backlog(machine: usize) -> Vec<(String, Vec<u8>)> {
    let id = format!("truck-{machine:04}");
    let start = util::now_ns() - 2 * 86_400_000_000_000;
    let mut out = vec![util::message(&util::safety_batch(
        &id,
        3,
        1,
        3,
        start + 1_000_000_000,
    ))];
    for b in 0..BACKLOG_BATCHES {
        let first = 1 + b * EVENTS_PER_BATCH;
        out.push(util::message(&util::slo_batch(
            &id,
            3,
            first,
            EVENTS_PER_BATCH,
            start + first as i64 * 10_000_000_000,
        )));
    }
    out
}

fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

async fn publish(broker: SocketAddr, id: usize, messages: Vec<(String, Vec<u8>)>) {
    let mut options = edgewatch_harness::mqtt::options(&format!("storm-{id}"), broker);
    options.set_keep_alive(Duration::from_secs(30));
    let (client, mut events) = AsyncClient::new(options, 64);
    let expected = messages.len();
    let poller = tokio::spawn(async move {
        let mut acked = 0;
        while acked < expected {
            if let MqttEvent::Incoming(Packet::PubAck(_)) = events.poll().await.unwrap() {
                acked += 1;
            }
        }
    });
    for (topic, payload) in messages {
        client
            .publish(topic, QoS::AtLeastOnce, false, payload)
            .await
            .unwrap();
    }
    poller.await.unwrap();
}

fn one_run(run: usize) -> (f64, u64, usize) {
    let broker = Mosquitto::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let metrics: SocketAddr = format!("127.0.0.1:{}", edgewatch_harness::net::free_port().unwrap())
        .parse()
        .unwrap();
    let config = format!(
        "[mqtt]\nhost = \"127.0.0.1\"\nport = {}\nclient_id = \"gw-storm\"\n[store]\npath = \"{}\"\n[metrics]\nlisten = \"{metrics}\"\n[http]\nenabled = false\n",
        broker.port(),
        dir.path().join("store.redb").display()
    );
    std::fs::write(dir.path().join("gw.toml"), config).unwrap();
    let mut gateway = GatewayProcess::start(
        Path::new(env!("CARGO_BIN_EXE_edgewatch-gateway")),
        &dir.path().join("gw.toml"),
        &dir.path().join("gateway.log"),
        metrics,
        Launch::new("warn"),
        Duration::from_secs(60),
    )
    .unwrap();
    let mut per_connection: Vec<Vec<(String, Vec<u8>)>> = vec![Vec::new(); CONNECTIONS];
    let mut total = 0;
    for machine in 0..MACHINES {
        let backlog = backlog(machine);
        total += backlog.len();
        per_connection[machine % CONNECTIONS].extend(backlog);
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let started = Instant::now();
    let publishers: Vec<_> = per_connection
        .into_iter()
        .enumerate()
        .map(|(id, messages)| runtime.spawn(publish(broker.addr(), id + run * 100, messages)))
        .collect();
    while gateway
        .metric("edgewatch_gateway_messages_acked_total")
        .unwrap_or(0.0)
        < total as f64
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    let elapsed = started.elapsed().as_secs_f64();
    runtime.block_on(async {
        for publisher in publishers {
            publisher.await.unwrap();
        }
    });
    let rss = peak_rss_kib(gateway.pid().unwrap());
    gateway.kill();
    (elapsed, rss, total)
}

fn main() {
    let mut times = Vec::new();
    let mut rss = Vec::new();
    let mut total = 0;
    for run in 0..RUNS {
        let (t, r, n) = one_run(run);
        println!(
            "run {run}: {n} batches in {t:.2} s, peak RSS {:.1} MiB",
            r as f64 / 1024.0
        );
        times.push(t);
        rss.push(r);
        total = n;
    }
    times.sort_by(f64::total_cmp);
    rss.sort_unstable();
    let time = times[times.len() / 2];
    let events = MACHINES as u64 * (BACKLOG_BATCHES * EVENTS_PER_BATCH + 3);
    println!(
        "{MACHINES} machines, {total} batches ({events} events) through {CONNECTIONS} connections: median {time:.2} s to ingest all ({:.0} batches/s, {:.0} events/s), median peak RSS {:.1} MiB",
        total as f64 / time,
        events as f64 / time,
        rss[rss.len() / 2] as f64 / 1024.0
    );
}
