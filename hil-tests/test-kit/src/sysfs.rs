//! A fake Jetson sysfs tree in a directory, laid out like the real one: class directories are
//! symlinks into `devices`, the GPU is found through `device/of_node/name`, and every cpufreq
//! policy also holds the `cpuinfo_cur_freq` the reader must never open.
//!
//! ```text
//! <root>/sys/devices/virtual/thermal/thermal_zone<N>/{type,temp,policy,trip_point_<i>_{temp,type,hyst}}
//! <root>/sys/class/thermal/thermal_zone<N>                      -> the zone's devices directory
//! <root>/sys/devices/system/cpu/cpufreq/policy<N>/{cpuinfo_max_freq,cpuinfo_min_freq,
//!                                                   scaling_max_freq,scaling_cur_freq,
//!                                                   cpuinfo_cur_freq,related_cpus}
//! <root>/sys/devices/system/cpu/cpu<C>/cpufreq                  -> its policy
//! <root>/sys/devices/platform/bus@0/<gpu>/devfreq/<gpu>/{cur_freq,max_freq,min_freq,
//!                                                        available_frequencies}
//! <root>/sys/class/devfreq/<gpu>                                -> the GPU's devfreq directory
//! <root>/sys/devices/platform/<device>/hwmon/hwmon<N>/{name,...} <- sys/class/hwmon/hwmon<N>
//! <root>/var/lib/nvpmodel/status                                 "pmode:NNNN"
//! ```
//!
//! The samplers' tests read it with the real reader, the HIL rig and the demo point a real agent
//! at it (`thermal.sysfs_root`).
//!
//! Invariants:
//! - Values are rewritten in place (same inode), as sysfs values change: readers keep their files
//!   open across reads.
//! - Every value file ends in a newline, as the kernel writes them; device-tree strings end in NUL.
//! - Nothing is written outside the root.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use tempfile::TempDir;

/// Trip point: (millidegrees, type, hysteresis in millidegrees).
pub type TripSpec<'a> = (i64, &'a str, i64);

/// A file, directory or link of the tree could not be made.
#[derive(Debug, thiserror::Error)]
#[error("{action} {}: {source}", path.display())]
pub struct SysfsError {
    /// What was being done ("writing", "linking", ...).
    pub action: &'static str,
    /// The path it was done to.
    pub path: PathBuf,
    /// The I/O error.
    pub source: std::io::Error,
}

impl From<SysfsError> for std::io::Error {
    fn from(error: SysfsError) -> Self {
        Self::new(error.source.kind(), error.to_string())
    }
}

/// Result of building or changing a fake tree.
pub type Result<T = (), E = SysfsError> = std::result::Result<T, E>;

/// The GPU of the AGX Orin-like tree, by its devfreq name.
pub const ORIN_GPU: &str = "17000000.gpu";

/// A fake sysfs tree rooted at a directory (its own temporary one, or one given).
#[derive(Debug)]
pub struct FakeSysfs {
    root: PathBuf,
    /// The temporary directory the tree lives in, removed on drop; `None` for a given root.
    _dir: Option<TempDir>,
}

impl FakeSysfs {
    /// An empty tree in a new temporary directory.
    pub fn empty() -> Result<Self> {
        let dir = tempfile::tempdir().map_err(|source| SysfsError {
            action: "creating a directory in",
            path: std::env::temp_dir(),
            source,
        })?;
        Ok(Self {
            root: dir.path().to_owned(),
            _dir: Some(dir),
        })
    }

    /// An empty tree rooted at `root` (created as files are written; kept on drop).
    pub fn at(root: &Path) -> Self {
        Self {
            root: root.to_owned(),
            _dir: None,
        }
    }

    /// An AGX Orin-like tree in a new temporary directory: cpu, gpu, tj and PMIC zones; three
    /// 4-core clusters at 2201.6 MHz; the ga10b GPU at 1300.5 MHz; an INA3221 hwmon and
    /// `soctherm_oc` with three channels; power mode 0.
    pub fn orin() -> Result<Self> {
        let fake = Self::empty()?;
        fake.zone(
            0,
            "cpu-thermal",
            50_000,
            &[(65_000, "passive", 0), (105_000, "critical", 0)],
        )?;
        fake.zone(1, "gpu-thermal", 48_000, &[(95_500, "passive", 0)])?;
        fake.zone(
            2,
            "tj-thermal",
            50_000,
            &[(70_000, "passive", 0), (80_000, "active", 0)],
        )?;
        fake.zone(3, "PMIC-Die", 100_000, &[(90_000, "passive", 0)])?;
        fake.orin_devices(729_600)?;
        Ok(fake)
    }

