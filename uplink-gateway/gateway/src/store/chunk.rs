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
//! Encoding of a chunk (the value of `open_chunks` and `sealed_chunks`), written in format 2;
//! format 1 (stores from before it) is still read, and a chunk of format 1 is written in format 2
//! when a transaction changes it:
//! ```text
//! format 1: [1] then per sample: [ts ms: i64 LE][value: f64 bits, u64 LE]          16 B/sample
//! format 2: [2][n: varint][ts ms: zigzag varint][value: f64 bits, u64 LE]     first sample
//!           then per sample: [Δts − previous Δts: zigzag varint][value XOR previous value]
//!           value: [0] when equal; [0x80][to − from: zigzag varint] when both are whole
//!           numbers and that gives back the exact bits; else the XOR of their bits as
//!           [trailing zero bytes << 4 | length] and the `length` (1..=8) bytes left, LE
//! ```
//! A series sampled at a steady interval costs one byte per timestamp, a counter of whole
//! numbers two to four bytes per value: 4 to 5 bytes per sample instead of 16, and a group
//! rewrites a third or less of the bytes of the chunks it appends to. Arithmetic on timestamps wraps, so every `i64` round-trips.

use super::Upsert;

/// Most samples a stored chunk holds. A group rewrites the chunk it appends to, so a smaller
/// chunk rewrites fewer bytes and a larger one makes fewer B-tree entries.
pub const MAX_SAMPLES: usize = 128;

/// The format byte of chunks from before the compact encoding.
const FORMAT_PLAIN: u8 = 1;
/// Bytes per sample of [`FORMAT_PLAIN`].
const PLAIN_SAMPLE_BYTES: usize = 16;
/// The format byte of the compact encoding, the one written.
const FORMAT_COMPACT: u8 = 2;

/// A stored chunk's bytes are not a chunk (wrong format byte or length, or samples out of order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a sample chunk is not in the chunk format")]
pub struct Malformed;

/// The control byte of a value given as the difference of two whole numbers (see [`whole`]).
const WHOLE_DELTA: u8 = 0x80;

/// `value` as an integer when it is a whole number that an `f64` holds exactly.
fn whole(value: f64) -> Option<i64> {
    const EXACT: f64 = (1u64 << 53) as f64;
    // The conversion saturates and drops a fraction: equal back only for a whole number (no
    // call to `trunc`, which `fract` makes).
    let int = value as i64;
    (int as f64 == value && value.abs() <= EXACT).then_some(int)
}

fn put_varint(mut value: u64, out: &mut Vec<u8>) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn zigzag(value: i64) -> u64 {
    ((value << 1) ^ (value >> 63)) as u64
}

fn unzigzag(value: u64) -> i64 {
    (value >> 1) as i64 ^ -((value & 1) as i64)
}

/// Reads a varint at the front of `bytes`, advancing it.
fn take_varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = bytes.split_first()?;
        *bytes = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

fn take_u64(bytes: &mut &[u8]) -> Option<u64> {
    let (head, rest) = bytes.split_first_chunk::<8>()?;
    *bytes = rest;
    Some(u64::from_le_bytes(*head))
}

/// Where a compact encoding stands after a sample: what the next one is encoded against (its
/// time, the step from the sample before it, its value's bits, and the value as a whole number
/// when it is one).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Cursor {
    ts: i64,
    delta: i64,
    bits: u64,
    whole: Option<i64>,
}

/// The bytes of one sample's encoding, built on the stack and appended at once: at most a
/// 10-byte varint, a control byte and a 10-byte varint.
struct Staged {
    bytes: [u8; 24],
    len: usize,
}

impl Staged {
    fn push(&mut self, byte: u8) {
        self.bytes[self.len] = byte;
        self.len += 1;
    }

    /// Appends the staged bytes to `out`: all of the buffer copied at once (a fixed-size copy,
    /// no call), then cut back to the bytes staged.
    fn append_to(&self, out: &mut Vec<u8>) {
        let end = out.len() + self.len;
        out.extend_from_slice(&self.bytes);
        out.truncate(end);
    }

    fn varint(&mut self, mut value: u64) {
        while value >= 0x80 {
            self.push(value as u8 | 0x80);
            value >>= 7;
        }
        self.push(value as u8);
    }
}

