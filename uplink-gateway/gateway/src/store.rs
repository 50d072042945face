//! The embedded store: samples, series and their lifecycle, de-duplication state, per-machine
//! state, dead letters and the remote-write outbox, in one redb file.
//!
//! Invariants:
//! - One write transaction covers everything one group of MQTT messages changes (samples,
//!   live series, de-duplication ranges, machine state, dead letters, outbox). It commits with
//!   `Durability::Immediate` before any of those messages is acknowledged to the broker.
//! - Samples are idempotent on (series, timestamp): writing an identical value is a no-op; a
//!   different value at an existing (series, timestamp) is refused and counted, never overwritten.
//! - A series' samples are stored in chunks (see [`chunk`]): a transaction loads the chunks it
//!   touches (first the series' last one, where appends land), edits them in memory and writes
//!   each changed one back before it commits, so the chunks a reader sees are those of the last
//!   commit. A group costs a B-tree write per series it touches, not per sample.
//! - A series' last chunk, its *open* one, is kept apart from its earlier, *sealed* ones: at most
//!   one per series in `open_chunks`, after every sealed one of the series. A chunk is sealed
//!   when a chunk is started after it (it is full) or when a transaction changes it while it is
//!   not the last: it is then written once at the end of `sealed_chunks` (numbered in the order
//!   sealed, so a group appends its sealed chunks in a few new pages) and indexed by (series id,
//!   first timestamp) in `chunk_index`, whose entries are small. So a group rewrites the pages
//!   of the open chunks and the index entries it touches, not those of the chunks before them. A
//!   sealed chunk that a late sample changes is removed and sealed again under a new number.
//! - A series is *live* for its machine from its admission until it retires; retiring removes it
//!   from `live_series` only (its samples stay), and a retired series written again is admitted
//!   again like a new one. Admission and retirement are the ingest path's decisions; the store
//!   keeps what they need (`LiveSeries`, `MachineState::newest_event_ms`).
//! - Dead letters are bounded by count: beyond the limit the oldest are dropped and counted.
//! - A series, once created, keeps its id and is never removed (retiring touches `live_series`
//!   only), so the writer keeps committed ids in memory between transactions; the ids a
//!   transaction created are forgotten with it when it does not commit.
//! - One gateway instance writes a store (redb `SingleWriter` mode); other processes (`report`,
//!   `export-focus`) may open it read-only at the same time and see its commits.
//! - A store of the format before chunks (samples one per entry, table `samples`) is migrated
//!   when the writer opens it, in one transaction; until then read-only openers read that table.
//!   So is a store of the layout with every chunk in one table (`sample_chunks`, keyed by (series
//!   id, first ts)): each series' last chunk is moved to `open_chunks`, the others sealed, their
//!   bytes as they were.
//!
//! Tables:
//! ```text
//! series          &str  canonical key          -> u64 series id
//! series_by_id    u64   series id              -> &str canonical key
//! live_series     (&str machine, u64 series id) -> LiveSeries (32 bytes)
//! open_chunks     (u64 series id, i64 first ts ms) -> the series' last chunk, see chunk.rs
//! sealed_chunks   u64   number (order sealed)  -> a chunk of up to 128 (ts ms, value), see chunk.rs
//! chunk_index     (u64 series id, i64 first ts ms) -> u64 number in sealed_chunks
//! dedup           &[u8] machine\0 tier epoch   -> SeqRanges encoding (see dedup.rs)
//! machines        &str  machine id             -> MachineState (96 bytes; 56 before the fleet series, 40 before series lifecycle)
//! dead_letters    u64   id (arrival order)     -> DeadLetter encoding
//! outbox          u64   id                     -> remote-write WriteRequest (protobuf)
//! meta            &str  name                   -> u64 (id counters, dropped dead letters)
//! ```

mod chunk;

use std::path::Path;

use redb::{
    ConcurrencyMode, Database, Durability, ReadOnlyDatabase, ReadOnlyTable, ReadTransaction,
    ReadableDatabase, ReadableTable, ReadableTableMetadata, Table, TableDefinition, TableError,
    TableHandle,
};

use self::chunk::{Chunk, Place};

use crate::config::StoreConfig;
use crate::dedup::SeqRanges;
use crate::series::SeriesSlot;

const SERIES: TableDefinition<&str, u64> = TableDefinition::new("series");
const SERIES_BY_ID: TableDefinition<u64, &str> = TableDefinition::new("series_by_id");
const LIVE_SERIES: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("live_series");
/// Each series' open chunk, its last (see [`chunk::Place`]).
const OPEN_CHUNKS: TableDefinition<(u64, i64), &[u8]> = TableDefinition::new("open_chunks");
/// Sealed chunks in the order they were sealed: each written once, at the end of the table.
const SEALED_CHUNKS: TableDefinition<u64, &[u8]> = TableDefinition::new("sealed_chunks");
/// Where each sealed chunk is: small entries, so a group's sealings rewrite few pages.
const CHUNK_INDEX: TableDefinition<(u64, i64), u64> = TableDefinition::new("chunk_index");
/// Chunks of the layout before open and sealed chunks were kept apart: every chunk of a series
/// under (series id, first ts); moved into the three tables above when the writer opens the
/// store.
const CHUNKS_IN_ONE_TABLE: TableDefinition<(u64, i64), &[u8]> =
    TableDefinition::new("sample_chunks");
/// Samples of the format before chunks, one entry per sample; migrated into chunks when the
/// writer opens the store.
const SAMPLES_BEFORE_CHUNKS: TableDefinition<(u64, i64), f64> = TableDefinition::new("samples");
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
    /// A stored chunk of samples could not be read; the transaction (or read) stopped there.
    #[error("the sample chunk of series {series} at {key} ms is corrupt")]
    CorruptChunk {
        /// Series id.
        series: u64,
        /// The chunk's key (its first timestamp, ms).
        key: i64,
    },
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

/// What happened to one sample written with [`Writer::put_sample`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upsert {
    /// Stored.
    New,
    /// The same value was already stored at this (series, timestamp): nothing changed.
    Identical,
    /// Another value is stored at this (series, timestamp): refused, the stored one kept.
    Conflict,
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
    /// Timestamp (ms) of the latest gateway-series sample, so the next one is strictly later; 0
    /// before the first.
    pub last_gateway_ts_ms: i64,
    /// Newest event time (ms) of the machine's counter events: series retire against it.
    pub newest_event_ms: i64,
    /// Refusal series the machine owns (they are bounded apart from the series budget).
    pub refusal_series: u64,
    /// Timestamp (ms) of the latest sample of the machine's fleet series (online state, last
    /// event and arrival, model-version event times), so the next one is strictly later; 0
    /// before the first.
    pub last_fleet_ts_ms: i64,
    /// Newest event time (ms) of any event received from the machine (the value of its
    /// last-event series); 0 before the first.
    pub last_event_ms: i64,
    /// What the machine's latest status message said: [`Self::STATUS_NONE`],
    /// [`Self::STATUS_ONLINE`] or [`Self::STATUS_OFFLINE`].
    pub status: u64,
    /// Timestamp (ms) of the latest sample of its online series; 0 before the first.
    pub status_ts_ms: i64,
    /// The latest arrival (ms) written to its last-arrival series; 0 before the first.
    pub arrival_series_ms: i64,
}

impl MachineState {
    /// No status message seen yet.
    pub const STATUS_NONE: u64 = 0;
    /// The latest status said online.
    pub const STATUS_ONLINE: u64 = 1;
    /// The latest status said offline (a last will, or a clean stop).
    pub const STATUS_OFFLINE: u64 = 2;

    fn encode(&self) -> [u8; 96] {
        let mut out = [0u8; 96];
        out[0..8].copy_from_slice(&self.reconnect_ns.to_be_bytes());
        out[8..16].copy_from_slice(&self.last_arrival_ns.to_be_bytes());
        out[16..24].copy_from_slice(&self.safety_received.to_be_bytes());
        out[24..32].copy_from_slice(&self.safety_fresh.to_be_bytes());
        out[32..40].copy_from_slice(&self.last_gateway_ts_ms.to_be_bytes());
        out[40..48].copy_from_slice(&self.newest_event_ms.to_be_bytes());
        out[48..56].copy_from_slice(&self.refusal_series.to_be_bytes());
        out[56..64].copy_from_slice(&self.last_fleet_ts_ms.to_be_bytes());
        out[64..72].copy_from_slice(&self.last_event_ms.to_be_bytes());
        out[72..80].copy_from_slice(&self.status.to_be_bytes());
        out[80..88].copy_from_slice(&self.status_ts_ms.to_be_bytes());
        out[88..96].copy_from_slice(&self.arrival_series_ms.to_be_bytes());
        out
    }

    /// Reads the 96-byte form, the 56-byte form of stores from before the fleet series, or the
    /// 40-byte form of stores from before the series lifecycle (the later fields then start at
    /// 0).
    fn decode(bytes: &[u8]) -> Option<Self> {
        let field = |range: std::ops::Range<usize>| -> Option<[u8; 8]> {
            bytes.get(range)?.try_into().ok()
        };
        if ![40, 56, 96].contains(&bytes.len()) {
            return None;
        }
        let later = |range: std::ops::Range<usize>| field(range).unwrap_or([0; 8]);
        Some(Self {
            reconnect_ns: i64::from_be_bytes(field(0..8)?),
            last_arrival_ns: i64::from_be_bytes(field(8..16)?),
            safety_received: u64::from_be_bytes(field(16..24)?),
            safety_fresh: u64::from_be_bytes(field(24..32)?),
            last_gateway_ts_ms: i64::from_be_bytes(field(32..40)?),
            newest_event_ms: i64::from_be_bytes(later(40..48)),
            refusal_series: u64::from_be_bytes(later(48..56)),
            last_fleet_ts_ms: i64::from_be_bytes(later(56..64)),
            last_event_ms: i64::from_be_bytes(later(64..72)),
            status: u64::from_be_bytes(later(72..80)),
            status_ts_ms: i64::from_be_bytes(later(80..88)),
            arrival_series_ms: i64::from_be_bytes(later(88..96)),
        })
    }
}

/// A live series of a machine: when it was last written, and the run it is in.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LiveSeries {
    /// Newest event time (ms) of its samples: it retires once its machine's newest event time
    /// is `series_retire_after` past this.
    pub last_ms: i64,
    /// Start (ms) of the newest run seen (a counter's start time), `i64::MIN` when unknown.
    pub run_start_ms: i64,
    /// Latest sample of that run: time (ms) and value.
    pub run_last_ms: i64,
    /// Its value.
    pub run_last_value: f64,
}

impl LiveSeries {
    /// A series admitted with a sample at `ts_ms` of no known run.
    pub fn new(ts_ms: i64) -> Self {
        Self {
            last_ms: ts_ms,
            run_start_ms: i64::MIN,
            run_last_ms: i64::MIN,
            run_last_value: 0.0,
        }
    }

    fn encode(&self) -> [u8; 32] {
        let mut out = [0u8; 32];
        out[0..8].copy_from_slice(&self.last_ms.to_be_bytes());
        out[8..16].copy_from_slice(&self.run_start_ms.to_be_bytes());
        out[16..24].copy_from_slice(&self.run_last_ms.to_be_bytes());
        out[24..32].copy_from_slice(&self.run_last_value.to_be_bytes());
        out
    }

