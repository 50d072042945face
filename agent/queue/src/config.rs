//! Queue configuration: the settings with their units and named defaults ([`RawQueueConfig`], as
//! the agent's configuration or a test states them), and the validated form the queue runs with
//! ([`QueueConfig`]), following the workspace's convention (`edgewatch_conventions::config`).
//!
//! Invariants:
//! - A [`QueueConfig`] exists only after [`QueueConfig::from_raw`] accepted every field and the
//!   cross-field rules; the queue is built only from one.
//! - Errors name the field as this crate spells it (`safety_flush_interval`); the agent renames
//!   them to its file's keys.
//! - No I/O here: the directory is only named, never touched.

use std::path::PathBuf;
use std::time::Duration;

use edgewatch_conventions::config::ConfigError;
use edgewatch_proto::tier::PerTier;

/// Accepted and ignored since the store became a log (it was redb's page cache); kept so that
/// configurations written for the old store still load.
pub const DEFAULT_CACHE_BYTES: u64 = 8 * 1024 * 1024;
/// Total record bytes on disk: days of SLO counters and hours of debug samples on a Jetson's eMMC.
pub const DEFAULT_BUDGET_BYTES: u64 = 512 * 1024 * 1024;
/// Largest share of the budget each tier may hold (percent). Shares are caps and may add up to
/// more than 100: when the total is over budget, debug goes first, then SLO, never safety.
pub const DEFAULT_SHARE_PERCENT: PerTier<u8> = PerTier {
    safety: 25,
    slo: 60,
    debug: 60,
};
/// Safety data is kept until it is delivered or its share is full.
pub const DEFAULT_SAFETY_MAX_AGE: Option<Duration> = None;
/// SLO counters are cumulative: older samples only add resolution once a month has passed.
pub const DEFAULT_SLO_MAX_AGE: Option<Duration> = Some(Duration::from_secs(30 * 24 * 3600));
/// Raw debug samples are worthless after a week.
pub const DEFAULT_DEBUG_MAX_AGE: Option<Duration> = Some(Duration::from_secs(7 * 24 * 3600));
/// Group commit of safety appends: the longest a safety event waits for its fsync.
pub const DEFAULT_SAFETY_FLUSH_INTERVAL: Duration = Duration::from_millis(10);
/// Group commit of SLO and debug appends: at most this much of them is lost in a power cut.
pub const DEFAULT_BULK_FLUSH_INTERVAL: Duration = Duration::from_secs(1);
/// Appends buffered in memory before an append flushes by itself.
pub const DEFAULT_MAX_PENDING_BYTES: u64 = 4 * 1024 * 1024;
/// Largest encoded event accepted; well under a batch's 4 MiB decompressed limit.
pub const DEFAULT_MAX_RECORD_BYTES: u32 = 256 * 1024;
/// Safety events held in memory while the store cannot be opened or written: all the append
/// index holds. At a few safety events a minute this is days; a burst of 4,096 is rare.
pub const DEFAULT_SAFETY_HOLD_RECORDS: usize = PENDING_CAPACITY;
/// Below this much offline window (at current rates) the queue raises `OfflineWindowLow`.
pub const DEFAULT_OFFLINE_WINDOW_THRESHOLD: Option<Duration> = Some(Duration::from_secs(24 * 3600));
/// Smoothing time constant of the append-rate estimate behind the offline window.
pub const DEFAULT_RATE_TIME_CONSTANT: Duration = Duration::from_secs(15 * 60);
/// How often the status snapshot file is rewritten (at a flush).
pub const DEFAULT_STATUS_INTERVAL: Duration = Duration::from_secs(1);
/// First wait before reopening a store that failed (disk full, I/O error); each failed attempt
/// doubles it (`edgewatch_conventions::backoff`, no jitter: one machine, one disk).
pub const DEFAULT_STORE_RETRY_MIN: Duration = Duration::from_secs(1);
/// Longest wait between reopen attempts: a store that comes back is used within half a minute,
/// and a dead one costs one open attempt per half minute.
pub const DEFAULT_STORE_RETRY_MAX: Duration = Duration::from_secs(30);

/// Accepted and ignored: the log's recovery checks every record's checksum at every open.
pub const DEFAULT_VERIFY_ON_OPEN: bool = true;

/// Capacity of the in-memory index of appends not yet flushed (records, fixed in the type).
pub const PENDING_CAPACITY: usize = 4096;
/// Keys the key-value area holds at most: a few per sampler and source, far below this.
pub const MAX_KV_KEYS: usize = 256;
/// Longest key of the key-value area, bytes.
pub const MAX_KV_KEY_BYTES: usize = 256;
/// Longest value of the key-value area, bytes: a loop's accounting under four model versions
/// takes a few KiB. With the key count, the area stays under 17 MiB whatever callers stage.
pub const MAX_KV_VALUE_BYTES: usize = 64 * 1024;
/// Smallest budget accepted: room for the loss reports an eviction itself appends.
pub const MIN_BUDGET_BYTES: u64 = 256 * 1024;
/// Eviction frees this much beyond the limit, so the next flushes' loss reports fit without
/// evicting again; every tier's share must hold it beside its largest record.
pub const LOSS_RESERVE_BYTES: u64 = 4096;

