//! Agent configuration: a raw form mirroring the TOML file ([`RawConfig`]), then a validated form
//! with units in the types and cross-field checks done ([`Config::from_raw`]), following the
//! workspace's convention (`edgewatch_conventions::config`).
//!
//! Invariants:
//! - Unknown keys are errors, and every error names the key it is about (`uplink.keep_alive`).
//! - Parsing does no I/O beyond reading the one file; validation does none at all.
//! - Every default is a named constant with the reason for its value.
//! - Durations are strings of the one grammar (`keep_alive = "30s"`), each key with its bounds
//!   ([`duration_keys`]). The integer `_s`/`_ms` keys of older files still load to the same
//!   value: `Config::renamed_keys` lists them, loading logs a warning for each, `check-config`
//!   prints them, and giving both spellings of one setting is refused.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use edgewatch_conventions::config::{ConfigError, RenamedKey};
use edgewatch_conventions::duration::{DurationKey, Given, IntegerUnit};
use serde::Deserialize;

/// MQTT keepalive: a dead link is noticed within two of these (rumqttc refuses less than 5 s).
pub const DEFAULT_KEEPALIVE_S: u64 = 30;
/// rumqttc refuses keepalives below this.
pub const MIN_KEEPALIVE_S: u64 = 5;
/// MQTT carries the keepalive in 16 bits of seconds.
pub const MAX_KEEPALIVE_S: u64 = 65_535;
/// Raw (uncompressed) bytes per batch: compressed, always under the wire format's 512 KiB limit.
pub const DEFAULT_MAX_BATCH_BYTES: u64 = 256 * 1024;
/// Room for a batch's header fields (ids, version, sequence range, times) in its encoding.
const BATCH_HEADER_RESERVE: u64 = 1024;
/// Protobuf bytes around each event in a batch: its field key and a length of up to 3 bytes.
const BATCH_EVENT_OVERHEAD: u64 = 4;
/// Bytes of a zstd frame beyond its bound's estimate (frame header, checksum), rounded up.
const ZSTD_FRAME_RESERVE: u64 = 64;

/// The largest `uplink.max_batch_bytes` the framing carries with batches of `max_batch_events`
/// events: a batch of that many event bytes that does not compress at all must still fit
/// [`edgewatch_proto::framing::MAX_COMPRESSED_BYTES`] once encoded and compressed (zstd's worst
/// case above 128 KiB is the input plus 1/256 of it).
pub const fn max_batch_bytes_limit(max_batch_events: u32) -> u64 {
    let compressed = edgewatch_proto::framing::MAX_COMPRESSED_BYTES as u64 - ZSTD_FRAME_RESERVE;
    let encoded = compressed * 256 / 257;
    encoded - BATCH_HEADER_RESERVE - BATCH_EVENT_OVERHEAD * max_batch_events as u64
}
/// Events per batch: keeps a batch's decode cost at the gateway small.
pub const DEFAULT_MAX_BATCH_EVENTS: u32 = 2_000;
/// Publishes awaiting PUBACK at once; Mosquitto announces a Receive Maximum of 20.
pub const DEFAULT_INFLIGHT: u16 = 16;
/// First reconnect backoff; doubles up to the maximum, each wait drawn uniformly below it.
pub const DEFAULT_BACKOFF_MIN_MS: u64 = 1_000;
/// Longest reconnect backoff: a fleet coming back after a site outage spreads over minutes.
pub const DEFAULT_BACKOFF_MAX_MS: u64 = 300_000;
/// Random delay before the first connection, so machines powered up together do not connect together.
pub const DEFAULT_INITIAL_DELAY_MAX_MS: u64 = 10_000;
/// zstd level: fast on ARM cores, most of the ratio on repetitive telemetry.
pub const DEFAULT_COMPRESSION_LEVEL: i32 = edgewatch_proto::framing::DEFAULT_COMPRESSION_LEVEL;
/// Largest local submission accepted on the ingest socket.
pub const DEFAULT_INGEST_MAX_MESSAGE_BYTES: u32 = 64 * 1024;
/// Sustained submissions per second per client connection.
pub const DEFAULT_INGEST_RATE_PER_S: u32 = 20_000;
/// Submissions a client may send in a burst above its rate.
pub const DEFAULT_INGEST_BURST: u32 = 20_000;
/// Socket permissions: owner and group may submit.
pub const DEFAULT_INGEST_MODE: u32 = 0o660;

