//! Thermal and power sampling against real captures, fake sysfs trees in temporary
//! directories, and real child processes standing in for tegrastats.
#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

mod child;
mod docs;
mod fake_sysfs;
mod properties;
mod replay;
mod scenarios;
mod sysfs_reader;
mod util;
