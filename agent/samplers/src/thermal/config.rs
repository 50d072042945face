//! Configuration of the thermal and power sampler: the raw `[thermal]` table the agent embeds in
//! its TOML file ([`RawThermalConfig`]), and the validated form the sampler and its shells are
//! built from ([`ThermalConfig`]).
//!
//! Invariants:
//! - Unknown keys are refused ([`RawThermalConfig`] denies them); a missing `[thermal]` table or
//!   key takes the named default constant below, whose doc says why it has that value.
//! - [`ThermalConfig::from_raw`] does no I/O and every error names the key as the agent's file
//!   spells it (`thermal.poll_interval`), so the agent can exit with status 64.
//! - Periods are duration strings ([`DURATION_KEYS`]); the integer `_ms`/`_s` keys of older files
//!   still load to the same value, and giving both spellings is refused.
//! - The validated form carries units in its types (`Duration`, kHz) and has passed every
//!   cross-field check: nothing downstream re-validates.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use edgewatch_conventions::config::{ConfigError, RenamedKey};
use edgewatch_conventions::duration::{self, DurationKey, Given, IntegerUnit};
use serde::Deserialize;

/// Where JetPack installs tegrastats.
pub const DEFAULT_TEGRASTATS_PATH: &str = "/usr/bin/tegrastats";
/// tegrastats' own default interval: one sample per second resolves rail power well enough for
/// energy (the rails' own averaging window is of that order) and throttling episodes of seconds.
pub const DEFAULT_INTERVAL_MS: u64 = 1_000;
/// Faster than 10 Hz, tegrastats' own BPMP reads start to cost the housekeeping core for no gain.
pub const MIN_INTERVAL_MS: u64 = 100;
/// Slower than once a minute, energy integration and episode timing become meaningless.
pub const MAX_INTERVAL_MS: u64 = 60_000;
/// Replays run at the capture's own pace unless told otherwise.
pub const DEFAULT_REPLAY_SPEED: f64 = 1.0;
/// First restart delay after tegrastats exits: quick enough that a one-off crash costs one sample.
pub const DEFAULT_RESTART_BACKOFF_MIN_MS: u64 = 1_000;
/// Longest restart delay: a binary that keeps failing is retried once a minute, not in a loop.
pub const DEFAULT_RESTART_BACKOFF_MAX_MS: u64 = 60_000;
/// The real sysfs; tests point this at a fake tree.
pub const DEFAULT_SYSFS_ROOT: &str = "/";
/// 1 Hz: on Orin and Thor every thermal-zone and `soctherm_oc` read is a BPMP IPC, so these are
/// polled at most once a second.
pub const DEFAULT_POLL_INTERVAL_MS: u64 = 1_000;
/// 10 Hz at most, the rate the footprint tests use (ten times production).
pub const MIN_POLL_INTERVAL_MS: u64 = 100;
/// Slowest poll: over-current episodes are timed at this resolution.
pub const MAX_POLL_INTERVAL_MS: u64 = 60_000;
/// Counters every 10 s: SLO windows of 5 minutes get 30 points, at a few hundred bytes each.
pub const DEFAULT_COUNTERS_INTERVAL_S: u64 = 10;
/// Counters at least once an hour, so a long partition still leaves points inside each window.
pub const MAX_COUNTERS_INTERVAL_S: u64 = 3_600;
/// One raw sample in ten (every 10 s at the default interval): enough to explain a counter step
/// without filling the debug tier.
pub const DEFAULT_DEBUG_SAMPLE_EVERY: u32 = 10;
/// No minimum spacing of raw samples beyond `debug_sample_every` by default.
pub const DEFAULT_DEBUG_SAMPLE_MIN_INTERVAL_MS: u64 = 0;
/// One poll period at the default 1 Hz: an over-current increment marks the interval it was seen
/// in as throttled (each hardware event lasts about a millisecond, below any poll rate).
pub const DEFAULT_OC_HOLD_MS: u64 = 1_000;
/// While over-current events keep coming, one `OverCurrent` per channel per minute carries the
/// accumulated delta: safety data without a safety-tier flood (MAXN can count thousands).
pub const DEFAULT_OC_REPORT_INTERVAL_S: u64 = 60;
/// A trip is left only 2 °C below its temperature: Jetson zone readings jitter by about ±0.5 °C
/// between samples, so a temperature dancing on the trip does not flap.
pub const DEFAULT_TRIP_HYSTERESIS_CELSIUS: f64 = 2.0;
/// A cap counts only when more than 1 MHz below the nominal maximum: absorbs kHz/MHz rounding
/// between a configured MHz value and the kernel's kHz figures.
pub const DEFAULT_CAP_TOLERANCE_MHZ: u32 = 1;
/// An interval without samples longer than 5 s (five samples at 1 Hz) is not integrated or
/// counted: the power curve and the throttle state over it are unknown.
pub const DEFAULT_MAX_GAP_MS: u64 = 5_000;
/// Device-tree names of Jetson GPUs under `/sys/class/devfreq/*/device/of_node/name`: ga10b
/// (Orin), gpu-gpc-0 (Thor), gv11b (Xavier), gp10b (TX2), gb10b (Thor, older kernels).
pub const DEFAULT_GPU_OF_NODE_NAMES: &[&str] = &["ga10b", "gpu-gpc-0", "gv11b", "gp10b", "gb10b"];

