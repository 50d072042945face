//! Command-line flags as clap parses them ([`RawConfig`]) and the validated configuration built
//! from them ([`Config::from_raw`]), the workspace's configuration convention
//! (`edgewatch_conventions::config`) with flags for keys. Pure: the script file's text is read by
//! `main` and passed in.
//!
//! Invariants:
//! - Every error is a `ConfigError` naming the flag it comes from; `main` exits 64 with it.
//! - Units are fixed here: periods and budgets in ns, durations as a count of activations.

use std::path::PathBuf;

use clap::Parser;
use edgewatch_conventions::config::ConfigError;

use crate::script::{Rule, Schedule, parse_rule, parse_script, parse_time};

/// Highest loop rate accepted: 100 kHz (a 10 µs period).
const MAX_RATE_HZ: f64 = 100_000.0;

/// Flags as given on the command line.
#[derive(Debug, Parser)]
#[command(
    name = "edgewatch-synthetic-loop",
    allow_negative_numbers = true,
    about = "A real timed control loop that writes every cycle through loop-probe, with scripted \
             overruns, skipped activations, fallbacks, autonomy modes, interventions, safe stops \
             and model versions. Prints a JSON summary on exit.",
    after_help = "Pattern rules (--event, or one per line in --script; see README.md):\n  \
                  overrun 2x at cycles 100..110   skip every 97   fallback at cycle 300\n  \
                  late-start 45ms at cycle 200   hang 2s at 4s\n  \
                  mode manual at 1.2s   intervention at 800ms   safe-stop at 1.5s\n  \
                  model yolo-v8.1 hash=0xfeed at 0s"
)]
pub struct RawConfig {
    /// Probe file to create (e.g. /dev/shm/edgewatch-loop-1.probe).
    #[arg(long, value_name = "PATH")]
    pub probe: PathBuf,
    /// Loop id written into the probe.
    #[arg(long, default_value_t = 1)]
    pub loop_id: u32,
    /// Loop name written into the probe (at most 31 bytes).
    #[arg(long, default_value = "synthetic")]
    pub loop_name: String,
    /// Loop rate in Hz.
    #[arg(long)]
    pub rate_hz: f64,
    /// Per-cycle budget in milliseconds.
    #[arg(long)]
    pub budget_ms: f64,
    /// Relative deadline (e.g. 35ms): a cycle completing later than this after its release
    /// misses its deadline. Default: the period.
    #[arg(long, value_name = "TIME")]
    pub deadline: Option<String>,
    /// Run time (e.g. 2s, 500ms); without it, run until SIGTERM or SIGINT.
    #[arg(long)]
    pub duration: Option<String>,
    /// Run SCHED_FIFO at this priority (1..99).
    #[arg(long, value_name = "PRIORITY")]
    pub fifo: Option<i32>,
    /// Pin the loop to this CPU.
    #[arg(long)]
    pub cpu: Option<usize>,
    /// Fail instead of warning when memory cannot be locked.
    #[arg(long)]
    pub require_rt: bool,
    /// Probe ring slots (a power of two); default: 16 s of records.
    #[arg(long)]
    pub capacity: Option<u32>,
    /// File of pattern rules, one per line.
    #[arg(long, value_name = "FILE")]
    pub script: Option<PathBuf>,
    /// One pattern rule; repeatable.
    #[arg(long = "event", value_name = "RULE")]
    pub events: Vec<String>,
}

/// The flag `key` (e.g. `--rate-hz`) refused for `reason`.
fn bad(key: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::new(key, reason)
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Probe file path.
    pub probe: PathBuf,
    /// Loop id.
    pub loop_id: u32,
    /// Loop name.
    pub loop_name: String,
    /// Loop rate in Hz (for the summary).
    pub rate_hz: f64,
    /// Period.
    pub period_ns: u64,
    /// Budget (≤ period).
    pub budget_ns: u64,
    /// Relative deadline (non-zero; the period unless `--deadline` says otherwise).
    pub deadline_ns: u64,
    /// Activations to run, or until a stop signal.
    pub activations: Option<u64>,
    /// SCHED_FIFO priority.
    pub fifo: Option<i32>,
    /// CPU to pin to.
    pub cpu: Option<usize>,
    /// Whether failing to lock memory is fatal.
    pub require_rt: bool,
    /// Ring slots.
    pub capacity: u32,
    /// The injection pattern.
    pub schedule: Schedule,
}

