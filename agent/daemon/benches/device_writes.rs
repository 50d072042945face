//! Device bytes written per acknowledged event: what the agent's queue costs a machine's flash.
//!
//! Each case makes a fresh ext4 file system (`mkfs.ext4` defaults: a journal, as a distribution
//! installs it; inode tables and journal initialised at once, so that no background
//! initialisation writes during the measurement) on a 1 GiB image through a loop device of its own, mounts it, and runs the real
//! agent at the packaged default configuration with its queue directory on it (its log, socket
//! and status files stay elsewhere: on a machine they go to journald and `/run`). Once the agent
//! is connected to a real Mosquitto and has settled, the device's counters are read; a client
//! submits N events of one tier through the local socket at a steady rate; the bench waits until
//! a subscriber received all N and the agent's queue holds none of them (acknowledged by the
//! broker, then deleted), flushes the file system (`sync -f`, so that what the page cache still
//! held is counted) and reads the counters again: (sectors written, field 7 of
//! `/sys/block/loopN/stat`, × 512) / N. The idle case submits nothing for as long as the safety
//! case took: the agent's own writes (health and source reports) over the same time.
//!
//! `cargo bench -p edgewatch-agent --bench device_writes` (options: `WRITES_EVENTS` (1000) per
//! case, `WRITES_RATE` (50) submissions per second). Needs root, loop devices and e2fsprogs;
//! prints SKIP with the reason otherwise. Unmounts and detaches in every case, also on a panic.
#![allow(clippy::print_stdout, clippy::print_stderr, clippy::unwrap_used)]

#[path = "../tests/util/mod.rs"]
mod util;

use std::path::Path;
use std::time::{Duration, Instant};

use edgewatch_harness::agent::AgentProcess;
use edgewatch_harness::collector::{Collector, Keep};
use edgewatch_harness::mosquitto::Mosquitto;
use edgewatch_harness::process::Launch;
use edgewatch_proto::v1::{Tier, event};
use edgewatch_test_kit::loopfs::{self, LoopDevice, Mounted};
use rumqttc::v5::MqttOptions;
use rumqttc::v5::mqttbytes::QoS;
use util::{BIN, Pace, Producer, ProducerSpec};

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|_| "unknown".into())
}

/// What one case wrote.
struct Case {
    name: String,
    events: u64,
    window: Duration,
    bytes_written: u64,
    write_requests: u64,
}

/// The agent's `status --json`.
fn status(agent: &AgentProcess) -> serde_json::Value {
    agent
        .command(&["status", "--json"])
        .ok()
        .and_then(|out| serde_json::from_slice(&out.stdout).ok())
        .unwrap_or(serde_json::Value::Null)
}

/// Records of `tier` in the agent's queue, by its status (`None` while unknown).
fn queued(agent: &AgentProcess, tier: Tier) -> Option<u64> {
    let name = edgewatch_proto::tier::name(tier)?;
    status(agent)["queue"]["tiers"]
        .as_array()?
        .iter()
        .find(|t| t["tier"] == name)?["records"]
        .as_u64()
}

fn wait_until(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
    assert!(util::wait_until(timeout, &mut check), "timed out: {what}");
}

