//! One loop's deadline accounting, as pure logic: what the shell read from the probe goes in
//! (identity, model slot, records, the cumulative summary, liveness), events come out. No I/O,
//! no clock: every call takes the poll's [`Now`].
//!
//! A poll is `begin_poll` (model and mode as read now), `record` for each new ring record,
//! then `end_poll` with the header summary read after the records.
//!
//! Invariants:
//! - Cycles, overruns, skipped and summed durations come from deltas of the header's cumulative
//!   summary, which the producer keeps exact even when the ring overruns; each delta goes to the
//!   (loop, model version) series selected at that poll. So the series of one producer epoch add
//!   up to the header's totals since the epoch's baseline, whatever records were lost.
//! - Activations and deadline misses are the header's totals too, except while a producer that
//!   holds its lock records nothing: then the activations it owes (their deadline one period
//!   past) are counted provisionally, and the probe's counts take over when it records again
//!   ([`super::provisional`]). Each poll credits `max(counted, header + overdue) - counted` to
//!   the current series, so these never decrease and are never counted twice.
//! - A probe without deadlines (ABI 1) has its activations counted (`cycles + skipped`) and its
//!   deadline misses reported absent, with legacy semantics; its bursts count overruns, as
//!   before deadlines.
//! - The histogram and bursts come from records, so they cover the records actually read; lost
//!   records are reported (`RING_OVERRUN`) and break burst runs. A burst's misses are deadline
//!   misses: late completions, and the skipped activations a record's gap in cycle numbers
//!   shows (when the record before it was read).
//! - An epoch's baseline is zero when the producer started after the agent. When the agent finds
//!   a producer already running, it continues the accounting an earlier run of the agent kept
//!   for that same producer epoch ([`super::resume`]: same series and starts, the header's
//!   increase since credited to the current series, records already read skipped); with
//!   nothing kept, counts made before are not attributed (their model is unknown) and the
//!   series start at the agent's first sight.
//! - An epoch's last values are stamped at its producer's last heartbeat (as wall time), after
//!   its last report and never after the poll: the next producer's first values, at a later
//!   time, never share a timestamp with them.
//! - A series is never reported with zero counts; its first non-zero value is reported at once
//!   (so a counter reset after a restart is visible at a low value), then every snapshot while it
//!   is the current series or changed, and a last time when its epoch ends or it is evicted.
//! - Safety reports are rate-limited per kind: bursts per loop, anomalies and overruns per probe;
//!   what happens in between is merged into the next report, never dropped. A miss run still
//!   going is held up to the burst interval, so a run ending within it is one report.
//! - No allocation in steady state (same producer, same model).

use edgewatch_proto::v1::{self, ModelSource, ModelVersion, ProbeState};
use loop_probe::{
    AutonomyMode, AutonomyState, DeadlineSemantics, FLAG_DEADLINE_MISS, FLAG_OVERRUN, PollStats,
    ProbeInfo, Record, Summary,
};

use super::burst::BurstDetector;
use super::config::{BurstRules, HistogramBounds, MAX_BOUNDS};
use super::emit::{CounterKind, CountersView, Emitter, LoopId};
use super::histogram::{Histogram, response_time_ns};
use super::provisional::{Counted, overdue_activations};
use super::resume::{self, HeaderTotals, LoopResume};
use crate::autonomy::{AutonomyLedger, ModeNs, wire_mode};
use crate::model::{PerModel, clear_model, copy_model, is_unknown, same_series, unknown_model};
use crate::sink::{EventSink, Now};

/// Model versions kept per loop and epoch (live models per machine are at most 2).
pub const MODELS_PER_LOOP: usize = 4;

/// What the tracker needs from the probe's configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct LoopSettings {
    /// Burst rules.
    pub burst: BurstRules,
    /// Histogram bounds.
    pub histogram: HistogramBounds,
    /// Least time between burst reports per rule, ns.
    pub burst_min_interval_ns: u64,
    /// Least time between anomaly / overrun reports, ns.
    pub status_min_interval_ns: u64,
    /// Model name reported with the probe's model slot.
    pub model_name: Option<String>,
    /// Whether this loop's autonomy mode is the machine's (its seconds are reported).
    pub autonomy_source: bool,
    /// Name used in events before the probe announced one (the configured name, or "").
    pub configured_name: String,
    /// Probe path, for anomaly details.
    pub path: String,
}

/// The agent's view of a producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoopState {
    /// No probe file yet (the loop has not started).
    Waiting,
    /// The probe file is unusable (bad magic, ABI, size, name; shrank).
    Faulty,
    /// The producer holds its lock and records cycles.
    Alive,
    /// The producer holds its lock but its heartbeat is old.
    Stalled,
    /// The producer's lock is gone.
    Dead,
}

/// Cumulative values of one (loop, model version) series.
#[derive(Debug, Clone)]
pub struct DeadlineSeries {
    /// Control steps recorded.
    pub cycles: u64,
    /// Steps over budget: execution overruns.
    pub overruns: u64,
    /// Activations skipped.
    pub skipped: u64,
    /// Activations: cycles plus skipped, plus those counted provisionally.
    pub activations: u64,
    /// Deadline misses: late completions plus skipped, plus those counted provisionally (0 for
    /// a probe without deadlines).
    pub deadline_misses: u64,
    /// Sum of durations.
    pub sum_duration_ns: u64,
    /// Longest duration seen.
    pub max_duration_ns: u64,
    /// Response times of the records read.
    pub histogram: Histogram,
    /// Changed since the last report.
    dirty: bool,
    /// Never reported yet.
    fresh: bool,
}

impl DeadlineSeries {
    fn new(bounds: &heapless::Vec<u64, MAX_BOUNDS>) -> DeadlineSeries {
        DeadlineSeries {
            cycles: 0,
            overruns: 0,
            skipped: 0,
            activations: 0,
            deadline_misses: 0,
            sum_duration_ns: 0,
            max_duration_ns: 0,
            histogram: Histogram::new(bounds),
            dirty: false,
            fresh: true,
        }
    }