/// `uplink.keep_alive`: rumqttc's floor to MQTT's 16 bits of seconds.
pub const KEEP_ALIVE: DurationKey = DurationKey::new(
    "uplink.keep_alive",
    Duration::from_secs(MIN_KEEPALIVE_S),
    Duration::from_secs(MAX_KEEPALIVE_S),
)
.replacing("uplink.keepalive_s", IntegerUnit::Seconds);
/// `uplink.backoff_min`: above zero (a zero backoff is a hot reconnect loop), at most an hour.
pub const BACKOFF_MIN: DurationKey = DurationKey::new(
    "uplink.backoff_min",
    Duration::from_millis(1),
    Duration::from_secs(3_600),
)
.replacing("uplink.backoff_min_ms", IntegerUnit::Milliseconds);
/// `uplink.backoff_max`: at least `uplink.backoff_min`, at most a day.
pub const BACKOFF_MAX: DurationKey = DurationKey::new(
    "uplink.backoff_max",
    Duration::from_millis(1),
    Duration::from_secs(86_400),
)
.replacing("uplink.backoff_max_ms", IntegerUnit::Milliseconds);
/// `uplink.initial_delay_max`: 0 (connect at once) to an hour.
pub const INITIAL_DELAY_MAX: DurationKey = DurationKey::new(
    "uplink.initial_delay_max",
    Duration::ZERO,
    Duration::from_secs(3_600),
)
.replacing("uplink.initial_delay_max_ms", IntegerUnit::Milliseconds);
/// `queue.safety_flush`: positive, at most a minute (and at most `queue.bulk_flush`).
pub const SAFETY_FLUSH: DurationKey = DurationKey::new(
    "queue.safety_flush",
    Duration::from_millis(1),
    Duration::from_secs(60),
)
.replacing("queue.safety_flush_ms", IntegerUnit::Milliseconds);
/// `queue.bulk_flush`: positive, at most a minute.
pub const BULK_FLUSH: DurationKey = DurationKey::new(
    "queue.bulk_flush",
    Duration::from_millis(1),
    Duration::from_secs(60),
)
.replacing("queue.bulk_flush_ms", IntegerUnit::Milliseconds);
/// `queue.offline_window_alarm`: 0 disables the alarm; at most a year.
pub const OFFLINE_WINDOW_ALARM: DurationKey = DurationKey::new(
    "queue.offline_window_alarm",
    Duration::ZERO,
    Duration::from_secs(365 * 86_400),
)
.replacing("queue.offline_window_alarm_s", IntegerUnit::Seconds);
/// `queue.max_age.safety`: 0 keeps records until delivered or evicted; else at least a second
/// (the queue's own rule), at most ten years.
pub const MAX_AGE_SAFETY: DurationKey = DurationKey::new(
    "queue.max_age.safety",
    Duration::ZERO,
    Duration::from_secs(3_650 * 86_400),
)
.replacing("queue.max_age_s.safety", IntegerUnit::Seconds);
/// `queue.max_age.slo`: as `queue.max_age.safety`.
pub const MAX_AGE_SLO: DurationKey = DurationKey::new(
    "queue.max_age.slo",
    Duration::ZERO,
    Duration::from_secs(3_650 * 86_400),
)
.replacing("queue.max_age_s.slo", IntegerUnit::Seconds);
/// `queue.max_age.debug`: as `queue.max_age.safety`.
pub const MAX_AGE_DEBUG: DurationKey = DurationKey::new(
    "queue.max_age.debug",
    Duration::ZERO,
    Duration::from_secs(3_650 * 86_400),
)
.replacing("queue.max_age_s.debug", IntegerUnit::Seconds);
/// The duration keys of the agent's own tables.
const OWN_DURATION_KEYS: [DurationKey; 10] = [
    KEEP_ALIVE,
    BACKOFF_MIN,
    BACKOFF_MAX,
    INITIAL_DELAY_MAX,
    SAFETY_FLUSH,
    BULK_FLUSH,
    OFFLINE_WINDOW_ALARM,
    MAX_AGE_SAFETY,
    MAX_AGE_SLO,
    MAX_AGE_DEBUG,
];

/// Every duration key of the agent's file, the samplers' `[deadline]` and `[thermal]` included.
pub fn duration_keys() -> impl Iterator<Item = DurationKey> {
    OWN_DURATION_KEYS
        .into_iter()
        .chain(edgewatch_samplers::deadline::config::DURATION_KEYS)
        .chain(edgewatch_samplers::thermal::config::DURATION_KEYS)
}

/// Why the agent's configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file was read and its configuration refused.
    #[error(transparent)]
    Refused(#[from] ConfigError),
}

impl LoadError {
    /// The key the error is about.
    pub fn key(&self) -> Option<&str> {
        match self {
            Self::Read { .. } => None,
            Self::Refused(error) => Some(error.key()),
        }
    }
}

/// The value of one duration key, under either spelling, or `default`.
fn resolve(
    key: &DurationKey,
    text: Option<&String>,
    integer: Option<u64>,
    default: Duration,
) -> Result<Given, ConfigError> {
    Ok(key
        .resolve(text.map(String::as_str), integer)?
        .unwrap_or(Given {
            value: default,
            key: key.name,
        }))
}

// ---------------------------------------------------------------------------------------------
// Raw form: mirrors the file.

/// The agent's file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    machine: RawMachine,
    queue: RawQueueSettings,
    uplink: RawUplink,
    #[serde(default)]
    scheduling: RawScheduling,
    #[serde(default)]
    ingest: RawIngest,
    #[serde(default)]
    status: RawStatus,
    #[serde(default)]
    deadline: edgewatch_samplers::deadline::RawDeadlineConfig,
    #[serde(default)]
    probe: Vec<edgewatch_samplers::deadline::RawProbeConfig>,
    #[serde(default)]
    model: edgewatch_samplers::model::RawModelConfig,
    #[serde(default)]
    thermal: edgewatch_samplers::thermal::RawThermalConfig,
}

