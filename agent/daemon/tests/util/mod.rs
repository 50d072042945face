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

/// The packaged configuration, as installed.
pub const PACKAGED: &str = include_str!("../../config/agent.toml");

/// The packaged configuration with this run's paths, ids and broker, and `bandwidth` bytes/s
/// (0: the packaged "no cap"). Intervals, backoff, batch sizes and flush periods stay as shipped.
pub fn packaged_config(
    dir: &Path,
    broker: std::net::SocketAddr,
    machine: &str,
    bandwidth: u64,
) -> String {
    let replacements = [
        ("id = \"unprovisioned\"", format!("id = \"{machine}\"")),
        ("site = \"unassigned\"", "site = \"pit-3\"".to_owned()),
        (
            "dir = \"/var/lib/edgewatch-agent\"",
            format!("dir = \"{}\"", dir.join("queue").display()),
        ),
        (
            "host = \"broker.invalid\"",
            format!("host = \"{}\"", broker.ip()),
        ),
        ("port = 8883", format!("port = {}", broker.port())),
        (
            "#bandwidth_bytes_per_s = 0",
            format!("bandwidth_bytes_per_s = {bandwidth}"),
        ),
        (
            "socket = \"/run/edgewatch/agent.sock\"",
            format!("socket = \"{}\"", dir.join("agent.sock").display()),
        ),
        (
            "file = \"/run/edgewatch/agent-status.json\"",
            format!("file = \"{}\"", dir.join("agent-status.json").display()),
        ),
        (
            "#tegrastats = \"/usr/bin/tegrastats\"",
            format!(
                "tegrastats = \"{}\"\nsysfs_root = \"{}\"",
                dir.join("no-tegrastats").display(),
                dir.join("no-sysfs").display()
            ),
        ),
    ];
    let mut text = PACKAGED.to_owned();
    for (from, to) in replacements {
        text = replace_once(&text, from, &to);
    }
    text
}

/// `text` with the one occurrence of `from` replaced by `to`.
pub fn replace_once(text: &str, from: &str, to: &str) -> String {
    assert_eq!(
        text.matches(from).count(),
        1,
        "the configuration no longer holds `{from}` once"
    );
    text.replace(from, to)
}

impl Agent {
    /// An agent on the packaged configuration (see [`packaged_config`]), with `edits` (each
    /// `(from, to)` replacing text found once) applied on top.
    pub fn start_packaged(broker: SocketAddr, machine: &str, edits: &[(&str, &str)]) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("edgewatch-agent-test-")
            .tempdir()
            .unwrap();
        let mut text = packaged_config(dir.path(), broker, machine, 0);
        for (from, to) in edits {
            text = replace_once(&text, from, to);
        }
        let process =
            AgentProcess::start(Path::new(BIN), dir.path(), &text, Launch::new("info")).unwrap();
        let mut agent = Self {
            config: process.config(),
            socket: process.socket(),
            dir,
            process,
        };
        agent.wait_for_socket();
        agent
    }

    /// The queue directory.
    pub fn queue_dir(&self) -> PathBuf {
        self.dir.path().join("queue")
    }

    /// Sends SIGTERM without waiting.
    pub fn signal_term(&self) {
        self.process.signal(libc::SIGTERM);
    }

    /// Waits for the process to exit (after a signal), at most `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.process.exited() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

/// One record read back from a queue directory: its tier, sequence number and event.
#[derive(Debug, Clone)]
pub struct Stored {
    pub tier: Tier,
    pub seq: u64,
    pub event: Event,
}

/// Every record of the queue in `dir` (the agent must not be running), in tier order.
pub fn stored_records(dir: &Path) -> Vec<Stored> {
    let (mut queue, _) = edgewatch_queue::Queue::open(
        edgewatch_queue::RawQueueConfig::new(dir),
        std::time::SystemTime::now(),
    )
    .unwrap();
    let mut stored = Vec::new();
    while let Some(batch) = queue
        .next_batch(edgewatch_queue::BatchLimits::default())
        .unwrap()
    {
        let tier = batch.tier();
        for (seq, bytes) in batch.records() {
            stored.push(Stored {
                tier,
                seq,
                event: Event::decode(bytes).unwrap(),
            });
        }
    }
    stored
}