/// Appends the compact encoding of a run's first sample (after its format byte and count).
fn encode_first((ts, value): (i64, f64), out: &mut Vec<u8>) -> Cursor {
    put_varint(zigzag(ts), out);
    out.extend_from_slice(&value.to_bits().to_le_bytes());
    Cursor {
        ts,
        delta: 0,
        bits: value.to_bits(),
        whole: whole(value),
    }
}

/// Appends the compact encoding of the sample after the one `cursor` stands at, and moves it on.
fn encode_next(cursor: &mut Cursor, (next_ts, value): (i64, f64), out: &mut Vec<u8>) {
    let mut staged = Staged {
        bytes: [0; 24],
        len: 0,
    };
    let next_delta = next_ts.wrapping_sub(cursor.ts);
    staged.varint(zigzag(next_delta.wrapping_sub(cursor.delta)));
    let xor = cursor.bits ^ value.to_bits();
    let previous = cursor.whole;
    *cursor = Cursor {
        ts: next_ts,
        delta: next_delta,
        bits: value.to_bits(),
        whole: if xor == 0 { previous } else { whole(value) },
    };
    if xor == 0 {
        staged.push(0);
        staged.append_to(out);
        return;
    }
    // A counter of whole numbers: their difference, when it gives back the exact bits.
    if let (Some(from), Some(to)) = (previous, cursor.whole)
        && (from.wrapping_add(to.wrapping_sub(from)) as f64).to_bits() == cursor.bits
    {
        staged.push(WHOLE_DELTA);
        staged.varint(zigzag(to.wrapping_sub(from)));
        staged.append_to(out);
        return;
    }
    let trailing = xor.trailing_zeros() / 8;
    let length = 8 - xor.leading_zeros() / 8 - trailing;
    staged.push(((trailing << 4) | length) as u8);
    let kept = (xor >> (8 * trailing)).to_le_bytes();
    for &byte in &kept[..length as usize] {
        staged.push(byte);
    }
    staged.append_to(out);
}

/// Appends the encoding of `samples` (in time order) to `out`, in the compact format.
pub fn encode(samples: &[(i64, f64)], out: &mut Vec<u8>) {
    out.reserve(2 + samples.len() * 6);
    out.push(FORMAT_COMPACT);
    put_varint(samples.len() as u64, out);
    let Some((&first, rest)) = samples.split_first() else {
        return;
    };
    let mut cursor = encode_first(first, out);
    for &sample in rest {
        encode_next(&mut cursor, sample, out);
    }
}

/// The encoding of format 1, as stores from before the compact format hold it (for tests).
#[cfg(test)]
pub fn encode_plain(samples: &[(i64, f64)], out: &mut Vec<u8>) {
    out.push(FORMAT_PLAIN);
    for (ts, value) in samples {
        out.extend_from_slice(&ts.to_le_bytes());
        out.extend_from_slice(&value.to_bits().to_le_bytes());
    }
}

/// The samples of an encoded chunk, in time order (the whole encoding checked first).
pub fn decode(bytes: &[u8]) -> Result<Samples<'_>, Malformed> {
    let samples = match bytes.split_first() {
        Some((&FORMAT_PLAIN, rest)) if rest.len() % PLAIN_SAMPLE_BYTES == 0 && !rest.is_empty() => {
            Samples {
                rest,
                left: rest.len() / PLAIN_SAMPLE_BYTES,
                state: State::Plain,
            }
        }
        Some((&FORMAT_COMPACT, mut rest)) => {
            let left = take_varint(&mut rest)
                .and_then(|n| usize::try_from(n).ok())
                .filter(|&n| n > 0)
                .ok_or(Malformed)?;
            Samples {
                rest,
                left,
                state: State::CompactFirst,
            }
        }
        _ => return Err(Malformed),
    };
    // Every sample there, and nothing after the last.
    let mut check = samples.clone();
    for _ in 0..samples.left {
        check.next().ok_or(Malformed)?;
    }
    if !check.rest.is_empty() {
        return Err(Malformed);
    }
    Ok(samples)
}

/// Number of samples of an encoded chunk.
pub fn count(bytes: &[u8]) -> Result<usize, Malformed> {
    Ok(decode(bytes)?.len())
}

