//! The queue: appends buffered in memory, one durable commit of the log per flush holding the
//! appends, the deletions of acknowledged records, expiry, eviction, the loss reports and the
//! staged entries of the key-value area; reads in strict tier order; quarantine of a store that
//! will not open; a store that cannot be opened or written (not corruption) retried with
//! backoff while safety appends are held in memory; a store of the old format migrated at open;
//! a compaction API the log never needs (drained segments are unlinked as records go).
//!
//! ```text
//!              open ok                      commit fails (EIO, ENOSPC)
//!   ─► open ─────────► available ◄──────────────────────────────┐ ─────────► unavailable
//!        │ not corruption       ▲ commit ok after a reopen     │           (store closed;
//!        ▼                      └──────────────────────────────┴─────────── reopened at
//!    unavailable, never opened (epoch 0) ── reopen ok: state loaded, held   backoff times)
//!                                           safety renumbered into it
//! ```
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
//! - While the store is unavailable, safety appends are held in memory (at most
//!   `safety_hold_records`; beyond, refused and counted `BufferOverflow`), other appends are
//!   refused and counted `DiskFull`; reopen attempts follow `edgewatch_conventions::backoff`
//!   from `store_retry_min` to `store_retry_max`, each with a new handle (never one that saw an
//!   I/O error). The backoff starts again only after a commit succeeded.
//! - A quarantine reports, per tier, the records of the old store that did not reach the new
//!   one under the old epoch, bounded by the old store's state or else by the last status
//!   snapshot.
//! - A compaction is never due with the log; were one to run, it would never write the live
//!   store: it copies a snapshot elsewhere, and a flush applies what changed since and renames
//!   the copy into place before it commits.
//! - The queue reads no clock and spawns nothing: every time is an argument.

use std::ops::RangeInclusive;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use edgewatch_conventions::backoff::{Backoff, Jitter};
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
    Copied, CopyJob, Frames, LOSS_CAUSES, Loaded, Persisted, Removed, Store, StoreError, StoreTx,
    contain_panic,
};
use crate::window::{self, RateEstimator, WindowAlarm};

/// The store inside the queue directory: the log's directory (see `crate::log`).
pub const DB_FILE: &str = "queue.log";
/// The store of the format before the log (a redb file), migrated into [`DB_FILE`] at open.
pub const LEGACY_FILE: &str = "queue.redb";
/// A fresh store being prepared to replace a quarantined one.
const FRESH_FILE: &str = "queue.log.new";
/// Folder that quarantined stores are moved into.
pub const QUARANTINE_DIR: &str = "quarantine";
/// Quarantined stores kept; older ones are deleted so quarantine cannot fill the disk.
pub const QUARANTINE_KEEP: usize = 2;
/// Upper bound of a stored `QueueLoss` or `OfflineWindowLow` record (key, header and event).
pub const MAX_REPORT_BYTES: u64 = 160;
/// A compaction's copy of the store, until it is renamed over [`DB_FILE`] (a log never makes
/// one; the old format's leftover is removed at open).
const COMPACT_FILE: &str = "queue.log.compact";
const LEGACY_COMPACT_FILE: &str = "queue.redb.compact";
/// The file is compacted only when it is at least this large...
pub const COMPACT_MIN_FILE_BYTES: u64 = 4 * 1024 * 1024;
/// ...and holds less than this fraction (1/n) of live record bytes: the copy is then at most
/// about half the file, so compactions cannot follow one another for nothing.
pub const COMPACT_LIVE_FRACTION: u64 = 4;
/// Least time between two compactions (a bound on their cost whatever the workload).
pub const COMPACT_MIN_INTERVAL: Duration = Duration::from_secs(30);
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
    /// Set when the store could not be opened for a reason other than corruption (only from
    /// [`Queue::open_or_hold`]): the queue runs without it, epoch 0, and retries.
    pub unavailable: Option<String>,
}

/// Why the store cannot be used, while it cannot (see [`Queue::store_fault`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreFault<'a> {
    /// What failed last.
    pub reason: &'a str,
    /// When the store became unavailable.
    pub since: SystemTime,
    /// Failed attempts to open or write it since then.
    pub attempts: u32,
    /// When the next attempt to reopen it is due.
    pub next_attempt: SystemTime,
    /// Safety events held in memory, waiting for it.
    pub held_safety: usize,
    /// The most that are held (`safety_hold_records`).
    pub hold_capacity: usize,
    /// True until the store has been opened once by this process (the queue's state, its
    /// epoch and its numbers are not known yet).
    pub never_opened: bool,
}

/// The store's unavailability as the queue tracks it.
#[derive(Debug)]
struct Fault {
    reason: String,
    since: SystemTime,
    attempts: u32,
    next_attempt: SystemTime,
}

/// A compaction's copy, to run where the caller chooses (another thread: it takes as long as
/// the live records take to copy). See [`Queue::begin_compaction`].
pub struct CompactionJob(CopyJob);

impl CompactionJob {
    /// Copies the store as of now into a new file. Hand the result to
    /// [`Queue::finish_compaction`].
    pub fn run(self) -> CompactionResult {
        CompactionResult(self.0.run())
    }
}

/// What a [`CompactionJob`] produced.
pub struct CompactionResult(Result<Copied, StoreError>);

/// The store a compaction replaced, still open: close it where that cannot delay anything
/// ([`Queue::take_retired_store`]). Its files are already replaced. (The log is never
/// compacted, so there is none.)
pub struct RetiredStore(Store);

impl RetiredStore {
    /// Closes the old store.
    pub fn close(self) {
        drop(self.0);
    }
}

impl std::fmt::Debug for CompactionResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Ok(_) => f.write_str("CompactionResult(copied)"),
            Err(error) => write!(f, "CompactionResult({error})"),
        }
    }
}

/// Where a compaction stands.
#[derive(Default)]
enum Compaction {
    #[default]
    Idle,
    /// A copy runs elsewhere; deletions committed since it began are kept for the swap.
    Running {
        _cancel: CancelOnDrop,
        deleted: Vec<(usize, u64, u64)>,
    },
    /// The copy is done: the next flush applies `deleted` and what was appended since, and
    /// swaps it in.
    Ready {
        copied: Copied,
        deleted: Vec<(usize, u64, u64)>,
    },
    /// Cancelled (the store failed or was quarantined) while its copy ran: its result is
    /// dropped when it comes back.
    Cancelled,
}

impl std::fmt::Debug for Compaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Idle => "Idle",
            Self::Running { .. } => "Running",
            Self::Ready { .. } => "Ready",
            Self::Cancelled => "Cancelled",
        })
    }
}

impl Compaction {
    /// Deletions must be remembered for the swap.
    fn tracks_deletions(&self) -> bool {
        matches!(self, Self::Running { .. } | Self::Ready { .. })
    }

    fn record_deletions(&mut self, more: &mut Vec<(usize, u64, u64)>) {
        if let Self::Running { deleted, .. } | Self::Ready { deleted, .. } = self {
            deleted.append(more);
        }
    }

    /// Stops a running copy (its result will be dropped) and forgets a finished one.
    fn cancel(&mut self) {
        match std::mem::take(self) {
            // Dropping `Running` raises its cancel flag.
            Self::Running { .. } => *self = Self::Cancelled,
            Self::Ready { copied, .. } => drop(Store::from_copy(copied)),
            other => *self = other,
        }
    }
}

