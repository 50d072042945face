//! A fake Jetson sysfs tree in a temporary directory, laid out like the real one: class
//! directories are symlinks into `devices`, the GPU is found through `device/of_node/name`, and
//! every cpufreq policy also holds the `cpuinfo_cur_freq` the reader must never open.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use edgewatch_samplers::thermal::config::{SysfsConfig, ThermalConfig, ThermalConfigRaw};
use tempfile::TempDir;

/// Trip point: (millidegrees, type, hysteresis in millidegrees).
pub type TripSpec<'a> = (i64, &'a str, i64);

pub struct FakeSysfs {
    dir: TempDir,
}

impl FakeSysfs {
    pub fn empty() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    /// An AGX Orin-like tree: cpu, gpu, tj and PMIC zones; three 4-core clusters at 2201.6 MHz;
    /// the ga10b GPU at 1300.5 MHz; an INA3221 hwmon and `soctherm_oc` with three channels;
    /// power mode 0.
    pub fn orin() -> Self {
        let fake = Self::empty();
        fake.zone(
            0,
            "cpu-thermal",
            50_000,
            &[(65_000, "passive", 0), (105_000, "critical", 0)],
        );
        fake.zone(1, "gpu-thermal", 48_000, &[(95_500, "passive", 0)]);
        fake.zone(
            2,
            "tj-thermal",
            50_000,
            &[(70_000, "passive", 0), (80_000, "active", 0)],
        );
        fake.zone(3, "PMIC-Die", 100_000, &[(90_000, "passive", 0)]);
        for policy in [0, 4, 8] {
            fake.policy(policy, 2_201_600, 2_201_600, 729_600);
        }
        fake.gpu(
            "17000000.gpu",
            "ga10b",
            306_000_000,
            1_300_500_000,
            &[306_000_000, 612_000_000, 918_000_000, 1_300_500_000],
        );
        fake.hwmon(
            0,
            "i2c-1/1-0040",
            "ina3221",
            &[("in1_input", "5000"), ("curr1_input", "1200")],
        );
        fake.hwmon(
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
        );
        fake.power_mode(0);
        fake
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.root().join(rel)
    }

    /// Writes `content` to `rel` in place (same inode, as sysfs values change), creating
    /// directories.
    pub fn write(&self, rel: &str, content: &str) {
        let path = self.path(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, content).unwrap();
    }

