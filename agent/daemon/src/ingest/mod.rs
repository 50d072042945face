//! Local event ingest: a Unix-domain socket where processes on the machine (the autonomy state
//! machine, operator tools) submit events into a tier.
//!
//! Invariants:
//! - The socket is created with the configured mode (0660 by default) and group; a stale socket
//!   file from a previous run is replaced, anything else at that path is left alone (error).
//! - Each connection is served by its own task with its own buffer and rate limit: a slow,
//!   malformed or flooding client costs only its own connection, never another's or the agent's.
//! - A submission is answered only after it is in the queue; a safety submission only after it is
//!   durable. Every refusal is answered (when the stream allows it) and counted.
//! - Interventions, safe stops and mode changes are counted by the agent, once per submission
//!   ([`counting`]): the event carries the agent's own total (`source` LOCAL), kept with it in
//!   the queue's key-value area; a retry with a remembered submission id is answered as the
//!   original and counted no more.

pub mod codec;
pub mod counting;

use std::cell::RefCell;
use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::rc::Rc;

use codec::Frame;
use counting::LocalCounts;
use edgewatch_proto::v1::{
    Attribute, AutonomyModeChange, CustomEvent, Event, Intervention, LocalReply, LocalSubmission,
    SafeStop, Tier, attribute, event,
};
use prost::Message;
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;

use crate::clock;
use crate::config::{Config, Ingest};
use crate::pacing::token_bucket::TokenBucket;
use crate::spool::Spool;

/// Counters for `status`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct IngestStats {
    /// Connections accepted.
    pub connections: u64,
    /// Submissions accepted into the queue.
    pub accepted: u64,
    /// Submissions refused (malformed, wrong kind, over the rate, queue refused).
    pub rejected: u64,
    /// Connections closed because their stream could not be read further.
    pub dropped_connections: u64,
}

