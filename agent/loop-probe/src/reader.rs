//! The agent's side: maps a probe file read-only, reads new records from a cursor, reads the
//! header, and tells whether the producer is alive, stalled, dead or restarted.
//!
//! Invariants:
//! - The mapping is `PROT_READ, MAP_SHARED` (`r--s` in `/proc/<pid>/maps`): the agent cannot
//!   write anything the loop could read.
//! - The header is validated from a `pread` copy before anything is mapped: magic, ABI version
//!   (1 or 2), header and slot size, capacity (power of two, in range), period and budget
//!   (non-zero), the relative deadline (ABI 2: non-zero, at most 1000 periods), and a file at
//!   least as long as the ring. Identity fields are taken from that copy and never
//!   re-read for indexing, so a producer scribbling over its header cannot move our reads.
//! - Every read pass first `fstat`s the mapped fd and refuses to touch the mapping if the file
//!   became shorter than mapped. Residual race: a file truncated between that `fstat` and the
//!   loads still raises SIGBUS. Only the file's owner or root can truncate it (mode 0640), and
//!   the producer never does; closing the race fully would need a process-wide SIGBUS handler,
//!   which a library must not install.
//! - Liveness uses a second fd (a separate open file description on the same inode) for the
//!   `flock(LOCK_SH | LOCK_NB)` probe, released at once.
//! - After [`ProbeReader::open`], no method allocates: records go to a caller's closure, values
//!   are returned by copy, the path is kept as a C string for `stat`.
//! - An ABI 1 file (a producer from before deadlines) is read with [`DeadlineSemantics::Legacy`]:
//!   cycles, skipped and overruns are exact and activations are `cycles + skipped`, but
//!   completions were never judged against a deadline, so [`Summary::deadline_misses`] is `None`
//!   and [`ProbeInfo::deadline_ns`] is `None`: never a value made up from the overruns.
//! - A summary names the record its counters end with ([`Summary::last_record`]): the summary
//!   is read first, then that record's slot, which the producer wrote before the summary; a
//!   slot lapped or being written since leaves it unknown for that read, never another record.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use memmap2::{MmapOptions, MmapRaw};

use crate::layout::{
    ABI_VERSION, HEADER_SIZE, Header, LOOP_NAME_CAPACITY, MAGIC, MAX_CAPACITY, MIN_ABI_VERSION,
    MIN_CAPACITY, SLOT_SIZE, Slot, file_size,
};
use crate::protocol::{
    AutonomyState, CellRead, CycleCounters, EventCounters, MAX_DURATION_PERIODS, ModelVersion,
    PollStats, Record, RingReader, RingRef, SlotRead, read_autonomy, read_events, read_model,
    read_slot, read_summary,
};
use crate::sync::Ordering;
use crate::writer::flock;

/// A heartbeat older than this many periods means the producer is stalled.
pub const STALL_PERIODS: u64 = 3;
/// Attempts at opening a file that keeps being replaced while we open it.
const OPEN_ATTEMPTS: u32 = 3;

/// Opening a probe file failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// A filesystem or mapping call failed (e.g. the file does not exist).
    #[error("probe {path}: {op} failed: {source}")]
    Io {
        /// The call that failed.
        op: &'static str,
        /// The probe path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The file is shorter than its header or its ring.
    #[error("probe {path} is {len} bytes; at least {needed} expected")]
    TooSmall {
        /// The probe path.
        path: PathBuf,
        /// Its length.
        len: u64,
        /// The length the header requires.
        needed: u64,
    },
    /// The first word is not `EWLPROBE`: not a probe file.
    #[error("probe {path}: bad magic {found:#018x}; not a probe file")]
    BadMagic {
        /// The probe path.
        path: PathBuf,
        /// The word found.
        found: u64,
    },
    /// The file uses a layout version this reader does not know.
    #[error("probe {path}: ABI version {found}, this reader supports 1 to {supported}")]
    UnsupportedAbi {
        /// The probe path.
        path: PathBuf,
        /// Version in the file.
        found: u32,
        /// Newest version this crate reads (it reads every version from 1).
        supported: u32,
    },
    /// A header field is out of range.
    #[error("probe {path}: header field `{field}` has invalid value {value}")]
    InvalidHeader {
        /// The probe path.
        path: PathBuf,
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
    },
    /// The file at the path was replaced every time we tried to open it.
    #[error("probe {path} was replaced while being opened, {attempts} times")]
    ReplacedDuringOpen {
        /// The probe path.
        path: PathBuf,
        /// Attempts made.
        attempts: u32,
    },
}