    fn decode(bytes: &[u8]) -> Option<Self> {
        let field = |at: usize| -> Option<[u8; 8]> { bytes.get(at..at + 8)?.try_into().ok() };
        if bytes.len() != 32 {
            return None;
        }
        Some(Self {
            last_ms: i64::from_be_bytes(field(0)?),
            run_start_ms: i64::from_be_bytes(field(8)?),
            run_last_ms: i64::from_be_bytes(field(16)?),
            run_last_value: f64::from_be_bytes(field(24)?),
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
    /// One event of an accepted batch, refused by a check of its own (its payload is the
    /// event's protobuf encoding, its topic the batch's).
    Event,
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
            DeadLetterSource::Event => 2,
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
            1 => DeadLetterSource::RemoteWrite,
            _ => DeadLetterSource::Event,
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

/// What [`Store`] reads of each series in a range.
#[derive(Debug, Clone, Copy)]
enum Read {
    /// Every sample.
    All,
    /// The latest sample.
    Latest,
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

/// Most series ids [`Store`] keeps in memory between transactions, about 150 bytes each (40 MiB
/// in all): 1,900 machines with every series of the default budget (136) fit. Beyond it the cache
/// starts again empty after each commit, which costs what it saves: each transaction reads its
/// series' ids from the store once, as without the cache.
const SERIES_ID_CACHE_MAX: usize = 1 << 18;

/// Most series whose last chunk [`Store`] keeps in memory between transactions: about 2 KiB of
/// samples and 0.6 KiB of their encoding each (42 MiB in all), the series a gateway appends to
/// in a few minutes. Beyond it the
/// cache starts again empty after each commit: each transaction then reads the last chunk of
/// each series it touches once, as without the cache.
const HEAD_CACHE_MAX: usize = 1 << 14;

/// What the writer keeps in memory between transactions, all of it as last committed.
#[derive(Default)]
struct WriterCache {
    /// Ids of committed series, by canonical key (a series, once created, never changes id nor
    /// goes away, so the cache is never stale). Given back with what a transaction created when
    /// it commits.
    series_ids: foldhash::HashMap<String, u64>,
    /// The last stored chunk of series, by id, as its last commit wrote it, with its encoding
    /// (one writer, so nothing else changes it). A transaction takes those it touches and gives
    /// back their last chunk when it commits; one that fails gives back none.
    heads: foldhash::HashMap<u64, Chunk>,
}

/// The store.
pub struct Store {
    db: Handle,
    config: StoreConfig,
    /// The writer's (empty for a read-only handle), taken by each write transaction.
    cache: std::sync::Mutex<WriterCache>,
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
        Self::with_database(db, config)
    }

    /// The store over the writer's `db`, migrated to this layout.
    fn with_database(db: Database, config: &StoreConfig) -> Result<Self, StoreError> {
        let migrated = migrate_samples(&db)?;
        if migrated > 0 {
            tracing::info!(
                path = %config.path.display(),
                samples = migrated,
                "Samples of the format before chunks were moved into chunks."
            );
        }
        let moved = migrate_chunks(&db)?;
        if moved > 0 {
            tracing::info!(
                path = %config.path.display(),
                chunks = moved,
                "Chunks were moved apart into open and sealed chunks."
            );
        }
        let store = Self {
            db: Handle::Writer(db),
            config: config.clone(),
            cache: std::sync::Mutex::default(),
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
            cache: std::sync::Mutex::default(),
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
        // One writer at a time holds the cache (redb serializes write transactions anyway). A
        // transaction that panicked left the ids it created in it: start again empty.
        let mut cache = self.cache.lock().unwrap_or_else(|poisoned| {
            let mut cache = poisoned.into_inner();
            *cache = WriterCache::default();
            self.cache.clear_poison();
            cache
        });
        let WriterCache { series_ids, heads } = &mut *cache;
        let mut txn = db.begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        let mut created = Vec::new();
        let result: Result<(R, ChunksTouched), StoreError> = (|| {
            let mut writer = Writer {
                series: txn.open_table(SERIES)?,
                series_by_id: txn.open_table(SERIES_BY_ID)?,
                live_series: txn.open_table(LIVE_SERIES)?,
                samples: ChunkTables {
                    open: txn.open_table(OPEN_CHUNKS)?,
                    sealed: txn.open_table(SEALED_CHUNKS)?,
                    index: txn.open_table(CHUNK_INDEX)?,
                    next_sealed: None,
                },
                chunks: ChunksTouched::default(),
                heads,
                spare: Vec::new(),
                encoded: Vec::new(),
                dedup: txn.open_table(DEDUP)?,
                machines: txn.open_table(MACHINES)?,
                dead_letters: txn.open_table(DEAD_LETTERS)?,
                outbox: txn.open_table(OUTBOX)?,
                meta: txn.open_table(META)?,
                config: &self.config,
                series_ids,
                created: &mut created,
                live: LiveStates::default(),
                live_machines: Vec::new(),
                last_live_machine: 0,
            };
            let result = f(&mut writer)?;
            writer.flush_live()?;
            writer.flush_chunks()?;
            Ok((result, std::mem::take(&mut writer.chunks)))
        })();
        let committed = result.and_then(|result| {
            txn.commit()?;
            Ok(result)
        });
        let WriterCache { series_ids, heads } = &mut *cache;
        match committed {
            Err(error) => {
                // Ids created by a transaction that did not commit do not exist.
                for key in &created {
                    series_ids.remove(key);
                }
                Err(error)
            }
            Ok((result, touched)) => {
                if series_ids.len() > SERIES_ID_CACHE_MAX {
                    series_ids.clear();
                }
                for (id, series) in touched.list {
                    if let Some(head) = series.into_head() {
                        heads.insert(id, head);
                    }
                }
                if heads.len() > HEAD_CACHE_MAX {
                    heads.clear();
                }
                Ok(result)
            }
        }
    }

    /// Raw samples of every series of `metric` with `from_ms <= ts <= to_ms`, series sorted by key.
    pub fn query(
        &self,
        metric: &str,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<Vec<RawSeries>, StoreError> {
        self.read_series(metric, from_ms, to_ms, None, Read::All)
    }

    /// [`Store::query`] of one machine's series (label `machine_id` = `machine`) only.
    pub fn query_machine(
        &self,
        metric: &str,
        from_ms: i64,
        to_ms: i64,
        machine: &str,
    ) -> Result<Vec<RawSeries>, StoreError> {
        self.read_series(metric, from_ms, to_ms, Some(machine), Read::All)
    }

    /// Per series of `metric` (of one machine when `machine` is given), its latest sample with
    /// `from_ms <= ts <= to_ms`; series sorted by key.
    pub fn query_latest(
        &self,
        metric: &str,
        from_ms: i64,
        to_ms: i64,
        machine: Option<&str>,
    ) -> Result<Vec<RawSeries>, StoreError> {
        self.read_series(metric, from_ms, to_ms, machine, Read::Latest)
    }

    fn read_series(
        &self,
        metric: &str,
        from_ms: i64,
        to_ms: i64,
        machine: Option<&str>,
        read: Read,
    ) -> Result<Vec<RawSeries>, StoreError> {
        if from_ms > to_ms {
            return Ok(Vec::new());
        }
        let txn = self.begin_read()?;
        let series = txn.open_table(SERIES)?;
        let samples = Samples::open(&txn)?;
        let low = format!("{metric}{{");
        let high = format!("{metric}|");
        let mut out = Vec::new();
        for entry in series.range(low.as_str()..high.as_str())? {
            let (key, id) = entry?;
            let id = id.value();
            let Some((name, labels)) = crate::series::SeriesKey::parse(key.value()) else {
                continue;
            };
            if let Some(machine) = machine
                && !labels
                    .iter()
                    .any(|(n, v)| n == edgewatch_slo::names::label::MACHINE_ID && v == machine)
            {
                continue;
            }
            let mut points = Vec::new();
            samples.read(id, from_ms, to_ms, read, &mut points)?;
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
        Samples::open(&txn)?.count()
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

/// The sample tables of a read transaction: open and sealed chunks, or the table of a store of
/// an earlier layout that no writer has opened (and so migrated) yet.
enum Samples {
    Chunks(Option<Box<ReadChunks>>),
    InOneTable(ReadOnlyTable<(u64, i64), &'static [u8]>),
    BeforeChunks(ReadOnlyTable<(u64, i64), f64>),
}

/// The tables of open and sealed chunks, read-only.
struct ReadChunks {
    open: ReadOnlyTable<(u64, i64), &'static [u8]>,
    sealed: ReadOnlyTable<u64, &'static [u8]>,
    index: ReadOnlyTable<(u64, i64), u64>,
}

impl ReadChunks {
    /// The samples of sealed chunk `seq` of series `id` at `key`.
    fn sealed(&self, id: u64, key: i64, seq: u64) -> Result<Vec<(i64, f64)>, StoreError> {
        let corrupt = || StoreError::CorruptChunk { series: id, key };
        let bytes = self.sealed.get(seq)?.ok_or_else(corrupt)?;
        Ok(chunk::decode(bytes.value())
            .map_err(|_| corrupt())?
            .collect())
    }
}

impl Samples {
    fn open(txn: &ReadTransaction) -> Result<Self, StoreError> {
        match txn.open_table(SAMPLES_BEFORE_CHUNKS) {
            Ok(table) => return Ok(Self::BeforeChunks(table)),
            Err(TableError::TableDoesNotExist(_)) => {}
            Err(error) => return Err(error.into()),
        }
        match txn.open_table(CHUNKS_IN_ONE_TABLE) {
            Ok(table) => return Ok(Self::InOneTable(table)),
            Err(TableError::TableDoesNotExist(_)) => {}
            Err(error) => return Err(error.into()),
        }
        let open = match txn.open_table(OPEN_CHUNKS) {
            Ok(table) => table,
            Err(TableError::TableDoesNotExist(_)) => return Ok(Self::Chunks(None)),
            Err(error) => return Err(error.into()),
        };
        Ok(Self::Chunks(Some(Box::new(ReadChunks {
            open,
            sealed: txn.open_table(SEALED_CHUNKS)?,
            index: txn.open_table(CHUNK_INDEX)?,
        }))))
    }

    /// Appends the samples of series `id` with `from_ms <= ts <= to_ms` (all, or the latest) to
    /// `out`, in time order.
    fn read(
        &self,
        id: u64,
        from_ms: i64,
        to_ms: i64,
        read: Read,
        out: &mut Vec<(i64, f64)>,
    ) -> Result<(), StoreError> {
        let corrupt = |key| StoreError::CorruptChunk { series: id, key };
        let within = |ts: &i64| (from_ms..=to_ms).contains(ts);
        match self {
            Self::Chunks(None) => {}
            Self::Chunks(Some(tables)) => {
                // The open chunk when it starts at or before `to_ms`: it comes after every
                // sealed one.
                let open = match tables.open.range((id, i64::MIN)..=(id, to_ms))?.next() {
                    Some(entry) => {
                        let (key, bytes) = entry?;
                        let key = key.value().1;
                        let samples = chunk::decode(bytes.value()).map_err(|_| corrupt(key))?;
                        Some((key, samples.collect::<Vec<_>>()))
                    }
                    None => None,
                };
                match read {
                    Read::All => {
                        // The sealed chunk covering `from_ms` starts at or before it (none
                        // when the open chunk does).
                        let open_covers = open.as_ref().is_some_and(|(key, _)| *key <= from_ms);
                        if !open_covers {
                            let start = match tables
                                .index
                                .range((id, i64::MIN)..=(id, from_ms))?
                                .next_back()
                            {
                                Some(entry) => entry?.0.value().1,
                                None => from_ms,
                            };
                            for entry in tables.index.range((id, start)..=(id, to_ms))? {
                                let (key, seq) = entry?;
                                let samples = tables.sealed(id, key.value().1, seq.value())?;
                                out.extend(samples.into_iter().filter(|(ts, _)| within(ts)));
                            }
                        }
                        if let Some((_, samples)) = open {
                            out.extend(samples.into_iter().filter(|(ts, _)| within(ts)));
                        }
                    }
                    Read::Latest => {
                        // The last chunk starting at or before `to_ms` holds the latest sample.
                        let samples = match open {
                            Some((_, samples)) => samples,
                            None => match tables
                                .index
                                .range((id, i64::MIN)..=(id, to_ms))?
                                .next_back()
                            {
                                Some(entry) => {
                                    let (key, seq) = entry?;
                                    tables.sealed(id, key.value().1, seq.value())?
                                }
                                None => Vec::new(),
                            },
                        };
                        if let Some(&latest) =
                            samples.iter().take_while(|(ts, _)| *ts <= to_ms).last()
                            && latest.0 >= from_ms
                        {
                            out.push(latest);
                        }
                    }
                }
            }
            Self::InOneTable(table) => match read {
                Read::All => {
                    // The chunk covering `from_ms` starts at or before it.
                    let start = match table.range((id, i64::MIN)..=(id, from_ms))?.next_back() {
                        Some(entry) => entry?.0.value().1,
                        None => from_ms,
                    };
                    for entry in table.range((id, start)..=(id, to_ms))? {
                        let (key, bytes) = entry?;
                        let samples =
                            chunk::decode(bytes.value()).map_err(|_| corrupt(key.value().1))?;
                        out.extend(samples.filter(|(ts, _)| within(ts)));
                    }
                }
                Read::Latest => {
                    // The last chunk starting at or before `to_ms` holds the latest sample.
                    if let Some(entry) = table.range((id, i64::MIN)..=(id, to_ms))?.next_back() {
                        let (key, bytes) = entry?;
                        let samples =
                            chunk::decode(bytes.value()).map_err(|_| corrupt(key.value().1))?;
                        if let Some(latest) = samples.take_while(|(ts, _)| *ts <= to_ms).last()
                            && latest.0 >= from_ms
                        {
                            out.push(latest);
                        }
                    }
                }
            },
            Self::BeforeChunks(table) => {
                let mut range = table.range((id, from_ms)..=(id, to_ms))?;
                match read {
                    Read::All => {
                        for sample in range {
                            let (k, v) = sample?;
                            out.push((k.value().1, v.value()));
                        }
                    }
                    Read::Latest => {
                        if let Some(sample) = range.next_back() {
                            let (k, v) = sample?;
                            out.push((k.value().1, v.value()));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn count(&self) -> Result<u64, StoreError> {
        let count_chunks = |table: &ReadOnlyTable<(u64, i64), &'static [u8]>| {
            let mut count = 0;
            for entry in table.iter()? {
                let (key, bytes) = entry?;
                let (series, key) = key.value();
                count += chunk::count(bytes.value())
                    .map_err(|_| StoreError::CorruptChunk { series, key })?
                    as u64;
            }
            Ok::<u64, StoreError>(count)
        };
        match self {
            Self::Chunks(None) => Ok(0),
            Self::Chunks(Some(tables)) => {
                let mut count = count_chunks(&tables.open)?;
                for entry in tables.index.iter()? {
                    let (key, seq) = entry?;
                    let (series, key) = key.value();
                    count += tables.sealed(series, key, seq.value())?.len() as u64;
                }
                Ok(count)
            }
            Self::InOneTable(table) => count_chunks(table),
            Self::BeforeChunks(table) => Ok(table.len()?),
        }
    }
}

/// Moves the samples of a store of the format before chunks into chunks (in one table, the layout
/// [`migrate_chunks`] then moves apart), in one durable transaction (all moved, or none); returns
/// how many. Nothing to do for a store in chunks.
fn migrate_samples(db: &Database) -> Result<u64, StoreError> {
    let mut txn = db.begin_write()?;
    let before_chunks = txn
        .list_tables()?
        .any(|table| table.name() == SAMPLES_BEFORE_CHUNKS.name());
    if !before_chunks {
        return Ok(0);
    }
    txn.set_durability(Durability::Immediate)?;
    let mut moved = 0;
    {
        let old = txn.open_table(SAMPLES_BEFORE_CHUNKS)?;
        let mut chunks = txn.open_table(CHUNKS_IN_ONE_TABLE)?;
        let mut run: Vec<(i64, f64)> = Vec::with_capacity(chunk::MAX_SAMPLES);
        let mut run_series = 0;
        let mut bytes = Vec::new();
        let mut write = |series: u64, run: &mut Vec<(i64, f64)>| -> Result<(), StoreError> {
            if let Some(&(first, _)) = run.first() {
                bytes.clear();
                chunk::encode(run, &mut bytes);
                chunks.insert((series, first), bytes.as_slice())?;
                run.clear();
            }
            Ok(())
        };
        for entry in old.iter()? {
            let (key, value) = entry?;
            let (series, ts) = key.value();
            if series != run_series || run.len() == chunk::MAX_SAMPLES {
                write(run_series, &mut run)?;
                run_series = series;
            }
            run.push((ts, value.value()));
            moved += 1;
        }
        write(run_series, &mut run)?;
    }
    txn.delete_table(SAMPLES_BEFORE_CHUNKS)?;
    txn.commit()?;
    Ok(moved)
}

/// Moves the chunks of a store of the layout in one table apart: each series' last chunk into
/// `open_chunks`, the others into `sealed_chunks` (indexed in `chunk_index`), their bytes as
/// stored (format 1 stays readable), in one durable transaction (all moved, or none); returns
/// how many. Nothing to do for a store of this layout.
fn migrate_chunks(db: &Database) -> Result<u64, StoreError> {
    let mut txn = db.begin_write()?;
    let in_one_table = txn
        .list_tables()?
        .any(|table| table.name() == CHUNKS_IN_ONE_TABLE.name());
    if !in_one_table {
        return Ok(0);
    }
    txn.set_durability(Durability::Immediate)?;
    let mut moved = 0;
    {
        let old = txn.open_table(CHUNKS_IN_ONE_TABLE)?;
        let mut open = txn.open_table(OPEN_CHUNKS)?;
        let mut sealed = txn.open_table(SEALED_CHUNKS)?;
        let mut index = txn.open_table(CHUNK_INDEX)?;
        let mut seq = sealed.last()?.map_or(0, |(key, _)| key.value() + 1);
        let mut entries = old.iter()?.peekable();
        while let Some(entry) = entries.next() {
            let (key, bytes) = entry?;
            let (series, first) = key.value();
            let last = match entries.peek() {
                Some(Ok((next, _))) => next.value().0 != series,
                Some(Err(_)) => false,
                None => true,
            };
            if last {
                open.insert((series, first), bytes.value())?;
            } else {
                sealed.insert(seq, bytes.value())?;
                index.insert((series, first), seq)?;
                seq += 1;
            }
            moved += 1;
        }
    }
    txn.delete_table(CHUNKS_IN_ONE_TABLE)?;
    txn.commit()?;
    Ok(moved)
}

/// The chunks of one series that a write transaction loaded or created.
#[derive(Debug, Default)]
struct SeriesChunks {
    /// By key (their identity for the transaction).
    chunks: Vec<Chunk>,
    /// Whether the series' last stored chunk was looked up (and loaded) in this transaction:
    /// then no stored chunk has a key after the last of `chunks`. Set when a transaction first
    /// touches the series.
    head_known: bool,
}

/// The sample tables of a write transaction (see [`chunk::Place`]).
struct ChunkTables<'txn> {
    open: Table<'txn, (u64, i64), &'static [u8]>,
    sealed: Table<'txn, u64, &'static [u8]>,
    index: Table<'txn, (u64, i64), u64>,
    /// The number the next sealed chunk takes, once looked up in this transaction.
    next_sealed: Option<u64>,
}

impl ChunkTables<'_> {
    /// The number for a chunk sealed now: after every stored one.
    fn next_sealed(&mut self) -> Result<u64, StoreError> {
        let next = match self.next_sealed {
            Some(next) => next,
            None => self.sealed.last()?.map_or(0, |(key, _)| key.value() + 1),
        };
        self.next_sealed = Some(next + 1);
        Ok(next)
    }

    /// Stores the encoded chunk of series `id` starting at `first`: as its open chunk, or sealed
    /// after every sealed one.
    fn put(&mut self, id: u64, first: i64, bytes: &[u8], open: bool) -> Result<(), StoreError> {
        if open {
            self.open.insert((id, first), bytes)?;
        } else {
            let seq = self.next_sealed()?;
            self.sealed.insert(seq, bytes)?;
            self.index.insert((id, first), seq)?;
        }
        Ok(())
    }

    /// Sealed chunk `seq` of series `id` at `key`, into `series.chunks` at `at`; returns `at`.
    fn load_sealed(
        &self,
        series: &mut SeriesChunks,
        at: usize,
        id: u64,
        key: i64,
        seq: u64,
        spare: &mut Vec<Vec<(i64, f64)>>,
    ) -> Result<usize, StoreError> {
        let bytes = self
            .sealed
            .get(seq)?
            .ok_or(StoreError::CorruptChunk { series: id, key })?;
        series.load(at, id, key, Place::Sealed(seq), bytes.value(), spare)
    }
}

/// The chunks of the series a write transaction touched: in a list that a [`SeriesSlot`]
/// indexes, found by series id through `at` (entries are never removed while it runs).
#[derive(Default)]
struct ChunksTouched {
    /// Index in `list` by series id.
    at: foldhash::HashMap<u64, usize>,
    list: Vec<(u64, SeriesChunks)>,
}

impl ChunksTouched {
    /// The index in `list` of series `id`'s chunks: at its first touch, its last chunk taken
    /// from the store's cache when there.
    fn index(&mut self, heads: &mut foldhash::HashMap<u64, Chunk>, id: u64) -> usize {
        let list = &mut self.list;
        *self.at.entry(id).or_insert_with(|| {
            let series = match heads.remove(&id) {
                Some(head) => SeriesChunks {
                    chunks: vec![head],
                    head_known: true,
                },
                None => SeriesChunks::default(),
            };
            list.push((id, series));
            list.len() - 1
        })
    }
}

/// The chunks of series `id` in this transaction (see [`ChunksTouched::index`]).
fn series_chunks<'a>(
    chunks: &'a mut ChunksTouched,
    heads: &mut foldhash::HashMap<u64, Chunk>,
    id: u64,
) -> &'a mut SeriesChunks {
    let at = chunks.index(heads, id);
    &mut chunks.list[at].1
}

/// The live state of one (machine, series) that a write transaction read or changed.
struct LiveTouched {
    /// Index of the machine in the writer's `live_machines`.
    machine: u32,
    id: u64,
    /// `None`: not live (as the store holds it: a membership change is written at once).
    live: Option<LiveSeries>,
    /// Whether `live` is an update held back until the transaction commits.
    dirty: bool,
}

/// The live states a write transaction read or changed: in a list that a [`SeriesSlot`]
/// indexes, found by (machine index, series id) through `at` (entries are never removed while
/// it runs; a retired series' entry says it is not live).
#[derive(Default)]
struct LiveStates {
    at: foldhash::HashMap<(u32, u64), usize>,
    list: Vec<LiveTouched>,
}

/// Stores a sample in `series` (chunks of series `id`), see [`Writer::put_sample`].
fn put_into(
    series: &mut SeriesChunks,
    tables: &ChunkTables<'_>,
    id: u64,
    spare: &mut Vec<Vec<(i64, f64)>>,
    ts_ms: i64,
    value: f64,
) -> Result<Upsert, StoreError> {
    // The common case, what `covering` finds without a lookup: at or after the key of the
    // series' last chunk, known to be its last, which has room.
    if series.head_known
        && let Some(last) = series.chunks.last_mut()
        && last.key <= ts_ms
        && !last.full_for_append(ts_ms)
    {
        return Ok(last.put(ts_ms, value));
    }
    let at = match series.covering(tables, id, ts_ms, spare)? {
        // After the last sample of a full chunk: a new one starts there.
        Some(at) if series.chunks[at].full_for_append(ts_ms) => {
            let created = Chunk::created(ts_ms, spare.pop().unwrap_or_default());
            series.chunks.insert(at + 1, created);
            at + 1
        }
        Some(at) => at,
        // Before every chunk: the first one takes it (split when written back if it grew
        // too large), or the series' first chunk starts.
        None => match series.first(tables, id, spare)? {
            Some(first) => first,
            None => {
                let created = Chunk::created(ts_ms, spare.pop().unwrap_or_default());
                series.chunks.insert(0, created);
                0
            }
        },
    };
    Ok(series.chunks[at].put(ts_ms, value))
}

impl SeriesChunks {
    /// The series' last chunk as the store holds it once this transaction's changes are written
    /// back (see [`Writer::flush_chunks`]); `None` when that is not known.
    fn into_head(mut self) -> Option<Chunk> {
        if !self.head_known {
            return None;
        }
        let last = self.chunks.pop()?;
        if last.dirty {
            last.into_stored_last(Place::Open)
        } else {
            Some(last)
        }
    }

    /// Loads the stored chunk `key` (at `place`) into `chunks` at `at`; returns `at`.
    fn load(
        &mut self,
        at: usize,
        id: u64,
        key: i64,
        place: Place,
        bytes: &[u8],
        spare: &mut Vec<Vec<(i64, f64)>>,
    ) -> Result<usize, StoreError> {
        let chunk = Chunk::loaded(key, place, bytes, spare.pop().unwrap_or_default())
            .map_err(|_| StoreError::CorruptChunk { series: id, key })?;
        self.chunks.insert(at, chunk);
        Ok(at)
    }

    /// Loads the series' last chunk (its open one, else its last sealed one), the first time
    /// the transaction touches the series.
    fn touch(
        &mut self,
        tables: &ChunkTables<'_>,
        id: u64,
        spare: &mut Vec<Vec<(i64, f64)>>,
    ) -> Result<(), StoreError> {
        if self.head_known {
            return Ok(());
        }
        self.head_known = true;
        let at = self.chunks.len();
        if let Some(entry) = tables.open.range((id, i64::MIN)..=(id, i64::MAX))?.next() {
            let (key, bytes) = entry?;
            self.load(at, id, key.value().1, Place::Open, bytes.value(), spare)?;
        } else if let Some(entry) = tables
            .index
            .range((id, i64::MIN)..=(id, i64::MAX))?
            .next_back()
        {
            let (key, seq) = entry?;
            tables.load_sealed(self, at, id, key.value().1, seq.value(), spare)?;
        }
        Ok(())
    }

    /// The chunk covering `ts` (see [`chunk`]), loaded when needed; `None` when `ts` precedes
    /// every chunk.
    fn covering(
        &mut self,
        tables: &ChunkTables<'_>,
        id: u64,
        ts: i64,
        spare: &mut Vec<Vec<(i64, f64)>>,
    ) -> Result<Option<usize>, StoreError> {
        self.touch(tables, id, spare)?;
        let after = self.chunks.partition_point(|c| c.key <= ts);
        // At or after the last chunk's key: no stored chunk comes later.
        if after == self.chunks.len() && after > 0 {
            return Ok(Some(after - 1));
        }
        // Before the last chunk (the open one, when there is one, is loaded): a sealed one.
        if let Some(entry) = tables.index.range((id, i64::MIN)..=(id, ts))?.next_back() {
            let (key, seq) = entry?;
            let key = key.value().1;
            if after == 0 || self.chunks[after - 1].key < key {
                return tables
                    .load_sealed(self, after, id, key, seq.value(), spare)
                    .map(Some);
            }
        }
        if after > 0 {
            return Ok(Some(after - 1));
        }
        Ok(self
            .chunks
            .first()
            .is_some_and(|c| c.low <= ts)
            .then_some(0))
    }

    /// The series' first chunk, loaded when needed; `None` when it has none.
    fn first(
        &mut self,
        tables: &ChunkTables<'_>,
        id: u64,
        spare: &mut Vec<Vec<(i64, f64)>>,
    ) -> Result<Option<usize>, StoreError> {
        self.touch(tables, id, spare)?;
        if let Some(entry) = tables.index.range((id, i64::MIN)..=(id, i64::MAX))?.next() {
            let (key, seq) = entry?;
            let key = key.value().1;
            if self.chunks.first().is_none_or(|c| key < c.key) {
                return tables
                    .load_sealed(self, 0, id, key, seq.value(), spare)
                    .map(Some);
            }
        }
        Ok((!self.chunks.is_empty()).then_some(0))
    }

    /// The chunk after `chunks[at]`, loaded when needed.
    fn next(
        &mut self,
        tables: &ChunkTables<'_>,
        id: u64,
        at: usize,
        spare: &mut Vec<Vec<(i64, f64)>>,
    ) -> Result<Option<usize>, StoreError> {
        // `touch` ran: no stored chunk comes after the last one.
        let Some(next) = self.chunks.get(at + 1).map(|c| c.key) else {
            return Ok(None);
        };
        let after = self.chunks[at].key;
        let mut stored = tables.index.range((
            std::ops::Bound::Excluded((id, after)),
            std::ops::Bound::Excluded((id, next)),
        ))?;
        if let Some(entry) = stored.next() {
            let (key, seq) = entry?;
            return tables
                .load_sealed(self, at + 1, id, key.value().1, seq.value(), spare)
                .map(Some);
        }
        Ok(Some(at + 1))
    }

    /// The chunk before `chunks[at]`, loaded when needed.
    fn prev(
        &mut self,
        tables: &ChunkTables<'_>,
        id: u64,
        at: usize,
        spare: &mut Vec<Vec<(i64, f64)>>,
    ) -> Result<Option<usize>, StoreError> {
        let before = self.chunks[at].key;
        let pending = at.checked_sub(1).map(|i| self.chunks[i].key);
        if let Some(entry) = tables
            .index
            .range((id, i64::MIN)..(id, before))?
            .next_back()
        {
            let (key, seq) = entry?;
            let key = key.value().1;
            if pending.is_none_or(|p| key > p) {
                return tables
                    .load_sealed(self, at, id, key, seq.value(), spare)
                    .map(Some);
            }
        }
        Ok(at.checked_sub(1))
    }
}

/// A machine of one [`Writer`]'s live-series entries, from [`Writer::live_machine_of`]: good
/// for that writer only.
#[derive(Debug, Clone, Copy)]
pub struct LiveMachine<'m> {
    /// Its index in the writer's `live_machines`.
    index: u32,
    name: &'m str,
}

/// The tables of one open write transaction (see [`Store::write`]).
pub struct Writer<'txn> {
    series: Table<'txn, &'static str, u64>,
    series_by_id: Table<'txn, u64, &'static str>,
    live_series: Table<'txn, (&'static str, u64), &'static [u8]>,
    /// The tables of open and sealed chunks.
    samples: ChunkTables<'txn>,
    /// Chunks of samples loaded or created in this transaction, by series id; the changed ones
    /// are written back before it commits.
    chunks: ChunksTouched,
    /// The store's cached last chunks (see [`WriterCache::heads`]); a series' is taken into
    /// `chunks` when the transaction first touches it.
    heads: &'txn mut foldhash::HashMap<u64, Chunk>,
    /// Sample buffers to reuse for chunks loaded.
    spare: Vec<Vec<(i64, f64)>>,
    /// The encoding of the chunk being written back.
    encoded: Vec<u8>,
    dedup: Table<'txn, &'static [u8], &'static [u8]>,
    machines: Table<'txn, &'static str, &'static [u8]>,
    dead_letters: Table<'txn, u64, &'static [u8]>,
    outbox: Table<'txn, u64, &'static [u8]>,
    meta: Table<'txn, &'static str, u64>,
    config: &'txn StoreConfig,
    /// Series ids known: those committed (the store's cache) and those created in this
    /// transaction, which are also listed in `created` to be forgotten if it does not commit.
    series_ids: &'txn mut foldhash::HashMap<String, u64>,
    /// Keys of the series created in this transaction.
    created: &'txn mut Vec<String>,
    /// Live states read or changed in this transaction, by (index in `live_machines`, series
    /// id), with whether to write them back when it commits (membership changes are written at
    /// once; only updates wait).
    live: LiveStates,
    /// Machines of the entries of `live`.
    live_machines: Vec<String>,
    /// The index in `live_machines` that [`Writer::live_machine`] gave last.
    last_live_machine: u32,
}

impl Writer<'_> {
    fn next_id(&mut self, name: &str) -> Result<u64, StoreError> {
        let id = self.meta.get(name)?.map_or(1, |v| v.value());
        self.meta.insert(name, id + 1)?;
        Ok(id)
    }

    /// The id of a series, `None` when it was never written.
    pub fn series_id(&mut self, key: &str) -> Result<Option<u64>, StoreError> {
        if let Some(&id) = self.series_ids.get(key) {
            return Ok(Some(id));
        }
        let id = self.series.get(key)?.map(|v| v.value());
        if let Some(id) = id {
            self.series_ids.insert(key.to_owned(), id);
        }
        Ok(id)
    }

    /// The id of a series, created when new.
    pub fn series_id_or_create(&mut self, key: &str) -> Result<u64, StoreError> {
        if let Some(id) = self.series_id(key)? {
            return Ok(id);
        }
        let id = self.next_id(NEXT_SERIES)?;
        self.series.insert(key, id)?;
        self.series_by_id.insert(id, key)?;
        self.series_ids.insert(key.to_owned(), id);
        self.created.push(key.to_owned());
        Ok(id)
    }

    /// The value stored at (series, timestamp).
    pub fn sample(&mut self, id: u64, ts_ms: i64) -> Result<Option<f64>, StoreError> {
        let series = series_chunks(&mut self.chunks, self.heads, id);
        let at = series.covering(&self.samples, id, ts_ms, &mut self.spare)?;
        Ok(at.and_then(|at| series.chunks[at].get(ts_ms)))
    }

    /// The earliest sample of a series with `from_ms <= ts < to_ms`.
    pub fn first_sample_in(
        &mut self,
        id: u64,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<Option<(i64, f64)>, StoreError> {
        if from_ms >= to_ms {
            return Ok(None);
        }
        let series = series_chunks(&mut self.chunks, self.heads, id);
        let mut at = match series.covering(&self.samples, id, from_ms, &mut self.spare)? {
            Some(at) => Some(at),
            None => series.first(&self.samples, id, &mut self.spare)?,
        };
        while let Some(i) = at {
            let chunk = &series.chunks[i];
            if chunk.low >= to_ms {
                return Ok(None);
            }
            let found = chunk.samples.partition_point(|s| s.0 < from_ms);
            if let Some(&(ts, value)) = chunk.samples.get(found) {
                return Ok((ts < to_ms).then_some((ts, value)));
            }
            at = series.next(&self.samples, id, i, &mut self.spare)?;
        }
        Ok(None)
    }

    /// The latest sample of a series, `None` when it has none.
    pub fn last_sample(&mut self, id: u64) -> Result<Option<(i64, f64)>, StoreError> {
        let series = series_chunks(&mut self.chunks, self.heads, id);
        series.touch(&self.samples, id, &mut self.spare)?;
        let mut at = series.chunks.len().checked_sub(1);
        while let Some(i) = at {
            if let Some(&last) = series.chunks[i].samples.last() {
                return Ok(Some(last));
            }
            at = series.prev(&self.samples, id, i, &mut self.spare)?;
        }
        Ok(None)
    }

    /// Stores a sample unless the series holds one at that time: [`Upsert::New`], or
    /// [`Upsert::Identical`] (a no-op), or [`Upsert::Conflict`] (the stored value is kept).
    pub fn put_sample(&mut self, id: u64, ts_ms: i64, value: f64) -> Result<Upsert, StoreError> {
        let series = series_chunks(&mut self.chunks, self.heads, id);
        put_into(series, &self.samples, id, &mut self.spare, ts_ms, value)
    }

    /// Series `id` for `machine` in this writer: its chunks and its live state found once, for
    /// [`Writer::put_sample_at`], [`Writer::live_at`] and [`Writer::set_live_at`] (no lookup
    /// per sample).
    pub fn series_slot(
        &mut self,
        machine: LiveMachine<'_>,
        id: u64,
    ) -> Result<SeriesSlot, StoreError> {
        let chunks = self.chunks.index(self.heads, id);
        let live = self.live_index(machine, id)?;
        Ok(SeriesSlot { chunks, live })
    }

    /// [`Writer::put_sample`] of the series of `slot`.
    pub fn put_sample_at(
        &mut self,
        slot: SeriesSlot,
        ts_ms: i64,
        value: f64,
    ) -> Result<Upsert, StoreError> {
        let (id, series) = &mut self.chunks.list[slot.chunks];
        put_into(series, &self.samples, *id, &mut self.spare, ts_ms, value)
    }

    /// Removes a sample written in this transaction (an event refused after part of it was
    /// written).
    pub fn remove_sample(&mut self, id: u64, ts_ms: i64) -> Result<(), StoreError> {
        let series = series_chunks(&mut self.chunks, self.heads, id);
        if let Some(at) = series.covering(&self.samples, id, ts_ms, &mut self.spare)? {
            series.chunks[at].remove(ts_ms);
        }
        Ok(())
    }

    /// Writes back the chunks changed in this transaction, each under its first sample's time
    /// (split when it grew too large, removed when emptied): a series' last chunk (its last part)
    /// to `open_chunks`, replacing its open chunk there; any other changed chunk, and an open
    /// chunk that is no longer the last, sealed at the end of `sealed_chunks`.
    fn flush_chunks(&mut self) -> Result<(), StoreError> {
        // In key order: neighbouring writes land in the same B-tree pages.
        let mut order: Vec<usize> = (0..self.chunks.list.len()).collect();
        let list = &mut self.chunks.list;
        order.sort_unstable_by_key(|&at| list[at].0);
        let Self {
            samples: tables,
            encoded,
            ..
        } = self;
        for at in order {
            let (id, series) = &mut list[at];
            let id = *id;
            // `touch` loaded the stored last chunk, so the last of `chunks` is the series' last.
            let last = series
                .head_known
                .then(|| series.chunks.len().checked_sub(1))
                .flatten();
            for (at, chunk) in series.chunks.iter_mut().enumerate() {
                let is_last = Some(at) == last;
                let moves = chunk.stored == Some(Place::Open) && !is_last;
                if !chunk.dirty && !moves {
                    continue;
                }
                let parts = chunk.parts().count();
                let first = chunk.samples.first().map(|s| s.0);
                // An open chunk that stays open under its key is overwritten in place.
                let in_place = is_last && parts == 1 && first == Some(chunk.key);
                match chunk.stored {
                    Some(Place::Sealed(seq)) => {
                        tables.index.remove((id, chunk.key))?;
                        tables.sealed.remove(seq)?;
                    }
                    Some(Place::Open) if !in_place => {
                        tables.open.remove((id, chunk.key))?;
                    }
                    _ => {}
                }
                if let (1, Some(first)) = (parts, first) {
                    // The common case: one run, encoded from where its last write-back ended.
                    encoded.clear();
                    chunk.encode_into(encoded);
                    tables.put(id, first, encoded, is_last)?;
                    continue;
                }
                for (n, part) in chunk.parts().enumerate() {
                    let Some(&(first, _)) = part.first() else {
                        continue;
                    };
                    encoded.clear();
                    chunk::encode(part, encoded);
                    tables.put(id, first, encoded, is_last && n + 1 == parts)?;
                }
            }
        }
        Ok(())
    }

    /// The live state of a machine's series; `None` when it is not live (never admitted, or
    /// retired).
    pub fn live(&mut self, machine: &str, id: u64) -> Result<Option<LiveSeries>, StoreError> {
        let machine = self.live_machine_of(machine);
        self.live_in(machine, id)
    }

    /// `machine` for [`Writer::live_in`] and [`Writer::set_live_in`]: its entries of this
    /// transaction found without comparing its name again (once per event, not per sample).
    pub fn live_machine_of<'m>(&mut self, machine: &'m str) -> LiveMachine<'m> {
        LiveMachine {
            index: self.live_machine(machine),
            name: machine,
        }
    }

    /// [`Writer::live`] of a machine this writer gave.
    pub fn live_in(
        &mut self,
        machine: LiveMachine<'_>,
        id: u64,
    ) -> Result<Option<LiveSeries>, StoreError> {
        let at = self.live_index(machine, id)?;
        Ok(self.live.list[at].live)
    }

    /// The live state of the series of `slot` (see [`Writer::live_in`]).
    pub fn live_at(&self, slot: SeriesSlot) -> Option<LiveSeries> {
        self.live.list[slot.live].live
    }

    /// The index in `live.list` of (`machine`, `id`), read from the store the first time.
    fn live_index(&mut self, machine: LiveMachine<'_>, id: u64) -> Result<usize, StoreError> {
        debug_assert_eq!(self.live_machines[machine.index as usize], machine.name);
        let key = (machine.index, id);
        if let Some(&at) = self.live.at.get(&key) {
            return Ok(at);
        }
        let live = self
            .live_series
            .get((machine.name, id))?
            .and_then(|v| LiveSeries::decode(v.value()));
        self.live.list.push(LiveTouched {
            machine: machine.index,
            id,
            live,
            dirty: false,
        });
        let at = self.live.list.len() - 1;
        self.live.at.insert(key, at);
        Ok(at)
    }

    /// Admits a series to its machine's live set (or updates it when it is live).
    pub fn set_live(&mut self, machine: &str, id: u64, live: LiveSeries) -> Result<(), StoreError> {
        let machine = self.live_machine_of(machine);
        self.set_live_in(machine, id, live)
    }

    /// [`Writer::set_live`] of a machine this writer gave.
    pub fn set_live_in(
        &mut self,
        machine: LiveMachine<'_>,
        id: u64,
        live: LiveSeries,
    ) -> Result<(), StoreError> {
        let at = self.live_index(machine, id)?;
        self.set_live_entry(at, live)
    }

    /// [`Writer::set_live`] of the series of `slot`.
    pub fn set_live_at(&mut self, slot: SeriesSlot, live: LiveSeries) -> Result<(), StoreError> {
        self.set_live_entry(slot.live, live)
    }

    /// Sets the live state at `at` in `live.list`: an update of a live series is held back until
    /// the transaction commits; an admission is written at once.
    fn set_live_entry(&mut self, at: usize, live: LiveSeries) -> Result<(), StoreError> {
        let entry = &mut self.live.list[at];
        if entry.live.is_none() {
            let machine = self.live_machines[entry.machine as usize].as_str();
            self.live_series
                .insert((machine, entry.id), live.encode().as_slice())?;
        } else {
            entry.dirty = true;
        }
        entry.live = Some(live);
        Ok(())
    }

    /// The index of `machine` in `live_machines`, added when new (the machine of the previous
    /// call first: a batch's series are all its machine's, so the list is searched once per
    /// batch, not once per sample).
    fn live_machine(&mut self, machine: &str) -> u32 {
        let last = self.last_live_machine as usize;
        let index = match self.live_machines.get(last) {
            Some(m) if m.as_str() == machine => last,
            _ => {
                let found = self
                    .live_machines
                    .iter()
                    .rposition(|m| m.as_str() == machine);
                found.unwrap_or_else(|| {
                    self.live_machines.push(machine.to_owned());
                    self.live_machines.len() - 1
                })
            }
        };
        let index = u32::try_from(index).unwrap_or(u32::MAX);
        self.last_live_machine = index;
        index
    }

    /// How many series of `machine` are live.
    pub fn live_count(&self, machine: &str) -> Result<u64, StoreError> {
        let mut count = 0;
        for entry in self.live_series.range((machine, 0)..=(machine, u64::MAX))? {
            entry?;
            count += 1;
        }
        Ok(count)
    }

    /// Retires every live series of `machine` last written before `cutoff_ms` (its samples
    /// stay); returns how many.
    pub fn retire_before(&mut self, machine: &str, cutoff_ms: i64) -> Result<u64, StoreError> {
        let mut stale = Vec::new();
        let index = self.live_machine(machine);
        for entry in self.live_series.range((machine, 0)..=(machine, u64::MAX))? {
            let (key, value) = entry?;
            let id = key.value().1;
            let held = self
                .live
                .at
                .get(&(index, id))
                .and_then(|&at| self.live.list[at].live);
            let last_ms = match held {
                Some(live) => live.last_ms,
                None => LiveSeries::decode(value.value()).map_or(i64::MIN, |l| l.last_ms),
            };
            if last_ms < cutoff_ms {
                stale.push(id);
            }
        }
        for id in &stale {
            self.live_series.remove((machine, *id))?;
            if let Some(&at) = self.live.at.get(&(index, *id)) {
                self.live.list[at].live = None;
                self.live.list[at].dirty = false;
            }
        }
        Ok(stale.len() as u64)
    }

    /// Writes the live-series updates held back during the transaction.
    fn flush_live(&mut self) -> Result<(), StoreError> {
        for entry in &self.live.list {
            if let (true, Some(live)) = (entry.dirty, entry.live) {
                let machine = self.live_machines[entry.machine as usize].as_str();
                self.live_series
                    .insert((machine, entry.id), live.encode().as_slice())?;
            }
        }
        Ok(())
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
impl Writer<'_> {
    /// Overwrites every open chunk with bytes no chunk decodes from: for tests of the paths that
    /// must stop on a corrupt chunk (the writer's cache of last chunks is the file's only after
    /// the store is reopened).
    pub(crate) fn corrupt_open_chunks(&mut self) -> Result<(), StoreError> {
        let keys: Vec<(u64, i64)> = self
            .samples
            .open
            .iter()?
            .map(|entry| entry.map(|(key, _)| key.value()))
            .collect::<Result<_, _>>()?;
        for key in keys {
            self.samples.open.insert(key, [9u8, 9, 9].as_slice())?;
        }
        Ok(())
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
                let id = w.series_id_or_create("x{machine_id=\"m\"}")?;
                Ok([
                    w.put_sample(id, 10, 1.0)?,
                    w.put_sample(id, 10, 1.0)?,
                    w.put_sample(id, 10, 2.0)?,
                ])
            })
            .unwrap();
        assert_eq!(outcomes, [Upsert::New, Upsert::Identical, Upsert::Conflict]);
        let series = store.query("x", 0, 100).unwrap();
        assert_eq!(series.len(), 1);
        assert_eq!(series[0].samples, vec![(10, 1.0)]);
    }

    #[test]
    fn a_retired_series_leaves_the_live_set_and_keeps_its_samples() {
        let (_dir, store) = store();
        store
            .write(|w| {
                for (key, last) in [("a{}", 10), ("b{}", 20), ("c{}", 30)] {
                    let id = w.series_id_or_create(key)?;
                    w.put_sample(id, last, 1.0)?;
                    w.set_live("m", id, LiveSeries::new(last))?;
                }
                let other = w.series_id_or_create("d{}")?;
                w.set_live("n", other, LiveSeries::new(0))?;
                assert_eq!(w.live_count("m")?, 3);
                // An update held back in this transaction counts for retirement.
                let b = w.series_id("b{}")?.unwrap();
                w.set_live("m", b, LiveSeries::new(40))?;
                assert_eq!(w.retire_before("m", 25)?, 1);
                assert_eq!(w.live_count("m")?, 2);
                assert_eq!(w.live_count("n")?, 1);
                Ok(())
            })
            .unwrap();
        store
            .write(|w| {
                let (a, b) = (w.series_id("a{}")?.unwrap(), w.series_id("b{}")?.unwrap());
                assert_eq!(w.live("m", a)?, None);
                assert_eq!(
                    w.live("m", b)?.unwrap().last_ms,
                    40,
                    "written back at commit"
                );
                Ok(())
            })
            .unwrap();
        assert_eq!(
            store.query("a", 0, 100).unwrap()[0].samples,
            vec![(10, 1.0)]
        );
    }

    #[test]
    fn a_series_slot_sees_what_the_keyed_calls_see_through_retirement_and_readmission() {
        let (_dir, store) = store();
        store
            .write(|w| {
                let id = w.series_id_or_create("a{}")?;
                let machine = w.live_machine_of("m");
                let slot = w.series_slot(machine, id)?;
                assert_eq!(w.live_at(slot), None, "never admitted");
                assert_eq!(w.put_sample_at(slot, 10, 1.0)?, Upsert::New);
                assert_eq!(
                    w.put_sample(id, 10, 2.0)?,
                    Upsert::Conflict,
                    "one chunk list"
                );
                w.set_live_at(slot, LiveSeries::new(10))?;
                assert_eq!(w.live_count("m")?, 1, "an admission is written at once");
                w.set_live_in(machine, id, LiveSeries::new(20))?;
                assert_eq!(w.live_at(slot).map(|l| l.last_ms), Some(20));
                assert_eq!(w.retire_before("m", 30)?, 1);
                assert_eq!(w.live_at(slot), None, "retired");
                assert_eq!(w.live("m", id)?, None);
                assert_eq!(w.live_count("m")?, 0);
                w.set_live_at(slot, LiveSeries::new(40))?;
                assert_eq!(w.live_count("m")?, 1, "readmitted at once");
                w.set_live_at(slot, LiveSeries::new(50))?;
                assert_eq!(w.put_sample_at(slot, 50, 3.0)?, Upsert::New);
                Ok(())
            })
            .unwrap();
        store
            .write(|w| {
                let id = w.series_id("a{}")?.unwrap();
                assert_eq!(
                    w.live("m", id)?.map(|l| l.last_ms),
                    Some(50),
                    "held back, written"
                );
                Ok(())
            })
            .unwrap();
        assert_eq!(
            store.query("a", 0, 100).unwrap()[0].samples,
            vec![(10, 1.0), (50, 3.0)]
        );
    }

    #[test]
    fn a_failed_transaction_leaves_nothing_behind() {
        let (_dir, store) = store();
        let result: Result<(), StoreError> = store.write(|w| {
            let id = w.series_id_or_create("a{}")?;
            w.put_sample(id, 1, 1.0)?;
            w.set_live("m", id, LiveSeries::new(1))?;
            Err(StoreError::Storage(redb::Error::Corrupted("test".into())))
        });
        assert!(result.is_err());
        assert_eq!(store.sample_count().unwrap(), 0);
        store
            .write(|w| {
                assert_eq!(w.series_id("a{}")?, None);
                assert_eq!(w.live_count("m")?, 0);
                Ok(())
            })
            .unwrap();
    }

    #[test]
    fn series_ids_kept_between_transactions_match_the_store_and_a_failed_one_leaves_none() {
        let (dir, store) = store();
        let a = store.write(|w| w.series_id_or_create("a{}")).unwrap();
        // A failed transaction's new series (and its id) do not exist afterwards, in the cache
        // either: the next transaction creates it again, with the id the store then gives.
        let failed: Result<(), StoreError> = store.write(|w| {
            assert_eq!(w.series_id("a{}")?, Some(a));
            w.series_id_or_create("b{}")?;
            Err(StoreError::Storage(redb::Error::Corrupted("test".into())))
        });
        assert!(failed.is_err());
        let b = store
            .write(|w| {
                assert_eq!(w.series_id("b{}")?, None);
                w.series_id_or_create("b{}")
            })
            .unwrap();
        drop(store);
        let reopened = Store::open_path(&dir.path().join("store.redb")).unwrap();
        reopened
            .write(|w| {
                assert_eq!(
                    (w.series_id("a{}")?, w.series_id("b{}")?),
                    (Some(a), Some(b))
                );
                Ok(())
            })
            .unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn a_transaction_that_panicked_leaves_no_series_id_behind() {
        let (_dir, store) = store();
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            store.write(|w| -> Result<(), StoreError> {
                w.series_id_or_create("a{}")?;
                panic!("a bug in the ingest path");
            })
        }));
        assert!(panicked.is_err());
        for ts in [1, 2] {
            store
                .write(|w| {
                    let id = w.series_id_or_create("a{}")?;
                    w.put_sample(id, ts, 1.0)?;
                    Ok(())
                })
                .unwrap();
        }
        assert_eq!(
            store.query("a", 0, 10).unwrap()[0].samples,
            vec![(1, 1.0), (2, 1.0)]
        );
    }

    #[test]
    fn machine_states_of_stores_from_before_the_series_lifecycle_and_the_fleet_series_still_read() {
        let state = MachineState {
            reconnect_ns: 1,
            last_arrival_ns: 2,
            safety_received: 3,
            safety_fresh: 4,
            last_gateway_ts_ms: 5,
            newest_event_ms: 6,
            refusal_series: 7,
            last_fleet_ts_ms: 8,
            last_event_ms: 9,
            status: MachineState::STATUS_OFFLINE,
            status_ts_ms: 11,
            arrival_series_ms: 12,
        };
        assert_eq!(MachineState::decode(&state.encode()), Some(state));
        let old = MachineState::decode(&state.encode()[..40]).unwrap();
        assert_eq!((old.safety_fresh, old.newest_event_ms), (4, 0));
        let before_fleet = MachineState::decode(&state.encode()[..56]).unwrap();
        assert_eq!(before_fleet.refusal_series, 7);
        assert_eq!(
            (before_fleet.last_event_ms, before_fleet.status),
            (0, MachineState::STATUS_NONE)
        );
        assert_eq!(MachineState::decode(&state.encode()[..60]), None);
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

    /// Writes a store of the format before chunks: series and their samples one entry each.
    fn write_store_before_chunks(path: &Path, series: &[(&str, Vec<(i64, f64)>)]) {
        let db = Database::create(path).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut keys = txn.open_table(SERIES).unwrap();
            let mut by_id = txn.open_table(SERIES_BY_ID).unwrap();
            let mut samples = txn.open_table(SAMPLES_BEFORE_CHUNKS).unwrap();
            let mut meta = txn.open_table(META).unwrap();
            for (id, (key, points)) in (1u64..).zip(series) {
                keys.insert(*key, id).unwrap();
                by_id.insert(id, *key).unwrap();
                for &(ts, value) in points {
                    samples.insert((id, ts), value).unwrap();
                }
                meta.insert(NEXT_SERIES, id + 1).unwrap();
            }
        }
        txn.commit().unwrap();
    }

    /// Every stored chunk, as (series, key, place, format byte, samples), in key order per series
    /// (sealed ones first, then the open one).
    type StoredChunk = (u64, i64, Place, u8, Vec<(i64, f64)>);

    fn stored_chunks(path: &Path) -> Vec<StoredChunk> {
        let db = Database::builder().open_read_only(path).unwrap();
        let txn = db.begin_read().unwrap();
        let open = txn.open_table(OPEN_CHUNKS).unwrap();
        let sealed = txn.open_table(SEALED_CHUNKS).unwrap();
        let index = txn.open_table(CHUNK_INDEX).unwrap();
        let mut out = Vec::new();
        let mut indexed = std::collections::BTreeSet::new();
        for entry in index.iter().unwrap() {
            let (key, seq) = entry.unwrap();
            let (series, first) = key.value();
            assert!(indexed.insert(seq.value()), "a sealed chunk indexed twice");
            let bytes = sealed
                .get(seq.value())
                .unwrap()
                .expect("indexed chunks exist");
            let bytes = bytes.value();
            let samples = chunk::decode(bytes).unwrap().collect();
            out.push((series, first, Place::Sealed(seq.value()), bytes[0], samples));
        }
        assert_eq!(
            sealed.len().unwrap(),
            indexed.len() as u64,
            "every sealed chunk is indexed"
        );
        for entry in open.iter().unwrap() {
            let (key, bytes) = entry.unwrap();
            let (series, first) = key.value();
            let bytes = bytes.value();
            let samples = chunk::decode(bytes).unwrap().collect();
            out.push((series, first, Place::Open, bytes[0], samples));
        }
        // Stable: per series its sealed chunks by key, then its open one.
        out.sort_by_key(|c| c.0);
        out
    }

    /// Every stored chunk holds the invariants of `chunk`: keyed by its first sample, not empty,
    /// in order, within the size bound, not overlapping the next chunk of its series; a series
    /// has at most one open chunk, after all its sealed ones.
    fn assert_chunks_hold_their_invariants(path: &Path) {
        let mut previous: Option<(u64, i64, Place)> = None;
        for (series, first, place, _, samples) in stored_chunks(path) {
            assert!(!samples.is_empty() && samples.len() <= chunk::MAX_SAMPLES);
            assert_eq!(samples[0].0, first, "keyed by its first sample");
            assert!(samples.windows(2).all(|w| w[0].0 < w[1].0));
            if let Some((prev_series, prev_last, prev_place)) = previous
                && prev_series == series
            {
                assert!(prev_last < first, "chunks of series {series} overlap");
                assert_ne!(
                    prev_place,
                    Place::Open,
                    "series {series}: the open chunk is last"
                );
            }
            previous = Some((series, samples[samples.len() - 1].0, place));
        }
    }

    #[test]
    fn a_store_of_the_format_before_chunks_reads_back_every_sample_after_the_upgrade() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.redb");
        let a: Vec<(i64, f64)> = (0..300).map(|i| (i * 10, i as f64)).collect();
        let b: Vec<(i64, f64)> = vec![(-5, f64::NAN), (7, 2.5)];
        write_store_before_chunks(&path, &[("a{m=\"1\"}", a.clone()), ("b{}", b.clone())]);

        // Before any writer opened it, a read-only opener reads the old table.
        let reader = Store::open_read_only(&path).unwrap();
        assert_eq!(reader.query("a", i64::MIN, i64::MAX).unwrap()[0].samples, a);
        assert_eq!(reader.sample_count().unwrap(), 302);
        drop(reader);

        let store = Store::open_path(&path).unwrap();
        assert_eq!(store.query("a", i64::MIN, i64::MAX).unwrap()[0].samples, a);
        let read_b = &store.query("b", i64::MIN, i64::MAX).unwrap()[0].samples;
        assert_eq!(
            (read_b[0].0, read_b[0].1.is_nan(), read_b[1]),
            (-5, true, (7, 2.5))
        );
        assert_eq!(store.sample_count().unwrap(), 302);
        assert_eq!(
            store.query_latest("a", 0, 1234, None).unwrap()[0].samples,
            vec![(1230, 123.0)]
        );
        // The writer carries on where the old store left off: conflicts are still refused.
        store
            .write(|w| {
                let id = w.series_id("a{m=\"1\"}")?.unwrap();
                assert_eq!(w.put_sample(id, 100, 99.0)?, Upsert::Conflict);
                assert_eq!(w.put_sample(id, 100, 10.0)?, Upsert::Identical);
                assert_eq!(w.put_sample(id, 5, 0.5)?, Upsert::New);
                assert_eq!(w.series_id_or_create("c{}")?, 3, "series ids continue");
                Ok(())
            })
            .unwrap();
        drop(store);
        assert_chunks_hold_their_invariants(&path);
        let db = Database::builder().open_read_only(&path).unwrap();
        let txn = db.begin_read().unwrap();
        assert!(
            txn.list_tables()
                .unwrap()
                .all(|t| t.name() != SAMPLES_BEFORE_CHUNKS.name()),
            "the old table is gone"
        );
        drop(txn);
        drop(db);
        let reopened = Store::open_read_only(&path).unwrap();
        assert_eq!(reopened.sample_count().unwrap(), 303);
    }

    /// A series key and its chunks' samples.
    type SeriesInChunks<'a> = (&'a str, Vec<&'a [(i64, f64)]>);

    /// Writes a store of the layout with every chunk in one table (`sample_chunks`), as the
    /// store wrote it before open and sealed chunks were kept apart: `chunks` per series key, each
    /// encoded by `encode`.
    fn write_store_in_one_table(
        path: &Path,
        series: &[SeriesInChunks<'_>],
        encode: fn(&[(i64, f64)], &mut Vec<u8>),
    ) {
        let db = Database::builder().create(path).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut keys = txn.open_table(SERIES).unwrap();
            let mut by_id = txn.open_table(SERIES_BY_ID).unwrap();
            let mut chunks = txn.open_table(CHUNKS_IN_ONE_TABLE).unwrap();
            let mut meta = txn.open_table(META).unwrap();
            for (id, (key, parts)) in (1u64..).zip(series) {
                keys.insert(*key, id).unwrap();
                by_id.insert(id, *key).unwrap();
                for part in parts {
                    let mut bytes = Vec::new();
                    encode(part, &mut bytes);
                    chunks.insert((id, part[0].0), bytes.as_slice()).unwrap();
                }
                meta.insert(NEXT_SERIES, id + 1).unwrap();
            }
        }
        txn.commit().unwrap();
    }

    #[test]
    fn a_store_of_plain_chunks_reads_back_and_rewrites_the_chunks_it_changes_compactly() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plain.redb");
        // Two chunks of series 1 and one of series 2, in format 1, as the store before the
        // compact encoding wrote them.
        let a1: Vec<(i64, f64)> = (0..128).map(|i| (i * 10, i as f64)).collect();
        let a2: Vec<(i64, f64)> = (128..200).map(|i| (i * 10, i as f64)).collect();
        let b: Vec<(i64, f64)> = vec![(-5, f64::NAN), (7, 2.5)];
        write_store_in_one_table(
            &path,
            &[("a{}", vec![&a1, &a2]), ("b{}", vec![&b])],
            chunk::encode_plain,
        );
        let all: Vec<(i64, f64)> = a1.iter().chain(&a2).copied().collect();
        let store = Store::open_path(&path).unwrap();
        assert_eq!(
            store.query("a", i64::MIN, i64::MAX).unwrap()[0].samples,
            all
        );
        assert_eq!(store.sample_count().unwrap(), 202);
        assert_eq!(
            store.query_latest("a", 0, 1234, None).unwrap()[0].samples,
            vec![(1230, 123.0)]
        );
        store
            .write(|w| {
                assert_eq!(w.put_sample(1, 100, 99.0)?, Upsert::Conflict);
                assert_eq!(w.put_sample(1, 1990, 199.0)?, Upsert::Identical);
                assert_eq!(w.put_sample(1, 2000, 200.0)?, Upsert::New);
                Ok(())
            })
            .unwrap();
        drop(store);
        assert_chunks_hold_their_invariants(&path);
        let formats: Vec<(u64, i64, Place, u8)> = stored_chunks(&path)
            .into_iter()
            .map(|(series, key, place, format, _)| (series, key, place, format))
            .collect();
        assert_eq!(
            formats,
            vec![
                (1, 0, Place::Sealed(0), 1),
                (1, 1280, Place::Open, 2),
                (2, -5, Place::Open, 1)
            ],
            "only the chunk that changed is rewritten, in format 2"
        );
        let reopened = Store::open_read_only(&path).unwrap();
        let mut expected = all;
        expected.push((2000, 200.0));
        assert_eq!(
            reopened.query("a", i64::MIN, i64::MAX).unwrap()[0].samples,
            expected
        );
        let read_b = &reopened.query("b", i64::MIN, i64::MAX).unwrap()[0].samples;
        assert_eq!(
            (read_b[0].0, read_b[0].1.is_nan(), read_b[1]),
            (-5, true, (7, 2.5))
        );
    }

    #[test]
    fn a_store_with_every_chunk_in_one_table_reads_back_every_sample_and_series_after_the_upgrade()
    {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("one-table.redb");
        // Series 1 with three full chunks and an open one, series 2 with one chunk, series 3 with
        // two full ones: compact chunks, as the layout in one table wrote them.
        let a: Vec<(i64, f64)> = (0..450).map(|i| (i * 10, (i * 250) as f64)).collect();
        let b: Vec<(i64, f64)> = vec![(-5, f64::NAN), (7, 2.5)];
        let c: Vec<(i64, f64)> = (0..256).map(|i| (1_000 + i, 0.37 * i as f64)).collect();
        let chunks_of = |samples: &[(i64, f64)]| -> Vec<Vec<(i64, f64)>> {
            samples
                .chunks(chunk::MAX_SAMPLES)
                .map(<[_]>::to_vec)
                .collect()
        };
        let (a_chunks, c_chunks) = (chunks_of(&a), chunks_of(&c));
        let keys = ["a{m=\"1\"}", "b{}", "c{m=\"2\"}"];
        write_store_in_one_table(
            &path,
            &[
                (keys[0], a_chunks.iter().map(Vec::as_slice).collect()),
                (keys[1], vec![&b]),
                (keys[2], c_chunks.iter().map(Vec::as_slice).collect()),
            ],
            chunk::encode,
        );
        let bits = |samples: &[(i64, f64)]| -> Vec<(i64, u64)> {
            samples.iter().map(|&(t, v)| (t, v.to_bits())).collect()
        };
        let check = |store: &Store| {
            for (metric, samples) in [("a", &a), ("b", &b), ("c", &c)] {
                let read = store.query(metric, i64::MIN, i64::MAX).unwrap();
                assert_eq!(read.len(), 1, "{metric}");
                assert_eq!(bits(&read[0].samples), bits(samples), "{metric}");
                let latest = store
                    .query_latest(metric, i64::MIN, i64::MAX, None)
                    .unwrap();
                assert_eq!(
                    bits(&latest[0].samples),
                    bits(&samples[samples.len() - 1..])
                );
            }
            assert_eq!(
                store.query("a", 1275, 1295).unwrap()[0].samples,
                vec![(1280, 32_000.0), (1290, 32_250.0)],
                "a window across two chunks"
            );
            assert_eq!(store.metrics().unwrap(), vec!["a", "b", "c"]);
            assert_eq!(store.sample_count().unwrap(), 450 + 2 + 256);
        };
        // Before any writer opened it, a read-only opener reads the table as it is.
        check(&Store::open_read_only(&path).unwrap());
        let store = Store::open_path(&path).unwrap();
        check(&store);
        store
            .write(|w| {
                for (id, key) in (1u64..).zip(keys) {
                    assert_eq!(w.series_id(key)?, Some(id), "series keep their ids");
                }
                assert_eq!(w.put_sample(1, 100, 1.0)?, Upsert::Conflict);
                assert_eq!(w.put_sample(1, 100, 2_500.0)?, Upsert::Identical);
                assert_eq!(w.last_sample(3)?, Some((1_255, 0.37 * 255.0)));
                Ok(())
            })
            .unwrap();
        check(&store);
        drop(store);
        assert_chunks_hold_their_invariants(&path);
        let places: Vec<(u64, i64, Place)> = stored_chunks(&path)
            .into_iter()
            .map(|(series, key, place, _, _)| (series, key, place))
            .collect();
        assert_eq!(
            places,
            vec![
                (1, 0, Place::Sealed(0)),
                (1, 1280, Place::Sealed(1)),
                (1, 2560, Place::Sealed(2)),
                (1, 3840, Place::Open),
                (2, -5, Place::Open),
                (3, 1000, Place::Sealed(3)),
                (3, 1128, Place::Open),
            ],
            "each series' last chunk open, the others sealed"
        );
        let db = Database::builder().open_read_only(&path).unwrap();
        let txn = db.begin_read().unwrap();
        assert!(
            txn.list_tables()
                .unwrap()
                .all(|t| t.name() != CHUNKS_IN_ONE_TABLE.name()),
            "the table of the old layout is gone"
        );
        drop((txn, db));
        check(&Store::open_read_only(&path).unwrap());
    }

    /// redb's file backend, counting the bytes written through it.
    #[derive(Debug)]
    struct CountingBackend {
        inner: redb::backends::FileBackend,
        written: std::sync::Arc<std::sync::atomic::AtomicU64>,
    }

    impl redb::StorageBackend for CountingBackend {
        fn len(&self) -> Result<u64, std::io::Error> {
            self.inner.len()
        }
        fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
            self.inner.read(offset, out)
        }
        fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
            self.inner.set_len(len)
        }
        fn sync_data(&self) -> Result<(), std::io::Error> {
            self.inner.sync_data()
        }
        fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
            self.written
                .fetch_add(data.len() as u64, std::sync::atomic::Ordering::Relaxed);
            self.inner.write(offset, data)
        }
        fn close(&self) -> Result<(), std::io::Error> {
            self.inner.close()
        }
        fn try_lock_range(
            &self,
            start: std::ops::Bound<u64>,
            end: std::ops::Bound<u64>,
        ) -> Result<bool, redb::BackendError> {
            self.inner.try_lock_range(start, end)
        }
        fn try_lock_shared_range(
            &self,
            start: std::ops::Bound<u64>,
            end: std::ops::Bound<u64>,
        ) -> Result<bool, redb::BackendError> {
            self.inner.try_lock_shared_range(start, end)
        }
        fn lock_range(
            &self,
            start: std::ops::Bound<u64>,
            end: std::ops::Bound<u64>,
        ) -> Result<(), redb::BackendError> {
            self.inner.lock_range(start, end)
        }
        fn lock_shared_range(
            &self,
            start: std::ops::Bound<u64>,
            end: std::ops::Bound<u64>,
        ) -> Result<(), redb::BackendError> {
            self.inner.lock_shared_range(start, end)
        }
        fn unlock_range(
            &self,
            start: std::ops::Bound<u64>,
            end: std::ops::Bound<u64>,
        ) -> Result<(), redb::BackendError> {
            self.inner.unlock_range(start, end)
        }
        fn query_lock_range(
            &self,
            start: std::ops::Bound<u64>,
            end: std::ops::Bound<u64>,
        ) -> Result<bool, redb::BackendError> {
            self.inner.query_lock_range(start, end)
        }
    }

    #[test]
    fn a_group_appending_to_every_series_rewrites_their_open_chunks_not_the_chunks_before_them() {
        // 400 series of a deadline counter every 10 s with 8 chunks of history each, then groups
        // appending 20 samples to every series, as a fleet's steady ingest does: each group
        // should write about its new samples and the open chunks, not the pages of every
        // series' earlier chunks.
        const SERIES: u64 = 400;
        const HISTORY: i64 = 8 * chunk::MAX_SAMPLES as i64;
        const PER_GROUP: i64 = 20;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.redb");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .unwrap();
        let written = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let backend = CountingBackend {
            inner: redb::backends::FileBackend::new(file).unwrap(),
            written: written.clone(),
        };
        let config = StoreConfig::at(&path);
        let db = Database::builder()
            .set_cache_size(config.cache_size)
            .set_concurrency_mode(ConcurrencyMode::SingleWriter)
            .create_with_backend(backend)
            .unwrap();
        let store = Store::with_database(db, &config).unwrap();
        let sample = |i: i64| (1_700_000_000_000 + i * 10_000, (250 * i) as f64);
        let group = |from: i64, to: i64| {
            store
                .write(|w| {
                    for s in 0..SERIES {
                        let id = w.series_id_or_create(&format!("cycles{{m=\"{s}\"}}"))?;
                        for i in from..to {
                            let (ts, value) = sample(i);
                            assert_eq!(w.put_sample(id, ts, value)?, Upsert::New);
                        }
                    }
                    Ok(())
                })
                .unwrap();
        };
        group(0, HISTORY);
        let mut per_group = Vec::new();
        for g in 0..4 {
            let before = written.load(std::sync::atomic::Ordering::Relaxed);
            group(HISTORY + g * PER_GROUP, HISTORY + (g + 1) * PER_GROUP);
            per_group.push(written.load(std::sync::atomic::Ordering::Relaxed) - before);
        }
        // The new samples take about 4 bytes each, 32 KiB per group; the open chunks they land
        // in 40 to 200 KiB; the first group also seals every series' full chunk (200 KiB, plus
        // the index). The layout with every chunk in one table rewrote a 4 KiB page per series,
        // the one holding its last chunk and the chunks before it: 1.6 MiB and more per group.
        let bound = 512 * 1024;
        assert!(
            per_group.iter().all(|&bytes| bytes <= bound),
            "bytes written per group: {per_group:?}, bound {bound}"
        );
        assert_eq!(
            store.sample_count().unwrap(),
            SERIES * (HISTORY + 4 * PER_GROUP) as u64
        );
    }

    #[test]
    fn a_corrupt_chunk_is_an_error_naming_it_not_a_panic() {
        let (dir, store) = store();
        store
            .write(|w| {
                let id = w.series_id_or_create("a{}")?;
                w.put_sample(id, 5, 1.0)?;
                Ok(())
            })
            .unwrap();
        store
            .write(|w| {
                w.samples.open.insert((1, 5), [9u8, 9, 9].as_slice())?;
                Ok(())
            })
            .unwrap();
        // Reopened: the writer's cache of last chunks starts from the file.
        drop(store);
        let store = Store::open_path(&dir.path().join("store.redb")).unwrap();
        let error = store.query("a", 0, 10).unwrap_err();
        assert!(matches!(
            error,
            StoreError::CorruptChunk { series: 1, key: 5 }
        ));
        let error = store
            .write(|w| w.put_sample(1, 6, 1.0).map(|_| ()))
            .unwrap_err();
        assert!(matches!(
            error,
            StoreError::CorruptChunk { series: 1, key: 5 }
        ));
        drop(dir);
    }

    mod model {
        //! The chunked sample store against a plain map, with transactions that fail and
        //! reopening.

        use std::collections::BTreeMap;

        use proptest::prelude::*;

        use super::super::*;
        use super::assert_chunks_hold_their_invariants;

        const SERIES: u64 = 3;
        /// Past two chunks, so chunks fill, split and take samples before them.
        const TIMES: i64 = 300;

        #[derive(Debug, Clone)]
        enum Op {
            Put(u64, i64, f64),
            Remove(u64, i64),
            Get(u64, i64),
            FirstIn(u64, i64, i64),
            Last(u64),
        }

        #[derive(Debug, Clone)]
        enum Action {
            /// One transaction; committed, or failed at its end (nothing of it stays).
            Write(Vec<Op>, bool),
            /// Appends in time order to every series, as ingest mostly does.
            Appends(i64, i64),
            Reopen,
        }

        fn op() -> impl Strategy<Value = Op> {
            let series = 0..SERIES;
            let ts = -5..TIMES;
            let value = prop_oneof![Just(0.0), Just(1.0), Just(2.0), Just(f64::NAN)];
            prop_oneof![
                6 => (series.clone(), ts.clone(), value).prop_map(|(s, t, v)| Op::Put(s, t, v)),
                1 => (series.clone(), ts.clone()).prop_map(|(s, t)| Op::Remove(s, t)),
                1 => (series.clone(), ts.clone()).prop_map(|(s, t)| Op::Get(s, t)),
                1 => (series.clone(), ts.clone(), ts).prop_map(|(s, a, b)| Op::FirstIn(s, a, b)),
                1 => series.prop_map(Op::Last),
            ]
        }

        fn action() -> impl Strategy<Value = Action> {
            prop_oneof![
                6 => (prop::collection::vec(op(), 1..40), prop::bool::weighted(0.8))
                    .prop_map(|(ops, commit)| Action::Write(ops, commit)),
                2 => (0..TIMES, 1i64..150).prop_map(|(from, n)| Action::Appends(from, n)),
                1 => Just(Action::Reopen),
            ]
        }

        type Model = BTreeMap<(u64, i64), f64>;

        fn same(a: f64, b: f64) -> bool {
            a == b || (a.is_nan() && b.is_nan())
        }

        fn key(series: u64) -> String {
            format!("s{series}{{}}")
        }

        /// Runs `ops` on the store and on `model`, checking every answer.
        fn run(w: &mut Writer<'_>, model: &mut Model, ops: &[Op]) -> Result<(), StoreError> {
            for op in ops {
                match *op {
                    Op::Put(s, ts, v) => {
                        let id = w.series_id_or_create(&key(s))?;
                        let expected = match model.get(&(s, ts)) {
                            None => Upsert::New,
                            Some(&stored) if same(stored, v) => Upsert::Identical,
                            Some(_) => Upsert::Conflict,
                        };
                        assert_eq!(w.put_sample(id, ts, v)?, expected, "{op:?}");
                        model.entry((s, ts)).or_insert(v);
                    }
                    Op::Remove(s, ts) => {
                        let id = w.series_id_or_create(&key(s))?;
                        w.remove_sample(id, ts)?;
                        model.remove(&(s, ts));
                    }
                    Op::Get(s, ts) => {
                        let id = w.series_id_or_create(&key(s))?;
                        let got = w.sample(id, ts)?;
                        let expected = model.get(&(s, ts)).copied();
                        assert_eq!(got.map(f64::to_bits), expected.map(f64::to_bits), "{op:?}");
                    }
                    Op::FirstIn(s, from, to) => {
                        let id = w.series_id_or_create(&key(s))?;
                        let got = w.first_sample_in(id, from, to)?;
                        let expected = if from < to {
                            model
                                .range((s, from)..(s, to))
                                .next()
                                .map(|(k, v)| (k.1, *v))
                        } else {
                            None
                        };
                        assert_eq!(
                            got.map(|(t, v)| (t, v.to_bits())),
                            expected.map(|(t, v)| (t, v.to_bits())),
                            "{op:?}"
                        );
                    }
                    Op::Last(s) => {
                        let id = w.series_id_or_create(&key(s))?;
                        let got = w.last_sample(id)?;
                        let expected = model.range((s, i64::MIN)..=(s, i64::MAX)).next_back();
                        assert_eq!(
                            got.map(|(t, v)| (t, v.to_bits())),
                            expected.map(|(k, v)| (k.1, v.to_bits())),
                            "{op:?}"
                        );
                    }
                }
            }
            Ok(())
        }

        /// What a reader sees equals the model: every sample, the latest in a window, the count.
        fn check_reads(store: &Store, model: &Model) {
            for s in 0..SERIES {
                let metric = format!("s{s}");
                let expected: Vec<(i64, u64)> = model
                    .range((s, i64::MIN)..=(s, i64::MAX))
                    .map(|(k, v)| (k.1, v.to_bits()))
                    .collect();
                let read = store.query(&metric, i64::MIN, i64::MAX).unwrap();
                let got: Vec<(i64, u64)> = read
                    .first()
                    .map(|r| r.samples.iter().map(|&(t, v)| (t, v.to_bits())).collect())
                    .unwrap_or_default();
                assert_eq!(got, expected, "series {s}");
                for (from, to) in [(-5, 3), (40, 200), (130, 131), (250, TIMES)] {
                    let window: Vec<(i64, u64)> = model
                        .range((s, from)..=(s, to))
                        .map(|(k, v)| (k.1, v.to_bits()))
                        .collect();
                    let read = store.query(&metric, from, to).unwrap();
                    let got: Vec<(i64, u64)> = read
                        .first()
                        .map(|r| r.samples.iter().map(|&(t, v)| (t, v.to_bits())).collect())
                        .unwrap_or_default();
                    assert_eq!(got, window, "series {s} in {from}..={to}");
                    let latest = store.query_latest(&metric, from, to, None).unwrap();
                    let got = latest
                        .first()
                        .map(|r| (r.samples[0].0, r.samples[0].1.to_bits()));
                    assert_eq!(
                        got,
                        window.last().copied(),
                        "latest of {s} in {from}..={to}"
                    );
                }
            }
            assert_eq!(store.sample_count().unwrap(), model.len() as u64);
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(48))]

            /// Random puts (out of order, duplicates, conflicts), removals and reads in
            /// transactions that commit or fail, with reopening: the writer, a read-only opener
            /// and the stored chunks agree with a plain map throughout.
            #[test]
            fn chunked_samples_agree_with_a_plain_map(
                actions in prop::collection::vec(action(), 1..14),
            ) {
                let dir = tempfile::tempdir().unwrap();
                let path = dir.path().join("store.redb");
                let mut store = Store::open_path(&path).unwrap();
                let mut model = Model::new();
                for action in actions {
                    match action {
                        Action::Write(ops, commit) => {
                            let mut next = model.clone();
                            let result: Result<(), StoreError> = store.write(|w| {
                                run(w, &mut next, &ops)?;
                                if commit {
                                    Ok(())
                                } else {
                                    Err(StoreError::Storage(redb::Error::Corrupted("test".into())))
                                }
                            });
                            prop_assert_eq!(result.is_ok(), commit);
                            if commit {
                                model = next;
                            }
                        }
                        Action::Appends(from, n) => {
                            let ops: Vec<Op> = (0..SERIES)
                                .flat_map(|s| {
                                    (from..from + n).map(move |t| Op::Put(s, t, (t % 7) as f64))
                                })
                                .collect();
                            store.write(|w| run(w, &mut model, &ops)).unwrap();
                        }
                        Action::Reopen => {
                            drop(store);
                            store = Store::open_path(&path).unwrap();
                        }
                    }
                    check_reads(&store, &model);
                    let reader = Store::open_read_only(&path).unwrap();
                    check_reads(&reader, &model);
                }
                drop(store);
                assert_chunks_hold_their_invariants(&path);
            }
        }
    }
}
