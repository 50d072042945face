//! Ingest throughput: the whole ingest path (decode + validate + dedup + normalize + one durable
//! redb commit per group) against a decode-only baseline on the same payloads, in the same run,
//! decoded as the ingest path decodes them (each batch over the one before). The ingest path runs
//! twice per run, into a fresh store each time: decoding inline (one thread) and decoding ahead
//! on a second thread (`Decoding::Ahead`, what a gateway with two cores does). Prints medians of
//! several runs; CPU time and allocations are the whole process's (both threads).
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
use ingest_payloads::{DECODINGS, EVENTS_PER_BATCH, GROUP, loadavg, median, write_bytes};

/// Counts allocations per event: one relaxed atomic and a thread-local per call, the same for
/// every path.
#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator::new();

const RUNS: usize = 5;
const ARRIVAL: i64 = 1_800_000_000_000_000_000;

/// CPU time of this process, every thread (s): unlike the wall clock, barely moved by other jobs
/// on the machine (it leaves out the waits for the disk).
fn process_cpu() -> f64 {
    ingest_payloads::cpu_seconds(libc::CLOCK_PROCESS_CPUTIME_ID)
}

/// CPU time of this thread (s): the thread that writes the store, where a second one decodes.
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

    // Events/s per path: decode only, then for each decoding new batches and re-sent batches.
    let paths = 1 + 2 * DECODINGS.len();
    let mut rate = vec![Vec::new(); paths];
    // CPU µs per event, per path.
    let mut cpu = vec![Vec::new(); paths];
    // Of it, the thread that writes the store (the bench's own).
    let mut writer_cpu = vec![Vec::new(); paths];
    // Allocations per event, per path (the same in every run).
    let mut allocations = vec![0.0; paths];
    // KiB written to the device per group of messages, per ingest path.
    let mut written = vec![Vec::new(); paths];
    // Size of the store file once every batch is stored, per decoding.
    let mut file_bytes = [0; DECODINGS.len()];
    for _ in 0..RUNS {
        // The decoder as the ingest path uses it: each batch decoded over the one before.
        let mut decoder = BatchDecoder::new().unwrap();
        let mut batch = Batch::default();
        let allocated = ALLOCATOR.allocations();
        let cpu_started = process_cpu();
        let started = Instant::now();
        let mut decoded_events = 0usize;
        for (_, payload) in &payloads {
            decoder.decode_into(payload, &mut batch).unwrap();
            decoded_events += batch.events.len();
        }
        assert_eq!(decoded_events as f64, events);
        rate[0].push(events / started.elapsed().as_secs_f64());
        cpu[0].push((process_cpu() - cpu_started) * 1e6 / events);
        writer_cpu[0].push((process_cpu() - cpu_started) * 1e6 / events);
        allocations[0] = (ALLOCATOR.allocations() - allocated) as f64 / events;

        for (index, (_, decoding)) in DECODINGS.into_iter().enumerate() {
            let dir = tempfile::tempdir().unwrap();
            let file = dir.path().join("bench.redb");
            let store = Store::open_path(&file).unwrap();
            let mut ingestor = Ingestor::new(store, IngestConfig::default()).unwrap();
            ingestor.set_decoding(decoding);
            for resent in [false, true] {
                let path = 1 + 2 * index + usize::from(resent);
                let allocated = ALLOCATOR.allocations();
                let written_before = write_bytes();
                let cpu_started = process_cpu();
                let writer_cpu_started = thread_cpu();
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
                if resent {
                    assert_eq!(new_events, 0);
                } else {
                    assert_eq!(new_events as f64, events);
                }
                rate[path].push(events / started.elapsed().as_secs_f64());
                cpu[path].push((process_cpu() - cpu_started) * 1e6 / events);
                writer_cpu[path].push((thread_cpu() - writer_cpu_started) * 1e6 / events);
                allocations[path] = (ALLOCATOR.allocations() - allocated) as f64 / events;
                written[path].push(
                    (write_bytes() - written_before) as f64
                        / 1024.0
                        / payloads.chunks(GROUP).len() as f64,
                );
                if !resent {
                    file_bytes[index] = std::fs::metadata(&file).unwrap().len();
                }
            }
        }
    }
    let rate: Vec<f64> = rate.into_iter().map(|mut runs| median(&mut runs)).collect();
    let cpu: Vec<f64> = cpu.into_iter().map(|mut runs| median(&mut runs)).collect();
    let writer_cpu: Vec<f64> = writer_cpu
        .into_iter()
        .map(|mut runs| median(&mut runs))
        .collect();
    let written: Vec<f64> = written
        .into_iter()
        .map(|mut runs| {
            if runs.is_empty() {
                0.0
            } else {
                median(&mut runs)
            }
        })
        .collect();
    println!(
        "| path | events/s (median) | batches/s | vs decode-only | CPU µs per event | of it, the writing thread | vs decode-only, CPU | allocations per event | KiB written per group |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut names = vec!["decode only (baseline)".to_owned()];
    for (name, _) in DECODINGS {
        names.push(format!("full ingest, new batches, {name}"));
        names.push(format!("full ingest, re-sent batches, {name}"));
    }
    for (path, name) in names.iter().enumerate() {
        println!(
            "| {name} | {:.0} | {:.0} | {:.2}× | {:.2} | {:.2} | {:.2}× | {:.1} | {:.0} |",
            rate[path],
            rate[path] / EVENTS_PER_BATCH as f64,
            rate[path] / rate[0],
            cpu[path],
            writer_cpu[path],
            cpu[0] / cpu[path],
            allocations[path],
            written[path],
        );
    }
    for ((name, _), bytes) in DECODINGS.iter().zip(file_bytes) {
        println!(
            "store file after the new batches, {name}: {:.1} MiB",
            bytes as f64 / 1048576.0
        );
    }
    println!("load average after: {}", loadavg());
}
