//! Framing and validation of local submissions (sans-IO).
//!
//! The stream carries varint-length-prefixed protobuf messages: `LocalSubmission` from the client,
//! `LocalReply` back, one reply per submission, in order.
//!
//! Invariants:
//! - A length above the configured maximum is refused before any byte of the body is buffered; the
//!   stream cannot be resynchronized after that, so the connection is closed.
//! - A body that is not a valid submission is refused with a reply; the stream stays usable.
//! - Only the event kinds local applications own are accepted: interventions, safe stops,
//!   autonomy-mode changes, custom events and log records.
//! - A submission id, when given, is 1 to [`MAX_SUBMISSION_ID_BYTES`] bytes.

use edgewatch_proto::v1::{AutonomyMode, Event, LocalReply, LocalSubmission, Tier, event};
use prost::Message;

/// Longest submission id accepted.
pub const MAX_SUBMISSION_ID_BYTES: usize = 64;

/// Why a frame or submission was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmissionError {
    /// The declared length is above the limit (the connection is closed).
    #[error("submission of {len} bytes is above the limit of {max}")]
    TooLarge {
        /// Declared length.
        len: u64,
        /// The limit.
        max: usize,
    },
    /// The length prefix is not a valid varint (the connection is closed).
    #[error("malformed length prefix")]
    BadLength,
    /// The body is not a `LocalSubmission`.
    #[error("not a LocalSubmission: {0}")]
    Malformed(String),
    /// The tier is missing or unknown.
    #[error("tier must be safety, slo or debug")]
    Tier,
    /// The event has no kind, or one that local applications may not submit.
    #[error("event kind {0} cannot be submitted locally")]
    Kind(&'static str),
    /// The submission id is longer than [`MAX_SUBMISSION_ID_BYTES`].
    #[error("submission_id must be at most {MAX_SUBMISSION_ID_BYTES} bytes, not {0}")]
    Id(usize),
}

impl SubmissionError {
    /// Whether the connection must be closed after this error.
    pub fn is_fatal(&self) -> bool {
        matches!(self, Self::TooLarge { .. } | Self::BadLength)
    }
}

/// Result of looking for one frame at the start of a buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    /// More bytes are needed.
    Incomplete,
    /// A complete frame: its body spans `body` within the buffer, and `consumed` bytes in all.
    Complete {
        /// Body range in the buffer.
        body: std::ops::Range<usize>,
        /// Prefix plus body length.
        consumed: usize,
    },
}

/// Finds the first frame in `buf`, refusing lengths above `max`.
pub fn next_frame(buf: &[u8], max: usize) -> Result<Frame, SubmissionError> {
    let mut len: u64 = 0;
    for (index, &byte) in buf.iter().enumerate().take(10) {
        len |= u64::from(byte & 0x7f) << (7 * index);
        if byte & 0x80 == 0 {
            if len > max as u64 {
                return Err(SubmissionError::TooLarge { len, max });
            }
            let start = index + 1;
            // `len <= max`, which is a usize.
            let end = start + len as usize;
            return Ok(if buf.len() >= end {
                Frame::Complete {
                    body: start..end,
                    consumed: end,
                }
            } else {
                Frame::Incomplete
            });
        }
    }
    if buf.len() >= 10 {
        Err(SubmissionError::BadLength)
    } else {
        Ok(Frame::Incomplete)
    }
}

/// A submission as checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Submission {
    /// The tier asked for.
    pub tier: Tier,
    /// The event (a kind local applications may submit).
    pub event: Event,
    /// The client's id for it, the same on a retry.
    pub id: Option<String>,
}

/// Decodes and checks one submission body.
pub fn decode_submission(body: &[u8]) -> Result<Submission, SubmissionError> {
    let submission = LocalSubmission::decode(body)
        .map_err(|error| SubmissionError::Malformed(error.to_string()))?;
    let tier = Tier::try_from(submission.tier)
        .ok()
        .filter(|tier| edgewatch_proto::tier::index(*tier).is_some())
        .ok_or(SubmissionError::Tier)?;
    if submission.submission_id.len() > MAX_SUBMISSION_ID_BYTES {
        return Err(SubmissionError::Id(submission.submission_id.len()));
    }
    let id = (!submission.submission_id.is_empty()).then_some(submission.submission_id);
    let event = submission.event.unwrap_or_default();
    match &event.kind {
        Some(
            event::Kind::Intervention(_)
            | event::Kind::SafeStop(_)
            | event::Kind::AutonomyModeChange(_)
            | event::Kind::Custom(_)
            | event::Kind::Log(_),
        ) => Ok(Submission { tier, event, id }),
        Some(other) => Err(SubmissionError::Kind(kind_name(other))),
        None => Err(SubmissionError::Kind("none")),
    }
}

/// Encodes a length-prefixed message into `out` (appending).
pub fn encode_frame(message: &impl Message, out: &mut Vec<u8>) {
    // Encoding into a Vec cannot fail for lack of space.
    let _ = message.encode_length_delimited(out);
}

/// The reply for an accepted submission.
pub fn accepted(seq: u64) -> LocalReply {
    LocalReply {
        accepted: true,
        seq,
        error: String::new(),
    }
}

/// The reply for a refused submission.
pub fn refused(error: &impl std::fmt::Display) -> LocalReply {
    LocalReply {
        accepted: false,
        seq: 0,
        error: error.to_string(),
    }
}

