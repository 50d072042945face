//! Matches rumqttc's packet ids to the publishes they carry, for one connection (sans-IO; owned by
//! the drain's core, which keeps one tracker per connection).
//!
//! rumqttc's `publish()` returns before a packet id exists; the id appears later as an
//! `Outgoing::Publish(pkid)` event, in the order requests were queued, and the broker's PUBACK names
//! only that id. This tracker keeps the three stages a publish goes through:
//!
//! ```text
//! submit(item) ──► submitted (FIFO) ──Outgoing::Publish(pkid)──► written[pkid] ──PubAck(pkid)──► done
//!                          └──Outgoing::AwaitAck(pkid)──► collided ──Outgoing::Publish(pkid)──┘
//! ```
//!
//! Invariants:
//! - An item leaves the tracker only through an acknowledgement of its own packet id, or when the
//!   whole tracker is dropped with its connection (every item then comes back, exactly once, from
//!   [`Tracker::drain`]).
//! - Written items are kept in the order they were written: [`Tracker::oldest_written`] is the
//!   publish the broker reached first among those it has not acknowledged.
//! - A PUBACK for an unknown packet id matches nothing.

use std::collections::VecDeque;

/// Where the items sent but not yet acknowledged are, for one connection.
#[derive(Debug, Clone)]
pub struct Tracker<T> {
    submitted: VecDeque<T>,
    written: Vec<(u16, T)>,
    collided: Option<(u16, T)>,
}

impl<T> Default for Tracker<T> {
    fn default() -> Self {
        Self {
            submitted: VecDeque::new(),
            written: Vec::new(),
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
    /// A packet id was written again before its acknowledgement.
    #[error("packet id {0} was written while still awaiting its acknowledgement")]
    InUse(u16),
}

impl<T> Tracker<T> {
    /// Items submitted, written or waiting behind a packet-id collision.
    pub fn len(&self) -> usize {
        self.submitted.len() + self.written.len() + usize::from(self.collided.is_some())
    }

    /// Nothing is outstanding.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// An item was handed to the client (`try_publish` succeeded).
    pub fn submit(&mut self, item: T) {
        self.submitted.push_back(item);
    }

    /// The client wrote the oldest submitted publish (or the collided one) with packet id `pkid`.
    pub fn on_outgoing_publish(&mut self, pkid: u16) -> Result<(), TrackerError> {
        if self.written.iter().any(|(id, _)| *id == pkid) {
            return Err(TrackerError::InUse(pkid));
        }
        let item = match self.collided.take() {
            Some((collided_pkid, item)) if collided_pkid == pkid => item,
            other => {
                self.collided = other;
                self.submitted
                    .pop_front()
                    .ok_or(TrackerError::NothingSubmitted(pkid))?
            }
        };
        self.written.push((pkid, item));
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
        let index = self.written.iter().position(|(id, _)| *id == pkid)?;
        Some(self.written.remove(index).1)
    }

    /// The written item the broker reached first among those not acknowledged.
    pub fn oldest_written(&self) -> Option<&T> {
        self.written.first().map(|(_, item)| item)
    }

    /// The written items not acknowledged, in the order they were written.
    pub fn written(&self) -> impl Iterator<Item = &T> {
        self.written.iter().map(|(_, item)| item)
    }

    /// Every item, written or not, in the order they were submitted to the client as far as
    /// known (written first, then the collided one, then the rest).
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.written
            .iter()
            .map(|(_, item)| item)
            .chain(self.collided.iter().map(|(_, item)| item))
            .chain(self.submitted.iter())
    }

    /// The connection is gone: every outstanding item, for the caller to put back.
    pub fn drain(&mut self) -> impl Iterator<Item = T> + '_ {
        let collided = self.collided.take().map(|(_, item)| item);
        self.written
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
    fn a_fresh_tracker_after_reconnect_matches_no_stale_puback() {
        let mut old = Tracker::default();
        old.submit("a");
        old.on_outgoing_publish(7).unwrap();
        let mut new = Tracker::default();
        new.submit("a");
        assert_eq!(new.on_puback(7), None, "stale ack deleted a re-sent record");
        new.on_outgoing_publish(8).unwrap();
        assert_eq!(new.on_puback(8), Some("a"));
        assert_eq!(old.on_puback(7), Some("a"));
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
    fn the_oldest_written_item_is_the_first_written_and_not_acknowledged() {
        let mut tracker = Tracker::default();
        for item in ["a", "b", "c"] {
            tracker.submit(item);
        }
        for pkid in [5, 6, 7] {
            tracker.on_outgoing_publish(pkid).unwrap();
        }
        assert_eq!(tracker.oldest_written(), Some(&"a"));
        tracker.on_puback(5);
        assert_eq!(tracker.oldest_written(), Some(&"b"));
        tracker.on_puback(7);
        assert_eq!(tracker.oldest_written(), Some(&"b"));
    }

    #[test]
    fn a_packet_id_with_nothing_submitted_or_still_in_use_is_an_error() {
        let mut tracker: Tracker<u8> = Tracker::default();
        assert_eq!(
            tracker.on_outgoing_publish(3),
            Err(TrackerError::NothingSubmitted(3))
        );
        tracker.submit(1);
        tracker.submit(2);
        tracker.on_outgoing_publish(3).unwrap();
        assert_eq!(tracker.on_outgoing_publish(3), Err(TrackerError::InUse(3)));
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