/// `thermal.interval`: tegrastats' own sampling interval.
pub const INTERVAL: DurationKey = DurationKey::new(
    "thermal.interval",
    Duration::from_millis(MIN_INTERVAL_MS),
    Duration::from_millis(MAX_INTERVAL_MS),
)
.replacing("thermal.interval_ms", IntegerUnit::Milliseconds);
/// `thermal.restart_backoff_min`: the first restart delay, at most an hour.
pub const RESTART_BACKOFF_MIN: DurationKey = DurationKey::new(
    "thermal.restart_backoff_min",
    Duration::from_millis(1),
    Duration::from_secs(3_600),
)
.replacing("thermal.restart_backoff_min_ms", IntegerUnit::Milliseconds);
/// `thermal.restart_backoff_max`: the longest restart delay, at least the first one.
pub const RESTART_BACKOFF_MAX: DurationKey = DurationKey::new(
    "thermal.restart_backoff_max",
    Duration::from_millis(1),
    Duration::from_secs(3_600),
)
.replacing("thermal.restart_backoff_max_ms", IntegerUnit::Milliseconds);
/// `thermal.poll_interval`: the period of sysfs reads.
pub const POLL_INTERVAL: DurationKey = DurationKey::new(
    "thermal.poll_interval",
    Duration::from_millis(MIN_POLL_INTERVAL_MS),
    Duration::from_millis(MAX_POLL_INTERVAL_MS),
)
.replacing("thermal.poll_interval_ms", IntegerUnit::Milliseconds);
/// `thermal.counters_interval`: the period of the cumulative counters.
pub const COUNTERS_INTERVAL: DurationKey = DurationKey::new(
    "thermal.counters_interval",
    Duration::from_secs(1),
    Duration::from_secs(MAX_COUNTERS_INTERVAL_S),
)
.replacing("thermal.counters_interval_s", IntegerUnit::Seconds);
/// `thermal.debug_sample_min_interval`: 0 (no spacing) to a day.
pub const DEBUG_SAMPLE_MIN_INTERVAL: DurationKey = DurationKey::new(
    "thermal.debug_sample_min_interval",
    Duration::ZERO,
    Duration::from_secs(86_400),
)
.replacing(
    "thermal.debug_sample_min_interval_ms",
    IntegerUnit::Milliseconds,
);
/// `thermal.oc_hold`: how long an over-current increment counts as throttled.
pub const OC_HOLD: DurationKey = DurationKey::new(
    "thermal.oc_hold",
    Duration::from_millis(1),
    Duration::from_secs(3_600),
)
.replacing("thermal.oc_hold_ms", IntegerUnit::Milliseconds);
/// `thermal.oc_report_interval`: a second to a day.
pub const OC_REPORT_INTERVAL: DurationKey = DurationKey::new(
    "thermal.oc_report_interval",
    Duration::from_secs(1),
    Duration::from_secs(86_400),
)
.replacing("thermal.oc_report_interval_s", IntegerUnit::Seconds);
/// `thermal.max_gap`: at least twice the shortest period either source may have, at most an
/// hour (and at least twice `interval` and `poll_interval` as configured).
pub const MAX_GAP: DurationKey = DurationKey::new(
    "thermal.max_gap",
    Duration::from_millis(2 * MIN_INTERVAL_MS),
    Duration::from_secs(3_600),
)
.replacing("thermal.max_gap_ms", IntegerUnit::Milliseconds);
/// Every duration key of `[thermal]`.
pub const DURATION_KEYS: [DurationKey; 9] = [
    INTERVAL,
    RESTART_BACKOFF_MIN,
    RESTART_BACKOFF_MAX,
    POLL_INTERVAL,
    COUNTERS_INTERVAL,
    DEBUG_SAMPLE_MIN_INTERVAL,
    OC_HOLD,
    OC_REPORT_INTERVAL,
    MAX_GAP,
];

/// `key` of `[thermal]` out of its range.
fn out_of_range(key: &str, value: impl ToString, expected: &str) -> ConfigError {
    ConfigError::new(
        format!("thermal.{key}"),
        format!("{} is out of range ({expected})", value.to_string()),
    )
}

/// `key` of `[thermal]` malformed, missing where another key needs it, or in conflict with one.
fn invalid(key: &str, problem: impl Into<String>) -> ConfigError {
    ConfigError::new(format!("thermal.{key}"), problem)
}

// ---------------------------------------------------------------------------------------------
// Raw form: mirrors the `[thermal]` table.

