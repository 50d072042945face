//! What a quarantine reports: the records of the old store that did not reach the new one, per
//! tier, under the **old** epoch (the numbers they were sent or would have been sent under), with
//! the best bound known of their sequence range and bytes: the old store's own state when it can
//! be read, else the last status snapshot the queue wrote beside it; the salvage's copies are
//! not losses. The running totals carry over.
#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

mod util;

use std::collections::BTreeMap;
use std::path::Path;

use edgewatch_proto::v1::{LossCause, QueueLoss, Tier};
use edgewatch_queue::{PerTier, Queue, QueueStatus, RawQueueConfig};
use util::*;

/// Records appended per tier, then the oldest `acked` of each tier acknowledged.
const APPENDED: PerTier<u64> = PerTier {
    safety: 7,
    slo: 11,
    debug: 13,
};
const ACKED: PerTier<u64> = PerTier {
    safety: 2,
    slo: 0,
    debug: 4,
};

/// A queue holding `APPENDED - ACKED` records per tier, closed cleanly after the agent's status
/// loop rewrote its snapshot. Returns the queue's epoch, the status it last reported, and
/// seq → name per tier of the records it holds.
fn filled(dir: &Path) -> (u64, QueueStatus, BTreeMap<(Tier, u64), String>) {
    filled_with(roomy_config(dir))
}

/// [`filled`], with the queue's snapshot where `config` puts it.
fn filled_with(config: RawQueueConfig) -> (u64, QueueStatus, BTreeMap<(Tier, u64), String>) {
    let (mut queue, _) = Queue::open(config, t0()).unwrap();
    let mut names = BTreeMap::new();
    for (ix, tier) in [Tier::Safety, Tier::Slo, Tier::Debug]
        .into_iter()
        .enumerate()
    {
        for i in 0..*APPENDED.at(ix) {
            let name = format!("{}{i}", edgewatch_proto::tier::NAMES[ix]);
            let seq = queue
                .append(tier, &named_event(&name, 100), at_ms(1))
                .unwrap();
            names.insert((tier, seq), name);
        }
    }
    queue.flush(at_ms(2)).unwrap();
    let epoch = queue.epoch();
    for (ix, tier) in [Tier::Safety, Tier::Slo, Tier::Debug]
        .into_iter()
        .enumerate()
    {
        let acked = *ACKED.at(ix);
        if acked > 0 {
            assert!(queue.ack(tier, epoch, 1..=acked, at_ms(3)));
            for seq in 1..=acked {
                names.remove(&(tier, seq));
            }
        }
    }
    queue.flush(at_ms(4)).unwrap();
    // The agent rewrites the snapshot every second.
    queue.refresh_status_snapshot(at_ms(5));
    let status = queue.status(at_ms(5));
    drop(queue);
    (epoch, status, names)
}

fn quarantine_reports(queue: &mut Queue) -> Vec<(Tier, QueueLoss)> {
    read_everything(queue)
        .into_iter()
        .filter_map(|((tier, _), event)| queue_loss(&event).cloned().map(|loss| (tier, loss)))
        .filter(|(_, loss)| loss.cause == LossCause::Quarantined as i32)
        .collect()
}

#[test]
fn a_store_that_will_not_open_reports_each_tiers_records_under_the_old_epoch_from_the_last_snapshot()
 {
    let dir = tempfile::tempdir().unwrap();
    let (old_epoch, before, _) = filled(dir.path());
    replace_store(dir.path(), &[0x5a; 65_536]);

    let (queue, report) = Queue::open(roomy_config(dir.path()), at_ms(10)).unwrap();
    assert!(report.quarantined.is_some());
    assert_reported_from_the_snapshot(queue, old_epoch, &before);
}

/// The agent's layout: the snapshot on tmpfs beside the agent's status file, not in the queue
/// directory.
fn snapshot_elsewhere(dir: &Path, run: &Path) -> RawQueueConfig {
    let mut config = roomy_config(dir);
    config.status_file = run.join("queue-status");
    config
}

