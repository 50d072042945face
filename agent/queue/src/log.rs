//! The queue's segmented log: per-tier segment files of framed records appended in sequence
//! order, and a small state file written in two alternating slots. It offers what the storage
//! boundary (`store`) needs: ordered records per tier, a state record, a key-value area and one
//! atomic durable write per flush.
//!
//! Design constraints (invariants):
//! - Records of a tier are appended in increasing sequence order; a record's position is found by
//!   scanning frames from a remembered position (the head of the tier, or where the last read
//!   stopped): no per-record index is kept in memory.
//! - A commit writes the frames of every touched tier and `fdatasync`s them, then, only if it
//!   changed something the frames do not carry (removals, the key-value area, losses, the epoch,
//!   a sequence number consumed without a frame), writes the other state slot and `fdatasync`s
//!   it. Frames carry the generation of the state they need: recovery drops frames whose state
//!   never became durable, so a commit is all or nothing, across tiers, through a crash.
//! - A failed commit truncates what it appended and changes nothing in memory.
//! - A segment's size is that of its valid frames: its blocks allocated ahead (up to the
//!   segment's end, `fallocate` keeping the size, so that an append's `fdatasync` allocates no
//!   blocks) are past it, and a failed commit gives back every tier's.
//! - A segment is unlinked only after a durable state has removed every record in it; a tier's
//!   last segment, drained, is kept for the next appends while it is under `KEEP_DRAINED_BYTES`.
//! - Recovery reads the newest valid state slot, scans every frame (checking each record's
//!   CRC32C), truncates a torn or uncommitted tail and reports records that fail their checks.
//!
//! ```text
//! <dir>/state.0, <dir>/state.1    slot = len:u32 LE | crc32c(payload):u32 LE | payload
//!   payload = magic:u64 | generation:u64 | epoch:u64
//!             | per tier: next_seq:u64 | removed_below:u64 | records:u64 | last_seq:u64
//!                         | holes:u32 | (first:u64 | last:u64) × holes
//!             | losses: 3 × LOSS_CAUSES × u64
//!             | kv entries:u32 | (key_len:u32 | key | value_len:u32 | value) × entries
//!   (all little-endian; the slot with the higher generation and a valid checksum wins)
//! <dir>/<tier>.<first seq, 20 digits>.seg
//!   frame = len:u32 LE | generation:u32 LE | value (len bytes, see `record`)
//!   the record's sequence number is the `seq` field leading its event
//! ```
//!
//! A record is removed when its sequence number is below the tier's `removed_below` or inside one
//! of its holes (out-of-order removals: acknowledgements, dead letters, corrupt records).

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use edgewatch_proto::tier::{NAMES, PerTier};

use crate::record;

// The vocabulary of the storage boundary (`store` re-exports it): what a store remembers, what
// opening it found, what a removal took, and how an operation failed.

/// Loss causes are `LossCause` values `0..LOSS_CAUSES`.
pub const LOSS_CAUSES: usize = 8;

/// Running loss totals, indexed `[tier][cause]`.
pub type LossTotals = [[u64; LOSS_CAUSES]; 3];

/// What the store remembers besides the records themselves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Persisted {
    /// Random id of this store, fixed at creation.
    pub epoch: u64,
    /// Next sequence number per tier (sequence numbers start at 1).
    pub next_seq: PerTier<u64>,
    /// Records stored per tier.
    pub records: PerTier<u64>,
    /// Bytes stored per tier (key + value).
    pub bytes: PerTier<u64>,
    /// Loss totals since the store was created.
    pub losses: LossTotals,
}

impl Persisted {
    /// Takes one record of `bytes` off tier `ix`'s counts (saturating: counts repaired at open
    /// never make a deletion fail).
    pub fn forget(&mut self, ix: usize, bytes: u64) {
        let stored = self.bytes.at_mut(ix);
        *stored = stored.saturating_sub(bytes);
        let records = self.records.at_mut(ix);
        *records = records.saturating_sub(1);
    }

    /// Takes `records` records of `bytes` in all off tier `ix`'s counts (saturating, as
    /// [`Persisted::forget`]).
    pub fn forget_many(&mut self, ix: usize, records: u64, bytes: u64) {
        let stored = self.bytes.at_mut(ix);
        *stored = stored.saturating_sub(bytes);
        let count = self.records.at_mut(ix);
        *count = count.saturating_sub(records);
    }

    /// The state of a store just created.
    pub fn fresh(epoch: u64) -> Self {
        Self {
            epoch,
            next_seq: PerTier::all(1),
            records: PerTier::default(),
            bytes: PerTier::default(),
            losses: [[0; LOSS_CAUSES]; 3],
        }
    }
}

/// A store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The file is not a readable store of this format (bad header, failed page checksum,
    /// missing or inconsistent state).
    #[error("store is corrupt: {0}")]
    Corrupt(String),
    /// The file system has no space left.
    #[error("disk is full")]
    DiskFull,
    /// Another process has the store open.
    #[error("store is open in another process")]
    Locked,
    /// Reading or writing the file failed otherwise.
    #[error("store I/O failed: {0}")]
    Io(String),
}

/// A store's state as loaded and verified.
#[derive(Clone, Debug)]
pub struct Loaded {
    /// The state, with record and byte counts as found.
    pub state: Persisted,
    /// Records present but failing their checks: `(tier, seq)`.
    pub corrupt: Vec<(usize, u64)>,
    /// Records the state counted that the log no longer holds.
    pub unaccounted: PerTier<u64>,
    /// Sequence number and append time of the oldest intact record per tier.
    pub oldest: PerTier<Option<(u64, u64)>>,
    /// The key-value area, in key order.
    pub kv: Vec<(String, Vec<u8>)>,
}

/// A record removed from a tier: its key and stored bytes (key + value).
#[derive(Clone, Copy, Debug)]
pub struct Removed {
    pub seq: u64,
    pub bytes: u64,
}

impl Loaded {
    /// A just-created store: nothing to verify.
    pub fn fresh(state: Persisted) -> Self {
        Self {
            state,
            corrupt: Vec::new(),
            unaccounted: PerTier::default(),
            oldest: PerTier::default(),
            kv: Vec::new(),
        }
    }
}

/// A segment takes no more appends once it holds this many bytes.
pub const SEGMENT_BYTES: u64 = 16 * 1024 * 1024;
/// A tier's last segment is kept when every record in it is removed, as long as it is smaller
/// than this: the next appends go into it instead of a file created, synced into the directory
/// and unlinked again for each event of a quiet tier. A larger drained segment is unlinked, so a
/// drained log holds at most this much per tier.
const KEEP_DRAINED_BYTES: u64 = 1024 * 1024;

/// Allocates `file`'s blocks from `reserved` to the end of the segment (`SEGMENT_BYTES`, or
/// `end` past it), keeping the file's size, when the frames up to `end` would pass `reserved`:
/// an append's `fdatasync` then fills blocks that exist instead of allocating them. Returns the
/// new end of the reservation. A refusal is not an error: the appends then allocate their blocks
/// as they write, as without a reservation, and the segment asks no more (the end of the segment
/// is returned). On a refusal what a partial allocation took beyond the frames (`len`) is
/// released at once, so that a nearly full disk is not taken by one tier's reservation; a file
/// system without `fallocate` clears `supported`.
fn reserve_ahead(file: &File, len: u64, reserved: u64, end: u64, supported: &mut bool) -> u64 {
    if end <= reserved || !*supported {
        return reserved;
    }
    let target = SEGMENT_BYTES.max(end);
    let (Ok(offset), Ok(count)) = (
        libc::off_t::try_from(reserved),
        libc::off_t::try_from(target - reserved),
    ) else {
        return reserved;
    };
    // SAFETY: `fallocate` reads only its integer arguments; the descriptor is open for writing
    // for as long as `file` is borrowed.
    let result =
        unsafe { libc::fallocate(file.as_raw_fd(), libc::FALLOC_FL_KEEP_SIZE, offset, count) };
    if result == 0 {
        return target;
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::EOPNOTSUPP | libc::ENOSYS) => *supported = false,
        // Truncating to the size the file has frees the blocks beyond it, and only those.
        _ => {
            let _ = file.set_len(len);
        }
    }
    target
}

/// Whether the file system holding `dir` keeps its files in memory (tmpfs, ramfs), where blocks
/// allocated ahead would be memory taken, not journal work saved.
fn in_memory(dir: &File) -> bool {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    // SAFETY: `fstatfs` writes only into the zeroed struct we own.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above; the descriptor is open for as long as `dir` is borrowed.
    if unsafe { libc::fstatfs(dir.as_raw_fd(), &mut stat) } != 0 {
        return false;
    }
    #[allow(clippy::unnecessary_cast)] // `f_type`'s integer type differs between targets.
    let kind = stat.f_type as i64;
    kind == TMPFS_MAGIC || kind == RAMFS_MAGIC
}

/// Bytes of a frame before its value.
pub const FRAME_HEADER: usize = 8;
/// Room kept beyond a buffer's frames: a record's header is copied at its longest (32 bytes,
/// frame header included) before being cut to its length.
const HEAD_SLACK: usize = 32;
/// Largest value a frame may carry (a longer length is garbage, not a record).
const MAX_VALUE: usize = 4 * 1024 * 1024;
/// Bytes read from a segment at once while scanning.
const READ_CHUNK: usize = 256 * 1024;
const STATE_FILES: [&str; 2] = ["state.0", "state.1"];
const MAGIC: u64 = u64::from_le_bytes(*b"EWQLOG01");

/// Records of one tier waiting for a commit, already in frame form (`len | generation | value`,
/// the generation filled in by the commit): the caller encodes each record here once, and the
/// commit writes these bytes as they are, with no copy in between.
///
/// Invariants:
/// - Frames follow each other without gaps, in increasing sequence order; each value's leading
///   `seq` is the sequence number it was pushed under.
/// - `records` and `value_bytes` count exactly the frames held.
#[derive(Debug, Default)]
pub struct Frames {
    bytes: Vec<u8>,
    first_seq: u64,
    last_seq: u64,
    records: u64,
    /// Bytes of the values, without their frame headers.
    value_bytes: u64,
    /// Longest value held (a value longer than a frame may carry is refused at the commit).
    max_value: usize,
}

impl Frames {
    /// An empty buffer that holds `value_bytes` of values in up to `records` frames without
    /// growing (with room for the last record's header to be copied at its longest, 32 bytes).
    pub fn with_capacity(value_bytes: usize, records: usize) -> Self {
        Self {
            bytes: Vec::with_capacity(
                value_bytes
                    .saturating_add(records * FRAME_HEADER)
                    .saturating_add(HEAD_SLACK),
            ),
            ..Self::default()
        }
    }

