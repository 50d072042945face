//! The ingest path: a group of MQTT messages → validate → de-duplicate → normalize → admit →
//! one store transaction. No network and no clock: arrival time is an argument, and the caller
//! acknowledges the messages to the broker only after [`Ingestor::ingest`] returned `Ok`.
//!
//! ```text
//! event ─► normalize (series.rs: labels, times, values, SLO pairs, increments; baselines)
//!            │ refused ─────────────────────────────┐
//!            ▼                                       │
//!          conflicts ─► same run never decreases ─► series budget (retire, then admit)
//!            │ refused            │ refused            │ refused
//!            ▼                    ▼                    ▼
//!          values + baselines   dead letter (not for the budget) + refusal series, per
//!          stored, series live  refused sample, at the sample's time
//! ```
//!
//! Invariants:
//! - Every message of a group ends in exactly one [`Outcome`], and all their effects (samples,
//!   live series, de-duplication ranges, machine state, dead letters, remote-write outbox)
//!   commit atomically or not at all. `Err` means nothing was committed and nothing may be
//!   acknowledged.
//! - A batch's events whose `(machine, epoch, tier, seq)` was already committed produce nothing;
//!   the batch's whole `first_seq..=last_seq` is then marked received (gaps inside a batch are
//!   records lost on the machine, see `docs/wire-protocol.md`). So a redelivered or replayed
//!   event is never refused, admitted or counted twice, and writes no second baseline.
//! - A counter event is stored whole or refused whole: its values and baselines, with both
//!   series of every SLO pair, are admitted together or not at all. A refused event is
//!   dead-lettered with its reason (except when only the series budget refused it) and every
//!   sample it would have written is counted in `edgewatch_refused_samples_total` (labels of
//!   the refused series, its name, the reason), written to both sinks: refused data is never
//!   silently absent from a report.
//! - A machine has at most `max_series_per_machine` live series. When one more is needed, the
//!   series not written for `series_retire_after` in the machine's event time (against its
//!   newest event time, so a replayed backlog retires the same series whenever it arrives)
//!   retire first; they keep their samples and are admitted again when written again.
//! - A refused message is stored as a dead letter with its reason, never dropped silently.
//! - Each machine's fleet series (online state from its last status of the group, last event
//!   time and last arrival from its batches with new events, first and last event time per
//!   model version of its stored events) are stamped at arrival, strictly increasing per
//!   machine, and written only when they change: a redelivered group writes nothing new.
//! - When remote-write is configured, every sample newly stored (and young enough for the sink's
//!   out-of-order window) is queued in the outbox in the same transaction, one request per machine.
//! - Decoding is pure, so where a second core is at hand a group's messages are decoded on a
//!   second thread ([`Decoding::Ahead`]), a few chunks ahead of the thread that admits them in
//!   their order. That changes when a message is decoded, never what the transaction writes: the
//!   outcomes, counters and store are those of decoding inline (a proptest compares them), and a
//!   failed transaction stops the decoding thread before `ingest` returns.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::mpsc;

use edgewatch_proto::framing::{BatchDecoder, DecodeError};
use edgewatch_proto::v1::{Batch, Event, MachineStatus, Tier};
use edgewatch_slo::names::{ONLINE_REFRESH_MS, label, metric, refusal, value};
use prost::Message as _;

use crate::config::IngestConfig;
use crate::dedup::{stream_key, stream_prefix};
use crate::remote_write::build_request;
use crate::series::{
    self, BaseLabels, EventSamples, KeyMemo, Normalized, Refusal, Sample, SeriesKey, SeriesSlot,
};
use crate::store::{
    DeadLetter, DeadLetterSource, LiveMachine, LiveSeries, MachineState, Store, StoreError, Upsert,
    Writer,
};
use crate::validate::{Rejection, Valid, validate};

/// Refusal series a machine may own with the labels of the series they are about; beyond it a
/// refusal keeps only the base labels, its reason and series name (model `unknown`), so a
/// machine cannot mint series through its refusals.
pub const MAX_REFUSAL_SERIES_PER_MACHINE: u64 = 64;
/// How far (ms) a refusal may move later than its time to find two free milliseconds for its
/// pair of samples: refusals of one series at one millisecond arriving apart.
const REFUSAL_SLOT_SEARCH_MS: i64 = 1_000;

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
    /// Counter events refused, per `names::refusal::REASONS` index.
    pub events_refused: [u64; refusal::REASONS.len()],
    /// Samples refused (what the refused events would have written), per reason index.
    pub samples_refused: [u64; refusal::REASONS.len()],
    /// Samples stored (values, baselines, the gateway's own and refusal series).
    pub samples_new: u64,
    /// Samples already stored with the same value.
    pub samples_identical: u64,
    /// Baselines stored (of `samples_new`).
    pub baselines_new: u64,
    /// Baselines not written because the series holds another sample between the baseline's
    /// time and its value's (another run, or a sample a millisecond before).
    pub baselines_skipped: u64,
    /// Series retired to make room in a machine's budget.
    pub series_retired: u64,
    /// Refusals that found no free millisecond for their pair of samples (not counted in the
    /// refusal series; a warning names them).
    pub refusals_unplaced: u64,
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

impl IngestStats {
    /// Counter events refused for `reason` (one of `names::refusal::REASONS`).
    pub fn events_refused_for(&self, reason: &str) -> u64 {
        self.events_refused[reason_index(reason)]
    }

    /// Samples refused for `reason`.
    pub fn samples_refused_for(&self, reason: &str) -> u64 {
        self.samples_refused[reason_index(reason)]
    }
}

