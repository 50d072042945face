//! Drain benchmark: how fast the real agent empties a backlog into a real Mosquitto and how much
//! memory it takes, against a bare rumqttc QoS 1 publisher sending the same batches with no disk,
//! in the same run. Two backlogs: 200,000 events, and about 1 GiB of events.
//!
//! `cargo bench -p edgewatch-agent --bench drain` (options: `DRAIN_EVENTS` (200000) and
//! `DRAIN_ROUNDS` (3) for the first backlog; `DRAIN_BIG_BYTES` (1 GiB of encoded events, 0 skips
//! it) and `DRAIN_BIG_ROUNDS` (1) for the second).
//!
//! The backlog goes in as a machine's would: through the agent's local socket while the broker
//! is unreachable (the link blackholed at the fault proxy). The agent is then restarted, as a
//! machine rebooting after days offline, and its link opened; its memory is measured from that
//! start (`VmHWM` at the end, and `VmRSS` sampled every 10 ms). Nothing here opens the queue's
//! files, so the bench measures whichever queue backend is in the tree. The bench's agent has a
//! 4 GiB queue budget (the packaged default, 512 MiB, would evict most of a 1 GiB backlog) and
//! an ingest rate of 1,000,000 per tier (the default, 20,000/s, would make the fill slow); the
//! rest is as shipped. Its files are under the system's temporary directory, deleted at the end.
//!
//! Profiling: `DRAIN_SMAPS=1` prints where the draining agent's resident memory is (by mapping,
//! from `/proc/<pid>/smaps`) at the end of each drain; `DRAIN_AGENT_ENV` sets variables of the
//! draining agent, e.g. `"LD_PRELOAD=/usr/lib/heaptrack/libheaptrack_preload.so
//! DUMP_HEAPTRACK_OUTPUT=/tmp/drain.heaptrack.raw"` (then `heaptrack_interpret < raw | gzip >
//! drain.heaptrack.gz; heaptrack_print drain.heaptrack.gz`).
//!
//! Prints `/proc/loadavg` and the free space at the start and end of each backlog, and a
//! Markdown table per backlog: events/s (median of rounds) for both sides, the ratio, wire bytes
//! per event, the agent's CPU seconds and peak RSS during the drain, and compression per tier.
#![allow(clippy::print_stdout, clippy::print_stderr, clippy::unwrap_used)]

use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use edgewatch_agent::ingest::codec;

use edgewatch_harness::agent::AgentProcess;
use edgewatch_harness::collector::{Collector, Keep};
use edgewatch_harness::mosquitto::Mosquitto;
use edgewatch_harness::process::Launch;
use edgewatch_harness::proxy::{Fault, FaultProxy};
use edgewatch_proto::framing::{BatchEncoder, DEFAULT_COMPRESSION_LEVEL, MAX_COMPRESSED_BYTES};
use edgewatch_proto::v1::{
    Attribute, Batch, CustomEvent, Event, LocalReply, LocalSubmission, Tier, attribute, event,
};
use prost::Message;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::Packet;
use rumqttc::v5::{AsyncClient, Event as MqttEvent, MqttOptions};

const BIN: &str = env!("CARGO_BIN_EXE_edgewatch-agent");

/// How the draining agent is launched: with the variables of `DRAIN_AGENT_ENV` (space-separated
/// `KEY=VALUE` pairs), for a profiler's preload library.
fn drain_launch() -> Launch {
    let mut launch = Launch::new("warn");
    let vars = std::env::var("DRAIN_AGENT_ENV").unwrap_or_default();
    for (key, value) in vars.split_whitespace().filter_map(|kv| kv.split_once('=')) {
        launch = launch.env(key, value);
    }
    launch
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn unix_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
}

fn int(key: &str, value: u64) -> Attribute {
    Attribute {
        key: key.into(),
        value: Some(attribute::Value::IntValue(value as i64)),
    }
}

fn float(key: &str, value: f64) -> Attribute {
    Attribute {
        key: key.into(),
        value: Some(attribute::Value::DoubleValue(value)),
    }
}