/// A running copy's cancel flag, raised when the queue stops waiting for it (the copy then
/// stops at its next chunk).
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
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
    /// True for a safety commit ([`Queue::flush_scheduled`]): it wrote the safety appends only;
    /// the other appends, acknowledgements, dead letters and key-value entries keep waiting.
    pub safety_only: bool,
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

/// Appends waiting for the next flush: per tier, the stored records already in the log's frame
/// form (a commit writes them from here, with no copy in between), in buffers reused from flush
/// to flush and sized at open so they never grow.
#[derive(Debug)]
struct Pending {
    frames: [Frames; 3],
    /// Records waiting, every tier (at most [`PENDING_CAPACITY`]).
    records: usize,
    /// Bytes of their stored values (what `max_pending_bytes` bounds).
    bytes: u64,
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
    /// Sequence number and append time (unix ms) of each tier's oldest stored record.
    oldest: PerTier<Option<(u64, u64)>>,
    /// Why the store last failed, while it is unavailable or marked for repair.
    store_problem: Option<StoreError>,
    /// Set from a failure to open or write the store until a commit succeeds again.
    fault: Option<Fault>,
    /// Waits between reopen attempts (`store_retry_min` to `store_retry_max`, no jitter: one
    /// machine, one disk).
    retry: Backoff,
    /// False until the store has been opened once: state, epoch and numbers are placeholders.
    opened: bool,
    compaction: Compaction,
    last_compaction: Option<SystemTime>,
    /// The store the last compaction replaced, until the caller takes it to close it.
    retired: Option<StoreSlot>,
    last_status_write: Option<SystemTime>,
    scratch: Vec<u8>,
    /// The last append's time and its `unix_ms`: appends of one flush group share a time, and
    /// converting it for each record showed in the profile (`Timespec::sub_timespec`).
    append_time: (SystemTime, u64),
    value: Vec<u8>,
    batch_index: Vec<(u64, usize, usize)>,
    batch_bytes: Vec<u8>,
    status_text: String,
    snapshot_paths: status::SnapshotPaths,
}

/// The store, with a manual Debug (its file handles have none worth printing).
struct StoreSlot(Store);

impl std::fmt::Debug for StoreSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Store")
    }
}

impl Queue {
    /// Opens (or creates) the queue in `config.dir`. A store that will not open, or panics while
    /// opening, is moved to `quarantine/` and replaced by a fresh one with a new epoch, whose
    /// first records report the loss. A store that cannot be opened for another reason (a
    /// failing or full disk) is an error; see [`Queue::open_or_hold`] to run without it.
    pub fn open(
        config: RawQueueConfig,
        now: SystemTime,
    ) -> Result<(Queue, OpenReport), QueueError> {
        let config = config.validate()?;
        let opened = open_store(&config, now)?;
        let mut queue = Queue::shell(config, now);
        let quarantined = opened.quarantined.clone();
        let created = opened.created;
        queue.install(opened, now);
        Ok(queue.opened_report(created, quarantined, now))
    }

    /// Like [`Queue::open`], but a store that cannot be opened for a reason other than
    /// corruption (EIO, a full disk during repair, a directory that cannot be created) does not
    /// stop the caller: the queue starts without it (epoch 0, nothing readable), holds safety
    /// appends in memory, refuses and counts the others, and each flush due retries the store
    /// with backoff ([`Queue::store_fault`]). When it opens, the held appends are numbered in
    /// its epoch and written. Only a bad configuration and another process holding the store
    /// are errors.
    pub fn open_or_hold(
        config: RawQueueConfig,
        now: SystemTime,
    ) -> Result<(Queue, OpenReport), QueueError> {
        let config = config.validate()?;
        match open_store(&config, now) {
            Ok(opened) => {
                let mut queue = Queue::shell(config, now);
                let quarantined = opened.quarantined.clone();
                let created = opened.created;
                queue.install(opened, now);
                Ok(queue.opened_report(created, quarantined, now))
            }
            Err(error @ (QueueError::StoreUnavailable { .. } | QueueError::Directory { .. })) => {
                let reason = error.to_string();
                let mut queue = Queue::shell(config, now);
                queue.begin_fault(reason.clone(), now);
                tracing::error!(%reason, "The queue store cannot be opened; running without it: \
                    safety events are held in memory, others refused, and the store is retried.");
                let report = OpenReport {
                    epoch: 0,
                    created: false,
                    quarantined: None,
                    records: PerTier::default(),
                    losses: PerTier::default(),
                    unavailable: Some(reason),
                };
                Ok((queue, report))
            }
            Err(other) => Err(other),
        }
    }

    /// A queue with no store yet: empty buffers, placeholder state (epoch 0).
    fn shell(config: QueueConfig, now: SystemTime) -> Queue {
        let max_pending = usize::try_from(config.get().max_pending_bytes).unwrap_or(usize::MAX);
        let rate_tau = config.get().rate_time_constant;
        let retry = Backoff::new(config.get().store_retry_min, config.get().store_retry_max);
        let state = Persisted::fresh(0);
        let mut rates = RateEstimator::new(rate_tau);
        rates.update(now);
        Queue {
            path: config.get().dir.join(DB_FILE),
            store: None,
            state,
            next_seq: state.next_seq,
            pending: Pending {
                frames: std::array::from_fn(|_| {
                    Frames::with_capacity(max_pending, PENDING_CAPACITY)
                }),
                records: 0,
                bytes: 0,
                safety_since: None,
                bulk_since: None,
                kv_after_safety: false,
                flush_owed: false,
            },
            acks: Vec::new(),
            dead_letters: Vec::new(),
            corrupt: Vec::new(),
            cursor: PerTier::default(),
            unreported: LossLedger::default(),
            refused: PerTier::default(),
            kv: Vec::new(),
            rates,
            alarm: WindowAlarm::default(),
            oldest: PerTier::default(),
            store_problem: None,
            fault: None,
            retry,
            opened: false,
            compaction: Compaction::Idle,
            last_compaction: None,
            retired: None,
            last_status_write: None,
            scratch: Vec::new(),
            append_time: (UNIX_EPOCH, 0),
            value: Vec::new(),
            batch_index: Vec::new(),
            batch_bytes: Vec::new(),
            status_text: String::with_capacity(2048),
            snapshot_paths: status::SnapshotPaths::at(&config.get().status_file),
            config,
        }
    }

    /// Takes a store just opened: its state, its key-value area (under the entries staged in
    /// memory meanwhile, which are newer), its damage to count; appends held while no store was
    /// open are numbered in its epoch. Counts and reports the damage found at once.
    fn install(&mut self, opened: Opened, now: SystemTime) {
        let Opened {
            store,
            loaded,
            quarantined,
            ..
        } = opened;
        if let Some(q) = &quarantined {
            tracing::warn!(reason = %q.reason, moved_to = %q.moved_to.display(),
                "Queue store would not open; moved aside and started a fresh queue.");
        }
        self.store = Some(StoreSlot(store));
        self.state = loaded.state;
        self.corrupt = loaded.corrupt;
        self.oldest = loaded.oldest;
        for (key, value) in loaded.kv {
            if !self.kv.iter().any(|entry| entry.key == key) {
                self.kv.push(KvEntry {
                    key,
                    value,
                    present: true,
                    staged: false,
                });
            }
        }
        for ix in 0..3 {
            let missing = *loaded.unaccounted.at(ix);
            if missing > 0 {
                tracing::warn!(
                    tier = tier::NAMES[ix],
                    missing,
                    "Queue store lost records to damage; counted as corrupt."
                );
                self.unreported.add_count(ix, LossCause::Corrupt, missing);
            }
        }
        self.renumber_pending(self.state.next_seq);
        self.cursor = PerTier::default();
        self.acks.clear();
        self.dead_letters.clear();
        self.opened = true;
        self.store_problem = None;
        if !self.corrupt.is_empty() || !self.unreported.is_empty() {
            // Count and report the damage now, before anything else can be lost with it. A
            // failure here is handled like any flush failure and retried.
            let _ = self.flush(now);
        }
    }

