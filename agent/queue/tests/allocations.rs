//! The agent's steady state appends without allocating: the queue's pending buffers, scratch
//! encoding buffer and fixed-capacity index are reused. `append_encoded` checks its untrusted
//! input against the schema without decoding it into a message, so it does not allocate either;
//! the agent's own events go through `append`. Measured with a counting allocator (this
//! test binary's global allocator). Flushes and reads allocate in the store (a transaction's staged copy of the removal state);
//! their counts are printed for the record, not asserted.
#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

mod util;

use edgewatch_proto::v1::Tier;
use edgewatch_queue::{BatchLimits, Queue};
use edgewatch_test_kit::alloc::CountingAllocator;
use util::*;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator::new();

#[test]
fn appends_in_the_steady_state_do_not_allocate() {
    let dir = tempfile::tempdir().unwrap();
    let (mut queue, _) = Queue::open(roomy_config(dir.path()), t0()).unwrap();
    let events: Vec<_> = (0..3).map(|i| named_event(&format!("e{i}"), 300)).collect();
    let tiers = [Tier::Safety, Tier::Slo, Tier::Debug];
    let limits = BatchLimits::default();
    let mut now = 0;
    let round = |queue: &mut Queue, now: &mut u64| -> (u64, u64, u64) {
        let before = ALLOCATOR.allocations();
        for i in 0..300 {
            *now += 1;
            queue
                .append(tiers[i % 3], &events[i % 3], at_ms(*now))
                .unwrap();
            queue
                .append(tiers[(i + 1) % 3], &events[(i + 1) % 3], at_ms(*now))
                .unwrap();
        }
        let appends = ALLOCATOR.allocations() - before;
        let before = ALLOCATOR.allocations();
        queue.flush(at_ms(*now)).unwrap();
        let flush = ALLOCATOR.allocations() - before;
        let before = ALLOCATOR.allocations();
        while let Some(batch) = queue.next_batch(limits).unwrap() {
            let (tier, epoch, first, last) = (
                batch.tier(),
                batch.epoch(),
                batch.first_seq(),
                batch.last_seq(),
            );
            queue.ack(tier, epoch, first..=last, at_ms(*now));
        }
        let read = ALLOCATOR.allocations() - before;
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

#[test]
fn appends_of_encoded_events_are_checked_without_allocating() {
    use prost::Message;
    let dir = tempfile::tempdir().unwrap();
    let (mut queue, _) = Queue::open(roomy_config(dir.path()), t0()).unwrap();
    let events: Vec<Vec<u8>> = (0..3)
        .map(|i| named_event(&format!("e{i}"), 300).encode_to_vec())
        .collect();
    let tiers = [Tier::Safety, Tier::Slo, Tier::Debug];
    let mut now = 0;
    let mut round = || {
        let before = ALLOCATOR.allocations();
        for i in 0..600 {
            now += 1;
            queue
                .append_encoded(tiers[i % 3], &events[i % 3], at_ms(now))
                .unwrap();
        }
        let appends = ALLOCATOR.allocations() - before;
        queue.flush(at_ms(now)).unwrap();
        appends
    };
    for _ in 0..3 {
        round();
    }
    let appends = round();
    assert_eq!(appends, 0, "600 encoded appends allocated {appends} times");
}

#[test]
fn the_status_snapshot_and_file_size_the_agent_asks_every_second_do_not_allocate() {
    let dir = tempfile::tempdir().unwrap();
    let (mut queue, _) = Queue::open(roomy_config(dir.path()), t0()).unwrap();
    let tiers = [Tier::Safety, Tier::Slo, Tier::Debug];
    for (i, tier) in tiers.into_iter().enumerate() {
        queue
            .append(tier, &named_event(&format!("e{i}"), 300), at_ms(1))
            .unwrap();
    }
    queue.flush(at_ms(1)).unwrap();
    // Warm-up: the snapshot's text buffer reaches its working size.
    queue.refresh_status_snapshot(at_ms(2));
    let (allocations, bytes) = ALLOCATOR.allocations_during(|| {
        let mut bytes = 0;
        for s in 3..103 {
            bytes = queue.file_bytes();
            queue.refresh_status_snapshot(at_ms(s * 1000));
        }
        bytes
    });
    assert!(bytes > 0, "the log's files have a size");
    assert_eq!(
        allocations, 0,
        "100 status refreshes and file sizes allocated {allocations} times"
    );
}
