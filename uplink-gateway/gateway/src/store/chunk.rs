//! Sample chunks: the samples of one series kept in runs of up to [`MAX_SAMPLES`], one store
//! value per run, so that a group of messages rewrites one value per series it touches instead of
//! inserting one B-tree entry per sample. Pure: encoding, and the edits a write transaction makes
//! to the chunks it loaded; the store looks the chunks up and writes them back.
//!
//! Invariants (of the chunks stored for one series):
//! - Each chunk is keyed by the timestamp of its first sample and holds at least one sample, in
//!   strictly increasing time order.
//! - Chunks do not overlap: every sample of a chunk lies before the key of the next chunk. So a
//!   timestamp is *covered* by the chunk with the greatest key at or before it, and a (series,
//!   timestamp) is stored at most once.
//!
//! Within a write transaction a loaded or new chunk keeps the key it was found (or created) with,
//! its *identity*, so that lookups compare identities only; the one exception is the series'
//! first chunk, whose `low` bound may move down to take a sample earlier than every chunk. When
//! the transaction commits each changed chunk is written back under the timestamp of its first
//! sample (removed when emptied), split in even parts when it grew beyond [`MAX_SAMPLES`].
//!
//! Encoding of a chunk (the value of `sample_chunks`):
//! ```text
//! [format: u8 = 1] then per sample, in time order: [ts ms: i64 LE][value: f64 bits, u64 LE]
//! ```

use super::Upsert;

/// Most samples a stored chunk holds: 2 KiB of samples, half a redb page. A group rewrites the
/// chunk it appends to, so a smaller chunk rewrites fewer bytes and a larger one makes fewer
/// B-tree entries.
pub const MAX_SAMPLES: usize = 128;

/// The format byte of the encoding above.
const FORMAT: u8 = 1;
/// Bytes per encoded sample.
const SAMPLE_BYTES: usize = 16;

/// A stored chunk's bytes are not a chunk (wrong format byte or length, or samples out of order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a sample chunk is not in the chunk format")]
pub struct Malformed;

/// Appends the encoding of `samples` (in time order) to `out`.
pub fn encode(samples: &[(i64, f64)], out: &mut Vec<u8>) {
    out.reserve(1 + samples.len() * SAMPLE_BYTES);
    out.push(FORMAT);
    for (ts, value) in samples {
        out.extend_from_slice(&ts.to_le_bytes());
        out.extend_from_slice(&value.to_bits().to_le_bytes());
    }
}

/// The samples of an encoded chunk, in time order.
pub fn decode(bytes: &[u8]) -> Result<Samples<'_>, Malformed> {
    match bytes.split_first() {
        Some((&FORMAT, rest)) if rest.len() % SAMPLE_BYTES == 0 && !rest.is_empty() => {
            Ok(Samples { rest })
        }
        _ => Err(Malformed),
    }
}

/// Number of samples of an encoded chunk.
pub fn count(bytes: &[u8]) -> Result<usize, Malformed> {
    Ok(decode(bytes)?.len())
}

/// The samples of an encoded chunk (see [`decode`]).
#[derive(Debug, Clone)]
pub struct Samples<'a> {
    rest: &'a [u8],
}

fn sample_at(bytes: &[u8]) -> (i64, f64) {
    let mut ts = [0u8; 8];
    let mut value = [0u8; 8];
    ts.copy_from_slice(&bytes[..8]);
    value.copy_from_slice(&bytes[8..SAMPLE_BYTES]);
    (
        i64::from_le_bytes(ts),
        f64::from_bits(u64::from_le_bytes(value)),
    )
}

impl Iterator for Samples<'_> {
    type Item = (i64, f64);

    fn next(&mut self) -> Option<(i64, f64)> {
        let (first, rest) = self.rest.split_at_checked(SAMPLE_BYTES)?;
        self.rest = rest;
        Some(sample_at(first))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.rest.len() / SAMPLE_BYTES;
        (n, Some(n))
    }
}