/// Queue settings as the agent's configuration states them, not yet validated.
#[derive(Clone, Debug, PartialEq)]
pub struct RawQueueConfig {
    /// Directory holding the store (`queue.log/`) and the quarantine folder.
    pub dir: PathBuf,
    /// The status snapshot for other processes (rewritten every `status_interval`, never
    /// fsynced): `<dir>/status` by default; the agent puts it on tmpfs, off the flash.
    pub status_file: PathBuf,
    /// Accepted and ignored (it was the old store's page cache); still checked for its range.
    pub cache_bytes: u64,
    /// Total bytes of stored records (key + value) over all tiers.
    pub budget_bytes: u64,
    /// Largest share of `budget_bytes` each tier may hold, in percent (1..=100 each).
    pub share_percent: PerTier<u8>,
    /// Records older than this (since append) are expired; `None` keeps them.
    pub max_age: PerTier<Option<Duration>>,
    /// Longest a safety append waits for its flush.
    pub safety_flush_interval: Duration,
    /// Longest an SLO or debug append waits for its flush.
    pub bulk_flush_interval: Duration,
    /// Buffered append bytes after which `append` flushes by itself.
    pub max_pending_bytes: u64,
    /// Largest encoded event accepted by `append`.
    pub max_record_bytes: u32,
    /// Safety events held in memory while the store cannot be written (at most
    /// [`PENDING_CAPACITY`]); more are refused and counted.
    pub safety_hold_records: usize,
    /// Raise `OfflineWindowLow` below this window; `None` never raises it.
    pub offline_window_threshold: Option<Duration>,
    /// Time constant of the smoothed append rates.
    pub rate_time_constant: Duration,
    /// Interval between status snapshot writes.
    pub status_interval: Duration,
    /// First wait before reopening a failed store (doubling with each failed attempt).
    pub store_retry_min: Duration,
    /// Longest wait between attempts to reopen a failed store.
    pub store_retry_max: Duration,
    /// Accepted and ignored: every open scans the log and checks each record's checksum (the
    /// recovery itself); damage is salvaged into a new epoch and quarantined either way.
    pub verify_on_open: bool,
}

impl RawQueueConfig {
    /// Defaults for a queue kept in `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        let dir = dir.into();
        Self {
            status_file: dir.join(crate::status::SNAPSHOT_FILE),
            dir,
            cache_bytes: DEFAULT_CACHE_BYTES,
            budget_bytes: DEFAULT_BUDGET_BYTES,
            share_percent: DEFAULT_SHARE_PERCENT,
            max_age: PerTier {
                safety: DEFAULT_SAFETY_MAX_AGE,
                slo: DEFAULT_SLO_MAX_AGE,
                debug: DEFAULT_DEBUG_MAX_AGE,
            },
            safety_flush_interval: DEFAULT_SAFETY_FLUSH_INTERVAL,
            bulk_flush_interval: DEFAULT_BULK_FLUSH_INTERVAL,
            max_pending_bytes: DEFAULT_MAX_PENDING_BYTES,
            max_record_bytes: DEFAULT_MAX_RECORD_BYTES,
            safety_hold_records: DEFAULT_SAFETY_HOLD_RECORDS,
            offline_window_threshold: DEFAULT_OFFLINE_WINDOW_THRESHOLD,
            rate_time_constant: DEFAULT_RATE_TIME_CONSTANT,
            status_interval: DEFAULT_STATUS_INTERVAL,
            store_retry_min: DEFAULT_STORE_RETRY_MIN,
            store_retry_max: DEFAULT_STORE_RETRY_MAX,
            verify_on_open: DEFAULT_VERIFY_ON_OPEN,
        }
    }

    /// Checks every field and the rules between them: [`QueueConfig::from_raw`].
    pub fn validate(self) -> Result<QueueConfig, ConfigError> {
        QueueConfig::from_raw(self)
    }
}

