//! Gateway configuration in two stages, the workspace's convention (`edgewatch_conventions::config`):
//! [`RawConfig`] mirrors the TOML file (unknown keys refused, no I/O), then [`Config::from_raw`]
//! checks every value and cross-field rule and yields typed values (`Duration`, byte counts, socket
//! addresses).
//!
//! Invariants:
//! - Every error names the key it is about (`section.key`), so `main` can exit with status 64 and a
//!   message an operator can act on.
//! - Durations are strings of the workspace's one grammar, each key with its bounds
//!   ([`duration_keys`], the `[slo]` and `[prices]` keys included).
//! - Defaults are named constants with the reason for their value; `docs/configuration.md`
//!   (`## Gateway`) documents every key.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use edgewatch_conventions::config::{ConfigError, RenamedKey};
use edgewatch_conventions::duration::DurationKey;
use edgewatch_proto::framing::MAX_COMPRESSED_BYTES;
use serde::Deserialize;

/// Broker port when none is given: plain MQTT.
pub const DEFAULT_MQTT_PORT: u16 = 1883;
/// Keepalive: a dead link shows within two keepalives; rumqttc refuses less than 5 s.
pub const DEFAULT_KEEP_ALIVE: Duration = Duration::from_secs(30);
/// The broker keeps this instance's session (and queues its share) this long while it is away.
pub const DEFAULT_SESSION_EXPIRY: Duration = Duration::from_secs(7 * 24 * 3600);
/// Unacknowledged messages the broker may have in flight to this instance; also the group-commit
/// ceiling, so one commit can cover everything in flight.
pub const DEFAULT_RECEIVE_MAXIMUM: u16 = 256;
/// Largest MQTT packet accepted: a batch's limit plus room for topic and properties.
pub const DEFAULT_MAX_PACKET_SIZE: u32 = 1024 * 1024;
/// Room an MQTT publish needs besides its payload (fixed header, topic, properties).
const PACKET_OVERHEAD: u32 = 16 * 1024;
/// How far ahead of arrival an event time may lie before the event is flagged as from the future.
pub const DEFAULT_MAX_FUTURE_SKEW: Duration = Duration::from_secs(5 * 60);
/// How far a batch's `sent_time` may differ from its arrival before the agent's clock is flagged.
pub const DEFAULT_MAX_CLOCK_SKEW: Duration = Duration::from_secs(5 * 60);
/// Silence after which the next batch of a machine counts as a reconnect (when no status came).
pub const DEFAULT_RECONNECT_GAP: Duration = Duration::from_secs(10 * 60);
/// Freshness limit of safety events (docs/series.md).
pub const DEFAULT_FRESHNESS_LIMIT: Duration = Duration::from_secs(24 * 3600);
/// Series budget per machine, from the table of `docs/series.md` ("Budget"): a model version
/// with three loops owns 36 series (7 per loop with deadline semantics), two live versions 72,
/// queue losses at most 21, the queue backlog of the health reports 7, so 100 are needed; the
/// margin of one more version (36) covers a version rolled out within `series_retire_after` of
/// the previous one.
pub const DEFAULT_MAX_SERIES_PER_MACHINE: u32 = 2 * 36 + 21 + 7 + 36;
/// A series not written for this long (in the machine's event time) retires and frees its place
/// in the budget: a model version switched away from is gone an hour later, while every live
/// series is written every few seconds.
pub const DEFAULT_SERIES_RETIRE_AFTER: Duration = Duration::from_secs(3600);
/// Sequence ranges kept per (machine, epoch, tier) before the oldest holes are closed.
pub const DEFAULT_MAX_RANGES_PER_STREAM: u32 = 64;
/// Queue epochs remembered per (machine, tier); an agent gets a new one only when its queue is
/// recreated, so a handful covers months.
pub const DEFAULT_MAX_EPOCHS_PER_STREAM: u32 = 8;
/// De-duplication state unused this long is pruned: longer than any offline period plus drain.
pub const DEFAULT_DEDUP_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);
/// redb page cache: bounds the store's memory.
pub const DEFAULT_CACHE_SIZE: u64 = 64 * 1024 * 1024;
/// Dead letters kept; the oldest are dropped (and counted) beyond this.
pub const DEFAULT_DEAD_LETTER_MAX_RECORDS: u64 = 100_000;
/// Bytes of a rejected payload kept in its dead letter.
pub const DEFAULT_DEAD_LETTER_MAX_PAYLOAD: u64 = MAX_COMPRESSED_BYTES as u64;
/// Remote-write request timeout.
pub const DEFAULT_RW_TIMEOUT: Duration = Duration::from_secs(30);
/// Samples older than this are not sent by remote-write: at or under the sink's out-of-order
/// window (Prometheus answers "too old" outside it and rolls back the whole request).
pub const DEFAULT_RW_MAX_SAMPLE_AGE: Duration = Duration::from_secs(7 * 24 * 3600);
/// First retry delay after a 429/5xx.
pub const DEFAULT_RW_MIN_BACKOFF: Duration = Duration::from_millis(500);
/// Longest retry delay.
pub const DEFAULT_RW_MAX_BACKOFF: Duration = Duration::from_secs(60);