/// Why the reader believes a new producer took over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartReason {
    /// The path now names a different file (a new producer renamed its file into place).
    NewInode,
    /// The mapped file's epoch changed under us.
    NewEpoch {
        /// The epoch now in the file.
        epoch: u64,
    },
    /// The head went below our cursor.
    HeadWentBack {
        /// Head read.
        head: u64,
        /// Our cursor.
        cursor: u64,
    },
}

/// A read pass failed; the mapping was not touched unless the error says otherwise.
#[derive(Debug, thiserror::Error)]
pub enum PollError {
    /// The file is now shorter than the mapping; reading would fault.
    #[error("probe file shrank to {actual} bytes while {expected} are mapped")]
    FileShrunk {
        /// Bytes mapped.
        expected: u64,
        /// Current length.
        actual: u64,
    },
    /// A new producer took over; call [`ProbeReader::reopen`].
    #[error("probe producer restarted: {0:?}")]
    ProducerRestarted(RestartReason),
    /// A syscall of the liveness or size check failed.
    #[error("probe {op} failed: {source}")]
    Io {
        /// The call.
        op: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A seqlocked cell stayed claimed by a writer for every attempt (or its writer died
    /// holding it).
    #[error("probe {what} is being written; no consistent copy after retries")]
    Busy {
        /// The cell.
        what: &'static str,
    },
    /// The producer wrote a value no correct producer writes.
    #[error("probe holds an implausible value: {what}")]
    Implausible {
        /// What was wrong.
        what: &'static str,
    },
}

/// What a probe's deadline counters mean, by the ABI its producer writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeadlineSemantics {
    /// ABI 2: a deadline miss is a completion after release + D, or a skipped activation.
    Completion,
    /// ABI 1: the producer predates deadlines. Activations, skipped and overruns are exact;
    /// deadline misses were never measured.
    Legacy,
}

/// The producer's identity, from the header at open time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeInfo {
    /// Loop id.
    pub loop_id: u32,
    loop_name: [u8; LOOP_NAME_CAPACITY],
    /// Nominal period (non-zero).
    pub period_ns: u64,
    /// Per-cycle budget (non-zero).
    pub budget_ns: u64,
    /// Relative deadline D (non-zero); `None` for an ABI 1 producer, which declares none.
    pub deadline_ns: Option<u64>,
    /// Layout version of the file (1 or 2).
    pub abi_version: u32,
    /// Ring slots.
    pub capacity: u32,
    /// Producer epoch.
    pub epoch: u64,
    /// Kernel boot id of the producer's boot.
    pub boot_id: [u8; 16],
    /// Producer pid.
    pub pid: u32,
    /// Producer start, CLOCK_MONOTONIC ns.
    pub start_ns: u64,
}

impl ProbeInfo {
    /// What the deadline counters of this producer mean.
    pub fn semantics(&self) -> DeadlineSemantics {
        if self.deadline_ns.is_some() {
            DeadlineSemantics::Completion
        } else {
            DeadlineSemantics::Legacy
        }
    }

    /// The loop name (up to the first NUL; invalid UTF-8 gives "").
    pub fn loop_name(&self) -> &str {
        let end = self
            .loop_name
            .iter()
            .position(|b| *b == 0)
            .unwrap_or(LOOP_NAME_CAPACITY);
        self.loop_name
            .get(..end)
            .and_then(|b| std::str::from_utf8(b).ok())
            .unwrap_or("")
    }
}