/// The bound socket, ready to serve.
pub struct IngestServer {
    listener: UnixListener,
    settings: Ingest,
    spool: Spool,
    stats: Rc<RefCell<IngestStats>>,
    counting: Rc<RefCell<Counting>>,
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
        Ok(Self {
            listener,
            settings: settings.clone(),
            spool,
            stats,
            counting: Rc::new(RefCell::new(Counting {
                counts,
                kept: Vec::new(),
            })),
        })
    }

    /// Accepts connections until `shutdown` turns true.
    pub async fn serve(self, mut shutdown: watch::Receiver<bool>) {
        loop {
            let stream = tokio::select! {
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(error) => {
                        tracing::warn!(%error, "Accepting a local connection failed.");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                },
                _ = shutdown.changed() => break,
            };
            self.stats.borrow_mut().connections += 1;
            tokio::task::spawn_local(serve_connection(
                stream,
                self.settings.clone(),
                self.spool.clone(),
                Rc::clone(&self.stats),
                Rc::clone(&self.counting),
                shutdown.clone(),
            ));
        }
        let _ = std::fs::remove_file(&self.settings.socket);
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

async fn serve_connection(
    mut stream: UnixStream,
    settings: Ingest,
    spool: Spool,
    stats: Rc<RefCell<IngestStats>>,
    counting: Rc<RefCell<Counting>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut buf: Vec<u8> = Vec::with_capacity(16 * 1024);
    let mut answered = Answers::default();
    // The rate limit is backpressure: past its burst a client waits (its writes block), nothing
    // it sent is refused for speed alone.
    let mut bucket = TokenBucket::new(
        u64::from(settings.rate_per_s),
        u64::from(settings.burst),
        clock::instant(),
    );
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        let read = tokio::select! {
            read = stream.read(&mut chunk) => read,
            _ = shutdown.changed() => return,
        };
        let n = match read {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        let mut offset = 0;
        let mut fatal = false;
        loop {
            let frame = codec::next_frame(&buf[offset..], settings.max_message_bytes);
            let (body, consumed) = match frame {
                Ok(Frame::Incomplete) => break,
                Ok(Frame::Complete { body, consumed }) => (body, consumed),
                Err(error) => {
                    tracing::warn!(%error, "A local client sent an unreadable stream; closing it.");
                    stats.borrow_mut().dropped_connections += 1;
                    answered.push(Err(error.to_string()));
                    fatal = true;
                    break;
                }
            };
            let wait = bucket.wait_for(1, clock::instant());
            if !wait.is_zero() {
                if answered.send(&mut stream, &spool, &stats).await.is_err() {
                    return;
                }
                tokio::time::sleep(wait).await;
            }
            bucket.take(1, clock::instant());
            let body = &buf[offset + body.start..offset + body.end];
            answered.push(accept(body, &spool, &mut counting.borrow_mut()));
            offset += consumed;
        }
        buf.drain(..offset);
        if answered.send(&mut stream, &spool, &stats).await.is_err() || fatal {
            return;
        }
    }
}

/// Outcomes of the submissions read so far, answered together after one group commit: tier,
/// sequence number and the queue epoch it was given in.
#[derive(Default)]
struct Answers {
    outcomes: Vec<Result<(Tier, u64, u64), String>>,
    encoded: Vec<u8>,
}

impl Answers {
    fn push(&mut self, outcome: Result<(Tier, u64, u64), String>) {
        self.outcomes.push(outcome);
    }

    /// Waits until every accepted safety submission is durable, then writes all replies.
    async fn send(
        &mut self,
        stream: &mut UnixStream,
        spool: &Spool,
        stats: &Rc<RefCell<IngestStats>>,
    ) -> std::io::Result<()> {
        if self.outcomes.is_empty() {
            return Ok(());
        }
        let last_safety = self
            .outcomes
            .iter()
            .filter_map(|outcome| match outcome {
                Ok((Tier::Safety, seq, epoch)) => Some((*epoch, *seq)),
                _ => None,
            })
            .max();
        if let Some((epoch, seq)) = last_safety {
            // Each safety outcome is confirmed below, for its own number and epoch.
            let _ = spool.wait_durable(Tier::Safety, epoch, seq).await;
        }
        self.encoded.clear();
        {
            let mut stats = stats.borrow_mut();
            for outcome in self.outcomes.drain(..) {
                // A safety submission is answered accepted only if it is durable under the
                // number it was given; otherwise with why (store unavailable, quarantined).
                let outcome = match outcome {
                    Ok((Tier::Safety, seq, epoch)) => spool
                        .confirm(Tier::Safety, epoch, seq)
                        .map(|()| (Tier::Safety, seq, epoch))
                        .map_err(|not_durable| not_durable.to_string()),
                    other => other,
                };
                let reply = match outcome {
                    Ok((_, seq, _)) => {
                        stats.accepted += 1;
                        codec::accepted(seq)
                    }
                    Err(error) => {
                        stats.rejected += 1;
                        codec::refused(&error)
                    }
                };
                codec::encode_frame(&reply, &mut self.encoded);
            }
        }
        stream.write_all(&self.encoded).await
    }
}

/// Decodes, stamps, counts and appends one submission; returns its tier, number and the queue
/// epoch the number belongs to.
fn accept(body: &[u8], spool: &Spool, counting: &mut Counting) -> Result<(Tier, u64, u64), String> {
    let codec::Submission {
        tier,
        mut event,
        id,
    } = codec::decode_submission(body).map_err(|error| error.to_string())?;
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
        && let Some(original) = id
            .as_deref()
            .and_then(|id| counting.counts.accepted(id, epoch))
    {
        // A retry of a submission already in the queue: the same answer, nothing counted again.
        return Ok((original.0, original.1, epoch));
    }
    let seq = spool
        .append(tier, &event)
        .map_err(|error| refusal(spool, &error))?;
    let epoch = spool.queue().epoch();
    if let Some(prepared) = prepared {
        counting
            .counts
            .commit(prepared, id.as_deref(), (tier, seq, epoch));
        counting.kept.clear();
        // Encoding into a Vec cannot run out of room.
        let _ = counting.counts.encode(&mut counting.kept);
        // Staged after the append: durable with the event it counts.
        if let Err(error) = spool
            .queue_mut()
            .stage_kv(counting::KEPT_KEY, &counting.kept)
        {
            tracing::warn!(%error, "The count of local submissions was not kept; after a restart it starts again.");
        }
    }
    Ok((tier, seq, epoch))
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
