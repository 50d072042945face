//! The agent's status, for `edgewatch-agent status`: written by the running agent's
//! [`write_loop`] to a file every second (atomically: a temporary file renamed into place), read by
//! `status` without ever touching the running agent. The queue writes its own snapshot the same
//! way, asked by the same loop, beside this file (`config::queue_status_file`): both are volatile
//! and rewritten every second, so they live where the status file does (tmpfs when packaged),
//! never in the queue directory on the flash.
//!
//! Invariants:
//! - Reading status never blocks or disturbs the running agent: it only reads files.
//! - Writing a snapshot allocates nothing once warm: a reused buffer, a view borrowed from the
//!   live counters, a source list rewritten in place.
//! - A snapshot older than [`STALE_AFTER`] is reported as such (the agent is not running or stuck).

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, SystemTime};

use edgewatch_queue::QueueStatus;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::clock::{self, unix_ms};
use crate::config::Config;
use crate::degraded::StoreView;
use crate::drain::DrainStats;
use crate::ingest::IngestStats;
use crate::spool::Spool;

/// A status file older than this means the agent is not updating it.
pub const STALE_AFTER: Duration = Duration::from_secs(5);

/// What `run` publishes about itself.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AgentSnapshot {
    /// When this snapshot was taken (ms since the Unix epoch).
    pub as_of_unix_ms: u64,
    /// Process id of the agent.
    pub pid: u32,
    /// Agent version.
    pub version: String,
    /// Seconds since the agent started.
    pub uptime_s: u64,
    /// Uplink state.
    pub uplink: serde_json::Value,
    /// Local ingest counters.
    pub ingest: serde_json::Value,
    /// The queue's store: available, or why not and what is held meanwhile.
    #[serde(default)]
    pub store: serde_json::Value,
    /// Sampling sources and the age of their last sample.
    pub sources: Vec<SourceStatus>,
}

/// One sampling source.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SourceStatus {
    /// Source name (e.g. `probe:planner`, `tegrastats`).
    pub name: String,
    /// State in a word (alive, stalled, dead, missing, ...).
    pub state: String,
    /// Seconds since its last sample, if any.
    pub last_sample_age_s: Option<f64>,
}

/// What `run` writes every second: the same fields as [`AgentSnapshot`], borrowed from the
/// live counters so that writing a snapshot allocates nothing.
#[derive(Debug, Serialize)]
pub struct SnapshotView<'a> {
    /// When this snapshot was taken (ms since the Unix epoch).
    pub as_of_unix_ms: u64,
    /// Process id of the agent.
    pub pid: u32,
    /// Agent version.
    pub version: &'static str,
    /// Seconds since the agent started.
    pub uptime_s: u64,
    /// Uplink state.
    pub uplink: &'a DrainStats,
    /// Local ingest counters.
    pub ingest: &'a IngestStats,
    /// The queue's store: available, or why not (and what is held in memory meanwhile).
    pub store: StoreView<'a>,
    /// Sampling sources and the age of their last sample.
    pub sources: &'a [SourceStatus],
}

impl<'a> SnapshotView<'a> {
    /// The snapshot as of now.
    pub fn now(
        started: SystemTime,
        uplink: &'a DrainStats,
        ingest: &'a IngestStats,
        store: StoreView<'a>,
        sources: &'a [SourceStatus],
    ) -> Self {
        let now = clock::wall();
        Self {
            as_of_unix_ms: unix_ms(now),
            pid: std::process::id(),
            version: env!("CARGO_PKG_VERSION"),
            uptime_s: now.duration_since(started).map_or(0, |d| d.as_secs()),
            uplink,
            ingest,
            store,
            sources,
        }
    }
}

/// Room reserved for one snapshot's JSON: several times a typical one, so the buffer never
/// grows while the agent runs.
const SNAPSHOT_CAPACITY: usize = 16 * 1024;

/// Writes snapshots atomically to one path, through one reused buffer.
pub struct StatusWriter {
    path: PathBuf,
    temp: PathBuf,
    json: Vec<u8>,
}

impl StatusWriter {
    /// A writer for `path`.
    pub fn new(path: PathBuf) -> Self {
        let mut temp = path.clone().into_os_string();
        temp.push(".tmp");
        Self {
            path,
            temp: temp.into(),
            json: Vec::with_capacity(SNAPSHOT_CAPACITY),
        }
    }

    /// Replaces the file with `snapshot`.
    pub fn write(&mut self, snapshot: &SnapshotView<'_>) -> std::io::Result<()> {
        self.json.clear();
        serde_json::to_writer_pretty(&mut self.json, snapshot).map_err(std::io::Error::other)?;
        std::fs::write(&self.temp, &self.json)?;
        std::fs::rename(&self.temp, &self.path)
    }
}

impl SourceStatus {
    /// An empty entry with room for typical names and states.
    pub fn with_capacity() -> Self {
        Self {
            name: String::with_capacity(64),
            state: String::with_capacity(64),
            last_sample_age_s: None,
        }
    }
}

