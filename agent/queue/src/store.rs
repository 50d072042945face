//! The storage boundary: the queue's segmented log ([`crate::log`]) behind the few operations
//! the queue needs (ordered records per tier, a small state record, the callers' key-value area,
//! one atomic durable write per flush), and the one-way migration from the store format before
//! it (a redb database, `queue.redb`). This is the only module that names redb, and only to
//! read an old store once.
//!
//! Invariants:
//! - When `write` returns `Ok`, the records, the removals, the key-value entries and the state
//!   written in it survive a power cut; when it fails, none of it happened.
//! - Errors are classified once, here and in the log: corruption, a full disk, other I/O.
//! - A migration never loses or duplicates a record: the old file is removed only after the
//!   log holding all of it (same epoch, same sequence numbers, same loss totals) is durable and
//!   in place, and a log in place is never migrated into again.
//! - A log needs no compaction: drained segments are unlinked as records are removed, so
//!   [`CopyJob`] copies nothing and the queue never finds compaction due.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use edgewatch_proto::tier::PerTier;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition, TableHandle};

pub use crate::log::{Frames, LOSS_CAUSES, Loaded, LossTotals, Persisted, Removed, StoreError};
use crate::log::{Log, LogTx};

/// Version of the old (redb) layout below, the only one a migration reads.
pub const FORMAT_VERSION: u64 = 1;

// The old store's layout, read once by `migrate`.
const TIER_TABLES: [TableDefinition<u64, &[u8]>; 3] = [
    TableDefinition::new("tier.safety"),
    TableDefinition::new("tier.slo"),
    TableDefinition::new("tier.debug"),
];
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const LOSSES: TableDefinition<u16, u64> = TableDefinition::new("losses");
/// The callers' key-value area (absent from stores written before it existed: empty).
const KV: TableDefinition<&str, &[u8]> = TableDefinition::new("kv");

const META_FORMAT: &str = "format";
const META_EPOCH: &str = "epoch";
const META_NEXT_SEQ: [&str; 3] = ["next_seq.safety", "next_seq.slo", "next_seq.debug"];

impl From<redb::Error> for StoreError {
    fn from(error: redb::Error) -> Self {
        match error {
            redb::Error::Corrupted(reason) => Self::Corrupt(reason),
            redb::Error::UpgradeRequired(version) => {
                Self::Corrupt(format!("file format {version} needs an upgrade"))
            }
            redb::Error::RepairAborted => Self::Corrupt("repair aborted".into()),
            redb::Error::DatabaseAlreadyOpen | redb::Error::LockProtocolMismatch => Self::Locked,
            redb::Error::Io(error) if error.kind() == std::io::ErrorKind::StorageFull => {
                Self::DiskFull
            }
            // A truncated or garbage file fails to read its header or pages.
            redb::Error::Io(error)
                if matches!(
                    error.kind(),
                    std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::InvalidData
                ) =>
            {
                Self::Corrupt(error.to_string())
            }
            redb::Error::TableTypeMismatch { .. }
            | redb::Error::TableIsMultimap(_)
            | redb::Error::TableIsNotMultimap(_)
            | redb::Error::TypeDefinitionChanged { .. } => Self::Corrupt(error.to_string()),
            other => Self::Io(other.to_string()),
        }
    }
}

macro_rules! from_redb {
    ($($error:ty),*) => {$(
        impl From<$error> for StoreError {
            fn from(error: $error) -> Self {
                redb::Error::from(error).into()
            }
        }
    )*};
}
from_redb!(
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::CompactionError,
    redb::SetDurabilityError
);

/// An open store: the segmented log in a directory.
pub struct Store {
    log: Log,
}

impl Store {
    /// Opens the store at `path` (a directory), creating an empty one when it is missing or
    /// empty. A store left by a crash is recovered here: every frame is scanned and checked, a
    /// torn or uncommitted tail truncated (this is the recovery time).
    pub fn open(path: &Path, _cache_bytes: u64) -> Result<Self, StoreError> {
        Ok(Self {
            log: Log::open(path, false)?,
        })
    }