    /// Appends record `seq` as one frame: `write` is given the buffer and the length of the
    /// frame's header, [`FRAME_HEADER`], and appends that many zero bytes, then the value (which
    /// must lead with `seq`, as `record::encode_after` writes it): the header and the record's
    /// own are stored in one copy. On error nothing is appended.
    #[inline(always)]
    pub fn push<E>(
        &mut self,
        seq: u64,
        write: impl FnOnce(&mut Vec<u8>, usize) -> Result<(), E>,
    ) -> Result<usize, E> {
        let start = self.bytes.len();
        if let Err(error) = write(&mut self.bytes, FRAME_HEADER) {
            self.bytes.truncate(start);
            return Err(error);
        }
        let len = self.bytes.len() - start - FRAME_HEADER;
        self.bytes[start..start + 4].copy_from_slice(&(len as u32).to_le_bytes());
        if self.records == 0 {
            self.first_seq = seq;
        }
        self.last_seq = seq;
        self.records += 1;
        self.value_bytes += len as u64;
        self.max_value = self.max_value.max(len);
        Ok(len)
    }

    /// Records held.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Bytes of the values held (what the queue counts, without the frame headers).
    pub fn value_bytes(&self) -> u64 {
        self.value_bytes
    }

    pub fn is_empty(&self) -> bool {
        self.records == 0
    }

    /// Sequence numbers of the first and last record held.
    pub fn seqs(&self) -> Option<(u64, u64)> {
        (self.records > 0).then_some((self.first_seq, self.last_seq))
    }

    /// Each record held, in order: its sequence number and value.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &[u8])> {
        FrameIter {
            bytes: &self.bytes,
            at: 0,
        }
    }

    /// Forgets every record (the capacity stays).
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.records = 0;
        self.value_bytes = 0;
        self.max_value = 0;
    }
}

/// The frames of a buffer built by [`Frames`] or [`LogTx::insert`]: sequence number and value.
struct FrameIter<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Iterator for FrameIter<'a> {
    type Item = (u64, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        let header = self.bytes.get(self.at..self.at + FRAME_HEADER)?;
        let len = u32::from_le_bytes(header[..4].try_into().unwrap_or([0; 4])) as usize;
        let value = self
            .bytes
            .get(self.at + FRAME_HEADER..self.at + FRAME_HEADER + len)?;
        self.at += FRAME_HEADER + len;
        Some((frame_seq(value).unwrap_or(0), value))
    }
}

/// Sets the generation field of every frame in `frames`.
fn tag_frames(frames: &mut [u8], generation: u64) {
    let mut at = 0;
    while at + FRAME_HEADER <= frames.len() {
        let len = u32::from_le_bytes(frames[at..at + 4].try_into().unwrap_or([0; 4]));
        frames[at + 4..at + 8].copy_from_slice(&(generation as u32).to_le_bytes());
        at += FRAME_HEADER + len as usize;
    }
}

fn io(error: std::io::Error) -> StoreError {
    if error.kind() == ErrorKind::StorageFull {
        StoreError::DiskFull
    } else {
        StoreError::Io(error.to_string())
    }
}

/// Where a frame starts: the segment (by its first sequence number) and the offset in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Pos {
    segment: u64,
    offset: u64,
}

struct Segment {
    first_seq: u64,
    file: File,
    /// Bytes of valid frames (the file may be longer only while a commit writes).
    len: u64,
    /// Frames up to here ask for no blocks allocated ahead: the end of those allocated (with
    /// `fallocate` keeping the size), or the segment's end once a reservation was refused; `len`
    /// for a segment recovery opened or a failed commit truncated.
    reserved: u64,
    /// Damaged byte ranges `[from, to)` that recovery found and scans jump over.
    skips: Vec<(u64, u64)>,
}

/// What is removed of a tier.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Removal {
    /// Every record below this is removed.
    below: u64,
    /// Removed ranges above `below`, sorted and disjoint, inclusive.
    holes: Vec<(u64, u64)>,
}

impl Removal {
    fn contains(&self, seq: u64) -> bool {
        seq < self.below
            || self
                .holes
                .iter()
                .any(|&(first, last)| first <= seq && seq <= last)
    }

    /// Adds `first..=last` to the removed set.
    fn add(&mut self, first: u64, last: u64) {
        let first = first.max(self.below);
        if first > last {
            return;
        }
        let at = self
            .holes
            .partition_point(|&(_, end)| end.saturating_add(1) < first);
        let mut merged = (first, last);
        while let Some(&(a, b)) = self.holes.get(at) {
            if a > merged.1.saturating_add(1) {
                break;
            }
            merged = (merged.0.min(a), merged.1.max(b));
            self.holes.remove(at);
        }
        self.holes.insert(at, merged);
    }

    /// Moves `below` up to `seq` (no live record lies below it) and drops holes under it.
    fn advance(&mut self, seq: u64) {
        if seq <= self.below {
            return;
        }
        self.below = seq;
        self.holes.retain(|&(_, last)| last >= seq);
        if let Some(first) = self.holes.first_mut() {
            first.0 = first.0.max(seq);
        }
    }
}

struct TierLog {
    /// The tier's index (segment names, and the scan buffer's key).
    ix: usize,
    segments: VecDeque<Segment>,
    removal: Removal,
    last_seq: u64,
    /// Live records and their bytes (key + value, as the queue counts them).
    records: u64,
    bytes: u64,
    /// A frame at or before the first live record.
    head: Option<Pos>,
    /// Where the last read stopped: the frame at `pos` is the first with a sequence number of
    /// at least `seq`.
    cursor: Option<(u64, Pos)>,
    /// What the last read handed out, so acknowledging exactly that needs no rescan.
    run: Option<ReadRun>,
}

/// The live frames one read visited, one after another: with the removal unchanged since, they
/// are every live record of `from..=last`, and their stored bytes are known without a rescan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ReadRun {
    /// The read's lower bound: frames below `first` and at or above it were all removed.
    from: u64,
    first: u64,
    last: u64,
    records: u64,
    /// Stored bytes (key + value) of those records.
    bytes: u64,
    /// The frame after the last one.
    next: Pos,
}

impl TierLog {
    fn new(ix: usize) -> Self {
        Self {
            ix,
            segments: VecDeque::new(),
            removal: Removal {
                below: 1,
                holes: Vec::new(),
            },
            last_seq: 0,
            records: 0,
            bytes: 0,
            head: None,
            cursor: None,
            run: None,
        }
    }

    fn segment_index(&self, first_seq: u64) -> Option<usize> {
        self.segments
            .iter()
            .position(|segment| segment.first_seq == first_seq)
    }

    /// Where the next frame goes in the last segment: the head when nothing is live.
    fn end(&self) -> Option<Pos> {
        self.segments.back().map(|segment| Pos {
            segment: segment.first_seq,
            offset: segment.len,
        })
    }

    fn start(&self) -> Option<Pos> {
        self.segments.front().map(|segment| Pos {
            segment: segment.first_seq,
            offset: 0,
        })
    }
}

/// One frame seen by a scan.
struct Frame<'a> {
    seq: u64,
    value: &'a [u8],
    pos: Pos,
    next: Pos,
}

/// The protobuf key of the event's first field, its sequence number (field 1, varint).
const SEQ_TAG: u8 = 0x08;

/// A frame's sequence number, from the event leading its value (no checksum check).
fn frame_seq(value: &[u8]) -> Option<u64> {
    let event = value.get(record::HEADER_LEN..)?;
    if event.first() != Some(&SEQ_TAG) {
        return None;
    }
    let mut seq = 0u64;
    for (i, byte) in event[1..].iter().take(10).enumerate() {
        seq |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some(seq);
        }
    }
    None
}

/// The scan buffer: bytes of one segment from offset `at`, kept between scans (frames never
/// change once committed; a failed commit clears it).
#[derive(Default)]
struct ScanBuf {
    data: Vec<u8>,
    /// Tier and first sequence number of the segment held.
    segment: (usize, u64),
    at: u64,
}

impl ScanBuf {
    fn clear(&mut self) {
        self.data.clear();
    }

    /// Makes `data` hold `segment` bytes `offset..offset + need` (at least), reading
    /// `READ_CHUNK` ahead.
    fn fill(
        &mut self,
        ix: usize,
        segment: &Segment,
        offset: u64,
        need: u64,
    ) -> Result<(), StoreError> {
        let held = self.segment == (ix, segment.first_seq)
            && offset >= self.at
            && offset + need <= self.at + self.data.len() as u64;
        if held {
            return Ok(());
        }
        let want = need.max(READ_CHUNK as u64).min(segment.len - offset) as usize;
        self.data.clear();
        self.data.resize(want, 0);
        segment
            .file
            .read_exact_at(&mut self.data, offset)
            .map_err(io)?;
        self.segment = (ix, segment.first_seq);
        self.at = offset;
        Ok(())
    }
}

