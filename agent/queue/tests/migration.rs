//! Upgrading over a queue of the format before the log (a redb file, `queue.redb`): the open
//! migrates it into the log and the queue delivers every record it held, under the same epoch
//! and numbers, with its key-value area and loss totals; a migration interrupted at any step
//! loses nothing and duplicates nothing.
#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

mod util;

use std::collections::BTreeMap;
use std::path::Path;

use edgewatch_proto::v1::{LossCause, Tier};
use edgewatch_queue::Queue;
use prost::Message;
use redb::TableDefinition;
use util::*;

const EPOCH: u64 = 0x0123_4567_89ab_cdef;
/// Records per tier in the old store; the first `ACKED` of each were delivered and deleted.
const RECORDS: u64 = 40;
const ACKED: u64 = 5;

/// Writes an old-format store as the agent before the log left it: tables `tier.*` of
/// `seq → record`, the state in `meta`, loss totals in `losses`, the key-value area in `kv`.
/// Returns what it holds: (tier, seq) → name.
fn old_store(dir: &Path) -> BTreeMap<(Tier, u64), String> {
    let tiers: [TableDefinition<u64, &[u8]>; 3] = [
        TableDefinition::new("tier.safety"),
        TableDefinition::new("tier.slo"),
        TableDefinition::new("tier.debug"),
    ];
    let meta: TableDefinition<&str, u64> = TableDefinition::new("meta");
    let losses: TableDefinition<u16, u64> = TableDefinition::new("losses");
    let kv: TableDefinition<&str, &[u8]> = TableDefinition::new("kv");
    let db = redb::Database::create(dir.join("queue.redb")).unwrap();
    let txn = db.begin_write().unwrap();
    let mut names = BTreeMap::new();
    {
        let mut meta = txn.open_table(meta).unwrap();
        meta.insert("format", 1).unwrap();
        meta.insert("epoch", EPOCH).unwrap();
        for (ix, (tier, definition)) in [Tier::Safety, Tier::Slo, Tier::Debug]
            .into_iter()
            .zip(tiers)
            .enumerate()
        {
            let mut table = txn.open_table(definition).unwrap();
            let (mut records, mut bytes) = (0u64, 0u64);
            for seq in ACKED + 1..=RECORDS {
                let name = format!("{ix}-{seq}");
                let mut value = Vec::new();
                edgewatch_queue::record::encode(
                    &mut value,
                    seq,
                    1_000 + seq,
                    &named_event(&name, 150).encode_to_vec(),
                )
                .unwrap();
                table.insert(seq, value.as_slice()).unwrap();
                records += 1;
                bytes += 8 + value.len() as u64;
                names.insert((tier, seq), name);
            }
            let tier_name = ["safety", "slo", "debug"][ix];
            // Numbers were handed out beyond the last record (a refused append).
            meta.insert(format!("next_seq.{tier_name}").as_str(), RECORDS + 3)
                .unwrap();
            meta.insert(format!("records.{tier_name}").as_str(), records)
                .unwrap();
            meta.insert(format!("bytes.{tier_name}").as_str(), bytes)
                .unwrap();
        }
        let mut losses = txn.open_table(losses).unwrap();
        losses
            .insert((8 + LossCause::Evicted as usize) as u16, 7)
            .unwrap();
        let mut kv = txn.open_table(kv).unwrap();
        kv.insert("sampler/0", &b"counted up to 35"[..]).unwrap();
    }
    txn.commit().unwrap();
    names
}

fn delivered(queue: &mut Queue) -> BTreeMap<(Tier, u64), String> {
    read_everything(queue)
        .into_iter()
        .filter_map(|(key, event)| name_of(&event).map(|name| (key, name.to_owned())))
        .collect()
}

fn assert_migrated(dir: &Path, names: &BTreeMap<(Tier, u64), String>) {
    let (mut queue, report) = Queue::open(roomy_config(dir), at_ms(10)).unwrap();
    assert!(report.quarantined.is_none());
    assert!(!report.created);
    assert_eq!(queue.epoch(), EPOCH, "the epoch carries over");
    assert_eq!(
        &delivered(&mut queue),
        names,
        "every record, once, with its number"
    );
    assert_eq!(queue.kv("sampler/0"), Some(&b"counted up to 35"[..]));
    assert_eq!(report.losses.slo[LossCause::Evicted as usize], 7);
    assert!(!dir.join("queue.redb").exists(), "the old file is gone");
    // Numbers go on after the old store's, never reusing one it handed out.
    let seq = queue
        .append(Tier::Safety, &named_event("after", 10), at_ms(11))
        .unwrap();
    assert_eq!(seq, RECORDS + 3);
    queue.flush(at_ms(12)).unwrap();
    drop(queue);
    let (mut queue, _) = Queue::open(roomy_config(dir), at_ms(13)).unwrap();
    let mut expected = names.clone();
    expected.insert((Tier::Safety, RECORDS + 3), "after".into());
    assert_eq!(delivered(&mut queue), expected);
}

#[test]
fn an_agent_upgraded_over_a_queue_of_the_old_format_delivers_every_record() {
    let dir = tempfile::tempdir().unwrap();
    let names = old_store(dir.path());
    assert_migrated(dir.path(), &names);
}

#[test]
fn a_migration_interrupted_before_its_log_was_in_place_runs_again_from_the_old_file() {
    let dir = tempfile::tempdir().unwrap();
    let names = old_store(dir.path());
    // As if the power failed while the log was being written beside the old file: a partial
    // log under the temporary name, holding some of the records.
    let staging = dir.path().join("queue.log.migrating");
    std::fs::create_dir(&staging).unwrap();
    {
        let other = tempfile::tempdir().unwrap();
        let partial = old_store(other.path());
        assert_eq!(partial, names);
        assert_migrated(other.path(), &partial);
        for (name, bytes) in store_files(other.path())
            .into_iter()
            .filter(|(name, _)| name.starts_with("safety"))
        {
            std::fs::write(staging.join(name), &bytes[..bytes.len() / 2]).unwrap();
        }
    }
    assert_migrated(dir.path(), &names);
    assert!(!staging.exists());
}

#[test]
fn a_migration_interrupted_after_its_log_was_in_place_does_not_run_twice() {
    let dir = tempfile::tempdir().unwrap();
    let names = old_store(dir.path());
    let old = std::fs::read(dir.path().join("queue.redb")).unwrap();
    {
        let (mut queue, _) = Queue::open(roomy_config(dir.path()), at_ms(1)).unwrap();
        // Delivered after the migration: must not come back from the old file.
        assert!(queue.ack(Tier::Slo, EPOCH, ACKED + 1..=ACKED + 2, at_ms(2)));
        queue.flush(at_ms(3)).unwrap();
    }
    // As if the power failed after the rename, before the old file was removed.
    std::fs::write(dir.path().join("queue.redb"), old).unwrap();
    let mut expected = names.clone();
    expected.remove(&(Tier::Slo, ACKED + 1));
    expected.remove(&(Tier::Slo, ACKED + 2));
    assert_migrated(dir.path(), &expected);
}
