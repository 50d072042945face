//! Prometheus remote-write 1.0: message types, request building, response classification (pure),
//! and a blocking HTTP sender with retries.
//!
//! Invariants:
//! - Labels of a time series are sorted by name (`__name__` included) and non-empty; the samples of
//!   one series are in strictly increasing time order within a request.
//! - One request carries the samples of one machine, so a sample the sink refuses rolls back only
//!   that machine's request (Prometheus 2.x refuses whole requests).
//! - The body is protobuf compressed with snappy's *block* (raw) format, never the framed format,
//!   with the four headers the spec requires.
//! - Responses: 2xx done; 400, 409 and other 4xx except 429 are permanent (dead-letter, count);
//!   429 and 5xx are retried with capped exponential backoff and full jitter, forever, except a
//!   5xx whose body says the sample is too old or out of bounds (Prometheus before 2.51 answers
//!   "too old" with 500), which is permanent.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use edgewatch_conventions::backoff::{Backoff, Jitter};
use prost::Message;

use crate::config::RemoteWriteConfig;
use crate::series::{Sample, SeriesKey};

/// `prometheus.WriteRequest`.
#[derive(Clone, PartialEq, Message)]
pub struct WriteRequest {
    /// Series with their samples.
    #[prost(message, repeated, tag = "1")]
    pub timeseries: Vec<TimeSeries>,
}

/// `prometheus.TimeSeries`.
#[derive(Clone, PartialEq, Message)]
pub struct TimeSeries {
    /// Labels, sorted by name.
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<Label>,
    /// Samples, in time order.
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<PromSample>,
}

/// `prometheus.Label`.
#[derive(Clone, PartialEq, Message)]
pub struct Label {
    /// Label name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Label value.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `prometheus.Sample`.
#[derive(Clone, PartialEq, Message)]
pub struct PromSample {
    /// Value.
    #[prost(double, tag = "1")]
    pub value: f64,
    /// Milliseconds since the Unix epoch.
    #[prost(int64, tag = "2")]
    pub timestamp: i64,
}

/// Builds one request from samples (of one machine): series grouped, labels sorted, samples in
/// time order with repeated timestamps dropped.
pub fn build_request(samples: &[&Sample]) -> WriteRequest {
    let mut by_series: BTreeMap<&str, Vec<(i64, f64)>> = BTreeMap::new();
    for sample in samples {
        by_series
            .entry(sample.series.as_str())
            .or_default()
            .push((sample.ts_ms, sample.value));
    }
    let mut timeseries = Vec::with_capacity(by_series.len());
    for (key, mut points) in by_series {
        let Some((metric, labels)) = SeriesKey::parse(key) else {
            continue;
        };
        points.sort_by_key(|&(ts, _)| ts);
        points.dedup_by_key(|&mut (ts, _)| ts);
        let mut labels: Vec<Label> = labels
            .into_iter()
            .filter(|(_, value)| !value.is_empty())
            .map(|(name, value)| Label { name, value })
            .collect();
        labels.push(Label {
            name: "__name__".into(),
            value: metric,
        });
        labels.sort_by(|a, b| a.name.cmp(&b.name));
        timeseries.push(TimeSeries {
            labels,
            samples: points
                .into_iter()
                .map(|(timestamp, value)| PromSample { value, timestamp })
                .collect(),
        });
    }
    WriteRequest { timeseries }
}

/// Compresses a protobuf body with snappy's block format.
pub fn compress(body: &[u8]) -> Result<Vec<u8>, snap::Error> {
    snap::raw::Encoder::new().compress_vec(body)
}

/// What to do after a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Stored.
    Done,
    /// Refused for good: dead-letter and count.
    Permanent,
    /// Try again after a backoff.
    Retry,
}

/// Classifies an HTTP status and body (see the module invariants).
pub fn classify(status: u16, body: &str) -> Verdict {
    match status {
        200..=299 => Verdict::Done,
        429 => Verdict::Retry,
        500..=599 => {
            let body = body.to_ascii_lowercase();
            if body.contains("too old") || body.contains("out of bounds") {
                Verdict::Permanent
            } else {
                Verdict::Retry
            }
        }
        _ => Verdict::Permanent,
    }
}

/// Why a request was not delivered.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The sink refused it for good; dead-letter it.
    #[error("the sink refused the request with HTTP {status}: {body}")]
    Refused {
        /// HTTP status.
        status: u16,
        /// Start of the response body.
        body: String,
    },
    /// Shutdown was requested while retrying; the request stays in the outbox.
    #[error("shutdown requested before the request was delivered")]
    Interrupted,
    /// The body could not be compressed.
    #[error("snappy compression failed: {0}")]
    Compression(#[from] snap::Error),
}

/// Counters the sender reports.
#[derive(Debug, Default, Clone, Copy)]
pub struct SendStats {
    /// Attempts that will be retried (429, 5xx, transport errors).
    pub retries: u64,
}

