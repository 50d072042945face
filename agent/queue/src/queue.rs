//! The queue: appends buffered in memory, one durable write transaction per flush holding the
//! appends, the deletions of acknowledged records, expiry, eviction, the loss reports and the
//! staged entries of the key-value area; reads in strict tier order; quarantine of a store that
//! will not open.
//!
//! Invariants:
//! - An append is durable only after the flush that wrote it returned `Ok`; reads hand out only
//!   durable records, so a sequence number seen outside the machine always belongs to one record.
//! - Records leave the store only by acknowledgement or by a counted loss (eviction, expiry,
//!   corruption, dead letter); each loss's counter and its `QueueLoss` report are written in the
//!   transaction that deleted the records.
//! - An acknowledgement, a dead letter or a rewind of another epoch (read before a quarantine
//!   renumbered the queue) changes nothing.
//! - Safety records are evicted only when the safety tier alone exceeds its own share.
//! - A key-value entry is staged in memory and written by the next commit with every append
//!   still waiting: never durable before an append made ahead of it. A failed commit keeps it
//!   staged; a quarantine writes the whole area into the fresh store.
//! - The queue reads no clock and spawns nothing: every time is an argument.

use std::ops::RangeInclusive;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use edgewatch_proto::tier::{self, PerTier, TIERS};
use edgewatch_proto::v1::{Event, LossCause, OfflineWindowLow, QueueLoss, Tier, event::Kind};
use prost::Message;

use crate::config::{
    LOSS_RESERVE_BYTES, MAX_KV_KEY_BYTES, MAX_KV_KEYS, MAX_KV_VALUE_BYTES, PENDING_CAPACITY,
    QueueConfig, RawQueueConfig,
};
use crate::error::{AppendError, FlushError, KvError, QueueError, ReadError};
use crate::record;
use crate::status::{self, QueueStatus, TierStatus};
use crate::store::{
    LOSS_CAUSES, Loaded, Persisted, Removed, Store, StoreError, StoreTx, contain_panic,
};
use crate::window::{self, RateEstimator, WindowAlarm};

/// The database file inside the queue directory.
pub const DB_FILE: &str = "queue.redb";
/// A fresh store being prepared to replace a quarantined one.
const FRESH_FILE: &str = "queue.redb.new";
/// Folder that quarantined stores are moved into.
pub const QUARANTINE_DIR: &str = "quarantine";
/// Quarantined stores kept; older ones are deleted so quarantine cannot fill the disk.
pub const QUARANTINE_KEEP: usize = 2;
/// Upper bound of a stored `QueueLoss` or `OfflineWindowLow` record (key, header and event).
pub const MAX_REPORT_BYTES: u64 = 160;
/// `compact_if_drained` rewrites the file only when it is at least this large...
pub const COMPACT_MIN_FILE_BYTES: u64 = 4 * 1024 * 1024;
/// ...and holds less than this fraction (1/n) of live record bytes.
pub const COMPACT_LIVE_FRACTION: u64 = 4;
/// SLO and debug bytes waiting that a safety commit still carries: above this, the safety appends
/// are committed alone and the rest keeps its own interval. Writing 190 KB more made a commit about
/// 6 ms slower on the reference VM (docs/benchmarks.md); 32 KiB costs about 1 ms, half the 2 ms
/// that load may add to a safety acknowledgement's p99.
pub const SAFETY_CARRY_BYTES: u64 = 32 * 1024;

/// Limits of one batch handed to the uplink.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchLimits {
    /// Most records in the batch.
    pub max_records: usize,
    /// Most event bytes in the batch; a single larger record is still handed out alone.
    pub max_bytes: usize,
}

impl Default for BatchLimits {
    fn default() -> Self {
        Self {
            max_records: 1000,
            max_bytes: 256 * 1024,
        }
    }
}

/// A batch of records of one tier, in increasing sequence order, borrowed from the queue's
/// reusable buffers.
#[derive(Debug)]
pub struct ReadBatch<'a> {
    tier: Tier,
    epoch: u64,
    index: &'a [(u64, usize, usize)],
    bytes: &'a [u8],
}

impl<'a> ReadBatch<'a> {
    /// Tier of every record in the batch.
    pub fn tier(&self) -> Tier {
        self.tier
    }

    /// Epoch of the queue the sequence numbers belong to.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// True if the batch holds no record (never returned by `next_batch`).
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Sequence number of the first record.
    pub fn first_seq(&self) -> u64 {
        self.index.first().map_or(0, |entry| entry.0)
    }

    /// Sequence number of the last record.
    pub fn last_seq(&self) -> u64 {
        self.index.last().map_or(0, |entry| entry.0)
    }

    /// Sum of the records' event bytes.
    pub fn event_bytes(&self) -> usize {
        self.bytes.len()
    }

    /// `(seq, event)` pairs; each event is a complete protobuf `Event` with its `seq` set.
    pub fn records(&self) -> impl Iterator<Item = (u64, &'a [u8])> + Clone + 'a {
        let bytes = self.bytes;
        self.index
            .iter()
            .map(move |&(seq, start, end)| (seq, &bytes[start..end]))
    }
}

/// What opening the queue found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenReport {
    /// Epoch of the queue now open.
    pub epoch: u64,
    /// True if the store was created by this open (first start or after a quarantine).
    pub created: bool,
    /// Set if the previous store would not open and was moved aside.
    pub quarantined: Option<Quarantined>,
    /// Records found per tier.
    pub records: PerTier<u64>,
    /// Loss totals found per tier: `[tier][LossCause as usize]`.
    pub losses: PerTier<[u64; LOSS_CAUSES]>,
}

/// A store moved aside.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quarantined {
    /// Where the old file now lives.
    pub moved_to: PathBuf,
    /// Why it would not open.
    pub reason: String,
}

/// What a successful flush made durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlushOutcome {
    /// Epoch the sequence numbers below belong to. It changes only when a damaged store was
    /// replaced; waiters holding numbers of an older epoch must be failed, not completed.
    pub epoch: u64,
    /// Highest durable sequence number per tier (0: none yet). Every lower number is durable or
    /// was reported lost.
    pub durable: PerTier<u64>,
    /// Records written by this flush per tier (appends, loss reports and alarms included).
    pub written: PerTier<u64>,
    /// Records evicted or expired by this flush per tier.
    pub lost: PerTier<u64>,
    /// False if there was nothing to write and no transaction was committed.
    pub committed: bool,
    /// Sequence ranges (inclusive) dropped since the previous flush returned, by a failed flush
    /// an `append` ran by itself: awaiting callers must stop waiting for them.
    pub refused: PerTier<Option<(u64, u64)>>,
}

impl FlushOutcome {
    /// True if `seq` of `tier` is durable: at or below the durable number and not among the
    /// refused ranges. A waiter whose number is at or below the durable number but refused must
    /// be failed.
    pub fn is_durable(&self, tier: Tier, seq: u64) -> bool {
        let durable = self
            .durable
            .get(tier)
            .is_some_and(|&durable| seq <= durable);
        let refused = self
            .refused
            .get(tier)
            .and_then(|range| *range)
            .is_some_and(|(first, last)| (first..=last).contains(&seq));
        durable && !refused
    }
}

#[derive(Clone, Copy, Debug)]
struct PendingEntry {
    ix: usize,
    seq: u64,
    start: usize,
    end: usize,
}

/// Appends waiting for the next flush: one byte arena and a fixed-capacity index, both reused.
/// The index is boxed once at open so the `Queue` itself stays small to move.
#[derive(Debug)]
struct Pending {
    bytes: Vec<u8>,
    entries: Box<heapless::Vec<PendingEntry, PENDING_CAPACITY>>,
    /// Append time of the oldest waiting safety record, and of the oldest other work.
    safety_since: Option<SystemTime>,
    bulk_since: Option<SystemTime>,
    /// A key-value entry was staged while a safety append waited: it may describe that append,
    /// so the append is written only by a full commit, with the entry.
    kv_after_safety: bool,
    /// An append (or `make_room`) flushed by itself since `flush` last returned: its outcome is
    /// owed to the caller, so a flush is due at once.
    flush_owed: bool,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct LossAcc {
    count: u64,
    bytes: u64,
    first_seq: u64,
    last_seq: u64,
    /// Incidents (a quarantine counts once whatever it lost).
    incidents: u64,
}

/// Losses not yet written as reports, per `[tier][cause]`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct LossLedger([[LossAcc; LOSS_CAUSES]; 3]);

impl LossLedger {
    fn add(&mut self, ix: usize, cause: LossCause, seq: Option<u64>, bytes: u64) {
        let acc = &mut self.0[ix][cause as usize];
        acc.count += 1;
        acc.incidents += 1;
        acc.bytes += bytes;
        if let Some(seq) = seq {
            if acc.first_seq == 0 || seq < acc.first_seq {
                acc.first_seq = seq;
            }
            acc.last_seq = acc.last_seq.max(seq);
        }
    }

