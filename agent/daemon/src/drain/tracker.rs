//! Matches rumqttc's packet ids to the records they carry (sans-IO).
//!
//! rumqttc's `publish()` returns before a packet id exists; the id appears later as an
//! `Outgoing::Publish(pkid)` event, in the order requests were queued, and the broker's PUBACK names
//! only that id. This tracker keeps the three stages a publish goes through:
//!
//! ```text
//! submit(item) ──► submitted (FIFO) ──Outgoing::Publish(pkid)──► inflight[pkid] ──PubAck(pkid)──► done
//!                          └──Outgoing::AwaitAck(pkid)──► collided ──Outgoing::Publish(pkid)──┘
//! ```
//!
//! Invariants:
//! - An item leaves the tracker only through an acknowledgement of its own packet id, or through
//!   [`Tracker::drain`] when the connection is lost (then every item comes back, exactly once).
//! - A PUBACK for an unknown packet id (a stale acknowledgement from a dead connection that rumqttc
//!   replays after the next CONNACK) matches nothing.

use std::collections::VecDeque;

/// Where the items sent but not yet acknowledged are.
#[derive(Debug)]
pub struct Tracker<T> {
    submitted: VecDeque<T>,
    inflight: Vec<(u16, T)>,
    collided: Option<(u16, T)>,
}

impl<T> Default for Tracker<T> {
    fn default() -> Self {
        Self {
            submitted: VecDeque::new(),
            inflight: Vec::new(),
            collided: None,
        }
    }
}

/// Something the tracker could not match; only a broken client would cause it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TrackerError {
    /// A packet id appeared with nothing submitted to carry it.
    #[error("packet id {0} was assigned with no publish waiting for one")]
    NothingSubmitted(u16),
}

impl<T> Tracker<T> {
    /// Items submitted, in flight or waiting behind a packet-id collision.
    pub fn len(&self) -> usize {
        self.submitted.len() + self.inflight.len() + usize::from(self.collided.is_some())
    }

    /// Nothing is outstanding.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// An item was handed to the client (`try_publish` succeeded).
    pub fn submit(&mut self, item: T) {
        self.submitted.push_back(item);
    }

    /// The client wrote the oldest submitted publish with packet id `pkid`.
    pub fn on_outgoing_publish(&mut self, pkid: u16) -> Result<(), TrackerError> {
        let item = match self.collided.take() {
            Some((collided_pkid, item)) if collided_pkid == pkid => item,
            other => {
                self.collided = other;
                self.submitted
                    .pop_front()
                    .ok_or(TrackerError::NothingSubmitted(pkid))?
            }
        };
        self.inflight.push((pkid, item));
        Ok(())
    }

    /// The client holds the oldest submitted publish until `pkid`'s previous use is acknowledged.
    pub fn on_await_ack(&mut self, pkid: u16) -> Result<(), TrackerError> {
        let item = self
            .submitted
            .pop_front()
            .ok_or(TrackerError::NothingSubmitted(pkid))?;
        self.collided = Some((pkid, item));
        Ok(())
    }

    /// The broker acknowledged `pkid`: returns the item it carried, if it is ours.
    pub fn on_puback(&mut self, pkid: u16) -> Option<T> {
        let index = self.inflight.iter().position(|(id, _)| *id == pkid)?;
        Some(self.inflight.swap_remove(index).1)
    }

    /// The connection is gone: keeps the items that were written under a packet id (their PUBACKs
    /// may still be handed out, read before the failure) in a new tracker, and forgets the rest.
    pub fn take_written(&mut self) -> Self {
        let written = Self {
            submitted: VecDeque::new(),
            inflight: std::mem::take(&mut self.inflight),
            collided: None,
        };
        self.collided = None;
        self.submitted.clear();
        written
    }