/// A blocking remote-write client.
pub struct RemoteWriter {
    agent: ureq::Agent,
    config: RemoteWriteConfig,
}

impl RemoteWriter {
    /// A client for `config`.
    pub fn new(config: RemoteWriteConfig) -> Self {
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(config.timeout))
            .http_status_as_error(false)
            .user_agent(concat!("edgewatch-gateway/", env!("CARGO_PKG_VERSION")))
            .build()
            .new_agent();
        Self { agent, config }
    }

    /// The endpoint.
    pub fn url(&self) -> &str {
        &self.config.url
    }

    /// Sends one protobuf body, retrying 429/5xx/transport errors until delivered, refused for
    /// good, or `stop` is set.
    pub fn send(
        &self,
        protobuf: &[u8],
        stop: &AtomicBool,
        stats: &mut SendStats,
    ) -> Result<(), SendError> {
        let body = compress(protobuf)?;
        let mut backoff = Backoff::new(self.config.min_backoff, self.config.max_backoff);
        loop {
            let mut request = self
                .agent
                .post(&self.config.url)
                .header("Content-Encoding", "snappy")
                .header("Content-Type", "application/x-protobuf")
                .header("X-Prometheus-Remote-Write-Version", "0.1.0");
            for (name, value) in &self.config.headers {
                request = request.header(name.as_str(), value.as_str());
            }
            let verdict = match request.send(&body[..]) {
                Ok(mut response) => {
                    let status = response.status().as_u16();
                    let text = response
                        .body_mut()
                        .with_config()
                        .limit(64 * 1024)
                        .read_to_string()
                        .unwrap_or_default();
                    match classify(status, &text) {
                        Verdict::Done => return Ok(()),
                        Verdict::Permanent => {
                            return Err(SendError::Refused {
                                status,
                                body: text.chars().take(512).collect(),
                            });
                        }
                        Verdict::Retry => {
                            tracing::warn!(status, body = %text.trim(), "Remote-write sink asked to retry.");
                            Verdict::Retry
                        }
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, url = %self.config.url, "Remote-write request failed; will retry.");
                    Verdict::Retry
                }
            };
            debug_assert_eq!(verdict, Verdict::Retry);
            stats.retries += 1;
            // Full jitter: sleep a random time up to the current backoff, in small steps so a
            // shutdown is noticed quickly.
            let sleep = backoff
                .next_wait(Jitter::Full(rand::random::<f64>()))
                .max(Duration::from_millis(10));
            let deadline = std::time::Instant::now() + sleep;
            while std::time::Instant::now() < deadline {
                if stop.load(Ordering::Relaxed) {
                    return Err(SendError::Interrupted);
                }
                std::thread::sleep(Duration::from_millis(20).min(sleep));
            }
            if stop.load(Ordering::Relaxed) {
                return Err(SendError::Interrupted);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(series: &str, ts_ms: i64, value: f64) -> Sample {
        Sample {
            series: series.into(),
            ts_ms,
            value,
        }
    }

    #[test]
    fn requests_have_sorted_labels_and_time_ordered_samples() {
        let a = sample("m{site=\"s\",machine_id=\"x\"}", 20, 2.0);
        let b = sample("m{site=\"s\",machine_id=\"x\"}", 10, 1.0);
        let c = sample("m{site=\"s\",machine_id=\"x\"}", 10, 1.0);
        let request = build_request(&[&a, &b, &c]);
        assert_eq!(request.timeseries.len(), 1);
        let series = &request.timeseries[0];
        let names: Vec<&str> = series.labels.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, vec!["__name__", "machine_id", "site"]);
        let times: Vec<i64> = series.samples.iter().map(|s| s.timestamp).collect();
        assert_eq!(times, vec![10, 20]);
    }

    #[test]
    fn the_body_is_snappy_block_format_not_framed() {
        let body = WriteRequest::default().encode_to_vec();
        let compressed = compress(b"hello hello hello").unwrap();
        // The framed format starts with a stream identifier chunk (0xff 0x06 0x00 0x00 "sNaPpY").
        assert_ne!(compressed.first(), Some(&0xff));
        assert_eq!(
            snap::raw::Decoder::new()
                .decompress_vec(&compressed)
                .unwrap(),
            b"hello hello hello"
        );
        assert!(body.is_empty());
    }

    #[test]
    fn responses_are_classified_as_the_spec_and_prometheus_quirks_say() {
        assert_eq!(classify(204, ""), Verdict::Done);
        assert_eq!(classify(400, "out of order sample"), Verdict::Permanent);
        assert_eq!(classify(409, ""), Verdict::Permanent);
        assert_eq!(classify(429, ""), Verdict::Retry);
        assert_eq!(classify(503, "unavailable"), Verdict::Retry);
        assert_eq!(classify(500, "too old sample"), Verdict::Permanent);
        assert_eq!(classify(404, ""), Verdict::Permanent);
    }
}