    /// Everything of the AGX Orin-like tree but its thermal zones: three 4-core clusters at
    /// 2201.6 MHz running at `cpu_cur_khz`; the ga10b GPU at 1300.5 MHz; an INA3221 hwmon and
    /// `soctherm_oc` with three channels; power mode 0.
    pub fn orin_devices(&self, cpu_cur_khz: u64) -> Result {
        for policy in [0, 4, 8] {
            self.policy(policy, 2_201_600, 2_201_600, cpu_cur_khz)?;
        }
        self.gpu(
            ORIN_GPU,
            "ga10b",
            306_000_000,
            1_300_500_000,
            &[306_000_000, 612_000_000, 918_000_000, 1_300_500_000],
        )?;
        self.hwmon(
            0,
            "i2c-1/1-0040",
            "ina3221",
            &[("in1_input", "5000"), ("curr1_input", "1200")],
        )?;
        self.hwmon(
            3,
            "soctherm-oc-event",
            "soctherm_oc",
            &[
                ("oc1_event_cnt", "0"),
                ("oc2_event_cnt", "0"),
                ("oc3_event_cnt", "1200"),
                ("oc1_throt_en", "1"),
                ("oc2_throt_en", "1"),
                ("oc3_throt_en", "1"),
            ],
        )?;
        self.power_mode(0)
    }

    /// The tree's root (a reader's or agent's `sysfs_root`).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `rel` under the root.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    /// Writes `content` to `rel` in place (same inode, as sysfs values change), creating
    /// directories.
    pub fn write(&self, rel: &str, content: &str) -> Result {
        let path = self.path(rel);
        self.create_parent(&path)?;
        fs::write(&path, content).map_err(|source| SysfsError {
            action: "writing",
            path,
            source,
        })
    }

    fn link(&self, target: &str, rel: &str) -> Result {
        let path = self.path(rel);
        self.create_parent(&path)?;
        symlink(self.path(target), &path).map_err(|source| SysfsError {
            action: "linking",
            path,
            source,
        })
    }

    fn create_parent(&self, path: &Path) -> Result {
        match path.parent() {
            Some(parent) => fs::create_dir_all(parent).map_err(|source| SysfsError {
                action: "creating",
                path: parent.to_owned(),
                source,
            }),
            None => Ok(()),
        }
    }

