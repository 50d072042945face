//! The queue's behaviour as the agent and the uplink see it: durability after flush, strict tier
//! order, acknowledgement, restart, budgets and eviction order, expiry, the offline-window alarm,
//! status from a second reader, compaction.
#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

mod util;

use std::time::Duration;

use edgewatch_proto::v1::{LossCause, Tier, event::Kind};
use edgewatch_queue::{BatchLimits, Queue, QueueError, read_snapshot};
use util::*;

#[test]
fn appends_are_durable_only_after_a_flush_and_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let (mut queue, report) = Queue::open(roomy_config(dir.path()), t0()).unwrap();
    assert!(report.created);
    let seq = queue
        .append(Tier::Safety, &named_event("a", 10), at_ms(1))
        .unwrap();
    assert_eq!(seq, 1);
    assert_eq!(queue.durable_seq(Tier::Safety), 0);
    assert!(queue.next_batch(BatchLimits::default()).unwrap().is_none());
    let outcome = queue.flush(at_ms(2)).unwrap();
    assert_eq!(outcome.durable.safety, 1);
    assert!(outcome.is_durable(Tier::Safety, seq));
    assert!(!outcome.is_durable(Tier::Safety, seq + 1));
    assert!(!outcome.is_durable(Tier::Slo, seq));
    assert_eq!(outcome.epoch, queue.epoch());
    assert!(outcome.committed);
    let epoch = queue.epoch();
    drop(queue);
    let (mut queue, report) = Queue::open(roomy_config(dir.path()), at_ms(3)).unwrap();
    assert!(!report.created);
    assert_eq!(report.epoch, epoch);
    assert_eq!(report.records.safety, 1);
    let all = read_everything(&mut queue);
    assert_eq!(name_of(&all[&(Tier::Safety, 1)]), Some("a"));
}

#[test]
fn unflushed_appends_are_gone_after_a_crash_and_their_numbers_were_never_seen() {
    let dir = tempfile::tempdir().unwrap();
    let (mut queue, _) = Queue::open(roomy_config(dir.path()), t0()).unwrap();
    queue
        .append(Tier::Slo, &named_event("kept", 1), at_ms(1))
        .unwrap();
    queue.flush(at_ms(2)).unwrap();
    queue
        .append(Tier::Slo, &named_event("lost", 1), at_ms(3))
        .unwrap();
    drop(queue);
    let (mut queue, _) = Queue::open(roomy_config(dir.path()), at_ms(4)).unwrap();
    let all = read_everything(&mut queue);
    assert_eq!(all.len(), 1);
    assert_eq!(
        queue
            .append(Tier::Slo, &named_event("next", 1), at_ms(5))
            .unwrap(),
        2
    );
}

#[test]
fn a_safety_append_during_a_long_debug_drain_is_handed_out_next() {
    let dir = tempfile::tempdir().unwrap();
    let (mut queue, _) = Queue::open(roomy_config(dir.path()), t0()).unwrap();
    for i in 0..100 {
        queue
            .append(Tier::Debug, &named_event(&format!("d{i}"), 50), at_ms(1))
            .unwrap();
    }
    queue
        .append(Tier::Slo, &named_event("s", 5), at_ms(1))
        .unwrap();
    queue.flush(at_ms(2)).unwrap();
    let limits = BatchLimits {
        max_records: 10,
        max_bytes: 1 << 20,
    };
    let batch = queue.next_batch(limits).unwrap().unwrap();
    assert_eq!((batch.tier(), batch.len()), (Tier::Slo, 1));
    let batch = queue.next_batch(limits).unwrap().unwrap();
    assert_eq!(
        (batch.tier(), batch.first_seq(), batch.last_seq()),
        (Tier::Debug, 1, 10)
    );
    queue
        .append(Tier::Safety, &named_event("alarm", 5), at_ms(3))
        .unwrap();
    queue.flush(at_ms(4)).unwrap();
    let batch = queue.next_batch(limits).unwrap().unwrap();
    assert_eq!((batch.tier(), batch.first_seq()), (Tier::Safety, 1));
    let batch = queue.next_batch(limits).unwrap().unwrap();
    assert_eq!((batch.tier(), batch.first_seq()), (Tier::Debug, 11));
}

