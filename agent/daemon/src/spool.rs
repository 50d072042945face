//! The spool: the one handle on the queue that every task of the runtime holds, the group-commit
//! flusher, the samplers' sink, and the one signal that records became durable.
//!
//! ```text
//! ingest, samplers, health ─ append ─► Spool ─► queue (pending) ─ wake ─► Flusher: flush when due
//!        (a Ticket: tier, epoch, seq)                                        │ Durable (watch)
//!   local-socket replies (Spool::settled) ◄──────────────────────────────────┤
//!   drain (DurableChanges::changed) ◄────────────────────────────────────────┘
//! ```
//!
//! Invariants:
//! - The queue is shared by reference on the runtime's one thread, never locked: every borrow
//!   ends before the task holding it awaits, so no task finds the queue borrowed.
//! - One signal says what became of appends: the [`Durable`] value the flusher publishes after
//!   each flush (the queue's epoch, the highest durable number per tier, the ranges a failed
//!   flush dropped, and whether the store is unavailable). Local-socket replies wait on it and
//!   the drain wakes on its changes. A ticket is durable only in its own epoch, at or below its
//!   tier's durable number and outside every dropped range; nothing else lets a reply claim
//!   durability. A ticket of another epoch (a quarantine), a dropped one, or a safety append
//!   held in memory while the store is unavailable is settled with the reason ([`NotDurable`]).
//! - When to flush is the queue's decision (`next_flush_at`, `flush_scheduled`: its group-commit
//!   intervals, the safety commit's carry limit, and while its store is unavailable the next
//!   reopen attempt). An append whose flush is due before the deadline the flusher sleeps for
//!   (or while it sleeps with none) wakes it at once, so a safety append is durable within the
//!   safety interval and any append within its tier's interval, whatever else waits. Work the
//!   queue takes without an append (acknowledgements, dead letters, a compaction's copy) is
//!   found by the flusher's next wake ([`Spool::wake_flusher`] brings it forward): it sleeps on
//!   the monotonic clock, at most a bulk interval. A failed flush is logged and retried when the
//!   queue says, at the earliest 100 ms later.
//! - From shutdown on, the flusher commits whatever is appended at once (while the store works),
//!   so that every accepted submission is answered before the agent exits; once stopped it
//!   makes a final flush.
//! - What samplers keep across restarts goes into the queue's key-value area, staged after the
//!   events it describes, so it is durable with them; a sampling pass makes room first
//!   ([`SamplerSink::make_room`]), so no flush of a full buffer falls between the two.

use std::cell::{Cell, Ref, RefCell, RefMut};
use std::rc::Rc;
use std::time::{Duration, SystemTime};

use edgewatch_proto::tier;
use edgewatch_proto::v1::{Event, Tier};
use edgewatch_queue::{AppendError, FlushError, FlushOutcome, PerTier, Queue};
use edgewatch_samplers::EventSink;
use tokio::sync::{Notify, watch};

use crate::clock;

/// Dropped ranges remembered per tier; more are merged with their neighbours (a waiter between
/// two merged ranges is then told its record was dropped: a possible duplicate, never a loss).
const REFUSALS_KEPT: usize = 8;

/// The number an append was given: its tier, the queue epoch the number belongs to, and the
/// sequence number itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket {
    /// Tier of the record.
    pub tier: Tier,
    /// Queue epoch of `seq`.
    pub epoch: u64,
    /// Sequence number in the tier.
    pub seq: u64,
}

/// What became of an append, as of the last flush.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Not written yet.
    Pending,
    /// Durable under its number.
    Durable,
    /// Dropped by a flush that failed (counted by the queue as a loss).
    Dropped,
    /// Held in memory, not durable: the store is unavailable (only safety appends are held); the
    /// queue writes it once the store is back.
    Held,
    /// The queue was replaced (a damaged store quarantined, a new epoch) before the record was
    /// written; its number means nothing in the new epoch.
    Quarantined {
        /// The epoch the number was given in.
        old: u64,
        /// The epoch now.
        new: u64,
    },
    /// Appended while the store had never opened (epoch 0) and written since, under a number of
    /// the store's epoch that the ticket does not hold.
    HeldThenWritten {
        /// The store's epoch.
        new: u64,
    },
    /// The flusher stopped (the agent is stopping) before the record was durable.
    Stopped,
}

