//! The storage boundary: the only module that names redb. Everything the queue needs from a store
//! is here (ordered `u64 → bytes` tables per tier, a small state record, the callers' key-value
//! area, one atomic durable write per flush, compaction), so the backend can change without
//! touching the queue's logic.
//!
//! Invariants:
//! - Every `write` commits with `Durability::Immediate`: when it returns `Ok`, the records, the
//!   deletions, the key-value entries and the state written in it survive a power cut; when it
//!   fails, none of it happened.
//! - The state record (epoch, next sequence numbers, record and byte counts, loss totals) is
//!   written in the same transaction as the records it describes.
//! - redb errors are classified once, here: corruption, a full disk, other I/O, a held lock.
//! - Closing a store never panics out of it: redb may panic closing a damaged file, and the
//!   queue closes stores exactly when they are damaged or failing.
//! - A compaction copy ([`CopyJob`]) reads a snapshot of the live store from another thread
//!   and writes only its own new file; the live store goes on committing meanwhile.

use std::mem::ManuallyDrop;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use edgewatch_proto::tier::PerTier;
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition, TableHandle};

use crate::record;

/// Version of the layout below; a store with another version is quarantined.
pub const FORMAT_VERSION: u64 = 1;
/// Loss causes are `LossCause` values `0..LOSS_CAUSES`.
pub const LOSS_CAUSES: usize = 8;

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
const META_RECORDS: [&str; 3] = ["records.safety", "records.slo", "records.debug"];
const META_BYTES: [&str; 3] = ["bytes.safety", "bytes.slo", "bytes.debug"];

/// Running loss totals, indexed `[tier][cause]`.
pub type LossTotals = [[u64; LOSS_CAUSES]; 3];

/// What the store remembers besides the records themselves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Persisted {
    /// Random id of this store, fixed at creation.
    pub epoch: u64,
    /// Next sequence number per tier (sequence numbers start at 1).
    pub next_seq: PerTier<u64>,
    /// Records stored per tier.
    pub records: PerTier<u64>,
    /// Bytes stored per tier (key + value).
    pub bytes: PerTier<u64>,
    /// Loss totals since the store was created.
    pub losses: LossTotals,
}

impl Persisted {
    /// Takes one record of `bytes` off tier `ix`'s counts (saturating: counts repaired at open
    /// never make a deletion fail).
    pub fn forget(&mut self, ix: usize, bytes: u64) {
        let stored = self.bytes.at_mut(ix);
        *stored = stored.saturating_sub(bytes);
        let records = self.records.at_mut(ix);
        *records = records.saturating_sub(1);
    }

    /// The state of a store just created.
    pub fn fresh(epoch: u64) -> Self {
        Self {
            epoch,
            next_seq: PerTier::all(1),
            records: PerTier::default(),
            bytes: PerTier::default(),
            losses: [[0; LOSS_CAUSES]; 3],
        }
    }
}

/// A store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The file is not a readable store of this format (bad header, failed page checksum,
    /// missing or inconsistent state).
    #[error("store is corrupt: {0}")]
    Corrupt(String),
    /// The file system has no space left.
    #[error("disk is full")]
    DiskFull,
    /// Another process has the store open.
    #[error("store is open in another process")]
    Locked,
    /// Reading or writing the file failed otherwise.
    #[error("store I/O failed: {0}")]
    Io(String),
}

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

/// A store's state as loaded and verified.
#[derive(Clone, Debug)]
pub struct Loaded {
    /// The state, with record and byte counts as found.
    pub state: Persisted,
    /// Records present but failing their checks: `(tier, seq)`.
    pub corrupt: Vec<(usize, u64)>,
    /// Records the state counted that the tables no longer hold.
    pub unaccounted: PerTier<u64>,
    /// Sequence number and append time of the oldest intact record per tier.
    pub oldest: PerTier<Option<(u64, u64)>>,
    /// The key-value area, in key order.
    pub kv: Vec<(String, Vec<u8>)>,
}

/// An open store. Shared with a compaction copy while one runs; closed (contained) when the
/// last holder drops it.
pub struct Store {
    db: ManuallyDrop<Arc<Database>>,
}

impl Drop for Store {
    fn drop(&mut self) {
        // SAFETY: `db` is taken exactly once, here, and never used again.
        let db = unsafe { ManuallyDrop::take(&mut self.db) };
        // redb commits its allocator state when the last handle closes, and panics on a file
        // it finds damaged while doing so: a closing store is often a damaged one.
        if catch_unwind(AssertUnwindSafe(move || drop(db))).is_err() {
            tracing::warn!("Closing the queue store failed; the file is left as it was.");
        }
    }
}

