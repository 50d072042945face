//! The seqlock and latch procedures of the probe, on plain references: no I/O, no clock, no
//! allocation. The shared-memory shells (`writer`, `reader`) and the loom and proptest models
//! all run this same code.
//!
//! Invariants:
//! - Every shared word is accessed with a Relaxed atomic operation; ordering comes from explicit
//!   `fence`s (and Release stores on the writer side). The reader issues only Relaxed loads of at
//!   most 8 bytes, the only atomic accesses Rust defines on read-only memory.
//! - Slot `n mod capacity` holds record `n`; its `seq` is `2n+1` while written and `2n+2` once
//!   whole. A reader accepts a copy only if `seq` read `2n+2` before and after it.
//! - The summary is a latch (two copies, index = `seq & 1`): a reader always finds a whole copy,
//!   even after the producer died inside an update.
//! - Autonomy and model cells may be written by any producer thread: a writer claims the cell by
//!   moving `seq` from even to odd with one compare-exchange and gives up (`SlotBusy`) rather
//!   than wait.
//! - The record path is wait-free and panic-free: no loops, no indexing that can fail.
//! - Every position the reader passes is accounted for exactly once: delivered, lost
//!   (overwritten before it was read), torn (seq inconsistent or changed during the copy), or
//!   rejected (values no loop can produce), unless the head jumped absurdly (a counted anomaly).
//!
//! - The record path judges each cycle against the relative deadline D: completion
//!   (`start + duration`) after `release + D` is a deadline miss; a gap in cycle numbers is that
//!   many skipped activations, each a deadline miss; `duration > budget` is an overrun, counted
//!   apart. So the summary always holds `skipped <= deadline_misses <= cycles + skipped`, the
//!   activations (see `layout` for the definitions).
//!
//! Writer, per record `n` (single thread):
//! 1. `slot.seq = 2n+1`; `summary.seq = 2k+1` (Release: publishes copy 1 of the last update);
//!    `fence(Release)`.
//! 2. Slot fields; summary copy 0.
//! 3. `fence(Release)`; `slot.seq = 2n+2`; `head = n+1`; `summary.seq = 2k+2`; `heartbeat`.
//! 4. `fence(Release)`; summary copy 1.
//!
//! Reader: `head`, `fence(Acquire)`; count what lies beyond `capacity` behind it as lost; per
//! slot `s1 = seq`, `fence(Acquire)`, copy, `fence(Acquire)`, `s2 = seq`; accept iff
//! `s1 == s2 == 2n+2`.

use crate::layout::{
    AUTONOMY_MODES, AutonomyCell, AutonomyMode, CALLER_FLAGS, EventCells, FLAG_DEADLINE_MISS,
    FLAG_OVERRUN, FLAG_SKIPPED, MODEL_VERSION_CAPACITY, ModelCell, Slot, SummaryCell, SummaryWords,
    pack_bytes, unpack_bytes,
};
use crate::sync::{AtomicU64, Ordering, fence};

/// A record whose duration exceeds this many periods is rejected as nonsense.
pub const MAX_DURATION_PERIODS: u64 = 1000;
/// A head advancing faster than this many records per period (plus one ring) is an anomaly.
pub const MAX_RECORDS_PER_PERIOD: u64 = 1000;
/// Attempts a reader makes on a seqlocked cell before reporting it busy (few under loom, whose
/// state space grows with every retry).
pub const READ_ATTEMPTS: u32 = if cfg!(loom) { 2 } else { 64 };

/// One control-loop cycle, as the loop reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cycle {
    /// The loop's cycle counter; a gap means activations were skipped.
    pub cycle: u64,
    /// Planned activation, CLOCK_MONOTONIC ns.
    pub release_ns: u64,
    /// Actual start, CLOCK_MONOTONIC ns.
    pub start_ns: u64,
    /// Execution time.
    pub duration_ns: u64,
    /// Caller flags (`FLAG_DEGRADED`, `FLAG_FALLBACK`); other bits are ignored.
    pub flags: u32,
}