    fn opened_report(
        mut self,
        created: bool,
        quarantined: Option<Quarantined>,
        now: SystemTime,
    ) -> (Queue, OpenReport) {
        let report = OpenReport {
            epoch: self.state.epoch,
            created,
            quarantined,
            records: self.state.records,
            losses: PerTier {
                safety: self.state.losses[0],
                slo: self.state.losses[1],
                debug: self.state.losses[2],
            },
            unavailable: None,
        };
        self.write_status(now);
        (self, report)
    }

    /// Numbers the waiting appends from `next` on (a store was opened or replaced under them):
    /// the new numbers are what the next commit writes.
    fn renumber_pending(&mut self, next: PerTier<u64>) {
        self.next_seq = next;
        if self.pending.records == 0 {
            return;
        }
        let capacity = usize::try_from(self.config.get().max_pending_bytes).unwrap_or(usize::MAX);
        for ix in 0..3 {
            if self.pending.frames[ix].is_empty() {
                continue;
            }
            let old = std::mem::replace(
                &mut self.pending.frames[ix],
                Frames::with_capacity(capacity, PENDING_CAPACITY),
            );
            for (_, value) in old.iter() {
                let seq = *self.next_seq.at(ix);
                *self.next_seq.at_mut(ix) += 1;
                let appended = record::appended_unix_ms(value).unwrap_or(0);
                // The stored encoding is valid: re-encoding it under the new number cannot fail.
                let _ = self.pending.frames[ix].push(seq, |out, lead| {
                    record::encode_trusted_after(
                        out,
                        lead,
                        seq,
                        appended,
                        &value[record::HEADER_LEN..],
                    )
                });
            }
        }
        self.pending.bytes = self.pending.frames.iter().map(Frames::value_bytes).sum();
    }

    /// The store just failed (to open or to commit): unavailable from now, retried with backoff
    /// from the first wait on.
    fn begin_fault(&mut self, reason: String, now: SystemTime) {
        self.retry.reset();
        let wait = self.retry.next_wait(Jitter::None);
        self.fault = Some(Fault {
            reason,
            since: now,
            attempts: 1,
            next_attempt: now + wait,
        });
    }

    /// Another attempt failed: the next waits longer (up to `store_retry_max`).
    fn attempt_failed(&mut self, reason: String, now: SystemTime) {
        let wait = self.retry.next_wait(Jitter::None);
        match &mut self.fault {
            Some(fault) => {
                fault.reason = reason;
                fault.attempts += 1;
                fault.next_attempt = now + wait;
            }
            None => self.begin_fault(reason, now),
        }
    }