/// The fleet page's address when `[http]` does not say: loopback, so the page is seen only from
/// the gateway's own host (or through a reverse proxy there) until an operator opens it up; the
/// port next to `/metrics`' customary 9464.
pub const DEFAULT_HTTP_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9465);

/// A year: longer than any skew, gap or freshness limit worth configuring.
const YEAR: Duration = Duration::from_secs(365 * 86_400);
/// Ten years: longer than any retention worth configuring.
const DECADE: Duration = Duration::from_secs(3_650 * 86_400);
/// `mqtt.keep_alive`: rumqttc refuses less than 5 s; MQTT carries 16 bits of seconds.
pub const KEEP_ALIVE: DurationKey = DurationKey::new(
    "mqtt.keep_alive",
    Duration::from_secs(5),
    Duration::from_secs(65_535),
);
/// `mqtt.session_expiry`: a persistent session is what makes a crash mean redelivery; MQTT
/// carries 32 bits of seconds (136 years).
pub const SESSION_EXPIRY: DurationKey = DurationKey::new(
    "mqtt.session_expiry",
    Duration::from_secs(1),
    Duration::from_secs(u32::MAX as u64),
);
/// `ingest.max_future_skew`: 0 (none tolerated) to a year.
pub const MAX_FUTURE_SKEW: DurationKey =
    DurationKey::new("ingest.max_future_skew", Duration::ZERO, YEAR);
/// `ingest.max_clock_skew`: 0 (flag any difference) to a year.
pub const MAX_CLOCK_SKEW: DurationKey =
    DurationKey::new("ingest.max_clock_skew", Duration::ZERO, YEAR);
/// `ingest.reconnect_gap`: 0 to a year.
pub const RECONNECT_GAP: DurationKey =
    DurationKey::new("ingest.reconnect_gap", Duration::ZERO, YEAR);
/// `ingest.freshness_limit`: 0 to a year.
pub const FRESHNESS_LIMIT: DurationKey =
    DurationKey::new("ingest.freshness_limit", Duration::ZERO, YEAR);
/// `ingest.series_retire_after`: a second (every sample keeps its series only that long) to a
/// year (series never retire in practice).
pub const SERIES_RETIRE_AFTER: DurationKey =
    DurationKey::new("ingest.series_retire_after", Duration::from_secs(1), YEAR);
/// `dedup.retention`: 0 to ten years.
pub const DEDUP_RETENTION: DurationKey =
    DurationKey::new("dedup.retention", Duration::ZERO, DECADE);
/// `remote_write.timeout`: above zero, at most an hour.
pub const RW_TIMEOUT: DurationKey = DurationKey::new(
    "remote_write.timeout",
    Duration::from_millis(1),
    Duration::from_secs(3_600),
);
/// `remote_write.max_sample_age`: 0 to ten years.
pub const RW_MAX_SAMPLE_AGE: DurationKey =
    DurationKey::new("remote_write.max_sample_age", Duration::ZERO, DECADE);
/// `remote_write.min_backoff`: above zero (a zero backoff is a hot retry loop), at most an hour.
pub const RW_MIN_BACKOFF: DurationKey = DurationKey::new(
    "remote_write.min_backoff",
    Duration::from_millis(1),
    Duration::from_secs(3_600),
);
/// `remote_write.max_backoff`: at least `remote_write.min_backoff`, at most a day.
pub const RW_MAX_BACKOFF: DurationKey = DurationKey::new(
    "remote_write.max_backoff",
    Duration::from_millis(1),
    Duration::from_secs(86_400),
);
/// The duration keys of the gateway's own tables.
const OWN_DURATION_KEYS: [DurationKey; 12] = [
    KEEP_ALIVE,
    SESSION_EXPIRY,
    MAX_FUTURE_SKEW,
    MAX_CLOCK_SKEW,
    RECONNECT_GAP,
    FRESHNESS_LIMIT,
    SERIES_RETIRE_AFTER,
    DEDUP_RETENTION,
    RW_TIMEOUT,
    RW_MAX_SAMPLE_AGE,
    RW_MIN_BACKOFF,
    RW_MAX_BACKOFF,
];

/// Every duration key of the gateway's file with its full name: the gateway's own, then those of
/// `[slo]` and `[prices]` (which `edgewatch-slo` names relative to their table).
pub fn duration_keys() -> Vec<(String, DurationKey)> {
    let own = OWN_DURATION_KEYS
        .into_iter()
        .map(|key| (key.name.to_owned(), key));
    let slo = edgewatch_slo::catalog::DURATION_KEYS
        .into_iter()
        .map(|key| (format!("slo.{}", key.name), key));
    let prices = edgewatch_slo::cost::DURATION_KEYS
        .into_iter()
        .map(|key| (format!("prices.{}", key.name), key));
    own.chain(slo).chain(prices).collect()
}

