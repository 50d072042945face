//! The drain: empties the queue over MQTT v5, safety first, deleting nothing before the broker's
//! acknowledgement. Three parts:
//!
//! ```text
//!            events (connected, pkid written, PUBACK + reason, lost + why, read, durable, time)
//!  link ──────────────────────────────► core (pure: decides everything) ──► actions
//!  (rumqttc, its own task)                                                     │
//!    ▲  Connect{at} / Abort / publish                                          │
//!    └──────────────── this shell: executes actions on the link, the queue ◄───┘
//!                       (read + encode, ack, rewind, requeue, dead-letter) and the status
//! ```
//!
//! - [`core`]: the state machine. Packet ids, windows, refusals, halving, dead letters, parking,
//!   pauses, backoff and the bandwidth cap are decided there, with time as an argument.
//! - [`link`]: the rumqttc shell; connects only when the core says so and never has a poll
//!   cancelled mid-connection.
//! - [`tracker`]: packet ids to publishes, one per connection, owned by the core.
//! - this module: [`Drain::run`], the task that feeds the core and executes its actions, and
//!   [`DrainStats`], what it reports to `status` and health.
//!
//! Invariants:
//! - A record leaves the queue only on a success PUBACK for a publish of it in the same epoch
//!   (`Queue::ack` ignores another epoch's), or as a counted, reported dead letter (a record
//!   refused again and again alone in its batch, or too large for any batch).
//! - Publishes are submitted only while the link is up, at most `inflight` at a time, none behind
//!   a trial (a tier or a size the broker has not taken on the connection: a broker that closes
//!   the connection on a refusal must not reset it under a later write, which would hide the
//!   refusal), and each payload fits the framing, the broker's maximum packet size and what
//!   refusals taught.
//! - After a refusal or a failed connection the next attempt waits (backoff, pause or parking),
//!   and the backoff grows with every failed connection: nothing the broker refuses becomes a hot
//!   retry loop or a reconnection storm.

pub mod core;
pub mod link;
pub mod tracker;

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use edgewatch_proto::framing::{BatchEncoder, EncodeError, MAX_COMPRESSED_BYTES};
use edgewatch_proto::tier::{self, PerTier, TIERS};
use edgewatch_proto::topic::{batch_topic, status_topic};
use edgewatch_proto::v1::{Batch, MachineStatus, Tier};
use prost::Message;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{LastWill, Packet, PubAckReason};
use rumqttc::v5::{Event, MqttOptions};
use rumqttc::{Outgoing, TlsConfiguration, Transport};
use serde::Serialize;
use tokio::sync::watch;

use self::core::{
    Action, BatchRef, ConnectInfo, DEAD_LETTER_AFTER, DeadLetterCause, DrainCore, Note,
    ReadOutcome, ReadRequest, Settings, reason,
};
use self::link::{Command, Link, LinkEvent};
use crate::clock::{self, unix_ms, unix_ns};
use crate::config::{Machine, Uplink as UplinkConfig};
use crate::spool::{DurableChanges, Spool};

/// Bytes an MQTT PUBLISH adds around topic and payload (fixed header, lengths, packet id,
/// properties), rounded up.
const PUBLISH_OVERHEAD: usize = 32;

/// How long a tier whose topic the broker refused stays parked before it is tried again.
pub const PARK_DURATION: Duration = Duration::from_secs(300);

/// How long a graceful shutdown waits for outstanding PUBACKs.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// How long a graceful shutdown waits for the offline status and the DISCONNECT to be written.
const DISCONNECT_GRACE: Duration = Duration::from_secs(2);

