//! The drain's sans-IO core: every decision the uplink makes, as a pure state machine. It takes
//! events (connected, packet id written, PUBACK with its reason code, connection lost with why,
//! batch read, records durable, queue epoch changed, time) and returns actions (connect at, read,
//! publish, delete, rewind, requeue, dead-letter, abort). The shell (`drain::run` over
//! `drain::link`) moves bytes and feeds events; it decides nothing.
//!
//! ```text
//!  Waiting ──Connect{at} (backoff, or the initial delay)──► link connects ──on_connected──► Connected
//!     ▲                                                                                    │
//!     └──────────── on_connection_lost: RequeueAll, backoff grows, Connect{at} ◄────────────┘
//!
//!  Connected: Read ─► on_read ─► Publish (window, bandwidth bucket) ─► on_written(pkid)
//!             a trial (a tier or a size the connection has not seen taken) ─► no Read until answered
//!             on_puback(pkid, 0x00) ─► Delete{tier, epoch, first..=last}      (the only deletion)
//!             0x10 / 0x97            ─► quiesce, pause (backoff grows), then probe: one record at a time
//!             0x87 / 0x90            ─► quiesce, park the tier
//!             0x80 / 0x83 / 0x99 / 0x95 ─► quiesce, halve the tier's batches; one record refused
//!                                          `dead_letter_after` times ─► DeadLetter
//!             quiesce = no new publish until nothing is in flight, then RequeueAll
//! ```
//!
//! Invariants:
//! - A record is deleted (`Action::Delete`) only on a success PUBACK for a publish that carried it,
//!   and the deletion names the epoch the record was read in: the queue ignores another epoch's.
//!   The one other way out is `Action::DeadLetter`, for a record refused again and again alone in
//!   its batch, or too large for any batch, which the queue counts and reports.
//! - Packet ids are matched per connection: the events between a connection loss and the next
//!   `on_connected` belong to the dead connection (rumqttc hands them out before the CONNACK), so
//!   a stale PUBACK matches only what the dead connection carried, never a re-send.
//! - Nothing is read again while it may still be in flight: `RequeueAll` comes only after a
//!   connection loss or once nothing is in flight; `Rewind` only for a batch never published.
//! - Nothing is published behind a trial: after a publish of a tier the broker has not taken on
//!   this connection, or larger than any payload it took there, nothing is read until that
//!   publish is answered or the connection is gone. Mosquitto (2.0) closes the connection right
//!   after a refusing PUBACK (0x95 for its `message_size_limit`, 0x87 for its ACL); a publish
//!   written behind the refused one meets the reset, and rumqttc then reports the failed write
//!   instead of the PUBACK that explains it. With nothing behind it, a refused trial's PUBACK is
//!   read, so every refusal that ends a connection is seen as one and acted on.
//! - Every failed connection makes the backoff ceiling grow (up to its maximum); only a success
//!   PUBACK resets it. A refusal never leads to an immediate re-send of the same publish: halving
//!   shrinks it, everything else waits (pause, park, backoff).
//! - The bandwidth bucket holds back batch reads only: connecting, the status message and
//!   keepalives are never waited for.
//! - Pure: no I/O, no clock (time is an argument), randomness from a seed.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use edgewatch_conventions::backoff::{Backoff, Jitter};
use edgewatch_proto::tier::{self, PerTier, TIERS};
use edgewatch_proto::v1::Tier;
use edgewatch_queue::BatchLimits;

use super::tracker::{Tracker, TrackerError};
use crate::pacing::token_bucket::TokenBucket;

/// MQTT v5 reason codes the core tells apart (PUBACK and DISCONNECT share these numbers).
pub mod reason {
    /// Success.
    pub const SUCCESS: u8 = 0x00;
    /// The broker took the message but nobody subscribes to its topic.
    pub const NO_MATCHING_SUBSCRIBERS: u8 = 0x10;
    /// Unspecified error.
    pub const UNSPECIFIED_ERROR: u8 = 0x80;
    /// Implementation-specific error.
    pub const IMPLEMENTATION_SPECIFIC_ERROR: u8 = 0x83;
    /// Not authorized (an ACL refused the topic).
    pub const NOT_AUTHORIZED: u8 = 0x87;
    /// The topic name is not valid.
    pub const TOPIC_NAME_INVALID: u8 = 0x90;
    /// The packet identifier is already in use.
    pub const PACKET_IDENTIFIER_IN_USE: u8 = 0x91;
    /// The packet is larger than the broker accepts.
    pub const PACKET_TOO_LARGE: u8 = 0x95;
    /// The broker's quota is exceeded.
    pub const QUOTA_EXCEEDED: u8 = 0x97;
    /// The payload does not match its format indicator.
    pub const PAYLOAD_FORMAT_INVALID: u8 = 0x99;
}