    fn is_empty(&self) -> bool {
        self.cycles == 0
            && self.skipped == 0
            && self.activations == 0
            && self.histogram.total() == 0
    }
}

/// A minimum spacing between reports of one kind.
#[derive(Debug, Clone, Copy, Default)]
struct Gate {
    last_ns: Option<u64>,
}

impl Gate {
    fn open(&self, now_ns: u64, min_ns: u64) -> bool {
        self.last_ns
            .is_none_or(|l| now_ns.saturating_sub(l) >= min_ns)
    }
}

/// One producer's identity and the counters as last read.
#[derive(Debug, Clone)]
struct Epoch {
    info: ProbeInfo,
    bounds: heapless::Vec<u64, MAX_BOUNDS>,
    /// Summary at the last poll (the baseline for the next delta).
    prev: Summary,
    /// Activations and deadline misses counted, in the header's terms.
    counted: Counted,
    /// Start of series created at the epoch's first poll, wall ns.
    start_unix_ns: i64,
    /// Polls completed in this epoch.
    polls: u64,
    /// Ring records below this index were read by an earlier run of the agent (resumed epoch).
    read_from: u64,
    /// Wall time of the last counter event of this epoch, ns.
    last_report_unix_ns: i64,
}

/// Counts for the agent's `status` command.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoopCounts {
    /// Header totals of the current producer: cycles, overruns, skipped.
    pub cycles: u64,
    /// Execution overruns.
    pub overruns: u64,
    /// Skipped activations.
    pub skipped: u64,
    /// Activations of the current producer: the header's, plus those owed while it is silent.
    pub activations: u64,
    /// Deadline misses, as `activations`; `None` for a probe without deadlines (ABI 1).
    pub deadline_misses: Option<u64>,
    /// Fallbacks, interventions, safe stops (header totals).
    pub fallbacks: u64,
    /// Interventions.
    pub interventions: u64,
    /// Safe stops.
    pub safe_stops: u64,
    /// Records overwritten before the agent read them, since the agent started.
    pub lost_records: u64,
    /// Anomalies found, since the agent started.
    pub anomalies: u64,
    /// Burst reports emitted, since the agent started.
    pub bursts: u64,
}

/// A pending anomaly or overrun report.
#[derive(Debug, Clone, Copy, Default)]
struct Pending {
    gate: Gate,
    count: u64,
    detail: &'static str,
}

/// One loop's accounting; see the module doc.
#[derive(Debug)]
pub struct LoopTracker {
    settings: LoopSettings,
    state: LoopState,
    epoch: Option<Epoch>,
    /// Epoch of the last producer seen, across restarts.
    last_epoch: Option<u64>,
    loop_id: u32,
    loop_name: String,
    series: PerModel<DeadlineSeries, MODELS_PER_LOOP>,
    current: Option<usize>,
    /// The model counters go to now.
    effective: ModelVersion,
    /// The last known (not unknown) model, for change reports.
    last_known: ModelVersion,
    scratch: ModelVersion,
    own_mode: AutonomyMode,
    machine_mode: AutonomyMode,
    bursts: BurstDetector,
    /// What the current producer's deadline counters mean.
    semantics: DeadlineSemantics,
    /// Index and cycle of the last record read, to see the activations a gap skipped.
    last_record: Option<(u64, u64)>,
    burst_gate: Gate,
    /// When the waiting burst report was first seen, CLOCK_MONOTONIC ns.
    burst_pending_since: Option<u64>,
    anomaly: Pending,
    overrun: Pending,
    autonomy: AutonomyLedger,
    counts: LoopCounts,
    last_sample_ns: Option<u64>,
    problem: Option<&'static str>,
    /// What an earlier run of the agent kept, until the first producer opened.
    resume: Option<LoopResume>,
    /// The state to keep, refilled in place (no allocation once it has its shape).
    kept: LoopResume,
}

impl LoopTracker {
    /// A tracker for a loop not seen yet.
    pub fn new(settings: LoopSettings) -> LoopTracker {
        let mut loop_name = String::with_capacity(32);
        loop_name.push_str(&settings.configured_name);
        LoopTracker {
            bursts: BurstDetector::new(settings.burst),
            semantics: DeadlineSemantics::Completion,
            last_record: None,
            settings,
            state: LoopState::Waiting,
            epoch: None,
            last_epoch: None,
            loop_id: 0,
            loop_name,
            series: PerModel::default(),
            current: None,
            effective: unknown_model(),
            last_known: unknown_model(),
            scratch: unknown_model(),
            own_mode: AutonomyMode::Unknown,
            machine_mode: AutonomyMode::Unknown,
            burst_gate: Gate::default(),
            burst_pending_since: None,
            anomaly: Pending::default(),
            overrun: Pending::default(),
            autonomy: AutonomyLedger::default(),
            counts: LoopCounts::default(),
            last_sample_ns: None,
            problem: None,
            resume: None,
            kept: LoopResume::default(),
        }
    }

