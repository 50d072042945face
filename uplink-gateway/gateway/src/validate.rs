//! Validation of one MQTT message: the topic's claimed identity, then the payload (framing limits,
//! schema version, structure), then identity agreement between topic and payload. Pure: no I/O, no
//! clock.
//!
//! Invariants:
//! - No input makes validation panic, and nothing is decoded past the limits of
//!   `edgewatch_proto::framing` (a status payload is bounded by [`MAX_STATUS_BYTES`]).
//! - A message is accepted only if the topic's site and machine equal the payload's `site_id` and
//!   `machine_id`, and a batch's tier equals the topic's tier: with a per-machine broker ACL on
//!   topics, this ties the payload to the certificate that published it.
//! - Every refusal is a [`Rejection`] with a stable [`Rejection::reason`] used as a metric label.

use edgewatch_proto::framing::{BatchDecoder, DecodeError};
use edgewatch_proto::topic::{TopicError, TopicKind, parse_topic};
use edgewatch_proto::v1::{Batch, MachineStatus};
use edgewatch_proto::{SCHEMA_VERSION, topic};
use prost::Message as _;

/// Largest status payload accepted (a `MachineStatus` is a few dozen bytes).
pub const MAX_STATUS_BYTES: usize = 4096;

/// A message that passed validation.
#[derive(Debug, Clone, PartialEq)]
pub enum Valid {
    /// A batch of events, decoded into the caller's batch (see [`validate`]).
    Batch,
    /// A machine's online/offline status.
    Status(MachineStatus),
}

/// Why a message was refused.
#[derive(Debug, thiserror::Error)]
pub enum Rejection {
    /// The topic is not an `edgewatch/v1/<site>/<machine>/<tier|status>` topic.
    #[error("bad topic: {0}")]
    Topic(#[from] TopicError),
    /// The batch payload failed framing, decoding or structural checks.
    #[error("bad batch: {0}")]
    Batch(#[from] DecodeError),
    /// The status payload is too large or not a valid `MachineStatus`.
    #[error("bad status: {0}")]
    Status(String),
    /// The topic's site or machine differs from the payload's.
    #[error("topic names {topic_site}/{topic_machine} but the payload is from {site}/{machine}")]
    IdentityMismatch {
        /// Site level of the topic.
        topic_site: String,
        /// Machine level of the topic.
        topic_machine: String,
        /// `site_id` of the payload.
        site: String,
        /// `machine_id` of the payload.
        machine: String,
    },
    /// The topic's tier differs from the batch's tier.
    #[error("topic tier differs from the batch's tier {batch_tier}")]
    TierMismatch {
        /// `tier` of the batch.
        batch_tier: i32,
    },
}

impl Rejection {
    /// Stable, low-cardinality reason (metric label and dead-letter reason code).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Topic(_) => "bad_topic",
            Self::Batch(DecodeError::CompressedTooLarge { .. })
            | Self::Batch(DecodeError::DecompressedTooLarge { .. })
            | Self::Batch(DecodeError::TooManyEvents)
            | Self::Batch(DecodeError::TooManyFields) => "too_large",
            Self::Batch(DecodeError::UnsupportedSchema { .. }) => "schema_version",
            Self::Batch(DecodeError::Malformed(_)) => "malformed",
            Self::Batch(_) => "undecodable",
            Self::Status(_) => "bad_status",
            Self::IdentityMismatch { .. } => "identity_mismatch",
            Self::TierMismatch { .. } => "tier_mismatch",
        }
    }

    /// Every reason [`Rejection::reason`] can return (for metric exposition).
    pub const REASONS: [&'static str; 8] = [
        "bad_topic",
        "too_large",
        "schema_version",
        "malformed",
        "undecodable",
        "bad_status",
        "identity_mismatch",
        "tier_mismatch",
    ];
}

