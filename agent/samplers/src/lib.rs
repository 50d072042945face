//! The agent's samplers: what turns probes, sensors and manifests into events.
//!
//! Layout:
//! - [`sink`]: where samplers put events ([`EventSink`]) and the time they are given ([`Now`]).
//! - [`deadline`]: control-loop probes → deadline counters, miss bursts, fallbacks, interventions,
//!   safe stops, producer liveness ([`deadline::DeadlineSampler`]).
//! - [`autonomy`]: seconds per autonomy mode per model version, and mode changes (pure).
//! - [`model`]: the running model's identity from a manifest beside the engine, the engine's
//!   sha256 hashed incrementally ([`model::ModelWatcher`]).
//! - [`thermal`]: throttling, over-current and energy from tegrastats and sysfs.
//!
//! Invariants:
//! - Samplers are pure logic over their sources: they read no clock (time comes in as [`Now`]),
//!   and the I/O they need (a probe mapping, a sysfs file, a child's output) is behind a small
//!   source type the agent's shell drives.
//! - In steady state a sampler does not allocate: events are built in reused structures and
//!   handed to the sink by reference.

pub mod autonomy;
pub mod deadline;
pub mod model;
pub mod sink;
pub mod thermal;

pub use sink::{CollectingSink, EventSink, Now};