/// The `p` quantile (0..=1) of `values`, by the nearest rank.
pub fn quantile(values: &[Duration], p: f64) -> Duration {
    let mut sorted = values.to_vec();
    sorted.sort();
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// How a [`Producer`] submits.
#[derive(Debug, Clone, Copy)]
pub enum Pace {
    /// One submission at a time: the next is written when the reply to the last arrived.
    OneAtATime,
    /// Pipelined at this many submissions per second (one every 1/rate s, or a few every
    /// millisecond above 1,000/s), replies read as they come.
    PerSecond(u32),
    /// Pipelined as fast as the socket takes them.
    Flood,
}

/// One accepted submission: the event's id, the sequence number the reply named, how long the
/// reply took and when it arrived.
#[derive(Debug, Clone, Copy)]
pub struct Ack {
    pub id: i64,
    pub seq: u64,
    pub latency: Duration,
    pub at: Instant,
}

/// What a producer saw.
#[derive(Debug, Default)]
pub struct ProducerReport {
    pub tier: Option<Tier>,
    /// Accepted replies, in order.
    pub acked: Vec<Ack>,
    /// Refused replies: id and error.
    pub refused: Vec<(i64, String)>,
    /// Submissions written whose reply never came (connection lost or closed first).
    pub unanswered: Vec<i64>,
    /// Connections made.
    pub connections: u64,
}

/// A client thread submitting custom events with ids `first_id, first_id + 1, ...` to one tier,
/// until stopped or `limit` submissions were written; with `reconnect`, it connects again
/// whenever its connection is lost (an agent killed and restarted).
pub struct Producer {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<ProducerReport>>,
}

/// What a producer is told to do.
#[derive(Debug, Clone)]
pub struct ProducerSpec {
    pub socket: PathBuf,
    pub tier: Tier,
    pub first_id: i64,
    pub padding: usize,
    pub pace: Pace,
    pub limit: Option<u64>,
    pub reconnect: bool,
}

impl Producer {
    pub fn start(spec: ProducerSpec) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = std::sync::Arc::clone(&stop);
        let thread = std::thread::spawn(move || produce(&spec, &flag));
        Self {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops writing and returns what was seen (replies still due are waited for only while the
    /// connection stays open, at most 30 s).
    pub fn stop(mut self) -> ProducerReport {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.thread.take().unwrap().join().unwrap()
    }

    /// Waits for the producer to end by itself (its `limit` written and answered, or its
    /// connection closed without `reconnect`).
    pub fn join(mut self) -> ProducerReport {
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

fn produce(spec: &ProducerSpec, stop: &std::sync::atomic::AtomicBool) -> ProducerReport {
    use std::sync::atomic::Ordering;
    let mut report = ProducerReport {
        tier: Some(spec.tier),
        ..ProducerReport::default()
    };
    let mut next_id = spec.first_id;
    let end_id = spec.limit.map(|limit| spec.first_id + limit as i64);
    loop {
        if stop.load(Ordering::SeqCst) || end_id.is_some_and(|end| next_id >= end) {
            return report;
        }
        let stream = match UnixStream::connect(&spec.socket) {
            Ok(stream) => stream,
            Err(_) if spec.reconnect => {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            Err(error) => panic!("cannot connect to {}: {error}", spec.socket.display()),
        };
        report.connections += 1;
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        match spec.pace {
            Pace::OneAtATime => {
                one_at_a_time(spec, stop, stream, &mut next_id, end_id, &mut report)
            }
            Pace::PerSecond(_) | Pace::Flood => {
                pipelined(spec, stop, stream, &mut next_id, end_id, &mut report)
            }
        }
        if !spec.reconnect {
            return report;
        }
    }
}

fn submission_frame(tier: Tier, id: i64, padding: usize, out: &mut Vec<u8>) {
    let submission = LocalSubmission {
        tier: tier as i32,
        event: Some(test_event(id, padding)),
        ..LocalSubmission::default()
    };
    codec::encode_frame(&submission, out);
}

/// Reads one reply frame; `None` when the stream ended or failed.
fn read_reply(stream: &mut UnixStream, buf: &mut Vec<u8>) -> Option<LocalReply> {
    let mut chunk = [0u8; 4096];
    loop {
        if let Ok(codec::Frame::Complete { body, consumed }) = codec::next_frame(buf, 1024 * 1024) {
            let reply = LocalReply::decode(&buf[body]).unwrap();
            buf.drain(..consumed);
            return Some(reply);
        }
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

fn record(report: &mut ProducerReport, id: i64, sent: Instant, reply: LocalReply) {
    let now = Instant::now();
    if reply.accepted {
        report.acked.push(Ack {
            id,
            seq: reply.seq,
            latency: now - sent,
            at: now,
        });
    } else {
        report.refused.push((id, reply.error));
    }
}

fn one_at_a_time(
    spec: &ProducerSpec,
    stop: &std::sync::atomic::AtomicBool,
    mut stream: UnixStream,
    next_id: &mut i64,
    end_id: Option<i64>,
    report: &mut ProducerReport,
) {
    let mut out = Vec::new();
    let mut buf = Vec::new();
    while !stop.load(std::sync::atomic::Ordering::SeqCst) && end_id.is_none_or(|end| *next_id < end)
    {
        let id = *next_id;
        *next_id += 1;
        out.clear();
        submission_frame(spec.tier, id, spec.padding, &mut out);
        let sent = Instant::now();
        if stream.write_all(&out).is_err() {
            report.unanswered.push(id);
            return;
        }
        match read_reply(&mut stream, &mut buf) {
            Some(reply) => record(report, id, sent, reply),
            None => {
                report.unanswered.push(id);
                return;
            }
        }
    }
}

fn pipelined(
    spec: &ProducerSpec,
    stop: &std::sync::atomic::AtomicBool,
    stream: UnixStream,
    next_id: &mut i64,
    end_id: Option<i64>,
    report: &mut ProducerReport,
) {
    use std::collections::VecDeque;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let sent: Arc<Mutex<VecDeque<(i64, Instant)>>> = Arc::new(Mutex::new(VecDeque::new()));
    let writer_done = Arc::new(AtomicBool::new(false));
    let mut writer = stream.try_clone().unwrap();
    let first = *next_id;
    let written = std::thread::scope(|scope| {
        let sent_w = Arc::clone(&sent);
        let done = Arc::clone(&writer_done);
        let tier = spec.tier;
        let padding = spec.padding;
        let pace = spec.pace;
        let handle = scope.spawn(move || {
            let mut id = first;
            let mut out = Vec::new();
            // Ticks of 1 ms: the submissions are spread, as independent clients' would be.
            let tick = match pace {
                Pace::PerSecond(per_s) => {
                    Duration::from_secs_f64((per_s / 1000).max(1) as f64 / f64::from(per_s.max(1)))
                }
                _ => Duration::ZERO,
            };
            let mut next_tick = Instant::now();
            loop {
                if stop.load(Ordering::SeqCst) || end_id.is_some_and(|end| id >= end) {
                    break;
                }
                let count = match pace {
                    Pace::PerSecond(per_s) => (per_s / 1000).max(1) as i64,
                    _ => 64,
                };
                let count = end_id.map_or(count, |end| count.min(end - id));
                out.clear();
                for i in 0..count {
                    submission_frame(tier, id + i, padding, &mut out);
                }
                {
                    let now = Instant::now();
                    let mut sent = sent_w.lock().unwrap();
                    for i in 0..count {
                        sent.push_back((id + i, now));
                    }
                }
                id += count;
                if writer.write_all(&out).is_err() {
                    // The chunk's ids stay unanswered (some may have been read); they are never
                    // written again.
                    break;
                }
                if let Pace::PerSecond(_) = pace {
                    next_tick += tick;
                    let now = Instant::now();
                    if next_tick > now {
                        std::thread::sleep(next_tick - now);
                    }
                }
            }
            done.store(true, Ordering::SeqCst);
            id
        });
        let mut reader = stream;
        let mut buf = Vec::new();
        loop {
            let caught_up = sent.lock().unwrap().is_empty();
            if caught_up && writer_done.load(Ordering::SeqCst) {
                break;
            }
            if caught_up {
                // Nothing awaited yet: poll briefly so that the writer's end is seen.
                reader
                    .set_read_timeout(Some(Duration::from_millis(20)))
                    .unwrap();
            } else {
                reader
                    .set_read_timeout(Some(Duration::from_secs(30)))
                    .unwrap();
            }
            match read_reply(&mut reader, &mut buf) {
                Some(reply) => {
                    let (id, at) = sent
                        .lock()
                        .unwrap()
                        .pop_front()
                        .expect("a reply to nothing");
                    record(report, id, at, reply);
                }
                None if caught_up => {}
                None => break,
            }
        }
        let _ = reader.shutdown(std::net::Shutdown::Both);
        handle.join().unwrap()
    });
    *next_id = written;
    report
        .unanswered
        .extend(sent.lock().unwrap().drain(..).map(|(id, _)| id));
}

/// A reference for what the machine's other load does to a process scheduled as the packaged
/// agent is (`SCHED_IDLE`, the idle I/O class): a thread with the same scheduling that wakes
/// every 100 ms, writes a 4 KiB page and `fdatasync`s it in a directory on the agent's file
/// system, and keeps how late it finished against its deadline. A latency bound the agent cannot
/// keep on a loaded machine (its CPU and disk come after every other job's) adds the
/// reference's worst lateness in the same run: other jobs widen the bound, a quiet machine keeps
/// it tight, and the agent's own delays still count in full.
pub struct IdleReference {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Duration>,
}

impl IdleReference {
    /// Starts the reference thread, writing `dir/idle-reference`.
    pub fn start(dir: &Path) -> Self {
        use std::os::unix::fs::FileExt;
        use std::sync::atomic::Ordering;
        const PERIOD: Duration = Duration::from_millis(100);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let file = std::fs::File::create(dir.join("idle-reference")).unwrap();
        let stop_flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let param = libc::sched_param { sched_priority: 0 };
            // SAFETY: sets the calling thread's own policy; `param` outlives the call.
            let policy = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
            assert_eq!(policy, 0, "SCHED_IDLE refused");
            // ioprio_set(IOPRIO_WHO_PROCESS, this thread, IOPRIO_CLASS_IDLE << 13).
            // SAFETY: a plain system call on this thread's own I/O priority.
            let io = unsafe { libc::syscall(libc::SYS_ioprio_set, 1, 0, 3 << 13) };
            assert_eq!(io, 0, "the idle I/O class refused");
            let page = [0x5au8; 4096];
            let mut worst = Duration::ZERO;
            let mut deadline = Instant::now();
            while !stop_flag.load(Ordering::Relaxed) {
                deadline += PERIOD;
                std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
                file.write_all_at(&page, 0).unwrap();
                file.sync_data().unwrap();
                worst = worst.max(Instant::now().saturating_duration_since(deadline));
                // A deadline missed by more than a period is not retried: the next is in the future.
                deadline = deadline.max(Instant::now() - PERIOD);
            }
            worst
        });
        Self { stop, thread }
    }

    /// Stops the thread and returns its worst lateness.
    pub fn stop(self) -> Duration {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

/// How long the threads of process `pid` have waited on a run queue, runnable but not running,
/// since they started (the second field of `/proc/<pid>/task/<tid>/schedstat`, summed).
pub fn run_queue_wait(pid: u32) -> Duration {
    let mut nanos = 0u64;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let Ok(stat) = std::fs::read_to_string(task.unwrap().path().join("schedstat")) else {
            continue; // a thread that ended meanwhile
        };
        nanos += stat
            .split_whitespace()
            .nth(1)
            .and_then(|field| field.parse::<u64>().ok())
            .unwrap();
    }
    Duration::from_nanos(nanos)
}