/// The `[thermal]` table as written. Embed it in the agent's config with `#[serde(default)]`;
/// every key is optional. See `docs/configuration.md`, "Agent: thermal". A duration key absent
/// from the file is `None` and takes its default in validation; a deprecated integer key is
/// `None` unless the file uses it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawThermalConfig {
    /// Run (or replay) tegrastats at all; sysfs sampling runs either way.
    pub tegrastats_enabled: bool,
    /// The tegrastats program.
    pub tegrastats: PathBuf,
    /// `tegrastats --interval`, and the spacing of replayed lines, e.g. `"1s"`.
    #[serde(default)]
    pub interval: Option<String>,
    /// Deprecated spelling of `interval`: ms.
    #[serde(default)]
    pub interval_ms: Option<u64>,
    /// Replay this capture file instead of running tegrastats.
    pub replay: Option<PathBuf>,
    /// Replay speed factor (2.0 = twice as fast as captured).
    pub replay_speed: f64,
    /// Start the capture over at its end.
    pub replay_loop: bool,
    /// First delay before restarting an exited tegrastats.
    #[serde(default)]
    pub restart_backoff_min: Option<String>,
    /// Deprecated spelling of `restart_backoff_min`: ms.
    #[serde(default)]
    pub restart_backoff_min_ms: Option<u64>,
    /// Longest delay between restarts.
    #[serde(default)]
    pub restart_backoff_max: Option<String>,
    /// Deprecated spelling of `restart_backoff_max`: ms.
    #[serde(default)]
    pub restart_backoff_max_ms: Option<u64>,
    /// Root under which `/sys/...` and `/var/lib/nvpmodel/status` are read.
    pub sysfs_root: PathBuf,
    /// Period of sysfs reads (thermal zones, cpufreq, devfreq, over-current counters).
    #[serde(default)]
    pub poll_interval: Option<String>,
    /// Deprecated spelling of `poll_interval`: ms.
    #[serde(default)]
    pub poll_interval_ms: Option<u64>,
    /// The GPU's directory name under `/sys/class/devfreq` (e.g. `17000000.gpu`); found by
    /// device-tree name when absent.
    pub gpu_devfreq: Option<String>,
    /// Period of `ThrottleCounters` and `EnergyCounters`.
    #[serde(default)]
    pub counters_interval: Option<String>,
    /// Deprecated spelling of `counters_interval`: s.
    #[serde(default)]
    pub counters_interval_s: Option<u64>,
    /// Emit one raw `ThermalSample` in this many tegrastats samples; 0 emits none.
    pub debug_sample_every: u32,
    /// And at least this far apart.
    #[serde(default)]
    pub debug_sample_min_interval: Option<String>,
    /// Deprecated spelling of `debug_sample_min_interval`: ms.
    #[serde(default)]
    pub debug_sample_min_interval_ms: Option<u64>,
    /// How long an over-current increment counts as throttled.
    #[serde(default)]
    pub oc_hold: Option<String>,
    /// Deprecated spelling of `oc_hold`: ms.
    #[serde(default)]
    pub oc_hold_ms: Option<u64>,
    /// Least spacing of `OverCurrent` reports per channel during an episode.
    #[serde(default)]
    pub oc_report_interval: Option<String>,
    /// Deprecated spelling of `oc_report_interval`: s.
    #[serde(default)]
    pub oc_report_interval_s: Option<u64>,
    /// Least hysteresis below a trip temperature before it counts as left, °C.
    pub trip_hysteresis_celsius: f64,
    /// How far below the nominal maximum a frequency cap must be to count, MHz.
    pub cap_tolerance_mhz: u32,
    /// Longest interval between samples that is still integrated and counted.
    #[serde(default)]
    pub max_gap: Option<String>,
    /// Deprecated spelling of `max_gap`: ms.
    #[serde(default)]
    pub max_gap_ms: Option<u64>,
    /// Nominal maximum clocks for power modes without their own entry.
    pub nominal_max_mhz: RawNominalMax,
    /// Nominal maximum clocks per nvpmodel power mode id (the `N` of `pmode:000N`).
    pub power_mode_nominal_max_mhz: BTreeMap<String, RawNominalMax>,
    /// Component a thermal zone's trips throttle, by zone name (overrides the naming rule).
    pub zone_components: BTreeMap<String, ZoneComponent>,
    /// Rail power read from sysfs (INA3221/INA238 hwmon), integrated like tegrastats rails.
    pub power_input: Vec<RawPowerInput>,
}