    /// Opens a damaged store to copy out what can be read: without a valid state, every
    /// frame whose record passes its checks is visible (and `load` is `None`).
    pub fn open_for_salvage(path: &Path) -> Result<Self, StoreError> {
        Ok(Self {
            log: Log::open(path, true)?,
        })
    }

    /// The state and what recovery found against it (checksums, counts). `None` for a store
    /// never written.
    pub fn load(&self) -> Result<Option<Loaded>, StoreError> {
        Ok(self.log.load())
    }

    /// The key-value area alone, whatever the state says (for a salvage).
    pub fn kv(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        Ok(self.log.kv())
    }

    /// Visits the records of tier `ix` with `from <= seq < to`, in order, until `visit` returns
    /// false.
    pub fn read(
        &self,
        ix: usize,
        from: u64,
        to: u64,
        visit: impl FnMut(u64, &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        self.log.read(ix, from, to, visit)
    }

    /// Runs `work` in one transaction and commits it durably. Nothing of it persists if `work`
    /// or the commit fails.
    pub fn write<R>(
        &self,
        work: impl FnOnce(&StoreTx<'_>) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        self.log.write(|tx| work(&StoreTx { tx }))
    }

    /// [`Store::write`] with the records of `appends` (per tier, in frame form) appended first
    /// and written from those buffers without another copy; a record already stored (a commit
    /// reported failed that landed after all) is not stored twice, and
    /// [`TierTable::replaced`] counts it.
    pub fn write_with<R>(
        &self,
        appends: [Option<&mut Frames>; 3],
        work: impl FnOnce(&StoreTx<'_>) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        self.log.write_with(appends, |tx| work(&StoreTx { tx }))
    }

    /// Verifies every record's checksum: the open already did (recovery scans every frame), so
    /// this only says so.
    pub fn verify(&mut self) -> Result<bool, StoreError> {
        Ok(true)
    }

    /// A compaction copy: a log unlinks drained segments as it goes and never needs one, so the
    /// job copies nothing and reports so.
    pub fn copy_job(&self, dest: PathBuf, _cache_bytes: u64, _cancel: Arc<AtomicBool>) -> CopyJob {
        CopyJob { _dest: dest }
    }

    /// Opens a file a [`CopyJob`] wrote (a log's job never writes one).
    pub fn from_copy(copied: Copied) -> (Self, CopiedFrom) {
        match copied.never {}
    }

    /// Bytes of the open store's files, without listing its directory or allocating.
    pub fn file_bytes(&self) -> u64 {
        self.log.file_bytes()
    }
}

/// Bytes of the files of the store at `path` (0 if it does not exist), without opening it.
pub fn file_bytes(path: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(path) else {
        return std::fs::metadata(path).map_or(0, |m| m.len());
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.metadata().ok())
        .map(|m| m.len())
        .sum()
}

/// What a compaction copy copied: its snapshot of the live store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopiedFrom {
    /// The live store's next sequence numbers in the snapshot: every record below them that
    /// the snapshot held was copied; records appended later were not.
    pub next_seq: PerTier<u64>,
    /// Records copied.
    pub records: u64,
    /// Bytes copied (keys and values).
    pub bytes: u64,
}

/// A finished copy (never made by a log: see [`Store::copy_job`]).
pub struct Copied {
    never: std::convert::Infallible,
}

/// A compaction copy (see [`Store::copy_job`]): a log has nothing to copy.
pub struct CopyJob {
    _dest: PathBuf,
}

impl CopyJob {
    /// Reports that a log needs no compaction copy.
    pub fn run(self) -> Result<Copied, StoreError> {
        Err(StoreError::Io(
            "a log needs no compaction: drained segments are unlinked".into(),
        ))
    }
}

/// Runs `f`, turning a panic into `StoreError::Corrupt`: redb panics only on a file it cannot
/// make sense of, and the queue answers corruption by quarantine, never by a crash loop.
pub fn contain_panic<R>(
    f: AssertUnwindSafe<impl FnOnce() -> Result<R, StoreError>>,
) -> Result<R, StoreError> {
    match catch_unwind(f) {
        Ok(result) => result,
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_owned());
            Err(StoreError::Corrupt(format!("store panicked: {message}")))
        }
    }
}