#[test]
fn handed_out_records_wait_for_an_ack_or_a_requeue() {
    let dir = tempfile::tempdir().unwrap();
    let (mut queue, _) = Queue::open(roomy_config(dir.path()), t0()).unwrap();
    for i in 0..6 {
        queue
            .append(Tier::Slo, &named_event(&format!("s{i}"), 1), at_ms(1))
            .unwrap();
    }
    queue.flush(at_ms(2)).unwrap();
    let limits = BatchLimits {
        max_records: 3,
        max_bytes: 1 << 20,
    };
    let first = queue.next_batch(limits).unwrap().unwrap();
    assert_eq!((first.first_seq(), first.last_seq()), (1, 3));
    let second = queue.next_batch(limits).unwrap().unwrap();
    assert_eq!((second.first_seq(), second.last_seq()), (4, 6));
    assert!(queue.next_batch(limits).unwrap().is_none());
    let epoch = queue.epoch();
    queue.ack(Tier::Slo, epoch, 4..=6, at_ms(3));
    queue.requeue_unacked();
    let again = queue.next_batch(limits).unwrap().unwrap();
    assert_eq!((again.first_seq(), again.last_seq()), (1, 3));
    assert!(
        queue.next_batch(limits).unwrap().is_none(),
        "acked records are not handed out again, even before the flush deletes them"
    );
}

#[test]
fn acknowledged_records_are_deleted_and_unacknowledged_ones_are_read_again_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (mut queue, _) = Queue::open(roomy_config(dir.path()), t0()).unwrap();
    for i in 0..4 {
        queue
            .append(Tier::Debug, &named_event(&format!("d{i}"), 1), at_ms(1))
            .unwrap();
    }
    queue.flush(at_ms(2)).unwrap();
    let limits = BatchLimits {
        max_records: 2,
        max_bytes: 1 << 20,
    };
    queue.next_batch(limits).unwrap().unwrap();
    let epoch = queue.epoch();
    queue.ack(Tier::Debug, epoch, 1..=2, at_ms(3));
    queue.next_batch(limits).unwrap().unwrap();
    queue.flush(at_ms(4)).unwrap();
    assert_eq!(queue.status(at_ms(4)).tiers.debug.records, 2);
    drop(queue);
    let (mut queue, _) = Queue::open(roomy_config(dir.path()), at_ms(5)).unwrap();
    let batch = queue.next_batch(limits).unwrap().unwrap();
    assert_eq!((batch.first_seq(), batch.last_seq()), (3, 4));
}

#[test]
fn batches_respect_their_byte_limit_but_always_carry_one_record() {
    let dir = tempfile::tempdir().unwrap();
    let (mut queue, _) = Queue::open(roomy_config(dir.path()), t0()).unwrap();
    for i in 0..3 {
        queue
            .append(Tier::Debug, &named_event(&format!("d{i}"), 1000), at_ms(1))
            .unwrap();
    }
    queue.flush(at_ms(2)).unwrap();
    let limits = BatchLimits {
        max_records: 100,
        max_bytes: 2100,
    };
    let batch = queue.next_batch(limits).unwrap().unwrap();
    assert_eq!(batch.len(), 2);
    assert!(batch.event_bytes() <= 2100);
    let tiny = BatchLimits {
        max_records: 100,
        max_bytes: 10,
    };
    assert_eq!(queue.next_batch(tiny).unwrap().unwrap().len(), 1);
}

#[test]
fn an_event_with_its_own_seq_is_stored_with_the_queue_seq() {
    let dir = tempfile::tempdir().unwrap();
    let (mut queue, _) = Queue::open(roomy_config(dir.path()), t0()).unwrap();
    let mut event = named_event("x", 1);
    event.seq = 999;
    let seq = queue.append(Tier::Debug, &event, at_ms(1)).unwrap();
    queue.flush(at_ms(2)).unwrap();
    let all = read_everything(&mut queue);
    assert_eq!(all[&(Tier::Debug, seq)].seq, seq);
}