/// One record as read back from the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Record {
    /// Position in the ring's history (0 for the producer's first record).
    pub index: u64,
    /// The loop's cycle counter.
    pub cycle: u64,
    /// Planned activation, CLOCK_MONOTONIC ns.
    pub release_ns: u64,
    /// Actual start, CLOCK_MONOTONIC ns.
    pub start_ns: u64,
    /// Execution time.
    pub duration_ns: u64,
    /// Budget the cycle was judged against.
    pub budget_ns: u64,
    /// Loop id.
    pub loop_id: u32,
    /// `FLAG_*` bits.
    pub flags: u32,
}

impl Record {
    /// Wake-up latency: actual start minus planned release (0 if the start was early).
    pub fn latency_ns(&self) -> u64 {
        self.start_ns.saturating_sub(self.release_ns)
    }

    /// Completion: start plus duration.
    pub fn completion_ns(&self) -> u64 {
        self.start_ns.saturating_add(self.duration_ns)
    }
}

/// Cumulative cycle counters, consistent with each other (one copy of the summary latch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CycleCounters {
    /// Cycles recorded.
    pub cycles: u64,
    /// Cycles whose duration exceeded the budget: execution overruns, a diagnostic (ABI 1
    /// called them misses).
    pub overruns: u64,
    /// Activations skipped (gaps in cycle numbers).
    pub skipped: u64,
    /// Longest duration.
    pub max_duration_ns: u64,
    /// Sum of durations (saturating).
    pub sum_duration_ns: u64,
    /// Activations released: `cycles + skipped`, from one latch copy.
    pub activations: u64,
    /// Activations that missed their deadline: completions after release + D, plus skipped
    /// activations (ABI 2).
    pub deadline_misses: u64,
}

/// Event counters; each is monotonic on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EventCounters {
    /// Operator interventions.
    pub interventions: u64,
    /// Safe stops.
    pub safe_stops: u64,
    /// Fallbacks to the safety controller.
    pub fallbacks: u64,
}

/// The autonomy mode and the time spent in each mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AutonomyState {
    /// Current mode.
    pub mode: AutonomyMode,
    /// When the current mode began, CLOCK_MONOTONIC ns.
    pub since_ns: u64,
    /// Nanoseconds spent in each mode before `since_ns`, indexed by `AutonomyMode as usize`.
    pub ns_in_mode: [u64; AUTONOMY_MODES],
}

impl AutonomyState {
    /// Total nanoseconds spent in `mode` up to `now_ns`, counting the current stretch.
    pub fn total_ns(&self, mode: AutonomyMode, now_ns: u64) -> u64 {
        let before = self.ns_in_mode.get(mode as usize).copied().unwrap_or(0);
        if mode == self.mode {
            before.saturating_add(now_ns.saturating_sub(self.since_ns))
        } else {
            before
        }
    }
}

/// A model version: an id hash and a version string of at most 64 bytes, stored inline.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ModelVersion {
    /// Hash identifying the model artefact.
    pub id_hash: u64,
    len: u8,
    bytes: [u8; MODEL_VERSION_CAPACITY],
}

impl ModelVersion {
    /// A model version, or `None` if `version` is longer than 64 bytes.
    pub fn new(id_hash: u64, version: &str) -> Option<ModelVersion> {
        let src = version.as_bytes();
        let mut bytes = [0u8; MODEL_VERSION_CAPACITY];
        bytes.get_mut(..src.len())?.copy_from_slice(src);
        Some(ModelVersion {
            id_hash,
            len: src.len() as u8,
            bytes,
        })
    }

    /// The version string.
    pub fn version(&self) -> &str {
        // Built only from a `&str` or from validated UTF-8.
        self.bytes
            .get(..usize::from(self.len))
            .and_then(|b| core::str::from_utf8(b).ok())
            .unwrap_or("")
    }
}

