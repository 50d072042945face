//! Safety acknowledgement latency through the local socket: a one-at-a-time safety client (each
//! submission written when the reply to the last arrived, as the autonomy stack submits) against
//! the real agent at the packaged default configuration (10 ms safety flush, 1 s bulk flush),
//! draining to a real Mosquitto, without and with concurrent SLO and debug load at 1,000/s each.
//!
//! `cargo bench -p edgewatch-agent --bench safety_latency` (options: `SAFETY_BENCH_RUNS` (5),
//! `SAFETY_BENCH_SECONDS` per phase (10), `SAFETY_BENCH_LOAD` per bulk tier (1000), and
//! `SAFETY_BENCH_NORMAL_PRIORITY=1` to run the agent at normal priority instead of the packaged
//! SCHED_IDLE, which tells the scheduler's share of the figures on a shared machine).
//! Each run starts a fresh agent and measures both phases on it, in alternating order; the table
//! gives p50 and p99 of each phase per run, the 1-minute load average at the end of each run, and
//! the medians over runs.
#![allow(clippy::print_stdout, clippy::print_stderr, clippy::unwrap_used)]

#[path = "../tests/util/mod.rs"]
mod util;

use std::time::Duration;

use edgewatch_harness::collector::{Collector, Keep};
use edgewatch_harness::mosquitto::Mosquitto;
use edgewatch_proto::v1::Tier;
use rumqttc::v5::MqttOptions;
use rumqttc::v5::mqttbytes::QoS;
use util::{Agent, Pace, Producer, ProducerSpec, quantile};

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

/// p50 and p99 of one phase.
#[derive(Clone, Copy, Debug)]
struct Phase {
    acks: usize,
    p50: Duration,
    p99: Duration,
    bulk_acks: usize,
}

fn spec(agent: &Agent, tier: Tier, first_id: i64, pace: Pace) -> ProducerSpec {
    ProducerSpec {
        socket: agent.socket.clone(),
        tier,
        first_id,
        padding: 100,
        pace,
        limit: None,
        reconnect: false,
    }
}

fn phase(agent: &Agent, seconds: u64, load: Option<u32>, first_id: i64) -> Phase {
    let bulk: Vec<Producer> = load
        .into_iter()
        .flat_map(|per_s| {
            [
                Producer::start(spec(
                    agent,
                    Tier::Slo,
                    first_id + 1_000_000,
                    Pace::PerSecond(per_s),
                )),
                Producer::start(spec(
                    agent,
                    Tier::Debug,
                    first_id + 2_000_000,
                    Pace::PerSecond(per_s),
                )),
            ]
        })
        .collect();
    if load.is_some() {
        // The load is running before the safety client starts.
        std::thread::sleep(Duration::from_millis(500));
    }
    let safety = Producer::start(spec(agent, Tier::Safety, first_id, Pace::OneAtATime));
    std::thread::sleep(Duration::from_secs(seconds));
    let safety = safety.stop();
    let bulk_acks = bulk
        .into_iter()
        .map(|producer| producer.stop().acked.len())
        .sum();
    assert!(safety.refused.is_empty(), "{:?}", safety.refused);
    let latencies: Vec<Duration> = safety.acked.iter().map(|ack| ack.latency).collect();
    Phase {
        acks: latencies.len(),
        p50: quantile(&latencies, 0.5),
        p99: quantile(&latencies, 0.99),
        bulk_acks,
    }
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values[values.len() / 2]
}

fn ms(duration: Duration) -> String {
    format!("{:.2}", duration.as_secs_f64() * 1000.0)
}

fn main() {
    if std::env::args().any(|arg| arg == "--list") {
        return;
    }
    let runs = env_or("SAFETY_BENCH_RUNS", 5);
    let seconds = env_or("SAFETY_BENCH_SECONDS", 10);
    let load = env_or("SAFETY_BENCH_LOAD", 1000) as u32;
    let edits: &[(&str, &str)] = if env_or("SAFETY_BENCH_NORMAL_PRIORITY", 0) == 1 {
        &[("#idle_priority = true", "idle_priority = false")]
    } else {
        &[]
    };
    let broker = Mosquitto::start().unwrap();
    // Counted, not kept: a subscriber so that the broker answers PUBACK success.
    let mut options = MqttOptions::new("bench-collector", "127.0.0.1", broker.port());
    options.set_keep_alive(Duration::from_secs(30));
    let collector = Collector::subscribe(options, QoS::AtLeastOnce, Keep::MessageCount).unwrap();
    let load_before = load_average();
    let mut quiet = Vec::new();
    let mut loaded = Vec::new();
    println!(
        "| run | order | no load: acks, p50 ms, p99 ms | load: acks, p50 ms, p99 ms, bulk acks | load average (1, 5, 15 min) at the run's end |"
    );
    println!("|---|---|---|---|---|");
    for run in 0..runs {
        let agent = Agent::start_packaged(broker.addr(), &format!("bench-{run}"), edits);
        std::thread::sleep(Duration::from_secs(1));
        let first_id = (run as i64 + 1) * 10_000_000;
        let load_first = run % 2 == 1;
        let (q, l) = if load_first {
            let l = phase(&agent, seconds, Some(load), first_id + 5_000_000);
            let q = phase(&agent, seconds, None, first_id);
            (q, l)
        } else {
            let q = phase(&agent, seconds, None, first_id);
            let l = phase(&agent, seconds, Some(load), first_id + 5_000_000);
            (q, l)
        };
        println!(
            "| {} | {} | {}, {}, {} | {}, {}, {}, {} | {} |",
            run + 1,
            if load_first {
                "load first"
            } else {
                "no load first"
            },
            q.acks,
            ms(q.p50),
            ms(q.p99),
            l.acks,
            ms(l.p50),
            ms(l.p99),
            l.bulk_acks,
            load_average()
        );
        quiet.push(q);
        loaded.push(l);
        drop(agent);
    }
    let quiet_p50 = median(quiet.iter().map(|p| p.p50).collect());
    let quiet_p99 = median(quiet.iter().map(|p| p.p99).collect());
    let loaded_p50 = median(loaded.iter().map(|p| p.p50).collect());
    let loaded_p99 = median(loaded.iter().map(|p| p.p99).collect());
    println!();
    println!(
        "| safety ack latency (median of {runs} runs of {seconds} s{}) | p50 | p99 |",
        if edits.is_empty() {
            ""
        } else {
            ", normal priority"
        }
    );
    println!("|---|---|---|");
    println!("| no load | {} ms | {} ms |", ms(quiet_p50), ms(quiet_p99));
    println!(
        "| SLO and debug at {load}/s each | {} ms | {} ms |",
        ms(loaded_p50),
        ms(loaded_p99)
    );
    let excess = loaded_p99.saturating_sub(quiet_p99);
    println!(
        "\np99 under load minus p99 without: {} ms (goal: at most 2 ms); load average before: {load_before}, after: {}; {} messages at the broker",
        ms(excess),
        load_average(),
        collector.messages()
    );
}