    /// Why the store cannot be used, while it cannot: from a failure to open or to commit until
    /// a commit succeeds again.
    pub fn store_fault(&self) -> Option<StoreFault<'_>> {
        self.fault.as_ref().map(|fault| StoreFault {
            reason: &fault.reason,
            since: fault.since,
            attempts: fault.attempts,
            next_attempt: fault.next_attempt,
            held_safety: self.pending.frames[0].records() as usize,
            hold_capacity: self.config.get().safety_hold_records,
            never_opened: !self.opened,
        })
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
        let result = self.append_valid(tier, &scratch, false, now);
        self.scratch = scratch;
        result
    }

    /// Appends a protobuf-encoded `Event` (any `seq` field in it is dropped and replaced). The
    /// bytes are checked to be an `Event` as prost would decode it (a record the gateway could not
    /// decode would poison its whole batch) in the same pass that splices the sequence number in,
    /// without decoding them into a message and without allocating.
    pub fn append_encoded(
        &mut self,
        tier: Tier,
        event: &[u8],
        now: SystemTime,
    ) -> Result<u64, AppendError> {
        match self.append_valid(tier, event, true, now) {
            Err(AppendError::Malformed(_)) => Err(AppendError::NotAnEvent),
            result => result,
        }
    }

    /// Appends an encoded `Event`: untrusted bytes when `check` (checked against the schema),
    /// else bytes prost just encoded from a typed `Event` (only their top level is walked).
    fn append_valid(
        &mut self,
        tier: Tier,
        event: &[u8],
        check: bool,
        now: SystemTime,
    ) -> Result<u64, AppendError> {
        let ix = tier::index(tier).ok_or(AppendError::NoTier)?;
        let max = self.config.get().max_record_bytes;
        let len = event.len() + record::HEADER_LEN + 11;
        if len > max as usize {
            return Err(AppendError::TooLarge { len, max });
        }
        let len = len as u64;
        if self.store.is_none() || !self.pending_has_room(len) {
            self.append_without_room(ix, event, check, len, now)?;
        }
        let seq = *self.next_seq.at(ix);
        let ms = if now == self.append_time.0 {
            self.append_time.1
        } else {
            self.append_time = (now, unix_ms(now));
            self.append_time.1
        };
        // Room was checked above: the buffer does not grow. The check and splice inlined here:
        // this is the queue's one hot path.
        let stored = self.pending.frames[ix].push(
            seq,
            #[inline(always)]
            |out, lead| {
                if check {
                    record::encode_after(out, lead, seq, ms, event)
                } else {
                    record::encode_trusted_after(out, lead, seq, ms, event)
                }
            },
        )? as u64;
        self.pending.records += 1;
        self.pending.bytes += stored;
        *self.next_seq.at_mut(ix) += 1;
        self.rates.record(ix, stored + record::KEY_LEN);
        let since = if ix == 0 {
            &mut self.pending.safety_since
        } else {
            &mut self.pending.bulk_since
        };
        since.get_or_insert(now);
        Ok(seq)
    }

    /// An append of `len` bytes to tier `ix` for which the store is unavailable or the buffer
    /// has no room: refuses it (counted as lost, unless its bytes are not an event), holds a
    /// safety append in memory, or flushes inline to make room. Kept apart from the usual path
    /// of [`Queue::append_valid`], which it leaves as short as it can be.
    #[cold]
    #[inline(never)]
    fn append_without_room(
        &mut self,
        ix: usize,
        event: &[u8],
        check: bool,
        len: u64,
        now: SystemTime,
    ) -> Result<(), AppendError> {
        if check {
            // Bytes that are not an event are refused before anything is counted as lost for
            // them; on the usual path `record::encode` checks them as it stores them.
            record::validate(event)?;
        }
        if self.store.is_none() {
            if ix != 0 {
                self.unreported.add(ix, LossCause::DiskFull, None, len);
                return Err(AppendError::StoreUnavailable);
            }
            let held = self.pending.records;
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
        Ok(())
    }

    fn pending_has_room(&self, len: u64) -> bool {
        self.pending.records < PENDING_CAPACITY
            && (self.pending.bytes + len) <= self.config.get().max_pending_bytes
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
    /// append flushed by itself and its outcome is owed; while the store is unavailable, the
    /// next attempt to reopen it. `None` when nothing waits.
    pub fn next_flush_at(&self) -> Option<SystemTime> {
        if self.pending.flush_owed {
            return Some(UNIX_EPOCH);
        }
        if self.store.is_none() {
            // Unavailable: the next flush is the next attempt to reopen the store.
            return self.fault.as_ref().map(|fault| fault.next_attempt);
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
        self.pending.records
    }

    /// Flushes now unless `records` more appends of `bytes` in all fit in the append buffer. A
    /// caller about to append events and then stage the key-value entry that describes them
    /// calls this first: no flush that an `append` runs by itself (a full buffer) then separates
    /// the events from the entry, so they become durable in one transaction. Returns whether
    /// the room is there (not while the store is unavailable and the buffer full).
    pub fn make_room(&mut self, records: usize, bytes: u64, now: SystemTime) -> bool {
        let fits = |queue: &Queue| {
            queue.pending.records + records <= PENDING_CAPACITY
                && queue.pending.bytes + bytes <= queue.config.get().max_pending_bytes
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
            // Damage: the full flush meets it as any flush does (quarantining).
            Err(StoreError::Corrupt(_)) => self.flush(now),
            // An I/O error or a full disk: the store is closed as after any failed commit (held,
            // refused, reopened with backoff), never written again through the handle that met
            // it, as a full flush on the same store would.
            Err(error) => {
                let error = self.store_failed(error, now);
                let refused = std::mem::take(&mut self.refused);
                Err(FlushError { refused, ..error })
            }
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
            // A store back from a fault is confirmed by a full commit (held events, reports).
            || self.fault.is_some()
            // A compaction's copy is swapped in by a full flush.
            || matches!(self.compaction, Compaction::Ready { .. })
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
        let stored = |frames: &Frames| frames.value_bytes() + record::KEY_LEN * frames.records();
        let safety_bytes = stored(&pending.frames[0]);
        let bulk_bytes = stored(&pending.frames[1]) + stored(&pending.frames[2]);
        // Waiting beside the safety appends and no SLO or debug append: acknowledgements, dead
        // letters, a key-value entry staged before them. They change the state, so carrying them
        // would add a state slot's write and `fdatasync` to every safety event's commit (an event
        // acknowledged before the next is appended, at any steady rate); they keep their own
        // deadline instead, and one state write carries them all.
        let only_state_waits = bulk_bytes == 0 && pending.bulk_since.is_some();
        // Over its cap the safety tier evicts, which the full commit does and reports.
        (bulk_bytes > SAFETY_CARRY_BYTES || only_state_waits)
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
        let safety = &mut self.pending.frames[0];
        let written = safety.records();
        let stored = safety.value_bytes() + record::KEY_LEN * written;
        let oldest = store.write_with([Some(safety), None, None], |tx| {
            let table = tx.tier(0)?;
            // Held records whose earlier commit did land after all.
            let (records, bytes) = table.replaced();
            state.forget_many(0, records, bytes);
            state.bytes.safety += stored;
            state.records.safety += written;
            let oldest = table.peek_oldest()?;
            tx.put_state(&state)?;
            Ok(oldest)
        })?;
        self.state = state;
        self.oldest.safety = oldest;
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
            safety_only: true,
            refused: PerTier::default(),
        })
    }

    /// Drops the safety appends from the append buffer (after a safety commit wrote them).
    fn retain_bulk_pending(&mut self) {
        let pending = &mut self.pending;
        pending.records -= pending.frames[0].records() as usize;
        pending.bytes -= pending.frames[0].value_bytes();
        pending.frames[0].clear();
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
        if matches!(self.compaction, Compaction::Ready { .. }) {
            self.swap_compacted(now);
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
        if let Some(fault) = self.fault.take() {
            self.retry.reset();
            tracing::info!(
                reason = %fault.reason,
                attempts = fault.attempts,
                unavailable_ms = now.duration_since(fault.since).map_or(0, |d| d.as_millis() as u64),
                safety_written = outcome.written.safety,
                "The queue store is back; the safety events held in memory are written."
            );
        }
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
            matches!((config.max_age.at(ix), self.oldest.at(ix)),
                (Some(age), Some((_, oldest))) if oldest.saturating_add(age.as_millis() as u64) < now_ms)
        });
        let window = self.window();
        let mut alarm = self.alarm;
        let raise = config
            .offline_window_threshold
            .is_some_and(|threshold| alarm.observe(window, threshold));
        let nothing_to_do = self.pending.records == 0
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
                safety_only: false,
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
        let mut oldest = PerTier::<Option<(u64, u64)>>::default();
        // While a compaction copies the store, what this commit deletes is kept for its swap.
        let track = self.compaction.tracks_deletions();
        let mut deleted_now: Vec<(usize, u64, u64)> = Vec::new();
        let caps = PerTier {
            safety: self.config.cap(0),
            slo: self.config.cap(1),
            debug: self.config.cap(2),
        };
        let budget = config.budget_bytes;
        let appended = self.pending.frames.each_ref().map(|frames| {
            let records = frames.records();
            (records, frames.value_bytes() + record::KEY_LEN * records)
        });
        let [safety, slo, debug] = &mut self.pending.frames;
        let acks = &self.acks;
        let corrupt = &self.corrupt;
        let kv = &self.kv;
        let dead_letters = &self.dead_letters;
        let scratch = &mut self.scratch;
        let value = &mut self.value;
        let rates = self.rates.rates();
        let threshold = config.offline_window_threshold;
        let appends = [Some(safety), Some(slo), Some(debug)];
        store.write_with(appends, |tx| {
            for ix in 0..3 {
                let mut table = tx.tier(ix)?;
                // Held records whose earlier commit did land after all.
                let (records, bytes) = table.replaced();
                state.forget_many(ix, records, bytes);
                let (records, bytes) = appended[ix];
                *state.bytes.at_mut(ix) += bytes;
                *state.records.at_mut(ix) += records;
                *written.at_mut(ix) += records;
                for &(_, first, last) in acks.iter().filter(|ack| ack.0 == ix) {
                    let (records, bytes) = table.remove_acknowledged(first, last)?;
                    state.forget_many(ix, records, bytes);
                    if track {
                        deleted_now.push((ix, first, last));
                    }
                }
                for &(_, seq) in corrupt.iter().filter(|c| c.0 == ix) {
                    table.remove_range(seq, seq, |removed| {
                        state.forget(ix, removed.bytes);
                        ledger.add_removed(ix, LossCause::Corrupt, &removed);
                    })?;
                    if track {
                        deleted_now.push((ix, seq, seq));
                    }
                }
                for &(_, seq) in dead_letters.iter().filter(|d| d.0 == ix) {
                    table.remove_range(seq, seq, |removed| {
                        state.forget(ix, removed.bytes);
                        ledger.add_removed(ix, LossCause::Refused, &removed);
                    })?;
                    if track {
                        deleted_now.push((ix, seq, seq));
                    }
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
                        if track {
                            deleted_now.push((ix, removed.seq, removed.seq));
                        }
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
                        if track {
                            deleted_now.push((ix, removed.seq, removed.seq));
                        }
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
                        if track {
                            deleted_now.push((ix, removed.seq, removed.seq));
                        }
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
                        if track {
                            deleted_now.push((ix, removed.seq, removed.seq));
                        }
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
                        if track {
                            deleted_now.push((ix, removed.seq, removed.seq));
                        }
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
                *oldest.at_mut(ix) = tx.tier(ix)?.peek_oldest()?;
            }
            Ok(())
        })?;
        self.state = state;
        self.next_seq = state.next_seq;
        self.alarm = alarm;
        self.oldest = oldest;
        self.compaction.record_deletions(&mut deleted_now);
        self.unreported = LossLedger::default();
        for frames in &mut self.pending.frames {
            frames.clear();
        }
        self.pending.records = 0;
        self.pending.bytes = 0;
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
            safety_only: false,
            refused: PerTier::default(),
        })
    }

    /// The store could not be written: drop SLO and debug appends (counted), hold safety ones,
    /// close the store so a later flush reopens (and repairs) it.
    fn store_failed(&mut self, error: StoreError, now: SystemTime) -> FlushError {
        tracing::warn!(%error, "Queue flush failed; holding safety events, refusing others.");
        for ix in 1..3 {
            let frames = &mut self.pending.frames[ix];
            for (seq, value) in frames.iter() {
                let bytes = record::KEY_LEN + value.len() as u64;
                self.unreported
                    .add(ix, LossCause::DiskFull, Some(seq), bytes);
            }
            if let Some((first, last)) = frames.seqs() {
                let range = self.refused.at_mut(ix);
                *range = Some(match *range {
                    Some((before, _)) => (before, last),
                    None => (first, last),
                });
            }
            frames.clear();
        }
        let kept = self.pending.frames[0].records() as usize;
        self.pending.records = kept;
        self.pending.bytes = self.pending.frames[0].value_bytes();
        // The refusal reports and any acknowledgements still wait: keep a flush due (the next
        // one is the next reopen attempt, see `next_flush_at`).
        self.pending.bulk_since = Some(now);
        // Never reuse a handle that saw an I/O error (its view of the file may not be the
        // disk's after a failed fsync): close it; a reopen opens the file anew.
        self.store = None;
        self.compaction.cancel();
        let reason = error.to_string();
        if self.fault.is_some() {
            self.attempt_failed(reason.clone(), now);
        } else {
            self.begin_fault(reason.clone(), now);
        }
        self.store_problem = Some(error);
        FlushError {
            reason,
            refused: self.refused,
            held_safety: kept,
        }
    }

    /// Reopens a store closed by a failure (or never opened), if the next attempt is due: a
    /// new handle on the files, the log's recovery, the queue's checks.
    fn reopen(&mut self, now: SystemTime) -> Result<(), FlushError> {
        let held = self.pending.records;
        let not_yet = |reason: String| FlushError {
            reason,
            refused: PerTier::default(),
            held_safety: held,
        };
        if let Some(fault) = &self.fault
            && now < fault.next_attempt
        {
            return Err(not_yet(fault.reason.clone()));
        }
        if !self.opened {
            // Never opened: the whole open (integrity check, quarantine of a damaged store).
            return match open_store(&self.config, now) {
                Ok(opened) => {
                    tracing::info!(
                        held = held,
                        "The queue store opened; the events held meanwhile are numbered in its \
                         epoch."
                    );
                    self.install(opened, now);
                    Ok(())
                }
                Err(error) => {
                    let reason = error.to_string();
                    self.attempt_failed(reason.clone(), now);
                    Err(not_yet(reason))
                }
            };
        }
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
                self.oldest = loaded.oldest;
                Ok(())
            }
            Ok((_, None)) => self.quarantine_now("the store lost its state", now),
            Err(StoreError::Corrupt(reason)) => self.quarantine_now(&reason, now),
            Err(error) => {
                let reason = error.to_string();
                self.attempt_failed(reason.clone(), now);
                self.store_problem = Some(error);
                Err(not_yet(reason))
            }
        }
    }

    /// Moves the current store aside and continues with a fresh one (new epoch). Pending
    /// appends are kept and get new sequence numbers in the new epoch.
    fn quarantine_now(&mut self, reason: &str, now: SystemTime) -> Result<(), FlushError> {
        // The damaged store's handles are closed before it is moved aside.
        self.store = None;
        self.compaction.cancel();
        let held = self.pending.records;
        let (store, loaded, moved) = match quarantine(&self.config, &self.path, reason, true, now) {
            Ok(done) => done,
            Err(error) => {
                // The fresh store could not be built (the disk fails or is full too): the store
                // is unavailable; a later attempt reopens the damaged one and quarantines it.
                let reason = error.to_string();
                self.pending.bulk_since.get_or_insert(now);
                if self.fault.is_some() {
                    self.attempt_failed(reason.clone(), now);
                } else {
                    self.begin_fault(reason.clone(), now);
                }
                return Err(FlushError {
                    reason,
                    refused: PerTier::default(),
                    held_safety: held,
                });
            }
        };
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
        self.renumber_pending(state.next_seq);
        self.oldest = loaded.oldest;
        Ok(())
    }

    /// True when the file is worth compacting: the store works, no compaction ran in the last
    /// [`COMPACT_MIN_INTERVAL`], and the file is at least [`COMPACT_MIN_FILE_BYTES`] while its
    /// live records take less than 1/[`COMPACT_LIVE_FRACTION`] of it (a backlog has drained).
    /// Reads the file's size (one `stat`).
    pub fn compaction_due(&self, now: SystemTime) -> bool {
        // The log unlinks drained segments as it goes: nothing is ever worth copying.
        const LOG_NEEDS_COMPACTION: bool = false;
        if !LOG_NEEDS_COMPACTION
            || self.store.is_none()
            || self.fault.is_some()
            || !matches!(self.compaction, Compaction::Idle)
            || self.last_compaction.is_some_and(|at| {
                now.duration_since(at)
                    .is_ok_and(|since| since < COMPACT_MIN_INTERVAL)
            })
        {
            return false;
        }
        let file_bytes = self.file_bytes();
        file_bytes >= COMPACT_MIN_FILE_BYTES
            && self.state.bytes.sum().saturating_mul(COMPACT_LIVE_FRACTION) < file_bytes
    }

    /// Starts a compaction if one is due ([`Queue::compaction_due`]): returns the copy to run,
    /// on another thread, while the queue goes on; hand its result to
    /// [`Queue::finish_compaction`]. The next flush after that swaps the copy in.
    pub fn begin_compaction(&mut self, now: SystemTime) -> Option<CompactionJob> {
        if !self.compaction_due(now) {
            return None;
        }
        let Some(StoreSlot(store)) = &self.store else {
            return None;
        };
        let cancel = Arc::new(AtomicBool::new(false));
        let job = store.copy_job(
            self.config.get().dir.join(COMPACT_FILE),
            self.config.get().cache_bytes,
            Arc::clone(&cancel),
        );
        self.compaction = Compaction::Running {
            _cancel: CancelOnDrop(cancel),
            deleted: Vec::new(),
        };
        self.last_compaction = Some(now);
        Some(CompactionJob(job))
    }

    /// Takes a finished copy: the next flush (due within `bulk_flush_interval`) swaps it in. A
    /// failed or cancelled copy is dropped with its file.
    pub fn finish_compaction(&mut self, result: CompactionResult, now: SystemTime) {
        let dest = self.config.get().dir.join(COMPACT_FILE);
        match (std::mem::take(&mut self.compaction), result.0) {
            (Compaction::Running { deleted, .. }, Ok(copied)) => {
                self.compaction = Compaction::Ready { copied, deleted };
                self.pending.bulk_since.get_or_insert(now);
            }
            (Compaction::Running { .. }, Err(error)) => {
                tracing::warn!(%error, "Copying the queue for compaction failed; it is tried again later.");
                let _ = std::fs::remove_file(&dest);
            }
            (_, Ok(copied)) => {
                drop(Store::from_copy(copied));
                let _ = std::fs::remove_file(&dest);
            }
            (_, Err(_)) => {
                let _ = std::fs::remove_file(&dest);
            }
        }
    }

    /// The store the last compaction swapped out, to close where closing cannot delay the
    /// queue's user (the agent closes it on a blocking thread). Dropped with the queue if never
    /// taken.
    pub fn take_retired_store(&mut self) -> Option<RetiredStore> {
        self.retired
            .take()
            .map(|StoreSlot(store)| RetiredStore(store))
    }

    /// Forgets a compaction whose copy never came back (its thread died): cancels it and drops
    /// its file.
    pub fn abandon_compaction(&mut self) {
        self.compaction = Compaction::Idle;
        let _ = std::fs::remove_file(self.config.get().dir.join(COMPACT_FILE));
    }

    /// Swaps a finished copy in, before this flush commits: applies to the copy what was
    /// deleted and appended since its snapshot, the committed key-value area and state, in one
    /// durable transaction, then renames it over the store. Any failure leaves the live store
    /// as it was (the copy is dropped).
    fn swap_compacted(&mut self, now: SystemTime) {
        let Compaction::Ready { copied, deleted } = std::mem::take(&mut self.compaction) else {
            return;
        };
        let (new, from) = Store::from_copy(copied);
        let dest = self.config.get().dir.join(COMPACT_FILE);
        let Some(StoreSlot(old)) = &self.store else {
            drop(new);
            let _ = std::fs::remove_file(&dest);
            return;
        };
        let before = self.file_bytes();
        let state = self.state;
        let result = old.kv().and_then(|kv| {
            new.write(|tx| {
                for ix in 0..3 {
                    let mut table = tx.tier(ix)?;
                    for &(_, first, last) in deleted.iter().filter(|d| d.0 == ix) {
                        table.remove_range(first, last, |_| {})?;
                    }
                    let mut failed = None;
                    old.read(
                        ix,
                        *from.next_seq.at(ix),
                        u64::MAX,
                        |seq, value| match table.insert(seq, value) {
                            Ok(_) => true,
                            Err(error) => {
                                failed = Some(error);
                                false
                            }
                        },
                    )?;
                    if let Some(error) = failed {
                        return Err(error);
                    }
                }
                for (key, value) in &kv {
                    tx.put_kv(key, Some(value))?;
                }
                tx.put_state(&state)
            })
        });
        let swapped = result
            .map_err(|e| e.to_string())
            .and_then(|()| std::fs::rename(&dest, &self.path).map_err(|e| e.to_string()));
        match swapped {
            Ok(()) => {
                sync_dir(&self.config.get().dir);
                // The old store is closed by the caller, off this thread (see `RetiredStore`).
                self.retired = self.store.replace(StoreSlot(new));
                self.last_compaction = Some(now);
                tracing::info!(
                    before_bytes = before,
                    after_bytes = self.file_bytes(),
                    copied_records = from.records,
                    live_bytes = state.bytes.sum(),
                    "Compacted the queue file."
                );
            }
            Err(error) => {
                tracing::warn!(%error, "Swapping in the compacted queue file failed; the file stays as it was.");
                drop(new);
                let _ = std::fs::remove_file(&dest);
            }
        }
    }

    /// Compacts now, on the caller's thread, if a compaction is due: the copy, then a flush that
    /// swaps it in. Returns true if it compacted. (The agent runs the copy on another thread:
    /// [`Queue::begin_compaction`].)
    pub fn compact_if_drained(&mut self, now: SystemTime) -> Result<bool, FlushError> {
        let Some(job) = self.begin_compaction(now) else {
            return Ok(false);
        };
        self.finish_compaction(job.run(), now);
        if !matches!(self.compaction, Compaction::Ready { .. }) {
            return Ok(false);
        }
        self.flush(now)?;
        let swapped = self.take_retired_store();
        let compacted = swapped.is_some();
        if let Some(old) = swapped {
            old.close();
        }
        Ok(compacted)
    }

    /// Bytes of the store's files (the log's segments and state slots).
    pub fn file_bytes(&self) -> u64 {
        match &self.store {
            // The open log knows its files' sizes: the status snapshot asks every second, and
            // listing the directory allocates (glibc's 32 KiB `opendir` buffer, the entries).
            Some(StoreSlot(store)) => store.file_bytes(),
            None => crate::store::file_bytes(&self.path),
        }
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
                    .oldest
                    .at(ix)
                    .map(|(_, ms)| Duration::from_millis(now_ms.saturating_sub(ms))),
                first_seq: self.oldest.at(ix).map_or(0, |(seq, _)| seq),
                durable_seq: self.state.next_seq.at(ix) - 1,
                pending: self.pending.frames[ix].records(),
                evicted: lost(LossCause::Evicted),
                expired: lost(LossCause::Expired),
                corrupt: lost(LossCause::Corrupt),
                disk_full: lost(LossCause::DiskFull),
                buffer_overflow: lost(LossCause::BufferOverflow),
                refused: lost(LossCause::Refused),
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
            store_available: self.store.is_some()
                && self.store_problem.is_none()
                && self.fault.is_none(),
        }
    }

    fn write_status(&mut self, now: SystemTime) {
        if !self.opened {
            // Nothing is known of the store yet: the last snapshot (of the last run) stays, as
            // the bound a quarantine would read.
            return;
        }
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
            let total = &mut state.losses[ix][cause];
            *total += acc.count;
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
    record::encode_trusted(value, seq, unix_ms(now), scratch)
        .map_err(|error| StoreError::Corrupt(format!("queue event encoding: {error}")))?;
    tx.tier(ix)?.insert(seq, value)?;
    *state.next_seq.at_mut(ix) += 1;
    *state.records.at_mut(ix) += 1;
    *state.bytes.at_mut(ix) += record::KEY_LEN + value.len() as u64;
    Ok(())
}

