//! Drain benchmark: how fast the real agent empties a 200,000-event backlog into a real Mosquitto,
//! against a bare rumqttc QoS 1 publisher sending the same batches with no disk, in the same run.
//!
//! `cargo bench -p edgewatch-agent --bench drain` (options: `DRAIN_EVENTS`, `DRAIN_ROUNDS`).
//! Prints a Markdown table: events/s (median of rounds) for both, the ratio, wire bytes per
//! event, the agent's CPU seconds and peak RSS during the drain, and compression per tier.
#![allow(clippy::print_stdout, clippy::print_stderr, clippy::unwrap_used)]

use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use edgewatch_harness::agent::AgentProcess;
use edgewatch_harness::collector::{Collector, Keep};
use edgewatch_harness::mosquitto::Mosquitto;
use edgewatch_harness::process::Launch;
use edgewatch_harness::proxy::{Fault, FaultProxy};
use edgewatch_proto::framing::{BatchEncoder, DEFAULT_COMPRESSION_LEVEL, MAX_COMPRESSED_BYTES};
use edgewatch_proto::v1::{
    Batch, DeadlineCounters, DeadlineMissBurst, DeadlineSemantics, Event, LatencyHistogram,
    LoopRef, ModelVersion, RailPower, Temperature, ThermalSample, Tier, event,
};
use edgewatch_queue::{Queue, RawQueueConfig};
use prost::Message;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::Packet;
use rumqttc::v5::{AsyncClient, Event as MqttEvent, MqttOptions};

const BIN: &str = env!("CARGO_BIN_EXE_edgewatch-agent");

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

fn model() -> ModelVersion {
    ModelVersion {
        name: "haul-perception".into(),
        version: "4.2.1".into(),
        id_hash: 0xfeed,
        ..ModelVersion::default()
    }
}

