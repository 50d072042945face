//! Model-based tests: random append / read / ack / requeue / rewind / flush / restart / crash
//! actions run against the real queue (a real log on disk) and against a plain in-memory model,
//! which keeps only what was flushed when the queue crashes. Every batch, every durable report and
//! every record count must match; an acknowledgement carrying another epoch changes nothing.
//!
//! The key-value area runs in the same model: entries staged after an append (naming it, as the
//! agent's samplers name the events their state describes), staged alone, or removed. After every
//! action the queue's area equals the model's (staged over durable), after a crash only what a
//! flush made durable survives, and an entry that survived a crash never names an append that did
//! not.
//!
//! Flushes come as the agent's flusher makes them too (`flush_scheduled`): a safety commit may
//! leave a large SLO or debug backlog, or acknowledgements, waiting; the model then moves only
//! the safety appends to durable (the acknowledgements stay pending, lost in a crash), and checks
//! that no key-value entry staged after a waiting safety append was left behind by it.
//!
//! A second property runs the same actions with a budget small enough to evict and age limits
//! short enough to expire, and checks conservation instead of equality: every record ever made
//! durable is still there, was acknowledged or dead-lettered, or is counted as lost.
//!
//! `PROPTEST_CASES=N` runs more cases (default 48 each).
#![allow(clippy::unwrap_used)]
// Test code: a failed unwrap is a failed test.
// A tier index addresses the model's arrays and `TIERS` alike.
#![allow(clippy::needless_range_loop)]

mod util;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use edgewatch_proto::v1::Event;
use edgewatch_queue::{BatchLimits, Queue, RawQueueConfig, TIERS};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use prost::Message;
use util::*;

#[derive(Clone, Debug)]
enum Action {
    Append {
        tier: usize,
        pad: usize,
    },
    Flush,
    Read {
        max_records: usize,
        max_bytes: usize,
    },
    Ack {
        tier: usize,
        from_back: u64,
        len: u64,
    },
    AckLastBatch,
    /// An acknowledgement read in another epoch (before a quarantine): it must change nothing.
    AckOtherEpoch {
        tier: usize,
        from_back: u64,
        len: u64,
    },
    /// The uplink split a batch: hand the tier out again from a recent number.
    Rewind {
        tier: usize,
        from_back: u64,
    },
    /// The uplink gave up on the first record of the last batch.
    DeadLetterLastBatch,
    Requeue,
    Restart,
    Crash,
    Wait {
        ms: u64,
    },
    /// Appends an event, then stages key `key` naming it.
    AppendAndStage {
        tier: usize,
        key: usize,
    },
    /// Stages key `key` with a value naming no event.
    Stage {
        key: usize,
        len: usize,
    },
    RemoveKey {
        key: usize,
    },
    /// Appends `count` events of about 1 KB to a bulk tier: enough of them outweigh what a
    /// safety commit carries.
    BulkBurst {
        tier: usize,
        count: usize,
    },
    /// A flush as the agent's flusher makes it, `ms` after the last action.
    FlushScheduled {
        ms: u64,
    },
}

/// Padding of a [`Action::BulkBurst`] event.
const BURST_PAD: usize = 900;

/// Keys of the key-value area the actions use.
const KEYS: usize = 3;

fn key_name(key: usize) -> String {
    format!("sampler/{key}")
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        8 => (0..3usize, 0..300usize).prop_map(|(tier, pad)| Action::Append { tier, pad }),
        3 => Just(Action::Flush),
        4 => (1..8usize, 1..3000usize)
            .prop_map(|(max_records, max_bytes)| Action::Read { max_records, max_bytes }),
        2 => (0..3usize, 0..30u64, 0..10u64)
            .prop_map(|(tier, from_back, len)| Action::Ack { tier, from_back, len }),
        2 => Just(Action::AckLastBatch),
        1 => (0..3usize, 0..30u64, 0..10u64)
            .prop_map(|(tier, from_back, len)| Action::AckOtherEpoch { tier, from_back, len }),
        1 => (0..3usize, 0..30u64).prop_map(|(tier, from_back)| Action::Rewind { tier, from_back }),
        1 => Just(Action::DeadLetterLastBatch),
        1 => Just(Action::Requeue),
        1 => Just(Action::Restart),
        1 => Just(Action::Crash),
        1 => (1..5000u64).prop_map(|ms| Action::Wait { ms }),
        4 => (0..3usize, 0..KEYS).prop_map(|(tier, key)| Action::AppendAndStage { tier, key }),
        2 => (0..KEYS, 0..2000usize).prop_map(|(key, len)| Action::Stage { key, len }),
        1 => (0..KEYS).prop_map(|key| Action::RemoveKey { key }),
        2 => (1..3usize, 10..60usize).prop_map(|(tier, count)| Action::BulkBurst { tier, count }),
        3 => (0..1500u64).prop_map(|ms| Action::FlushScheduled { ms }),
    ]
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(48)
}