fn text(key: &str, value: &str) -> Attribute {
    Attribute {
        key: key.into(),
        value: Some(attribute::Value::StringValue(value.into())),
    }
}

/// A realistic event of each tier, with the fields of what the agent's samplers make: a miss
/// burst (safety), deadline counters (SLO), a raw thermal sample (debug). The local socket takes
/// only the kinds applications submit, so each is a custom event carrying those fields as
/// attributes.
fn realistic(tier: Tier, i: u64) -> Event {
    let source = [
        int("loop_id", 1),
        text("loop_name", "planner"),
        text("model", "haul-perception"),
        text("model_version", "4.2.1"),
    ];
    let (name, attributes): (&str, Vec<Attribute>) = match tier {
        Tier::Safety => (
            "deadline_miss_burst",
            source
                .into_iter()
                .chain([
                    int("rule", 1),
                    int("misses", 3),
                    int("window_cycles", 3),
                    int("first_cycle", i * 100),
                    int("last_cycle", i * 100 + 2),
                    int("worst_duration_ns", 41_000_000 + i % 1000),
                    int("mode", 1),
                ])
                .collect(),
        ),
        Tier::Slo => (
            "deadline_counters",
            source
                .into_iter()
                .chain([
                    int("start_time_unix_ns", 1_764_000_000_000_000_000),
                    int("producer_epoch", 7),
                    int("period_ns", 40_000_000),
                    int("budget_ns", 40_000_000),
                    int("cycles", 250 * i),
                    int("misses", i / 50),
                    int("skipped", i / 500),
                    int("sum_duration_ns", 250 * i * 20_000_000),
                    int("max_duration_ns", 45_000_000),
                ])
                .chain(
                    [10, 20, 30, 36, 40, 44, 0]
                        .iter()
                        .zip([10 * i, 200 * i, 35 * i, 4 * i, i, i / 50, i / 100])
                        .map(|(le_ms, count)| int(&format!("le_{le_ms}ms"), count)),
                )
                .collect(),
        ),
        _ => (
            "thermal_sample",
            ["cpu", "gpu", "soc0", "soc1", "soc2", "tj"]
                .iter()
                .enumerate()
                .map(|(z, zone)| {
                    float(
                        &format!("{zone}_celsius"),
                        45.0 + ((i + z as u64) % 13) as f64 * 0.531,
                    )
                })
                .chain(
                    ["VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0"]
                        .iter()
                        .enumerate()
                        .flat_map(|(r, rail)| {
                            [
                                float(
                                    &format!("{rail}_mw"),
                                    3000.0 + ((i * 7 + r as u64) % 400) as f64,
                                ),
                                float(&format!("{rail}_avg_mw"), 3100.0 + r as f64),
                            ]
                        }),
                )
                .chain((0..8).map(|c| float(&format!("cpu{c}_load_pct"), ((i + c) % 60) as f64)))
                .chain([
                    int("cpu_freq_mhz", 1190),
                    float("gpu_load_pct", (i % 99) as f64),
                    int("gpu_freq_mhz", 624),
                    int("emc_freq_mhz", 2133),
                    int("ram_used_mb", 5120 + i % 64),
                    int("ram_total_mb", 15_656),
                ])
                .collect(),
        ),
    };
    Event {
        seq: 0,
        event_time_unix_ns: 1_764_500_000_000_000_000 + i as i64 * 10_000_000,
        monotonic_ns: i * 10_000_000,
        kind: Some(event::Kind::Custom(CustomEvent {
            name: name.into(),
            attributes,
        })),
    }
}

/// 10 % safety, 30 % SLO, 60 % debug.
fn tier_of(i: u64) -> Tier {
    match i % 10 {
        0 => Tier::Safety,
        1..=3 => Tier::Slo,
        _ => Tier::Debug,
    }
}

/// Counts the backlog's events (the custom ones) arriving on `edgewatch/v1/#`: the agent's own
/// health reports are not part of it.
fn collector(broker: std::net::SocketAddr, name: &str) -> Collector {
    let mut options = MqttOptions::new(name, broker.ip().to_string(), broker.port());
    options.set_max_packet_size(Some(2 * 1024 * 1024));
    options.set_keep_alive(Duration::from_secs(30));
    Collector::subscribe(
        options,
        QoS::AtLeastOnce,
        Keep::EventCount(|e| matches!(e.kind, Some(event::Kind::Custom(_)))),
    )
    .unwrap()
}