#[test]
fn a_snapshot_kept_outside_the_queue_directory_bounds_a_quarantine_as_one_inside_it_did() {
    let (dir, run) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (old_epoch, before, _) = filled_with(snapshot_elsewhere(dir.path(), run.path()));
    assert!(!dir.path().join("status").exists());
    replace_store(dir.path(), &[0x5a; 65_536]);

    let config = snapshot_elsewhere(dir.path(), run.path());
    let (queue, report) = Queue::open(config, at_ms(10)).unwrap();
    assert!(report.quarantined.is_some());
    assert_reported_from_the_snapshot(queue, old_epoch, &before);
}

#[test]
fn the_first_open_after_an_upgrade_bounds_a_quarantine_by_the_snapshot_the_older_version_left() {
    // The older version kept its snapshot in the queue directory; the new one keeps it elsewhere,
    // where nothing is yet when the damaged store is found.
    let (dir, run) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (old_epoch, before, _) = filled(dir.path());
    assert!(dir.path().join("status").exists());
    replace_store(dir.path(), &[0x5a; 65_536]);

    let config = snapshot_elsewhere(dir.path(), run.path());
    let (queue, report) = Queue::open(config, at_ms(10)).unwrap();
    assert!(report.quarantined.is_some());
    assert!(
        !dir.path().join("status").exists(),
        "the old snapshot is removed once read"
    );
    assert_reported_from_the_snapshot(queue, old_epoch, &before);
}

/// The quarantine reports of a store whose state was lost, bounded by the snapshot `before`.
fn assert_reported_from_the_snapshot(mut queue: Queue, old_epoch: u64, before: &QueueStatus) {
    assert_ne!(queue.epoch(), old_epoch);
    let reports = quarantine_reports(&mut queue);
    let expected = |tier: Tier, ix: usize| {
        let lost = APPENDED.at(ix) - ACKED.at(ix);
        let report_tier = if tier == Tier::Safety {
            Tier::Safety
        } else {
            Tier::Slo
        };
        (
            report_tier,
            QueueLoss {
                tier: tier as i32,
                cause: LossCause::Quarantined as i32,
                count: lost,
                first_seq: ACKED.at(ix) + 1,
                last_seq: *APPENDED.at(ix),
                epoch: old_epoch,
                bytes: before.tiers.at(ix).bytes,
                total: lost,
            },
        )
    };
    let mut expected = vec![
        expected(Tier::Safety, 0),
        expected(Tier::Slo, 1),
        expected(Tier::Debug, 2),
    ];
    // Reports are read in tier order: the safety one, then the SLO tier's (SLO, debug).
    expected.sort_by_key(|(report_tier, loss)| (*report_tier as i32, loss.tier));
    assert_eq!(reports, expected);
    let status = queue.status(at_ms(11));
    assert_eq!(status.tiers.safety.quarantined, 5);
    assert_eq!(status.tiers.slo.quarantined, 11);
    assert_eq!(status.tiers.debug.quarantined, 9);
}

