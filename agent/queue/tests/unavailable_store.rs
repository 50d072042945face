//! A store that cannot be opened for a reason other than corruption (here its path is a file
//! where the log's directory should be; on a machine, EIO from a failing eMMC or ENOSPC during
//! recovery):
//! `open_or_hold` runs without it, holds safety appends in memory, refuses and counts the
//! others, retries with backoff, and once the store opens numbers the held appends in its epoch
//! and writes them, once.
#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

mod util;

use edgewatch_proto::v1::{LossCause, Tier};
use edgewatch_queue::{AppendError, Queue, QueueError};
use util::*;

#[test]
fn a_store_that_cannot_be_opened_holds_safety_appends_and_writes_them_once_it_opens() {
    let dir = tempfile::tempdir().unwrap();
    let (epoch, kept) = {
        let (mut queue, _) = Queue::open(roomy_config(dir.path()), t0()).unwrap();
        for name in ["s1", "s2"] {
            queue
                .append(Tier::Safety, &named_event(name, 10), at_ms(1))
                .unwrap();
        }
        queue
            .append(Tier::Slo, &named_event("o1", 10), at_ms(1))
            .unwrap();
        queue.stage_kv("stored", b"before").unwrap();
        queue.flush(at_ms(2)).unwrap();
        (queue.epoch(), queue.durable_seq(Tier::Safety))
    };
    assert_eq!(kept, 2);
    let db = dir.path().join(STORE);
    let aside = dir.path().join("queue.log.aside");
    std::fs::rename(&db, &aside).unwrap();
    // A file where the store's directory should be: opening fails, and not as corruption.
    std::fs::write(&db, b"").unwrap();

    assert!(matches!(
        Queue::open(roomy_config(dir.path()), at_ms(0)),
        Err(QueueError::StoreUnavailable { .. })
    ));
    let start = 10_000;
    let (mut queue, report) = Queue::open_or_hold(roomy_config(dir.path()), at_ms(start)).unwrap();
    assert!(report.unavailable.is_some());
    assert_eq!(report.epoch, 0);
    assert_eq!(queue.epoch(), 0, "no epoch is known yet");
    let fault = queue.store_fault().unwrap();
    assert!(fault.never_opened);
    assert_eq!(fault.attempts, 1);
    assert_eq!(fault.since, at_ms(start));
    assert_eq!(fault.next_attempt, at_ms(start + 1_000));

    for name in ["h1", "h2"] {
        queue
            .append(Tier::Safety, &named_event(name, 10), at_ms(start + 10))
            .unwrap();
    }
    assert_eq!(
        queue.append(Tier::Slo, &named_event("refused", 10), at_ms(start + 10)),
        Err(AppendError::StoreUnavailable)
    );
    queue.stage_kv("staged", b"while held").unwrap();
    assert_eq!(queue.store_fault().unwrap().held_safety, 2);
    assert!(!queue.status(at_ms(start + 10)).store_available);
    assert!(
        queue.next_batch(Default::default()).unwrap().is_none(),
        "nothing is readable"
    );

    // Attempts follow the backoff: 1 s, then 2 s, then 4 s after each failure.
    assert_eq!(queue.next_flush_at(), Some(at_ms(start + 1_000)));
    assert!(queue.flush(at_ms(start + 500)).is_err());
    assert_eq!(
        queue.store_fault().unwrap().attempts,
        1,
        "not due: not tried"
    );
    assert!(queue.flush(at_ms(start + 1_000)).is_err());
    let fault = queue.store_fault().unwrap();
    assert_eq!(
        (fault.attempts, fault.next_attempt),
        (2, at_ms(start + 3_000))
    );
    assert!(queue.flush(at_ms(start + 3_000)).is_err());
    let fault = queue.store_fault().unwrap();
    assert_eq!(
        (fault.attempts, fault.next_attempt),
        (3, at_ms(start + 7_000))
    );

    // The store can be opened again.
    std::fs::remove_file(&db).unwrap();
    std::fs::rename(&aside, &db).unwrap();
    assert!(queue.flush(at_ms(start + 6_999)).is_err(), "not yet due");
    let outcome = queue.flush(at_ms(start + 7_000)).unwrap();
    assert_eq!(outcome.epoch, epoch, "the store's own epoch");
    assert_eq!(queue.epoch(), epoch);
    assert!(queue.store_fault().is_none());
    assert!(queue.status(at_ms(start + 7_000)).store_available);
    assert_eq!(
        outcome.durable.safety, 4,
        "the held appends follow the stored ones"
    );

    let all = read_everything(&mut queue);
    let names = |tier: Tier| -> Vec<(u64, String)> {
        all.iter()
            .filter(|((t, _), _)| *t == tier)
            .filter_map(|((_, seq), event)| name_of(event).map(|n| (*seq, n.to_owned())))
            .collect()
    };
    assert_eq!(
        names(Tier::Safety),
        [(1, "s1"), (2, "s2"), (3, "h1"), (4, "h2")].map(|(s, n)| (s, n.to_owned()))
    );
    assert_eq!(names(Tier::Slo), [(1, "o1".to_owned())]);
    let refused: Vec<_> = all
        .values()
        .filter_map(queue_loss)
        .map(|loss| (loss.tier, loss.cause, loss.count, loss.epoch))
        .collect();
    assert_eq!(
        refused,
        [(Tier::Slo as i32, LossCause::DiskFull as i32, 1, epoch)]
    );
    // The key-value area: the stored entry is back, the one staged meanwhile is written.
    assert_eq!(queue.kv("stored"), Some(&b"before"[..]));
    assert_eq!(queue.kv("staged"), Some(&b"while held"[..]));
    drop(queue);
    let (queue, report) = Queue::open(roomy_config(dir.path()), at_ms(start + 8_000)).unwrap();
    assert!(report.quarantined.is_none());
    assert_eq!(queue.kv("staged"), Some(&b"while held"[..]));
    assert_eq!(queue.durable_seq(Tier::Safety), 4);
}

#[test]
fn reopen_attempts_back_off_to_their_maximum_and_start_again_after_a_commit() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(STORE), b"").unwrap();
    let (mut queue, _) = Queue::open_or_hold(roomy_config(dir.path()), at_ms(0)).unwrap();
    let mut now = 0;
    let mut waits = Vec::new();
    for _ in 0..8 {
        let next = queue.store_fault().unwrap().next_attempt;
        let wait = next.duration_since(at_ms(now)).unwrap();
        waits.push(wait.as_secs());
        now += wait.as_millis() as u64;
        assert!(queue.flush(at_ms(now)).is_err());
    }
    assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30, 30]);
    std::fs::remove_file(dir.path().join(STORE)).unwrap();
    now += 30_000;
    queue.flush(at_ms(now)).unwrap();
    assert!(queue.store_fault().is_none());
    assert_ne!(queue.epoch(), 0, "a new store, with its epoch");
    assert_eq!(queue.status(at_ms(now)).tiers.safety.records, 0);
}
