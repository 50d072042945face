//! Cost of `ProbeWriter::record` on a real /dev/shm mapping, against a no-op baseline measured
//! in the same run, alone and with an agent-like reader polling the ring from another thread.
//!
//! Run: `cargo bench -p loop-probe --bench record`; medians are in
//! `target/criterion/record/*/new/estimates.json` (`median.point_estimate`, ns).
#![allow(clippy::unwrap_used)]

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use criterion::{Criterion, criterion_group, criterion_main};
use loop_probe::{Cycle, ProbeReader, ProbeWriter, Record, WriterConfig, clock::monotonic_ns};

/// What a loop pays to hand a cycle to a function that does nothing with it.
#[inline(never)]
fn noop(c: &Cycle) -> u32 {
    black_box(c.flags)
}

fn cycle(i: u64) -> Cycle {
    Cycle {
        cycle: i,
        release_ns: i * 1_000_000,
        start_ns: i * 1_000_000 + 20_000,
        duration_ns: 300_000 + (i & 0xff) * 1000,
        flags: 0,
    }
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::Builder::new()
        .prefix("loop-probe-bench")
        .tempdir_in("/dev/shm")
        .unwrap();
    let path = dir.path().join("bench.probe");
    let mut w =
        ProbeWriter::create(&path, &WriterConfig::new(1, "bench", 1_000_000, 400_000)).unwrap();
    let mut g = c.benchmark_group("record");
    let mut i = 0u64;
    g.bench_function("noop_baseline", |b| {
        b.iter(|| {
            i += 1;
            noop(black_box(&cycle(i)))
        })
    });
    g.bench_function("record", |b| {
        b.iter(|| {
            i += 1;
            w.record(black_box(&cycle(i)))
        })
    });
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let stop = stop.clone();
        let path = path.clone();
        std::thread::spawn(move || {
            let mut r = ProbeReader::open(&path).unwrap();
            let mut sum = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let _ = r.poll(monotonic_ns(), &mut |rec: &Record| sum += rec.duration_ns);
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            sum
        })
    };
    g.bench_function("record_with_reader_polling_1khz", |b| {
        b.iter(|| {
            i += 1;
            w.record(black_box(&cycle(i)))
        })
    });
    g.finish();
    stop.store(true, Ordering::Relaxed);
    black_box(reader.join().unwrap());
}

criterion_group!(benches, bench);
criterion_main!(benches);