#[test]
fn bad_appends_are_refused_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let (mut queue, _) = Queue::open(roomy_config(dir.path()), t0()).unwrap();
    use edgewatch_queue::AppendError;
    assert_eq!(
        queue.append(Tier::Unspecified, &named_event("x", 1), at_ms(1)),
        Err(AppendError::NoTier)
    );
    assert!(matches!(
        queue.append(Tier::Debug, &named_event("x", 20_000), at_ms(1)),
        Err(AppendError::TooLarge { .. })
    ));
    assert_eq!(
        queue.append_encoded(Tier::Debug, &[0x0a, 0x05, 0x01], at_ms(1)),
        Err(AppendError::NotAnEvent)
    );
    // Well-formed protobuf, but field 2 (an int64) as a length-delimited field.
    assert_eq!(
        queue.append_encoded(Tier::Debug, &[0x12, 0x01, 0x00], at_ms(1)),
        Err(AppendError::NotAnEvent)
    );
    let good = prost::Message::encode_to_vec(&named_event("ok", 1));
    assert_eq!(queue.append_encoded(Tier::Debug, &good, at_ms(1)), Ok(1));
    queue.flush(at_ms(2)).unwrap();
    let all = read_everything(&mut queue);
    assert_eq!(name_of(&all[&(Tier::Debug, 1)]), Some("ok"));
    assert_eq!(queue.pending_records(), 0);
}

#[test]
fn debug_is_evicted_before_slo_and_safety_is_never_evicted_for_a_lower_tier() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = roomy_config(dir.path());
    config.budget_bytes = 400 * 1024;
    config.max_pending_bytes = 64 * 1024;
    config.max_record_bytes = 4096;
    config.share_percent.safety = 50;
    config.share_percent.slo = 100;
    config.share_percent.debug = 100;
    let (mut queue, _) = Queue::open(config.clone(), t0()).unwrap();
    let mut now = 1;
    let mut append = |queue: &mut Queue, tier: Tier, n: usize| {
        for i in 0..n {
            queue
                .append(tier, &named_event(&format!("{tier:?}{i}"), 900), at_ms(now))
                .unwrap();
            if i % 20 == 0 {
                queue.flush(at_ms(now)).unwrap();
            }
            now += 1;
        }
        queue.flush(at_ms(now)).unwrap();
    };
    append(&mut queue, Tier::Safety, 150);
    append(&mut queue, Tier::Debug, 200);
    append(&mut queue, Tier::Slo, 300);
    let status = queue.status(at_ms(now));
    assert_eq!(
        status.tiers.safety.evicted, 0,
        "safety made room for nobody"
    );
    assert_eq!(status.tiers.safety.records, 150);
    assert!(status.tiers.debug.records == 0, "debug went first");
    assert_eq!(status.tiers.debug.evicted, 200);
    assert!(status.tiers.slo.evicted > 0);
    let total = status.tiers.safety.bytes + status.tiers.slo.bytes + status.tiers.debug.bytes;
    assert!(total <= config.budget_bytes, "{total}");

    // The reports are stored in the SLO tier and add up to the counters.
    let all = read_everything(&mut queue);
    let mut reported = [0u64; 3];
    for event in all.values() {
        if let Some(loss) = queue_loss(event) {
            assert_eq!(loss.cause, LossCause::Evicted as i32);
            assert_eq!(loss.epoch, queue.epoch());
            assert!(loss.first_seq <= loss.last_seq);
            reported[loss.tier as usize - 1] += loss.count;
        }
    }
    assert_eq!(reported[2], 200);
    // SLO reports can evict older SLO reports: the counter is the ground truth, the surviving
    // reports never claim more.
    assert!(reported[1] <= status.tiers.slo.evicted);
    drop(queue);
    let (queue, report) = Queue::open(config, at_ms(now)).unwrap();
    assert_eq!(report.losses.debug[LossCause::Evicted as usize], 200);
    assert_eq!(
        queue.status(at_ms(now)).tiers.slo.evicted,
        status.tiers.slo.evicted
    );
}

#[test]
fn a_full_safety_tier_evicts_its_own_oldest_and_reports_it_as_safety() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = roomy_config(dir.path());
    config.budget_bytes = 400 * 1024;
    config.max_pending_bytes = 64 * 1024;
    config.max_record_bytes = 4096;
    config.share_percent.safety = 25;
    let (mut queue, _) = Queue::open(config, t0()).unwrap();
    for i in 0..200 {
        queue
            .append(Tier::Safety, &named_event(&format!("s{i}"), 900), at_ms(i))
            .unwrap();
        queue.flush(at_ms(i)).unwrap();
    }
    let status = queue.status(at_ms(300));
    assert!(status.tiers.safety.evicted > 0);
    assert!(status.tiers.safety.bytes <= status.tiers.safety.cap_bytes);
    let all = read_everything(&mut queue);
    let losses: Vec<_> = all
        .iter()
        .filter_map(|((tier, _), event)| queue_loss(event).map(|loss| (*tier, *loss)))
        .collect();
    assert!(!losses.is_empty());
    for (tier, loss) in &losses {
        assert_eq!(*tier, Tier::Safety);
        assert_eq!(loss.tier, Tier::Safety as i32);
    }
    // The oldest surviving record follows the last evicted one.
    let newest_loss = losses.iter().map(|(_, l)| l.last_seq).max().unwrap();
    let oldest_kept = all
        .iter()
        .filter(|(_, e)| name_of(e).is_some())
        .map(|((_, seq), _)| *seq)
        .min()
        .unwrap();
    assert_eq!(oldest_kept, newest_loss + 1);
}