impl Fate {
    /// True until the fate is known.
    pub fn is_pending(self) -> bool {
        self == Fate::Pending
    }
}

/// Sequence ranges (inclusive) a failed flush dropped in one tier, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Refusals(heapless::Vec<(u64, u64), REFUSALS_KEPT>);

impl Refusals {
    fn add(&mut self, (first, last): (u64, u64)) {
        if let Some(previous) = self.0.last_mut()
            && previous.1.saturating_add(1) >= first
        {
            previous.1 = previous.1.max(last);
            return;
        }
        if self.0.is_full() {
            // Merge the two oldest: a wider range fails more waiters, never fewer.
            let second = self.0.remove(1);
            self.0[0].1 = second.1;
        }
        // There is room now.
        let _ = self.0.push((first, last));
    }

    fn contains(&self, seq: u64) -> bool {
        self.0
            .iter()
            .any(|&(first, last)| (first..=last).contains(&seq))
    }
}

/// The durable signal's value: what the last flush made durable or dropped, and whether the
/// store is unavailable.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Durable {
    epoch: u64,
    seqs: PerTier<u64>,
    dropped: PerTier<Refusals>,
    /// The last flush failed (the queue holds safety appends in memory until a commit succeeds),
    /// or the store never opened.
    unavailable: bool,
}

impl Durable {
    fn of(queue: &Queue) -> Self {
        Self {
            epoch: queue.epoch(),
            seqs: PerTier {
                safety: queue.durable_seq(Tier::Safety),
                slo: queue.durable_seq(Tier::Slo),
                debug: queue.durable_seq(Tier::Debug),
            },
            dropped: PerTier::default(),
            unavailable: queue.store_fault().is_some(),
        }
    }

    /// What became of `ticket`.
    pub fn fate(&self, ticket: Ticket) -> Fate {
        // Tier::Unspecified is never appended; it reads as debug.
        let ix = tier::index(ticket.tier).unwrap_or(tier::DEBUG);
        if ticket.epoch != self.epoch {
            if ticket.epoch == 0 {
                Fate::HeldThenWritten { new: self.epoch }
            } else {
                Fate::Quarantined {
                    old: ticket.epoch,
                    new: self.epoch,
                }
            }
        } else if self.dropped.at(ix).contains(ticket.seq) {
            Fate::Dropped
        } else if ticket.seq <= *self.seqs.at(ix) {
            Fate::Durable
        } else if self.unavailable {
            Fate::Held
        } else {
            Fate::Pending
        }
    }

    /// Takes in a flush's result; true if anything a waiter may look at changed.
    fn update(&mut self, result: &Result<FlushOutcome, FlushError>) -> bool {
        let before = self.clone();
        let (refused, committed) = match result {
            Ok(outcome) => {
                if outcome.epoch != self.epoch {
                    self.epoch = outcome.epoch;
                    self.dropped = PerTier::default();
                }
                self.seqs = outcome.durable;
                self.unavailable = false;
                (&outcome.refused, outcome.committed)
            }
            Err(error) => {
                // Every failed flush leaves the store unavailable until a commit succeeds.
                self.unavailable = true;
                (&error.refused, false)
            }
        };
        for ix in 0..3 {
            if let Some(range) = *refused.at(ix) {
                self.dropped.at_mut(ix).add(range);
            }
        }
        committed || *self != before
    }
}

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
    /// A flush that failed dropped the event (an SLO or debug one), counted as lost.
    #[error(
        "the queue could not write the event (a store failure); it was dropped and counted as lost"
    )]
    Dropped,
    /// The flusher stopped (the agent is stopping) before the event was durable.
    #[error("the agent stopped before this event was durable")]
    Stopped,
}

