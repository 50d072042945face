//! What the uplink asks of the queue besides reading: acknowledgements that carry the epoch of the
//! read they answer, a record given up on (dead-lettered) as a counted and reported loss, and a
//! tier's reads rewound to send a split batch in parts.
#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

mod util;

use edgewatch_proto::v1::{LossCause, Tier};
use edgewatch_queue::{BatchLimits, Queue};
use util::*;

const ALL: BatchLimits = BatchLimits {
    max_records: 1000,
    max_bytes: 1 << 20,
};

#[test]
fn an_acknowledgement_from_another_epoch_deletes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (mut queue, _) = Queue::open(roomy_config(dir.path()), t0()).unwrap();
    for i in 0..3 {
        queue
            .append(Tier::Slo, &named_event(&format!("s{i}"), 1), at_ms(1))
            .unwrap();
    }
    queue.flush(at_ms(2)).unwrap();
    let epoch = queue.epoch();
    let batch = queue.next_batch(ALL).unwrap().unwrap();
    assert_eq!(
        (batch.epoch(), batch.first_seq(), batch.last_seq()),
        (epoch, 1, 3)
    );
    assert!(!queue.ack(Tier::Slo, epoch ^ 1, 1..=3, at_ms(3)));
    queue.flush(at_ms(4)).unwrap();
    assert_eq!(queue.status(at_ms(4)).tiers.slo.records, 3);
    queue.requeue_unacked();
    let again = queue.next_batch(ALL).unwrap().unwrap();
    assert_eq!((again.first_seq(), again.last_seq()), (1, 3));
}

/// A publish read in one epoch, then a quarantine that renumbers the queue from 1: the late
/// PUBACK for the old numbers must not delete the new records carrying them.
#[test]
fn a_late_acknowledgement_after_a_quarantine_renumbered_the_queue_deletes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (mut queue, _) = Queue::open(roomy_config(dir.path()), t0()).unwrap();
    for i in 0..3 {
        queue
            .append(Tier::Slo, &named_event(&format!("old{i}"), 1), at_ms(1))
            .unwrap();
    }
    queue.flush(at_ms(2)).unwrap();
    let (old_epoch, first, last) = {
        let batch = queue.next_batch(ALL).unwrap().unwrap();
        (batch.epoch(), batch.first_seq(), batch.last_seq())
    };
    drop(queue);
    replace_store(dir.path(), &[0x5a; 65_536]);
    let (mut queue, report) = Queue::open(roomy_config(dir.path()), at_ms(3)).unwrap();
    assert!(report.quarantined.is_some());
    assert_ne!(queue.epoch(), old_epoch);
    for i in 0..3 {
        queue
            .append(Tier::Slo, &named_event(&format!("new{i}"), 1), at_ms(4))
            .unwrap();
    }
    queue.flush(at_ms(5)).unwrap();
    assert!(!queue.ack(Tier::Slo, old_epoch, first..=last, at_ms(6)));
    queue.flush(at_ms(7)).unwrap();
    let all = read_everything(&mut queue);
    let names: Vec<_> = (1..=3)
        .map(|seq| name_of(&all[&(Tier::Slo, seq)]).unwrap().to_owned())
        .collect();
    assert_eq!(names, ["new0", "new1", "new2"]);
}

#[test]
fn a_dead_lettered_record_is_never_read_again_and_is_deleted_counted_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let (mut queue, _) = Queue::open(roomy_config(dir.path()), t0()).unwrap();
    for i in 0..3 {
        queue
            .append(Tier::Debug, &named_event(&format!("d{i}"), 100), at_ms(1))
            .unwrap();
    }
    queue.flush(at_ms(2)).unwrap();
    let epoch = queue.epoch();
    queue.next_batch(ALL).unwrap().unwrap();
    assert!(!queue.dead_letter(Tier::Debug, epoch ^ 1, 2, at_ms(3)));
    assert!(
        !queue.dead_letter(Tier::Debug, epoch, 4, at_ms(3)),
        "not durable"
    );
    assert!(queue.dead_letter(Tier::Debug, epoch, 2, at_ms(3)));
    queue.requeue_unacked();
    let seqs: Vec<u64> = queue
        .next_batch(ALL)
        .unwrap()
        .unwrap()
        .records()
        .map(|(seq, _)| seq)
        .collect();
    assert_eq!(
        seqs,
        [1, 3],
        "a dead letter is not handed out while it waits"
    );
    assert!(queue.flush_due(at_ms(3) + std::time::Duration::from_secs(60)));
    queue.flush(at_ms(4)).unwrap();
    let status = queue.status(at_ms(4));
    assert_eq!(status.tiers.debug.records, 2);
    let all = read_everything(&mut queue);
    let reports: Vec<_> = all
        .iter()
        .filter_map(|(&(tier, _), event)| queue_loss(event).map(|loss| (tier, *loss)))
        .collect();
    assert_eq!(reports.len(), 1, "{reports:?}");
    let (tier, loss) = &reports[0];
    assert_eq!(
        *tier,
        Tier::Slo,
        "losses of bulk tiers are reported in the SLO tier"
    );
    assert_eq!(loss.tier, Tier::Debug as i32);
    assert_eq!(loss.cause, LossCause::Refused as i32);
    assert_eq!((loss.count, loss.first_seq, loss.last_seq), (1, 2, 2));
    assert_eq!((loss.epoch, loss.total), (epoch, 1));
    assert!(
        all.keys()
            .all(|&(tier, seq)| (tier, seq) != (Tier::Debug, 2)),
        "the dead letter is gone"
    );
    drop(queue);
    let (_, report) = Queue::open(roomy_config(dir.path()), at_ms(5)).unwrap();
    assert_eq!(report.losses.debug[LossCause::Refused as usize], 1);
}

#[test]
fn a_rewound_tier_hands_out_its_records_again_and_other_tiers_stay_where_they_were() {
    let dir = tempfile::tempdir().unwrap();
    let (mut queue, _) = Queue::open(roomy_config(dir.path()), t0()).unwrap();
    for i in 0..6 {
        queue
            .append(Tier::Slo, &named_event(&format!("s{i}"), 1), at_ms(1))
            .unwrap();
    }
    queue
        .append(Tier::Safety, &named_event("a", 1), at_ms(1))
        .unwrap();
    queue.flush(at_ms(2)).unwrap();
    let epoch = queue.epoch();
    let three = BatchLimits {
        max_records: 3,
        max_bytes: 1 << 20,
    };
    let read = |queue: &mut Queue| {
        queue
            .next_batch(three)
            .unwrap()
            .map(|b| (b.tier(), b.first_seq(), b.last_seq()))
    };
    assert_eq!(read(&mut queue), Some((Tier::Safety, 1, 1)));
    assert_eq!(read(&mut queue), Some((Tier::Slo, 1, 3)));
    assert_eq!(read(&mut queue), Some((Tier::Slo, 4, 6)));
    assert!(!queue.rewind(Tier::Slo, epoch ^ 1, 2));
    assert_eq!(read(&mut queue), None);
    assert!(queue.rewind(Tier::Slo, epoch, 5));
    assert_eq!(read(&mut queue), Some((Tier::Slo, 5, 6)));
    assert!(queue.rewind(Tier::Slo, epoch, 2));
    assert_eq!(read(&mut queue), Some((Tier::Slo, 2, 4)));
    assert_eq!(read(&mut queue), Some((Tier::Slo, 5, 6)));
    assert_eq!(read(&mut queue), None, "safety was not handed out again");
}
