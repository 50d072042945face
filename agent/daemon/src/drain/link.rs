//! The rumqttc shell: a task of its own owns the event loop, connects only when told to, and hands
//! every event and every connection failure to the drain, in order. It decides nothing.
//!
//! ```text
//! drain ──Command::Connect{at}──► wait until `at` ─► poll() … poll() ─► Err ─► Lost ─┐
//!   ▲          Command::Abort ──► clean() (drop the connection) ─► Lost(Aborted) ──┤
//!   └──────────────── LinkEvent::Mqtt(event) / LinkEvent::Lost(why) ◄────────────────┘
//! ```
//!
//! Invariants:
//! - `EventLoop::poll` is never cancelled while a connection is being set up or used, except to
//!   drop that connection (abort, stop): a TCP connection is never opened without its CONNECT
//!   being sent, and no packet is lost half-written.
//! - A connection attempt starts only after a `Connect` command, never at the time of an earlier
//!   one: reconnecting is the drain's decision (its backoff), not rumqttc's.
//! - [`Link::is_up`] is false from the moment rumqttc dropped a connection (it then moves what was
//!   queued into its own pending list, cleared at the next CONNACK): the drain submits nothing
//!   while it is false, so nothing submitted for one connection is sent on the next.
//! - Events reach the drain in the order rumqttc produced them; exactly one `Lost` follows each
//!   connection attempt that ends.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Instant;

use rumqttc::v5::mqttbytes::Error as MqttError;
use rumqttc::v5::mqttbytes::v5::Packet;
use rumqttc::v5::{AsyncClient, ConnectionError, Event, EventLoop, MqttOptions, StateError};
use tokio::sync::mpsc;

use super::core::{Lost, reason};

/// What the drain tells the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Connect when `at` comes (replaces an earlier time not yet reached).
    Connect(Instant),
    /// Drop the current connection now (ignored when there is none).
    Abort,
}

/// What the link tells the drain.
// An event is moved once, through the channel, and is mostly the large variant: boxing it would
// cost an allocation per event for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum LinkEvent {
    /// An event of the connection.
    Mqtt(Event),
    /// The connection ended, or the attempt failed: why, and rumqttc's words for it.
    Lost(Lost, String),
}

/// The drain's end of the link.
pub struct Link {
    client: AsyncClient,
    events: mpsc::UnboundedReceiver<LinkEvent>,
    commands: mpsc::UnboundedSender<Command>,
    up: Rc<Cell<bool>>,
    task: tokio::task::JoinHandle<()>,
}

impl Link {
    /// Starts the link's task (on the current `LocalSet`) with a request channel of `capacity`.
    pub fn start(options: MqttOptions, capacity: usize) -> Self {
        let (client, event_loop) = AsyncClient::new(options, capacity);
        let (event_tx, events) = mpsc::unbounded_channel();
        let (commands, command_rx) = mpsc::unbounded_channel();
        let up = Rc::new(Cell::new(false));
        let task = tokio::task::spawn_local(run(event_loop, event_tx, command_rx, Rc::clone(&up)));
        Self {
            client,
            events,
            commands,
            up,
            task,
        }
    }

    /// The client publishes go through; use it only while [`Link::is_up`].
    pub fn client(&self) -> &AsyncClient {
        &self.client
    }

    /// A connection is established and rumqttc has not dropped it.
    pub fn is_up(&self) -> bool {
        self.up.get()
    }

    /// Sends a command to the link's task.
    pub fn command(&self, command: Command) {
        let _ = self.commands.send(command);
    }

    /// The next event (cancel-safe). `None` once the task ended.
    pub async fn next(&mut self) -> Option<LinkEvent> {
        self.events.recv().await
    }

    /// The next event if one is waiting.
    pub fn try_next(&mut self) -> Option<LinkEvent> {
        self.events.try_recv().ok()
    }

    /// Stops the task, dropping any connection.
    pub fn stop(self) {
        self.task.abort();
    }
}

async fn run(
    mut event_loop: EventLoop,
    events: mpsc::UnboundedSender<LinkEvent>,
    mut commands: mpsc::UnboundedReceiver<Command>,
    up: Rc<Cell<bool>>,
) {
    let mut connect_at: Option<Instant> = None;
    loop {
        // Not connected: wait for the drain's go, and for its time.
        let Some(at) = connect_at.take() else {
            match commands.recv().await {
                Some(Command::Connect(at)) => connect_at = Some(at),
                Some(Command::Abort) => {}
                None => return,
            }
            continue;
        };
        tokio::select! {
            () = tokio::time::sleep_until(at.into()) => {}
            command = commands.recv() => {
                match command {
                    Some(Command::Connect(later)) => connect_at = Some(later),
                    Some(Command::Abort) => connect_at = Some(at),
                    None => return,
                }
                continue;
            }
        }
        // Connecting, then connected: poll until the connection ends.
        loop {
            tokio::select! {
                biased;
                command = commands.recv() => match command {
                    Some(Command::Abort) => {
                        // Cancelling poll here only abandons the connection being dropped.
                        event_loop.clean();
                        up.set(false);
                        let _ = events.send(LinkEvent::Lost(Lost::Aborted, "dropped by the drain".into()));
                        break;
                    }
                    Some(Command::Connect(_)) => {}
                    None => return,
                },
                result = event_loop.poll() => match result {
                    Ok(event) => {
                        if matches!(event, Event::Incoming(Packet::ConnAck(_))) {
                            up.set(true);
                        }
                        let _ = events.send(LinkEvent::Mqtt(event));
                    }
                    Err(error) => {
                        up.set(false);
                        let _ = events.send(LinkEvent::Lost(classify(&error), error.to_string()));
                        break;
                    }
                },
            }
        }
    }
}

/// What a rumqttc error means to the drain.
pub fn classify(error: &ConnectionError) -> Lost {
    match error {
        ConnectionError::MqttState(StateError::ServerDisconnect { reason_code, .. }) => {
            Lost::Disconnected(*reason_code as u8)
        }
        // rumqttc checked a packet against the broker's announced maximum.
        ConnectionError::MqttState(StateError::OutgoingPacketTooLarge { .. }) => {
            Lost::Disconnected(reason::PACKET_TOO_LARGE)
        }
        // A PUBACK with a reason code rumqttc does not know (0x95 from Mosquitto's
        // message_size_limit) is reported as an invalid return code.
        ConnectionError::MqttState(StateError::Deserialization(
            MqttError::InvalidConnectReturnCode(code) | MqttError::InvalidReason(code),
        )) => Lost::Undecodable(Some(*code)),
        ConnectionError::MqttState(StateError::Deserialization(
            MqttError::Io(_) | MqttError::InsufficientBytes(_),
        )) => Lost::Link,
        ConnectionError::MqttState(StateError::Deserialization(_)) => Lost::Undecodable(None),
        _ => Lost::Link,
    }
}