/// The plain model: what is durable, what waits for a flush, what was handed out.
#[derive(Default)]
struct Model {
    durable: [BTreeMap<u64, String>; 3],
    pending: Vec<(usize, u64, String)>,
    durable_next: [u64; 3],
    next: [u64; 3],
    acks: Vec<(usize, u64, u64)>,
    cursor: [u64; 3],
    /// The key-value area as committed.
    kv_durable: BTreeMap<String, String>,
    /// Staged since the last flush: a value, or `None` for a removal.
    kv_staged: BTreeMap<String, Option<String>>,
    /// A key-value entry was staged while a safety append waited.
    kv_after_safety: bool,
}

impl Model {
    fn new() -> Self {
        Self {
            durable_next: [1; 3],
            next: [1; 3],
            ..Self::default()
        }
    }

    fn acked(&self, tier: usize, seq: u64) -> bool {
        self.acks
            .iter()
            .any(|&(t, first, last)| t == tier && (first..=last).contains(&seq))
    }

    fn flush(&mut self) {
        for (key, value) in std::mem::take(&mut self.kv_staged) {
            match value {
                Some(value) => self.kv_durable.insert(key, value),
                None => self.kv_durable.remove(&key),
            };
        }
        for (tier, seq, name) in self.pending.drain(..) {
            self.durable[tier].insert(seq, name);
        }
        for &(tier, first, last) in &self.acks {
            self.durable[tier].retain(|seq, _| !(first..=last).contains(seq));
        }
        self.acks.clear();
        self.durable_next = self.next;
        self.kv_after_safety = false;
    }

    /// A safety commit: the waiting safety appends become durable, nothing else.
    fn flush_safety(&mut self) {
        let (safety, rest): (Vec<_>, Vec<_>) =
            self.pending.drain(..).partition(|(tier, _, _)| *tier == 0);
        self.pending = rest;
        for (tier, seq, name) in safety {
            self.durable[tier].insert(seq, name);
        }
        self.durable_next[0] = self.next[0];
    }

    fn safety_waits(&self) -> bool {
        self.pending.iter().any(|(tier, _, _)| *tier == 0)
    }

    fn stage(&mut self, key: String, value: Option<String>) {
        self.kv_after_safety |= self.safety_waits();
        self.kv_staged.insert(key, value);
    }

    fn crash(&mut self) {
        self.pending.clear();
        self.acks.clear();
        self.kv_staged.clear();
        self.kv_after_safety = false;
        self.next = self.durable_next;
        self.cursor = [0; 3];
    }

    /// The value of `key` the queue must return: staged over durable.
    fn kv(&self, key: &str) -> Option<&str> {
        match self.kv_staged.get(key) {
            Some(staged) => staged.as_deref(),
            None => self.kv_durable.get(key).map(String::as_str),
        }
    }

    fn ack(&mut self, tier: usize, first: u64, last: u64) {
        let last = last.min(self.durable_next[tier] - 1);
        if first <= last {
            self.acks.push((tier, first, last));
        }
    }

