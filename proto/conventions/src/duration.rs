//! The one duration grammar of every configuration file, and the bounds of each duration key.
//!
//! A duration is a TOML string holding a whole number and one unit, nothing else:
//!
//! ```text
//! duration = digits unit
//! digits   = "0".."9", at least one
//! unit     = "ms" | "s" | "m" | "h" | "d" | "w"        (m = 60 s, h = 60 m, d = 24 h, w = 7 d)
//! ```
//!
//! `"250ms"`, `"30s"`, `"5m"`, `"24h"`, `"30d"`, `"2w"`. Refused: a bare number (`"30"`), a
//! fraction (`"1.5s"`), a sign, spaces, upper case, any other unit (`"1y"`), and compound forms
//! (`"1h30m"`): one spelling per value (`"90m"`), the single-unit form of the Prometheus windows
//! the SLO catalog renders. Zero is grammatical (`"0s"`); whether a key takes it is that key's
//! bound.
//!
//! Every duration key is a [`DurationKey`]: its name and its inclusive bounds. A value out of
//! bounds is an error naming the key and both bounds. A key that replaced an integer key of the
//! agent's older files (`uplink.keepalive_s = 30` for `uplink.keep_alive = "30s"`) says which
//! ([`DurationKey::replacing`]); [`DurationKey::resolve`] takes either spelling, with the rules of
//! [`crate::config`].
//!
//! Invariants:
//! - [`parse`] is the only parser of durations in configuration files: the agent, the gateway and
//!   the SLO catalog read every duration key through a [`DurationKey`].
//! - `parse(&format(d)) == Ok(d)` for every duration of whole milliseconds.
//! - Values are checked against their bounds whichever spelling gave them.

use std::time::Duration;

use crate::config::{ConfigError, RenamedKey, refuse_both_spellings};

/// The units, largest first, with their length in milliseconds.
pub const UNITS: [(&str, u64); 6] = [
    ("w", 7 * 86_400_000),
    ("d", 86_400_000),
    ("h", 3_600_000),
    ("m", 60_000),
    ("s", 1_000),
    ("ms", 1),
];

/// Why a text is not a duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// Only digits (or nothing): the unit is missing.
    #[error("`{text}` has no unit (use ms, s, m, h, d or w)")]
    MissingUnit {
        /// The text given.
        text: String,
    },
    /// The text does not start with a digit.
    #[error("`{text}` does not start with a whole number")]
    MissingNumber {
        /// The text given.
        text: String,
    },
    /// What follows the number is not one of the units (a second unit, a fraction, a space).
    #[error("`{text}`: `{unit}` is not a unit (use one of ms, s, m, h, d or w, e.g. `90m`)")]
    UnknownUnit {
        /// The text given.
        text: String,
        /// What follows the number.
        unit: String,
    },
    /// More milliseconds than fit in 64 bits.
    #[error("`{text}` is too large")]
    TooLarge {
        /// The text given.
        text: String,
    },
}

/// Parses `text` by the grammar above.
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = text.split_at(digits);
    if unit.is_empty() {
        return Err(DurationError::MissingUnit {
            text: text.to_owned(),
        });
    }
    if number.is_empty() {
        return Err(DurationError::MissingNumber {
            text: text.to_owned(),
        });
    }
    let Some((_, unit_ms)) = UNITS.iter().find(|(name, _)| *name == unit) else {
        return Err(DurationError::UnknownUnit {
            text: text.to_owned(),
            unit: unit.to_owned(),
        });
    };
    let too_large = || DurationError::TooLarge {
        text: text.to_owned(),
    };
    let number: u64 = number.parse().map_err(|_| too_large())?;
    number
        .checked_mul(*unit_ms)
        .map(Duration::from_millis)
        .ok_or_else(too_large)
}

/// The shortest spelling of `duration` in the grammar (`3600s` is `1h`, zero is `0s`); a part
/// below one millisecond is dropped.
pub fn format(duration: Duration) -> String {
    let ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
    if ms == 0 {
        return "0s".to_owned();
    }
    let (name, unit_ms) = UNITS
        .iter()
        .find(|(_, unit_ms)| ms % unit_ms == 0)
        .copied()
        .unwrap_or(("ms", 1));
    format!("{}{name}", ms / unit_ms)
}