/// A realistic event of each tier: a miss burst (safety), deadline counters (SLO), a raw thermal
/// sample (debug).
fn realistic(tier: Tier, i: u64) -> Event {
    let kind = match tier {
        Tier::Safety => event::Kind::DeadlineMissBurst(DeadlineMissBurst {
            control_loop: Some(LoopRef {
                loop_id: 1,
                loop_name: "planner".into(),
            }),
            model: Some(model()),
            rule: 1,
            misses: 3,
            window_cycles: 3,
            first_cycle: i * 100,
            last_cycle: i * 100 + 2,
            worst_duration_ns: 41_000_000 + i % 1000,
            mode: 1,
            semantics: DeadlineSemantics::Completion as i32,
        }),
        Tier::Slo => event::Kind::DeadlineCounters(DeadlineCounters {
            control_loop: Some(LoopRef {
                loop_id: 1,
                loop_name: "planner".into(),
            }),
            model: Some(model()),
            start_time_unix_ns: 1_764_000_000_000_000_000,
            producer_epoch: 7,
            period_ns: 40_000_000,
            budget_ns: 40_000_000,
            cycles: 250 * i,
            misses: i / 50,
            skipped: i / 500,
            sum_duration_ns: 250 * i * 20_000_000,
            max_duration_ns: 45_000_000,
            response_time: Some(LatencyHistogram {
                bounds_ns: vec![
                    10_000_000, 20_000_000, 30_000_000, 36_000_000, 40_000_000, 44_000_000,
                ],
                counts: vec![10 * i, 200 * i, 35 * i, 4 * i, i, i / 50, i / 100],
            }),
            mode: 0,
            activations: Some(250 * i + i / 500),
            deadline_misses: Some(i / 40 + i / 500),
            overruns: Some(i / 50),
            deadline_ns: 40_000_000,
            semantics: DeadlineSemantics::Completion as i32,
        }),
        _ => event::Kind::ThermalSample(ThermalSample {
            temperatures: ["cpu", "gpu", "soc0", "soc1", "soc2", "tj"]
                .iter()
                .enumerate()
                .map(|(z, name)| Temperature {
                    zone: (*name).into(),
                    celsius: Some(45.0 + ((i + z as u64) % 13) as f64 * 0.531),
                })
                .collect(),
            rails: ["VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0"]
                .iter()
                .enumerate()
                .map(|(r, name)| RailPower {
                    rail: (*name).into(),
                    current_mw: 3000.0 + ((i * 7 + r as u64) % 400) as f64,
                    average_mw: Some(3100.0 + (r as f64)),
                })
                .collect(),
            cpu_load_pct: (0..8).map(|c| ((i + c) % 60) as f64).collect(),
            cpu_freq_mhz: vec![1190; 8],
            gpu_load_pct: Some((i % 99) as f64),
            gpu_freq_mhz: vec![624],
            emc_freq_mhz: Some(2133),
            ram_used_mb: Some(5120 + i % 64),
            ram_total_mb: Some(15_656),
        }),
    };
    Event {
        seq: 0,
        event_time_unix_ns: 1_764_500_000_000_000_000 + i as i64 * 10_000_000,
        monotonic_ns: i * 10_000_000,
        kind: Some(kind),
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

/// Counts the backlog's events arriving on `edgewatch/v1/#`: the agent's own health reports are
/// not part of it.
fn collector(broker: std::net::SocketAddr, name: &str) -> Collector {
    let mut options = MqttOptions::new(name, broker.ip().to_string(), broker.port());
    options.set_max_packet_size(Some(2 * 1024 * 1024));
    options.set_keep_alive(Duration::from_secs(30));
    Collector::subscribe(
        options,
        QoS::AtLeastOnce,
        Keep::EventCount(|e| !matches!(e.kind, Some(event::Kind::AgentHealth(_)))),
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
/// through the same kind of proxy the agent's link goes through.
fn baseline(broker: std::net::SocketAddr, payloads: &[(String, Vec<u8>, u64)], total: u64) -> f64 {
    let collector = collector(broker, "baseline-collector");
    let proxy = FaultProxy::start(broker).unwrap();
    let link = proxy.addr();
    let payloads = payloads.to_vec();
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
                    let (topic, payload, _) = &payloads[next];
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
    wait_for(&collector, total, Duration::from_secs(300));
    let elapsed = started.elapsed();
    publisher.join().unwrap();
    drop(collector);
    total as f64 / elapsed.as_secs_f64()
}

fn proc_cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    // SAFETY: sysconf has no memory preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

fn vm_hwm_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or(0)
}

struct AgentRun {
    events_per_s: f64,
    wire_bytes_per_event: f64,
    cpu_seconds: f64,
    peak_rss_kib: u64,
    ratios: [f64; 3],
}

fn agent_run(broker: std::net::SocketAddr, total: u64) -> AgentRun {
    let dir = tempfile::tempdir().unwrap();
    let queue_dir = dir.path().join("queue");
    // The backlog: written straight into the agent's queue, as days offline would leave it.
    {
        let mut config = RawQueueConfig::new(&queue_dir);
        config.budget_bytes = 2 * 1024 * 1024 * 1024;
        let (mut queue, _) = Queue::open(config, SystemTime::now()).unwrap();
        for i in 0..total {
            queue
                .append(tier_of(i), &realistic(tier_of(i), i), SystemTime::now())
                .unwrap();
            if i % 4000 == 3999 {
                queue.flush(SystemTime::now()).unwrap();
            }
        }
        queue.flush(SystemTime::now()).unwrap();
    }
    let proxy = FaultProxy::start(broker).unwrap();
    proxy.set(Fault::Blackhole);
    let config = format!(
        "[machine]\nid = \"bench-1\"\nsite = \"bench\"\nclass = \"haul-truck\"\n\n[queue]\ndir = \"{}\"\nbudget_bytes = 2147483648\n\n[uplink]\nhost = \"127.0.0.1\"\nport = {}\nkeep_alive = \"30s\"\ninitial_delay_max = \"0s\"\nbackoff_min = \"50ms\"\nbackoff_max = \"200ms\"\n\n[scheduling]\nidle_priority = false\n\n[ingest]\nsocket = \"{}\"\n\n[thermal]\ntegrastats_enabled = false\nsysfs_root = \"{}\"\n",
        queue_dir.display(),
        proxy.port(),
        dir.path().join("agent.sock").display(),
        dir.path().join("no-sysfs").display(),
    );
    let collector = collector(broker, "agent-collector");
    let mut agent =
        AgentProcess::start(Path::new(BIN), dir.path(), &config, Launch::new("warn")).unwrap();
    assert!(
        agent.wait_for_socket(Duration::from_secs(30)).is_ok(),
        "agent did not start"
    );
    // Let the agent settle (queue verified at open, health reported), then open the link.
    std::thread::sleep(Duration::from_secs(2));
    let pid = agent.pid().unwrap();
    let cpu_before = proc_cpu_seconds(pid);
    let wire_before = proxy.bytes_upstream();
    proxy.set(Fault::Pass);
    // The agent's own health events also arrive; count only the backlog.
    let elapsed = wait_for(&collector, total, Duration::from_secs(600));
    let cpu_seconds = proc_cpu_seconds(pid) - cpu_before;
    let peak_rss_kib = vm_hwm_kib(pid);
    let wire = proxy.bytes_upstream() - wire_before;
    std::thread::sleep(Duration::from_millis(1500));
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
        wire_bytes_per_event: wire as f64 / total as f64,
        cpu_seconds,
        peak_rss_kib,
        ratios,
    }
}

/// The agent's batches, re-encoded here for the baseline: same events, same batching.
fn baseline_payloads(total: u64) -> Vec<(String, Vec<u8>, u64)> {
    let mut encoder = BatchEncoder::new(DEFAULT_COMPRESSION_LEVEL).unwrap();
    let mut out = Vec::new();
    for tier in [Tier::Safety, Tier::Slo, Tier::Debug] {
        let events: Vec<Event> = (0..total)
            .filter(|&i| tier_of(i) == tier)
            .enumerate()
            .map(|(seq, i)| Event {
                seq: seq as u64 + 1,
                ..realistic(tier, i)
            })
            .collect();
        let segment = edgewatch_proto::tier::name(tier).unwrap();
        // Same limits as the agent's defaults: 2,000 events or 256 KiB of events per batch.
        let mut start = 0;
        while start < events.len() {
            let mut end = start;
            let mut bytes = 0;
            while end < events.len()
                && end - start < 2000
                && bytes + events[end].encoded_len() <= 256 * 1024
            {
                bytes += events[end].encoded_len();
                end += 1;
            }
            let chunk = events[start..end].to_vec();
            let batch = Batch {
                schema_version: 1,
                machine_id: "bench-1".into(),
                site_id: "bench".into(),
                agent_epoch: 1,
                tier: tier as i32,
                first_seq: chunk[0].seq,
                last_seq: chunk[chunk.len() - 1].seq,
                sent_time_unix_ns: unix_ns(),
                events: chunk,
                machine_class: "haul-truck".into(),
                agent_version: "bench".into(),
            };
            let mut payload = Vec::new();
            encoder
                .encode(&batch, MAX_COMPRESSED_BYTES, &mut payload)
                .unwrap();
            out.push((
                format!("edgewatch/v1/bench/baseline/{segment}"),
                payload,
                (end - start) as u64,
            ));
            start = end;
        }
    }
    out
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.partial_cmp(b).unwrap());
    values[values.len() / 2]
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let total = env_or("DRAIN_EVENTS", 200_000) as u64;
    let rounds = env_or("DRAIN_ROUNDS", 3);
    let broker = Mosquitto::start().unwrap();
    let payloads = baseline_payloads(total);
    let mut base = Vec::new();
    let mut agent = Vec::new();
    for round in 0..rounds {
        // Alternate the order so drift on a shared machine hits both sides alike.
        if round % 2 == 0 {
            base.push(baseline(broker.addr(), &payloads, total));
            agent.push(agent_run(broker.addr(), total));
        } else {
            agent.push(agent_run(broker.addr(), total));
            base.push(baseline(broker.addr(), &payloads, total));
        }
        eprintln!(
            "round {round}: baseline {:.0} ev/s, agent {:.0} ev/s",
            base[round], agent[round].events_per_s
        );
    }
    let base_median = median(&mut base.clone());
    let agent_median = median(&mut agent.iter().map(|a| a.events_per_s).collect::<Vec<_>>());
    let wire = median(
        &mut agent
            .iter()
            .map(|a| a.wire_bytes_per_event)
            .collect::<Vec<_>>(),
    );
    let cpu = median(&mut agent.iter().map(|a| a.cpu_seconds).collect::<Vec<_>>());
    let rss = median(
        &mut agent
            .iter()
            .map(|a| a.peak_rss_kib as f64)
            .collect::<Vec<_>>(),
    );
    let ratio = |t: usize| median(&mut agent.iter().map(|a| a.ratios[t]).collect::<Vec<_>>());
    let raw_per_event: f64 = (0..1000u64)
        .map(|i| realistic(tier_of(i), i).encoded_len() as f64)
        .sum::<f64>()
        / 1000.0;
    println!("| measure ({total} events, {rounds} rounds, medians) | value |");
    println!("|---|---|");
    println!(
        "| bare rumqttc QoS 1 publisher, same batches, no disk (baseline) | {base_median:.0} events/s |"
    );
    println!("| agent drain from its queue | {agent_median:.0} events/s |");
    println!("| agent / baseline | {:.2} |", agent_median / base_median);
    println!(
        "| wire bytes per event (MQTT, at the proxy) | {wire:.1} (protobuf event alone: {raw_per_event:.1}) |"
    );
    println!("| agent CPU during the drain | {cpu:.2} s |");
    println!("| agent peak RSS (VmHWM) | {:.1} MiB |", rss / 1024.0);
    println!("| compression, safety (miss bursts) | {:.1}x |", ratio(0));
    println!(
        "| compression, SLO (deadline counters) | {:.1}x |",
        ratio(1)
    );
    println!(
        "| compression, debug (thermal samples) | {:.1}x |",
        ratio(2)
    );
}
