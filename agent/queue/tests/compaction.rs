//! Compaction off the caller's thread: a copy of a snapshot of the store runs elsewhere while
//! the queue goes on appending, acknowledging, evicting and committing; the next flush applies
//! what changed since the snapshot and swaps the copy in. Afterwards the queue holds exactly
//! what it would have held without the compaction, in a file a fraction of the size.
#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

mod util;

use std::collections::BTreeMap;

use edgewatch_proto::v1::{Event, Tier};
use edgewatch_queue::Queue;
use util::*;

/// Every named record the queue holds: (tier, seq) → name.
fn named(all: &BTreeMap<(Tier, u64), Event>) -> BTreeMap<(Tier, u64), String> {
    all.iter()
        .filter_map(|(key, event)| name_of(event).map(|name| (*key, name.to_owned())))
        .collect()
}

#[test]
fn a_compaction_copied_while_the_queue_goes_on_swaps_in_exactly_what_the_queue_holds() {
    let dir = tempfile::tempdir().unwrap();
    let (mut queue, _) = Queue::open(roomy_config(dir.path()), t0()).unwrap();
    let epoch = queue.epoch();
    for i in 0..8_000u64 {
        queue
            .append(Tier::Debug, &named_event(&format!("d{i}"), 1_000), at_ms(1))
            .unwrap();
        if i % 500 == 499 {
            queue.flush(at_ms(2)).unwrap();
        }
    }
    queue.flush(at_ms(3)).unwrap();
    // Most of the backlog is delivered; its newest part is still there, at the file's end.
    assert!(queue.ack(Tier::Debug, epoch, 1..=7_000, at_ms(4)));
    queue.flush(at_ms(5)).unwrap();
    let before = queue.file_bytes();
    assert!(
        queue.compaction_due(at_ms(6)),
        "{before} bytes, mostly free"
    );

    let job = queue.begin_compaction(at_ms(6)).unwrap();
    assert!(queue.begin_compaction(at_ms(6)).is_none(), "one at a time");
    // The copy runs (here to its end, so that everything below happens after its snapshot, as
    // it does when it runs on another thread) ...
    let copied = job.run();
    // ... while the queue goes on: appends in every tier, acknowledgements, a dead letter and a
    // key-value entry, each committed to the live store.
    for i in 0..40u64 {
        let tier = [Tier::Safety, Tier::Slo, Tier::Debug][(i % 3) as usize];
        queue
            .append(tier, &named_event(&format!("n{i}"), 200), at_ms(10 + i))
            .unwrap();
        if i % 10 == 9 {
            queue.flush(at_ms(10 + i)).unwrap();
        }
    }
    assert!(queue.ack(Tier::Debug, epoch, 7_001..=7_500, at_ms(60)));
    assert!(queue.dead_letter(Tier::Debug, epoch, 7_600, at_ms(60)));
    queue.stage_kv("cursor", b"7500").unwrap();
    queue.flush(at_ms(61)).unwrap();
    let expected = named(&read_everything(&mut queue));
    let durable = (
        queue.durable_seq(Tier::Safety),
        queue.durable_seq(Tier::Slo),
        queue.durable_seq(Tier::Debug),
    );

    queue.finish_compaction(copied, at_ms(62));
    assert!(
        queue.flush_due(at_ms(62 + 1_000)),
        "the swap is due with the next flush"
    );
    queue.flush(at_ms(62 + 1_000)).unwrap();
    let after = queue.file_bytes();
    assert!(after * 2 < before, "{before} -> {after} bytes");
    assert_eq!(named(&read_everything(&mut queue)), expected);
    assert_eq!(queue.epoch(), epoch);
    assert_eq!(
        (
            queue.durable_seq(Tier::Safety),
            queue.durable_seq(Tier::Slo),
            queue.durable_seq(Tier::Debug),
        ),
        durable
    );
    assert_eq!(queue.kv("cursor"), Some(&b"7500"[..]));
    // A working queue, which opens again as it was.
    queue
        .append(Tier::Safety, &named_event("after", 1), at_ms(2_000))
        .unwrap();
    queue.flush(at_ms(2_001)).unwrap();
    let expected = named(&read_everything(&mut queue));
    drop(queue);
    assert!(!dir.path().join("queue.redb.compact").exists());
    let (mut queue, report) = Queue::open(roomy_config(dir.path()), at_ms(3_000)).unwrap();
    assert!(report.quarantined.is_none());
    assert_eq!(named(&read_everything(&mut queue)), expected);
    assert_eq!(queue.kv("cursor"), Some(&b"7500"[..]));
}

#[test]
fn a_copy_left_by_a_crash_before_its_swap_is_dropped_and_the_store_is_whole() {
    let dir = tempfile::tempdir().unwrap();
    let (mut queue, _) = Queue::open(roomy_config(dir.path()), t0()).unwrap();
    for i in 0..3 {
        queue
            .append(Tier::Safety, &named_event(&format!("s{i}"), 10), at_ms(1))
            .unwrap();
    }
    queue.flush(at_ms(2)).unwrap();
    let expected = named(&read_everything(&mut queue));
    drop(queue);
    std::fs::write(dir.path().join("queue.redb.compact"), b"half a copy").unwrap();
    let (mut queue, report) = Queue::open(roomy_config(dir.path()), at_ms(3)).unwrap();
    assert!(report.quarantined.is_none());
    assert!(!dir.path().join("queue.redb.compact").exists());
    assert_eq!(named(&read_everything(&mut queue)), expected);
}
