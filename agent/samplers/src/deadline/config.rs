//! Configuration of the deadline sampler: the raw `[deadline]` and `[[probe]]` sections as they
//! appear in the agent's TOML ([`RawDeadlineConfig`], [`RawProbeConfig`]), and the validated form
//! with units in the types ([`DeadlineConfig`], [`ProbeConfig`]).
//!
//! Invariants:
//! - The raw structs do no I/O and refuse unknown keys; every validation error names its key
//!   (`deadline.poll_hz`, `probe[1].path`) so the agent can exit 64 with it.
//! - Every default is a named constant with the reason for its value.
//! - Intervals are duration strings ([`DURATION_KEYS`]); the numbers of seconds or milliseconds
//!   of older files (`snapshot_interval_s = 10`) still load to the same value, and giving both
//!   spellings is refused.
//! - A validated config always satisfies the capacities of the sampler's fixed structures
//!   (probes, histogram bounds, window misses), so the sampler never has to truncate.

use std::path::PathBuf;
use std::time::Duration;

use edgewatch_conventions::config::{ConfigError, RenamedKey, refuse_both_spellings};
use edgewatch_conventions::duration::{DurationKey, Given, IntegerUnit};
use serde::Deserialize;

/// Polls per second. The probe design polls at 1–10 Hz. Counters, bursts and latencies come from
/// the loop's own timestamped records, which the rings keep for seconds (16 s at 1 kHz), so the
/// rate only bounds how soon a stalled or dead producer is seen: within 250 ms here, well inside
/// the uplink's batching. Each poll is a wake-up of the agent; at ten times this rate the HIL
/// footprint level measures the agent under its 1% CPU budget (`docs/hil.md`), at 10 Hz it was not.
pub const DEFAULT_POLL_HZ: f64 = 4.0;
/// Highest accepted poll rate: ten times the default, for footprint tests.
pub const MAX_POLL_HZ: f64 = 100.0;
/// Seconds between cumulative SLO snapshots: 8,640 samples per series per day, fine enough for
/// the 5-minute burn-rate window.
pub const DEFAULT_SNAPSHOT_INTERVAL_S: f64 = 10.0;
/// Misses in a row that make a burst: two can be jitter; three at 25 Hz are 120 ms without a
/// fresh output, about when a safety controller takes over.
pub const DEFAULT_BURST_CONSECUTIVE: u32 = 3;
/// Window of the "m misses within w cycles" rule: 100 cycles is 4 s at 25 Hz.
pub const DEFAULT_BURST_WINDOW_CYCLES: u32 = 100;
/// Misses within the window that make a burst: 5 % over the window, 500 times a 99.99 % budget.
pub const DEFAULT_BURST_WINDOW_MISSES: u32 = 5;
/// Seconds between two burst reports of one rule for one loop; bursts in between are merged into
/// the next report, so a loop missing every cycle cannot flood the safety tier.
pub const DEFAULT_BURST_MIN_INTERVAL_S: f64 = 1.0;
/// Seconds between two anomaly or ring-overrun reports for one probe; what happens in between is
/// counted into the next report.
pub const DEFAULT_STATUS_MIN_INTERVAL_S: f64 = 10.0;
/// Shortest heartbeat gap reported as a stall (on top of the reader's three periods): one poll
/// at 10 Hz. Shorter gaps cannot be resolved by the poll anyway and would flood the safety tier
/// with scheduler hiccups of fast loops; they still show as misses.
pub const DEFAULT_STALL_MIN_MS: f64 = 100.0;
/// Response-time bucket bounds as multiples of the loop's budget: fine around the budget, where
/// the SLO is decided, plus the tail.
pub const DEFAULT_HISTOGRAM_BOUNDS_BUDGET: [f64; 10] =
    [0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0];