impl Default for RawThermalConfig {
    /// Every key at its default, spelled out as the documentation's example writes it (the
    /// duration keys in their current spelling, no deprecated key).
    fn default() -> Self {
        let ms = |ms: u64| Some(duration::format(Duration::from_millis(ms)));
        let s = |s: u64| Some(duration::format(Duration::from_secs(s)));
        Self {
            tegrastats_enabled: true,
            tegrastats: PathBuf::from(DEFAULT_TEGRASTATS_PATH),
            interval: ms(DEFAULT_INTERVAL_MS),
            interval_ms: None,
            replay: None,
            replay_speed: DEFAULT_REPLAY_SPEED,
            replay_loop: false,
            restart_backoff_min: ms(DEFAULT_RESTART_BACKOFF_MIN_MS),
            restart_backoff_min_ms: None,
            restart_backoff_max: ms(DEFAULT_RESTART_BACKOFF_MAX_MS),
            restart_backoff_max_ms: None,
            sysfs_root: PathBuf::from(DEFAULT_SYSFS_ROOT),
            poll_interval: ms(DEFAULT_POLL_INTERVAL_MS),
            poll_interval_ms: None,
            gpu_devfreq: None,
            counters_interval: s(DEFAULT_COUNTERS_INTERVAL_S),
            counters_interval_s: None,
            debug_sample_every: DEFAULT_DEBUG_SAMPLE_EVERY,
            debug_sample_min_interval: ms(DEFAULT_DEBUG_SAMPLE_MIN_INTERVAL_MS),
            debug_sample_min_interval_ms: None,
            oc_hold: ms(DEFAULT_OC_HOLD_MS),
            oc_hold_ms: None,
            oc_report_interval: s(DEFAULT_OC_REPORT_INTERVAL_S),
            oc_report_interval_s: None,
            trip_hysteresis_celsius: DEFAULT_TRIP_HYSTERESIS_CELSIUS,
            cap_tolerance_mhz: DEFAULT_CAP_TOLERANCE_MHZ,
            max_gap: ms(DEFAULT_MAX_GAP_MS),
            max_gap_ms: None,
            nominal_max_mhz: RawNominalMax::default(),
            power_mode_nominal_max_mhz: BTreeMap::new(),
            zone_components: BTreeMap::new(),
            power_input: Vec::new(),
        }
    }
}

/// Nominal maximum clocks of one power mode, MHz. An absent value falls back (see
/// [`NominalMax`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawNominalMax {
    /// CPU clusters.
    pub cpu: Option<u32>,
    /// GPU.
    pub gpu: Option<u32>,
}

/// What a thermal zone's trips throttle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ZoneComponent {
    /// The CPU clusters.
    Cpu,
    /// The GPU.
    Gpu,
    /// The rest of the module (junction, SoC, CV, board sensors).
    Soc,
    /// Not a throttling signal (e.g. `PMIC-Die`, a constant).
    Ignore,
}

/// One `[[thermal.power_input]]`: a rail read from sysfs. Give either `power_uw`, or both
/// `millivolts` and `milliamps`. Paths are as on the target and read under `sysfs_root`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPowerInput {
    /// Rail name in `EnergyCounters`, e.g. `VDD_IN`.
    pub rail: String,
    /// A file holding power in µW (hwmon `power*_input`).
    pub power_uw: Option<PathBuf>,
    /// A file holding the bus voltage in mV (hwmon `in*_input`).
    pub millivolts: Option<PathBuf>,
    /// A file holding the current in mA (hwmon `curr*_input`).
    pub milliamps: Option<PathBuf>,
}

// ---------------------------------------------------------------------------------------------
// Validated form.

/// The validated `[thermal]` configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct ThermalConfig {
    /// The tegrastats source (child, replay or none) and its restart policy.
    pub tegrastats: TegrastatsConfig,
    /// The sysfs reader.
    pub sysfs: SysfsConfig,
    /// Throttling detection.
    pub throttle: ThrottleConfig,
    /// Energy integration.
    pub energy: EnergyConfig,
    /// Period of `ThrottleCounters` and `EnergyCounters`.
    pub counters_interval: Duration,
    /// Downsampling of raw `ThermalSample`s.
    pub debug_sample: DebugSampleConfig,
}

/// Where tegrastats lines come from.
#[derive(Debug, Clone, PartialEq)]
pub struct TegrastatsConfig {
    /// Child process, replay, or nothing.
    pub source: TegrastatsSourceConfig,
    /// Sampling interval (`--interval`), and the logical spacing of replayed lines.
    pub interval: Duration,
    /// Restart delays of the child.
    pub backoff: BackoffConfig,
}

/// The kind of tegrastats source.
#[derive(Debug, Clone, PartialEq)]
pub enum TegrastatsSourceConfig {
    /// No tegrastats: thermal data comes from sysfs only.
    Disabled,
    /// Run `program --interval <ms>` and read its standard output.
    Child {
        /// The tegrastats program.
        program: PathBuf,
    },
    /// Read lines from a capture file.
    Replay {
        /// The capture.
        path: PathBuf,
        /// Speed factor, > 0.
        speed: f64,
        /// Start over at the end.
        looped: bool,
    },
}

/// Exponential restart delays: `min`, doubling per quick exit, at most `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackoffConfig {
    /// First delay.
    pub min: Duration,
    /// Longest delay; a run at least this long resets the delay to `min`.
    pub max: Duration,
}

/// What the sysfs reader opens.
#[derive(Debug, Clone, PartialEq)]
pub struct SysfsConfig {
    /// Root of the tree (`/` on a machine).
    pub root: PathBuf,
    /// Poll period.
    pub poll_interval: Duration,
    /// GPU devfreq directory name, when configured.
    pub gpu_devfreq: Option<String>,
    /// Device-tree names that identify the GPU when `gpu_devfreq` is absent.
    pub gpu_of_node_names: Vec<String>,
    /// Rail power inputs, in configuration order.
    pub power_inputs: Vec<PowerInput>,
}

