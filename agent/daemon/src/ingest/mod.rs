//! Local event ingest: a Unix-domain socket where processes on the machine (the autonomy state
//! machine, operator tools) submit events into a tier.
//!
//! ```text
//! client ─► read half ─ frame ─ decode ─ rate (tier) ─ accept: append ─► outcomes (in order)
//!                                                                            │ each one once
//! client ◄─ write half ◄── replies, in order ◄── durable, dropped or refused ┘ its fate is known
//! ```
//!
//! Invariants:
//! - The socket is created with the configured mode (0660 by default) and group; a stale socket
//!   file from a previous run is replaced, anything else at that path is left alone (error).
//! - Each connection is served by its own task with its own buffer: a slow, malformed or
//!   flooding client costs only its own connection, never another's or the agent's. Reading
//!   goes on while earlier submissions wait for their flush, up to [`MAX_UNANSWERED`].
//! - The rate limit is the agent's, one per tier over all connections ([`rate`]): many
//!   connections get no more than one, and safety is never held back by SLO or debug traffic.
//! - A submission is accepted once it is appended, and answered in order, only once its fate is
//!   known: an accepted reply, carrying its sequence number, only when the record is durable
//!   under that number (within `safety_flush` for safety, `bulk_flush` for the others); an error
//!   reply when a failed flush dropped it, the store was quarantined first (its number is void)
//!   or the agent stopped first. The one reply that is neither durable nor a loss: while the
//!   queue's store is unavailable, a safety submission is held in memory and answered at once
//!   with an error saying so ("held"); SLO and debug submissions are refused with the store's
//!   fault. Every refusal is answered (when the stream allows it) and counted.
//! - On shutdown the socket stops accepting and reading; every accepted submission is still
//!   answered once durable (the flusher commits at once from then on), for at most
//!   [`SHUTDOWN_REPLY_GRACE`] per connection that does not read its replies.
//! - Interventions, safe stops and mode changes are counted by the agent, once per submission
//!   ([`counting`]): the event carries the agent's own total (`source` LOCAL), kept with it in
//!   the queue's key-value area; a retry with a remembered submission id is answered as the
//!   original and counted no more.

pub mod codec;
pub mod counting;
pub mod rate;

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use codec::{Frame, Submission};
use counting::LocalCounts;
use edgewatch_proto::v1::{
    Attribute, AutonomyModeChange, CustomEvent, Event, Intervention, LocalReply, LocalSubmission,
    SafeStop, Tier, attribute, event,
};
use prost::Message;
use rate::IngestRate;
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;

use crate::clock;
use crate::config::{Config, Ingest};
use crate::spool::{Fate, Spool, Ticket};

/// Submissions of one connection read and not yet answered, at most: past this the connection
/// stops reading until replies went out (a client that never reads its replies holds this much).
pub const MAX_UNANSWERED: usize = 32 * 1024;

/// How long a stopping agent keeps trying to answer a connection's accepted submissions.
pub const SHUTDOWN_REPLY_GRACE: Duration = Duration::from_secs(5);

/// Counters for `status`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct IngestStats {
    /// Connections accepted.
    pub connections: u64,
    /// Submissions accepted into the queue.
    pub accepted: u64,
    /// Submissions refused (malformed, wrong kind, queue refused, dropped before durable).
    pub rejected: u64,
    /// Connections closed because their stream could not be read further.
    pub dropped_connections: u64,
}

/// The bound socket, ready to serve.
pub struct IngestServer {
    listener: UnixListener,
    settings: Ingest,
    shared: Rc<Shared>,
}

/// What every connection of the socket shares.
struct Shared {
    spool: Spool,
    stats: Rc<RefCell<IngestStats>>,
    counting: RefCell<Counting>,
    rate: RefCell<IngestRate>,
}

/// The agent's counts of socket submissions, shared by the connections, and a buffer to keep
/// them.
struct Counting {
    counts: LocalCounts,
    kept: Vec<u8>,
}