    /// Adds `count` lost records whose sequence numbers are unknown.
    fn add_count(&mut self, ix: usize, cause: LossCause, count: u64) {
        let acc = &mut self.0[ix][cause as usize];
        acc.count += count;
        acc.incidents += 1;
    }

    fn add_removed(&mut self, ix: usize, cause: LossCause, removed: &Removed) {
        self.add(ix, cause, Some(removed.seq), removed.bytes);
    }

    fn is_empty(&self) -> bool {
        self.0
            .iter()
            .all(|row| row.iter().all(|acc| acc.incidents == 0))
    }

    /// Upper bound of the bytes the reports of this ledger (and an alarm) add to each tier.
    fn report_bytes(&self, alarm: bool) -> PerTier<u64> {
        let mut need = PerTier::<u64>::default();
        for (ix, row) in self.0.iter().enumerate() {
            let reports = row.iter().filter(|acc| acc.incidents > 0).count() as u64;
            *need.at_mut(if ix == 0 { 0 } else { 1 }) += reports * MAX_REPORT_BYTES;
        }
        if alarm {
            need.safety += MAX_REPORT_BYTES;
        }
        need
    }
}

/// One entry of the key-value area as the queue holds it: the whole area lives in memory (it is
/// small, see [`MAX_KV_KEYS`]) and is read from there.
#[derive(Debug)]
struct KvEntry {
    key: String,
    value: Vec<u8>,
    /// False once removed; the entry is dropped when its removal is committed.
    present: bool,
    /// Changed since the last commit: written (or removed) by the next one.
    staged: bool,
}

/// The durable priority-tiered event queue. See the crate documentation.
#[derive(Debug)]
pub struct Queue {
    config: QueueConfig,
    path: PathBuf,
    /// `None` while the store failed and waits to be reopened.
    store: Option<StoreSlot>,
    /// What the store holds as of the last commit.
    state: Persisted,
    /// Next sequence number to hand out per tier (ahead of `state` by the pending appends).
    next_seq: PerTier<u64>,
    pending: Pending,
    /// Acknowledged ranges `(tier, first, last)` to delete at the next flush.
    acks: Vec<(usize, u64, u64)>,
    /// Records found corrupt by reads, to delete and count at the next flush.
    corrupt: Vec<(usize, u64)>,
    /// Records the uplink gave up on (refused by the broker again and again), to delete and
    /// count as `Refused` at the next flush.
    dead_letters: Vec<(usize, u64)>,
    /// Next sequence number to read per tier; records below it are handed out or gone.
    cursor: PerTier<u64>,
    /// Losses noticed outside a write (refusals, overflow), reported at the next commit.
    unreported: LossLedger,
    /// Ranges dropped by failed flushes, handed to the caller by the next `flush`.
    refused: PerTier<Option<(u64, u64)>>,
    /// The key-value area: what the store holds, with what is staged for the next commit.
    kv: Vec<KvEntry>,
    rates: RateEstimator,
    alarm: WindowAlarm,
    /// Append time (unix ms) of each tier's oldest stored record.
    oldest_ms: PerTier<Option<u64>>,
    /// Why the store last failed, while it is unavailable or marked for repair.
    store_problem: Option<StoreError>,
    last_retry: Option<SystemTime>,
    last_status_write: Option<SystemTime>,
    scratch: Vec<u8>,
    value: Vec<u8>,
    batch_index: Vec<(u64, usize, usize)>,
    batch_bytes: Vec<u8>,
    status_text: String,
    snapshot_paths: status::SnapshotPaths,
}

/// The store, with a manual Debug (redb's handles have none worth printing).
struct StoreSlot(Store);

impl std::fmt::Debug for StoreSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Store")
    }
}

impl Queue {
    /// Opens (or creates) the queue in `config.dir`. A store that will not open, or panics while
    /// opening, is moved to `quarantine/` and replaced by a fresh one with a new epoch, whose
    /// first record reports the loss.
    pub fn open(
        config: RawQueueConfig,
        now: SystemTime,
    ) -> Result<(Queue, OpenReport), QueueError> {
        let config = config.validate()?;
        let dir = config.get().dir.clone();
        std::fs::create_dir_all(&dir).map_err(|source| QueueError::Directory {
            path: dir.clone(),
            source,
        })?;
        let path = dir.join(DB_FILE);
        let fresh = dir.join(FRESH_FILE);
        if !path.exists() && fresh.exists() {
            // A quarantine was interrupted after the fresh store was complete.
            rename(&fresh, &path)?;
        }
        let cache = config.get().cache_bytes;
        let verify = config.get().verify_on_open;
        let attempt = contain_panic(AssertUnwindSafe(|| {
            let mut store = Store::open(&path, cache)?;
            let clean = !verify || store.verify()?;
            let loaded = if clean { store.load()? } else { None };
            Ok((store, clean, loaded))
        }));
        let mut created = false;
        let mut quarantined = None;
        let (store, loaded) = match attempt {
            Ok((store, true, Some(loaded))) => (store, loaded),
            Ok((store, true, None)) => {
                created = true;
                let state = Persisted::fresh(new_epoch(now));
                store
                    .write(|tx| tx.put_state(&state))
                    .map_err(|error| unavailable(&path, &error))?;
                (store, Loaded::fresh(state))
            }
            Ok((store, false, _)) => {
                drop(store);
                let reason = "failed its integrity check".to_owned();
                let (store, loaded, moved) = quarantine(&config, &path, &reason, true, now)?;
                created = true;
                quarantined = Some(Quarantined {
                    moved_to: moved,
                    reason,
                });
                (store, loaded)
            }
            Err(StoreError::Corrupt(reason)) => {
                let (store, loaded, moved) = quarantine(&config, &path, &reason, true, now)?;
                created = true;
                quarantined = Some(Quarantined {
                    moved_to: moved,
                    reason,
                });
                (store, loaded)
            }
            Err(StoreError::Locked) => return Err(QueueError::AlreadyOpen(path)),
            Err(error) => return Err(unavailable(&path, &error)),
        };
        if let Some(q) = &quarantined {
            tracing::warn!(reason = %q.reason, moved_to = %q.moved_to.display(),
                "Queue store would not open; moved aside and started a fresh queue.");
        }
        let max_pending = usize::try_from(config.get().max_pending_bytes).unwrap_or(usize::MAX);
        let rate_tau = config.get().rate_time_constant;
        let state = loaded.state;
        let mut queue = Queue {
            path,
            store: Some(StoreSlot(store)),
            state,
            next_seq: state.next_seq,
            pending: Pending {
                bytes: Vec::with_capacity(max_pending),
                entries: Box::default(),
                safety_since: None,
                bulk_since: None,
                kv_after_safety: false,
                flush_owed: false,
            },
            acks: Vec::new(),
            dead_letters: Vec::new(),
            corrupt: loaded.corrupt,
            cursor: PerTier::default(),
            unreported: LossLedger::default(),
            refused: PerTier::default(),
            kv: loaded
                .kv
                .into_iter()
                .map(|(key, value)| KvEntry {
                    key,
                    value,
                    present: true,
                    staged: false,
                })
                .collect(),
            rates: RateEstimator::new(rate_tau),
            alarm: WindowAlarm::default(),
            oldest_ms: loaded.oldest_unix_ms,
            store_problem: None,
            last_retry: None,
            last_status_write: None,
            scratch: Vec::new(),
            value: Vec::new(),
            batch_index: Vec::new(),
            batch_bytes: Vec::new(),
            status_text: String::with_capacity(2048),
            snapshot_paths: status::SnapshotPaths::in_dir(&config.get().dir),
            config,
        };
        for ix in 0..3 {
            let missing = *loaded.unaccounted.at(ix);
            if missing > 0 {
                tracing::warn!(
                    tier = tier::NAMES[ix],
                    missing,
                    "Queue store lost records to damage; counted as corrupt."
                );
                queue.unreported.add_count(ix, LossCause::Corrupt, missing);
            }
        }
        if !queue.corrupt.is_empty() || !queue.unreported.is_empty() {
            // Count and report the damage now, before anything else can be lost with it. A failure
            // here is handled like any flush failure and retried.
            let _ = queue.flush(now);
        }
        queue.rates.update(now);
        let report = OpenReport {
            epoch: queue.state.epoch,
            created,
            quarantined,
            records: queue.state.records,
            losses: PerTier {
                safety: queue.state.losses[0],
                slo: queue.state.losses[1],
                debug: queue.state.losses[2],
            },
        };
        queue.write_status(now);
        Ok((queue, report))
    }

