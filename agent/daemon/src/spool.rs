//! The spool: the one handle on the queue that every task of the runtime holds, the group-commit
//! flusher, the samplers' sink, and the one signal that records became durable.
//!
//! ```text
//! ingest, samplers, health ─ append ─► Spool ─► queue (pending) ─ wake ─► Flusher: flush when due
//!                                                                            │ durable seqs (watch)
//!   local-socket waiters (Spool::wait_durable) ◄─────────────────────────────┤
//!   drain (DurableChanges::changed) ◄────────────────────────────────────────┘
//! ```
//!
//! Invariants:
//! - The queue is shared by reference on the runtime's one thread, never locked: every borrow
//!   ends before the task holding it awaits, so no task finds the queue borrowed.
//! - One signal says that records are durable: the durable sequence numbers the flusher publishes
//!   after each flush. It is raised when a flush committed or moved a durable number; local-socket
//!   waiters wait on its value and the drain wakes on its changes.
//! - When to flush is the queue's decision (`next_flush_at`, `flush_due`: its group-commit
//!   intervals, and while its store is unavailable the next reopen attempt); a failed flush is
//!   logged and retried when the queue says, at the earliest 100 ms later.
//! - A waiter is answered durable only for a number of the epoch it was given in: a quarantine
//!   (new epoch) or an unavailable store ends the wait with the reason ([`NotDurable`]); a failed
//!   flush raises the signal so that waiters look.
//! - What samplers keep across restarts goes into the queue's key-value area, staged after the
//!   events it describes, so it is durable with them; a sampling pass makes room first
//!   ([`SamplerSink::make_room`]), so no flush of a full buffer falls between the two.

use std::cell::{Ref, RefCell, RefMut};
use std::rc::Rc;
use std::time::Duration;

use edgewatch_proto::tier;
use edgewatch_proto::v1::{Event, Tier};
use edgewatch_queue::{AppendError, PerTier, Queue};
use edgewatch_samplers::EventSink;
use tokio::sync::{Notify, watch};

use crate::clock;

/// Durable sequence numbers per tier, as of the last flush.
type DurableSeqs = PerTier<u64>;

/// Why a waiter's event is not confirmed durable under the number it was given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotDurable {
    /// The store cannot be written: the event is held in memory (safety) until it can.
    #[error(
        "not durable: the queue store is unavailable ({reason}); the event is held in memory \
         and written when the store is back"
    )]
    Unavailable {
        /// What failed.
        reason: String,
    },
    /// The store was damaged and replaced while the event waited: its number is void (the
    /// new epoch gives the same numbers to other records).
    #[error(
        "the queue store was quarantined while this event waited (epoch {old:016x} replaced by \
         {new:016x}): the number it was given is void"
    )]
    Quarantined {
        /// The epoch the number was given in.
        old: u64,
        /// The epoch now.
        new: u64,
    },
    /// The store was unavailable when the event arrived and opened since: the event was held,
    /// then written under a number of the store's epoch.
    #[error(
        "the queue store was unavailable when this event arrived; it was held in memory and \
         has since been written in epoch {new:016x}, under a number this reply cannot give"
    )]
    HeldThenWritten {
        /// The store's epoch.
        new: u64,
    },
    /// The flusher stopped (the agent is stopping) before the event was durable.
    #[error("the agent stopped before this event was durable")]
    Stopped,
}

/// The queue and its durable signal, shared by the tasks of the runtime (cloning shares).
#[derive(Clone)]
pub struct Spool {
    /// The queue itself.
    queue: Rc<RefCell<Queue>>,
    /// Wakes the flusher after an append.
    appended: Rc<Notify>,
    /// Durable sequence numbers, published by the [`Flusher`].
    durable: watch::Receiver<DurableSeqs>,
}

impl Spool {
    /// Shares `queue`, and returns the flusher that must run beside the handle for appends to
    /// become durable.
    pub fn new(queue: Queue) -> (Self, Flusher) {
        let (durable_tx, durable_rx) = watch::channel(durable_seqs(&queue));
        let spool = Self {
            queue: Rc::new(RefCell::new(queue)),
            appended: Rc::new(Notify::new()),
            durable: durable_rx,
        };
        let flusher = Flusher {
            spool: spool.clone(),
            durable: durable_tx,
        };
        (spool, flusher)
    }

    /// Appends an event and wakes the flusher. Errors are logged and counted by the queue.
    pub fn append(&self, tier: Tier, event: &Event) -> Result<u64, AppendError> {
        let result = self.queue.borrow_mut().append(tier, event, clock::wall());
        self.appended.notify_one();
        result
    }

    /// Waits until `seq` of `tier`, given in queue epoch `epoch`, is durable, or cannot become
    /// durable under that number now (see [`Spool::confirm`]).
    pub async fn wait_durable(&self, tier: Tier, epoch: u64, seq: u64) -> Result<(), NotDurable> {
        // Tier::Unspecified waits for debug's durability.
        let ix = tier::index(tier).unwrap_or(tier::DEBUG);
        let mut durable = self.durable.clone();
        let waited = durable
            .wait_for(|durable| {
                let queue = self.queue.borrow();
                queue.epoch() != epoch || *durable.at(ix) >= seq || queue.store_fault().is_some()
            })
            .await;
        if waited.is_err() && *self.durable.borrow().at(ix) < seq {
            return Err(NotDurable::Stopped);
        }
        self.confirm(tier, epoch, seq)
    }