/// Refusals of a record alone in its batch before it is dead-lettered.
pub const DEAD_LETTER_AFTER: u32 = 3;

/// How long a quiesce (waiting for the publishes in flight before reading again) may last before
/// the connection is dropped instead: a broker that stops acknowledging is a dead link.
pub const QUIESCE_TIMEOUT: Duration = Duration::from_secs(60);

/// The smallest wire limit a refusal can teach: below it batches hold one record anyway.
pub const MIN_WIRE_LIMIT: usize = 1024;

/// What the core is configured with (from `[uplink]`).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Publishes awaiting PUBACK at once (at most the broker's Receive Maximum).
    pub inflight: u16,
    /// Raw event bytes per batch.
    pub max_batch_bytes: usize,
    /// Records per batch.
    pub max_batch_events: usize,
    /// Largest compressed payload the framing carries.
    pub framing_limit: usize,
    /// First reconnect backoff and pause.
    pub backoff_min: Duration,
    /// Longest reconnect backoff and pause.
    pub backoff_max: Duration,
    /// Upper bound of the random delay before the first connection.
    pub initial_delay_max: Duration,
    /// How long a tier whose topic the broker refused stays parked.
    pub park: Duration,
    /// How long a shutdown waits for the publishes in flight.
    pub shutdown_grace: Duration,
    /// Keep and retry a batch the broker had no subscriber for (PUBACK 0x10).
    pub retry_when_no_subscribers: bool,
    /// Bandwidth cap in bytes per second of MQTT packets, if any.
    pub bandwidth_bytes_per_s: Option<u64>,
    /// Refusals of a one-record batch before the record is dead-lettered.
    pub dead_letter_after: u32,
    /// Seed of the core's jitter.
    pub seed: u64,
}

/// One batch as read from the queue: what a publish carries and what its PUBACK acknowledges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchRef {
    /// Tier of every record in it.
    pub tier: Tier,
    /// Queue epoch the sequence numbers belong to.
    pub epoch: u64,
    /// First sequence number.
    pub first: u64,
    /// Last sequence number.
    pub last: u64,
    /// Records carried.
    pub events: u64,
    /// Event bytes (protobuf, before compression).
    pub event_bytes: u64,
    /// Payload bytes as sent (compressed).
    pub wire_bytes: u64,
}

impl BatchRef {
    fn ix(&self) -> usize {
        // The queue hands out no Tier::Unspecified batch; one would count as debug.
        tier::index(self.tier).unwrap_or(tier::DEBUG)
    }

    fn holds(&self, tier: Tier, epoch: u64, seq: u64) -> bool {
        self.tier == tier && self.epoch == epoch && (self.first..=self.last).contains(&seq)
    }
}

/// What one publish carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    Batch(BatchRef),
    Status,
}

/// What the broker announced in its CONNACK.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnectInfo {
    /// Receive Maximum: publishes it accepts in flight.
    pub receive_maximum: Option<u16>,
    /// The largest payload its Maximum Packet Size leaves room for, with our longest topic.
    pub max_payload: Option<usize>,
}

/// Why a connection ended (or never began).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lost {
    /// The network failed, a keepalive went unanswered, or connecting failed.
    Link,
    /// The broker sent DISCONNECT with this reason code.
    Disconnected(u8),
    /// A packet from the broker could not be decoded; the reason code it carried, if known (a
    /// PUBACK 0x95 from Mosquitto's `message_size_limit` is one rumqttc cannot decode).
    Undecodable(Option<u8>),
    /// The core asked for it ([`Action::Abort`]).
    Aborted,
}

impl Lost {
    /// The publish in flight is the likely cause: the oldest one not acknowledged is halved.
    fn blames_a_publish(self) -> Option<u8> {
        match self {
            Self::Disconnected(reason::PACKET_TOO_LARGE) => Some(reason::PACKET_TOO_LARGE),
            Self::Undecodable(code) => Some(code.unwrap_or(reason::UNSPECIFIED_ERROR)),
            _ => None,
        }
    }
}