impl core::fmt::Debug for ModelVersion {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ModelVersion")
            .field("id_hash", &format_args!("{:#018x}", self.id_hash))
            .field("version", &self.version())
            .finish()
    }
}

/// A writer found a seqlocked cell claimed by another thread and did not wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{what} is being written by another thread; not waiting")]
pub struct SlotBusy {
    /// The cell: "autonomy" or "model version".
    pub what: &'static str,
}

/// What one read pass over the ring found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PollStats {
    /// Records delivered to the caller.
    pub new_records: u64,
    /// Records overwritten by the producer before they could be read.
    pub lost: u64,
    /// Slots rejected because their sequence word was inconsistent or changed during the copy.
    pub torn: u64,
    /// Records rejected for values no loop can produce (e.g. duration over 1000 periods).
    pub rejected: u64,
    /// Times the head moved absurdly far; the cursor was resynchronised without counting loss.
    pub head_jumps: u64,
}

impl PollStats {
    /// Adds `other` into `self`.
    pub fn accumulate(&mut self, other: &PollStats) {
        self.new_records = self.new_records.saturating_add(other.new_records);
        self.lost = self.lost.saturating_add(other.lost);
        self.torn = self.torn.saturating_add(other.torn);
        self.rejected = self.rejected.saturating_add(other.rejected);
        self.head_jumps = self.head_jumps.saturating_add(other.head_jumps);
    }
}

/// The head went below the reader's cursor: the ring was reset, i.e. a new producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadWentBack {
    /// Head read.
    pub head: u64,
    /// Reader cursor.
    pub cursor: u64,
}

/// References to the parts of a ring the record path touches.
#[derive(Clone, Copy)]
pub struct RingRef<'a> {
    /// Records published.
    pub head: &'a AtomicU64,
    /// End of the last cycle.
    pub heartbeat_ns: &'a AtomicU64,
    /// Cumulative counters.
    pub summary: &'a SummaryCell,
    /// The slots; length is a power of two.
    pub slots: &'a [Slot],
}

/// What the record path judges each cycle against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Judgement {
    /// Execution budget: a longer duration is an overrun.
    pub budget_ns: u64,
    /// Relative deadline D: a completion after release + D is a deadline miss.
    pub deadline_ns: u64,
}

/// Producer-side state of one ring: the next position and the running counters. Owned by the
/// single thread that records cycles; never read back from shared memory.
#[derive(Debug, Clone)]
pub struct RingWriter {
    head: u64,
    mask: u64,
    budget_ns: u64,
    deadline_ns: u64,
    loop_id: u32,
    last_cycle: Option<u64>,
    counters: CycleCounters,
    summary_seq: u64,
}

impl RingWriter {
    /// A writer for a fresh ring of `capacity` slots (a power of two), judging cycles by `judge`.
    pub fn new(capacity: u32, judge: Judgement, loop_id: u32) -> RingWriter {
        RingWriter {
            head: 0,
            mask: u64::from(capacity.max(1)) - 1,
            budget_ns: judge.budget_ns,
            deadline_ns: judge.deadline_ns,
            loop_id,
            last_cycle: None,
            counters: CycleCounters::default(),
            summary_seq: 0,
        }
    }

    /// Records published so far.
    pub fn head(&self) -> u64 {
        self.head
    }

    /// The counters as last published.
    pub fn counters(&self) -> CycleCounters {
        self.counters
    }

