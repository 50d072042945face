//! Test scaffolding light enough for every crate's tests: nothing here starts a process, a broker
//! or a certificate authority (that is `edgewatch-harness`), and nothing needs a runtime.
//!
//! Layout:
//! - [`alloc`]: a counting global allocator, for the no-allocation tests and benches.
//! - [`sysfs`]: a fake Jetson sysfs tree (thermal zones, cpufreq, GPU devfreq, hwmon, nvpmodel).
//! - [`config_docs`]: the keys a configuration parser accepts, read from its refusal of an unknown
//!   key, and the sections and examples of the documentation that must list them.
//!
//! Invariants:
//! - Depends on no workspace crate, so any crate may use it as a dev-dependency (and the HIL rig
//!   and the demo as a normal one) without a cycle.
//! - Everything it writes stays under a directory the caller owns or a temporary one.

pub mod alloc;
pub mod config_docs;
pub mod sysfs;
