//! Helpers for the agent's integration tests: the real `edgewatch-agent` binary as a child
//! process, a collector subscribed to the broker, and a pipelined local-socket client.
#![allow(dead_code, clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use edgewatch_agent::ingest::codec;
use edgewatch_proto::framing::decode_batch;
use edgewatch_proto::v1::{
    CustomEvent, Event, LocalReply, LocalSubmission, Tier, attribute, event,
};
use prost::Message;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::Packet;
use rumqttc::v5::{AsyncClient, Event as MqttEvent, MqttOptions};

pub const BIN: &str = env!("CARGO_BIN_EXE_edgewatch-agent");

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
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub socket: PathBuf,
    child: Option<Child>,
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
        let config = dir.path().join("agent.toml");
        std::fs::write(&config, Self::config_text(setup, dir.path())).unwrap();
        let socket = dir.path().join("agent.sock");
        let mut agent = Self {
            dir,
            config,
            socket,
            child: None,
        };
        agent.spawn();
        agent
    }

    /// Starts the process (again) on the same directory.
    pub fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("agent.log"))
            .unwrap();
        let child = Command::new(BIN)
            .args(["run", "--config"])
            .arg(&self.config)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        let socket = self.socket.clone();
        assert!(
            wait_until(Duration::from_secs(20), || UnixStream::connect(&socket)
                .is_ok()),
            "the agent's socket never appeared; log:\n{}",
            self.log()
        );
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// SIGKILL, then reap.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then wait for the exit status.
    pub fn terminate(&mut self) -> ExitStatus {
        let mut child = self.child.take().unwrap();
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        child.wait().unwrap()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("agent.log")).unwrap_or_default()
    }

    /// `edgewatch-agent status --json`, parsed.
    pub fn status(&self) -> serde_json::Value {
        let output = Command::new(BIN)
            .args(["status", "--json", "--config"])
            .arg(&self.config)
            .output()
            .unwrap();
        serde_json::from_slice(&output.stdout).unwrap_or(serde_json::Value::Null)
    }

    pub fn uplink_connected(&self) -> bool {
        self.status()["agent"]["uplink"]["connected"].as_bool() == Some(true)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One event as received by the collector.
#[derive(Debug, Clone)]
pub struct Received {
    pub topic: String,
    pub tier: Tier,
    pub epoch: u64,
    pub seq: u64,
    pub event: Event,
}

/// A retained status message: topic and payload.
pub type StatusMessage = (String, Vec<u8>);

/// A subscriber on `edgewatch/v1/#` with a persistent session, decoding every batch.
pub struct Collector {
    pub received: Arc<Mutex<Vec<Received>>>,
    pub statuses: Arc<Mutex<Vec<StatusMessage>>>,
    pub undecodable: Arc<Mutex<u64>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Collector {
    pub fn start(broker: SocketAddr) -> Self {
        Self::start_with(broker, |_| {})
    }

    pub fn start_with(broker: SocketAddr, configure: impl FnOnce(&mut MqttOptions)) -> Self {
        let received = Arc::new(Mutex::new(Vec::new()));
        let statuses = Arc::new(Mutex::new(Vec::new()));
        let undecodable = Arc::new(Mutex::new(0));
        let mut options = MqttOptions::new("collector", broker.ip().to_string(), broker.port());
        options.set_keep_alive(Duration::from_secs(5));
        options.set_clean_start(false);
        options.set_session_expiry_interval(Some(3600));
        options.set_max_packet_size(Some(2 * 1024 * 1024));
        configure(&mut options);
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (r, s, u) = (
            Arc::clone(&received),
            Arc::clone(&statuses),
            Arc::clone(&undecodable),
        );
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let (client, mut events) = AsyncClient::new(options, 64);
                let mut ready = Some(ready_tx);
                loop {
                    let event = tokio::select! {
                        event = events.poll() => event,
                        _ = &mut stopped => return,
                    };
                    match event {
                        Ok(MqttEvent::Incoming(Packet::ConnAck(_))) => {
                            let _ = client.try_subscribe("edgewatch/v1/#", QoS::AtLeastOnce);
                        }
                        Ok(MqttEvent::Incoming(Packet::SubAck(_))) => {
                            if let Some(ready) = ready.take() {
                                let _ = ready.send(());
                            }
                        }
                        Ok(MqttEvent::Incoming(Packet::Publish(publish))) => {
                            let topic = String::from_utf8_lossy(&publish.topic).into_owned();
                            if topic.ends_with("/status") {
                                s.lock().unwrap().push((topic, publish.payload.to_vec()));
                                continue;
                            }
                            match decode_batch(&publish.payload) {
                                Ok(batch) => {
                                    let mut received = r.lock().unwrap();
                                    let tier = batch.tier();
                                    for event in batch.events {
                                        received.push(Received {
                                            topic: topic.clone(),
                                            tier,
                                            epoch: batch.agent_epoch,
                                            seq: event.seq,
                                            event,
                                        });
                                    }
                                }
                                Err(_) => *u.lock().unwrap() += 1,
                            }
                        }
                        Ok(_) => {}
                        Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                    }
                }
            });
        });
        ready_rx
            .recv_timeout(Duration::from_secs(15))
            .expect("collector never subscribed");
        Self {
            received,
            statuses,
            undecodable,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    pub fn count(&self) -> usize {
        self.received.lock().unwrap().len()
    }

    /// Distinct (tier, epoch, seq) received.
    pub fn distinct(&self) -> std::collections::BTreeSet<(i32, u64, u64)> {
        self.received
            .lock()
            .unwrap()
            .iter()
            .map(|r| (r.tier as i32, r.epoch, r.seq))
            .collect()
    }

    /// Custom events received with the given name attribute `id`, by tier.
    pub fn ids(&self, tier: Tier) -> Vec<i64> {
        self.received
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.tier == tier)
            .filter_map(|r| test_id(&r.event))
            .collect()
    }

    pub fn snapshot(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A custom event carrying a numeric `id` attribute and `padding` bytes of text.
pub fn test_event(id: i64, padding: usize) -> Event {
    let mut attributes = vec![edgewatch_proto::v1::Attribute {
        key: "id".into(),
        value: Some(attribute::Value::IntValue(id)),
    }];
    if padding > 0 {
        // Pseudo-random text compresses about as badly as real sensor dumps.
        let mut state = id as u64 ^ 0x9e37_79b9_7f4a_7c15;
        let text: String = (0..padding)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                char::from(b'a' + (state % 26) as u8)
            })
            .collect();
        attributes.push(edgewatch_proto::v1::Attribute {
            key: "padding".into(),
            value: Some(attribute::Value::StringValue(text)),
        });
    }
    Event {
        kind: Some(event::Kind::Custom(CustomEvent {
            name: "test".into(),
            attributes,
        })),
        ..Event::default()
    }
}

/// The `id` attribute of a test event.
pub fn test_id(event: &Event) -> Option<i64> {
    let Some(event::Kind::Custom(custom)) = &event.kind else {
        return None;
    };
    custom
        .attributes
        .iter()
        .find_map(|a| match (&a.key[..], &a.value) {
            ("id", Some(attribute::Value::IntValue(id))) => Some(*id),
            _ => None,
        })
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