    /// The connection is gone: every outstanding item, for the caller to put back.
    pub fn drain(&mut self) -> impl Iterator<Item = T> + '_ {
        let collided = self.collided.take().map(|(_, item)| item);
        self.inflight
            .drain(..)
            .map(|(_, item)| item)
            .chain(collided)
            .chain(self.submitted.drain(..))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn an_item_is_returned_only_by_its_own_puback() {
        let mut tracker = Tracker::default();
        tracker.submit("a");
        tracker.submit("b");
        tracker.on_outgoing_publish(1).unwrap();
        tracker.on_outgoing_publish(2).unwrap();
        assert_eq!(tracker.on_puback(2), Some("b"));
        assert_eq!(tracker.on_puback(2), None);
        assert_eq!(tracker.on_puback(1), Some("a"));
        assert!(tracker.is_empty());
    }

    #[test]
    fn a_stale_puback_after_reconnect_matches_nothing() {
        let mut tracker = Tracker::default();
        tracker.submit("a");
        tracker.on_outgoing_publish(7).unwrap();
        assert_eq!(tracker.drain().collect::<Vec<_>>(), vec!["a"]);
        tracker.submit("a");
        assert_eq!(
            tracker.on_puback(7),
            None,
            "stale ack deleted a re-sent record"
        );
        tracker.on_outgoing_publish(8).unwrap();
        assert_eq!(tracker.on_puback(8), Some("a"));
    }

    #[test]
    fn a_collided_publish_goes_out_under_the_awaited_id() {
        let mut tracker = Tracker::default();
        tracker.submit("old");
        tracker.on_outgoing_publish(1).unwrap();
        tracker.submit("new");
        tracker.submit("next");
        tracker.on_await_ack(1).unwrap();
        assert_eq!(tracker.len(), 3);
        assert_eq!(tracker.on_puback(1), Some("old"));
        tracker.on_outgoing_publish(1).unwrap();
        tracker.on_outgoing_publish(2).unwrap();
        assert_eq!(tracker.on_puback(1), Some("new"));
        assert_eq!(tracker.on_puback(2), Some("next"));
    }

    #[test]
    fn written_items_stay_matchable_after_the_connection_is_gone() {
        let mut tracker = Tracker::default();
        tracker.submit("written");
        tracker.submit("queued");
        tracker.on_outgoing_publish(4).unwrap();
        let mut stale = tracker.take_written();
        assert!(tracker.is_empty());
        assert_eq!(stale.on_puback(4), Some("written"));
        assert!(stale.is_empty());
    }

    #[test]
    fn a_packet_id_with_nothing_submitted_is_an_error() {
        let mut tracker: Tracker<u8> = Tracker::default();
        assert_eq!(
            tracker.on_outgoing_publish(3),
            Err(TrackerError::NothingSubmitted(3))
        );
    }

    #[derive(Debug, Clone)]
    enum Step {
        Submit,
        Write,
        Ack(u8),
        Drop,
    }

    proptest! {
        /// Whatever happens, every submitted item comes back exactly once: acknowledged or drained.
        #[test]
        fn every_item_comes_back_exactly_once(steps in proptest::collection::vec(
            prop_oneof![
                3 => Just(Step::Submit),
                3 => Just(Step::Write),
                3 => (0u8..8).prop_map(Step::Ack),
                1 => Just(Step::Drop),
            ],
            0..200,
        )) {
            let mut tracker = Tracker::default();
            let mut next_item = 0u32;
            let mut written: Vec<u16> = Vec::new();
            let mut returned = Vec::new();
            for step in steps {
                match step {
                    Step::Submit => { tracker.submit(next_item); next_item += 1; }
                    Step::Write => {
                        // rumqttc reuses a packet id only after its acknowledgement.
                        let free = (1..=8u16).find(|p| !written.contains(p));
                        if let (false, Some(pkid)) = (tracker.submitted.is_empty(), free) {
                            tracker.on_outgoing_publish(pkid).unwrap();
                            written.push(pkid);
                        }
                    }
                    Step::Ack(pkid) => {
                        let pkid = u16::from(pkid) + 1;
                        if let Some(item) = tracker.on_puback(pkid) {
                            written.retain(|&p| p != pkid);
                            returned.push(item);
                        }
                    }
                    Step::Drop => { returned.extend(tracker.drain()); written.clear(); }
                }
            }
            returned.extend(tracker.drain());
            returned.sort_unstable();
            prop_assert_eq!(returned, (0..next_item).collect::<Vec<_>>());
        }
    }
}
