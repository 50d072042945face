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