fn wait_for(collector: &Collector, target: u64, timeout: Duration) -> Duration {
    let start = Instant::now();
    while collector.events_counted() < target {
        assert!(
            start.elapsed() < timeout,
            "only {} of {target} arrived",
            collector.events_counted()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    start.elapsed()
}

/// Baseline: the same batches published by a bare rumqttc client, QoS 1, 16 in flight, no disk,
/// through the same kind of proxy the agent's link goes through. Returns events/s.
fn baseline(
    broker: std::net::SocketAddr,
    payloads: &Arc<Vec<(String, Vec<u8>)>>,
    total: u64,
) -> f64 {
    let collector = collector(broker, "baseline-collector");
    let proxy = FaultProxy::start(broker).unwrap();
    let link = proxy.addr();
    let payloads = Arc::clone(payloads);
    let started = Instant::now();
    let publisher = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let mut options = MqttOptions::new("baseline", link.ip().to_string(), link.port());
            options.set_max_packet_size(Some(2 * 1024 * 1024));
            options.set_outgoing_inflight_upper_limit(16);
            let (client, mut events) = AsyncClient::new(options, 32);
            let mut next = 0;
            let mut acked = 0;
            let mut inflight = 0;
            while acked < payloads.len() {
                while inflight < 16 && next < payloads.len() {
                    let (topic, payload) = &payloads[next];
                    client
                        .try_publish(topic.as_str(), QoS::AtLeastOnce, false, payload.clone())
                        .unwrap();
                    next += 1;
                    inflight += 1;
                }
                if let Ok(MqttEvent::Incoming(Packet::PubAck(_))) = events.poll().await {
                    acked += 1;
                    inflight -= 1;
                }
            }
        });
    });
    wait_for(&collector, total, drain_timeout(total));
    let elapsed = started.elapsed();
    publisher.join().unwrap();
    drop(collector);
    total as f64 / elapsed.as_secs_f64()
}

/// Generous: ten times the slowest drain yet seen (90,000 events/s), and at least 10 minutes.
fn drain_timeout(total: u64) -> Duration {
    Duration::from_secs((total / 9_000).max(600))
}

fn proc_cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    // SAFETY: sysconf has no memory preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// A `kB` field of `/proc/<pid>/status` (`VmHWM`, `VmRSS`), 0 once the process is gone.
fn status_kib(pid: u32, field: &str) -> u64 {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return 0;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Samples a process's `VmRSS` every 10 ms until stopped; returns the largest.
struct RssSampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<u64>,
}

impl RssSampler {
    fn start(pid: u32) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut peak = 0;
            while !flag.load(Ordering::Relaxed) {
                peak = peak.max(status_kib(pid, "VmRSS"));
                std::thread::sleep(Duration::from_millis(10));
            }
            peak.max(status_kib(pid, "VmRSS"))
        });
        Self { stop, thread }
    }

    fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

/// Where a process's resident memory is (`DRAIN_SMAPS=1`): `smaps_rollup`, and the resident
/// KiB of `/proc/<pid>/smaps` summed by what is mapped (the binary, a library, the heap, thread
/// stacks, anonymous mappings), largest first.
fn print_memory_map(pid: u32) {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    eprintln!("smaps_rollup of the agent after the drain:\n{rollup}");
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let mut by_name: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
    let mut current = String::new();
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let first = fields.next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            // A mapping's header: range, perms, offset, dev, inode, [path].
            let perms = fields.next().unwrap_or("");
            let path = fields.nth(3).unwrap_or("[anon]");
            current = format!("{path} {perms}");
        } else if first == "Rss:" {
            let kib: u64 = fields.next().and_then(|v| v.parse().ok()).unwrap_or(0);
            let entry = by_name.entry(current.clone()).or_default();
            entry.0 += kib;
            entry.1 += 1;
        }
    }
    let mut rows: Vec<_> = by_name
        .into_iter()
        .filter(|(_, (kib, _))| *kib > 0)
        .collect();
    rows.sort_by_key(|row| std::cmp::Reverse(row.1.0));
    for (name, (kib, count)) in rows.iter().take(25) {
        eprintln!("{kib:>8} KiB in {count:>3} mapping(s): {name}");
    }
}