    fn link(&self, target: &str, rel: &str) {
        let path = self.path(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        symlink(self.path(target), path).unwrap();
    }

    pub fn zone(&self, n: u32, kind: &str, millicelsius: i64, trips: &[TripSpec<'_>]) {
        let dir = format!("sys/devices/virtual/thermal/thermal_zone{n}");
        self.write(&format!("{dir}/type"), &format!("{kind}\n"));
        self.write(&format!("{dir}/temp"), &format!("{millicelsius}\n"));
        self.write(&format!("{dir}/policy"), "step_wise\n");
        for (i, (temp, kind, hyst)) in trips.iter().enumerate() {
            self.write(&format!("{dir}/trip_point_{i}_temp"), &format!("{temp}\n"));
            self.write(&format!("{dir}/trip_point_{i}_type"), &format!("{kind}\n"));
            self.write(&format!("{dir}/trip_point_{i}_hyst"), &format!("{hyst}\n"));
        }
        self.link(&dir, &format!("sys/class/thermal/thermal_zone{n}"));
    }

    pub fn set_temp(&self, n: u32, millicelsius: i64) {
        self.write(
            &format!("sys/devices/virtual/thermal/thermal_zone{n}/temp"),
            &format!("{millicelsius}\n"),
        );
    }

    /// A cpufreq policy covering CPUs `first..first + 4`, with `cpuN/cpufreq` links to it.
    pub fn policy(&self, first: u32, cpuinfo_max_khz: u64, scaling_max_khz: u64, cur_khz: u64) {
        let dir = format!("sys/devices/system/cpu/cpufreq/policy{first}");
        self.write(
            &format!("{dir}/cpuinfo_max_freq"),
            &format!("{cpuinfo_max_khz}\n"),
        );
        self.write(&format!("{dir}/cpuinfo_min_freq"), "115200\n");
        self.write(
            &format!("{dir}/scaling_max_freq"),
            &format!("{scaling_max_khz}\n"),
        );
        self.write(&format!("{dir}/scaling_cur_freq"), &format!("{cur_khz}\n"));
        self.write(&format!("{dir}/cpuinfo_cur_freq"), &format!("{cur_khz}\n"));
        self.write(
            &format!("{dir}/related_cpus"),
            &format!("{} {} {} {}\n", first, first + 1, first + 2, first + 3),
        );
        for cpu in first..first + 4 {
            self.link(&dir, &format!("sys/devices/system/cpu/cpu{cpu}/cpufreq"));
        }
    }

    pub fn set_scaling_max(&self, policy: u32, khz: u64) {
        self.write(
            &format!("sys/devices/system/cpu/cpufreq/policy{policy}/scaling_max_freq"),
            &format!("{khz}\n"),
        );
    }

    pub fn gpu(&self, name: &str, of_node_name: &str, cur_hz: u64, max_hz: u64, available: &[u64]) {
        let device = format!("sys/devices/platform/bus@0/{name}");
        let devfreq = format!("{device}/devfreq/{name}");
        let of_node = "sys/firmware/devicetree/base/bus@0/gpu@17000000";
        // Device-tree strings end in NUL.
        self.write(&format!("{of_node}/name"), &format!("{of_node_name}\0"));
        self.write(&format!("{devfreq}/cur_freq"), &format!("{cur_hz}\n"));
        self.write(&format!("{devfreq}/max_freq"), &format!("{max_hz}\n"));
        self.write(
            &format!("{devfreq}/min_freq"),
            &format!("{}\n", available[0]),
        );
        let list: Vec<String> = available.iter().map(u64::to_string).collect();
        self.write(
            &format!("{devfreq}/available_frequencies"),
            &format!("{}\n", list.join(" ")),
        );
        self.link(of_node, &format!("{device}/of_node"));
        self.link(&device, &format!("{devfreq}/device"));
        self.link(&devfreq, &format!("sys/class/devfreq/{name}"));
    }

    pub fn set_gpu_max(&self, name: &str, hz: u64) {
        self.write(
            &format!("sys/devices/platform/bus@0/{name}/devfreq/{name}/max_freq"),
            &format!("{hz}\n"),
        );
    }

    pub fn hwmon(&self, n: u32, device: &str, name: &str, files: &[(&str, &str)]) {
        let dir = format!("sys/devices/platform/{device}/hwmon/hwmon{n}");
        self.write(&format!("{dir}/name"), &format!("{name}\n"));
        for (file, value) in files {
            self.write(&format!("{dir}/{file}"), &format!("{value}\n"));
        }
        self.link(&dir, &format!("sys/class/hwmon/hwmon{n}"));
    }

    pub fn set_oc(&self, channel: u32, count: u64) {
        self.write(
            &format!("sys/devices/platform/soctherm-oc-event/hwmon/hwmon3/oc{channel}_event_cnt"),
            &format!("{count}\n"),
        );
    }

    pub fn power_mode(&self, mode: u32) {
        self.write("var/lib/nvpmodel/status", &format!("pmode:{mode:04}\n"));
    }

    /// The sysfs part of a configuration rooted here.
    pub fn sysfs_config(&self) -> SysfsConfig {
        self.config(ThermalConfigRaw::default()).sysfs
    }

    /// `raw` with `sysfs_root` set here, validated.
    pub fn config(&self, raw: ThermalConfigRaw) -> ThermalConfig {
        ThermalConfigRaw {
            sysfs_root: self.root().to_owned(),
            ..raw
        }
        .validate()
        .unwrap()
    }
}