/// A store just opened, with what opening it found.
struct Opened {
    store: Store,
    loaded: Loaded,
    created: bool,
    quarantined: Option<Quarantined>,
}

/// Opens the store in `config.dir`: creates the directory, completes an interrupted quarantine,
/// drops a compaction copy left by a crash, migrates a store of the old format, runs the log's
/// recovery (every record's checksum), and
/// quarantines a store that fails (a fresh one with a new epoch replaces it). Errors are only
/// what retrying later may cure (the store unavailable, the directory) or another process
/// holding the store.
fn open_store(config: &QueueConfig, now: SystemTime) -> Result<Opened, QueueError> {
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
    // A compaction of the old format interrupted before its rename: the store itself is whole.
    remove_any(&dir.join(LEGACY_COMPACT_FILE));
    remove_any(&dir.join(COMPACT_FILE));
    match contain_panic(AssertUnwindSafe(|| {
        crate::store::migrate(&dir.join(LEGACY_FILE), &path)
    })) {
        Ok(true) => tracing::info!("Migrated the queue store from the old format to the log."),
        Ok(false) => {}
        Err(StoreError::Corrupt(reason)) => {
            // An old store that cannot be read goes where quarantined stores go.
            let folder = dir.join(QUARANTINE_DIR);
            let _ = std::fs::create_dir_all(&folder);
            let moved = folder.join(format!("queue-{}.redb", unix_ms(now)));
            tracing::error!(%reason, moved_to = %moved.display(),
                "The queue store of the old format is unreadable; moved aside, not migrated.");
            rename(&dir.join(LEGACY_FILE), &moved)?;
            let _ = std::fs::write(moved.with_extension("reason"), &reason);
            sync_dir(&dir);
        }
        Err(StoreError::Locked) => return Err(QueueError::AlreadyOpen(dir.join(LEGACY_FILE))),
        Err(error) => return Err(unavailable(&dir.join(LEGACY_FILE), &error)),
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
            let (store, loaded, moved) = quarantine(config, &path, &reason, true, now)?;
            created = true;
            quarantined = Some(Quarantined {
                moved_to: moved,
                reason,
            });
            (store, loaded)
        }
        Err(StoreError::Corrupt(reason)) => {
            let (store, loaded, moved) = quarantine(config, &path, &reason, true, now)?;
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
    // The store is ours (locked) and any quarantine has read its bound: a snapshot that an
    // older version kept in the directory, when this queue's is elsewhere, is stale from now on.
    let legacy = status::SnapshotPaths::at(&dir.join(status::SNAPSHOT_FILE));
    if legacy.file() != config.get().status_file {
        remove_any(legacy.file());
        remove_any(legacy.tmp());
    }
    Ok(Opened {
        store,
        loaded,
        created,
        quarantined,
    })
}

/// What a quarantine knows of one tier of the store it moves aside: how many records, bytes
/// and which numbers it held, by the best source there is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct TierBound {
    epoch: u64,
    records: u64,
    bytes: u64,
    /// Sequence numbers the tier held, inclusive (`first` 1 when unknown).
    first: u64,
    last: u64,
}