/// `/proc/loadavg`'s three load averages.
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

/// Bytes free to unprivileged users on the file system holding `path`.
fn free_bytes(path: &Path) -> u64 {
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `stat` is plain old data, written by statvfs before it is read; the path is a valid
    // NUL-terminated string that outlives the call.
    unsafe {
        let mut stat: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c_path.as_ptr(), &mut stat) != 0 {
            return 0;
        }
        stat.f_bavail as u64 * stat.f_frsize as u64
    }
}

/// Bytes allocated on disk under `dir`.
fn disk_usage(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| match entry.metadata() {
            Ok(meta) if meta.is_dir() => disk_usage(&entry.path()),
            Ok(meta) => meta.blocks() * 512,
            Err(_) => 0,
        })
        .sum()
}

/// Submits events `0..total` (tier by [`tier_of`]) through the agent's socket on one
/// connection, pipelined, and waits until every one is answered; each must be accepted (the
/// agent answers once the record is durable). Returns the time taken and the events' encoded
/// bytes.
fn fill(socket: &Path, total: u64) -> (Duration, u64) {
    let stream = UnixStream::connect(socket).unwrap();
    let mut writer = stream.try_clone().unwrap();
    let started = Instant::now();
    let feeder = std::thread::spawn(move || {
        let mut out = Vec::with_capacity(128 * 1024);
        let mut event_bytes = 0;
        for i in 0..total {
            let tier = tier_of(i);
            let event = realistic(tier, i);
            event_bytes += event.encoded_len() as u64;
            let submission = LocalSubmission {
                tier: tier as i32,
                event: Some(event),
                ..LocalSubmission::default()
            };
            codec::encode_frame(&submission, &mut out);
            if out.len() >= 64 * 1024 {
                writer.write_all(&out).unwrap();
                out.clear();
            }
        }
        writer.write_all(&out).unwrap();
        event_bytes
    });
    let mut reader = stream;
    reader
        .set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    let mut answered = 0u64;
    while answered < total {
        let n = reader.read(&mut chunk).unwrap();
        assert!(
            n > 0,
            "the agent closed the connection after {answered} replies"
        );
        buf.extend_from_slice(&chunk[..n]);
        let mut offset = 0;
        while let Ok(codec::Frame::Complete { body, consumed }) =
            codec::next_frame(&buf[offset..], 1024 * 1024)
        {
            let reply = LocalReply::decode(&buf[offset + body.start..offset + body.end]).unwrap();
            assert!(
                reply.accepted,
                "submission {answered} was refused: {}",
                reply.error
            );
            answered += 1;
            offset += consumed;
        }
        buf.drain(..offset);
    }
    let event_bytes = feeder.join().unwrap();
    (started.elapsed(), event_bytes)
}

/// The bench's agent: the link through `port` (the fault proxy), a 4 GiB queue budget and an
/// ingest rate that does not hold the fill back.
fn agent_config(dir: &Path, port: u16) -> String {
    format!(
        "[machine]\nid = \"bench-1\"\nsite = \"bench\"\nclass = \"haul-truck\"\n\n[queue]\ndir = \"{}\"\nbudget_bytes = 4294967296\n\n[uplink]\nhost = \"127.0.0.1\"\nport = {port}\nkeep_alive = \"30s\"\ninitial_delay_max = \"0s\"\nbackoff_min = \"50ms\"\nbackoff_max = \"200ms\"\n\n[scheduling]\nidle_priority = false\n\n[ingest]\nsocket = \"{}\"\nrate_per_s = 1000000\nburst = 1000000\n\n[thermal]\ntegrastats_enabled = false\nsysfs_root = \"{}\"\n",
        dir.join("queue").display(),
        dir.join("agent.sock").display(),
        dir.join("no-sysfs").display(),
    )
}

