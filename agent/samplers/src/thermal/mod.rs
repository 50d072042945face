//! Thermal and power sampling: throttling episodes and throttled seconds per component,
//! over-current events, energy per power rail, and downsampled raw samples, from tegrastats and
//! the Jetson's sysfs.
//!
//! Layout:
//! - [`config`]: the `[thermal]` table (`RawThermalConfig`), its validation and named defaults.
//! - [`tegrastats`] (I/O shell): `tegrastats` as a restarted child process, or a capture replay.
//! - [`sysfs`] (I/O shell): thermal zones, cpufreq, GPU devfreq, `soctherm_oc` and configured
//!   power inputs, kept open and re-read with `pread`.
//! - [`throttle`] (pure): throttling conditions, their episodes and cumulative seconds.
//! - [`energy`] (pure): rail power integrated into joules.
//! - [`raw_sample`] (pure): which tegrastats samples go to the debug tier.
//! - [`sampler`] (pure): [`ThermalSampler`], which ties the three together and emits counters
//!   per model version and lifecycle logs.
//! - [`clock`]: the shells' clock.
//!
//! # Driving it from the agent
//!
//! The agent builds the reader, the source and the sampler once, then feeds the sampler from its
//! current-thread loop; the sampler emits into the agent's [`EventSink`](crate::EventSink).
//! The runtime needs time and I/O drivers (`enable_all`) for the child process.
//!
//! ```no_run
//! use edgewatch_samplers::thermal::{
//!     RawThermalConfig, ThermalSampler, SysfsReader, TegrastatsSource, clock,
//! };
//! use edgewatch_samplers::CollectingSink;
//!
//! # async fn run(raw: RawThermalConfig) -> Result<(), Box<dyn std::error::Error>> {
//! let config = raw.validate()?; // on error: exit 64 naming `error.key()`
//! let mut reader = SysfsReader::open(&config.sysfs)?;
//! let mut source = TegrastatsSource::new(&config.tegrastats)?;
//! let model = None; // the model version running now, from the model sampler
//! let mut sink = CollectingSink::default(); // the agent's durable queue
//! let mut sampler = ThermalSampler::new(&config, reader.inventory(), clock::now(), model);
//! let mut poll = tokio::time::interval(config.sysfs.poll_interval);
//! loop {
//!     tokio::select! {
//!         event = source.next() => sampler.on_tegrastats(&event, model, &mut sink),
//!         _ = poll.tick() => {
//!             let now = clock::now();
//!             sampler.on_sysfs(reader.read(), now, model, &mut sink);
//!         }
//!     }
//! }
//! # }
//! ```
//!
//! Invariants:
//! - Pure modules do no I/O and read no clock; the shells ([`tegrastats`], [`sysfs`]) read the
//!   clock through [`clock`] only and stamp what they hand over.
//! - `cpuinfo_cur_freq` is never opened (see [`sysfs`]).
//! - In steady state nothing here allocates: a tegrastats line, a sysfs poll and a counter
//!   emission reuse their buffers and events.
//! - Nothing is fatal at run time: a malformed line, an unreadable file or a dead tegrastats is
//!   counted and reported, and sampling goes on.

pub mod clock;
pub mod config;
pub mod energy;
pub mod raw_sample;
pub mod sampler;
pub mod sysfs;
pub mod tegrastats;
pub mod throttle;

pub use config::{RawThermalConfig, ThermalConfig};
pub use energy::EnergyIntegrator;
pub use sampler::{ThermalSampler, ThermalStatus};
pub use sysfs::{SysfsError, SysfsInventory, SysfsReader, SysfsSnapshot};
pub use tegrastats::{TegrastatsError, TegrastatsEvent, TegrastatsSource, TegrastatsStatus};
pub use throttle::ThrottleDetector;