/// The configuration file as written (TOML).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// `[mqtt]`: the broker and the subscription.
    pub mqtt: RawMqttConfig,
    /// `[ingest]`: validation and normalization.
    #[serde(default)]
    pub ingest: RawIngestConfig,
    /// `[dedup]`: de-duplication state bounds.
    #[serde(default)]
    pub dedup: RawDedup,
    /// `[store]`: the embedded store.
    pub store: RawStoreConfig,
    /// `[metrics]`: the gateway's own `/metrics` endpoint.
    #[serde(default)]
    pub metrics: RawMetrics,
    /// `[http]`: the fleet page (on by default, on loopback).
    #[serde(default)]
    pub http: RawHttp,
    /// `[remote_write]`: optional Prometheus remote-write sink.
    pub remote_write: Option<RawRemoteWriteConfig>,
    /// `[slo]`: the SLO catalog (`docs/slo-catalog.md`); the built-in catalog when absent.
    pub slo: Option<edgewatch_slo::RawCatalog>,
    /// `[prices]`: the price book; `export-focus` and the cost report need it.
    pub prices: Option<edgewatch_slo::RawPriceBook>,
}

/// `[mqtt]` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMqttConfig {
    /// Broker host name or address.
    pub host: String,
    /// Broker port.
    pub port: Option<u16>,
    /// Stable client id of this instance.
    pub client_id: String,
    /// Shared-subscription group; absent means a plain subscription.
    pub shared_group: Option<String>,
    /// Keepalive, e.g. "30s".
    pub keep_alive: Option<String>,
    /// Session expiry, e.g. "7d".
    pub session_expiry: Option<String>,
    /// Receive Maximum announced to the broker.
    pub receive_maximum: Option<u16>,
    /// Largest MQTT packet accepted, bytes.
    pub max_packet_size_bytes: Option<u32>,
    /// Username (e.g. without mTLS).
    pub username: Option<String>,
    /// Password, with `username`.
    pub password: Option<String>,
    /// `[mqtt.tls]`: TLS or mTLS to the broker.
    pub tls: Option<RawTlsConfig>,
}

/// `[mqtt.tls]` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTlsConfig {
    /// CA certificate (PEM) the broker's certificate chains to.
    pub ca_file: PathBuf,
    /// Client certificate (PEM), for mTLS.
    pub cert_file: Option<PathBuf>,
    /// Client key (PEM), for mTLS.
    pub key_file: Option<PathBuf>,
}

/// `[ingest]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawIngestConfig {
    /// e.g. "5m".
    pub max_future_skew: Option<String>,
    /// e.g. "5m".
    pub max_clock_skew: Option<String>,
    /// e.g. "10m".
    pub reconnect_gap: Option<String>,
    /// e.g. "24h".
    pub freshness_limit: Option<String>,
    /// Series budget per machine.
    pub max_series_per_machine: Option<u32>,
    /// e.g. "1h".
    pub series_retire_after: Option<String>,
    /// Decode a group's messages on a second thread (where the machine has two cores).
    pub decode_ahead: Option<bool>,
}

/// `[dedup]` as written (validated into [`IngestConfig`]).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDedup {
    /// Ranges per stream.
    pub max_ranges_per_stream: Option<u32>,
    /// Epochs per (machine, tier).
    pub max_epochs_per_stream: Option<u32>,
    /// e.g. "30d".
    pub retention: Option<String>,
}

/// `[store]` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStoreConfig {
    /// Path of the redb file.
    pub path: PathBuf,
    /// Page cache, bytes.
    pub cache_size_bytes: Option<u64>,
    /// Dead letters kept.
    pub dead_letter_max_records: Option<u64>,
    /// Payload bytes kept per dead letter.
    pub dead_letter_max_payload_bytes: Option<u64>,
}

/// `[metrics]` as written (validated into [`Config::metrics_listen`]).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMetrics {
    /// Listen address of `/metrics`, e.g. "127.0.0.1:9464"; absent means no endpoint.
    pub listen: Option<String>,
}

/// `[http]` as written (validated into [`Config::http`]).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHttp {
    /// `false` turns the fleet page off; default `true`.
    pub enabled: Option<bool>,
    /// Listen address of the fleet page, e.g. "127.0.0.1:9465" (the default).
    pub listen: Option<String>,
    /// Read the page's samples from this Prometheus (e.g. "http://127.0.0.1:9090") instead of the
    /// embedded store.
    pub prometheus: Option<String>,
}