    /// The validated configuration's settings.
    pub fn config(&self) -> &RawQueueConfig {
        self.config.get()
    }

    /// Epoch of this queue: sequence numbers are unique per (machine, epoch, tier).
    pub fn epoch(&self) -> u64 {
        self.state.epoch
    }

    /// Highest durable sequence number of `tier` (0 if none).
    pub fn durable_seq(&self, tier: Tier) -> u64 {
        tier::index(tier).map_or(0, |ix| self.state.next_seq.at(ix) - 1)
    }

    /// Appends an event (its `seq` is ignored and set by the queue); returns its sequence number.
    /// The event is durable only after a flush reports `durable >= seq` for its tier.
    pub fn append(
        &mut self,
        tier: Tier,
        event: &Event,
        now: SystemTime,
    ) -> Result<u64, AppendError> {
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        // Encoding into a Vec cannot run out of space.
        let _ = event.encode(&mut scratch);
        let result = self.append_valid(tier, &scratch, now);
        self.scratch = scratch;
        result
    }

    /// Appends a protobuf-encoded `Event` (any `seq` field in it is dropped and replaced). The
    /// bytes are decoded once to check they are an `Event` (a record the gateway could not decode
    /// would poison its whole batch), which allocates; [`Queue::append`] does not.
    pub fn append_encoded(
        &mut self,
        tier: Tier,
        event: &[u8],
        now: SystemTime,
    ) -> Result<u64, AppendError> {
        if Event::decode(event).is_err() {
            return Err(AppendError::NotAnEvent);
        }
        self.append_valid(tier, event, now)
    }

    /// Appends bytes known to encode an `Event`.
    fn append_valid(
        &mut self,
        tier: Tier,
        event: &[u8],
        now: SystemTime,
    ) -> Result<u64, AppendError> {
        let ix = tier::index(tier).ok_or(AppendError::NoTier)?;
        let max = self.config.get().max_record_bytes;
        let len = event.len() + record::HEADER_LEN + 11;
        if len > max as usize {
            return Err(AppendError::TooLarge { len, max });
        }
        let len = len as u64;
        if self.store.is_none() {
            if ix != 0 {
                self.unreported.add(ix, LossCause::DiskFull, None, len);
                return Err(AppendError::StoreUnavailable);
            }
            let held = self.pending.entries.len();
            if held >= self.config.get().safety_hold_records || !self.pending_has_room(len) {
                self.unreported.add(0, LossCause::BufferOverflow, None, len);
                return Err(AppendError::HoldFull);
            }
        } else if !self.pending_has_room(len) {
            // The buffer is full: flush inline. The caller's next `flush` reports what this one
            // made durable or dropped, and is due at once.
            let _ = self.flush_inner(now);
            self.pending.flush_owed = true;
            if !self.pending_has_room(len) {
                let cause = if ix == 0 {
                    LossCause::BufferOverflow
                } else {
                    LossCause::DiskFull
                };
                self.unreported.add(ix, cause, None, len);
                return Err(if ix == 0 {
                    AppendError::HoldFull
                } else {
                    AppendError::StoreUnavailable
                });
            }
        }
        let seq = *self.next_seq.at(ix);
        let start = self.pending.bytes.len();
        record::encode(&mut self.pending.bytes, seq, unix_ms(now), event)?;
        let end = self.pending.bytes.len();
        // Room was checked above, so the push cannot fail.
        let _ = self.pending.entries.push(PendingEntry {
            ix,
            seq,
            start,
            end,
        });
        *self.next_seq.at_mut(ix) += 1;
        self.rates
            .record(ix, (end - start) as u64 + record::KEY_LEN);
        let since = if ix == 0 {
            &mut self.pending.safety_since
        } else {
            &mut self.pending.bulk_since
        };
        since.get_or_insert(now);
        Ok(seq)
    }

    fn pending_has_room(&self, len: u64) -> bool {
        !self.pending.entries.is_full()
            && (self.pending.bytes.len() as u64 + len) <= self.config.get().max_pending_bytes
    }

    /// Acknowledges the records `seqs` of `tier` in `epoch` (delivered upstream). They are deleted
    /// at the next flush; until then they are not handed out again. Sequence numbers not durable
    /// are ignored, and so is an acknowledgement from another epoch (a publish read before a
    /// quarantine renumbered the queue): it deletes nothing and returns false.
    pub fn ack(
        &mut self,
        tier: Tier,
        epoch: u64,
        seqs: RangeInclusive<u64>,
        now: SystemTime,
    ) -> bool {
        let Some(ix) = tier::index(tier) else {
            return false;
        };
        if epoch != self.state.epoch {
            return false;
        }
        let first = *seqs.start();
        let last = (*seqs.end()).min(self.state.next_seq.at(ix).saturating_sub(1));
        if first > last {
            return false;
        }
        match self.acks.last_mut() {
            Some((prev_ix, _, prev_last))
                if *prev_ix == ix && prev_last.saturating_add(1) == first =>
            {
                *prev_last = last;
            }
            _ => self.acks.push((ix, first, last)),
        }
        self.pending.bulk_since.get_or_insert(now);
        true
    }

    /// Gives up on record `seq` of `tier` in `epoch` (the broker refused it again and again): it
    /// is not handed out again and is deleted at the next flush, counted and reported as a
    /// `Refused` loss in that transaction. Returns false, doing nothing, for another epoch or a
    /// number not durable.
    pub fn dead_letter(&mut self, tier: Tier, epoch: u64, seq: u64, now: SystemTime) -> bool {
        let Some(ix) = tier::index(tier) else {
            return false;
        };
        if epoch != self.state.epoch || seq == 0 || seq >= *self.state.next_seq.at(ix) {
            return false;
        }
        if !self.dead_letters.contains(&(ix, seq)) {
            self.dead_letters.push((ix, seq));
        }
        self.pending.bulk_since.get_or_insert(now);
        true
    }

    /// Hands `tier`'s records from `from` on out again (the uplink split a batch it had read and
    /// sends it in parts), leaving other tiers' reads where they are. Returns false, doing
    /// nothing, for another epoch.
    pub fn rewind(&mut self, tier: Tier, epoch: u64, from: u64) -> bool {
        let Some(ix) = tier::index(tier) else {
            return false;
        };
        if epoch != self.state.epoch {
            return false;
        }
        let cursor = self.cursor.at_mut(ix);
        *cursor = (*cursor).min(from);
        true
    }

    /// Makes every record handed out and not acknowledged available again (after a lost
    /// connection), from the oldest, in tier order.
    pub fn requeue_unacked(&mut self) {
        self.cursor = PerTier::default();
    }

