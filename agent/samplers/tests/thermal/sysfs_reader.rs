//! The sysfs reader on fake trees: what it finds, what it re-reads, and what it never opens.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use edgewatch_samplers::thermal::config::RawThermalConfig;
use edgewatch_samplers::thermal::sysfs::{FreqReading, TripKind};
use edgewatch_samplers::thermal::{SysfsError, SysfsReader};

use crate::fake_sysfs::{FakeSysfs, RootedConfig};

/// Open and access events on watched directories, by file name, through inotify.
struct FileWatch {
    fd: i32,
    /// (IN_OPEN, IN_ACCESS) counts per file name.
    seen: BTreeMap<String, (u32, u32)>,
}

impl FileWatch {
    fn new(dirs: &[&Path]) -> Self {
        // SAFETY: plain syscall with constant flags; the result is checked.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        assert!(fd >= 0, "inotify_init1 failed");
        for dir in dirs {
            let path = CString::new(dir.as_os_str().as_bytes()).unwrap();
            // SAFETY: `path` is a valid NUL-terminated string that outlives the call.
            let wd = unsafe {
                libc::inotify_add_watch(fd, path.as_ptr(), libc::IN_OPEN | libc::IN_ACCESS)
            };
            assert!(wd >= 0, "cannot watch {}", dir.display());
        }
        Self {
            fd,
            seen: BTreeMap::new(),
        }
    }

    /// Drains the queued events into `seen`.
    fn drain(&mut self) -> &BTreeMap<String, (u32, u32)> {
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            // SAFETY: `buf` is valid for writes of its length; the fd is ours and non-blocking.
            let n = unsafe { libc::read(self.fd, buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                break;
            }
            let mut at = 0;
            let n = n as usize;
            while at + 16 <= n {
                let word =
                    |o: usize| u32::from_ne_bytes(buf[at + o..at + o + 4].try_into().unwrap());
                let (mask, len) = (word(4), word(12) as usize);
                assert_eq!(mask & libc::IN_Q_OVERFLOW, 0, "inotify queue overflowed");
                let name = &buf[at + 16..at + 16 + len];
                let name = String::from_utf8_lossy(name)
                    .trim_end_matches('\0')
                    .to_owned();
                let entry = self.seen.entry(name).or_default();
                if mask & libc::IN_OPEN != 0 {
                    entry.0 += 1;
                }
                if mask & libc::IN_ACCESS != 0 {
                    entry.1 += 1;
                }
                at += 16 + len;
            }
        }
        &self.seen
    }
}

impl Drop for FileWatch {
    fn drop(&mut self) {
        // SAFETY: the fd is ours and closed once.
        unsafe { libc::close(self.fd) };
    }
}

#[test]
fn the_reader_never_opens_cpuinfo_cur_freq_and_reads_each_metric_once_per_poll() {
    let fake = FakeSysfs::orin().unwrap();
    let policies: Vec<_> = [0, 4, 8]
        .iter()
        .map(|p| fake.path(&format!("sys/devices/system/cpu/cpufreq/policy{p}")))
        .collect();
    let dirs: Vec<&Path> = policies.iter().map(|p| p.as_path()).collect();
    let mut watch = FileWatch::new(&dirs);

    let mut reader = SysfsReader::open(&fake.sysfs_config()).unwrap();
    const POLLS: u32 = 25;
    for _ in 0..POLLS {
        reader.read();
    }
    let seen = watch.drain();

    assert!(
        !seen.contains_key("cpuinfo_cur_freq"),
        "cpuinfo_cur_freq was touched: {seen:?}"
    );
    // The watch works: each metric file was opened once (three policies) and read once per
    // poll; the static maximum was read at open only.
    assert_eq!(seen.get("scaling_cur_freq"), Some(&(3, 3 * POLLS)));
    assert_eq!(seen.get("scaling_max_freq"), Some(&(3, 3 * POLLS)));
    assert_eq!(seen.get("cpuinfo_max_freq").map(|s| s.0), Some(3));
}