/// Rewrites a source list in place: entry `i` keeps its strings (and their capacity) from one
/// refresh to the next, so a list whose shape does not change allocates nothing.
pub struct SourceListWriter<'a> {
    list: &'a mut Vec<SourceStatus>,
    len: usize,
}

impl<'a> SourceListWriter<'a> {
    /// Starts rewriting `list`.
    pub fn new(list: &'a mut Vec<SourceStatus>) -> Self {
        Self { list, len: 0 }
    }

    /// The next entry, cleared.
    pub fn entry(&mut self) -> &mut SourceStatus {
        if self.len == self.list.len() {
            self.list.push(SourceStatus::with_capacity());
        }
        let entry = &mut self.list[self.len];
        self.len += 1;
        entry.name.clear();
        entry.state.clear();
        entry.last_sample_age_s = None;
        entry
    }
}

impl Drop for SourceListWriter<'_> {
    /// Drops the entries not rewritten this time.
    fn drop(&mut self) {
        self.list.truncate(self.len);
    }
}

/// Writes the status file every second, after the queue rewrote its own snapshot, until
/// `shutdown` turns true.
pub async fn write_loop(
    spool: Spool,
    mut status: StatusWriter,
    drain: Rc<RefCell<DrainStats>>,
    ingest: Rc<RefCell<IngestStats>>,
    sources: Rc<RefCell<Vec<SourceStatus>>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let started = clock::wall();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        spool.queue_mut().refresh_status_snapshot(clock::wall());
        let (drain, ingest, sources) = (drain.borrow(), ingest.borrow(), sources.borrow());
        let queue = spool.queue();
        let store = StoreView::of(queue.store_fault(), queue.config().safety_hold_records);
        let snapshot = SnapshotView::now(started, &drain, &ingest, store, &sources);
        if let Err(error) = status.write(&snapshot) {
            tracing::warn!(%error, "The status file could not be written.");
        }
    }
}

/// Everything `status` shows.
#[derive(Debug, Serialize)]
pub struct Status {
    /// False when the agent's snapshot is missing or stale.
    pub agent_running: bool,
    /// The agent's snapshot, if any.
    pub agent: Option<AgentSnapshot>,
    /// The queue's snapshot, if any.
    pub queue: Option<QueueView>,
    /// Problems reading either.
    pub notes: Vec<String>,
}

/// The queue's snapshot in the form `status --json` prints.
#[derive(Debug, Serialize)]
pub struct QueueView {
    /// When the queue wrote it (ms since the Unix epoch).
    pub as_of_unix_ms: u64,
    /// Queue epoch.
    pub epoch: u64,
    /// Database file size.
    pub file_bytes: u64,
    /// Configured budget.
    pub budget_bytes: u64,
    /// Seconds the queue can stay offline at current rates before it must evict.
    pub offline_window_s: Option<f64>,
    /// False while the store cannot be written.
    pub store_available: bool,
    /// Per tier, in priority order.
    pub tiers: Vec<TierView>,
}

/// One tier of [`QueueView`].
#[derive(Debug, Serialize)]
pub struct TierView {
    /// `safety`, `slo` or `debug`.
    pub tier: &'static str,
    /// Records stored.
    pub records: u64,
    /// Bytes stored.
    pub bytes: u64,
    /// Age of the oldest record.
    pub oldest_age_s: Option<f64>,
    /// Records evicted for space.
    pub evicted: u64,
    /// Records expired by age.
    pub expired: u64,
    /// Records that failed their checksum.
    pub corrupt: u64,
    /// Records refused while the disk was full.
    pub disk_full: u64,
    /// Smoothed append rate.
    pub append_bytes_per_second: f64,
}

impl From<&QueueStatus> for QueueView {
    fn from(status: &QueueStatus) -> Self {
        let tier = |name, t: &edgewatch_queue::TierStatus| TierView {
            tier: name,
            records: t.records,
            bytes: t.bytes,
            oldest_age_s: t.oldest_age.map(|age| age.as_secs_f64()),
            evicted: t.evicted,
            expired: t.expired,
            corrupt: t.corrupt,
            disk_full: t.disk_full,
            append_bytes_per_second: t.append_bytes_per_second,
        };
        Self {
            as_of_unix_ms: status.as_of_unix_ms,
            epoch: status.epoch,
            file_bytes: status.file_bytes,
            budget_bytes: status.budget_bytes,
            offline_window_s: status.offline_window.map(|w| w.as_secs_f64()),
            store_available: status.store_available,
            tiers: status
                .tiers
                .iter()
                .zip(edgewatch_proto::tier::NAMES)
                .map(|((_, t), name)| tier(name, t))
                .collect(),
        }
    }
}

/// Why `status` could not print.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// Writing to stdout failed.
    #[error("writing the status: {0}")]
    Output(#[from] std::io::Error),
}

