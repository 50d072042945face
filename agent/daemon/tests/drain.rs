//! The drain at the packaged default configuration, against a real Mosquitto through the fault
//! proxy: a link cut under a bandwidth cap, a broker refusing large packets, a broker with no
//! subscriber, and a link cut in the middle of a drain.
//!
//! Every agent here runs on `config/agent.toml` as shipped, with only its paths, ids and broker
//! address changed (and the bandwidth cap where a test is about it): intervals, backoff, batch
//! sizes and flush periods are the packaged ones.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.
#![allow(clippy::print_stderr)] // The measured figures go to the test's output.

mod util;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use edgewatch_agent::config::DEFAULT_BACKOFF_MIN_MS;
use edgewatch_harness::agent::AgentProcess;
use edgewatch_harness::mosquitto::{Mosquitto, MosquittoOptions};
use edgewatch_harness::process::Launch;
use edgewatch_harness::proxy::{Fault, FaultProxy};
use edgewatch_proto::v1::Tier;
use util::{BIN, Collector, check_config, packaged_config, submit_all, test_event, wait_until};

const SAFETY_IDS: i64 = 1_000_000;
const SLO_IDS: i64 = 2_000_000;
const DEBUG_IDS: i64 = 3_000_000;

/// A real agent on the packaged configuration, in its own directory.
struct Agent {
    process: AgentProcess,
    _dir: tempfile::TempDir,
    socket: std::path::PathBuf,
}

impl Agent {
    fn start(broker: SocketAddr, machine: &str, bandwidth: u64) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("edgewatch-drain-test-")
            .tempdir()
            .unwrap();
        let config = packaged_config(dir.path(), broker, machine, bandwidth);
        let mut process =
            AgentProcess::start(Path::new(BIN), dir.path(), &config, Launch::new("info")).unwrap();
        let ready = process.wait_for_socket(Duration::from_secs(20));
        assert!(
            ready.is_ok(),
            "the agent did not start; log:\n{}",
            process.log()
        );
        Self {
            socket: process.socket(),
            process,
            _dir: dir,
        }
    }

    fn status(&self) -> serde_json::Value {
        let output = self.process.command(&["status", "--json"]).unwrap();
        serde_json::from_slice(&output.stdout).unwrap_or(serde_json::Value::Null)
    }

    fn uplink(&self) -> serde_json::Value {
        self.status()["agent"]["uplink"].clone()
    }

    fn log(&self) -> String {
        self.process.log_tail(200)
    }

    fn submit(&self, tier: Tier, first_id: i64, count: i64, padding: usize) {
        let replies = submit_all(
            &self.socket,
            (first_id..first_id + count)
                .map(|id| (tier, test_event(id, padding)))
                .collect(),
        );
        assert!(
            replies.iter().all(|reply| reply.accepted),
            "a submission was refused: {:?}",
            replies.iter().find(|r| !r.accepted).map(|r| &r.error)
        );
    }
}

fn all_arrived(collector: &Collector, tier: Tier, first: i64, count: i64) -> bool {
    let ids: BTreeSet<i64> = collector.ids(tier).into_iter().collect();
    (first..first + count).all(|id| ids.contains(&id))
}

fn connections(proxy: &FaultProxy) -> u64 {
    proxy.stats().connections_accepted.load(Ordering::Relaxed)
}