/// `deadline.snapshot_interval`: at least a millisecond (and one poll), at most an hour.
pub const SNAPSHOT_INTERVAL: DurationKey = DurationKey::new(
    "deadline.snapshot_interval",
    Duration::from_millis(1),
    Duration::from_secs(3_600),
)
.replacing("deadline.snapshot_interval_s", IntegerUnit::Seconds);
/// `deadline.burst_min_interval`: 0 reports every burst, at most an hour.
pub const BURST_MIN_INTERVAL: DurationKey = DurationKey::new(
    "deadline.burst_min_interval",
    Duration::ZERO,
    Duration::from_secs(3_600),
)
.replacing("deadline.burst_min_interval_s", IntegerUnit::Seconds);
/// `deadline.status_min_interval`: 0 reports every anomaly, at most an hour.
pub const STATUS_MIN_INTERVAL: DurationKey = DurationKey::new(
    "deadline.status_min_interval",
    Duration::ZERO,
    Duration::from_secs(3_600),
)
.replacing("deadline.status_min_interval_s", IntegerUnit::Seconds);
/// `deadline.stall_min`: at most a minute.
pub const STALL_MIN: DurationKey = DurationKey::new(
    "deadline.stall_min",
    Duration::ZERO,
    Duration::from_secs(60),
)
.replacing("deadline.stall_min_ms", IntegerUnit::Milliseconds);
/// Every duration key of `[deadline]` and `[[probe]]`.
pub const DURATION_KEYS: [DurationKey; 4] = [
    SNAPSHOT_INTERVAL,
    BURST_MIN_INTERVAL,
    STATUS_MIN_INTERVAL,
    STALL_MIN,
];

/// Most probes one agent samples (loops per machine are at most 5 in the series budget).
pub const MAX_PROBES: usize = 16;
/// Most finite histogram buckets.
pub const MAX_BOUNDS: usize = 16;
/// Largest `burst_window_misses` (the window keeps that many miss positions inline).
pub const MAX_WINDOW_MISSES: usize = 64;

/// The `[deadline]` section as written.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDeadlineConfig {
    /// Polls per second (default [`DEFAULT_POLL_HZ`]).
    pub poll_hz: Option<f64>,
    /// Time between SLO snapshots, e.g. `"10s"` (default [`DEFAULT_SNAPSHOT_INTERVAL_S`]).
    pub snapshot_interval: Option<String>,
    /// Deprecated spelling of `snapshot_interval`: seconds.
    pub snapshot_interval_s: Option<f64>,
    /// Consecutive misses that make a burst.
    pub burst_consecutive: Option<u32>,
    /// Window (cycles) of the windowed burst rule.
    pub burst_window_cycles: Option<u32>,
    /// Misses within the window that make a burst.
    pub burst_window_misses: Option<u32>,
    /// Least time between burst reports per loop and rule, e.g. `"1s"`.
    pub burst_min_interval: Option<String>,
    /// Deprecated spelling of `burst_min_interval`: seconds.
    pub burst_min_interval_s: Option<f64>,
    /// Least time between anomaly / overrun reports per probe, e.g. `"10s"`.
    pub status_min_interval: Option<String>,
    /// Deprecated spelling of `status_min_interval`: seconds.
    pub status_min_interval_s: Option<f64>,
    /// Shortest heartbeat gap reported as a stall, e.g. `"100ms"`.
    pub stall_min: Option<String>,
    /// Deprecated spelling of `stall_min`: milliseconds.
    pub stall_min_ms: Option<f64>,
    /// Absolute response-time bucket bounds, ms (exclusive with `histogram_bounds_budget`).
    pub histogram_bounds_ms: Option<Vec<f64>>,
    /// Bucket bounds as multiples of each loop's budget.
    pub histogram_bounds_budget: Option<Vec<f64>>,
}

