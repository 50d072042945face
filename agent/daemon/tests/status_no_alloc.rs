//! The once-per-second status work allocates nothing once warm: rewriting the source list in
//! place and writing the status file from a borrowed view, counted by a per-thread counting
//! allocator; and what is written still reads back as the snapshot `status` shows.
#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::fmt::Write as _;
use std::time::SystemTime;

use edgewatch_agent::drain::DrainStats;
use edgewatch_agent::ingest::IngestStats;
use edgewatch_agent::status::{
    AgentSnapshot, SnapshotView, SourceListWriter, SourceStatus, StatusWriter,
};

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

struct Counting;

fn count() {
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged; counting
// touches no allocation.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded unchanged; the caller upholds `alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded unchanged; the caller upholds `alloc_zeroed`'s contract.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: forwarded unchanged; the caller upholds `realloc`'s contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged; the caller upholds `dealloc`'s contract.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn allocations_during(f: impl FnOnce()) -> u64 {
    let before = ALLOCATIONS.with(Cell::get);
    f();
    ALLOCATIONS.with(Cell::get) - before
}

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
            .write(&SnapshotView::now(started, &uplink, &ingest, &sources))
            .unwrap();
    }
    let allocations = allocations_during(|| {
        for tick in 3..200 {
            uplink.events_acked += 1_000_000;
            ingest.accepted += 77;
            refresh(&mut sources, tick);
            writer
                .write(&SnapshotView::now(started, &uplink, &ingest, &sources))
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
