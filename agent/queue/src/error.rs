//! Errors at the queue's boundary: opening, appending, flushing, reading.
//!
//! Invariants:
//! - Every variant names what happened; none is returned for a condition the queue handled by
//!   itself (a corrupt record, a quarantined store), which are reported as counted losses instead.
//! - An error that leaves something with the caller hands it back (refused sequence ranges).

use std::path::PathBuf;

use edgewatch_conventions::config::ConfigError;
use edgewatch_proto::tier::PerTier;

use crate::record::MalformedEvent;

/// The queue could not be opened. Corruption never ends here: a store that will not open is
/// quarantined and a fresh one started.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// A configuration field was refused.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Another process (another agent) has the queue open.
    #[error("queue at {0} is open in another process")]
    AlreadyOpen(PathBuf),
    /// The queue directory or a file in it could not be created, moved or read.
    #[error("queue directory operation on {path} failed: {source}")]
    Directory {
        /// The file or directory involved.
        path: PathBuf,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// The store could not be read or written for a reason other than corruption (a full or
    /// failing disk); retrying later may succeed.
    #[error("queue store at {path} is unavailable: {reason}")]
    StoreUnavailable {
        /// The database file.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
}

/// An append was refused. Refusals of valid events are counted as losses.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AppendError {
    /// The tier was `Tier::Unspecified`.
    #[error("an event needs a tier")]
    NoTier,
    /// The encoded event is larger than `max_record_bytes`.
    #[error("event of {len} bytes exceeds the {max}-byte record limit")]
    TooLarge {
        /// Encoded size.
        len: usize,
        /// The configured limit.
        max: u32,
    },
    /// The bytes handed in are not a sequence of protobuf fields.
    #[error(transparent)]
    Malformed(#[from] MalformedEvent),
    /// The bytes handed in are protobuf but do not decode as an `Event`.
    #[error("bytes do not decode as an edgewatch.v1 Event")]
    NotAnEvent,
    /// The store cannot be written (disk full or failing): SLO and debug events are refused and
    /// counted as `DiskFull` losses until a flush succeeds again.
    #[error("store is unavailable; SLO and debug events are refused")]
    StoreUnavailable,
    /// The store cannot be written and the in-memory safety buffer is full: counted as a
    /// `BufferOverflow` loss.
    #[error("store is unavailable and the safety hold buffer is full")]
    HoldFull,
}

/// A flush could not commit. The queue has already acted: SLO and debug appends of the failed
/// flush are dropped and counted (`refused`), safety appends are held in memory, and the store is
/// reopened on a later flush.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("flush failed ({reason}); {held_safety} safety events held in memory")]
pub struct FlushError {
    /// What failed.
    pub reason: String,
    /// Sequence ranges (inclusive) dropped by this failure, per tier: awaiting callers must stop
    /// waiting for them.
    pub refused: PerTier<Option<(u64, u64)>>,
    /// Safety events waiting in memory for the store to come back.
    pub held_safety: usize,
}

/// Reading a batch failed. The queue marks the store for repair at the next flush.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("reading the queue failed: {reason}")]
pub struct ReadError {
    /// What failed.
    pub reason: String,
}

/// An entry of the key-value area was refused; nothing was staged.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KvError {
    /// The key is empty or longer than [`crate::config::MAX_KV_KEY_BYTES`].
    #[error("a key-value key must be 1 to {max} bytes, not {len}")]
    BadKey {
        /// The key's length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The value is longer than [`crate::config::MAX_KV_VALUE_BYTES`].
    #[error("a key-value value must be at most {max} bytes, not {len}")]
    TooLarge {
        /// The value's length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The area already holds [`crate::config::MAX_KV_KEYS`] keys and this one is new.
    #[error("the key-value area holds its maximum of {max} keys")]
    TooManyKeys {
        /// The limit.
        max: usize,
    },
}