    /// The batch the queue must hand out: `(tier, [(seq, name)])`.
    fn read(
        &mut self,
        limits: BatchLimits,
        pads: &BTreeMap<String, usize>,
    ) -> Option<(usize, Vec<(u64, String)>)> {
        for tier in 0..3 {
            let end = self.durable_next[tier];
            if self.cursor[tier] >= end {
                continue;
            }
            let mut batch: Vec<(u64, String)> = Vec::new();
            let mut bytes = 0;
            let mut stopped_at = None;
            for (&seq, name) in self.durable[tier].range(self.cursor[tier]..end) {
                if self.acked(tier, seq) {
                    continue;
                }
                let mut event = named_event(name, pads[name]);
                event.seq = seq;
                let len = event.encoded_len();
                if !batch.is_empty()
                    && (batch.len() >= limits.max_records || bytes + len > limits.max_bytes)
                {
                    stopped_at = Some(seq);
                    break;
                }
                bytes += len;
                batch.push((seq, name.clone()));
            }
            self.cursor[tier] = stopped_at.unwrap_or(end);
            if !batch.is_empty() {
                return Some((tier, batch));
            }
        }
        None
    }
}

fn open(config: &RawQueueConfig, now_ms: u64) -> Queue {
    Queue::open(config.clone(), at_ms(now_ms)).unwrap().0
}

/// The value staged for the event `name` of `tier` and `seq`.
fn naming(tier: usize, seq: u64, name: &str) -> String {
    format!("{tier}:{seq}:{name}")
}