/// One tier's records lost to a quarantine: the bound minus what the salvage copied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct QuarantineLoss {
    epoch: u64,
    count: u64,
    bytes: u64,
    first_seq: u64,
    last_seq: u64,
}

/// What the salvage of one tier copied, and the gaps it found among the numbers the bound says
/// the tier held.
#[derive(Clone, Copy, Debug, Default)]
struct TierSalvage {
    copied: u64,
    /// Copied records (and their bytes) whose numbers the bound covers.
    copied_in_bound: u64,
    copied_bytes_in_bound: u64,
    /// Last number copied inside the bound, and the extent of the numbers not copied there.
    last_copied: u64,
    gap: Option<(u64, u64)>,
}

impl TierSalvage {
    fn copied(&mut self, seq: u64, bytes: u64, bound: Option<&TierBound>) {
        self.copied += 1;
        let Some(bound) = bound.filter(|b| (b.first..=b.last).contains(&seq)) else {
            return;
        };
        self.copied_in_bound += 1;
        self.copied_bytes_in_bound += bytes;
        let expected = self.last_copied.max(bound.first.saturating_sub(1)) + 1;
        if seq > expected {
            self.widen_gap(expected, seq - 1);
        }
        self.last_copied = seq;
    }

    fn widen_gap(&mut self, first: u64, last: u64) {
        self.gap = Some(match self.gap {
            Some((a, b)) => (a.min(first), b.max(last)),
            None => (first, last),
        });
    }

