//! The embedded store: samples, series, de-duplication state, per-machine state, dead letters and
//! the remote-write outbox, in one redb file.
//!
//! Invariants:
//! - One write transaction covers everything one group of MQTT messages changes (samples,
//!   de-duplication ranges, machine state, dead letters, outbox). It commits with
//!   `Durability::Immediate` before any of those messages is acknowledged to the broker.
//! - Samples are idempotent on (series, timestamp): writing an identical value is a no-op; a
//!   different value at an existing (series, timestamp) is refused and counted, never overwritten.
//! - A machine owns at most `max_series_per_machine` series of the contract (the gateway's own two
//!   freshness series are not counted); a sample that would create one more is refused and counted.
//! - Dead letters are bounded by count: beyond the limit the oldest are dropped and counted.
//! - One gateway instance writes a store (redb `SingleWriter` mode); other processes (`report`,
//!   `export-focus`) may open it read-only at the same time and see its commits.
//!
//! Tables:
//! ```text
//! series          &str  canonical key          -> u64 series id
//! series_by_id    u64   series id              -> &str canonical key
//! machine_series  &str  machine id             -> u64 series owned
//! samples         (u64 series id, i64 ts ms)   -> f64 value
//! dedup           &[u8] machine\0 tier epoch   -> SeqRanges encoding (see dedup.rs)
//! machines        &str  machine id             -> MachineState (40 bytes)
//! dead_letters    u64   id (arrival order)     -> DeadLetter encoding
//! outbox          u64   id                     -> remote-write WriteRequest (protobuf)
//! meta            &str  name                   -> u64 (id counters, dropped dead letters)
//! ```

use std::path::Path;

use redb::{
    ConcurrencyMode, Database, Durability, ReadOnlyDatabase, ReadTransaction, ReadableDatabase,
    ReadableTable, ReadableTableMetadata, Table, TableDefinition,
};

use crate::config::StoreConfig;
use crate::dedup::SeqRanges;

const SERIES: TableDefinition<&str, u64> = TableDefinition::new("series");
const SERIES_BY_ID: TableDefinition<u64, &str> = TableDefinition::new("series_by_id");
const MACHINE_SERIES: TableDefinition<&str, u64> = TableDefinition::new("machine_series");
const SAMPLES: TableDefinition<(u64, i64), f64> = TableDefinition::new("samples");
const DEDUP: TableDefinition<&[u8], &[u8]> = TableDefinition::new("dedup");
const MACHINES: TableDefinition<&str, &[u8]> = TableDefinition::new("machines");
const DEAD_LETTERS: TableDefinition<u64, &[u8]> = TableDefinition::new("dead_letters");
const OUTBOX: TableDefinition<u64, &[u8]> = TableDefinition::new("outbox");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

const NEXT_SERIES: &str = "next_series_id";
const NEXT_DEAD_LETTER: &str = "next_dead_letter_id";
const NEXT_OUTBOX: &str = "next_outbox_id";

/// A store operation failed; the transaction was not committed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database file could not be opened or created.
    #[error("opening the store {path}: {source}")]
    Open {
        /// File path.
        path: String,
        /// redb's error.
        source: redb::DatabaseError,
    },
    /// A read, write or commit failed.
    #[error("store I/O failed: {0}")]
    Storage(#[from] redb::Error),
    /// A write was attempted through a read-only handle.
    #[error("the store was opened read-only")]
    ReadOnly,
}

impl From<redb::TransactionError> for StoreError {
    fn from(error: redb::TransactionError) -> Self {
        Self::Storage(error.into())
    }
}
impl From<redb::TableError> for StoreError {
    fn from(error: redb::TableError) -> Self {
        Self::Storage(error.into())
    }
}
impl From<redb::StorageError> for StoreError {
    fn from(error: redb::StorageError) -> Self {
        Self::Storage(error.into())
    }
}
impl From<redb::CommitError> for StoreError {
    fn from(error: redb::CommitError) -> Self {
        Self::Storage(error.into())
    }
}
impl From<redb::SetDurabilityError> for StoreError {
    fn from(error: redb::SetDurabilityError) -> Self {
        Self::Storage(error.into())
    }
}

