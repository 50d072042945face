//! De-duplication state of one stream `(machine, epoch, tier)`: the set of sequence numbers already
//! received, kept as sorted inclusive ranges. Pure: no I/O, no clock; the store persists the encoded
//! form in the same transaction as the samples it admits.
//!
//! Invariants:
//! - Ranges are sorted, disjoint and never adjacent (`[1,3]` and `[4,9]` are merged into `[1,9]`).
//! - A stream holds at most `max_ranges` ranges. An agent sends each tier in sequence order and
//!   re-sends only its last in-flight window after a reconnect, so a gap far below the newest
//!   range is a record lost on the machine (reported by a `QueueLoss` event), not one still coming.
//!   When the bound is hit, the lowest gaps are closed (treated as received) and counted.
//! - Encoding is `[u64 last_seen_ns BE][u32 count BE]` then `count × [u64 first BE][u64 last BE]`;
//!   decoding refuses anything else (a corrupt record is replaced, never trusted).
//!
//! Key layout (see [`stream_key`]): `machine \0 tier epoch_be`, so the epochs of one
//! `(machine, tier)` are one key range and the oldest can be pruned.

/// Received sequence numbers of one stream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeqRanges {
    /// Sorted, disjoint, non-adjacent inclusive ranges.
    ranges: Vec<(u64, u64)>,
}

impl SeqRanges {
    /// No sequence received yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The ranges, sorted.
    pub fn ranges(&self) -> &[(u64, u64)] {
        &self.ranges
    }

    /// Whether `seq` was received.
    pub fn contains(&self, seq: u64) -> bool {
        let index = self.ranges.partition_point(|&(_, last)| last < seq);
        self.ranges
            .get(index)
            .is_some_and(|&(first, _)| first <= seq)
    }

    /// Whether every sequence of `first..=last` was received.
    pub fn contains_all(&self, first: u64, last: u64) -> bool {
        let index = self.ranges.partition_point(|&(_, end)| end < first);
        self.ranges
            .get(index)
            .is_some_and(|&(start, end)| start <= first && last <= end)
    }

    /// Marks `first..=last` received, then closes the lowest gaps while more than `max_ranges`
    /// ranges remain. Returns how many sequence numbers those closed gaps held.
    pub fn insert(&mut self, first: u64, last: u64, max_ranges: usize) -> u64 {
        let (first, last) = if first <= last {
            (first, last)
        } else {
            (last, first)
        };
        // Ranges that overlap or touch [first, last] are merged with it.
        let start = self
            .ranges
            .partition_point(|&(_, end)| end.saturating_add(1) < first);
        let end = self
            .ranges
            .partition_point(|&(begin, _)| begin <= last.saturating_add(1));
        let mut merged = (first, last);
        if start < end {
            merged.0 = merged.0.min(self.ranges[start].0);
            merged.1 = merged.1.max(self.ranges[end - 1].1);
        }
        self.ranges.splice(start..end, std::iter::once(merged));
        let mut closed = 0u64;
        let max_ranges = max_ranges.max(1);
        while self.ranges.len() > max_ranges {
            let (a_first, a_last) = self.ranges[0];
            let (_, b_last) = self.ranges[1];
            let gap_first = a_last + 1;
            let (b_first, _) = self.ranges[1];
            closed = closed.saturating_add(b_first - gap_first);
            self.ranges.splice(0..2, std::iter::once((a_first, b_last)));
        }
        closed
    }

    /// Appends the encoding (with the time the stream was last seen) to `out`.
    pub fn encode(&self, last_seen_ns: i64, out: &mut Vec<u8>) {
        out.extend_from_slice(&last_seen_ns.to_be_bytes());
        let count = u32::try_from(self.ranges.len()).unwrap_or(u32::MAX);
        out.extend_from_slice(&count.to_be_bytes());
        for &(first, last) in self.ranges.iter().take(count as usize) {
            out.extend_from_slice(&first.to_be_bytes());
            out.extend_from_slice(&last.to_be_bytes());
        }
    }