impl DoubleEndedIterator for Samples<'_> {
    fn next_back(&mut self) -> Option<(i64, f64)> {
        let at = self.rest.len().checked_sub(SAMPLE_BYTES)?;
        let (rest, last) = self.rest.split_at(at);
        self.rest = rest;
        Some(sample_at(last))
    }
}

impl ExactSizeIterator for Samples<'_> {}

/// A chunk loaded (or created) by a write transaction.
#[derive(Debug, Clone, PartialEq)]
pub struct Chunk {
    /// Its identity for the transaction: its key in the store when loaded, the timestamp it was
    /// created for otherwise.
    pub key: i64,
    /// Lowest timestamp it covers: `key`, lower only for the series' first chunk after it took
    /// a sample earlier than every chunk.
    pub low: i64,
    /// Whether the store holds it under `key` (to be replaced or removed when written back).
    pub stored: bool,
    /// Changed in this transaction.
    pub dirty: bool,
    /// Its samples, in time order.
    pub samples: Vec<(i64, f64)>,
}

impl Chunk {
    /// A chunk read from the store under `key`.
    pub fn loaded(key: i64, bytes: &[u8], mut samples: Vec<(i64, f64)>) -> Result<Self, Malformed> {
        samples.clear();
        samples.extend(decode(bytes)?);
        let ordered = samples.windows(2).all(|w| w[0].0 < w[1].0);
        if !ordered || samples.first().map(|s| s.0) != Some(key) {
            return Err(Malformed);
        }
        Ok(Self {
            key,
            low: key,
            stored: true,
            dirty: false,
            samples,
        })
    }

    /// A new chunk for a sample at `ts`.
    pub fn created(ts: i64, samples: Vec<(i64, f64)>) -> Self {
        Self {
            key: ts,
            low: ts,
            stored: false,
            dirty: true,
            samples,
        }
    }

    /// The value at `ts`.
    pub fn get(&self, ts: i64) -> Option<f64> {
        self.samples
            .binary_search_by_key(&ts, |s| s.0)
            .ok()
            .map(|at| self.samples[at].1)
    }

    /// Stores `value` at `ts` unless the chunk holds a sample there: [`Upsert::New`], or
    /// [`Upsert::Identical`] (a no-op), or [`Upsert::Conflict`] (the stored value is kept).
    pub fn put(&mut self, ts: i64, value: f64) -> Upsert {
        // Appending is the common case: no search.
        let at = match self.samples.last() {
            Some(&(last, _)) if last < ts => self.samples.len(),
            None => 0,
            _ => match self.samples.binary_search_by_key(&ts, |s| s.0) {
                Ok(at) => {
                    let stored = self.samples[at].1;
                    return if stored == value || (stored.is_nan() && value.is_nan()) {
                        Upsert::Identical
                    } else {
                        Upsert::Conflict
                    };
                }
                Err(at) => at,
            },
        };
        self.samples.insert(at, (ts, value));
        self.low = self.low.min(ts);
        self.dirty = true;
        Upsert::New
    }

    /// Removes the sample at `ts`, if any.
    pub fn remove(&mut self, ts: i64) {
        if let Ok(at) = self.samples.binary_search_by_key(&ts, |s| s.0) {
            self.samples.remove(at);
            self.dirty = true;
        }
    }

    /// Whether a sample at `ts` after every one of this chunk should start a new chunk.
    pub fn full_for_append(&self, ts: i64) -> bool {
        self.samples.len() >= MAX_SAMPLES && self.samples.last().is_some_and(|s| s.0 < ts)
    }

    /// The last of [`Chunk::parts`] as the store holds it once written back; `None` when empty.
    pub fn into_stored_last(mut self) -> Option<Chunk> {
        let last = self.parts().last()?.len();
        let at = self.samples.len() - last;
        let samples = if at == 0 {
            self.samples
        } else {
            self.samples.split_off(at)
        };
        let key = samples.first()?.0;
        Some(Self {
            key,
            low: key,
            stored: true,
            dirty: false,
            samples,
        })
    }

