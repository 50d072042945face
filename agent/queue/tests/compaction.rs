//! Compaction of a log: never due, because drained segments are unlinked as records are
//! removed. The compaction API stays (the agent calls it) and does nothing; the file shrinks
//! with the acknowledgements themselves, and the queue holds exactly what it held.
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
fn a_log_is_never_due_for_compaction_and_shrinks_as_its_backlog_drains() {
    let dir = tempfile::tempdir().unwrap();
    let (mut queue, _) = Queue::open(roomy_config(dir.path()), t0()).unwrap();
    let epoch = queue.epoch();
    for i in 0..40_000u64 {
        queue
            .append(Tier::Debug, &named_event(&format!("d{i}"), 1_000), at_ms(1))
            .unwrap();
        if i % 500 == 499 {
            queue.flush(at_ms(2)).unwrap();
        }
    }
    queue.flush(at_ms(3)).unwrap();
    let full = queue.file_bytes();
    // Most of the backlog is delivered; its newest part is still there, at the log's end.
    assert!(queue.ack(Tier::Debug, epoch, 1..=35_000, at_ms(4)));
    queue.flush(at_ms(5)).unwrap();
    let before = queue.file_bytes();
    assert!(
        before * 2 < full,
        "drained segments are unlinked: {full} -> {before} bytes"
    );
    assert!(!queue.compaction_due(at_ms(6)));
    assert!(queue.begin_compaction(at_ms(6)).is_none());
    // The queue goes on: appends in every tier, acknowledgements, a dead letter and a
    // key-value entry.
    for i in 0..40u64 {
        let tier = [Tier::Safety, Tier::Slo, Tier::Debug][(i % 3) as usize];
        queue
            .append(tier, &named_event(&format!("n{i}"), 200), at_ms(10 + i))
            .unwrap();
        if i % 10 == 9 {
            queue.flush(at_ms(10 + i)).unwrap();
        }
    }
    assert!(queue.ack(Tier::Debug, epoch, 35_001..=35_500, at_ms(60)));
    assert!(queue.dead_letter(Tier::Debug, epoch, 35_600, at_ms(60)));
    queue.stage_kv("cursor", b"35500").unwrap();
    queue.flush(at_ms(61)).unwrap();
    assert!(!queue.compact_if_drained(at_ms(100_000)).unwrap());
    let expected = named(&read_everything(&mut queue));
    assert!(!expected.contains_key(&(Tier::Debug, 35_600)));
    assert_eq!(expected.len(), 4_499 + 40);
    // It opens again as it was.
    drop(queue);
    let (mut queue, report) = Queue::open(roomy_config(dir.path()), at_ms(3_000)).unwrap();
    assert!(report.quarantined.is_none());
    assert_eq!(queue.epoch(), epoch);
    assert_eq!(named(&read_everything(&mut queue)), expected);
    assert_eq!(queue.kv("cursor"), Some(&b"35500"[..]));
    // Once everything is delivered, what is left is small: the state and, per tier, at most a
    // small drained last segment kept for the next appends.
    for tier in [Tier::Safety, Tier::Slo, Tier::Debug] {
        let durable = queue.durable_seq(tier);
        assert!(queue.ack(tier, epoch, 1..=durable, at_ms(3_001)));
    }
    queue.flush(at_ms(3_002)).unwrap();
    let drained = queue.file_bytes();
    assert!(drained < 64 * 1024, "{drained} bytes left");
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
    // Left by the old format's compaction, or a log's directory of that name.
    std::fs::write(dir.path().join("queue.redb.compact"), b"half a copy").unwrap();
    std::fs::create_dir(dir.path().join("queue.log.compact")).unwrap();
    let (mut queue, report) = Queue::open(roomy_config(dir.path()), at_ms(3)).unwrap();
    assert!(report.quarantined.is_none());
    assert!(!dir.path().join("queue.redb.compact").exists());
    assert!(!dir.path().join("queue.log.compact").exists());
    assert_eq!(named(&read_everything(&mut queue)), expected);
}