/// What the drain reports to `status` (its `uplink` section) and the agent's health events.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DrainStats {
    /// A CONNACK was received and the connection has not failed since.
    pub connected: bool,
    /// Wall-clock time of the last successful acknowledgement (ms since the Unix epoch).
    pub last_ack_unix_ms: Option<u64>,
    /// The wait before the current reconnection attempt, if backing off.
    pub backoff_ms: Option<u64>,
    /// Connections established.
    pub connects: u64,
    /// Connections lost or refused, and connection attempts that failed.
    pub disconnects: u64,
    /// Batches acknowledged, and the events they carried.
    pub batches_acked: u64,
    /// Events acknowledged.
    pub events_acked: u64,
    /// Event bytes (protobuf, before compression) acknowledged.
    pub payload_bytes_acked: u64,
    /// Event bytes acknowledged per tier (safety, slo, debug), before compression.
    pub event_bytes_acked_by_tier: [u64; 3],
    /// Payload bytes acknowledged per tier, as sent (compressed batches).
    pub wire_bytes_acked_by_tier: [u64; 3],
    /// Publishes the broker refused (PUBACK with an error reason, or a refusal that ended the
    /// connection).
    pub refused: u64,
    /// The last refusal, as text.
    pub last_refusal: Option<String>,
    /// Publishes the broker took with no subscriber (PUBACK 0x10), re-sent later.
    pub no_subscribers: u64,
    /// Tiers parked after a refusal, with the time they are retried (ms since the Unix epoch).
    pub parked_until_unix_ms: [Option<u64>; 3],
    /// Sending paused (no subscriber, quota, a record refused) until then (ms since the Unix
    /// epoch); the connection stays.
    pub paused_until_unix_ms: Option<u64>,
    /// Records dead-lettered per tier: refused again and again alone in a batch, or too large
    /// for any batch. Each is also a `QueueLoss` (cause `REFUSED`) in the queue.
    pub dead_lettered: [u64; 3],
    /// The last dead letter, as text.
    pub last_dead_letter: Option<String>,
}

/// The drain task's state: the shell around [`DrainCore`].
pub struct Drain {
    config: UplinkConfig,
    machine: Machine,
    spool: Spool,
    /// Wakes the drain when records became durable.
    wake: DurableChanges,
    stats: Rc<RefCell<DrainStats>>,
    topics: [String; 3],
    status_topic: String,
    header: Batch,
    encoder: BatchEncoder,
    /// The payload of the batch read last, published by the `Publish` action that follows.
    payload: Vec<u8>,
    epoch: u64,
}

