//! Flush scheduling: a safety commit carries the SLO and debug appends waiting beside it only while
//! they are small ([`SAFETY_CARRY_BYTES`]), leaves them waiting otherwise, leaves
//! acknowledgements waiting alone for their own interval (no state write per safety event),
//! never separates a key-value entry from the appends made ahead of it nor a safety append from
//! the entry staged after it, and an append that flushed by itself makes the next flush due at
//! once.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

mod util;

use std::time::{Duration, UNIX_EPOCH};

use edgewatch_proto::v1::Tier;
use edgewatch_queue::Queue;
use edgewatch_queue::queue::SAFETY_CARRY_BYTES;
use util::*;

/// Debug appends of 1 KiB each, `bytes` in all (rounded up).
fn append_debug(queue: &mut Queue, bytes: u64, at: u64) -> u64 {
    let count = bytes.div_ceil(1024);
    for i in 0..count {
        queue
            .append(Tier::Debug, &named_event(&format!("d{i}"), 1024), at_ms(at))
            .unwrap();
    }
    count
}

#[test]
fn a_safety_commit_leaves_a_large_bulk_waiting_for_its_own_interval() {
    let dir = tempfile::tempdir().unwrap();
    let (mut queue, _) = Queue::open(roomy_config(dir.path()), t0()).unwrap();
    let debug = append_debug(&mut queue, SAFETY_CARRY_BYTES * 2, 0);
    let safety = queue
        .append(Tier::Safety, &named_event("s", 10), at_ms(5))
        .unwrap();
    // The safety deadline (5 ms + 10 ms) comes first.
    assert_eq!(queue.next_flush_at(), Some(at_ms(15)));
    let outcome = queue.flush_scheduled(at_ms(15)).unwrap();
    assert!(outcome.committed);
    assert_eq!(outcome.durable.safety, safety);
    assert_eq!(outcome.durable.debug, 0, "the bulk waits");
    assert_eq!(outcome.written.safety, 1);
    assert_eq!(queue.pending_records() as u64, debug);
    assert_eq!(queue.durable_seq(Tier::Debug), 0);
    // The bulk keeps its own deadline, from its oldest append.
    assert_eq!(queue.next_flush_at(), Some(at_ms(1000)));
    let outcome = queue.flush_scheduled(at_ms(1000)).unwrap();
    assert_eq!(outcome.durable.debug, debug);
    assert_eq!(queue.pending_records(), 0);
    // Everything read back, under its number, once.
    let all = read_everything(&mut queue);
    assert_eq!(all.len() as u64, debug + 1);
    assert_eq!(name_of(&all[&(Tier::Safety, safety)]), Some("s"));
    assert_eq!(
        name_of(&all[&(Tier::Debug, debug)]),
        Some(&*format!("d{}", debug - 1))
    );
}

#[test]
fn a_small_bulk_rides_with_the_safety_commit() {
    let dir = tempfile::tempdir().unwrap();
    let (mut queue, _) = Queue::open(roomy_config(dir.path()), t0()).unwrap();
    let debug = append_debug(&mut queue, SAFETY_CARRY_BYTES / 2, 0);
    queue
        .append(Tier::Safety, &named_event("s", 10), at_ms(5))
        .unwrap();
    let outcome = queue.flush_scheduled(at_ms(15)).unwrap();
    assert_eq!(outcome.durable.safety, 1);
    assert_eq!(outcome.durable.debug, debug);
    assert_eq!(queue.pending_records(), 0);
    assert_eq!(queue.next_flush_at(), None);
}

#[test]
fn a_key_value_entry_staged_after_a_safety_append_goes_with_it_in_a_full_commit() {
    let dir = tempfile::tempdir().unwrap();
    let (mut queue, _) = Queue::open(roomy_config(dir.path()), t0()).unwrap();
    let debug = append_debug(&mut queue, SAFETY_CARRY_BYTES * 2, 0);
    queue
        .append(Tier::Safety, &named_event("s", 10), at_ms(5))
        .unwrap();
    // The entry may describe the safety append (a count of interventions): the two go together,
    // and with them everything appended before the entry.
    queue.stage_kv("ingest/counts", b"1").unwrap();
    let outcome = queue.flush_scheduled(at_ms(15)).unwrap();
    assert_eq!(outcome.durable.safety, 1);
    assert_eq!(outcome.durable.debug, debug);
    drop(queue);
    let (queue, _) = Queue::open(roomy_config(dir.path()), at_ms(20)).unwrap();
    assert_eq!(queue.kv("ingest/counts"), Some(&b"1"[..]));
}

#[test]
fn a_key_value_entry_staged_before_the_safety_append_waits_for_the_bulk_ahead_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let (mut queue, _) = Queue::open(roomy_config(dir.path()), t0()).unwrap();
    append_debug(&mut queue, SAFETY_CARRY_BYTES * 2, 0);
    // A sampler's state, describing the debug appends before it.
    queue
        .stage_kv("sampler/0", b"after the debug appends")
        .unwrap();
    queue
        .append(Tier::Safety, &named_event("s", 10), at_ms(5))
        .unwrap();
    let outcome = queue.flush_scheduled(at_ms(15)).unwrap();
    assert_eq!((outcome.durable.safety, outcome.durable.debug), (1, 0));
    // A crash now (no further flush): the safety record survives; the entry does not, since the
    // appends it describes did not.
    drop(queue);
    let (mut queue, _) = Queue::open(roomy_config(dir.path()), at_ms(20)).unwrap();
    assert_eq!(queue.kv("sampler/0"), None);
    let all = read_everything(&mut queue);
    assert_eq!(all.len(), 1);
    assert_eq!(name_of(&all[&(Tier::Safety, 1)]), Some("s"));
    // The restarted queue numbers on from what is durable: debug starts at 1 again (nothing of
    // it was ever durable, read or acknowledged), safety at 2.
    assert_eq!(queue.durable_seq(Tier::Debug), 0);
    assert_eq!(
        queue
            .append(Tier::Safety, &named_event("s2", 10), at_ms(21))
            .unwrap(),
        2
    );
}

