//! The sysfs reader: finds the Jetson's thermal zones, cpufreq policies, GPU devfreq node,
//! `soctherm_oc` over-current counters and configured rail power inputs under a root directory,
//! keeps their files open, and re-reads them into one reused [`SysfsSnapshot`].
//!
//! ```text
//! <root>/sys/class/thermal/thermal_zone<N>/{type, temp, trip_point_<i>_{temp,type,hyst}}
//! <root>/sys/devices/system/cpu/cpufreq/policy<N>/{scaling_cur_freq, scaling_max_freq, cpuinfo_max_freq}
//!        (or cpu<N>/cpufreq/ when there are no policy directories)
//! <root>/sys/class/devfreq/<gpu>/{cur_freq, max_freq, available_frequencies, device/of_node/name}
//! <root>/sys/class/hwmon/hwmon<N>/{name = "soctherm_oc", oc<k>_event_cnt}
//! <root>/var/lib/nvpmodel/status          ("pmode:0002": the power mode)
//! ```
//!
//! Invariants:
//! - **`cpuinfo_cur_freq` is never opened**: on Tegra, reading it queues work on the measured core
//!   and IPIs it (`tegra194-cpufreq.c`), which would disturb a control loop pinned there.
//!   `scaling_cur_freq` (the cached policy clock) is read instead. A test watches the fake tree
//!   with inotify and fails if the file is ever opened.
//! - Every metric file is opened once, at [`SysfsReader::open`], and re-read with one
//!   `pread(fd, buf, 0)` per poll into a stack buffer: a poll makes no allocation and one syscall
//!   per metric. Static values (trip points, hardware maxima) are read once at open. The power
//!   mode file is the exception: it is re-opened per poll, because nvpmodel may replace it.
//! - A metric that fails to read is `None` in that snapshot and counted in
//!   [`SysfsStatus::read_errors`]; it never fails the poll. A zone reading -256 °C or less is
//!   the "power domain off" sentinel: `None`, not a temperature and not an error. Missing optional hardware (no GPU
//!   devfreq, no `soctherm_oc`) is simply absent from the [`SysfsInventory`].
//! - Snapshot vectors are index-aligned with the inventory's and never change length after open.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::config::{PowerInputSource, SysfsConfig};

/// Largest sysfs value read: every metric here is a short decimal number.
const READ_BUF: usize = 64;
/// The hwmon device that exposes the soctherm over-current counters (Orin, Thor).
const SOCTHERM_OC_NAME: &str = "soctherm_oc";
/// Where nvpmodel records the current power mode.
const NVPMODEL_STATUS: &str = "var/lib/nvpmodel/status";
/// Trip points read per zone at most (Jetson zones have one to five).
const MAX_TRIPS_PER_ZONE: u32 = 32;
/// What a Jetson zone reads while its power domain is off (tegrastats prints it as `-256C`).
const ZONE_OFFLINE_MILLICELSIUS: i64 = -256_000;

/// Why the reader could not be opened. Missing optional hardware is not an error; a configured
/// file that is missing is.
#[derive(Debug, thiserror::Error)]
pub enum SysfsError {
    /// `thermal.gpu_devfreq` names a directory that does not exist under the root.
    #[error("key `thermal.gpu_devfreq`: {} does not exist", path.display())]
    GpuDevfreqMissing {
        /// The directory looked for.
        path: PathBuf,
    },
    /// A `[[thermal.power_input]]` file could not be opened.
    #[error("key `thermal.power_input`: rail {rail}: cannot open {}: {source}", path.display())]
    PowerInputUnreadable {
        /// The rail.
        rail: String,
        /// The file, under the root.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
}

/// Kind of a thermal trip point (`trip_point_N_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TripKind {
    /// Fan control; not throttling.
    Active,
    /// Software throttling (cpufreq/devfreq cooling devices).
    Passive,
    /// Imminent hardware action.
    Hot,
    /// Shutdown.
    Critical,
}

impl TripKind {
    fn parse(text: &str) -> Option<Self> {
        match text {
            "active" => Some(Self::Active),
            "passive" => Some(Self::Passive),
            "hot" => Some(Self::Hot),
            "critical" => Some(Self::Critical),
            _ => None,
        }
    }
}

/// One trip point of a zone, read once at open.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Trip {
    /// `N` of `trip_point_N_*`.
    pub index: u32,
    /// Trip temperature, °C.
    pub celsius: f64,
    /// Its kind.
    pub kind: TripKind,
    /// The zone's own hysteresis for it (`trip_point_N_hyst`), °C; 0 when absent.
    pub hysteresis_celsius: f64,
}

