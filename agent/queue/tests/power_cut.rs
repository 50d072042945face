//! Simulated power cuts. The queue lives on an ext4 image mounted through a loop device, with the
//! kernel's writeback held back, so whatever the queue did not fsync stays in the page cache.
//! A real child writes through the queue and reports durable sequence numbers; after SIGKILL the
//! image file is copied, so only what reached the "device" survives. The copy is mounted (ext4
//! replays its journal), checked against every report, and the next run continues on it, as a
//! machine does after a power cut.
//!
//! Needs root, loop devices and e2fsprogs; prints SKIP with the reason otherwise, and fails
//! without them where `EDGEWATCH_REQUIRE_FAULT_INJECTION` is set (`.ci/run`). The writeback
//! settings are restored when the test ends, even on failure.
//! `EDGEWATCH_QUEUE_CUTS=N` (default 30) sets the number of cuts; `EDGEWATCH_QUEUE_SEED` the seed.
#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

mod util;

use std::time::SystemTime;

use edgewatch_queue::Queue;
use util::child::{KillAt, Rng, env_count, run_and_kill, seed};
use util::ledger::Ledger;
use util::system::{Mount, WritebackHeld, make_ext4, privileged};

const BUDGET: u64 = 512 * 1024;
const IMAGE_BYTES: u64 = 48 * 1024 * 1024;

#[test]
fn records_reported_durable_survive_power_cuts_and_every_loss_is_counted() {
    if !privileged("power-cut test") {
        return;
    }
    let cuts = env_count("EDGEWATCH_QUEUE_CUTS", 30);
    let mut rng = Rng(seed(0x5eed_0002));
    let work = tempfile::tempdir().unwrap();
    let mnt = work.path().join("mnt");
    let mut image = work.path().join("image-0");
    make_ext4(&image, IMAGE_BYTES).unwrap();
    let _held = WritebackHeld::new().unwrap();
    let mut ledger = Ledger::default();
    let mut checked = util::ledger::Checked::default();
    for cut in 0..cuts {
        let mount = Mount::new(&image, &mnt).unwrap();
        let queue_dir = mount.dir.join("queue");
        let kill = KillAt::random(&mut rng, 400);
        let output = run_and_kill(&queue_dir, cut, rng.below(u64::MAX), BUDGET, kill);
        // The power cut: only what the loop device wrote into the image file survives.
        let next = work.path().join(format!("image-{}", cut + 1));
        std::fs::copy(&image, &next).unwrap();
        mount.unmount().unwrap();
        std::fs::remove_file(&image).unwrap();
        image = next;
        ledger.ingest(&output).unwrap();

        let mount = Mount::new(&image, &mnt).unwrap();
        let queue_dir = mount.dir.join("queue");
        let (mut queue, report) = Queue::open(
            util::roomy_config_with_budget(&queue_dir, BUDGET),
            SystemTime::now(),
        )
        .unwrap();
        assert!(
            report.quarantined.is_none(),
            "cut {cut}: the store did not survive: {:?}",
            report.quarantined
        );
        checked = ledger
            .check(&mut queue, SystemTime::now())
            .unwrap_or_else(|e| panic!("cut {cut}: {e}"));
        drop(queue);
        mount.unmount().unwrap();
    }
    println!(
        "{cuts} cuts, {} durable reports: {} present, {} acknowledged, {} counted lost",
        ledger.durable.len(),
        checked.present,
        checked.acked,
        checked.counted_lost
    );
    assert_eq!(
        ledger.epochs.len(),
        1,
        "the epoch never changed: no quarantine"
    );
    assert!(checked.kv_checked, "the key-value area named a record");
    assert!(
        ledger.durable.len() as u64 >= cuts,
        "the children made progress"
    );
}