/// Short name of an event kind, for messages and counters.
pub fn kind_name(kind: &event::Kind) -> &'static str {
    match kind {
        event::Kind::DeadlineCounters(_) => "deadline_counters",
        event::Kind::DeadlineMissBurst(_) => "deadline_miss_burst",
        event::Kind::SafetyFallback(_) => "safety_fallback",
        event::Kind::ProbeStatus(_) => "probe_status",
        event::Kind::ThermalSample(_) => "thermal_sample",
        event::Kind::ThrottleStarted(_) => "throttle_started",
        event::Kind::ThrottleEnded(_) => "throttle_ended",
        event::Kind::ThrottleCounters(_) => "throttle_counters",
        event::Kind::OverCurrent(_) => "over_current",
        event::Kind::EnergyCounters(_) => "energy_counters",
        event::Kind::AutonomyModeChange(_) => "autonomy_mode_change",
        event::Kind::AutonomySeconds(_) => "autonomy_seconds",
        event::Kind::Intervention(_) => "intervention",
        event::Kind::SafeStop(_) => "safe_stop",
        event::Kind::ModelVersionChange(_) => "model_version_change",
        event::Kind::QueueLoss(_) => "queue_loss",
        event::Kind::OfflineWindowLow(_) => "offline_window_low",
        event::Kind::AgentHealth(_) => "agent_health",
        event::Kind::Log(_) => "log",
        event::Kind::Custom(_) => "custom",
    }
}

/// Parses a tier name as used on the command line and in topics.
pub fn parse_tier(name: &str) -> Option<Tier> {
    edgewatch_proto::tier::from_name(name)
}

/// Parses an autonomy mode name (`autonomous`, `manual`, `teleoperated`, `idle`).
pub fn parse_mode(name: &str) -> Option<AutonomyMode> {
    match name {
        "autonomous" => Some(AutonomyMode::Autonomous),
        "manual" => Some(AutonomyMode::Manual),
        "teleoperated" => Some(AutonomyMode::Teleoperated),
        "idle" => Some(AutonomyMode::Idle),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgewatch_proto::v1::{CustomEvent, Intervention, QueueLoss};
    use proptest::prelude::*;

    fn submission(tier: Tier, kind: event::Kind) -> Vec<u8> {
        LocalSubmission {
            tier: tier as i32,
            event: Some(Event {
                kind: Some(kind),
                ..Event::default()
            }),
            ..LocalSubmission::default()
        }
        .encode_to_vec()
    }

    #[test]
    fn frames_are_found_only_when_complete() {
        let mut buf = Vec::new();
        encode_frame(&accepted(7), &mut buf);
        assert_eq!(next_frame(&buf[..1], 100), Ok(Frame::Incomplete));
        let Ok(Frame::Complete { body, consumed }) = next_frame(&buf, 100) else {
            panic!("no frame");
        };
        assert_eq!(consumed, buf.len());
        assert_eq!(LocalReply::decode(&buf[body]).unwrap().seq, 7);
        assert_eq!(next_frame(&[], 100), Ok(Frame::Incomplete));
    }

    #[test]
    fn an_oversized_length_is_refused_before_its_body_arrives() {
        let mut buf = Vec::new();
        prost::encoding::encode_varint(1_000_000, &mut buf);
        assert_eq!(
            next_frame(&buf, 64 * 1024),
            Err(SubmissionError::TooLarge {
                len: 1_000_000,
                max: 64 * 1024
            })
        );
        assert!(next_frame(&[0xff; 10], 100).unwrap_err().is_fatal());
    }

    #[test]
    fn local_kinds_are_accepted_and_agent_kinds_refused() {
        let intervention = submission(
            Tier::Safety,
            event::Kind::Intervention(Intervention::default()),
        );
        assert!(matches!(
            decode_submission(&intervention),
            Ok(Submission {
                tier: Tier::Safety,
                id: None,
                ..
            })
        ));
        let custom = submission(Tier::Debug, event::Kind::Custom(CustomEvent::default()));
        assert!(decode_submission(&custom).is_ok());
        let forged = submission(Tier::Safety, event::Kind::QueueLoss(QueueLoss::default()));
        assert_eq!(
            decode_submission(&forged).unwrap_err(),
            SubmissionError::Kind("queue_loss")
        );
        let no_tier = submission(
            Tier::Unspecified,
            event::Kind::Custom(CustomEvent::default()),
        );
        assert_eq!(
            decode_submission(&no_tier).unwrap_err(),
            SubmissionError::Tier
        );
        assert!(matches!(
            decode_submission(b"\xff\xff\xff"),
            Err(SubmissionError::Malformed(_))
        ));
    }

    #[test]
    fn a_submission_id_is_optional_and_bounded() {
        let with_id = |id: &str| {
            LocalSubmission {
                tier: Tier::Safety as i32,
                event: Some(Event {
                    kind: Some(event::Kind::Intervention(Intervention::default())),
                    ..Event::default()
                }),
                submission_id: id.to_owned(),
            }
            .encode_to_vec()
        };
        assert_eq!(
            decode_submission(&with_id("op-1")).unwrap().id.as_deref(),
            Some("op-1")
        );
        let long = "x".repeat(MAX_SUBMISSION_ID_BYTES + 1);
        assert_eq!(
            decode_submission(&with_id(&long)).unwrap_err(),
            SubmissionError::Id(MAX_SUBMISSION_ID_BYTES + 1)
        );
    }

    proptest! {
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            match next_frame(&bytes, 128) {
                Ok(Frame::Complete { body, .. }) => { let _ = decode_submission(&bytes[body]); }
                Ok(Frame::Incomplete) | Err(_) => {}
            }
        }
    }
}