/// One case on a fresh file system: `tier` `None` submits nothing for `idle_window`.
fn case(
    broker: std::net::SocketAddr,
    tier: Option<Tier>,
    n: u64,
    rate: u32,
    idle_window: Duration,
) -> Case {
    let scratch = tempfile::Builder::new()
        .prefix("edgewatch-device-writes-")
        .tempdir()
        .unwrap();
    let image = scratch.path().join("ext4.img");
    loopfs::sparse_image(&image, 1 << 30).unwrap();
    // Declared before the mount, so that the mount is dropped (unmounted) first.
    let device = LoopDevice::attach(&image).unwrap();
    // Inode tables and journal initialised by mkfs: otherwise ext4 zeroes them in the background
    // after the mount (ext4lazyinit), writes that are no part of the agent's.
    let mount = Mounted::ext4(
        device.path(),
        &["-E", "lazy_itable_init=0,lazy_journal_init=0"],
        &scratch.path().join("mnt"),
        None,
    )
    .unwrap();
    let agent_dir = scratch.path().join("agent");
    std::fs::create_dir_all(&agent_dir).unwrap();
    let machine = format!(
        "writes-{}",
        tier.map_or("idle", |t| edgewatch_proto::tier::name(t).unwrap())
    );
    let config = util::replace_once(
        &util::packaged_config(&agent_dir, broker, &machine, 0),
        &format!("dir = \"{}\"", agent_dir.join("queue").display()),
        &format!("dir = \"{}\"", mount.dir().join("queue").display()),
    );
    let mut options = MqttOptions::new(
        format!("{machine}-collector"),
        broker.ip().to_string(),
        broker.port(),
    );
    options.set_max_packet_size(Some(2 * 1024 * 1024));
    options.set_keep_alive(Duration::from_secs(30));
    let collector = Collector::subscribe(
        options,
        QoS::AtLeastOnce,
        Keep::EventCount(|e| matches!(e.kind, Some(event::Kind::Custom(_)))),
    )
    .unwrap();
    let mut agent =
        AgentProcess::start(Path::new(BIN), &agent_dir, &config, Launch::new("warn")).unwrap();
    agent.wait_for_socket(Duration::from_secs(60)).unwrap();
    wait_until("the agent connects", Duration::from_secs(60), || {
        status(&agent)["agent"]["uplink"]["connected"].as_bool() == Some(true)
    });
    // Settled: the queue created, the first health report written and sent.
    std::thread::sleep(Duration::from_secs(3));
    mount.sync().unwrap();
    let before = device.stat().unwrap();
    let started = Instant::now();
    match tier {
        Some(tier) => {
            let report = Producer::start(ProducerSpec {
                socket: agent.socket(),
                tier,
                first_id: 1,
                padding: 100,
                pace: Pace::PerSecond(rate),
                limit: Some(n),
                reconnect: false,
            })
            .join();
            assert!(report.refused.is_empty(), "refused: {:?}", report.refused);
            assert_eq!(report.acked.len() as u64, n, "accepted submissions");
            wait_until(
                "every event at the subscriber",
                Duration::from_secs(120),
                || collector.events_counted() >= n,
            );
            assert_eq!(collector.events_counted(), n, "events at the subscriber");
            wait_until("the queue empty of them", Duration::from_secs(60), || {
                queued(&agent, tier) == Some(0)
            });
        }
        None => std::thread::sleep(idle_window),
    }
    mount.sync().unwrap();
    let window = started.elapsed();
    let after = device.stat().unwrap();
    agent.terminate(Duration::from_secs(60));
    drop(collector);
    drop(mount);
    drop(device);
    Case {
        name: tier.map_or("none (idle)".into(), |t| {
            edgewatch_proto::tier::name(t).unwrap().to_owned()
        }),
        events: if tier.is_some() { n } else { 0 },
        window,
        bytes_written: after.bytes_written() - before.bytes_written(),
        write_requests: after.writes - before.writes,
    }
}

fn main() {
    if std::env::args().any(|arg| arg == "--list") {
        return;
    }
    println!(
        "load average (1, 5, 15 min) at the start: {}",
        load_average()
    );
    if let Err(reason) = loopfs::prerequisites(&["mkfs.ext4", "sync"]) {
        println!("SKIP device writes per acknowledged event: {reason}");
        return;
    }
    let n = env_or("WRITES_EVENTS", 1000);
    let rate = env_or("WRITES_RATE", 50) as u32;
    let broker = Mosquitto::start().unwrap();
    let mut cases = Vec::new();
    for tier in [Tier::Safety, Tier::Slo, Tier::Debug] {
        cases.push(case(broker.addr(), Some(tier), n, rate, Duration::ZERO));
        eprintln!(
            "{}: {} bytes in {:.1} s, load {}",
            cases[cases.len() - 1].name,
            cases[cases.len() - 1].bytes_written,
            cases[cases.len() - 1].window.as_secs_f64(),
            load_average()
        );
    }
    let idle_window = cases[0].window;
    let idle = case(broker.addr(), None, n, rate, idle_window);
    let idle_per_s = idle.bytes_written as f64 / idle.window.as_secs_f64();
    println!(
        "\n| tier ({n} events at {rate}/s, 100-byte padding) | window | device bytes written (write requests) | bytes per acknowledged event | less the idle rate over the same window |"
    );
    println!("|---|---|---|---|---|");
    for case in cases.iter().chain([&idle]) {
        let per_event = |bytes: f64| {
            if case.events == 0 {
                "-".to_owned()
            } else {
                format!("{:.0}", bytes / case.events as f64)
            }
        };
        println!(
            "| {} | {:.1} s | {} ({}) | {} | {} |",
            case.name,
            case.window.as_secs_f64(),
            case.bytes_written,
            case.write_requests,
            per_event(case.bytes_written as f64),
            per_event(case.bytes_written as f64 - idle_per_s * case.window.as_secs_f64()),
        );
    }
    println!(
        "\nload average (1, 5, 15 min) at the end: {}",
        load_average()
    );
}
