//! The drain: empties the queue over MQTT v5, safety first, deleting nothing before the broker's
//! acknowledgement.
//!
//! The agent owns retransmission (rumqttc drops in-flight publishes on a clean-start reconnect):
//!
//! ```text
//! connected ─► fill window: queue.next_batch (strict tier order) ─► encode (protobuf+zstd)
//!     ▲          ─► bandwidth bucket ─► try_publish ─► tracker.submit
//!     │        PUBACK(pkid) Success ─► queue.ack(tier, first..=last)      (the only deletion point)
//!     │        PUBACK 0x10 no subscribers ─► disconnect, everything back to the queue, back off
//!     │        PUBACK refusal (0x87 ...) ─► park that tier, count, log; other tiers go on
//!     └─ error ─► tracker.drain (stale PUBACKs still matched) ─► queue.requeue_unacked ─► full-jitter backoff
//! ```
//!
//! Invariants:
//! - A record leaves the queue only on a PUBACK with a success reason for the publish that carried
//!   it; every other outcome puts it back.
//! - Publishes are submitted only while connected, at most `inflight` at a time, and each payload
//!   fits the broker's maximum packet size.
//! - After a refusal or a failed connection the next attempt waits (backoff or parking): nothing
//!   the broker refuses becomes a hot retry loop.

pub mod tracker;

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use edgewatch_conventions::backoff::{Backoff, Jitter};
use edgewatch_proto::framing::{BatchEncoder, EncodeError, MAX_COMPRESSED_BYTES};
use edgewatch_proto::tier::{self, TIERS};
use edgewatch_proto::topic::{batch_topic, status_topic};
use edgewatch_proto::v1::{Batch, MachineStatus, Tier};
use edgewatch_queue::BatchLimits;
use prost::Message;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{ConnectReturnCode, LastWill, Packet, PubAckReason};
use rumqttc::v5::{AsyncClient, ConnectionError, Event, EventLoop, MqttOptions};
use rumqttc::{Outgoing, TlsConfiguration, Transport};
use serde::Serialize;
use tokio::sync::watch;

use crate::clock::{self, unix_ms, unix_ns};
use crate::config::{Machine, Uplink as UplinkConfig};
use crate::pacing::token_bucket::TokenBucket;
use crate::spool::{DurableChanges, Spool};
use tracker::Tracker;

/// Bytes an MQTT PUBLISH adds around topic and payload (fixed header, lengths, packet id,
/// properties), rounded up.
const PUBLISH_OVERHEAD: usize = 32;

/// How long a refused tier stays parked before it is tried again.
pub const PARK_DURATION: Duration = Duration::from_secs(300);

/// How long a graceful shutdown waits for outstanding PUBACKs.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

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
    /// Connections lost or refused.
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
    /// Publishes the broker refused (PUBACK with an error reason).
    pub refused: u64,
    /// The last refusal, as text.
    pub last_refusal: Option<String>,
    /// Publishes the broker took with no subscriber (PUBACK 0x10), re-sent later.
    pub no_subscribers: u64,
    /// Tiers parked after a refusal, with the time they are retried (ms since the Unix epoch).
    pub parked_until_unix_ms: [Option<u64>; 3],
}

/// What one publish carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    Batch {
        tier: Tier,
        epoch: u64,
        first: u64,
        last: u64,
        events: u64,
        bytes: u64,
        wire_bytes: u64,
    },
    Status,
}