impl QueueConfig {
    /// Checks every field of `raw` and the rules between them.
    pub fn from_raw(raw: RawQueueConfig) -> Result<QueueConfig, ConfigError> {
        let bad = |key: &str, reason: &str| Err(ConfigError::new(key, reason));
        if raw.dir.as_os_str().is_empty() {
            return bad("dir", "must name a directory");
        }
        if raw.status_file.file_name().is_none() {
            return bad("status_file", "must name a file");
        }
        if raw.cache_bytes < 1024 * 1024 || raw.cache_bytes > 1024 * 1024 * 1024 {
            return bad("cache_bytes", "must be between 1 MiB and 1 GiB");
        }
        if raw.budget_bytes < MIN_BUDGET_BYTES {
            return bad("budget_bytes", "must be at least 256 KiB");
        }
        for (key, share) in [
            ("share_percent.safety", raw.share_percent.safety),
            ("share_percent.slo", raw.share_percent.slo),
            ("share_percent.debug", raw.share_percent.debug),
        ] {
            if share == 0 || share > 100 {
                return bad(key, "must be between 1 and 100");
            }
        }
        for (key, age) in [
            ("max_age.safety", raw.max_age.safety),
            ("max_age.slo", raw.max_age.slo),
            ("max_age.debug", raw.max_age.debug),
        ] {
            if age.is_some_and(|age| age < Duration::from_secs(1)) {
                return bad(key, "must be at least one second");
            }
        }
        if raw.safety_flush_interval.is_zero()
            || raw.safety_flush_interval > raw.bulk_flush_interval
        {
            return bad(
                "safety_flush_interval",
                "must be positive and no longer than bulk_flush_interval",
            );
        }
        if raw.bulk_flush_interval > Duration::from_secs(60) {
            return bad("bulk_flush_interval", "must be at most 60 s");
        }
        if raw.max_record_bytes < 64 || u64::from(raw.max_record_bytes) > 4 * 1024 * 1024 {
            return bad("max_record_bytes", "must be between 64 B and 4 MiB");
        }
        if raw.max_pending_bytes < u64::from(raw.max_record_bytes) * 2 {
            return bad(
                "max_pending_bytes",
                "must hold at least two largest records",
            );
        }
        if raw.max_pending_bytes > raw.budget_bytes {
            return bad("max_pending_bytes", "must not exceed budget_bytes");
        }
        if raw.safety_hold_records == 0 || raw.safety_hold_records > PENDING_CAPACITY {
            return bad("safety_hold_records", "must be between 1 and 4096");
        }
        if raw.store_retry_min.is_zero() {
            return bad(
                "store_retry_min",
                "must be positive (a zero wait is a hot retry loop)",
            );
        }
        if raw.store_retry_max < raw.store_retry_min {
            return bad("store_retry_max", "must be at least store_retry_min");
        }
        if raw.rate_time_constant < Duration::from_secs(1) {
            return bad("rate_time_constant", "must be at least one second");
        }
        let smallest_share = raw
            .share_percent
            .safety
            .min(raw.share_percent.slo)
            .min(raw.share_percent.debug);
        if raw.budget_bytes / 100 * u64::from(smallest_share)
            < u64::from(raw.max_record_bytes) + LOSS_RESERVE_BYTES
        {
            return bad(
                "budget_bytes",
                "every tier's share must hold its largest record and the loss reports",
            );
        }
        Ok(QueueConfig(raw))
    }
}

/// Settings that passed [`QueueConfig::from_raw`].
#[derive(Clone, Debug, PartialEq)]
pub struct QueueConfig(RawQueueConfig);

impl QueueConfig {
    /// The settings, as stated and accepted.
    pub fn get(&self) -> &RawQueueConfig {
        &self.0
    }

    /// Bytes tier `ix` may hold.
    pub(crate) fn cap(&self, ix: usize) -> u64 {
        self.0.budget_bytes / 100 * u64::from(*self.0.share_percent.at(ix))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        assert!(RawQueueConfig::new("/tmp/q").validate().is_ok());
    }

    #[test]
    fn the_snapshot_is_in_the_directory_by_default_and_must_name_a_file() {
        let config = RawQueueConfig::new("/tmp/q");
        assert_eq!(config.status_file, std::path::Path::new("/tmp/q/status"));
        let mut config = RawQueueConfig::new("/tmp/q");
        config.status_file = PathBuf::from("/");
        assert_eq!(config.validate().unwrap_err().key, "status_file");
    }

    #[test]
    fn a_zero_share_is_refused_and_named() {
        let mut config = RawQueueConfig::new("/tmp/q");
        config.share_percent.slo = 0;
        assert_eq!(config.validate().unwrap_err().key, "share_percent.slo");
    }

    #[test]
    fn a_safety_flush_slower_than_the_bulk_flush_is_refused() {
        let mut config = RawQueueConfig::new("/tmp/q");
        config.safety_flush_interval = Duration::from_secs(2);
        assert_eq!(config.validate().unwrap_err().key, "safety_flush_interval");
    }

    #[test]
    fn a_hold_buffer_larger_than_its_type_capacity_is_refused() {
        let mut config = RawQueueConfig::new("/tmp/q");
        config.safety_hold_records = PENDING_CAPACITY + 1;
        assert_eq!(config.validate().unwrap_err().key, "safety_hold_records");
    }

    #[test]
    fn a_budget_too_small_for_a_record_is_refused() {
        let mut config = RawQueueConfig::new("/tmp/q");
        config.budget_bytes = MIN_BUDGET_BYTES;
        config.max_record_bytes = 64 * 1024;
        config.max_pending_bytes = 128 * 1024;
        assert_eq!(config.validate().unwrap_err().key, "budget_bytes");
    }
}