#[test]
fn records_the_salvage_cannot_copy_are_counted_under_the_old_epoch_and_the_rest_keep_their_numbers()
{
    let dir = tempfile::tempdir().unwrap();
    let (old_epoch, before, names) = filled(dir.path());
    // Damage the old store behind the queue's back: three SLO records vanish from their
    // segment, and a state slot no longer reads (so the store is quarantined and salvaged).
    {
        let segment = segment_path(dir.path(), "slo", 1);
        let bytes = std::fs::read(&segment).unwrap();
        let mut kept = Vec::new();
        let mut removed = 0;
        for (seq, start, end) in segment_frames(&bytes) {
            if [4, 5, 6].contains(&seq) {
                removed += 1;
            } else {
                kept.extend_from_slice(&bytes[start..end]);
            }
        }
        assert_eq!(removed, 3);
        std::fs::write(&segment, kept).unwrap();
        damage_older_state_slot(dir.path());
    }

    let (mut queue, report) = Queue::open(roomy_config(dir.path()), at_ms(10)).unwrap();
    assert!(report.quarantined.is_some());
    let all = read_everything(&mut queue);
    // Every record the salvage copied keeps its number and content.
    let mut salvaged = BTreeMap::new();
    for ((tier, seq), event) in &all {
        if let Some(name) = name_of(event) {
            salvaged.insert((*tier, *seq), name.to_owned());
        }
    }
    let mut expected_salvaged = names.clone();
    for seq in [4, 5, 6] {
        expected_salvaged.remove(&(Tier::Slo, seq));
    }
    assert_eq!(salvaged, expected_salvaged);
    // The three records it could not copy, and nothing else, are reported lost.
    let record_bytes = |seq: u64| {
        let name = &names[&(Tier::Slo, seq)];
        let mut value = Vec::new();
        edgewatch_queue::record::encode(
            &mut value,
            seq,
            0,
            &prost::Message::encode_to_vec(&named_event(name, 100)),
        )
        .unwrap();
        edgewatch_queue::record::KEY_LEN + value.len() as u64
    };
    let reports = quarantine_reports(&mut queue);
    assert_eq!(
        reports,
        vec![(
            Tier::Slo,
            QueueLoss {
                tier: Tier::Slo as i32,
                cause: LossCause::Quarantined as i32,
                count: 3,
                first_seq: 4,
                last_seq: 6,
                epoch: old_epoch,
                bytes: record_bytes(4) + record_bytes(5) + record_bytes(6),
                total: 3,
            }
        )]
    );
    let status = queue.status(at_ms(11));
    assert_eq!(status.tiers.slo.quarantined, 3);
    assert_eq!(status.tiers.safety.quarantined, 0);
    assert_eq!(status.tiers.debug.quarantined, 0);
    assert_eq!(
        status.tiers.slo.records,
        before.tiers.slo.records - 3 + 1,
        "the salvaged SLO records and the loss report"
    );
}

#[test]
fn loss_totals_of_a_store_whose_state_is_lost_carry_over_from_the_last_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut config = roomy_config(dir.path());
        config.max_age.debug = Some(std::time::Duration::from_secs(1));
        let (mut queue, _) = Queue::open(config, t0()).unwrap();
        for i in 0..5 {
            queue
                .append(Tier::Debug, &named_event(&format!("d{i}"), 10), at_ms(1))
                .unwrap();
        }
        queue.flush(at_ms(2)).unwrap();
        // Two seconds later the five debug records have expired.
        queue.flush(at_ms(2_100)).unwrap();
        queue.refresh_status_snapshot(at_ms(2_200));
        assert_eq!(queue.status(at_ms(2_200)).tiers.debug.expired, 5);
    }
    replace_store(dir.path(), &[0x5a; 65_536]);
    let (queue, report) = Queue::open(roomy_config(dir.path()), at_ms(3_000)).unwrap();
    assert!(report.quarantined.is_some());
    assert_eq!(queue.status(at_ms(3_001)).tiers.debug.expired, 5);
    assert_eq!(report.losses.debug[LossCause::Expired as usize], 5);
}

/// Flips a byte in the payload of the state slot with the lower generation.
fn damage_older_state_slot(dir: &Path) {
    let store = dir.join(STORE);
    let generation = |name: &str| {
        std::fs::read(store.join(name))
            .ok()
            .filter(|bytes| bytes.len() >= 24)
            .map(|bytes| u64::from_le_bytes(bytes[16..24].try_into().unwrap()))
    };
    let older = match (generation("state.0"), generation("state.1")) {
        (Some(a), Some(b)) if a < b => "state.0",
        (Some(_), Some(_)) => "state.1",
        other => panic!("two state slots expected, found {other:?}"),
    };
    let mut bytes = std::fs::read(store.join(older)).unwrap();
    bytes[20] ^= 0x40;
    std::fs::write(store.join(older), bytes).unwrap();
}