/// A thermal zone.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ZoneInfo {
    /// `N` of `thermal_zoneN`.
    pub id: u32,
    /// Its `type`, e.g. `cpu-thermal`.
    pub kind: String,
    /// Its trip points (unknown kinds and non-positive temperatures left out).
    pub trips: Vec<Trip>,
}

/// A cpufreq policy (one per cluster on Jetson).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CpuPolicyInfo {
    /// Directory name, e.g. `policy0` (or `cpu0` in the per-CPU layout).
    pub name: String,
    /// `cpuinfo_max_freq`, kHz: the hardware maximum.
    pub hardware_max_khz: Option<u64>,
}

/// The GPU's devfreq node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GpuInfo {
    /// Directory name under `/sys/class/devfreq`, e.g. `17000000.gpu`.
    pub device: String,
    /// Highest of `available_frequencies`, kHz, when the file exists.
    pub hardware_max_khz: Option<u64>,
}

/// What was found at open. Built by hand in tests of the pure logic.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SysfsInventory {
    /// Thermal zones, by zone number.
    pub zones: Vec<ZoneInfo>,
    /// cpufreq policies, by number.
    pub cpu_policies: Vec<CpuPolicyInfo>,
    /// The GPU devfreq node, if found.
    pub gpu: Option<GpuInfo>,
    /// Over-current channels of `soctherm_oc`, e.g. `oc1`, by number.
    pub oc_channels: Vec<String>,
    /// Configured power input rails, in configuration order.
    pub power_inputs: Vec<String>,
}

/// A clock reading: current and maximum (the cap), kHz.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FreqReading {
    /// `scaling_cur_freq` / devfreq `cur_freq`.
    pub cur_khz: Option<u64>,
    /// `scaling_max_freq` / devfreq `max_freq`.
    pub max_khz: Option<u64>,
}

/// One poll's values, index-aligned with the [`SysfsInventory`]. `None` = unreadable this time.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SysfsSnapshot {
    /// Zone temperatures, °C.
    pub zone_celsius: Vec<Option<f64>>,
    /// cpufreq policy clocks.
    pub cpu_policies: Vec<FreqReading>,
    /// GPU clocks (`None` when there is no GPU node).
    pub gpu: Option<FreqReading>,
    /// Over-current counters as read (cumulative since boot).
    pub oc_counts: Vec<Option<u64>>,
    /// Power input rails, mW.
    pub power_mw: Vec<Option<f64>>,
    /// nvpmodel power mode id.
    pub power_mode: Option<u32>,
}

impl SysfsSnapshot {
    /// An empty snapshot shaped like `inventory` (every value `None`).
    pub fn shaped_like(inventory: &SysfsInventory) -> Self {
        Self {
            zone_celsius: vec![None; inventory.zones.len()],
            cpu_policies: vec![FreqReading::default(); inventory.cpu_policies.len()],
            gpu: inventory.gpu.as_ref().map(|_| FreqReading::default()),
            oc_counts: vec![None; inventory.oc_channels.len()],
            power_mw: vec![None; inventory.power_inputs.len()],
            power_mode: None,
        }
    }
}

/// Counters of the reader's own work.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SysfsStatus {
    /// Polls done.
    pub polls: u64,
    /// Metric reads that failed (value left `None`).
    pub read_errors: u64,
    /// Files held open.
    pub open_files: usize,
}

struct PolicyFiles {
    cur: Option<File>,
    max: Option<File>,
}

enum PowerFiles {
    Microwatts(File),
    VoltsAmps(File, File),
}

/// Keeps the metric files open and re-reads them. Synchronous: a poll is a few dozen `pread`s of
/// sub-page files, so the agent calls it directly from its loop.
pub struct SysfsReader {
    inventory: SysfsInventory,
    zone_temps: Vec<Option<File>>,
    policies: Vec<PolicyFiles>,
    gpu: Option<PolicyFiles>,
    oc: Vec<File>,
    power: Vec<PowerFiles>,
    nvpmodel_status: PathBuf,
    snapshot: SysfsSnapshot,
    status: SysfsStatus,
}

impl std::fmt::Debug for SysfsReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SysfsReader")
            .field("inventory", &self.inventory)
            .field("status", &self.status)
            .finish_non_exhaustive()
    }
}