/// One `[[probe]]` entry as written.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawProbeConfig {
    /// Probe file, e.g. `/dev/shm/edgewatch-loop-1.probe`.
    pub path: Option<PathBuf>,
    /// Expected loop name; a probe announcing another name is an anomaly and is not sampled.
    pub loop_name: Option<String>,
    /// Model name reported with the probe's model-version slot (the slot holds only a version).
    pub model_name: Option<String>,
    /// Whether this probe's autonomy mode is the machine's (default: the first probe).
    pub autonomy: Option<bool>,
    /// Per-probe override of `deadline.burst_consecutive`.
    pub burst_consecutive: Option<u32>,
    /// Per-probe override of `deadline.burst_window_cycles`.
    pub burst_window_cycles: Option<u32>,
    /// Per-probe override of `deadline.burst_window_misses`.
    pub burst_window_misses: Option<u32>,
    /// Per-probe override of `deadline.histogram_bounds_ms`.
    pub histogram_bounds_ms: Option<Vec<f64>>,
    /// Per-probe override of `deadline.histogram_bounds_budget`.
    pub histogram_bounds_budget: Option<Vec<f64>>,
}

fn bad(key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::new(key, reason)
}

/// The burst rules of one loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BurstRules {
    /// k: this many misses in a row.
    pub consecutive: u32,
    /// w: the window, in cycles.
    pub window_cycles: u32,
    /// m: this many misses within w cycles (at most [`MAX_WINDOW_MISSES`]).
    pub window_misses: u32,
}

/// How a loop's response-time buckets are placed.
#[derive(Debug, Clone, PartialEq)]
pub enum HistogramBounds {
    /// Fixed bounds, ns, strictly increasing.
    Absolute(heapless::Vec<u64, MAX_BOUNDS>),
    /// Multiples of the loop's budget, strictly increasing.
    BudgetMultiples(heapless::Vec<f64, MAX_BOUNDS>),
}

impl HistogramBounds {
    /// The bounds in ns for a loop with this budget: strictly increasing, at least 1 ns (a
    /// multiple that rounds onto its predecessor is dropped).
    pub fn resolve(&self, budget_ns: u64) -> heapless::Vec<u64, MAX_BOUNDS> {
        let mut out = heapless::Vec::new();
        let mut push = |b: u64| {
            if out.last().is_none_or(|last| b > *last) {
                // Both sources hold at most MAX_BOUNDS entries.
                let _ = out.push(b);
            }
        };
        match self {
            HistogramBounds::Absolute(v) => v.iter().copied().for_each(&mut push),
            HistogramBounds::BudgetMultiples(v) => {
                for m in v {
                    push(((budget_ns as f64) * m).round().max(1.0) as u64);
                }
            }
        }
        out
    }
}

/// One probe, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeConfig {
    /// Probe file.
    pub path: PathBuf,
    /// Expected loop name, if checked.
    pub loop_name: Option<String>,
    /// Model name reported with the probe's model slot.
    pub model_name: Option<String>,
    /// Whether this probe's autonomy mode is the machine's.
    pub autonomy_source: bool,
    /// Burst rules.
    pub burst: BurstRules,
    /// Histogram bounds.
    pub histogram: HistogramBounds,
}

/// The deadline sampler's validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadlineConfig {
    /// Time between polls; the agent's shell calls `poll` on a timer of this period.
    pub poll_interval: Duration,
    /// Time between cumulative SLO snapshots.
    pub snapshot_interval: Duration,
    /// Least time between burst reports of one rule for one loop.
    pub burst_min_interval: Duration,
    /// Least time between anomaly or overrun reports for one probe.
    pub status_min_interval: Duration,
    /// Shortest heartbeat gap reported as a stall.
    pub stall_min: Duration,
    /// The probes, in configuration order.
    pub probes: Vec<ProbeConfig>,
}