impl Store {
    /// Opens the store at `path`, creating an empty one when the file is missing or empty. A store
    /// left by a crash is repaired here (redb walks the whole file: this is the recovery time).
    pub fn open(path: &Path, cache_bytes: u64) -> Result<Self, StoreError> {
        let mut builder = Database::builder();
        builder.set_cache_size(usize::try_from(cache_bytes).unwrap_or(usize::MAX));
        let db = builder.create(path)?;
        Ok(Self::from_db(db))
    }

    fn from_db(db: Database) -> Self {
        Self {
            db: ManuallyDrop::new(Arc::new(db)),
        }
    }

    /// Reads the state and verifies every record against it (checksum, key, count): a store
    /// that was damaged outside redb can silently lose entries, and the only way to count them is
    /// to compare what is there with what the state says. `None` for a store with no tables yet.
    pub fn load(&self) -> Result<Option<Loaded>, StoreError> {
        let txn = self.db.begin_read()?;
        let mut names = Vec::new();
        for table in txn.list_tables()? {
            names.push(table.name().to_owned());
        }
        if !names.iter().any(|name| name == META.name()) {
            if names.is_empty() {
                return Ok(None);
            }
            return Err(StoreError::Corrupt(format!(
                "tables {names:?} without the queue's state"
            )));
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
        for ix in 0..3 {
            *state.next_seq.at_mut(ix) = get(META_NEXT_SEQ[ix])?.max(1);
            *state.records.at_mut(ix) = get(META_RECORDS[ix])?;
            *state.bytes.at_mut(ix) = get(META_BYTES[ix])?;
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
        let mut loaded = Loaded {
            state,
            corrupt: Vec::new(),
            unaccounted: PerTier::default(),
            oldest: PerTier::default(),
            kv: Vec::new(),
        };
        loaded.kv = read_kv(&txn)?;
        for (ix, definition) in TIER_TABLES.iter().enumerate() {
            let table = match txn.open_table(*definition) {
                Ok(table) => table,
                Err(redb::TableError::TableDoesNotExist(_)) => {
                    *loaded.unaccounted.at_mut(ix) = *state.records.at(ix);
                    *loaded.state.records.at_mut(ix) = 0;
                    *loaded.state.bytes.at_mut(ix) = 0;
                    continue;
                }
                Err(error) => return Err(error.into()),
            };
            let (mut records, mut bytes, mut last) = (0u64, 0u64, 0u64);
            for entry in table.iter()? {
                let (key, value) = entry?;
                let (seq, value) = (key.value(), value.value());
                records += 1;
                bytes += record::KEY_LEN + value.len() as u64;
                last = last.max(seq);
                match record::check(value, seq) {
                    Ok(view) => {
                        loaded
                            .oldest
                            .at_mut(ix)
                            .get_or_insert((seq, view.appended_unix_ms));
                    }
                    Err(_) => loaded.corrupt.push((ix, seq)),
                }
            }
            // Entries the state counts but the table no longer yields were lost to damage.
            *loaded.unaccounted.at_mut(ix) = state.records.at(ix).saturating_sub(records);
            *loaded.state.records.at_mut(ix) = records;
            *loaded.state.bytes.at_mut(ix) = bytes;
            let next = loaded.state.next_seq.at_mut(ix);
            if last >= *next {
                // Never hand out a stored sequence number again, whatever the state says.
                *next = last + 1;
            }
        }
        Ok(Some(loaded))
    }

    /// The key-value area alone, whatever the state says (for a salvage).
    pub fn kv(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        read_kv(&self.db.begin_read()?)
    }

    /// Visits the records of tier `ix` with `from <= seq < to`, in order, until `visit` returns
    /// false. A panic inside the store (a damaged page it did not detect) is reported as
    /// corruption, never propagated.
    pub fn read(
        &self,
        ix: usize,
        from: u64,
        to: u64,
        visit: impl FnMut(u64, &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        contain_panic(AssertUnwindSafe(|| self.read_inner(ix, from, to, visit)))
    }

    fn read_inner(
        &self,
        ix: usize,
        from: u64,
        to: u64,
        mut visit: impl FnMut(u64, &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        let txn = self.db.begin_read()?;
        let table = match txn.open_table(TIER_TABLES[ix]) {
            Ok(table) => table,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(()),
            Err(error) => return Err(error.into()),
        };
        for entry in table.range(from..to)? {
            let (key, value) = entry?;
            if !visit(key.value(), value.value()) {
                break;
            }
        }
        Ok(())
    }

    /// Runs `work` in one write transaction and commits it durably. Nothing of it persists if
    /// `work` or the commit fails. A panic inside the store is reported as corruption.
    pub fn write<R>(
        &self,
        work: impl FnOnce(&StoreTx<'_>) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        contain_panic(AssertUnwindSafe(|| self.write_inner(work)))
    }

    fn write_inner<R>(
        &self,
        work: impl FnOnce(&StoreTx<'_>) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let mut txn = self.db.begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        let result = work(&StoreTx { txn: &txn });
        match result {
            Ok(value) => {
                txn.commit()?;
                Ok(value)
            }
            Err(error) => {
                // The abort's own error adds nothing to the one that made us abort.
                let _ = txn.abort();
                Err(error)
            }
        }
    }

    /// Verifies the checksum of every page of the committed trees (reads the whole file). False if
    /// the file was damaged and redb repaired it (possibly by falling back to an older commit).
    pub fn verify(&mut self) -> Result<bool, StoreError> {
        match Arc::get_mut(&mut self.db) {
            Some(db) => Ok(db.check_integrity()?),
            None => Err(StoreError::Io(
                "the store is shared with a compaction".into(),
            )),
        }
    }

    /// A copy of this store's records into a new file at `dest`, to run on another thread
    /// ([`CopyJob::run`]) while this store goes on; `cancel` stops it between chunks.
    pub fn copy_job(&self, dest: PathBuf, cache_bytes: u64, cancel: Arc<AtomicBool>) -> CopyJob {
        CopyJob {
            source: Arc::clone(&self.db),
            dest,
            cache_bytes,
            cancel,
        }
    }

    /// Opens a file a [`CopyJob`] wrote (already open in `copied`).
    pub fn from_copy(copied: Copied) -> (Self, CopiedFrom) {
        (Self::from_db(copied.db), copied.from)
    }
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

/// A finished copy: the new file, open, and what it holds.
pub struct Copied {
    db: Database,
    from: CopiedFrom,
}

/// Copies the records of a live store, as of one read snapshot, into a new file (see
/// [`Store::copy_job`]). Sendable to another thread; touches only its own file.
pub struct CopyJob {
    source: Arc<Database>,
    dest: PathBuf,
    cache_bytes: u64,
    cancel: Arc<AtomicBool>,
}

impl CopyJob {
    /// Runs the copy: chunks of a few MiB in non-durable transactions, then one durable commit.
    /// A panic inside redb is reported as corruption.
    pub fn run(self) -> Result<Copied, StoreError> {
        contain_panic(AssertUnwindSafe(|| self.run_inner()))
    }

    fn run_inner(self) -> Result<Copied, StoreError> {
        const CHUNK_BYTES: usize = 4 * 1024 * 1024;
        match std::fs::remove_file(&self.dest) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                return Err(StoreError::Io(error.to_string()));
            }
            _ => {}
        }
        let mut builder = Database::builder();
        builder.set_cache_size(usize::try_from(self.cache_bytes).unwrap_or(usize::MAX));
        let dest = builder.create(&self.dest)?;
        let snapshot = self.source.begin_read()?;
        let mut next_seq = PerTier::all(1);
        {
            let meta = snapshot.open_table(META)?;
            for (ix, key) in META_NEXT_SEQ.iter().enumerate() {
                if let Some(value) = meta.get(*key)? {
                    *next_seq.at_mut(ix) = value.value().max(1);
                }
            }
        }
        let (mut records, mut bytes) = (0u64, 0u64);
        let mut chunk: Vec<(u64, Vec<u8>)> = Vec::new();
        for (ix, definition) in TIER_TABLES.iter().enumerate() {
            let table = match snapshot.open_table(*definition) {
                Ok(table) => table,
                Err(redb::TableError::TableDoesNotExist(_)) => continue,
                Err(error) => return Err(error.into()),
            };
            let mut from = 0u64;
            loop {
                if self.cancel.load(Ordering::Relaxed) {
                    return Err(StoreError::Io("compaction cancelled".into()));
                }
                chunk.clear();
                let mut chunk_bytes = 0;
                for entry in table.range(from..)? {
                    let (key, value) = entry?;
                    chunk_bytes += value.value().len();
                    chunk.push((key.value(), value.value().to_vec()));
                    if chunk_bytes >= CHUNK_BYTES {
                        break;
                    }
                }
                let Some(&(last, _)) = chunk.last() else {
                    break;
                };
                let mut txn = dest.begin_write()?;
                txn.set_durability(Durability::None)?;
                {
                    let mut out = txn.open_table(TIER_TABLES[ix])?;
                    for (seq, value) in &chunk {
                        out.insert(*seq, value.as_slice())?;
                        records += 1;
                        bytes += record::KEY_LEN + value.len() as u64;
                    }
                }
                txn.commit()?;
                if last == u64::MAX {
                    break;
                }
                from = last + 1;
            }
        }
        drop(snapshot);
        let mut txn = dest.begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        for definition in TIER_TABLES {
            // Every tier table exists in the copy, even an empty one.
            drop(txn.open_table(definition)?);
        }
        txn.commit()?;
        Ok(Copied {
            db: dest,
            from: CopiedFrom {
                next_seq,
                records,
                bytes,
            },
        })
    }
}

/// The key-value area of a read transaction, in key order (empty when the table does not exist).
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
    txn: &'a redb::WriteTransaction,
}

impl StoreTx<'_> {
    /// The records table of tier `ix`. Only one may be open at a time.
    pub fn tier(&self, ix: usize) -> Result<TierTable<'_>, StoreError> {
        Ok(TierTable {
            table: self.txn.open_table(TIER_TABLES[ix])?,
        })
    }

    /// Writes the state record.
    pub fn put_state(&self, state: &Persisted) -> Result<(), StoreError> {
        let mut meta = self.txn.open_table(META)?;
        meta.insert(META_FORMAT, FORMAT_VERSION)?;
        meta.insert(META_EPOCH, state.epoch)?;
        for ix in 0..3 {
            meta.insert(META_NEXT_SEQ[ix], *state.next_seq.at(ix))?;
            meta.insert(META_RECORDS[ix], *state.records.at(ix))?;
            meta.insert(META_BYTES[ix], *state.bytes.at(ix))?;
        }
        drop(meta);
        let mut losses = self.txn.open_table(LOSSES)?;
        for (tier, row) in state.losses.iter().enumerate() {
            for (cause, total) in row.iter().enumerate() {
                if *total > 0 {
                    losses.insert((tier * LOSS_CAUSES + cause) as u16, *total)?;
                }
            }
        }
        Ok(())
    }

    /// Writes `value` under `key` in the key-value area, or removes `key` when `value` is `None`.
    pub fn put_kv(&self, key: &str, value: Option<&[u8]>) -> Result<(), StoreError> {
        let mut kv = self.txn.open_table(KV)?;
        match value {
            Some(value) => {
                kv.insert(key, value)?;
            }
            None => {
                kv.remove(key)?;
            }
        }
        Ok(())
    }
}

/// One tier's records inside a write transaction.
pub struct TierTable<'t> {
    table: redb::Table<'t, u64, &'static [u8]>,
}

/// A record removed from a tier: its key and stored bytes (key + value).
#[derive(Clone, Copy, Debug)]
pub struct Removed {
    pub seq: u64,
    pub bytes: u64,
}

impl TierTable<'_> {
    /// Stores `value` under `seq`; returns the bytes of a record it replaced.
    pub fn insert(&mut self, seq: u64, value: &[u8]) -> Result<Option<u64>, StoreError> {
        let old = self.table.insert(seq, value)?;
        Ok(old.map(|old| record::KEY_LEN + old.value().len() as u64))
    }