/// A rail read from sysfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PowerInput {
    /// Rail name.
    pub rail: String,
    /// The file(s) it is read from, as on the target (absolute).
    pub source: PowerInputSource,
}

/// The files a [`PowerInput`] is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PowerInputSource {
    /// One file in µW.
    Microwatts(PathBuf),
    /// Voltage (mV) times current (mA).
    VoltsAmps {
        /// mV file.
        millivolts: PathBuf,
        /// mA file.
        milliamps: PathBuf,
    },
}

/// Nominal maximum clocks of a power mode, MHz; `None` falls back to the default entry, then to
/// the hardware maximum (`cpuinfo_max_freq`, the highest devfreq `available_frequencies`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NominalMax {
    /// CPU clusters.
    pub cpu_mhz: Option<u32>,
    /// GPU.
    pub gpu_mhz: Option<u32>,
}

/// Throttling detection settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ThrottleConfig {
    /// Nominal maxima for power modes without an entry in `per_power_mode`.
    pub nominal: NominalMax,
    /// Nominal maxima per nvpmodel power mode id.
    pub per_power_mode: BTreeMap<u32, NominalMax>,
    /// Least hysteresis below a trip, °C (the zone's own `trip_point_N_hyst` if larger).
    pub trip_hysteresis_celsius: f64,
    /// How far below nominal a cap must be, kHz.
    pub cap_tolerance_khz: u64,
    /// How long an over-current increment counts as throttled.
    pub oc_hold: Duration,
    /// Least spacing of `OverCurrent` reports per channel.
    pub oc_report_interval: Duration,
    /// Zone name overrides (names lower-cased), checked before the naming rule.
    pub zone_components: Vec<(String, ZoneComponent)>,
    /// Longest interval still counted as throttled time.
    pub max_gap: Duration,
}

/// Energy integration settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnergyConfig {
    /// Longest interval between two samples of a rail that is still integrated.
    pub max_gap: Duration,
}

/// Raw-sample downsampling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DebugSampleConfig {
    /// One in this many samples; 0 = none.
    pub every: u32,
    /// And at least this far apart.
    pub min_interval: Duration,
}

impl Default for ThermalConfig {
    fn default() -> Self {
        // The defaults are valid by construction; a test keeps it so.
        match ThermalConfig::from_raw(&RawThermalConfig::default()) {
            Ok(config) => config,
            Err(error) => unreachable!("the default thermal configuration is invalid: {error}"),
        }
    }
}

fn check_range(
    key: &str,
    value: u64,
    min: u64,
    max: u64,
    expected: &'static str,
) -> Result<(), ConfigError> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(out_of_range(key, value, expected))
    }
}

fn check_absolute(key: &str, path: &Path) -> Result<(), ConfigError> {
    if path.is_absolute() {
        Ok(())
    } else {
        Err(invalid(
            key,
            format!(
                "`{}` must be an absolute path as on the target (it is read under sysfs_root)",
                path.display()
            ),
        ))
    }
}

/// The value of one duration key, under either spelling, or `default`.
fn resolve(
    key: &DurationKey,
    text: Option<&String>,
    integer: Option<u64>,
    default: Duration,
) -> Result<Given, ConfigError> {
    Ok(key
        .resolve(text.map(String::as_str), integer)?
        .unwrap_or(Given {
            value: default,
            key: key.name,
        }))
}

impl RawThermalConfig {
    /// Checks every value and cross-field rule, and builds the typed configuration:
    /// [`ThermalConfig::from_raw`].
    ///
    /// # Errors
    ///
    /// The first value refused, naming its key.
    pub fn validate(&self) -> Result<ThermalConfig, ConfigError> {
        ThermalConfig::from_raw(self)
    }

    /// The deprecated keys this table uses.
    pub fn renamed_keys(&self) -> Vec<RenamedKey> {
        [
            (INTERVAL, self.interval_ms.is_some()),
            (RESTART_BACKOFF_MIN, self.restart_backoff_min_ms.is_some()),
            (RESTART_BACKOFF_MAX, self.restart_backoff_max_ms.is_some()),
            (POLL_INTERVAL, self.poll_interval_ms.is_some()),
            (COUNTERS_INTERVAL, self.counters_interval_s.is_some()),
            (
                DEBUG_SAMPLE_MIN_INTERVAL,
                self.debug_sample_min_interval_ms.is_some(),
            ),
            (OC_HOLD, self.oc_hold_ms.is_some()),
            (OC_REPORT_INTERVAL, self.oc_report_interval_s.is_some()),
            (MAX_GAP, self.max_gap_ms.is_some()),
        ]
        .into_iter()
        .filter(|(_, used)| *used)
        .filter_map(|(key, _)| key.renamed())
        .collect()
    }
}