impl RawConfig {
    /// The deprecated keys the file uses, in the order of its tables.
    pub fn renamed_keys(&self) -> Vec<RenamedKey> {
        let q = &self.queue;
        let u = &self.uplink;
        let mut renamed: Vec<RenamedKey> = [
            (MAX_AGE_SAFETY, q.max_age_s.safety.is_some()),
            (MAX_AGE_SLO, q.max_age_s.slo.is_some()),
            (MAX_AGE_DEBUG, q.max_age_s.debug.is_some()),
            (SAFETY_FLUSH, q.safety_flush_ms.is_some()),
            (BULK_FLUSH, q.bulk_flush_ms.is_some()),
            (OFFLINE_WINDOW_ALARM, q.offline_window_alarm_s.is_some()),
            (KEEP_ALIVE, u.keepalive_s.is_some()),
            (BACKOFF_MIN, u.backoff_min_ms.is_some()),
            (BACKOFF_MAX, u.backoff_max_ms.is_some()),
            (INITIAL_DELAY_MAX, u.initial_delay_max_ms.is_some()),
        ]
        .into_iter()
        .filter(|(_, used)| *used)
        .filter_map(|(key, _)| key.renamed())
        .collect();
        renamed.extend(self.deadline.renamed_keys());
        renamed.extend(self.thermal.renamed_keys());
        renamed
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMachine {
    id: String,
    site: String,
    class: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawQueueSettings {
    dir: PathBuf,
    budget_bytes: Option<u64>,
    cache_bytes: Option<u64>,
    max_record_bytes: Option<u32>,
    /// Safety events held in memory while the store cannot be opened or written.
    safety_hold_records: Option<usize>,
    #[serde(default)]
    share_percent: RawPerTier<u8>,
    /// "0s" keeps records until delivered or evicted.
    #[serde(default)]
    max_age: RawPerTier<String>,
    /// Deprecated spelling of `max_age`: seconds.
    #[serde(default)]
    max_age_s: RawPerTier<u64>,
    safety_flush: Option<String>,
    /// Deprecated spelling of `safety_flush`: ms.
    safety_flush_ms: Option<u64>,
    bulk_flush: Option<String>,
    /// Deprecated spelling of `bulk_flush`: ms.
    bulk_flush_ms: Option<u64>,
    /// "0s" disables the alarm.
    offline_window_alarm: Option<String>,
    /// Deprecated spelling of `offline_window_alarm`: seconds.
    offline_window_alarm_s: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPerTier<T> {
    safety: Option<T>,
    slo: Option<T>,
    debug: Option<T>,
}

impl<T> Default for RawPerTier<T> {
    fn default() -> Self {
        Self {
            safety: None,
            slo: None,
            debug: None,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUplink {
    host: String,
    port: u16,
    client_id: Option<String>,
    keep_alive: Option<String>,
    /// Deprecated spelling of `keep_alive`: seconds.
    keepalive_s: Option<u64>,
    tls: Option<RawTls>,
    #[serde(default = "default_max_batch_bytes")]
    max_batch_bytes: u64,
    #[serde(default = "default_max_batch_events")]
    max_batch_events: u32,
    #[serde(default = "default_inflight")]
    inflight: u16,
    /// 0 = unlimited.
    #[serde(default)]
    bandwidth_bytes_per_s: u64,
    backoff_min: Option<String>,
    /// Deprecated spelling of `backoff_min`: ms.
    backoff_min_ms: Option<u64>,
    backoff_max: Option<String>,
    /// Deprecated spelling of `backoff_max`: ms.
    backoff_max_ms: Option<u64>,
    initial_delay_max: Option<String>,
    /// Deprecated spelling of `initial_delay_max`: ms.
    initial_delay_max_ms: Option<u64>,
    #[serde(default = "default_compression_level")]
    compression_level: i32,
    #[serde(default = "default_true")]
    retry_when_no_subscribers: bool,
    #[serde(default)]
    topics: RawTopics,
}

/// Topic overrides, for brokers that remap topics (bridges, mount points).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTopics {
    safety: Option<String>,
    slo: Option<String>,
    debug: Option<String>,
    status: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScheduling {
    #[serde(default)]
    cores: Vec<usize>,
    #[serde(default)]
    control_loop_cores: Vec<usize>,
    #[serde(default = "default_true")]
    idle_priority: bool,
}

impl Default for RawScheduling {
    fn default() -> Self {
        Self {
            cores: Vec::new(),
            control_loop_cores: Vec::new(),
            idle_priority: true,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawIngest {
    socket: Option<PathBuf>,
    group: Option<String>,
    mode: Option<u32>,
    max_message_bytes: Option<u32>,
    rate_per_s: Option<u32>,
    burst: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStatus {
    file: Option<PathBuf>,
}

fn default_max_batch_bytes() -> u64 {
    DEFAULT_MAX_BATCH_BYTES
}
fn default_max_batch_events() -> u32 {
    DEFAULT_MAX_BATCH_EVENTS
}
fn default_inflight() -> u16 {
    DEFAULT_INFLIGHT
}
fn default_compression_level() -> i32 {
    DEFAULT_COMPRESSION_LEVEL
}
fn default_true() -> bool {
    true
}

// ---------------------------------------------------------------------------------------------
// Validated form.

/// The agent's validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Who this machine is.
    pub machine: Machine,
    /// Where the queue lives.
    pub queue: QueueSettings,
    /// How to reach the broker.
    pub uplink: Uplink,
    /// Where the agent may run.
    pub scheduling: Scheduling,
    /// The local event socket.
    pub ingest: Ingest,
    /// Where `run` publishes its status for `status`.
    pub status_file: PathBuf,
    /// Control-loop probes and the deadline sampler.
    pub deadline: edgewatch_samplers::deadline::DeadlineConfig,
    /// The model manifest, if any.
    pub model: Option<edgewatch_samplers::model::ModelConfig>,
    /// Thermal and power sampling.
    pub thermal: edgewatch_samplers::thermal::ThermalConfig,
    /// Deprecated keys the file uses (they loaded to the same values as their new spelling).
    pub renamed_keys: Vec<RenamedKey>,
}

/// Identity of the machine, as the broker and gateway see it.
#[derive(Debug, Clone)]
pub struct Machine {
    /// Machine id (the certificate's CN under mTLS).
    pub id: String,
    /// Site id.
    pub site: String,
    /// Machine class, the SLO and cost grouping key.
    pub class: String,
}

/// File name of the status file in the queue directory when `[status] file` is not set.
pub const DEFAULT_STATUS_FILE_NAME: &str = "agent-status.json";
/// File name of the queue's status snapshot, beside the agent's status file.
pub const QUEUE_STATUS_FILE_NAME: &str = "queue-status";

/// Where the queue's status snapshot goes: beside the agent's status file (`status_file`), so
/// both volatile files, rewritten every second, share its place (tmpfs when packaged: no flash
/// writes) and the queue directory holds only what must survive.
pub fn queue_status_file(status_file: &Path) -> PathBuf {
    status_file.with_file_name(QUEUE_STATUS_FILE_NAME)
}

/// Queue settings, validated by the queue itself.
#[derive(Debug, Clone)]
pub struct QueueSettings {
    /// Directory holding the queue database (and its quarantine folder).
    pub dir: PathBuf,
    /// The queue's own configuration.
    pub queue: edgewatch_queue::QueueConfig,
}

/// mTLS material.
#[derive(Debug, Clone)]
pub struct Tls {
    /// CA certificate (PEM) that signed the broker's certificate.
    pub ca: PathBuf,
    /// This machine's certificate (PEM).
    pub cert: PathBuf,
    /// This machine's private key (PEM).
    pub key: PathBuf,
}

/// Uplink settings.
#[derive(Debug, Clone)]
pub struct Uplink {
    /// Broker host name or address.
    pub host: String,
    /// Broker port.
    pub port: u16,
    /// MQTT client id (defaults to the machine id).
    pub client_id: String,
    /// MQTT keepalive.
    pub keepalive: Duration,
    /// mTLS, when set.
    pub tls: Option<Tls>,
    /// Uncompressed bytes per batch.
    pub max_batch_bytes: usize,
    /// Events per batch.
    pub max_batch_events: usize,
    /// Publishes awaiting acknowledgement at once.
    pub inflight: u16,
    /// Bandwidth cap in bytes per second (MQTT packets), `None` for unlimited.
    pub bandwidth_bytes_per_s: Option<u64>,
    /// First reconnect backoff.
    pub backoff_min: Duration,
    /// Longest reconnect backoff.
    pub backoff_max: Duration,
    /// Upper bound of the random delay before the first connection.
    pub initial_delay_max: Duration,
    /// zstd level.
    pub compression_level: i32,
    /// Keep and retry a batch the broker took but had no subscriber for (PUBACK 0x10).
    pub retry_when_no_subscribers: bool,
    /// Topics replacing the standard ones, by `safety`, `slo`, `debug` or `status`.
    pub topic_overrides: std::collections::BTreeMap<&'static str, String>,
}

/// Placement of the agent on the machine's cores.
#[derive(Debug, Clone)]
pub struct Scheduling {
    /// Cores the agent may run on; empty means "leave affinity alone".
    pub cores: BTreeSet<usize>,
    /// Cores that run control loops; the agent refuses to share any of them.
    pub control_loop_cores: BTreeSet<usize>,
    /// SCHED_IDLE and the idle I/O class.
    pub idle_priority: bool,
}

/// The local ingest socket.
#[derive(Debug, Clone)]
pub struct Ingest {
    /// Socket path.
    pub socket: PathBuf,
    /// Group that may write to it (chgrp), if any.
    pub group: Option<String>,
    /// Socket file mode.
    pub mode: u32,
    /// Largest submission accepted.
    pub max_message_bytes: usize,
    /// Sustained submissions per second per connection.
    pub rate_per_s: u32,
    /// Burst above the rate.
    pub burst: u32,
}

impl Config {
    /// Reads and validates a configuration file.
    pub fn load(path: &Path) -> Result<Self, LoadError> {
        let text = std::fs::read_to_string(path).map_err(|source| LoadError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Parses and validates configuration text; `path` is used in messages only. Each deprecated
    /// key the text uses is logged as a warning naming its new spelling.
    pub fn parse(text: &str, path: &Path) -> Result<Self, LoadError> {
        let deserializer = toml::Deserializer::parse(text)
            .map_err(|error| ConfigError::new("", error.to_string()).in_file(path))?;
        let raw: RawConfig = serde_path_to_error::deserialize(deserializer).map_err(|error| {
            ConfigError::new(error.path().to_string(), error.inner().message()).in_file(path)
        })?;
        let config = Self::from_raw(raw).map_err(|error| error.in_file(path))?;
        for renamed in &config.renamed_keys {
            tracing::warn!(
                file = %path.display(),
                old = renamed.old,
                new = renamed.new,
                "A configuration key has a new name; the old one still loads. Rename it."
            );
        }
        Ok(config)
    }
}

impl RawQueueSettings {
    fn into_queue_config(
        self,
        status_file: PathBuf,
    ) -> Result<edgewatch_queue::QueueConfig, ConfigError> {
        let mut config = edgewatch_queue::RawQueueConfig::new(self.dir);
        config.status_file = status_file;
        if let Some(value) = self.budget_bytes {
            config.budget_bytes = value;
        }
        if let Some(value) = self.cache_bytes {
            config.cache_bytes = value;
        }
        if let Some(value) = self.max_record_bytes {
            config.max_record_bytes = value;
        }
        if let Some(value) = self.safety_hold_records {
            config.safety_hold_records = value;
        }
        let shares = self.share_percent;
        config.share_percent.safety = shares.safety.unwrap_or(config.share_percent.safety);
        config.share_percent.slo = shares.slo.unwrap_or(config.share_percent.slo);
        config.share_percent.debug = shares.debug.unwrap_or(config.share_percent.debug);
        // Zero: keep records until delivered or evicted.
        let age = |key: &DurationKey, text: Option<&String>, seconds: Option<u64>, default| {
            key.resolve(text.map(String::as_str), seconds)
                .map(|given| match given {
                    Some(given) => (Some(given.value).filter(|v| !v.is_zero()), given.key),
                    None => (default, key.name),
                })
        };
        let (safety, safety_key) = age(
            &MAX_AGE_SAFETY,
            self.max_age.safety.as_ref(),
            self.max_age_s.safety,
            config.max_age.safety,
        )?;
        let (slo, slo_key) = age(
            &MAX_AGE_SLO,
            self.max_age.slo.as_ref(),
            self.max_age_s.slo,
            config.max_age.slo,
        )?;
        let (debug, debug_key) = age(
            &MAX_AGE_DEBUG,
            self.max_age.debug.as_ref(),
            self.max_age_s.debug,
            config.max_age.debug,
        )?;
        config.max_age.safety = safety;
        config.max_age.slo = slo;
        config.max_age.debug = debug;
        let safety_flush = resolve(
            &SAFETY_FLUSH,
            self.safety_flush.as_ref(),
            self.safety_flush_ms,
            config.safety_flush_interval,
        )?;
        config.safety_flush_interval = safety_flush.value;
        let bulk_flush = resolve(
            &BULK_FLUSH,
            self.bulk_flush.as_ref(),
            self.bulk_flush_ms,
            config.bulk_flush_interval,
        )?;
        config.bulk_flush_interval = bulk_flush.value;
        if let Some(alarm) = OFFLINE_WINDOW_ALARM.resolve(
            self.offline_window_alarm.as_deref(),
            self.offline_window_alarm_s,
        )? {
            config.offline_window_threshold = Some(alarm.value).filter(|v| !v.is_zero());
        }
        config.validate().map_err(|error| {
            // The queue names its own fields; give them the file's names, as the file spells them.
            let key = match error.key.as_str() {
                "dir" => "queue.dir".to_owned(),
                // The queue's snapshot goes beside the agent's status file.
                "status_file" => "status.file".to_owned(),
                "max_age.safety" => safety_key.to_owned(),
                "max_age.slo" => slo_key.to_owned(),
                "max_age.debug" => debug_key.to_owned(),
                "safety_flush_interval" => safety_flush.key.to_owned(),
                "bulk_flush_interval" => bulk_flush.key.to_owned(),
                other => format!("queue.{other}"),
            };
            ConfigError::new(key, error.reason)
        })
    }
}

impl Config {
    /// Checks every value and cross-field rule of `raw`; the error names the first bad key.
    pub fn from_raw(raw: RawConfig) -> Result<Config, ConfigError> {
        use edgewatch_proto::topic::validate_id;
        let renamed_keys = raw.renamed_keys();
        validate_id(&raw.machine.id).map_err(|e| ConfigError::new("machine.id", e.to_string()))?;
        validate_id(&raw.machine.site)
            .map_err(|e| ConfigError::new("machine.site", e.to_string()))?;
        validate_id(&raw.machine.class)
            .map_err(|e| ConfigError::new("machine.class", e.to_string()))?;
        let status_file = raw
            .status
            .file
            .clone()
            .unwrap_or_else(|| raw.queue.dir.join(DEFAULT_STATUS_FILE_NAME));
        let queue = raw
            .queue
            .into_queue_config(queue_status_file(&status_file))?;
        let deadline = raw.deadline.validate(&raw.probe)?;
        let model = raw.model.validate()?;
        let thermal = raw.thermal.validate()?;

        let uplink = raw.uplink;
        if uplink.host.is_empty() {
            return Err(ConfigError::new("uplink.host", "must not be empty"));
        }
        if uplink.port == 0 {
            return Err(ConfigError::new("uplink.port", "must not be 0"));
        }
        let keepalive = resolve(
            &KEEP_ALIVE,
            uplink.keep_alive.as_ref(),
            uplink.keepalive_s,
            Duration::from_secs(DEFAULT_KEEPALIVE_S),
        )?
        .value;
        if uplink.max_batch_events == 0
            || uplink.max_batch_events as usize > edgewatch_proto::framing::MAX_EVENTS_PER_BATCH
        {
            return Err(ConfigError::new(
                "uplink.max_batch_events",
                format!(
                    "must be between 1 and {}",
                    edgewatch_proto::framing::MAX_EVENTS_PER_BATCH
                ),
            ));
        }
        let max_raw = max_batch_bytes_limit(uplink.max_batch_events);
        if uplink.max_batch_bytes < 1024 || uplink.max_batch_bytes > max_raw {
            return Err(ConfigError::new(
                "uplink.max_batch_bytes",
                format!(
                    "must be between 1024 and {max_raw} bytes (with uplink.max_batch_events = {}): \
                     a batch that does not compress must fit the framing's {} compressed bytes",
                    uplink.max_batch_events,
                    edgewatch_proto::framing::MAX_COMPRESSED_BYTES
                ),
            ));
        }
        if uplink.inflight == 0 || uplink.inflight > 64 {
            return Err(ConfigError::new(
                "uplink.inflight",
                "must be between 1 and 64",
            ));
        }
        let backoff_min = resolve(
            &BACKOFF_MIN,
            uplink.backoff_min.as_ref(),
            uplink.backoff_min_ms,
            Duration::from_millis(DEFAULT_BACKOFF_MIN_MS),
        )?;
        let backoff_max = resolve(
            &BACKOFF_MAX,
            uplink.backoff_max.as_ref(),
            uplink.backoff_max_ms,
            Duration::from_millis(DEFAULT_BACKOFF_MAX_MS),
        )?;
        if backoff_max.value < backoff_min.value {
            return Err(ConfigError::new(
                backoff_max.key,
                format!("must not be below {}", backoff_min.key),
            ));
        }
        let initial_delay_max = resolve(
            &INITIAL_DELAY_MAX,
            uplink.initial_delay_max.as_ref(),
            uplink.initial_delay_max_ms,
            Duration::from_millis(DEFAULT_INITIAL_DELAY_MAX_MS),
        )?
        .value;
        if !(1..=19).contains(&uplink.compression_level) {
            return Err(ConfigError::new(
                "uplink.compression_level",
                "must be between 1 and 19",
            ));
        }
        if uplink.bandwidth_bytes_per_s != 0 && uplink.bandwidth_bytes_per_s < 1024 {
            return Err(ConfigError::new(
                "uplink.bandwidth_bytes_per_s",
                "must be 0 (unlimited) or at least 1024",
            ));
        }
        let client_id = uplink.client_id.unwrap_or_else(|| raw.machine.id.clone());
        if client_id.is_empty() || client_id.len() > 128 {
            return Err(ConfigError::new(
                "uplink.client_id",
                "must be 1 to 128 bytes",
            ));
        }
        let mut topic_overrides = std::collections::BTreeMap::new();
        for (name, topic) in [
            ("safety", uplink.topics.safety),
            ("slo", uplink.topics.slo),
            ("debug", uplink.topics.debug),
            ("status", uplink.topics.status),
        ] {
            let Some(topic) = topic else { continue };
            if topic.is_empty() || topic.len() > 1024 || topic.contains(['+', '#', '\0']) {
                return Err(ConfigError::new(
                    format!("uplink.topics.{name}"),
                    "must be a non-empty topic name without wildcards",
                ));
            }
            topic_overrides.insert(name, topic);
        }
        let tls = uplink.tls.map(|tls| Tls {
            ca: tls.ca,
            cert: tls.cert,
            key: tls.key,
        });

        let cores: BTreeSet<usize> = raw.scheduling.cores.iter().copied().collect();
        let control_loop_cores: BTreeSet<usize> =
            raw.scheduling.control_loop_cores.iter().copied().collect();
        if let Some(shared) = cores.intersection(&control_loop_cores).next() {
            return Err(ConfigError::new(
                "scheduling.cores",
                format!(
                    "core {shared} is also in scheduling.control_loop_cores; the agent never shares a core with a control loop"
                ),
            ));
        }
        if cores.is_empty() && !control_loop_cores.is_empty() {
            return Err(ConfigError::new(
                "scheduling.cores",
                "must list the agent's cores when scheduling.control_loop_cores is set",
            ));
        }

        let ingest = raw.ingest;
        let mode = ingest.mode.unwrap_or(DEFAULT_INGEST_MODE);
        if mode > 0o777 || mode & 0o002 != 0 {
            return Err(ConfigError::new(
                "ingest.mode",
                "must be a file mode without write access for others (e.g. 0o660)",
            ));
        }
        let max_message_bytes = ingest
            .max_message_bytes
            .unwrap_or(DEFAULT_INGEST_MAX_MESSAGE_BYTES);
        if !(64..=1024 * 1024).contains(&max_message_bytes) {
            return Err(ConfigError::new(
                "ingest.max_message_bytes",
                "must be between 64 and 1048576",
            ));
        }
        let rate_per_s = ingest.rate_per_s.unwrap_or(DEFAULT_INGEST_RATE_PER_S);
        if rate_per_s == 0 {
            return Err(ConfigError::new("ingest.rate_per_s", "must be above 0"));
        }
        let burst = ingest.burst.unwrap_or(DEFAULT_INGEST_BURST).max(1);

        let socket = ingest
            .socket
            .unwrap_or_else(|| queue.get().dir.join("agent.sock"));
        Ok(Config {
            machine: Machine {
                id: raw.machine.id,
                site: raw.machine.site,
                class: raw.machine.class,
            },
            queue: QueueSettings {
                dir: queue.get().dir.clone(),
                queue,
            },
            uplink: Uplink {
                host: uplink.host,
                port: uplink.port,
                client_id,
                keepalive,
                tls,
                max_batch_bytes: usize::try_from(uplink.max_batch_bytes).unwrap_or(usize::MAX),
                max_batch_events: uplink.max_batch_events as usize,
                inflight: uplink.inflight,
                bandwidth_bytes_per_s: (uplink.bandwidth_bytes_per_s != 0)
                    .then_some(uplink.bandwidth_bytes_per_s),
                backoff_min: backoff_min.value,
                backoff_max: backoff_max.value,
                initial_delay_max,
                compression_level: uplink.compression_level,
                retry_when_no_subscribers: uplink.retry_when_no_subscribers,
                topic_overrides,
            },
            scheduling: Scheduling {
                cores,
                control_loop_cores,
                idle_priority: raw.scheduling.idle_priority,
            },
            ingest: Ingest {
                socket,
                group: ingest.group,
                mode,
                max_message_bytes: max_message_bytes as usize,
                rate_per_s,
                burst,
            },
            status_file,
            deadline,
            model,
            thermal,
            renamed_keys,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
[machine]
id = "truck-17"
site = "pit-3"
class = "haul-truck"

[queue]
dir = "/var/lib/edgewatch"

[uplink]
host = "broker.local"
port = 8883
"#;

    fn parse(text: &str) -> Result<Config, LoadError> {
        Config::parse(text, Path::new("agent.toml"))
    }

    #[test]
    fn a_minimal_file_gets_documented_defaults() {
        let config = parse(MINIMAL).unwrap();
        assert_eq!(config.uplink.client_id, "truck-17");
        assert_eq!(
            config.uplink.keepalive,
            Duration::from_secs(DEFAULT_KEEPALIVE_S)
        );
        assert_eq!(config.uplink.inflight, DEFAULT_INFLIGHT);
        assert_eq!(config.uplink.bandwidth_bytes_per_s, None);
        assert_eq!(
            config.ingest.socket,
            Path::new("/var/lib/edgewatch/agent.sock")
        );
        assert_eq!(
            config.queue.queue.get().budget_bytes,
            edgewatch_queue::config::DEFAULT_BUDGET_BYTES
        );
        assert_eq!(config.ingest.mode, 0o660);
        assert!(config.scheduling.idle_priority);
    }

    #[test]
    fn an_unknown_key_is_named_with_its_section() {
        let error = parse(&format!("{MINIMAL}keepalive = 3\n")).unwrap_err();
        assert_eq!(error.key(), Some("uplink.keepalive"));
        assert!(error.to_string().contains("unknown field"), "{error}");
        let error = parse(&MINIMAL.replace("[queue]", "[queue]\nbudget_typo = 1")).unwrap_err();
        assert_eq!(error.key(), Some("queue.budget_typo"));
        assert!(error.to_string().contains("budget_typo"), "{error}");
    }

    #[test]
    fn a_wrong_type_is_named_by_its_full_key() {
        let error = parse(&MINIMAL.replace("port = 8883", "port = \"eighty\"")).unwrap_err();
        assert_eq!(error.key(), Some("uplink.port"));
    }

    #[test]
    fn a_missing_section_is_named() {
        let error = parse("[machine]\nid = \"m\"\nsite = \"s\"\nclass = \"c\"\n").unwrap_err();
        assert!(error.to_string().contains("queue"), "{error}");
    }

    #[test]
    fn out_of_range_values_are_refused_by_key() {
        for (edit, key) in [
            ("port = 8883\nkeepalive_s = 2", "uplink.keepalive_s"),
            ("port = 8883\ninflight = 0", "uplink.inflight"),
            ("port = 8883\nbackoff_min_ms = 0", "uplink.backoff_min_ms"),
            (
                "port = 8883\nmax_batch_bytes = 10",
                "uplink.max_batch_bytes",
            ),
            (
                "port = 8883\nmax_batch_bytes = 2097152",
                "uplink.max_batch_bytes",
            ),
            (
                "port = 8883\nbandwidth_bytes_per_s = 5",
                "uplink.bandwidth_bytes_per_s",
            ),
            ("port = 0", "uplink.port"),
        ] {
            let error = parse(&MINIMAL.replace("port = 8883", edit)).unwrap_err();
            assert_eq!(error.key(), Some(key), "{edit}: {error}");
        }
        let error = parse(&MINIMAL.replace("truck-17", "truck/17")).unwrap_err();
        assert_eq!(error.key(), Some("machine.id"));
        let error = parse(&MINIMAL.replace("[queue]", "[queue]\nbudget_bytes = 10")).unwrap_err();
        assert_eq!(error.key(), Some("queue.budget_bytes"));
        let error = parse(&MINIMAL.replace("[queue]", "[queue]\nsafety_flush_ms = 0")).unwrap_err();
        assert_eq!(error.key(), Some("queue.safety_flush_ms"));
    }

    #[test]
    fn the_safety_hold_is_a_key_bounded_by_the_append_index() {
        let config = parse(MINIMAL).unwrap();
        assert_eq!(
            config.queue.queue.get().safety_hold_records,
            edgewatch_queue::config::DEFAULT_SAFETY_HOLD_RECORDS
        );
        let config =
            parse(&MINIMAL.replace("[queue]", "[queue]\nsafety_hold_records = 100")).unwrap();
        assert_eq!(config.queue.queue.get().safety_hold_records, 100);
        for bad in ["0", "4097"] {
            let text = MINIMAL.replace("[queue]", &format!("[queue]\nsafety_hold_records = {bad}"));
            let error = parse(&text).unwrap_err();
            assert_eq!(error.key(), Some("queue.safety_hold_records"), "{bad}");
        }
    }

    #[test]
    fn agent_cores_overlapping_a_control_loop_core_are_refused() {
        let text =
            format!("{MINIMAL}\n[scheduling]\ncores = [0, 1]\ncontrol_loop_cores = [1, 2]\n");
        let error = parse(&text).unwrap_err();
        assert_eq!(error.key(), Some("scheduling.cores"));
        assert!(error.to_string().contains("core 1"), "{error}");
        let text = format!("{MINIMAL}\n[scheduling]\ncores = [0]\ncontrol_loop_cores = [1, 2]\n");
        assert!(parse(&text).is_ok());
    }

    #[test]
    fn probe_and_sampler_keys_are_named_in_errors() {
        let text = format!("{MINIMAL}\n[deadline]\npoll_hz = 0\n");
        assert_eq!(parse(&text).unwrap_err().key(), Some("deadline.poll_hz"));
        let text = format!("{MINIMAL}\n[[probe]]\nloop_name = \"x\"\n");
        assert_eq!(parse(&text).unwrap_err().key(), Some("probe[0].path"));
        let text = format!("{MINIMAL}\n[[probe]]\npath = \"/dev/shm/a.probe\"\nwhat = 1\n");
        assert_eq!(parse(&text).unwrap_err().key(), Some("probe[0].what"));
    }

    /// Issue 15, item 3: up to 2 MiB used to be accepted, and an incompressible batch of that
    /// size could never be sent (the framing carries 512 KiB compressed).
    #[test]
    fn a_batch_size_the_framing_cannot_carry_is_refused() {
        let limit = max_batch_bytes_limit(DEFAULT_MAX_BATCH_EVENTS);
        let at = |bytes: u64| {
            MINIMAL.replace(
                "port = 8883",
                &format!("port = 8883\nmax_batch_bytes = {bytes}"),
            )
        };
        assert!(parse(&at(limit)).is_ok());
        let error = parse(&at(limit + 1)).unwrap_err();
        assert_eq!(error.key(), Some("uplink.max_batch_bytes"));
        assert!(error.to_string().contains("524288"), "{error}");
        // Fewer events per batch leave room for more bytes, never past the framing.
        let fewer = MINIMAL.replace(
            "port = 8883",
            &format!(
                "port = 8883\nmax_batch_events = 1\nmax_batch_bytes = {}",
                limit + 7_996
            ),
        );
        assert!(parse(&fewer).is_ok());
        assert!(max_batch_bytes_limit(1) < edgewatch_proto::framing::MAX_COMPRESSED_BYTES as u64);
        // Ten thousand incompressible events of the largest size, encoded and compressed, fit.
        let worst = max_batch_bytes_limit(10_000);
        let encoded = worst + BATCH_HEADER_RESERVE + 4 * 10_000;
        assert!(encoded + encoded / 256 + ZSTD_FRAME_RESERVE <= 524_288);
    }

    #[test]
    fn incompressible_batches_at_the_limit_fit_the_framing() {
        use edgewatch_proto::framing::{BatchEncoder, MAX_COMPRESSED_BYTES};
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut random = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        };
        for events in [1u32, 2_000, 10_000] {
            let limit = max_batch_bytes_limit(events) as usize;
            let size = limit / events as usize;
            let bodies: Vec<Vec<u8>> = (0..events)
                .map(|_| (0..size).map(|_| random()).collect())
                .collect();
            let header = edgewatch_proto::v1::Batch {
                schema_version: edgewatch_proto::SCHEMA_VERSION,
                machine_id: "m".repeat(64),
                site_id: "s".repeat(64),
                agent_epoch: u64::MAX,
                tier: edgewatch_proto::v1::Tier::Debug as i32,
                first_seq: u64::MAX - 20_000,
                last_seq: u64::MAX - 20_000 + u64::from(events) - 1,
                sent_time_unix_ns: i64::MAX,
                events: Vec::new(),
                machine_class: "c".repeat(64),
                agent_version: "0.1.0".into(),
            };
            let mut out = Vec::new();
            BatchEncoder::new(19)
                .unwrap()
                .encode_spliced(
                    &header,
                    bodies.iter().map(Vec::as_slice),
                    MAX_COMPRESSED_BYTES,
                    &mut out,
                )
                .unwrap_or_else(|error| panic!("{events} events of {size} bytes: {error}"));
        }
    }

    #[test]
    fn a_world_writable_socket_is_refused() {
        let text = format!("{MINIMAL}\n[ingest]\nmode = 0o666\n");
        assert_eq!(parse(&text).unwrap_err().key(), Some("ingest.mode"));
    }
}