/// The answer to [`Action::Read`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadOutcome {
    /// No tier asked for has a record to send.
    Empty,
    /// A batch was read and encoded; `packet_bytes` is the whole MQTT packet it makes.
    Encoded {
        /// The batch.
        batch: BatchRef,
        /// Bytes of the PUBLISH packet (payload, topic, header).
        packet_bytes: u64,
    },
    /// The batch read did not fit once encoded (above the limit asked for, or the framing's);
    /// nothing was sent.
    TooLarge {
        /// Its tier.
        tier: Tier,
        /// Its epoch.
        epoch: u64,
        /// Its first sequence number.
        first: u64,
        /// Its records.
        events: u64,
    },
    /// The queue could not be read.
    Failed,
}

/// A batch read, as the core asks for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadRequest {
    /// Per tier, in priority order: the limits of its next batch, or `None` to skip it (parked).
    pub limits: PerTier<Option<BatchLimits>>,
    /// Most compressed payload bytes for a batch of several records.
    pub wire_limit: usize,
    /// Most compressed payload bytes for a batch of one record (it goes alone or not at all).
    pub single_limit: usize,
}

/// Why a record was dead-lettered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadLetterCause {
    /// The broker refused it, alone in its batch, with this reason code, `times` times.
    Refused {
        /// The last reason code.
        code: u8,
        /// Refusals.
        times: u32,
    },
    /// Alone in its batch it is larger than any payload the framing or the broker carries.
    TooLargeToSend,
}

/// What the shell does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Let the link connect when `at` comes; it does not connect before.
    Connect {
        /// When.
        at: Instant,
    },
    /// Drop the connection now; the link reports it lost (`Lost::Aborted`).
    Abort,
    /// Publish the machine's online status (retained) as the next publish.
    PublishStatus,
    /// Read (and encode) the next batch, then call [`DrainCore::on_read`].
    Read(ReadRequest),
    /// Publish the batch just encoded, as the next publish.
    Publish(BatchRef),
    /// The broker took these records: acknowledge them to the queue (in their epoch only).
    Delete(BatchRef),
    /// Hand the tier's records out again from `from`: a batch read but never published.
    Rewind {
        /// The tier.
        tier: Tier,
        /// The epoch the read was in.
        epoch: u64,
        /// First sequence number to hand out again.
        from: u64,
    },
    /// Hand out again every record not acknowledged: nothing is in flight any more.
    RequeueAll,
    /// Give up on one record: the queue deletes it as a counted, reported loss.
    DeadLetter {
        /// Its tier.
        tier: Tier,
        /// Its epoch.
        epoch: u64,
        /// Its sequence number.
        seq: u64,
        /// Why.
        cause: DeadLetterCause,
    },
    /// Something for the status file and the log.
    Note(Note),
    /// Shutdown is complete: announce the agent offline, disconnect, stop.
    Finished,
}

/// What happened, for the status file and the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Note {
    /// A connection was established.
    Connected,
    /// A connection ended (or never began); the next attempt is in `retry_in`.
    ConnectionLost {
        /// Why.
        lost: Lost,
        /// It had been established.
        was_connected: bool,
        /// Wait before the next attempt.
        retry_in: Duration,
    },
    /// The broker acknowledged a batch.
    Acked(BatchRef),
    /// A PUBACK 0x10: nobody subscribes; sending pauses.
    NoSubscribers {
        /// The batch.
        batch: BatchRef,
        /// Sending resumes (one record at a time) after this long, if this refusal started a pause.
        pause: Option<Duration>,
    },
    /// The broker refused a batch with `code`.
    Refused {
        /// The batch.
        batch: BatchRef,
        /// The reason code.
        code: u8,
    },
    /// A tier is parked until `until`.
    Parked {
        /// The tier.
        tier: Tier,
        /// Until when.
        until: Instant,
    },
    /// A parked tier is read again.
    Unparked {
        /// The tier.
        tier: Tier,
    },
    /// Sending pauses until `until` (the connection stays).
    Paused {
        /// Until when.
        until: Instant,
    },
    /// A tier's batches hold at most `max_records` records from now on, and multi-record
    /// payloads at most `wire_limit` bytes.
    Shrunk {
        /// The tier.
        tier: Tier,
        /// Records per batch.
        max_records: usize,
        /// Compressed bytes per multi-record batch.
        wire_limit: usize,
    },
    /// A record was dead-lettered.
    DeadLettered {
        /// Its tier.
        tier: Tier,
        /// Its sequence number.
        seq: u64,
        /// Why.
        cause: DeadLetterCause,
    },
    /// The client reported a packet id the core cannot match; the connection is dropped.
    Bookkeeping(TrackerError),
    /// Publishes in flight went unacknowledged for [`QUIESCE_TIMEOUT`]; the connection is dropped.
    QuiesceTimedOut,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Not connected; the link connects when the last `Connect{at}` comes.
    Waiting,
    /// A CONNACK was seen and the connection has not failed since.
    Connected,
    /// Shutdown is complete.
    Finished,
}