impl ThermalConfig {
    /// Checks every value and cross-field rule of `raw`, and builds the typed configuration.
    ///
    /// # Errors
    ///
    /// The first value refused, naming its key.
    pub fn from_raw(raw: &RawThermalConfig) -> Result<ThermalConfig, ConfigError> {
        let ms = Duration::from_millis;
        let interval = resolve(
            &INTERVAL,
            raw.interval.as_ref(),
            raw.interval_ms,
            ms(DEFAULT_INTERVAL_MS),
        )?;
        let poll_interval = resolve(
            &POLL_INTERVAL,
            raw.poll_interval.as_ref(),
            raw.poll_interval_ms,
            ms(DEFAULT_POLL_INTERVAL_MS),
        )?;
        let counters_interval = resolve(
            &COUNTERS_INTERVAL,
            raw.counters_interval.as_ref(),
            raw.counters_interval_s,
            Duration::from_secs(DEFAULT_COUNTERS_INTERVAL_S),
        )?;
        let backoff_min = resolve(
            &RESTART_BACKOFF_MIN,
            raw.restart_backoff_min.as_ref(),
            raw.restart_backoff_min_ms,
            ms(DEFAULT_RESTART_BACKOFF_MIN_MS),
        )?;
        let backoff_max = resolve(
            &RESTART_BACKOFF_MAX,
            raw.restart_backoff_max.as_ref(),
            raw.restart_backoff_max_ms,
            ms(DEFAULT_RESTART_BACKOFF_MAX_MS),
        )?;
        if backoff_max.value < backoff_min.value {
            return Err(ConfigError::new(
                backoff_max.key,
                format!(
                    "{} is shorter than {} ({})",
                    duration::format(backoff_max.value),
                    backoff_min.key,
                    duration::format(backoff_min.value)
                ),
            ));
        }
        let debug_sample_min_interval = resolve(
            &DEBUG_SAMPLE_MIN_INTERVAL,
            raw.debug_sample_min_interval.as_ref(),
            raw.debug_sample_min_interval_ms,
            ms(DEFAULT_DEBUG_SAMPLE_MIN_INTERVAL_MS),
        )?;
        let oc_hold = resolve(
            &OC_HOLD,
            raw.oc_hold.as_ref(),
            raw.oc_hold_ms,
            ms(DEFAULT_OC_HOLD_MS),
        )?;
        let oc_report_interval = resolve(
            &OC_REPORT_INTERVAL,
            raw.oc_report_interval.as_ref(),
            raw.oc_report_interval_s,
            Duration::from_secs(DEFAULT_OC_REPORT_INTERVAL_S),
        )?;
        check_range(
            "cap_tolerance_mhz",
            u64::from(raw.cap_tolerance_mhz),
            0,
            1_000,
            "0 to 1000",
        )?;
        if !(raw.trip_hysteresis_celsius.is_finite()
            && (0.0..=20.0).contains(&raw.trip_hysteresis_celsius))
        {
            return Err(out_of_range(
                "trip_hysteresis_celsius",
                raw.trip_hysteresis_celsius,
                "0 to 20",
            ));
        }
        // A gap must be longer than the normal spacing of either source, or every interval
        // would be a gap.
        let max_gap = resolve(
            &MAX_GAP,
            raw.max_gap.as_ref(),
            raw.max_gap_ms,
            ms(DEFAULT_MAX_GAP_MS),
        )?;
        let longest_period = interval.value.max(poll_interval.value);
        if max_gap.value < 2 * longest_period {
            return Err(ConfigError::new(
                max_gap.key,
                format!(
                    "{} is shorter than twice {} and {} ({})",
                    duration::format(max_gap.value),
                    interval.key,
                    poll_interval.key,
                    duration::format(2 * longest_period)
                ),
            ));
        }
        let max_gap = max_gap.value;

        let source = raw.tegrastats_source()?;

        let nominal = nominal_max("nominal_max_mhz", raw.nominal_max_mhz)?;
        let mut per_power_mode = BTreeMap::new();
        for (mode, raw_max) in &raw.power_mode_nominal_max_mhz {
            let key = format!("power_mode_nominal_max_mhz.{mode}");
            let id: u32 = mode.parse().map_err(|_| {
                invalid(
                    &key,
                    "a power mode is the nvpmodel id, a whole number (`pmode:0002` is 2)",
                )
            })?;
            per_power_mode.insert(id, nominal_max(&key, *raw_max)?);
        }

        let mut zone_components = Vec::with_capacity(raw.zone_components.len());
        for (zone, component) in &raw.zone_components {
            if zone.trim().is_empty() {
                return Err(invalid("zone_components", "a zone name is empty"));
            }
            zone_components.push((zone.trim().to_ascii_lowercase(), *component));
        }

        if let Some(name) = &raw.gpu_devfreq
            && (name.is_empty() || name.contains('/'))
        {
            return Err(invalid(
                "gpu_devfreq",
                "must be a directory name under /sys/class/devfreq, e.g. `17000000.gpu`",
            ));
        }

        let power_inputs = raw.power_inputs()?;

        Ok(ThermalConfig {
            tegrastats: TegrastatsConfig {
                source,
                interval: interval.value,
                backoff: BackoffConfig {
                    min: backoff_min.value,
                    max: backoff_max.value,
                },
            },
            sysfs: SysfsConfig {
                root: raw.sysfs_root.clone(),
                poll_interval: poll_interval.value,
                gpu_devfreq: raw.gpu_devfreq.clone(),
                gpu_of_node_names: DEFAULT_GPU_OF_NODE_NAMES
                    .iter()
                    .map(|&name| name.to_owned())
                    .collect(),
                power_inputs,
            },
            throttle: ThrottleConfig {
                nominal,
                per_power_mode,
                trip_hysteresis_celsius: raw.trip_hysteresis_celsius,
                cap_tolerance_khz: u64::from(raw.cap_tolerance_mhz) * 1_000,
                oc_hold: oc_hold.value,
                oc_report_interval: oc_report_interval.value,
                zone_components,
                max_gap,
            },
            energy: EnergyConfig { max_gap },
            counters_interval: counters_interval.value,
            debug_sample: DebugSampleConfig {
                every: raw.debug_sample_every,
                min_interval: debug_sample_min_interval.value,
            },
        })
    }
}