impl IngestServer {
    /// Binds the socket at the configured path with the configured mode and group.
    pub fn bind(
        settings: &Ingest,
        spool: Spool,
        stats: Rc<RefCell<IngestStats>>,
    ) -> std::io::Result<Self> {
        remove_stale_socket(&settings.socket)?;
        if let Some(parent) = settings.socket.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let listener = UnixListener::bind(&settings.socket)?;
        std::fs::set_permissions(
            &settings.socket,
            std::fs::Permissions::from_mode(settings.mode),
        )?;
        if let Some(group) = &settings.group {
            set_group(&settings.socket, group)?;
        }
        let counts = LocalCounts::from_kept(spool.queue().kv(counting::KEPT_KEY));
        let rate = IngestRate::new(settings.rate_per_s, settings.burst, clock::instant());
        Ok(Self {
            listener,
            settings: settings.clone(),
            shared: Rc::new(Shared {
                spool,
                stats,
                counting: RefCell::new(Counting {
                    counts,
                    kept: Vec::new(),
                }),
                rate: RefCell::new(rate),
            }),
        })
    }

    /// Accepts connections until `shutdown` turns true, then waits (at most
    /// [`SHUTDOWN_REPLY_GRACE`]) until every connection answered what it accepted.
    pub async fn serve(self, mut shutdown: watch::Receiver<bool>) {
        let mut connections = JoinSet::new();
        loop {
            let stream = tokio::select! {
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(error) => {
                        tracing::warn!(%error, "Accepting a local connection failed.");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                Some(_) = connections.join_next(), if !connections.is_empty() => continue,
                _ = shutdown.wait_for(|&s| s) => break,
            };
            self.shared.stats.borrow_mut().connections += 1;
            connections.spawn_local(serve_connection(
                stream,
                self.settings.max_message_bytes,
                Rc::clone(&self.shared),
                shutdown.clone(),
            ));
        }
        // New clients find no socket and retry against the next run.
        let _ = std::fs::remove_file(&self.settings.socket);
        drop(self.listener);
        let answered = tokio::time::timeout(SHUTDOWN_REPLY_GRACE, async {
            while connections.join_next().await.is_some() {}
        })
        .await;
        if answered.is_err() {
            tracing::warn!(
                connections = connections.len(),
                "Local clients did not read their replies in time; closing their connections."
            );
        }
    }
}

fn remove_stale_socket(path: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path),
        Ok(_) => Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!("{} exists and is not a socket", path.display()),
        )),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(error),
    }
}

fn set_group(path: &Path, group: &str) -> std::io::Result<()> {
    let name = std::ffi::CString::new(group)
        .map_err(|_| std::io::Error::other("group name holds a NUL byte"))?;
    // SAFETY: getgrnam reads a NUL-terminated string and returns a pointer into static storage
    // (or null); we copy the gid out before any other call could overwrite it.
    let gid = unsafe {
        let entry = libc::getgrnam(name.as_ptr());
        if entry.is_null() {
            return Err(std::io::Error::other(format!("no group named {group}")));
        }
        (*entry).gr_gid
    };
    std::os::unix::fs::chown(path, None, Some(gid))
}

/// The outcome of one submission, until it is answered.
type Outcome = Result<Ticket, String>;

/// One connection's submissions between its reading and its writing half.
struct Exchange {
    /// Outcomes in submission order, not yet answered.
    outcomes: RefCell<VecDeque<Outcome>>,
    /// False once the reading half stopped: nothing more will be pushed.
    reading: std::cell::Cell<bool>,
    /// False once the writing half failed: the client is gone.
    writable: std::cell::Cell<bool>,
    /// Raised by the reading half when it pushed an outcome or stopped.
    pushed: Notify,
    /// Raised by the writing half when it answered (there is room again) or failed.
    answered: Notify,
}

async fn serve_connection(
    mut stream: UnixStream,
    max_message_bytes: usize,
    shared: Rc<Shared>,
    shutdown: watch::Receiver<bool>,
) {
    let exchange = Exchange {
        outcomes: RefCell::new(VecDeque::new()),
        reading: std::cell::Cell::new(true),
        writable: std::cell::Cell::new(true),
        pushed: Notify::new(),
        answered: Notify::new(),
    };
    let (reader, writer) = stream.split();
    tokio::join!(
        read_submissions(reader, max_message_bytes, &shared, &exchange, shutdown),
        write_replies(writer, &shared, &exchange),
    );
}