    /// The next batch in strict tier order: the first tier (safety, SLO, debug) with a durable
    /// record not yet handed out. `None` when there is nothing to send.
    pub fn next_batch(&mut self, limits: BatchLimits) -> Result<Option<ReadBatch<'_>>, ReadError> {
        self.next_batch_skipping(limits, PerTier::default())
    }

    /// Like [`Queue::next_batch`], but never hands out a tier marked in `skip` (e.g. one the
    /// broker refused, parked for a while); the next tier in order goes instead.
    pub fn next_batch_skipping(
        &mut self,
        limits: BatchLimits,
        skip: PerTier<bool>,
    ) -> Result<Option<ReadBatch<'_>>, ReadError> {
        self.batch_index.clear();
        self.batch_bytes.clear();
        let Some(StoreSlot(store)) = &self.store else {
            return Ok(None);
        };
        for (ix, tier) in TIERS.into_iter().enumerate() {
            let end = *self.state.next_seq.at(ix);
            let from = *self.cursor.at(ix);
            if from >= end || *skip.at(ix) {
                continue;
            }
            let acks = &self.acks;
            let dead_letters = &self.dead_letters;
            let corrupt = &mut self.corrupt;
            let index = &mut self.batch_index;
            let bytes = &mut self.batch_bytes;
            let mut consumed_to = None;
            let mut stopped = false;
            let result = store.read(ix, from, end, |seq, value| {
                if acks
                    .iter()
                    .any(|&(a_ix, first, last)| a_ix == ix && (first..=last).contains(&seq))
                    || dead_letters.contains(&(ix, seq))
                {
                    consumed_to = Some(seq);
                    return true;
                }
                match record::check(value, seq) {
                    Err(error) => {
                        tracing::warn!(%error, tier = tier::NAMES[ix], seq,
                            "Record failed its checksum; skipped.");
                        corrupt.push((ix, seq));
                        consumed_to = Some(seq);
                        true
                    }
                    Ok(view) => {
                        if !index.is_empty()
                            && (index.len() >= limits.max_records
                                || bytes.len() + view.event.len() > limits.max_bytes)
                        {
                            stopped = true;
                            return false;
                        }
                        let start = bytes.len();
                        bytes.extend_from_slice(view.event);
                        index.push((seq, start, bytes.len()));
                        consumed_to = Some(seq);
                        true
                    }
                }
            });
            if let Err(error) = result {
                let reason = error.to_string();
                self.store_problem = Some(error);
                self.batch_index.clear();
                self.batch_bytes.clear();
                return Err(ReadError { reason });
            }
            *self.cursor.at_mut(ix) = match (stopped, consumed_to) {
                (true, Some(seq)) => seq + 1,
                (true, None) => from,
                (false, _) => end,
            };
            if !self.corrupt.is_empty() {
                self.pending.bulk_since.get_or_insert(UNIX_EPOCH);
            }
            if !self.batch_index.is_empty() {
                return Ok(Some(ReadBatch {
                    tier,
                    epoch: self.state.epoch,
                    index: &self.batch_index,
                    bytes: &self.batch_bytes,
                }));
            }
        }
        Ok(None)
    }

    /// When the next flush is due: the oldest waiting safety append plus the safety interval, or
    /// the oldest other waiting work plus the bulk interval; at once (`UNIX_EPOCH`) when an
    /// append flushed by itself and its outcome is owed. `None` when nothing waits.
    pub fn next_flush_at(&self) -> Option<SystemTime> {
        if self.pending.flush_owed {
            return Some(UNIX_EPOCH);
        }
        let config = self.config.get();
        let safety = self
            .pending
            .safety_since
            .map(|since| since + config.safety_flush_interval);
        let bulk = self
            .pending
            .bulk_since
            .map(|since| since + config.bulk_flush_interval);
        match (safety, bulk) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// True if a flush is due at `now` (see [`Queue::next_flush_at`]).
    pub fn flush_due(&self, now: SystemTime) -> bool {
        self.next_flush_at().is_some_and(|at| at <= now)
    }

    /// Number of appends not yet durable.
    pub fn pending_records(&self) -> usize {
        self.pending.entries.len()
    }

    /// Flushes now unless `records` more appends of `bytes` in all fit in the append buffer. A
    /// caller about to append events and then stage the key-value entry that describes them
    /// calls this first: no flush that an `append` runs by itself (a full buffer) then separates
    /// the events from the entry, so they become durable in one transaction. Returns whether
    /// the room is there (not while the store is unavailable and the buffer full).
    pub fn make_room(&mut self, records: usize, bytes: u64, now: SystemTime) -> bool {
        let fits = |queue: &Queue| {
            queue.pending.entries.len() + records <= queue.pending.entries.capacity()
                && queue.pending.bytes.len() as u64 + bytes <= queue.config.get().max_pending_bytes
        };
        if fits(self) {
            return true;
        }
        // As an append that finds the buffer full: the caller's next `flush` reports what this
        // one made durable or dropped, and is due at once.
        let _ = self.flush_inner(now);
        self.pending.flush_owed = true;
        fits(self)
    }

    /// Stages `value` under `key` in the key-value area. The next flush writes it in the same
    /// transaction as every append still waiting, so it is never durable before the appends
    /// made ahead of it; until then [`Queue::kv`] already returns it. Staging alone does not make
    /// a flush due. Allocates only for a key not seen before or a longer value.
    pub fn stage_kv(&mut self, key: &str, value: &[u8]) -> Result<(), KvError> {
        if key.is_empty() || key.len() > MAX_KV_KEY_BYTES {
            return Err(KvError::BadKey {
                len: key.len(),
                max: MAX_KV_KEY_BYTES,
            });
        }
        if value.len() > MAX_KV_VALUE_BYTES {
            return Err(KvError::TooLarge {
                len: value.len(),
                max: MAX_KV_VALUE_BYTES,
            });
        }
        let entry = match self.kv.iter().position(|entry| entry.key == key) {
            Some(i) => &mut self.kv[i],
            None => {
                if self.kv.len() >= MAX_KV_KEYS {
                    return Err(KvError::TooManyKeys { max: MAX_KV_KEYS });
                }
                self.kv.push(KvEntry {
                    key: key.to_owned(),
                    value: Vec::with_capacity(value.len()),
                    present: true,
                    staged: true,
                });
                let last = self.kv.len() - 1;
                &mut self.kv[last]
            }
        };
        entry.value.clear();
        entry.value.extend_from_slice(value);
        entry.present = true;
        entry.staged = true;
        self.pending.kv_after_safety |= self.pending.safety_since.is_some();
        Ok(())
    }

    /// Stages the removal of `key` from the key-value area (written like [`Queue::stage_kv`]).
    pub fn remove_kv(&mut self, key: &str) {
        if let Some(entry) = self
            .kv
            .iter_mut()
            .find(|entry| entry.key == key && entry.present)
        {
            entry.value.clear();
            entry.present = false;
            entry.staged = true;
            self.pending.kv_after_safety |= self.pending.safety_since.is_some();
        }
    }

    /// The value under `key`: the one staged last, else the one stored (after an open: what the
    /// last commit before it wrote).
    pub fn kv(&self, key: &str) -> Option<&[u8]> {
        self.kv
            .iter()
            .find(|entry| entry.key == key && entry.present)
            .map(|entry| entry.value.as_slice())
    }

    /// Every key of the key-value area (staged or stored), in no particular order.
    pub fn kv_keys(&self) -> impl Iterator<Item = &str> {
        self.kv
            .iter()
            .filter(|entry| entry.present)
            .map(|entry| entry.key.as_str())
    }

    /// Writes every pending append, deletes acknowledged and corrupt records, expires and evicts
    /// as the budgets require, writes the loss reports, all in one durable transaction.
    ///
    /// The outcome (or error) also returns every range dropped since the previous `flush`
    /// returned, including by a flush an `append` ran by itself.
    pub fn flush(&mut self, now: SystemTime) -> Result<FlushOutcome, FlushError> {
        self.pending.flush_owed = false;
        let result = self.flush_inner(now);
        let refused = std::mem::take(&mut self.refused);
        match result {
            Ok(outcome) => Ok(FlushOutcome {
                refused,
                epoch: self.state.epoch,
                ..outcome
            }),
            Err(error) => Err(FlushError { refused, ..error }),
        }
    }

    /// Flushes what is due at `now`, as the agent's flusher does at [`Queue::next_flush_at`]:
    /// [`Queue::flush`], unless only safety appends are due and the SLO and debug appends
    /// waiting beside them exceed [`SAFETY_CARRY_BYTES`]; then a safety commit writes the safety
    /// appends alone (the outcome's durable numbers of the other tiers do not move) and the rest
    /// waits for its own interval. A safety append followed by a key-value entry staged while it
    /// waited goes only with a full flush, so the entry is never durable before the appends made
    /// ahead of it nor its append without it.
    pub fn flush_scheduled(&mut self, now: SystemTime) -> Result<FlushOutcome, FlushError> {
        if !self.safety_goes_alone(now) {
            return self.flush(now);
        }
        match self.commit_safety() {
            Ok(outcome) => Ok(outcome),
            // The full flush meets the store's failure as any flush does (holding, refusing,
            // quarantining).
            Err(_) => self.flush(now),
        }
    }

    /// True if only safety appends are due at `now` and the other waiting appends are too many to
    /// carry with them; false whenever a full flush has anything else to do first.
    fn safety_goes_alone(&self, now: SystemTime) -> bool {
        let pending = &self.pending;
        if pending.safety_since.is_none()
            || pending.kv_after_safety
            || pending.flush_owed
            || self.store.is_none()
            || self.store_problem.is_some()
            || !self.unreported.is_empty()
            || self.refused != PerTier::default()
        {
            return false;
        }
        // A bulk deadline in the past is due; an oldest time ahead of `now` means the wall clock
        // stepped back, and waiting for it could take as long as the step.
        let bulk_due = pending.bulk_since.is_some_and(|since| {
            since > now || since + self.config.get().bulk_flush_interval <= now
        });
        if bulk_due {
            return false;
        }
        let (mut safety_bytes, mut bulk_bytes) = (0u64, 0u64);
        for entry in pending.entries.iter() {
            let bytes = record::KEY_LEN + (entry.end - entry.start) as u64;
            if entry.ix == 0 {
                safety_bytes += bytes;
            } else {
                bulk_bytes += bytes;
            }
        }
        // Over its cap the safety tier evicts, which the full commit does and reports.
        bulk_bytes > SAFETY_CARRY_BYTES
            && self.state.bytes.safety + safety_bytes <= self.config.cap(0)
    }

    /// Writes the waiting safety appends alone in one durable transaction; the other appends,
    /// acknowledgements and staged key-value entries keep waiting.
    fn commit_safety(&mut self) -> Result<FlushOutcome, StoreError> {
        let Some(StoreSlot(store)) = &self.store else {
            return Err(StoreError::Io("store is not open".into()));
        };
        let mut state = self.state;
        state.next_seq.safety = self.next_seq.safety;
        let pending = &self.pending;
        let mut written = 0u64;
        let oldest = store.write(|tx| {
            let mut table = tx.tier(0)?;
            for entry in pending.entries.iter().filter(|entry| entry.ix == 0) {
                let replaced = table.insert(entry.seq, &pending.bytes[entry.start..entry.end])?;
                if let Some(old) = replaced {
                    // A held record whose earlier commit did land after all.
                    state.forget(0, old);
                }
                state.bytes.safety += record::KEY_LEN + (entry.end - entry.start) as u64;
                state.records.safety += 1;
                written += 1;
            }
            let oldest = table.peek_oldest()?.map(|(_, ms)| ms);
            drop(table);
            tx.put_state(&state)?;
            Ok(oldest)
        })?;
        self.state = state;
        self.oldest_ms.safety = oldest;
        self.retain_bulk_pending();
        let durable = self.state.next_seq;
        Ok(FlushOutcome {
            epoch: self.state.epoch,
            durable: PerTier {
                safety: durable.safety - 1,
                slo: durable.slo - 1,
                debug: durable.debug - 1,
            },
            written: PerTier {
                safety: written,
                ..PerTier::default()
            },
            lost: PerTier::default(),
            committed: true,
            refused: PerTier::default(),
        })
    }

    /// Drops the safety appends from the append buffer (after a safety commit wrote them),
    /// moving the others to its front in order. Allocates nothing.
    fn retain_bulk_pending(&mut self) {
        let pending = &mut self.pending;
        let mut kept = 0;
        let mut write_at = 0;
        for i in 0..pending.entries.len() {
            let entry = pending.entries[i];
            if entry.ix == 0 {
                continue;
            }
            let len = entry.end - entry.start;
            pending.bytes.copy_within(entry.start..entry.end, write_at);
            pending.entries[kept] = PendingEntry {
                start: write_at,
                end: write_at + len,
                ..entry
            };
            write_at += len;
            kept += 1;
        }
        pending.entries.truncate(kept);
        pending.bytes.truncate(write_at);
        pending.safety_since = None;
    }

    fn flush_inner(&mut self, now: SystemTime) -> Result<FlushOutcome, FlushError> {
        self.rates.update(now);
        if self.store.is_none() {
            self.reopen(now)?;
        }
        if let Some(StoreError::Corrupt(reason)) = &self.store_problem {
            let reason = reason.clone();
            self.quarantine_now(&reason, now)?;
        }
        let outcome = match self.commit(now) {
            Ok(outcome) => outcome,
            Err(StoreError::Corrupt(reason)) => {
                self.quarantine_now(&reason, now)?;
                self.commit(now)
                    .map_err(|error| self.store_failed(error, now))?
            }
            Err(error) => return Err(self.store_failed(error, now)),
        };
        self.store_problem = None;
        if self.last_status_write.is_none_or(|at| {
            now.duration_since(at)
                .map_or(true, |since| since >= self.config.get().status_interval)
        }) {
            self.write_status(now);
        }
        Ok(outcome)
    }

    fn commit(&mut self, now: SystemTime) -> Result<FlushOutcome, StoreError> {
        let now_ms = unix_ms(now);
        let config = self.config.get();
        let expiry_due = (0..3).any(|ix| {
            matches!((config.max_age.at(ix), self.oldest_ms.at(ix)),
                (Some(age), Some(oldest)) if oldest.saturating_add(age.as_millis() as u64) < now_ms)
        });
        let window = self.window();
        let mut alarm = self.alarm;
        let raise = config
            .offline_window_threshold
            .is_some_and(|threshold| alarm.observe(window, threshold));
        let nothing_to_do = self.pending.entries.is_empty()
            && self.acks.is_empty()
            && self.corrupt.is_empty()
            && self.dead_letters.is_empty()
            && self.unreported.is_empty()
            && !self.kv.iter().any(|entry| entry.staged)
            && !expiry_due
            && !raise;
        let durable = self.state.next_seq;
        if nothing_to_do {
            self.alarm = alarm;
            return Ok(FlushOutcome {
                epoch: self.state.epoch,
                durable: PerTier {
                    safety: durable.safety - 1,
                    slo: durable.slo - 1,
                    debug: durable.debug - 1,
                },
                written: PerTier::default(),
                lost: PerTier::default(),
                committed: false,
                refused: PerTier::default(),
            });
        }
        let Some(StoreSlot(store)) = &self.store else {
            return Err(StoreError::Io("store is not open".into()));
        };
        let mut state = self.state;
        state.next_seq = self.next_seq;
        let mut ledger = self.unreported;
        let mut written = PerTier::<u64>::default();
        let mut lost = PerTier::<u64>::default();
        let mut oldest = PerTier::<Option<u64>>::default();
        let caps = PerTier {
            safety: self.config.cap(0),
            slo: self.config.cap(1),
            debug: self.config.cap(2),
        };
        let budget = config.budget_bytes;
        let pending = &self.pending;
        let acks = &self.acks;
        let corrupt = &self.corrupt;
        let kv = &self.kv;
        let dead_letters = &self.dead_letters;
        let scratch = &mut self.scratch;
        let value = &mut self.value;
        let rates = self.rates.rates();
        let threshold = config.offline_window_threshold;
        store.write(|tx| {
            for ix in 0..3 {
                let mut table = tx.tier(ix)?;
                for entry in pending.entries.iter().filter(|entry| entry.ix == ix) {
                    let replaced =
                        table.insert(entry.seq, &pending.bytes[entry.start..entry.end])?;
                    let bytes = record::KEY_LEN + (entry.end - entry.start) as u64;
                    if let Some(old) = replaced {
                        // A held record whose earlier commit did land after all.
                        state.forget(ix, old);
                    }
                    *state.bytes.at_mut(ix) += bytes;
                    *state.records.at_mut(ix) += 1;
                    *written.at_mut(ix) += 1;
                }
                for &(_, first, last) in acks.iter().filter(|ack| ack.0 == ix) {
                    table.remove_range(first, last, |removed| {
                        state.forget(ix, removed.bytes);
                    })?;
                }
                for &(_, seq) in corrupt.iter().filter(|c| c.0 == ix) {
                    table.remove_range(seq, seq, |removed| {
                        state.forget(ix, removed.bytes);
                        ledger.add_removed(ix, LossCause::Corrupt, &removed);
                    })?;
                }
                for &(_, seq) in dead_letters.iter().filter(|d| d.0 == ix) {
                    table.remove_range(seq, seq, |removed| {
                        state.forget(ix, removed.bytes);
                        ledger.add_removed(ix, LossCause::Refused, &removed);
                    })?;
                }
                if let Some(age) = config.max_age.at(ix) {
                    let cutoff = now_ms.saturating_sub(age.as_millis() as u64);
                    while let Some((_, appended)) = table.peek_oldest()? {
                        if appended >= cutoff {
                            break;
                        }
                        let Some(removed) = table.pop_oldest()? else {
                            break;
                        };
                        state.forget(ix, removed.bytes);
                        *lost.at_mut(ix) += 1;
                        ledger.add_removed(ix, LossCause::Expired, &removed);
                    }
                }
                let cap = *caps.at(ix);
                if *state.bytes.at(ix) > cap {
                    let target = cap.saturating_sub(LOSS_RESERVE_BYTES);
                    while *state.bytes.at(ix) > target {
                        let Some(removed) = table.pop_oldest()? else {
                            break;
                        };
                        state.forget(ix, removed.bytes);
                        *lost.at_mut(ix) += 1;
                        ledger.add_removed(ix, LossCause::Evicted, &removed);
                    }
                }
            }
            if state.bytes.sum() > budget {
                let target = budget.saturating_sub(LOSS_RESERVE_BYTES);
                // Lowest tier first; safety is never evicted to make room for another tier.
                for ix in [2, 1] {
                    let mut table = tx.tier(ix)?;
                    while state.bytes.sum() > target {
                        let Some(removed) = table.pop_oldest()? else {
                            break;
                        };
                        state.forget(ix, removed.bytes);
                        *lost.at_mut(ix) += 1;
                        ledger.add_removed(ix, LossCause::Evicted, &removed);
                    }
                }
            }
            // The reports themselves take room: evict until they fit too, so caps and budget hold
            // after the commit. Each pass can add at most one more report per tier.
            for _ in 0..4 {
                let need = ledger.report_bytes(raise);
                let mut evicted = false;
                for ix in [0, 1] {
                    let mut table = tx.tier(ix)?;
                    while *state.bytes.at(ix) + *need.at(ix) > *caps.at(ix) {
                        let Some(removed) = table.pop_oldest()? else {
                            break;
                        };
                        state.forget(ix, removed.bytes);
                        *lost.at_mut(ix) += 1;
                        ledger.add_removed(ix, LossCause::Evicted, &removed);
                        evicted = true;
                    }
                }
                for ix in [2, 1] {
                    let mut table = tx.tier(ix)?;
                    while state.bytes.sum() + need.sum() > budget {
                        let Some(removed) = table.pop_oldest()? else {
                            break;
                        };
                        state.forget(ix, removed.bytes);
                        *lost.at_mut(ix) += 1;
                        ledger.add_removed(ix, LossCause::Evicted, &removed);
                        evicted = true;
                    }
                }
                if !evicted {
                    break;
                }
            }
            write_loss_reports(tx, &mut state, &ledger, now, scratch, value, &mut written)?;
            if raise {
                let window = window::offline_window(rates, state.bytes, caps, budget);
                let event = Event {
                    seq: 0,
                    event_time_unix_ns: unix_ns(now),
                    monotonic_ns: 0,
                    kind: Some(Kind::OfflineWindowLow(OfflineWindowLow {
                        window_seconds: window.map_or(f64::INFINITY, |w| w.as_secs_f64()),
                        threshold_seconds: threshold.map_or(0.0, |t| t.as_secs_f64()),
                        append_bytes_per_second: rates.safety + rates.slo + rates.debug,
                        free_bytes: budget.saturating_sub(state.bytes.sum()),
                    })),
                };
                insert_event(tx, &mut state, 0, &event, now, scratch, value)?;
                written.safety += 1;
            }
            for entry in kv.iter().filter(|entry| entry.staged) {
                tx.put_kv(&entry.key, entry.present.then_some(entry.value.as_slice()))?;
            }
            tx.put_state(&state)?;
            for ix in 0..3 {
                *oldest.at_mut(ix) = tx.tier(ix)?.peek_oldest()?.map(|(_, ms)| ms);
            }
            Ok(())
        })?;
        self.state = state;
        self.next_seq = state.next_seq;
        self.alarm = alarm;
        self.oldest_ms = oldest;
        self.unreported = LossLedger::default();
        self.pending.bytes.clear();
        self.pending.entries.clear();
        self.pending.safety_since = None;
        self.pending.bulk_since = None;
        self.pending.kv_after_safety = false;
        self.acks.clear();
        self.corrupt.clear();
        for entry in &mut self.kv {
            entry.staged = false;
        }
        self.kv.retain(|entry| entry.present);
        self.dead_letters.clear();
        let durable = self.state.next_seq;
        Ok(FlushOutcome {
            epoch: self.state.epoch,
            durable: PerTier {
                safety: durable.safety - 1,
                slo: durable.slo - 1,
                debug: durable.debug - 1,
            },
            written,
            lost,
            committed: true,
            refused: PerTier::default(),
        })
    }

    /// The store could not be written: drop SLO and debug appends (counted), hold safety ones,
    /// close the store so a later flush reopens (and repairs) it.
    fn store_failed(&mut self, error: StoreError, now: SystemTime) -> FlushError {
        tracing::warn!(%error, "Queue flush failed; holding safety events, refusing others.");
        let mut kept = 0;
        let mut write_at = 0;
        for i in 0..self.pending.entries.len() {
            let entry = self.pending.entries[i];
            if entry.ix == 0 {
                let len = entry.end - entry.start;
                self.pending
                    .bytes
                    .copy_within(entry.start..entry.end, write_at);
                self.pending.entries[kept] = PendingEntry {
                    start: write_at,
                    end: write_at + len,
                    ..entry
                };
                write_at += len;
                kept += 1;
            } else {
                let bytes = record::KEY_LEN + (entry.end - entry.start) as u64;
                self.unreported
                    .add(entry.ix, LossCause::DiskFull, Some(entry.seq), bytes);
                let range = self.refused.at_mut(entry.ix);
                *range = Some(match *range {
                    Some((first, _)) => (first, entry.seq),
                    None => (entry.seq, entry.seq),
                });
            }
        }
        self.pending.entries.truncate(kept);
        self.pending.bytes.truncate(write_at);
        // The refusal reports and any acknowledgements still wait: keep a flush due, which also
        // paces the reopen attempts.
        self.pending.bulk_since = Some(now);
        self.store = None;
        self.last_retry = Some(now);
        let reason = error.to_string();
        self.store_problem = Some(error);
        FlushError {
            reason,
            refused: self.refused,
            held_safety: kept,
        }
    }

    /// Reopens a store closed by a failure, if the retry interval has passed.
    fn reopen(&mut self, now: SystemTime) -> Result<(), FlushError> {
        let interval = self.config.get().store_retry_interval;
        let held = self.pending.entries.len();
        let not_yet = |reason: String| FlushError {
            reason,
            refused: PerTier::default(),
            held_safety: held,
        };
        if let Some(last) = self.last_retry
            && now.duration_since(last).is_ok_and(|since| since < interval)
        {
            let reason = self
                .store_problem
                .as_ref()
                .map_or_else(|| "store unavailable".to_owned(), ToString::to_string);
            return Err(not_yet(reason));
        }
        self.last_retry = Some(now);
        let cache = self.config.get().cache_bytes;
        let path = self.path.clone();
        let attempt = contain_panic(AssertUnwindSafe(|| {
            let store = Store::open(&path, cache)?;
            let state = store.load()?;
            Ok((store, state))
        }));
        match attempt {
            Ok((store, Some(loaded))) => {
                let state = loaded.state;
                self.store = Some(StoreSlot(store));
                self.state = state;
                self.corrupt = loaded.corrupt;
                for ix in 0..3 {
                    let missing = *loaded.unaccounted.at(ix);
                    if missing > 0 {
                        self.unreported.add_count(ix, LossCause::Corrupt, missing);
                    }
                }
                for ix in 0..3 {
                    let next = self.next_seq.at_mut(ix);
                    *next = (*next).max(*state.next_seq.at(ix));
                }
                self.cursor = PerTier::default();
                self.store_problem = None;
                self.oldest_ms = loaded.oldest_unix_ms;
                Ok(())
            }
            Ok((_, None)) => self.quarantine_now("the store lost its state", now),
            Err(StoreError::Corrupt(reason)) => self.quarantine_now(&reason, now),
            Err(error) => {
                let reason = error.to_string();
                self.store_problem = Some(error);
                Err(not_yet(reason))
            }
        }
    }

    /// Moves the current store aside and continues with a fresh one (new epoch). Pending
    /// appends are kept and get new sequence numbers in the new epoch.
    fn quarantine_now(&mut self, reason: &str, now: SystemTime) -> Result<(), FlushError> {
        self.store = None;
        let held = self.pending.entries.len();
        let (store, loaded, moved) = quarantine(&self.config, &self.path, reason, true, now)
            .map_err(|error| FlushError {
                reason: error.to_string(),
                refused: PerTier::default(),
                held_safety: held,
            })?;
        tracing::warn!(%reason, moved_to = %moved.display(),
            "Queue store failed; moved aside and started a fresh queue.");
        let state = loaded.state;
        self.store = Some(StoreSlot(store));
        self.state = state;
        self.store_problem = None;
        self.corrupt.clear();
        self.acks.clear();
        self.dead_letters.clear();
        self.cursor = PerTier::default();
        // The area in memory is the newest: all of it goes into the fresh store at the next
        // commit (over what the salvage copied).
        for entry in &mut self.kv {
            entry.staged = true;
        }
        // Renumber the pending appends in the new epoch.
        self.next_seq = state.next_seq;
        let mut bytes = Vec::with_capacity(self.pending.bytes.capacity());
        for i in 0..self.pending.entries.len() {
            let entry = self.pending.entries[i];
            let seq = *self.next_seq.at(entry.ix);
            *self.next_seq.at_mut(entry.ix) += 1;
            let old = &self.pending.bytes[entry.start..entry.end];
            let appended = record::appended_unix_ms(old).unwrap_or(0);
            let start = bytes.len();
            // The stored encoding is valid: re-encoding it under the new number cannot fail.
            let _ = record::encode(&mut bytes, seq, appended, &old[record::HEADER_LEN..]);
            self.pending.entries[i] = PendingEntry {
                seq,
                start,
                end: bytes.len(),
                ..entry
            };
        }
        self.pending.bytes = bytes;
        self.oldest_ms = loaded.oldest_unix_ms;
        Ok(())
    }

    /// Rewrites the database file without free space when the backlog has drained (live record
    /// bytes under a quarter of a file of at least 4 MiB). Returns true if it compacted.
    pub fn compact_if_drained(&mut self) -> Result<bool, FlushError> {
        let file_bytes = std::fs::metadata(&self.path).map_or(0, |m| m.len());
        if file_bytes < COMPACT_MIN_FILE_BYTES
            || self.state.bytes.sum().saturating_mul(COMPACT_LIVE_FRACTION) >= file_bytes
        {
            return Ok(false);
        }
        let Some(StoreSlot(store)) = &mut self.store else {
            return Ok(false);
        };
        store.compact().map_err(|error| FlushError {
            reason: error.to_string(),
            refused: PerTier::default(),
            held_safety: 0,
        })
    }

    /// Size of the database file in bytes.
    pub fn file_bytes(&self) -> u64 {
        std::fs::metadata(&self.path).map_or(0, |m| m.len())
    }

    /// Offline window at current rates (see [`crate::window`]); `None` when unbounded.
    pub fn offline_window(&self) -> Option<Duration> {
        self.window()
    }

    fn window(&self) -> Option<Duration> {
        let caps = PerTier {
            safety: self.config.cap(0),
            slo: self.config.cap(1),
            debug: self.config.cap(2),
        };
        window::offline_window(
            self.rates.rates(),
            self.state.bytes,
            caps,
            self.config.get().budget_bytes,
        )
    }

    /// The queue's state for the agent's `status` command.
    pub fn status(&self, now: SystemTime) -> QueueStatus {
        let now_ms = unix_ms(now);
        let rates = self.rates.rates();
        let tier = |ix: usize| {
            let losses = &self.state.losses[ix];
            let unreported = &self.unreported.0[ix];
            let lost = |cause: LossCause| losses[cause as usize] + unreported[cause as usize].count;
            TierStatus {
                records: *self.state.records.at(ix),
                bytes: *self.state.bytes.at(ix),
                cap_bytes: self.config.cap(ix),
                oldest_age: self
                    .oldest_ms
                    .at(ix)
                    .map(|ms| Duration::from_millis(now_ms.saturating_sub(ms))),
                durable_seq: self.state.next_seq.at(ix) - 1,
                pending: self
                    .pending
                    .entries
                    .iter()
                    .filter(|entry| entry.ix == ix)
                    .count() as u64,
                evicted: lost(LossCause::Evicted),
                expired: lost(LossCause::Expired),
                corrupt: lost(LossCause::Corrupt),
                disk_full: lost(LossCause::DiskFull),
                buffer_overflow: lost(LossCause::BufferOverflow),
                quarantined: losses[LossCause::Quarantined as usize],
                append_bytes_per_second: *rates.at(ix),
            }
        };
        QueueStatus {
            as_of_unix_ms: now_ms,
            epoch: self.state.epoch,
            tiers: PerTier {
                safety: tier(0),
                slo: tier(1),
                debug: tier(2),
            },
            budget_bytes: self.config.get().budget_bytes,
            file_bytes: self.file_bytes(),
            offline_window: self.window(),
            store_available: self.store.is_some() && self.store_problem.is_none(),
        }
    }

    fn write_status(&mut self, now: SystemTime) {
        let status = self.status(now);
        let mut text = std::mem::take(&mut self.status_text);
        if let Err(error) = status::write_snapshot_to(&self.snapshot_paths, &status, &mut text) {
            tracing::debug!(%error, "Queue status snapshot not written.");
        }
        self.status_text = text;
        self.last_status_write = Some(now);
    }

    /// Rewrites the status snapshot now (the agent calls this on its own timer, so that `status`
    /// stays current while nothing is appended or flushed).
    pub fn refresh_status_snapshot(&mut self, now: SystemTime) {
        self.write_status(now);
    }
}