/// The queue and its durable signal, shared by the tasks of the runtime (cloning shares).
#[derive(Clone)]
pub struct Spool {
    /// The queue itself.
    queue: Rc<RefCell<Queue>>,
    /// Wakes the flusher after an append due before the deadline it sleeps for.
    appended: Rc<Notify>,
    /// The deadline the flusher sleeps for; `None` while it sleeps with nothing due.
    armed: Rc<Cell<Option<SystemTime>>>,
    /// What became of appends, published by the [`Flusher`].
    durable: watch::Receiver<Durable>,
}

impl Spool {
    /// Shares `queue`, and returns the flusher that must run beside the handle for appends to
    /// become durable.
    pub fn new(queue: Queue) -> (Self, Flusher) {
        let (durable_tx, durable_rx) = watch::channel(Durable::of(&queue));
        let spool = Self {
            queue: Rc::new(RefCell::new(queue)),
            appended: Rc::new(Notify::new()),
            armed: Rc::new(Cell::new(None)),
            durable: durable_rx,
        };
        let flusher = Flusher {
            spool: spool.clone(),
            durable: durable_tx,
        };
        (spool, flusher)
    }

    /// Appends an event; wakes the flusher if the next flush is now due before the deadline it
    /// sleeps for (a first safety append, a first append at all, a full buffer flushed). Errors
    /// are logged and counted by the queue.
    pub fn append(&self, tier: Tier, event: &Event) -> Result<Ticket, AppendError> {
        let mut queue = self.queue.borrow_mut();
        let result = queue.append(tier, event, clock::wall());
        if let Some(next) = queue.next_flush_at()
            && self.armed.get().is_none_or(|armed| next < armed)
        {
            self.appended.notify_one();
        }
        // Read after the append: a flush it ran by itself may have replaced the store.
        let epoch = queue.epoch();
        result.map(|seq| Ticket { tier, epoch, seq })
    }

    /// What became of `ticket`, as of the last flush.
    pub fn fate(&self, ticket: Ticket) -> Fate {
        self.durable.borrow().fate(ticket)
    }

    /// Waits until the fate of `ticket` is known, and says it ([`Fate::Stopped`] if the flusher
    /// stopped first).
    pub async fn settled(&self, ticket: Ticket) -> Fate {
        let mut durable = self.durable.clone();
        let mut fate = Fate::Pending;
        let waited = durable
            .wait_for(|durable| {
                fate = durable.fate(ticket);
                !fate.is_pending()
            })
            .await;
        if waited.is_err() {
            fate = self.durable.borrow().fate(ticket);
        }
        if fate.is_pending() {
            Fate::Stopped
        } else {
            fate
        }
    }

