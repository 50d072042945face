//! The timed loop: sleeps to each absolute release, carries out the cycle's plan, records the
//! cycle through the probe, and keeps its own tally, from its own clock, to compare with what
//! the agent reports.
//!
//! Invariants:
//! - Release `k` is `t0 + k × period` on CLOCK_MONOTONIC; a late cycle never shifts later
//!   releases (the next sleep returns at once and the loop catches up).
//! - A skipped activation sleeps to its release and records nothing; the probe sees the gap
//!   when the next cycle records (so a skip in the very last activation is not seen). Mode,
//!   model, intervention and safe-stop events due at a skipped activation still happen (they
//!   come from the autonomy stack, not the loop); overruns, late starts and fallbacks do not.
//! - A hang at activation `k` stops the loop from `k`'s release for its length: no records, no
//!   heartbeat. The loop resumes with the first activation released at or after the hang's
//!   end; `k` and every activation released before that are skipped. Events due at `k` happen
//!   before the hang, those due at the other swallowed activations when the loop resumes.
//! - A late start sleeps from the release to `release + late`, then runs the step (and its
//!   overrun, if any) from there.
//! - The tally is the loop's own account, from its own clock, of the probe's rule: an
//!   activation misses its deadline when the time read as its step ends (which is also the
//!   `start + duration` the probe is given) comes after `release + deadline`, and every skipped
//!   activation misses it. Counts are kept per model version (the one published last when the
//!   activation was released) and in total.
//! - Autonomy time is tallied with the same timestamps passed to the probe, from the probe's
//!   creation to `end_monotonic_ns`, so the two agree to the nanosecond; autonomous time is also
//!   split by the model version in effect.
//! - Nothing in the loop allocates: the per-model tallies are laid out, one per model version
//!   the schedule can publish, before the loop starts.

use std::collections::BTreeMap;

use loop_probe::{AutonomyMode, Cycle, FLAG_FALLBACK, ProbeHandle, ProbeWriter};
use serde::Serialize;

use crate::config::Config;
use crate::rt::{now_ns, sleep_until, spin_until, stop_requested};
use crate::script::CyclePlan;

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
    /// Relative deadline, ns.
    pub deadline_ns: u64,
    /// Releases passed (run and skipped).
    pub activations: u64,
    /// Cycles run and recorded.
    pub cycles: u64,
    /// Activations skipped on purpose (`skip`, and those a `hang` swallowed).
    pub skipped_injected: u64,
    /// Cycles made to overrun on purpose.
    pub misses_injected: u64,
    /// Cycles whose measured duration exceeded the budget (injected or not): overruns, what the
    /// probe calls `overruns` (`misses` before deadlines).
    pub misses_observed: u64,
    /// Cycles made to start late on purpose.
    pub late_starts_injected: u64,
    /// Hangs carried out.
    pub hangs_injected: u64,
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
    /// The loop's own account, from its own clock, independent of the probe.
    pub tally: TallyReport,
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

/// The tally in total and per model version ("" before any was published).
#[derive(Debug, Clone, Serialize)]
pub struct TallyReport {
    /// Over the whole run.
    pub total: Counts,
    /// Per model version in effect when the activation was released (or the event happened).
    pub models: BTreeMap<String, Counts>,
}

/// What the loop counted of itself.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Counts {
    /// Activations released: run or skipped.
    pub activations: u64,
    /// Activations that completed after release + deadline, or never ran.
    pub deadline_misses: u64,
    /// Steps whose duration exceeded the budget.
    pub overruns: u64,
    /// Activations that never ran.
    pub skipped: u64,
    /// Fallbacks reported.
    pub fallbacks: u64,
    /// Interventions reported.
    pub interventions: u64,
    /// Safe stops reported.
    pub safe_stops: u64,
    /// Nanoseconds in autonomous mode.
    pub autonomous_ns: u64,
    /// The same in seconds.
    pub autonomous_seconds: f64,
}

