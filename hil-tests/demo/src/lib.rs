//! The all-in-one demo: a simulated fleet on one computer, nothing to install beyond the Rust
//! toolchain. Every machine is a real `edgewatch-agent` process fed by a real
//! `edgewatch-synthetic-loop` control loop and a replayed tegrastats capture; an embedded rumqttd
//! broker carries their batches to a real `edgewatch-gateway` with its embedded store; the run
//! ends with `edgewatch-gateway report` against that store.
//!
//! Layout:
//! - [`scenario`]: the fleet and its timeline, scaled to the run's duration (pure).
//! - [`files`]: the output directory's layout and the configuration files written there.
//! - [`sysfs`]: the fake thermal tree the throttling machine's agent reads.
//! - [`fleet`]: the gateway, agent and control-loop processes, and what they report while running.
//! - [`run`]: one run, start to end, with progress lines.
//! - [`summary`]: what a run did (`demo-summary.json`), for people and for the end-to-end test.
//!
//! Invariants:
//! - Nothing listens beyond 127.0.0.1, everything written stays under the output directory, and
//!   no process outlives the run (unless `--keep` asks for it, until the demo is stopped).
//! - The demo imitates nothing on the data path: what the report shows went through the same
//!   binaries, wire format and store a deployment uses.

pub mod files;
pub mod fleet;
pub mod run;
pub mod scenario;
pub mod summary;
pub mod sysfs;
