//! Where samplers put events and the state they keep across agent restarts, and the time they
//! are given.
//!
//! Invariants:
//! - A sampler hands each event to the sink once; the sink owns queueing, sequence numbers and
//!   durability. An event's `seq` is ignored (the queue assigns it).
//! - A kept state describes the events emitted before it: the sink makes it durable with them,
//!   never before them (the agent's sink stages it in the queue's key-value area).

use edgewatch_proto::v1::{Event, Tier};

/// The instant a sampler works at: wall clock for event times, monotonic clock for intervals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// Wall-clock time, nanoseconds since the Unix epoch (UTC).
    pub wall_unix_ns: i64,
    /// CLOCK_MONOTONIC, nanoseconds.
    pub monotonic_ns: u64,
}

/// Receives the events samplers produce.
pub trait EventSink {
    /// Queues `event` in `tier`. The sink must not keep a reference to it.
    fn emit(&mut self, tier: Tier, event: &Event);

    /// Keeps `state` under `key` for a later run of the agent, durable together with the events
    /// emitted before it (never before them). The default keeps nothing: a sampler without a
    /// place to keep its state starts from scratch when the agent restarts.
    fn keep(&mut self, key: &str, state: &[u8]) {
        let _ = (key, state);
    }
}

/// A sink that keeps every event and the last state under each key, for tests and tools.
#[derive(Debug, Default)]
pub struct CollectingSink {
    /// Events received, with their tier, in order.
    pub events: Vec<(Tier, Event)>,
    /// The last state kept under each key.
    pub kept: std::collections::BTreeMap<String, Vec<u8>>,
}

impl EventSink for CollectingSink {
    fn emit(&mut self, tier: Tier, event: &Event) {
        self.events.push((tier, event.clone()));
    }

    fn keep(&mut self, key: &str, state: &[u8]) {
        self.kept.insert(key.to_owned(), state.to_vec());
    }
}