/// Appends one `QueueLoss` report per (tier, cause) in `ledger`: safety losses to the safety
/// tier, others to the SLO tier, and adds them to the running totals in `state`.
fn write_loss_reports(
    tx: &StoreTx<'_>,
    state: &mut Persisted,
    ledger: &LossLedger,
    now: SystemTime,
    scratch: &mut Vec<u8>,
    value: &mut Vec<u8>,
    written: &mut PerTier<u64>,
) -> Result<(), StoreError> {
    for (ix, row) in ledger.0.iter().enumerate() {
        for (cause, acc) in row.iter().enumerate() {
            if acc.incidents == 0 {
                continue;
            }
            let quarantine = cause == LossCause::Quarantined as usize;
            let total = &mut state.losses[ix][cause];
            *total += if quarantine { acc.incidents } else { acc.count };
            let event = Event {
                seq: 0,
                event_time_unix_ns: unix_ns(now),
                monotonic_ns: 0,
                kind: Some(Kind::QueueLoss(QueueLoss {
                    tier: TIERS[ix] as i32,
                    cause: cause as i32,
                    count: acc.count,
                    first_seq: acc.first_seq,
                    last_seq: acc.last_seq,
                    epoch: state.epoch,
                    bytes: acc.bytes,
                    total: *total,
                })),
            };
            let report_ix = if ix == 0 { 0 } else { 1 };
            insert_event(tx, state, report_ix, &event, now, scratch, value)?;
            *written.at_mut(report_ix) += 1;
        }
    }
    Ok(())
}

