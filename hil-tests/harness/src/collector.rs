//! An MQTT subscriber on everything the agents publish (`edgewatch/v1/#`), standing in for the
//! gateway: it decodes every batch and keeps, or only counts, what arrived.
//!
//! ```text
//! broker ──PUBLISH──▶ collector thread (own runtime) ──▶ received / statuses / undecodable
//!                                                    └─▶ message and event counters
//! ```
//!
//! Invariants:
//! - `start` returns once the broker acknowledged the subscription, so nothing published after
//!   it is missed; it subscribes again on every CONNACK, so a reconnect keeps it subscribed.
//! - Status messages (topics ending in `/status`) are kept apart from batches, and a payload that
//!   does not decode as a batch is counted, never dropped unseen.
//! - The thread is stopped and joined when the handle drops.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use edgewatch_proto::framing::decode_batch;
use edgewatch_proto::v1::{Event, Tier};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::Packet;
use rumqttc::v5::{AsyncClient, Event as MqttEvent, MqttOptions};

use crate::events::event_id;
use crate::{HarnessError, Result};

/// Everything the agents publish.
pub const TOPIC_FILTER: &str = "edgewatch/v1/#";

/// How long `start` waits for the subscription.
const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(15);

/// One event as received.
#[derive(Debug, Clone)]
pub struct Received {
    /// The batch's topic.
    pub topic: String,
    /// The batch's tier.
    pub tier: Tier,
    /// The batch's agent epoch.
    pub epoch: u64,
    /// The event's sequence number.
    pub seq: u64,
    /// The event.
    pub event: Event,
}

/// A retained status message: topic and payload.
pub type StatusMessage = (String, Vec<u8>);

/// What a collector keeps of each message.
#[derive(Debug, Clone, Copy)]
pub enum Keep {
    /// Every event, status message and undecodable payload, for tests that look at them.
    Everything,
    /// Only counts: the events of decoded batches for which the function holds (e.g. all but
    /// the agents' own health reports).
    EventCount(fn(&Event) -> bool),
    /// Only the count of messages; payloads are not even decoded.
    MessageCount,
}