    /// Publishes one cycle. Wait-free: a fixed sequence of stores and fences.
    /// Returns the flags stored with the record.
    #[inline]
    pub fn record(&mut self, ring: &RingRef<'_>, c: &Cycle) -> u32 {
        let n = self.head;
        let mut flags = c.flags & CALLER_FLAGS;
        let c2 = &mut self.counters;
        if c.duration_ns > self.budget_ns {
            flags |= FLAG_OVERRUN;
            c2.overruns = c2.overruns.wrapping_add(1);
        }
        let completion = c.start_ns.saturating_add(c.duration_ns);
        if completion > c.release_ns.saturating_add(self.deadline_ns) {
            flags |= FLAG_DEADLINE_MISS;
            c2.deadline_misses = c2.deadline_misses.wrapping_add(1);
        }
        if let Some(last) = self.last_cycle
            && c.cycle > last.wrapping_add(1)
            && last != u64::MAX
        {
            let gap = c.cycle - last - 1;
            flags |= FLAG_SKIPPED;
            c2.skipped = c2.skipped.wrapping_add(gap);
            c2.activations = c2.activations.wrapping_add(gap);
            c2.deadline_misses = c2.deadline_misses.wrapping_add(gap);
        }
        self.last_cycle = Some(c.cycle);
        c2.cycles = c2.cycles.wrapping_add(1);
        c2.activations = c2.activations.wrapping_add(1);
        c2.max_duration_ns = c2.max_duration_ns.max(c.duration_ns);
        c2.sum_duration_ns = c2.sum_duration_ns.saturating_add(c.duration_ns);
        let counters = *c2;
        let k = self.summary_seq;
        let seq_writing = n.wrapping_mul(2).wrapping_add(1);
        let slot = ring.slots.get((n & self.mask) as usize);

        if let Some(slot) = slot {
            slot.seq.store(seq_writing, Ordering::Relaxed);
        }
        ring.summary.seq.store(k.wrapping_add(1), Ordering::Release);
        fence(Ordering::Release);
        if let Some(slot) = slot {
            slot.release_ns.store(c.release_ns, Ordering::Relaxed);
            slot.start_ns.store(c.start_ns, Ordering::Relaxed);
            slot.duration_ns.store(c.duration_ns, Ordering::Relaxed);
            slot.budget_ns.store(self.budget_ns, Ordering::Relaxed);
            slot.cycle.store(c.cycle, Ordering::Relaxed);
            slot.loop_id.store(self.loop_id, Ordering::Relaxed);
            slot.flags.store(flags, Ordering::Relaxed);
        }
        store_words(ring.summary, 0, &counters);
        fence(Ordering::Release);
        if let Some(slot) = slot {
            slot.seq
                .store(seq_writing.wrapping_add(1), Ordering::Relaxed);
        }
        ring.head.store(n.wrapping_add(1), Ordering::Relaxed);
        ring.summary.seq.store(k.wrapping_add(2), Ordering::Relaxed);
        ring.heartbeat_ns
            .store(c.start_ns.saturating_add(c.duration_ns), Ordering::Relaxed);
        fence(Ordering::Release);
        store_words(ring.summary, 1, &counters);

        self.head = n.wrapping_add(1);
        self.summary_seq = k.wrapping_add(2);
        flags
    }
}

/// Stores `c` into copy `i` (0 or 1) of the summary latch (`activations` is not stored).
#[inline]
fn store_words(summary: &SummaryCell, i: usize, c: &CycleCounters) {
    let (Some(w), Some(d)) = (summary.copies.get(i), summary.deadline_misses.get(i)) else {
        return;
    };
    w.cycles.store(c.cycles, Ordering::Relaxed);
    w.overruns.store(c.overruns, Ordering::Relaxed);
    w.skipped.store(c.skipped, Ordering::Relaxed);
    w.max_duration_ns
        .store(c.max_duration_ns, Ordering::Relaxed);
    w.sum_duration_ns
        .store(c.sum_duration_ns, Ordering::Relaxed);
    d.store(c.deadline_misses, Ordering::Relaxed);
}

fn load_words(w: &SummaryWords, d: &AtomicU64) -> CycleCounters {
    let cycles = w.cycles.load(Ordering::Relaxed);
    let skipped = w.skipped.load(Ordering::Relaxed);
    CycleCounters {
        cycles,
        overruns: w.overruns.load(Ordering::Relaxed),
        skipped,
        max_duration_ns: w.max_duration_ns.load(Ordering::Relaxed),
        sum_duration_ns: w.sum_duration_ns.load(Ordering::Relaxed),
        activations: cycles.wrapping_add(skipped),
        deadline_misses: d.load(Ordering::Relaxed),
    }
}

