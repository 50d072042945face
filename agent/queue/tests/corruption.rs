//! Damaged stores: garbage files, truncation, bit flips anywhere in the log's files, a record
//! whose checksum fails, an interrupted quarantine. The queue never panics and never refuses to
//! start: a store that will not open is quarantined (and the loss reported), a bad record is
//! skipped and counted, and every original record is either read back intact or accounted for.
#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

mod util;

use std::collections::BTreeMap;
use std::path::Path;

use edgewatch_proto::v1::{LossCause, Tier};
use edgewatch_queue::{Queue, TIERS};
use util::child::Rng;
use util::*;

const RECORDS: u64 = 600;

/// A cleanly closed queue of `RECORDS` records spread over the tiers; returns seq → name per tier.
fn filled_queue(dir: &Path) -> BTreeMap<(Tier, u64), String> {
    let (mut queue, _) = Queue::open(roomy_config(dir), t0()).unwrap();
    let mut names = BTreeMap::new();
    for i in 0..RECORDS {
        let tier = TIERS[(i % 3) as usize];
        let name = format!("c{i}");
        let seq = queue
            .append(tier, &named_event(&name, 200), at_ms(i))
            .unwrap();
        names.insert((tier, seq), name);
        if i % 50 == 49 {
            queue.flush(at_ms(i)).unwrap();
        }
    }
    queue.flush(at_ms(RECORDS)).unwrap();
    // The agent rewrites the status snapshot every second.
    queue.refresh_status_snapshot(at_ms(RECORDS));
    names
}

/// Opens a damaged queue and reads everything it still holds. Returns the records read (all
/// checked against `names`; after a quarantine, those salvaged), whether it quarantined, and the
/// corrupt count after a flush.
/// Records read are always intact: a damaged one is skipped and counted, never handed out.
fn open_damaged(
    dir: &Path,
    names: &BTreeMap<(Tier, u64), String>,
    old_epoch: u64,
) -> (usize, bool, u64) {
    let (mut queue, report) = Queue::open(roomy_config(dir), at_ms(10_000)).unwrap();
    let epoch = queue.epoch();
    let mut quarantined = report.quarantined.is_some();
    let mut intact = 0;
    if !quarantined {
        queue.requeue_unacked();
        let limits = edgewatch_queue::BatchLimits {
            max_records: 50,
            max_bytes: 1 << 20,
        };
        loop {
            match queue.next_batch(limits) {
                Ok(Some(batch)) => {
                    for (seq, bytes) in batch.records() {
                        let event =
                            <edgewatch_proto::v1::Event as prost::Message>::decode(bytes).unwrap();
                        assert_eq!(
                            name_of(&event),
                            names.get(&(batch.tier(), seq)).map(String::as_str),
                            "a record read back is the one written under its seq"
                        );
                        intact += 1;
                    }
                }
                Ok(None) => break,
                // The store noticed damage while reading: the next flush quarantines it.
                Err(_) => break,
            }
        }
        queue.flush(at_ms(10_001)).unwrap();
        quarantined = queue.epoch() != epoch;
    }
    let status = queue.status(at_ms(10_002));
    let corrupt = status.tiers.iter().map(|(_, t)| t.corrupt).sum();
    if quarantined {
        let all = read_everything(&mut queue);
        // Salvaged records keep their sequence numbers and content.
        for ((tier, seq), event) in &all {
            if let Some(name) = name_of(event) {
                assert_eq!(Some(name), names.get(&(*tier, *seq)).map(String::as_str));
                intact += 1;
            }
        }
        // What was not salvaged is reported lost, under the old epoch.
        let reported: u64 = all
            .values()
            .filter_map(queue_loss)
            .filter(|loss| loss.cause == LossCause::Quarantined as i32)
            .inspect(|loss| assert_eq!(loss.epoch, old_epoch, "reported under the old epoch"))
            .map(|loss| loss.count)
            .sum();
        assert!(
            intact as u64 + reported >= RECORDS,
            "{intact} salvaged + {reported} reported lost < {RECORDS}"
        );
        let counted: u64 = status.tiers.iter().map(|(_, t)| t.quarantined).sum();
        assert_eq!(counted, reported);
    }
    drop(queue);
    // No crash loop: the next start opens normally.
    let (_queue, report) = Queue::open(roomy_config(dir), at_ms(10_003)).unwrap();
    assert!(
        report.quarantined.is_none(),
        "a second open quarantines nothing"
    );
    (intact, quarantined, corrupt)
}

