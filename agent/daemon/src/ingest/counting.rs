//! How the agent counts the interventions, safe stops and mode changes that processes submit over
//! its local socket (sans-IO). The probe's header counts what a control loop reports; a
//! submission has no such counter, so the agent keeps one: one per submission, in counters of
//! its own (`source` LOCAL), kept in the queue's key-value area with the events.
//!
//! ```text
//! submission ─► accepted id? ── yes ─► the original's reply, nothing queued or counted
//!                   │ no
//!                   ▼
//!   prepare: total = counter + 1, delta = 1, source = LOCAL ─► append ─► commit ─► keep (kv)
//! ```
//!
//! Invariants:
//! - One counter per (kind, model name, model version), the labels of the gateway's series, so
//!   submissions under two models never interleave in one series; a counter never decreases.
//! - A submission is counted once, after its event is in the queue: the agent sets `total` (its
//!   counter including this one), `delta` (1) and `source`, whatever the client sent.
//! - An accepted submission's id is remembered (the last [`MAX_REMEMBERED`]) with the queue
//!   epoch its sequence number belongs to; a submission with an id remembered in the current
//!   epoch is answered as the original was and counted no more.
//! - The counters and ids are staged in the queue's key-value area right after the event's
//!   append: they are durable with it, so after any crash a restarted agent counts on from the
//!   last total a durable event carried.
//! - A mode change counts one transition (`AutonomyModeChange.total`) and no time: seconds per
//!   mode come only from the probe's mode cell, which the producer times itself.

use edgewatch_proto::v1::{EventSource, Tier, event::Kind};
use prost::Message;

/// The key-value entry the counters and remembered ids are kept under.
pub const KEPT_KEY: &str = "ingest/local-counts";
/// Submission ids remembered (the most recent ones).
pub const MAX_REMEMBERED: usize = 256;
/// Counters kept; past this the least recently counted is dropped (its series starts again from
/// one, which the increase rule counts as the reset it is).
pub const MAX_COUNTERS: usize = 64;

/// The counters and the remembered submissions, as kept.
#[derive(Clone, PartialEq, Message)]
pub struct LocalCounts {
    /// Counters, most recently counted last.
    #[prost(message, repeated, tag = "1")]
    pub counters: Vec<Counter>,
    /// Accepted submissions with an id, oldest first.
    #[prost(message, repeated, tag = "2")]
    pub accepted: Vec<Accepted>,
}

/// One counter.
#[derive(Clone, PartialEq, Message)]
pub struct Counter {
    /// `intervention`, `safe_stop` or `mode_change`.
    #[prost(string, tag = "1")]
    pub kind: String,
    /// Model name and version the submissions named (empty: none).
    #[prost(string, tag = "2")]
    pub model: String,
    #[prost(string, tag = "3")]
    pub version: String,
    /// Submissions counted.
    #[prost(uint64, tag = "4")]
    pub total: u64,
}

/// The reply given to a submission with an id.
#[derive(Clone, PartialEq, Message)]
pub struct Accepted {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(int32, tag = "2")]
    pub tier: i32,
    #[prost(uint64, tag = "3")]
    pub seq: u64,
    /// The queue epoch `seq` belongs to.
    #[prost(fixed64, tag = "4")]
    pub epoch: u64,
}

/// What a prepared submission will count, once its event is queued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    kind: &'static str,
    model: String,
    version: String,
    total: u64,
}

impl LocalCounts {
    /// What an earlier run kept; empty when nothing (or nothing readable) was kept.
    pub fn from_kept(kept: Option<&[u8]>) -> LocalCounts {
        kept.and_then(|bytes| LocalCounts::decode(bytes).ok())
            .unwrap_or_default()
    }

    /// The reply given to an accepted submission with this id, if remembered in the queue's
    /// current `epoch` (a replaced queue's numbers mean nothing any more).
    pub fn accepted(&self, id: &str, epoch: u64) -> Option<(Tier, u64)> {
        self.accepted
            .iter()
            .rev()
            .find(|a| a.id == id && a.epoch == epoch)
            .map(|a| (Tier::try_from(a.tier).unwrap_or(Tier::Safety), a.seq))
    }

    /// Fills the counting fields of a counted kind (`total`, `delta`, `source`) and returns what
    /// it counts; `None` (event untouched) for other kinds. Nothing is counted until
    /// [`LocalCounts::commit`].
    pub fn prepare(&self, kind: &mut Kind) -> Option<Prepared> {
        let (name, model) = match kind {
            Kind::Intervention(i) => ("intervention", i.model.as_ref()),
            Kind::SafeStop(s) => ("safe_stop", s.model.as_ref()),
            Kind::AutonomyModeChange(_) => ("mode_change", None),
            _ => return None,
        };
        let (model, version) = model.map_or((String::new(), String::new()), |m| {
            (m.name.clone(), m.version.clone())
        });
        let total = self
            .counters
            .iter()
            .find(|c| c.kind == name && c.model == model && c.version == version)
            .map_or(0, |c| c.total)
            + 1;
        match kind {
            Kind::Intervention(i) => {
                i.total = total;
                i.delta = 1;
                i.source = EventSource::Local as i32;
            }
            Kind::SafeStop(s) => {
                s.total = total;
                s.delta = 1;
                s.source = EventSource::Local as i32;
            }
            Kind::AutonomyModeChange(c) => {
                c.total = total;
                c.source = EventSource::Local as i32;
            }
            _ => {}
        }
        Some(Prepared {
            kind: name,
            model,
            version,
            total,
        })
    }