struct AgentRun {
    events_per_s: f64,
    drain_seconds: f64,
    fill_seconds: f64,
    event_bytes: u64,
    queue_disk_bytes: u64,
    fill_peak_rss_kib: u64,
    wire_bytes_per_event: f64,
    cpu_seconds: f64,
    peak_rss_kib: u64,
    sampled_rss_kib: u64,
    /// `RssAnon` and `RssFile` after the drain: private memory, and pages of the binary and
    /// libraries (clean, shared with the page cache).
    anon_kib: u64,
    file_kib: u64,
    ratios: [f64; 3],
}

fn agent_run(broker: std::net::SocketAddr, total: u64) -> AgentRun {
    let dir = tempfile::Builder::new()
        .prefix("edgewatch-drain-bench-")
        .tempdir()
        .unwrap();
    let proxy = FaultProxy::start(broker).unwrap();
    proxy.set(Fault::Blackhole);
    let config = agent_config(dir.path(), proxy.port());
    // The backlog, written through the socket while the broker is unreachable.
    let mut agent =
        AgentProcess::start(Path::new(BIN), dir.path(), &config, Launch::new("warn")).unwrap();
    assert!(
        agent.wait_for_socket(Duration::from_secs(60)).is_ok(),
        "agent did not start"
    );
    let (fill_time, event_bytes) = fill(&agent.socket(), total);
    let fill_peak_rss_kib = status_kib(agent.pid().unwrap(), "VmHWM");
    agent.terminate(Duration::from_secs(120));
    drop(agent);
    let queue_disk_bytes = disk_usage(&dir.path().join("queue"));

    // The drain, by a freshly started agent.
    let collector = collector(broker, "agent-collector");
    let mut agent =
        AgentProcess::start(Path::new(BIN), dir.path(), &config, drain_launch()).unwrap();
    let pid = agent.pid().unwrap();
    let sampler = RssSampler::start(pid);
    assert!(
        agent.wait_for_socket(Duration::from_secs(600)).is_ok(),
        "agent did not start"
    );
    // Let the agent settle (queue verified at open, health reported), then open the link.
    std::thread::sleep(Duration::from_secs(2));
    let cpu_before = proc_cpu_seconds(pid);
    let wire_before = proxy.bytes_upstream();
    proxy.set(Fault::Pass);
    // The agent's own health events also arrive; count only the backlog.
    let elapsed = wait_for(&collector, total, drain_timeout(total));
    let cpu_seconds = proc_cpu_seconds(pid) - cpu_before;
    let wire = proxy.bytes_upstream() - wire_before;
    std::thread::sleep(Duration::from_millis(1500));
    let sampled_rss_kib = sampler.stop();
    let peak_rss_kib = status_kib(pid, "VmHWM");
    let anon_kib = status_kib(pid, "RssAnon");
    let file_kib = status_kib(pid, "RssFile");
    if std::env::var_os("DRAIN_SMAPS").is_some() {
        print_memory_map(pid);
    }
    let status = agent.command(&["status", "--json"]).unwrap();
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let uplink = &status["agent"]["uplink"];
    let ratio = |t: usize| {
        uplink["event_bytes_acked_by_tier"][t]
            .as_f64()
            .unwrap_or(0.0)
            / uplink["wire_bytes_acked_by_tier"][t]
                .as_f64()
                .unwrap_or(1.0)
                .max(1.0)
    };
    let ratios = [ratio(0), ratio(1), ratio(2)];
    agent.terminate(Duration::from_secs(60));
    drop(collector);
    AgentRun {
        events_per_s: total as f64 / elapsed.as_secs_f64(),
        drain_seconds: elapsed.as_secs_f64(),
        fill_seconds: fill_time.as_secs_f64(),
        event_bytes,
        queue_disk_bytes,
        fill_peak_rss_kib,
        wire_bytes_per_event: wire as f64 / total as f64,
        cpu_seconds,
        peak_rss_kib,
        sampled_rss_kib,
        anon_kib,
        file_kib,
        ratios,
    }
}