#[test]
fn the_per_cpu_layout_is_read_without_touching_cpuinfo_cur_freq_either() {
    let fake = FakeSysfs::empty().unwrap();
    for cpu in 0..2 {
        let dir = format!("sys/devices/system/cpu/cpu{cpu}/cpufreq");
        fake.write(&format!("{dir}/cpuinfo_max_freq"), "1479000\n")
            .unwrap();
        fake.write(&format!("{dir}/scaling_max_freq"), "921600\n")
            .unwrap();
        fake.write(&format!("{dir}/scaling_cur_freq"), "102000\n")
            .unwrap();
        fake.write(&format!("{dir}/cpuinfo_cur_freq"), "102000\n")
            .unwrap();
    }
    let dirs = [
        fake.path("sys/devices/system/cpu/cpu0/cpufreq"),
        fake.path("sys/devices/system/cpu/cpu1/cpufreq"),
    ];
    let mut watch = FileWatch::new(&[dirs[0].as_path(), dirs[1].as_path()]);
    let mut reader = SysfsReader::open(&fake.sysfs_config()).unwrap();
    let names: Vec<&str> = reader
        .inventory()
        .cpu_policies
        .iter()
        .map(|p| p.name.as_str())
        .collect();
    assert_eq!(names, ["cpu0", "cpu1"]);
    let snapshot = reader.read().clone();
    assert_eq!(
        snapshot.cpu_policies[1],
        FreqReading {
            cur_khz: Some(102_000),
            max_khz: Some(921_600)
        }
    );
    let seen = watch.drain();
    assert!(!seen.contains_key("cpuinfo_cur_freq"), "{seen:?}");
    assert_eq!(seen.get("scaling_cur_freq"), Some(&(2, 2)));
}

#[test]
fn discovery_finds_zones_trips_policies_the_gpu_by_device_tree_name_and_soctherm_oc_by_name() {
    let fake = FakeSysfs::orin().unwrap();
    let reader = SysfsReader::open(&fake.sysfs_config()).unwrap();
    let inv = reader.inventory();

    let zones: Vec<(u32, &str, usize)> = inv
        .zones
        .iter()
        .map(|z| (z.id, z.kind.as_str(), z.trips.len()))
        .collect();
    assert_eq!(
        zones,
        [
            (0, "cpu-thermal", 2),
            (1, "gpu-thermal", 1),
            (2, "tj-thermal", 2),
            (3, "PMIC-Die", 1)
        ]
    );
    let cpu = &inv.zones[0].trips;
    assert_eq!((cpu[0].celsius, cpu[0].kind), (65.0, TripKind::Passive));
    assert_eq!((cpu[1].celsius, cpu[1].kind), (105.0, TripKind::Critical));
    assert_eq!(inv.zones[2].trips[1].kind, TripKind::Active);

    let policies: Vec<(&str, Option<u64>)> = inv
        .cpu_policies
        .iter()
        .map(|p| (p.name.as_str(), p.hardware_max_khz))
        .collect();
    assert_eq!(
        policies,
        [
            ("policy0", Some(2_201_600)),
            ("policy4", Some(2_201_600)),
            ("policy8", Some(2_201_600))
        ]
    );
    let gpu = inv.gpu.as_ref().unwrap();
    assert_eq!(
        (gpu.device.as_str(), gpu.hardware_max_khz),
        ("17000000.gpu", Some(1_300_500))
    );
    // hwmon0 is an INA3221; soctherm_oc is hwmon3.
    assert_eq!(inv.oc_channels, ["oc1", "oc2", "oc3"]);
    assert!(inv.power_inputs.is_empty());
    // 4 temps + 3 × 2 cpufreq + 2 devfreq + 3 oc counters.
    assert_eq!(reader.status().open_files, 15);
}

#[test]
fn each_poll_re_reads_the_open_files_and_an_unreadable_value_is_counted_not_fatal() {
    let fake = FakeSysfs::orin().unwrap();
    let mut reader = SysfsReader::open(&fake.sysfs_config()).unwrap();
    let first = reader.read().clone();
    assert_eq!(
        first.zone_celsius,
        [Some(50.0), Some(48.0), Some(50.0), Some(100.0)]
    );
    assert_eq!(
        first.gpu,
        Some(FreqReading {
            cur_khz: Some(306_000),
            max_khz: Some(1_300_500)
        })
    );
    assert_eq!(first.oc_counts, [Some(0), Some(0), Some(1200)]);
    assert_eq!(first.power_mode, Some(0));

    fake.set_scaling_max(4, 1_497_600).unwrap();
    fake.set_gpu_max("17000000.gpu", 612_000_000).unwrap();
    fake.set_oc(3, 1204).unwrap();
    fake.write("sys/devices/virtual/thermal/thermal_zone0/temp", "-\n")
        .unwrap();
    // A power-gated GPU zone reads the -256 °C sentinel.
    fake.set_temp(1, -256_000).unwrap();
    // nvpmodel may replace its status file: the reader re-opens it by path.
    fake.write("var/lib/nvpmodel/status.new", "pmode:0002\n")
        .unwrap();
    fs::rename(
        fake.path("var/lib/nvpmodel/status.new"),
        fake.path("var/lib/nvpmodel/status"),
    )
    .unwrap();

    let second = reader.read().clone();
    assert_eq!(second.zone_celsius[0], None);
    assert_eq!(second.zone_celsius[1], None);
    assert_eq!(second.cpu_policies[1].max_khz, Some(1_497_600));
    assert_eq!(second.gpu.unwrap().max_khz, Some(612_000));
    assert_eq!(second.oc_counts[2], Some(1204));
    assert_eq!(second.power_mode, Some(2));
    let status = reader.status();
    assert_eq!(
        (status.polls, status.read_errors),
        (2, 1),
        "the sentinel is no error"
    );
    fake.set_temp(1, 61_250).unwrap();
    assert_eq!(reader.read().zone_celsius[1], Some(61.25));
}