/// A record refused alone in its batch, and how often.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Poison {
    tier: Tier,
    epoch: u64,
    seq: u64,
    refusals: u32,
}

/// The drain's state machine. See the module documentation.
#[derive(Debug)]
pub struct DrainCore {
    settings: Settings,
    phase: Phase,
    /// The live connection's publishes.
    tracker: Tracker<Sent>,
    /// The previous connection's publishes: rumqttc hands out its last events (stale PUBACKs
    /// among them) after reconnecting, before the CONNACK.
    dead: Tracker<Sent>,
    /// The dead connection's end blames its oldest unacknowledged publish, with this code.
    blame: Option<u8>,
    epoch: u64,
    backoff: Backoff,
    rng: u64,
    bucket: Option<TokenBucket>,
    /// When the bucket lets the next read go, while it holds one back.
    send_at: Option<Instant>,
    /// The last read found nothing; cleared by anything that may have changed that.
    queue_empty: bool,
    /// A `Read` was handed out and its outcome not yet reported.
    reading: bool,
    parked_until: PerTier<Option<Instant>>,
    /// No reads until then (no subscribers, quota, a record refused alone); the connection stays.
    paused_until: Option<Instant>,
    /// One publish of one record at a time until a success (after a pause).
    probing: bool,
    /// The largest payload the broker took on this connection (success or no subscriber).
    taken_bytes: u64,
    /// The tiers the broker took a publish of on this connection.
    taken_tiers: PerTier<bool>,
    /// A trial in flight: a publish the broker may refuse (a tier or a size not taken on this
    /// connection). Nothing is read until its PUBACK; see the module documentation.
    trial: Option<BatchRef>,
    /// Reading stopped until nothing is in flight, since then.
    quiesce: Option<Instant>,
    record_limit: PerTier<usize>,
    wire_limit: usize,
    broker_payload: Option<usize>,
    receive_maximum: Option<u16>,
    poison: Option<Poison>,
    /// Shutdown requested: finish by this time at the latest.
    stopping: Option<Instant>,
    actions: VecDeque<Action>,
}

impl DrainCore {
    /// A core for a queue of `epoch`, started at `now`: its first action is the connection after
    /// the random initial delay.
    pub fn new(settings: Settings, epoch: u64, now: Instant) -> Self {
        let bucket = settings
            .bandwidth_bytes_per_s
            .map(|rate| TokenBucket::new(rate, rate.max(64 * 1024), now));
        let mut core = Self {
            phase: Phase::Waiting,
            tracker: Tracker::default(),
            dead: Tracker::default(),
            blame: None,
            epoch,
            backoff: Backoff::new(settings.backoff_min, settings.backoff_max),
            rng: settings.seed,
            bucket,
            send_at: None,
            queue_empty: false,
            reading: false,
            parked_until: PerTier::default(),
            paused_until: None,
            probing: false,
            taken_bytes: 0,
            taken_tiers: PerTier::all(false),
            trial: None,
            quiesce: None,
            record_limit: PerTier::all(settings.max_batch_events.max(1)),
            wire_limit: settings.framing_limit,
            broker_payload: None,
            receive_maximum: None,
            poison: None,
            stopping: None,
            actions: VecDeque::new(),
            settings,
        };
        let delay = core.settings.initial_delay_max.mul_f64(core.unit_random());
        core.actions.push_back(Action::Connect { at: now + delay });
        core
    }

    // ---- events -------------------------------------------------------------------------------