fn run_against_model(dir: &Path, actions: Vec<Action>) -> Result<(), TestCaseError> {
    let config = roomy_config(dir);
    let mut queue = open(&config, 0);
    let mut model = Model::new();
    let mut pads = BTreeMap::new();
    let mut last_batch: Option<(usize, u64, u64)> = None;
    let mut now = 1u64;
    for (step, action) in actions.into_iter().enumerate() {
        now += 1;
        match action {
            Action::Append { tier, pad } => {
                let name = format!("e{step}");
                pads.insert(name.clone(), pad);
                let seq = queue
                    .append(TIERS[tier], &named_event(&name, pad), at_ms(now))
                    .unwrap();
                prop_assert_eq!(seq, model.next[tier]);
                model.next[tier] += 1;
                model.pending.push((tier, seq, name));
            }
            Action::Flush => {
                let outcome = queue.flush(at_ms(now)).unwrap();
                model.flush();
                for tier in 0..3 {
                    prop_assert_eq!(
                        *outcome.durable.get(TIERS[tier]).unwrap(),
                        model.durable_next[tier] - 1
                    );
                }
                let status = queue.status(at_ms(now));
                for (tier, t) in status.tiers.iter() {
                    let ix = tier as usize - 1;
                    prop_assert_eq!(t.records, model.durable[ix].len() as u64);
                }
            }
            Action::Read {
                max_records,
                max_bytes,
            } => {
                let limits = BatchLimits {
                    max_records,
                    max_bytes,
                };
                let expected = model.read(limits, &pads);
                let got = queue.next_batch(limits).unwrap().map(|batch| {
                    let tier = batch.tier() as usize - 1;
                    let records: Vec<(u64, String)> = batch
                        .records()
                        .map(|(seq, bytes)| {
                            let event = Event::decode(bytes).unwrap();
                            assert_eq!(event.seq, seq);
                            (seq, name_of(&event).unwrap().to_owned())
                        })
                        .collect();
                    (tier, records)
                });
                prop_assert_eq!(&got, &expected);
                last_batch =
                    got.map(|(tier, records)| (tier, records[0].0, records[records.len() - 1].0));
            }
            Action::Ack {
                tier,
                from_back,
                len,
            } => {
                let first = model.durable_next[tier].saturating_sub(from_back).max(1);
                let last = first + len;
                let epoch = queue.epoch();
                queue.ack(TIERS[tier], epoch, first..=last, at_ms(now));
                model.ack(tier, first, last);
            }
            Action::AckLastBatch => {
                if let Some((tier, first, last)) = last_batch.take() {
                    let epoch = queue.epoch();
                    queue.ack(TIERS[tier], epoch, first..=last, at_ms(now));
                    model.ack(tier, first, last);
                }
            }
            Action::AckOtherEpoch {
                tier,
                from_back,
                len,
            } => {
                let first = model.durable_next[tier].saturating_sub(from_back).max(1);
                let epoch = queue.epoch() ^ 1;
                prop_assert!(!queue.ack(TIERS[tier], epoch, first..=first + len, at_ms(now)));
            }
            Action::Rewind { tier, from_back } => {
                let from = model.durable_next[tier].saturating_sub(from_back).max(1);
                let epoch = queue.epoch();
                prop_assert!(queue.rewind(TIERS[tier], epoch, from));
                model.cursor[tier] = model.cursor[tier].min(from);
            }
            // Dead letters add loss reports, which this model does not follow: see the
            // conservation property.
            Action::DeadLetterLastBatch => {}
            Action::Requeue => {
                queue.requeue_unacked();
                model.cursor = [0; 3];
            }
            Action::Restart => {
                queue.flush(at_ms(now)).unwrap();
                model.flush();
                drop(queue);
                model.crash();
                queue = open(&config, now);
                last_batch = None;
            }
            Action::Crash => {
                drop(queue);
                model.crash();
                queue = open(&config, now);
                last_batch = None;
                // What survived names only records that survived too.
                for key in 0..KEYS {
                    let Some(value) = queue.kv(&key_name(key)) else {
                        continue;
                    };
                    let value = std::str::from_utf8(value).unwrap();
                    let mut parts = value.splitn(3, ':');
                    let (Some(tier), Some(seq), Some(name)) =
                        (parts.next(), parts.next(), parts.next())
                    else {
                        continue;
                    };
                    let (tier, seq): (usize, u64) = (tier.parse().unwrap(), seq.parse().unwrap());
                    prop_assert!(
                        seq <= queue.durable_seq(TIERS[tier]),
                        "entry {} survived the crash, the event it names ({}) did not",
                        value,
                        name
                    );
                }
            }
            Action::Wait { ms } => now += ms,
            Action::AppendAndStage { tier, key } => {
                let name = format!("e{step}");
                pads.insert(name.clone(), 0);
                let seq = queue
                    .append(TIERS[tier], &named_event(&name, 0), at_ms(now))
                    .unwrap();
                prop_assert_eq!(seq, model.next[tier]);
                model.next[tier] += 1;
                model.pending.push((tier, seq, name.clone()));
                let value = naming(tier, seq, &name);
                queue.stage_kv(&key_name(key), value.as_bytes()).unwrap();
                model.stage(key_name(key), Some(value));
            }
            Action::Stage { key, len } => {
                let value = format!("s{step}{}", "x".repeat(len));
                queue.stage_kv(&key_name(key), value.as_bytes()).unwrap();
                model.stage(key_name(key), Some(value));
            }
            Action::RemoveKey { key } => {
                queue.remove_kv(&key_name(key));
                if model.kv(&key_name(key)).is_some() {
                    model.stage(key_name(key), None);
                }
            }
            Action::BulkBurst { tier, count } => {
                for i in 0..count {
                    let name = format!("e{step}.{i}");
                    pads.insert(name.clone(), BURST_PAD);
                    let seq = queue
                        .append(TIERS[tier], &named_event(&name, BURST_PAD), at_ms(now))
                        .unwrap();
                    prop_assert_eq!(seq, model.next[tier]);
                    model.next[tier] += 1;
                    model.pending.push((tier, seq, name));
                }
            }
            Action::FlushScheduled { ms } => {
                now += ms;
                let outcome = queue.flush_scheduled(at_ms(now)).unwrap();
                if !outcome.safety_only {
                    model.flush();
                } else {
                    // A safety commit: only with safety waiting, never leaving behind an entry
                    // staged after a safety append, and never moving the bulk tiers.
                    prop_assert!(
                        model.safety_waits(),
                        "a partial flush with no safety waiting"
                    );
                    prop_assert!(
                        !model.kv_after_safety,
                        "a safety commit left an entry staged after its append behind"
                    );
                    model.flush_safety();
                }
                for tier in 0..3 {
                    prop_assert_eq!(
                        *outcome.durable.get(TIERS[tier]).unwrap(),
                        model.durable_next[tier] - 1
                    );
                }
            }
        }
        for tier in 0..3 {
            prop_assert_eq!(queue.durable_seq(TIERS[tier]), model.durable_next[tier] - 1);
        }
        for key in 0..KEYS {
            let got = queue
                .kv(&key_name(key))
                .map(|v| std::str::from_utf8(v).unwrap());
            prop_assert_eq!(got, model.kv(&key_name(key)), "key {}", key);
        }
    }
    // Finally everything durable and not acknowledged is read back exactly.
    queue.flush(at_ms(now + 1)).unwrap();
    model.flush();
    let all = read_everything(&mut queue);
    let expected: BTreeSet<(usize, u64, String)> = (0..3)
        .flat_map(|tier| {
            model.durable[tier]
                .iter()
                .map(move |(seq, name)| (tier, *seq, name.clone()))
        })
        .collect();
    let got: BTreeSet<(usize, u64, String)> = all
        .iter()
        .map(|((tier, seq), event)| (*tier as usize - 1, *seq, name_of(event).unwrap().to_owned()))
        .collect();
    let differ: Vec<_> = got.symmetric_difference(&expected).take(5).collect();
    prop_assert!(
        differ.is_empty(),
        "{} records read back, {} expected; first differences: {:?}",
        got.len(),
        expected.len(),
        differ
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        // Relative to the package root, where cargo runs tests.
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/model.txt",
        ))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn the_queue_behaves_like_the_model_through_restarts_and_crashes(
        actions in proptest::collection::vec(action(), 1..80)
    ) {
        let dir = tempfile::tempdir().unwrap();
        run_against_model(dir.path(), actions)?;
    }

    #[test]
    fn with_evictions_and_expiry_every_durable_record_is_kept_acked_or_counted(
        actions in proptest::collection::vec(action(), 1..120)
    ) {
        let dir = tempfile::tempdir().unwrap();
        run_conservation(dir.path(), actions)?;
    }
}

