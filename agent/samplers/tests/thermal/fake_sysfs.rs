//! The fake Jetson sysfs tree of `edgewatch-test-kit` as the thermal tests use it, with the
//! thermal configurations rooted in it.

use edgewatch_samplers::thermal::config::{RawThermalConfig, SysfsConfig, ThermalConfig};
pub use edgewatch_test_kit::sysfs::FakeSysfs;

/// Thermal configurations whose `sysfs_root` is a fake tree.
pub trait RootedConfig {
    /// The sysfs part of a configuration rooted here.
    fn sysfs_config(&self) -> SysfsConfig;

    /// `raw` with `sysfs_root` set here, validated.
    fn config(&self, raw: RawThermalConfig) -> ThermalConfig;
}

impl RootedConfig for FakeSysfs {
    fn sysfs_config(&self) -> SysfsConfig {
        self.config(RawThermalConfig::default()).sysfs
    }

    fn config(&self, raw: RawThermalConfig) -> ThermalConfig {
        RawThermalConfig {
            sysfs_root: self.root().to_owned(),
            ..raw
        }
        .validate()
        .unwrap()
    }
}