/// The reading half: frames to outcomes, until the stream ends, fails or is unreadable, the
/// client is gone, or the agent stops.
async fn read_submissions(
    mut reader: tokio::net::unix::ReadHalf<'_>,
    max_message_bytes: usize,
    shared: &Shared,
    exchange: &Exchange,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut buf: Vec<u8> = Vec::with_capacity(16 * 1024);
    let mut chunk = vec![0u8; 16 * 1024];
    'stream: loop {
        let mut offset = 0;
        loop {
            let (body, consumed) = match codec::next_frame(&buf[offset..], max_message_bytes) {
                Ok(Frame::Incomplete) => break,
                Ok(Frame::Complete { body, consumed }) => (body, consumed),
                Err(error) => {
                    tracing::warn!(%error, "A local client sent an unreadable stream; closing it.");
                    shared.stats.borrow_mut().dropped_connections += 1;
                    push(exchange, Err(error.to_string()));
                    break 'stream;
                }
            };
            let submission = codec::decode_submission(&buf[offset + body.start..offset + body.end]);
            let tier = submission.as_ref().ok().map(|submission| submission.tier);
            let wait = shared.rate.borrow_mut().reserve(tier, clock::instant());
            // Past the rate, or past the replies this connection may hold, it waits: its
            // writes block, nothing is refused for speed alone. (A timer, even of zero, costs a
            // tick of the runtime's clock: only a real wait takes one.)
            let full = || exchange.outcomes.borrow().len() >= MAX_UNANSWERED;
            if !wait.is_zero() || full() {
                let go_on = async {
                    if !wait.is_zero() {
                        tokio::time::sleep(wait).await;
                    }
                    while full() && exchange.writable.get() {
                        exchange.answered.notified().await;
                    }
                };
                tokio::select! {
                    biased;
                    _ = shutdown.wait_for(|&s| s) => break 'stream,
                    () = go_on => {}
                }
            }
            if !exchange.writable.get() {
                break 'stream;
            }
            let outcome = match submission {
                Ok(submission) => accept(submission, shared),
                Err(error) => Err(error.to_string()),
            };
            push(exchange, outcome);
            offset += consumed;
        }
        buf.drain(..offset);
        let read = tokio::select! {
            biased;
            _ = shutdown.wait_for(|&s| s) => break,
            read = reader.read(&mut chunk) => read,
            () = async {
                while exchange.writable.get() {
                    exchange.answered.notified().await;
                }
            } => break,
        };
        match read {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    exchange.reading.set(false);
    exchange.pushed.notify_one();
}

fn push(exchange: &Exchange, outcome: Outcome) {
    exchange.outcomes.borrow_mut().push_back(outcome);
    exchange.pushed.notify_one();
}

/// The writing half: answers outcomes in order as their fates become known, until the reading
/// half stopped and everything it accepted is answered, or the client is gone.
async fn write_replies(
    mut writer: tokio::net::unix::WriteHalf<'_>,
    shared: &Shared,
    exchange: &Exchange,
) {
    let mut encoded = Vec::new();
    // A ticket whose wait ended with the flusher stopped.
    let mut stopped: Option<Ticket> = None;
    loop {
        let mut waiting_on = None;
        {
            let mut outcomes = exchange.outcomes.borrow_mut();
            let mut stats = shared.stats.borrow_mut();
            while let Some(outcome) = outcomes.front() {
                let reply = match outcome {
                    Err(error) => codec::refused(error),
                    Ok(ticket) => {
                        // The flusher's stop is known only to the wait that saw it.
                        let fate = match stopped {
                            Some(stopped) if stopped == *ticket => Fate::Stopped,
                            _ => shared.spool.fate(*ticket),
                        };
                        match fate {
                            Fate::Pending => {
                                waiting_on = Some(*ticket);
                                break;
                            }
                            Fate::Durable => codec::accepted(ticket.seq),
                            // Held (not durable: the documented exception), dropped, void after
                            // a quarantine, or never written: an error saying which.
                            fate => match shared.spool.not_durable(fate) {
                                Some(why) => codec::refused(&why),
                                None => codec::refused(&"not durable"),
                            },
                        }
                    }
                };
                if reply.accepted {
                    stats.accepted += 1;
                } else {
                    stats.rejected += 1;
                }
                codec::encode_frame(&reply, &mut encoded);
                outcomes.pop_front();
            }
        }
        if !encoded.is_empty() {
            exchange.answered.notify_one();
            if writer.write_all(&encoded).await.is_err() {
                exchange.writable.set(false);
                exchange.answered.notify_one();
                return;
            }
            encoded.clear();
            continue;
        }
        match waiting_on {
            Some(ticket) => {
                if shared.spool.settled(ticket).await == Fate::Stopped {
                    stopped = Some(ticket);
                }
            }
            None if !exchange.reading.get() => return,
            None => exchange.pushed.notified().await,
        }
    }
}

/// Stamps, counts and appends one decoded submission.
fn accept(submission: Submission, shared: &Shared) -> Outcome {
    let Submission {
        tier,
        mut event,
        id,
    } = submission;
    let spool = &shared.spool;
    let mut counting = shared.counting.borrow_mut();
    if event.event_time_unix_ns == 0 {
        event.event_time_unix_ns = clock::unix_ns(clock::wall());
    }
    if event.monotonic_ns == 0 {
        event.monotonic_ns = clock::monotonic_ns();
    }
    let prepared = event
        .kind
        .as_mut()
        .and_then(|kind| counting.counts.prepare(kind));
    let epoch = spool.queue().epoch();
    if prepared.is_some()
        && let Some((tier, seq)) = id
            .as_deref()
            .and_then(|id| counting.counts.accepted(id, epoch))
    {
        // A retry of a submission already in the queue: the same answer once the original is
        // durable, nothing counted again.
        return Ok(Ticket { tier, epoch, seq });
    }
    let ticket = spool
        .append(tier, &event)
        .map_err(|error| refusal(spool, &error))?;
    if let Some(prepared) = prepared {
        counting
            .counts
            .commit(prepared, id.as_deref(), (tier, ticket.seq, ticket.epoch));
        let Counting { counts, kept } = &mut *counting;
        kept.clear();
        // Encoding into a Vec cannot run out of room.
        let _ = counts.encode(kept);
        // Staged after the append: durable with the event it counts.
        if let Err(error) = spool.queue_mut().stage_kv(counting::KEPT_KEY, kept) {
            tracing::warn!(%error, "The count of local submissions was not kept; after a restart it starts again.");
        }
    }
    Ok(ticket)
}

/// The reply to a refused append: what the queue said, and while its store is unavailable,
/// why.
fn refusal(spool: &Spool, error: &edgewatch_queue::AppendError) -> String {
    match spool.queue().store_fault() {
        Some(fault) => format!("{error} ({})", fault.reason),
        None => error.to_string(),
    }
}

/// Why `emit` failed.
#[derive(Debug, thiserror::Error)]
pub enum EmitError {
    /// The arguments do not form an event.
    #[error("{0}")]
    Usage(String),
    /// The agent's socket could not be reached.
    #[error("cannot reach the agent at {path}: {source}")]
    Connect {
        /// Socket path.
        path: std::path::PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The exchange failed.
    #[error("talking to the agent: {0}")]
    Io(#[from] std::io::Error),
    /// The agent refused the event.
    #[error("the agent refused the event: {0}")]
    Refused(String),
}

/// Builds the event `edgewatch-agent emit` describes.
pub fn build_event(kind: &str, attrs: &[String]) -> Result<Event, EmitError> {
    let mut pairs = Vec::new();
    for attr in attrs {
        let (key, value) = attr
            .split_once('=')
            .ok_or_else(|| EmitError::Usage(format!("--attr {attr:?} is not key=value")))?;
        if key.is_empty() {
            return Err(EmitError::Usage(format!(
                "--attr {attr:?} has an empty key"
            )));
        }
        pairs.push((key.to_owned(), value.to_owned()));
    }
    let get = |key: &str| pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
    let mode = |key: &str| -> Result<i32, EmitError> {
        match get(key) {
            None => Ok(0),
            Some(name) => codec::parse_mode(&name).map(|m| m as i32).ok_or_else(|| {
                EmitError::Usage(format!(
                    "{key}={name}: expected autonomous, manual, teleoperated or idle"
                ))
            }),
        }
    };
    let kind = match kind {
        // The agent counts these itself (`total`, `delta` and `source` are its own).
        "intervention" => event::Kind::Intervention(Intervention {
            reason: get("reason").unwrap_or_default(),
            mode: mode("mode")?,
            ..Intervention::default()
        }),
        "safe-stop" => event::Kind::SafeStop(SafeStop {
            reason: get("reason").unwrap_or_default(),
            mode: mode("mode")?,
            ..SafeStop::default()
        }),
        "mode-change" => {
            if get("to").is_none() {
                return Err(EmitError::Usage(
                    "mode-change needs --attr to=<mode>".into(),
                ));
            }
            event::Kind::AutonomyModeChange(AutonomyModeChange {
                previous: mode("from")?,
                current: mode("to")?,
                reason: get("reason").unwrap_or_default(),
                ..AutonomyModeChange::default()
            })
        }
        name => {
            if name.is_empty() {
                return Err(EmitError::Usage("--kind must not be empty".into()));
            }
            event::Kind::Custom(CustomEvent {
                name: name.to_owned(),
                attributes: pairs
                    .into_iter()
                    .map(|(key, value)| Attribute {
                        key,
                        value: Some(typed_value(value)),
                    })
                    .collect(),
            })
        }
    };
    Ok(Event {
        kind: Some(kind),
        ..Event::default()
    })
}

fn typed_value(text: String) -> attribute::Value {
    if let Ok(int) = text.parse::<i64>() {
        attribute::Value::IntValue(int)
    } else if let Ok(float) = text.parse::<f64>() {
        attribute::Value::DoubleValue(float)
    } else if let Ok(flag) = text.parse::<bool>() {
        attribute::Value::BoolValue(flag)
    } else {
        attribute::Value::StringValue(text)
    }
}

/// Sends one submission to the agent's socket and waits for its reply. `id` identifies it
/// across retries: a retry the agent already accepted gets the original's reply.
pub fn submit(socket: &Path, tier: Tier, event: Event, id: Option<&str>) -> Result<u64, EmitError> {
    let mut stream =
        std::os::unix::net::UnixStream::connect(socket).map_err(|source| EmitError::Connect {
            path: socket.to_owned(),
            source,
        })?;
    stream.set_read_timeout(Some(std::time::Duration::from_secs(30)))?;
    let submission = LocalSubmission {
        tier: tier as i32,
        event: Some(event),
        submission_id: id.unwrap_or_default().to_owned(),
    };
    let mut out = Vec::new();
    codec::encode_frame(&submission, &mut out);
    stream.write_all(&out)?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Err(EmitError::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the agent closed the connection without a reply",
            )));
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Ok(Frame::Complete { body, .. }) = codec::next_frame(&buf, 64 * 1024) {
            let reply = LocalReply::decode(&buf[body])
                .map_err(|error| EmitError::Io(std::io::Error::other(error)))?;
            return if reply.accepted {
                Ok(reply.seq)
            } else {
                Err(EmitError::Refused(reply.error))
            };
        }
    }
}