impl RawThermalConfig {
    fn tegrastats_source(&self) -> Result<TegrastatsSourceConfig, ConfigError> {
        if !self.tegrastats_enabled {
            if self.replay.is_some() {
                return Err(invalid(
                    "replay",
                    "set while thermal.tegrastats_enabled is false",
                ));
            }
            return Ok(TegrastatsSourceConfig::Disabled);
        }
        if let Some(path) = &self.replay {
            if path.as_os_str().is_empty() {
                return Err(invalid("replay", "is empty"));
            }
            if !(self.replay_speed.is_finite()
                && self.replay_speed > 0.0
                && self.replay_speed <= 1e6)
            {
                return Err(out_of_range(
                    "replay_speed",
                    self.replay_speed,
                    "above 0, at most 1000000",
                ));
            }
            return Ok(TegrastatsSourceConfig::Replay {
                path: path.clone(),
                speed: self.replay_speed,
                looped: self.replay_loop,
            });
        }
        if self.tegrastats.as_os_str().is_empty() {
            return Err(invalid("tegrastats", "is empty"));
        }
        Ok(TegrastatsSourceConfig::Child {
            program: self.tegrastats.clone(),
        })
    }

    fn power_inputs(&self) -> Result<Vec<PowerInput>, ConfigError> {
        let mut inputs: Vec<PowerInput> = Vec::with_capacity(self.power_input.len());
        for (i, raw) in self.power_input.iter().enumerate() {
            let key = |field: &str| format!("power_input[{i}].{field}");
            if raw.rail.trim().is_empty() {
                return Err(invalid(&key("rail"), "is empty"));
            }
            if inputs.iter().any(|input| input.rail == raw.rail) {
                return Err(invalid(
                    &key("rail"),
                    format!("`{}` is configured twice", raw.rail),
                ));
            }
            let source = match (&raw.power_uw, &raw.millivolts, &raw.milliamps) {
                (Some(uw), None, None) => {
                    check_absolute(&key("power_uw"), uw)?;
                    PowerInputSource::Microwatts(uw.clone())
                }
                (None, Some(mv), Some(ma)) => {
                    check_absolute(&key("millivolts"), mv)?;
                    check_absolute(&key("milliamps"), ma)?;
                    PowerInputSource::VoltsAmps {
                        millivolts: mv.clone(),
                        milliamps: ma.clone(),
                    }
                }
                _ => {
                    return Err(invalid(
                        &format!("power_input[{i}]"),
                        "give either power_uw, or both millivolts and milliamps",
                    ));
                }
            };
            inputs.push(PowerInput {
                rail: raw.rail.clone(),
                source,
            });
        }
        Ok(inputs)
    }
}

