//! Agent configuration: a raw form mirroring the TOML file, then a validated form with units in the
//! types and cross-field checks done.
//!
//! Invariants:
//! - Unknown keys are errors, and every error names the key it is about (`uplink.keepalive_s`).
//! - Parsing does no I/O beyond reading the one file; validation does none at all.
//! - Every default is a named constant with the reason for its value.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// MQTT keepalive: a dead link is noticed within two of these (rumqttc refuses less than 5 s).
pub const DEFAULT_KEEPALIVE_S: u64 = 30;
/// rumqttc refuses keepalives below this.
pub const MIN_KEEPALIVE_S: u64 = 5;
/// Raw (uncompressed) bytes per batch: compressed, always under the wire format's 512 KiB limit.
pub const DEFAULT_MAX_BATCH_BYTES: u64 = 256 * 1024;
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

/// Why a configuration was refused. Each variant names the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The TOML is malformed or a key is unknown or of the wrong type.
    #[error("{path}: key `{key}`: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Dotted path of the key.
        key: String,
        /// What is wrong with it.
        message: String,
    },
    /// A value is out of range or inconsistent with another.
    #[error("key `{key}`: {message}")]
    Invalid {
        /// Dotted path of the key.
        key: String,
        /// What is wrong with it.
        message: String,
    },
}

impl ConfigError {
    fn invalid(key: &str, message: impl Into<String>) -> Self {
        Self::Invalid {
            key: key.to_owned(),
            message: message.into(),
        }
    }

