//! Ingest throughput on one core: the whole ingest path (decode + validate + dedup + normalize +
//! one durable redb commit per group) against a decode-only baseline on the same payloads, in the
//! same run, decoded as the ingest path decodes them (each batch over the one before). Prints
//! medians of several runs.
//!
//! Run: `cargo bench -p edgewatch-gateway --bench ingest`

#![allow(clippy::unwrap_used, clippy::print_stdout)]

mod ingest_payloads;

use std::time::Instant;

use edgewatch_gateway::config::IngestConfig;
use edgewatch_gateway::ingest::{Incoming, Ingestor};
use edgewatch_gateway::store::Store;
use edgewatch_proto::framing::BatchDecoder;
use edgewatch_proto::v1::Batch;
use edgewatch_test_kit::alloc::CountingAllocator;
use ingest_payloads::{EVENTS_PER_BATCH, GROUP, loadavg, median, write_bytes};

/// Counts allocations per event: one relaxed atomic and a thread-local per call, the same for
/// every path.
#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator::new();

const RUNS: usize = 5;
const ARRIVAL: i64 = 1_800_000_000_000_000_000;

/// CPU time of this thread (s): unlike the wall clock, barely moved by other jobs on the
/// machine (it leaves out the waits for the disk).
fn thread_cpu() -> f64 {
    ingest_payloads::cpu_seconds(libc::CLOCK_THREAD_CPUTIME_ID)
}

fn main() {
    println!("load average before: {}", loadavg());
    let payloads = ingest_payloads::payloads(ARRIVAL);
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
    // CPU µs per event, per path.
    let mut cpu = [Vec::new(), Vec::new(), Vec::new()];
    // Allocations per event, per path (the same in every run).
    let mut allocations = [0.0; 3];
    // KiB written to the device per group of messages, per ingest path.
    let mut written = [Vec::new(), Vec::new()];
    // Size of the store file once every batch is stored.
    let mut file_bytes = 0;
    for _ in 0..RUNS {
        // The decoder as the ingest path uses it: each batch decoded over the one before.
        let mut decoder = BatchDecoder::new().unwrap();
        let mut batch = Batch::default();
        let allocated = ALLOCATOR.allocations_on_this_thread();
        let cpu_started = thread_cpu();
        let started = Instant::now();
        let mut decoded_events = 0usize;
        for (_, payload) in &payloads {
            decoder.decode_into(payload, &mut batch).unwrap();
            decoded_events += batch.events.len();
        }
        assert_eq!(decoded_events as f64, events);
        decode.push(events / started.elapsed().as_secs_f64());
        cpu[0].push((thread_cpu() - cpu_started) * 1e6 / events);
        allocations[0] = (ALLOCATOR.allocations_on_this_thread() - allocated) as f64 / events;

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("bench.redb");
        let store = Store::open_path(&file).unwrap();
        let mut ingestor = Ingestor::new(store, IngestConfig::default()).unwrap();
        for (label, sink) in [("ingest", &mut ingest), ("duplicate", &mut duplicate)] {
            let allocated = ALLOCATOR.allocations_on_this_thread();
            let written_before = write_bytes();
            let cpu_started = thread_cpu();
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
            let path = if label == "ingest" { 1 } else { 2 };
            cpu[path].push((thread_cpu() - cpu_started) * 1e6 / events);
            allocations[path] =
                (ALLOCATOR.allocations_on_this_thread() - allocated) as f64 / events;
            written[path - 1].push(
                (write_bytes() - written_before) as f64
                    / 1024.0
                    / payloads.chunks(GROUP).len() as f64,
            );
            if label == "ingest" {
                file_bytes = std::fs::metadata(&file).unwrap().len();
            }
        }
    }
    let decode = median(&mut decode);
    let ingest = median(&mut ingest);
    let duplicate = median(&mut duplicate);
    let cpu = cpu.map(|mut runs| median(&mut runs));
    let written = written.map(|mut runs| median(&mut runs));
    println!(
        "| path | events/s (median) | batches/s | vs decode-only | CPU µs per event | vs decode-only, CPU | allocations per event |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (((name, rate), cpu_us), allocs) in [
        ("decode only (baseline)", decode),
        ("full ingest, new batches", ingest),
        ("full ingest, re-sent batches", duplicate),
    ]
    .into_iter()
    .zip(cpu)
    .zip(allocations)
    {
        println!(
            "| {name} | {:.0} | {:.0} | {:.2}× | {cpu_us:.2} | {:.2}× | {allocs:.1} |",
            rate,
            rate / EVENTS_PER_BATCH as f64,
            rate / decode,
            cpu[0] / cpu_us
        );
    }
    println!(
        "KiB written per group of {GROUP} (median): new batches {:.0}, re-sent batches {:.0}",
        written[0], written[1]
    );
    println!(
        "store file after the new batches: {:.1} MiB",
        file_bytes as f64 / 1048576.0
    );
    println!("load average after: {}", loadavg());
}