    /// Why `fate` is not durable, in words for the client; `None` for a durable or pending one.
    pub fn not_durable(&self, fate: Fate) -> Option<NotDurable> {
        Some(match fate {
            Fate::Pending | Fate::Durable => return None,
            Fate::Held => NotDurable::Unavailable {
                reason: self.queue.borrow().store_fault().map_or_else(
                    || "a flush failed".to_owned(),
                    |fault| fault.reason.to_owned(),
                ),
            },
            Fate::Dropped => NotDurable::Dropped,
            Fate::Quarantined { old, new } => NotDurable::Quarantined { old, new },
            Fate::HeldThenWritten { new } => NotDurable::HeldThenWritten { new },
            Fate::Stopped => NotDurable::Stopped,
        })
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

/// Wake-ups from the durable signal: one after any number of raises since the last one.
pub struct DurableChanges(watch::Receiver<Durable>);

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
    durable: watch::Sender<Durable>,
}

impl Flusher {
    /// Runs until `stop` turns true, then makes the final flush. From the time `shutdown` turns
    /// true it flushes whatever is appended at once, so that the tasks stopping (the local
    /// socket answering its clients, the samplers handing in what they hold) are not held back
    /// by the group-commit intervals.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>, mut stop: watch::Receiver<bool>) {
        let spool = &self.spool;
        let mut stopping = false;
        loop {
            let (next, bulk_interval, unavailable) = {
                let queue = spool.queue();
                (
                    queue.next_flush_at(),
                    queue.config().bulk_flush_interval,
                    queue.store_fault().is_some(),
                )
            };
            // The deadline is read from the queue's (wall) times once, then slept on the
            // monotonic clock, at most one bulk interval: a step of the wall clock cannot
            // postpone a flush by more, and work taken without an append is found as soon.
            spool.armed.set(next);
            let wait = match next {
                Some(_) if stopping && !unavailable => Duration::ZERO,
                Some(at) => at
                    .duration_since(clock::wall())
                    .unwrap_or(Duration::ZERO)
                    .min(bulk_interval),
                None => bulk_interval,
            };
            tokio::select! {
                () = tokio::time::sleep(wait) => {
                    if next.is_none() {
                        continue;
                    }
                }
                () = spool.appended.notified() => continue,
                // A closed channel also means the agent is stopping.
                _ = shutdown.wait_for(|&s| s), if !stopping => {
                    stopping = true;
                    continue;
                }
                _ = stop.wait_for(|&s| s) => break,
            }
            let now = clock::wall();
            // An unavailable store is tried again when the queue's backoff says, not at each
            // wake.
            if unavailable && !spool.queue().flush_due(now) {
                continue;
            }
            let result = spool.queue_mut().flush_scheduled(now);
            self.publish(&result);
            if let Err(error) = result {
                tracing::warn!(%error, "A queue flush failed; it is retried.");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        let result = spool.queue_mut().flush(clock::wall());
        self.publish(&result);
        if let Err(error) = result {
            tracing::error!(%error, "The final flush failed.");
        }
    }

    fn publish(&self, result: &Result<FlushOutcome, FlushError>) {
        self.durable
            .send_if_modified(|durable| durable.update(result));
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Instant;

    use edgewatch_proto::v1::CustomEvent;
    use edgewatch_proto::v1::event::Kind;
    use edgewatch_queue::RawQueueConfig;

    use super::*;

    fn event() -> Event {
        Event {
            kind: Some(Kind::Custom(CustomEvent {
                name: "test".into(),
                attributes: Vec::new(),
            })),
            ..Event::default()
        }
    }

    /// Runs `body` beside a flusher over a fresh queue with the default intervals (10 ms, 1 s).
    fn with_spool<F: std::future::Future<Output = ()>>(
        body: impl FnOnce(Spool, watch::Sender<bool>, watch::Sender<bool>) -> F,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let (queue, _) = Queue::open(RawQueueConfig::new(dir.path()), clock::wall()).unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let local = tokio::task::LocalSet::new();
        local.block_on(&runtime, async move {
            let (spool, flusher) = Spool::new(queue);
            let (shutdown_tx, shutdown) = watch::channel(false);
            let (stop_tx, stop) = watch::channel(false);
            let flusher = tokio::task::spawn_local(flusher.run(shutdown, stop));
            body(spool, shutdown_tx, stop_tx.clone()).await;
            let _ = stop_tx.send(true);
            flusher.await.unwrap();
        });
    }

    #[test]
    fn a_safety_append_behind_waiting_bulk_is_durable_within_the_safety_interval() {
        with_spool(|spool, shutdown, stop| async move {
            // Held to the end: a dropped sender means the agent is stopping.
            let _senders = (shutdown, stop);
            // Bulk first: its deadline is a second away.
            let debug = spool.append(Tier::Debug, &event()).unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
            let appended = Instant::now();
            let safety = spool.append(Tier::Safety, &event()).unwrap();
            let fate = tokio::time::timeout(Duration::from_millis(500), spool.settled(safety))
                .await
                .expect("the safety append waited for the bulk deadline");
            let took = appended.elapsed();
            assert_eq!(fate, Fate::Durable);
            // 10 ms of group commit and one fsync; generous for a loaded test machine.
            assert!(took < Duration::from_millis(200), "{took:?}");
            // The small bulk rode along.
            assert_eq!(spool.fate(debug), Fate::Durable);
        });
    }

    #[test]
    fn a_bulk_append_is_durable_only_after_its_group_commit() {
        with_spool(|spool, shutdown, stop| async move {
            // Held to the end: a dropped sender means the agent is stopping.
            let _senders = (shutdown, stop);
            let appended = Instant::now();
            let slo = spool.append(Tier::Slo, &event()).unwrap();
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert_eq!(spool.fate(slo), Fate::Pending);
            assert_eq!(spool.settled(slo).await, Fate::Durable);
            let took = appended.elapsed();
            assert!(
                took >= Duration::from_millis(990) && took < Duration::from_millis(1500),
                "{took:?}"
            );
        });
    }

    #[test]
    fn an_append_behind_an_acknowledgement_is_durable_within_its_interval() {
        with_spool(|spool, shutdown, stop| async move {
            let _senders = (shutdown, stop);
            let first = spool.append(Tier::Slo, &event()).unwrap();
            assert_eq!(spool.settled(first).await, Fate::Durable);
            // The drain acknowledges: work for the next flush that no append announced.
            let epoch = spool.queue().epoch();
            assert!(
                spool
                    .queue_mut()
                    .ack(Tier::Slo, epoch, first.seq..=first.seq, clock::wall())
            );
            let appended = Instant::now();
            let second = spool.append(Tier::Slo, &event()).unwrap();
            assert_eq!(spool.settled(second).await, Fate::Durable);
            let took = appended.elapsed();
            assert!(took < Duration::from_millis(1300), "{took:?}");
        });
    }

    #[test]
    fn from_shutdown_on_every_append_is_committed_at_once() {
        with_spool(|spool, shutdown, stop| async move {
            let _stop = stop;
            shutdown.send(true).unwrap();
            tokio::time::sleep(Duration::from_millis(10)).await;
            let appended = Instant::now();
            let debug = spool.append(Tier::Debug, &event()).unwrap();
            assert_eq!(spool.settled(debug).await, Fate::Durable);
            assert!(appended.elapsed() < Duration::from_millis(200));
        });
    }

    #[test]
    fn a_safety_append_without_a_store_is_held_at_once_then_written_under_another_number() {
        let dir = tempfile::tempdir().unwrap();
        // The queue's directory cannot be created while a file stands in its way.
        let blocker = dir.path().join("blocked");
        std::fs::write(&blocker, b"").unwrap();
        let (queue, report) =
            Queue::open_or_hold(RawQueueConfig::new(blocker.join("queue")), clock::wall()).unwrap();
        assert!(report.unavailable.is_some());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let local = tokio::task::LocalSet::new();
        local.block_on(&runtime, async move {
            let (spool, flusher) = Spool::new(queue);
            let (_shutdown_tx, shutdown) = watch::channel(false);
            let (stop_tx, stop) = watch::channel(false);
            let flusher = tokio::task::spawn_local(flusher.run(shutdown, stop));
            let safety = spool.append(Tier::Safety, &event()).unwrap();
            assert_eq!(safety.epoch, 0);
            assert!(spool.append(Tier::Slo, &event()).is_err(), "SLO is refused");
            let fate = tokio::time::timeout(Duration::from_millis(100), spool.settled(safety))
                .await
                .expect("a held append is settled at once");
            assert_eq!(fate, Fate::Held);
            let why = spool.not_durable(fate).unwrap().to_string();
            assert!(
                why.contains("unavailable") && why.contains("held in memory"),
                "{why}"
            );
            // The way is cleared: the next attempt (1 s after the failure) opens the store and
            // writes the held append under a number of the store's epoch.
            std::fs::remove_file(&blocker).unwrap();
            let written = tokio::time::timeout(Duration::from_secs(5), async {
                loop {
                    let fate = spool.fate(safety);
                    if fate != Fate::Held {
                        return fate;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
            .await
            .unwrap();
            let epoch = spool.queue().epoch();
            assert_ne!(epoch, 0);
            assert_eq!(written, Fate::HeldThenWritten { new: epoch });
            assert_eq!(spool.queue().durable_seq(Tier::Safety), 1);
            stop_tx.send(true).unwrap();
            flusher.await.unwrap();
        });
    }

    #[test]
    fn the_final_flush_publishes_what_it_made_durable() {
        let dir = tempfile::tempdir().unwrap();
        let (queue, _) = Queue::open(RawQueueConfig::new(dir.path()), clock::wall()).unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let local = tokio::task::LocalSet::new();
        local.block_on(&runtime, async move {
            let (spool, flusher) = Spool::new(queue);
            let (_shutdown_tx, shutdown) = watch::channel(false);
            let (stop_tx, stop) = watch::channel(false);
            let flusher = tokio::task::spawn_local(flusher.run(shutdown, stop));
            let slo = spool.append(Tier::Slo, &event()).unwrap();
            stop_tx.send(true).unwrap();
            flusher.await.unwrap();
            assert_eq!(spool.fate(slo), Fate::Durable);
        });
    }

    fn outcome(epoch: u64, durable: u64, refused: Option<(u64, u64)>) -> FlushOutcome {
        FlushOutcome {
            epoch,
            durable: PerTier::all(durable),
            written: PerTier::default(),
            lost: PerTier::default(),
            committed: true,
            safety_only: false,
            refused: PerTier {
                slo: refused,
                ..PerTier::default()
            },
        }
    }

    fn ticket(epoch: u64, seq: u64) -> Ticket {
        Ticket {
            tier: Tier::Slo,
            epoch,
            seq,
        }
    }

    #[test]
    fn a_dropped_range_fails_its_waiters_though_the_durable_number_passed_it() {
        let mut durable = Durable {
            epoch: 7,
            ..Durable::default()
        };
        // A flush failed and dropped 3..=5; the next one committed up to 9.
        let failed: Result<FlushOutcome, FlushError> = Err(FlushError {
            reason: "disk full".into(),
            refused: PerTier {
                slo: Some((3, 5)),
                ..PerTier::default()
            },
            held_safety: 0,
        });
        assert!(durable.update(&failed));
        assert_eq!(durable.fate(ticket(7, 4)), Fate::Dropped);
        // Not dropped, not durable: held in memory while the store is unavailable.
        assert_eq!(durable.fate(ticket(7, 6)), Fate::Held);
        assert!(durable.update(&Ok(outcome(7, 9, None))));
        for seq in 3..=5 {
            assert_eq!(durable.fate(ticket(7, seq)), Fate::Dropped);
        }
        assert_eq!(durable.fate(ticket(7, 2)), Fate::Durable);
        assert_eq!(durable.fate(ticket(7, 6)), Fate::Durable);
        assert_eq!(durable.fate(ticket(7, 10)), Fate::Pending);
        // Safety's numbers are its own.
        let safety = Ticket {
            tier: Tier::Safety,
            ..ticket(7, 4)
        };
        assert_eq!(durable.fate(safety), Fate::Durable);
    }

    #[test]
    fn a_ticket_of_another_epoch_is_void_never_durable() {
        let mut durable = Durable {
            epoch: 7,
            ..Durable::default()
        };
        durable.update(&Ok(outcome(7, 3, Some((2, 2)))));
        durable.update(&Ok(outcome(8, 5, None)));
        assert_eq!(
            durable.fate(ticket(7, 1)),
            Fate::Quarantined { old: 7, new: 8 }
        );
        assert_eq!(
            durable.fate(ticket(0, 1)),
            Fate::HeldThenWritten { new: 8 },
            "a ticket given before the store ever opened"
        );
        assert_eq!(
            durable.fate(ticket(8, 2)),
            Fate::Durable,
            "the old epoch's drops are gone"
        );
    }

    #[test]
    fn dropped_ranges_past_those_kept_merge_and_fail_more_waiters_never_fewer() {
        let mut refusals = Refusals::default();
        for k in 0..20u64 {
            refusals.add((k * 10, k * 10 + 1));
        }
        for k in 0..20u64 {
            assert!(
                refusals.contains(k * 10) && refusals.contains(k * 10 + 1),
                "{k}"
            );
        }
        // Adjacent ranges join.
        let mut adjacent = Refusals::default();
        adjacent.add((1, 2));
        adjacent.add((3, 4));
        assert_eq!(adjacent.0.len(), 1);
        assert!(!adjacent.contains(5));
    }
}
