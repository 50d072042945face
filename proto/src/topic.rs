//! MQTT topic names and the identity rules for machine and site ids.
//!
//! Topics: `edgewatch/v1/<site>/<machine>/<tier>` with the tier's name (`safety`, `slo` or
//! `debug`, from [`crate::tier::name`]) for batches, and `edgewatch/v1/<site>/<machine>/status`
//! for the retained online/offline status.
//!
//! Invariants:
//! - An id is 1 to [`MAX_ID_LEN`] bytes of `[A-Za-z0-9._-]`, not `.` or `..`: it can never carry an
//!   MQTT wildcard or level separator, so a topic built from valid ids parses back to the same ids.

use crate::tier;
use crate::v1::Tier;

/// First two levels of every edgewatch topic.
pub const TOPIC_PREFIX: &str = "edgewatch/v1";

/// Longest machine or site id accepted (bytes).
pub const MAX_ID_LEN: usize = 64;

/// Filter that matches every batch and status topic of every machine.
pub const ALL_MACHINES_FILTER: &str = "edgewatch/v1/+/+/+";

/// Last topic level of the retained status topic.
pub const STATUS_SEGMENT: &str = "status";

/// Why a machine or site id was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// The id is empty.
    #[error("the id is empty")]
    Empty,
    /// The id is longer than [`MAX_ID_LEN`] bytes.
    #[error("the id is {len} bytes long; at most {MAX_ID_LEN} are allowed")]
    TooLong {
        /// Length found.
        len: usize,
    },
    /// The id holds a character outside `[A-Za-z0-9._-]`.
    #[error("the id holds {found:?}; only letters, digits, '.', '_' and '-' are allowed")]
    BadCharacter {
        /// The first offending character.
        found: char,
    },
    /// The id is `.` or `..`.
    #[error("the id may not be '.' or '..'")]
    DotName,
}

/// Why a topic name is not an edgewatch topic.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopicError {
    /// The topic does not start with [`TOPIC_PREFIX`] or has the wrong number of levels.
    #[error("not an edgewatch/v1/<site>/<machine>/<tier|status> topic")]
    Shape,
    /// The last level is neither a tier nor `status`.
    #[error("unknown last topic level {0:?}; expected safety, slo, debug or status")]
    UnknownKind(String),
    /// The site level is not a valid id.
    #[error("bad site id in topic: {0}")]
    Site(IdError),
    /// The machine level is not a valid id.
    #[error("bad machine id in topic: {0}")]
    Machine(IdError),
}

/// What a topic carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopicKind {
    /// Batches of one tier.
    Batch(Tier),
    /// The retained online/offline status.
    Status,
}

/// The identity a topic claims.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopicIdentity<'a> {
    /// Site id from the topic.
    pub site: &'a str,
    /// Machine id from the topic.
    pub machine: &'a str,
    /// Batch tier or status.
    pub kind: TopicKind,
}

/// The bytes an id may hold: ASCII letters and digits, `.`, `_` and `-` (a table: the check runs
/// for every label value of every event the gateway ingests).
const ID_BYTES: [bool; 256] = {
    let mut allowed = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        allowed[b] = c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-');
        b += 1;
    }
    allowed
};

/// Checks a machine or site id.
pub fn validate_id(id: &str) -> Result<(), IdError> {
    if id.is_empty() {
        return Err(IdError::Empty);
    }
    if id.len() > MAX_ID_LEN {
        return Err(IdError::TooLong { len: id.len() });
    }
    // Every allowed character is one ASCII byte: the first byte not allowed starts the first
    // character not allowed.
    if let Some(at) = id.bytes().position(|b| !ID_BYTES[usize::from(b)]) {
        let found = id[at..]
            .chars()
            .next()
            .unwrap_or(char::REPLACEMENT_CHARACTER);
        return Err(IdError::BadCharacter { found });
    }
    if id == "." || id == ".." {
        return Err(IdError::DotName);
    }
    Ok(())
}

/// `edgewatch/v1/<site>/<machine>/<tier>`; the ids must be valid (see [`validate_id`]); `None`
/// for `Tier::Unspecified`.
pub fn batch_topic(site: &str, machine: &str, tier: Tier) -> Option<String> {
    let segment = tier::name(tier)?;
    Some(format!("{TOPIC_PREFIX}/{site}/{machine}/{segment}"))
}

/// `edgewatch/v1/<site>/<machine>/status`.
pub fn status_topic(site: &str, machine: &str) -> String {
    format!("{TOPIC_PREFIX}/{site}/{machine}/{STATUS_SEGMENT}")
}