/// The unit of an integer key that a duration key replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntegerUnit {
    /// `_ms` keys.
    Milliseconds,
    /// `_s` keys.
    Seconds,
}

impl IntegerUnit {
    /// `count` of this unit.
    pub fn times(self, count: u64) -> Duration {
        match self {
            Self::Milliseconds => Duration::from_millis(count),
            Self::Seconds => Duration::from_secs(count),
        }
    }
}

/// The integer key a duration key replaced, e.g. `uplink.keepalive_s` in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntegerKey {
    /// Its name, as files wrote it.
    pub name: &'static str,
    /// The unit of its number.
    pub unit: IntegerUnit,
}

/// A value and the key it was given under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Given {
    /// The value.
    pub value: Duration,
    /// The key as the file spells it: the duration key, or the integer key it replaced. Errors of
    /// later cross-field checks name this one.
    pub key: &'static str,
}

/// One duration key of a configuration file: its name and inclusive bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurationKey {
    /// The key, e.g. `uplink.keep_alive`; for keys inside arrays of tables, a pattern such as
    /// `slos[].period` (errors name the entry, see [`DurationKey::parse_at`]).
    pub name: &'static str,
    /// Shortest value accepted.
    pub min: Duration,
    /// Longest value accepted.
    pub max: Duration,
    /// The integer key this one replaced, which still loads.
    pub replaces: Option<IntegerKey>,
}

impl DurationKey {
    /// A key accepting `min..=max`.
    pub const fn new(name: &'static str, min: Duration, max: Duration) -> Self {
        Self {
            name,
            min,
            max,
            replaces: None,
        }
    }

    /// The same key, replacing the integer key `old` counted in `unit`.
    pub const fn replacing(self, old: &'static str, unit: IntegerUnit) -> Self {
        Self {
            replaces: Some(IntegerKey { name: old, unit }),
            ..self
        }
    }

    /// The renaming this key stands for, if it replaced an integer key.
    pub fn renamed(&self) -> Option<RenamedKey> {
        self.replaces.map(|old| RenamedKey {
            old: old.name,
            new: self.name,
        })
    }

    /// `text` parsed and checked against the bounds; errors name this key.
    pub fn parse(&self, text: &str) -> Result<Duration, ConfigError> {
        self.parse_at(self.name, text)
    }

    /// `text` parsed and checked against the bounds; errors name `key` (an entry of an array of
    /// tables, `slos[2].period` for `slos[].period`).
    pub fn parse_at(&self, key: &str, text: &str) -> Result<Duration, ConfigError> {
        let value = parse(text).map_err(|error| ConfigError::new(key, error.to_string()))?;
        self.check_at(key, value)
    }

    /// `value` checked against the bounds; errors name `key`.
    pub fn check_at(&self, key: &str, value: Duration) -> Result<Duration, ConfigError> {
        if value < self.min || value > self.max {
            return Err(ConfigError::new(
                key,
                format!(
                    "must be from {} to {}, not {}",
                    format(self.min),
                    format(self.max),
                    format(value)
                ),
            ));
        }
        Ok(value)
    }