/// Why the drain could not start.
#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    /// The TLS files could not be read.
    #[error("reading {path}: {source}")]
    Tls {
        /// The file.
        path: std::path::PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The batch encoder could not be created.
    #[error("creating the batch encoder: {0}")]
    Encoder(#[from] EncodeError),
    /// An id does not form a valid topic.
    #[error("machine or site id does not form a valid topic")]
    Topic,
}

/// What the run loop does after an action.
#[derive(PartialEq, Eq)]
enum Flow {
    Continue,
    Finished,
}

impl Drain {
    /// A drain emptying `spool`'s queue under `machine`'s identity.
    pub fn new(
        config: UplinkConfig,
        machine: Machine,
        agent_epoch: u64,
        spool: Spool,
        stats: Rc<RefCell<DrainStats>>,
    ) -> Result<Self, DrainError> {
        let topic = |tier| batch_topic(&machine.site, &machine.id, tier).ok_or(DrainError::Topic);
        let [safety, slo, debug] = TIERS.map(topic);
        let mut topics = [safety?, slo?, debug?];
        for (slot, name) in topics.iter_mut().zip(tier::NAMES) {
            if let Some(custom) = config.topic_overrides.get(name) {
                custom.clone_into(slot);
            }
        }
        let status_topic = config
            .topic_overrides
            .get("status")
            .cloned()
            .unwrap_or_else(|| status_topic(&machine.site, &machine.id));
        let header = Batch {
            schema_version: edgewatch_proto::SCHEMA_VERSION,
            machine_id: machine.id.clone(),
            site_id: machine.site.clone(),
            agent_epoch,
            tier: Tier::Unspecified as i32,
            first_seq: 0,
            last_seq: 0,
            sent_time_unix_ns: 0,
            events: Vec::new(),
            machine_class: machine.class.clone(),
            agent_version: env!("CARGO_PKG_VERSION").to_owned(),
        };
        Ok(Self {
            encoder: BatchEncoder::new(config.compression_level)?,
            config,
            machine,
            wake: spool.durable_changes(),
            spool,
            stats,
            topics,
            status_topic,
            header,
            payload: Vec::new(),
            epoch: agent_epoch,
        })
    }

    fn settings(&self) -> Settings {
        Settings {
            inflight: self.config.inflight,
            max_batch_bytes: self.config.max_batch_bytes,
            max_batch_events: self.config.max_batch_events,
            framing_limit: MAX_COMPRESSED_BYTES,
            backoff_min: self.config.backoff_min,
            backoff_max: self.config.backoff_max,
            initial_delay_max: self.config.initial_delay_max,
            park: PARK_DURATION,
            shutdown_grace: SHUTDOWN_GRACE,
            retry_when_no_subscribers: self.config.retry_when_no_subscribers,
            bandwidth_bytes_per_s: self.config.bandwidth_bytes_per_s,
            dead_letter_after: DEAD_LETTER_AFTER,
            seed: rand::random(),
        }
    }

    fn machine_status(&self, online: bool) -> Vec<u8> {
        MachineStatus {
            schema_version: edgewatch_proto::SCHEMA_VERSION,
            machine_id: self.machine.id.clone(),
            site_id: self.machine.site.clone(),
            online,
            time_unix_ns: unix_ns(clock::wall()),
            agent_epoch: self.header.agent_epoch,
            agent_version: self.header.agent_version.clone(),
            machine_class: self.machine.class.clone(),
        }
        .encode_to_vec()
    }

    fn options(&self) -> Result<MqttOptions, DrainError> {
        let mut options =
            MqttOptions::new(&self.config.client_id, &self.config.host, self.config.port);
        options.set_keep_alive(self.config.keepalive);
        options.set_clean_start(true);
        let max_packet = u32::try_from(MAX_COMPRESSED_BYTES + 64 * 1024).unwrap_or(u32::MAX);
        options.set_max_packet_size(Some(max_packet));
        options.set_outgoing_inflight_upper_limit(self.config.inflight);
        options.set_connection_timeout(self.config.keepalive.as_secs().clamp(5, 30));
        options.set_last_will(LastWill::new(
            &self.status_topic,
            self.machine_status(false),
            QoS::AtLeastOnce,
            true,
            None,
        ));
        if let Some(tls) = &self.config.tls {
            let read = |path: &std::path::PathBuf| {
                std::fs::read(path).map_err(|source| DrainError::Tls {
                    path: path.clone(),
                    source,
                })
            };
            let _ = rustls::crypto::ring::default_provider().install_default();
            options.set_transport(Transport::Tls(TlsConfiguration::Simple {
                ca: read(&tls.ca)?,
                alpn: None,
                client_auth: Some((read(&tls.cert)?, read(&tls.key)?)),
            }));
        }
        Ok(options)
    }

    /// Runs until `shutdown` turns true, then waits briefly for outstanding acknowledgements,
    /// announces the agent offline and disconnects.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) -> Result<(), DrainError> {
        let options = self.options()?;
        // Channel capacity above the window: try_publish never fails for lack of room.
        let mut link = Link::start(options, usize::from(self.config.inflight) + 4);
        let mut core = DrainCore::new(self.settings(), self.epoch, clock::instant());
        let mut stopping = false;
        loop {
            let epoch = self.spool.queue().epoch();
            if epoch != self.epoch {
                self.epoch = epoch;
                core.on_epoch(epoch);
            }
            while let Some(event) = link.try_next() {
                self.feed(&mut core, event);
            }
            let now = clock::instant();
            while let Some(action) = core.poll_action(now) {
                if self.execute(&mut core, &link, action, now) == Flow::Finished {
                    self.finish(link, &mut core).await;
                    return Ok(());
                }
            }
            let timeout = core.poll_timeout();
            tokio::select! {
                biased;
                _ = shutdown.changed(), if !stopping => {
                    stopping = true;
                    core.shutdown(clock::instant());
                }
                event = link.next() => match event {
                    Some(event) => self.feed(&mut core, event),
                    None => return Ok(()),
                },
                () = self.wake.changed() => core.on_durable(),
                () = async {
                    match timeout {
                        Some(at) => tokio::time::sleep_until(at.into()).await,
                        None => std::future::pending().await,
                    }
                } => core.handle_timeout(clock::instant()),
            }
        }
    }

    /// Hands one link event to the core.
    fn feed(&mut self, core: &mut DrainCore, event: LinkEvent) {
        let now = clock::instant();
        match event {
            LinkEvent::Mqtt(Event::Incoming(Packet::ConnAck(connack))) => {
                let properties = connack.properties.as_ref();
                let longest_topic = self.topics.iter().map(String::len).max().unwrap_or(0);
                let max_payload = properties
                    .and_then(|p| p.max_packet_size)
                    .map(|max| (max as usize).saturating_sub(longest_topic + PUBLISH_OVERHEAD));
                core.on_connected(
                    now,
                    ConnectInfo {
                        receive_maximum: properties.and_then(|p| p.receive_max),
                        max_payload,
                    },
                );
            }
            LinkEvent::Mqtt(Event::Outgoing(Outgoing::Publish(pkid))) if pkid != 0 => {
                core.on_written(pkid);
            }
            LinkEvent::Mqtt(Event::Outgoing(Outgoing::AwaitAck(pkid))) => core.on_await_ack(pkid),
            LinkEvent::Mqtt(Event::Incoming(Packet::PubAck(ack))) => {
                core.on_puback(now, ack.pkid, reason_code(&ack.reason));
            }
            LinkEvent::Mqtt(_) => {}
            LinkEvent::Lost(lost, text) => {
                if core.is_connected() {
                    tracing::warn!(reason = %text, "The connection to the broker was lost.");
                } else {
                    tracing::debug!(reason = %text, "Connecting to the broker failed.");
                }
                core.on_connection_lost(now, lost);
            }
        }
    }

    /// Carries out one action of the core.
    fn execute(&mut self, core: &mut DrainCore, link: &Link, action: Action, now: Instant) -> Flow {
        match action {
            Action::Connect { at } => link.command(Command::Connect(at)),
            Action::Abort => link.command(Command::Abort),
            Action::PublishStatus => {
                let online = self.machine_status(true);
                if link.is_up()
                    && link
                        .client()
                        .try_publish(self.status_topic.as_str(), QoS::AtLeastOnce, true, online)
                        .is_err()
                {
                    link.command(Command::Abort);
                }
            }
            Action::Read(request) => {
                let outcome = self.read(&request);
                core.on_read(now, outcome);
            }
            Action::Publish(batch) => {
                let topic = &self.topics[tier::index(batch.tier).unwrap_or(tier::DEBUG)];
                if link.is_up()
                    && let Err(error) = link.client().try_publish(
                        topic.as_str(),
                        QoS::AtLeastOnce,
                        false,
                        self.payload.clone(),
                    )
                {
                    // Only a full or closed channel fails here; the connection is dropped and
                    // everything goes back to the queue.
                    tracing::warn!(%error, "A publish could not be queued; reconnecting.");
                    link.command(Command::Abort);
                }
            }
            Action::Delete(batch) => {
                let taken = self.spool.queue_mut().ack(
                    batch.tier,
                    batch.epoch,
                    batch.first..=batch.last,
                    clock::wall(),
                );
                if !taken {
                    tracing::info!(tier = ?batch.tier, first = batch.first, last = batch.last, epoch = batch.epoch,
                        "An acknowledgement of another queue epoch deleted nothing.");
                }
            }
            Action::Rewind { tier, epoch, from } => {
                self.spool.queue_mut().rewind(tier, epoch, from);
            }
            Action::RequeueAll => self.spool.queue_mut().requeue_unacked(),
            Action::DeadLetter {
                tier,
                epoch,
                seq,
                cause: _,
            } => {
                self.spool
                    .queue_mut()
                    .dead_letter(tier, epoch, seq, clock::wall());
            }
            Action::Note(note) => self.note(note, now),
            Action::Finished => return Flow::Finished,
        }
        Flow::Continue
    }

    /// Reads the next batch the request allows, in tier order, and encodes it into
    /// `self.payload`.
    fn read(&mut self, request: &ReadRequest) -> ReadOutcome {
        let mut queue = self.spool.queue_mut();
        for (ix, tier) in TIERS.into_iter().enumerate() {
            let Some(limits) = *request.limits.at(ix) else {
                continue;
            };
            let only = PerTier {
                safety: ix != tier::SAFETY,
                slo: ix != tier::SLO,
                debug: ix != tier::DEBUG,
            };
            let batch = match queue.next_batch_skipping(limits, only) {
                Ok(Some(batch)) => batch,
                Ok(None) => continue,
                Err(error) => {
                    tracing::warn!(%error, "The queue could not be read; the uplink waits for the next wake-up.");
                    return ReadOutcome::Failed;
                }
            };
            self.header.tier = tier as i32;
            self.header.first_seq = batch.first_seq();
            self.header.last_seq = batch.last_seq();
            self.header.agent_epoch = batch.epoch();
            self.header.sent_time_unix_ns = unix_ns(clock::wall());
            let events = batch.len() as u64;
            let limit = if events == 1 {
                request.single_limit
            } else {
                request.wire_limit
            };
            let result = self.encoder.encode_spliced(
                &self.header,
                batch.records().map(|(_, event)| event),
                limit,
                &mut self.payload,
            );
            return match result {
                Ok(()) => ReadOutcome::Encoded {
                    batch: BatchRef {
                        tier,
                        epoch: batch.epoch(),
                        first: batch.first_seq(),
                        last: batch.last_seq(),
                        events,
                        event_bytes: batch.event_bytes() as u64,
                        wire_bytes: self.payload.len() as u64,
                    },
                    packet_bytes: (self.payload.len() + self.topics[ix].len() + PUBLISH_OVERHEAD)
                        as u64,
                },
                Err(error) => {
                    tracing::debug!(%error, ?tier, first = batch.first_seq(), events, limit,
                        "A batch did not fit once encoded; it is split.");
                    ReadOutcome::TooLarge {
                        tier,
                        epoch: batch.epoch(),
                        first: batch.first_seq(),
                        events,
                    }
                }
            };
        }
        ReadOutcome::Empty
    }

    /// Keeps the status file's `uplink` section and the log up to date.
    fn note(&self, note: Note, now: Instant) {
        let wall_of = |at: Instant| unix_ms(clock::wall() + at.saturating_duration_since(now));
        let mut stats = self.stats.borrow_mut();
        match note {
            Note::Connected => {
                stats.connected = true;
                stats.connects += 1;
                stats.backoff_ms = None;
                tracing::info!(broker = %self.config.host, port = self.config.port, "Connected to the broker.");
            }
            Note::ConnectionLost {
                lost,
                was_connected,
                retry_in,
            } => {
                stats.connected = false;
                stats.disconnects += 1;
                stats.backoff_ms = Some(u64::try_from(retry_in.as_millis()).unwrap_or(u64::MAX));
                stats.paused_until_unix_ms = None;
                tracing::info!(
                    ?lost,
                    was_connected,
                    retry_in_ms = retry_in.as_millis() as u64,
                    "Reconnecting after the backoff."
                );
            }
            Note::Acked(batch) => {
                let slot = tier::index(batch.tier).unwrap_or(tier::DEBUG);
                stats.last_ack_unix_ms = Some(unix_ms(clock::wall()));
                stats.batches_acked += 1;
                stats.events_acked += batch.events;
                stats.payload_bytes_acked += batch.event_bytes;
                stats.event_bytes_acked_by_tier[slot] += batch.event_bytes;
                stats.wire_bytes_acked_by_tier[slot] += batch.wire_bytes;
            }
            Note::NoSubscribers { batch, pause } => {
                stats.no_subscribers += 1;
                if let Some(pause) = pause {
                    tracing::warn!(tier = ?batch.tier, first = batch.first, last = batch.last,
                        pause_ms = pause.as_millis() as u64,
                        "The broker has no subscriber for our batches; pausing, then one record at a time.");
                }
            }
            Note::Refused { batch, code } => {
                stats.refused += 1;
                let text = reason_text(code);
                let slot = tier::index(batch.tier).unwrap_or(tier::DEBUG);
                tracing::error!(reason = %text, tier = ?batch.tier, first = batch.first, last = batch.last,
                    topic = %self.topics[slot], "The broker refused a publish; nothing is deleted.");
                stats.last_refusal = Some(text);
            }
            Note::Parked { tier, until } => {
                let slot = tier::index(tier).unwrap_or(tier::DEBUG);
                stats.parked_until_unix_ms[slot] = Some(wall_of(until));
                tracing::warn!(
                    ?tier,
                    park_s = PARK_DURATION.as_secs(),
                    "The tier is parked."
                );
            }
            Note::Unparked { tier } => {
                stats.parked_until_unix_ms[tier::index(tier).unwrap_or(tier::DEBUG)] = None;
            }
            Note::Paused { until } => {
                stats.paused_until_unix_ms = Some(wall_of(until));
            }
            Note::Shrunk {
                tier,
                max_records,
                wire_limit,
            } => {
                tracing::info!(
                    ?tier,
                    max_records,
                    wire_limit,
                    "Batches shrunk to what the broker and the framing take."
                );
            }
            Note::DeadLettered { tier, seq, cause } => {
                let slot = tier::index(tier).unwrap_or(tier::DEBUG);
                stats.dead_lettered[slot] += 1;
                let text = match cause {
                    DeadLetterCause::Refused { code, times } => {
                        format!(
                            "{} seq {seq}: refused {times} times ({})",
                            tier::NAMES[slot],
                            reason_text(code)
                        )
                    }
                    DeadLetterCause::TooLargeToSend => {
                        format!("{} seq {seq}: too large for any batch", tier::NAMES[slot])
                    }
                };
                tracing::error!(dead_letter = %text, "A record was dead-lettered: deleted, counted and reported as a refused loss.");
                stats.last_dead_letter = Some(text);
            }
            Note::Bookkeeping(error) => {
                tracing::error!(%error, "rumqttc reported a packet id matching no publish; reconnecting.");
            }
            Note::QuiesceTimedOut => {
                tracing::warn!("Publishes in flight went unacknowledged; reconnecting.");
            }
        }
    }

    /// Announces the agent offline, disconnects, and puts back what was not acknowledged.
    async fn finish(&mut self, mut link: Link, core: &mut DrainCore) {
        if link.is_up() {
            let offline = self.machine_status(false);
            let client = link.client().clone();
            let _ = client.try_publish(self.status_topic.as_str(), QoS::AtLeastOnce, true, offline);
            let _ = client.try_disconnect();
            // Let the link write the status and the DISCONNECT; late PUBACKs still delete.
            let deadline = tokio::time::Instant::now() + DISCONNECT_GRACE;
            loop {
                let event = tokio::select! {
                    event = link.next() => event,
                    () = tokio::time::sleep_until(deadline) => None,
                };
                match event {
                    Some(LinkEvent::Mqtt(Event::Outgoing(Outgoing::Disconnect)))
                    | Some(LinkEvent::Lost(..))
                    | None => break,
                    Some(LinkEvent::Mqtt(Event::Incoming(Packet::PubAck(ack)))) => {
                        let now = clock::instant();
                        core.on_puback(now, ack.pkid, reason_code(&ack.reason));
                        while let Some(action) = core.poll_action(now) {
                            if matches!(action, Action::Delete(_) | Action::Note(_)) {
                                self.execute(core, &link, action, now);
                            }
                        }
                    }
                    Some(_) => {}
                }
            }
        }
        link.stop();
        self.spool.queue_mut().requeue_unacked();
        self.stats.borrow_mut().connected = false;
    }
}