    /// The link connected (CONNACK success). Events after this belong to the new connection.
    pub fn on_connected(&mut self, now: Instant, info: ConnectInfo) {
        if self.phase != Phase::Waiting {
            return;
        }
        self.phase = Phase::Connected;
        // Every stale event of the dead connection came before this CONNACK: what is still
        // unacknowledged there was never taken.
        let culprit = self
            .dead
            .written()
            .find(|sent| matches!(sent, Sent::Batch(_)))
            .copied();
        if let Some(code) = self.blame.take()
            && let Some(Sent::Batch(batch)) = culprit
        {
            self.actions
                .push_back(Action::Note(Note::Refused { batch, code }));
            self.refused_content(now, batch, code, false);
        }
        self.dead = Tracker::default();
        self.receive_maximum = info.receive_maximum;
        self.broker_payload = info.max_payload;
        self.queue_empty = false;
        self.quiesce = None;
        // What another connection took proves nothing about this one (another broker, or the
        // same one reconfigured).
        self.taken_bytes = 0;
        self.taken_tiers = PerTier::all(false);
        self.trial = None;
        self.tracker = Tracker::default();
        self.tracker.submit(Sent::Status);
        self.actions.push_back(Action::Note(Note::Connected));
        self.actions.push_back(Action::PublishStatus);
    }

    /// The connection ended, or an attempt to connect failed. Nothing of it is in flight any more.
    pub fn on_connection_lost(&mut self, now: Instant, lost: Lost) {
        if self.phase == Phase::Finished {
            return;
        }
        let was_connected = self.phase == Phase::Connected;
        if was_connected {
            self.dead = std::mem::take(&mut self.tracker);
            self.blame = lost.blames_a_publish();
            self.actions.push_back(Action::RequeueAll);
        }
        self.phase = Phase::Waiting;
        self.quiesce = None;
        self.trial = None;
        self.paused_until = None;
        self.send_at = None;
        self.reading = false;
        let unit = self.unit_random();
        let wait = self.backoff.next_wait(Jitter::Full(unit));
        self.actions.push_back(Action::Note(Note::ConnectionLost {
            lost,
            was_connected,
            retry_in: wait,
        }));
        if self.stopping.is_some() {
            self.finish();
        } else {
            self.actions.push_back(Action::Connect { at: now + wait });
        }
    }

    /// rumqttc wrote the next publish with packet id `pkid` (`Outgoing::Publish`).
    pub fn on_written(&mut self, pkid: u16) {
        match self.phase {
            Phase::Connected => {
                if let Err(error) = self.tracker.on_outgoing_publish(pkid) {
                    self.bookkeeping_failed(error);
                }
            }
            // A stale event of the dead connection.
            Phase::Waiting => {
                let _ = self.dead.on_outgoing_publish(pkid);
            }
            Phase::Finished => {}
        }
    }

    /// rumqttc holds the next publish until `pkid` is acknowledged (`Outgoing::AwaitAck`).
    pub fn on_await_ack(&mut self, pkid: u16) {
        match self.phase {
            Phase::Connected => {
                if let Err(error) = self.tracker.on_await_ack(pkid) {
                    self.bookkeeping_failed(error);
                }
            }
            Phase::Waiting => {
                let _ = self.dead.on_await_ack(pkid);
            }
            Phase::Finished => {}
        }
    }

