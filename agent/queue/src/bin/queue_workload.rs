//! A process that writes through the queue the way the agent does, and reports on stdout what the
//! queue made durable, so a parent can SIGKILL it at any moment (or cut the power under it) and
//! then check the queue against the reports.
//!
//! Usage: `queue-workload <dir> <run> <seed> [budget_bytes] [max_appends]`
//!
//! Lines written (each after the fact it reports):
//! - `E <epoch>`: the queue is open (epoch in hex).
//! - `D <tier> <seq> <name>`: the event `name` is durable as `seq` of `tier` (1 safety, 2 SLO,
//!   3 debug).
//! - `A <tier> <first> <last>`: the range was acknowledged (deleted at the next flush).
//! - `R <tier> <first> <last>`: the range was dropped by a failed flush.
//!
//! After each append the key-value entry `workload/last` is staged naming it
//! (`<tier> <seq> <name>`).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::io::Write;
use std::process::ExitCode;
use std::time::SystemTime;

use edgewatch_conventions::config::EXIT_BAD_CONFIG;
use edgewatch_proto::v1::{Attribute, CustomEvent, Event, Tier, attribute, event::Kind};
use edgewatch_queue::{BatchLimits, Queue, RawQueueConfig, TIERS};

/// The key-value entry naming the last append.
const LAST_APPEND_KEY: &str = "workload/last";

/// xorshift64*: reproducible from the seed, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 {
        eprintln!("usage: queue-workload <dir> <run> <seed> [budget_bytes] [max_appends]");
        return ExitCode::from(EXIT_BAD_CONFIG);
    }
    let parse = |i: usize, default: u64| -> Option<u64> {
        args.get(i).map_or(Some(default), |v| v.parse().ok())
    };
    let (Some(run), Some(seed), Some(budget), Some(max_appends)) = (
        parse(2, 0),
        parse(3, 1),
        parse(4, 1024 * 1024),
        parse(5, u64::MAX),
    ) else {
        eprintln!("queue-workload: run, seed, budget_bytes and max_appends must be integers");
        return ExitCode::from(EXIT_BAD_CONFIG);
    };
    match work(&args[1], run, seed, budget, max_appends) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("queue-workload: {error}");
            ExitCode::FAILURE
        }
    }
}

fn work(
    dir: &str,
    run: u64,
    seed: u64,
    budget: u64,
    max_appends: u64,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut config = RawQueueConfig::new(dir);
    config.budget_bytes = budget;
    config.cache_bytes = 4 * 1024 * 1024;
    config.max_record_bytes = 4096;
    config.max_pending_bytes = (budget / 8).max(64 * 1024);
    config.offline_window_threshold = None;
    let (mut queue, report) = Queue::open(config, SystemTime::now())?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    writeln!(out, "E {:x}", report.epoch)?;
    out.flush()?;
    let mut rng = Rng(seed.max(1) ^ (run << 32));
    let mut waiting: Vec<(usize, u64, String)> = Vec::new();
    let mut until_flush = 1 + rng.below(32);
    let limits = BatchLimits {
        max_records: 64,
        max_bytes: 64 * 1024,
    };
    for i in 0..max_appends {
        let tier = match rng.below(10) {
            0..2 => 0,
            2..5 => 1,
            _ => 2,
        };
        let name = format!("r{run}-{i}");
        let event = Event {
            seq: 0,
            event_time_unix_ns: 0,
            monotonic_ns: i,
            kind: Some(Kind::Custom(CustomEvent {
                name: name.clone(),
                attributes: vec![Attribute {
                    key: "pad".into(),
                    value: Some(attribute::Value::StringValue(
                        "p".repeat(rng.below(400) as usize),
                    )),
                }],
            })),
        };
        match queue.append(TIERS[tier], &event, SystemTime::now()) {
            Ok(seq) => {
                // The key-value area names the last append, as the agent's samplers name what
                // their state describes: it must never outlive the record in a crash.
                let last = format!("{} {seq} {name}", tier + 1);
                queue.stage_kv(LAST_APPEND_KEY, last.as_bytes())?;
                waiting.push((tier, seq, name));
            }
            Err(error) => eprintln!("append refused: {error}"),
        }
        until_flush -= 1;
        if until_flush > 0 {
            continue;
        }
        until_flush = 1 + rng.below(32);
        match queue.flush(SystemTime::now()) {
            Ok(outcome) => {
                for (tier, seq, name) in waiting.drain(..) {
                    let durable = *outcome.durable.get(TIERS[tier]).unwrap_or(&0);
                    if seq <= durable {
                        writeln!(out, "D {} {seq} {name}", tier + 1)?;
                    }
                }
            }
            Err(error) => {
                for (tier, range) in error.refused.iter() {
                    if let Some((first, last)) = range {
                        writeln!(out, "R {} {first} {last}", tier as i32)?;
                    }
                }
                waiting.retain(|(tier, seq, _)| {
                    error
                        .refused
                        .get(TIERS[*tier])
                        .and_then(|r| *r)
                        .is_none_or(|(first, last)| !(first..=last).contains(seq))
                });
            }
        }
        out.flush()?;
        // Drain like the uplink: read in tier order, acknowledge only debug batches (SLO and
        // safety stay handed out until the next restart, so their losses stay countable).
        for _ in 0..rng.below(4) {
            let Some(batch) = queue.next_batch(limits)? else {
                break;
            };
            if batch.tier() == Tier::Debug && rng.below(2) == 0 {
                let (epoch, first, last) = (batch.epoch(), batch.first_seq(), batch.last_seq());
                queue.ack(Tier::Debug, epoch, first..=last, SystemTime::now());
                writeln!(out, "A 3 {first} {last}")?;
            }
        }
        out.flush()?;
    }
    queue.flush(SystemTime::now())?;
    for (tier, seq, name) in waiting.drain(..) {
        if seq <= queue.durable_seq(TIERS[tier]) {
            writeln!(out, "D {} {seq} {name}", tier + 1)?;
        }
    }
    out.flush()?;
    Ok(())
}
