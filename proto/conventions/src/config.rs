//! The configuration convention of every program here: a raw form read by serde, a validated form
//! built from it, one error shape, one exit status.
//!
//! ```text
//! file / command line ──serde──▶ RawX ──X::from_raw──▶ X            (units in the types)
//!                                          └──────────▶ ConfigError  (names the key) ──▶ exit 64
//! ```
//!
//! - `RawX` mirrors the file (or the command line): `deny_unknown_fields`, no I/O, no checks beyond
//!   types. An optional key is an `Option`, resolved to its named default by validation.
//! - `X::from_raw(raw)` checks every value and cross-field rule and yields `X`, whose fields carry
//!   their units in their types (`Duration`, byte counts). A `RawX` may offer `validate()` as the
//!   same call spelled from the raw side.
//! - A key renamed to a better spelling still loads under its old name, to the same value: the
//!   validated form lists it as a [`RenamedKey`], the program logs a warning naming both keys, and
//!   `check-config` lists it. Giving both spellings is an error naming both.
//!
//! Invariants:
//! - [`ConfigError`] is the only type that says a configuration was refused. A program may wrap it
//!   in its own error for failures that are not about configuration (a file it cannot read), never
//!   define another.
//! - Every [`ConfigError`] names one key (a dotted path such as `uplink.keep_alive`, an entry such
//!   as `probe[0].path`, or a flag such as `--rate-hz`) and prints one way:
//!   ``[<file>: ]key `<key>`: <reason>``.
//! - A program that refuses its configuration exits with [`EXIT_BAD_CONFIG`].

use std::fmt;
use std::path::PathBuf;

/// Exit status of a program whose configuration file or command line was refused: 64, sysexits'
/// `EX_USAGE`, which the deployment tooling and the systemd units expect.
pub const EXIT_BAD_CONFIG: u8 = 64;

/// A configuration refused, naming the key at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// The key as the file or command line spells it: `uplink.keep_alive`, `probe[0].path`,
    /// `--rate-hz`; empty only when the text could not be parsed at all.
    pub key: String,
    /// What is wrong with it, e.g. `must be between 1 and 64`.
    pub reason: String,
    /// The file the key was read from, when known.
    pub file: Option<PathBuf>,
}

impl ConfigError {
    /// `key` refused for `reason`.
    pub fn new(key: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            reason: reason.into(),
            file: None,
        }
    }

    /// The same error, said of `file`.
    #[must_use]
    pub fn in_file(mut self, file: impl Into<PathBuf>) -> Self {
        self.file = Some(file.into());
        self
    }

    /// The same error, its key placed under `table` (`slos[0].period` under `slo` is
    /// `slo.slos[0].period`): for a section validated by a library that names keys relative to
    /// its own table.
    #[must_use]
    pub fn under(mut self, table: &str) -> Self {
        self.key = if self.key.is_empty() {
            table.to_owned()
        } else {
            format!("{table}.{}", self.key)
        };
        self
    }

    /// The key at fault.
    pub fn key(&self) -> &str {
        &self.key
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(file) = &self.file {
            write!(f, "{}: ", file.display())?;
        }
        write!(f, "key `{}`: {}", self.key, self.reason)
    }
}

/// A key the file spells the old way. It loads to the same value as its new spelling; the
/// program logs a warning naming both, and `check-config` lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RenamedKey {
    /// The old spelling, e.g. `uplink.keepalive_s`.
    pub old: &'static str,
    /// The spelling that replaces it, e.g. `uplink.keep_alive`.
    pub new: &'static str,
}

impl fmt::Display for RenamedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}` is deprecated: use `{}`", self.old, self.new)
    }
}

/// Refuses a setting given under both its spellings: which one the operator meant is unknown.
pub fn refuse_both_spellings(
    renamed: RenamedKey,
    new_given: bool,
    old_given: bool,
) -> Result<(), ConfigError> {
    if new_given && old_given {
        return Err(ConfigError::new(
            renamed.new,
            format!(
                "given together with its old spelling `{}`; keep only `{}`",
                renamed.old, renamed.new
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_prints_its_key_and_reason_and_its_file_when_known() {
        let error = ConfigError::new("uplink.inflight", "must be between 1 and 64");
        assert_eq!(
            error.to_string(),
            "key `uplink.inflight`: must be between 1 and 64"
        );
        assert_eq!(
            error.in_file("/etc/edgewatch/agent.toml").to_string(),
            "/etc/edgewatch/agent.toml: key `uplink.inflight`: must be between 1 and 64"
        );
    }

    #[test]
    fn a_key_placed_under_a_table_gains_its_prefix() {
        let error = ConfigError::new("slos[0].period", "is not a duration").under("slo");
        assert_eq!(error.key(), "slo.slos[0].period");
        assert_eq!(
            ConfigError::new("", "missing").under("prices").key,
            "prices"
        );
    }

    #[test]
    fn both_spellings_of_one_setting_are_refused_naming_both() {
        let renamed = RenamedKey {
            old: "uplink.keepalive_s",
            new: "uplink.keep_alive",
        };
        assert!(refuse_both_spellings(renamed, true, false).is_ok());
        assert!(refuse_both_spellings(renamed, false, true).is_ok());
        let error = refuse_both_spellings(renamed, true, true).unwrap_err();
        assert_eq!(error.key, "uplink.keep_alive");
        assert!(error.reason.contains("`uplink.keepalive_s`"), "{error}");
        assert_eq!(
            renamed.to_string(),
            "`uplink.keepalive_s` is deprecated: use `uplink.keep_alive`"
        );
    }

    #[test]
    fn the_exit_status_of_a_refused_configuration_is_64() {
        assert_eq!(EXIT_BAD_CONFIG, 64);
    }
}
