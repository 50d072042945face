//! The timed loop: sleeps to each absolute release, carries out the cycle's plan, records the
//! cycle through the probe, and keeps its own tally to compare with what the agent reports.
//!
//! Invariants:
//! - Release `k` is `t0 + k × period` on CLOCK_MONOTONIC; a late cycle never shifts later
//!   releases (the next sleep returns at once and the loop catches up).
//! - A skipped activation sleeps to its release and records nothing; the probe sees the gap
//!   when the next cycle records (so a skip in the very last activation is not seen). Mode,
//!   model, intervention and safe-stop events due at a skipped activation still happen (they
//!   come from the autonomy stack, not the loop); overruns and fallbacks do not.
//! - Autonomy time is tallied with the same timestamps passed to the probe, from the probe's
//!   creation to `end_monotonic_ns`, so the two agree to the nanosecond.
//! - Nothing in the loop allocates.

use std::collections::BTreeMap;

use loop_probe::{AutonomyMode, Cycle, FLAG_FALLBACK, ProbeWriter};
use serde::Serialize;

use crate::config::Config;
use crate::rt::{now_ns, sleep_until, spin_until, stop_requested};

/// What the loop did, printed as JSON on exit.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    /// Probe file.
    pub probe: String,
    /// Loop id.
    pub loop_id: u32,
    /// Producer epoch, hex.
    pub epoch: String,
    /// Loop rate.
    pub rate_hz: f64,
    /// Period, ns.
    pub period_ns: u64,
    /// Budget, ns.
    pub budget_ns: u64,
    /// Releases passed (run and skipped).
    pub activations: u64,
    /// Cycles run and recorded.
    pub cycles: u64,
    /// Activations skipped on purpose.
    pub skipped_injected: u64,
    /// Cycles made to overrun on purpose.
    pub misses_injected: u64,
    /// Cycles whose measured duration exceeded the budget (injected or not).
    pub misses_observed: u64,
    /// Fallbacks reported.
    pub fallbacks: u64,
    /// Interventions reported.
    pub interventions: u64,
    /// Safe stops reported.
    pub safe_stops: u64,
    /// Model versions published.
    pub model_changes: u64,
    /// The last model version published.
    pub model_version: Option<String>,
    /// Seconds per autonomy mode, from probe creation to the end.
    pub autonomy_seconds: BTreeMap<&'static str, f64>,
    /// The same in nanoseconds.
    pub autonomy_ns: BTreeMap<&'static str, u64>,
    /// When the tally ended, CLOCK_MONOTONIC ns.
    pub end_monotonic_ns: u64,
    /// "duration" or "signal".
    pub stopped_by: &'static str,
    /// Scheduling policy in effect: "fifo:N" or "other".
    pub sched: String,
    /// CPU pinned to.
    pub cpu: Option<usize>,
    /// Whether mlockall succeeded.
    pub memory_locked: bool,
    /// Setter calls that found a header cell busy (always 0 with one thread).
    pub setter_busy: u64,
}

/// Counts kept by the loop; no allocation.
#[derive(Default)]
struct Tally<'a> {
    activations: u64,
    cycles: u64,
    skipped: u64,
    misses_injected: u64,
    misses_observed: u64,
    fallbacks: u64,
    interventions: u64,
    safe_stops: u64,
    model_changes: u64,
    last_model: Option<&'a str>,
    setter_busy: u64,
    mode_ns: [u64; 5],
}

/// Runs the loop until the configured number of activations or a stop signal.
pub fn run(cfg: &Config, writer: &mut ProbeWriter, memory_locked: bool) -> Outcome {
    let h = writer.handle().clone();
    let mut t = Tally::default();
    let mut mode = AutonomyMode::Unknown;
    let mut mode_since = h.start_ns();
    let t0 = now_ns() + cfg.period_ns;
    let mut stopped_by = "duration";
    let mut k: u64 = 0;
    loop {
        if cfg.activations.is_some_and(|n| k >= n) {
            break;
        }
        if stop_requested() {
            stopped_by = "signal";
            break;
        }
        let release = t0 + k * cfg.period_ns;
        let plan = cfg.schedule.plan(k);
        if !sleep_until(release) {
            stopped_by = "signal";
            break;
        }
        t.activations += 1;
        let start = now_ns();
        let mut flags = 0;
        if let Some(m) = plan.mode {
            if let Some(acc) = t.mode_ns.get_mut(mode as usize) {
                *acc += start.saturating_sub(mode_since);
            }
            mode = m;
            mode_since = mode_since.max(start);
            t.setter_busy += u64::from(h.set_autonomy(m, start).is_err());
        }
        if let Some((hash, version)) = plan.model {
            t.setter_busy += u64::from(h.set_model_version(hash, version).is_err());
            t.model_changes += 1;
            t.last_model = Some(version);
        }
        for _ in 0..plan.interventions {
            h.count_intervention();
            t.interventions += 1;
        }
        for _ in 0..plan.safe_stops {
            h.count_safe_stop();
            t.safe_stops += 1;
        }
        if plan.skip {
            t.skipped += 1;
            k += 1;
            continue;
        }
        if plan.fallback {
            h.count_fallback();
            flags |= FLAG_FALLBACK;
            t.fallbacks += 1;
        }
        if let Some(factor) = plan.overrun {
            spin_until(start + (factor * cfg.budget_ns as f64) as u64);
            t.misses_injected += 1;
        }
        let duration = now_ns() - start;
        if duration > cfg.budget_ns {
            t.misses_observed += 1;
        }
        writer.record(&Cycle {
            cycle: k,
            release_ns: release,
            start_ns: start,
            duration_ns: duration,
            flags,
        });
        t.cycles += 1;
        k += 1;
    }
    let end = now_ns();
    if let Some(acc) = t.mode_ns.get_mut(mode as usize) {
        *acc += end.saturating_sub(mode_since);
    }
    outcome(cfg, writer, &t, end, stopped_by, memory_locked)
}

fn outcome(
    cfg: &Config,
    writer: &ProbeWriter,
    t: &Tally<'_>,
    end: u64,
    stopped_by: &'static str,
    memory_locked: bool,
) -> Outcome {
    let autonomy_ns: BTreeMap<&'static str, u64> = AutonomyMode::ALL
        .iter()
        .map(|m| (m.name(), t.mode_ns.get(*m as usize).copied().unwrap_or(0)))
        .collect();
    Outcome {
        probe: cfg.probe.display().to_string(),
        loop_id: cfg.loop_id,
        epoch: format!("{:#018x}", writer.handle().epoch()),
        rate_hz: cfg.rate_hz,
        period_ns: cfg.period_ns,
        budget_ns: cfg.budget_ns,
        activations: t.activations,
        cycles: t.cycles,
        skipped_injected: t.skipped,
        misses_injected: t.misses_injected,
        misses_observed: t.misses_observed,
        fallbacks: t.fallbacks,
        interventions: t.interventions,
        safe_stops: t.safe_stops,
        model_changes: t.model_changes,
        model_version: t.last_model.map(str::to_owned),
        autonomy_seconds: autonomy_ns
            .iter()
            .map(|(k, v)| (*k, *v as f64 / 1e9))
            .collect(),
        autonomy_ns,
        end_monotonic_ns: end,
        stopped_by,
        sched: cfg
            .fifo
            .map_or_else(|| "other".to_owned(), |p| format!("fifo:{p}")),
        cpu: cfg.cpu,
        memory_locked,
        setter_busy: t.setter_busy,
    }
}