    /// The key the error is about.
    pub fn key(&self) -> Option<&str> {
        match self {
            Self::Read { .. } => None,
            Self::Parse { key, .. } | Self::Invalid { key, .. } => Some(key),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Raw form: mirrors the file.

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    machine: RawMachine,
    queue: RawQueue,
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMachine {
    id: String,
    site: String,
    class: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawQueue {
    dir: PathBuf,
    budget_bytes: Option<u64>,
    cache_bytes: Option<u64>,
    max_record_bytes: Option<u32>,
    #[serde(default)]
    share_percent: RawPerTier<u8>,
    #[serde(default)]
    max_age_s: RawPerTier<u64>,
    safety_flush_ms: Option<u64>,
    bulk_flush_ms: Option<u64>,
    /// 0 disables the alarm.
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
    #[serde(default = "default_keepalive_s")]
    keepalive_s: u64,
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
    #[serde(default = "default_backoff_min_ms")]
    backoff_min_ms: u64,
    #[serde(default = "default_backoff_max_ms")]
    backoff_max_ms: u64,
    #[serde(default = "default_initial_delay_max_ms")]
    initial_delay_max_ms: u64,
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

fn default_keepalive_s() -> u64 {
    DEFAULT_KEEPALIVE_S
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
fn default_backoff_min_ms() -> u64 {
    DEFAULT_BACKOFF_MIN_MS
}
fn default_backoff_max_ms() -> u64 {
    DEFAULT_BACKOFF_MAX_MS
}
fn default_initial_delay_max_ms() -> u64 {
    DEFAULT_INITIAL_DELAY_MAX_MS
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
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Parses and validates configuration text; `path` is used in messages only.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let deserializer = toml::Deserializer::parse(text).map_err(|error| ConfigError::Parse {
            path: path.to_owned(),
            key: String::new(),
            message: error.to_string(),
        })?;
        let raw: RawConfig =
            serde_path_to_error::deserialize(deserializer).map_err(|error| ConfigError::Parse {
                path: path.to_owned(),
                key: error.path().to_string(),
                message: error.inner().message().to_owned(),
            })?;
        raw.validate()
    }
}

impl RawQueue {
    fn into_queue_config(self) -> Result<edgewatch_queue::QueueConfig, ConfigError> {
        let mut config = edgewatch_queue::RawQueueConfig::new(self.dir);
        if let Some(value) = self.budget_bytes {
            config.budget_bytes = value;
        }
        if let Some(value) = self.cache_bytes {
            config.cache_bytes = value;
        }
        if let Some(value) = self.max_record_bytes {
            config.max_record_bytes = value;
        }
        let shares = self.share_percent;
        config.share_percent.safety = shares.safety.unwrap_or(config.share_percent.safety);
        config.share_percent.slo = shares.slo.unwrap_or(config.share_percent.slo);
        config.share_percent.debug = shares.debug.unwrap_or(config.share_percent.debug);
        // 0 seconds: keep records until delivered or evicted.
        let age = |seconds: Option<u64>, default| match seconds {
            Some(0) => None,
            Some(seconds) => Some(Duration::from_secs(seconds)),
            None => default,
        };
        config.max_age.safety = age(self.max_age_s.safety, config.max_age.safety);
        config.max_age.slo = age(self.max_age_s.slo, config.max_age.slo);
        config.max_age.debug = age(self.max_age_s.debug, config.max_age.debug);
        if let Some(ms) = self.safety_flush_ms {
            config.safety_flush_interval = Duration::from_millis(ms);
        }
        if let Some(ms) = self.bulk_flush_ms {
            config.bulk_flush_interval = Duration::from_millis(ms);
        }
        if let Some(seconds) = self.offline_window_alarm_s {
            config.offline_window_threshold = (seconds > 0).then(|| Duration::from_secs(seconds));
        }
        config.validate().map_err(|error| {
            // The queue names its own fields; give them the file's names.
            let key = match error.key.as_str() {
                "dir" => "queue.dir".to_owned(),
                "max_age.safety" | "max_age.slo" | "max_age.debug" => {
                    format!("queue.max_age_s.{}", &error.key["max_age.".len()..])
                }
                "safety_flush_interval" => "queue.safety_flush_ms".to_owned(),
                "bulk_flush_interval" => "queue.bulk_flush_ms".to_owned(),
                other => format!("queue.{other}"),
            };
            ConfigError::invalid(&key, error.reason)
        })
    }
}

impl RawConfig {
    fn validate(self) -> Result<Config, ConfigError> {
        use edgewatch_proto::topic::validate_id;
        validate_id(&self.machine.id)
            .map_err(|e| ConfigError::invalid("machine.id", e.to_string()))?;
        validate_id(&self.machine.site)
            .map_err(|e| ConfigError::invalid("machine.site", e.to_string()))?;
        validate_id(&self.machine.class)
            .map_err(|e| ConfigError::invalid("machine.class", e.to_string()))?;
        let queue = self.queue.into_queue_config()?;
        let deadline = self
            .deadline
            .validate(&self.probe)
            .map_err(|error| ConfigError::invalid(&error.key, error.reason))?;
        let model = self
            .model
            .validate()
            .map_err(|error| ConfigError::invalid(&error.key, error.reason))?;
        let thermal = self
            .thermal
            .validate()
            .map_err(|error| ConfigError::invalid(&error.key, error.reason))?;

        let uplink = self.uplink;
        if uplink.host.is_empty() {
            return Err(ConfigError::invalid("uplink.host", "must not be empty"));
        }
        if uplink.port == 0 {
            return Err(ConfigError::invalid("uplink.port", "must not be 0"));
        }
        if uplink.keepalive_s < MIN_KEEPALIVE_S || uplink.keepalive_s > 65_535 {
            return Err(ConfigError::invalid(
                "uplink.keepalive_s",
                format!("must be between {MIN_KEEPALIVE_S} and 65535 seconds"),
            ));
        }
        let max_raw = edgewatch_proto::framing::MAX_DECOMPRESSED_BYTES as u64 / 2;
        if uplink.max_batch_bytes < 1024 || uplink.max_batch_bytes > max_raw {
            return Err(ConfigError::invalid(
                "uplink.max_batch_bytes",
                format!("must be between 1024 and {max_raw} bytes"),
            ));
        }
        if uplink.max_batch_events == 0
            || uplink.max_batch_events as usize > edgewatch_proto::framing::MAX_EVENTS_PER_BATCH
        {
            return Err(ConfigError::invalid(
                "uplink.max_batch_events",
                format!(
                    "must be between 1 and {}",
                    edgewatch_proto::framing::MAX_EVENTS_PER_BATCH
                ),
            ));
        }
        if uplink.inflight == 0 || uplink.inflight > 64 {
            return Err(ConfigError::invalid(
                "uplink.inflight",
                "must be between 1 and 64",
            ));
        }
        if uplink.backoff_min_ms == 0 {
            return Err(ConfigError::invalid(
                "uplink.backoff_min_ms",
                "must be above 0 (a zero backoff is a hot reconnect loop)",
            ));
        }
        if uplink.backoff_max_ms < uplink.backoff_min_ms {
            return Err(ConfigError::invalid(
                "uplink.backoff_max_ms",
                "must not be below uplink.backoff_min_ms",
            ));
        }
        if !(1..=19).contains(&uplink.compression_level) {
            return Err(ConfigError::invalid(
                "uplink.compression_level",
                "must be between 1 and 19",
            ));
        }
        if uplink.bandwidth_bytes_per_s != 0 && uplink.bandwidth_bytes_per_s < 1024 {
            return Err(ConfigError::invalid(
                "uplink.bandwidth_bytes_per_s",
                "must be 0 (unlimited) or at least 1024",
            ));
        }
        let client_id = uplink.client_id.unwrap_or_else(|| self.machine.id.clone());
        if client_id.is_empty() || client_id.len() > 128 {
            return Err(ConfigError::invalid(
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
                return Err(ConfigError::invalid(
                    &format!("uplink.topics.{name}"),
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

        let cores: BTreeSet<usize> = self.scheduling.cores.iter().copied().collect();
        let control_loop_cores: BTreeSet<usize> =
            self.scheduling.control_loop_cores.iter().copied().collect();
        if let Some(shared) = cores.intersection(&control_loop_cores).next() {
            return Err(ConfigError::invalid(
                "scheduling.cores",
                format!(
                    "core {shared} is also in scheduling.control_loop_cores; the agent never shares a core with a control loop"
                ),
            ));
        }
        if cores.is_empty() && !control_loop_cores.is_empty() {
            return Err(ConfigError::invalid(
                "scheduling.cores",
                "must list the agent's cores when scheduling.control_loop_cores is set",
            ));
        }

        let ingest = self.ingest;
        let mode = ingest.mode.unwrap_or(DEFAULT_INGEST_MODE);
        if mode > 0o777 || mode & 0o002 != 0 {
            return Err(ConfigError::invalid(
                "ingest.mode",
                "must be a file mode without write access for others (e.g. 0o660)",
            ));
        }
        let max_message_bytes = ingest
            .max_message_bytes
            .unwrap_or(DEFAULT_INGEST_MAX_MESSAGE_BYTES);
        if !(64..=1024 * 1024).contains(&max_message_bytes) {
            return Err(ConfigError::invalid(
                "ingest.max_message_bytes",
                "must be between 64 and 1048576",
            ));
        }
        let rate_per_s = ingest.rate_per_s.unwrap_or(DEFAULT_INGEST_RATE_PER_S);
        if rate_per_s == 0 {
            return Err(ConfigError::invalid("ingest.rate_per_s", "must be above 0"));
        }
        let burst = ingest.burst.unwrap_or(DEFAULT_INGEST_BURST).max(1);

        let socket = ingest
            .socket
            .unwrap_or_else(|| queue.get().dir.join("agent.sock"));
        let status_file = self
            .status
            .file
            .unwrap_or_else(|| queue.get().dir.join("agent-status.json"));

        Ok(Config {
            machine: Machine {
                id: self.machine.id,
                site: self.machine.site,
                class: self.machine.class,
            },
            queue: QueueSettings {
                dir: queue.get().dir.clone(),
                queue,
            },
            uplink: Uplink {
                host: uplink.host,
                port: uplink.port,
                client_id,
                keepalive: Duration::from_secs(uplink.keepalive_s),
                tls,
                max_batch_bytes: usize::try_from(uplink.max_batch_bytes).unwrap_or(usize::MAX),
                max_batch_events: uplink.max_batch_events as usize,
                inflight: uplink.inflight,
                bandwidth_bytes_per_s: (uplink.bandwidth_bytes_per_s != 0)
                    .then_some(uplink.bandwidth_bytes_per_s),
                backoff_min: Duration::from_millis(uplink.backoff_min_ms),
                backoff_max: Duration::from_millis(uplink.backoff_max_ms),
                initial_delay_max: Duration::from_millis(uplink.initial_delay_max_ms),
                compression_level: uplink.compression_level,
                retry_when_no_subscribers: uplink.retry_when_no_subscribers,
                topic_overrides,
            },
            scheduling: Scheduling {
                cores,
                control_loop_cores,
                idle_priority: self.scheduling.idle_priority,
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

    fn parse(text: &str) -> Result<Config, ConfigError> {
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

    #[test]
    fn a_world_writable_socket_is_refused() {
        let text = format!("{MINIMAL}\n[ingest]\nmode = 0o666\n");
        assert_eq!(parse(&text).unwrap_err().key(), Some("ingest.mode"));
    }
}