    /// Decodes [`SeqRanges::encode`]'s output; `None` if it is not a valid encoding.
    pub fn decode(bytes: &[u8]) -> Option<(Self, i64)> {
        let last_seen = i64::from_be_bytes(bytes.get(0..8)?.try_into().ok()?);
        let count = u32::from_be_bytes(bytes.get(8..12)?.try_into().ok()?) as usize;
        let body = bytes.get(12..)?;
        if body.len() != count.checked_mul(16)? {
            return None;
        }
        let mut ranges: Vec<(u64, u64)> = Vec::with_capacity(count);
        for chunk in body.chunks_exact(16) {
            let first = u64::from_be_bytes(chunk[0..8].try_into().ok()?);
            let last = u64::from_be_bytes(chunk[8..16].try_into().ok()?);
            if first > last {
                return None;
            }
            if let Some(&(_, previous)) = ranges.last()
                && first <= previous.checked_add(1)?
            {
                return None;
            }
            ranges.push((first, last));
        }
        Some((Self { ranges }, last_seen))
    }
}

/// Store key of a stream: `machine \0 tier epoch_be`.
pub fn stream_key(machine: &str, tier: i32, epoch: u64) -> Vec<u8> {
    let mut key = stream_prefix(machine, tier);
    key.extend_from_slice(&epoch.to_be_bytes());
    key
}

/// Key prefix of all epochs of `(machine, tier)`.
pub fn stream_prefix(machine: &str, tier: i32) -> Vec<u8> {
    let mut key = Vec::with_capacity(machine.len() + 10);
    key.extend_from_slice(machine.as_bytes());
    key.push(0);
    key.push(u8::try_from(tier).unwrap_or(u8::MAX));
    key
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn touching_ranges_merge_into_one() {
        let mut set = SeqRanges::new();
        set.insert(1, 3, 8);
        set.insert(7, 9, 8);
        set.insert(4, 6, 8);
        assert_eq!(set.ranges(), &[(1, 9)]);
        assert!(set.contains_all(2, 8));
        assert!(!set.contains(10));
    }

    #[test]
    fn the_lowest_gaps_close_when_the_bound_is_hit() {
        let mut set = SeqRanges::new();
        set.insert(1, 1, 2);
        set.insert(10, 10, 2);
        let closed = set.insert(20, 20, 2);
        assert_eq!(closed, 8);
        assert_eq!(set.ranges(), &[(1, 10), (20, 20)]);
        assert!(!set.contains(15));
    }

    #[test]
    fn a_corrupt_encoding_is_refused() {
        let mut set = SeqRanges::new();
        set.insert(5, 9, 8);
        set.insert(20, 29, 8);
        let mut bytes = Vec::new();
        set.encode(42, &mut bytes);
        assert_eq!(SeqRanges::decode(&bytes), Some((set, 42)));
        assert_eq!(SeqRanges::decode(&bytes[..bytes.len() - 1]), None);
        // Overlapping ranges are not a valid state.
        let mut overlapping = bytes.clone();
        overlapping[28..36].copy_from_slice(&8u64.to_be_bytes());
        assert_eq!(SeqRanges::decode(&overlapping), None);
    }

    proptest! {
        /// Model: a plain set of every inserted sequence number (bound high enough never to
        /// close a gap).
        #[test]
        fn ranges_agree_with_a_plain_set(inserts in prop::collection::vec((0u64..200, 0u64..8), 1..60)) {
            let mut set = SeqRanges::new();
            let mut model = BTreeSet::new();
            for (first, len) in inserts {
                set.insert(first, first + len, 1000);
                model.extend(first..=first + len);
                let mut bytes = Vec::new();
                set.encode(0, &mut bytes);
                let (decoded, _) = SeqRanges::decode(&bytes).unwrap();
                prop_assert_eq!(&decoded, &set);
            }
            for seq in 0..220 {
                prop_assert_eq!(set.contains(seq), model.contains(&seq), "seq {}", seq);
            }
        }

        /// With a small bound, nothing received is ever forgotten: closing gaps only adds.
        #[test]
        fn a_bounded_set_never_forgets_a_received_sequence(inserts in prop::collection::vec((0u64..500, 0u64..4), 1..80), bound in 2usize..6) {
            let mut set = SeqRanges::new();
            let mut model = BTreeSet::new();
            for (first, len) in inserts {
                set.insert(first, first + len, bound);
                model.extend(first..=first + len);
                prop_assert!(set.ranges().len() <= bound);
            }
            for seq in model {
                prop_assert!(set.contains(seq));
            }
        }
    }
}
