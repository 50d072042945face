//! The once-per-second status work allocates nothing once warm: rewriting the source list in
//! place and writing the status file from a borrowed view, counted by a per-thread counting
//! allocator; and what is written still reads back as the snapshot `status` shows.
#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use edgewatch_agent::degraded::StoreView;
use edgewatch_agent::drain::DrainStats;
use edgewatch_agent::ingest::IngestStats;
use edgewatch_agent::status::{
    AgentSnapshot, SnapshotView, SourceListWriter, SourceStatus, StatusWriter,
};
use edgewatch_queue::StoreFault;
use edgewatch_test_kit::alloc::CountingAllocator;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator::new();

/// What the agent's sample loop writes every second: two probes, tegrastats, sysfs.
fn refresh(list: &mut Vec<SourceStatus>, tick: u64) {
    let mut writer = SourceListWriter::new(list);
    for name in ["steering", "planner"] {
        let entry = writer.entry();
        let _ = write!(entry.name, "probe:{name}");
        entry.state.push_str("alive");
        entry.last_sample_age_s = Some(0.01 * tick as f64);
    }
    let entry = writer.entry();
    entry.name.push_str("tegrastats");
    let _ = write!(
        entry.state,
        "running (samples {}, malformed 0, restarts 0)",
        tick * 10
    );
    let entry = writer.entry();
    entry.name.push_str("sysfs");
    let _ = write!(entry.state, "polls {tick}, read errors 0, files 15");
}

/// The store as the queue reports it: working on even ticks, unavailable on odd ones.
fn store(tick: u64, since: SystemTime) -> StoreView<'static> {
    let fault = (tick % 2 == 1).then(|| StoreFault {
        reason: "queue store at /var/lib/edgewatch-agent/queue.log is unavailable: disk is full",
        since,
        attempts: tick as u32,
        next_attempt: since + Duration::from_secs(tick),
        held_safety: tick as usize,
        hold_capacity: 4096,
        never_opened: false,
    });
    StoreView::of(fault, 4096)
}

#[test]
fn the_status_writer_and_the_source_list_allocate_nothing_once_warm() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent-status.json");
    let mut writer = StatusWriter::new(path.clone());
    let mut sources = Vec::new();
    let mut uplink = DrainStats {
        last_refusal: Some("NotAuthorized".into()),
        ..DrainStats::default()
    };
    let mut ingest = IngestStats::default();
    let started = SystemTime::now();
    for tick in 0..3 {
        refresh(&mut sources, tick);
        writer
            .write(&SnapshotView::now(
                started,
                &uplink,
                &ingest,
                store(tick, started),
                &sources,
            ))
            .unwrap();
    }
    let (allocations, ()) = ALLOCATOR.allocations_during(|| {
        for tick in 3..200 {
            uplink.events_acked += 1_000_000;
            ingest.accepted += 77;
            refresh(&mut sources, tick);
            writer
                .write(&SnapshotView::now(
                    started,
                    &uplink,
                    &ingest,
                    store(tick, started),
                    &sources,
                ))
                .unwrap();
        }
    });
    assert_eq!(allocations, 0);

    let text = std::fs::read_to_string(&path).unwrap();
    let read: AgentSnapshot = serde_json::from_str(&text).unwrap();
    assert_eq!(read.pid, std::process::id());
    assert_eq!(read.sources.len(), 4);
    assert_eq!(read.sources[3].state, "polls 199, read errors 0, files 15");
    assert_eq!(read.uplink["events_acked"], 197_000_000u64);
    assert_eq!(read.uplink["last_refusal"], "NotAuthorized");
    assert_eq!(read.ingest["accepted"], 197 * 77);
    assert_eq!(read.store["available"], false, "tick 199 is a fault");
    assert_eq!(read.store["held_safety"], 199);
}

#[test]
fn a_shorter_source_list_drops_the_entries_not_rewritten() {
    let mut sources = Vec::new();
    refresh(&mut sources, 1);
    assert_eq!(sources.len(), 4);
    {
        let mut writer = SourceListWriter::new(&mut sources);
        writer.entry().name.push_str("sysfs");
    }
    assert_eq!(sources.len(), 1);
    assert_eq!(sources[0].name, "sysfs");
    assert_eq!(sources[0].state, "");
}
