//! Helpers for the agent's integration tests: the real `edgewatch-agent` binary run from the
//! configuration the tests vary (`edgewatch_harness::agent`), the harness's collector subscribed
//! to the broker, and a pipelined local-socket client.
#![allow(dead_code, clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

use edgewatch_agent::ingest::codec;
use edgewatch_harness::agent::AgentProcess;
use edgewatch_harness::events::custom_event;
use edgewatch_harness::process::Launch;
use edgewatch_proto::v1::{Event, LocalReply, LocalSubmission, Tier};
use prost::Message;

// Not every test binary uses every re-export.
#[allow(unused_imports)]
pub use edgewatch_harness::collector::{Collector, Received};
#[allow(unused_imports)]
pub use edgewatch_harness::events::event_id as test_id;

pub const BIN: &str = env!("CARGO_BIN_EXE_edgewatch-agent");

/// `edgewatch-agent check-config` on a file holding `text`.
pub fn check_config(text: &str) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.toml");
    std::fs::write(&path, text).unwrap();
    Command::new(BIN)
        .args(["check-config", "--config"])
        .arg(&path)
        .output()
        .unwrap()
}

/// Polls `check` until it is true or `timeout` passes.
pub fn wait_until(timeout: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    check()
}

/// Settings tests vary; the rest of the configuration is fixed.
pub struct AgentSetup {
    pub machine: String,
    pub site: String,
    pub broker: SocketAddr,
    pub keepalive_s: u64,
    pub bandwidth_bytes_per_s: u64,
    pub extra_uplink: String,
    pub extra: String,
    /// The `[thermal]` table; by default no tegrastats and an empty sysfs tree.
    pub thermal: String,
}

impl AgentSetup {
    pub fn new(broker: SocketAddr) -> Self {
        Self {
            machine: "truck-17".into(),
            site: "pit-3".into(),
            broker,
            keepalive_s: 5,
            bandwidth_bytes_per_s: 0,
            extra_uplink: String::new(),
            extra: String::new(),
            thermal: "tegrastats_enabled = false\nsysfs_root = \"{dir}/no-sysfs\"\n".into(),
        }
    }
}

/// A real agent process with its own directory (config, queue, socket, status).
pub struct Agent {
    /// Declared first, so the agent is killed before its directory is removed.
    process: AgentProcess,
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub socket: PathBuf,
}

impl Agent {
    pub fn config_text(setup: &AgentSetup, dir: &Path) -> String {
        format!(
            r#"
[machine]
id = "{machine}"
site = "{site}"
class = "haul-truck"

[queue]
dir = "{queue}"
budget_bytes = 268435456
bulk_flush_ms = 200

[uplink]
host = "{host}"
port = {port}
keepalive_s = {keepalive}
backoff_min_ms = 100
backoff_max_ms = 1000
initial_delay_max_ms = 0
bandwidth_bytes_per_s = {bandwidth}
{extra_uplink}

[scheduling]
idle_priority = false

[ingest]
socket = "{socket}"

[thermal]
{thermal}
{extra}
"#,
            machine = setup.machine,
            site = setup.site,
            queue = dir.join("queue").display(),
            host = setup.broker.ip(),
            port = setup.broker.port(),
            keepalive = setup.keepalive_s,
            bandwidth = setup.bandwidth_bytes_per_s,
            extra_uplink = setup.extra_uplink,
            socket = dir.join("agent.sock").display(),
            thermal = setup.thermal.replace("{dir}", &dir.display().to_string()),
            extra = setup.extra,
        )
    }

    /// Writes the configuration and starts the agent; waits for its socket.
    pub fn start(setup: &AgentSetup) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("edgewatch-agent-test-")
            .tempdir()
            .unwrap();
        let process = AgentProcess::start(
            Path::new(BIN),
            dir.path(),
            &Self::config_text(setup, dir.path()),
            Launch::new("info"),
        )
        .unwrap();
        let mut agent = Self {
            config: process.config(),
            socket: process.socket(),
            dir,
            process,
        };
        agent.wait_for_socket();
        agent
    }

    /// Starts the process (again) on the same directory.
    pub fn spawn(&mut self) {
        self.process.respawn().unwrap();
        self.wait_for_socket();
    }

    fn wait_for_socket(&mut self) {
        let ready = self.process.wait_for_socket(Duration::from_secs(20));
        assert!(
            ready.is_ok(),
            "the agent's socket never appeared; log:\n{}",
            self.log()
        );
    }

    pub fn pid(&self) -> u32 {
        self.process.pid().unwrap()
    }

    /// SIGKILL, then reap.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// SIGTERM, then wait for the exit status.
    pub fn terminate(&mut self) -> ExitStatus {
        self.process
            .terminate(Duration::from_secs(60))
            .status()
            .unwrap()
    }

    pub fn log(&self) -> String {
        self.process.log()
    }

    /// `edgewatch-agent status --json`, parsed.
    pub fn status(&self) -> serde_json::Value {
        let output = self.process.command(&["status", "--json"]).unwrap();
        serde_json::from_slice(&output.stdout).unwrap_or(serde_json::Value::Null)
    }

    pub fn uplink_connected(&self) -> bool {
        self.status()["agent"]["uplink"]["connected"].as_bool() == Some(true)
    }
}

/// A custom event carrying a numeric `id` attribute and `padding` bytes of text.
pub fn test_event(id: i64, padding: usize) -> Event {
    custom_event("test", id, padding)
}

/// Submits events over one connection, pipelined; returns each reply in order.
pub fn submit_all(socket: &Path, submissions: Vec<(Tier, Event)>) -> Vec<LocalReply> {
    let stream = UnixStream::connect(socket).unwrap();
    let mut writer = stream.try_clone().unwrap();
    let count = submissions.len();
    let feeder = std::thread::spawn(move || {
        let mut out = Vec::with_capacity(64 * 1024);
        for (tier, event) in submissions {
            let submission = LocalSubmission {
                tier: tier as i32,
                event: Some(event),
                ..LocalSubmission::default()
            };
            codec::encode_frame(&submission, &mut out);
            if out.len() > 32 * 1024 {
                writer.write_all(&out).unwrap();
                out.clear();
            }
        }
        writer.write_all(&out).unwrap();
    });
    let mut reader = stream;
    reader
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut replies = Vec::with_capacity(count);
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    while replies.len() < count {
        let n = reader.read(&mut chunk).unwrap();
        assert!(
            n > 0,
            "the agent closed the connection after {} replies",
            replies.len()
        );
        buf.extend_from_slice(&chunk[..n]);
        let mut offset = 0;
        while let Ok(codec::Frame::Complete { body, consumed }) =
            codec::next_frame(&buf[offset..], 1024 * 1024)
        {
            replies.push(LocalReply::decode(&buf[offset + body.start..offset + body.end]).unwrap());
            offset += consumed;
        }
        buf.drain(..offset);
    }
    feeder.join().unwrap();
    replies
}