/// Small budget and short debug age: the queue evicts and expires. Tracks what was made durable
/// and checks, after every flush, restart and crash, that each such record is present with its
/// content, or was acknowledged, or that the tier's loss counters cover it.
fn run_conservation(dir: &Path, actions: Vec<Action>) -> Result<(), TestCaseError> {
    let mut config = roomy_config(dir);
    config.budget_bytes = 256 * 1024;
    config.max_pending_bytes = 32 * 1024;
    config.max_record_bytes = 1024;
    config.share_percent.safety = 10;
    config.share_percent.slo = 40;
    config.share_percent.debug = 60;
    config.max_age.debug = Some(Duration::from_secs(20));
    let mut queue = open(&config, 0);
    let mut durable: [BTreeMap<u64, String>; 3] = Default::default();
    let mut pending: Vec<(usize, u64, String)> = Vec::new();
    let mut acked: Vec<(usize, u64, u64)> = Vec::new();
    let mut last_batch: Option<(usize, u64, u64)> = None;
    let mut now = 1u64;
    let check = |queue: &mut Queue,
                 durable: &[BTreeMap<u64, String>; 3],
                 acked: &[(usize, u64, u64)],
                 now: u64|
     -> Result<(), TestCaseError> {
        let all = read_everything(queue);
        let status = queue.status(at_ms(now));
        for tier in 0..3 {
            let t = status.tiers.get(TIERS[tier]).unwrap();
            let mut missing = 0;
            for (seq, name) in &durable[tier] {
                match all.get(&(TIERS[tier], *seq)) {
                    Some(event) => prop_assert_eq!(name_of(event), Some(name.as_str())),
                    None => {
                        if !acked
                            .iter()
                            .any(|&(a, f, l)| a == tier && (f..=l).contains(seq))
                        {
                            missing += 1;
                        }
                    }
                }
            }
            prop_assert!(
                missing <= t.evicted + t.expired + t.corrupt,
                "tier {} lost {} records silently (counted {})",
                tier,
                missing,
                t.evicted + t.expired + t.corrupt
            );
            prop_assert!(t.bytes <= t.cap_bytes);
        }
        let total: u64 = status.tiers.iter().map(|(_, t)| t.bytes).sum();
        prop_assert!(total <= status.budget_bytes);
        Ok(())
    };
    for (step, action) in actions.into_iter().enumerate() {
        now += 1;
        match action {
            Action::Append { tier, pad } => {
                let name = format!("e{step}");
                let seq = queue
                    .append(TIERS[tier], &named_event(&name, pad * 3), at_ms(now))
                    .unwrap();
                pending.push((tier, seq, name));
            }
            Action::Flush | Action::Restart => {
                let outcome = queue.flush(at_ms(now)).unwrap();
                for (tier, seq, name) in pending.drain(..) {
                    prop_assert!(seq <= *outcome.durable.get(TIERS[tier]).unwrap());
                    durable[tier].insert(seq, name);
                }
                if matches!(action, Action::Restart) {
                    drop(queue);
                    queue = open(&config, now);
                    last_batch = None;
                }
                check(&mut queue, &durable, &acked, now)?;
            }
            Action::Crash => {
                drop(queue);
                pending.clear();
                queue = open(&config, now);
                last_batch = None;
                check(&mut queue, &durable, &acked, now)?;
            }
            Action::Read {
                max_records,
                max_bytes,
            } => {
                let limits = BatchLimits {
                    max_records,
                    max_bytes,
                };
                last_batch = queue.next_batch(limits).unwrap().map(|batch| {
                    (
                        batch.tier() as usize - 1,
                        batch.first_seq(),
                        batch.last_seq(),
                    )
                });
            }
            Action::Ack { .. } | Action::AckLastBatch => {
                if let Some((tier, first, last)) = last_batch.take() {
                    let epoch = queue.epoch();
                    queue.ack(TIERS[tier], epoch, first..=last, at_ms(now));
                    acked.push((tier, first, last));
                }
            }
            Action::AckOtherEpoch {
                tier, from_back, ..
            } => {
                let seq = queue
                    .durable_seq(TIERS[tier])
                    .saturating_sub(from_back)
                    .max(1);
                let epoch = queue.epoch() ^ 1;
                prop_assert!(!queue.ack(TIERS[tier], epoch, 1..=seq, at_ms(now)));
            }
            Action::Rewind { tier, from_back } => {
                let from = queue
                    .durable_seq(TIERS[tier])
                    .saturating_sub(from_back)
                    .max(1);
                let epoch = queue.epoch();
                queue.rewind(TIERS[tier], epoch, from);
            }
            Action::DeadLetterLastBatch => {
                if let Some((tier, first, _)) = last_batch.take() {
                    let epoch = queue.epoch();
                    // Counted and reported as a `Refused` loss (tests/uplink_positions.rs).
                    if queue.dead_letter(TIERS[tier], epoch, first, at_ms(now)) {
                        acked.push((tier, first, first));
                    }
                }
            }
            Action::Requeue => queue.requeue_unacked(),
            Action::Wait { ms } => now += ms * 4,
            Action::AppendAndStage { tier, key } => {
                let name = format!("e{step}");
                let seq = queue
                    .append(TIERS[tier], &named_event(&name, 0), at_ms(now))
                    .unwrap();
                pending.push((tier, seq, name.clone()));
                let value = naming(tier, seq, &name);
                queue.stage_kv(&key_name(key), value.as_bytes()).unwrap();
            }
            Action::Stage { key, len } => {
                let value = format!("s{step}{}", "x".repeat(len));
                queue.stage_kv(&key_name(key), value.as_bytes()).unwrap();
            }
            Action::RemoveKey { key } => queue.remove_kv(&key_name(key)),
            Action::BulkBurst { tier, count } => {
                for i in 0..count {
                    let name = format!("e{step}.{i}");
                    let seq = queue
                        .append(TIERS[tier], &named_event(&name, BURST_PAD), at_ms(now))
                        .unwrap();
                    pending.push((tier, seq, name));
                }
            }
            Action::FlushScheduled { ms } => {
                now += ms;
                let outcome = queue.flush_scheduled(at_ms(now)).unwrap();
                let (made, waiting): (Vec<_>, Vec<_>) = pending
                    .drain(..)
                    .partition(|entry| entry.1 <= *outcome.durable.get(TIERS[entry.0]).unwrap());
                pending = waiting;
                for (tier, seq, name) in made {
                    durable[tier].insert(seq, name);
                }
                check(&mut queue, &durable, &acked, now)?;
            }
        }
    }
    Ok(())
}
