//! Queue status for the agent's `status` command, and the snapshot file through which a second
//! process reads it while the agent runs.
//!
//! One process at a time opens the store (it is locked), so the queue writes its snapshot to
//! `status_file` at most every `status_interval` (at a flush, and when it opens): written to
//! `<status_file>.tmp`, then renamed over `status_file`, so a reader sees the old or the new
//! snapshot, never a torn one, and never blocks the agent. The snapshot is volatile by nature: it
//! is not fsynced (after a power cut it may be older than the queue, or gone), and the agent
//! keeps it on tmpfs beside its own status file, off the flash the queue wears: rewritten every
//! second in the queue directory it cost a journal commit every few seconds, most of an idle
//! agent's writes. By default (a queue used on its own) it is `<dir>/status`; a queue whose
//! snapshot lives elsewhere removes that file of older versions when it opens.
//!
//! ```text
//! edgewatch-queue-status 1
//! as_of_unix_ms <u64>
//! epoch <u64 hex>
//! budget_bytes <u64>
//! file_bytes <u64>
//! offline_window_seconds <f64 | none>
//! store_available <true | false>
//! tier <name> records <u64> bytes <u64> cap_bytes <u64> oldest_age_ms <u64 | none>
//!      first_seq <u64> durable_seq <u64> pending <u64> evicted <u64> expired <u64>
//!      corrupt <u64> disk_full <u64> buffer_overflow <u64> refused <u64> quarantined <u64>
//!      append_bytes_per_second <f64>
//! ```
//! (each `tier` line is one line; three of them, safety, slo, debug.)
//!
//! Besides `status`, the snapshot is what bounds a quarantine's loss when the damaged store's
//! own state cannot be read: its epoch, and per tier the records, bytes and sequence range it
//! held, and its loss totals, as of at most `status_interval` before. A queue that never opened
//! its store does not write one (it would erase that bound with placeholders).
//!
//! Invariants:
//! - `read_snapshot` accepts exactly what `write_snapshot` writes and refuses anything else with
//!   a typed error.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use edgewatch_proto::tier::{self, PerTier};

/// File name of the snapshot in the queue directory, the default `status_file` (and where
/// versions before it could be set kept it).
pub const SNAPSHOT_FILE: &str = "status";
const MAGIC: &str = "edgewatch-queue-status 1";

/// One tier's state.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TierStatus {
    /// Records stored.
    pub records: u64,
    /// Bytes stored (keys and values).
    pub bytes: u64,
    /// The most this tier may hold.
    pub cap_bytes: u64,
    /// Age of the oldest stored record (since its append).
    pub oldest_age: Option<Duration>,
    /// Sequence number of the oldest stored record (0: none stored).
    pub first_seq: u64,
    /// Highest durable sequence number.
    pub durable_seq: u64,
    /// Appends waiting for a flush.
    pub pending: u64,
    /// Records evicted for space, since the store was created.
    pub evicted: u64,
    /// Records expired by age.
    pub expired: u64,
    /// Records that failed their checksum.
    pub corrupt: u64,
    /// Records refused or dropped because the store could not be written.
    pub disk_full: u64,
    /// Safety records refused because the in-memory hold buffer was full.
    pub buffer_overflow: u64,
    /// Records the broker refused again and again, given up on (dead letters).
    pub refused: u64,
    /// Records lost to quarantines (the best bound known at each: see `docs/queue.md`).
    pub quarantined: u64,
    /// Smoothed append rate.
    pub append_bytes_per_second: f64,
}

/// The whole queue's state.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct QueueStatus {
    /// When this status was taken (ms since the Unix epoch).
    pub as_of_unix_ms: u64,
    /// Queue epoch.
    pub epoch: u64,
    /// Per-tier figures.
    pub tiers: PerTier<TierStatus>,
    /// Configured total budget.
    pub budget_bytes: u64,
    /// Size of the database file.
    pub file_bytes: u64,
    /// How long the queue can stay offline at current rates before it must evict.
    pub offline_window: Option<Duration>,
    /// False while the store cannot be written (disk full, I/O errors).
    pub store_available: bool,
}

