//! Helpers shared by the queue's integration tests: small configurations, recognisable events,
//! a controlled clock, and a reader that drains what a queue holds without acknowledging it.
#![allow(dead_code, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, SystemTime};

use edgewatch_proto::v1::{Attribute, CustomEvent, Event, QueueLoss, Tier, attribute, event::Kind};
use edgewatch_queue::{BatchLimits, Queue, RawQueueConfig};
use prost::Message;

/// A fixed starting time so tests never read the clock.
pub fn t0() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)
}

pub fn at_ms(ms: u64) -> SystemTime {
    t0() + Duration::from_millis(ms)
}

/// A configuration with a budget large enough that nothing is evicted, no age limits and no
/// offline-window alarm: only what the test does changes the queue.
pub fn roomy_config(dir: &Path) -> RawQueueConfig {
    let mut config = RawQueueConfig::new(dir);
    config.cache_bytes = 2 * 1024 * 1024;
    config.budget_bytes = 64 * 1024 * 1024;
    config.max_pending_bytes = 1024 * 1024;
    config.max_record_bytes = 16 * 1024;
    config.max_age.slo = None;
    config.max_age.debug = None;
    config.offline_window_threshold = None;
    config
}

/// An event recognisable by its name, padded with `pad` bytes.
pub fn named_event(name: &str, pad: usize) -> Event {
    Event {
        seq: 0,
        event_time_unix_ns: 1,
        monotonic_ns: 2,
        kind: Some(Kind::Custom(CustomEvent {
            name: name.to_owned(),
            attributes: vec![Attribute {
                key: "pad".into(),
                value: Some(attribute::Value::StringValue("x".repeat(pad))),
            }],
        })),
    }
}

/// The name of a custom event, or `None` for other kinds.
pub fn name_of(event: &Event) -> Option<&str> {
    match &event.kind {
        Some(Kind::Custom(custom)) => Some(&custom.name),
        _ => None,
    }
}

pub fn queue_loss(event: &Event) -> Option<&QueueLoss> {
    match &event.kind {
        Some(Kind::QueueLoss(loss)) => Some(loss),
        _ => None,
    }
}

/// Everything a queue hands out from now, per tier, decoded; nothing is acknowledged, and the
/// read cursor is put back afterwards.
pub fn read_everything(queue: &mut Queue) -> BTreeMap<(Tier, u64), Event> {
    queue.requeue_unacked();
    let mut all = BTreeMap::new();
    let limits = BatchLimits {
        max_records: 10_000,
        max_bytes: 16 * 1024 * 1024,
    };
    while let Some(batch) = queue.next_batch(limits).unwrap() {
        for (seq, bytes) in batch.records() {
            let event = Event::decode(bytes).unwrap();
            assert_eq!(event.seq, seq, "stored seq differs from its key");
            assert!(
                all.insert((batch.tier(), seq), event).is_none(),
                "seq handed out twice"
            );
        }
    }
    queue.requeue_unacked();
    all
}

pub mod child;
pub mod ledger;
pub mod system;

/// The configuration `queue-workload` uses, for opening its queue in the test process.
pub fn roomy_config_with_budget(dir: &Path, budget: u64) -> RawQueueConfig {
    let mut config = RawQueueConfig::new(dir);
    config.budget_bytes = budget;
    config.cache_bytes = 4 * 1024 * 1024;
    config.max_record_bytes = 4096;
    config.max_pending_bytes = (budget / 8).max(64 * 1024);
    config.offline_window_threshold = None;
    config
}

/// The queue's store inside its directory: the log's directory of segments and state slots.
pub const STORE: &str = "queue.log";

/// Replaces the store with one nothing can be read from: no segment, `garbage` where its state
/// slot is.
pub fn replace_store(dir: &Path, garbage: &[u8]) {
    let store = dir.join(STORE);
    if store.exists() {
        std::fs::remove_dir_all(&store).unwrap();
    }
    std::fs::create_dir(&store).unwrap();
    std::fs::write(store.join("state.0"), garbage).unwrap();
}

/// The store's files in name order, with their bytes.
pub fn store_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir.join(STORE))
        .unwrap()
        .map(|entry| {
            let entry = entry.unwrap();
            (
                entry.file_name().into_string().unwrap(),
                std::fs::read(entry.path()).unwrap(),
            )
        })
        .collect();
    files.sort();
    files
}

/// Writes `files` as the store in `dir` (replacing what was there).
pub fn write_store_files(dir: &Path, files: &[(String, Vec<u8>)]) {
    let store = dir.join(STORE);
    if store.exists() {
        std::fs::remove_dir_all(&store).unwrap();
    }
    std::fs::create_dir(&store).unwrap();
    for (name, bytes) in files {
        std::fs::write(store.join(name), bytes).unwrap();
    }
}

/// The frames of a segment file: `(seq, start, end)` byte ranges, `len:u32 | generation:u32 |
/// value`, the sequence number read from the event leading the value.
pub fn segment_frames(bytes: &[u8]) -> Vec<(u64, usize, usize)> {
    let mut frames = Vec::new();
    let mut at = 0;
    while at + 8 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        let end = at + 8 + len;
        let event = &bytes[at + 8 + 12..end];
        assert_eq!(event[0], 0x08, "an event starts with its seq");
        let (mut seq, mut shift) = (0u64, 0);
        for byte in &event[1..] {
            seq |= u64::from(byte & 0x7f) << shift;
            shift += 7;
            if byte & 0x80 == 0 {
                break;
            }
        }
        frames.push((seq, at, end));
        at = end;
    }
    frames
}

/// The path of the segment of `tier` (`"safety"`, `"slo"`, `"debug"`) starting at `first`.
pub fn segment_path(dir: &Path, tier: &str, first: u64) -> std::path::PathBuf {
    dir.join(STORE).join(format!("{tier}.{first:020}.seg"))
}