impl SysfsReader {
    /// Discovers what the tree has under `config.root`, reads the static values and opens every
    /// metric file.
    ///
    /// # Errors
    ///
    /// [`SysfsError`] when a configured GPU devfreq node or power input file is missing.
    pub fn open(config: &SysfsConfig) -> Result<Self, SysfsError> {
        let root = &config.root;
        let mut inventory = SysfsInventory::default();
        let mut zone_temps = Vec::new();
        for (id, dir) in numbered_entries(&root.join("sys/class/thermal"), "thermal_zone") {
            let kind = read_text(&dir.join("type")).unwrap_or_default();
            let trips = read_trips(&dir);
            zone_temps.push(File::open(dir.join("temp")).ok());
            inventory.zones.push(ZoneInfo { id, kind, trips });
        }

        let mut policies = Vec::new();
        for (name, dir) in cpufreq_dirs(root) {
            let hardware_max_khz =
                read_text(&dir.join("cpuinfo_max_freq")).and_then(|text| text.parse::<u64>().ok());
            // Only these two names are ever opened; see the module invariants.
            policies.push(PolicyFiles {
                cur: File::open(dir.join("scaling_cur_freq")).ok(),
                max: File::open(dir.join("scaling_max_freq")).ok(),
            });
            inventory.cpu_policies.push(CpuPolicyInfo {
                name,
                hardware_max_khz,
            });
        }

        let mut gpu = None;
        if let Some(dir) = find_gpu(root, config)? {
            let device = dir
                .file_name()
                .map(|name| name.to_string_lossy().into_owned())
                .unwrap_or_default();
            let hardware_max_khz = read_text(&dir.join("available_frequencies")).and_then(|t| {
                t.split_ascii_whitespace()
                    .filter_map(|hz| hz.parse::<u64>().ok())
                    .max()
                    .map(|hz| hz / 1_000)
            });
            gpu = Some(PolicyFiles {
                cur: File::open(dir.join("cur_freq")).ok(),
                max: File::open(dir.join("max_freq")).ok(),
            });
            inventory.gpu = Some(GpuInfo {
                device,
                hardware_max_khz,
            });
        }

        let mut oc = Vec::new();
        if let Some(hwmon) = find_soctherm_oc(root) {
            let mut channels: Vec<(u32, String, PathBuf)> = fs::read_dir(&hwmon)
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|entry| {
                    let name = entry.file_name().into_string().ok()?;
                    let number = name.strip_prefix("oc")?.strip_suffix("_event_cnt")?;
                    let n = number.parse::<u32>().ok()?;
                    Some((n, format!("oc{n}"), entry.path()))
                })
                .collect();
            channels.sort();
            for (_, channel, path) in channels {
                if let Ok(file) = File::open(&path) {
                    oc.push(file);
                    inventory.oc_channels.push(channel);
                }
            }
        }

        let mut power = Vec::new();
        for input in &config.power_inputs {
            let open = |path: &Path| {
                let under = under_root(root, path);
                File::open(&under).map_err(|source| SysfsError::PowerInputUnreadable {
                    rail: input.rail.clone(),
                    path: under.clone(),
                    source,
                })
            };
            power.push(match &input.source {
                PowerInputSource::Microwatts(path) => PowerFiles::Microwatts(open(path)?),
                PowerInputSource::VoltsAmps {
                    millivolts,
                    milliamps,
                } => PowerFiles::VoltsAmps(open(millivolts)?, open(milliamps)?),
            });
            inventory.power_inputs.push(input.rail.clone());
        }