/// The last record the summary's counters include.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LastRecord {
    /// The loop's cycle number.
    pub cycle: u64,
    /// Its planned release, CLOCK_MONOTONIC ns.
    pub release_ns: u64,
}

/// Cumulative counters from the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// Cycle counters, consistent with each other (`activations` is `cycles + skipped`). With
    /// [`DeadlineSemantics::Legacy`], `deadline_misses` is 0 and means nothing: use
    /// [`Summary::deadline_misses`].
    pub cycles: CycleCounters,
    /// Event counters.
    pub events: EventCounters,
    /// Records published.
    pub head: u64,
    /// End of the last recorded cycle, CLOCK_MONOTONIC ns.
    pub heartbeat_ns: u64,
    /// What the deadline counters mean.
    pub semantics: DeadlineSemantics,
    /// The record the counters end with (record `cycles - 1`), read from the ring: `None` before
    /// the first record, or when the ring no longer (or not yet) holds it whole.
    pub last_record: Option<LastRecord>,
}

impl Default for Summary {
    fn default() -> Self {
        Summary {
            cycles: CycleCounters::default(),
            events: EventCounters::default(),
            head: 0,
            heartbeat_ns: 0,
            semantics: DeadlineSemantics::Completion,
            last_record: None,
        }
    }
}

impl Summary {
    /// Activations that missed their deadline (late completions plus skipped), or `None` when
    /// the producer (ABI 1) never measured them.
    pub fn deadline_misses(&self) -> Option<u64> {
        match self.semantics {
            DeadlineSemantics::Completion => Some(self.cycles.deadline_misses),
            DeadlineSemantics::Legacy => None,
        }
    }
}

/// Whether the producer is still there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// It holds its lock and its heartbeat is fresh.
    Alive,
    /// It holds its lock but has not recorded a cycle for more than 3 periods.
    Stalled {
        /// Age of the last heartbeat.
        heartbeat_age_ns: u64,
    },
    /// Its lock is gone: the process exited or was killed.
    Dead,
    /// A new producer took over; call [`ProbeReader::reopen`].
    Restarted(RestartReason),
}

/// The agent's read-only view of one probe file.
pub struct ProbeReader {
    path: PathBuf,
    c_path: CString,
    file: File,
    lock_file: File,
    map: MmapRaw,
    map_len: u64,
    dev: u64,
    ino: u64,
    info: ProbeInfo,
    ring: RingReader,
    totals: PollStats,
}

impl std::fmt::Debug for ProbeReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeReader")
            .field("path", &self.path)
            .field("info", &self.info)
            .field("cursor", &self.ring.cursor())
            .finish()
    }
}

impl ProbeReader {
    /// Opens and validates the probe file at `path`, positioned at the oldest record still in
    /// the ring.
    pub fn open(path: impl AsRef<Path>) -> Result<ProbeReader, OpenError> {
        let path = path.as_ref();
        for _ in 0..OPEN_ATTEMPTS {
            if let Some(r) = Self::try_open(path)? {
                return Ok(r);
            }
        }
        Err(OpenError::ReplacedDuringOpen {
            path: path.to_path_buf(),
            attempts: OPEN_ATTEMPTS,
        })
    }