/// A subscriber on [`TOPIC_FILTER`] running on its own thread.
pub struct Collector {
    /// Events received, in arrival order (with [`Keep::Everything`]).
    pub received: Arc<Mutex<Vec<Received>>>,
    /// Status messages received (with [`Keep::Everything`]).
    pub statuses: Arc<Mutex<Vec<StatusMessage>>>,
    /// Payloads on batch topics that did not decode (with [`Keep::Everything`]).
    pub undecodable: Arc<Mutex<u64>>,
    messages: Arc<AtomicU64>,
    events_counted: Arc<AtomicU64>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Collector {
    /// The tests' collector: client id `collector`, a persistent session (so nothing published
    /// while it is disconnected is lost), 2 MiB packets, QoS 1, keeping everything.
    pub fn start(broker: SocketAddr) -> Result<Self> {
        Self::start_with(broker, |_| {})
    }

    /// As [`Collector::start`], with options changed by `configure` (TLS, credentials).
    pub fn start_with(
        broker: SocketAddr,
        configure: impl FnOnce(&mut MqttOptions),
    ) -> Result<Self> {
        let mut options = MqttOptions::new("collector", broker.ip().to_string(), broker.port());
        options.set_keep_alive(Duration::from_secs(5));
        options.set_clean_start(false);
        options.set_session_expiry_interval(Some(3600));
        options.set_max_packet_size(Some(2 * 1024 * 1024));
        configure(&mut options);
        Self::subscribe(options, QoS::AtLeastOnce, Keep::Everything)
    }

    /// Connects with `options`, subscribes to [`TOPIC_FILTER`] at `qos`, and returns once the
    /// subscription is acknowledged.
    pub fn subscribe(options: MqttOptions, qos: QoS, keep: Keep) -> Result<Self> {
        let received = Arc::new(Mutex::new(Vec::new()));
        let statuses = Arc::new(Mutex::new(Vec::new()));
        let undecodable = Arc::new(Mutex::new(0));
        let messages = Arc::new(AtomicU64::new(0));
        let events_counted = Arc::new(AtomicU64::new(0));
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(HarnessError::io("building the collector's runtime"))?;
        let sink = Sink {
            keep,
            received: Arc::clone(&received),
            statuses: Arc::clone(&statuses),
            undecodable: Arc::clone(&undecodable),
            messages: Arc::clone(&messages),
            events_counted: Arc::clone(&events_counted),
        };
        let thread = std::thread::Builder::new()
            .name("mqtt-collector".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let (client, mut events) = AsyncClient::new(options, 64);
                    let mut ready = Some(ready_tx);
                    loop {
                        let event = tokio::select! {
                            event = events.poll() => event,
                            _ = &mut stopped => return,
                        };
                        match event {
                            Ok(MqttEvent::Incoming(Packet::ConnAck(_))) => {
                                let _ = client.try_subscribe(TOPIC_FILTER, qos);
                            }
                            Ok(MqttEvent::Incoming(Packet::SubAck(_))) => {
                                if let Some(ready) = ready.take() {
                                    let _ = ready.send(());
                                }
                            }
                            Ok(MqttEvent::Incoming(Packet::Publish(publish))) => {
                                sink.take(&publish.topic, &publish.payload);
                            }
                            Ok(_) => {}
                            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                        }
                    }
                });
            })
            .map_err(HarnessError::io("spawning the collector's thread"))?;
        let mut collector = Self {
            received,
            statuses,
            undecodable,
            messages,
            events_counted,
            stop: Some(stop),
            thread: Some(thread),
        };
        if ready_rx.recv_timeout(SUBSCRIBE_TIMEOUT).is_err() {
            collector.shutdown();
            return Err(HarnessError::NotReady {
                what: "the collector's subscription".into(),
                seconds: SUBSCRIBE_TIMEOUT.as_secs(),
                detail: " (no SUBACK)".into(),
            });
        }
        Ok(collector)
    }

    /// Messages received, on any topic.
    pub fn messages(&self) -> u64 {
        self.messages.load(Ordering::Relaxed)
    }

    /// Events counted (with [`Keep::EventCount`]).
    pub fn events_counted(&self) -> u64 {
        self.events_counted.load(Ordering::Relaxed)
    }

    /// Events received so far.
    pub fn count(&self) -> usize {
        lock(&self.received).len()
    }

    /// Distinct (tier, epoch, seq) received.
    pub fn distinct(&self) -> BTreeSet<(i32, u64, u64)> {
        lock(&self.received)
            .iter()
            .map(|r| (r.tier as i32, r.epoch, r.seq))
            .collect()
    }

    /// The `id` attributes of the custom events received in `tier`
    /// ([`crate::events::custom_event`]).
    pub fn ids(&self, tier: Tier) -> Vec<i64> {
        lock(&self.received)
            .iter()
            .filter(|r| r.tier == tier)
            .filter_map(|r| event_id(&r.event))
            .collect()
    }

    /// A copy of the events received so far.
    pub fn snapshot(&self) -> Vec<Received> {
        lock(&self.received).clone()
    }

    fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Where the collector's thread puts what arrives.
struct Sink {
    keep: Keep,
    received: Arc<Mutex<Vec<Received>>>,
    statuses: Arc<Mutex<Vec<StatusMessage>>>,
    undecodable: Arc<Mutex<u64>>,
    messages: Arc<AtomicU64>,
    events_counted: Arc<AtomicU64>,
}

impl Sink {
    fn take(&self, topic: &[u8], payload: &[u8]) {
        self.messages.fetch_add(1, Ordering::Relaxed);
        match self.keep {
            Keep::MessageCount => {}
            Keep::EventCount(counts) => {
                if let Ok(batch) = decode_batch(payload) {
                    let n = batch.events.iter().filter(|e| counts(e)).count();
                    self.events_counted.fetch_add(n as u64, Ordering::Relaxed);
                }
            }
            Keep::Everything => {
                let topic = String::from_utf8_lossy(topic).into_owned();
                if topic.ends_with("/status") {
                    lock(&self.statuses).push((topic, payload.to_vec()));
                    return;
                }
                match decode_batch(payload) {
                    Ok(batch) => {
                        let mut received = lock(&self.received);
                        let tier = batch.tier();
                        for event in batch.events {
                            received.push(Received {
                                topic: topic.clone(),
                                tier,
                                epoch: batch.agent_epoch,
                                seq: event.seq,
                                event,
                            });
                        }
                    }
                    Err(_) => *lock(&self.undecodable) += 1,
                }
            }
        }
    }
}