impl Counts {
    fn add(&mut self, o: &Counts) {
        self.activations += o.activations;
        self.deadline_misses += o.deadline_misses;
        self.overruns += o.overruns;
        self.skipped += o.skipped;
        self.fallbacks += o.fallbacks;
        self.interventions += o.interventions;
        self.safe_stops += o.safe_stops;
        self.autonomous_ns += o.autonomous_ns;
    }
}

/// Counts kept by the loop; no allocation once built.
struct Tally<'a> {
    cycles: u64,
    misses_injected: u64,
    late_starts: u64,
    hangs: u64,
    model_changes: u64,
    last_model: Option<&'a str>,
    setter_busy: u64,
    mode: AutonomyMode,
    /// When the current mode began (for `mode_ns`).
    mode_since: u64,
    mode_ns: [u64; 5],
    /// Model versions the schedule can publish; index 0 is "none yet".
    versions: Vec<&'a str>,
    /// Counts per entry of `versions`.
    per_model: Vec<Counts>,
    /// Index of the model in effect.
    model: usize,
    /// When the current (mode, model) stretch began (for autonomous time per model).
    stretch_since: u64,
}

impl<'a> Tally<'a> {
    fn new(model_versions: Vec<&'a str>, start_ns: u64) -> Tally<'a> {
        let mut versions = vec![""];
        versions.extend(model_versions);
        Tally {
            cycles: 0,
            misses_injected: 0,
            late_starts: 0,
            hangs: 0,
            model_changes: 0,
            last_model: None,
            setter_busy: 0,
            mode: AutonomyMode::Unknown,
            mode_since: start_ns,
            mode_ns: [0; 5],
            per_model: vec![Counts::default(); versions.len()],
            versions,
            model: 0,
            stretch_since: start_ns,
        }
    }

    fn current(&mut self) -> &mut Counts {
        let i = self.model.min(self.per_model.len().saturating_sub(1));
        // `per_model` has an entry per version, index 0 at least.
        &mut self.per_model[i]
    }

    /// Closes the current (mode, model) stretch at `at`: its time goes to the mode, and to the
    /// model if the mode is autonomous.
    fn close_stretch(&mut self, at: u64) {
        if self.mode == AutonomyMode::Autonomous {
            let spent = at.saturating_sub(self.stretch_since);
            self.current().autonomous_ns += spent;
        }
        self.stretch_since = self.stretch_since.max(at);
    }

    /// The autonomy stack's events of `plan`, at `at`.
    fn events(&mut self, plan: &CyclePlan<'a>, at: u64, h: &ProbeHandle) {
        if let Some(m) = plan.mode {
            self.close_stretch(at);
            if let Some(acc) = self.mode_ns.get_mut(self.mode as usize) {
                *acc += at.saturating_sub(self.mode_since);
            }
            self.mode = m;
            self.mode_since = self.mode_since.max(at);
            self.setter_busy += u64::from(h.set_autonomy(m, at).is_err());
        }
        if let Some((hash, version)) = plan.model {
            self.close_stretch(at);
            self.setter_busy += u64::from(h.set_model_version(hash, version).is_err());
            self.model_changes += 1;
            self.last_model = Some(version);
            self.model = self
                .versions
                .iter()
                .position(|v| *v == version)
                .unwrap_or(0);
        }
        for _ in 0..plan.interventions {
            h.count_intervention();
            self.current().interventions += 1;
        }
        for _ in 0..plan.safe_stops {
            h.count_safe_stop();
            self.current().safe_stops += 1;
        }
    }

    /// `n` activations that never ran.
    fn skipped(&mut self, n: u64) {
        let c = self.current();
        c.activations += n;
        c.skipped += n;
        c.deadline_misses += n;
    }

    /// One activation that ran.
    fn ran(&mut self, overrun: bool, missed_deadline: bool, fallback: bool) {
        self.cycles += 1;
        let c = self.current();
        c.activations += 1;
        c.overruns += u64::from(overrun);
        c.deadline_misses += u64::from(missed_deadline);
        c.fallbacks += u64::from(fallback);
    }

    /// Ends the tally at `end`.
    fn close(&mut self, end: u64) {
        self.close_stretch(end);
        if let Some(acc) = self.mode_ns.get_mut(self.mode as usize) {
            *acc += end.saturating_sub(self.mode_since);
        }
    }

    fn total(&self) -> Counts {
        let mut t = Counts::default();
        for c in &self.per_model {
            t.add(c);
        }
        t
    }
}

/// Runs the loop until the configured number of activations or a stop signal.
pub fn run(cfg: &Config, writer: &mut ProbeWriter, memory_locked: bool) -> Outcome {
    let h = writer.handle().clone();
    let mut t = Tally::new(cfg.schedule.model_versions(), h.start_ns());
    let t0 = now_ns() + cfg.period_ns;
    let limit = cfg.activations.unwrap_or(u64::MAX);
    let mut stopped_by = "duration";
    let mut k: u64 = 0;
    while k < limit {
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
        let woke = now_ns();
        t.events(&plan, woke, &h);
        if let Some(hang) = plan.hang_ns {
            t.hangs += 1;
            let resumes = sleep_until(release.saturating_add(hang));
            // The first activation released at or after the hang's end; a stop signal ends the
            // run with the activations released so far.
            let next = if resumes {
                k + hang.div_ceil(cfg.period_ns).max(1)
            } else {
                (now_ns().saturating_sub(t0) / cfg.period_ns + 1).max(k + 1)
            };
            let last = next.min(limit);
            t.skipped(last - k);
            if !resumes {
                stopped_by = "signal";
                break;
            }
            let at = now_ns();
            for i in k + 1..last {
                t.events(&cfg.schedule.plan(i), at, &h);
            }
            k = next;
            continue;
        }
        if plan.skip {
            t.skipped(1);
            k += 1;
            continue;
        }
        let start = match plan.late_start_ns {
            None => woke,
            Some(late) => {
                t.late_starts += 1;
                if !sleep_until(release.saturating_add(late)) {
                    // Released, never ran.
                    t.skipped(1);
                    stopped_by = "signal";
                    break;
                }
                now_ns()
            }
        };
        let mut flags = 0;
        if plan.fallback {
            h.count_fallback();
            flags |= FLAG_FALLBACK;
        }
        if let Some(factor) = plan.overrun {
            spin_until(start + (factor * cfg.budget_ns as f64) as u64);
            t.misses_injected += 1;
        }
        let end = now_ns();
        let duration = end - start;
        t.ran(
            duration > cfg.budget_ns,
            end > release.saturating_add(cfg.deadline_ns),
            plan.fallback,
        );
        writer.record(&Cycle {
            cycle: k,
            release_ns: release,
            start_ns: start,
            duration_ns: duration,
            flags,
        });
        k += 1;
    }
    let end = now_ns();
    t.close(end);
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
    let seconds = |mut c: Counts| {
        c.autonomous_seconds = c.autonomous_ns as f64 / 1e9;
        c
    };
    let total = seconds(t.total());
    let models: BTreeMap<String, Counts> = t
        .versions
        .iter()
        .zip(&t.per_model)
        .filter(|(_, c)| **c != Counts::default())
        .map(|(v, c)| ((*v).to_owned(), seconds(*c)))
        .collect();
    Outcome {
        probe: cfg.probe.display().to_string(),
        loop_id: cfg.loop_id,
        epoch: format!("{:#018x}", writer.handle().epoch()),
        rate_hz: cfg.rate_hz,
        period_ns: cfg.period_ns,
        budget_ns: cfg.budget_ns,
        deadline_ns: cfg.deadline_ns,
        activations: total.activations,
        cycles: t.cycles,
        skipped_injected: total.skipped,
        misses_injected: t.misses_injected,
        misses_observed: total.overruns,
        late_starts_injected: t.late_starts,
        hangs_injected: t.hangs,
        fallbacks: total.fallbacks,
        interventions: total.interventions,
        safe_stops: total.safe_stops,
        model_changes: t.model_changes,
        model_version: t.last_model.map(str::to_owned),
        autonomy_seconds: autonomy_ns
            .iter()
            .map(|(k, v)| (*k, *v as f64 / 1e9))
            .collect(),
        autonomy_ns,
        tally: TallyReport { total, models },
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