    /// Counts a prepared submission whose event was queued as `seq` of `tier` in queue `epoch`,
    /// remembering its id if it has one.
    pub fn commit(
        &mut self,
        prepared: Prepared,
        id: Option<&str>,
        (tier, seq, epoch): (Tier, u64, u64),
    ) {
        let position = self.counters.iter().position(|c| {
            c.kind == prepared.kind && c.model == prepared.model && c.version == prepared.version
        });
        let mut counter = match position {
            Some(i) => self.counters.remove(i),
            None => {
                if self.counters.len() >= MAX_COUNTERS {
                    self.counters.remove(0);
                }
                Counter {
                    kind: prepared.kind.to_owned(),
                    model: prepared.model,
                    version: prepared.version,
                    total: 0,
                }
            }
        };
        counter.total = counter.total.max(prepared.total);
        self.counters.push(counter);
        if let Some(id) = id {
            if self.accepted.len() >= MAX_REMEMBERED {
                self.accepted.remove(0);
            }
            self.accepted.push(Accepted {
                id: id.to_owned(),
                tier: tier as i32,
                seq,
                epoch,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgewatch_proto::v1::{AutonomyModeChange, Intervention, ModelVersion, SafeStop};

    fn intervention(version: Option<&str>) -> Kind {
        Kind::Intervention(Intervention {
            total: 99,
            delta: 7,
            model: version.map(|v| ModelVersion {
                name: "det".into(),
                version: v.into(),
                ..ModelVersion::default()
            }),
            ..Intervention::default()
        })
    }

    fn total(kind: &Kind) -> (u64, u64, i32) {
        match kind {
            Kind::Intervention(i) => (i.total, i.delta, i.source),
            Kind::SafeStop(s) => (s.total, s.delta, s.source),
            Kind::AutonomyModeChange(c) => (c.total, 1, c.source),
            _ => (0, 0, 0),
        }
    }

    fn count(
        counts: &mut LocalCounts,
        mut kind: Kind,
        id: Option<&str>,
        seq: u64,
    ) -> (u64, u64, i32) {
        let prepared = counts.prepare(&mut kind).unwrap();
        counts.commit(prepared, id, (Tier::Safety, seq, 5));
        total(&kind)
    }

    #[test]
    fn each_submission_counts_one_under_its_own_model_and_kind() {
        let mut counts = LocalCounts::default();
        let local = EventSource::Local as i32;
        assert_eq!(
            count(&mut counts, intervention(None), None, 1),
            (1, 1, local)
        );
        assert_eq!(
            count(&mut counts, intervention(None), None, 2),
            (2, 1, local)
        );
        assert_eq!(count(&mut counts, intervention(Some("4.2")), None, 3).0, 1);
        assert_eq!(count(&mut counts, intervention(None), None, 4).0, 3);
        let stop = Kind::SafeStop(SafeStop::default());
        assert_eq!(count(&mut counts, stop, None, 5).0, 1);
        let change = Kind::AutonomyModeChange(AutonomyModeChange::default());
        assert_eq!(count(&mut counts, change.clone(), None, 6), (1, 1, local));
        assert_eq!(count(&mut counts, change, None, 7).0, 2);
    }

    #[test]
    fn nothing_counts_until_committed_and_other_kinds_are_left_alone() {
        let mut counts = LocalCounts::default();
        let mut kind = intervention(None);
        // Prepared but not queued (the queue refused it): the next one is the first again.
        counts.prepare(&mut kind).unwrap();
        assert_eq!(count(&mut counts, intervention(None), None, 1).0, 1);
        let mut custom = Kind::Custom(Default::default());
        assert_eq!(counts.prepare(&mut custom), None);
    }

    #[test]
    fn a_remembered_id_gets_the_original_reply_across_a_restart() {
        let mut counts = LocalCounts::default();
        count(&mut counts, intervention(None), Some("op-1"), 41);
        assert_eq!(counts.accepted("op-1", 5), Some((Tier::Safety, 41)));
        assert_eq!(counts.accepted("op-2", 5), None);
        let again = LocalCounts::from_kept(Some(&counts.encode_to_vec()));
        assert_eq!(again, counts);
        assert_eq!(again.accepted("op-1", 5), Some((Tier::Safety, 41)));
        // A queue replaced since (quarantine): its sequence numbers are not the original's.
        assert_eq!(again.accepted("op-1", 6), None);
        assert_eq!(
            LocalCounts::from_kept(Some(b"\xff\xff")),
            LocalCounts::default()
        );
    }

    #[test]
    fn memory_and_counters_are_bounded() {
        let mut counts = LocalCounts::default();
        for i in 0..MAX_REMEMBERED as u64 + 10 {
            count(&mut counts, intervention(None), Some(&format!("id-{i}")), i);
        }
        assert_eq!(counts.accepted.len(), MAX_REMEMBERED);
        assert_eq!(counts.accepted("id-0", 5), None);
        assert!(
            counts
                .accepted(&format!("id-{}", MAX_REMEMBERED + 9), 5)
                .is_some()
        );
        for v in 0..MAX_COUNTERS + 5 {
            count(&mut counts, intervention(Some(&v.to_string())), None, 0);
        }
        assert_eq!(counts.counters.len(), MAX_COUNTERS);
    }
}