/// The MQTT v5 reason code of a PUBACK rumqttc decoded.
fn reason_code(reason: &PubAckReason) -> u8 {
    match reason {
        PubAckReason::Success => reason::SUCCESS,
        PubAckReason::NoMatchingSubscribers => reason::NO_MATCHING_SUBSCRIBERS,
        PubAckReason::UnspecifiedError => reason::UNSPECIFIED_ERROR,
        PubAckReason::ImplementationSpecificError => reason::IMPLEMENTATION_SPECIFIC_ERROR,
        PubAckReason::NotAuthorized => reason::NOT_AUTHORIZED,
        PubAckReason::TopicNameInvalid => reason::TOPIC_NAME_INVALID,
        PubAckReason::PacketIdentifierInUse => reason::PACKET_IDENTIFIER_IN_USE,
        PubAckReason::QuotaExceeded => reason::QUOTA_EXCEEDED,
        PubAckReason::PayloadFormatInvalid => reason::PAYLOAD_FORMAT_INVALID,
    }
}

/// A reason code as text, for the status file and the log.
fn reason_text(code: u8) -> String {
    let name = match code {
        reason::SUCCESS => "Success",
        reason::NO_MATCHING_SUBSCRIBERS => "NoMatchingSubscribers",
        reason::UNSPECIFIED_ERROR => "UnspecifiedError",
        reason::IMPLEMENTATION_SPECIFIC_ERROR => "ImplementationSpecificError",
        reason::NOT_AUTHORIZED => "NotAuthorized",
        reason::TOPIC_NAME_INVALID => "TopicNameInvalid",
        reason::PACKET_IDENTIFIER_IN_USE => "PacketIdentifierInUse",
        reason::PACKET_TOO_LARGE => "PacketTooLarge",
        reason::QUOTA_EXCEEDED => "QuotaExceeded",
        reason::PAYLOAD_FORMAT_INVALID => "PayloadFormatInvalid",
        _ => "Unknown",
    };
    format!("{name} (0x{code:02x})")
}