/// A write transaction in progress.
pub struct StoreTx<'a> {
    tx: &'a LogTx<'a>,
}

impl StoreTx<'_> {
    /// The records of tier `ix`.
    pub fn tier(&self, ix: usize) -> Result<TierTable<'_>, StoreError> {
        Ok(TierTable { tx: self.tx, ix })
    }

    /// Writes the state record.
    pub fn put_state(&self, state: &Persisted) -> Result<(), StoreError> {
        self.tx.put_state(state);
        Ok(())
    }

    /// Writes `value` under `key` in the key-value area, or removes `key` when `value` is `None`.
    pub fn put_kv(&self, key: &str, value: Option<&[u8]>) -> Result<(), StoreError> {
        self.tx.put_kv(key, value);
        Ok(())
    }
}

/// One tier's records inside a write transaction.
pub struct TierTable<'t> {
    tx: &'t LogTx<'t>,
    ix: usize,
}

impl TierTable<'_> {
    /// Stores `value` under `seq`; returns the bytes of a record it replaced.
    pub fn insert(&mut self, seq: u64, value: &[u8]) -> Result<Option<u64>, StoreError> {
        self.tx.insert(self.ix, seq, value)
    }

    /// Records handed to [`Store::write_with`] for this tier that were stored already: how
    /// many, and their stored bytes.
    pub fn replaced(&self) -> (u64, u64) {
        self.tx.replaced(self.ix)
    }

    /// Removes the records with `first <= seq <= last`, calling `removed` for each.
    pub fn remove_range(
        &mut self,
        first: u64,
        last: u64,
        removed: impl FnMut(Removed),
    ) -> Result<(), StoreError> {
        self.tx.remove_range(self.ix, first, last, removed)
    }

    /// Removes the records with `first <= seq <= last` (delivered upstream); returns how many
    /// and their stored bytes.
    pub fn remove_acknowledged(&mut self, first: u64, last: u64) -> Result<(u64, u64), StoreError> {
        self.tx.remove_acknowledged(self.ix, first, last)
    }

    /// Removes and describes the oldest record.
    pub fn pop_oldest(&mut self) -> Result<Option<Removed>, StoreError> {
        self.tx.pop_oldest(self.ix)
    }

    /// Sequence number and append time of the oldest record.
    pub fn peek_oldest(&self) -> Result<Option<(u64, u64)>, StoreError> {
        self.tx.peek_oldest(self.ix)
    }
}

