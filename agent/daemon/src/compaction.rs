//! The queue's compaction task, kept for the queue's compaction API. The queue's store is a
//! segmented log that unlinks drained segments as records are removed, so it never reports a
//! compaction due (`docs/queue.md`, "Compaction"): this task asks every `CHECK_INTERVAL` (no
//! I/O: the answer is constant) and never starts a copy. Were a store to need one again, the
//! task hands the copy to a blocking thread and gives the result back to the queue, whose next
//! flush swaps it in.
//!
//! ```text
//! every CHECK_INTERVAL: queue.begin_compaction ─► (a log: None, nothing to do)
//!   otherwise: spawn_blocking(job.run) ─► queue.finish_compaction(result) ─► swapped at a flush
//! ```
//!
//! Invariants:
//! - Neither a copy nor closing a replaced store runs on the runtime's thread: a safety append
//!   and its flush wait for no part of them.
//! - One compaction at a time; a copy still running at shutdown is cancelled when the queue
//!   drops, and its file is removed at the next open.

use std::time::Duration;

use tokio::sync::watch;

use crate::clock;
use crate::spool::Spool;

/// How often the task asks the queue whether a compaction is due (a `stat` of the file).
pub const CHECK_INTERVAL: Duration = Duration::from_secs(2);

/// Compacts the queue file when it is due, until `shutdown` turns true.
pub async fn compaction_loop(spool: Spool, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(CHECK_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        // The store a swap replaced is closed off the thread that flushes.
        if let Some(old) = spool.queue_mut().take_retired_store() {
            tokio::task::spawn_blocking(move || old.close());
        }
        let Some(job) = spool.queue_mut().begin_compaction(clock::wall()) else {
            continue;
        };
        let started = clock::instant();
        let copy = tokio::task::spawn_blocking(move || job.run());
        let result = tokio::select! {
            result = copy => result,
            // The queue cancels the copy when it drops.
            _ = shutdown.changed() => return,
        };
        match result {
            Ok(result) => {
                tracing::debug!(
                    copy_ms = started.elapsed().as_millis() as u64,
                    "The queue's compaction copy finished; the next flush swaps it in."
                );
                spool.queue_mut().finish_compaction(result, clock::wall());
                spool.wake_flusher();
            }
            Err(error) => {
                tracing::warn!(%error, "The queue's compaction copy did not finish.");
                spool.queue_mut().abandon_compaction();
            }
        }
    }
}