#[test]
fn records_older_than_their_tier_age_limit_expire_and_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = roomy_config(dir.path());
    config.max_age.debug = Some(Duration::from_secs(7 * 24 * 3600));
    let (mut queue, _) = Queue::open(config, t0()).unwrap();
    for i in 0..5 {
        queue
            .append(Tier::Debug, &named_event(&format!("d{i}"), 1), at_ms(i))
            .unwrap();
    }
    queue.flush(at_ms(10)).unwrap();
    let week = 7 * 24 * 3600 * 1000;
    queue
        .append(Tier::Debug, &named_event("fresh", 1), at_ms(week))
        .unwrap();
    let outcome = queue.flush(at_ms(week + 3)).unwrap();
    assert_eq!(
        outcome.lost.debug, 3,
        "records appended at 0, 1, 2 ms are older than a week"
    );
    let status = queue.status(at_ms(week + 3));
    assert_eq!(status.tiers.debug.expired, 3);
    // Expiry also runs on a flush with nothing else to do.
    let outcome = queue.flush(at_ms(week + 100)).unwrap();
    assert_eq!(outcome.lost.debug, 2);
    let all = read_everything(&mut queue);
    let expired: u64 = all
        .values()
        .filter_map(queue_loss)
        .filter(|loss| loss.cause == LossCause::Expired as i32)
        .map(|loss| loss.count)
        .sum();
    assert_eq!(expired, 5);
}

#[test]
fn the_offline_window_alarm_is_raised_once_then_rearms_with_hysteresis() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = roomy_config(dir.path());
    config.budget_bytes = 10 * 1024 * 1024;
    config.offline_window_threshold = Some(Duration::from_secs(24 * 3600));
    config.rate_time_constant = Duration::from_secs(10);
    let (mut queue, _) = Queue::open(config, t0()).unwrap();
    // About 1 KB/s into debug (cap 6 MB): roughly 1.7 h of window, far below 24 h.
    for second in 1..=120u64 {
        queue
            .append(Tier::Debug, &named_event("d", 1000), at_ms(second * 1000))
            .unwrap();
        queue.flush(at_ms(second * 1000)).unwrap();
    }
    let window = queue.offline_window().unwrap();
    assert!(window < Duration::from_secs(24 * 3600), "{window:?}");
    let all = read_everything(&mut queue);
    let alarms: Vec<_> = all
        .iter()
        .filter(|(_, e)| matches!(e.kind, Some(Kind::OfflineWindowLow(_))))
        .collect();
    assert_eq!(alarms.len(), 1, "raised once, not once per flush");
    assert_eq!(alarms[0].0.0, Tier::Safety);
    // Appends stop: the rate decays, the window grows past the hysteresis, the alarm re-arms,
    // and a new burst raises it again.
    for second in 121..=400u64 {
        queue.flush(at_ms(second * 1000)).unwrap();
    }
    for second in 401..=520u64 {
        queue
            .append(Tier::Debug, &named_event("d", 1000), at_ms(second * 1000))
            .unwrap();
        queue.flush(at_ms(second * 1000)).unwrap();
    }
    let all = read_everything(&mut queue);
    let alarms = all
        .values()
        .filter(|e| matches!(e.kind, Some(Kind::OfflineWindowLow(_))))
        .count();
    assert_eq!(alarms, 2);
}