#[test]
fn a_garbage_file_with_nothing_to_bound_its_loss_is_quarantined_and_no_loss_is_invented() {
    let dir = tempfile::tempdir().unwrap();
    let garbage: Vec<u8> = (0..65_536u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    replace_store(dir.path(), &garbage);
    let (mut queue, report) = Queue::open(roomy_config(dir.path()), t0()).unwrap();
    let quarantined = report.quarantined.clone().unwrap();
    assert!(report.created);
    assert_eq!(
        std::fs::read(quarantined.moved_to.join("state.0")).unwrap(),
        garbage
    );
    assert!(quarantined.moved_to.with_extension("reason").exists());
    // Neither a state nor a status snapshot says what the file held: nothing is reported, and
    // the log says the loss is unknown.
    assert!(read_everything(&mut queue).is_empty());
    drop(queue);
    let (_, report) = Queue::open(roomy_config(dir.path()), at_ms(1)).unwrap();
    assert!(report.quarantined.is_none());
    assert_eq!(report.losses.safety, [0; 8]);
}

#[test]
fn an_empty_file_is_a_fresh_queue_and_a_foreign_database_is_quarantined() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join(STORE)).unwrap();
    let (_, report) = Queue::open(roomy_config(dir.path()), t0()).unwrap();
    assert!(report.created && report.quarantined.is_none());

    // Files that are not the queue's: a segment without any state.
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join(STORE)).unwrap();
    std::fs::write(segment_path(dir.path(), "safety", 1), b"k v").unwrap();
    let (_, report) = Queue::open(roomy_config(dir.path()), t0()).unwrap();
    assert!(report.quarantined.is_some());
}

/// The store's files laid end to end, in name order (damage anywhere in them is damage to the
/// store), with each file's length.
fn concatenated(dir: &Path) -> (Vec<u8>, Vec<(String, usize)>) {
    let mut all = Vec::new();
    let mut layout = Vec::new();
    for (name, bytes) in store_files(dir) {
        layout.push((name, bytes.len()));
        all.extend_from_slice(&bytes);
    }
    (all, layout)
}

/// A queue directory holding `store` (concatenated files cut back into `layout`; a file past
/// the end of a truncated `store` is missing, the one it ends in short) and the pristine queue's
/// status snapshot.
fn damaged_dir(pristine: &Path, store: &[u8], layout: &[(String, usize)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    let mut at = 0;
    for (name, len) in layout {
        if at >= store.len() {
            break;
        }
        let end = (at + len).min(store.len());
        files.push((name.clone(), store[at..end].to_vec()));
        at += len;
    }
    write_store_files(dir.path(), &files);
    std::fs::copy(pristine.join("status"), dir.path().join("status")).unwrap();
    dir
}

fn snapshot_epoch(dir: &Path) -> u64 {
    edgewatch_queue::read_snapshot(&dir.join("status"))
        .unwrap()
        .epoch
}

#[test]
fn a_truncated_store_never_panics_and_loses_nothing_silently() {
    let pristine = tempfile::tempdir().unwrap();
    let names = filled_queue(pristine.path());
    let epoch = snapshot_epoch(pristine.path());
    let (bytes, layout) = concatenated(pristine.path());
    for keep in [bytes.len() / 2, bytes.len() / 4, 4096, 100, bytes.len() - 1] {
        let dir = damaged_dir(pristine.path(), &bytes[..keep], &layout);
        let (intact, quarantined, corrupt) = open_damaged(dir.path(), &names, epoch);
        assert!(
            quarantined || intact as u64 + corrupt >= RECORDS,
            "truncated to {keep}: {intact} intact, {corrupt} corrupt, not quarantined"
        );
    }
}

#[test]
fn bit_flips_anywhere_never_panic_and_every_record_is_intact_or_accounted() {
    let pristine = tempfile::tempdir().unwrap();
    let names = filled_queue(pristine.path());
    let epoch = snapshot_epoch(pristine.path());
    let (bytes, layout) = concatenated(pristine.path());
    let trials = util::child::env_count("EDGEWATCH_QUEUE_FLIP_TRIALS", 60);
    let mut rng = Rng(util::child::seed(0x5eed_0003));
    let (mut quarantines, mut corrupt_seen, mut untouched, mut salvaged) = (0, 0, 0, 0);
    for trial in 0..trials {
        let mut damaged = bytes.clone();
        for _ in 0..1 + rng.below(8) {
            let at = rng.below(damaged.len() as u64) as usize;
            damaged[at] ^= 1 << rng.below(8);
        }
        let dir = damaged_dir(pristine.path(), &damaged, &layout);
        let (intact, quarantined, corrupt) = open_damaged(dir.path(), &names, epoch);
        // A flip in the stored counts can over-count a loss; nothing may go uncounted.
        assert!(
            quarantined || intact as u64 + corrupt >= RECORDS,
            "trial {trial}: {intact} intact + {corrupt} corrupt < {RECORDS}, not quarantined"
        );
        if quarantined {
            quarantines += 1;
            salvaged += intact;
        } else if corrupt > 0 {
            corrupt_seen += 1;
        } else {
            untouched += 1;
        }
    }
    println!(
        "{trials} trials: {quarantines} quarantined ({salvaged} records salvaged, {} per \
         quarantine), {corrupt_seen} with corrupt records skipped and counted, {untouched} with \
         every record intact",
        salvaged / quarantines.max(1)
    );
}

#[test]
fn a_record_failing_its_checksum_is_skipped_counted_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let names = filled_queue(dir.path());
    {
        let segment = segment_path(dir.path(), "debug", 1);
        let mut bytes = std::fs::read(&segment).unwrap();
        let (_, _, end) = segment_frames(&bytes)
            .into_iter()
            .find(|(seq, _, _)| *seq == 7)
            .unwrap();
        bytes[end - 1] ^= 0x40;
        std::fs::write(&segment, bytes).unwrap();
    }
    let (mut queue, report) = Queue::open(roomy_config(dir.path()), t0()).unwrap();
    assert!(report.quarantined.is_none());
    let first = read_everything(&mut queue);
    assert!(!first.contains_key(&(Tier::Debug, 7)));
    let named = first.values().filter(|e| name_of(e).is_some()).count();
    assert_eq!(named as u64, RECORDS - 1);
    for ((tier, seq), event) in first.iter().filter(|(_, e)| name_of(e).is_some()) {
        assert_eq!(
            name_of(event),
            names.get(&(*tier, *seq)).map(String::as_str)
        );
    }
    queue.flush(at_ms(1)).unwrap();
    let status = queue.status(at_ms(1));
    assert_eq!(status.tiers.debug.corrupt, 1);
    assert_eq!(
        status.tiers.debug.records,
        RECORDS / 3 - 1,
        "the bad record was deleted"
    );
    let all = read_everything(&mut queue);
    let loss = all
        .iter()
        .find_map(|((tier, _), e)| queue_loss(e).map(|l| (*tier, *l)))
        .unwrap();
    assert_eq!(
        loss.0,
        Tier::Slo,
        "debug losses are reported in the SLO tier"
    );
    assert_eq!(
        (
            loss.1.tier,
            loss.1.cause,
            loss.1.count,
            loss.1.first_seq,
            loss.1.last_seq
        ),
        (Tier::Debug as i32, LossCause::Corrupt as i32, 1, 7, 7)
    );
    drop(queue);
    let (_, report) = Queue::open(roomy_config(dir.path()), at_ms(2)).unwrap();
    assert_eq!(
        report.losses.debug[LossCause::Corrupt as usize],
        1,
        "the count persists"
    );
}

