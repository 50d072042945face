//! The ingest benchmarks' payloads, shared by `ingest.rs` and `victoria.rs` so that both measure
//! the same batches: 100 machines × 20 SLO batches × 50 events (deadline counters and two energy
//! rails), every counter with a start time, so each series also gets its baseline.

// Each benchmark uses a part of it.
#![allow(dead_code)]

use edgewatch_gateway::ingest::{DECODE_AHEAD_MIN_MESSAGES, Decoding};
use edgewatch_proto::framing::encode_batch;
use edgewatch_proto::v1::{
    Batch, DeadlineCounters, EnergyCounters, Event, LoopRef, ModelVersion, RailEnergy, Tier, event,
};

/// Machines sending.
pub const MACHINES: u64 = 100;
/// SLO batches per machine.
pub const BATCHES_PER_MACHINE: u64 = 20;
/// Events per batch.
pub const EVENTS_PER_BATCH: u64 = 50;
/// Messages per ingest call (one durable commit), as `run` groups them with a backlog waiting:
/// the packaged default Receive Maximum, the most messages the broker sends unacknowledged.
pub const GROUP: usize = edgewatch_gateway::config::DEFAULT_RECEIVE_MAXIMUM as usize;

const DAY_NS: i64 = 86_400_000_000_000;

/// Seconds of CPU time on `clock` (`CLOCK_THREAD_CPUTIME_ID`: this thread, which other jobs on
/// the machine move less than the wall clock and which leaves out the waits for the disk;
/// `CLOCK_PROCESS_CPUTIME_ID`: every thread of this process).
pub fn cpu_seconds(clock: libc::clockid_t) -> f64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec for the call to fill.
    unsafe { libc::clock_gettime(clock, &mut now) };
    now.tv_sec as f64 + now.tv_nsec as f64 / 1e9
}

/// (topic, payload) of every batch, machines interleaved, for batches arriving at `arrival_ns`:
/// events stamped every 10 s over the day before it, their runs started two days before it.
pub fn payloads(arrival_ns: i64) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for b in 0..BATCHES_PER_MACHINE {
        for m in 0..MACHINES {
            let machine = format!("truck-{m:03}");
            let events = (0..EVENTS_PER_BATCH)
                .map(|i| {
                    let seq = 1 + b * EVENTS_PER_BATCH + i;
                    let time = arrival_ns - DAY_NS + seq as i64 * 10_000_000_000;
                    // Every series runs from this start, as an agent's do: the first event of
                    // each writes its baseline, the others find it.
                    let start = arrival_ns - 2 * DAY_NS;
                    let model = Some(ModelVersion {
                        name: "haul-perception".into(),
                        version: "4.2.1".into(),
                        ..Default::default()
                    });
                    let kind = if i % 2 == 0 {
                        event::Kind::DeadlineCounters(DeadlineCounters {
                            control_loop: Some(LoopRef {
                                loop_id: 1,
                                loop_name: "safety".into(),
                            }),
                            model,
                            start_time_unix_ns: start,
                            cycles: 250 * seq,
                            misses: seq / 100,
                            ..Default::default()
                        })
                    } else {
                        event::Kind::EnergyCounters(EnergyCounters {
                            start_time_unix_ns: start,
                            rails: vec![
                                RailEnergy {
                                    rail: "VDD_GPU_SOC".into(),
                                    joules: 90.0 * seq as f64,
                                },
                                RailEnergy {
                                    rail: "VDD_CPU_CV".into(),
                                    joules: 40.0 * seq as f64,
                                },
                            ],
                            model,
                        })
                    };
                    Event {
                        seq,
                        event_time_unix_ns: time,
                        monotonic_ns: seq,
                        kind: Some(kind),
                    }
                })
                .collect::<Vec<_>>();
            let batch = Batch {
                schema_version: 1,
                machine_id: machine.clone(),
                site_id: "pit-3".into(),
                agent_epoch: 9,
                tier: Tier::Slo as i32,
                first_seq: events[0].seq,
                last_seq: events[events.len() - 1].seq,
                sent_time_unix_ns: arrival_ns,
                events,
                machine_class: "haul-truck".into(),
                agent_version: "0.1.0".into(),
            };
            out.push((
                format!("edgewatch/v1/pit-3/{machine}/slo"),
                encode_batch(&batch).unwrap(),
            ));
        }
    }
    out
}

/// `/proc/loadavg`'s three averages.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The median (sorts `values`).
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Bytes this process has caused to be written to the block device so far (`write_bytes` of
/// `/proc/self/io`: the pages its writes dirtied, counted when dirtied).
pub fn write_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("write_bytes: ")?.trim().parse().ok())
        .unwrap_or(0)
}

/// The gateway's two ways of decoding a group, each benched into a fresh store: inline (one
/// thread), and ahead on a second thread (what `Ingestor::new` picks with two cores or more).
pub const DECODINGS: [(&str, Decoding); 2] = [
    ("decoded inline", Decoding::Inline),
    (
        "decoded ahead",
        Decoding::Ahead {
            min_messages: DECODE_AHEAD_MIN_MESSAGES,
        },
    ),
];