/// Reads the summary latch (one whole copy). `None` only if the writer kept changing it for
/// every attempt. In an ABI 1 file `deadline_misses` reads as zero.
pub fn read_summary(cell: &SummaryCell) -> Option<CycleCounters> {
    for _ in 0..READ_ATTEMPTS {
        let s = cell.seq.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        let i = (s & 1) as usize;
        let (Some(copy), Some(deadline)) = (cell.copies.get(i), cell.deadline_misses.get(i)) else {
            return None;
        };
        let c = load_words(copy, deadline);
        fence(Ordering::Acquire);
        if cell.seq.load(Ordering::Relaxed) == s {
            return Some(c);
        }
        spin_hint();
    }
    None
}

/// Reads the event counters.
pub fn read_events(e: &EventCells) -> EventCounters {
    let out = EventCounters {
        interventions: e.interventions.load(Ordering::Relaxed),
        safe_stops: e.safe_stops.load(Ordering::Relaxed),
        fallbacks: e.fallbacks.load(Ordering::Relaxed),
    };
    fence(Ordering::Acquire);
    out
}

/// Claims a try-acquire seqlock: `Some(s)` with `seq` now `s+1`, or `None` if another writer
/// holds it.
fn try_claim(seq: &AtomicU64) -> Option<u64> {
    let s = seq.load(Ordering::Relaxed);
    if s & 1 == 1 {
        return None;
    }
    seq.compare_exchange(s, s.wrapping_add(1), Ordering::Acquire, Ordering::Relaxed)
        .ok()?;
    fence(Ordering::Release);
    Some(s)
}

/// Publishes a model version. Any producer thread; fails rather than waits if another thread
/// is writing the cell.
pub fn write_model(cell: &ModelCell, model: &ModelVersion) -> Result<(), SlotBusy> {
    let s = try_claim(&cell.seq).ok_or(SlotBusy {
        what: "model version",
    })?;
    cell.id_hash.store(model.id_hash, Ordering::Relaxed);
    cell.len.store(u64::from(model.len), Ordering::Relaxed);
    let words: [u64; MODEL_VERSION_CAPACITY / 8] = pack_bytes(&model.bytes);
    for (cellw, w) in cell.version.iter().zip(words) {
        cellw.store(w, Ordering::Relaxed);
    }
    cell.seq.store(s.wrapping_add(2), Ordering::Release);
    Ok(())
}

/// What a reader found in a seqlocked cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CellRead<T> {
    /// A consistent value.
    Value(T),
    /// Never written.
    Empty,
    /// A writer held the cell for every attempt (or died holding it).
    Busy,
    /// The cell held a value no writer of this crate produces.
    Implausible(&'static str),
}

/// Reads the model version cell.
pub fn read_model(cell: &ModelCell) -> CellRead<ModelVersion> {
    for _ in 0..READ_ATTEMPTS {
        let s1 = cell.seq.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        if s1 == 0 {
            return CellRead::Empty;
        }
        if s1 & 1 == 1 {
            spin_hint();
            continue;
        }
        let id_hash = cell.id_hash.load(Ordering::Relaxed);
        let len = cell.len.load(Ordering::Relaxed);
        let mut words = [0u64; MODEL_VERSION_CAPACITY / 8];
        for (w, cw) in words.iter_mut().zip(cell.version.iter()) {
            *w = cw.load(Ordering::Relaxed);
        }
        fence(Ordering::Acquire);
        if cell.seq.load(Ordering::Relaxed) != s1 {
            spin_hint();
            continue;
        }
        if len > MODEL_VERSION_CAPACITY as u64 {
            return CellRead::Implausible("model version length exceeds 64 bytes");
        }
        let mut bytes = [0u8; MODEL_VERSION_CAPACITY];
        unpack_bytes(&words, &mut bytes);
        let Some(valid) = bytes.get(..len as usize) else {
            return CellRead::Implausible("model version length exceeds 64 bytes");
        };
        if core::str::from_utf8(valid).is_err() {
            return CellRead::Implausible("model version is not UTF-8");
        }
        return CellRead::Value(ModelVersion {
            id_hash,
            len: len as u8,
            bytes,
        });
    }
    CellRead::Busy
}

