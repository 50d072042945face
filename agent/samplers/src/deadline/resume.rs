//! What the agent keeps of a loop's accounting across its own restarts, so that a restarted agent
//! that finds the same producer epoch continues it: the producer, the header totals the series
//! correspond to, the series themselves (values, start, model), the activations counted
//! provisionally, the autonomy seconds and the ring position already read. Pure: a tracker
//! fills it and takes it back.
//!
//! ```text
//!   agent run 1: poll … report ─ keep(state) ─┐ one queue transaction ┌─ restart: restore(state)
//!                                             └──────── events ───────┘   same producer epoch:
//!   header H₀ ──── series S₀ ──────────── H₁ ─ S₁ ─── (agent down) ───── H₂: S₂ = S₁ + (H₂ − H₁)
//! ```
//!
//! Invariants:
//! - The state is kept after the events that report it, in the same poll, and the agent's queue
//!   writes it in the same transaction as those events: after any crash, what is restored is at
//!   least every value a durable event reported, and the header totals it holds are the ones its
//!   series values were computed from. So a resumed series never reports less than before, and
//!   what the probe counted meanwhile (the agent's downtime included) is credited exactly once.
//! - Encoded as protobuf with a format number; a state that does not decode, holds another
//!   format or names another producer is not resumed (the loop is then counted from first sight,
//!   as by an agent that never saw it).
//! - Refilling a state reuses its strings and lists: keeping it every poll allocates nothing once
//!   it has its shape.

use edgewatch_proto::v1::ModelVersion;
use prost::Message;

use crate::model::{copy_model, unknown_model};

/// Format of [`LoopResume`]; another value is not resumed.
pub const FORMAT: u32 = 1;

/// One loop's accounting as kept between agent runs.
#[derive(Clone, PartialEq, Message)]
pub struct LoopResume {
    /// [`FORMAT`].
    #[prost(uint32, tag = "1")]
    pub format: u32,
    /// The producer epoch the state belongs to (the last one seen, when none is being counted).
    #[prost(fixed64, tag = "2")]
    pub producer_epoch: u64,
    /// The producer's start, CLOCK_MONOTONIC ns (its identity with the epoch).
    #[prost(uint64, tag = "3")]
    pub producer_start_ns: u64,
    /// True while the epoch is being counted; false once it ended (died, restarted, refused).
    #[prost(bool, tag = "4")]
    pub counting: bool,
    /// The header totals the series below correspond to.
    #[prost(message, optional, tag = "5")]
    pub header: Option<HeaderTotals>,
    /// Activations counted in the header's terms (with those counted provisionally).
    #[prost(uint64, tag = "6")]
    pub counted_activations: u64,
    /// Deadline misses counted in the header's terms.
    #[prost(uint64, tag = "7")]
    pub counted_deadline_misses: u64,
    /// Start of series created at the epoch's first poll, wall ns.
    #[prost(int64, tag = "8")]
    pub epoch_start_unix_ns: i64,
    /// Polls of the epoch so far.
    #[prost(uint64, tag = "9")]
    pub polls: u64,
    /// Ring records below this index were read already.
    #[prost(uint64, tag = "10")]
    pub records_read: u64,
    /// Wall time of the epoch's last counter report, ns (its final values are stamped later).
    #[prost(int64, tag = "11")]
    pub last_report_unix_ns: i64,
    /// The series of the epoch.
    #[prost(message, repeated, tag = "12")]
    pub series: Vec<SeriesResume>,
    /// The autonomy totals last seen, per mode (absent before the first observation).
    #[prost(message, optional, tag = "13")]
    pub autonomy_seen: Option<ModeTotals>,
    /// Autonomy seconds per model version.
    #[prost(message, repeated, tag = "14")]
    pub autonomy: Vec<AutonomyResume>,
    /// The last known model, for change reports across the restart.
    #[prost(message, optional, tag = "15")]
    pub last_known_model: Option<ModelVersion>,
}

/// The probe header's cumulative totals at the poll the series were last updated from.
#[derive(Clone, Copy, PartialEq, Message)]
pub struct HeaderTotals {
    #[prost(uint64, tag = "1")]
    pub cycles: u64,
    #[prost(uint64, tag = "2")]
    pub overruns: u64,
    #[prost(uint64, tag = "3")]
    pub skipped: u64,
    #[prost(uint64, tag = "4")]
    pub activations: u64,
    #[prost(uint64, tag = "5")]
    pub deadline_misses: u64,
    #[prost(uint64, tag = "6")]
    pub sum_duration_ns: u64,
    #[prost(uint64, tag = "7")]
    pub max_duration_ns: u64,
    #[prost(uint64, tag = "8")]
    pub fallbacks: u64,
    #[prost(uint64, tag = "9")]
    pub interventions: u64,
    #[prost(uint64, tag = "10")]
    pub safe_stops: u64,
    #[prost(uint64, tag = "11")]
    pub head: u64,
    #[prost(uint64, tag = "12")]
    pub heartbeat_ns: u64,
}

