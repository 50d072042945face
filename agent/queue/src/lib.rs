//! Priority-tiered event queue on disk: safety before SLO counters before debug, nothing lost
//! silently. The on-disk format, the procedures and what a power cut can lose are described in
//! `docs/queue.md`.
//!
//! Layout:
//! - [`queue`]: [`Queue`], the I/O shell: append, flush (group commit), read in strict tier
//!   order, acknowledge, requeue, status, compaction, quarantine, and the key-value area whose
//!   entries are committed with the appends they describe.
//! - [`config`]: [`RawQueueConfig`] with named defaults, validated into [`QueueConfig`].
//! - [`record`]: the stored record (CRC32C, append time, the event with its `seq` spliced in).
//! - [`window`]: pure logic for the offline window (smoothed rates, alarm hysteresis).
//! - `wire`: checks an encoded `Event` as prost would decode it, in one pass, without allocating
//!   (one schema list generates a check per message); [`record`] uses it while it splices the
//!   sequence number in.
//! - [`status`]: [`QueueStatus`] and the snapshot file another process reads.
//! - `log`: the segmented log: per-tier segments of framed records, two state slots.
//! - `store`: the storage boundary over the log, and the migration from the old redb format;
//!   nothing else names a backend.
//!
//! Invariants:
//! - An append is reported durable only after the store has flushed it.
//! - Records leave the queue only when the broker acknowledged them (in the epoch they were read
//!   in), or by a counted eviction, expiry, corruption or dead letter, reported upstream as a
//!   `QueueLoss` event written in the same transaction as the deletion.
//! - Sequence numbers per tier never repeat within an epoch, across restarts; a store that will
//!   not open is quarantined and replaced with a new epoch, and what it held that could not be
//!   salvaged is reported lost under its own epoch.
//! - A store that cannot be opened or written for another reason (a failing or full disk) is
//!   never a reason to stop: safety appends are held in memory, the others refused and counted,
//!   and the store is retried with backoff, each time through a new handle.
//! - A staged key-value entry is committed by the next flush together with every append still
//!   waiting, so it is never durable before the appends made ahead of it: after any crash the
//!   area describes records that are durable. With [`Queue::make_room`] first, the appends made
//!   before a stage are also never durable without it.
//!
//! ```no_run
//! use std::time::SystemTime;
//! use edgewatch_proto::v1::{Event, Tier};
//! use edgewatch_queue::{BatchLimits, Queue, RawQueueConfig};
//!
//! let (mut queue, report) = Queue::open(RawQueueConfig::new("/var/lib/edgewatch/queue"), SystemTime::now())?;
//! let seq = queue.append(Tier::Safety, &Event::default(), SystemTime::now())?;
//! // On the agent's timer (≤ 10 ms while safety appends wait):
//! let outcome = queue.flush(SystemTime::now())?;
//! assert!(outcome.durable.safety >= seq);
//! if let Some(batch) = queue.next_batch(BatchLimits::default())? {
//!     let (tier, epoch, range) = (batch.tier(), batch.epoch(), batch.first_seq()..=batch.last_seq());
//!     // ... publish, await PUBACK ...
//!     queue.ack(tier, epoch, range, SystemTime::now());
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod config;
pub mod error;
mod log;
pub mod queue;
pub mod record;
pub mod status;
mod store;
pub mod window;
mod wire;

pub use config::{QueueConfig, RawQueueConfig};
pub use edgewatch_proto::tier::{PerTier, TIERS};
pub use error::{AppendError, FlushError, KvError, QueueError, ReadError};
pub use queue::{
    BatchLimits, CompactionJob, CompactionResult, FlushOutcome, OpenReport, Quarantined, Queue,
    ReadBatch, RetiredStore, StoreFault,
};
pub use status::{QueueStatus, SnapshotError, TierStatus, read_snapshot};
pub use store::LOSS_CAUSES;