/// `[remote_write]` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRemoteWriteConfig {
    /// Endpoint, e.g. "http://prometheus:9090/api/v1/write".
    pub url: String,
    /// e.g. "30s".
    pub timeout: Option<String>,
    /// e.g. "7d".
    pub max_sample_age: Option<String>,
    /// e.g. "500ms".
    pub min_backoff: Option<String>,
    /// e.g. "60s".
    pub max_backoff: Option<String>,
    /// Extra request headers (e.g. `X-Scope-OrgID` for Mimir).
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Broker connection and subscription.
    pub mqtt: MqttConfig,
    /// Validation and normalization limits.
    pub ingest: IngestConfig,
    /// Embedded store.
    pub store: StoreConfig,
    /// `/metrics` listen address.
    pub metrics_listen: Option<SocketAddr>,
    /// The fleet page; `None` when `[http] enabled = false`.
    pub http: Option<HttpConfig>,
    /// Remote-write sink, when configured.
    pub remote_write: Option<RemoteWriteConfig>,
    /// The SLO catalog.
    pub catalog: edgewatch_slo::Catalog,
    /// The price book, when configured.
    pub prices: Option<edgewatch_slo::PriceBook>,
}

/// The fleet page's server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpConfig {
    /// Listen address.
    pub listen: SocketAddr,
    /// Prometheus base URL to read from instead of the embedded store.
    pub prometheus: Option<String>,
}

impl HttpConfig {
    /// Validates `[http]`; `None` when it is turned off.
    pub fn from_raw(raw: &RawHttp) -> Result<Option<Self>, ConfigError> {
        let listen = match &raw.listen {
            None => DEFAULT_HTTP_LISTEN,
            Some(text) => text.parse::<SocketAddr>().map_err(|_| {
                ConfigError::new(
                    "http.listen",
                    format!("{text:?} is not an address:port such as 127.0.0.1:9465"),
                )
            })?,
        };
        if let Some(url) = &raw.prometheus
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            return Err(ConfigError::new(
                "http.prometheus",
                format!("{url:?} is not an http:// or https:// URL"),
            ));
        }
        if raw.enabled == Some(false) {
            return Ok(None);
        }
        Ok(Some(Self {
            listen,
            prometheus: raw.prometheus.clone(),
        }))
    }
}

/// TLS material paths.
#[derive(Debug, Clone)]
pub struct TlsConfig {
    /// CA (PEM).
    pub ca_file: PathBuf,
    /// Client certificate and key (PEM), for mTLS.
    pub client: Option<(PathBuf, PathBuf)>,
}

/// Broker connection and subscription.
#[derive(Debug, Clone)]
pub struct MqttConfig {
    /// Broker host.
    pub host: String,
    /// Broker port.
    pub port: u16,
    /// Stable client id (persistent session).
    pub client_id: String,
    /// Shared-subscription group.
    pub shared_group: Option<String>,
    /// Keepalive interval.
    pub keep_alive: Duration,
    /// Session expiry.
    pub session_expiry: Duration,
    /// Receive Maximum (messages unacknowledged at once).
    pub receive_maximum: u16,
    /// Largest packet accepted.
    pub max_packet_size: u32,
    /// Username and password.
    pub credentials: Option<(String, Password)>,
    /// TLS.
    pub tls: Option<TlsConfig>,
}

impl MqttConfig {
    /// The subscription filter: `$share/<group>/edgewatch/v1/+/+/+` or the plain filter.
    pub fn filter(&self) -> String {
        match &self.shared_group {
            Some(group) => format!(
                "$share/{group}/{}",
                edgewatch_proto::topic::ALL_MACHINES_FILTER
            ),
            None => edgewatch_proto::topic::ALL_MACHINES_FILTER.to_owned(),
        }
    }
}

/// A password; its `Debug` form is redacted so `check-config` never prints it.
#[derive(Clone, PartialEq, Eq)]
pub struct Password(pub String);

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Validation and normalization limits (used by the pure ingest logic).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IngestConfig {
    /// Events later than arrival + this are flagged and not normalized.
    pub max_future_skew: Duration,
    /// |sent_time − arrival| above this flags the agent's clock.
    pub max_clock_skew: Duration,
    /// Arrival silence that makes the next batch a reconnect.
    pub reconnect_gap: Duration,
    /// Freshness limit of safety events.
    pub freshness_limit: Duration,
    /// Series budget per machine: live series at once.
    pub max_series_per_machine: u32,
    /// A series not written for this long, in its machine's event time, retires.
    pub series_retire_after: Duration,
    /// Ranges kept per dedup stream.
    pub max_ranges_per_stream: u32,
    /// Epochs kept per (machine, tier).
    pub max_epochs_per_stream: u32,
    /// Dedup state retention.
    pub dedup_retention: Duration,
    /// Samples older than arrival − this are not queued for remote-write (`None`: no sink).
    pub remote_write_max_age: Option<Duration>,
    /// Decode a group's messages on a second thread, ahead of the one that writes them, where
    /// the machine has two cores or more (`ingest::Decoding`): more messages per second from
    /// one gateway, for more CPU time per message.
    pub decode_ahead: bool,
}