/// What happened to one sample written with [`Writer::upsert_sample`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upsert {
    /// Stored.
    New,
    /// The same value was already stored at this (series, timestamp): nothing changed.
    Identical,
    /// Another value is stored at this (series, timestamp): refused.
    Conflict,
    /// The series is new and the machine's series budget is spent: refused.
    OverBudget,
}

/// Per-machine state kept by the gateway.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MachineState {
    /// Latest reconnect time (ns since the epoch), from a status message or a gap in arrivals.
    pub reconnect_ns: i64,
    /// Arrival time of the latest message from the machine.
    pub last_arrival_ns: i64,
    /// Safety events accepted so far (the value of `edgewatch_safety_events_received_total`).
    pub safety_received: u64,
    /// Fresh safety events so far (`edgewatch_safety_events_fresh_total`).
    pub safety_fresh: u64,
    /// Timestamp (ms) of the latest gateway-series sample, so the next one is strictly later.
    pub last_gateway_ts_ms: i64,
}

impl MachineState {
    fn encode(&self) -> [u8; 40] {
        let mut out = [0u8; 40];
        out[0..8].copy_from_slice(&self.reconnect_ns.to_be_bytes());
        out[8..16].copy_from_slice(&self.last_arrival_ns.to_be_bytes());
        out[16..24].copy_from_slice(&self.safety_received.to_be_bytes());
        out[24..32].copy_from_slice(&self.safety_fresh.to_be_bytes());
        out[32..40].copy_from_slice(&self.last_gateway_ts_ms.to_be_bytes());
        out
    }

    fn decode(bytes: &[u8]) -> Option<Self> {
        let field = |range: std::ops::Range<usize>| -> Option<[u8; 8]> {
            bytes.get(range)?.try_into().ok()
        };
        if bytes.len() != 40 {
            return None;
        }
        Some(Self {
            reconnect_ns: i64::from_be_bytes(field(0..8)?),
            last_arrival_ns: i64::from_be_bytes(field(8..16)?),
            safety_received: u64::from_be_bytes(field(16..24)?),
            safety_fresh: u64::from_be_bytes(field(24..32)?),
            last_gateway_ts_ms: i64::from_be_bytes(field(32..40)?),
        })
    }
}

/// Where a dead letter came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadLetterSource {
    /// An MQTT message refused by validation.
    Mqtt,
    /// A remote-write request the sink refused for good.
    RemoteWrite,
}

/// A refused payload and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// Arrival (or refusal) time, ns since the epoch.
    pub arrival_ns: i64,
    /// Where it came from.
    pub source: DeadLetterSource,
    /// `reason_code: detail`.
    pub reason: String,
    /// MQTT topic, or the remote-write URL.
    pub topic: String,
    /// Size of the original payload.
    pub payload_len: u64,
    /// The payload, truncated to the configured maximum.
    pub payload: Vec<u8>,
}

impl DeadLetter {
    fn encode(&self, out: &mut Vec<u8>) {
        let reason = truncate_utf8(&self.reason, 1024);
        let topic = truncate_utf8(&self.topic, 1024);
        out.extend_from_slice(&self.arrival_ns.to_be_bytes());
        out.push(match self.source {
            DeadLetterSource::Mqtt => 0,
            DeadLetterSource::RemoteWrite => 1,
        });
        out.extend_from_slice(&(reason.len() as u16).to_be_bytes());
        out.extend_from_slice(reason.as_bytes());
        out.extend_from_slice(&(topic.len() as u16).to_be_bytes());
        out.extend_from_slice(topic.as_bytes());
        out.extend_from_slice(&self.payload_len.to_be_bytes());
        out.extend_from_slice(&self.payload);
    }