fn nominal_max(key: &str, raw: RawNominalMax) -> Result<NominalMax, ConfigError> {
    for (field, value) in [("cpu", raw.cpu), ("gpu", raw.gpu)] {
        if let Some(mhz) = value {
            check_range(
                &format!("{key}.{field}"),
                u64::from(mhz),
                1,
                100_000,
                "1 to 100000",
            )?;
        }
    }
    Ok(NominalMax {
        cpu_mhz: raw.cpu,
        gpu_mhz: raw.gpu,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(toml_text: &str) -> RawThermalConfig {
        toml::from_str(toml_text).unwrap()
    }

    fn error_key(toml_text: &str) -> String {
        parse(toml_text).validate().unwrap_err().key().to_owned()
    }

    #[test]
    fn an_empty_table_takes_every_default_and_is_valid() {
        let config = parse("").validate().unwrap();
        assert_eq!(config, ThermalConfig::default());
        assert_eq!(
            config.tegrastats.source,
            TegrastatsSourceConfig::Child {
                program: PathBuf::from(DEFAULT_TEGRASTATS_PATH)
            }
        );
        assert_eq!(config.sysfs.poll_interval, Duration::from_secs(1));
        assert_eq!(config.counters_interval, Duration::from_secs(10));
        assert_eq!(config.throttle.cap_tolerance_khz, 1_000);
    }

    #[test]
    fn unknown_keys_are_refused_by_the_raw_table() {
        let error = toml::from_str::<RawThermalConfig>("poll_interval = 5").unwrap_err();
        assert!(error.to_string().contains("poll_interval"), "{error}");
    }

    #[test]
    fn each_out_of_range_value_names_its_key() {
        for (text, key) in [
            ("interval_ms = 10", "thermal.interval_ms"),
            ("poll_interval_ms = 50", "thermal.poll_interval_ms"),
            ("counters_interval_s = 0", "thermal.counters_interval_s"),
            (
                "restart_backoff_min_ms = 500\nrestart_backoff_max_ms = 100",
                "thermal.restart_backoff_max_ms",
            ),
            ("oc_hold_ms = 0", "thermal.oc_hold_ms"),
            (
                "trip_hysteresis_celsius = -1.0",
                "thermal.trip_hysteresis_celsius",
            ),
            ("max_gap_ms = 1500", "thermal.max_gap_ms"),
            (
                "replay = \"/x\"\nreplay_speed = 0.0",
                "thermal.replay_speed",
            ),
            ("[nominal_max_mhz]\ncpu = 0", "thermal.nominal_max_mhz.cpu"),
        ] {
            assert_eq!(error_key(text), key, "for {text:?}");
        }
    }

    #[test]
    fn the_largest_gap_must_exceed_two_periods_of_the_slower_source() {
        assert_eq!(
            error_key("poll_interval_ms = 4000\nmax_gap_ms = 7000"),
            "thermal.max_gap_ms"
        );
        assert!(
            parse("poll_interval_ms = 4000\nmax_gap_ms = 8000")
                .validate()
                .is_ok()
        );
    }

    #[test]
    fn power_modes_are_nvpmodel_ids() {
        let config = parse("[power_mode_nominal_max_mhz.2]\ncpu = 1497\ngpu = 612")
            .validate()
            .unwrap();
        assert_eq!(
            config.throttle.per_power_mode[&2],
            NominalMax {
                cpu_mhz: Some(1497),
                gpu_mhz: Some(612)
            }
        );
        assert_eq!(
            error_key("[power_mode_nominal_max_mhz.maxn]\ncpu = 1"),
            "thermal.power_mode_nominal_max_mhz.maxn"
        );
    }

    #[test]
    fn a_replay_makes_the_source_a_replay_and_needs_tegrastats_enabled() {
        let config = parse("replay = \"/captures/a.txt\"\nreplay_speed = 10.0\nreplay_loop = true")
            .validate()
            .unwrap();
        assert_eq!(
            config.tegrastats.source,
            TegrastatsSourceConfig::Replay {
                path: PathBuf::from("/captures/a.txt"),
                speed: 10.0,
                looped: true
            }
        );
        assert_eq!(
            error_key("tegrastats_enabled = false\nreplay = \"/a\""),
            "thermal.replay"
        );
        assert_eq!(
            parse("tegrastats_enabled = false")
                .validate()
                .unwrap()
                .tegrastats
                .source,
            TegrastatsSourceConfig::Disabled
        );
    }

    #[test]
    fn a_power_input_is_one_microwatt_file_or_a_voltage_and_current_pair() {
        let config = parse(
            "[[power_input]]\nrail = \"VDD_IN\"\npower_uw = \"/sys/class/hwmon/hwmon1/power1_input\"\n\
             [[power_input]]\nrail = \"VDD_SOC\"\nmillivolts = \"/sys/a/in3_input\"\nmilliamps = \"/sys/a/curr3_input\"",
        )
        .validate()
        .unwrap();
        assert_eq!(config.sysfs.power_inputs.len(), 2);
        assert_eq!(
            error_key("[[power_input]]\nrail = \"A\"\nmillivolts = \"/x\""),
            "thermal.power_input[0]"
        );
        assert_eq!(
            error_key(
                "[[power_input]]\nrail = \"A\"\npower_uw = \"/x\"\n[[power_input]]\nrail = \"A\"\npower_uw = \"/y\""
            ),
            "thermal.power_input[1].rail"
        );
        assert_eq!(
            error_key("[[power_input]]\nrail = \"A\"\npower_uw = \"relative/x\""),
            "thermal.power_input[0].power_uw"
        );
    }

    #[test]
    fn zone_components_are_matched_lower_case_and_unknown_components_are_refused() {
        let config = parse("[zone_components]\n\"PMIC-Die\" = \"ignore\"\nTboard = \"soc\"")
            .validate()
            .unwrap();
        assert!(
            config
                .throttle
                .zone_components
                .contains(&("pmic-die".to_owned(), ZoneComponent::Ignore))
        );
        assert!(toml::from_str::<RawThermalConfig>("[zone_components]\na = \"fan\"").is_err());
    }

    #[test]
    fn a_gpu_devfreq_name_is_a_directory_name() {
        assert_eq!(error_key("gpu_devfreq = \"a/b\""), "thermal.gpu_devfreq");
    }
}
