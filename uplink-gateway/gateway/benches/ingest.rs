//! Ingest throughput on one core: the whole ingest path (decode + validate + dedup + normalize +
//! one durable redb commit per group) against a decode-only baseline on the same payloads, in the
//! same run. Prints medians of several runs.
//!
//! Run: `cargo bench -p edgewatch-gateway --bench ingest`

#![allow(clippy::unwrap_used, clippy::print_stdout)]

use std::time::Instant;

use edgewatch_gateway::config::IngestConfig;
use edgewatch_gateway::ingest::{Incoming, Ingestor};
use edgewatch_gateway::store::Store;
use edgewatch_proto::framing::{BatchDecoder, encode_batch};
use edgewatch_proto::v1::{
    Batch, DeadlineCounters, EnergyCounters, Event, LoopRef, ModelVersion, RailEnergy, Tier, event,
};

const MACHINES: u64 = 100;
const BATCHES_PER_MACHINE: u64 = 20;
const EVENTS_PER_BATCH: u64 = 50;
const GROUP: usize = 64;
const RUNS: usize = 5;
const ARRIVAL: i64 = 1_800_000_000_000_000_000;

fn payloads() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for b in 0..BATCHES_PER_MACHINE {
        for m in 0..MACHINES {
            let machine = format!("truck-{m:03}");
            let events = (0..EVENTS_PER_BATCH)
                .map(|i| {
                    let seq = 1 + b * EVENTS_PER_BATCH + i;
                    let time = ARRIVAL - 86_400_000_000_000 + seq as i64 * 10_000_000_000;
                    // Every series runs from this start, as an agent's do: the first event of
                    // each writes its baseline, the others find it.
                    let start = ARRIVAL - 2 * 86_400_000_000_000;
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
                sent_time_unix_ns: ARRIVAL,
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

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let payloads = payloads();
    let batches = payloads.len() as f64;
    let events = batches * EVENTS_PER_BATCH as f64;
    let bytes: usize = payloads.iter().map(|(_, p)| p.len()).sum();
    println!(
        "{} batches, {} events, {:.1} MiB compressed; groups of {GROUP}; {RUNS} runs",
        batches,
        events,
        bytes as f64 / 1048576.0
    );

    let mut decode = Vec::new();
    let mut ingest = Vec::new();
    let mut duplicate = Vec::new();
    for _ in 0..RUNS {
        let mut decoder = BatchDecoder::new().unwrap();
        let started = Instant::now();
        let mut decoded_events = 0usize;
        for (_, payload) in &payloads {
            decoded_events += decoder.decode(payload).unwrap().events.len();
        }
        assert_eq!(decoded_events as f64, events);
        decode.push(events / started.elapsed().as_secs_f64());

        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_path(&dir.path().join("bench.redb")).unwrap();
        let mut ingestor = Ingestor::new(store, IngestConfig::default()).unwrap();
        for (label, sink) in [("ingest", &mut ingest), ("duplicate", &mut duplicate)] {
            let started = Instant::now();
            let mut new_events = 0;
            for group in payloads.chunks(GROUP) {
                let incoming: Vec<Incoming<'_>> = group
                    .iter()
                    .map(|(topic, payload)| Incoming { topic, payload })
                    .collect();
                new_events += ingestor
                    .ingest(&incoming, ARRIVAL)
                    .unwrap()
                    .stats
                    .events_new;
            }
            if label == "ingest" {
                assert_eq!(new_events as f64, events);
            } else {
                assert_eq!(new_events, 0);
            }
            sink.push(events / started.elapsed().as_secs_f64());
        }
    }
    let decode = median(&mut decode);
    let ingest = median(&mut ingest);
    let duplicate = median(&mut duplicate);
    println!("| path | events/s (median) | batches/s | vs decode-only |");
    println!("|---|---|---|---|");
    for (name, rate) in [
        ("decode only (baseline)", decode),
        ("full ingest, new batches", ingest),
        ("full ingest, re-sent batches", duplicate),
    ] {
        println!(
            "| {name} | {:.0} | {:.0} | {:.2}× |",
            rate,
            rate / EVENTS_PER_BATCH as f64,
            rate / decode
        );
    }
}