    /// `None` if the path was replaced between our two opens.
    fn try_open(path: &Path) -> Result<Option<ProbeReader>, OpenError> {
        let io_err = |op, source| OpenError::Io {
            op,
            path: path.to_path_buf(),
            source,
        };
        let c_path = CString::new(path.as_os_str().as_bytes())
            .map_err(|e| io_err("open", io::Error::new(io::ErrorKind::InvalidInput, e)))?;
        let file = File::open(path).map_err(|e| io_err("open", e))?;
        let st = fstat(&file).map_err(|e| io_err("fstat", e))?;
        let len = st.st_size as u64;
        let mut raw = [0u8; HEADER_SIZE];
        if len < HEADER_SIZE as u64 {
            return Err(OpenError::TooSmall {
                path: path.to_path_buf(),
                len,
                needed: HEADER_SIZE as u64,
            });
        }
        file.read_exact_at(&mut raw, 0)
            .map_err(|e| io_err("pread", e))?;
        let info = parse_header(path, &raw)?;
        let needed = file_size(info.capacity).unwrap_or(usize::MAX) as u64;
        if len < needed {
            return Err(OpenError::TooSmall {
                path: path.to_path_buf(),
                len,
                needed,
            });
        }
        let lock_file = File::open(path).map_err(|e| io_err("open", e))?;
        let st2 = fstat(&lock_file).map_err(|e| io_err("fstat", e))?;
        if (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino) {
            return Ok(None);
        }
        let map = MmapOptions::new()
            .len(needed as usize)
            .map_raw_read_only(&file)
            .map_err(|e| io_err("mmap", e))?;
        let mut r = ProbeReader {
            path: path.to_path_buf(),
            c_path,
            file,
            lock_file,
            map,
            map_len: needed,
            dev: st.st_dev,
            ino: st.st_ino,
            info,
            ring: RingReader::new(info.capacity, info.period_ns, info.start_ns, 0),
            totals: PollStats::default(),
        };
        r.guard().map_err(|_| OpenError::TooSmall {
            path: path.to_path_buf(),
            len: 0,
            needed,
        })?;
        let head = r.header().head.load(Ordering::Relaxed);
        r.ring = RingReader::new(
            info.capacity,
            info.period_ns,
            info.start_ns,
            head.saturating_sub(u64::from(info.capacity)),
        );
        Ok(Some(r))
    }

    /// Opens the file now at the same path (after a restart), starting from its oldest record.
    pub fn reopen(&mut self) -> Result<(), OpenError> {
        *self = ProbeReader::open(&self.path)?;
        Ok(())
    }

    /// The producer's identity as read at open.
    pub fn info(&self) -> &ProbeInfo {
        &self.info
    }

    /// The probe path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What every poll since open found, added up.
    pub fn totals(&self) -> &PollStats {
        &self.totals
    }

    /// Hands every record published since the last poll to `sink`, oldest first.
    /// `now_ns` (CLOCK_MONOTONIC) bounds how far the head may plausibly have moved.
    pub fn poll<F: FnMut(&Record)>(
        &mut self,
        now_ns: u64,
        sink: &mut F,
    ) -> Result<PollStats, PollError> {
        self.guard()?;
        self.poll_unguarded(now_ns, sink)
    }

    fn poll_unguarded<F: FnMut(&Record)>(
        &mut self,
        now_ns: u64,
        sink: &mut F,
    ) -> Result<PollStats, PollError> {
        self.check_epoch()?;
        let h = self.header();
        let ring = RingRef {
            head: &h.head,
            heartbeat_ns: &h.heartbeat_ns,
            summary: &h.summary,
            slots: self.slots(),
        };
        let mut ring_reader = self.ring.clone();
        let res = ring_reader.poll(&ring, now_ns, sink);
        self.ring = ring_reader;
        match res {
            Ok(stats) => {
                self.totals.accumulate(&stats);
                Ok(stats)
            }
            Err(back) => Err(PollError::ProducerRestarted(RestartReason::HeadWentBack {
                head: back.head,
                cursor: back.cursor,
            })),
        }
    }

    /// The cumulative counters.
    pub fn summary(&self) -> Result<Summary, PollError> {
        self.guard()?;
        self.summary_unguarded()
    }