/// Validates one message received on `topic_name`. A batch is decoded into `batch`, over the
/// batch decoded there before ([`BatchDecoder::decode_into`]: its strings and lists are reused);
/// after anything but [`Valid::Batch`], `batch` holds nothing of use.
pub fn validate(
    topic_name: &str,
    payload: &[u8],
    decoder: &mut BatchDecoder,
    batch: &mut Batch,
) -> Result<Valid, Rejection> {
    let claimed = parse_topic(topic_name)?;
    let mismatch = |site: &str, machine: &str| Rejection::IdentityMismatch {
        topic_site: claimed.site.to_owned(),
        topic_machine: claimed.machine.to_owned(),
        site: site.chars().take(topic::MAX_ID_LEN).collect(),
        machine: machine.chars().take(topic::MAX_ID_LEN).collect(),
    };
    match claimed.kind {
        TopicKind::Batch(tier) => {
            decoder.decode_into(payload, batch)?;
            if batch.site_id != claimed.site || batch.machine_id != claimed.machine {
                return Err(mismatch(&batch.site_id, &batch.machine_id));
            }
            if batch.tier != tier as i32 {
                return Err(Rejection::TierMismatch {
                    batch_tier: batch.tier,
                });
            }
            Ok(Valid::Batch)
        }
        TopicKind::Status => {
            if payload.len() > MAX_STATUS_BYTES {
                return Err(Rejection::Status(format!(
                    "{} bytes; at most {MAX_STATUS_BYTES} are allowed",
                    payload.len()
                )));
            }
            let status = MachineStatus::decode(payload)
                .map_err(|error| Rejection::Status(error.to_string()))?;
            if status.schema_version != SCHEMA_VERSION {
                return Err(Rejection::Status(format!(
                    "schema version {} is not {SCHEMA_VERSION}",
                    status.schema_version
                )));
            }
            if status.site_id != claimed.site || status.machine_id != claimed.machine {
                return Err(mismatch(&status.site_id, &status.machine_id));
            }
            Ok(Valid::Status(status))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgewatch_proto::framing::encode_batch;
    use edgewatch_proto::v1::{CustomEvent, Event, Tier, event};

    fn batch(machine: &str, tier: Tier) -> Batch {
        Batch {
            schema_version: 1,
            machine_id: machine.into(),
            site_id: "pit-3".into(),
            agent_epoch: 1,
            tier: tier as i32,
            first_seq: 1,
            last_seq: 1,
            sent_time_unix_ns: 1,
            events: vec![Event {
                seq: 1,
                event_time_unix_ns: 1,
                monotonic_ns: 1,
                kind: Some(event::Kind::Custom(CustomEvent::default())),
            }],
            machine_class: String::new(),
            agent_version: String::new(),
        }
    }

    #[test]
    fn a_batch_published_under_another_machines_topic_is_refused() {
        let mut decoder = BatchDecoder::new().unwrap();
        let payload = encode_batch(&batch("truck-18", Tier::Slo)).unwrap();
        let error = validate(
            "edgewatch/v1/pit-3/truck-17/slo",
            &payload,
            &mut decoder,
            &mut Batch::default(),
        )
        .unwrap_err();
        assert_eq!(error.reason(), "identity_mismatch");
        assert!(
            validate(
                "edgewatch/v1/pit-3/truck-18/slo",
                &payload,
                &mut decoder,
                &mut Batch::default()
            )
            .is_ok(),
            "the matching topic is accepted"
        );
    }

    #[test]
    fn a_batch_on_the_wrong_tier_topic_is_refused() {
        let mut decoder = BatchDecoder::new().unwrap();
        let payload = encode_batch(&batch("truck-17", Tier::Debug)).unwrap();
        let error = validate(
            "edgewatch/v1/pit-3/truck-17/safety",
            &payload,
            &mut decoder,
            &mut Batch::default(),
        )
        .unwrap_err();
        assert_eq!(error.reason(), "tier_mismatch");
    }

    #[test]
    fn garbage_and_bad_topics_get_distinct_reasons() {
        let mut decoder = BatchDecoder::new().unwrap();
        assert_eq!(
            validate(
                "edgewatch/v1/pit-3/truck-17/slo",
                b"hello",
                &mut decoder,
                &mut Batch::default()
            )
            .unwrap_err()
            .reason(),
            "undecodable"
        );
        assert_eq!(
            validate("other/topic", b"hello", &mut decoder, &mut Batch::default())
                .unwrap_err()
                .reason(),
            "bad_topic"
        );
        assert_eq!(
            validate(
                "edgewatch/v1/pit-3/truck-17/status",
                &[0xff; 10],
                &mut decoder,
                &mut Batch::default()
            )
            .unwrap_err()
            .reason(),
            "bad_status"
        );
    }

    #[test]
    fn a_status_must_name_its_topics_machine() {
        let mut decoder = BatchDecoder::new().unwrap();
        let status = MachineStatus {
            schema_version: 1,
            machine_id: "truck-17".into(),
            site_id: "pit-3".into(),
            online: true,
            time_unix_ns: 5,
            ..Default::default()
        };
        let payload = status.encode_to_vec();
        assert_eq!(
            validate(
                "edgewatch/v1/pit-3/truck-17/status",
                &payload,
                &mut decoder,
                &mut Batch::default()
            )
            .unwrap(),
            Valid::Status(status)
        );
        assert_eq!(
            validate(
                "edgewatch/v1/pit-4/truck-17/status",
                &payload,
                &mut decoder,
                &mut Batch::default()
            )
            .unwrap_err()
            .reason(),
            "identity_mismatch"
        );
    }
}