    /// The broker answered `pkid` with reason `code`.
    pub fn on_puback(&mut self, now: Instant, pkid: u16, code: u8) {
        let live = self.phase != Phase::Waiting;
        let sent = if live {
            self.tracker.on_puback(pkid)
        } else {
            self.dead.on_puback(pkid)
        };
        let Some(sent) = sent else {
            // Not ours (or already answered): nothing to do.
            return;
        };
        let Sent::Batch(batch) = sent else {
            if code == reason::SUCCESS {
                self.backoff.reset();
            }
            return;
        };
        if live {
            if self.trial == Some(batch) {
                self.trial = None;
            }
            if code == reason::SUCCESS || code == reason::NO_MATCHING_SUBSCRIBERS {
                self.taken_bytes = self.taken_bytes.max(batch.wire_bytes);
                *self.taken_tiers.at_mut(batch.ix()) = true;
            }
        }
        match code {
            reason::SUCCESS => self.acked(batch),
            reason::NO_MATCHING_SUBSCRIBERS if !self.settings.retry_when_no_subscribers => {
                self.acked(batch)
            }
            reason::NO_MATCHING_SUBSCRIBERS | reason::QUOTA_EXCEEDED => {
                let pause = if live { self.pause(now) } else { None };
                let note = if code == reason::QUOTA_EXCEEDED {
                    Note::Refused { batch, code }
                } else {
                    Note::NoSubscribers { batch, pause }
                };
                self.actions.push_back(Action::Note(note));
            }
            reason::NOT_AUTHORIZED | reason::TOPIC_NAME_INVALID => {
                self.actions
                    .push_back(Action::Note(Note::Refused { batch, code }));
                let until = now + self.settings.park;
                *self.parked_until.at_mut(batch.ix()) = Some(until);
                self.actions.push_back(Action::Note(Note::Parked {
                    tier: batch.tier,
                    until,
                }));
                if live {
                    self.start_quiesce(now);
                }
            }
            reason::PACKET_IDENTIFIER_IN_USE => {
                self.actions
                    .push_back(Action::Note(Note::Refused { batch, code }));
                if live {
                    self.actions.push_back(Action::Abort);
                }
            }
            _ => {
                self.actions
                    .push_back(Action::Note(Note::Refused { batch, code }));
                self.refused_content(now, batch, code, live);
            }
        }
    }

    /// The outcome of the last [`Action::Read`].
    pub fn on_read(&mut self, now: Instant, outcome: ReadOutcome) {
        self.reading = false;
        match outcome {
            ReadOutcome::Empty | ReadOutcome::Failed => self.queue_empty = true,
            ReadOutcome::Encoded {
                batch,
                packet_bytes,
            } => {
                if self.phase != Phase::Connected || self.stopping.is_some() {
                    self.actions.push_back(Action::Rewind {
                        tier: batch.tier,
                        epoch: batch.epoch,
                        from: batch.first,
                    });
                    return;
                }
                if let Some(bucket) = &mut self.bucket {
                    bucket.take(packet_bytes, now);
                }
                self.tracker.submit(Sent::Batch(batch));
                if !(*self.taken_tiers.at(batch.ix()) && batch.wire_bytes <= self.taken_bytes) {
                    self.trial = Some(batch);
                }
                self.actions.push_back(Action::Publish(batch));
            }
            ReadOutcome::TooLarge {
                tier,
                epoch,
                first,
                events,
            } => {
                if events > 1 {
                    let ix = tier::index(tier).unwrap_or(tier::DEBUG);
                    let limit = usize::try_from(events / 2).unwrap_or(1).max(1);
                    *self.record_limit.at_mut(ix) = limit;
                    self.actions.push_back(Action::Note(Note::Shrunk {
                        tier,
                        max_records: limit,
                        wire_limit: self.wire_limit,
                    }));
                    self.actions.push_back(Action::Rewind {
                        tier,
                        epoch,
                        from: first,
                    });
                } else {
                    self.dead_letter(tier, epoch, first, DeadLetterCause::TooLargeToSend);
                }
            }
        }
    }

    /// Records became durable: there may be something to read.
    pub fn on_durable(&mut self) {
        self.queue_empty = false;
    }

    /// The queue's epoch is now `epoch` (a quarantine replaced the store). Publishes of the old
    /// epoch still in flight are acknowledged in their own epoch, which deletes nothing.
    pub fn on_epoch(&mut self, epoch: u64) {
        if epoch != self.epoch {
            self.epoch = epoch;
            self.poison = None;
            self.queue_empty = false;
        }
    }

    /// Stop: no new batch; finish once nothing is in flight, or after the shutdown grace.
    pub fn shutdown(&mut self, now: Instant) {
        if self.stopping.is_some() || self.phase == Phase::Finished {
            return;
        }
        self.stopping = Some(now + self.settings.shutdown_grace);
        if self.phase != Phase::Connected {
            self.finish();
        }
    }

    /// Time passed: parks and pauses end, the bucket refills, a quiesce or a shutdown times out.
    pub fn handle_timeout(&mut self, now: Instant) {
        for (ix, tier) in TIERS.into_iter().enumerate() {
            let until = self.parked_until.at_mut(ix);
            if until.is_some_and(|until| until <= now) {
                *until = None;
                self.queue_empty = false;
                self.actions
                    .push_back(Action::Note(Note::Unparked { tier }));
            }
        }
        if self.paused_until.is_some_and(|until| until <= now) {
            self.paused_until = None;
        }
        if self.send_at.is_some_and(|at| at <= now) {
            self.send_at = None;
        }
        if self.phase == Phase::Connected
            && self
                .quiesce
                .is_some_and(|since| since + QUIESCE_TIMEOUT <= now)
        {
            self.quiesce = None;
            self.actions.push_back(Action::Note(Note::QuiesceTimedOut));
            self.actions.push_back(Action::Abort);
        }
        if let Some(deadline) = self.stopping
            && self.phase == Phase::Connected
            && (deadline <= now || !self.batches_in_flight())
        {
            self.finish();
        }
    }