/// Sets a fresh autonomy cell's start: mode unknown since `start_ns`. Creation time only.
pub fn init_autonomy(cell: &AutonomyCell, start_ns: u64) {
    cell.mode
        .store(AutonomyMode::Unknown as u64, Ordering::Relaxed);
    cell.since_ns.store(start_ns, Ordering::Relaxed);
}

/// Switches the autonomy mode at `now_ns`, crediting the time since the last switch to the old
/// mode. Any producer thread; fails rather than waits if another thread is writing the cell.
pub fn write_autonomy(
    cell: &AutonomyCell,
    mode: AutonomyMode,
    now_ns: u64,
) -> Result<(), SlotBusy> {
    let s = try_claim(&cell.seq).ok_or(SlotBusy { what: "autonomy" })?;
    // Only producer threads write this cell, and the claim synchronised with the last one.
    let old = cell.mode.load(Ordering::Relaxed);
    let since = cell.since_ns.load(Ordering::Relaxed);
    if let Some(acc) = cell.ns_in_mode.get(old as usize) {
        let spent = now_ns.saturating_sub(since);
        acc.store(
            acc.load(Ordering::Relaxed).saturating_add(spent),
            Ordering::Relaxed,
        );
    }
    cell.mode.store(mode as u64, Ordering::Relaxed);
    cell.since_ns.store(now_ns.max(since), Ordering::Relaxed);
    cell.seq.store(s.wrapping_add(2), Ordering::Release);
    Ok(())
}

/// Reads the autonomy cell.
pub fn read_autonomy(cell: &AutonomyCell) -> CellRead<AutonomyState> {
    for _ in 0..READ_ATTEMPTS {
        let s1 = cell.seq.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        if s1 & 1 == 1 {
            spin_hint();
            continue;
        }
        let mode = cell.mode.load(Ordering::Relaxed);
        let since_ns = cell.since_ns.load(Ordering::Relaxed);
        let mut ns_in_mode = [0u64; AUTONOMY_MODES];
        for (o, c) in ns_in_mode.iter_mut().zip(cell.ns_in_mode.iter()) {
            *o = c.load(Ordering::Relaxed);
        }
        fence(Ordering::Acquire);
        if cell.seq.load(Ordering::Relaxed) != s1 {
            spin_hint();
            continue;
        }
        let Some(mode) = AutonomyMode::from_u64(mode) else {
            return CellRead::Implausible("autonomy mode is not a known value");
        };
        return CellRead::Value(AutonomyState {
            mode,
            since_ns,
            ns_in_mode,
        });
    }
    CellRead::Busy
}

/// The outcome of reading one slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotRead {
    /// The whole record.
    Whole(Record),
    /// The producer had already overwritten it with a later record.
    Overwritten,
    /// The sequence word was odd, behind, or changed during the copy.
    Torn,
}

/// Reads record `n` from `slot` (the slot at `n mod capacity`).
#[inline]
pub fn read_slot(slot: &Slot, n: u64) -> SlotRead {
    let expected = n.wrapping_mul(2).wrapping_add(2);
    let s1 = slot.seq.load(Ordering::Relaxed);
    fence(Ordering::Acquire);
    if s1 != expected {
        // Anything past `2n+3` belongs to a later lap of this slot.
        return if s1 > expected.wrapping_add(1) {
            SlotRead::Overwritten
        } else {
            SlotRead::Torn
        };
    }
    let r = Record {
        index: n,
        release_ns: slot.release_ns.load(Ordering::Relaxed),
        start_ns: slot.start_ns.load(Ordering::Relaxed),
        duration_ns: slot.duration_ns.load(Ordering::Relaxed),
        budget_ns: slot.budget_ns.load(Ordering::Relaxed),
        cycle: slot.cycle.load(Ordering::Relaxed),
        loop_id: slot.loop_id.load(Ordering::Relaxed),
        flags: slot.flags.load(Ordering::Relaxed),
    };
    fence(Ordering::Acquire);
    if slot.seq.load(Ordering::Relaxed) == s1 {
        SlotRead::Whole(r)
    } else {
        SlotRead::Torn
    }
}