/// Scans the committed frames of `tier` from `from` in order, calling `visit` until it returns
/// false.
fn scan(
    tier: &TierLog,
    from: Pos,
    buf: &mut ScanBuf,
    mut visit: impl FnMut(Frame<'_>) -> bool,
) -> Result<(), StoreError> {
    let Some(mut index) = tier.segment_index(from.segment) else {
        return Ok(());
    };
    let mut offset = from.offset;
    while let Some(segment) = tier.segments.get(index) {
        while offset < segment.len {
            if let Some(&(_, to)) = segment.skips.iter().find(|(from, _)| *from == offset) {
                offset = to;
                continue;
            }
            if offset + FRAME_HEADER as u64 > segment.len {
                return Err(StoreError::Corrupt(format!(
                    "segment {} ends inside a frame",
                    segment.first_seq
                )));
            }
            buf.fill(tier.ix, segment, offset, FRAME_HEADER as u64)?;
            let start = (offset - buf.at) as usize;
            let len = u32::from_le_bytes(buf.data[start..start + 4].try_into().unwrap_or([0; 4]));
            let size = (FRAME_HEADER + len as usize) as u64;
            if offset + size > segment.len {
                return Err(StoreError::Corrupt(format!(
                    "segment {} has a frame past its end",
                    segment.first_seq
                )));
            }
            buf.fill(tier.ix, segment, offset, size)?;
            let start = (offset - buf.at) as usize;
            let value = &buf.data[start + FRAME_HEADER..start + size as usize];
            let next_offset = offset + size;
            let pos = Pos {
                segment: segment.first_seq,
                offset,
            };
            let next = match tier.segments.get(index + 1) {
                Some(following) if next_offset >= segment.len => Pos {
                    segment: following.first_seq,
                    offset: 0,
                },
                _ => Pos {
                    segment: segment.first_seq,
                    offset: next_offset,
                },
            };
            let Some(seq) = frame_seq(value) else {
                return Err(StoreError::Corrupt(format!(
                    "segment {} has a frame without a sequence number at {offset}",
                    segment.first_seq
                )));
            };
            if !visit(Frame {
                seq,
                value,
                pos,
                next,
            }) {
                return Ok(());
            }
            offset = next_offset;
        }
        index += 1;
        offset = 0;
    }
    Ok(())
}

/// The first live record of `tier` at or after `hint`: its sequence number, stored bytes, append
/// time and position.
fn first_live(
    tier: &TierLog,
    removal: &Removal,
    hint: Option<Pos>,
    buf: &mut ScanBuf,
) -> Result<Option<(u64, u64, u64, Pos)>, StoreError> {
    let Some(from) = hint.or_else(|| tier.start()) else {
        return Ok(None);
    };
    let mut found = None;
    scan(tier, from, buf, |frame| {
        if removal.contains(frame.seq) {
            return true;
        }
        found = Some((
            frame.seq,
            record::KEY_LEN + frame.value.len() as u64,
            record::appended_unix_ms(frame.value).unwrap_or(0),
            frame.pos,
        ));
        false
    })?;
    Ok(found)
}

/// The persisted part of the state slot beyond [`Persisted`].
#[derive(Clone, Debug, Default)]
struct Slot {
    generation: u64,
    epoch: u64,
    next_seq: [u64; 3],
    removal: [Removal; 3],
    /// Live records and last sequence number per tier when the slot was written.
    records: [u64; 3],
    last_seq: [u64; 3],
    losses: LossTotals,
    kv: Vec<(String, Vec<u8>)>,
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

/// A slot's contents by reference, for encoding before the commit that writes it succeeded.
struct SlotView<'a> {
    generation: u64,
    epoch: u64,
    next_seq: [u64; 3],
    removal: [&'a Removal; 3],
    records: [u64; 3],
    last_seq: [u64; 3],
    losses: &'a LossTotals,
    kv: &'a [(String, Vec<u8>)],
}

impl SlotView<'_> {
    fn encode(&self, out: &mut Vec<u8>) {
        out.clear();
        put_u32(out, 0);
        put_u32(out, 0);
        put_u64(out, MAGIC);
        put_u64(out, self.generation);
        put_u64(out, self.epoch);
        for ix in 0..3 {
            put_u64(out, self.next_seq[ix]);
            put_u64(out, self.removal[ix].below);
            put_u64(out, self.records[ix]);
            put_u64(out, self.last_seq[ix]);
            put_u32(out, self.removal[ix].holes.len() as u32);
            for &(first, last) in &self.removal[ix].holes {
                put_u64(out, first);
                put_u64(out, last);
            }
        }
        for row in self.losses {
            for total in row {
                put_u64(out, *total);
            }
        }
        put_u32(out, self.kv.len() as u32);
        for (key, value) in self.kv {
            put_u32(out, key.len() as u32);
            out.extend_from_slice(key.as_bytes());
            put_u32(out, value.len() as u32);
            out.extend_from_slice(value);
        }
        let len = (out.len() - 8) as u32;
        let crc = crc32c::crc32c(&out[8..]);
        out[0..4].copy_from_slice(&len.to_le_bytes());
        out[4..8].copy_from_slice(&crc.to_le_bytes());
    }
}

impl Slot {
    /// Decodes a slot file's bytes; `None` if torn or not a slot.
    fn decode(bytes: &[u8]) -> Option<Self> {
        let mut r = Reader(bytes);
        let len = r.u32()? as usize;
        let crc = r.u32()?;
        let payload = r.take(len)?;
        if crc32c::crc32c(payload) != crc {
            return None;
        }
        let mut r = Reader(payload);
        if r.u64()? != MAGIC {
            return None;
        }
        let mut slot = Slot {
            generation: r.u64()?,
            epoch: r.u64()?,
            ..Slot::default()
        };
        for ix in 0..3 {
            slot.next_seq[ix] = r.u64()?;
            slot.removal[ix].below = r.u64()?.max(1);
            slot.records[ix] = r.u64()?;
            slot.last_seq[ix] = r.u64()?;
            let holes = r.u32()? as usize;
            for _ in 0..holes {
                let first = r.u64()?;
                let last = r.u64()?;
                slot.removal[ix].holes.push((first, last));
            }
        }
        for row in &mut slot.losses {
            for total in row.iter_mut() {
                *total = r.u64()?;
            }
        }
        let entries = r.u32()? as usize;
        for _ in 0..entries {
            let key_len = r.u32()? as usize;
            let key = String::from_utf8(r.take(key_len)?.to_vec()).ok()?;
            let value_len = r.u32()? as usize;
            slot.kv.push((key, r.take(value_len)?.to_vec()));
        }
        Some(slot)
    }
}

struct Inner {
    tiers: [TierLog; 3],
    slot: Slot,
    /// Which state file the next slot goes to.
    next_slot: usize,
    /// What recovery found, handed out by `load`.
    loaded: Option<Loaded>,
    buf: ScanBuf,
    encoded: Vec<u8>,
    /// The frame buffers of transactions, kept between them.
    frames: [Vec<u8>; 3],
    /// The state files, opened at their first write.
    state_files: [Option<File>; 2],
    /// The state files' lengths (a slot is rewritten in place from offset 0, never truncated).
    state_bytes: [u64; 2],
    /// Whether segments' blocks are allocated ahead (cleared when the file system has no
    /// `fallocate`).
    preallocate: bool,
}

/// An open log in a directory.
pub struct Log {
    dir: PathBuf,
    inner: Mutex<Inner>,
    /// The directory, locked while the log is open.
    _lock: File,
}

fn segment_name(ix: usize, first_seq: u64) -> String {
    format!("{}.{first_seq:020}.seg", NAMES[ix])
}

fn parse_segment_name(name: &str) -> Option<(usize, u64)> {
    let stem = name.strip_suffix(".seg")?;
    let (tier, seq) = stem.split_once('.')?;
    let ix = NAMES.iter().position(|name| *name == tier)?;
    Some((ix, seq.parse().ok()?))
}

fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io)
}

/// What recovery reads of one frame.
struct FrameInfo {
    end: usize,
    tag: u32,
    /// The sequence number leading the event, if one can be read.
    seq: Option<u64>,
    /// The record passes its checks (checksum, sequence number).
    ok: bool,
    appended: u64,
    value_len: usize,
}

/// A window over a segment file for recovery: reads a chunk at a time, so memory stays bounded
/// whatever the segment's size.
struct Window<'f> {
    file: &'f File,
    len: usize,
    buf: Vec<u8>,
    at: usize,
}

impl<'f> Window<'f> {
    fn new(file: &'f File, len: usize) -> Self {
        Self {
            file,
            len,
            buf: Vec::new(),
            at: 0,
        }
    }

    /// Makes `from..from + n` buffered; false if it runs past the file's end.
    fn load(&mut self, from: usize, n: usize) -> Result<bool, StoreError> {
        if from + n > self.len {
            return Ok(false);
        }
        if from < self.at || from + n > self.at + self.buf.len() {
            let want = n.max(READ_CHUNK).min(self.len - from);
            self.buf.clear();
            self.buf.resize(want, 0);
            self.file
                .read_exact_at(&mut self.buf, from as u64)
                .map_err(io)?;
            self.at = from;
        }
        Ok(true)
    }

    /// The first offset at or after `from` where a valid frame could start: its length is one
    /// a record can have and its event opens with the sequence number's tag. A cheap test
    /// byte by byte over the buffered chunk, so that the search past damaged bytes (zeros,
    /// garbage) reads at the disk's pace; [`Window::frame`] decides on each candidate. Every
    /// offset where `frame` would find a frame that passes its checks is a candidate.
    fn next_candidate(&mut self, from: usize) -> Result<Option<usize>, StoreError> {
        // The frame header, the record header and the event's first byte.
        const PROBE: usize = FRAME_HEADER + record::HEADER_LEN + 1;
        // The record header, the sequence number's tag and at least one byte of its varint.
        const MIN_VALUE: usize = record::HEADER_LEN + 2;
        let mut at = from;
        while self.load(at, PROBE)? {
            let buf = &self.buf[at - self.at..];
            let found = buf.windows(PROBE).position(|probe| {
                probe[PROBE - 1] == SEQ_TAG
                    && (MIN_VALUE..=MAX_VALUE).contains(
                        &(u32::from_le_bytes([probe[0], probe[1], probe[2], probe[3]]) as usize),
                    )
            });
            match found {
                Some(i) => return Ok(Some(at + i)),
                // Every position with a whole probe in the buffer was tried.
                None => at += buf.len() + 1 - PROBE,
            }
        }
        Ok(None)
    }

    /// The frame starting at `at`, if its header and length fit in the file.
    fn frame(&mut self, at: usize) -> Result<Option<FrameInfo>, StoreError> {
        if !self.load(at, FRAME_HEADER)? {
            return Ok(None);
        }
        let header = &self.buf[at - self.at..at - self.at + FRAME_HEADER];
        let len = u32::from_le_bytes(header[0..4].try_into().unwrap_or([0; 4])) as usize;
        let tag = u32::from_le_bytes(header[4..8].try_into().unwrap_or([0; 4]));
        let end = at + FRAME_HEADER + len;
        if len > MAX_VALUE || !self.load(at, FRAME_HEADER + len)? {
            return Ok(None);
        }
        let value = &self.buf[at - self.at + FRAME_HEADER..end - self.at];
        let seq = frame_seq(value);
        Ok(Some(FrameInfo {
            end,
            tag,
            seq,
            ok: seq.is_some_and(|seq| record::check(value, seq).is_ok()),
            appended: record::appended_unix_ms(value).unwrap_or(0),
            value_len: len,
        }))
    }
}

/// Stages a caller's run of frames as the first appends of tier `ix`: returns where in it the
/// frames to write start (past records already live, see [`Log::write_with`]) and the count and
/// stored bytes of those it skipped.
fn stage_run(
    inner: &Inner,
    tier: &mut StagedTier,
    ix: usize,
    run: &Frames,
    buf: &mut ScanBuf,
) -> Result<(usize, (u64, u64)), StoreError> {
    if run.max_value > MAX_VALUE {
        return Err(StoreError::Io(format!(
            "record of {} bytes is too large",
            run.max_value
        )));
    }
    let (mut skip, mut replaced) = (0usize, (0u64, 0u64));
    if run.first_seq <= tier.last_seq {
        // Rare: records of a commit reported failed that landed after all.
        let live = &inner.tiers[ix];
        for (seq, value) in run.iter() {
            if seq > tier.last_seq {
                break;
            }
            let mut found = None;
            if let Some(from) = tier.head.or_else(|| live.start()) {
                scan(live, from, buf, |frame| {
                    if frame.seq == seq && !tier.removal.contains(seq) {
                        found = Some(record::KEY_LEN + frame.value.len() as u64);
                    }
                    frame.seq < seq
                })?;
            }
            let Some(bytes) = found else {
                return Err(StoreError::Io(format!(
                    "{} record {seq} is not after the last one, {}",
                    NAMES[ix], tier.last_seq
                )));
            };
            replaced.0 += 1;
            replaced.1 += bytes;
            skip += FRAME_HEADER + value.len();
        }
    }
    let written = run.records - replaced.0;
    if written > 0 {
        tier.first_staged = FrameIter {
            bytes: &run.bytes,
            at: skip,
        }
        .next()
        .map_or(0, |(seq, _)| seq);
        tier.last_seq = run.last_seq;
        tier.records += written;
        let value_bytes = (run.bytes.len() - skip) as u64 - written * FRAME_HEADER as u64;
        tier.bytes += written * record::KEY_LEN + value_bytes;
    }
    Ok((skip, replaced))
}