#[test]
fn configured_power_inputs_read_microwatts_or_volts_times_amps() {
    let fake = FakeSysfs::orin().unwrap();
    fake.write(
        "sys/devices/platform/i2c-1/1-0040/hwmon/hwmon0/power1_input",
        "7250000\n",
    )
    .unwrap();
    let config = fake.config(
        toml::from_str::<RawThermalConfig>(
            r#"
            [[power_input]]
            rail = "VDD_IN"
            millivolts = "/sys/class/hwmon/hwmon0/in1_input"
            milliamps = "/sys/class/hwmon/hwmon0/curr1_input"
            [[power_input]]
            rail = "VDD_TOTAL"
            power_uw = "/sys/class/hwmon/hwmon0/power1_input"
            "#,
        )
        .unwrap(),
    );
    let mut reader = SysfsReader::open(&config.sysfs).unwrap();
    assert_eq!(reader.inventory().power_inputs, ["VDD_IN", "VDD_TOTAL"]);
    // 5000 mV × 1200 mA = 6000 mW; 7250000 µW = 7250 mW.
    assert_eq!(reader.read().power_mw, [Some(6000.0), Some(7250.0)]);
}

#[test]
fn a_configured_gpu_or_power_input_that_is_missing_is_an_error_naming_the_key() {
    let fake = FakeSysfs::orin().unwrap();
    let config = fake.config(RawThermalConfig {
        gpu_devfreq: Some("57000000.gpu".into()),
        ..RawThermalConfig::default()
    });
    let error = SysfsReader::open(&config.sysfs).unwrap_err();
    assert!(matches!(error, SysfsError::GpuDevfreqMissing { .. }));
    assert!(error.to_string().contains("thermal.gpu_devfreq"), "{error}");

    let config = fake.config(
        toml::from_str::<RawThermalConfig>(
            "[[power_input]]\nrail = \"X\"\npower_uw = \"/sys/class/hwmon/hwmon9/power1_input\"",
        )
        .unwrap(),
    );
    let error = SysfsReader::open(&config.sysfs).unwrap_err();
    assert!(error.to_string().contains("thermal.power_input"), "{error}");
}

#[test]
fn a_gpu_named_in_the_config_is_used_whatever_its_device_tree_name() {
    let fake = FakeSysfs::empty().unwrap();
    fake.gpu(
        "57000000.gpu",
        "gpu",
        76_800_000,
        921_600_000,
        &[76_800_000, 921_600_000],
    )
    .unwrap();
    let reader = SysfsReader::open(&fake.sysfs_config()).unwrap();
    assert!(reader.inventory().gpu.is_none(), "`gpu` is no known name");
    let config = fake.config(RawThermalConfig {
        gpu_devfreq: Some("57000000.gpu".into()),
        ..RawThermalConfig::default()
    });
    let reader = SysfsReader::open(&config.sysfs).unwrap();
    assert_eq!(
        reader.inventory().gpu.as_ref().unwrap().device,
        "57000000.gpu"
    );
}

#[test]
fn a_machine_without_jetson_sysfs_has_an_empty_inventory_and_reads_fine() {
    let fake = FakeSysfs::empty().unwrap();
    let mut reader = SysfsReader::open(&fake.sysfs_config()).unwrap();
    assert_eq!(reader.inventory(), &Default::default());
    let snapshot = reader.read();
    assert!(snapshot.zone_celsius.is_empty() && snapshot.gpu.is_none());
    assert_eq!(snapshot.power_mode, None);
    assert_eq!(reader.status().read_errors, 0);
}
