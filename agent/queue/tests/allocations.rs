//! The agent's steady state appends without allocating: the queue's pending buffers, scratch
//! encoding buffer and fixed-capacity index are reused. (`append_encoded` decodes its input once
//! to validate it and does allocate; the agent's own events go through `append`.) Measured with a counting allocator (this
//! test binary's global allocator). Flushes and reads allocate inside redb (transactions, pages);
//! their counts are printed for the record, not asserted.
#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

mod util;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use edgewatch_proto::v1::Tier;
use edgewatch_queue::{BatchLimits, Queue};
use util::*;

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
}

#[test]
fn appends_in_the_steady_state_do_not_allocate() {
    let dir = tempfile::tempdir().unwrap();
    let (mut queue, _) = Queue::open(roomy_config(dir.path()), t0()).unwrap();
    let events: Vec<_> = (0..3).map(|i| named_event(&format!("e{i}"), 300)).collect();
    let tiers = [Tier::Safety, Tier::Slo, Tier::Debug];
    let limits = BatchLimits::default();
    let mut now = 0;
    let round = |queue: &mut Queue, now: &mut u64| -> (u64, u64, u64) {
        let before = allocations();
        for i in 0..300 {
            *now += 1;
            queue
                .append(tiers[i % 3], &events[i % 3], at_ms(*now))
                .unwrap();
            queue
                .append(tiers[(i + 1) % 3], &events[(i + 1) % 3], at_ms(*now))
                .unwrap();
        }
        let appends = allocations() - before;
        let before = allocations();
        queue.flush(at_ms(*now)).unwrap();
        let flush = allocations() - before;
        let before = allocations();
        while let Some(batch) = queue.next_batch(limits).unwrap() {
            let (tier, first, last) = (batch.tier(), batch.first_seq(), batch.last_seq());
            queue.ack(tier, first..=last, at_ms(*now));
        }
        let read = allocations() - before;
        (appends, flush, read)
    };
    // Warm-up: buffers reach their working size.
    for _ in 0..3 {
        round(&mut queue, &mut now);
    }
    let (appends, flush, read) = round(&mut queue, &mut now);
    println!("600 appends: {appends} allocations; one flush: {flush}; reads and acks: {read}");
    assert_eq!(appends, 0, "600 appends allocated {appends} times");
}