impl Default for IngestConfig {
    fn default() -> Self {
        Self {
            max_future_skew: DEFAULT_MAX_FUTURE_SKEW,
            max_clock_skew: DEFAULT_MAX_CLOCK_SKEW,
            reconnect_gap: DEFAULT_RECONNECT_GAP,
            freshness_limit: DEFAULT_FRESHNESS_LIMIT,
            max_series_per_machine: DEFAULT_MAX_SERIES_PER_MACHINE,
            series_retire_after: DEFAULT_SERIES_RETIRE_AFTER,
            max_ranges_per_stream: DEFAULT_MAX_RANGES_PER_STREAM,
            max_epochs_per_stream: DEFAULT_MAX_EPOCHS_PER_STREAM,
            dedup_retention: DEFAULT_DEDUP_RETENTION,
            remote_write_max_age: None,
            decode_ahead: true,
        }
    }
}

/// Embedded store settings.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// redb file.
    pub path: PathBuf,
    /// Page cache bytes.
    pub cache_size: usize,
    /// Dead letters kept.
    pub dead_letter_max_records: u64,
    /// Payload bytes kept per dead letter.
    pub dead_letter_max_payload: usize,
}

impl StoreConfig {
    /// Defaults for a store at `path`.
    pub fn at(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            cache_size: DEFAULT_CACHE_SIZE as usize,
            dead_letter_max_records: DEFAULT_DEAD_LETTER_MAX_RECORDS,
            dead_letter_max_payload: DEFAULT_DEAD_LETTER_MAX_PAYLOAD as usize,
        }
    }
}

/// Remote-write sink settings.
#[derive(Debug, Clone)]
pub struct RemoteWriteConfig {
    /// Endpoint URL.
    pub url: String,
    /// Request timeout.
    pub timeout: Duration,
    /// Oldest sample sent, relative to arrival.
    pub max_sample_age: Duration,
    /// First retry delay.
    pub min_backoff: Duration,
    /// Longest retry delay.
    pub max_backoff: Duration,
    /// Extra headers.
    pub headers: Vec<(String, String)>,
}

/// `value` of `key` (the one grammar, checked against the key's bounds), or `default`.
fn duration(
    key: &DurationKey,
    value: Option<&String>,
    default: Duration,
) -> Result<Duration, ConfigError> {
    match value {
        None => Ok(default),
        Some(text) => key.parse(text),
    }
}

