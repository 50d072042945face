//! Test scaffolding light enough for every crate's tests: nothing here starts a broker or a
//! certificate authority (that is `edgewatch-harness`), nothing needs a runtime, and the only
//! processes it runs are the C compiler that builds its preload libraries and, for [`loopfs`],
//! `losetup`, `mkfs.ext4`, `mount` and `umount`.
//!
//! Layout:
//! - [`alloc`]: a counting global allocator, for the no-allocation tests and benches.
//! - [`sysfs`]: a fake Jetson sysfs tree (thermal zones, cpufreq, GPU devfreq, hwmon, nvpmodel).
//! - [`config_docs`]: the keys a configuration parser accepts, read from its refusal of an unknown
//!   key, and the sections and examples of the documentation that must list them.
//! - [`preload`]: an `LD_PRELOAD` library built from C source with the system compiler.
//! - [`faults`]: disk faults (EIO on writes, syncs, creations under a directory) injected into a
//!   real process through such a library, with counts of what it did to its files.
//! - [`loopfs`]: loop devices over image files, ext4 made and mounted on them, and the device's
//!   write counters, each undone on drop (root only), and the one rule of every privileged
//!   test: SKIP with the reason, or fail where `EDGEWATCH_REQUIRE_FAULT_INJECTION` is set.
//!
//! Invariants:
//! - Depends on no workspace crate, so any crate may use it as a dev-dependency (and the HIL rig
//!   and the demo as a normal one) without a cycle.
//! - Everything it writes stays under a directory the caller owns or a temporary one.

pub mod alloc;
pub mod config_docs;
pub mod faults;
pub mod loopfs;
pub mod preload;
pub mod sysfs;