/// The snapshot could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The file could not be read.
    #[error("status snapshot could not be read: {0}")]
    Io(#[from] std::io::Error),
    /// The file is not a snapshot of this format.
    #[error("status snapshot is malformed at line {line}")]
    Malformed {
        /// 1-based line number.
        line: usize,
    },
}

/// Where a queue's snapshot goes: the file and its temporary, joined once so that rewriting the
/// snapshot every second allocates nothing.
#[derive(Debug, Clone)]
pub struct SnapshotPaths {
    file: PathBuf,
    tmp: PathBuf,
}

impl SnapshotPaths {
    /// The snapshot at `file`, through `<file>.tmp`.
    pub fn at(file: &Path) -> Self {
        let mut tmp = file.as_os_str().to_owned();
        tmp.push(".tmp");
        Self {
            file: file.to_owned(),
            tmp: tmp.into(),
        }
    }

    /// The snapshot file.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// Its temporary, renamed over it.
    pub fn tmp(&self) -> &Path {
        &self.tmp
    }
}

/// Writes `status` atomically to `file` (temp file + rename), formatting into `text`.
pub fn write_snapshot(file: &Path, status: &QueueStatus, text: &mut String) -> std::io::Result<()> {
    write_snapshot_to(&SnapshotPaths::at(file), status, text)
}

/// Writes `status` atomically to `paths`, formatting into `text` (no allocation once `text` has
/// the room).
pub fn write_snapshot_to(
    paths: &SnapshotPaths,
    status: &QueueStatus,
    text: &mut String,
) -> std::io::Result<()> {
    text.clear();
    let _ = writeln!(text, "{MAGIC}");
    let _ = writeln!(text, "as_of_unix_ms {}", status.as_of_unix_ms);
    let _ = writeln!(text, "epoch {:016x}", status.epoch);
    let _ = writeln!(text, "budget_bytes {}", status.budget_bytes);
    let _ = writeln!(text, "file_bytes {}", status.file_bytes);
    match status.offline_window {
        Some(window) => {
            let _ = writeln!(text, "offline_window_seconds {}", window.as_secs_f64());
        }
        None => text.push_str("offline_window_seconds none\n"),
    }
    let _ = writeln!(text, "store_available {}", status.store_available);
    for ix in 0..3 {
        let t = status.tiers.at(ix);
        let _ = write!(
            text,
            "tier {} records {} bytes {} cap_bytes {} oldest_age_ms ",
            tier::NAMES[ix],
            t.records,
            t.bytes,
            t.cap_bytes
        );
        match t.oldest_age {
            Some(age) => {
                let _ = write!(text, "{}", age.as_millis());
            }
            None => text.push_str("none"),
        }
        let _ = writeln!(
            text,
            " first_seq {} durable_seq {} pending {} evicted {} expired {} corrupt {} \
             disk_full {} buffer_overflow {} refused {} quarantined {} append_bytes_per_second {}",
            t.first_seq,
            t.durable_seq,
            t.pending,
            t.evicted,
            t.expired,
            t.corrupt,
            t.disk_full,
            t.buffer_overflow,
            t.refused,
            t.quarantined,
            t.append_bytes_per_second
        );
    }
    std::fs::write(&paths.tmp, text.as_bytes())?;
    std::fs::rename(&paths.tmp, &paths.file)
}

/// Reads the snapshot a queue wrote to `file` (its `status_file`), without opening the queue.
pub fn read_snapshot(file: &Path) -> Result<QueueStatus, SnapshotError> {
    let text = std::fs::read_to_string(file)?;
    parse(&text)
}

