//! Where samplers put events, and the time they are given.
//!
//! Invariants:
//! - A sampler hands each event to the sink once; the sink owns queueing, sequence numbers and
//!   durability. An event's `seq` is ignored (the queue assigns it).

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
}

/// A sink that keeps every event, for tests and tools.
#[derive(Debug, Default)]
pub struct CollectingSink {
    /// Events received, with their tier, in order.
    pub events: Vec<(Tier, Event)>,
}

impl EventSink for CollectingSink {
    fn emit(&mut self, tier: Tier, event: &Event) {
        self.events.push((tier, event.clone()));
    }
}