/// Stores a queue-generated event in tier `ix` under the next sequence number.
fn insert_event(
    tx: &StoreTx<'_>,
    state: &mut Persisted,
    ix: usize,
    event: &Event,
    now: SystemTime,
    scratch: &mut Vec<u8>,
    value: &mut Vec<u8>,
) -> Result<(), StoreError> {
    scratch.clear();
    let _ = event.encode(scratch);
    value.clear();
    let seq = *state.next_seq.at(ix);
    record::encode(value, seq, unix_ms(now), scratch)
        .map_err(|error| StoreError::Corrupt(format!("queue event encoding: {error}")))?;
    tx.tier(ix)?.insert(seq, value)?;
    *state.next_seq.at_mut(ix) += 1;
    *state.records.at_mut(ix) += 1;
    *state.bytes.at_mut(ix) += record::KEY_LEN + value.len() as u64;
    Ok(())
}

/// Builds a fresh store whose first transaction already holds the `Quarantined` loss report, then
/// moves the broken file aside and the fresh one into place. Each step leaves something a later
/// open completes: the old file (quarantined again) or the fresh file (renamed into place).
///
/// With `salvage`, every record of the broken store that can still be read and passes its checks
/// is copied into the fresh one under its sequence number (in the new epoch, so no number is
/// reused if the damage rolled the state back); records the old state counted but that could not
/// be copied are reported as `Corrupt` losses, and the old loss totals carry over.
fn quarantine(
    config: &QueueConfig,
    path: &Path,
    reason: &str,
    salvage: bool,
    now: SystemTime,
) -> Result<(Store, Loaded, PathBuf), QueueError> {
    let dir = &config.get().dir;
    let fresh = dir.join(FRESH_FILE);
    match std::fs::remove_file(&fresh) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
            return Err(QueueError::Directory {
                path: fresh,
                source: error,
            });
        }
        _ => {}
    }
    let broken_bytes = std::fs::metadata(path).map_or(0, |m| m.len());
    let mut state = Persisted::fresh(new_epoch(now));
    let mut salvaged = PerTier::<u64>::default();
    {
        let store =
            Store::open(&fresh, config.get().cache_bytes).map_err(|e| unavailable(&fresh, &e))?;
        let mut ledger = LossLedger::default();
        ledger.add(0, LossCause::Quarantined, None, broken_bytes);
        let mut kv = Vec::new();
        if salvage && path.exists() {
            // Whatever the salvage cannot read stays in the quarantined file and is counted.
            let cache = config.get().cache_bytes;
            let _ = contain_panic(AssertUnwindSafe(|| {
                salvage_into(
                    path,
                    cache,
                    &store,
                    &mut state,
                    &mut ledger,
                    &mut salvaged,
                    &mut kv,
                )
            }));
        }
        let (mut scratch, mut value, mut written) = (Vec::new(), Vec::new(), PerTier::default());
        store
            .write(|tx| {
                write_loss_reports(
                    tx,
                    &mut state,
                    &ledger,
                    now,
                    &mut scratch,
                    &mut value,
                    &mut written,
                )?;
                for (key, value) in &kv {
                    tx.put_kv(key, Some(value))?;
                }
                tx.put_state(&state)
            })
            .map_err(|e| unavailable(&fresh, &e))?;
    }
    if salvaged.sum() > 0 {
        tracing::warn!(
            safety = salvaged.safety,
            slo = salvaged.slo,
            debug = salvaged.debug,
            "Salvaged intact records from the damaged queue store into the new epoch."
        );
    }
    let folder = dir.join(QUARANTINE_DIR);
    std::fs::create_dir_all(&folder).map_err(|source| QueueError::Directory {
        path: folder.clone(),
        source,
    })?;
    let mut moved = folder.join(format!("queue-{}.redb", unix_ms(now)));
    for n in 1.. {
        if !moved.exists() {
            break;
        }
        moved = folder.join(format!("queue-{}.{n}.redb", unix_ms(now)));
    }
    if path.exists() {
        rename(path, &moved)?;
    }
    rename(&fresh, path)?;
    sync_dir(dir);
    prune_quarantine(&folder);
    let store = Store::open(path, config.get().cache_bytes).map_err(|e| unavailable(path, &e))?;
    let loaded = store
        .load()
        .map_err(|e| unavailable(path, &e))?
        .unwrap_or_else(|| Loaded::fresh(state));
    // The reason is kept beside the file for whoever inspects it.
    let _ = std::fs::write(moved.with_extension("reason"), reason);
    Ok((store, loaded, moved))
}