    // ---- outputs ------------------------------------------------------------------------------

    /// The next action, if any. Call until `None`, then wait for an event or [`Self::poll_timeout`].
    pub fn poll_action(&mut self, now: Instant) -> Option<Action> {
        self.handle_timeout(now);
        if let Some(action) = self.actions.pop_front() {
            return Some(action);
        }
        if self.phase != Phase::Connected || self.stopping.is_some() || self.reading {
            return None;
        }
        if self.quiesce.is_some() {
            if self.tracker.is_empty() {
                self.quiesce = None;
                self.queue_empty = false;
                return Some(Action::RequeueAll);
            }
            return None;
        }
        if self.trial.is_some()
            || self.paused_until.is_some()
            || self.queue_empty
            || self.send_at.is_some()
        {
            return None;
        }
        let window = if self.probing {
            1
        } else {
            usize::from(
                self.settings
                    .inflight
                    .min(self.receive_maximum.unwrap_or(u16::MAX))
                    .max(1),
            )
        };
        if self.tracker.len() >= window {
            return None;
        }
        let mut limits = PerTier::<Option<BatchLimits>>::default();
        for ix in 0..TIERS.len() {
            if self.parked_until.at(ix).is_none() {
                // A probe only asks whether the broker takes a publish again: one record.
                let max_records = if self.probing {
                    1
                } else {
                    *self.record_limit.at(ix)
                };
                *limits.at_mut(ix) = Some(BatchLimits {
                    max_records,
                    max_bytes: self.settings.max_batch_bytes,
                });
            }
        }
        if limits.iter().all(|(_, limit)| limit.is_none()) {
            return None;
        }
        if let Some(bucket) = &mut self.bucket {
            // Read only when the bucket is out of debt; the batch then takes what it needs.
            let wait = bucket.wait_for(1, now);
            if !wait.is_zero() {
                self.send_at = Some(now + wait);
                return None;
            }
        }
        self.reading = true;
        let single_limit = self
            .settings
            .framing_limit
            .min(self.broker_payload.unwrap_or(usize::MAX));
        Some(Action::Read(ReadRequest {
            limits,
            wire_limit: self.wire_limit.min(single_limit),
            single_limit,
        }))
    }