    /// The loss this salvage leaves against `bound`.
    fn loss(mut self, bound: &TierBound) -> QuarantineLoss {
        let after = self.last_copied.max(bound.first.saturating_sub(1)) + 1;
        if bound.last >= after {
            self.widen_gap(after, bound.last);
        }
        let count = bound.records.saturating_sub(self.copied_in_bound);
        let (first_seq, last_seq) = match (count, self.gap) {
            (0, _) => (0, 0),
            (_, Some(gap)) => gap,
            (_, None) => (bound.first, bound.last),
        };
        QuarantineLoss {
            epoch: bound.epoch,
            count,
            bytes: bound.bytes.saturating_sub(self.copied_bytes_in_bound),
            first_seq,
            last_seq,
        }
    }
}

/// Per tier, what the old store held by its own state (exact as of its last commit, unless the
/// damage reached it) or, when that cannot be read, by the last status snapshot (as of at most
/// `status_interval` before the last commit). A snapshot of the same epoch also gives the oldest
/// number, and the larger of the two counts is taken.
fn bounds(old: Option<&Persisted>, snapshot: Option<&QueueStatus>) -> Option<PerTier<TierBound>> {
    let tier = |ix: usize| -> Option<TierBound> {
        match (old, snapshot) {
            (Some(old), snapshot) => {
                let mut bound = TierBound {
                    epoch: old.epoch,
                    records: *old.records.at(ix),
                    bytes: *old.bytes.at(ix),
                    first: 1,
                    last: old.next_seq.at(ix).saturating_sub(1),
                };
                // A snapshot of the same store narrows the numbers; where it counted more (the
                // state itself may be damaged), the larger count is the safer bound.
                if let Some(t) = snapshot
                    .filter(|s| s.epoch == old.epoch)
                    .map(|s| s.tiers.at(ix))
                {
                    bound.first = t.first_seq.max(1);
                    bound.records = bound.records.max(t.records);
                    bound.bytes = bound.bytes.max(t.bytes);
                    bound.last = bound.last.max(t.durable_seq);
                }
                Some(bound)
            }
            (None, Some(s)) => {
                let t = s.tiers.at(ix);
                Some(TierBound {
                    epoch: s.epoch,
                    records: t.records,
                    bytes: t.bytes,
                    first: t.first_seq.max(1),
                    last: t.durable_seq,
                })
            }
            (None, None) => None,
        }
    };
    Some(PerTier {
        safety: tier(0)?,
        slo: tier(1)?,
        debug: tier(2)?,
    })
}

/// Loss totals as a snapshot shows them, `[tier][cause]`.
fn totals_of(snapshot: &QueueStatus) -> crate::store::LossTotals {
    let mut totals = [[0u64; LOSS_CAUSES]; 3];
    for (ix, row) in totals.iter_mut().enumerate() {
        let t = snapshot.tiers.at(ix);
        row[LossCause::Evicted as usize] = t.evicted;
        row[LossCause::Expired as usize] = t.expired;
        row[LossCause::Corrupt as usize] = t.corrupt;
        row[LossCause::DiskFull as usize] = t.disk_full;
        row[LossCause::Quarantined as usize] = t.quarantined;
        row[LossCause::BufferOverflow as usize] = t.buffer_overflow;
        row[LossCause::Refused as usize] = t.refused;
    }
    totals
}