    /// Thermal zone `n` of type `kind` at `millicelsius`, with its trip points, linked from
    /// `sys/class/thermal`.
    pub fn zone(&self, n: u32, kind: &str, millicelsius: i64, trips: &[TripSpec<'_>]) -> Result {
        let dir = format!("sys/devices/virtual/thermal/thermal_zone{n}");
        self.write(&format!("{dir}/type"), &format!("{kind}\n"))?;
        self.write(&format!("{dir}/temp"), &format!("{millicelsius}\n"))?;
        self.write(&format!("{dir}/policy"), "step_wise\n")?;
        for (i, (temp, kind, hyst)) in trips.iter().enumerate() {
            self.write(&format!("{dir}/trip_point_{i}_temp"), &format!("{temp}\n"))?;
            self.write(&format!("{dir}/trip_point_{i}_type"), &format!("{kind}\n"))?;
            self.write(&format!("{dir}/trip_point_{i}_hyst"), &format!("{hyst}\n"))?;
        }
        self.link(&dir, &format!("sys/class/thermal/thermal_zone{n}"))
    }

    /// Sets zone `n`'s temperature.
    pub fn set_temp(&self, n: u32, millicelsius: i64) -> Result {
        self.write(
            &format!("sys/devices/virtual/thermal/thermal_zone{n}/temp"),
            &format!("{millicelsius}\n"),
        )
    }

    /// A cpufreq policy covering CPUs `first..first + 4`, with `cpuN/cpufreq` links to it.
    pub fn policy(
        &self,
        first: u32,
        cpuinfo_max_khz: u64,
        scaling_max_khz: u64,
        cur_khz: u64,
    ) -> Result {
        let dir = format!("sys/devices/system/cpu/cpufreq/policy{first}");
        self.write(
            &format!("{dir}/cpuinfo_max_freq"),
            &format!("{cpuinfo_max_khz}\n"),
        )?;
        self.write(&format!("{dir}/cpuinfo_min_freq"), "115200\n")?;
        self.write(
            &format!("{dir}/scaling_max_freq"),
            &format!("{scaling_max_khz}\n"),
        )?;
        self.write(&format!("{dir}/scaling_cur_freq"), &format!("{cur_khz}\n"))?;
        self.write(&format!("{dir}/cpuinfo_cur_freq"), &format!("{cur_khz}\n"))?;
        self.write(
            &format!("{dir}/related_cpus"),
            &format!("{} {} {} {}\n", first, first + 1, first + 2, first + 3),
        )?;
        for cpu in first..first + 4 {
            self.link(&dir, &format!("sys/devices/system/cpu/cpu{cpu}/cpufreq"))?;
        }
        Ok(())
    }

    /// Sets the `scaling_max_freq` of the policy starting at CPU `policy`.
    pub fn set_scaling_max(&self, policy: u32, khz: u64) -> Result {
        self.write(
            &format!("sys/devices/system/cpu/cpufreq/policy{policy}/scaling_max_freq"),
            &format!("{khz}\n"),
        )
    }

    /// A GPU devfreq device `name` whose device-tree node is named `of_node_name`; its minimum
    /// is the first of `available`.
    pub fn gpu(
        &self,
        name: &str,
        of_node_name: &str,
        cur_hz: u64,
        max_hz: u64,
        available: &[u64],
    ) -> Result {
        let device = format!("sys/devices/platform/bus@0/{name}");
        let devfreq = format!("{device}/devfreq/{name}");
        let of_node = "sys/firmware/devicetree/base/bus@0/gpu@17000000";
        // Device-tree strings end in NUL.
        self.write(&format!("{of_node}/name"), &format!("{of_node_name}\0"))?;
        self.write(&format!("{devfreq}/cur_freq"), &format!("{cur_hz}\n"))?;
        self.write(&format!("{devfreq}/max_freq"), &format!("{max_hz}\n"))?;
        self.write(
            &format!("{devfreq}/min_freq"),
            &format!("{}\n", available[0]),
        )?;
        let list: Vec<String> = available.iter().map(u64::to_string).collect();
        self.write(
            &format!("{devfreq}/available_frequencies"),
            &format!("{}\n", list.join(" ")),
        )?;
        self.link(of_node, &format!("{device}/of_node"))?;
        self.link(&device, &format!("{devfreq}/device"))?;
        self.link(&devfreq, &format!("sys/class/devfreq/{name}"))
    }

    /// Sets the GPU `name`'s `max_freq`.
    pub fn set_gpu_max(&self, name: &str, hz: u64) -> Result {
        self.write(
            &format!("sys/devices/platform/bus@0/{name}/devfreq/{name}/max_freq"),
            &format!("{hz}\n"),
        )
    }

    /// hwmon device `n` of platform device `device`, named `name`, holding `files`.
    pub fn hwmon(&self, n: u32, device: &str, name: &str, files: &[(&str, &str)]) -> Result {
        let dir = format!("sys/devices/platform/{device}/hwmon/hwmon{n}");
        self.write(&format!("{dir}/name"), &format!("{name}\n"))?;
        for (file, value) in files {
            self.write(&format!("{dir}/{file}"), &format!("{value}\n"))?;
        }
        self.link(&dir, &format!("sys/class/hwmon/hwmon{n}"))
    }

    /// Sets the over-current event count of `soctherm_oc` channel `channel`.
    pub fn set_oc(&self, channel: u32, count: u64) -> Result {
        self.write(
            &format!("sys/devices/platform/soctherm-oc-event/hwmon/hwmon3/oc{channel}_event_cnt"),
            &format!("{count}\n"),
        )
    }

    /// The nvpmodel status file, power mode `mode`.
    pub fn power_mode(&self, mode: u32) -> Result {
        self.write("var/lib/nvpmodel/status", &format!("pmode:{mode:04}\n"))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn read(fake: &FakeSysfs, rel: &str) -> String {
        fs::read_to_string(fake.path(rel)).unwrap()
    }

    #[test]
    fn a_zone_is_reached_through_its_class_link_and_rewritten_in_place() {
        let fake = FakeSysfs::empty().unwrap();
        fake.zone(1, "gpu-thermal", 58_000, &[(95_500, "passive", 0)])
            .unwrap();
        let temp = "sys/class/thermal/thermal_zone1/temp";
        let inode =
            |rel: &str| std::os::unix::fs::MetadataExt::ino(&fs::metadata(fake.path(rel)).unwrap());
        let before = inode(temp);
        fake.set_temp(1, 97_250).unwrap();
        assert_eq!(inode(temp), before);
        assert_eq!(read(&fake, temp), "97250\n");
        assert_eq!(
            read(&fake, "sys/class/thermal/thermal_zone1/type"),
            "gpu-thermal\n"
        );
        assert_eq!(
            read(&fake, "sys/class/thermal/thermal_zone1/trip_point_0_temp"),
            "95500\n"
        );
    }

    #[test]
    fn the_orin_tree_links_cpus_gpu_and_hwmon_through_their_classes() {
        let fake = FakeSysfs::orin().unwrap();
        assert_eq!(
            read(
                &fake,
                "sys/devices/system/cpu/cpu5/cpufreq/scaling_cur_freq"
            ),
            "729600\n"
        );
        assert_eq!(
            read(&fake, "sys/class/devfreq/17000000.gpu/device/of_node/name"),
            "ga10b\0"
        );
        assert_eq!(read(&fake, "sys/class/hwmon/hwmon3/name"), "soctherm_oc\n");
        assert_eq!(read(&fake, "var/lib/nvpmodel/status"), "pmode:0000\n");
    }

    #[test]
    fn a_tree_at_a_given_root_stays_there_after_drop() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("sysfs");
        FakeSysfs::at(&root).power_mode(2).unwrap();
        assert_eq!(
            fs::read_to_string(root.join("var/lib/nvpmodel/status")).unwrap(),
            "pmode:0002\n"
        );
    }

    #[test]
    fn a_failed_write_names_the_path() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("file"), "").unwrap();
        let error = FakeSysfs::at(&dir.path().join("file"))
            .power_mode(0)
            .unwrap_err();
        assert!(error.to_string().starts_with("creating "), "{error}");
        assert!(
            error.to_string().contains("file/var/lib/nvpmodel"),
            "{error}"
        );
    }
}
