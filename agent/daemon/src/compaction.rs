//! The queue file's compaction, off the agent's thread. After a large backlog drains, the redb
//! file keeps its high-water size (freed pages are reused, not returned); every crash recovery
//! walks the whole file. When the queue says a compaction is due (its live records under a
//! quarter of a file of at least 4 MiB, at most every 30 s), this task hands the copy to a
//! blocking thread and gives the result back to the queue, whose next flush swaps it in.
//!
//! ```text
//! every CHECK_INTERVAL: queue.begin_compaction ─► spawn_blocking(job.run): copy a snapshot
//!   (the runtime goes on: appends, flushes, drain)          │ into queue.redb.compact
//!                       queue.finish_compaction(result) ◄───┘
//!   next flush: apply deletions and appends since the snapshot, rename over queue.redb
//!   next tick: close the replaced store on a blocking thread (redb writes its allocator state)
//! ```
//!
//! Invariants:
//! - Neither the copy nor closing the replaced store runs on the runtime's thread: a safety
//!   append and its flush wait for no part of them. The one step on that thread is the swap
//!   inside a flush, bounded by what changed during the copy (its longest pause is in
//!   `docs/queue.md`).
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
        // The store the last swap replaced: closing it writes redb's allocator state for the
        // whole old file, work for this thread's neighbour, not for the one that flushes.
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