    fn decode(bytes: &[u8]) -> Option<Self> {
        let arrival_ns = i64::from_be_bytes(bytes.get(0..8)?.try_into().ok()?);
        let source = match *bytes.get(8)? {
            0 => DeadLetterSource::Mqtt,
            _ => DeadLetterSource::RemoteWrite,
        };
        let mut at = 9;
        let text = |at: &mut usize| -> Option<String> {
            let len = u16::from_be_bytes(bytes.get(*at..*at + 2)?.try_into().ok()?) as usize;
            let value = std::str::from_utf8(bytes.get(*at + 2..*at + 2 + len)?).ok()?;
            *at += 2 + len;
            Some(value.to_owned())
        };
        let reason = text(&mut at)?;
        let topic = text(&mut at)?;
        let payload_len = u64::from_be_bytes(bytes.get(at..at + 8)?.try_into().ok()?);
        Some(Self {
            arrival_ns,
            source,
            reason,
            topic,
            payload_len,
            payload: bytes.get(at + 8..)?.to_vec(),
        })
    }
}

fn truncate_utf8(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Raw samples of one series, as the SLO core consumes them.
#[derive(Debug, Clone, PartialEq)]
pub struct RawSeries {
    /// Metric name.
    pub metric: String,
    /// Labels other than the name, sorted by name.
    pub labels: Vec<(String, String)>,
    /// (timestamp ms, value), in time order.
    pub samples: Vec<(i64, f64)>,
}

/// One de-duplication stream, for inspection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DedupStream {
    /// Machine id.
    pub machine: String,
    /// Tier number.
    pub tier: i32,
    /// Queue epoch.
    pub epoch: u64,
    /// Received sequence ranges.
    pub ranges: Vec<(u64, u64)>,
}

/// The database handle: the writer's, or a read-only one.
enum Handle {
    Writer(Database),
    Reader(ReadOnlyDatabase),
}

/// The store.
pub struct Store {
    db: Handle,
    config: StoreConfig,
}

impl Store {
    /// Opens (or creates) the store described by `config`.
    pub fn open(config: &StoreConfig) -> Result<Self, StoreError> {
        let open_error = |source| StoreError::Open {
            path: config.path.display().to_string(),
            source,
        };
        if let Some(parent) = config.path.parent()
            && !parent.as_os_str().is_empty()
        {
            let _ = std::fs::create_dir_all(parent);
        }
        let db = Database::builder()
            .set_cache_size(config.cache_size)
            .set_concurrency_mode(ConcurrencyMode::SingleWriter)
            .create(&config.path)
            .map_err(open_error)?;
        let store = Self {
            db: Handle::Writer(db),
            config: config.clone(),
        };
        // Create every table up front so readers never meet a missing one.
        store.write(|_| Ok(()))?;
        Ok(store)
    }

    /// Opens the store at `path` with default settings.
    pub fn open_path(path: &Path) -> Result<Self, StoreError> {
        Self::open(&StoreConfig::at(path))
    }

    /// Opens an existing store read-only, alongside the gateway that writes it.
    pub fn open_read_only(path: &Path) -> Result<Self, StoreError> {
        let config = StoreConfig::at(path);
        let db = Database::builder()
            .set_cache_size(config.cache_size)
            .set_concurrency_mode(ConcurrencyMode::SingleWriter)
            .open_read_only(path)
            .map_err(|source| StoreError::Open {
                path: path.display().to_string(),
                source,
            })?;
        Ok(Self {
            db: Handle::Reader(db),
            config,
        })
    }

    fn begin_read(&self) -> Result<ReadTransaction, StoreError> {
        Ok(match &self.db {
            Handle::Writer(db) => db.begin_read()?,
            Handle::Reader(db) => db.begin_read()?,
        })
    }