/// Reads both snapshots.
pub fn read(config: &Config) -> Status {
    let mut notes = Vec::new();
    let agent = match read_agent(&config.status_file) {
        Ok(snapshot) => Some(snapshot),
        Err(error) => {
            notes.push(format!(
                "agent status {}: {error}",
                config.status_file.display()
            ));
            None
        }
    };
    let queue = match edgewatch_queue::read_snapshot(&config.queue.queue.get().status_file) {
        Ok(status) => Some(QueueView::from(&status)),
        Err(error) => {
            notes.push(format!("queue status: {error}"));
            None
        }
    };
    let now = unix_ms(clock::wall());
    let agent_running = agent.as_ref().is_some_and(|snapshot| {
        now.saturating_sub(snapshot.as_of_unix_ms) <= STALE_AFTER.as_millis() as u64
    });
    if agent.is_some() && !agent_running {
        notes.push("the agent's status is stale: the agent is not running".into());
    }
    Status {
        agent_running,
        agent,
        queue,
        notes,
    }
}

fn read_agent(path: &Path) -> Result<AgentSnapshot, String> {
    let text = std::fs::read_to_string(path).map_err(|error| error.to_string())?;
    serde_json::from_str(&text).map_err(|error| error.to_string())
}

/// Renders the status as a table.
pub fn render_text(status: &Status) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "agent: {}",
        if status.agent_running {
            "running"
        } else {
            "not running"
        }
    );
    if let Some(agent) = &status.agent {
        let _ = writeln!(
            out,
            "  pid {}  version {}  uptime {} s",
            agent.pid, agent.version, agent.uptime_s
        );
        let uplink = &agent.uplink;
        let _ = writeln!(
            out,
            "uplink: {}  last ack {}  backoff {}  refused {}  reconnects {}",
            if uplink["connected"].as_bool() == Some(true) {
                "connected"
            } else {
                "disconnected"
            },
            uplink["last_ack_unix_ms"]
                .as_u64()
                .map_or("never".to_owned(), |ms| format!(
                    "{} s ago",
                    unix_ms(clock::wall()).saturating_sub(ms) / 1000
                )),
            uplink["backoff_ms"]
                .as_u64()
                .map_or("-".to_owned(), |ms| format!("{ms} ms")),
            uplink["refused"].as_u64().unwrap_or(0),
            uplink["disconnects"].as_u64().unwrap_or(0),
        );
        let _ = writeln!(
            out,
            "ingest: accepted {}  rejected {}",
            agent.ingest["accepted"].as_u64().unwrap_or(0),
            agent.ingest["rejected"].as_u64().unwrap_or(0)
        );
        let store = &agent.store;
        if store["available"].as_bool() == Some(false) {
            let now = unix_ms(clock::wall());
            let ago = |key: &str| {
                store[key].as_u64().map_or("-".to_owned(), |ms| {
                    format!("{} s", now.abs_diff(ms) / 1000)
                })
            };
            let _ = writeln!(
                out,
                "store: UNAVAILABLE for {}  held safety {} of {}  attempts {}  next attempt in {}",
                ago("since_unix_ms"),
                store["held_safety"].as_u64().unwrap_or(0),
                store["hold_capacity"].as_u64().unwrap_or(0),
                store["attempts"].as_u64().unwrap_or(0),
                ago("next_attempt_unix_ms"),
            );
            let _ = writeln!(out, "  {}", store["fault"].as_str().unwrap_or(""));
        } else if store["available"].as_bool() == Some(true) {
            let _ = writeln!(out, "store: available");
        }
        let _ = writeln!(out, "sources:");
        if agent.sources.is_empty() {
            let _ = writeln!(out, "  (none configured)");
        }
        for source in &agent.sources {
            let _ = writeln!(
                out,
                "  {:<24} {:<10} last sample {}",
                source.name,
                source.state,
                source
                    .last_sample_age_s
                    .map_or("never".to_owned(), |age| format!("{age:.1} s ago"))
            );
        }
    }
    if let Some(queue) = &status.queue {
        let _ = writeln!(
            out,
            "queue: epoch {:016x}  file {} bytes  budget {} bytes  offline window {}",
            queue.epoch,
            queue.file_bytes,
            queue.budget_bytes,
            queue
                .offline_window_s
                .map_or("unbounded".to_owned(), |w| format!("{:.1} h", w / 3600.0))
        );
        let _ = writeln!(
            out,
            "  {:<7} {:>9} {:>12} {:>11} {:>8} {:>8} {:>8}",
            "tier", "records", "bytes", "oldest (s)", "evicted", "expired", "corrupt"
        );
        for tier in &queue.tiers {
            let _ = writeln!(
                out,
                "  {:<7} {:>9} {:>12} {:>11} {:>8} {:>8} {:>8}",
                tier.tier,
                tier.records,
                tier.bytes,
                tier.oldest_age_s
                    .map_or("-".to_owned(), |age| format!("{age:.0}")),
                tier.evicted,
                tier.expired,
                tier.corrupt
            );
        }
    }
    for note in &status.notes {
        let _ = writeln!(out, "note: {note}");
    }
    out
}