    fn summary_unguarded(&self) -> Result<Summary, PollError> {
        let h = self.header();
        let mut cycles = read_summary(&h.summary).ok_or(PollError::Busy { what: "summary" })?;
        let semantics = self.info.semantics();
        let implausible = |what| Err(PollError::Implausible { what });
        if cycles.overruns > cycles.cycles {
            return implausible("more overruns than cycles");
        }
        if cycles.max_duration_ns > cycles.sum_duration_ns {
            return implausible("longest cycle exceeds the sum of all cycles");
        }
        match semantics {
            DeadlineSemantics::Completion => {
                if cycles.deadline_misses > cycles.activations {
                    return implausible("more deadline misses than activations");
                }
                if cycles.deadline_misses < cycles.skipped {
                    return implausible("fewer deadline misses than skipped activations");
                }
            }
            // Reserved (zero) in ABI 1: nothing is invented.
            DeadlineSemantics::Legacy => cycles.deadline_misses = 0,
        }
        // The record the counters end with, whole (else unknown this time: the producer has
        // lapped it, or is writing it).
        let last_record = cycles.cycles.checked_sub(1).and_then(|n| {
            let slot = self
                .slots()
                .get((n & u64::from(self.info.capacity - 1)) as usize)?;
            match read_slot(slot, n) {
                SlotRead::Whole(r) => Some(LastRecord {
                    cycle: r.cycle,
                    release_ns: r.release_ns,
                }),
                SlotRead::Overwritten | SlotRead::Torn => None,
            }
        });
        let events = read_events(&h.events);
        let head = h.head.load(Ordering::Relaxed);
        let heartbeat_ns = h.heartbeat_ns.load(Ordering::Relaxed);
        Ok(Summary {
            cycles,
            events,
            head,
            heartbeat_ns,
            semantics,
            last_record,
        })
    }

    /// The model version, or `None` if the producer never set one.
    pub fn model_version(&self) -> Result<Option<ModelVersion>, PollError> {
        self.guard()?;
        self.model_version_unguarded()
    }

    fn model_version_unguarded(&self) -> Result<Option<ModelVersion>, PollError> {
        match read_model(&self.header().model) {
            CellRead::Value(m) => Ok(Some(m)),
            CellRead::Empty => Ok(None),
            CellRead::Busy => Err(PollError::Busy {
                what: "model version",
            }),
            CellRead::Implausible(what) => Err(PollError::Implausible { what }),
        }
    }

    /// The autonomy mode and time per mode.
    pub fn autonomy(&self) -> Result<AutonomyState, PollError> {
        self.guard()?;
        self.autonomy_unguarded()
    }

    fn autonomy_unguarded(&self) -> Result<AutonomyState, PollError> {
        match read_autonomy(&self.header().autonomy) {
            CellRead::Value(a) => Ok(a),
            CellRead::Empty | CellRead::Busy => Err(PollError::Busy { what: "autonomy" }),
            CellRead::Implausible(what) => Err(PollError::Implausible { what }),
        }
    }

