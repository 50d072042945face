//! The deadline sampler's outgoing events, built in place: one `Event` per kind, created once with
//! its strings and lists reserved, refilled for every emission and handed to the sink by
//! reference.
//!
//! Invariants:
//! - Refilling an event clears and refills its strings and vectors without shrinking them, and
//!   never replaces the oneof variant it was built with, so steady-state emission allocates
//!   nothing (strings longer than their reservation grow once, then keep that capacity).
//! - Every event carries the poll's wall time as event time and its monotonic time.
//! - Interventions, safe stops and mode changes say they come from the probe
//!   (`EventSource::Probe`): the agent's own count of socket submissions is another counter.
//! - `DeadlineCounters` carries both vocabularies: the deadline fields (activations, deadline
//!   misses, overruns, deadline, semantics) and, with their old meaning, the fields gateways
//!   from before deadlines read (`cycles`, `misses` = overruns, `skipped`).

use edgewatch_proto::v1::{
    self, AutonomyModeChange, AutonomySeconds, DeadlineCounters, DeadlineMissBurst, Event,
    EventSource, Intervention, LatencyHistogram, LoopRef, ModeSeconds, ModelVersion,
    ModelVersionChange, ProbeState, ProbeStatus, SafeStop, SafetyFallback, Tier, event::Kind,
};
use loop_probe::DeadlineSemantics;

use super::burst::Burst;
use super::config::MAX_BOUNDS;
use super::histogram::Histogram;
use crate::autonomy::{ModeNs, REPORTED_MODES};
use crate::model::{copy_model, unknown_model};
use crate::sink::{EventSink, Now};

/// Bytes reserved for a `ProbeStatus.detail`: a reason and a probe path.
const DETAIL_CAPACITY: usize = 256;
/// Bytes reserved for a loop name (the probe's field holds 31).
const LOOP_NAME_CAPACITY: usize = 32;

/// Which loop an event is about.
#[derive(Debug, Clone, Copy)]
pub struct LoopId<'a> {
    /// Loop id from the probe header (0 before a probe was read).
    pub id: u32,
    /// Loop name.
    pub name: &'a str,
}

/// Cumulative per-series values for a `DeadlineCounters` snapshot.
#[derive(Debug, Clone, Copy)]
pub struct CountersView<'a> {
    /// Series start, wall ns.
    pub start_time_unix_ns: i64,
    /// Producer epoch.
    pub epoch: u64,
    /// Nominal period.
    pub period_ns: u64,
    /// Budget.
    pub budget_ns: u64,
    /// Cycles recorded.
    pub cycles: u64,
    /// Execution overruns.
    pub overruns: u64,
    /// Skipped activations.
    pub skipped: u64,
    /// Activations (recorded, skipped, and owed while silent).
    pub activations: u64,
    /// Deadline misses; `None` when the probe does not measure them (ABI 1).
    pub deadline_misses: Option<u64>,
    /// Relative deadline; `None` when the probe declares none (ABI 1).
    pub deadline_ns: Option<u64>,
    /// Sum of durations.
    pub sum_duration_ns: u64,
    /// Longest duration.
    pub max_duration_ns: u64,
    /// Response-time histogram.
    pub histogram: &'a Histogram,
}

/// Which header counter an increment event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CounterKind {
    /// `SafetyFallback`.
    Fallback,
    /// `Intervention`.
    Intervention,
    /// `SafeStop`.
    SafeStop,
}

/// One reusable event per kind.
#[derive(Debug)]
pub struct Emitter {
    counters: Event,
    burst: Event,
    fallback: Event,
    intervention: Event,
    safe_stop: Event,
    status: Event,
    model_change: Event,
    mode_change: Event,
    autonomy: Event,
}

fn loop_ref() -> Option<LoopRef> {
    Some(LoopRef {
        loop_id: 0,
        loop_name: String::with_capacity(LOOP_NAME_CAPACITY),
    })
}

fn event(kind: Kind) -> Event {
    Event {
        seq: 0,
        event_time_unix_ns: 0,
        monotonic_ns: 0,
        kind: Some(kind),
    }
}

fn fill_loop(dst: &mut Option<LoopRef>, l: LoopId<'_>) {
    let r = dst.get_or_insert_with(LoopRef::default);
    r.loop_id = l.id;
    r.loop_name.clear();
    r.loop_name.push_str(l.name);
}

fn fill_model(dst: &mut Option<ModelVersion>, m: &ModelVersion) {
    copy_model(dst.get_or_insert_with(unknown_model), m);
}

fn stamp(ev: &mut Event, now: Now) {
    ev.seq = 0;
    ev.event_time_unix_ns = now.wall_unix_ns;
    ev.monotonic_ns = now.monotonic_ns;
}

impl Default for Emitter {
    fn default() -> Self {
        Emitter::new()
    }
}