fn parse(text: &str) -> Result<QueueStatus, SnapshotError> {
    let mut status = QueueStatus::default();
    let mut lines = text.lines().enumerate();
    let bad = |line: usize| SnapshotError::Malformed { line: line + 1 };
    match lines.next() {
        Some((_, MAGIC)) => {}
        _ => return Err(bad(0)),
    }
    let mut tiers_seen = 0;
    for (n, line) in lines {
        let mut words = line.split(' ');
        let key = words.next().ok_or_else(|| bad(n))?;
        let mut value = || words.next().ok_or_else(|| bad(n));
        match key {
            "as_of_unix_ms" => status.as_of_unix_ms = value()?.parse().map_err(|_| bad(n))?,
            "epoch" => {
                status.epoch = u64::from_str_radix(value()?, 16).map_err(|_| bad(n))?;
            }
            "budget_bytes" => status.budget_bytes = value()?.parse().map_err(|_| bad(n))?,
            "file_bytes" => status.file_bytes = value()?.parse().map_err(|_| bad(n))?,
            "offline_window_seconds" => {
                status.offline_window = match value()? {
                    "none" => None,
                    seconds => Some(
                        seconds
                            .parse::<f64>()
                            .ok()
                            .and_then(|s| Duration::try_from_secs_f64(s).ok())
                            .ok_or_else(|| bad(n))?,
                    ),
                };
            }
            "store_available" => status.store_available = value()?.parse().map_err(|_| bad(n))?,
            "tier" => {
                let ix = tier::from_name(value()?)
                    .and_then(tier::index)
                    .ok_or_else(|| bad(n))?;
                let tier = status.tiers.at_mut(ix);
                let rest: Vec<&str> = line.split(' ').skip(2).collect();
                if !rest.len().is_multiple_of(2) {
                    return Err(bad(n));
                }
                for pair in rest.chunks(2) {
                    let (name, v) = (pair[0], pair[1]);
                    let int = || v.parse::<u64>().map_err(|_| bad(n));
                    match name {
                        "records" => tier.records = int()?,
                        "bytes" => tier.bytes = int()?,
                        "cap_bytes" => tier.cap_bytes = int()?,
                        "oldest_age_ms" => {
                            tier.oldest_age = match v {
                                "none" => None,
                                _ => Some(Duration::from_millis(int()?)),
                            };
                        }
                        "first_seq" => tier.first_seq = int()?,
                        "durable_seq" => tier.durable_seq = int()?,
                        "pending" => tier.pending = int()?,
                        "evicted" => tier.evicted = int()?,
                        "expired" => tier.expired = int()?,
                        "corrupt" => tier.corrupt = int()?,
                        "disk_full" => tier.disk_full = int()?,
                        "buffer_overflow" => tier.buffer_overflow = int()?,
                        "refused" => tier.refused = int()?,
                        "quarantined" => tier.quarantined = int()?,
                        "append_bytes_per_second" => {
                            tier.append_bytes_per_second = v.parse().map_err(|_| bad(n))?;
                        }
                        _ => return Err(bad(n)),
                    }
                }
                tiers_seen += 1;
            }
            _ => return Err(bad(n)),
        }
    }
    if tiers_seen != 3 {
        return Err(bad(0));
    }
    Ok(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_reads_back_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let mut status = QueueStatus {
            as_of_unix_ms: 1_700_000_000_123,
            epoch: 0xdead_beef_0000_0001,
            budget_bytes: 1 << 20,
            file_bytes: 4096,
            offline_window: Some(Duration::from_millis(86_400_500)),
            store_available: true,
            ..QueueStatus::default()
        };
        status.tiers.slo = TierStatus {
            records: 3,
            bytes: 300,
            cap_bytes: 1000,
            oldest_age: Some(Duration::from_millis(1500)),
            first_seq: 3,
            durable_seq: 9,
            pending: 1,
            evicted: 2,
            expired: 4,
            corrupt: 5,
            disk_full: 6,
            buffer_overflow: 7,
            refused: 10,
            quarantined: 8,
            append_bytes_per_second: 12.5,
        };
        let mut text = String::new();
        let file = dir.path().join("queue-status");
        write_snapshot(&file, &status, &mut text).unwrap();
        assert_eq!(read_snapshot(&file).unwrap(), status);
        assert!(!dir.path().join("queue-status.tmp").exists());
    }

    #[test]
    fn a_foreign_file_is_refused_with_its_line() {
        assert!(matches!(
            parse("edgewatch-queue-status 1\nbogus 1\n"),
            Err(SnapshotError::Malformed { line: 2 })
        ));
        assert!(matches!(
            parse("hello"),
            Err(SnapshotError::Malformed { line: 1 })
        ));
    }
}