/// Copies the intact records of the store at `path` into `fresh`, in chunks of a few MiB, and
/// accounts for what it could not copy; hands back its key-value area if it can be read.
fn salvage_into(
    path: &Path,
    cache: u64,
    fresh: &Store,
    state: &mut Persisted,
    ledger: &mut LossLedger,
    salvaged: &mut PerTier<u64>,
    kv: &mut Vec<(String, Vec<u8>)>,
) -> Result<(), StoreError> {
    const CHUNK_BYTES: usize = 4 * 1024 * 1024;
    let broken = Store::open(path, cache)?;
    // The area is copied even when the state is unusable (its entries describe records the
    // salvage keeps or counts); an unreadable area is lost with the file.
    *kv = broken.kv().unwrap_or_default();
    let old = broken.load().ok().flatten().map(|loaded| loaded.state);
    if let Some(old) = &old {
        state.losses = old.losses;
        state.next_seq = old.next_seq;
    }
    for ix in 0..3 {
        let mut from = 0u64;
        let mut seen = 0u64;
        let mut chunk: Vec<(u64, Vec<u8>)> = Vec::new();
        loop {
            chunk.clear();
            let mut chunk_bytes = 0;
            let mut next_from = None;
            let read = broken.read(ix, from, u64::MAX, |seq, value| {
                next_from = Some(seq.saturating_add(1));
                seen += 1;
                match record::check(value, seq) {
                    Ok(_) => {
                        chunk_bytes += value.len();
                        chunk.push((seq, value.to_vec()));
                    }
                    Err(_) => ledger.add(ix, LossCause::Corrupt, Some(seq), 0),
                }
                chunk_bytes < CHUNK_BYTES
            });
            fresh.write(|tx| {
                let mut table = tx.tier(ix)?;
                for (seq, value) in &chunk {
                    table.insert(*seq, value)?;
                    *state.records.at_mut(ix) += 1;
                    *state.bytes.at_mut(ix) += record::KEY_LEN + value.len() as u64;
                    let next = state.next_seq.at_mut(ix);
                    *next = (*next).max(seq + 1);
                    *salvaged.at_mut(ix) += 1;
                }
                Ok(())
            })?;
            match (read, next_from) {
                (Ok(()), Some(next)) if next > from && next != u64::MAX => from = next,
                _ => break,
            }
        }
        if let Some(old) = &old {
            let missing = old.records.at(ix).saturating_sub(seen);
            if missing > 0 {
                ledger.add_count(ix, LossCause::Corrupt, missing);
            }
        }
    }
    Ok(())
}

