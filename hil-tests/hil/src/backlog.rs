//! A backlog for the agent to drain: custom debug events with incompressible-ish padding
//! (`edgewatch_harness::events`), submitted through the agent's real local socket, pipelined,
//! each accepted only once durable.
//!
//! Invariants:
//! - Every submission gets its reply; a refused one is an error naming the agent's reason.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use edgewatch_agent::ingest::codec;
use edgewatch_harness::events::custom_event;
use edgewatch_proto::v1::{LocalReply, LocalSubmission, Tier};
use prost::Message;

/// Filling the backlog failed.
#[derive(Debug, thiserror::Error)]
pub enum BacklogError {
    /// The socket failed.
    #[error("local socket: {0}")]
    Io(#[from] std::io::Error),
    /// The agent refused a submission.
    #[error("the agent refused submission {index}: {reason}")]
    Refused {
        /// Which submission.
        index: usize,
        /// The agent's reason.
        reason: String,
    },
    /// A reply did not decode.
    #[error("undecodable reply: {0}")]
    Reply(#[from] prost::DecodeError),
}

/// Submits `count` events of `padding` bytes to the agent's socket; returns when every one is
/// durable in the agent's queue.
pub fn fill(socket: &Path, count: usize, padding: usize) -> Result<(), BacklogError> {
    fill_from(socket, 0, count, padding)
}

/// [`fill`], with event ids from `first_id` on (a later backlog does not repeat an earlier one's
/// ids).
pub fn fill_from(
    socket: &Path,
    first_id: usize,
    count: usize,
    padding: usize,
) -> Result<(), BacklogError> {
    let stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(Duration::from_secs(120)))?;
    let mut writer = stream.try_clone()?;
    let feeder = std::thread::spawn(move || -> std::io::Result<()> {
        let mut out = Vec::with_capacity(256 * 1024);
        for id in 0..count {
            let submission = LocalSubmission {
                tier: Tier::Debug as i32,
                event: Some(custom_event("hil-backlog", (first_id + id) as i64, padding)),
                ..LocalSubmission::default()
            };
            codec::encode_frame(&submission, &mut out);
            if out.len() > 128 * 1024 {
                writer.write_all(&out)?;
                out.clear();
            }
        }
        writer.write_all(&out)
    });
    let mut reader = stream;
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    let mut replies = 0;
    while replies < count {
        let n = reader.read(&mut chunk)?;
        if n == 0 {
            return Err(BacklogError::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("the agent closed the socket after {replies} replies"),
            )));
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut offset = 0;
        while let Ok(codec::Frame::Complete { body, consumed }) =
            codec::next_frame(&buf[offset..], 1024 * 1024)
        {
            let reply = LocalReply::decode(&buf[offset + body.start..offset + body.end])?;
            if !reply.accepted {
                return Err(BacklogError::Refused {
                    index: replies,
                    reason: reply.error,
                });
            }
            replies += 1;
            offset += consumed;
        }
        buf.drain(..offset);
    }
    feeder
        .join()
        .map_err(|_| std::io::Error::other("the feeder thread panicked"))??;
    Ok(())
}