    /// The setting given as a duration string under this key or, in an older file, as an integer
    /// under the key it replaced; `None` when neither is given (the caller applies the default).
    /// Both spellings at once are an error naming both; either is checked against the bounds,
    /// and errors name the key the file used. `integer` is ignored by a key that replaced none.
    pub fn resolve(
        &self,
        text: Option<&str>,
        integer: Option<u64>,
    ) -> Result<Option<Given>, ConfigError> {
        let old = self.replaces.zip(integer);
        if let Some(renamed) = self.renamed() {
            refuse_both_spellings(renamed, text.is_some(), old.is_some())?;
        }
        if let Some(text) = text {
            let value = self.parse(text)?;
            return Ok(Some(Given {
                value,
                key: self.name,
            }));
        }
        match old {
            Some((old, count)) => {
                let value = self.check_at(old.name, old.unit.times(count))?;
                Ok(Some(Given {
                    value,
                    key: old.name,
                }))
            }
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEEP_ALIVE: DurationKey = DurationKey::new(
        "uplink.keep_alive",
        Duration::from_secs(5),
        Duration::from_secs(65_535),
    )
    .replacing("uplink.keepalive_s", IntegerUnit::Seconds);

    #[test]
    fn every_unit_parses_to_its_length() {
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse("30d"), Ok(Duration::from_secs(30 * 86_400)));
        assert_eq!(parse("2w"), Ok(Duration::from_secs(14 * 86_400)));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
        assert_eq!(parse("0ms"), Ok(Duration::ZERO));
    }

    #[test]
    fn anything_but_a_whole_number_and_one_unit_is_refused() {
        for bad in [
            "", "30", "s", "ms", "1h30m", "1.5s", "-5m", "+5m", "5 m", " 5m", "5m ", "1y", "5S",
            "5M", "5sec", "0x10s", "5mss",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        assert!(matches!(
            parse("30"),
            Err(DurationError::MissingUnit { .. })
        ));
        assert!(matches!(
            parse("1h30m"),
            Err(DurationError::UnknownUnit { .. })
        ));
        assert!(matches!(
            parse("99999999999999999999s"),
            Err(DurationError::TooLarge { .. })
        ));
        assert!(matches!(
            parse("18446744073709551615w"),
            Err(DurationError::TooLarge { .. })
        ));
    }

    #[test]
    fn format_gives_the_shortest_spelling_and_parses_back() {
        assert_eq!(format(Duration::from_secs(3_600)), "1h");
        assert_eq!(format(Duration::from_secs(90 * 60)), "90m");
        assert_eq!(format(Duration::from_secs(14 * 86_400)), "2w");
        assert_eq!(format(Duration::from_millis(1_500)), "1500ms");
        assert_eq!(format(Duration::from_secs(65_535)), "65535s");
        assert_eq!(format(Duration::ZERO), "0s");
        for ms in [1, 999, 1_000, 60_000, 86_400_000, 604_800_000, 123_456_789] {
            let d = Duration::from_millis(ms);
            assert_eq!(parse(&format(d)), Ok(d), "{ms} ms");
        }
    }

    #[test]
    fn a_value_out_of_bounds_is_refused_naming_the_key_and_both_bounds() {
        assert_eq!(KEEP_ALIVE.parse("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(KEEP_ALIVE.parse("65535s"), Ok(Duration::from_secs(65_535)));
        let error = KEEP_ALIVE.parse("4999ms").unwrap_err();
        assert_eq!(error.key, "uplink.keep_alive");
        assert_eq!(error.reason, "must be from 5s to 65535s, not 4999ms");
        assert_eq!(
            KEEP_ALIVE.parse("65536s").unwrap_err().key,
            "uplink.keep_alive"
        );
        let error = KEEP_ALIVE.parse("30").unwrap_err();
        assert_eq!(error.key, "uplink.keep_alive");
        assert!(error.reason.contains("no unit"), "{error}");
        assert_eq!(
            KEEP_ALIVE.parse_at("probe[2].x", "1s").unwrap_err().key,
            "probe[2].x"
        );
    }

    #[test]
    fn either_spelling_resolves_to_the_same_value_and_both_are_refused() {
        let new = KEEP_ALIVE.resolve(Some("30s"), None).unwrap().unwrap();
        let old = KEEP_ALIVE.resolve(None, Some(30)).unwrap().unwrap();
        assert_eq!(new.value, old.value);
        assert_eq!(new.key, "uplink.keep_alive");
        assert_eq!(old.key, "uplink.keepalive_s");
        assert_eq!(KEEP_ALIVE.resolve(None, None), Ok(None));
        assert_eq!(
            KEEP_ALIVE.resolve(None, Some(2)).unwrap_err().key,
            "uplink.keepalive_s"
        );
        let both = KEEP_ALIVE.resolve(Some("30s"), Some(30)).unwrap_err();
        assert_eq!(both.key, "uplink.keep_alive");
        assert!(both.reason.contains("uplink.keepalive_s"), "{both}");
        assert_eq!(
            KEEP_ALIVE.renamed(),
            Some(RenamedKey {
                old: "uplink.keepalive_s",
                new: "uplink.keep_alive"
            })
        );
    }

    #[test]
    fn integer_units_count_seconds_or_milliseconds() {
        assert_eq!(IntegerUnit::Seconds.times(3), Duration::from_secs(3));
        assert_eq!(IntegerUnit::Milliseconds.times(3), Duration::from_millis(3));
    }
}