    /// Runs `f` in one write transaction and commits it durably; nothing is committed if `f` fails.
    pub fn write<R>(
        &self,
        f: impl FnOnce(&mut Writer<'_>) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let Handle::Writer(db) = &self.db else {
            return Err(StoreError::ReadOnly);
        };
        let mut txn = db.begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        let result = {
            let mut writer = Writer {
                series: txn.open_table(SERIES)?,
                series_by_id: txn.open_table(SERIES_BY_ID)?,
                machine_series: txn.open_table(MACHINE_SERIES)?,
                samples: txn.open_table(SAMPLES)?,
                dedup: txn.open_table(DEDUP)?,
                machines: txn.open_table(MACHINES)?,
                dead_letters: txn.open_table(DEAD_LETTERS)?,
                outbox: txn.open_table(OUTBOX)?,
                meta: txn.open_table(META)?,
                config: &self.config,
                series_ids: std::collections::HashMap::new(),
            };
            f(&mut writer)?
        };
        txn.commit()?;
        Ok(result)
    }

    /// Raw samples of every series of `metric` with `from_ms <= ts <= to_ms`, series sorted by key.
    pub fn query(
        &self,
        metric: &str,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<Vec<RawSeries>, StoreError> {
        let txn = self.begin_read()?;
        let series = txn.open_table(SERIES)?;
        let samples = txn.open_table(SAMPLES)?;
        let low = format!("{metric}{{");
        let high = format!("{metric}|");
        let mut out = Vec::new();
        for entry in series.range(low.as_str()..high.as_str())? {
            let (key, id) = entry?;
            let id = id.value();
            let Some((name, labels)) = crate::series::SeriesKey::parse(key.value()) else {
                continue;
            };
            let mut points = Vec::new();
            for sample in samples.range((id, from_ms)..=(id, to_ms))? {
                let (k, v) = sample?;
                points.push((k.value().1, v.value()));
            }
            if !points.is_empty() {
                out.push(RawSeries {
                    metric: name,
                    labels,
                    samples: points,
                });
            }
        }
        Ok(out)
    }

    /// Every metric name with at least one series.
    pub fn metrics(&self) -> Result<Vec<String>, StoreError> {
        let txn = self.begin_read()?;
        let series = txn.open_table(SERIES)?;
        let mut names: Vec<String> = Vec::new();
        for entry in series.iter()? {
            let (key, _) = entry?;
            let name = crate::series::SeriesKey::metric(key.value());
            if names.last().map(String::as_str) != Some(name) {
                names.push(name.to_owned());
            }
        }
        names.dedup();
        Ok(names)
    }

    /// Number of samples stored.
    pub fn sample_count(&self) -> Result<u64, StoreError> {
        let txn = self.begin_read()?;
        Ok(txn.open_table(SAMPLES)?.len()?)
    }

    /// Dead letters, oldest first.
    pub fn dead_letters(&self) -> Result<Vec<DeadLetter>, StoreError> {
        let txn = self.begin_read()?;
        let table = txn.open_table(DEAD_LETTERS)?;
        let mut out = Vec::new();
        for entry in table.iter()? {
            let (_, value) = entry?;
            if let Some(letter) = DeadLetter::decode(value.value()) {
                out.push(letter);
            }
        }
        Ok(out)
    }

    /// Every de-duplication stream.
    pub fn dedup_streams(&self) -> Result<Vec<DedupStream>, StoreError> {
        let txn = self.begin_read()?;
        let table = txn.open_table(DEDUP)?;
        let mut out = Vec::new();
        for entry in table.iter()? {
            let (key, value) = entry?;
            let key = key.value();
            let Some(split) = key.iter().position(|&b| b == 0) else {
                continue;
            };
            let (Some(&tier), Some(epoch)) = (key.get(split + 1), key.get(split + 2..split + 10))
            else {
                continue;
            };
            let Some((ranges, _)) = SeqRanges::decode(value.value()) else {
                continue;
            };
            out.push(DedupStream {
                machine: String::from_utf8_lossy(&key[..split]).into_owned(),
                tier: i32::from(tier),
                epoch: u64::from_be_bytes(epoch.try_into().unwrap_or([0; 8])),
                ranges: ranges.ranges().to_vec(),
            });
        }
        Ok(out)
    }

    /// State of one machine.
    pub fn machine_state(&self, machine: &str) -> Result<Option<MachineState>, StoreError> {
        let txn = self.begin_read()?;
        let table = txn.open_table(MACHINES)?;
        Ok(table
            .get(machine)?
            .and_then(|value| MachineState::decode(value.value())))
    }

    /// Pending remote-write requests, oldest first.
    pub fn outbox(&self) -> Result<Vec<(u64, Vec<u8>)>, StoreError> {
        let txn = self.begin_read()?;
        let table = txn.open_table(OUTBOX)?;
        let mut out = Vec::new();
        for entry in table.iter()? {
            let (key, value) = entry?;
            out.push((key.value(), value.value().to_vec()));
        }
        Ok(out)
    }

    /// Number of pending remote-write requests.
    pub fn outbox_len(&self) -> Result<u64, StoreError> {
        let txn = self.begin_read()?;
        Ok(txn.open_table(OUTBOX)?.len()?)
    }

    /// Removes delivered (or dead-lettered) remote-write requests.
    pub fn remove_outbox(&self, ids: &[u64]) -> Result<(), StoreError> {
        self.write(|writer| {
            for id in ids {
                writer.outbox.remove(id)?;
            }
            Ok(())
        })
    }

    /// Removes de-duplication streams not seen since `cutoff_ns`; returns how many.
    pub fn prune_dedup(&self, cutoff_ns: i64) -> Result<u64, StoreError> {
        self.write(|writer| {
            let mut removed = 0u64;
            writer.dedup.retain(|_, value| {
                let keep = SeqRanges::decode(value).is_some_and(|(_, seen)| seen >= cutoff_ns);
                if !keep {
                    removed += 1;
                }
                keep
            })?;
            Ok(removed)
        })
    }
}

/// The tables of one open write transaction (see [`Store::write`]).
pub struct Writer<'txn> {
    series: Table<'txn, &'static str, u64>,
    series_by_id: Table<'txn, u64, &'static str>,
    machine_series: Table<'txn, &'static str, u64>,
    samples: Table<'txn, (u64, i64), f64>,
    dedup: Table<'txn, &'static [u8], &'static [u8]>,
    machines: Table<'txn, &'static str, &'static [u8]>,
    dead_letters: Table<'txn, u64, &'static [u8]>,
    outbox: Table<'txn, u64, &'static [u8]>,
    meta: Table<'txn, &'static str, u64>,
    config: &'txn StoreConfig,
    /// Series ids looked up or created in this transaction (dropped with it, so an aborted
    /// transaction leaves no stale id behind).
    series_ids: std::collections::HashMap<String, u64>,
}

