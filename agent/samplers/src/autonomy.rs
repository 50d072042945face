//! Autonomy mode accounting: seconds per mode per model version (the denominator of cost per
//! autonomous machine-hour) and mode changes, from the probe header's autonomy cell. Pure: the
//! deadline sampler hands in what it read and the time.
//!
//! Invariants:
//! - The probe credits time per mode itself (`AutonomyState::total_ns`), so the seconds are
//!   exact however rarely the agent looks; the agent only splits them between model versions,
//!   at poll resolution: time since the previous poll goes to the model seen at this poll.
//! - Per model the seconds are cumulative from the series start and never go down within a
//!   producer epoch, across agent restarts too (the agent keeps the series and the totals they
//!   were credited up to); a new producer starts new series (the header's totals restart at
//!   zero).
//! - The unknown mode (never reported) is not counted: it has no label on the wire.
//! - A mode change is reported when a known mode differs from the last known mode; a producer
//!   restart passing through "unknown" is not a change. Two changes between polls that return
//!   to the same mode are not seen (their seconds still are).
//! - No allocation.

use edgewatch_proto::v1::{self, ModelVersion};
use loop_probe::{AutonomyMode, AutonomyState};

use crate::model::PerModel;

/// Model versions kept per producer epoch (live models per machine are at most 2).
pub const MODELS_PER_EPOCH: usize = 4;

/// The modes reported on the wire, in `AutonomySeconds.modes` order.
pub const REPORTED_MODES: [AutonomyMode; 4] = [
    AutonomyMode::Autonomous,
    AutonomyMode::Manual,
    AutonomyMode::Teleoperated,
    AutonomyMode::Idle,
];

/// The wire value of a probe mode (the two enums number their values differently).
pub fn wire_mode(m: AutonomyMode) -> v1::AutonomyMode {
    match m {
        AutonomyMode::Unknown => v1::AutonomyMode::Unspecified,
        AutonomyMode::Idle => v1::AutonomyMode::Idle,
        AutonomyMode::Manual => v1::AutonomyMode::Manual,
        AutonomyMode::Teleoperated => v1::AutonomyMode::Teleoperated,
        AutonomyMode::Autonomous => v1::AutonomyMode::Autonomous,
    }
}

/// Nanoseconds per mode, indexed by `AutonomyMode as usize`.
pub type ModeNs = [u64; loop_probe::layout::AUTONOMY_MODES];

/// A mode change seen at a poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModeChange {
    /// The last known mode (`Unknown` if none was known yet).
    pub previous: AutonomyMode,
    /// The new mode.
    pub current: AutonomyMode,
}

/// Seconds per mode per model version for one producer epoch, and the current mode.
#[derive(Debug, Clone, Default)]
pub struct AutonomyLedger {
    /// Per-mode totals at the last observation (the probe's cumulative view).
    seen: Option<ModeNs>,
    /// Per-mode time credited to each model version.
    per_model: PerModel<ModeNs, MODELS_PER_EPOCH>,
    /// Last known (not unknown) mode, across epochs.
    last_known: Option<AutonomyMode>,
    /// Mode at the last observation.
    mode: Option<AutonomyMode>,
    /// Start time for series created in this epoch.
    series_start_unix_ns: i64,
}

impl AutonomyLedger {
    /// Starts a producer epoch. `baseline` is what the header held when the agent first saw it
    /// (time before that is not attributed), or `None` to count from the producer's start.
    pub fn start_epoch(&mut self, baseline: Option<ModeNs>, series_start_unix_ns: i64) {
        self.seen = baseline;
        self.per_model.clear();
        self.mode = None;
        self.series_start_unix_ns = series_start_unix_ns;
    }

    /// The mode at the last observation.
    pub fn mode(&self) -> Option<AutonomyMode> {
        self.mode
    }

    /// The probe's per-mode totals at the last observation (the baseline of the next), for
    /// keeping across an agent restart.
    pub fn seen(&self) -> Option<&ModeNs> {
        self.seen.as_ref()
    }

    /// Puts back a series an earlier run of the agent kept (after [`AutonomyLedger::start_epoch`]
    /// with the totals it had seen).
    pub fn restore_series(
        &mut self,
        model: &ModelVersion,
        start_time_unix_ns: i64,
        ns: &ModeNs,
        now_ns: u64,
    ) {
        let (i, _) = self
            .per_model
            .select(model, start_time_unix_ns, now_ns, || *ns);
        if let Some(e) = self.per_model.get_mut(i) {
            e.value = *ns;
        }
    }