    /// When the core next needs [`Self::handle_timeout`] (or [`Self::poll_action`]), if ever.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        let mut consider = |at: Option<Instant>| {
            if let Some(at) = at {
                next = Some(next.map_or(at, |next| next.min(at)));
            }
        };
        for (_, until) in self.parked_until.iter() {
            consider(*until);
        }
        if self.phase == Phase::Connected {
            consider(self.paused_until);
            consider(self.send_at);
            consider(self.quiesce.map(|since| since + QUIESCE_TIMEOUT));
            consider(self.stopping);
        }
        next
    }

    // ---- views ---------------------------------------------------------------------------------

    /// The ceiling of the next reconnect wait or pause.
    pub fn backoff_ceiling(&self) -> Duration {
        self.backoff.ceiling()
    }

    /// Publishes of the live connection not yet acknowledged (the status message included).
    pub fn in_flight(&self) -> usize {
        self.tracker.len()
    }

    /// A CONNACK was seen and the connection has not failed since.
    pub fn is_connected(&self) -> bool {
        self.phase == Phase::Connected
    }

    /// Shutdown is complete.
    pub fn is_finished(&self) -> bool {
        self.phase == Phase::Finished
    }

    /// Records per batch of each tier, as refusals and oversized encodings have left them.
    pub fn record_limits(&self) -> PerTier<usize> {
        self.record_limit
    }

    /// Compressed bytes per multi-record batch, as refusals have left it.
    pub fn wire_limit(&self) -> usize {
        self.wire_limit
    }

    // ---- internals ----------------------------------------------------------------------------

    fn acked(&mut self, batch: BatchRef) {
        self.backoff.reset();
        self.probing = false;
        if self
            .poison
            .is_some_and(|p| batch.holds(p.tier, p.epoch, p.seq))
        {
            self.poison = None;
        }
        // A full batch with room to spare under the wire limit: let the tier's batches grow back.
        let ix = batch.ix();
        let limit = self.record_limit.at_mut(ix);
        if batch.events >= *limit as u64
            && *limit < self.settings.max_batch_events
            && batch.wire_bytes.saturating_mul(2) <= self.wire_limit as u64
        {
            *limit = (*limit * 2).min(self.settings.max_batch_events);
        }
        self.actions.push_back(Action::Delete(batch));
        self.actions.push_back(Action::Note(Note::Acked(batch)));
    }

    /// The broker refused `batch` for what it carries (or its size): halve the tier's batches, or
    /// count the refusal of a record alone and dead-letter it after `dead_letter_after`.
    fn refused_content(&mut self, now: Instant, batch: BatchRef, code: u8, live: bool) {
        let ix = batch.ix();
        if code == reason::PACKET_TOO_LARGE {
            let learned = usize::try_from(batch.wire_bytes / 2)
                .unwrap_or(usize::MAX)
                .max(MIN_WIRE_LIMIT);
            self.wire_limit = self.wire_limit.min(learned);
        }
        if batch.events > 1 {
            let limit = usize::try_from(batch.events / 2).unwrap_or(1).max(1);
            let current = self.record_limit.at_mut(ix);
            *current = (*current).min(limit);
            self.actions.push_back(Action::Note(Note::Shrunk {
                tier: batch.tier,
                max_records: *current,
                wire_limit: self.wire_limit,
            }));
            if live {
                self.start_quiesce(now);
            }
            return;
        }
        let refusals = match self.poison {
            Some(p) if p.tier == batch.tier && p.epoch == batch.epoch && p.seq == batch.first => {
                p.refusals + 1
            }
            _ => 1,
        };
        if refusals >= self.settings.dead_letter_after.max(1) {
            self.poison = None;
            self.dead_letter(
                batch.tier,
                batch.epoch,
                batch.first,
                DeadLetterCause::Refused {
                    code,
                    times: refusals,
                },
            );
            if live {
                self.start_quiesce(now);
            }
        } else {
            self.poison = Some(Poison {
                tier: batch.tier,
                epoch: batch.epoch,
                seq: batch.first,
                refusals,
            });
            if live {
                self.pause(now);
            }
        }
    }

    fn dead_letter(&mut self, tier: Tier, epoch: u64, seq: u64, cause: DeadLetterCause) {
        self.actions.push_back(Action::DeadLetter {
            tier,
            epoch,
            seq,
            cause,
        });
        self.actions
            .push_back(Action::Note(Note::DeadLettered { tier, seq, cause }));
    }

    /// No new read until nothing is in flight; then everything unacknowledged is read again.
    fn start_quiesce(&mut self, now: Instant) {
        if self.quiesce.is_none() {
            self.quiesce = Some(now);
        }
    }

    /// Quiesce, then pause with the backoff (once per round: refusals of the publishes still in
    /// flight do not compound it), then probe with one record at a time. Returns the pause, if new.
    fn pause(&mut self, now: Instant) -> Option<Duration> {
        let new_round = self.paused_until.is_none() && self.quiesce.is_none();
        self.start_quiesce(now);
        self.probing = true;
        if !new_round {
            return None;
        }
        let unit = self.unit_random();
        let wait = self.backoff.next_wait(Jitter::Full(unit));
        let until = now + wait;
        self.paused_until = Some(until);
        self.actions.push_back(Action::Note(Note::Paused { until }));
        Some(wait)
    }

    fn bookkeeping_failed(&mut self, error: TrackerError) {
        self.actions
            .push_back(Action::Note(Note::Bookkeeping(error)));
        self.actions.push_back(Action::Abort);
    }

    fn batches_in_flight(&self) -> bool {
        self.tracker
            .iter()
            .any(|sent| matches!(sent, Sent::Batch(_)))
    }

    fn finish(&mut self) {
        self.phase = Phase::Finished;
        self.actions.push_back(Action::Finished);
    }

    /// A uniform number in `[0, 1)` from the core's own generator (splitmix64).
    fn unit_random(&mut self) -> f64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests;