    fn id(&self) -> LoopId<'_> {
        LoopId {
            id: self.loop_id,
            name: &self.loop_name,
        }
    }

    /// The agent's view of the producer.
    pub fn state(&self) -> LoopState {
        self.state
    }

    /// Loop name (the probe's once read, else the configured one).
    pub fn loop_name(&self) -> &str {
        &self.loop_name
    }

    /// The current producer's identity.
    pub fn info(&self) -> Option<&ProbeInfo> {
        self.epoch.as_ref().map(|e| &e.info)
    }

    /// What the current (or last) producer's deadline counters mean.
    pub fn semantics(&self) -> DeadlineSemantics {
        self.semantics
    }

    /// The model counters go to now (unknown: empty name and version).
    pub fn model(&self) -> &ModelVersion {
        &self.effective
    }

    /// The loop's mode as its probe reports it, else the machine's.
    pub fn mode(&self) -> AutonomyMode {
        if self.own_mode == AutonomyMode::Unknown {
            self.machine_mode
        } else {
            self.own_mode
        }
    }

    /// The autonomy mode this loop's probe reports (for the machine, if it is the source).
    pub fn own_mode(&self) -> AutonomyMode {
        self.own_mode
    }

    /// Counts for `status`.
    pub fn counts(&self) -> &LoopCounts {
        &self.counts
    }

    /// When the last poll read the probe, CLOCK_MONOTONIC ns.
    pub fn last_sample_ns(&self) -> Option<u64> {
        self.last_sample_ns
    }

    /// The problem that keeps the probe unusable, if any.
    pub fn problem(&self) -> Option<&'static str> {
        self.problem
    }

    /// Series of the current epoch: model, start, values.
    pub fn series(&self) -> impl Iterator<Item = (&ModelVersion, i64, &DeadlineSeries)> {
        self.series
            .iter()
            .map(|e| (&e.model, e.start_time_unix_ns, &e.value))
    }

    /// Autonomy seconds per model of the current epoch (if this loop is the autonomy source).
    pub fn autonomy_series(&self) -> impl Iterator<Item = (&ModelVersion, i64, &ModeNs)> {
        self.autonomy.series()
    }

    /// No probe file at the path.
    pub fn waiting(&mut self) {
        if self.epoch.is_none() && self.state != LoopState::Dead {
            self.state = LoopState::Waiting;
            self.problem = None;
        }
    }

    /// A new producer was opened. `baseline` is the header as first read when the producer
    /// started before the agent (its earlier counts are not attributed, nor the activations it
    /// owed then), `None` to count from the producer's start. Reports `RESTARTED` when an
    /// earlier producer was known.
    pub fn start_epoch<S: EventSink + ?Sized>(
        &mut self,
        info: &ProbeInfo,
        baseline: Option<(Summary, Option<AutonomyState>)>,
        now: Now,
        em: &mut Emitter,
        sink: &mut S,
    ) {
        if self.epoch.is_some() {
            self.end_epoch(now, em, sink);
        }
        self.loop_id = info.loop_id;
        self.loop_name.clear();
        self.loop_name.push_str(info.loop_name());
        if self.last_epoch.is_some_and(|e| e != info.epoch) {
            em.probe_status(
                now,
                self.id(),
                ProbeState::Restarted,
                info.epoch,
                info.pid,
                0,
                &[],
                sink,
            );
        }
        self.last_epoch = Some(info.epoch);
        if let Some(kept) = self.resume.take()
            && kept.counting
            && kept.producer_epoch == info.epoch
            && kept.producer_start_ns == info.start_ns
            && let Some(header) = kept.header
        {
            self.resume_epoch(info, &kept, header, now);
            return;
        }
        let counted = match &baseline {
            Some((summary, _)) => Counted::at_first_sight(
                summary.cycles.activations,
                summary.deadline_misses(),
                overdue(summary, info, now.monotonic_ns),
            ),
            None => Counted::default(),
        };
        let (prev, start_unix_ns, auto_base) = match baseline {
            Some((summary, autonomy)) => {
                let mut prev = summary;
                // Event counters are reported once with their totals (delta since the producer
                // started) so their series exist from the first poll.
                prev.events = Default::default();
                let base = autonomy.map(|a| {
                    let mut t: ModeNs = [0; loop_probe::layout::AUTONOMY_MODES];
                    for m in AutonomyMode::ALL {
                        if let Some(x) = t.get_mut(m as usize) {
                            *x = a.total_ns(m, now.monotonic_ns.max(a.since_ns));
                        }
                    }
                    t
                });
                (prev, now.wall_unix_ns, Some(base))
            }
            None => {
                let age = now.monotonic_ns.saturating_sub(info.start_ns);
                let start = now
                    .wall_unix_ns
                    .saturating_sub(i64::try_from(age).unwrap_or(i64::MAX));
                (Summary::default(), start, None)
            }
        };
        self.epoch = Some(Epoch {
            info: *info,
            bounds: self.settings.histogram.resolve(info.budget_ns),
            prev,
            counted,
            start_unix_ns,
            polls: 0,
            read_from: 0,
            last_report_unix_ns: i64::MIN,
        });
        self.semantics = info.semantics();
        self.last_record = None;
        self.series.clear();
        self.current = None;
        self.bursts.reset();
        self.autonomy
            .start_epoch(auto_base.flatten(), start_unix_ns);
        self.own_mode = AutonomyMode::Unknown;
        self.state = LoopState::Alive;
        self.problem = None;
    }

    /// Takes what an earlier run of the agent kept of this loop ([`super::resume`]): the next
    /// producer opened continues it if it is the same producer epoch. The last known model and
    /// producer epoch are taken in any case, so a model change or a producer restart while the
    /// agent was down is reported.
    pub fn restore(&mut self, kept: LoopResume) {
        if kept.producer_epoch != 0 {
            self.last_epoch = Some(kept.producer_epoch);
        }
        if let Some(model) = &kept.last_known_model {
            copy_model(&mut self.last_known, model);
        }
        self.resume = Some(kept);
    }

    /// Continues an epoch from what an earlier run kept: its series (values, starts, models),
    /// the header totals they correspond to, what was counted provisionally, the autonomy
    /// seconds, and the ring position read. The next poll credits the header's increase since
    /// (the agent's downtime included) to the series current then.
    fn resume_epoch(&mut self, info: &ProbeInfo, kept: &LoopResume, h: HeaderTotals, now: Now) {
        let mut prev = Summary {
            semantics: info.semantics(),
            head: h.head,
            heartbeat_ns: h.heartbeat_ns,
            last_record: None,
            ..Summary::default()
        };
        prev.cycles.cycles = h.cycles;
        prev.cycles.overruns = h.overruns;
        prev.cycles.skipped = h.skipped;
        prev.cycles.activations = h.activations;
        prev.cycles.deadline_misses = h.deadline_misses;
        prev.cycles.sum_duration_ns = h.sum_duration_ns;
        prev.cycles.max_duration_ns = h.max_duration_ns;
        prev.events.fallbacks = h.fallbacks;
        prev.events.interventions = h.interventions;
        prev.events.safe_stops = h.safe_stops;
        let bounds = self.settings.histogram.resolve(info.budget_ns);
        self.series.clear();
        for kept_series in &kept.series {
            let Some(model) = &kept_series.model else {
                continue;
            };
            let (i, _) = self.series.select(
                model,
                kept_series.start_time_unix_ns,
                now.monotonic_ns,
                || DeadlineSeries::new(&bounds),
            );
            if let Some(entry) = self.series.get_mut(i) {
                let v = &mut entry.value;
                v.cycles = kept_series.cycles;
                v.overruns = kept_series.overruns;
                v.skipped = kept_series.skipped;
                v.activations = kept_series.activations;
                v.deadline_misses = kept_series.deadline_misses;
                v.sum_duration_ns = kept_series.sum_duration_ns;
                v.max_duration_ns = kept_series.max_duration_ns;
                // Bounds changed with the configuration: the histogram starts again.
                v.histogram.set_counts(&kept_series.histogram);
                v.dirty = kept_series.dirty;
                v.fresh = kept_series.fresh;
            }
        }
        let seen = kept.autonomy_seen.as_ref().map(|t| mode_ns(&t.ns));
        self.autonomy.start_epoch(seen, kept.epoch_start_unix_ns);
        for a in &kept.autonomy {
            if let (Some(model), Some(ns)) = (&a.model, &a.ns) {
                self.autonomy.restore_series(
                    model,
                    a.start_time_unix_ns,
                    &mode_ns(&ns.ns),
                    now.monotonic_ns,
                );
            }
        }
        self.epoch = Some(Epoch {
            info: *info,
            bounds,
            prev,
            counted: Counted {
                activations: kept.counted_activations,
                deadline_misses: kept.counted_deadline_misses,
            },
            start_unix_ns: kept.epoch_start_unix_ns,
            polls: kept.polls,
            read_from: kept.records_read,
            last_report_unix_ns: kept.last_report_unix_ns,
        });
        self.semantics = info.semantics();
        self.last_record = None;
        self.current = None;
        self.bursts.reset();
        self.own_mode = AutonomyMode::Unknown;
        self.state = LoopState::Alive;
        self.problem = None;
    }

    /// The state to keep for a later run of the agent ([`super::resume`]), refilled in place.
    /// The shell keeps it after every pass in which this loop emitted, so that it is written with
    /// those events.
    pub fn kept_state(&mut self) -> &LoopResume {
        let k = &mut self.kept;
        k.format = resume::FORMAT;
        resume::fill_model(&mut k.last_known_model, &self.last_known);
        let Some(e) = &self.epoch else {
            k.producer_epoch = self.last_epoch.unwrap_or(0);
            k.producer_start_ns = 0;
            k.counting = false;
            k.header = None;
            k.series_mut(0);
            k.autonomy_mut(0);
            k.autonomy_seen = None;
            return &self.kept;
        };
        k.producer_epoch = e.info.epoch;
        k.producer_start_ns = e.info.start_ns;
        k.counting = true;
        let (c, ev) = (&e.prev.cycles, &e.prev.events);
        k.header = Some(HeaderTotals {
            cycles: c.cycles,
            overruns: c.overruns,
            skipped: c.skipped,
            activations: c.activations,
            deadline_misses: c.deadline_misses,
            sum_duration_ns: c.sum_duration_ns,
            max_duration_ns: c.max_duration_ns,
            fallbacks: ev.fallbacks,
            interventions: ev.interventions,
            safe_stops: ev.safe_stops,
            head: e.prev.head,
            heartbeat_ns: e.prev.heartbeat_ns,
        });
        k.counted_activations = e.counted.activations;
        k.counted_deadline_misses = e.counted.deadline_misses;
        k.epoch_start_unix_ns = e.start_unix_ns;
        k.polls = e.polls;
        k.records_read = self
            .last_record
            .map_or(e.read_from, |(index, _)| e.read_from.max(index + 1));
        k.last_report_unix_ns = e.last_report_unix_ns;
        let n = self.series.iter().count();
        for (dst, src) in k.series_mut(n).iter_mut().zip(self.series.iter()) {
            resume::fill_model(&mut dst.model, &src.model);
            dst.start_time_unix_ns = src.start_time_unix_ns;
            let v = &src.value;
            dst.cycles = v.cycles;
            dst.overruns = v.overruns;
            dst.skipped = v.skipped;
            dst.activations = v.activations;
            dst.deadline_misses = v.deadline_misses;
            dst.sum_duration_ns = v.sum_duration_ns;
            dst.max_duration_ns = v.max_duration_ns;
            dst.histogram.clear();
            dst.histogram.extend_from_slice(v.histogram.counts());
            dst.dirty = v.dirty;
            dst.fresh = v.fresh;
        }
        match self.autonomy.seen() {
            Some(seen) => resume::fill_totals(&mut k.autonomy_seen, seen),
            None => k.autonomy_seen = None,
        }
        let n = self.autonomy.series().count();
        for (dst, (model, start, ns)) in k.autonomy_mut(n).iter_mut().zip(self.autonomy.series()) {
            resume::fill_model(&mut dst.model, model);
            dst.start_time_unix_ns = start;
            resume::fill_totals(&mut dst.ns, ns);
        }
        &self.kept
    }

    /// When the current epoch's last values are stamped if it ends now: its producer's last
    /// heartbeat (`heartbeat_ns`, CLOCK_MONOTONIC) as wall time, but not before the epoch's
    /// series start, at least a millisecond (the gateway's resolution) after the epoch's last
    /// report, and never after `now`. Only the wall time moves; `now` without an epoch.
    pub fn final_stamp(&self, now: Now, heartbeat_ns: u64) -> Now {
        let Some(e) = &self.epoch else {
            return now;
        };
        let behind =
            i64::try_from(now.monotonic_ns.saturating_sub(heartbeat_ns)).unwrap_or(i64::MAX);
        let heartbeat_wall = now.wall_unix_ns.saturating_sub(behind);
        let after_report = e.last_report_unix_ns.saturating_add(1_000_000);
        Now {
            wall_unix_ns: heartbeat_wall
                .max(e.start_unix_ns)
                .max(after_report)
                .min(now.wall_unix_ns),
            monotonic_ns: now.monotonic_ns,
        }
    }

    /// The current producer's last heartbeat as last read, CLOCK_MONOTONIC ns.
    pub fn last_heartbeat_ns(&self) -> Option<u64> {
        self.epoch.as_ref().map(|e| e.prev.heartbeat_ns)
    }

    /// First half of a poll: the model slot and the loop's mode as read now. `machine_mode` is
    /// the autonomy source's mode, used when this probe reports none.
    pub fn begin_poll<S: EventSink + ?Sized>(
        &mut self,
        slot: Option<&loop_probe::ModelVersion>,
        manifest: Option<&ModelVersion>,
        machine_mode: AutonomyMode,
        now: Now,
        em: &mut Emitter,
        sink: &mut S,
    ) {
        self.machine_mode = machine_mode;
        resolve_model(
            &mut self.scratch,
            slot,
            manifest,
            self.settings.model_name.as_deref(),
        );
        if !crate::model::same_identity(&self.scratch, &self.effective)
            || self.scratch.source != self.effective.source
        {
            if !is_unknown(&self.scratch) {
                let both_manifest = self.scratch.source == ModelSource::Manifest as i32
                    && self.last_known.source == ModelSource::Manifest as i32;
                if !is_unknown(&self.last_known)
                    && is_change(&self.last_known, &self.scratch)
                    && !both_manifest
                {
                    let id = LoopId {
                        id: self.loop_id,
                        name: &self.loop_name,
                    };
                    em.model_change(now, id, &self.last_known, &self.scratch, sink);
                }
                copy_model(&mut self.last_known, &self.scratch);
            }
            copy_model(&mut self.effective, &self.scratch);
        }
        let Some(epoch) = &self.epoch else {
            return;
        };
        let start = if epoch.polls == 0 {
            epoch.start_unix_ns
        } else {
            now.wall_unix_ns
        };
        let bounds = &epoch.bounds;
        let (i, evicted) = self
            .series
            .select(&self.effective, start, now.monotonic_ns, || {
                DeadlineSeries::new(bounds)
            });
        self.current = Some(i);
        if let Some(old) = evicted
            && !old.value.is_empty()
        {
            let id = LoopId {
                id: self.loop_id,
                name: &self.loop_name,
            };
            emit_counters(
                em,
                now,
                id,
                epoch,
                &old.model,
                old.start_time_unix_ns,
                &old.value,
                sink,
            );
            if let Some(e) = self.epoch.as_mut() {
                e.last_report_unix_ns = e.last_report_unix_ns.max(now.wall_unix_ns);
            }
        }
    }

    /// One record read from the ring, oldest first.
    #[inline]
    pub fn record(&mut self, rec: &Record) {
        if self.epoch.as_ref().is_some_and(|e| rec.index < e.read_from) {
            // Read (and counted in the histogram and bursts) by an earlier run of the agent.
            return;
        }
        let missed = match self.semantics {
            DeadlineSemantics::Completion => {
                // The activations a gap in cycle numbers skipped are misses of the same run, when
                // the record before the gap was read (not lost or torn).
                if let Some((index, cycle)) = self.last_record
                    && rec.index == index.wrapping_add(1)
                    && rec.cycle > cycle.saturating_add(1)
                {
                    self.bursts.skipped(cycle + 1, rec.cycle - cycle - 1);
                }
                rec.flags & FLAG_DEADLINE_MISS != 0
            }
            DeadlineSemantics::Legacy => rec.flags & FLAG_OVERRUN != 0,
        };
        self.last_record = Some((rec.index, rec.cycle));
        self.bursts.record(rec.cycle, missed, rec.duration_ns);
        if let Some(e) = self.current.and_then(|i| self.series.get_mut(i)) {
            let s = &mut e.value;
            s.histogram.record(response_time_ns(
                rec.release_ns,
                rec.start_ns,
                rec.duration_ns,
            ));
            s.max_duration_ns = s.max_duration_ns.max(rec.duration_ns);
            s.dirty = true;
        }
    }

    /// Second half of a poll: the summary read after the records, the ring's statistics, the
    /// autonomy cell with the time to evaluate it at (now, or a dead producer's last
    /// heartbeat), and whether the producer holds its lock (only then are the activations it
    /// owes counted provisionally).
    #[allow(clippy::too_many_arguments)]
    pub fn end_poll<S: EventSink + ?Sized>(
        &mut self,
        summary: &Summary,
        stats: &PollStats,
        autonomy: Option<(&AutonomyState, u64)>,
        holds_lock: bool,
        now: Now,
        em: &mut Emitter,
        sink: &mut S,
    ) {
        let Some(epoch) = self.epoch.as_mut() else {
            return;
        };
        self.last_sample_ns = Some(now.monotonic_ns);
        let prev = epoch.prev;
        let (c, p) = (&summary.cycles, &prev.cycles);
        let went_back = c.cycles < p.cycles
            || c.overruns < p.overruns
            || c.skipped < p.skipped
            || c.activations < p.activations
            || c.deadline_misses < p.deadline_misses
            || c.sum_duration_ns < p.sum_duration_ns;
        let owed = if holds_lock {
            overdue(summary, &epoch.info, now.monotonic_ns)
        } else {
            0
        };
        let mut anomaly: Option<&'static str> = None;
        if went_back {
            anomaly = Some("probe summary counters went backwards");
        } else if let Some(s) = self.current.and_then(|i| self.series.get_mut(i)) {
            let v = &mut s.value;
            let dc = c.cycles - p.cycles;
            let dm = c.overruns - p.overruns;
            let ds = c.skipped - p.skipped;
            let deadline = epoch
                .counted
                .advance(c.activations, summary.deadline_misses(), owed);
            v.cycles = v.cycles.saturating_add(dc);
            v.overruns = v.overruns.saturating_add(dm);
            v.skipped = v.skipped.saturating_add(ds);
            v.activations = v.activations.saturating_add(deadline.activations);
            v.deadline_misses = v.deadline_misses.saturating_add(deadline.deadline_misses);
            v.sum_duration_ns = v
                .sum_duration_ns
                .saturating_add(c.sum_duration_ns - p.sum_duration_ns);
            if c.max_duration_ns > p.max_duration_ns {
                v.max_duration_ns = v.max_duration_ns.max(c.max_duration_ns);
            }
            if dc + dm + ds + deadline.activations + deadline.deadline_misses > 0 {
                v.dirty = true;
            }
        }
        epoch.prev = *summary;
        epoch.polls += 1;
        self.counts.cycles = c.cycles;
        self.counts.overruns = c.overruns;
        self.counts.skipped = c.skipped;
        self.counts.activations = epoch.counted.activations;
        self.counts.deadline_misses = summary
            .deadline_misses()
            .map(|_| epoch.counted.deadline_misses);

        // Header event counters.
        let mode = wire_mode(self.mode());
        let e = &summary.events;
        let pe = &prev.events;
        let mut incremented = false;
        for (kind, total, before) in [
            (CounterKind::Fallback, e.fallbacks, pe.fallbacks),
            (CounterKind::Intervention, e.interventions, pe.interventions),
            (CounterKind::SafeStop, e.safe_stops, pe.safe_stops),
        ] {
            if total > before {
                let id = LoopId {
                    id: self.loop_id,
                    name: &self.loop_name,
                };
                em.increment(
                    now,
                    kind,
                    id,
                    &self.effective,
                    mode,
                    total,
                    total - before,
                    sink,
                );
                incremented = true;
            } else if total < before {
                anomaly = Some("probe event counters went backwards");
            }
        }
        self.counts.fallbacks = e.fallbacks;
        self.counts.interventions = e.interventions;
        self.counts.safe_stops = e.safe_stops;
        if incremented && let Some(epoch) = self.epoch.as_mut() {
            epoch.last_report_unix_ns = epoch.last_report_unix_ns.max(now.wall_unix_ns);
        }

        // Autonomy.
        if let Some((state, at_ns)) = autonomy {
            self.own_mode = state.mode;
            if self.settings.autonomy_source {
                let (change, back) =
                    self.autonomy
                        .observe(state, at_ns, &self.effective, now.monotonic_ns);
                if let Some(ch) = change {
                    em.mode_change(now, wire_mode(ch.previous), wire_mode(ch.current), sink);
                }
                if back {
                    anomaly = Some("probe autonomy time went backwards");
                }
            }
        }

        // Ring statistics.
        if stats.lost > 0 {
            self.bursts.gap();
            self.overrun.count = self.overrun.count.saturating_add(stats.lost);
            self.counts.lost_records = self.counts.lost_records.saturating_add(stats.lost);
        }
        if stats.rejected > 0 {
            anomaly = Some("probe records hold impossible durations");
        }
        if stats.head_jumps > 0 {
            anomaly = Some("probe head jumped further than the loop can record");
        }
        if let Some(a) = anomaly {
            self.note_anomaly(a);
        }
        self.flush(now, false, em, sink);

        // A new series is reported at once, so that a reset is seen at a low value.
        if let (Some(i), Some(epoch)) = (self.current, self.epoch.as_mut())
            && let Some(s) = self.series.get_mut(i)
            && s.value.fresh
            && !s.value.is_empty()
        {
            epoch.last_report_unix_ns = epoch.last_report_unix_ns.max(now.wall_unix_ns);
            s.value.fresh = false;
            s.value.dirty = false;
            let id = LoopId {
                id: self.loop_id,
                name: &self.loop_name,
            };
            emit_counters(
                em,
                now,
                id,
                epoch,
                &s.model,
                s.start_time_unix_ns,
                &s.value,
                sink,
            );
        }
    }

    fn note_anomaly(&mut self, detail: &'static str) {
        self.anomaly.count = self.anomaly.count.saturating_add(1);
        self.anomaly.detail = detail;
        self.counts.anomalies = self.counts.anomalies.saturating_add(1);
    }

    /// Something is wrong with the probe (a refused file, an implausible value): counted, and
    /// reported no more often than the configured interval.
    pub fn anomaly<S: EventSink + ?Sized>(
        &mut self,
        detail: &'static str,
        now: Now,
        em: &mut Emitter,
        sink: &mut S,
    ) {
        self.note_anomaly(detail);
        self.flush(now, false, em, sink);
    }

    /// The probe file cannot be used until it changes (bad magic, ABI, size, loop name).
    pub fn faulty<S: EventSink + ?Sized>(
        &mut self,
        detail: &'static str,
        now: Now,
        em: &mut Emitter,
        sink: &mut S,
    ) {
        self.end_epoch(now, em, sink);
        self.state = LoopState::Faulty;
        self.problem = Some(detail);
        self.anomaly(detail, now, em, sink);
    }

    /// Emits what is pending and allowed by the rate limits (or everything, when `all`).
    fn flush<S: EventSink + ?Sized>(
        &mut self,
        now: Now,
        all: bool,
        em: &mut Emitter,
        sink: &mut S,
    ) {
        let t = now.monotonic_ns;
        let (epoch, pid) = self
            .epoch
            .as_ref()
            .map_or((self.last_epoch.unwrap_or(0), 0), |e| {
                (e.info.epoch, e.info.pid)
            });
        let status_min = self.settings.status_min_interval_ns;
        if self.anomaly.count > 0 && (all || self.anomaly.gate.open(t, status_min)) {
            let id = LoopId {
                id: self.loop_id,
                name: &self.loop_name,
            };
            let mut n = itoa_buf();
            let count = fmt_u64(&mut n, self.anomaly.count);
            em.probe_status(
                now,
                id,
                ProbeState::Anomaly,
                epoch,
                pid,
                0,
                &[
                    self.anomaly.detail,
                    " (",
                    &self.settings.path,
                    "; ",
                    count,
                    " since the last report)",
                ],
                sink,
            );
            self.anomaly.count = 0;
            self.anomaly.gate.last_ns = Some(t);
        }
        if self.overrun.count > 0 && (all || self.overrun.gate.open(t, status_min)) {
            let id = LoopId {
                id: self.loop_id,
                name: &self.loop_name,
            };
            em.probe_status(
                now,
                id,
                ProbeState::RingOverrun,
                epoch,
                pid,
                self.overrun.count,
                &["records overwritten before the agent read them; miss counts stay exact"],
                sink,
            );
            self.overrun.count = 0;
            self.overrun.gate.last_ns = Some(t);
        }
        let burst_min = self.settings.burst_min_interval_ns;
        if self.bursts.pending() && self.burst_pending_since.is_none() {
            self.burst_pending_since = Some(t);
        }
        // A run still going is held (up to the interval) so that one run is one report.
        let held_long = self
            .burst_pending_since
            .is_some_and(|since| t.saturating_sub(since) >= burst_min);
        if self.bursts.pending()
            && (all
                || (self.burst_gate.open(t, burst_min) && (!self.bursts.run_open() || held_long)))
        {
            let mode = wire_mode(self.mode());
            for b in self.bursts.take().into_iter().flatten() {
                let id = LoopId {
                    id: self.loop_id,
                    name: &self.loop_name,
                };
                em.burst(now, id, &self.effective, mode, self.semantics, &b, sink);
                self.counts.bursts += 1;
            }
            self.burst_gate.last_ns = Some(t);
            self.burst_pending_since = None;
        }
    }

    /// The producer's heartbeat is older than the stall limit.
    pub fn stalled<S: EventSink + ?Sized>(&mut self, now: Now, em: &mut Emitter, sink: &mut S) {
        if self.state == LoopState::Alive {
            self.state = LoopState::Stalled;
            self.status_event(ProbeState::Stalled, now, em, sink);
        }
    }

    /// The producer records cycles again (or still).
    pub fn alive<S: EventSink + ?Sized>(&mut self, now: Now, em: &mut Emitter, sink: &mut S) {
        if self.state == LoopState::Stalled {
            self.state = LoopState::Alive;
            self.status_event(ProbeState::Recovered, now, em, sink);
        }
    }

    /// The producer's lock is gone. Call after a last poll of what it left; ends the epoch, its
    /// last values stamped at `at` (a [`LoopTracker::final_stamp`]).
    pub fn died<S: EventSink + ?Sized>(
        &mut self,
        now: Now,
        at: Now,
        em: &mut Emitter,
        sink: &mut S,
    ) {
        if self.epoch.is_some() && self.state != LoopState::Dead {
            self.status_event(ProbeState::Died, now, em, sink);
            self.end_epoch_at(at, em, sink);
            self.state = LoopState::Dead;
        }
    }

    fn status_event<S: EventSink + ?Sized>(
        &mut self,
        state: ProbeState,
        now: Now,
        em: &mut Emitter,
        sink: &mut S,
    ) {
        let (epoch, pid) = self
            .epoch
            .as_ref()
            .map_or((0, 0), |e| (e.info.epoch, e.info.pid));
        let id = LoopId {
            id: self.loop_id,
            name: &self.loop_name,
        };
        em.probe_status(now, id, state, epoch, pid, 0, &[], sink);
    }

    /// Ends the current producer epoch: pending reports and every non-empty series are emitted
    /// one last time, stamped at the producer's last heartbeat ([`LoopTracker::final_stamp`]).
    pub fn end_epoch<S: EventSink + ?Sized>(&mut self, now: Now, em: &mut Emitter, sink: &mut S) {
        let Some(heartbeat_ns) = self.last_heartbeat_ns() else {
            return;
        };
        let at = self.final_stamp(now, heartbeat_ns);
        self.end_epoch_at(at, em, sink);
    }

    /// Ends the current producer epoch with its last values stamped at `at` (a
    /// [`LoopTracker::final_stamp`]).
    pub fn end_epoch_at<S: EventSink + ?Sized>(&mut self, at: Now, em: &mut Emitter, sink: &mut S) {
        if self.epoch.is_none() {
            return;
        }
        self.flush(at, true, em, sink);
        self.report(at, true, em, sink);
        self.epoch = None;
        self.current = None;
        self.series.clear();
        self.bursts.reset();
    }

    /// Emits every non-empty series and the autonomy seconds now, changed or not: the agent is
    /// stopping, and what was counted since the last snapshot must be in the queue before its
    /// last flush. The epoch goes on (a later run of the agent continues it).
    pub fn report_all<S: EventSink + ?Sized>(&mut self, now: Now, em: &mut Emitter, sink: &mut S) {
        self.flush(now, true, em, sink);
        self.report(now, true, em, sink);
    }

    /// The periodic SLO snapshot: the current series and every series changed since the last
    /// one, and the autonomy seconds if this loop is the autonomy source.
    pub fn snapshot<S: EventSink + ?Sized>(&mut self, now: Now, em: &mut Emitter, sink: &mut S) {
        self.report(now, false, em, sink);
    }

    fn report<S: EventSink + ?Sized>(
        &mut self,
        now: Now,
        all: bool,
        em: &mut Emitter,
        sink: &mut S,
    ) {
        let Some(epoch) = self.epoch.as_mut() else {
            return;
        };
        epoch.last_report_unix_ns = epoch.last_report_unix_ns.max(now.wall_unix_ns);
        let epoch = &*epoch;
        let id = LoopId {
            id: self.loop_id,
            name: &self.loop_name,
        };
        for (i, s) in self.series.iter_mut().enumerate() {
            let wanted = all || s.value.dirty || Some(i) == self.current;
            if wanted && !s.value.is_empty() {
                s.value.dirty = false;
                s.value.fresh = false;
                emit_counters(
                    em,
                    now,
                    id,
                    epoch,
                    &s.model,
                    s.start_time_unix_ns,
                    &s.value,
                    sink,
                );
            }
        }
        if self.settings.autonomy_source {
            for (model, start, ns) in self.autonomy.series() {
                em.autonomy_seconds(now, model, start, ns, sink);
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn emit_counters<S: EventSink + ?Sized>(
    em: &mut Emitter,
    now: Now,
    id: LoopId<'_>,
    epoch: &Epoch,
    model: &ModelVersion,
    start_time_unix_ns: i64,
    s: &DeadlineSeries,
    sink: &mut S,
) {
    em.deadline_counters(
        now,
        id,
        model,
        &CountersView {
            start_time_unix_ns,
            epoch: epoch.info.epoch,
            period_ns: epoch.info.period_ns,
            budget_ns: epoch.info.budget_ns,
            cycles: s.cycles,
            overruns: s.overruns,
            skipped: s.skipped,
            activations: s.activations,
            deadline_misses: match epoch.info.semantics() {
                DeadlineSemantics::Completion => Some(s.deadline_misses),
                DeadlineSemantics::Legacy => None,
            },
            deadline_ns: epoch.info.deadline_ns,
            sum_duration_ns: s.sum_duration_ns,
            max_duration_ns: s.max_duration_ns,
            histogram: &s.histogram,
        },
        sink,
    );
}

/// Activations a producer owes at `now_ns` (see [`super::provisional`]): 0 before its first
/// record, when the ring no longer holds the record the summary ends with, and for a probe
/// without deadlines.
fn overdue(summary: &Summary, info: &ProbeInfo, now_ns: u64) -> u64 {
    match (summary.last_record, info.deadline_ns) {
        (Some(last), Some(deadline_ns)) => {
            overdue_activations(now_ns, last.release_ns, info.period_ns, deadline_ns)
        }
        _ => 0,
    }
}

/// Whether going from `a` to `b` is a model change worth a report: another (name, version), another
/// id, or another engine hash (an engine hash arriving where there was none is not).
fn is_change(a: &ModelVersion, b: &ModelVersion) -> bool {
    !same_series(a, b)
        || a.id_hash != b.id_hash
        || (!a.engine_sha256.is_empty()
            && !b.engine_sha256.is_empty()
            && a.engine_sha256 != b.engine_sha256)
}

/// The model a loop runs: its probe slot when set (named by the probe's `model_name`, else by a
/// manifest of the same version), otherwise the manifest's identity, otherwise unknown.
pub fn resolve_model(
    dst: &mut ModelVersion,
    slot: Option<&loop_probe::ModelVersion>,
    manifest: Option<&ModelVersion>,
    model_name: Option<&str>,
) {
    clear_model(dst);
    match slot {
        Some(s) => {
            dst.version.push_str(s.version());
            dst.id_hash = s.id_hash;
            dst.source = ModelSource::Probe as i32;
            let matching = manifest.filter(|m| m.version == s.version());
            if let Some(name) = model_name {
                dst.name.push_str(name);
            } else if let Some(m) = matching {
                dst.name.push_str(&m.name);
            }
            if let Some(m) = matching
                && model_name.is_none_or(|n| n == m.name)
            {
                dst.engine_sha256.push_str(&m.engine_sha256);
                dst.tensorrt_version.push_str(&m.tensorrt_version);
                dst.cuda_version.push_str(&m.cuda_version);
                dst.l4t_version.push_str(&m.l4t_version);
            }
        }
        None => {
            if let Some(m) = manifest {
                copy_model(dst, m);
            }
        }
    }
}

/// Per-mode nanoseconds from a kept list (missing modes are 0).
fn mode_ns(kept: &[u64]) -> ModeNs {
    let mut ns: ModeNs = [0; loop_probe::layout::AUTONOMY_MODES];
    for (dst, src) in ns.iter_mut().zip(kept) {
        *dst = *src;
    }
    ns
}

fn itoa_buf() -> [u8; 20] {
    [0; 20]
}

/// Decimal text of `v` in `buf`, without allocating.
fn fmt_u64(buf: &mut [u8; 20], mut v: u64) -> &str {
    let mut i = buf.len();
    loop {
        i -= 1;
        if let Some(b) = buf.get_mut(i) {
            *b = b'0' + (v % 10) as u8;
        }
        v /= 10;
        if v == 0 || i == 0 {
            break;
        }
    }
    buf.get(i..)
        .and_then(|b| std::str::from_utf8(b).ok())
        .unwrap_or("")
}

/// The wire mode of a probe mode (re-exported for the shell's status).
pub fn wire(m: AutonomyMode) -> v1::AutonomyMode {
    wire_mode(m)
}

#[cfg(test)]
mod tests;