#[test]
fn a_safety_commit_with_the_bulk_overdue_is_a_full_flush() {
    let dir = tempfile::tempdir().unwrap();
    let (mut queue, _) = Queue::open(roomy_config(dir.path()), t0()).unwrap();
    let debug = append_debug(&mut queue, SAFETY_CARRY_BYTES * 2, 0);
    queue
        .append(Tier::Safety, &named_event("s", 10), at_ms(995))
        .unwrap();
    let outcome = queue.flush_scheduled(at_ms(1005)).unwrap();
    assert_eq!((outcome.durable.safety, outcome.durable.debug), (1, debug));
    // A wall clock that stepped back behind the oldest append is not waited for either.
    let debug2 = append_debug(&mut queue, SAFETY_CARRY_BYTES * 2, 5000);
    queue
        .append(Tier::Safety, &named_event("s", 10), at_ms(5000))
        .unwrap();
    let outcome = queue.flush_scheduled(at_ms(2000)).unwrap();
    assert_eq!(
        (outcome.durable.safety, outcome.durable.debug),
        (2, debug + debug2)
    );
}

#[test]
fn an_append_that_flushed_by_itself_makes_the_next_flush_due_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = roomy_config(dir.path());
    config.max_pending_bytes = 64 * 1024;
    let (mut queue, _) = Queue::open(config, t0()).unwrap();
    let mut appended = 0;
    while queue.pending_records() == appended {
        queue
            .append(Tier::Slo, &named_event("x", 1024), at_ms(0))
            .unwrap();
        appended += 1;
    }
    // The buffer filled and the append flushed it: the caller is owed that flush's outcome.
    assert_eq!(queue.next_flush_at(), Some(UNIX_EPOCH));
    assert!(queue.flush_due(at_ms(1)));
    let outcome = queue.flush_scheduled(at_ms(1)).unwrap();
    assert_eq!(outcome.durable.slo, appended as u64);
    assert_eq!(queue.next_flush_at(), None);
    // The durable numbers of an idle queue stay where they are.
    let again = queue
        .flush_scheduled(at_ms(2) + Duration::from_secs(5))
        .unwrap();
    assert!(!again.committed);
    assert_eq!(again.durable, outcome.durable);
}

#[test]
fn an_acknowledgement_waiting_alone_keeps_its_own_interval_instead_of_riding_with_a_safety_commit()
{
    // At a steady rate each safety event is acknowledged before the next is appended: carried by
    // the next event's commit, every acknowledgement would add a state slot's write and
    // `fdatasync` to it. Waiting for its own interval, one state write carries a second's worth.
    let dir = tempfile::tempdir().unwrap();
    let (mut queue, _) = Queue::open(roomy_config(dir.path()), t0()).unwrap();
    let epoch = queue.epoch();
    queue
        .append(Tier::Safety, &named_event("s1", 10), at_ms(0))
        .unwrap();
    queue.flush_scheduled(at_ms(10)).unwrap();
    assert!(queue.ack(Tier::Safety, epoch, 1..=1, at_ms(20)));
    queue
        .append(Tier::Safety, &named_event("s2", 10), at_ms(25))
        .unwrap();
    assert_eq!(queue.next_flush_at(), Some(at_ms(35)));
    let outcome = queue.flush_scheduled(at_ms(35)).unwrap();
    assert_eq!(outcome.durable.safety, 2);
    assert_eq!(
        queue.next_flush_at(),
        Some(at_ms(20) + Duration::from_secs(1)),
        "the acknowledgement waits for the bulk interval"
    );
    // A crash now loses the acknowledgement, not a record: the first is sent again (the gateway
    // de-duplicates), as after any acknowledgement not yet flushed.
    drop(queue);
    let (mut queue, _) = Queue::open(roomy_config(dir.path()), at_ms(40)).unwrap();
    let all = read_everything(&mut queue);
    assert_eq!(
        all.keys().copied().collect::<Vec<_>>(),
        vec![(Tier::Safety, 1), (Tier::Safety, 2)]
    );
    // At its deadline it is written, with the others of that second.
    assert!(queue.ack(Tier::Safety, epoch, 1..=1, at_ms(50)));
    queue
        .append(Tier::Safety, &named_event("s3", 10), at_ms(60))
        .unwrap();
    queue.flush_scheduled(at_ms(70)).unwrap();
    assert!(queue.ack(Tier::Safety, epoch, 2..=3, at_ms(80)));
    assert_eq!(queue.next_flush_at(), Some(at_ms(1050)));
    let outcome = queue.flush_scheduled(at_ms(1050)).unwrap();
    assert!(outcome.committed);
    assert_eq!(queue.next_flush_at(), None);
    drop(queue);
    let (mut queue, _) = Queue::open(roomy_config(dir.path()), at_ms(2000)).unwrap();
    assert!(read_everything(&mut queue).is_empty());
}