/// The samples of an encoded chunk (see [`decode`]).
#[derive(Debug, Clone)]
pub struct Samples<'a> {
    rest: &'a [u8],
    /// Samples not yet read.
    left: usize,
    state: State,
}

/// Where [`Samples`] stands in its encoding.
#[derive(Debug, Clone, Copy)]
enum State {
    /// Format 1.
    Plain,
    /// Format 2, before its first sample.
    CompactFirst,
    /// Format 2 after a sample: its (ts, Δts from the one before, value bits).
    Compact(i64, i64, u64),
}

impl Samples<'_> {
    fn read(&mut self) -> Option<(i64, f64)> {
        let rest = &mut self.rest;
        let (ts, delta, bits) = match self.state {
            State::Plain => {
                let ts = take_u64(rest)? as i64;
                return Some((ts, f64::from_bits(take_u64(rest)?)));
            }
            State::CompactFirst => {
                let ts = unzigzag(take_varint(rest)?);
                (ts, 0, take_u64(rest)?)
            }
            State::Compact(ts, delta, bits) => {
                let delta = delta.wrapping_add(unzigzag(take_varint(rest)?));
                let (&control, tail) = rest.split_first()?;
                *rest = tail;
                let xor = if control == 0 {
                    0
                } else if control == WHOLE_DELTA {
                    let from = f64::from_bits(bits) as i64;
                    let to = from.wrapping_add(unzigzag(take_varint(rest)?));
                    bits ^ (to as f64).to_bits()
                } else {
                    let trailing = usize::from(control >> 4);
                    let length = usize::from(control & 0x0f);
                    if length == 0 || trailing + length > 8 {
                        return None;
                    }
                    let (kept, tail) = rest.split_at_checked(length)?;
                    *rest = tail;
                    let mut word = [0u8; 8];
                    word[..length].copy_from_slice(kept);
                    u64::from_le_bytes(word) << (8 * trailing)
                };
                (ts.wrapping_add(delta), delta, bits ^ xor)
            }
        };
        self.state = State::Compact(ts, delta, bits);
        Some((ts, f64::from_bits(bits)))
    }
}

impl Iterator for Samples<'_> {
    type Item = (i64, f64);

    fn next(&mut self) -> Option<(i64, f64)> {
        if self.left == 0 {
            return None;
        }
        let sample = self.read()?;
        self.left -= 1;
        Some(sample)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for Samples<'_> {}

/// Where the store holds a chunk (see the store's tables): a series' *open* chunk, its last,
/// rewritten as it grows, is kept apart from its *sealed* ones, written once each in the order
/// they were sealed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// The series' entry in `open_chunks`.
    Open,
    /// Entry `n` of `sealed_chunks` (found through `chunk_index`).
    Sealed(u64),
}

/// A chunk loaded (or created) by a write transaction.
#[derive(Debug, Clone, PartialEq)]
pub struct Chunk {
    /// Its identity for the transaction: its key in the store when loaded, the timestamp it was
    /// created for otherwise.
    pub key: i64,
    /// Lowest timestamp it covers: `key`, lower only for the series' first chunk after it took
    /// a sample earlier than every chunk.
    pub low: i64,
    /// Where the store holds it under `key` (to be replaced or removed when written back);
    /// `None` when created in this transaction.
    pub stored: Option<Place>,
    /// Changed in this transaction.
    pub dirty: bool,
    /// Its samples, in time order.
    pub samples: Vec<(i64, f64)>,
    /// The encoding of its first samples, while it only grew at its end (see
    /// [`Chunk::encode_into`]).
    encoded: Encoded,
}

/// The compact encoding of a chunk's first samples, kept while the chunk only grows at its end,
/// so that writing the chunk back encodes only the samples appended since it was last written.
#[derive(Debug, Clone, Default, PartialEq)]
struct Encoded {
    /// The encoding of `samples[..len]` after the format byte and count.
    body: Vec<u8>,
    /// How many samples `body` holds; 0 when there is nothing to build on.
    len: usize,
    /// Where the encoding stands after the last of them.
    cursor: Cursor,
}

impl Encoded {
    fn clear(&mut self) {
        self.body.clear();
        self.len = 0;
    }
}

