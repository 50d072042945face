//! The agent as operators use it: configuration checks, placement, SIGTERM, `status`, `emit`,
//! and the local socket under a burst and under garbage.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

mod util;

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::time::Duration;

use edgewatch_harness::mosquitto::Mosquitto;
use edgewatch_proto::v1::{Tier, event};
use util::{Agent, AgentSetup, BIN, Collector, check_config, submit_all, test_event, wait_until};

#[test]
fn check_config_accepts_a_valid_file_and_exits_64_naming_a_bad_key() {
    let dir = tempfile::tempdir().unwrap();
    let setup = AgentSetup::new("127.0.0.1:1883".parse().unwrap());
    let good = Agent::config_text(&setup, dir.path());
    let output = check_config(&good);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    let unknown = good.replace("[uplink]", "[uplink]\nkeepalive_seconds = 5");
    let output = check_config(&unknown);
    assert_eq!(output.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("uplink.keepalive_seconds"), "{stderr}");

    let out_of_range = good.replace("keepalive_s = 5", "keepalive_s = 1");
    let output = check_config(&out_of_range);
    assert_eq!(output.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&output.stderr).contains("uplink.keepalive_s"));

    let overlap = good.replace(
        "[scheduling]",
        "[scheduling]\ncores = [0]\ncontrol_loop_cores = [0]",
    );
    let output = check_config(&overlap);
    assert_eq!(output.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&output.stderr).contains("scheduling.cores"));
}

#[test]
fn run_with_a_bad_config_exits_64_before_doing_anything() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.toml");
    std::fs::write(&path, "[machine]\nid = \"m\"\n").unwrap();
    let output = Command::new(BIN)
        .args(["run", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(64));
    assert!(std::fs::read_dir(dir.path()).unwrap().count() == 1);
}

fn proc_stat_policy(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which ends with ')'); policy is field 41.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    rest.split(' ').nth(41 - 3).unwrap().parse().unwrap()
}

#[test]
fn the_agent_pins_itself_runs_sched_idle_serves_and_exits_zero_on_sigterm() {
    let broker = Mosquitto::start().unwrap();
    let mut setup = AgentSetup::new(broker.addr());
    let last_core = std::thread::available_parallelism().unwrap().get() - 1;
    setup.extra = String::new();
    let dir = tempfile::Builder::new()
        .prefix("edgewatch-agent-test-")
        .tempdir()
        .unwrap();
    let text = Agent::config_text(&setup, dir.path()).replace(
        "[scheduling]\nidle_priority = false",
        &format!(
            "[scheduling]\ncores = [0]\ncontrol_loop_cores = [{last_core}]\nidle_priority = true"
        ),
    );
    let config = dir.path().join("agent.toml");
    std::fs::write(&config, text).unwrap();
    let mut child = Command::new(BIN)
        .args(["run", "--config"])
        .arg(&config)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let socket = dir.path().join("agent.sock");
    assert!(wait_until(Duration::from_secs(20), || UnixStream::connect(
        &socket
    )
    .is_ok()));

    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
    let allowed = status
        .lines()
        .find_map(|line| line.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim()
        .to_owned();
    assert_eq!(allowed, "0");
    assert_eq!(proc_stat_policy(child.id()), libc::SCHED_IDLE as u32);
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o660);

    // SAFETY: kill(2) on our child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let exit = child.wait().unwrap();
    assert_eq!(exit.code(), Some(0));
    assert!(!socket.exists(), "the socket was left behind");
}

#[test]
fn status_reports_queue_uplink_and_staleness_without_touching_the_agent() {
    let broker = Mosquitto::start().unwrap();
    // Someone must subscribe: without one the broker answers "no subscribers" and the agent
    // backs off.
    let collector = Collector::start(broker.addr()).unwrap();
    let mut agent = Agent::start(&AgentSetup::new(broker.addr()));
    submit_all(
        &agent.socket,
        (0..10)
            .map(|id| (Tier::Debug, test_event(id, 10)))
            .collect(),
    );
    assert!(wait_until(Duration::from_secs(10), || {
        agent.status()["agent"]["uplink"]["connected"].as_bool() == Some(true)
    }));
    let output = Command::new(BIN)
        .args(["status", "--config"])
        .arg(&agent.config)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{text}");
    for needle in [
        "agent: running",
        "uplink: connected",
        "safety",
        "slo",
        "debug",
        "offline window",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    let json = agent.status();
    assert_eq!(json["queue"]["tiers"].as_array().unwrap().len(), 3);
    // The agent reports its own health upstream at start (then every minute), in the SLO tier.
    assert!(wait_until(Duration::from_secs(10), || {
        collector.snapshot().iter().any(|r| {
            r.tier == Tier::Slo
                && matches!(&r.event.kind, Some(event::Kind::AgentHealth(h)) if h.rss_bytes > 0 && h.tiers.len() == 3)
        })
    }));
    assert!(wait_until(Duration::from_secs(5), || {
        agent.status()["agent"]["ingest"]["accepted"].as_u64() >= Some(10)
    }));

    agent.terminate();
    std::thread::sleep(super_stale());
    let output = Command::new(BIN)
        .args(["status", "--config"])
        .arg(&agent.config)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&output.stdout).contains("agent: not running"));
}

fn super_stale() -> Duration {
    edgewatch_agent::status::STALE_AFTER + Duration::from_secs(1)
}

