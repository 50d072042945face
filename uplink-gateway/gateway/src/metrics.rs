//! The gateway's own metrics (counters and gauges), rendered in the Prometheus text exposition
//! format, and a minimal HTTP server for `GET /metrics` on tokio.
//!
//! Invariants:
//! - Counters only go up for the life of the process; labels come from fixed sets (rejection
//!   reasons), never from message content.
//! - The HTTP server is [`crate::http`]'s: it reads at most [`http::MAX_REQUEST_HEAD`] bytes per
//!   connection, answers one request and closes; a slow or hostile client cannot hold more than
//!   one task and a small buffer.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use edgewatch_slo::names::refusal;

use crate::http;
use crate::ingest::IngestStats;
use crate::validate::Rejection;

macro_rules! counters {
    ($($field:ident => $name:literal, $help:literal;)*) => {
        /// Process-wide counters and gauges.
        #[derive(Debug, Default)]
        pub struct Metrics {
            $(#[doc = $help] pub $field: AtomicU64,)*
            /// Dead letters per rejection reason ([`Rejection::REASONS`] order).
            pub rejected: [AtomicU64; Rejection::REASONS.len()],
            /// Counter events refused, per `names::refusal::REASONS` index.
            pub events_refused: [AtomicU64; refusal::REASONS.len()],
            /// Samples refused, per `names::refusal::REASONS` index.
            pub samples_refused: [AtomicU64; refusal::REASONS.len()],
            /// Remote-write requests pending in the outbox.
            pub outbox_pending: AtomicU64,
            /// Unix time (s) of the last committed group.
            pub last_commit_unix_s: AtomicI64,
            /// 1 while the subscription is acknowledged on the current connection, else 0.
            pub subscribed: AtomicU64,
        }

        impl Metrics {
            /// Renders the text exposition format.
            pub fn render(&self) -> String {
                let mut out = String::with_capacity(4096);
                $(
                    let _ = writeln!(out, "# HELP {} {}", $name, $help);
                    let _ = writeln!(out, "# TYPE {} counter", $name);
                    let _ = writeln!(out, "{} {}", $name, self.$field.load(Ordering::Relaxed));
                )*
                let _ = writeln!(out, "# HELP edgewatch_gateway_dead_letters_total Messages refused and stored as dead letters, by reason.");
                let _ = writeln!(out, "# TYPE edgewatch_gateway_dead_letters_total counter");
                for (reason, value) in Rejection::REASONS.iter().zip(&self.rejected) {
                    let _ = writeln!(out, "edgewatch_gateway_dead_letters_total{{reason=\"{reason}\"}} {}", value.load(Ordering::Relaxed));
                }
                for (name, help, counts) in [
                    ("edgewatch_gateway_events_refused_total", "Counter events of accepted batches refused, by reason (each but series_budget also dead-lettered).", &self.events_refused),
                    ("edgewatch_gateway_samples_refused_total", "Samples refused, by reason: what refused events would have written, counted in edgewatch_refused_samples_total.", &self.samples_refused),
                ] {
                    let _ = writeln!(out, "# HELP {name} {help}");
                    let _ = writeln!(out, "# TYPE {name} counter");
                    for (reason, value) in refusal::REASONS.iter().zip(counts) {
                        let _ = writeln!(out, "{name}{{reason=\"{reason}\"}} {}", value.load(Ordering::Relaxed));
                    }
                }
                let _ = writeln!(out, "# HELP edgewatch_gateway_remote_write_outbox_pending Remote-write requests committed locally and not yet delivered.");
                let _ = writeln!(out, "# TYPE edgewatch_gateway_remote_write_outbox_pending gauge");
                let _ = writeln!(out, "edgewatch_gateway_remote_write_outbox_pending {}", self.outbox_pending.load(Ordering::Relaxed));
                let _ = writeln!(out, "# HELP edgewatch_gateway_last_commit_timestamp_seconds Unix time of the last committed group of messages.");
                let _ = writeln!(out, "# TYPE edgewatch_gateway_last_commit_timestamp_seconds gauge");
                let _ = writeln!(out, "edgewatch_gateway_last_commit_timestamp_seconds {}", self.last_commit_unix_s.load(Ordering::Relaxed));
                let _ = writeln!(out, "# HELP edgewatch_gateway_subscribed 1 while the broker has acknowledged the subscription on the current connection.");
                let _ = writeln!(out, "# TYPE edgewatch_gateway_subscribed gauge");
                let _ = writeln!(out, "edgewatch_gateway_subscribed {}", self.subscribed.load(Ordering::Relaxed));
                out
            }
        }
    };
}

counters! {
    messages_received => "edgewatch_gateway_messages_received_total", "MQTT messages received.";
    messages_acked => "edgewatch_gateway_messages_acked_total", "MQTT messages acknowledged to the broker after their commit.";
    commits => "edgewatch_gateway_commits_total", "Store transactions committed (one per group of messages).";
    batches_accepted => "edgewatch_gateway_batches_accepted_total", "Batches with at least one new event.";
    batches_duplicate => "edgewatch_gateway_batches_duplicate_total", "Batches whose every event was already received.";
    events_new => "edgewatch_gateway_events_total", "Events accepted (after de-duplication).";
    events_duplicate => "edgewatch_gateway_events_duplicate_total", "Events dropped as already received.";
    status_messages => "edgewatch_gateway_status_messages_total", "Machine status messages received.";
    reconnects => "edgewatch_gateway_machine_reconnects_total", "Machine reconnects seen (status or arrival gap).";
    clock_skew_batches => "edgewatch_gateway_clock_skew_batches_total", "Batches whose sent time differs from arrival by more than ingest.max_clock_skew.";
    future_events => "edgewatch_gateway_future_events_total", "Counter events stamped later than arrival plus ingest.max_future_skew (refused).";
    bad_time_events => "edgewatch_gateway_bad_time_events_total", "Counter events stamped at or before the Unix epoch, or started after their own time (refused).";
    bad_label_events => "edgewatch_gateway_bad_label_events_total", "Counter events with a label value that is not acceptable (refused).";
    bad_values => "edgewatch_gateway_bad_values_total", "Counter events with a value that is negative, NaN or infinite (refused).";
    samples_new => "edgewatch_gateway_samples_stored_total", "Samples stored in the embedded store.";
    samples_identical => "edgewatch_gateway_samples_identical_total", "Samples already stored with the same value (no-op).";
    samples_conflicting => "edgewatch_gateway_samples_conflicting_total", "Samples refused: another value exists at a series and timestamp of their event.";
    samples_over_budget => "edgewatch_gateway_series_refused_total", "Samples refused because their machine's live series are at max_series_per_machine.";
    series_retired => "edgewatch_gateway_series_retired_total", "Series retired (not written for ingest.series_retire_after) to make room in a machine's budget.";
    baselines_new => "edgewatch_gateway_baselines_stored_total", "Baselines stored: where a counter stood before an event (0 at its start).";
    baselines_skipped => "edgewatch_gateway_baselines_skipped_total", "Baselines not written: the series holds another sample between the baseline and its value.";
    refusals_unplaced => "edgewatch_gateway_refusals_unplaced_total", "Refused samples that found no free millisecond in their refusal series.";
    dedup_holes_closed => "edgewatch_gateway_dedup_holes_closed_total", "Sequence numbers treated as received to bound de-duplication state.";
    dedup_epochs_pruned => "edgewatch_gateway_dedup_epochs_pruned_total", "De-duplication streams dropped by the per-(machine, tier) epoch bound.";
    dedup_streams_expired => "edgewatch_gateway_dedup_streams_expired_total", "De-duplication streams dropped after dedup.retention.";
    safety_received => "edgewatch_gateway_safety_events_received_total", "Safety events accepted.";
    safety_fresh => "edgewatch_gateway_safety_events_fresh_total", "Safety events that arrived within the freshness limit.";
    dead_letters_dropped => "edgewatch_gateway_dead_letters_dropped_total", "Old dead letters dropped to stay within store.dead_letter_max_records.";
    store_errors => "edgewatch_gateway_store_errors_total", "Store transactions that failed (nothing acknowledged).";
    rw_requests => "edgewatch_gateway_remote_write_requests_total", "Remote-write requests delivered.";
    rw_retries => "edgewatch_gateway_remote_write_retries_total", "Remote-write attempts retried (429, 5xx, transport errors).";
    rw_refused => "edgewatch_gateway_remote_write_refused_total", "Remote-write requests refused for good and dead-lettered.";
    rw_too_old => "edgewatch_gateway_remote_write_too_old_samples_total", "Samples stored locally but older than remote_write.max_sample_age (not sent).";
    mqtt_errors => "edgewatch_gateway_mqtt_connection_errors_total", "MQTT connection errors (each followed by a reconnect).";
}

impl Metrics {
    /// Adds the counters of one committed ingest call.
    pub fn add(&self, stats: &IngestStats) {
        let add = |counter: &AtomicU64, value: u64| {
            counter.fetch_add(value, Ordering::Relaxed);
        };
        add(&self.batches_accepted, stats.batches_accepted);
        add(&self.batches_duplicate, stats.batches_duplicate);
        add(&self.events_new, stats.events_new);
        add(&self.events_duplicate, stats.events_duplicate);
        add(&self.status_messages, stats.status_messages);
        add(&self.reconnects, stats.reconnects);
        add(&self.clock_skew_batches, stats.clock_skew_batches);
        add(
            &self.future_events,
            stats.events_refused_for(refusal::FUTURE_TIME),
        );
        add(
            &self.bad_time_events,
            stats.events_refused_for(refusal::BAD_TIME),
        );
        add(
            &self.bad_label_events,
            stats.events_refused_for(refusal::BAD_LABEL),
        );
        add(
            &self.bad_values,
            stats.events_refused_for(refusal::BAD_VALUE),
        );
        add(&self.samples_new, stats.samples_new);
        add(&self.samples_identical, stats.samples_identical);
        add(
            &self.samples_conflicting,
            stats.samples_refused_for(refusal::CONFLICT),
        );
        add(
            &self.samples_over_budget,
            stats.samples_refused_for(refusal::SERIES_BUDGET),
        );
        add(&self.series_retired, stats.series_retired);
        add(&self.baselines_new, stats.baselines_new);
        add(&self.baselines_skipped, stats.baselines_skipped);
        add(&self.refusals_unplaced, stats.refusals_unplaced);
        add(&self.dedup_holes_closed, stats.dedup_holes_closed);
        add(&self.dedup_epochs_pruned, stats.dedup_epochs_pruned);
        add(&self.safety_received, stats.safety_received);
        add(&self.safety_fresh, stats.safety_fresh);
        add(&self.dead_letters_dropped, stats.dead_letters_dropped);
        add(&self.rw_too_old, stats.samples_too_old_for_remote_write);
        for (counter, value) in self.rejected.iter().zip(stats.rejected) {
            add(counter, value);
        }
        for (counter, value) in self.events_refused.iter().zip(stats.events_refused) {
            add(counter, value);
        }
        for (counter, value) in self.samples_refused.iter().zip(stats.samples_refused) {
            add(counter, value);
        }
    }
}

/// Serves `GET /metrics` on `listener` until the task is dropped, through the one request
/// reader of [`crate::http`].
pub async fn serve(listener: tokio::net::TcpListener, metrics: Arc<Metrics>) {
    http::serve(listener, move |request: http::Request| {
        let metrics = Arc::clone(&metrics);
        async move { answer(&request, &metrics) }
    })
    .await;
}

fn answer(request: &http::Request, metrics: &Metrics) -> http::Response {
    match request.path.as_str() {
        "/metrics" => http::Response {
            status: "200 OK",
            headers: vec![(
                "Content-Type",
                "text/plain; version=0.0.4; charset=utf-8".to_owned(),
            )],
            body: metrics.render(),
        },
        _ => http::Response::text("404 Not Found", "not found\n"),
    }
}

/// Binds the metrics listener (so a bad address fails at start-up, not later).
pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn the_exposition_names_every_reason_and_adds_stats() {
        let metrics = Metrics::default();
        let mut stats = IngestStats::default();
        stats.rejected[0] = 2;
        stats.samples_new = 5;
        metrics.add(&stats);
        let text = metrics.render();
        assert!(text.contains("edgewatch_gateway_dead_letters_total{reason=\"bad_topic\"} 2\n"));
        assert!(text.contains("edgewatch_gateway_samples_stored_total 5\n"));
        for reason in Rejection::REASONS {
            assert!(text.contains(&format!("reason=\"{reason}\"")));
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_server_answers_get_metrics_over_http() {
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let metrics = Arc::new(Metrics::default());
        metrics.commits.fetch_add(3, Ordering::Relaxed);
        let server = tokio::spawn(serve(listener, Arc::clone(&metrics)));
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        assert!(response.starts_with("HTTP/1.1 200 OK"));
        assert!(response.contains("edgewatch_gateway_commits_total 3\n"));
        server.abort();
    }
}