/// One (loop, model version) series.
#[derive(Clone, PartialEq, Message)]
pub struct SeriesResume {
    #[prost(message, optional, tag = "1")]
    pub model: Option<ModelVersion>,
    #[prost(int64, tag = "2")]
    pub start_time_unix_ns: i64,
    #[prost(uint64, tag = "3")]
    pub cycles: u64,
    #[prost(uint64, tag = "4")]
    pub overruns: u64,
    #[prost(uint64, tag = "5")]
    pub skipped: u64,
    #[prost(uint64, tag = "6")]
    pub activations: u64,
    #[prost(uint64, tag = "7")]
    pub deadline_misses: u64,
    #[prost(uint64, tag = "8")]
    pub sum_duration_ns: u64,
    #[prost(uint64, tag = "9")]
    pub max_duration_ns: u64,
    /// Response-time histogram counts (one more than the bounds).
    #[prost(uint64, repeated, tag = "10")]
    pub histogram: Vec<u64>,
    /// Changed since its last report.
    #[prost(bool, tag = "11")]
    pub dirty: bool,
    /// Never reported yet.
    #[prost(bool, tag = "12")]
    pub fresh: bool,
}

/// Nanoseconds per autonomy mode, indexed by the probe's mode number.
#[derive(Clone, PartialEq, Message)]
pub struct ModeTotals {
    #[prost(uint64, repeated, tag = "1")]
    pub ns: Vec<u64>,
}

/// Autonomy seconds of one model version.
#[derive(Clone, PartialEq, Message)]
pub struct AutonomyResume {
    #[prost(message, optional, tag = "1")]
    pub model: Option<ModelVersion>,
    #[prost(int64, tag = "2")]
    pub start_time_unix_ns: i64,
    #[prost(message, optional, tag = "3")]
    pub ns: Option<ModeTotals>,
}

impl LoopResume {
    /// Decodes a kept state; `None` if it does not decode or has another format.
    pub fn decode_kept(bytes: &[u8]) -> Option<LoopResume> {
        LoopResume::decode(bytes)
            .ok()
            .filter(|state| state.format == FORMAT)
    }

    /// Makes `series` hold `n` entries, reusing the ones it has.
    pub(crate) fn series_mut(&mut self, n: usize) -> &mut [SeriesResume] {
        resize_reusing(&mut self.series, n);
        &mut self.series
    }

    /// Makes `autonomy` hold `n` entries, reusing the ones it has.
    pub(crate) fn autonomy_mut(&mut self, n: usize) -> &mut [AutonomyResume] {
        resize_reusing(&mut self.autonomy, n);
        &mut self.autonomy
    }
}

/// Truncates or grows `list` to `n`, keeping the entries (and their buffers) it already has.
fn resize_reusing<T: Default>(list: &mut Vec<T>, n: usize) {
    list.truncate(n);
    while list.len() < n {
        list.push(T::default());
    }
}

/// Copies `src` into the model held in `dst`, reusing its strings.
pub(crate) fn fill_model(dst: &mut Option<ModelVersion>, src: &ModelVersion) {
    copy_model(dst.get_or_insert_with(unknown_model), src);
}

/// Fills `dst` with `src`, reusing its buffer.
pub(crate) fn fill_totals(dst: &mut Option<ModeTotals>, src: &[u64]) {
    let totals = dst.get_or_insert_with(ModeTotals::default);
    totals.ns.clear();
    totals.ns.extend_from_slice(src);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_of_another_format_or_no_state_at_all_is_not_resumed() {
        let state = LoopResume {
            format: FORMAT,
            producer_epoch: 7,
            counting: true,
            ..LoopResume::default()
        };
        let bytes = state.encode_to_vec();
        assert_eq!(LoopResume::decode_kept(&bytes), Some(state.clone()));
        let other = LoopResume {
            format: FORMAT + 1,
            ..state
        };
        assert_eq!(LoopResume::decode_kept(&other.encode_to_vec()), None);
        assert_eq!(LoopResume::decode_kept(b"\xff\xff\xff"), None);
    }

    #[test]
    fn refilling_a_state_reuses_its_entries() {
        let mut state = LoopResume::default();
        state.series_mut(3)[2]
            .histogram
            .extend_from_slice(&[1, 2, 3]);
        let capacity = state.series[2].histogram.capacity();
        state.series_mut(1);
        state.series_mut(3);
        assert_eq!(state.series.len(), 3);
        // The third entry is new (it was dropped), the first was kept.
        assert!(state.series[2].histogram.is_empty());
        state.series_mut(3)[2]
            .histogram
            .extend_from_slice(&[4, 5, 6]);
        assert!(state.series[2].histogram.capacity() >= capacity.min(3));
    }
}
