//! SIGKILL at random moments: a real child process writes through the queue and reports what the
//! queue made durable; after each kill the next child reopens the queue. Periodically and at the
//! end the queue is checked against every report: nothing reported durable is lost unless it was
//! acknowledged or counted as evicted, no sequence number names two events, and the key-value
//! entry the child stages after each append never names a record that did not survive.
//!
//! `EDGEWATCH_QUEUE_KILLS=N` (default 200) sets the number of kills; `EDGEWATCH_QUEUE_SEED` the
//! seed.
#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

mod util;

use std::time::SystemTime;

use edgewatch_queue::Queue;
use util::child::{KillAt, Rng, env_count, run_and_kill, seed};
use util::ledger::Ledger;

/// Small enough that the runs evict (so eviction accounting is exercised), large enough to keep
/// a few thousand records.
const BUDGET: u64 = 1024 * 1024;

#[test]
fn records_reported_durable_survive_sigkill_and_every_loss_is_counted() {
    let kills = env_count("EDGEWATCH_QUEUE_KILLS", 200);
    let mut rng = Rng(seed(0x5eed_0001));
    let dir = tempfile::tempdir().unwrap();
    let queue_dir = dir.path().join("queue");
    let mut ledger = Ledger::default();
    let mut totals = util::ledger::Checked::default();
    for run in 0..kills {
        let kill = KillAt::random(&mut rng, 120);
        let output = run_and_kill(&queue_dir, run, rng.below(u64::MAX), BUDGET, kill);
        ledger.ingest(&output).unwrap();
        if run % 25 == 24 || run + 1 == kills {
            let (mut queue, report) = Queue::open(
                util::roomy_config_with_budget(&queue_dir, BUDGET),
                SystemTime::now(),
            )
            .unwrap();
            assert!(
                report.quarantined.is_none(),
                "a SIGKILL never corrupts the store"
            );
            totals = ledger.check(&mut queue, SystemTime::now()).unwrap();
        }
    }
    println!(
        "{kills} kills, {} lines, {} durable reports: {} present, {} acknowledged, {} counted lost",
        ledger.lines,
        ledger.durable.len(),
        totals.present,
        totals.acked,
        totals.counted_lost
    );
    assert_eq!(ledger.epochs.len(), 1, "the epoch never changed");
    assert!(totals.kv_checked, "the key-value area named a record");
    assert!(
        ledger.durable.len() as u64 >= kills,
        "the children made progress"
    );
}