impl Emitter {
    /// Every event built once, with room reserved.
    pub fn new() -> Emitter {
        Emitter {
            counters: event(Kind::DeadlineCounters(DeadlineCounters {
                control_loop: loop_ref(),
                model: Some(unknown_model()),
                response_time: Some(LatencyHistogram {
                    bounds_ns: Vec::with_capacity(MAX_BOUNDS),
                    counts: Vec::with_capacity(MAX_BOUNDS + 1),
                }),
                ..DeadlineCounters::default()
            })),
            burst: event(Kind::DeadlineMissBurst(DeadlineMissBurst {
                control_loop: loop_ref(),
                model: Some(unknown_model()),
                ..DeadlineMissBurst::default()
            })),
            fallback: event(Kind::SafetyFallback(SafetyFallback {
                control_loop: loop_ref(),
                model: Some(unknown_model()),
                ..SafetyFallback::default()
            })),
            intervention: event(Kind::Intervention(Intervention {
                model: Some(unknown_model()),
                source: EventSource::Probe as i32,
                ..Intervention::default()
            })),
            safe_stop: event(Kind::SafeStop(SafeStop {
                model: Some(unknown_model()),
                source: EventSource::Probe as i32,
                ..SafeStop::default()
            })),
            status: event(Kind::ProbeStatus(ProbeStatus {
                control_loop: loop_ref(),
                detail: String::with_capacity(DETAIL_CAPACITY),
                ..ProbeStatus::default()
            })),
            model_change: event(Kind::ModelVersionChange(ModelVersionChange {
                control_loop: loop_ref(),
                previous: Some(unknown_model()),
                current: Some(unknown_model()),
            })),
            mode_change: event(Kind::AutonomyModeChange(AutonomyModeChange {
                source: EventSource::Probe as i32,
                ..AutonomyModeChange::default()
            })),
            autonomy: event(Kind::AutonomySeconds(AutonomySeconds {
                modes: Vec::with_capacity(REPORTED_MODES.len()),
                model: Some(unknown_model()),
                ..AutonomySeconds::default()
            })),
        }
    }

    /// SLO tier: a cumulative `DeadlineCounters` snapshot of one (loop, model) series.
    pub fn deadline_counters<S: EventSink + ?Sized>(
        &mut self,
        now: Now,
        l: LoopId<'_>,
        model: &ModelVersion,
        c: &CountersView<'_>,
        sink: &mut S,
    ) {
        let ev = &mut self.counters;
        stamp(ev, now);
        let Some(Kind::DeadlineCounters(d)) = &mut ev.kind else {
            return;
        };
        fill_loop(&mut d.control_loop, l);
        fill_model(&mut d.model, model);
        d.start_time_unix_ns = c.start_time_unix_ns;
        d.producer_epoch = c.epoch;
        d.period_ns = c.period_ns;
        d.budget_ns = c.budget_ns;
        d.cycles = c.cycles;
        // The field's old meaning, for gateways from before deadline semantics.
        d.misses = c.overruns;
        d.skipped = c.skipped;
        d.activations = Some(c.activations);
        d.deadline_misses = c.deadline_misses;
        d.overruns = Some(c.overruns);
        d.deadline_ns = c.deadline_ns.unwrap_or(0);
        d.semantics = wire_semantics(
            c.deadline_ns
                .map_or(DeadlineSemantics::Legacy, |_| DeadlineSemantics::Completion),
        ) as i32;
        d.sum_duration_ns = c.sum_duration_ns;
        d.max_duration_ns = c.max_duration_ns;
        // Counters are per (loop, model version), not split by mode.
        d.mode = v1::AutonomyMode::Unspecified as i32;
        let h = d
            .response_time
            .get_or_insert_with(LatencyHistogram::default);
        h.bounds_ns.clear();
        h.bounds_ns.extend_from_slice(c.histogram.bounds());
        h.counts.clear();
        h.counts.extend_from_slice(c.histogram.counts());
        sink.emit(Tier::Slo, ev);
    }

    /// Safety tier: a deadline-miss burst; `semantics` says what its misses are.
    #[allow(clippy::too_many_arguments)]
    pub fn burst<S: EventSink + ?Sized>(
        &mut self,
        now: Now,
        l: LoopId<'_>,
        model: &ModelVersion,
        mode: v1::AutonomyMode,
        semantics: DeadlineSemantics,
        b: &Burst,
        sink: &mut S,
    ) {
        let ev = &mut self.burst;
        stamp(ev, now);
        let Some(Kind::DeadlineMissBurst(d)) = &mut ev.kind else {
            return;
        };
        fill_loop(&mut d.control_loop, l);
        fill_model(&mut d.model, model);
        d.rule = b.rule as i32;
        d.misses = b.misses;
        d.window_cycles = b.window_cycles;
        d.first_cycle = b.first_cycle;
        d.last_cycle = b.last_cycle;
        d.worst_duration_ns = b.worst_duration_ns;
        d.mode = mode as i32;
        d.semantics = wire_semantics(semantics) as i32;
        sink.emit(Tier::Safety, ev);
    }