/// Parses an edgewatch topic name into the identity it claims.
pub fn parse_topic(topic: &str) -> Result<TopicIdentity<'_>, TopicError> {
    let rest = topic
        .strip_prefix(TOPIC_PREFIX)
        .and_then(|rest| rest.strip_prefix('/'))
        .ok_or(TopicError::Shape)?;
    let mut levels = rest.split('/');
    let (Some(site), Some(machine), Some(last), None) =
        (levels.next(), levels.next(), levels.next(), levels.next())
    else {
        return Err(TopicError::Shape);
    };
    validate_id(site).map_err(TopicError::Site)?;
    validate_id(machine).map_err(TopicError::Machine)?;
    let kind = if last == STATUS_SEGMENT {
        TopicKind::Status
    } else {
        TopicKind::Batch(
            tier::from_name(last).ok_or_else(|| TopicError::UnknownKind(last.to_owned()))?,
        )
    };
    Ok(TopicIdentity {
        site,
        machine,
        kind,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn batch_topics_parse_back_to_their_identity() {
        for tier in [Tier::Safety, Tier::Slo, Tier::Debug] {
            let topic = batch_topic("pit-3", "truck-17", tier).unwrap();
            let id = parse_topic(&topic).unwrap();
            assert_eq!(id.site, "pit-3");
            assert_eq!(id.machine, "truck-17");
            assert_eq!(id.kind, TopicKind::Batch(tier));
        }
        assert_eq!(
            parse_topic(&status_topic("pit-3", "truck-17"))
                .unwrap()
                .kind,
            TopicKind::Status
        );
    }

    #[test]
    fn unspecified_tier_has_no_topic() {
        assert_eq!(batch_topic("s", "m", Tier::Unspecified), None);
    }

    #[test]
    fn topics_of_the_wrong_shape_are_refused() {
        for bad in [
            "",
            "edgewatch/v1",
            "edgewatch/v1/site/machine",
            "edgewatch/v2/site/machine/slo",
            "edgewatch/v1/site/machine/slo/extra",
            "edgewatch/v1//machine/slo",
            "edgewatch/v1/site/+/slo",
            "edgewatch/v1/site/#/slo",
        ] {
            assert!(parse_topic(bad).is_err(), "{bad:?} was accepted");
        }
        assert_eq!(
            parse_topic("edgewatch/v1/s/m/telemetry"),
            Err(TopicError::UnknownKind("telemetry".into()))
        );
    }

    #[test]
    fn ids_with_wildcards_separators_or_dots_are_refused() {
        assert_eq!(validate_id(""), Err(IdError::Empty));
        assert_eq!(
            validate_id("a/b"),
            Err(IdError::BadCharacter { found: '/' })
        );
        assert_eq!(validate_id("+"), Err(IdError::BadCharacter { found: '+' }));
        assert_eq!(validate_id("#"), Err(IdError::BadCharacter { found: '#' }));
        assert_eq!(validate_id("é"), Err(IdError::BadCharacter { found: 'é' }));
        assert_eq!(validate_id(".."), Err(IdError::DotName));
        assert_eq!(
            validate_id(&"a".repeat(65)),
            Err(IdError::TooLong { len: 65 })
        );
        assert_eq!(validate_id(&"a".repeat(64)), Ok(()));
    }

    proptest! {
        #[test]
        fn any_valid_ids_round_trip_through_a_topic(
            site in "[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}",
            machine in "[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}",
        ) {
            let topic = batch_topic(&site, &machine, Tier::Debug).unwrap();
            let id = parse_topic(&topic).unwrap();
            prop_assert_eq!(id.site, site.as_str());
            prop_assert_eq!(id.machine, machine.as_str());
        }

        #[test]
        fn an_id_is_refused_for_its_first_character_outside_the_allowed_set(
            id in "[A-Za-z0-9._/é+#-]{0,70}|\\PC{0,20}",
        ) {
            let first_bad = id
                .chars()
                .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')));
            let expected = if id.is_empty() {
                Err(IdError::Empty)
            } else if id.len() > MAX_ID_LEN {
                Err(IdError::TooLong { len: id.len() })
            } else if let Some(found) = first_bad {
                Err(IdError::BadCharacter { found })
            } else if id == "." || id == ".." {
                Err(IdError::DotName)
            } else {
                Ok(())
            };
            prop_assert_eq!(validate_id(&id), expected);
        }

        #[test]
        fn parsing_any_string_never_panics(topic in "\\PC{0,80}") {
            let _ = parse_topic(&topic);
        }
    }
}