fn prune_quarantine(folder: &Path) {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return;
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "redb"))
        .collect();
    // Names carry the time in ms, zero-free and growing: sort by (length, name).
    files.sort_by(|a, b| {
        let (a, b) = (a.as_os_str(), b.as_os_str());
        a.len().cmp(&b.len()).then(a.cmp(b))
    });
    let excess = files.len().saturating_sub(QUARANTINE_KEEP);
    for old in &files[..excess] {
        let _ = std::fs::remove_file(old);
        let _ = std::fs::remove_file(old.with_extension("reason"));
    }
}

fn rename(from: &Path, to: &Path) -> Result<(), QueueError> {
    std::fs::rename(from, to).map_err(|source| QueueError::Directory {
        path: from.to_owned(),
        source,
    })
}

fn sync_dir(dir: &Path) {
    if let Ok(handle) = std::fs::File::open(dir) {
        let _ = handle.sync_all();
    }
}

fn unavailable(path: &Path, error: &StoreError) -> QueueError {
    if matches!(error, StoreError::Locked) {
        return QueueError::AlreadyOpen(path.to_owned());
    }
    QueueError::StoreUnavailable {
        path: path.to_owned(),
        reason: error.to_string(),
    }
}

/// A random, non-zero epoch: std's per-process random hash keys mixed with the time.
fn new_epoch(now: SystemTime) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    hasher.write_u32(std::process::id());
    hasher.finish().max(1)
}

pub(crate) fn unix_ms(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn unix_ns(time: SystemTime) -> i64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_loss_report_fits_its_reserved_bytes() {
        let event = Event {
            seq: 0,
            event_time_unix_ns: i64::MAX,
            monotonic_ns: 0,
            kind: Some(Kind::QueueLoss(QueueLoss {
                tier: Tier::Debug as i32,
                cause: LossCause::BufferOverflow as i32,
                count: u64::MAX,
                first_seq: u64::MAX,
                last_seq: u64::MAX,
                epoch: u64::MAX,
                bytes: u64::MAX,
                total: u64::MAX,
            })),
        };
        let mut value = Vec::new();
        record::encode(&mut value, u64::MAX, u64::MAX, &event.encode_to_vec()).unwrap();
        assert!(
            record::KEY_LEN + value.len() as u64 <= MAX_REPORT_BYTES,
            "{}",
            value.len()
        );
        let alarm = Event {
            seq: 0,
            event_time_unix_ns: i64::MAX,
            monotonic_ns: 0,
            kind: Some(Kind::OfflineWindowLow(OfflineWindowLow {
                window_seconds: f64::MAX,
                threshold_seconds: f64::MAX,
                append_bytes_per_second: f64::MAX,
                free_bytes: u64::MAX,
            })),
        };
        value.clear();
        record::encode(&mut value, u64::MAX, u64::MAX, &alarm.encode_to_vec()).unwrap();
        assert!(
            record::KEY_LEN + value.len() as u64 <= MAX_REPORT_BYTES,
            "{}",
            value.len()
        );
    }
}
