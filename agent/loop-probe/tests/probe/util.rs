//! Helpers shared by the integration tests.

use std::path::{Path, PathBuf};

use loop_probe::{Cycle, WriterConfig};

pub const PERIOD: u64 = 1_000_000;
pub const BUDGET: u64 = 400_000;

/// A scratch directory on tmpfs when there is one, as in production.
pub fn scratch() -> tempfile::TempDir {
    let base = Path::new("/dev/shm");
    if base.is_dir() {
        tempfile::Builder::new()
            .prefix("loop-probe-test")
            .tempdir_in(base)
            .unwrap()
    } else {
        tempfile::tempdir().unwrap()
    }
}

pub fn probe_path(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("loop.probe")
}

pub fn config(capacity: u32) -> WriterConfig {
    let mut c = WriterConfig::new(7, "steer", PERIOD, BUDGET);
    c.capacity = capacity;
    c
}

pub fn cycle(i: u64, duration_ns: u64) -> Cycle {
    let release_ns = loop_probe::clock::monotonic_ns();
    Cycle {
        cycle: i,
        release_ns,
        start_ns: release_ns + 10_000,
        duration_ns,
        flags: 0,
    }
}