impl Config {
    /// Validates the flags; `script` is the text of `--script`, if given.
    pub fn from_raw(flags: &RawConfig, script: Option<&str>) -> Result<Config, ConfigError> {
        let rate = flags.rate_hz;
        if !(rate.is_finite() && rate > 0.0 && rate <= MAX_RATE_HZ) {
            return Err(bad("--rate-hz", "must be above 0 and at most 100000"));
        }
        let period_ns = (1e9 / rate).round() as u64;
        let b = flags.budget_ms;
        if !(b.is_finite() && b > 0.0) {
            return Err(bad("--budget-ms", "must be above 0"));
        }
        let budget_ns = ((b * 1e6).round() as u64).max(1);
        if budget_ns > period_ns {
            return Err(bad(
                "--budget-ms",
                "must not exceed the period (1000 / --rate-hz ms)",
            ));
        }
        let deadline_ns = match &flags.deadline {
            None => period_ns,
            Some(d) => {
                let secs = parse_time(d).map_err(|e| bad("--deadline", e))?;
                let ns = (secs * 1e9).round() as u64;
                if ns == 0 || ns > period_ns.saturating_mul(1000) {
                    return Err(bad(
                        "--deadline",
                        "must be above 0 and at most 1000 periods",
                    ));
                }
                ns
            }
        };
        let activations = match &flags.duration {
            None => None,
            Some(d) => {
                let secs = parse_time(d).map_err(|e| bad("--duration", e))?;
                Some((secs * rate).floor() as u64)
            }
        };
        if let Some(p) = flags.fifo
            && !(1..=99).contains(&p)
        {
            return Err(bad("--fifo", "priority must be from 1 to 99"));
        }
        if let Some(cpu) = flags.cpu
            && cpu >= libc::CPU_SETSIZE as usize
        {
            return Err(bad("--cpu", format!("must be below {}", libc::CPU_SETSIZE)));
        }
        if flags.loop_name.len() >= 32 || flags.loop_name.contains('\0') {
            return Err(bad("--loop-name", "must be at most 31 bytes without NUL"));
        }
        let capacity = flags
            .capacity
            .unwrap_or_else(|| loop_probe::recommended_capacity(period_ns));
        if !capacity.is_power_of_two() || !(2..=1 << 20).contains(&capacity) {
            return Err(bad(
                "--capacity",
                "must be a power of two from 2 to 1048576",
            ));
        }
        let mut rules: Vec<Rule> = Vec::new();
        if let Some(text) = script {
            let parsed = parse_script(text, rate)
                .map_err(|(line, e)| bad("--script", format!("line {line}: {e}")))?;
            rules.extend(parsed);
        }
        for e in &flags.events {
            rules.push(parse_rule(e, rate).map_err(|e| bad("--event", e.to_string()))?);
        }
        Ok(Config {
            probe: flags.probe.clone(),
            loop_id: flags.loop_id,
            loop_name: flags.loop_name.clone(),
            rate_hz: rate,
            period_ns,
            budget_ns,
            deadline_ns,
            activations,
            fifo: flags.fifo,
            cpu: flags.cpu,
            require_rt: flags.require_rt,
            capacity,
            schedule: Schedule::new(rules),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(args: &[&str]) -> RawConfig {
        let mut all = vec!["edgewatch-synthetic-loop", "--probe", "/dev/shm/x.probe"];
        all.extend_from_slice(args);
        RawConfig::try_parse_from(all).unwrap()
    }

    #[test]
    fn a_valid_command_line_becomes_a_config_in_ns_and_activations() {
        let c = Config::from_raw(
            &flags(&[
                "--rate-hz",
                "25",
                "--budget-ms",
                "40",
                "--duration",
                "2s",
                "--event",
                "skip every 5",
            ]),
            Some("overrun 2x at cycle 3\n"),
        )
        .unwrap();
        assert_eq!(c.period_ns, 40_000_000);
        assert_eq!(c.budget_ns, 40_000_000);
        assert_eq!(
            c.deadline_ns, 40_000_000,
            "the deadline defaults to the period"
        );
        assert_eq!(c.activations, Some(50));
        assert_eq!(c.capacity, 1024);
        assert_eq!(c.schedule.rules().len(), 2);
    }

    #[test]
    fn a_declared_deadline_is_kept_in_ns() {
        let c = Config::from_raw(
            &flags(&["--rate-hz", "25", "--budget-ms", "20", "--deadline", "35ms"]),
            None,
        )
        .unwrap();
        assert_eq!(c.deadline_ns, 35_000_000);
        for bad_deadline in ["0ms", "41s", "35"] {
            let e = Config::from_raw(
                &flags(&[
                    "--rate-hz",
                    "25",
                    "--budget-ms",
                    "20",
                    "--deadline",
                    bad_deadline,
                ]),
                None,
            )
            .unwrap_err();
            assert_eq!(e.key, "--deadline", "{bad_deadline}: {e}");
        }
    }

    #[test]
    fn each_bad_value_names_its_flag() {
        for (args, key) in [
            (&["--rate-hz", "0", "--budget-ms", "1"][..], "--rate-hz"),
            (
                &["--rate-hz", "100", "--budget-ms", "20"][..],
                "--budget-ms",
            ),
            (
                &["--rate-hz", "100", "--budget-ms", "-1"][..],
                "--budget-ms",
            ),
            (
                &["--rate-hz", "100", "--budget-ms", "1", "--duration", "2"][..],
                "--duration",
            ),
            (
                &["--rate-hz", "100", "--budget-ms", "1", "--fifo", "100"][..],
                "--fifo",
            ),
            (
                &["--rate-hz", "100", "--budget-ms", "1", "--capacity", "1000"][..],
                "--capacity",
            ),
            (
                &[
                    "--rate-hz",
                    "100",
                    "--budget-ms",
                    "1",
                    "--event",
                    "fly at 1s",
                ][..],
                "--event",
            ),
        ] {
            let e = Config::from_raw(&flags(args), None).unwrap_err();
            assert_eq!(e.key, key, "{args:?}: {e}");
        }
        let e = Config::from_raw(
            &flags(&["--rate-hz", "100", "--budget-ms", "1"]),
            Some("skip\n"),
        )
        .unwrap_err();
        assert_eq!(e.key, "--script");
        assert!(e.reason.starts_with("line 1"), "{e}");
    }
}
