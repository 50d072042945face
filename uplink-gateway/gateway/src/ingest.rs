//! The ingest path: a group of MQTT messages → validate → de-duplicate → normalize → one store
//! transaction. No network and no clock: arrival time is an argument, and the caller acknowledges
//! the messages to the broker only after [`Ingestor::ingest`] returned `Ok`.
//!
//! Invariants:
//! - Every message of a group ends in exactly one [`Outcome`], and all their effects (samples,
//!   de-duplication ranges, machine state, dead letters, remote-write outbox) commit atomically or
//!   not at all. `Err` means nothing was committed and nothing may be acknowledged.
//! - A batch's events whose `(machine, epoch, tier, seq)` was already committed produce nothing;
//!   the batch's whole `first_seq..=last_seq` is then marked received (gaps inside a batch are
//!   records lost on the machine, see `docs/wire-protocol.md`).
//! - A refused message is stored as a dead letter with its reason, never dropped silently.
//! - When remote-write is configured, every sample newly stored (and young enough for the sink's
//!   out-of-order window) is queued in the outbox in the same transaction, one request per machine.

use edgewatch_proto::framing::{BatchDecoder, DecodeError};
use edgewatch_proto::v1::{Batch, MachineStatus, Tier};
use edgewatch_slo::names::metric;
use prost::Message as _;

use crate::config::IngestConfig;
use crate::dedup::{stream_key, stream_prefix};
use crate::remote_write::build_request;
use crate::series::{self, BaseLabels, NormalizeStats, Sample};
use crate::store::{DeadLetter, DeadLetterSource, Store, StoreError, Upsert, Writer};
use crate::validate::{Rejection, Valid, validate};

/// One MQTT message handed to the ingest path.
#[derive(Debug, Clone, Copy)]
pub struct Incoming<'a> {
    /// Topic it was published on.
    pub topic: &'a str,
    /// Payload.
    pub payload: &'a [u8],
}

/// What became of one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A batch with at least one event not received before.
    Accepted {
        /// Events not seen before.
        new_events: u64,
        /// Events already received (re-sent).
        duplicate_events: u64,
    },
    /// A batch whose every event was received before.
    Duplicate,
    /// A machine status message.
    Status,
    /// Refused and stored as a dead letter.
    DeadLettered {
        /// [`Rejection::reason`].
        reason: &'static str,
    },
}

/// Counters of one ingest call, added to the gateway's metrics by the caller.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IngestStats {
    /// Batches with new events.
    pub batches_accepted: u64,
    /// Batches entirely re-sent.
    pub batches_duplicate: u64,
    /// Events not seen before.
    pub events_new: u64,
    /// Events dropped as already received.
    pub events_duplicate: u64,
    /// Status messages.
    pub status_messages: u64,
    /// Reconnects detected (status or arrival gap).
    pub reconnects: u64,
    /// Batches whose `sent_time` differs from arrival by more than the allowed clock skew.
    pub clock_skew_batches: u64,
    /// What normalization dropped.
    pub normalize: NormalizeStats,
    /// Samples stored.
    pub samples_new: u64,
    /// Samples already stored with the same value.
    pub samples_identical: u64,
    /// Samples refused: another value exists at that (series, timestamp).
    pub samples_conflicting: u64,
    /// Samples refused by the per-machine series budget.
    pub samples_over_budget: u64,
    /// Sequence numbers treated as received when bounding de-duplication ranges.
    pub dedup_holes_closed: u64,
    /// De-duplication streams dropped for the per-(machine, tier) epoch bound.
    pub dedup_epochs_pruned: u64,
    /// Safety events accepted / fresh.
    pub safety_received: u64,
    /// Of those, fresh.
    pub safety_fresh: u64,
    /// Dead letters written, per [`Rejection::REASONS`] index.
    pub rejected: [u64; Rejection::REASONS.len()],
    /// Old dead letters dropped to respect the bound.
    pub dead_letters_dropped: u64,
    /// Samples stored but too old for the remote-write sink's window.
    pub samples_too_old_for_remote_write: u64,
}

/// Result of one committed ingest call.
#[derive(Debug, Clone, Default)]
pub struct IngestReport {
    /// One outcome per message, in order.
    pub outcomes: Vec<Outcome>,
    /// Counters.
    pub stats: IngestStats,
    /// Outbox ids queued for remote-write in this transaction.
    pub outbox_ids: Vec<u64>,
}

/// The ingest path over an open store.
pub struct Ingestor {
    store: Store,
    decoder: BatchDecoder,
    config: IngestConfig,
}