impl Chunk {
    /// A chunk read from the store under `key`, at `place`.
    pub fn loaded(
        key: i64,
        place: Place,
        bytes: &[u8],
        mut samples: Vec<(i64, f64)>,
    ) -> Result<Self, Malformed> {
        samples.clear();
        samples.extend(decode(bytes)?);
        let ordered = samples.windows(2).all(|w| w[0].0 < w[1].0);
        if !ordered || samples.first().map(|s| s.0) != Some(key) {
            return Err(Malformed);
        }
        Ok(Self {
            key,
            low: key,
            stored: Some(place),
            dirty: false,
            samples,
            encoded: Encoded::default(),
        })
    }

    /// A new chunk for a sample at `ts`.
    pub fn created(ts: i64, samples: Vec<(i64, f64)>) -> Self {
        Self {
            key: ts,
            low: ts,
            stored: None,
            dirty: true,
            samples,
            encoded: Encoded::default(),
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
        if at < self.samples.len() {
            // Not at the end: the encoding kept no longer leads to the samples.
            self.encoded.clear();
            self.samples.insert(at, (ts, value));
        } else {
            self.samples.push((ts, value));
        }
        self.low = self.low.min(ts);
        self.dirty = true;
        Upsert::New
    }

    /// Removes the sample at `ts`, if any.
    pub fn remove(&mut self, ts: i64) {
        if let Ok(at) = self.samples.binary_search_by_key(&ts, |s| s.0) {
            self.samples.remove(at);
            self.encoded.clear();
            self.dirty = true;
        }
    }

    /// Whether a sample at `ts` after every one of this chunk should start a new chunk.
    pub fn full_for_append(&self, ts: i64) -> bool {
        self.samples.len() >= MAX_SAMPLES && self.samples.last().is_some_and(|s| s.0 < ts)
    }

    /// The last of [`Chunk::parts`] as the store holds it once written back at `place`; `None`
    /// when empty.
    pub fn into_stored_last(mut self, place: Place) -> Option<Chunk> {
        let last = self.parts().last()?.len();
        let at = self.samples.len() - last;
        let (samples, encoded) = if at == 0 {
            (self.samples, self.encoded)
        } else {
            (self.samples.split_off(at), Encoded::default())
        };
        let key = samples.first()?.0;
        Some(Self {
            key,
            low: key,
            stored: Some(place),
            dirty: false,
            samples,
            encoded,
        })
    }

    /// Appends the encoding of the whole chunk to `out`, the same bytes as [`encode`] of its
    /// samples: only the samples appended since the last call are encoded, when it only grew at
    /// its end since; the encoding of those before is copied.
    pub fn encode_into(&mut self, out: &mut Vec<u8>) {
        let encoded = &mut self.encoded;
        if encoded.len > self.samples.len() {
            encoded.clear();
        }
        for &sample in &self.samples[encoded.len..] {
            if encoded.len == 0 {
                encoded.cursor = encode_first(sample, &mut encoded.body);
            } else {
                encode_next(&mut encoded.cursor, sample, &mut encoded.body);
            }
            encoded.len += 1;
        }
        out.reserve(11 + encoded.body.len());
        out.push(FORMAT_COMPACT);
        put_varint(self.samples.len() as u64, out);
        out.extend_from_slice(&encoded.body);
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

    fn bits(samples: impl Iterator<Item = (i64, f64)>) -> Vec<(i64, u64)> {
        samples.map(|(t, v)| (t, v.to_bits())).collect()
    }

    #[test]
    fn a_chunk_reads_back_what_was_encoded_in_either_format() {
        let samples = vec![
            (i64::MIN, 1.5),
            (-5, 1.5),
            (0, f64::NAN),
            (7, -0.0),
            (8, 0.0),
            (9, f64::MAX),
            (i64::MAX, f64::INFINITY),
        ];
        let (mut compact, mut plain) = (Vec::new(), Vec::new());
        encode(&samples, &mut compact);
        encode_plain(&samples, &mut plain);
        for bytes in [&compact, &plain] {
            assert_eq!(bits(decode(bytes).unwrap()), bits(samples.iter().copied()));
            assert_eq!(count(bytes), Ok(samples.len()));
        }
    }

    #[test]
    fn steady_counters_take_fewer_bytes_than_plain_samples() {
        // A deadline counter every 20 s (500 more cycles each time) in a third of the bytes,
        // energy in joules with a fraction in two thirds.
        type Value = fn(i64) -> f64;
        let steps: [(Value, f64); 2] = [
            (|i| 250.0 * (2 * i + 1) as f64, 1.0 / 3.0),
            (|i| 0.37 * i as f64, 2.0 / 3.0),
        ];
        for (step, most) in steps {
            let samples: Vec<(i64, f64)> = (0..MAX_SAMPLES as i64)
                .map(|i| (1_700_000_000_000 + i * 20_000, step(i)))
                .collect();
            let (mut compact, mut plain) = (Vec::new(), Vec::new());
            encode(&samples, &mut compact);
            encode_plain(&samples, &mut plain);
            assert_eq!(
                bits(decode(&compact).unwrap()),
                bits(samples.iter().copied())
            );
            assert!(
                compact.len() as f64 <= plain.len() as f64 * most,
                "{} bytes against {}",
                compact.len(),
                plain.len()
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn any_samples_in_time_order_round_trip(
            mut samples in proptest::collection::vec((proptest::num::i64::ANY, proptest::num::u64::ANY), 1..200)
        ) {
            samples.sort_by_key(|s| s.0);
            samples.dedup_by_key(|s| s.0);
            let samples: Vec<(i64, f64)> =
                samples.into_iter().map(|(t, v)| (t, f64::from_bits(v))).collect();
            let mut bytes = Vec::new();
            encode(&samples, &mut bytes);
            proptest::prop_assert_eq!(bits(decode(&bytes).unwrap()), bits(samples.iter().copied()));
            for cut in 0..bytes.len() {
                proptest::prop_assert!(decode(&bytes[..cut]).is_err(), "cut at {}", cut);
            }
        }
    }

    #[test]
    fn bytes_of_another_format_or_length_or_order_are_malformed() {
        for encode in [encode, encode_plain] {
            let mut bytes = Vec::new();
            encode(&[(1, 1.0), (2, 2.0)], &mut bytes);
            assert_eq!(decode(&bytes[..bytes.len() - 1]).err(), Some(Malformed));
            assert_eq!(decode(&bytes[..1]).err(), Some(Malformed), "no samples");
            let mut longer = bytes.clone();
            longer.push(0);
            assert_eq!(decode(&longer).err(), Some(Malformed), "a byte after");
            let mut other = bytes.clone();
            other[0] = 3;
            assert_eq!(decode(&other).err(), Some(Malformed));
            assert_eq!(
                Chunk::loaded(2, Place::Open, &bytes, Vec::new()).err(),
                Some(Malformed),
                "key"
            );
            let mut backwards = Vec::new();
            encode(&[(2, 1.0), (1, 2.0)], &mut backwards);
            assert_eq!(
                Chunk::loaded(2, Place::Open, &backwards, Vec::new()).err(),
                Some(Malformed)
            );
        }
        let mut empty = Vec::new();
        encode(&[], &mut empty);
        assert_eq!(decode(&empty).err(), Some(Malformed), "no samples");
    }

    proptest::proptest! {
        #[test]
        fn a_chunk_encoded_as_it_grows_is_encoded_as_its_samples_are(
            ops in proptest::collection::vec((0u8..4, 0i64..200, 0u64..4), 1..120)
        ) {
            // Appends mostly, some samples before the end and removals, the chunk written back
            // (encoded) between them: each time the bytes of its samples encoded at once.
            let mut chunk = Chunk::created(100, Vec::new());
            let mut end = 100;
            for (op, ts, value) in ops {
                let value = [0.0, 1.5, 250.0 * ts as f64, f64::NAN][value as usize];
                match op {
                    0 | 1 => {
                        end += 1 + ts % 3;
                        chunk.put(end, value);
                    }
                    2 => {
                        chunk.put(ts, value);
                    }
                    _ => chunk.remove(ts),
                }
                let (mut cached, mut whole) = (Vec::new(), Vec::new());
                chunk.encode_into(&mut cached);
                encode(&chunk.samples, &mut whole);
                proptest::prop_assert_eq!(cached, whole);
            }
        }
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
