//! A small fake Jetson sysfs tree for the throttling machine: thermal zones laid out as on the
//! target (`sys/class/thermal/thermal_zoneN` linking into `sys/devices/virtual/thermal`), whose
//! temperatures the demo changes while the agent reads them.
//!
//! Invariants:
//! - Temperatures are rewritten in place (same inode), as sysfs values change: the agent keeps
//!   its files open across reads.
//! - No capture crosses a real trip point, and the throttling machine's capture carries no GPU
//!   reading (`files::capture_text`), so only this tree makes the machine throttle.

use std::path::{Path, PathBuf};

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
#[derive(Debug, Clone)]
pub struct ThermalTree {
    root: PathBuf,
}

impl ThermalTree {
    /// Builds the tree under `root`: `cpu-thermal`, `gpu-thermal` and `tj-thermal` zones, cool.
    pub fn create(root: &Path) -> std::io::Result<Self> {
        let tree = Self {
            root: root.to_owned(),
        };
        tree.zone(
            0,
            "cpu-thermal",
            55_000,
            &[(99_000, "passive"), (105_000, "critical")],
        )?;
        tree.zone(
            GPU_ZONE,
            "gpu-thermal",
            GPU_COOL_MILLICELSIUS,
            &[(GPU_TRIP_MILLICELSIUS, "passive"), (105_000, "critical")],
        )?;
        tree.zone(
            2,
            "tj-thermal",
            60_000,
            &[(99_000, "passive"), (105_000, "critical")],
        )?;
        Ok(tree)
    }

    /// Sets the GPU zone's temperature.
    pub fn set_gpu_millicelsius(&self, millicelsius: i64) -> std::io::Result<()> {
        std::fs::write(
            self.zone_dir(GPU_ZONE).join("temp"),
            format!("{millicelsius}\n"),
        )
    }

    fn zone_dir(&self, n: u32) -> PathBuf {
        self.root
            .join(format!("sys/devices/virtual/thermal/thermal_zone{n}"))
    }

    fn zone(
        &self,
        n: u32,
        kind: &str,
        millicelsius: i64,
        trips: &[(i64, &str)],
    ) -> std::io::Result<()> {
        let dir = self.zone_dir(n);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("type"), format!("{kind}\n"))?;
        std::fs::write(dir.join("temp"), format!("{millicelsius}\n"))?;
        for (i, (temp, kind)) in trips.iter().enumerate() {
            std::fs::write(
                dir.join(format!("trip_point_{i}_temp")),
                format!("{temp}\n"),
            )?;
            std::fs::write(
                dir.join(format!("trip_point_{i}_type")),
                format!("{kind}\n"),
            )?;
            std::fs::write(dir.join(format!("trip_point_{i}_hyst")), "0\n")?;
        }
        let class = self.root.join("sys/class/thermal");
        std::fs::create_dir_all(&class)?;
        let link = class.join(format!("thermal_zone{n}"));
        if !link.exists() {
            std::os::unix::fs::symlink(&dir, link)?;
        }
        Ok(())
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