impl Ingestor {
    /// An ingest path writing to `store`; fails only if the zstd decoder cannot start.
    pub fn new(store: Store, config: IngestConfig) -> Result<Self, DecodeError> {
        let decoder = BatchDecoder::new()?;
        Ok(Self {
            store,
            decoder,
            config,
        })
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The configuration.
    pub fn config(&self) -> &IngestConfig {
        &self.config
    }

    /// Ingests a group of messages that arrived at `arrival_ns` in one durable transaction.
    pub fn ingest(
        &mut self,
        messages: &[Incoming<'_>],
        arrival_ns: i64,
    ) -> Result<IngestReport, StoreError> {
        let decoder = &mut self.decoder;
        let config = &self.config;
        self.store.write(|writer| {
            let mut report = IngestReport::default();
            let mut remote: Vec<(String, Vec<Sample>)> = Vec::new();
            for message in messages {
                let outcome = match validate(message.topic, message.payload, decoder) {
                    Ok(Valid::Batch(batch)) => ingest_batch(
                        writer,
                        config,
                        &batch,
                        arrival_ns,
                        &mut report.stats,
                        &mut remote,
                    )?,
                    Ok(Valid::Status(status)) => {
                        ingest_status(writer, config, &status, arrival_ns, &mut report.stats)?;
                        Outcome::Status
                    }
                    Err(rejection) => {
                        let reason = rejection.reason();
                        if let Some(index) = Rejection::REASONS.iter().position(|r| *r == reason)
                        {
                            report.stats.rejected[index] += 1;
                        }
                        tracing::warn!(topic = %truncate(message.topic), reason, error = %rejection, "Message refused; dead-lettered.");
                        report.stats.dead_letters_dropped += writer.dead_letter(&DeadLetter {
                            arrival_ns,
                            source: DeadLetterSource::Mqtt,
                            reason: format!("{reason}: {rejection}"),
                            topic: message.topic.to_owned(),
                            payload_len: message.payload.len() as u64,
                            payload: message.payload.to_vec(),
                        })?;
                        Outcome::DeadLettered { reason }
                    }
                };
                report.outcomes.push(outcome);
            }
            for (_, samples) in &remote {
                if samples.is_empty() {
                    continue;
                }
                let refs: Vec<&Sample> = samples.iter().collect();
                let body = build_request(&refs).encode_to_vec();
                report.outbox_ids.push(writer.outbox_push(&body)?);
            }
            Ok(report)
        })
    }
}

fn truncate(text: &str) -> &str {
    let mut end = text.len().min(200);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

fn ns(duration: std::time::Duration) -> i64 {
    i64::try_from(duration.as_nanos()).unwrap_or(i64::MAX)
}

/// Notes an arrival from a machine: a silence longer than the reconnect gap makes it a reconnect.
fn note_arrival(
    state: &mut crate::store::MachineState,
    config: &IngestConfig,
    arrival_ns: i64,
    stats: &mut IngestStats,
) {
    if (state.last_arrival_ns == 0
        || arrival_ns.saturating_sub(state.last_arrival_ns) > ns(config.reconnect_gap))
        && arrival_ns > state.reconnect_ns
    {
        state.reconnect_ns = arrival_ns;
        stats.reconnects += 1;
    }
    state.last_arrival_ns = state.last_arrival_ns.max(arrival_ns);
}

fn ingest_status(
    writer: &mut Writer<'_>,
    config: &IngestConfig,
    status: &MachineStatus,
    arrival_ns: i64,
    stats: &mut IngestStats,
) -> Result<(), StoreError> {
    stats.status_messages += 1;
    let mut state = writer.machine_get(&status.machine_id)?;
    if status.online {
        // The agent's clock says when it connected; never later than we saw it.
        let connected = status.time_unix_ns.min(arrival_ns);
        if connected > state.reconnect_ns {
            state.reconnect_ns = connected;
            stats.reconnects += 1;
        }
        state.last_arrival_ns = state.last_arrival_ns.max(arrival_ns);
    } else {
        note_arrival(&mut state, config, arrival_ns, stats);
    }
    writer.machine_put(&status.machine_id, &state)
}

fn ingest_batch(
    writer: &mut Writer<'_>,
    config: &IngestConfig,
    batch: &Batch,
    arrival_ns: i64,
    stats: &mut IngestStats,
    remote: &mut Vec<(String, Vec<Sample>)>,
) -> Result<Outcome, StoreError> {
    let key = stream_key(&batch.machine_id, batch.tier, batch.agent_epoch);
    let (mut ranges, _) = writer.dedup_get(&key)?.unwrap_or_default();
    let mut state = writer.machine_get(&batch.machine_id)?;
    note_arrival(&mut state, config, arrival_ns, stats);
    if ranges.contains_all(batch.first_seq, batch.last_seq) {
        stats.batches_duplicate += 1;
        stats.events_duplicate += batch.events.len() as u64;
        writer.machine_put(&batch.machine_id, &state)?;
        return Ok(Outcome::Duplicate);
    }
    if batch.sent_time_unix_ns.abs_diff(arrival_ns) > config.max_clock_skew.as_nanos() as u64 {
        stats.clock_skew_batches += 1;
        tracing::warn!(
            machine = %batch.machine_id,
            skew_ms = (batch.sent_time_unix_ns.saturating_sub(arrival_ns)) / 1_000_000,
            "Batch sent time is far from its arrival: the agent's clock is skewed."
        );
    }
    let base = BaseLabels::of(batch);
    let is_safety = batch.tier == Tier::Safety as i32;
    let mut samples = Vec::new();
    let mut new_events = 0u64;
    let mut duplicate_events = 0u64;
    let mut normalize = NormalizeStats::default();
    for event in &batch.events {
        if ranges.contains(event.seq) {
            duplicate_events += 1;
            continue;
        }
        new_events += 1;
        match &base {
            Some(base) => series::normalize_event(
                base,
                event,
                arrival_ns,
                ns(config.max_future_skew),
                &mut normalize,
                &mut samples,
            ),
            None => normalize.bad_label_events += 1,
        }
        if is_safety {
            state.safety_received += 1;
            stats.safety_received += 1;
            if series::is_fresh(
                arrival_ns,
                event.event_time_unix_ns,
                state.reconnect_ns,
                ns(config.freshness_limit),
            ) {
                state.safety_fresh += 1;
                stats.safety_fresh += 1;
            }
        }
    }
    if is_safety
        && new_events > 0
        && let Some(base) = &base
    {
        let ts_ms = series::ns_to_ms(arrival_ns).max(state.last_gateway_ts_ms + 1);
        state.last_gateway_ts_ms = ts_ms;
        samples.push(Sample {
            series: base.key(metric::SAFETY_EVENTS_RECEIVED, &[]),
            ts_ms,
            value: state.safety_received as f64,
        });
        samples.push(Sample {
            series: base.key(metric::SAFETY_EVENTS_FRESH, &[]),
            ts_ms,
            value: state.safety_fresh as f64,
        });
    }
    let oldest_for_remote = config
        .remote_write_max_age
        .map(|age| series::ns_to_ms(arrival_ns.saturating_sub(ns(age))));
    let mut stored = Vec::new();
    for sample in samples {
        let gateway_series = sample.series.starts_with(metric::GATEWAY_PREFIX);
        let budget = (!gateway_series).then_some(config.max_series_per_machine);
        match writer.upsert_sample(
            &batch.machine_id,
            &sample.series,
            sample.ts_ms,
            sample.value,
            budget,
        )? {
            Upsert::New => {
                stats.samples_new += 1;
                match oldest_for_remote {
                    Some(oldest) if sample.ts_ms < oldest => {
                        stats.samples_too_old_for_remote_write += 1;
                    }
                    Some(_) => stored.push(sample),
                    None => {}
                }
            }
            Upsert::Identical => stats.samples_identical += 1,
            Upsert::Conflict => {
                stats.samples_conflicting += 1;
                tracing::warn!(machine = %batch.machine_id, series = %sample.series, ts_ms = sample.ts_ms, "A different value exists at this series and time; sample refused.");
            }
            Upsert::OverBudget => {
                stats.samples_over_budget += 1;
                tracing::warn!(machine = %batch.machine_id, series = %sample.series, "Machine is at its series budget; sample refused.");
            }
        }
    }
    if !stored.is_empty() {
        match remote.iter_mut().find(|(m, _)| *m == batch.machine_id) {
            Some((_, list)) => list.extend(stored),
            None => remote.push((batch.machine_id.clone(), stored)),
        }
    }
    stats.dedup_holes_closed += ranges.insert(
        batch.first_seq,
        batch.last_seq,
        config.max_ranges_per_stream as usize,
    );
    let prefix = stream_prefix(&batch.machine_id, batch.tier);
    stats.dedup_epochs_pruned += writer.dedup_put(
        &key,
        &prefix,
        &ranges,
        arrival_ns,
        config.max_epochs_per_stream,
    )?;
    writer.machine_put(&batch.machine_id, &state)?;
    stats.normalize.future_events += normalize.future_events;
    stats.normalize.bad_time_events += normalize.bad_time_events;
    stats.normalize.bad_label_events += normalize.bad_label_events;
    stats.normalize.bad_values += normalize.bad_values;
    stats.batches_accepted += 1;
    stats.events_new += new_events;
    stats.events_duplicate += duplicate_events;
    Ok(Outcome::Accepted {
        new_events,
        duplicate_events,
    })
}