impl Writer<'_> {
    fn next_id(&mut self, name: &str) -> Result<u64, StoreError> {
        let id = self.meta.get(name)?.map_or(1, |v| v.value());
        self.meta.insert(name, id + 1)?;
        Ok(id)
    }

    /// Writes one sample; `budget` is the machine's series limit (`None`: not counted).
    pub fn upsert_sample(
        &mut self,
        machine: &str,
        series: &str,
        ts_ms: i64,
        value: f64,
        budget: Option<u32>,
    ) -> Result<Upsert, StoreError> {
        let existing = match self.series_ids.get(series) {
            Some(&id) => Some(id),
            None => self.series.get(series)?.map(|v| v.value()),
        };
        let id = match existing {
            Some(id) => id,
            None => {
                if let Some(limit) = budget {
                    let owned = self.machine_series.get(machine)?.map_or(0, |v| v.value());
                    if owned >= u64::from(limit) {
                        return Ok(Upsert::OverBudget);
                    }
                    self.machine_series.insert(machine, owned + 1)?;
                }
                let id = self.next_id(NEXT_SERIES)?;
                self.series.insert(series, id)?;
                self.series_by_id.insert(id, series)?;
                id
            }
        };
        if !self.series_ids.contains_key(series) {
            self.series_ids.insert(series.to_owned(), id);
        }
        // One tree operation in the common case (a new sample); a conflict puts the stored value
        // back, so it is never overwritten.
        let previous = self.samples.insert((id, ts_ms), value)?.map(|v| v.value());
        match previous {
            None => Ok(Upsert::New),
            Some(stored) if stored == value || (stored.is_nan() && value.is_nan()) => {
                Ok(Upsert::Identical)
            }
            Some(stored) => {
                self.samples.insert((id, ts_ms), stored)?;
                Ok(Upsert::Conflict)
            }
        }
    }

    /// De-duplication ranges of a stream (`None` if never seen or unreadable) and when last seen.
    pub fn dedup_get(&self, key: &[u8]) -> Result<Option<(SeqRanges, i64)>, StoreError> {
        Ok(self
            .dedup
            .get(key)?
            .and_then(|value| SeqRanges::decode(value.value())))
    }

    /// Stores a stream's ranges. When the stream is new and its `(machine, tier)` then holds more
    /// than `max_epochs` epochs, the least recently seen are removed; returns how many.
    pub fn dedup_put(
        &mut self,
        key: &[u8],
        prefix: &[u8],
        ranges: &SeqRanges,
        seen_ns: i64,
        max_epochs: u32,
    ) -> Result<u64, StoreError> {
        let is_new = self.dedup.get(key)?.is_none();
        let mut bytes = Vec::with_capacity(12 + 16 * ranges.ranges().len());
        ranges.encode(seen_ns, &mut bytes);
        self.dedup.insert(key, bytes.as_slice())?;
        if !is_new {
            return Ok(0);
        }
        let mut end = prefix.to_vec();
        end.extend_from_slice(&[0xff; 9]);
        let mut epochs: Vec<(i64, Vec<u8>)> = Vec::new();
        for entry in self.dedup.range(prefix..end.as_slice())? {
            let (k, v) = entry?;
            let seen = SeqRanges::decode(v.value()).map_or(i64::MIN, |(_, seen)| seen);
            epochs.push((seen, k.value().to_vec()));
        }
        let excess = epochs.len().saturating_sub(max_epochs as usize);
        if excess == 0 {
            return Ok(0);
        }
        epochs.sort();
        let mut removed = 0;
        for (_, old) in epochs.into_iter().filter(|(_, k)| k != key).take(excess) {
            self.dedup.remove(old.as_slice())?;
            removed += 1;
        }
        Ok(removed)
    }

    /// State of a machine (default if never seen).
    pub fn machine_get(&self, machine: &str) -> Result<MachineState, StoreError> {
        Ok(self
            .machines
            .get(machine)?
            .and_then(|value| MachineState::decode(value.value()))
            .unwrap_or_default())
    }

    /// Stores a machine's state.
    pub fn machine_put(&mut self, machine: &str, state: &MachineState) -> Result<(), StoreError> {
        self.machines.insert(machine, state.encode().as_slice())?;
        Ok(())
    }

    /// Records a dead letter (payload truncated to the configured maximum). Returns how many old
    /// dead letters were dropped to stay within the configured count.
    pub fn dead_letter(&mut self, letter: &DeadLetter) -> Result<u64, StoreError> {
        let id = self.next_id(NEXT_DEAD_LETTER)?;
        let mut letter_bytes = Vec::new();
        let keep = letter
            .payload
            .len()
            .min(self.config.dead_letter_max_payload);
        let truncated = DeadLetter {
            payload: letter.payload[..keep].to_vec(),
            ..letter.clone()
        };
        truncated.encode(&mut letter_bytes);
        self.dead_letters.insert(id, letter_bytes.as_slice())?;
        let mut dropped = 0;
        while self.dead_letters.len()? > self.config.dead_letter_max_records {
            if self.dead_letters.pop_first()?.is_none() {
                break;
            }
            dropped += 1;
        }
        Ok(dropped)
    }

    /// Queues a remote-write request body (protobuf, uncompressed); returns its id.
    pub fn outbox_push(&mut self, body: &[u8]) -> Result<u64, StoreError> {
        let id = self.next_id(NEXT_OUTBOX)?;
        self.outbox.insert(id, body)?;
        Ok(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_path(&dir.path().join("store.redb")).unwrap();
        (dir, store)
    }

    #[test]
    fn an_identical_sample_is_a_no_op_and_a_different_value_is_refused() {
        let (_dir, store) = store();
        let outcomes = store
            .write(|w| {
                Ok([
                    w.upsert_sample("m", "x{machine_id=\"m\"}", 10, 1.0, Some(5))?,
                    w.upsert_sample("m", "x{machine_id=\"m\"}", 10, 1.0, Some(5))?,
                    w.upsert_sample("m", "x{machine_id=\"m\"}", 10, 2.0, Some(5))?,
                ])
            })
            .unwrap();
        assert_eq!(outcomes, [Upsert::New, Upsert::Identical, Upsert::Conflict]);
        let series = store.query("x", 0, 100).unwrap();
        assert_eq!(series.len(), 1);
        assert_eq!(series[0].samples, vec![(10, 1.0)]);
    }

    #[test]
    fn a_machine_cannot_own_more_series_than_its_budget() {
        let (_dir, store) = store();
        let outcomes = store
            .write(|w| {
                Ok([
                    w.upsert_sample("m", "a{}", 1, 1.0, Some(2))?,
                    w.upsert_sample("m", "b{}", 1, 1.0, Some(2))?,
                    w.upsert_sample("m", "c{}", 1, 1.0, Some(2))?,
                    w.upsert_sample("m", "c{}", 1, 1.0, None)?,
                    w.upsert_sample("n", "d{}", 1, 1.0, Some(2))?,
                ])
            })
            .unwrap();
        assert_eq!(
            outcomes,
            [
                Upsert::New,
                Upsert::New,
                Upsert::OverBudget,
                Upsert::New,
                Upsert::New
            ]
        );
    }

    #[test]
    fn a_failed_transaction_leaves_nothing_behind() {
        let (_dir, store) = store();
        let result: Result<(), StoreError> = store.write(|w| {
            w.upsert_sample("m", "a{}", 1, 1.0, None)?;
            Err(StoreError::Storage(redb::Error::Corrupted("test".into())))
        });
        assert!(result.is_err());
        assert_eq!(store.sample_count().unwrap(), 0);
    }

    #[test]
    fn dead_letters_are_bounded_oldest_first() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = StoreConfig::at(dir.path().join("s.redb"));
        config.dead_letter_max_records = 2;
        config.dead_letter_max_payload = 3;
        let store = Store::open(&config).unwrap();
        let letter = |n: i64| DeadLetter {
            arrival_ns: n,
            source: DeadLetterSource::Mqtt,
            reason: "undecodable: x".into(),
            topic: "t".into(),
            payload_len: 5,
            payload: vec![1, 2, 3, 4, 5],
        };
        let dropped = store
            .write(|w| {
                let mut dropped = 0;
                for n in 0..3 {
                    dropped += w.dead_letter(&letter(n))?;
                }
                Ok(dropped)
            })
            .unwrap();
        assert_eq!(dropped, 1);
        let letters = store.dead_letters().unwrap();
        assert_eq!(letters.len(), 2);
        assert_eq!(letters[0].arrival_ns, 1);
        assert_eq!(letters[0].payload, vec![1, 2, 3]);
        assert_eq!(letters[0].payload_len, 5);
    }

    #[test]
    fn old_epochs_of_a_stream_are_pruned_least_recently_seen_first() {
        let (_dir, store) = store();
        let prefix = crate::dedup::stream_prefix("m", 2);
        let mut ranges = SeqRanges::new();
        ranges.insert(1, 1, 8);
        store
            .write(|w| {
                for epoch in 0..4u64 {
                    let key = crate::dedup::stream_key("m", 2, epoch);
                    w.dedup_put(&key, &prefix, &ranges, epoch as i64 * 10, 2)?;
                }
                Ok(())
            })
            .unwrap();
        let epochs: Vec<u64> = store
            .dedup_streams()
            .unwrap()
            .iter()
            .map(|s| s.epoch)
            .collect();
        assert_eq!(epochs, vec![2, 3]);
    }
}
