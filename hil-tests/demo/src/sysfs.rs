//! The throttling machine's thermal zones: a fake Jetson sysfs tree
//! ([`edgewatch_test_kit::sysfs`]) holding only zones, whose GPU temperature the demo changes
//! while the agent reads it.
//!
//! Invariants:
//! - Temperatures are rewritten in place (same inode), as sysfs values change: the agent keeps
//!   its files open across reads.
//! - No capture crosses a real trip point, and the throttling machine's capture carries no GPU
//!   reading (`files::capture_text`), so only this tree makes the machine throttle.

use std::path::Path;

use edgewatch_test_kit::sysfs::FakeSysfs;

/// The GPU zone's passive trip point, m°C (AGX Orin's `gpu-thermal`).
pub const GPU_TRIP_MILLICELSIUS: i64 = 95_500;
/// The GPU zone's temperature while the demo heats it, m°C.
pub const GPU_HOT_MILLICELSIUS: i64 = 97_250;
/// The GPU zone's temperature otherwise, m°C.
pub const GPU_COOL_MILLICELSIUS: i64 = 58_000;

// Heating must cross the trip, and cooling must leave it by more than the agent's default
// hysteresis (2 °C).
const _: () = assert!(GPU_HOT_MILLICELSIUS >= GPU_TRIP_MILLICELSIUS);
const _: () = assert!(GPU_COOL_MILLICELSIUS < GPU_TRIP_MILLICELSIUS - 2_000);

/// Index of the GPU zone.
const GPU_ZONE: u32 = 1;

/// A fake thermal tree rooted at a directory (the agent's `thermal.sysfs_root`).
#[derive(Debug)]
pub struct ThermalTree {
    tree: FakeSysfs,
}

impl ThermalTree {
    /// Builds the tree under `root`: `cpu-thermal`, `gpu-thermal` and `tj-thermal` zones, cool.
    pub fn create(root: &Path) -> std::io::Result<Self> {
        let tree = FakeSysfs::at(root);
        tree.zone(
            0,
            "cpu-thermal",
            55_000,
            &[(99_000, "passive", 0), (105_000, "critical", 0)],
        )?;
        tree.zone(
            GPU_ZONE,
            "gpu-thermal",
            GPU_COOL_MILLICELSIUS,
            &[
                (GPU_TRIP_MILLICELSIUS, "passive", 0),
                (105_000, "critical", 0),
            ],
        )?;
        tree.zone(
            2,
            "tj-thermal",
            60_000,
            &[(99_000, "passive", 0), (105_000, "critical", 0)],
        )?;
        Ok(Self { tree })
    }

    /// Sets the GPU zone's temperature.
    pub fn set_gpu_millicelsius(&self, millicelsius: i64) -> std::io::Result<()> {
        Ok(self.tree.set_temp(GPU_ZONE, millicelsius)?)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn heating_rewrites_the_gpu_zone_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let tree = ThermalTree::create(dir.path()).unwrap();
        let temp = dir.path().join("sys/class/thermal/thermal_zone1/temp");
        let inode = |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
        let before = inode(&temp);
        tree.set_gpu_millicelsius(GPU_HOT_MILLICELSIUS).unwrap();
        assert_eq!(inode(&temp), before);
        assert_eq!(
            std::fs::read_to_string(&temp).unwrap(),
            format!("{GPU_HOT_MILLICELSIUS}\n")
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join("sys/class/thermal/thermal_zone1/type"))
                .unwrap(),
            "gpu-thermal\n"
        );
    }
}