/// Builds a fresh store whose first transaction already holds the loss reports, then moves the
/// broken file aside and the fresh one into place. Each step leaves something a later open
/// completes: the old file (quarantined again) or the fresh file (renamed into place).
///
/// With `salvage`, every record of the broken store that can still be read and passes its checks
/// is copied into the fresh one under its sequence number (in the new epoch, so no number is
/// reused if the damage rolled the state back). What the old store held and the salvage could
/// not copy is reported per tier as a `Quarantined` loss under the **old** epoch, with its
/// bytes and the range of numbers it lies in, bounded by the old state or else by the last
/// status snapshot (no report for a tier nothing bounds, or that lost nothing). The old loss
/// totals carry over from the same source.
fn quarantine(
    config: &QueueConfig,
    path: &Path,
    reason: &str,
    salvage: bool,
    now: SystemTime,
) -> Result<(Store, Loaded, PathBuf), QueueError> {
    let dir = &config.get().dir;
    let fresh = dir.join(FRESH_FILE);
    let stale = if fresh.is_dir() {
        std::fs::remove_dir_all(&fresh)
    } else {
        std::fs::remove_file(&fresh)
    };
    match stale {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
            return Err(QueueError::Directory {
                path: fresh,
                source: error,
            });
        }
        _ => {}
    }
    // The first open after an upgrade finds the snapshot where the older version kept it.
    let snapshot = status::read_snapshot(&config.get().status_file)
        .or_else(|_| status::read_snapshot(&dir.join(status::SNAPSHOT_FILE)))
        .ok()
        .filter(|s| s.epoch != 0);
    let mut state = Persisted::fresh(new_epoch(now));
    let mut salvaged = PerTier::<TierSalvage>::default();
    let mut bound = None;
    {
        let store =
            Store::open(&fresh, config.get().cache_bytes).map_err(|e| unavailable(&fresh, &e))?;
        let mut old = None;
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
                    snapshot.as_ref(),
                    &mut old,
                    &mut bound,
                    &mut salvaged,
                    &mut kv,
                )
            }));
        }
        if bound.is_none() {
            bound = bounds(old.as_ref(), snapshot.as_ref());
        }
        if let Some(old) = &old {
            state.losses = old.losses;
        } else if let Some(snapshot) = &snapshot {
            state.losses = totals_of(snapshot);
        }
        let losses = bound.map(|bound| PerTier {
            safety: salvaged.safety.loss(&bound.safety),
            slo: salvaged.slo.loss(&bound.slo),
            debug: salvaged.debug.loss(&bound.debug),
        });
        let (mut scratch, mut value) = (Vec::new(), Vec::new());
        store
            .write(|tx| {
                if let Some(losses) = &losses {
                    write_quarantine_reports(
                        tx,
                        &mut state,
                        losses,
                        now,
                        &mut scratch,
                        &mut value,
                    )?;
                }
                for (key, value) in &kv {
                    tx.put_kv(key, Some(value))?;
                }
                tx.put_state(&state)
            })
            .map_err(|e| unavailable(&fresh, &e))?;
        match &losses {
            Some(losses) => tracing::warn!(
                old_epoch = bound.map_or(0, |b| b.safety.epoch),
                safety_lost = losses.safety.count,
                slo_lost = losses.slo.count,
                debug_lost = losses.debug.count,
                safety_salvaged = salvaged.safety.copied,
                slo_salvaged = salvaged.slo.copied,
                debug_salvaged = salvaged.debug.copied,
                source = if old.is_some() {
                    "its state"
                } else {
                    "the last status snapshot"
                },
                "Quarantined a damaged queue store; what it held and the salvage could not copy \
                 is reported lost under its epoch."
            ),
            None => tracing::error!(
                safety_salvaged = salvaged.safety.copied,
                slo_salvaged = salvaged.slo.copied,
                debug_salvaged = salvaged.debug.copied,
                "Quarantined a damaged queue store whose state and status snapshot are both \
                 unreadable: what it lost is unknown and not reported."
            ),
        }
    }
    let folder = dir.join(QUARANTINE_DIR);
    std::fs::create_dir_all(&folder).map_err(|source| QueueError::Directory {
        path: folder.clone(),
        source,
    })?;
    let mut moved = folder.join(format!("queue-{}.log", unix_ms(now)));
    for n in 1.. {
        if !moved.exists() {
            break;
        }
        moved = folder.join(format!("queue-{}.{n}.log", unix_ms(now)));
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

/// Appends one `Quarantined` `QueueLoss` per tier that lost records, under the old epoch (to
/// the safety tier for safety, the SLO tier otherwise), adding them to the running totals.
fn write_quarantine_reports(
    tx: &StoreTx<'_>,
    state: &mut Persisted,
    losses: &PerTier<QuarantineLoss>,
    now: SystemTime,
    scratch: &mut Vec<u8>,
    value: &mut Vec<u8>,
) -> Result<(), StoreError> {
    for (ix, loss) in [losses.safety, losses.slo, losses.debug].iter().enumerate() {
        if loss.count == 0 {
            continue;
        }
        let total = &mut state.losses[ix][LossCause::Quarantined as usize];
        *total += loss.count;
        let event = Event {
            seq: 0,
            event_time_unix_ns: unix_ns(now),
            monotonic_ns: 0,
            kind: Some(Kind::QueueLoss(QueueLoss {
                tier: TIERS[ix] as i32,
                cause: LossCause::Quarantined as i32,
                count: loss.count,
                first_seq: loss.first_seq,
                last_seq: loss.last_seq,
                epoch: loss.epoch,
                bytes: loss.bytes,
                total: *total,
            })),
        };
        insert_event(
            tx,
            state,
            if ix == 0 { 0 } else { 1 },
            &event,
            now,
            scratch,
            value,
        )?;
    }
    Ok(())
}

/// Copies the intact records of the store at `path` into `fresh`, in chunks of a few MiB;
/// hands back its state (`old`) and key-value area if they can be read, the bounds of what it
/// held (`bound`, from its state or `snapshot`), and per tier what was copied.
#[allow(clippy::too_many_arguments)]
fn salvage_into(
    path: &Path,
    cache: u64,
    fresh: &Store,
    state: &mut Persisted,
    snapshot: Option<&QueueStatus>,
    old: &mut Option<Persisted>,
    bound: &mut Option<PerTier<TierBound>>,
    salvaged: &mut PerTier<TierSalvage>,
    kv: &mut Vec<(String, Vec<u8>)>,
) -> Result<(), StoreError> {
    const CHUNK_BYTES: usize = 4 * 1024 * 1024;
    let _ = cache;
    let broken = Store::open_for_salvage(path)?;
    // The area is copied even when the state is unusable (its entries describe records the
    // salvage keeps or counts); an unreadable area is lost with the file.
    *kv = broken.kv().unwrap_or_default();
    *old = broken.load().ok().flatten().map(|loaded| loaded.state);
    *bound = bounds(old.as_ref(), snapshot);
    if let Some(old) = old.as_ref() {
        // Numbers go on from the old store's: none is given twice, in either epoch's reports.
        state.next_seq = old.next_seq;
    }
    for ix in 0..3 {
        let tier_bound = bound.as_ref().map(|b| *b.at(ix));
        let mut from = 0u64;
        let mut chunk: Vec<(u64, Vec<u8>)> = Vec::new();
        loop {
            chunk.clear();
            let mut chunk_bytes = 0;
            let mut next_from = None;
            let read = broken.read(ix, from, u64::MAX, |seq, value| {
                next_from = Some(seq.saturating_add(1));
                if record::check(value, seq).is_ok() {
                    chunk_bytes += value.len();
                    chunk.push((seq, value.to_vec()));
                }
                chunk_bytes < CHUNK_BYTES
            });
            fresh.write(|tx| {
                let mut table = tx.tier(ix)?;
                for (seq, value) in &chunk {
                    table.insert(*seq, value)?;
                    let bytes = record::KEY_LEN + value.len() as u64;
                    *state.records.at_mut(ix) += 1;
                    *state.bytes.at_mut(ix) += bytes;
                    let next = state.next_seq.at_mut(ix);
                    *next = (*next).max(seq + 1);
                    salvaged.at_mut(ix).copied(*seq, bytes, tier_bound.as_ref());
                }
                Ok(())
            })?;
            match (read, next_from) {
                (Ok(()), Some(next)) if next > from && next != u64::MAX => from = next,
                _ => break,
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
        .filter(|path| {
            path.extension()
                .is_some_and(|ext| ext == "log" || ext == "redb")
        })
        .collect();
    // Names carry the time in ms, zero-free and growing: sort by (length, name).
    files.sort_by(|a, b| {
        let (a, b) = (a.as_os_str(), b.as_os_str());
        a.len().cmp(&b.len()).then(a.cmp(b))
    });
    let excess = files.len().saturating_sub(QUARANTINE_KEEP);
    for old in &files[..excess] {
        remove_any(old);
        let _ = std::fs::remove_file(old.with_extension("reason"));
    }
}

/// Removes a file or a directory tree, if there.
fn remove_any(path: &Path) {
    let _ = if path.is_dir() {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    };
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