#[test]
fn an_interrupted_quarantine_is_completed_at_the_next_open() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut queue, _) = Queue::open(roomy_config(dir.path()), t0()).unwrap();
        queue
            .append(Tier::Safety, &named_event("s", 10), at_ms(1))
            .unwrap();
        queue.flush(at_ms(2)).unwrap();
        queue.refresh_status_snapshot(at_ms(3));
    }
    replace_store(dir.path(), b"not a database at all, not even close");
    let (queue, _) = Queue::open(roomy_config(dir.path()), at_ms(4)).unwrap();
    let epoch = queue.epoch();
    drop(queue);
    // As if the power failed between moving the broken store aside and renaming the fresh one.
    std::fs::rename(dir.path().join(STORE), dir.path().join("queue.log.new")).unwrap();
    let (mut queue, report) = Queue::open(roomy_config(dir.path()), at_ms(5)).unwrap();
    assert!(report.quarantined.is_none());
    assert_eq!(queue.epoch(), epoch);
    assert_eq!(
        read_everything(&mut queue).len(),
        1,
        "the quarantine report is kept"
    );
}

#[test]
fn quarantine_keeps_only_the_newest_broken_stores() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..4u64 {
        replace_store(dir.path(), b"garbage garbage garbage garbage");
        let (_, report) = Queue::open(roomy_config(dir.path()), at_ms(i * 1000)).unwrap();
        assert!(report.quarantined.is_some());
    }
    let kept = std::fs::read_dir(dir.path().join("quarantine"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "log")
        })
        .count();
    assert_eq!(kept, edgewatch_queue::queue::QUARANTINE_KEEP);
}

#[test]
fn a_quarantined_store_hands_its_key_value_area_to_the_fresh_one() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut queue, _) = Queue::open(roomy_config(dir.path()), t0()).unwrap();
        queue
            .append(Tier::Slo, &named_event("counted", 10), at_ms(1))
            .unwrap();
        queue.stage_kv("sampler/0", b"counted up to 1").unwrap();
        queue.flush(at_ms(2)).unwrap();
    }
    // One state slot is damaged (the older: the newer one, with the area, reads).
    {
        let store = dir.path().join(STORE);
        let generation = |name: &str| {
            let bytes = std::fs::read(store.join(name)).unwrap();
            u64::from_le_bytes(bytes[16..24].try_into().unwrap())
        };
        let older = if generation("state.0") < generation("state.1") {
            "state.0"
        } else {
            "state.1"
        };
        let mut bytes = std::fs::read(store.join(older)).unwrap();
        bytes[20] ^= 0x40;
        std::fs::write(store.join(older), bytes).unwrap();
    }
    let (mut queue, report) = Queue::open(roomy_config(dir.path()), at_ms(3)).unwrap();
    assert!(report.quarantined.is_some());
    assert_eq!(queue.kv("sampler/0"), Some(&b"counted up to 1"[..]));
    let names: Vec<String> = read_everything(&mut queue)
        .values()
        .filter_map(|event| name_of(event).map(str::to_owned))
        .collect();
    assert_eq!(
        names,
        ["counted"],
        "the record it describes was salvaged too"
    );
}