/// Index of a refusal reason in `names::refusal::REASONS`.
fn reason_index(reason: &str) -> usize {
    refusal::REASONS
        .iter()
        .position(|r| *r == reason)
        .unwrap_or(0)
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

/// Where a group's messages are decoded (zstd, protobuf, structure checks: pure work).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decoding {
    /// On the thread that writes the transaction, each message just before it is admitted.
    Inline,
    /// On a second thread, ahead of the writing thread, for groups of at least `min_messages`
    /// (smaller groups decode inline: starting the thread would cost more than it overlaps). The
    /// transaction, its order and its outcome are those of [`Decoding::Inline`].
    Ahead {
        /// Smallest group decoded ahead.
        min_messages: usize,
    },
}

impl Decoding {
    /// Decoding ahead where `decode_ahead` is set and the machine has a second core to run it
    /// on, inline elsewhere.
    pub fn for_this_machine(decode_ahead: bool) -> Self {
        match std::thread::available_parallelism() {
            Ok(cores) if decode_ahead && cores.get() >= 2 => Self::Ahead {
                min_messages: DECODE_AHEAD_MIN_MESSAGES,
            },
            _ => Self::Inline,
        }
    }
}

/// Messages decoded per hand-over between the decoding thread and the writing one: each
/// hand-over may wake a thread, so they go in chunks rather than one by one.
const DECODE_CHUNK: usize = 8;
/// Chunks the decoding thread may hold decoded ahead of the writing thread (with their batches,
/// kept between groups and decoded into again).
const DECODE_CHUNKS: usize = 4;
/// Smallest group [`Decoding::for_this_machine`] decodes ahead: two chunks.
pub const DECODE_AHEAD_MIN_MESSAGES: usize = 2 * DECODE_CHUNK;

/// Messages decoded ahead of the writing thread: `validated[i]` is the validation of a message,
/// `batches[i]` the batch it decoded into.
#[derive(Default)]
struct DecodedChunk {
    validated: Vec<Result<Valid, Rejection>>,
    batches: Vec<Batch>,
}

/// The ingest path over an open store.
pub struct Ingestor {
    /// Shared with readers in the same process (the fleet page), which only read.
    store: std::sync::Arc<Store>,
    decoder: BatchDecoder,
    /// The batch being ingested when decoding inline, decoded over the one before (its strings
    /// and lists reused).
    batch: Batch,
    /// Series keys built for the batch being ingested, for the events after.
    keys: KeyMemo,
    config: IngestConfig,
    decoding: Decoding,
    /// The chunks of batches decoded ahead, between groups.
    chunks: Vec<DecodedChunk>,
}

impl Ingestor {
    /// An ingest path writing to `store`, decoding as [`Decoding::for_this_machine`] says for
    /// `config.decode_ahead`; fails only if the zstd decoder cannot start.
    pub fn new(store: Store, config: IngestConfig) -> Result<Self, DecodeError> {
        let decoder = BatchDecoder::new()?;
        Ok(Self {
            store: std::sync::Arc::new(store),
            decoder,
            batch: Batch::default(),
            keys: KeyMemo::default(),
            decoding: Decoding::for_this_machine(config.decode_ahead),
            config,
            chunks: Vec::new(),
        })
    }

    /// Decodes the next groups as `decoding` says.
    pub fn set_decoding(&mut self, decoding: Decoding) {
        self.decoding = decoding;
    }