    /// Whether `seq` of `tier`, given in queue epoch `epoch`, is durable now; if not, why.
    pub fn confirm(&self, tier: Tier, epoch: u64, seq: u64) -> Result<(), NotDurable> {
        let ix = tier::index(tier).unwrap_or(tier::DEBUG);
        let queue = self.queue.borrow();
        let now = queue.epoch();
        if now != epoch {
            return Err(if epoch == 0 {
                NotDurable::HeldThenWritten { new: now }
            } else {
                NotDurable::Quarantined {
                    old: epoch,
                    new: now,
                }
            });
        }
        if *self.durable.borrow().at(ix) >= seq {
            return Ok(());
        }
        match queue.store_fault() {
            Some(fault) => Err(NotDurable::Unavailable {
                reason: fault.reason.to_owned(),
            }),
            None => Err(NotDurable::Stopped),
        }
    }

    /// The durable signal as a stream of wake-ups, for a task that reads whatever became durable.
    pub fn durable_changes(&self) -> DurableChanges {
        DurableChanges(self.durable.clone())
    }

    /// The queue, for reading. The borrow must end before the caller awaits.
    pub fn queue(&self) -> Ref<'_, Queue> {
        self.queue.borrow()
    }

    /// The queue, for changing. The borrow must end before the caller awaits.
    pub fn queue_mut(&self) -> RefMut<'_, Queue> {
        self.queue.borrow_mut()
    }

    /// Wakes the flusher (the queue has work due sooner than it was told).
    pub fn wake_flusher(&self) {
        self.appended.notify_one();
    }
}

fn durable_seqs(queue: &Queue) -> DurableSeqs {
    PerTier {
        safety: queue.durable_seq(Tier::Safety),
        slo: queue.durable_seq(Tier::Slo),
        debug: queue.durable_seq(Tier::Debug),
    }
}

/// Wake-ups from the durable signal: one after any number of raises since the last one.
pub struct DurableChanges(watch::Receiver<DurableSeqs>);

impl DurableChanges {
    /// Waits until the signal was raised since the last wake-up (at once if it already was).
    /// Once the flusher has stopped, it never returns.
    pub async fn changed(&mut self) {
        if self.0.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Group commit: flushes when the queue says a flush is due and raises the durable signal.
pub struct Flusher {
    spool: Spool,
    durable: watch::Sender<DurableSeqs>,
}

impl Flusher {
    /// Runs until `shutdown` turns true (the final flush is the caller's).
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let spool = &self.spool;
        loop {
            let next = spool.queue().next_flush_at();
            let wait = next.map(|at| at.duration_since(clock::wall()).unwrap_or(Duration::ZERO));
            tokio::select! {
                () = async {
                    match wait {
                        Some(wait) => tokio::time::sleep(wait).await,
                        // Nothing pending: wait for an append, but wake now and then for expiry,
                        // status snapshots and store retries.
                        None => { let _ = tokio::time::timeout(Duration::from_secs(1), spool.appended.notified()).await; }
                    }
                } => {}
                _ = shutdown.changed() => return,
            }
            let now = clock::wall();
            if !spool.queue().flush_due(now) {
                continue;
            }
            let outcome = spool.queue_mut().flush(now);
            match outcome {
                Ok(outcome) => {
                    self.durable.send_if_modified(|current| {
                        let moved = *current != outcome.durable;
                        *current = outcome.durable;
                        moved || outcome.committed
                    });
                }
                Err(error) => {
                    tracing::warn!(%error, "A queue flush failed; it is retried.");
                    // Waiters look again: their events may be held now, not on disk.
                    self.durable.send_modify(|_| ());
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}

/// Appends a sampling pass may make at most: a few per loop, and the thermal sampler's.
const PASS_RECORDS: usize = 512;
/// Bytes those appends may take at most.
const PASS_BYTES: u64 = 1024 * 1024;

/// The spool as the samplers' sink: what a sampler emits is appended, what it keeps is staged in
/// the queue's key-value area, and what the queue refuses is logged once per hundred.
pub struct SamplerSink {
    spool: Spool,
    refused: u64,
}

impl SamplerSink {
    /// A sink appending to `spool`.
    pub fn new(spool: Spool) -> Self {
        Self { spool, refused: 0 }
    }

    /// Call before a sampling pass: flushes first if the queue's append buffer could not take a
    /// pass's events, so that they and the states kept after them share one transaction.
    pub fn make_room(&mut self) {
        self.spool
            .queue_mut()
            .make_room(PASS_RECORDS, PASS_BYTES, clock::wall());
    }
}

impl EventSink for SamplerSink {
    fn emit(&mut self, tier: Tier, event: &Event) {
        if let Err(error) = self.spool.append(tier, event) {
            // The queue counts and reports what it refuses; one log line per hundred here.
            if self.refused.is_multiple_of(100) {
                tracing::warn!(%error, ?tier, refused = self.refused, "The queue refused a sampled event.");
            }
            self.refused += 1;
        }
    }

    fn keep(&mut self, key: &str, state: &[u8]) {
        if let Err(error) = self.spool.queue_mut().stage_kv(key, state) {
            tracing::warn!(%error, key, "A sampler's state was not kept; after a restart it starts again.");
        }
    }
}