/// Reader-side state of one ring: the cursor and what is known about the producer's pace.
/// Holds no references; every pass gets the ring and the time as arguments.
#[derive(Debug, Clone)]
pub struct RingReader {
    cursor: u64,
    mask: u64,
    capacity: u64,
    period_ns: u64,
    start_ns: u64,
    last_poll_ns: Option<u64>,
}

impl RingReader {
    /// A reader of a ring of `capacity` slots (a power of two) whose producer started at
    /// `start_ns` with this nominal period (non-zero), positioned at `cursor`.
    pub fn new(capacity: u32, period_ns: u64, start_ns: u64, cursor: u64) -> RingReader {
        RingReader {
            cursor,
            mask: u64::from(capacity.max(1)) - 1,
            capacity: u64::from(capacity.max(1)),
            period_ns: period_ns.max(1),
            start_ns,
            last_poll_ns: None,
        }
    }

    /// Next position to read.
    pub fn cursor(&self) -> u64 {
        self.cursor
    }

    /// Reads every record published since the last pass, oldest first, handing each whole and
    /// plausible one to `sink`. `now_ns` bounds how far the head may plausibly have moved.
    pub fn poll<F: FnMut(&Record)>(
        &mut self,
        ring: &RingRef<'_>,
        now_ns: u64,
        sink: &mut F,
    ) -> Result<PollStats, HeadWentBack> {
        let head = ring.head.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        let mut stats = PollStats::default();
        if head < self.cursor {
            return Err(HeadWentBack {
                head,
                cursor: self.cursor,
            });
        }
        let since = self.last_poll_ns.unwrap_or(self.start_ns);
        let periods = now_ns.saturating_sub(since) / self.period_ns;
        let bound = periods
            .saturating_add(1)
            .saturating_mul(MAX_RECORDS_PER_PERIOD)
            .saturating_add(self.capacity);
        self.last_poll_ns = Some(now_ns);
        let advance = head - self.cursor;
        if advance > bound {
            stats.head_jumps = 1;
            self.cursor = head - self.capacity;
        } else if advance > self.capacity {
            stats.lost = advance - self.capacity;
            self.cursor = head - self.capacity;
        }
        let max_duration = self.period_ns.saturating_mul(MAX_DURATION_PERIODS);
        while self.cursor < head {
            let n = self.cursor;
            self.cursor += 1;
            let Some(slot) = ring.slots.get((n & self.mask) as usize) else {
                stats.torn += 1;
                continue;
            };
            match read_slot(slot, n) {
                SlotRead::Whole(r) if r.duration_ns > max_duration => stats.rejected += 1,
                SlotRead::Whole(r) => {
                    stats.new_records += 1;
                    sink(&r);
                }
                SlotRead::Overwritten => stats.lost += 1,
                SlotRead::Torn => stats.torn += 1,
            }
        }
        Ok(stats)
    }
}

#[inline]
fn spin_hint() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    core::hint::spin_loop();
}

/// The protocol's view of a heap ring of the unit-test and loom models (here, not in `layout`,
/// so that `layout` never names `protocol`).
#[cfg(test)]
impl crate::layout::zeroed::Ring {
    pub(crate) fn ring_ref(&self) -> RingRef<'_> {
        RingRef {
            head: &self.head,
            heartbeat_ns: &self.heartbeat_ns,
            summary: &self.summary,
            slots: &self.slots,
        }
    }
}

#[cfg(test)]
#[cfg(not(loom))]
mod tests;

#[cfg(test)]
#[cfg(loom)]
mod loom_tests;