    /// How groups are decoded.
    pub fn decoding(&self) -> Decoding {
        self.decoding
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The store, for a reader in the same process (a second handle on the file would conflict
    /// with this one's lock).
    pub fn shared_store(&self) -> std::sync::Arc<Store> {
        std::sync::Arc::clone(&self.store)
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
        if let Decoding::Ahead { min_messages } = self.decoding
            && messages.len() >= min_messages.max(1)
            && let Some(written) = self.ingest_decoding_ahead(messages, arrival_ns)
        {
            return written;
        }
        let Self {
            store,
            decoder,
            batch,
            keys,
            config,
            ..
        } = self;
        store.write(|writer| {
            let mut group = GroupWrite::default();
            for message in messages {
                let validated = validate(message.topic, message.payload, decoder, batch);
                group.message(writer, config, keys, message, validated, batch, arrival_ns)?;
            }
            group.finish(writer, config, arrival_ns)
        })
    }

    /// [`Ingestor::ingest`] with the messages decoded on a second thread, chunk by chunk, while
    /// this one admits the chunks decoded before. `None` if the thread could not start (nothing
    /// was written).
    fn ingest_decoding_ahead(
        &mut self,
        messages: &[Incoming<'_>],
        arrival_ns: i64,
    ) -> Option<Result<IngestReport, StoreError>> {
        let Self {
            store,
            decoder,
            keys,
            config,
            chunks,
            ..
        } = self;
        let (decoded_tx, decoded_rx) = mpsc::channel::<DecodedChunk>();
        let (free_tx, free_rx) = mpsc::channel::<DecodedChunk>();
        chunks.resize_with(DECODE_CHUNKS, DecodedChunk::default);
        for chunk in chunks.drain(..) {
            // Cannot fail: `free_rx` is alive.
            let _ = free_tx.send(chunk);
        }
        std::thread::scope(|scope| {
            let decoding = std::thread::Builder::new()
                .name("ingest-decode".to_owned())
                .spawn_scoped(scope, move || {
                    for part in messages.chunks(DECODE_CHUNK) {
                        // Waits while every chunk is decoded and not yet admitted; fails once
                        // the writer stopped (its transaction failed).
                        let Ok(mut chunk) = free_rx.recv() else { break };
                        chunk.validated.clear();
                        if chunk.batches.len() < part.len() {
                            chunk.batches.resize_with(part.len(), Batch::default);
                        }
                        for (message, batch) in part.iter().zip(&mut chunk.batches) {
                            chunk.validated.push(validate(
                                message.topic,
                                message.payload,
                                decoder,
                                batch,
                            ));
                        }
                        if decoded_tx.send(chunk).is_err() {
                            break;
                        }
                    }
                    free_rx
                })
                .ok()?;
            // The closure owns the writer's ends of both channels: whether it returns, fails or
            // never runs, they are dropped with it, so the decoding thread never waits for it.
            let written = store.write(move |writer| {
                let mut group = GroupWrite::default();
                for part in messages.chunks(DECODE_CHUNK) {
                    let Ok(mut chunk) = decoded_rx.recv() else {
                        // Nothing of the group may commit; the thread's panic follows.
                        panic!("the decoding thread stopped before the group's end");
                    };
                    for ((message, validated), batch) in part
                        .iter()
                        .zip(chunk.validated.drain(..))
                        .zip(&chunk.batches)
                    {
                        group
                            .message(writer, config, keys, message, validated, batch, arrival_ns)?;
                    }
                    let _ = free_tx.send(chunk);
                }
                group.finish(writer, config, arrival_ns)
            });
            match decoding.join() {
                Ok(free_rx) => chunks.extend(free_rx.try_iter()),
                Err(panic) => std::panic::resume_unwind(panic),
            }
            Some(written)
        })
    }
}

/// What a group's transaction gathers over its messages, written at its end.
#[derive(Default)]
struct GroupWrite {
    report: IngestReport,
    /// Samples newly stored, per machine, for the remote-write outbox.
    remote: Vec<(String, Vec<Sample>)>,
    /// Each machine's last status in the group.
    statuses: Vec<MachineStatus>,
}

impl GroupWrite {
    /// Ingests one message, given its validation (a batch's decoded into `batch`).
    #[allow(clippy::too_many_arguments)]
    fn message(
        &mut self,
        writer: &mut Writer<'_>,
        config: &IngestConfig,
        keys: &mut KeyMemo,
        message: &Incoming<'_>,
        validated: Result<Valid, Rejection>,
        batch: &Batch,
        arrival_ns: i64,
    ) -> Result<(), StoreError> {
        let stats = &mut self.report.stats;
        let outcome = match validated {
            Ok(Valid::Batch) => ingest_batch(
                writer,
                config,
                batch,
                message.topic,
                arrival_ns,
                stats,
                &mut self.remote,
                keys,
            )?,
            Ok(Valid::Status(status)) => {
                ingest_status(writer, config, &status, arrival_ns, stats)?;
                // The online state as of the group: a machine's last status in it.
                self.statuses.retain(|s| s.machine_id != status.machine_id);
                self.statuses.push(status);
                Outcome::Status
            }
            Err(rejection) => {
                let reason = rejection.reason();
                if let Some(index) = Rejection::REASONS.iter().position(|r| *r == reason) {
                    stats.rejected[index] += 1;
                }
                tracing::warn!(topic = %truncate(message.topic), reason, error = %rejection, "Message refused; dead-lettered.");
                stats.dead_letters_dropped += writer.dead_letter(&DeadLetter {
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
        self.report.outcomes.push(outcome);
        Ok(())
    }

    /// Writes what the group gathered: each machine's online state, the remote-write requests.
    fn finish(
        mut self,
        writer: &mut Writer<'_>,
        config: &IngestConfig,
        arrival_ns: i64,
    ) -> Result<IngestReport, StoreError> {
        for status in &self.statuses {
            write_online(
                writer,
                config,
                status,
                arrival_ns,
                &mut self.report.stats,
                &mut self.remote,
            )?;
        }
        for (_, samples) in &self.remote {
            if samples.is_empty() {
                continue;
            }
            let refs: Vec<&Sample> = samples.iter().collect();
            let body = build_request(&refs).encode_to_vec();
            self.report.outbox_ids.push(writer.outbox_push(&body)?);
        }
        Ok(self.report)
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

/// Writes a machine's online state for the fleet view: its retained status when the agent
/// connects, its last will when the broker saw the link cut. Called with the machine's last
/// status of a group, so a redelivered group (the same statuses again) writes nothing new; a
/// status that changed and changed back within one group is not seen. A class that is not a
/// label value is `unknown` here, so the machine is still listed.
fn write_online(
    writer: &mut Writer<'_>,
    config: &IngestConfig,
    status: &MachineStatus,
    arrival_ns: i64,
    stats: &mut IngestStats,
    remote: &mut Vec<(String, Vec<Sample>)>,
) -> Result<(), StoreError> {
    let mut state = writer.machine_get(&status.machine_id)?;
    let base = BaseLabels {
        machine: &status.machine_id,
        site: &status.site_id,
        class: series::label_value(&status.machine_class).unwrap_or(value::UNKNOWN),
    };
    let mut fleet = FleetWrite::new(&mut state, arrival_ns);
    fleet.status(&base, status.online);
    let mut stored = Vec::new();
    fleet.commit(writer, stats, &mut stored)?;
    queue_remote(
        config,
        &status.machine_id,
        arrival_ns,
        stored,
        stats,
        remote,
    );
    writer.machine_put(&status.machine_id, &state)
}

/// The fleet series one message writes for its machine (`docs/series.md`, "Fleet series"),
/// at one timestamp: its arrival, or just after the machine's previous fleet sample when that
/// is not earlier. Only what changed is written, so a redelivery or a replay at the same
/// arrival writes nothing new.
struct FleetWrite<'s> {
    state: &'s mut MachineState,
    arrival_ms: i64,
    /// (series key, value) to write.
    samples: Vec<(String, f64)>,
    /// Whether the online state is among them.
    online: bool,
}

impl<'s> FleetWrite<'s> {
    fn new(state: &'s mut MachineState, arrival_ns: i64) -> Self {
        Self {
            state,
            arrival_ms: series::ns_to_ms(arrival_ns),
            samples: Vec::with_capacity(4),
            online: false,
        }
    }

    /// A status message: the machine's online state, written when it changed (or was last
    /// written [`ONLINE_REFRESH_MS`] ago).
    fn status(&mut self, base: &BaseLabels<'_>, online: bool) {
        let status = if online {
            MachineState::STATUS_ONLINE
        } else {
            MachineState::STATUS_OFFLINE
        };
        let changed = status != self.state.status;
        self.state.status = status;
        if changed || self.refresh_due() {
            self.push_online(base);
        }
    }

    fn refresh_due(&self) -> bool {
        self.arrival_ms.saturating_sub(self.state.status_ts_ms) >= ONLINE_REFRESH_MS
    }

    fn push_online(&mut self, base: &BaseLabels<'_>) {
        let value = match self.state.status {
            MachineState::STATUS_ONLINE => 1.0,
            MachineState::STATUS_OFFLINE => 0.0,
            _ => return,
        };
        self.online = true;
        self.samples
            .push((base.key(metric::MACHINE_ONLINE, &[]), value));
    }

    /// What a batch with new events says of its machine: its arrival (when later than the last
    /// one written), the newest event time (when it rose), and the online state of the last
    /// status message again when that was written [`ONLINE_REFRESH_MS`] ago.
    fn batch(&mut self, base: &BaseLabels<'_>, newest_event_ms: Option<i64>) {
        if self.arrival_ms > self.state.arrival_series_ms {
            self.state.arrival_series_ms = self.arrival_ms;
            self.samples.push((
                base.key(metric::MACHINE_LAST_ARRIVAL, &[]),
                self.arrival_ms as f64 / 1000.0,
            ));
        }
        if let Some(newest) = newest_event_ms
            && newest > self.state.last_event_ms
        {
            self.state.last_event_ms = newest;
            self.samples.push((
                base.key(metric::MACHINE_LAST_EVENT, &[]),
                newest as f64 / 1000.0,
            ));
        }
        if self.state.status != MachineState::STATUS_NONE && self.refresh_due() {
            self.push_online(base);
        }
    }

    /// The event times of a model version's events stored from this batch: its first-event
    /// series when they lower it, its last-event series when they raise it.
    fn model_version(
        &mut self,
        writer: &mut Writer<'_>,
        base: &BaseLabels<'_>,
        model: (&str, &str),
        (first_ms, last_ms): (i64, i64),
    ) -> Result<(), StoreError> {
        let labels = [(label::MODEL, model.0), (label::MODEL_VERSION, model.1)];
        for (name, ms, lowers) in [
            (metric::MODEL_VERSION_FIRST_EVENT, first_ms, true),
            (metric::MODEL_VERSION_LAST_EVENT, last_ms, false),
        ] {
            let key = base.key(name, &labels);
            let stored_ms = match writer.series_id(&key)? {
                Some(id) => writer
                    .last_sample(id)?
                    .map(|(_, seconds)| (seconds * 1000.0).round() as i64),
                None => None,
            };
            let moves =
                stored_ms.is_none_or(|stored| if lowers { ms < stored } else { ms > stored });
            if moves {
                self.samples.push((key, ms as f64 / 1000.0));
            }
        }
        Ok(())
    }

    /// Writes the samples, adding those newly stored to `stored`.
    fn commit(
        self,
        writer: &mut Writer<'_>,
        stats: &mut IngestStats,
        stored: &mut Vec<Sample>,
    ) -> Result<(), StoreError> {
        if self.samples.is_empty() {
            return Ok(());
        }
        let ts_ms = self
            .arrival_ms
            .max(self.state.last_fleet_ts_ms.saturating_add(1));
        self.state.last_fleet_ts_ms = ts_ms;
        if self.online {
            self.state.status_ts_ms = ts_ms;
        }
        for (series, value) in self.samples {
            write_gateway_sample(writer, stats, stored, series, ts_ms, value)?;
        }
        Ok(())
    }
}

/// Writes one sample of a series the gateway derives (stamped with arrival, strictly after the
/// machine's previous one, so a different stored value means a store that lost its machine
/// state: refused and counted, never overwritten).
fn write_gateway_sample(
    writer: &mut Writer<'_>,
    stats: &mut IngestStats,
    stored: &mut Vec<Sample>,
    series: String,
    ts_ms: i64,
    value: f64,
) -> Result<(), StoreError> {
    let id = writer.series_id_or_create(&series)?;
    match writer.put_sample(id, ts_ms, value)? {
        Upsert::New => {
            stats.samples_new += 1;
            stored.push(Sample {
                series,
                ts_ms,
                value,
            });
        }
        Upsert::Identical => stats.samples_identical += 1,
        Upsert::Conflict => {
            stats.samples_refused[reason_index(refusal::CONFLICT)] += 1;
            tracing::warn!(%series, ts_ms, "A different value exists at this series and time; sample refused.");
        }
    }
    Ok(())
}

/// Queues a machine's newly stored samples for remote-write (when configured), leaving out
/// those older than the sink's window (counted).
fn queue_remote(
    config: &IngestConfig,
    machine: &str,
    arrival_ns: i64,
    stored: Vec<Sample>,
    stats: &mut IngestStats,
    remote: &mut Vec<(String, Vec<Sample>)>,
) {
    let Some(age) = config.remote_write_max_age else {
        return;
    };
    let oldest = series::ns_to_ms(arrival_ns.saturating_sub(ns(age)));
    let mut sent = Vec::with_capacity(stored.len());
    for sample in stored {
        if sample.ts_ms < oldest {
            stats.samples_too_old_for_remote_write += 1;
        } else {
            sent.push(sample);
        }
    }
    if sent.is_empty() {
        return;
    }
    match remote.iter_mut().find(|(m, _)| m == machine) {
        Some((_, list)) => list.extend(sent),
        None => remote.push((machine.to_owned(), sent)),
    }
}

/// A (model, model version) and the oldest and newest event time (ms) of its events stored.
type ModelSpan<'b> = ((&'b str, &'b str), (i64, i64));

/// What one batch's events share while they are admitted: the store, the machine and its state,
/// and what the batch refused and stored so far.
struct BatchContext<'b, 'w, 'txn> {
    writer: &'w mut Writer<'txn>,
    config: &'b IngestConfig,
    batch: &'b Batch,
    topic: &'b str,
    arrival_ns: i64,
    state: MachineState,
    /// The batch's machine in the writer's live-series entries (looked up once per batch).
    live_machine: LiveMachine<'b>,
    stats: &'b mut IngestStats,
    /// (refused series key, reason, time ms), one per refused sample.
    refused: Vec<(String, &'static str, i64)>,
    /// Samples newly stored, for remote-write.
    stored: Vec<Sample>,
    /// Whether there is a remote-write sink to keep them for.
    remote: bool,
    /// Newest sane event time (ms) of the batch's new events.
    newest_event_ms: Option<i64>,
    /// Per (model, model version) of the events stored, their oldest and newest event time (ms),
    /// in the order first stored (a batch names one or a few: searched from the last one added,
    /// not kept sorted per event).
    model_versions: Vec<ModelSpan<'b>>,
    /// Per value of the event being admitted: its series' live state before it, its series id
    /// (before and after the event), and the (series id, time) of the samples it newly wrote.
    /// Reused from event to event.
    scratch: Scratch,
}

/// [`BatchContext::scratch`].
#[derive(Default)]
struct Scratch {
    lives: Vec<Option<LiveSeries>>,
    /// Ids and writer slots of the series that existed before the event (looked up once).
    known: Vec<Option<(u64, SeriesSlot)>>,
    ids: Vec<(u64, SeriesSlot)>,
    written: Vec<(u64, i64)>,
}

impl<'b> BatchContext<'b, '_, '_> {
    /// Refuses one event: counted, dead-lettered (unless `dead_letter` is false), and each
    /// sample it would have written noted for the refusal series.
    fn refuse(
        &mut self,
        event: &Event,
        refusal: Refusal,
        dead_letter: bool,
    ) -> Result<(), StoreError> {
        let Refusal {
            reason,
            ts_ms,
            series,
            detail,
        } = refusal;
        self.stats.events_refused[reason_index(reason)] += 1;
        tracing::warn!(
            machine = %self.batch.machine_id,
            seq = event.seq,
            reason,
            %detail,
            "Counter event refused; counted as refused samples."
        );
        if dead_letter {
            let payload = event.encode_to_vec();
            self.stats.dead_letters_dropped += self.writer.dead_letter(&DeadLetter {
                arrival_ns: self.arrival_ns,
                source: DeadLetterSource::Event,
                reason: format!("{reason}: {detail}"),
                topic: self.topic.to_owned(),
                payload_len: payload.len() as u64,
                payload,
            })?;
        }
        self.refused
            .extend(series.into_iter().map(|key| (key, reason, ts_ms)));
        Ok(())
    }

    /// Admits one counter event's samples, or refuses the event whole (a run that decreases,
    /// the series budget, a conflict).
    fn admit(
        &mut self,
        event: &Event,
        samples: &EventSamples<'b>,
        memo: &mut KeyMemo,
    ) -> Result<(), StoreError> {
        let EventSamples {
            ref values,
            baseline,
            run_start_ms,
            model,
            slots,
            ..
        } = *samples;
        let Some(ts_ms) = values.first().map(|v| v.ts_ms) else {
            return Ok(());
        };
        let machine = self.batch.machine_id.as_str();
        self.state.newest_event_ms = self.state.newest_event_ms.max(ts_ms);
        let keys = || values.iter().map(|v| v.series.clone()).collect::<Vec<_>>();
        let refusal = |reason, detail| Refusal {
            reason,
            ts_ms,
            series: keys(),
            detail,
        };
        // A refused event leaves the buffers to be allocated again: a rare path.
        let Scratch {
            mut lives,
            mut known,
            mut ids,
            mut written,
        } = std::mem::take(&mut self.scratch);
        lives.clear();
        known.clear();
        ids.clear();
        written.clear();
        let live_machine = self.live_machine;
        for (i, v) in values.iter().enumerate() {
            // The id and the writer's slot the memo holds for the value's key, found once per
            // batch and key: no lookup per value.
            let slot = slots.get(i);
            let found = match slot.and_then(|slot| memo.series_slot(slot)) {
                Some(found) => Some(found),
                None => match self.writer.series_id(&v.series)? {
                    Some(id) => {
                        let handle = self.writer.series_slot(live_machine, id)?;
                        if let Some(slot) = slot {
                            memo.set_series_slot(slot, id, handle);
                        }
                        Some((id, handle))
                    }
                    None => None,
                },
            };
            lives.push(found.and_then(|(_, handle)| self.writer.live_at(handle)));
            known.push(found);
        }

        // Within one run (one start time) a counter never goes down.
        if let Some(start) = run_start_ms {
            for (v, live) in values.iter().zip(&lives) {
                let Some(live) = live.filter(|live| live.run_start_ms == start) else {
                    continue;
                };
                let decreased = (v.ts_ms > live.run_last_ms && v.value < live.run_last_value)
                    || (v.ts_ms < live.run_last_ms && v.value > live.run_last_value);
                if decreased {
                    let detail = format!(
                        "{} {} at {} ms, {} at {} ms in the same run",
                        SeriesKey::metric(&v.series),
                        v.value,
                        v.ts_ms,
                        live.run_last_value,
                        live.run_last_ms
                    );
                    return self.refuse(event, refusal(refusal::COUNTER_DECREASED, detail), true);
                }
            }
        }

        // The series budget: the event's new series all fit, after retiring stale ones, or the
        // event is refused.
        let mut new_series: Vec<&str> = Vec::new();
        for (v, live) in values.iter().zip(&lives) {
            if live.is_none() && !new_series.contains(&v.series.as_str()) {
                new_series.push(&v.series);
            }
        }
        if !new_series.is_empty() {
            let needed = new_series.len() as u64;
            let budget = u64::from(self.config.max_series_per_machine);
            let mut live = self.writer.live_count(machine)?;
            if live + needed > budget {
                let cutoff = self
                    .state
                    .newest_event_ms
                    .saturating_sub(ms(self.config.series_retire_after));
                self.stats.series_retired += self.writer.retire_before(machine, cutoff)?;
                live = self.writer.live_count(machine)?;
            }
            if live + needed > budget {
                let detail =
                    format!("{needed} new series for a machine with {live} of {budget} live");
                return self.refuse(event, refusal(refusal::SERIES_BUDGET, detail), false);
            }
        }

        // The values; another value at one of the event's (series, time) refuses the event and
        // takes back what it wrote (the stored history stays as it was).
        for (i, (v, found)) in values.iter().zip(&known).enumerate() {
            let (id, handle) = match *found {
                Some(found) => found,
                None => {
                    let id = self.writer.series_id_or_create(&v.series)?;
                    let handle = self.writer.series_slot(live_machine, id)?;
                    if let Some(slot) = slots.get(i) {
                        memo.set_series_slot(slot, id, handle);
                    }
                    (id, handle)
                }
            };
            match self.writer.put_sample_at(handle, v.ts_ms, v.value)? {
                Upsert::New => written.push((id, v.ts_ms)),
                Upsert::Identical => {}
                Upsert::Conflict => {
                    let stored = self.writer.sample(id, v.ts_ms)?.unwrap_or(f64::NAN);
                    let detail = format!(
                        "{} holds {stored} at this time, not {}",
                        SeriesKey::metric(&v.series),
                        v.value
                    );
                    for &(id, ts) in &written {
                        self.writer.remove_sample(id, ts)?;
                    }
                    return self.refuse(event, refusal(refusal::CONFLICT, detail), true);
                }
            }
            ids.push((id, handle));
        }
        for ((v, &(id, handle)), live) in values.iter().zip(&ids).zip(&lives) {
            if written.contains(&(id, v.ts_ms)) {
                self.stats.samples_new += 1;
                if self.remote {
                    self.stored.push(v.clone());
                }
            } else {
                self.stats.samples_identical += 1;
            }
            let mut next = live.unwrap_or(LiveSeries::new(v.ts_ms));
            next.last_ms = next.last_ms.max(v.ts_ms);
            if let Some(start) = run_start_ms {
                let newer_run = start > next.run_start_ms;
                let later_in_run = start == next.run_start_ms && v.ts_ms >= next.run_last_ms;
                if newer_run || later_in_run {
                    next.run_start_ms = start;
                    next.run_last_ms = v.ts_ms;
                    next.run_last_value = v.value;
                }
            }
            self.writer.set_live_at(handle, next)?;
        }
        if let Some(model) = model {
            match self
                .model_versions
                .iter_mut()
                .rev()
                .find(|(m, _)| *m == model)
            {
                Some((_, span)) => *span = (span.0.min(ts_ms), span.1.max(ts_ms)),
                None => self.model_versions.push((model, (ts_ms, ts_ms))),
            }
        }
        // A baseline goes where nothing else of its series is, between it and its value: there
        // it can only say what the run's own samples agree with. Anything there (another run's
        // sample stamped after this run's start) leaves the value to the reset rule. A later
        // event of a run already seen found the same there, for less: nothing to read.
        let Some(b) = baseline else {
            self.scratch = Scratch {
                lives,
                known,
                ids,
                written,
            };
            return Ok(());
        };
        for ((v, &(id, _)), live) in values.iter().zip(&ids).zip(&lives) {
            let seen = live.is_some_and(|live| {
                Some(live.run_start_ms) == run_start_ms && v.ts_ms >= live.run_last_ms
            });
            if seen {
                continue;
            }
            match self.writer.first_sample_in(id, b.ts_ms, v.ts_ms)? {
                None => {
                    self.writer.put_sample(id, b.ts_ms, b.value)?;
                    self.stats.samples_new += 1;
                    self.stats.baselines_new += 1;
                    if self.remote {
                        self.stored.push(Sample {
                            series: v.series.clone(),
                            ts_ms: b.ts_ms,
                            value: b.value,
                        });
                    }
                }
                Some((t, x)) if t == b.ts_ms && x == b.value => self.stats.samples_identical += 1,
                Some(_) => self.stats.baselines_skipped += 1,
            }
        }
        self.scratch = Scratch {
            lives,
            known,
            ids,
            written,
        };
        Ok(())
    }

    /// Writes the refusal series of what this batch refused: per (refusal series, time), a pair
    /// `(t − 1, 0), (t, n)` at the first two free milliseconds from the refused samples' time.
    fn write_refusals(&mut self, base: &BaseLabels<'_>) -> Result<(), StoreError> {
        let mut counts: BTreeMap<(String, i64), u64> = BTreeMap::new();
        // Refusal series this batch creates with their full labels, within the bound.
        let mut planned: BTreeSet<String> = BTreeSet::new();
        for (key, reason, ts_ms) in std::mem::take(&mut self.refused) {
            self.stats.samples_refused[reason_index(reason)] += 1;
            let Some((refused_metric, labels)) = SeriesKey::parse(&key) else {
                continue;
            };
            let mut pairs: Vec<(&str, &str)> = labels
                .iter()
                .map(|(n, v)| (n.as_str(), v.as_str()))
                .collect();
            pairs.push((label::REASON, reason));
            pairs.push((label::SERIES, &refused_metric));
            let full = SeriesKey::build(metric::REFUSED_SAMPLES, &mut pairs);
            let known = planned.contains(&full) || self.writer.series_id(&full)?.is_some();
            let room =
                self.state.refusal_series + (planned.len() as u64) < MAX_REFUSAL_SERIES_PER_MACHINE;
            let refusal_key = if known {
                full
            } else if room {
                planned.insert(full.clone());
                full
            } else {
                base.key(
                    metric::REFUSED_SAMPLES,
                    &[
                        (label::MODEL, value::UNKNOWN),
                        (label::MODEL_VERSION, value::UNKNOWN),
                        (label::REASON, reason),
                        (label::SERIES, &refused_metric),
                    ],
                )
            };
            *counts.entry((refusal_key, ts_ms)).or_insert(0) += 1;
        }
        for ((key, ts_ms), n) in counts {
            let id = match self.writer.series_id(&key)? {
                Some(id) => id,
                None => {
                    self.state.refusal_series += 1;
                    self.writer.series_id_or_create(&key)?
                }
            };
            let mut placed = false;
            for t in ts_ms..ts_ms.saturating_add(REFUSAL_SLOT_SEARCH_MS) {
                if self.writer.sample(id, t - 1)?.is_none() && self.writer.sample(id, t)?.is_none()
                {
                    for (at, value) in [(t - 1, 0.0), (t, n as f64)] {
                        self.writer.put_sample(id, at, value)?;
                        self.stats.samples_new += 1;
                        self.stored.push(Sample {
                            series: key.clone(),
                            ts_ms: at,
                            value,
                        });
                    }
                    placed = true;
                    break;
                }
            }
            if !placed {
                self.stats.refusals_unplaced += n;
                tracing::warn!(series = %key, ts_ms, n, "No free millisecond for a refusal; not counted in its series.");
            }
        }
        Ok(())
    }
}

fn ms(duration: std::time::Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

#[allow(clippy::too_many_arguments)]
fn ingest_batch(
    writer: &mut Writer<'_>,
    config: &IngestConfig,
    batch: &Batch,
    topic: &str,
    arrival_ns: i64,
    stats: &mut IngestStats,
    remote: &mut Vec<(String, Vec<Sample>)>,
    keys: &mut KeyMemo,
) -> Result<Outcome, StoreError> {
    // The ids the memo holds may be of series a transaction that did not commit created.
    keys.forget_ids();
    let key = stream_key(&batch.machine_id, batch.tier, batch.agent_epoch);
    let (mut ranges, _) = writer.dedup_get(&key)?.unwrap_or_default();
    let mut state = writer.machine_get(&batch.machine_id)?;
    note_arrival(&mut state, config, arrival_ns, stats);
    if ranges.contains_all(batch.first_seq, batch.last_seq) {
        // A redelivery changes nothing, not even the machine's last arrival.
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
    // A machine class that is not a label value refuses every counter event of the batch; the
    // lenient labels (class `unknown`) name what they would have written, and the machine's
    // fleet series, so it is still listed.
    let strict = BaseLabels::of(batch);
    let base = strict.unwrap_or_else(|| BaseLabels::lenient(batch));
    let is_safety = batch.tier == Tier::Safety as i32;
    keys.begin_batch(&base);
    let mut new_events = 0u64;
    let mut duplicate_events = 0u64;
    let live_machine = writer.live_machine_of(&batch.machine_id);
    let mut cx = BatchContext {
        writer,
        config,
        batch,
        topic,
        arrival_ns,
        state,
        live_machine,
        stats,
        refused: Vec::new(),
        stored: Vec::new(),
        remote: config.remote_write_max_age.is_some(),
        newest_event_ms: None,
        model_versions: Vec::new(),
        scratch: Scratch::default(),
    };
    for event in &batch.events {
        if ranges.contains(event.seq) {
            duplicate_events += 1;
            continue;
        }
        new_events += 1;
        // The machine's last event time counts every event it sent with a sane time.
        if series::event_time_ok(
            event.event_time_unix_ns,
            arrival_ns,
            ns(config.max_future_skew),
        )
        .is_ok()
        {
            let ms = series::ns_to_ms(event.event_time_unix_ns);
            cx.newest_event_ms = Some(cx.newest_event_ms.map_or(ms, |n| n.max(ms)));
        }
        let normalized = series::normalize_event_with(
            keys,
            &base,
            event,
            arrival_ns,
            ns(config.max_future_skew),
        );
        match normalized {
            Normalized::NotCounter => {}
            Normalized::Refused(refusal) => cx.refuse(event, refusal, true)?,
            Normalized::Counted(samples) if strict.is_none() => {
                let mut series: Vec<String> =
                    samples.values.iter().map(|v| v.series.clone()).collect();
                series.extend(samples.refused_entries);
                let refusal = Refusal {
                    reason: refusal::BAD_LABEL,
                    ts_ms: series::ns_to_ms(event.event_time_unix_ns),
                    series,
                    detail: "the batch's machine class is not an id".to_owned(),
                };
                cx.refuse(event, refusal, true)?;
            }
            Normalized::Counted(mut samples) => {
                let ts_ms = series::ns_to_ms(event.event_time_unix_ns);
                for key in std::mem::take(&mut samples.refused_entries) {
                    cx.refused.push((key, refusal::BAD_LABEL, ts_ms));
                }
                cx.admit(event, &samples, keys)?;
                keys.recycle(samples.values, &samples.slots);
            }
        }
        if is_safety {
            cx.state.safety_received += 1;
            cx.stats.safety_received += 1;
            if series::is_fresh(
                arrival_ns,
                event.event_time_unix_ns,
                cx.state.reconnect_ns,
                ns(config.freshness_limit),
            ) {
                cx.state.safety_fresh += 1;
                cx.stats.safety_fresh += 1;
            }
        }
    }
    if is_safety
        && new_events > 0
        && let Some(base) = &strict
    {
        let ts_ms = series::ns_to_ms(arrival_ns).max(cx.state.last_gateway_ts_ms + 1);
        let mut gateway = Vec::with_capacity(4);
        // The gateway's own counters start from zero just before their first sample, so a
        // machine's first safety batch counts.
        if cx.state.last_gateway_ts_ms == 0 {
            for name in [metric::SAFETY_EVENTS_RECEIVED, metric::SAFETY_EVENTS_FRESH] {
                gateway.push((base.key(name, &[]), ts_ms - 1, 0.0));
            }
        }
        cx.state.last_gateway_ts_ms = ts_ms;
        gateway.push((
            base.key(metric::SAFETY_EVENTS_RECEIVED, &[]),
            ts_ms,
            cx.state.safety_received as f64,
        ));
        gateway.push((
            base.key(metric::SAFETY_EVENTS_FRESH, &[]),
            ts_ms,
            cx.state.safety_fresh as f64,
        ));
        for (series, ts_ms, value) in gateway {
            let id = cx.writer.series_id_or_create(&series)?;
            match cx.writer.put_sample(id, ts_ms, value)? {
                Upsert::New => {
                    cx.stats.samples_new += 1;
                    cx.stored.push(Sample {
                        series,
                        ts_ms,
                        value,
                    });
                }
                Upsert::Identical => cx.stats.samples_identical += 1,
                Upsert::Conflict => {
                    cx.stats.samples_refused[reason_index(refusal::CONFLICT)] += 1;
                    tracing::warn!(machine = %batch.machine_id, %series, ts_ms, "A different value exists at this series and time; sample refused.");
                }
            }
        }
    }
    cx.write_refusals(&base)?;
    let BatchContext {
        writer,
        mut state,
        stats,
        mut stored,
        newest_event_ms,
        mut model_versions,
        ..
    } = cx;
    // Written in (model, version) order, as a sorted map would give them.
    model_versions.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let mut fleet = FleetWrite::new(&mut state, arrival_ns);
    fleet.batch(&base, newest_event_ms);
    for ((model, version), span) in &model_versions {
        fleet.model_version(writer, &base, (model, version), *span)?;
    }
    fleet.commit(writer, stats, &mut stored)?;
    queue_remote(config, &batch.machine_id, arrival_ns, stored, stats, remote);
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
    stats.batches_accepted += 1;
    stats.events_new += new_events;
    stats.events_duplicate += duplicate_events;
    Ok(Outcome::Accepted {
        new_events,
        duplicate_events,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

    use edgewatch_proto::framing::encode_batch;
    use edgewatch_proto::v1::{DeadlineCounters, Event, LoopRef, event};

    use super::*;

    const ARRIVAL: i64 = 1_800_000_000_000_000_000;

    /// One SLO batch of `machine`, events `first..first + 5`.
    fn message(machine: &str, first: u64) -> (String, Vec<u8>) {
        let events = (first..first + 5)
            .map(|seq| Event {
                seq,
                event_time_unix_ns: ARRIVAL - 3_600_000_000_000 + seq as i64 * 1_000_000_000,
                monotonic_ns: seq,
                kind: Some(event::Kind::DeadlineCounters(DeadlineCounters {
                    control_loop: Some(LoopRef {
                        loop_id: 1,
                        loop_name: "planner".into(),
                    }),
                    cycles: 100 * seq,
                    ..Default::default()
                })),
            })
            .collect();
        let batch = Batch {
            schema_version: 1,
            machine_id: machine.to_owned(),
            site_id: "pit-3".into(),
            agent_epoch: 1,
            tier: Tier::Slo as i32,
            first_seq: first,
            last_seq: first + 4,
            sent_time_unix_ns: ARRIVAL,
            events,
            machine_class: "haul-truck".into(),
            agent_version: String::new(),
        };
        (
            format!("edgewatch/v1/pit-3/{machine}/slo"),
            encode_batch(&batch).unwrap(),
        )
    }

    fn incoming(messages: &[(String, Vec<u8>)]) -> Vec<Incoming<'_>> {
        messages
            .iter()
            .map(|(topic, payload)| Incoming { topic, payload })
            .collect()
    }

    /// A transaction that fails in the middle of a group decoded ahead returns its error with
    /// nothing of the group stored, the decoding thread stopped; the next group goes through.
    #[test]
    fn a_failed_transaction_decoding_ahead_stores_nothing_and_the_next_group_commits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.redb");
        let mut ingestor =
            Ingestor::new(Store::open_path(&path).unwrap(), IngestConfig::default()).unwrap();
        ingestor
            .ingest(&incoming(&[message("truck-0", 1)]), ARRIVAL)
            .unwrap();
        ingestor.store().write(|w| w.corrupt_open_chunks()).unwrap();
        drop(ingestor);
        let mut ingestor =
            Ingestor::new(Store::open_path(&path).unwrap(), IngestConfig::default()).unwrap();
        ingestor.set_decoding(Decoding::Ahead { min_messages: 1 });
        // Forty batches of other machines, then one of truck-0, whose chunk is corrupt, then
        // more: the transaction fails five chunks in, with the decoding thread ahead of it.
        let mut group: Vec<(String, Vec<u8>)> = (0..40)
            .map(|m| message(&format!("truck-{}", m + 1), 1))
            .collect();
        group.push(message("truck-0", 6));
        group.extend((0..40).map(|m| message(&format!("truck-{}", m + 1), 6)));
        let error = ingestor.ingest(&incoming(&group), ARRIVAL).unwrap_err();
        assert!(matches!(error, StoreError::CorruptChunk { .. }), "{error}");
        let streams = ingestor.store().dedup_streams().unwrap();
        assert_eq!(
            streams
                .iter()
                .map(|s| s.machine.as_str())
                .collect::<Vec<_>>(),
            ["truck-0"],
            "nothing of the failed group is stored"
        );
        // The same group without truck-0 commits, decoded ahead again.
        group.remove(40);
        let report = ingestor.ingest(&incoming(&group), ARRIVAL).unwrap();
        assert_eq!(report.outcomes.len(), 80);
        assert_eq!(report.stats.events_new, 80 * 5);
        assert_eq!(ingestor.store().dedup_streams().unwrap().len(), 41);
    }
}