        let open_files = zone_temps.iter().flatten().count()
            + policies
                .iter()
                .chain(gpu.iter())
                .map(|p| usize::from(p.cur.is_some()) + usize::from(p.max.is_some()))
                .sum::<usize>()
            + oc.len()
            + power
                .iter()
                .map(|p| match p {
                    PowerFiles::Microwatts(_) => 1,
                    PowerFiles::VoltsAmps(..) => 2,
                })
                .sum::<usize>();
        let snapshot = SysfsSnapshot::shaped_like(&inventory);
        Ok(Self {
            inventory,
            zone_temps,
            policies,
            gpu,
            oc,
            power,
            nvpmodel_status: root.join(NVPMODEL_STATUS),
            snapshot,
            status: SysfsStatus {
                open_files,
                ..SysfsStatus::default()
            },
        })
    }

    /// What was found at open.
    pub fn inventory(&self) -> &SysfsInventory {
        &self.inventory
    }

    /// The reader's counters.
    pub fn status(&self) -> SysfsStatus {
        self.status
    }

    /// Re-reads every metric into the reused snapshot. No allocation; one `pread` per metric,
    /// plus an open/read/close of the nvpmodel status file.
    pub fn read(&mut self) -> &SysfsSnapshot {
        let mut buf = [0u8; READ_BUF];
        let errors = &mut self.status.read_errors;
        for (slot, file) in self.snapshot.zone_celsius.iter_mut().zip(&self.zone_temps) {
            *slot = file
                .as_ref()
                .and_then(|f| read_i64(f, &mut buf, errors))
                .filter(|&millicelsius| millicelsius > ZONE_OFFLINE_MILLICELSIUS)
                .map(|millicelsius| millicelsius as f64 / 1_000.0);
        }
        for (slot, files) in self.snapshot.cpu_policies.iter_mut().zip(&self.policies) {
            *slot = read_freq(files, &mut buf, errors, 1);
        }
        if let (Some(slot), Some(files)) = (self.snapshot.gpu.as_mut(), self.gpu.as_ref()) {
            // devfreq speaks Hz.
            *slot = read_freq(files, &mut buf, errors, 1_000);
        }
        for (slot, file) in self.snapshot.oc_counts.iter_mut().zip(&self.oc) {
            *slot = read_i64(file, &mut buf, errors).and_then(|n| u64::try_from(n).ok());
        }
        for (slot, files) in self.snapshot.power_mw.iter_mut().zip(&self.power) {
            *slot = match files {
                PowerFiles::Microwatts(file) => {
                    read_i64(file, &mut buf, errors).map(|uw| uw as f64 / 1_000.0)
                }
                PowerFiles::VoltsAmps(mv, ma) => {
                    let mv = read_i64(mv, &mut buf, errors);
                    let ma = read_i64(ma, &mut buf, errors);
                    mv.zip(ma).map(|(mv, ma)| mv as f64 * ma as f64 / 1_000.0)
                }
            };
        }
        self.snapshot.power_mode = read_power_mode(&self.nvpmodel_status, &mut buf);
        self.status.polls += 1;
        &self.snapshot
    }
}

fn read_freq(
    files: &PolicyFiles,
    buf: &mut [u8; READ_BUF],
    errors: &mut u64,
    div: i64,
) -> FreqReading {
    let read = |file: &Option<File>, buf: &mut [u8; READ_BUF], errors: &mut u64| {
        file.as_ref()
            .and_then(|f| read_i64(f, buf, errors))
            .and_then(|v| u64::try_from(v / div).ok())
    };
    FreqReading {
        cur_khz: read(&files.cur, buf, errors),
        max_khz: read(&files.max, buf, errors),
    }
}

/// One `pread` at offset 0 and a decimal parse; a failure is counted and read as `None`.
fn read_i64(file: &File, buf: &mut [u8; READ_BUF], errors: &mut u64) -> Option<i64> {
    let value = file
        .read_at(buf, 0)
        .ok()
        .and_then(|n| buf.get(..n))
        .and_then(parse_i64);
    if value.is_none() {
        *errors += 1;
    }
    value
}

/// A decimal integer with optional sign, surrounded by ASCII whitespace or NULs.
fn parse_i64(bytes: &[u8]) -> Option<i64> {
    let trimmed = trim(bytes);
    let (negative, digits) = match trimmed.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, trimmed),
    };
    if digits.is_empty() {
        return None;
    }
    let mut value: i64 = 0;
    for &b in digits {
        if !b.is_ascii_digit() {
            return None;
        }
        value = value.checked_mul(10)?.checked_add(i64::from(b - b'0'))?;
    }
    Some(if negative { -value } else { value })
}

fn trim(bytes: &[u8]) -> &[u8] {
    let junk = |b: &u8| b.is_ascii_whitespace() || *b == 0;
    let start = bytes.iter().position(|b| !junk(b)).unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|b| !junk(b))
        .map_or(start, |i| i + 1);
    bytes.get(start..end).unwrap_or_default()
}

/// `pmode:0002` → 2. Re-opened per call (nvpmodel may replace the file); no heap use for
/// paths shorter than std's stack buffer.
fn read_power_mode(path: &Path, buf: &mut [u8; READ_BUF]) -> Option<u32> {
    let file = File::open(path).ok()?;
    let n = file.read_at(buf, 0).ok()?;
    let text = buf.get(..n)?;
    let at = text.windows(6).position(|w| w == b"pmode:")? + 6;
    let digits = text.get(at..)?;
    let len = digits.iter().take_while(|b| b.is_ascii_digit()).count();
    let mut mode: u32 = 0;
    for &b in digits.get(..len)? {
        mode = mode.checked_mul(10)?.checked_add(u32::from(b - b'0'))?;
    }
    (len > 0).then_some(mode)
}

/// The text of a small file, trimmed of whitespace and NULs (device-tree strings end in NUL).
fn read_text(path: &Path) -> Option<String> {
    let bytes = fs::read(path).ok()?;
    Some(String::from_utf8_lossy(trim(&bytes)).into_owned())
}