impl Config {
    /// Parses and validates TOML text.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let deserializer = toml::Deserializer::parse(text)
            .map_err(|error| ConfigError::new("(file)", error.to_string()))?;
        let raw: RawConfig = serde_path_to_error::deserialize(deserializer).map_err(|error| {
            let message = error.inner().message();
            let table = error.path().to_string();
            // A missing key's path ends at its table; the key is in the message.
            let key = match message
                .strip_prefix("missing field `")
                .and_then(|rest| rest.split('`').next())
            {
                Some(missing) if table == "." => missing.to_owned(),
                Some(missing) => format!("{table}.{missing}"),
                None => table,
            };
            ConfigError::new(key, message)
        })?;
        Self::from_raw(raw)
    }

    /// The deprecated keys the file uses: none, as no key of the gateway has been renamed; the
    /// list `check-config` prints, as the agent's does.
    pub fn renamed_keys(&self) -> &[RenamedKey] {
        &[]
    }

    /// Validates the raw configuration.
    pub fn from_raw(raw: RawConfig) -> Result<Self, ConfigError> {
        let mqtt = &raw.mqtt;
        if mqtt.host.trim().is_empty() {
            return Err(ConfigError::new("mqtt.host", "must not be empty"));
        }
        if mqtt.client_id.is_empty() || mqtt.client_id.len() > 128 {
            return Err(ConfigError::new(
                "mqtt.client_id",
                "must be 1 to 128 bytes: a stable id per gateway instance",
            ));
        }
        if let Some(group) = &mqtt.shared_group
            && edgewatch_proto::topic::validate_id(group).is_err()
        {
            return Err(ConfigError::new(
                "mqtt.shared_group",
                "must be 1 to 64 characters of [A-Za-z0-9._-]",
            ));
        }
        let keep_alive = duration(&KEEP_ALIVE, mqtt.keep_alive.as_ref(), DEFAULT_KEEP_ALIVE)?;
        let session_expiry = duration(
            &SESSION_EXPIRY,
            mqtt.session_expiry.as_ref(),
            DEFAULT_SESSION_EXPIRY,
        )?;
        let receive_maximum = mqtt.receive_maximum.unwrap_or(DEFAULT_RECEIVE_MAXIMUM);
        if receive_maximum == 0 {
            return Err(ConfigError::new(
                "mqtt.receive_maximum",
                "must be at least 1",
            ));
        }
        let max_packet_size = mqtt
            .max_packet_size_bytes
            .unwrap_or(DEFAULT_MAX_PACKET_SIZE);
        let needed = MAX_COMPRESSED_BYTES as u32 + PACKET_OVERHEAD;
        if max_packet_size < needed {
            return Err(ConfigError::new(
                "mqtt.max_packet_size_bytes",
                format!(
                    "must be at least {needed} (the largest batch plus topic and properties); rumqttc's default of 10 KiB would refuse real batches"
                ),
            ));
        }
        let credentials = match (&mqtt.username, &mqtt.password) {
            (Some(user), Some(password)) => Some((user.clone(), Password(password.clone()))),
            (Some(user), None) => Some((user.clone(), Password(String::new()))),
            (None, Some(_)) => {
                return Err(ConfigError::new(
                    "mqtt.password",
                    "is set without mqtt.username",
                ));
            }
            (None, None) => None,
        };
        let tls = match &mqtt.tls {
            None => None,
            Some(tls) => {
                let client = match (&tls.cert_file, &tls.key_file) {
                    (Some(cert), Some(key)) => Some((cert.clone(), key.clone())),
                    (None, None) => None,
                    (Some(_), None) => {
                        return Err(ConfigError::new(
                            "mqtt.tls.key_file",
                            "is required with mqtt.tls.cert_file",
                        ));
                    }
                    (None, Some(_)) => {
                        return Err(ConfigError::new(
                            "mqtt.tls.cert_file",
                            "is required with mqtt.tls.key_file",
                        ));
                    }
                };
                Some(TlsConfig {
                    ca_file: tls.ca_file.clone(),
                    client,
                })
            }
        };
        let mqtt_config = MqttConfig {
            host: mqtt.host.clone(),
            port: mqtt.port.unwrap_or(DEFAULT_MQTT_PORT),
            client_id: mqtt.client_id.clone(),
            shared_group: mqtt.shared_group.clone(),
            keep_alive,
            session_expiry,
            receive_maximum,
            max_packet_size,
            credentials,
            tls,
        };

        let ingest = &raw.ingest;
        let max_series_per_machine = ingest
            .max_series_per_machine
            .unwrap_or(DEFAULT_MAX_SERIES_PER_MACHINE);
        if max_series_per_machine == 0 {
            return Err(ConfigError::new(
                "ingest.max_series_per_machine",
                "must be at least 1",
            ));
        }
        let max_ranges_per_stream = raw
            .dedup
            .max_ranges_per_stream
            .unwrap_or(DEFAULT_MAX_RANGES_PER_STREAM);
        if !(2..=4096).contains(&max_ranges_per_stream) {
            return Err(ConfigError::new(
                "dedup.max_ranges_per_stream",
                "must be between 2 and 4096",
            ));
        }
        let max_epochs_per_stream = raw
            .dedup
            .max_epochs_per_stream
            .unwrap_or(DEFAULT_MAX_EPOCHS_PER_STREAM);
        if !(1..=1024).contains(&max_epochs_per_stream) {
            return Err(ConfigError::new(
                "dedup.max_epochs_per_stream",
                "must be between 1 and 1024",
            ));
        }

        let remote_write = match &raw.remote_write {
            None => None,
            Some(rw) => {
                if !(rw.url.starts_with("http://") || rw.url.starts_with("https://")) {
                    return Err(ConfigError::new(
                        "remote_write.url",
                        "must be an http:// or https:// URL",
                    ));
                }
                let min_backoff = duration(
                    &RW_MIN_BACKOFF,
                    rw.min_backoff.as_ref(),
                    DEFAULT_RW_MIN_BACKOFF,
                )?;
                let max_backoff = duration(
                    &RW_MAX_BACKOFF,
                    rw.max_backoff.as_ref(),
                    DEFAULT_RW_MAX_BACKOFF,
                )?;
                if max_backoff < min_backoff {
                    return Err(ConfigError::new(
                        "remote_write.max_backoff",
                        "must be at least remote_write.min_backoff",
                    ));
                }
                let timeout = duration(&RW_TIMEOUT, rw.timeout.as_ref(), DEFAULT_RW_TIMEOUT)?;
                Some(RemoteWriteConfig {
                    url: rw.url.clone(),
                    timeout,
                    max_sample_age: duration(
                        &RW_MAX_SAMPLE_AGE,
                        rw.max_sample_age.as_ref(),
                        DEFAULT_RW_MAX_SAMPLE_AGE,
                    )?,
                    min_backoff,
                    max_backoff,
                    headers: rw
                        .headers
                        .iter()
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect(),
                })
            }
        };

        let ingest_config = IngestConfig {
            max_future_skew: duration(
                &MAX_FUTURE_SKEW,
                ingest.max_future_skew.as_ref(),
                DEFAULT_MAX_FUTURE_SKEW,
            )?,
            max_clock_skew: duration(
                &MAX_CLOCK_SKEW,
                ingest.max_clock_skew.as_ref(),
                DEFAULT_MAX_CLOCK_SKEW,
            )?,
            reconnect_gap: duration(
                &RECONNECT_GAP,
                ingest.reconnect_gap.as_ref(),
                DEFAULT_RECONNECT_GAP,
            )?,
            freshness_limit: duration(
                &FRESHNESS_LIMIT,
                ingest.freshness_limit.as_ref(),
                DEFAULT_FRESHNESS_LIMIT,
            )?,
            max_series_per_machine,
            series_retire_after: duration(
                &SERIES_RETIRE_AFTER,
                ingest.series_retire_after.as_ref(),
                DEFAULT_SERIES_RETIRE_AFTER,
            )?,
            max_ranges_per_stream,
            max_epochs_per_stream,
            dedup_retention: duration(
                &DEDUP_RETENTION,
                raw.dedup.retention.as_ref(),
                DEFAULT_DEDUP_RETENTION,
            )?,
            remote_write_max_age: remote_write.as_ref().map(|rw| rw.max_sample_age),
            decode_ahead: ingest.decode_ahead.unwrap_or(true),
        };

        let store = &raw.store;
        if store.path.as_os_str().is_empty() {
            return Err(ConfigError::new("store.path", "must not be empty"));
        }
        let cache_size = store.cache_size_bytes.unwrap_or(DEFAULT_CACHE_SIZE);
        if cache_size < 1024 * 1024 {
            return Err(ConfigError::new(
                "store.cache_size_bytes",
                "must be at least 1048576",
            ));
        }
        let dead_letter_max_records = store
            .dead_letter_max_records
            .unwrap_or(DEFAULT_DEAD_LETTER_MAX_RECORDS);
        if dead_letter_max_records == 0 {
            return Err(ConfigError::new(
                "store.dead_letter_max_records",
                "must be at least 1",
            ));
        }
        let store_config = StoreConfig {
            path: store.path.clone(),
            cache_size: usize::try_from(cache_size).unwrap_or(usize::MAX),
            dead_letter_max_records,
            dead_letter_max_payload: usize::try_from(
                store
                    .dead_letter_max_payload_bytes
                    .unwrap_or(DEFAULT_DEAD_LETTER_MAX_PAYLOAD),
            )
            .unwrap_or(usize::MAX),
        };

        let metrics_listen = match &raw.metrics.listen {
            None => None,
            Some(text) => Some(text.parse::<SocketAddr>().map_err(|_| {
                ConfigError::new(
                    "metrics.listen",
                    format!("{text:?} is not an address:port such as 127.0.0.1:9464"),
                )
            })?),
        };

        let http = HttpConfig::from_raw(&raw.http)?;

        let catalog = match &raw.slo {
            None => edgewatch_slo::Catalog::default(),
            Some(slo) => {
                edgewatch_slo::Catalog::from_raw(slo).map_err(|error| error.under("slo"))?
            }
        };
        let prices = match &raw.prices {
            None => None,
            Some(prices) => Some(
                edgewatch_slo::PriceBook::from_raw(prices)
                    .map_err(|error| error.under("prices"))?,
            ),
        };

        Ok(Self {
            mqtt: mqtt_config,
            ingest: ingest_config,
            store: store_config,
            metrics_listen,
            http,
            remote_write,
            catalog,
            prices,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgewatch_conventions::duration::parse as parse_duration;

    const MINIMAL: &str = r#"
        [mqtt]
        host = "127.0.0.1"
        client_id = "gw-1"
        [store]
        path = "/tmp/store.redb"
    "#;

    #[test]
    fn a_minimal_file_gets_the_documented_defaults() {
        let config = Config::from_toml(MINIMAL).unwrap();
        assert_eq!(config.mqtt.port, DEFAULT_MQTT_PORT);
        assert_eq!(config.mqtt.filter(), "edgewatch/v1/+/+/+");
        assert_eq!(config.ingest, IngestConfig::default());
        assert!(config.remote_write.is_none());
        assert!(config.metrics_listen.is_none());
        assert_eq!(
            config.http,
            Some(HttpConfig {
                listen: "127.0.0.1:9465".parse().unwrap(),
                prometheus: None
            })
        );
    }

    #[test]
    fn the_fleet_page_turns_off_and_its_errors_name_the_key() {
        let off = Config::from_toml(&format!("{MINIMAL}\n[http]\nenabled = false\n")).unwrap();
        assert_eq!(off.http, None);
        let moved = Config::from_toml(&format!(
            "{MINIMAL}\n[http]\nlisten = \"0.0.0.0:8080\"\nprometheus = \"http://p:9090\"\n"
        ))
        .unwrap();
        assert_eq!(
            moved.http,
            Some(HttpConfig {
                listen: "0.0.0.0:8080".parse().unwrap(),
                prometheus: Some("http://p:9090".to_owned())
            })
        );
        for (table, key) in [
            ("listen = \"everywhere\"", "http.listen"),
            ("prometheus = \"p:9090\"", "http.prometheus"),
            ("port = 1", "`port`"),
        ] {
            let error = Config::from_toml(&format!("{MINIMAL}\n[http]\n{table}\n")).unwrap_err();
            assert!(error.to_string().contains(key), "{error}");
        }
    }

    #[test]
    fn the_documented_example_is_a_valid_configuration() {
        let doc = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/configuration.md"
        ))
        .unwrap();
        let gateway = doc.split("## Gateway").nth(1).unwrap();
        let example = gateway.split("```toml").nth(1).unwrap();
        let example = example.split("```").next().unwrap();
        let config = Config::from_toml(example).unwrap();
        assert_eq!(config.mqtt.filter(), "$share/edgewatch/edgewatch/v1/+/+/+");
        assert!(config.mqtt.tls.unwrap().client.is_some());
        assert!(config.remote_write.is_some());
    }

    #[test]
    fn the_password_never_appears_in_the_printed_configuration() {
        let text = MINIMAL.replace(
            "client_id",
            "username = \"gw\"\npassword = \"hunter2\"\nclient_id",
        );
        let printed = format!("{:?}", Config::from_toml(&text).unwrap());
        assert!(!printed.contains("hunter2"));
        assert!(printed.contains("<redacted>"));
    }

    #[test]
    fn a_shared_group_becomes_a_shared_subscription() {
        let text = MINIMAL.replace("client_id", "shared_group = \"gw\"\nclient_id");
        let config = Config::from_toml(&text).unwrap();
        assert_eq!(config.mqtt.filter(), "$share/gw/edgewatch/v1/+/+/+");
    }

    #[test]
    fn an_unknown_key_is_named_in_the_error() {
        let text = MINIMAL.replace("client_id", "colour = \"red\"\nclient_id");
        let error = Config::from_toml(&text).unwrap_err();
        assert_eq!(error.key, "mqtt.colour");
    }

    #[test]
    fn a_value_of_the_wrong_type_or_a_missing_key_is_named_by_its_path() {
        for (line, key) in [
            ("decode_ahead = \"yes\"", "ingest.decode_ahead"),
            (
                "max_series_per_machine = \"x\"",
                "ingest.max_series_per_machine",
            ),
        ] {
            let text = MINIMAL.replace("[store]", &format!("[ingest]\n{line}\n[store]"));
            let error = Config::from_toml(&text).unwrap_err();
            assert_eq!(error.key, key, "{error}");
        }
        let error = Config::from_toml("").unwrap_err();
        assert_eq!(error.key, "mqtt");
        let error = Config::from_toml("[mqtt]\nhost = \"x\"\n").unwrap_err();
        assert_eq!(error.key, "mqtt.client_id");
        let error = Config::from_toml("[mqtt\nhost = 1").unwrap_err();
        assert_eq!(error.key, "(file)");
        assert!(error.to_string().contains("line 1"), "{error}");
    }

    #[test]
    fn a_packet_limit_below_the_batch_limit_is_refused() {
        let text = MINIMAL.replace("client_id", "max_packet_size_bytes = 10240\nclient_id");
        let error = Config::from_toml(&text).unwrap_err();
        assert_eq!(error.key, "mqtt.max_packet_size_bytes");
    }

    #[test]
    fn durations_take_units_and_refuse_bare_numbers() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert!(parse_duration("30").is_err());
        // Weeks are a unit of the workspace's one grammar, which the SLO catalog in this same
        // file always accepted.
        assert!(parse_duration("3w").is_ok());
        let text = MINIMAL.replace("[store]", "[ingest]\nfreshness_limit = \"1y\"\n[store]");
        assert_eq!(
            Config::from_toml(&text).unwrap_err().key,
            "ingest.freshness_limit"
        );
    }

    #[test]
    fn a_bad_slo_value_is_named_with_its_table() {
        let text = format!(
            "{MINIMAL}\n[slo]\n[[slo.slos]]\nname = \"x\"\nobjective_percent = 150.0\nsli = {{ kind = \"freshness\" }}\n"
        );
        let error = Config::from_toml(&text).unwrap_err();
        assert!(error.key.starts_with("slo.slos[0]"), "{}", error.key);
    }

    #[test]
    fn remote_write_backoff_must_be_ordered() {
        let text = format!(
            "{MINIMAL}\n[remote_write]\nurl = \"http://127.0.0.1:9/api/v1/write\"\nmin_backoff = \"10s\"\nmax_backoff = \"1s\"\n"
        );
        assert_eq!(
            Config::from_toml(&text).unwrap_err().key,
            "remote_write.max_backoff"
        );
    }
}