    /// Credits the time since the last observation to `model`, evaluating the probe's totals at
    /// `at_ns` (CLOCK_MONOTONIC), and returns a mode change if there was one. `now_ns` orders
    /// per-model entries for eviction. Totals that went backwards (a producer bug) are taken as
    /// the new baseline and credited nothing; the caller reports that as an anomaly.
    pub fn observe(
        &mut self,
        state: &AutonomyState,
        at_ns: u64,
        model: &ModelVersion,
        now_ns: u64,
    ) -> (Option<ModeChange>, bool) {
        let mut totals: ModeNs = [0; loop_probe::layout::AUTONOMY_MODES];
        for m in AutonomyMode::ALL {
            if let Some(t) = totals.get_mut(m as usize) {
                *t = state.total_ns(m, at_ns.max(state.since_ns));
            }
        }
        let prev = self.seen.unwrap_or([0; loop_probe::layout::AUTONOMY_MODES]);
        let went_back = totals.iter().zip(prev.iter()).any(|(t, p)| t < p);
        if !went_back {
            let start = self.series_start_unix_ns;
            let (i, _evicted) = self.per_model.select(model, start, now_ns, || {
                [0; loop_probe::layout::AUTONOMY_MODES]
            });
            if let Some(e) = self.per_model.get_mut(i) {
                for ((acc, t), p) in e.value.iter_mut().zip(totals.iter()).zip(prev.iter()) {
                    *acc = acc.saturating_add(t - p);
                }
            }
        }
        self.seen = Some(totals);
        self.mode = Some(state.mode);
        let mut change = None;
        if state.mode != AutonomyMode::Unknown {
            if self.last_known.is_some_and(|l| l != state.mode) {
                change = Some(ModeChange {
                    previous: self.last_known.unwrap_or(AutonomyMode::Unknown),
                    current: state.mode,
                });
            }
            self.last_known = Some(state.mode);
        }
        (change, went_back)
    }

    /// Series of this epoch: model, start, ns per mode.
    pub fn series(&self) -> impl Iterator<Item = (&ModelVersion, i64, &ModeNs)> {
        self.per_model
            .iter()
            .map(|e| (&e.model, e.start_time_unix_ns, &e.value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::unknown_model;

    fn state(mode: AutonomyMode, since_ns: u64, before: [u64; 5]) -> AutonomyState {
        AutonomyState {
            mode,
            since_ns,
            ns_in_mode: before,
        }
    }

    fn model(v: &str) -> ModelVersion {
        let mut m = unknown_model();
        m.name.push_str("det");
        m.version.push_str(v);
        m
    }

    fn ns(l: &AutonomyLedger, v: &str, mode: AutonomyMode) -> u64 {
        l.series()
            .find(|(m, _, _)| m.version == v)
            .map_or(0, |(_, _, t)| t[mode as usize])
    }

    #[test]
    fn time_between_polls_goes_to_the_model_seen_at_the_poll() {
        let mut l = AutonomyLedger::default();
        l.start_epoch(None, 7);
        let auto = AutonomyMode::Autonomous as usize;
        // Autonomous since 100.
        let s = state(AutonomyMode::Autonomous, 100, [100, 0, 0, 0, 0]);
        assert_eq!(l.observe(&s, 1_100, &model("1"), 1).0, None);
        assert_eq!(ns(&l, "1", AutonomyMode::Autonomous), 1_000);
        assert_eq!(ns(&l, "1", AutonomyMode::Unknown), 100);
        l.observe(&s, 1_600, &model("2"), 2);
        assert_eq!(ns(&l, "2", AutonomyMode::Autonomous), 500);
        // Manual from 2_000: 400 more autonomous, 100 manual, all to model 2.
        let mut before = [100, 0, 0, 0, 0];
        before[auto] = 1_900;
        let s2 = state(AutonomyMode::Manual, 2_000, before);
        let (change, back) = l.observe(&s2, 2_100, &model("2"), 3);
        assert!(!back);
        assert_eq!(
            change,
            Some(ModeChange {
                previous: AutonomyMode::Autonomous,
                current: AutonomyMode::Manual
            })
        );
        assert_eq!(ns(&l, "2", AutonomyMode::Autonomous), 900);
        assert_eq!(ns(&l, "2", AutonomyMode::Manual), 100);
        assert_eq!(ns(&l, "1", AutonomyMode::Autonomous), 1_000);
        assert!(l.series().all(|(_, start, _)| start == 7));
    }

    #[test]
    fn a_baseline_keeps_time_before_the_agent_out_of_the_series() {
        let mut l = AutonomyLedger::default();
        let s = state(AutonomyMode::Idle, 0, [0; 5]);
        let mut base = [0; 5];
        base[AutonomyMode::Idle as usize] = 5_000;
        l.start_epoch(Some(base), 0);
        l.observe(&s, 5_250, &model("1"), 1);
        assert_eq!(ns(&l, "1", AutonomyMode::Idle), 250);
    }

    #[test]
    fn a_restart_through_unknown_is_not_a_mode_change_and_totals_going_back_are_flagged() {
        let mut l = AutonomyLedger::default();
        l.start_epoch(None, 0);
        l.observe(
            &state(AutonomyMode::Autonomous, 0, [0; 5]),
            10,
            &model("1"),
            1,
        );
        l.start_epoch(None, 0);
        let (c, _) = l.observe(&state(AutonomyMode::Unknown, 0, [0; 5]), 5, &model("1"), 2);
        assert_eq!(c, None);
        let (c, _) = l.observe(
            &state(AutonomyMode::Autonomous, 6, [6, 0, 0, 0, 0]),
            9,
            &model("1"),
            3,
        );
        assert_eq!(c, None);
        let (_, back) = l.observe(
            &state(AutonomyMode::Autonomous, 0, [0; 5]),
            1,
            &model("1"),
            4,
        );
        assert!(back);
    }

    #[test]
    fn wire_modes_are_mapped_by_name_not_by_number() {
        assert_eq!(
            wire_mode(AutonomyMode::Autonomous),
            v1::AutonomyMode::Autonomous
        );
        assert_eq!(wire_mode(AutonomyMode::Idle), v1::AutonomyMode::Idle);
        assert_eq!(
            wire_mode(AutonomyMode::Unknown),
            v1::AutonomyMode::Unspecified
        );
    }
}