/// `<dir>/<prefix><N>` entries, sorted by N.
fn numbered_entries(dir: &Path, prefix: &str) -> Vec<(u32, PathBuf)> {
    let mut found: Vec<(u32, PathBuf)> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let n = name.strip_prefix(prefix)?.parse::<u32>().ok()?;
            Some((n, entry.path()))
        })
        .collect();
    found.sort();
    found
}

fn read_trips(zone: &Path) -> Vec<Trip> {
    let mut trips = Vec::new();
    for index in 0..MAX_TRIPS_PER_ZONE {
        let Some(temp) = read_text(&zone.join(format!("trip_point_{index}_temp"))) else {
            break;
        };
        let kind = read_text(&zone.join(format!("trip_point_{index}_type")))
            .and_then(|t| TripKind::parse(&t));
        let millicelsius = temp.parse::<i64>().ok();
        let hyst = read_text(&zone.join(format!("trip_point_{index}_hyst")))
            .and_then(|t| t.parse::<i64>().ok())
            .unwrap_or(0);
        if let (Some(kind), Some(mc)) = (kind, millicelsius)
            && mc > 0
        {
            trips.push(Trip {
                index,
                celsius: mc as f64 / 1_000.0,
                kind,
                hysteresis_celsius: hyst.max(0) as f64 / 1_000.0,
            });
        }
    }
    trips
}

/// cpufreq policy directories; the per-CPU layout when the kernel has no `policyN` directories.
fn cpufreq_dirs(root: &Path) -> Vec<(String, PathBuf)> {
    let cpu = root.join("sys/devices/system/cpu");
    let policies = numbered_entries(&cpu.join("cpufreq"), "policy");
    if !policies.is_empty() {
        return policies
            .into_iter()
            .map(|(n, dir)| (format!("policy{n}"), dir))
            .collect();
    }
    numbered_entries(&cpu, "cpu")
        .into_iter()
        .map(|(n, dir)| (format!("cpu{n}"), dir.join("cpufreq")))
        .filter(|(_, dir)| dir.is_dir())
        .collect()
}

fn find_gpu(root: &Path, config: &SysfsConfig) -> Result<Option<PathBuf>, SysfsError> {
    let devfreq = root.join("sys/class/devfreq");
    if let Some(name) = &config.gpu_devfreq {
        let path = devfreq.join(name);
        return if path.is_dir() {
            Ok(Some(path))
        } else {
            Err(SysfsError::GpuDevfreqMissing { path })
        };
    }
    let mut candidates: Vec<PathBuf> = fs::read_dir(&devfreq)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path())
        .collect();
    candidates.sort();
    Ok(candidates.into_iter().find(|dir| {
        read_text(&dir.join("device/of_node/name"))
            .is_some_and(|name| config.gpu_of_node_names.contains(&name))
    }))
}

fn find_soctherm_oc(root: &Path) -> Option<PathBuf> {
    numbered_entries(&root.join("sys/class/hwmon"), "hwmon")
        .into_iter()
        .map(|(_, dir)| dir)
        .find(|dir| read_text(&dir.join("name")).is_some_and(|name| name == SOCTHERM_OC_NAME))
}

/// An absolute target path read under `root`.
fn under_root(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysfs_numbers_parse_with_newlines_signs_and_nuls() {
        assert_eq!(parse_i64(b"47281\n"), Some(47_281));
        assert_eq!(parse_i64(b"-256000\n"), Some(-256_000));
        assert_eq!(parse_i64(b"  12\0"), Some(12));
        assert_eq!(parse_i64(b"\n"), None);
        assert_eq!(parse_i64(b"12a"), None);
        assert_eq!(parse_i64(b"-"), None);
        assert_eq!(parse_i64(b"99999999999999999999"), None);
    }

    #[test]
    fn the_power_mode_is_the_number_after_pmode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("status");
        let mut buf = [0u8; READ_BUF];
        assert_eq!(read_power_mode(&path, &mut buf), None);
        fs::write(&path, "pmode:0002 fmode:quiet\n").unwrap();
        assert_eq!(read_power_mode(&path, &mut buf), Some(2));
        fs::write(&path, "pmode:\n").unwrap();
        assert_eq!(read_power_mode(&path, &mut buf), None);
    }

    #[test]
    fn target_paths_are_read_under_the_root() {
        assert_eq!(
            under_root(Path::new("/tmp/fake"), Path::new("/sys/class/hwmon/x")),
            PathBuf::from("/tmp/fake/sys/class/hwmon/x")
        );
        assert_eq!(
            under_root(Path::new("/"), Path::new("/sys/x")),
            PathBuf::from("/sys/x")
        );
    }
}