/// Wire bytes are measured at the fault proxy: every byte the agent's connections wrote towards
/// the broker after the link returned (MQTT framing, CONNECT, PINGREQ, the status message and
/// every batch, re-sends included), counted by the proxy as it writes them to the broker.
#[test]
fn a_link_cut_under_a_bandwidth_cap_delays_a_ten_megabyte_backlog_only_by_the_reconnect() {
    const CAP: u64 = 100_000;
    let broker = Mosquitto::start().unwrap();
    let proxy = FaultProxy::start(broker.addr()).unwrap();
    let collector = Collector::start(broker.addr()).unwrap();
    let agent = Agent::start(proxy.addr(), "truck-21", CAP);
    // The packaged initial delay is up to 10 s.
    assert!(
        wait_until(Duration::from_secs(30), || agent.uplink()["connected"]
            .as_bool()
            .unwrap_or(false)),
        "never connected; log:\n{}",
        agent.log()
    );

    // The backlog: about 21 MB of events that compress to about 60 %, so more than 12 MB on the
    // wire. The drain runs under the cap for a few seconds, then the link is cut for 5 s (every
    // connection, open or new, is reset) and returns.
    let wire_start = proxy.bytes_upstream();
    agent.submit(Tier::Safety, SAFETY_IDS, 500, 2_600);
    agent.submit(Tier::Slo, SLO_IDS, 3_000, 2_600);
    agent.submit(Tier::Debug, DEBUG_IDS, 4_500, 2_600);
    assert!(wait_until(Duration::from_secs(30), || collector.count() >= 100));
    proxy.set(Fault::Reset);
    std::thread::sleep(Duration::from_secs(5));
    let connections_before = connections(&proxy);
    let wire_before = proxy.bytes_upstream();
    proxy.set(Fault::Pass);
    let returned = Instant::now();

    let done = wait_until(Duration::from_secs(200), || {
        all_arrived(&collector, Tier::Safety, SAFETY_IDS, 500)
            && all_arrived(&collector, Tier::Slo, SLO_IDS, 3_000)
            && all_arrived(&collector, Tier::Debug, DEBUG_IDS, 4_500)
    });
    let took = returned.elapsed();
    let wire = proxy.bytes_upstream() - wire_before;
    let reconnects = connections(&proxy) - connections_before;
    assert!(
        done,
        "the backlog did not drain within 200 s of the link's return; uplink: {}; log:\n{}",
        agent.uplink(),
        agent.log()
    );
    let total = proxy.bytes_upstream() - wire_start;
    assert!(
        wire >= 10_000_000,
        "{wire} bytes on the wire after the link returned ({total} in all)"
    );
    let backoff_min = Duration::from_millis(DEFAULT_BACKOFF_MIN_MS);
    let budget = Duration::from_secs_f64(1.2 * wire as f64 / CAP as f64) + backoff_min;
    eprintln!(
        "{wire} bytes on the wire after the link returned ({total} in all) took {took:?}; \
         budget {budget:?}; {reconnects} connections after the return"
    );
    assert!(
        took <= budget,
        "{wire} bytes took {took:?} after the link returned; at most {budget:?} allowed"
    );
    assert!(
        reconnects <= 2,
        "{reconnects} connections after the link returned"
    );
    let log = agent.log();
    assert!(!log.contains("lost track"), "log:\n{log}");
    // The status file kept being written throughout.
    let status = agent.status();
    let as_of = status["agent"]["as_of_unix_ms"].as_u64().unwrap();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(
        now_ms.saturating_sub(as_of) < 5_000,
        "status is stale: {status}"
    );
    // Everything delivered was deleted: nothing of the backlog is left.
    assert!(
        wait_until(Duration::from_secs(10), || {
            let status = agent.status();
            status["queue"]["tiers"][0]["records"].as_u64() == Some(0)
                && status["queue"]["tiers"][1]["records"].as_u64() == Some(0)
        }),
        "records left in the queue: {}",
        agent.status()["queue"]
    );
}

/// Mosquitto's `message_size_limit` answers a larger publish with PUBACK 0x95, which rumqttc
/// cannot decode, and closes the connection: it fails with the batch in flight. The agent halves
/// that batch, remembers the size the broker refused, and goes on. A batch the agent wrote behind
/// the refused one would meet the reset and hide the refusal (a bare link failure, the same
/// batches again on the next connection): the count of connections and refusals checks it never
/// does.
#[test]
fn a_broker_refusing_large_packets_gets_smaller_batches_not_a_reconnect_storm() {
    let broker = Mosquitto::start_with(MosquittoOptions {
        extra: vec!["message_size_limit 100000".into()],
        ..MosquittoOptions::default()
    })
    .unwrap();
    let proxy = FaultProxy::start(broker.addr()).unwrap();
    let collector = Collector::start(broker.addr()).unwrap();
    let agent = Agent::start(proxy.addr(), "truck-22", 0);
    // Every failure shows what both ends saw: the agent's log and the broker's account of the
    // agent's connections.
    let logs = || {
        format!(
            "agent log:\n{}\nbroker log of truck-22:\n{}",
            agent.log(),
            client_lines(&broker.log(), "truck-22", 300)
        )
    };
    // About 1 MB on the wire, in packaged batches of 256 KiB.
    agent.submit(Tier::Debug, DEBUG_IDS, 600, 2_600);
    let arrived = wait_until(Duration::from_secs(120), || {
        all_arrived(&collector, Tier::Debug, DEBUG_IDS, 600)
    });
    let connected = connections(&proxy);
    assert!(
        arrived,
        "{} of 600 arrived after {connected} connections; uplink: {}; {}",
        collector.ids(Tier::Debug).len(),
        agent.uplink(),
        logs()
    );
    // The status file (rewritten every second) reports the refusal.
    assert!(
        wait_until(Duration::from_secs(5), || {
            let uplink = agent.uplink();
            uplink["refused"].as_u64() >= Some(1)
                && uplink["last_refusal"]
                    .as_str()
                    .is_some_and(|text| text.contains("PacketTooLarge"))
        }),
        "uplink: {}; {}",
        agent.uplink(),
        logs()
    );
    let uplink = agent.uplink();
    eprintln!("600 events arrived over {connected} connections; uplink: {uplink}");
    // One connection, plus one per halving: 256 KiB, 128 KiB, then under the limit.
    assert!(
        connected <= 4,
        "{connected} connections; uplink: {uplink}; {}",
        logs()
    );
    assert_eq!(
        uplink["refused"].as_u64(),
        Some(connected - 1),
        "each refusal cost one connection; uplink: {uplink}; {}",
        logs()
    );
    assert_eq!(
        uplink["dead_lettered"],
        serde_json::json!([0, 0, 0]),
        "{}",
        logs()
    );
}