/// Moves an old-format store (a redb file at `old`) into a new log at `new`, if `old` exists
/// and no log is in place at `new`: reads the old file, writes the log beside it under a
/// temporary name (records in chunks, then the key-value area and the state: same epoch, same
/// next sequence numbers, same loss totals), makes it durable, renames it into place, then
/// removes the old file. Returns true if it migrated. A crash at any step leaves either the old
/// file alone (a half-written log is dropped and the migration runs again) or the log in place
/// (the old file, if still there, is removed without being read).
pub fn migrate(old: &Path, new: &Path) -> Result<bool, StoreError> {
    let in_place = new.exists();
    if !old.exists() {
        return Ok(false);
    }
    if in_place {
        std::fs::remove_file(old).map_err(|error| StoreError::Io(error.to_string()))?;
        sync_parent(new);
        return Ok(false);
    }
    let mut staging = new.as_os_str().to_owned();
    staging.push(".migrating");
    let staging = PathBuf::from(staging);
    if staging.exists() {
        std::fs::remove_dir_all(&staging).map_err(|error| StoreError::Io(error.to_string()))?;
    }
    contain_panic(AssertUnwindSafe(|| -> Result<(), StoreError> {
        let db = Database::open(old)?;
        let txn = db.begin_read()?;
        let names: Vec<String> = txn
            .list_tables()?
            .map(|table| table.name().to_owned())
            .collect();
        let log = Log::open(&staging, false)?;
        if !names.iter().any(|name| name == META.name()) {
            if !names.is_empty() {
                return Err(StoreError::Corrupt(format!(
                    "tables {names:?} without the queue's state"
                )));
            }
            return Ok(());
        }
        let meta = txn.open_table(META)?;
        let get = |key: &str| -> Result<u64, StoreError> {
            meta.get(key)?
                .map(|value| value.value())
                .ok_or_else(|| StoreError::Corrupt(format!("state `{key}` is missing")))
        };
        let format = get(META_FORMAT)?;
        if format != FORMAT_VERSION {
            return Err(StoreError::Corrupt(format!(
                "format {format} is not {FORMAT_VERSION}"
            )));
        }
        let mut state = Persisted::fresh(get(META_EPOCH)?);
        for (ix, key) in META_NEXT_SEQ.iter().enumerate() {
            *state.next_seq.at_mut(ix) = get(key)?.max(1);
        }
        let losses = txn.open_table(LOSSES)?;
        for entry in losses.iter()? {
            let (key, total) = entry?;
            let key = usize::from(key.value());
            if let Some(slot) = state
                .losses
                .get_mut(key / LOSS_CAUSES)
                .and_then(|row| row.get_mut(key % LOSS_CAUSES))
            {
                *slot = total.value();
            }
        }
        const CHUNK_BYTES: usize = 4 * 1024 * 1024;
        for (ix, definition) in TIER_TABLES.iter().enumerate() {
            let table = match txn.open_table(*definition) {
                Ok(table) => table,
                Err(redb::TableError::TableDoesNotExist(_)) => continue,
                Err(error) => return Err(error.into()),
            };
            let mut chunk: Vec<(u64, Vec<u8>)> = Vec::new();
            let mut chunk_bytes = 0;
            let mut entries = table.iter()?;
            loop {
                let entry = entries.next().transpose()?;
                if let Some((key, value)) = &entry {
                    chunk_bytes += value.value().len();
                    chunk.push((key.value(), value.value().to_vec()));
                    let next = state.next_seq.at_mut(ix);
                    *next = (*next).max(key.value() + 1);
                }
                if chunk_bytes >= CHUNK_BYTES || (entry.is_none() && !chunk.is_empty()) {
                    log.write(|tx| {
                        for (seq, value) in &chunk {
                            tx.insert(ix, *seq, value)?;
                        }
                        Ok(())
                    })?;
                    chunk.clear();
                    chunk_bytes = 0;
                }
                if entry.is_none() {
                    break;
                }
            }
        }
        let kv = read_kv(&txn)?;
        log.write(|tx| {
            for (key, value) in &kv {
                tx.put_kv(key, Some(value));
            }
            tx.put_state(&state);
            Ok(())
        })?;
        Ok(())
    }))?;
    std::fs::rename(&staging, new).map_err(|error| StoreError::Io(error.to_string()))?;
    sync_parent(new);
    std::fs::remove_file(old).map_err(|error| StoreError::Io(error.to_string()))?;
    sync_parent(new);
    Ok(true)
}

fn sync_parent(path: &Path) {
    if let Some(parent) = path.parent()
        && let Ok(dir) = std::fs::File::open(parent)
    {
        let _ = dir.sync_all();
    }
}

/// The key-value area of an old store (empty when the table does not exist).
fn read_kv(txn: &redb::ReadTransaction) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
    let kv = match txn.open_table(KV) {
        Ok(kv) => kv,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
        Err(error) => return Err(error.into()),
    };
    let mut entries = Vec::new();
    for entry in kv.iter()? {
        let (key, value) = entry?;
        entries.push((key.value().to_owned(), value.value().to_vec()));
    }
    Ok(entries)
}