/// The drain task's state.
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
    payload: Vec<u8>,
    tracker: Tracker<Sent>,
    /// Items of a dead connection, still matched against PUBACKs rumqttc read before the failure
    /// and hands out after the next CONNACK.
    stale: Tracker<Sent>,
    backoff: Backoff,
    bucket: Option<TokenBucket>,
    parked_until: [Option<Instant>; 3],
    /// Raw bytes per batch: the configured limit, lowered to fit the broker's maximum packet.
    batch_bytes: usize,
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
        let bucket = config
            .bandwidth_bytes_per_s
            .map(|rate| TokenBucket::new(rate, rate.max(64 * 1024), clock::instant()));
        Ok(Self {
            encoder: BatchEncoder::new(config.compression_level)?,
            backoff: Backoff::new(config.backoff_min, config.backoff_max),
            batch_bytes: config.max_batch_bytes,
            config,
            machine,
            wake: spool.durable_changes(),
            spool,
            stats,
            topics,
            status_topic,
            header,
            payload: Vec::new(),
            tracker: Tracker::default(),
            stale: Tracker::default(),
            bucket,
            parked_until: [None; 3],
        })
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
        let (client, mut events) = AsyncClient::new(options, usize::from(self.config.inflight) + 4);

        // Machines that lose power together must not connect together.
        let initial = self.config.initial_delay_max.mul_f64(rand::random::<f64>());
        tokio::select! {
            () = tokio::time::sleep(initial) => {}
            _ = shutdown.changed() => return Ok(()),
        }

        let mut connected = false;
        let mut draining_since: Option<Instant> = None;
        let mut next_send_at: Option<Instant> = None;
        loop {
            if *shutdown.borrow() && draining_since.is_none() {
                draining_since = Some(clock::instant());
            }
            if let Some(since) = draining_since
                && (!connected || self.tracker.is_empty() || since.elapsed() >= SHUTDOWN_GRACE)
            {
                return self.shut_down(&client, &mut events, connected).await;
            }
            if connected && draining_since.is_none() {
                next_send_at = self.fill_window(&client);
            }
            let send_timer = async {
                match next_send_at {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            let window_open = connected
                && draining_since.is_none()
                && next_send_at.is_none()
                && self.tracker.len() < usize::from(self.config.inflight);
            let event = tokio::select! {
                biased;
                _ = shutdown.changed(), if draining_since.is_none() => continue,
                event = events.poll() => event,
                () = self.wake.changed(), if window_open => continue,
                () = send_timer => continue,
                () = tokio::time::sleep(SHUTDOWN_GRACE), if draining_since.is_some() => continue,
            };
            match event {
                Ok(event) => {
                    if let Some(reconnect) = self.on_event(&client, event, &mut connected) {
                        // The broker had nobody to deliver to: drop the connection and come back
                        // later rather than spin re-sending.
                        let _ = client.try_disconnect();
                        self.on_connection_lost(&mut connected, reconnect.as_str());
                        self.wait_backoff(&mut shutdown).await;
                    }
                }
                Err(error) => {
                    self.on_connection_lost(&mut connected, &error_text(&error));
                    self.wait_backoff(&mut shutdown).await;
                }
            }
        }
    }

    /// Submits batches while the window, the bandwidth cap and the queue allow. Returns when the
    /// bandwidth cap lets the next batch go, if it is holding one back.
    fn fill_window(&mut self, client: &AsyncClient) -> Option<Instant> {
        let now = clock::instant();
        for (slot, until) in self.parked_until.iter_mut().enumerate() {
            if until.is_some_and(|until| until <= now) {
                *until = None;
                self.stats.borrow_mut().parked_until_unix_ms[slot] = None;
            }
        }
        while self.tracker.len() < usize::from(self.config.inflight) {
            if let Some(bucket) = &mut self.bucket {
                // Reserve room for a full batch before taking one: a batch handed out and then
                // held back would leave the queue's cursor ahead of what was sent.
                let wait = bucket.wait_for(self.batch_bytes as u64 / 4, now);
                if !wait.is_zero() {
                    return Some(now + wait);
                }
            }
            let sent = self.encode_next()?;
            let Sent::Batch { tier, bytes, .. } = sent else {
                continue;
            };
            // The queue hands out no Tier::Unspecified batch; one would go out as debug.
            let topic = &self.topics[tier::index(tier).unwrap_or(tier::DEBUG)];
            if let Some(bucket) = &mut self.bucket {
                bucket.take(
                    (self.payload.len() + topic.len() + PUBLISH_OVERHEAD) as u64,
                    now,
                );
            }
            match client.try_publish(
                topic.as_str(),
                QoS::AtLeastOnce,
                false,
                self.payload.clone(),
            ) {
                Ok(()) => self.tracker.submit(sent),
                Err(error) => {
                    // Only a full or closed channel fails here; the batch goes back with the rest
                    // when the connection is reset.
                    tracing::warn!(%error, bytes, "A publish could not be queued; retrying after reconnect.");
                    self.tracker.submit(sent);
                    break;
                }
            }
        }
        None
    }

    /// Takes the next batch the queue offers (skipping parked tiers) and encodes it into
    /// `self.payload`.
    fn encode_next(&mut self) -> Option<Sent> {
        let now = clock::instant();
        let parked = self
            .parked_until
            .map(|until| until.is_some_and(|t| t > now));
        let mut queue = self.spool.queue_mut();
        let limits = BatchLimits {
            max_records: self.config.max_batch_events,
            max_bytes: self.batch_bytes,
        };
        let skip = edgewatch_queue::PerTier {
            safety: parked[0],
            slo: parked[1],
            debug: parked[2],
        };
        let batch = match queue.next_batch_skipping(limits, skip) {
            Ok(Some(batch)) => batch,
            Ok(None) => return None,
            Err(error) => {
                tracing::warn!(%error, "The queue could not be read; the uplink waits for the next wake-up.");
                return None;
            }
        };
        self.header.tier = batch.tier() as i32;
        self.header.first_seq = batch.first_seq();
        self.header.last_seq = batch.last_seq();
        self.header.agent_epoch = batch.epoch();
        self.header.sent_time_unix_ns = unix_ns(clock::wall());
        let sent = Sent::Batch {
            tier: batch.tier(),
            epoch: batch.epoch(),
            first: batch.first_seq(),
            last: batch.last_seq(),
            events: batch.len() as u64,
            bytes: batch.event_bytes() as u64,
            wire_bytes: 0,
        };
        let result = self.encoder.encode_spliced(
            &self.header,
            batch.records().map(|(_, event)| event),
            MAX_COMPRESSED_BYTES,
            &mut self.payload,
        );
        match result {
            Ok(()) => {
                let mut sent = sent;
                if let Sent::Batch { wire_bytes, .. } = &mut sent {
                    *wire_bytes = self.payload.len() as u64;
                }
                Some(sent)
            }
            Err(error) => {
                // Only a record too large for any batch gets here; the queue limits record size
                // so that it cannot happen with a valid configuration.
                tracing::error!(%error, tier = ?batch.tier(), first = batch.first_seq(), "A batch could not be encoded; its tier is parked.");
                drop(queue);
                // An unknown or unspecified header tier parks debug.
                let slot = Tier::try_from(self.header.tier)
                    .ok()
                    .and_then(tier::index)
                    .unwrap_or(tier::DEBUG);
                self.park(slot, &error.to_string());
                self.spool.queue_mut().requeue_unacked();
                None
            }
        }
    }

    fn park(&mut self, slot: usize, reason: &str) {
        let until = clock::instant() + PARK_DURATION;
        self.parked_until[slot] = Some(until);
        let mut stats = self.stats.borrow_mut();
        stats.parked_until_unix_ms[slot] = Some(unix_ms(clock::wall() + PARK_DURATION));
        stats.last_refusal = Some(reason.to_owned());
    }

    /// Handles one event. Returns a reason when the connection must be dropped and retried later.
    fn on_event(
        &mut self,
        client: &AsyncClient,
        event: Event,
        connected: &mut bool,
    ) -> Option<String> {
        match event {
            Event::Incoming(Packet::ConnAck(connack)) => {
                // PUBACKs of the dead connection come out before this CONNACK; none after it.
                self.stale = Tracker::default();
                if connack.code != ConnectReturnCode::Success {
                    return Some(format!("connection refused: {:?}", connack.code));
                }
                *connected = true;
                self.backoff.reset();
                if let Some(max) = connack.properties.as_ref().and_then(|p| p.max_packet_size) {
                    self.fit_broker_packet_limit(max as usize);
                }
                {
                    let mut stats = self.stats.borrow_mut();
                    stats.connected = true;
                    stats.connects += 1;
                    stats.backoff_ms = None;
                }
                tracing::info!(broker = %self.config.host, port = self.config.port, "Connected to the broker.");
                let online = self.machine_status(true);
                if client
                    .try_publish(self.status_topic.as_str(), QoS::AtLeastOnce, true, online)
                    .is_ok()
                {
                    self.tracker.submit(Sent::Status);
                }
                None
            }
            Event::Outgoing(Outgoing::Publish(pkid)) => {
                if let Err(error) = self.tracker.on_outgoing_publish(pkid) {
                    tracing::error!(%error, "Publish bookkeeping lost track; reconnecting.");
                    return Some(error.to_string());
                }
                None
            }
            Event::Outgoing(Outgoing::AwaitAck(pkid)) => {
                if let Err(error) = self.tracker.on_await_ack(pkid) {
                    tracing::error!(%error, "Publish bookkeeping lost track; reconnecting.");
                    return Some(error.to_string());
                }
                None
            }
            Event::Incoming(Packet::PubAck(ack)) => {
                let (sent, stale) = match self.tracker.on_puback(ack.pkid) {
                    Some(sent) => (sent, false),
                    None => match self.stale.on_puback(ack.pkid) {
                        Some(sent) => (sent, true),
                        None => return None,
                    },
                };
                self.on_puback(sent, ack.reason, stale)
            }
            Event::Incoming(Packet::Disconnect(disconnect)) => {
                tracing::warn!(reason = ?disconnect.reason_code, "The broker closed the connection.");
                None
            }
            Event::Incoming(_) | Event::Outgoing(_) => None,
        }
    }

    fn on_puback(&mut self, sent: Sent, reason: PubAckReason, stale: bool) -> Option<String> {
        let Sent::Batch {
            tier,
            epoch,
            first,
            last,
            events,
            bytes,
            wire_bytes,
        } = sent
        else {
            return None;
        };
        match reason {
            PubAckReason::Success => {
                let now = clock::wall();
                // A batch read before a quarantine renumbered the queue deletes nothing.
                self.spool.queue_mut().ack(tier, epoch, first..=last, now);
                let mut stats = self.stats.borrow_mut();
                stats.last_ack_unix_ms = Some(unix_ms(now));
                stats.batches_acked += 1;
                stats.events_acked += events;
                stats.payload_bytes_acked += bytes;
                // Tier::Unspecified (never handed out by the queue) counts as debug.
                let slot = tier::index(tier).unwrap_or(tier::DEBUG);
                stats.event_bytes_acked_by_tier[slot] += bytes;
                stats.wire_bytes_acked_by_tier[slot] += wire_bytes;
                None
            }
            PubAckReason::NoMatchingSubscribers if self.config.retry_when_no_subscribers => {
                self.stats.borrow_mut().no_subscribers += 1;
                if stale {
                    // Already back in the queue with the rest of the dead connection.
                    return None;
                }
                tracing::warn!(
                    ?tier,
                    first,
                    last,
                    "The broker has no subscriber for our batches; backing off."
                );
                Some("no subscribers".to_owned())
            }
            PubAckReason::NoMatchingSubscribers => {
                self.spool
                    .queue_mut()
                    .ack(tier, epoch, first..=last, clock::wall());
                None
            }
            refusal => {
                let text = format!("{refusal:?}");
                // Tier::Unspecified (never handed out by the queue) parks debug.
                let slot = tier::index(tier).unwrap_or(tier::DEBUG);
                tracing::error!(reason = %text, ?tier, first, last, topic = %self.topics[slot], "The broker refused a publish; the tier is parked and nothing is deleted.");
                self.stats.borrow_mut().refused += 1;
                self.park(slot, &text);
                // The refused records go back with everything else in flight (the connection is
                // dropped: Mosquitto closes it anyway) and stay unsent while the tier is parked.
                (!stale).then(|| format!("refused: {text}"))
            }
        }
    }

    fn fit_broker_packet_limit(&mut self, broker_max: usize) {
        let longest_topic = self.topics.iter().map(String::len).max().unwrap_or(0);
        let room = broker_max.saturating_sub(longest_topic + PUBLISH_OVERHEAD);
        // zstd never grows input by more than about 1/256 plus a small constant.
        let raw = room.saturating_mul(255) / 256;
        let fitted = raw.saturating_sub(256).min(self.config.max_batch_bytes);
        if fitted < self.batch_bytes {
            tracing::info!(
                broker_max,
                batch_bytes = fitted,
                "Batches shrunk to fit the broker's maximum packet size."
            );
        }
        self.batch_bytes = fitted.max(1024);
    }

    fn on_connection_lost(&mut self, connected: &mut bool, why: &str) {
        if *connected {
            tracing::warn!(reason = why, "The connection to the broker was lost.");
        } else {
            tracing::debug!(reason = why, "Connecting to the broker failed.");
        }
        *connected = false;
        // Everything not acknowledged goes back to the queue; its PUBACKs may still arrive (they
        // were read before the failure) and are matched against `stale`.
        self.stale = self.tracker.take_written();
        self.spool.queue_mut().requeue_unacked();
        let mut stats = self.stats.borrow_mut();
        stats.connected = false;
        stats.disconnects += 1;
    }

    async fn wait_backoff(&mut self, shutdown: &mut watch::Receiver<bool>) {
        let wait = self.backoff.next_wait(Jitter::Full(rand::random::<f64>()));
        self.stats.borrow_mut().backoff_ms =
            Some(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX));
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            _ = shutdown.changed() => {}
        }
    }

    async fn shut_down(
        &mut self,
        client: &AsyncClient,
        events: &mut EventLoop,
        connected: bool,
    ) -> Result<(), DrainError> {
        if connected {
            let offline = self.machine_status(false);
            let _ = client.try_publish(self.status_topic.as_str(), QoS::AtLeastOnce, true, offline);
            let _ = client.try_disconnect();
            // Let the event loop write the status and the DISCONNECT.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
            loop {
                match tokio::time::timeout_at(deadline, events.poll()).await {
                    Ok(Ok(Event::Outgoing(Outgoing::Disconnect))) | Ok(Err(_)) | Err(_) => break,
                    Ok(Ok(Event::Incoming(Packet::PubAck(ack)))) => {
                        if let Some(sent) = self.tracker.on_puback(ack.pkid) {
                            self.on_puback(sent, ack.reason, false);
                        }
                    }
                    Ok(Ok(_)) => {}
                }
            }
        }
        self.tracker = Tracker::default();
        self.spool.queue_mut().requeue_unacked();
        self.stats.borrow_mut().connected = false;
        Ok(())
    }
}

fn error_text(error: &ConnectionError) -> String {
    error.to_string()
}