/// The last `lines` lines of a Mosquitto log about the client `id` (what it sent, what it was
/// answered, how its connections ended), without the copies sent on to subscribers.
fn client_lines(log: &str, id: &str, lines: usize) -> String {
    let about: Vec<&str> = log
        .lines()
        .filter(|line| line.contains(id) && !line.contains("Sending PUBLISH to"))
        .collect();
    about[about.len().saturating_sub(lines)..].join("\n")
}

/// Without a subscriber Mosquitto answers PUBACK 0x10: the records stay, the agent keeps its one
/// connection, retries with one record at a time, and waits longer after each refusal.
#[test]
fn a_broker_without_subscribers_sees_one_connection_and_growing_pauses() {
    let broker = Mosquitto::start().unwrap();
    let proxy = FaultProxy::start(broker.addr()).unwrap();
    let agent = Agent::start(proxy.addr(), "truck-23", 0);
    agent.submit(Tier::Safety, SAFETY_IDS, 200, 1_000);
    assert!(
        wait_until(Duration::from_secs(30), || agent.uplink()["no_subscribers"]
            .as_u64()
            .is_some_and(|n| n >= 1)),
        "no PUBACK 0x10 seen; log:\n{}",
        agent.log()
    );
    let start = Instant::now();
    let refusals_at_start = agent.uplink()["no_subscribers"].as_u64().unwrap();
    let bytes_at_start = proxy.bytes_upstream();
    std::thread::sleep(Duration::from_secs(60));
    let uplink = agent.uplink();
    let refusals = uplink["no_subscribers"].as_u64().unwrap() - refusals_at_start;
    let bytes = proxy.bytes_upstream() - bytes_at_start;
    let elapsed = start.elapsed();
    eprintln!(
        "in {elapsed:?}: {refusals} PUBACK 0x10, {bytes} bytes uploaded, {} connections in all; \
         uplink: {uplink}",
        connections(&proxy)
    );
    assert!(
        connections(&proxy) <= 1,
        "{} connections; uplink: {uplink}",
        connections(&proxy)
    );
    // Pauses double from 1 s (full jitter): at most a few rounds a minute, each one record of
    // about 1 kB (plus keepalives).
    assert!(
        refusals <= 12,
        "{refusals} refusals in {elapsed:?}; uplink: {uplink}"
    );
    assert!(
        bytes <= refusals.max(1) * 4_096,
        "{bytes} bytes uploaded for nobody in {elapsed:?} ({refusals} refusals)"
    );
    assert_eq!(
        agent.status()["queue"]["tiers"][0]["records"].as_u64(),
        Some(200),
        "nothing may be deleted"
    );
}

/// A link cut with batches in flight costs one reconnection, not a burst of them.
#[test]
fn a_link_cut_mid_drain_costs_one_reconnection() {
    let broker = Mosquitto::start().unwrap();
    let proxy = FaultProxy::start(broker.addr()).unwrap();
    let collector = Collector::start(broker.addr()).unwrap();
    let agent = Agent::start(proxy.addr(), "truck-24", 0);
    assert!(wait_until(Duration::from_secs(30), || {
        agent.uplink()["connected"].as_bool().unwrap_or(false)
    }));
    agent.submit(Tier::Debug, DEBUG_IDS, 20_000, 1_000);
    assert!(wait_until(Duration::from_secs(60), || collector.count() >= 2_000));
    let before = connections(&proxy);
    proxy.set(Fault::Reset);
    std::thread::sleep(Duration::from_secs(2));
    let cut_connections = connections(&proxy) - before;
    proxy.set(Fault::Pass);
    let before = connections(&proxy);
    assert!(
        wait_until(Duration::from_secs(120), || all_arrived(
            &collector,
            Tier::Debug,
            DEBUG_IDS,
            20_000
        )),
        "the drain did not finish; log:\n{}",
        agent.log()
    );
    let after = connections(&proxy) - before;
    // Attempts during the cut fail and back off (1 s, 2 s ...): a few, not a burst.
    assert!(
        cut_connections <= 3,
        "{cut_connections} connection attempts during a 2 s cut"
    );
    assert!(
        after <= 2,
        "{after} connections after one cut; log:\n{}",
        agent.log()
    );
    let log = agent.log();
    assert!(!log.contains("lost track"), "log:\n{log}");
}

/// Issue 15, item 3: the framing carries 512 KiB compressed; a batch size whose incompressible
/// batches cannot fit it is refused (up to 2 MiB used to be accepted).
#[test]
fn check_config_refuses_a_batch_size_the_framing_cannot_carry() {
    let dir = tempfile::tempdir().unwrap();
    let packaged = packaged_config(dir.path(), "127.0.0.1:1883".parse().unwrap(), "truck-25", 0);
    let output = check_config(&packaged);
    assert!(output.status.success(), "{output:?}");
    let text = packaged.replace(
        "bandwidth_bytes_per_s = 0",
        "bandwidth_bytes_per_s = 0\nmax_batch_bytes = 2097152",
    );
    let output = check_config(&text);
    assert_eq!(output.status.code(), Some(64), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("uplink.max_batch_bytes"), "{stderr}");
}