/// One interval: the duration string under `key`, else the deprecated number under the key it
/// replaced (seconds or milliseconds, fractions allowed, checked against the same bounds in that
/// unit), else `default`; both spellings are refused.
fn interval(
    key: &DurationKey,
    text: Option<&str>,
    number: Option<f64>,
    default: Duration,
) -> Result<Given, ConfigError> {
    if let Some(renamed) = key.renamed() {
        refuse_both_spellings(renamed, text.is_some(), number.is_some())?;
    }
    if let Some(text) = text {
        return Ok(Given {
            value: key.parse(text)?,
            key: key.name,
        });
    }
    match (number, key.replaces) {
        (Some(v), Some(old)) => {
            let per_second = match old.unit {
                IntegerUnit::Seconds => 1.0,
                IntegerUnit::Milliseconds => 1000.0,
            };
            let (min, max) = (
                key.min.as_secs_f64() * per_second,
                key.max.as_secs_f64() * per_second,
            );
            if !(v.is_finite() && v >= min && v <= max) {
                return Err(bad(
                    old.name,
                    format!("must be a number from {min} to {max}"),
                ));
            }
            Ok(Given {
                value: Duration::from_secs_f64(v / per_second),
                key: old.name,
            })
        }
        _ => Ok(Given {
            value: default,
            key: key.name,
        }),
    }
}

fn count(key: &str, v: Option<u32>, default: u32, min: u32, max: u32) -> Result<u32, ConfigError> {
    let v = v.unwrap_or(default);
    if !(min..=max).contains(&v) {
        return Err(bad(key, format!("must be an integer from {min} to {max}")));
    }
    Ok(v)
}

fn bounds(
    prefix: &str,
    ms: Option<&Vec<f64>>,
    budget: Option<&Vec<f64>>,
) -> Result<Option<HistogramBounds>, ConfigError> {
    let check = |key: String, v: &[f64]| -> Result<(), ConfigError> {
        if v.is_empty() || v.len() > MAX_BOUNDS {
            return Err(bad(key, format!("must hold 1 to {MAX_BOUNDS} bounds")));
        }
        if v.iter().any(|b| !(b.is_finite() && *b > 0.0)) {
            return Err(bad(key, "bounds must be finite and above 0"));
        }
        if v.windows(2).any(|w| w[1] <= w[0]) {
            return Err(bad(key, "bounds must be strictly increasing"));
        }
        Ok(())
    };
    match (ms, budget) {
        (Some(_), Some(_)) => Err(bad(
            format!("{prefix}.histogram_bounds_ms"),
            "give either histogram_bounds_ms or histogram_bounds_budget, not both",
        )),
        (Some(v), None) => {
            check(format!("{prefix}.histogram_bounds_ms"), v)?;
            let mut out = heapless::Vec::new();
            for b in v {
                let ns = (b * 1e6).round().max(1.0) as u64;
                if out.last().is_some_and(|l| ns <= *l) || out.push(ns).is_err() {
                    return Err(bad(
                        format!("{prefix}.histogram_bounds_ms"),
                        "bounds must differ by at least 1 ns",
                    ));
                }
            }
            Ok(Some(HistogramBounds::Absolute(out)))
        }
        (None, Some(v)) => {
            check(format!("{prefix}.histogram_bounds_budget"), v)?;
            Ok(Some(HistogramBounds::BudgetMultiples(
                v.iter().copied().collect(),
            )))
        }
        (None, None) => Ok(None),
    }
}

impl RawDeadlineConfig {
    /// Validates this section with the `[[probe]]` list; errors name their key.
    pub fn validate(&self, probes: &[RawProbeConfig]) -> Result<DeadlineConfig, ConfigError> {
        DeadlineConfig::from_raw(self, probes)
    }

    /// The deprecated keys this section uses.
    pub fn renamed_keys(&self) -> Vec<RenamedKey> {
        [
            (SNAPSHOT_INTERVAL, self.snapshot_interval_s.is_some()),
            (BURST_MIN_INTERVAL, self.burst_min_interval_s.is_some()),
            (STATUS_MIN_INTERVAL, self.status_min_interval_s.is_some()),
            (STALL_MIN, self.stall_min_ms.is_some()),
        ]
        .into_iter()
        .filter(|(_, used)| *used)
        .filter_map(|(key, _)| key.renamed())
        .collect()
    }
}