#[test]
fn a_queue_whose_snapshot_lives_elsewhere_writes_nothing_in_its_directory_but_the_store() {
    // The agent's layout: the snapshot, rewritten every second, on tmpfs beside the agent's
    // status file; the queue directory (on the flash) holds only what must survive.
    let (dir, run) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut config = roomy_config(dir.path());
    config.status_file = run.path().join("queue-status");
    let (mut queue, _) = Queue::open(config, t0()).unwrap();
    queue
        .append(Tier::Safety, &named_event("a", 1), at_ms(1))
        .unwrap();
    queue.flush(at_ms(2)).unwrap();
    for second in 1..=3 {
        queue.refresh_status_snapshot(at_ms(second * 1000));
    }
    let snapshot = read_snapshot(&run.path().join("queue-status")).unwrap();
    assert_eq!(snapshot.epoch, queue.epoch());
    assert_eq!(snapshot.as_of_unix_ms, 1_700_000_003_000);
    assert_eq!(
        (
            snapshot.tiers.safety.records,
            snapshot.tiers.safety.durable_seq
        ),
        (1, 1)
    );
    let names = |path: &std::path::Path| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(path)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    };
    assert_eq!(names(dir.path()), ["queue.log"]);
    assert_eq!(names(run.path()), ["queue-status"]);
}

#[test]
fn a_stale_snapshot_an_older_version_left_in_the_queue_directory_is_removed_at_open() {
    let (dir, run) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // An older version's queue: its snapshot (and an interrupted rewrite's temporary) in the
    // queue directory.
    let (mut queue, _) = Queue::open(roomy_config(dir.path()), t0()).unwrap();
    queue
        .append(Tier::Slo, &named_event("a", 1), at_ms(1))
        .unwrap();
    queue.flush(at_ms(2)).unwrap();
    queue.refresh_status_snapshot(at_ms(3));
    drop(queue);
    let legacy = dir.path().join("status");
    std::fs::copy(&legacy, dir.path().join("status.tmp")).unwrap();
    assert_eq!(read_snapshot(&legacy).unwrap().tiers.slo.records, 1);

    let mut config = roomy_config(dir.path());
    config.status_file = run.path().join("queue-status");
    let (mut queue, _) = Queue::open(config, at_ms(10)).unwrap();
    assert!(!legacy.exists() && !dir.path().join("status.tmp").exists());
    // What a reader finds is the running queue's, never the stale one.
    let epoch = queue.epoch();
    assert!(queue.ack(Tier::Slo, epoch, 1..=1, at_ms(11)));
    queue.flush(at_ms(12)).unwrap();
    queue.refresh_status_snapshot(at_ms(13));
    let snapshot = read_snapshot(&run.path().join("queue-status")).unwrap();
    assert_eq!(snapshot.tiers.slo.records, 0);
    assert_eq!(snapshot.tiers.slo.durable_seq, 1);
    assert!(!legacy.exists());
}

#[test]
fn a_second_reader_gets_the_status_from_the_snapshot_while_the_queue_is_open() {
    let dir = tempfile::tempdir().unwrap();
    let (mut queue, _) = Queue::open(roomy_config(dir.path()), t0()).unwrap();
    queue
        .append(Tier::Slo, &named_event("a", 1), at_ms(1))
        .unwrap();
    queue.flush(at_ms(5000)).unwrap();
    assert!(matches!(
        Queue::open(roomy_config(dir.path()), at_ms(5001)),
        Err(QueueError::AlreadyOpen(_))
    ));
    let snapshot = read_snapshot(&dir.path().join("status")).unwrap();
    assert_eq!(snapshot.epoch, queue.epoch());
    assert_eq!(snapshot.tiers.slo.records, 1);
    assert_eq!(snapshot.tiers.slo.durable_seq, 1);
    assert_eq!(
        snapshot.tiers.slo.oldest_age,
        Some(Duration::from_millis(4999))
    );
    assert!(snapshot.store_available);
}

#[test]
fn flushes_fall_due_by_tier_interval() {
    let dir = tempfile::tempdir().unwrap();
    let (mut queue, _) = Queue::open(roomy_config(dir.path()), t0()).unwrap();
    assert_eq!(queue.next_flush_at(), None);
    queue
        .append(Tier::Debug, &named_event("d", 1), at_ms(100))
        .unwrap();
    assert_eq!(queue.next_flush_at(), Some(at_ms(1100)));
    queue
        .append(Tier::Safety, &named_event("s", 1), at_ms(200))
        .unwrap();
    assert_eq!(queue.next_flush_at(), Some(at_ms(210)));
    assert!(!queue.flush_due(at_ms(209)));
    assert!(queue.flush_due(at_ms(210)));
    queue.flush(at_ms(210)).unwrap();
    assert_eq!(queue.next_flush_at(), None);
}