    /// Removes the records with `first <= seq <= last`, calling `removed` for each.
    pub fn remove_range(
        &mut self,
        first: u64,
        last: u64,
        mut removed: impl FnMut(Removed),
    ) -> Result<(), StoreError> {
        for entry in self.table.extract_from_if(first..=last, |_, _| true)? {
            let (key, value) = entry?;
            let value = value.value();
            removed(Removed {
                seq: key.value(),
                bytes: record::KEY_LEN + value.len() as u64,
            });
        }
        Ok(())
    }

    /// Removes and describes the oldest record.
    pub fn pop_oldest(&mut self) -> Result<Option<Removed>, StoreError> {
        Ok(self.table.pop_first()?.map(|(key, value)| {
            let value = value.value();
            Removed {
                seq: key.value(),
                bytes: record::KEY_LEN + value.len() as u64,
            }
        }))
    }

    /// Sequence number and append time of the oldest record.
    pub fn peek_oldest(&self) -> Result<Option<(u64, u64)>, StoreError> {
        Ok(self.table.first()?.map(|(key, value)| {
            (
                key.value(),
                record::appended_unix_ms(value.value()).unwrap_or(0),
            )
        }))
    }
}

impl Loaded {
    /// A just-created store: nothing to verify.
    pub fn fresh(state: Persisted) -> Self {
        Self {
            state,
            corrupt: Vec::new(),
            unaccounted: PerTier::default(),
            oldest: PerTier::default(),
            kv: Vec::new(),
        }
    }
}