/// The agent's batches, re-encoded here for the baseline: same events, same batching (2,000
/// events or 256 KiB of events per batch, the agent's defaults), built one batch at a time.
fn baseline_payloads(total: u64) -> Vec<(String, Vec<u8>)> {
    let mut encoder = BatchEncoder::new(DEFAULT_COMPRESSION_LEVEL).unwrap();
    let mut out = Vec::new();
    for tier in [Tier::Safety, Tier::Slo, Tier::Debug] {
        let segment = edgewatch_proto::tier::name(tier).unwrap();
        let topic = format!("edgewatch/v1/bench/baseline/{segment}");
        let mut chunk: Vec<Event> = Vec::with_capacity(2000);
        let mut bytes = 0;
        let mut seal = |chunk: &mut Vec<Event>| {
            let batch = Batch {
                schema_version: 1,
                machine_id: "bench-1".into(),
                site_id: "bench".into(),
                agent_epoch: 1,
                tier: tier as i32,
                first_seq: chunk[0].seq,
                last_seq: chunk[chunk.len() - 1].seq,
                sent_time_unix_ns: unix_ns(),
                events: std::mem::take(chunk),
                machine_class: "haul-truck".into(),
                agent_version: "bench".into(),
            };
            let mut payload = Vec::new();
            encoder
                .encode(&batch, MAX_COMPRESSED_BYTES, &mut payload)
                .unwrap();
            out.push((topic.clone(), payload));
        };
        for (seq, i) in (1..).zip((0..total).filter(|&i| tier_of(i) == tier)) {
            let event = Event {
                seq,
                ..realistic(tier, i)
            };
            let len = event.encoded_len();
            if !chunk.is_empty() && (chunk.len() == 2000 || bytes + len > 256 * 1024) {
                seal(&mut chunk);
                bytes = 0;
            }
            bytes += len;
            chunk.push(event);
        }
        if !chunk.is_empty() {
            seal(&mut chunk);
        }
    }
    out
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.partial_cmp(b).unwrap());
    values[values.len() / 2]
}