#[test]
fn emit_and_a_burst_of_100000_submissions_all_arrive() {
    let broker = Mosquitto::start().unwrap();
    let collector = Collector::start(broker.addr()).unwrap();
    let agent = Agent::start(&AgentSetup::new(broker.addr()));

    let output = Command::new(BIN)
        .args(["emit", "--config"])
        .arg(&agent.config)
        .args([
            "--tier",
            "safety",
            "--kind",
            "intervention",
            "--attr",
            "reason=obstacle",
            "--attr",
            "mode=autonomous",
        ])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("accepted: safety seq"));

    let burst = 100_000;
    let replies = submit_all(
        &agent.socket,
        (0..burst)
            .map(|id| (Tier::Slo, test_event(id, 0)))
            .collect(),
    );
    assert_eq!(replies.len(), burst as usize);
    assert!(replies.iter().all(|reply| reply.accepted));
    let seqs: Vec<u64> = replies.iter().map(|reply| reply.seq).collect();
    assert!(
        seqs.windows(2).all(|pair| pair[1] > pair[0]),
        "sequence numbers not increasing"
    );

    assert!(
        wait_until(Duration::from_secs(120), || {
            let ids: std::collections::BTreeSet<i64> =
                collector.ids(Tier::Slo).into_iter().collect();
            ids.len() == burst as usize
        }),
        "only {} of {burst} arrived",
        collector.ids(Tier::Slo).len()
    );
    let interventions = collector
        .snapshot()
        .into_iter()
        .filter(|r| matches!(&r.event.kind, Some(event::Kind::Intervention(i)) if i.reason == "obstacle"))
        .count();
    assert!(interventions >= 1);
}

#[test]
fn garbage_on_the_socket_is_rejected_and_counted_and_the_agent_keeps_serving() {
    let broker = Mosquitto::start().unwrap();
    let agent = Agent::start(&AgentSetup::new(broker.addr()));

    // A valid frame holding something that is not a submission: refused with a reply.
    let mut stream = UnixStream::connect(&agent.socket).unwrap();
    stream
        .write_all(&[5, 0xff, 0xff, 0xff, 0xff, 0xff])
        .unwrap();
    let mut reply = [0u8; 256];
    let n = stream.read(&mut reply).unwrap();
    assert!(n > 0);

    // An agent-only kind submitted locally: refused.
    let forged = edgewatch_proto::v1::Event {
        kind: Some(event::Kind::QueueLoss(Default::default())),
        ..Default::default()
    };
    let replies = submit_all(&agent.socket, vec![(Tier::Safety, forged)]);
    assert!(!replies[0].accepted);
    assert!(
        replies[0].error.contains("queue_loss"),
        "{}",
        replies[0].error
    );

    // A length prefix far above the limit: the connection is closed.
    let mut stream = UnixStream::connect(&agent.socket).unwrap();
    stream.write_all(&[0xff, 0xff, 0xff, 0x7f]).unwrap();
    let mut sink = Vec::new();
    let _ = stream.read_to_end(&mut sink);

    // Random bytes.
    let mut stream = UnixStream::connect(&agent.socket).unwrap();
    let noise: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let _ = stream.write_all(&noise);
    drop(stream);

    // Still serving.
    let replies = submit_all(&agent.socket, vec![(Tier::Debug, test_event(1, 0))]);
    assert!(replies[0].accepted);
    assert!(wait_until(Duration::from_secs(5), || {
        agent.status()["agent"]["ingest"]["rejected"].as_u64() >= Some(3)
    }));
}

#[test]
fn an_agent_at_the_packaged_configuration_rewrites_no_status_in_its_queue_directory() {
    // Both status files are rewritten every second; packaged, they live in `/run` (tmpfs) and
    // the queue directory on the flash holds only the store. Here `/run` is the test's directory.
    use edgewatch_harness::agent::AgentProcess;
    use edgewatch_harness::process::Launch;
    let broker = Mosquitto::start().unwrap();
    let _collector = Collector::start(broker.addr()).unwrap();
    let dir = tempfile::Builder::new()
        .prefix("edgewatch-agent-test-")
        .tempdir()
        .unwrap();
    let config = util::packaged_config(dir.path(), broker.addr(), "truck-17", 0);
    let mut agent = AgentProcess::start(
        std::path::Path::new(BIN),
        dir.path(),
        &config,
        Launch::new("info"),
    )
    .unwrap();
    agent.wait_for_socket(Duration::from_secs(20)).unwrap();
    let status = || -> serde_json::Value {
        let output = agent.command(&["status", "--json"]).unwrap();
        serde_json::from_slice(&output.stdout).unwrap_or(serde_json::Value::Null)
    };
    assert!(
        wait_until(Duration::from_secs(20), || {
            status()["agent_running"] == true && status()["queue"]["tiers"].is_array()
        }),
        "no status with the queue's: {}\n{}",
        status(),
        agent.log()
    );
    // Several rewrites of both.
    std::thread::sleep(Duration::from_secs(3));
    let mut in_queue_dir: Vec<String> = std::fs::read_dir(dir.path().join("queue"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    in_queue_dir.sort();
    assert_eq!(in_queue_dir, ["queue.log"], "{}", agent.log());
    // What `status` shows of the queue is the snapshot beside the agent's status file.
    let shown = status();
    let snapshot = edgewatch_queue::read_snapshot(&dir.path().join("queue-status")).unwrap();
    assert_eq!(shown["queue"]["epoch"].as_u64(), Some(snapshot.epoch));
    assert_ne!(snapshot.epoch, 0);
}