    /// The runs to store for this chunk: even parts of at most [`MAX_SAMPLES`] (none when it is
    /// empty). Each is stored under its first sample's timestamp.
    pub fn parts(&self) -> impl Iterator<Item = &[(i64, f64)]> {
        let n = self.samples.len();
        let parts = n.div_ceil(MAX_SAMPLES);
        let size = if parts == 0 { 1 } else { n.div_ceil(parts) };
        self.samples.chunks(size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_reads_back_what_was_encoded_in_both_directions() {
        let samples = vec![
            (-5, 1.5),
            (0, f64::NAN),
            (7, -0.0),
            (i64::MAX, f64::INFINITY),
        ];
        let mut bytes = Vec::new();
        encode(&samples, &mut bytes);
        let forward: Vec<_> = decode(&bytes)
            .unwrap()
            .map(|(t, v)| (t, v.to_bits()))
            .collect();
        let expected: Vec<_> = samples.iter().map(|&(t, v)| (t, v.to_bits())).collect();
        assert_eq!(forward, expected);
        let last = decode(&bytes).unwrap().next_back().unwrap();
        assert_eq!(
            (last.0, last.1.to_bits()),
            (i64::MAX, f64::INFINITY.to_bits())
        );
        assert_eq!(count(&bytes), Ok(4));
    }

    #[test]
    fn bytes_of_another_format_or_length_or_order_are_malformed() {
        let mut bytes = Vec::new();
        encode(&[(1, 1.0), (2, 2.0)], &mut bytes);
        assert_eq!(decode(&bytes[..bytes.len() - 1]).err(), Some(Malformed));
        assert_eq!(decode(&bytes[..1]).err(), Some(Malformed), "no samples");
        let mut other = bytes.clone();
        other[0] = 2;
        assert_eq!(decode(&other).err(), Some(Malformed));
        assert_eq!(
            Chunk::loaded(2, &bytes, Vec::new()).err(),
            Some(Malformed),
            "key"
        );
        let mut backwards = Vec::new();
        encode(&[(2, 1.0), (1, 2.0)], &mut backwards);
        assert_eq!(
            Chunk::loaded(2, &backwards, Vec::new()).err(),
            Some(Malformed)
        );
    }

    #[test]
    fn a_put_is_new_or_identical_or_a_refused_conflict() {
        let mut chunk = Chunk::created(10, Vec::new());
        assert_eq!(chunk.put(10, 1.0), Upsert::New);
        assert_eq!(chunk.put(12, f64::NAN), Upsert::New);
        assert_eq!(chunk.put(11, 3.0), Upsert::New);
        assert_eq!(chunk.put(10, 1.0), Upsert::Identical);
        assert_eq!(chunk.put(12, f64::NAN), Upsert::Identical);
        assert_eq!(chunk.put(10, 2.0), Upsert::Conflict);
        assert_eq!(chunk.get(10), Some(1.0));
        assert_eq!(chunk.put(5, 0.5), Upsert::New);
        assert_eq!((chunk.key, chunk.low), (10, 5));
        let times: Vec<i64> = chunk.samples.iter().map(|s| s.0).collect();
        assert_eq!(times, vec![5, 10, 11, 12]);
    }

    #[test]
    fn an_oversized_chunk_is_stored_in_even_parts() {
        let mut chunk = Chunk::created(0, Vec::new());
        for ts in 0..(MAX_SAMPLES as i64 * 2 + 1) {
            chunk.put(ts, 0.0);
        }
        let sizes: Vec<usize> = chunk.parts().map(<[_]>::len).collect();
        assert_eq!(sizes.iter().sum::<usize>(), MAX_SAMPLES * 2 + 1);
        assert!(
            sizes
                .iter()
                .all(|&n| (MAX_SAMPLES * 2 / 3..=MAX_SAMPLES).contains(&n))
        );
        chunk.samples.clear();
        assert_eq!(chunk.parts().count(), 0);
    }
}