/// Accepts frames tagged with the durable generation or an older one (wrapping `u32`).
fn committed(tag: u32, generation: u64) -> bool {
    (generation as u32).wrapping_sub(tag) as i32 >= 0
}

impl Log {
    /// Opens the log in `dir`, creating the directory when missing, and recovers it: reads the
    /// newest valid state slot and scans every frame.
    /// With `salvage`, a log without a valid state opens anyway: every frame whose record passes
    /// its checks is visible, and `load` is `None`.
    pub fn open(dir: &Path, salvage: bool) -> Result<Self, StoreError> {
        match std::fs::create_dir(dir) {
            Ok(()) => {
                if let Some(parent) = dir.parent() {
                    sync_dir(parent)?;
                }
            }
            Err(error) if error.kind() == ErrorKind::AlreadyExists => {}
            Err(error) => return Err(io(error)),
        }
        let meta = std::fs::metadata(dir).map_err(io)?;
        if !meta.is_dir() {
            return Err(StoreError::Io(format!(
                "{} is not a directory",
                dir.display()
            )));
        }
        // One process at a time: an advisory lock on the directory, released when closed.
        let lock = File::open(dir).map_err(io)?;
        // SAFETY: `flock` on a descriptor this function owns, open for the call's duration.
        let locked = unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if locked != 0 {
            let error = std::io::Error::last_os_error();
            if error.kind() == ErrorKind::WouldBlock {
                return Err(StoreError::Locked);
            }
            return Err(io(error));
        }
        let mut slots: Vec<(usize, Slot)> = Vec::new();
        let mut state_files = 0;
        let mut state_bytes = [0u64; 2];
        let mut damaged_slot = false;
        for (i, name) in STATE_FILES.iter().enumerate() {
            match std::fs::read(dir.join(name)) {
                Ok(bytes) => {
                    state_files += 1;
                    state_bytes[i] = bytes.len() as u64;
                    match Slot::decode(&bytes) {
                        Some(slot) => slots.push((i, slot)),
                        None => damaged_slot |= !bytes.is_empty(),
                    }
                }
                Err(error) if error.kind() == ErrorKind::NotFound => {}
                Err(error) => return Err(io(error)),
            }
        }
        let mut found: Vec<(usize, u64)> = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(io)? {
            let entry = entry.map_err(io)?;
            if let Some(parsed) = entry.file_name().to_str().and_then(parse_segment_name) {
                found.push(parsed);
            }
        }
        found.sort_unstable();
        let best = slots.into_iter().max_by_key(|(_, slot)| slot.generation);
        let mut inner = Inner {
            tiers: [TierLog::new(0), TierLog::new(1), TierLog::new(2)],
            slot: Slot::default(),
            next_slot: 0,
            loaded: None,
            buf: ScanBuf::default(),
            encoded: Vec::new(),
            frames: Default::default(),
            state_files: [None, None],
            state_bytes,
            preallocate: !in_memory(&lock),
        };
        let salvaging = salvage;
        let no_state = best.is_none();
        if damaged_slot && !salvage {
            // The newest slot torn by a crash while it was written, or either slot damaged since:
            // which one cannot be told, so the store is salvaged into a new one (nothing a
            // valid slot keeps is lost, and a record of the torn commit is kept, not dropped).
            return Err(StoreError::Corrupt(
                "a state slot fails its checksum".into(),
            ));
        }
        let best = best.or_else(|| {
            salvage.then(|| {
                (
                    1,
                    Slot {
                        generation: u64::from(u32::MAX / 2),
                        ..Slot::default()
                    },
                )
            })
        });
        let Some((slot_index, slot)) = best else {
            if state_files == 0 && found.is_empty() {
                return Ok(Self {
                    dir: dir.to_owned(),
                    inner: Mutex::new(inner),
                    _lock: lock,
                });
            }
            return Err(StoreError::Corrupt(format!(
                "no valid state slot among {state_files} state files beside {} segments",
                found.len()
            )));
        };
        inner.next_slot = 1 - slot_index;
        let mut loaded = Loaded {
            state: Persisted {
                epoch: slot.epoch,
                next_seq: PerTier {
                    safety: slot.next_seq[0].max(1),
                    slo: slot.next_seq[1].max(1),
                    debug: slot.next_seq[2].max(1),
                },
                records: PerTier::default(),
                bytes: PerTier::default(),
                losses: slot.losses,
            },
            corrupt: Vec::new(),
            unaccounted: PerTier::default(),
            oldest: PerTier::default(),
            kv: slot.kv.clone(),
        };
        let mut truncated = false;
        for (ix, tier) in inner.tiers.iter_mut().enumerate() {
            tier.removal = slot.removal[ix].clone();
            let names: Vec<u64> = found
                .iter()
                .filter(|(t, _)| *t == ix)
                .map(|&(_, seq)| seq)
                .collect();
            let mut counted_at_slot = 0u64;
            let mut gap_total = 0u64;
            let count = names.len();
            for (n, first_seq) in names.into_iter().enumerate() {
                let path = dir.join(segment_name(ix, first_seq));
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&path)
                    .map_err(io)?;
                let file_len = file.metadata().map_err(io)?.len() as usize;
                let last = n + 1 == count;
                let accept = |tag: u32| salvaging || committed(tag, slot.generation);
                let mut window = Window::new(&file, file_len);
                let mut offset = 0usize;
                let mut skips = Vec::new();
                let mut gaps = 0u64;
                let mut torn = false;
                while offset < file_len {
                    let frame = window.frame(offset)?;
                    // A complete frame whose record fails its checks counts as that record
                    // when the frame after it (or the segment's end) confirms its place.
                    let usable = match &frame {
                        Some(f)
                            if accept(f.tag) && f.seq.is_some_and(|seq| seq > tier.last_seq) =>
                        {
                            if f.ok {
                                true
                            } else {
                                let seq = f.seq.unwrap_or(0);
                                f.end == file_len
                                    || window.frame(f.end)?.is_some_and(|next| {
                                        next.ok
                                            && accept(next.tag)
                                            && next.seq.is_some_and(|s| s > seq)
                                    })
                            }
                        }
                        _ => false,
                    };
                    let Some(frame) = frame.filter(|_| usable) else {
                        // Garbage, a torn tail or an uncommitted commit: find the next frame
                        // that passes every check; what lies between is lost and counted.
                        let mut resumed = None;
                        let mut from = offset + 1;
                        while let Some(at) = window.next_candidate(from)? {
                            if let Some(next) = window.frame(at)?
                                && let Some(seq) = next.seq.filter(|&seq| {
                                    next.ok && accept(next.tag) && seq > tier.last_seq
                                })
                            {
                                resumed = Some((at, seq));
                                break;
                            }
                            from = at + 1;
                        }
                        match resumed {
                            Some((at, seq)) => {
                                gaps += (tier.last_seq + 1..seq)
                                    .take(1 << 20)
                                    .filter(|s| !tier.removal.contains(*s))
                                    .count() as u64;
                                skips.push((offset as u64, at as u64));
                                offset = at;
                                continue;
                            }
                            None => {
                                torn = true;
                                break;
                            }
                        }
                    };
                    let seq = frame.seq.unwrap_or(0);
                    tier.last_seq = seq;
                    if !tier.removal.contains(seq) {
                        let stored = record::KEY_LEN + frame.value_len as u64;
                        tier.records += 1;
                        tier.bytes += stored;
                        if seq <= slot.last_seq[ix] {
                            counted_at_slot += 1;
                        }
                        if frame.ok {
                            loaded
                                .oldest
                                .at_mut(ix)
                                .get_or_insert((seq, frame.appended));
                        } else {
                            loaded.corrupt.push((ix, seq));
                        }
                        if tier.head.is_none() {
                            tier.head = Some(Pos {
                                segment: first_seq,
                                offset: offset as u64,
                            });
                        }
                    }
                    offset = frame.end;
                }
                if torn && !last {
                    // The rest of a segment that is not the last is damage, not a torn write:
                    // the numbers up to the next segment's first are lost.
                    let next = found
                        .iter()
                        .filter(|(t, seq)| *t == ix && *seq > first_seq)
                        .map(|&(_, seq)| seq)
                        .next()
                        .unwrap_or(tier.last_seq + 1);
                    gaps += (tier.last_seq + 1..next)
                        .take(1 << 20)
                        .filter(|s| !tier.removal.contains(*s))
                        .count() as u64;
                }
                gap_total += gaps;
                if offset < file_len && last && !salvaging {
                    // A torn or uncommitted tail: what the last commit did not finish.
                    if offset == 0 {
                        drop(file);
                        std::fs::remove_file(&path).map_err(io)?;
                        truncated = true;
                        continue;
                    }
                    file.set_len(offset as u64).map_err(io)?;
                    file.sync_data().map_err(io)?;
                    truncated = true;
                }
                tier.segments.push_back(Segment {
                    first_seq,
                    file,
                    len: offset as u64,
                    reserved: offset as u64,
                    skips,
                });
            }
            if tier.head.is_none() {
                tier.head = tier.end();
            }
            *loaded.unaccounted.at_mut(ix) = slot.records[ix]
                .saturating_sub(counted_at_slot)
                .max(gap_total);
            *loaded.state.records.at_mut(ix) = tier.records;
            *loaded.state.bytes.at_mut(ix) = tier.bytes;
            let next = loaded.state.next_seq.at_mut(ix);
            if tier.last_seq >= *next {
                *next = tier.last_seq + 1;
            }
        }
        if truncated {
            sync_dir(dir)?;
        }
        inner.slot = slot;
        inner.loaded = (!no_state).then_some(loaded);
        let log = Self {
            dir: dir.to_owned(),
            inner: Mutex::new(inner),
            _lock: lock,
        };
        // A crash between a state write and the unlinks it allowed leaves removed segments.
        {
            let mut inner = log.lock();
            log.unlink_removed(&mut inner);
        }
        Ok(log)
    }

    /// Bytes of the log's files (segments and state slots: their sizes, so not the blocks
    /// reserved ahead of each tier's last segment), from what the log keeps in memory: no
    /// directory listing, no allocation (the agent's status asks every second).
    pub fn file_bytes(&self) -> u64 {
        let inner = self.lock();
        let segments: u64 = inner
            .tiers
            .iter()
            .flat_map(|tier| tier.segments.iter())
            .map(|segment| segment.len)
            .sum();
        segments + inner.state_bytes.iter().sum::<u64>()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// What recovery found; `None` for a log never written.
    pub fn load(&self) -> Option<Loaded> {
        self.lock().loaded.clone()
    }

    /// The key-value area as last committed.
    pub fn kv(&self) -> Vec<(String, Vec<u8>)> {
        self.lock().slot.kv.clone()
    }

    /// Visits the live records of tier `ix` with `from <= seq < to`, in order, until `visit`
    /// returns false; starts where the previous read stopped when it can.
    pub fn read(
        &self,
        ix: usize,
        from: u64,
        to: u64,
        mut visit: impl FnMut(u64, &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let tier = &inner.tiers[ix];
        let start = match tier.cursor {
            Some((seq, pos))
                if seq <= from
                    && from >= tier.removal.below
                    && tier.segment_index(pos.segment).is_some() =>
            {
                Some(pos)
            }
            _ => tier.head.or_else(|| tier.start()),
        };
        let Some(start) = start else {
            return Ok(());
        };
        let mut cursor = None;
        let mut run: Option<ReadRun> = None;
        let scanned = scan(tier, start, &mut inner.buf, |frame| {
            if frame.seq >= to {
                cursor = Some((frame.seq, frame.pos));
                return false;
            }
            if frame.seq < from || tier.removal.contains(frame.seq) {
                return true;
            }
            if visit(frame.seq, frame.value) {
                cursor = Some((frame.seq + 1, frame.next));
                let stored = record::KEY_LEN + frame.value.len() as u64;
                let run = run.get_or_insert(ReadRun {
                    from,
                    first: frame.seq,
                    last: frame.seq,
                    records: 0,
                    bytes: 0,
                    next: frame.next,
                });
                run.last = frame.seq;
                run.records += 1;
                run.bytes += stored;
                run.next = frame.next;
                true
            } else {
                cursor = Some((frame.seq, frame.pos));
                false
            }
        });
        let tier = &mut inner.tiers[ix];
        tier.run = if scanned.is_ok() { run } else { None };
        scanned?;
        if cursor.is_some() {
            tier.cursor = cursor;
        }
        Ok(())
    }

    /// Runs `work` as one transaction and commits it durably; nothing of it persists if `work`
    /// or the commit fails.
    pub fn write<R>(
        &self,
        work: impl FnOnce(&LogTx<'_>) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        self.write_with([None, None, None], work)
    }

    /// [`Log::write`] with the records of `appends` (per tier) appended first, before anything
    /// `work` does: their frames are written from the caller's buffers as they are. A record at
    /// or below its tier's last sequence number must be live (a commit reported failed that
    /// landed after all): it is not written again, and [`LogTx::replaced`] counts it. The
    /// generation field of the frames is overwritten; the buffers are otherwise left as given.
    pub fn write_with<R>(
        &self,
        mut appends: [Option<&mut Frames>; 3],
        work: impl FnOnce(&LogTx<'_>) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let mut buf = std::mem::take(&mut inner.buf);
        let frames = std::mem::take(&mut inner.frames);
        let mut staged = Staged::from(inner, frames);
        let mut skip = [0usize; 3];
        let mut replaced = [(0u64, 0u64); 3];
        let mut result = Ok(());
        for ix in 0..3 {
            if let Some(run) = appends[ix].as_deref().filter(|run| !run.is_empty()) {
                result = stage_run(inner, &mut staged.tiers[ix], ix, run, &mut buf).map(
                    |(at, counts)| {
                        skip[ix] = at;
                        replaced[ix] = counts;
                    },
                );
                if result.is_err() {
                    break;
                }
            }
        }
        let result = match result {
            Ok(()) => {
                let runs = [0, 1, 2].map(|ix| match appends[ix].as_deref() {
                    Some(run) => &run.bytes[skip[ix]..],
                    None => &[][..],
                });
                let tx = LogTx {
                    staged: std::cell::RefCell::new(staged),
                    inner: &*inner,
                    buf: std::cell::RefCell::new(buf),
                    runs,
                    replaced,
                };
                let result = work(&tx);
                let LogTx {
                    staged: tx_staged,
                    buf: tx_buf,
                    ..
                } = tx;
                buf = tx_buf.into_inner();
                staged = tx_staged.into_inner();
                result
            }
            Err(error) => Err(error),
        };
        inner.buf = buf;
        let result = match result {
            Ok(value) => {
                let mut runs: [&mut [u8]; 3] = Default::default();
                for (ix, run) in appends.iter_mut().enumerate() {
                    if let Some(run) = run {
                        runs[ix] = &mut run.bytes[skip[ix]..];
                    }
                }
                self.commit(inner, &mut staged, runs).map(|()| value)
            }
            Err(error) => Err(error),
        };
        // The frame buffers are kept for the next transaction.
        for (ix, tier) in staged.tiers.iter_mut().enumerate() {
            let mut frames = std::mem::take(&mut tier.frames);
            frames.clear();
            inner.frames[ix] = frames;
        }
        result
    }

    /// Commits `staged`, whose appends per tier are `runs` (the caller's frames) then its own
    /// frames.
    fn commit(
        &self,
        inner: &mut Inner,
        staged: &mut Staged,
        mut runs: [&mut [u8]; 3],
    ) -> Result<(), StoreError> {
        let mut needs_state = staged.kv.is_some() || inner.loaded.is_none();
        let mut next_seq = inner.slot.next_seq;
        let (mut epoch, mut losses) = (inner.slot.epoch, inner.slot.losses);
        for (next, tier) in next_seq.iter_mut().zip(&staged.tiers) {
            *next = (*next).max(tier.last_seq + 1);
        }
        if let Some(state) = &staged.state {
            needs_state |= state.epoch != epoch || state.losses != losses;
            (epoch, losses) = (state.epoch, state.losses);
            for (ix, next) in next_seq.iter_mut().enumerate() {
                let wanted = *state.next_seq.at(ix);
                if wanted > *next {
                    needs_state = true;
                    *next = wanted;
                }
            }
        }
        for ix in 0..3 {
            needs_state |= staged.tiers[ix].removal != inner.tiers[ix].removal;
        }
        let generation = inner.slot.generation + u64::from(needs_state);
        for (tier, run) in staged.tiers.iter_mut().zip(runs.iter_mut()) {
            tag_frames(run, generation);
            tag_frames(&mut tier.frames, generation);
        }
        // Write the frames of each tier, then the state.
        let mut created: [Option<PathBuf>; 3] = Default::default();
        let mut written: [Option<u64>; 3] = [None; 3];
        let mut reserved = [0u64; 3];
        let result = (|| -> Result<(), StoreError> {
            for (ix, tier) in staged.tiers.iter().enumerate() {
                let run = &*runs[ix];
                if tier.frames.is_empty() && run.is_empty() {
                    continue;
                }
                // The caller's frames, then the transaction's own, as one write when only one
                // of them has any.
                let write = |file: &File, at: u64| -> Result<(), StoreError> {
                    if !run.is_empty() {
                        file.write_all_at(run, at).map_err(io)?;
                    }
                    if !tier.frames.is_empty() {
                        file.write_all_at(&tier.frames, at + run.len() as u64)
                            .map_err(io)?;
                    }
                    Ok(())
                };
                let live = &inner.tiers[ix];
                let active = live
                    .segments
                    .back()
                    .filter(|segment| segment.len < SEGMENT_BYTES);
                let appended = (run.len() + tier.frames.len()) as u64;
                match active {
                    Some(segment) => {
                        written[ix] = Some(segment.len);
                        reserved[ix] = reserve_ahead(
                            &segment.file,
                            segment.len,
                            segment.reserved.max(segment.len),
                            segment.len + appended,
                            &mut inner.preallocate,
                        );
                        write(&segment.file, segment.len)?;
                        segment.file.sync_data().map_err(io)?;
                    }
                    None => {
                        let path = self.dir.join(segment_name(ix, tier.first_staged));
                        let file = OpenOptions::new()
                            .read(true)
                            .write(true)
                            .create(true)
                            .truncate(true)
                            .open(&path)
                            .map_err(io)?;
                        created[ix] = Some(path);
                        reserved[ix] = reserve_ahead(&file, 0, 0, appended, &mut inner.preallocate);
                        write(&file, 0)?;
                        file.sync_data().map_err(io)?;
                    }
                }
            }
            if created.iter().any(Option::is_some) {
                sync_dir(&self.dir)?;
            }
            if needs_state {
                SlotView {
                    generation,
                    epoch,
                    next_seq,
                    removal: [
                        &staged.tiers[0].removal,
                        &staged.tiers[1].removal,
                        &staged.tiers[2].removal,
                    ],
                    records: [0, 1, 2].map(|ix| staged.tiers[ix].records),
                    last_seq: [0, 1, 2].map(|ix| staged.tiers[ix].last_seq),
                    losses: &losses,
                    kv: staged.kv.as_deref().unwrap_or(&inner.slot.kv),
                }
                .encode(&mut inner.encoded);
                let slot = inner.next_slot;
                if inner.state_files[slot].is_none() {
                    inner.state_files[slot] = Some(
                        OpenOptions::new()
                            .write(true)
                            .create(true)
                            .truncate(false)
                            .open(self.dir.join(STATE_FILES[slot]))
                            .map_err(io)?,
                    );
                }
                if let Some(file) = &inner.state_files[slot] {
                    file.write_all_at(&inner.encoded, 0).map_err(io)?;
                    file.sync_data().map_err(io)?;
                }
                inner.state_bytes[slot] = inner.state_bytes[slot].max(inner.encoded.len() as u64);
                if inner.loaded.is_none() {
                    sync_dir(&self.dir)?;
                }
            }
            Ok(())
        })();
        if let Err(error) = result {
            inner.buf.clear();
            for tier in &mut inner.tiers {
                tier.run = None;
            }
            // A handle that met an error is not used again.
            inner.state_files = [None, None];
            // Undo the appends so a later commit does not build on them, and give back every
            // tier's blocks allocated ahead (a truncation frees the blocks past the size): on a
            // full disk the queue then holds no space beyond its records, as without them.
            for (ix, tier) in inner.tiers.iter_mut().enumerate() {
                if let Some(segment) = tier.segments.back_mut() {
                    let len = written[ix].unwrap_or(segment.len);
                    let _ = segment.file.set_len(len);
                    segment.reserved = len;
                }
            }
            for path in created.iter().flatten() {
                let _ = std::fs::remove_file(path);
            }
            return Err(error);
        }
        // Apply.
        for (ix, tier) in staged.tiers.iter_mut().enumerate() {
            let live = &mut inner.tiers[ix];
            let appended = (runs[ix].len() + tier.frames.len()) as u64;
            if written[ix].is_some() {
                if let Some(segment) = live.segments.back_mut() {
                    segment.len += appended;
                    segment.reserved = reserved[ix];
                }
            } else if let Some(path) = &created[ix] {
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(path)
                    .map_err(io)?;
                live.segments.push_back(Segment {
                    first_seq: tier.first_staged,
                    file,
                    len: appended,
                    reserved: reserved[ix],
                    skips: Vec::new(),
                });
            }
            if live.removal != tier.removal {
                std::mem::swap(&mut live.removal, &mut tier.removal);
                live.run = None;
            }
            live.last_seq = tier.last_seq;
            live.records = tier.records;
            live.bytes = tier.bytes;
            live.head = tier.head.or_else(|| live.start());
        }
        if needs_state {
            inner.next_slot = 1 - inner.next_slot;
            let slot = &mut inner.slot;
            slot.generation = generation;
            slot.epoch = epoch;
            slot.losses = losses;
            slot.next_seq = next_seq;
            for ix in 0..3 {
                slot.removal[ix].clone_from(&inner.tiers[ix].removal);
                slot.records[ix] = inner.tiers[ix].records;
                slot.last_seq[ix] = inner.tiers[ix].last_seq;
            }
            if let Some(kv) = staged.kv.take() {
                slot.kv = kv;
            }
        } else {
            inner.slot.next_seq = next_seq;
        }
        if inner.loaded.is_none() {
            inner.loaded = Some(Loaded::fresh(staged.state.unwrap_or(Persisted::fresh(0))));
        }
        self.unlink_removed(inner);
        Ok(())
    }

    /// Unlinks the segments whose records are all removed (the state saying so is durable).
    fn unlink_removed(&self, inner: &mut Inner) {
        for (ix, tier) in inner.tiers.iter_mut().enumerate() {
            loop {
                let all_removed = match (tier.segments.front(), tier.segments.get(1)) {
                    (Some(_), Some(next)) => next.first_seq <= tier.removal.below,
                    // The last one, drained, takes the next appends unless it is large.
                    (Some(last), None) => {
                        tier.last_seq < tier.removal.below && last.len >= KEEP_DRAINED_BYTES
                    }
                    (None, _) => false,
                };
                if !all_removed {
                    break;
                }
                let Some(segment) = tier.segments.pop_front() else {
                    break;
                };
                if let Err(error) =
                    std::fs::remove_file(self.dir.join(segment_name(ix, segment.first_seq)))
                {
                    tracing::warn!(%error, tier = NAMES[ix], "Unlinking a removed segment failed.");
                }
            }
            if tier
                .head
                .is_some_and(|pos| tier.segment_index(pos.segment).is_none())
            {
                tier.head = tier.start();
            }
            if tier
                .cursor
                .is_some_and(|(_, pos)| tier.segment_index(pos.segment).is_none())
            {
                tier.cursor = None;
            }
        }
    }
}

/// A tier's changes inside a transaction.
struct StagedTier {
    /// Frames appended, with their generation field to be filled at commit.
    frames: Vec<u8>,
    first_staged: u64,
    last_seq: u64,
    removal: Removal,
    records: u64,
    bytes: u64,
    head: Option<Pos>,
}

struct Staged {
    tiers: [StagedTier; 3],
    state: Option<Persisted>,
    /// The key-value area, once this transaction changed it.
    kv: Option<Vec<(String, Vec<u8>)>>,
}

impl Staged {
    fn from(inner: &Inner, frames: [Vec<u8>; 3]) -> Self {
        let [f0, f1, f2] = frames;
        let tier = |ix: usize, frames: Vec<u8>| {
            let live = &inner.tiers[ix];
            StagedTier {
                frames,
                first_staged: 0,
                last_seq: live.last_seq,
                removal: live.removal.clone(),
                records: live.records,
                bytes: live.bytes,
                head: live.head,
            }
        };
        Self {
            tiers: [tier(0, f0), tier(1, f1), tier(2, f2)],
            state: None,
            kv: None,
        }
    }
}

/// The first live record of a tier, as a transaction sees it.
struct Oldest {
    seq: u64,
    appended: u64,
    /// Where it is in a segment; `None` for a record this transaction appended.
    pos: Option<Pos>,
}

/// A write transaction in progress.
pub struct LogTx<'a> {
    inner: &'a Inner,
    staged: std::cell::RefCell<Staged>,
    buf: std::cell::RefCell<ScanBuf>,
    /// Per tier, the caller's frames appended ahead of the transaction's own (`write_with`).
    runs: [&'a [u8]; 3],
    /// Per tier, records of those runs found live already: count and stored bytes.
    replaced: [(u64, u64); 3],
}

impl LogTx<'_> {
    /// Records of tier `ix` handed to [`Log::write_with`] that were live already (not written
    /// again): how many, and their stored bytes.
    pub fn replaced(&self, ix: usize) -> (u64, u64) {
        self.replaced[ix]
    }

    /// Every frame this transaction appends to tier `ix`, in order.
    fn staged_frames<'s>(
        &'s self,
        own: &'s [u8],
        ix: usize,
    ) -> impl Iterator<Item = (u64, &'s [u8])> {
        FrameIter {
            bytes: self.runs[ix],
            at: 0,
        }
        .chain(FrameIter { bytes: own, at: 0 })
    }

    /// Writes the state record (its counts are the log's own).
    pub fn put_state(&self, state: &Persisted) {
        self.staged.borrow_mut().state = Some(*state);
    }

    /// Writes `value` under `key` in the key-value area, or removes `key` when `value` is `None`.
    pub fn put_kv(&self, key: &str, value: Option<&[u8]>) {
        let mut staged = self.staged.borrow_mut();
        let kv = staged.kv.get_or_insert_with(|| self.inner.slot.kv.clone());
        let at = kv.binary_search_by(|(k, _)| k.as_str().cmp(key));
        match (at, value) {
            (Ok(i), Some(value)) => kv[i].1 = value.to_vec(),
            (Err(i), Some(value)) => kv.insert(i, (key.to_owned(), value.to_vec())),
            (Ok(i), None) => {
                kv.remove(i);
            }
            (Err(_), None) => {}
        }
    }

    /// Appends `value` as record `seq` of tier `ix`; returns the bytes of a live record it
    /// replaces (the same record, from a commit reported failed that landed after all: it is not
    /// written twice). A number at or below the tier's last one that is not live cannot be
    /// appended to a log.
    pub fn insert(&self, ix: usize, seq: u64, value: &[u8]) -> Result<Option<u64>, StoreError> {
        let mut staged = self.staged.borrow_mut();
        let tier = &mut staged.tiers[ix];
        if seq <= tier.last_seq {
            let mut found = None;
            if tier.frames.is_empty() && self.runs[ix].is_empty() {
                let live = &self.inner.tiers[ix];
                let removal = tier.removal.clone();
                if let Some(from) = tier.head.or_else(|| live.start()) {
                    scan(live, from, &mut self.buf.borrow_mut(), |frame| {
                        if frame.seq == seq && !removal.contains(seq) {
                            found = Some(record::KEY_LEN + frame.value.len() as u64);
                        }
                        frame.seq < seq
                    })?;
                }
            }
            return match found {
                Some(bytes) => Ok(Some(bytes)),
                None => Err(StoreError::Io(format!(
                    "{} record {seq} is not after the last one, {}",
                    NAMES[ix], tier.last_seq
                ))),
            };
        }
        if value.len() > MAX_VALUE {
            return Err(StoreError::Io(format!(
                "record of {} bytes is too large",
                value.len()
            )));
        }
        if tier.frames.is_empty() && self.runs[ix].is_empty() {
            tier.first_staged = seq;
        }
        tier.frames
            .extend_from_slice(&(value.len() as u32).to_le_bytes());
        tier.frames.extend_from_slice(&[0; 4]);
        tier.frames.extend_from_slice(value);
        tier.last_seq = seq;
        tier.records += 1;
        tier.bytes += record::KEY_LEN + value.len() as u64;
        Ok(None)
    }

    /// The first live record of tier `ix` in the log or among this transaction's appends.
    fn oldest(&self, ix: usize) -> Result<Option<Oldest>, StoreError> {
        let staged = self.staged.borrow();
        let tier = &staged.tiers[ix];
        let live = &self.inner.tiers[ix];
        if let Some((seq, _, appended, pos)) =
            first_live(live, &tier.removal, tier.head, &mut self.buf.borrow_mut())?
        {
            return Ok(Some(Oldest {
                seq,
                appended,
                pos: Some(pos),
            }));
        }
        Ok(self
            .staged_frames(&tier.frames, ix)
            .find(|(seq, _)| !tier.removal.contains(*seq))
            .map(|(seq, value)| Oldest {
                seq,
                appended: record::appended_unix_ms(value).unwrap_or(0),
                pos: None,
            }))
    }

    /// Moves the tier's removed prefix up to its first live record.
    fn settle(&self, ix: usize) -> Result<(), StoreError> {
        let next = self.oldest(ix)?;
        let mut staged = self.staged.borrow_mut();
        let tier = &mut staged.tiers[ix];
        let below = next.as_ref().map_or(tier.last_seq + 1, |oldest| oldest.seq);
        tier.removal.advance(below);
        // The head moves to the first live record, or past every committed frame.
        tier.head = match next.and_then(|oldest| oldest.pos) {
            Some(pos) => Some(pos),
            None => self.inner.tiers[ix].end(),
        };
        Ok(())
    }

    /// Removes the live records of tier `ix` with `first <= seq <= last`, calling `removed` for
    /// each.
    pub fn remove_range(
        &self,
        ix: usize,
        first: u64,
        last: u64,
        mut removed: impl FnMut(Removed),
    ) -> Result<(), StoreError> {
        {
            let mut staged = self.staged.borrow_mut();
            let tier = &mut staged.tiers[ix];
            let live = &self.inner.tiers[ix];
            let removal = tier.removal.clone();
            let (mut records, mut bytes) = (0u64, 0u64);
            let mut visit = |seq: u64, len: usize| {
                if seq >= first && seq <= last && !removal.contains(seq) {
                    let stored = record::KEY_LEN + len as u64;
                    records += 1;
                    bytes += stored;
                    removed(Removed { seq, bytes: stored });
                }
            };
            if let Some(from) = tier.head.or_else(|| live.start()) {
                scan(live, from, &mut self.buf.borrow_mut(), |frame| {
                    if frame.seq > last {
                        return false;
                    }
                    visit(frame.seq, frame.value.len());
                    true
                })?;
            }
            for (seq, value) in self.staged_frames(&tier.frames, ix) {
                visit(seq, value.len());
            }
            tier.records -= records;
            tier.bytes -= bytes;
            tier.removal.add(first, last);
        }
        self.settle(ix)
    }

    /// Removes the live records of tier `ix` with `first <= seq <= last`; returns how many and
    /// their stored bytes. When the range is exactly what the last read handed out and nothing
    /// was removed since, the counts come from that read and the head moves past it without a
    /// rescan; otherwise this is [`LogTx::remove_range`].
    pub fn remove_acknowledged(
        &self,
        ix: usize,
        first: u64,
        last: u64,
    ) -> Result<(u64, u64), StoreError> {
        let live = &self.inner.tiers[ix];
        let known = {
            let staged = self.staged.borrow();
            let tier = &staged.tiers[ix];
            live.run.filter(|run| {
                run.from <= first
                    && first <= run.first
                    && run.last == last
                    && tier.removal == live.removal
            })
        };
        let Some(run) = known else {
            let (mut records, mut bytes) = (0, 0);
            self.remove_range(ix, first, last, |removed| {
                records += 1;
                bytes += removed.bytes;
            })?;
            return Ok((records, bytes));
        };
        {
            let mut staged = self.staged.borrow_mut();
            let tier = &mut staged.tiers[ix];
            // Every record below `first` already removed: every frame before `run.next` is now.
            let prefix = tier.removal.below >= first;
            tier.records -= run.records;
            tier.bytes -= run.bytes;
            tier.removal.add(first, last);
            if prefix {
                tier.head = Some(run.next);
            }
        }
        self.settle(ix)?;
        Ok((run.records, run.bytes))
    }

    /// Removes and describes the oldest live record of tier `ix`.
    pub fn pop_oldest(&self, ix: usize) -> Result<Option<Removed>, StoreError> {
        let Some(Oldest { seq, .. }) = self.oldest(ix)? else {
            return Ok(None);
        };
        let mut result = None;
        self.remove_range(ix, seq, seq, |removed| result = Some(removed))?;
        Ok(result)
    }

    /// Sequence number and append time of the oldest live record of tier `ix`.
    pub fn peek_oldest(&self, ix: usize) -> Result<Option<(u64, u64)>, StoreError> {
        Ok(self.oldest(ix)?.map(|oldest| (oldest.seq, oldest.appended)))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn value(seq: u64, ms: u64) -> Vec<u8> {
        let mut out = Vec::new();
        // event_time_unix_ns = 2, monotonic_ns = 5.
        let event = [0x10, 0x02, 0x18, 0x05];
        record::encode(&mut out, seq, ms, &event).unwrap();
        out
    }

    fn seqs(log: &Log, ix: usize) -> Vec<u64> {
        let mut out = Vec::new();
        log.read(ix, 0, u64::MAX, |seq, value| {
            record::check(value, seq).unwrap();
            out.push(seq);
            true
        })
        .unwrap();
        out
    }

    fn append(log: &Log, ix: usize, range: std::ops::RangeInclusive<u64>) {
        log.write(|tx| {
            for seq in range {
                tx.insert(ix, seq, &value(seq, seq))?;
            }
            Ok(())
        })
        .unwrap();
    }

    fn fresh(dir: &Path) -> Log {
        let log = Log::open(dir, false).unwrap();
        assert!(log.load().is_none());
        log.write(|tx| {
            tx.put_state(&Persisted::fresh(7));
            Ok(())
        })
        .unwrap();
        log
    }

    #[test]
    fn records_survive_a_reopen_in_order_with_their_state() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let log = fresh(&path);
        append(&log, 0, 1..=5);
        append(&log, 2, 1..=3);
        log.write(|tx| {
            tx.put_kv("k", Some(b"v"));
            Ok(())
        })
        .unwrap();
        drop(log);
        let log = Log::open(&path, false).unwrap();
        let loaded = log.load().unwrap();
        assert_eq!(loaded.state.epoch, 7);
        assert_eq!(loaded.state.records.safety, 5);
        assert_eq!(loaded.state.records.debug, 3);
        assert_eq!(loaded.state.next_seq.safety, 6);
        assert_eq!(loaded.oldest.safety, Some((1, 1)));
        assert_eq!(loaded.kv, vec![("k".to_owned(), b"v".to_vec())]);
        assert_eq!(seqs(&log, 0), vec![1, 2, 3, 4, 5]);
        assert_eq!(seqs(&log, 2), vec![1, 2, 3]);
    }

    #[test]
    fn removals_out_of_order_leave_holes_that_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let log = fresh(&path);
        append(&log, 1, 1..=10);
        let mut removed = Vec::new();
        log.write(|tx| {
            tx.remove_range(1, 4, 6, |r| removed.push(r.seq))?;
            tx.remove_range(1, 1, 2, |r| removed.push(r.seq))?;
            Ok(())
        })
        .unwrap();
        assert_eq!(removed, vec![4, 5, 6, 1, 2]);
        assert_eq!(seqs(&log, 1), vec![3, 7, 8, 9, 10]);
        drop(log);
        let log = Log::open(&path, false).unwrap();
        assert_eq!(log.load().unwrap().state.records.slo, 5);
        assert_eq!(seqs(&log, 1), vec![3, 7, 8, 9, 10]);
        let popped = log.write(|tx| tx.pop_oldest(1)).unwrap().unwrap();
        assert_eq!(popped.seq, 3);
        assert_eq!(log.write(|tx| tx.peek_oldest(1)).unwrap(), Some((7, 7)));
    }

    #[test]
    fn a_failed_transaction_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let log = fresh(&path);
        append(&log, 0, 1..=2);
        let result: Result<(), _> = log.write(|tx| {
            tx.insert(0, 3, &value(3, 3))?;
            tx.remove_range(0, 1, 1, |_| {})?;
            Err(StoreError::Io("no".into()))
        });
        assert!(result.is_err());
        assert_eq!(seqs(&log, 0), vec![1, 2]);
        drop(log);
        assert_eq!(seqs(&Log::open(&path, false).unwrap(), 0), vec![1, 2]);
    }

    fn frames(range: std::ops::RangeInclusive<u64>) -> Frames {
        let mut frames = Frames::with_capacity(4096, 64);
        for seq in range {
            frames
                .push(seq, |out, lead| {
                    out.resize(out.len() + lead, 0);
                    out.extend_from_slice(&value(seq, seq));
                    Ok::<(), ()>(())
                })
                .unwrap();
        }
        frames
    }

    #[test]
    fn a_callers_frames_are_written_first_and_a_record_already_live_is_counted_not_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let log = fresh(&path);
        append(&log, 1, 1..=2);
        // 2 is live already (a commit reported failed that landed): skipped and counted.
        let mut run = frames(2..=4);
        let replaced = log
            .write_with([None, Some(&mut run), None], |tx| {
                tx.insert(1, 5, &value(5, 5))?;
                // The transaction sees the caller's frames as its own appends.
                assert_eq!(tx.peek_oldest(1)?, Some((1, 1)));
                tx.remove_range(1, 1, 3, |_| {})?;
                assert_eq!(tx.peek_oldest(1)?, Some((4, 4)));
                Ok(tx.replaced(1))
            })
            .unwrap();
        assert_eq!(replaced, (1, record::KEY_LEN + value(2, 2).len() as u64));
        let values: Vec<Vec<u8>> = run.iter().map(|(_, value)| value.to_vec()).collect();
        assert_eq!(
            values,
            (2..=4).map(|seq| value(seq, seq)).collect::<Vec<_>>()
        );
        assert_eq!(seqs(&log, 1), vec![4, 5]);
        drop(log);
        let log = Log::open(&path, false).unwrap();
        assert_eq!(seqs(&log, 1), vec![4, 5]);
        assert_eq!(log.load().unwrap().state.records.slo, 2);
    }

    #[test]
    fn a_callers_frames_with_a_number_neither_new_nor_live_are_refused_and_nothing_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let log = fresh(&path);
        append(&log, 0, 1..=3);
        log.write(|tx| tx.remove_range(0, 2, 2, |_| {})).unwrap();
        let mut run = frames(2..=4);
        let result = log.write_with([Some(&mut run), None, None], |_| Ok(()));
        assert!(result.is_err());
        assert_eq!(seqs(&log, 0), vec![1, 3]);
    }

    #[test]
    fn a_torn_tail_is_truncated_and_appends_go_on_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let log = fresh(&path);
        append(&log, 0, 1..=3);
        drop(log);
        let segment = path.join(segment_name(0, 1));
        let mut bytes = std::fs::read(&segment).unwrap();
        let full = bytes.len();
        bytes.extend_from_slice(&[40, 0, 0, 0, 0, 0, 0, 0, 1, 2]);
        std::fs::write(&segment, &bytes).unwrap();
        let log = Log::open(&path, false).unwrap();
        assert_eq!(std::fs::metadata(&segment).unwrap().len(), full as u64);
        append(&log, 0, 4..=4);
        assert_eq!(seqs(&log, 0), vec![1, 2, 3, 4]);
    }

    #[test]
    fn a_segments_blocks_are_allocated_ahead_of_its_frames_while_its_size_stays_theirs() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let log = fresh(&path);
        append(&log, 0, 1..=3);
        let segment = path.join(segment_name(0, 1));
        let frames = log.lock().tiers[0].segments[0].len;
        let meta = std::fs::metadata(&segment).unwrap();
        assert_eq!(meta.len(), frames, "the size is that of the valid frames");
        let allocated = meta.blocks() * 512;
        if in_memory(&File::open(&path).unwrap()) {
            assert!(
                allocated < SEGMENT_BYTES,
                "{allocated} bytes taken in memory"
            );
        } else {
            assert!(
                allocated >= SEGMENT_BYTES,
                "{allocated} bytes allocated for {frames} bytes of frames"
            );
        }
        // Recovery reads the same frames and appends go on after them, in the blocks ahead.
        drop(log);
        let log = Log::open(&path, false).unwrap();
        assert_eq!(std::fs::metadata(&segment).unwrap().len(), frames);
        append(&log, 0, 4..=5);
        assert_eq!(seqs(&log, 0), vec![1, 2, 3, 4, 5]);
        let frames = log.lock().tiers[0].segments[0].len;
        assert_eq!(std::fs::metadata(&segment).unwrap().len(), frames);
    }

    #[test]
    fn a_small_drained_last_segment_is_kept_for_the_next_appends() {
        // A quiet tier (an event now and then, acknowledged before the next) writes into one
        // file instead of creating, syncing into the directory and unlinking one per event.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let log = fresh(&path);
        append(&log, 0, 1..=3);
        log.write(|tx| tx.remove_range(0, 1, 3, |_| {})).unwrap();
        let segment = path.join(segment_name(0, 1));
        assert!(segment.exists());
        assert_eq!(seqs(&log, 0), Vec::<u64>::new());
        append(&log, 0, 4..=4);
        let segments = std::fs::read_dir(&path)
            .unwrap()
            .filter(|entry| {
                let name = entry.as_ref().unwrap().file_name();
                parse_segment_name(name.to_str().unwrap()).is_some()
            })
            .count();
        assert_eq!(segments, 1, "the fourth record went into the kept segment");
        assert_eq!(seqs(&log, 0), vec![4]);
        drop(log);
        let log = Log::open(&path, false).unwrap();
        assert_eq!(seqs(&log, 0), vec![4]);
        assert_eq!(log.load().unwrap().state.records.safety, 1);
    }

    #[test]
    fn frames_of_a_commit_whose_state_never_landed_are_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let log = fresh(&path);
        append(&log, 0, 1..=3);
        // Keep the state as it is before a commit that needs a new one.
        let state = [
            std::fs::read(path.join(STATE_FILES[0])).ok(),
            std::fs::read(path.join(STATE_FILES[1])).ok(),
        ];
        log.write(|tx| {
            tx.insert(0, 4, &value(4, 4))?;
            tx.remove_range(0, 1, 1, |_| {})?;
            Ok(())
        })
        .unwrap();
        drop(log);
        // The crash: the frames are on disk, the state slot was not written.
        for (name, bytes) in STATE_FILES.iter().zip(state) {
            match bytes {
                Some(bytes) => std::fs::write(path.join(name), bytes).unwrap(),
                None => {
                    let _ = std::fs::remove_file(path.join(name));
                }
            }
        }
        let log = Log::open(&path, false).unwrap();
        assert_eq!(seqs(&log, 0), vec![1, 2, 3]);
    }

    #[test]
    fn a_record_failing_its_checksum_is_reported_and_the_rest_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let log = fresh(&path);
        append(&log, 0, 1..=3);
        drop(log);
        let segment = path.join(segment_name(0, 1));
        let mut bytes = std::fs::read(&segment).unwrap();
        let frame = bytes.len() / 3;
        bytes[frame + FRAME_HEADER + record::HEADER_LEN + 3] ^= 0xff;
        std::fs::write(&segment, &bytes).unwrap();
        let log = Log::open(&path, false).unwrap();
        let loaded = log.load().unwrap();
        assert_eq!(loaded.corrupt, vec![(0, 2)]);
        assert_eq!(loaded.state.records.safety, 3);
    }

    #[test]
    fn drained_segments_are_unlinked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let log = fresh(&path);
        // Enough to roll over at least one segment.
        let pad = vec![b'p'; 60_000];
        // A 60 kB field the schema does not know (number 100), as a later revision may send.
        let mut event = vec![0xa2, 0x06];
        let mut len = pad.len();
        while len >= 0x80 {
            event.push((len as u8 & 0x7f) | 0x80);
            len >>= 7;
        }
        event.push(len as u8);
        event.extend_from_slice(&pad);
        let n = 2 * SEGMENT_BYTES / 60_000;
        for chunk in (1..=n).collect::<Vec<_>>().chunks(50) {
            log.write(|tx| {
                for &seq in chunk {
                    let mut out = Vec::new();
                    record::encode(&mut out, seq, seq, &event).unwrap();
                    tx.insert(0, seq, &out)?;
                }
                Ok(())
            })
            .unwrap();
        }
        assert!(log.lock().tiers[0].segments.len() >= 2);
        log.write(|tx| tx.remove_range(0, 1, n, |_| {})).unwrap();
        assert_eq!(log.lock().tiers[0].segments.len(), 0);
        let files = std::fs::read_dir(&path).unwrap().count();
        assert_eq!(files, 1 + 1, "two state slots and no segment");
        append(&log, 0, n + 1..=n + 2);
        drop(log);
        let log = Log::open(&path, false).unwrap();
        assert_eq!(seqs(&log, 0), vec![n + 1, n + 2]);
    }

    #[test]
    fn reading_resumes_where_the_last_read_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let log = fresh(&dir.path().join("log"));
        append(&log, 0, 1..=10);
        let mut first = Vec::new();
        log.read(0, 1, 11, |seq, _| {
            first.push(seq);
            seq < 4
        })
        .unwrap();
        assert_eq!(first, vec![1, 2, 3, 4]);
        let mut rest = Vec::new();
        log.read(0, 4, 8, |seq, _| {
            rest.push(seq);
            true
        })
        .unwrap();
        assert_eq!(rest, vec![4, 5, 6, 7]);
    }

    /// Reads `from..to` of tier `ix` as the uplink does and returns the sequence numbers.
    fn read(log: &Log, ix: usize, from: u64, to: u64) -> Vec<u64> {
        let mut out = Vec::new();
        log.read(ix, from, to, |seq, _| {
            out.push(seq);
            true
        })
        .unwrap();
        out
    }

    /// Removes `first..=last` of tier `ix` as an acknowledgement; returns the counts and the
    /// tier's records and bytes after the commit.
    fn acknowledge(log: &Log, ix: usize, first: u64, last: u64) -> ((u64, u64), (u64, u64)) {
        let removed = log
            .write(|tx| tx.remove_acknowledged(ix, first, last))
            .unwrap();
        let inner = log.lock();
        (removed, (inner.tiers[ix].records, inner.tiers[ix].bytes))
    }

    #[test]
    fn acknowledging_what_was_just_read_counts_the_same_as_a_rescan() {
        let dir = tempfile::tempdir().unwrap();
        let stored = record::KEY_LEN + value(1, 1).len() as u64;
        for (read_to, ack) in [(11, (1, 10)), (6, (1, 5)), (11, (3, 10)), (11, (1, 9))] {
            let path = dir
                .path()
                .join(format!("log-{read_to}-{}-{}", ack.0, ack.1));
            let log = fresh(&path);
            append(&log, 2, 1..=10);
            assert_eq!(read(&log, 2, 0, read_to).len() as u64, read_to - 1);
            let count = ack.1 - ack.0 + 1;
            let ((records, bytes), after) = acknowledge(&log, 2, ack.0, ack.1);
            assert_eq!((records, bytes), (count, count * stored), "ack {ack:?}");
            assert_eq!(after, (10 - count, (10 - count) * stored), "ack {ack:?}");
            let left: Vec<u64> = (1..=10).filter(|s| !(ack.0..=ack.1).contains(s)).collect();
            assert_eq!(seqs(&log, 2), left);
            drop(log);
            let log = Log::open(&path, false).unwrap();
            assert_eq!(log.load().unwrap().state.records.debug, 10 - count);
            assert_eq!(seqs(&log, 2), left);
        }
    }

    #[test]
    fn a_read_is_not_trusted_for_records_removed_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let log = fresh(&dir.path().join("log"));
        let stored = record::KEY_LEN + value(1, 1).len() as u64;
        append(&log, 1, 1..=10);
        assert_eq!(read(&log, 1, 0, 11).len(), 10);
        // Record 4 goes (a dead letter, say) after the read and before the acknowledgement.
        log.write(|tx| tx.remove_range(1, 4, 4, |_| {})).unwrap();
        let ((records, bytes), after) = acknowledge(&log, 1, 1, 10);
        assert_eq!((records, bytes), (9, 9 * stored));
        assert_eq!(after, (0, 0));
        // And within one transaction.
        append(&log, 1, 11..=20);
        assert_eq!(read(&log, 1, 11, 21).len(), 10);
        let removed = log
            .write(|tx| {
                tx.remove_range(1, 15, 16, |_| {})?;
                tx.remove_acknowledged(1, 11, 20)
            })
            .unwrap();
        assert_eq!(removed, (8, 8 * stored));
        assert!(seqs(&log, 1).is_empty());
    }

    #[test]
    fn acknowledging_the_head_moves_it_past_the_read_so_appends_after_it_are_found() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let log = fresh(&path);
        append(&log, 0, 1..=5);
        assert_eq!(read(&log, 0, 0, 6), vec![1, 2, 3, 4, 5]);
        acknowledge(&log, 0, 1, 5);
        append(&log, 0, 6..=8);
        assert_eq!(read(&log, 0, 6, 9), vec![6, 7, 8]);
        acknowledge(&log, 0, 6, 7);
        assert_eq!(seqs(&log, 0), vec![8]);
        let oldest = log.write(|tx| tx.peek_oldest(0)).unwrap();
        assert_eq!(oldest, Some((8, 8)));
        drop(log);
        let log = Log::open(&path, false).unwrap();
        assert_eq!(seqs(&log, 0), vec![8]);
    }

    /// Offsets in 0..len where a frame passing its checks starts, tried one by one.
    fn valid_frames_everywhere(window: &mut Window<'_>, len: usize) -> Vec<usize> {
        (0..len)
            .filter(|&at| window.frame(at).unwrap().is_some_and(|f| f.ok))
            .collect()
    }

    #[test]
    fn the_search_past_damage_skips_no_offset_where_a_valid_frame_starts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let log = fresh(&path);
        append(&log, 0, 1..=40);
        drop(log);
        // The real frames, as the log wrote them.
        let segment = std::fs::read(path.join(segment_name(0, 1))).unwrap();
        let mut frames = Vec::new();
        {
            let file = File::open(path.join(segment_name(0, 1))).unwrap();
            let mut window = Window::new(&file, segment.len());
            let mut at = 0;
            while let Some(frame) = window.frame(at).unwrap() {
                assert!(frame.ok);
                frames.push(segment[at..frame.end].to_vec());
                at = frame.end;
            }
        }
        assert_eq!(frames.len(), 40);
        // Damage: zeros, then bytes from a xorshift, with lone sequence-number tags and
        // plausible lengths scattered in; real frames set in both, some across the boundary of
        // the window's read chunk.
        let len = 2 * READ_CHUNK + 4096;
        let mut bytes = vec![0u8; len];
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for byte in &mut bytes[READ_CHUNK / 2..] {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            *byte = state as u8;
        }
        for at in (100..len - 64).step_by(997) {
            bytes[at] = SEQ_TAG;
            bytes[at - 20..at - 16].copy_from_slice(&30u32.to_le_bytes());
        }
        let placed = [
            5,
            1000,
            READ_CHUNK - 30,
            READ_CHUNK - 3,
            READ_CHUNK + 700,
            2 * READ_CHUNK - 45,
            2 * READ_CHUNK - 1,
            len - frames[0].len(),
        ];
        for (n, &at) in placed.iter().enumerate() {
            let frame = &frames[n * 5];
            bytes[at..at + frame.len()].copy_from_slice(frame);
        }
        let damaged = dir.path().join("damaged.seg");
        std::fs::write(&damaged, &bytes).unwrap();
        let file = File::open(&damaged).unwrap();

        let mut window = Window::new(&file, len);
        let everywhere = valid_frames_everywhere(&mut window, len);
        for at in placed {
            assert!(everywhere.contains(&at), "the frame set at {at} reads");
        }
        let mut window = Window::new(&file, len);
        let mut found = Vec::new();
        let mut candidates = 0;
        let mut from = 0;
        while let Some(at) = window.next_candidate(from).unwrap() {
            assert!(at >= from);
            candidates += 1;
            if window.frame(at).unwrap().is_some_and(|f| f.ok) {
                found.push(at);
            }
            from = at + 1;
        }
        assert_eq!(found, everywhere);
        // The filter is worth having: few offsets of the damage get the full check.
        assert!(
            candidates < len / 500,
            "{candidates} candidates in {len} bytes"
        );
    }
}
