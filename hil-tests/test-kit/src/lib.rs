//! Test scaffolding light enough for every crate's tests: nothing here starts a process, a broker
//! or a certificate authority (that is `edgewatch-harness`).
//!
//! Layout:
//! - [`alloc`]: a counting global allocator, for the no-allocation tests and benches.
//! - [`sysfs`]: a fake Jetson sysfs tree (thermal zones, cooling devices, cpufreq, devfreq, hwmon).

pub mod alloc;
pub mod sysfs;
