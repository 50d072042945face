//! Steady state allocates nothing: the record path and every reader method after `open`.

use edgewatch_test_kit::alloc::CountingAllocator;
use loop_probe::{AutonomyMode, ProbeReader, ProbeWriter, Record, clock::monotonic_ns};

use crate::util::{config, cycle, probe_path, scratch};

/// Counts per thread: tests running beside this one do not disturb it.
#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator::new();

#[test]
fn recording_and_reading_in_steady_state_allocate_nothing() {
    let dir = scratch();
    let path = probe_path(&dir);
    let mut w = ProbeWriter::create(&path, &config(256)).unwrap();
    let mut r = ProbeReader::open(&path).unwrap();
    let h = w.handle().clone();
    let mut seen = 0u64;
    let mut sink = |rec: &Record| seen += rec.cycle;
    // Warm-up pass, then the measured passes.
    w.record(&cycle(0, 1));
    r.poll(monotonic_ns(), &mut sink).unwrap();
    let before = ALLOCATOR.allocations_on_this_thread();
    for i in 1..2000u64 {
        w.record(&cycle(i, if i % 3 == 0 { 10_000_000 } else { 1 }));
        if i % 100 == 0 {
            h.set_autonomy(AutonomyMode::Autonomous, monotonic_ns())
                .unwrap();
            h.set_model_version(i, "steady-1").unwrap();
            h.count_fallback();
            r.poll(monotonic_ns(), &mut sink).unwrap();
            r.summary().unwrap();
            r.model_version().unwrap();
            r.autonomy().unwrap();
            r.liveness(monotonic_ns()).unwrap();
        }
    }
    let after = ALLOCATOR.allocations_on_this_thread();
    assert_eq!(after - before, 0, "allocations in steady state");
    assert!(seen > 0);
}