#[test]
fn a_drain_shrinks_the_file_without_a_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let (mut queue, _) = Queue::open(roomy_config(dir.path()), t0()).unwrap();
    for i in 0..8000u64 {
        queue
            .append(Tier::Debug, &named_event("d", 1000), at_ms(i))
            .unwrap();
        if i % 500 == 0 {
            queue.flush(at_ms(i)).unwrap();
        }
    }
    queue.flush(at_ms(9000)).unwrap();
    let full = queue.file_bytes();
    assert!(full > 8_000_000, "{full}");
    let epoch = queue.epoch();
    queue.ack(Tier::Debug, epoch, 1..=8000, at_ms(9001));
    queue.flush(at_ms(9002)).unwrap();
    assert_eq!(queue.status(at_ms(9002)).tiers.debug.records, 0);
    // The log unlinked its drained segments with the acknowledgement's commit.
    let drained = queue.file_bytes();
    assert!(drained * 4 < full, "{full} -> {drained}");
    assert!(
        !queue.compact_if_drained(at_ms(99_002)).unwrap(),
        "nothing left to gain: a log is never compacted"
    );
    // Still a working queue.
    queue
        .append(Tier::Debug, &named_event("after", 1), at_ms(9003))
        .unwrap();
    queue.flush(at_ms(9004)).unwrap();
    assert_eq!(read_everything(&mut queue).len(), 1);
}

#[test]
fn the_key_value_area_is_written_with_the_next_flush_and_bounded() {
    use edgewatch_queue::KvError;
    use edgewatch_queue::config::{MAX_KV_KEY_BYTES, MAX_KV_KEYS, MAX_KV_VALUE_BYTES};

    let dir = tempfile::tempdir().unwrap();
    let (mut queue, _) = Queue::open(roomy_config(dir.path()), t0()).unwrap();
    queue.stage_kv("a", b"1").unwrap();
    assert_eq!(queue.kv("a"), Some(&b"1"[..]), "read back at once");
    assert!(
        queue.next_flush_at().is_none(),
        "staging alone makes no flush due"
    );
    let outcome = queue.flush(at_ms(1)).unwrap();
    assert!(outcome.committed, "an explicit flush writes what is staged");
    queue.stage_kv("a", b"2").unwrap();
    queue.stage_kv("b", b"3").unwrap();
    queue.remove_kv("b");
    drop(queue);
    // Not flushed: the last commit's area comes back.
    let (mut queue, _) = Queue::open(roomy_config(dir.path()), at_ms(2)).unwrap();
    assert_eq!(queue.kv("a"), Some(&b"1"[..]));
    assert_eq!(queue.kv("b"), None);
    queue.stage_kv("b", b"3").unwrap();
    queue.flush(at_ms(3)).unwrap();
    queue.remove_kv("a");
    queue.flush(at_ms(4)).unwrap();
    drop(queue);
    let (mut queue, _) = Queue::open(roomy_config(dir.path()), at_ms(5)).unwrap();
    assert_eq!(queue.kv_keys().collect::<Vec<_>>(), ["b"]);

    assert_eq!(
        queue.stage_kv("", b""),
        Err(KvError::BadKey {
            len: 0,
            max: MAX_KV_KEY_BYTES
        })
    );
    assert!(matches!(
        queue.stage_kv("c", &vec![0; MAX_KV_VALUE_BYTES + 1]),
        Err(KvError::TooLarge { .. })
    ));
    for i in 1..MAX_KV_KEYS {
        queue.stage_kv(&format!("k{i}"), b"").unwrap();
    }
    assert_eq!(
        queue.stage_kv("one-too-many", b""),
        Err(KvError::TooManyKeys { max: MAX_KV_KEYS })
    );
    queue.stage_kv("b", b"still room for a known key").unwrap();
}

#[test]
fn making_room_flushes_only_a_buffer_that_cannot_take_the_next_appends() {
    let dir = tempfile::tempdir().unwrap();
    let (mut queue, _) = Queue::open(roomy_config(dir.path()), t0()).unwrap();
    queue
        .append(Tier::Slo, &named_event("a", 100), at_ms(1))
        .unwrap();
    assert!(queue.make_room(16, 64 * 1024, at_ms(2)));
    assert_eq!(queue.pending_records(), 1, "room enough: nothing flushed");
    let max = queue.config().max_pending_bytes;
    assert!(queue.make_room(16, max, at_ms(3)));
    assert_eq!(queue.pending_records(), 0, "flushed to make room");
    assert_eq!(queue.durable_seq(Tier::Slo), 1);
}
