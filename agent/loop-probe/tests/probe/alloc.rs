//! Steady state allocates nothing: the record path and every reader method after `open`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use loop_probe::{AutonomyMode, ProbeReader, ProbeWriter, Record, clock::monotonic_ns};

use crate::util::{config, cycle, probe_path, scratch};

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator; only counts, per thread.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|a| a.set(a.get() + 1));
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.with(|a| a.set(a.get() + 1));
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

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
    let before = allocations();
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
    let after = allocations();
    assert_eq!(after - before, 0, "allocations in steady state");
    assert!(seen > 0);
}