/// `edgewatch-agent emit`: submits one event (with the submission id `id`, if given) and
/// prints its sequence number.
pub fn emit(
    config: &Config,
    tier: &str,
    kind: &str,
    attrs: &[String],
    id: Option<&str>,
) -> Result<u64, EmitError> {
    let tier = codec::parse_tier(tier)
        .ok_or_else(|| EmitError::Usage(format!("--tier {tier}: expected safety, slo or debug")))?;
    if id.is_some_and(|id| id.is_empty() || id.len() > codec::MAX_SUBMISSION_ID_BYTES) {
        return Err(EmitError::Usage(format!(
            "--id must be 1 to {} bytes",
            codec::MAX_SUBMISSION_ID_BYTES
        )));
    }
    let event = build_event(kind, attrs)?;
    submit(&config.ingest.socket, tier, event, id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emit_arguments_become_typed_events() {
        let event = build_event(
            "intervention",
            &["reason=obstacle".into(), "mode=autonomous".into()],
        )
        .unwrap();
        let Some(event::Kind::Intervention(intervention)) = event.kind else {
            panic!("not an intervention");
        };
        assert_eq!(intervention.reason, "obstacle");
        let event = build_event(
            "bed-raised",
            &[
                "angle=42.5".into(),
                "loaded=true".into(),
                "count=3".into(),
                "who=op".into(),
            ],
        )
        .unwrap();
        let Some(event::Kind::Custom(custom)) = event.kind else {
            panic!("not custom");
        };
        assert_eq!(custom.name, "bed-raised");
        let values: Vec<_> = custom
            .attributes
            .into_iter()
            .map(|a| a.value.unwrap())
            .collect();
        assert_eq!(
            values,
            vec![
                attribute::Value::DoubleValue(42.5),
                attribute::Value::BoolValue(true),
                attribute::Value::IntValue(3),
                attribute::Value::StringValue("op".into()),
            ]
        );
    }

    #[test]
    fn bad_emit_arguments_are_usage_errors() {
        assert!(matches!(
            build_event("custom", &["novalue".into()]),
            Err(EmitError::Usage(_))
        ));
        assert!(matches!(
            build_event("mode-change", &[]),
            Err(EmitError::Usage(_))
        ));
        assert!(matches!(
            build_event("intervention", &["mode=flying".into()]),
            Err(EmitError::Usage(_))
        ));
    }
}