    /// Starts a read pass: one `fstat` shrink check covering the reads made through the
    /// returned [`ReadPass`], instead of one per call. For a poller that reads the model slot,
    /// the autonomy cell, the new records and the summary together (four `fstat`s become one).
    pub fn pass(&mut self) -> Result<ReadPass<'_>, PollError> {
        self.guard()?;
        Ok(ReadPass { reader: self })
    }

    /// Whether the producer is alive, stalled (heartbeat older than 3 periods at `now_ns`),
    /// dead (its lock is gone) or replaced. Three syscalls: `fstat`, `stat`, `flock`.
    pub fn liveness(&self, now_ns: u64) -> Result<Liveness, PollError> {
        self.liveness_checking_path(now_ns, true)
    }

    /// As [`ProbeReader::liveness`], but the path is examined (`stat`) only when the producer's
    /// lock is gone: two syscalls while the producer lives. What this cannot see is a new file at
    /// the path while the old producer still holds its lock; a poller calls
    /// [`ProbeReader::liveness`] on a timer as well.
    pub fn liveness_while_locked(&self, now_ns: u64) -> Result<Liveness, PollError> {
        self.liveness_checking_path(now_ns, false)
    }

    fn liveness_checking_path(&self, now_ns: u64, always: bool) -> Result<Liveness, PollError> {
        self.guard()?;
        let replaced = || match stat_path(&self.c_path) {
            Ok(st) => Ok((st.st_dev, st.st_ino) != (self.dev, self.ino)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(source) => Err(PollError::Io { op: "stat", source }),
        };
        if always && replaced()? {
            return Ok(Liveness::Restarted(RestartReason::NewInode));
        }
        if let Err(PollError::ProducerRestarted(r)) = self.check_epoch() {
            return Ok(Liveness::Restarted(r));
        }
        let h = self.header();
        let head = h.head.load(Ordering::Relaxed);
        if head < self.ring.cursor() {
            return Ok(Liveness::Restarted(RestartReason::HeadWentBack {
                head,
                cursor: self.ring.cursor(),
            }));
        }
        match flock(&self.lock_file, libc::LOCK_SH | libc::LOCK_NB) {
            Ok(()) => {
                let _ = flock(&self.lock_file, libc::LOCK_UN);
                if !always && replaced()? {
                    return Ok(Liveness::Restarted(RestartReason::NewInode));
                }
                return Ok(Liveness::Dead);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(source) => {
                return Err(PollError::Io {
                    op: "flock",
                    source,
                });
            }
        }
        let heartbeat = h.heartbeat_ns.load(Ordering::Relaxed);
        let age = now_ns.saturating_sub(heartbeat);
        if age > self.info.period_ns.saturating_mul(STALL_PERIODS) {
            return Ok(Liveness::Stalled {
                heartbeat_age_ns: age,
            });
        }
        Ok(Liveness::Alive)
    }

    fn check_epoch(&self) -> Result<(), PollError> {
        let epoch = self.header().epoch.load(Ordering::Relaxed);
        if epoch == self.info.epoch {
            Ok(())
        } else {
            Err(PollError::ProducerRestarted(RestartReason::NewEpoch {
                epoch,
            }))
        }
    }

    /// Refuses to touch the mapping if the file is now shorter than it.
    fn guard(&self) -> Result<(), PollError> {
        let st = fstat(&self.file).map_err(|source| PollError::Io {
            op: "fstat",
            source,
        })?;
        let actual = st.st_size as u64;
        if actual < self.map_len {
            return Err(PollError::FileShrunk {
                expected: self.map_len,
                actual,
            });
        }
        Ok(())
    }

    fn header(&self) -> &Header {
        // SAFETY: the mapping is at least HEADER_SIZE bytes, page-aligned and lives as long as
        // `self`; `Header` is atomics only, so any bytes are valid. It is mapped read-only, and
        // this crate's reader only issues Relaxed loads of at most 8 bytes, which Rust defines
        // on read-only memory. Callers run `guard()` first so the pages are backed.
        unsafe { &*(self.map.as_ptr() as *const Header) }
    }

    fn slots(&self) -> &[Slot] {
        // SAFETY: the mapping is HEADER_SIZE + capacity * SLOT_SIZE bytes (validated at open
        // from our own copy of the header), the slot area is page-aligned, and `Slot` is 64
        // bytes of atomics read only with Relaxed loads, as for `header()`.
        unsafe {
            std::slice::from_raw_parts(
                self.map.as_ptr().add(HEADER_SIZE) as *const Slot,
                self.info.capacity as usize,
            )
        }
    }
}

/// A read pass begun by [`ProbeReader::pass`]: the same reads as the reader's own methods, after
/// one shrink check for all of them. Keep a pass short (one poll): the file is not re-checked
/// while it lives, so the window between the check and the loads is the pass's length.
pub struct ReadPass<'r> {
    reader: &'r mut ProbeReader,
}

impl ReadPass<'_> {
    /// As [`ProbeReader::poll`].
    pub fn poll<F: FnMut(&Record)>(
        &mut self,
        now_ns: u64,
        sink: &mut F,
    ) -> Result<PollStats, PollError> {
        self.reader.poll_unguarded(now_ns, sink)
    }

    /// As [`ProbeReader::summary`].
    pub fn summary(&self) -> Result<Summary, PollError> {
        self.reader.summary_unguarded()
    }

    /// As [`ProbeReader::model_version`].
    pub fn model_version(&self) -> Result<Option<ModelVersion>, PollError> {
        self.reader.model_version_unguarded()
    }

    /// As [`ProbeReader::autonomy`].
    pub fn autonomy(&self) -> Result<AutonomyState, PollError> {
        self.reader.autonomy_unguarded()
    }
}