impl DeadlineConfig {
    /// Validates the `[deadline]` section and the `[[probe]]` list.
    pub fn from_raw(
        deadline: &RawDeadlineConfig,
        probes: &[RawProbeConfig],
    ) -> Result<DeadlineConfig, ConfigError> {
        let d = deadline;
        let poll_hz = d.poll_hz.unwrap_or(DEFAULT_POLL_HZ);
        if !(poll_hz.is_finite() && poll_hz > 0.0 && poll_hz <= MAX_POLL_HZ) {
            return Err(bad(
                "deadline.poll_hz",
                format!("must be above 0 and at most {MAX_POLL_HZ}"),
            ));
        }
        let poll_interval = Duration::from_secs_f64(1.0 / poll_hz);
        let snapshot = interval(
            &SNAPSHOT_INTERVAL,
            d.snapshot_interval.as_deref(),
            d.snapshot_interval_s,
            Duration::from_secs_f64(DEFAULT_SNAPSHOT_INTERVAL_S),
        )?;
        if snapshot.value < poll_interval {
            return Err(bad(
                snapshot.key,
                "must not be shorter than one poll (1 / deadline.poll_hz)",
            ));
        }
        let snapshot_interval = snapshot.value;
        let burst_min_interval = interval(
            &BURST_MIN_INTERVAL,
            d.burst_min_interval.as_deref(),
            d.burst_min_interval_s,
            Duration::from_secs_f64(DEFAULT_BURST_MIN_INTERVAL_S),
        )?
        .value;
        let status_min_interval = interval(
            &STATUS_MIN_INTERVAL,
            d.status_min_interval.as_deref(),
            d.status_min_interval_s,
            Duration::from_secs_f64(DEFAULT_STATUS_MIN_INTERVAL_S),
        )?
        .value;
        let stall_min = interval(
            &STALL_MIN,
            d.stall_min.as_deref(),
            d.stall_min_ms,
            Duration::from_secs_f64(DEFAULT_STALL_MIN_MS / 1000.0),
        )?
        .value;
        let base = BurstRules {
            consecutive: count(
                "deadline.burst_consecutive",
                d.burst_consecutive,
                DEFAULT_BURST_CONSECUTIVE,
                1,
                1_000_000,
            )?,
            window_cycles: count(
                "deadline.burst_window_cycles",
                d.burst_window_cycles,
                DEFAULT_BURST_WINDOW_CYCLES,
                1,
                10_000_000,
            )?,
            window_misses: count(
                "deadline.burst_window_misses",
                d.burst_window_misses,
                DEFAULT_BURST_WINDOW_MISSES,
                1,
                MAX_WINDOW_MISSES as u32,
            )?,
        };
        if base.window_misses > base.window_cycles {
            return Err(bad(
                "deadline.burst_window_misses",
                "must not exceed deadline.burst_window_cycles",
            ));
        }
        let base_bounds = bounds(
            "deadline",
            d.histogram_bounds_ms.as_ref(),
            d.histogram_bounds_budget.as_ref(),
        )?
        .unwrap_or_else(|| {
            HistogramBounds::BudgetMultiples(DEFAULT_HISTOGRAM_BOUNDS_BUDGET.into_iter().collect())
        });

        if probes.len() > MAX_PROBES {
            return Err(bad("probe", format!("at most {MAX_PROBES} probes")));
        }
        let explicit_autonomy = probes.iter().filter(|p| p.autonomy == Some(true)).count();
        let mut out: Vec<ProbeConfig> = Vec::with_capacity(probes.len());
        for (i, p) in probes.iter().enumerate() {
            let k = |field: &str| format!("probe[{i}].{field}");
            let path = match &p.path {
                Some(path) if !path.as_os_str().is_empty() => path.clone(),
                _ => return Err(bad(k("path"), "is required")),
            };
            if out.iter().any(|o| o.path == path) {
                return Err(bad(k("path"), "names the same file as an earlier probe"));
            }
            if let Some(name) = &p.loop_name
                && (name.is_empty() || name.len() > 31 || name.contains('\0'))
            {
                return Err(bad(k("loop_name"), "must be 1 to 31 bytes without NUL"));
            }
            if let Some(name) = &p.model_name
                && (name.is_empty() || name.len() > 64)
            {
                return Err(bad(k("model_name"), "must be 1 to 64 bytes"));
            }
            if p.autonomy == Some(true) && explicit_autonomy > 1 {
                return Err(bad(
                    k("autonomy"),
                    "only one probe may be the machine's autonomy source",
                ));
            }
            let autonomy_source = match p.autonomy {
                Some(a) => a,
                None => explicit_autonomy == 0 && i == 0,
            };
            let burst = BurstRules {
                consecutive: count(
                    &k("burst_consecutive"),
                    p.burst_consecutive,
                    base.consecutive,
                    1,
                    1_000_000,
                )?,
                window_cycles: count(
                    &k("burst_window_cycles"),
                    p.burst_window_cycles,
                    base.window_cycles,
                    1,
                    10_000_000,
                )?,
                window_misses: count(
                    &k("burst_window_misses"),
                    p.burst_window_misses,
                    base.window_misses,
                    1,
                    MAX_WINDOW_MISSES as u32,
                )?,
            };
            if burst.window_misses > burst.window_cycles {
                return Err(bad(
                    k("burst_window_misses"),
                    "must not exceed the probe's burst_window_cycles",
                ));
            }
            let histogram = bounds(
                &format!("probe[{i}]"),
                p.histogram_bounds_ms.as_ref(),
                p.histogram_bounds_budget.as_ref(),
            )?
            .unwrap_or_else(|| base_bounds.clone());
            out.push(ProbeConfig {
                path,
                loop_name: p.loop_name.clone(),
                model_name: p.model_name.clone(),
                autonomy_source,
                burst,
                histogram,
            });
        }
        Ok(DeadlineConfig {
            poll_interval,
            snapshot_interval,
            burst_min_interval,
            status_min_interval,
            stall_min,
            probes: out,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct AgentToml {
        #[serde(default)]
        deadline: RawDeadlineConfig,
        #[serde(default)]
        probe: Vec<RawProbeConfig>,
    }

    fn parse(text: &str) -> Result<DeadlineConfig, ConfigError> {
        let t: AgentToml = toml::from_str(text).unwrap();
        DeadlineConfig::from_raw(&t.deadline, &t.probe)
    }

    #[test]
    fn an_empty_section_takes_the_named_defaults() {
        let c = parse("[[probe]]\npath = \"/dev/shm/a.probe\"\n").unwrap();
        assert_eq!(c.poll_interval, Duration::from_millis(250));
        assert_eq!(c.snapshot_interval, Duration::from_secs(10));
        let p = &c.probes[0];
        assert!(p.autonomy_source, "the first probe is the autonomy source");
        assert_eq!(
            p.burst,
            BurstRules {
                consecutive: 3,
                window_cycles: 100,
                window_misses: 5
            }
        );
        let b = p.histogram.resolve(40_000_000);
        assert_eq!(b.len(), 10);
        assert_eq!(b[4], 40_000_000, "one bound sits at the budget");
    }

    #[test]
    fn per_probe_overrides_win_over_the_section() {
        let c = parse(
            "[deadline]\npoll_hz = 5\nburst_consecutive = 4\nhistogram_bounds_ms = [1, 2, 3]\n\
             [[probe]]\npath = \"/a\"\n\
             [[probe]]\npath = \"/b\"\nloop_name = \"steer\"\nautonomy = true\nburst_consecutive = 2\n\
             histogram_bounds_budget = [0.5, 1.0]\n",
        )
        .unwrap();
        assert_eq!(c.poll_interval, Duration::from_millis(200));
        assert!(!c.probes[0].autonomy_source && c.probes[1].autonomy_source);
        assert_eq!(c.probes[0].burst.consecutive, 4);
        assert_eq!(c.probes[1].burst.consecutive, 2);
        assert_eq!(
            c.probes[0].histogram.resolve(7).as_slice(),
            &[1_000_000, 2_000_000, 3_000_000]
        );
        assert_eq!(
            c.probes[1].histogram.resolve(10_000_000).as_slice(),
            &[5_000_000, 10_000_000]
        );
    }

    #[test]
    fn each_bad_value_names_its_key() {
        for (text, key) in [
            ("[deadline]\npoll_hz = 0\n", "deadline.poll_hz"),
            ("[deadline]\npoll_hz = 1000\n", "deadline.poll_hz"),
            (
                "[deadline]\nsnapshot_interval_s = 0.01\n",
                "deadline.snapshot_interval_s",
            ),
            (
                "[deadline]\nburst_consecutive = 0\n",
                "deadline.burst_consecutive",
            ),
            (
                "[deadline]\nburst_window_misses = 65\n",
                "deadline.burst_window_misses",
            ),
            (
                "[deadline]\nburst_window_misses = 10\nburst_window_cycles = 5\n",
                "deadline.burst_window_misses",
            ),
            (
                "[deadline]\nhistogram_bounds_ms = [2, 1]\n",
                "deadline.histogram_bounds_ms",
            ),
            (
                "[deadline]\nhistogram_bounds_ms = []\n",
                "deadline.histogram_bounds_ms",
            ),
            (
                "[deadline]\nhistogram_bounds_ms = [1]\nhistogram_bounds_budget = [1]\n",
                "deadline.histogram_bounds_ms",
            ),
            ("[deadline]\nstall_min_ms = -1\n", "deadline.stall_min_ms"),
            ("[[probe]]\nloop_name = \"x\"\n", "probe[0].path"),
            (
                "[[probe]]\npath = \"/a\"\n[[probe]]\npath = \"/a\"\n",
                "probe[1].path",
            ),
            (
                "[[probe]]\npath = \"/a\"\nloop_name = \"a-name-much-longer-than-31-bytes\"\n",
                "probe[0].loop_name",
            ),
            (
                "[[probe]]\npath = \"/a\"\nautonomy = true\n[[probe]]\npath = \"/b\"\nautonomy = true\n",
                "probe[0].autonomy",
            ),
            (
                "[[probe]]\npath = \"/a\"\nhistogram_bounds_budget = [0]\n",
                "probe[0].histogram_bounds_budget",
            ),
            (
                "[[probe]]\npath = \"/a\"\nburst_window_misses = 200\n",
                "probe[0].burst_window_misses",
            ),
        ] {
            let e = parse(text).unwrap_err();
            assert_eq!(e.key, key, "{text}: {e}");
        }
    }

    #[test]
    fn unknown_keys_are_refused_by_the_raw_sections() {
        let e = toml::from_str::<AgentToml>("[deadline]\npoll_hertz = 3\n").unwrap_err();
        assert!(e.to_string().contains("poll_hertz"), "{e}");
        let e = toml::from_str::<AgentToml>("[[probe]]\npath = \"/a\"\nlop = 1\n").unwrap_err();
        assert!(e.to_string().contains("lop"), "{e}");
    }

    #[test]
    fn budget_multiples_that_round_together_keep_strictly_increasing_bounds() {
        let b = HistogramBounds::BudgetMultiples([0.1, 0.12, 0.3].into_iter().collect());
        assert_eq!(b.resolve(10).as_slice(), &[1, 3]);
    }
}