/// One backlog's rounds and table.
fn backlog(broker: std::net::SocketAddr, name: &str, total: u64, rounds: usize) {
    let tmp = std::env::temp_dir();
    println!(
        "\n### {name}: {total} events, {rounds} round(s)\n\nload average (1, 5, 15 min) at the start: {}; free in {}: {:.1} GiB\n",
        load_average(),
        tmp.display(),
        free_bytes(&tmp) as f64 / (1u64 << 30) as f64
    );
    let payloads = Arc::new(baseline_payloads(total));
    let mut base = Vec::new();
    let mut agent = Vec::new();
    for round in 0..rounds {
        // Alternate the order so drift on a shared machine hits both sides alike.
        if round % 2 == 0 {
            base.push(baseline(broker, &payloads, total));
            agent.push(agent_run(broker, total));
        } else {
            agent.push(agent_run(broker, total));
            base.push(baseline(broker, &payloads, total));
        }
        let run = &agent[round];
        eprintln!(
            "{name} round {round}: baseline {:.0} ev/s, agent {:.0} ev/s ({:.1} s), drain VmHWM {} KiB, sampled VmRSS {} KiB, anon {} KiB, file {} KiB, fill {:.1} s, {} event bytes, queue on disk {} bytes, load {}",
            base[round],
            run.events_per_s,
            run.drain_seconds,
            run.peak_rss_kib,
            run.sampled_rss_kib,
            run.anon_kib,
            run.file_kib,
            run.fill_seconds,
            run.event_bytes,
            run.queue_disk_bytes,
            load_average()
        );
    }
    drop(payloads);
    let of = |f: fn(&AgentRun) -> f64| median(&mut agent.iter().map(f).collect::<Vec<_>>());
    let base_median = median(&mut base.clone());
    let agent_median = of(|a| a.events_per_s);
    let raw_per_event: f64 = (0..1000u64)
        .map(|i| realistic(tier_of(i), i).encoded_len() as f64)
        .sum::<f64>()
        / 1000.0;
    let mib = |kib: f64| kib / 1024.0;
    println!("| measure ({total} events, {rounds} round(s), medians) | value |");
    println!("|---|---|");
    println!(
        "| backlog: encoded events; queue files on disk after the fill | {:.1} MiB; {:.1} MiB |",
        of(|a| a.event_bytes as f64) / (1u64 << 20) as f64,
        of(|a| a.queue_disk_bytes as f64) / (1u64 << 20) as f64
    );
    println!(
        "| fill through the local socket (broker unreachable) | {:.1} s, {:.0} events/s; filling agent's VmHWM {:.1} MiB |",
        of(|a| a.fill_seconds),
        total as f64 / of(|a| a.fill_seconds),
        mib(of(|a| a.fill_peak_rss_kib as f64))
    );
    println!(
        "| bare rumqttc QoS 1 publisher, same batches, no disk (baseline) | {base_median:.0} events/s |"
    );
    println!(
        "| agent drain from its queue (restarted agent) | {agent_median:.0} events/s, {:.1} s |",
        of(|a| a.drain_seconds)
    );
    println!("| agent / baseline | {:.2} |", agent_median / base_median);
    println!(
        "| wire bytes per event (MQTT, at the proxy) | {:.1} (protobuf event alone: {raw_per_event:.1}) |",
        of(|a| a.wire_bytes_per_event)
    );
    println!(
        "| agent CPU during the drain | {:.2} s |",
        of(|a| a.cpu_seconds)
    );
    println!(
        "| agent peak RSS from its start through the drain: VmHWM at the end; largest VmRSS sampled every 10 ms | {:.1} MiB; {:.1} MiB |",
        mib(of(|a| a.peak_rss_kib as f64)),
        mib(of(|a| a.sampled_rss_kib as f64))
    );
    println!(
        "| agent RSS after the drain: anonymous (RssAnon); file pages of the binary and libraries (RssFile) | {:.1} MiB; {:.1} MiB |",
        mib(of(|a| a.anon_kib as f64)),
        mib(of(|a| a.file_kib as f64))
    );
    println!(
        "| compression, safety (miss bursts) | {:.1}x |",
        of(|a| a.ratios[0])
    );
    println!(
        "| compression, SLO (deadline counters) | {:.1}x |",
        of(|a| a.ratios[1])
    );
    println!(
        "| compression, debug (thermal samples) | {:.1}x |",
        of(|a| a.ratios[2])
    );
    println!(
        "\nload average at the end: {}; free in {}: {:.1} GiB",
        load_average(),
        tmp.display(),
        free_bytes(&tmp) as f64 / (1u64 << 30) as f64
    );
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    println!(
        "load average (1, 5, 15 min) at the bench's start: {}",
        load_average()
    );
    let total = env_or("DRAIN_EVENTS", 200_000) as u64;
    let rounds = env_or("DRAIN_ROUNDS", 3);
    let big_bytes = env_or("DRAIN_BIG_BYTES", 1 << 30) as u64;
    let big_rounds = env_or("DRAIN_BIG_ROUNDS", 1);
    let broker = Mosquitto::start().unwrap();
    if total > 0 && rounds > 0 {
        backlog(
            broker.addr(),
            &format!("{total}-event backlog"),
            total,
            rounds,
        );
    }
    if big_bytes > 0 && big_rounds > 0 {
        // The queue's files take up to about 1.5 times the events' bytes; the baseline's batches
        // are held in memory. Ask for three times the backlog.
        let free = free_bytes(&std::env::temp_dir());
        if free < 3 * big_bytes {
            println!(
                "\nSKIP the {big_bytes}-byte backlog: {:.1} GiB free in {}, it needs {:.1} GiB",
                free as f64 / (1u64 << 30) as f64,
                std::env::temp_dir().display(),
                (3 * big_bytes) as f64 / (1u64 << 30) as f64
            );
        } else {
            let per_event = (0..10_000u64)
                .map(|i| realistic(tier_of(i), i).encoded_len() as u64)
                .sum::<u64>()
                / 10_000;
            let events = big_bytes / per_event;
            backlog(
                broker.addr(),
                &format!("{} MiB backlog", big_bytes >> 20),
                events,
                big_rounds,
            );
        }
    }
    println!(
        "\nload average (1, 5, 15 min) at the bench's end: {}",
        load_average()
    );
}