fn word<const N: usize>(raw: &[u8], at: usize) -> Option<[u8; N]> {
    raw.get(at..at + N)?.try_into().ok()
}

fn u64_at(raw: &[u8], at: usize) -> u64 {
    word::<8>(raw, at).map_or(0, u64::from_ne_bytes)
}

fn u32_at(raw: &[u8], at: usize) -> u32 {
    word::<4>(raw, at).map_or(0, u32::from_ne_bytes)
}

/// Validates a header copy; offsets as in the `layout` table.
fn parse_header(path: &Path, raw: &[u8]) -> Result<ProbeInfo, OpenError> {
    let p = || path.to_path_buf();
    let invalid = |field, value| OpenError::InvalidHeader {
        path: p(),
        field,
        value,
    };
    let magic = u64_at(raw, 0);
    if magic != MAGIC {
        return Err(OpenError::BadMagic {
            path: p(),
            found: magic,
        });
    }
    let abi = u32_at(raw, 8);
    if !(MIN_ABI_VERSION..=ABI_VERSION).contains(&abi) {
        return Err(OpenError::UnsupportedAbi {
            path: p(),
            found: abi,
            supported: ABI_VERSION,
        });
    }
    let header_size = u32_at(raw, 12);
    if header_size as usize != HEADER_SIZE {
        return Err(invalid("header_size", u64::from(header_size)));
    }
    let slot_size = u32_at(raw, 16);
    if slot_size as usize != SLOT_SIZE {
        return Err(invalid("slot_size", u64::from(slot_size)));
    }
    let capacity = u32_at(raw, 20);
    if !capacity.is_power_of_two() || !(MIN_CAPACITY..=MAX_CAPACITY).contains(&capacity) {
        return Err(invalid("capacity", u64::from(capacity)));
    }
    let period_ns = u64_at(raw, 32);
    if period_ns == 0 {
        return Err(invalid("period_ns", 0));
    }
    let budget_ns = u64_at(raw, 40);
    if budget_ns == 0 {
        return Err(invalid("budget_ns", 0));
    }
    let epoch = u64_at(raw, 48);
    if epoch == 0 {
        return Err(invalid("epoch", 0));
    }
    let deadline_ns = if abi >= 2 {
        let d = u64_at(raw, 112);
        if d == 0 || d > period_ns.saturating_mul(MAX_DURATION_PERIODS) {
            return Err(invalid("deadline_ns", d));
        }
        Some(d)
    } else {
        None
    };
    let mut boot_id = [0u8; 16];
    boot_id.copy_from_slice(raw.get(64..80).unwrap_or(&[0; 16]));
    let mut loop_name = [0u8; LOOP_NAME_CAPACITY];
    loop_name.copy_from_slice(raw.get(80..112).unwrap_or(&[0; LOOP_NAME_CAPACITY]));
    Ok(ProbeInfo {
        loop_id: u32_at(raw, 24),
        loop_name,
        period_ns,
        budget_ns,
        deadline_ns,
        abi_version: abi,
        capacity,
        epoch,
        boot_id,
        pid: u32_at(raw, 28),
        start_ns: u64_at(raw, 56),
    })
}

fn fstat(file: &File) -> io::Result<libc::stat> {
    // SAFETY: an all-zero `stat` is a valid value of this plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes into `st`, which is valid and writable.
    let rc = unsafe { libc::fstat(file.as_raw_fd(), &mut st) };
    if rc == 0 {
        Ok(st)
    } else {
        Err(io::Error::last_os_error())
    }
}

fn stat_path(path: &CString) -> io::Result<libc::stat> {
    // SAFETY: an all-zero `stat` is a valid value of this plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated; stat writes into `st`, which is valid and writable.
    let rc = unsafe { libc::stat(path.as_ptr(), &mut st) };
    if rc == 0 {
        Ok(st)
    } else {
        Err(io::Error::last_os_error())
    }
}