    /// Safety tier: a header counter (fallback, intervention, safe stop) went up.
    #[allow(clippy::too_many_arguments)]
    pub fn increment<S: EventSink + ?Sized>(
        &mut self,
        now: Now,
        kind: CounterKind,
        l: LoopId<'_>,
        model: &ModelVersion,
        mode: v1::AutonomyMode,
        total: u64,
        delta: u64,
        sink: &mut S,
    ) {
        let ev = match kind {
            CounterKind::Fallback => &mut self.fallback,
            CounterKind::Intervention => &mut self.intervention,
            CounterKind::SafeStop => &mut self.safe_stop,
        };
        stamp(ev, now);
        match &mut ev.kind {
            Some(Kind::SafetyFallback(f)) => {
                fill_loop(&mut f.control_loop, l);
                fill_model(&mut f.model, model);
                f.total = total;
                f.delta = delta;
                f.mode = mode as i32;
            }
            Some(Kind::Intervention(i)) => {
                fill_model(&mut i.model, model);
                i.total = total;
                i.delta = delta;
                i.mode = mode as i32;
            }
            Some(Kind::SafeStop(s)) => {
                fill_model(&mut s.model, model);
                s.total = total;
                s.delta = delta;
                s.mode = mode as i32;
            }
            _ => return,
        }
        sink.emit(Tier::Safety, ev);
    }

    /// Safety tier: the agent's view of a producer changed. `detail` parts are concatenated.
    #[allow(clippy::too_many_arguments)]
    pub fn probe_status<S: EventSink + ?Sized>(
        &mut self,
        now: Now,
        l: LoopId<'_>,
        state: ProbeState,
        epoch: u64,
        pid: u32,
        lost_records: u64,
        detail: &[&str],
        sink: &mut S,
    ) {
        let ev = &mut self.status;
        stamp(ev, now);
        let Some(Kind::ProbeStatus(s)) = &mut ev.kind else {
            return;
        };
        fill_loop(&mut s.control_loop, l);
        s.state = state as i32;
        s.producer_epoch = epoch;
        s.pid = pid;
        s.lost_records = lost_records;
        s.detail.clear();
        for part in detail {
            s.detail.push_str(part);
        }
        sink.emit(Tier::Safety, ev);
    }

    /// Safety tier: the loop now runs a different model.
    pub fn model_change<S: EventSink + ?Sized>(
        &mut self,
        now: Now,
        l: LoopId<'_>,
        previous: &ModelVersion,
        current: &ModelVersion,
        sink: &mut S,
    ) {
        let ev = &mut self.model_change;
        stamp(ev, now);
        let Some(Kind::ModelVersionChange(c)) = &mut ev.kind else {
            return;
        };
        fill_loop(&mut c.control_loop, l);
        fill_model(&mut c.previous, previous);
        fill_model(&mut c.current, current);
        sink.emit(Tier::Safety, ev);
    }

    /// Safety tier: the autonomy mode changed.
    pub fn mode_change<S: EventSink + ?Sized>(
        &mut self,
        now: Now,
        previous: v1::AutonomyMode,
        current: v1::AutonomyMode,
        sink: &mut S,
    ) {
        let ev = &mut self.mode_change;
        stamp(ev, now);
        let Some(Kind::AutonomyModeChange(c)) = &mut ev.kind else {
            return;
        };
        c.previous = previous as i32;
        c.current = current as i32;
        c.reason.clear();
        sink.emit(Tier::Safety, ev);
    }

    /// SLO tier: cumulative seconds per mode for one model version.
    pub fn autonomy_seconds<S: EventSink + ?Sized>(
        &mut self,
        now: Now,
        model: &ModelVersion,
        start_time_unix_ns: i64,
        ns: &ModeNs,
        sink: &mut S,
    ) {
        let ev = &mut self.autonomy;
        stamp(ev, now);
        let Some(Kind::AutonomySeconds(a)) = &mut ev.kind else {
            return;
        };
        a.start_time_unix_ns = start_time_unix_ns;
        fill_model(&mut a.model, model);
        a.modes.clear();
        for m in REPORTED_MODES {
            a.modes.push(ModeSeconds {
                mode: crate::autonomy::wire_mode(m) as i32,
                seconds: ns.get(m as usize).copied().unwrap_or(0) as f64 / 1e9,
            });
        }
        sink.emit(Tier::Slo, ev);
    }
}

/// The wire name of what a probe's deadline counters mean.
pub fn wire_semantics(s: DeadlineSemantics) -> v1::DeadlineSemantics {
    match s {
        DeadlineSemantics::Completion => v1::DeadlineSemantics::Completion,
        DeadlineSemantics::Legacy => v1::DeadlineSemantics::LegacyProbe,
    }
}
