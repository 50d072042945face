//! A full disk: the queue lives on a small loop-mounted ext4 filesystem that a filler file has
//! nearly filled. When a flush fails, SLO and debug events are refused and counted, safety events
//! are held in memory up to the hold capacity and counted beyond it, nothing panics; when space
//! returns, the held safety events become durable and every refusal is reported upstream.
//!
//! Needs root, loop devices and e2fsprogs; prints SKIP with the reason otherwise, and fails
//! without them where `EDGEWATCH_REQUIRE_FAULT_INJECTION` is set (`.ci/run`).
#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

mod util;

use std::ffi::CString;
use std::io::Write;
use std::time::Duration;

use edgewatch_proto::v1::{LossCause, Tier};
use edgewatch_queue::{AppendError, Queue, RawQueueConfig};
use util::system::{Mount, make_ext4, privileged};
use util::*;

const HOLD: usize = 40;

fn free_bytes(path: &std::path::Path) -> u64 {
    let path = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: statvfs writes only into the zeroed struct we own; the path is NUL-terminated.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::statvfs(path.as_ptr(), &mut stat) }, 0);
    stat.f_bavail * stat.f_frsize
}

fn config(dir: &std::path::Path) -> RawQueueConfig {
    let mut config = RawQueueConfig::new(dir);
    config.budget_bytes = 64 * 1024 * 1024;
    config.cache_bytes = 2 * 1024 * 1024;
    config.max_record_bytes = 4096;
    config.max_pending_bytes = 256 * 1024;
    config.safety_hold_records = HOLD;
    config.offline_window_threshold = None;
    config.store_retry_min = Duration::from_secs(1);
    config
}

#[test]
fn a_full_disk_refuses_lower_tiers_holds_safety_and_reports_everything_when_space_returns() {
    if !privileged("disk-full test") {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("small.img");
    make_ext4(&image, 8 * 1024 * 1024).unwrap();
    let mount = Mount::new(&image, &work.path().join("mnt")).unwrap();
    let filler_path = mount.dir.join("filler");
    let filler_bytes = free_bytes(&mount.dir).saturating_sub(1536 * 1024);
    {
        let mut filler = std::fs::File::create(&filler_path).unwrap();
        let block = vec![0xa5u8; 64 * 1024];
        let mut left = filler_bytes;
        while left > 0 {
            let n = left.min(block.len() as u64) as usize;
            filler.write_all(&block[..n]).unwrap();
            left -= n as u64;
        }
        filler.sync_all().unwrap();
    }
    let queue_dir = mount.dir.join("queue");
    let (mut queue, _) = Queue::open(config(&queue_dir), t0()).unwrap();

    // Fill the disk: append to every tier and flush until a flush fails.
    let mut now = 1u64;
    let mut failure = None;
    for i in 0..20_000u64 {
        let tier = [Tier::Safety, Tier::Slo, Tier::Debug, Tier::Debug][(i % 4) as usize];
        queue
            .append(tier, &named_event(&format!("f{i}"), 1000), at_ms(now))
            .unwrap();
        now += 1;
        if i % 10 == 9 {
            match queue.flush(at_ms(now)) {
                Ok(_) => {}
                Err(error) => {
                    failure = Some(error);
                    break;
                }
            }
        }
    }
    let failure = failure.expect("the small filesystem filled up");
    assert!(
        failure.refused.slo.is_some() || failure.refused.debug.is_some(),
        "the failed flush dropped its SLO and debug appends: {failure}"
    );
    let held_at_failure = failure.held_safety;
    assert!(
        queue.next_flush_at().is_some(),
        "a flush stays due to retry the store and write the refusal reports"
    );
    assert!(
        held_at_failure > 0,
        "the failed flush held its safety appends"
    );

    // While the store is unavailable: SLO and debug refused, safety held up to the capacity.
    assert_eq!(
        queue.append(Tier::Debug, &named_event("d", 10), at_ms(now)),
        Err(AppendError::StoreUnavailable)
    );
    assert_eq!(
        queue.append(Tier::Slo, &named_event("s", 10), at_ms(now)),
        Err(AppendError::StoreUnavailable)
    );
    let mut held = Vec::new();
    let mut overflowed = 0;
    for i in 0..HOLD + 10 {
        match queue.append(Tier::Safety, &named_event(&format!("h{i}"), 10), at_ms(now)) {
            Ok(seq) => held.push(seq),
            Err(AppendError::HoldFull) => overflowed += 1,
            Err(other) => panic!("unexpected refusal: {other}"),
        }
    }
    assert_eq!(held.len() + held_at_failure, HOLD);
    assert_eq!(overflowed, 10 + held_at_failure);
    let status = queue.status(at_ms(now));
    assert!(!status.store_available);
    assert!(status.tiers.debug.disk_full > 0 && status.tiers.slo.disk_full > 0);
    assert_eq!(status.tiers.safety.buffer_overflow, overflowed as u64);
    // Before the retry interval a flush answers at once, still failing.
    assert!(queue.flush(at_ms(now + 10)).is_err());

    // Space returns.
    std::fs::remove_file(&filler_path).unwrap();
    now += 2000;
    let outcome = queue.flush(at_ms(now)).unwrap();
    assert!(outcome.durable.safety >= *held.last().unwrap());
    let status = queue.status(at_ms(now));
    assert!(status.store_available);
    let all = read_everything(&mut queue);
    for seq in &held {
        assert!(
            all.contains_key(&(Tier::Safety, *seq)),
            "held safety event {seq} is durable"
        );
    }
    let mut reported = [[0u64; 8]; 3];
    for ((tier, _), event) in &all {
        if let Some(loss) = queue_loss(event) {
            let expected_tier = if loss.tier == Tier::Safety as i32 {
                Tier::Safety
            } else {
                Tier::Slo
            };
            assert_eq!(*tier, expected_tier);
            reported[loss.tier as usize - 1][loss.cause as usize] += loss.count;
        }
    }
    let disk_full = LossCause::DiskFull as usize;
    assert_eq!(reported[1][disk_full], status.tiers.slo.disk_full);
    assert_eq!(reported[2][disk_full], status.tiers.debug.disk_full);
    assert_eq!(
        reported[0][LossCause::BufferOverflow as usize],
        status.tiers.safety.buffer_overflow
    );
    // Appends work again, and the counts survive a restart.
    queue
        .append(Tier::Debug, &named_event("after", 10), at_ms(now))
        .unwrap();
    queue.flush(at_ms(now + 1)).unwrap();
    drop(queue);
    let (queue, report) = Queue::open(config(&queue_dir), at_ms(now + 2)).unwrap();
    assert!(report.quarantined.is_none());
    assert_eq!(
        queue.status(at_ms(now + 2)).tiers.debug.disk_full,
        status.tiers.debug.disk_full
    );
    println!(
        "disk full after {} safety appends held at failure; refused: slo {}, debug {}; overflow {}",
        held_at_failure,
        status.tiers.slo.disk_full,
        status.tiers.debug.disk_full,
        status.tiers.safety.buffer_overflow
    );
    drop(queue);
    mount.unmount().unwrap();
}
