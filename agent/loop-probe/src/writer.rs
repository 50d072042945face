//! The producer's side: creates the probe file and records cycles into it.
//!
//! Invariants:
//! - All I/O happens in [`ProbeWriter::create`]: the file is created under a temporary name in
//!   the target directory, sized with `fallocate`, mapped `MAP_SHARED | MAP_POPULATE`, locked
//!   into RAM, prefaulted by writing every page, and only then renamed over `path`. A reader
//!   that can open `path` therefore always finds a whole header.
//! - The producer holds `flock(LOCK_EX)` on the file for its whole life, through an fd it never
//!   closes before the mapping; the agent's `LOCK_SH | LOCK_NB` probe succeeding means it died.
//! - The file is created mode 0640 and never shrunk.
//! - The header carries the relative deadline in effect, never 0: a config's 0 is written as the
//!   period. The record path judges every cycle against it and the budget.
//! - [`ProbeWriter::record`] makes no syscalls, takes no locks, never allocates and never waits;
//!   it is the only method that needs `&mut`, so one thread records.
//! - [`ProbeHandle`] methods may be called from any producer thread; the seqlocked ones return
//!   [`SlotBusy`] instead of waiting when two threads collide.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::{MmapOptions, MmapRaw};

use crate::clock::monotonic_ns;
use crate::layout::{
    ABI_VERSION, AutonomyMode, HEADER_SIZE, Header, LOOP_NAME_CAPACITY, MAGIC, MAX_CAPACITY,
    MIN_CAPACITY, SLOT_SIZE, Slot, file_size, pack_bytes, recommended_capacity,
};
use crate::protocol::{
    Cycle, Judgement, MAX_DURATION_PERIODS, ModelVersion, RingRef, RingWriter, SlotBusy,
    init_autonomy, write_autonomy, write_model,
};
use crate::sync::Ordering;

/// Mode of the probe file: the producer's user writes, its group (the agent) reads.
pub const FILE_MODE: u32 = 0o640;
/// How long a new producer retries before deciding a lock on the old file is a live producer's
/// rather than an agent's momentary liveness probe.
const LOCK_RETRIES: u32 = 50;

/// Whether the ring must be locked into RAM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryLock {
    /// `mlock` failing fails creation.
    Required,
    /// `mlock` failing is reported by [`ProbeWriter::memory_locked`] only.
    BestEffort,
}

/// What the producer announces about its loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriterConfig {
    /// The loop's id, unique on the machine.
    pub loop_id: u32,
    /// Human name, at most 31 bytes of UTF-8 without NUL.
    pub loop_name: String,
    /// Nominal period; non-zero.
    pub period_ns: u64,
    /// Per-cycle execution budget; non-zero. A longer duration is an overrun (a diagnostic).
    pub budget_ns: u64,
    /// Relative deadline D: an activation whose completion (start + duration) comes after its
    /// release + D misses its deadline. 0 means D = period (an implicit deadline).
    pub deadline_ns: u64,
    /// Ring slots; a power of two from 2 to 2^20.
    pub capacity: u32,
    /// Whether `mlock` must succeed.
    pub memory_lock: MemoryLock,
}

impl WriterConfig {
    /// A config with the deadline at the end of the period, the recommended capacity for
    /// `period_ns` and best-effort locking.
    pub fn new(loop_id: u32, loop_name: &str, period_ns: u64, budget_ns: u64) -> WriterConfig {
        WriterConfig {
            loop_id,
            loop_name: loop_name.to_owned(),
            period_ns,
            budget_ns,
            deadline_ns: 0,
            capacity: recommended_capacity(period_ns),
            memory_lock: MemoryLock::BestEffort,
        }
    }

    /// The relative deadline in effect: `deadline_ns`, or the period when it is 0.
    pub fn effective_deadline_ns(&self) -> u64 {
        if self.deadline_ns == 0 {
            self.period_ns
        } else {
            self.deadline_ns
        }
    }

    fn validate(&self) -> Result<(), CreateError> {
        let bad = |field, reason| Err(CreateError::InvalidConfig { field, reason });
        if self.period_ns == 0 {
            return bad("period_ns", "must be greater than zero");
        }
        if self.budget_ns == 0 {
            return bad("budget_ns", "must be greater than zero");
        }
        if self.deadline_ns > self.period_ns.saturating_mul(MAX_DURATION_PERIODS) {
            return bad(
                "deadline_ns",
                "must be 0 (the period) or at most 1000 periods",
            );
        }
        if !self.capacity.is_power_of_two()
            || !(MIN_CAPACITY..=MAX_CAPACITY).contains(&self.capacity)
        {
            return bad("capacity", "must be a power of two from 2 to 1048576");
        }
        if self.loop_name.len() >= LOOP_NAME_CAPACITY {
            return bad("loop_name", "must be at most 31 bytes");
        }
        if self.loop_name.as_bytes().contains(&0) {
            return bad("loop_name", "must not contain NUL");
        }
        Ok(())
    }
}

/// Creating the probe file failed; nothing was left at `path` (a temporary file is removed).
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    /// A config value is out of range.
    #[error("invalid probe config `{field}`: {reason}")]
    InvalidConfig {
        /// The offending key.
        field: &'static str,
        /// What it must be.
        reason: &'static str,
    },
    /// Another live producer holds the probe file at this path.
    #[error("probe {path} is held by a live producer (pid {pid})")]
    AlreadyRunning {
        /// The probe path.
        path: PathBuf,
        /// The pid the other producer recorded.
        pid: u32,
    },
    /// A filesystem or mapping call failed.
    #[error("probe {path}: {op} failed: {source}")]
    Io {
        /// The call that failed.
        op: &'static str,
        /// The file it failed on.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// `mlock` failed and [`MemoryLock::Required`] was asked for.
    #[error("probe {path}: mlock failed (raise RLIMIT_MEMLOCK or grant CAP_IPC_LOCK): {source}")]
    MemoryLock {
        /// The probe path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// Setting the model version failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SetModelError {
    /// The version string is longer than the 64-byte slot.
    #[error("model version is {len} bytes; the slot holds 64")]
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// Another thread was writing the slot.
    #[error(transparent)]
    Busy(#[from] SlotBusy),
}

/// The mapping and the locked fd, shared by the writer and its handles.
struct Shared {
    map: MmapRaw,
    /// Holds `flock(LOCK_EX)` for as long as any writer or handle lives.
    _file: File,
    path: PathBuf,
    capacity: u32,
    epoch: u64,
    start_ns: u64,
    memory_locked: bool,
}

impl Shared {
    #[inline]
    fn header(&self) -> &Header {
        // SAFETY: the mapping is at least HEADER_SIZE bytes, page-aligned, lives as long as
        // `self`, and every bit pattern is a valid `Header` (atomics only). Other processes
        // only ever access it through atomics as well.
        unsafe { &*(self.map.as_ptr() as *const Header) }
    }

    #[inline]
    fn slots(&self) -> &[Slot] {
        // SAFETY: the mapping is HEADER_SIZE + capacity * SLOT_SIZE bytes (checked at
        // creation), the slot area starts page-aligned, and `Slot` is 64 bytes of atomics.
        unsafe {
            std::slice::from_raw_parts(
                self.map.as_ptr().add(HEADER_SIZE) as *const Slot,
                self.capacity as usize,
            )
        }
    }
}

/// The header setters any producer thread may call; cheap to clone.
#[derive(Clone)]
pub struct ProbeHandle {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ProbeHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeHandle")
            .field("path", &self.shared.path)
            .field("epoch", &format_args!("{:#018x}", self.shared.epoch))
            .finish()
    }
}

impl ProbeHandle {
    /// Reports a change of autonomy mode at `now_ns` (CLOCK_MONOTONIC).
    pub fn set_autonomy(&self, mode: AutonomyMode, now_ns: u64) -> Result<(), SlotBusy> {
        write_autonomy(&self.shared.header().autonomy, mode, now_ns)
    }

    /// Publishes the model version the loop now runs.
    pub fn set_model_version(&self, id_hash: u64, version: &str) -> Result<(), SetModelError> {
        let m = ModelVersion::new(id_hash, version)
            .ok_or(SetModelError::TooLong { len: version.len() })?;
        write_model(&self.shared.header().model, &m)?;
        Ok(())
    }

    /// Counts an operator intervention.
    pub fn count_intervention(&self) {
        let e = &self.shared.header().events;
        e.interventions.fetch_add(1, Ordering::Release);
    }

    /// Counts a safe stop.
    pub fn count_safe_stop(&self) {
        let e = &self.shared.header().events;
        e.safe_stops.fetch_add(1, Ordering::Release);
    }

    /// Counts a fallback to the safety controller.
    pub fn count_fallback(&self) {
        let e = &self.shared.header().events;
        e.fallbacks.fetch_add(1, Ordering::Release);
    }

    /// The probe file path.
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// This producer's epoch.
    pub fn epoch(&self) -> u64 {
        self.shared.epoch
    }

    /// Whether the ring is locked into RAM.
    pub fn memory_locked(&self) -> bool {
        self.shared.memory_locked
    }

    /// When the probe file was created (CLOCK_MONOTONIC ns); autonomy time counts from here.
    pub fn start_ns(&self) -> u64 {
        self.shared.start_ns
    }
}

/// The producer: owns the probe file and records cycles into it.
pub struct ProbeWriter {
    handle: ProbeHandle,
    ring: RingWriter,
}

impl std::fmt::Debug for ProbeWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeWriter")
            .field("handle", &self.handle)
            .field("head", &self.ring.head())
            .finish()
    }
}

impl ProbeWriter {
    /// Creates the probe file at `path` (replacing a dead producer's) and maps it.
    pub fn create(
        path: impl AsRef<Path>,
        config: &WriterConfig,
    ) -> Result<ProbeWriter, CreateError> {
        config.validate()?;
        let path = path.as_ref().to_path_buf();
        let len = file_size(config.capacity).ok_or(CreateError::InvalidConfig {
            field: "capacity",
            reason: "ring does not fit in memory",
        })?;
        // Held until the rename so that two producers starting together cannot both win.
        let _old = lock_previous(&path)?;
        let tmp = temp_path(&path);
        let mut cleanup = RemoveOnDrop(Some(tmp.clone()));
        let io_err = |op, source| CreateError::Io {
            op,
            path: tmp.clone(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(FILE_MODE)
            .open(&tmp)
            .map_err(|e| io_err("open", e))?;
        file.set_permissions(std::fs::Permissions::from_mode(FILE_MODE))
            .map_err(|e| io_err("fchmod", e))?;
        flock(&file, libc::LOCK_EX | libc::LOCK_NB).map_err(|e| io_err("flock", e))?;
        allocate(&file, len).map_err(|e| io_err("fallocate", e))?;
        let map = MmapOptions::new()
            .len(len)
            .populate()
            .map_raw(&file)
            .map_err(|e| io_err("mmap", e))?;
        let memory_locked = match map.lock() {
            Ok(()) => true,
            Err(source) if config.memory_lock == MemoryLock::Required => {
                return Err(CreateError::MemoryLock {
                    path: path.clone(),
                    source,
                });
            }
            Err(_) => false,
        };
        let start_ns = monotonic_ns();
        let shared = Shared {
            map,
            _file: file,
            path: path.clone(),
            capacity: config.capacity,
            epoch: new_epoch(start_ns),
            start_ns,
            memory_locked,
        };
        init_file(&shared, config, start_ns);
        std::fs::rename(&tmp, &path).map_err(|e| io_err("rename", e))?;
        cleanup.0 = None;
        Ok(ProbeWriter {
            handle: ProbeHandle {
                shared: Arc::new(shared),
            },
            ring: RingWriter::new(
                config.capacity,
                Judgement {
                    budget_ns: config.budget_ns,
                    deadline_ns: config.effective_deadline_ns(),
                },
                config.loop_id,
            ),
        })
    }

    /// Records one cycle. No syscalls, no locks, no allocation, no waiting.
    /// Returns the flags stored with it (the probe adds `FLAG_OVERRUN`, `FLAG_DEADLINE_MISS`
    /// and `FLAG_SKIPPED`).
    #[inline]
    pub fn record(&mut self, cycle: &Cycle) -> u32 {
        let sh = &*self.handle.shared;
        let h = sh.header();
        let ring = RingRef {
            head: &h.head,
            heartbeat_ns: &h.heartbeat_ns,
            summary: &h.summary,
            slots: sh.slots(),
        };
        self.ring.record(&ring, cycle)
    }

    /// The handle for header setters; clone it for other threads.
    pub fn handle(&self) -> &ProbeHandle {
        &self.handle
    }

    /// Records published so far.
    pub fn head(&self) -> u64 {
        self.ring.head()
    }

    /// Whether the ring is locked into RAM.
    pub fn memory_locked(&self) -> bool {
        self.handle.shared.memory_locked
    }
}

/// Writes the header and touches every page, before the file becomes visible.
fn init_file(sh: &Shared, config: &WriterConfig, start_ns: u64) {
    let h = sh.header();
    for slot in sh.slots() {
        // Writing each line prefaults the page for writing now rather than in the loop.
        slot.seq.store(0, Ordering::Relaxed);
    }
    h.abi_version.store(ABI_VERSION, Ordering::Relaxed);
    h.header_size.store(HEADER_SIZE as u32, Ordering::Relaxed);
    h.slot_size.store(SLOT_SIZE as u32, Ordering::Relaxed);
    h.capacity.store(config.capacity, Ordering::Relaxed);
    h.loop_id.store(config.loop_id, Ordering::Relaxed);
    h.pid.store(std::process::id(), Ordering::Relaxed);
    h.period_ns.store(config.period_ns, Ordering::Relaxed);
    h.budget_ns.store(config.budget_ns, Ordering::Relaxed);
    h.deadline_ns
        .store(config.effective_deadline_ns(), Ordering::Relaxed);
    h.epoch.store(sh.epoch, Ordering::Relaxed);
    h.start_ns.store(start_ns, Ordering::Relaxed);
    let boot: [u64; 2] = pack_bytes(&boot_id());
    for (w, v) in h.boot_id.iter().zip(boot) {
        w.store(v, Ordering::Relaxed);
    }
    let name: [u64; LOOP_NAME_CAPACITY / 8] = pack_bytes(config.loop_name.as_bytes());
    for (w, v) in h.loop_name.iter().zip(name) {
        w.store(v, Ordering::Relaxed);
    }
    h.heartbeat_ns.store(start_ns, Ordering::Relaxed);
    init_autonomy(&h.autonomy, start_ns);
    h.magic.store(MAGIC, Ordering::Release);
}

/// Locks the file currently at `path`, if any, so it cannot be replaced under a live producer.
fn lock_previous(path: &Path) -> Result<Option<File>, CreateError> {
    let old = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(CreateError::Io {
                op: "open",
                path: path.to_path_buf(),
                source,
            });
        }
    };
    for _ in 0..LOCK_RETRIES {
        match flock(&old, libc::LOCK_EX | libc::LOCK_NB) {
            Ok(()) => return Ok(Some(old)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // An agent's liveness probe holds LOCK_SH for microseconds; a producer for life.
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            Err(source) => {
                return Err(CreateError::Io {
                    op: "flock",
                    path: path.to_path_buf(),
                    source,
                });
            }
        }
    }
    let mut pid = [0u8; 4];
    let pid = old
        .read_exact_at(&mut pid, 28)
        .map_or(0, |()| u32::from_ne_bytes(pid));
    Err(CreateError::AlreadyRunning {
        path: path.to_path_buf(),
        pid,
    })
}

/// `flock(2)` on `file`.
pub(crate) fn flock(file: &File, op: libc::c_int) -> io::Result<()> {
    // SAFETY: flock on an fd we own; no memory is passed.
    let rc = unsafe { libc::flock(file.as_raw_fd(), op) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Reserves `len` bytes so that no write into the mapping can hit ENOSPC as SIGBUS later.
fn allocate(file: &File, len: usize) -> io::Result<()> {
    let len =
        libc::off_t::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: fallocate on an fd we own; no memory is passed.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) };
    if rc == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EOPNOTSUPP) {
        // Filesystems without fallocate: size the file; pages are allocated by the prefault.
        return file.set_len(len as u64);
    }
    Err(err)
}

fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "probe".to_owned());
    let tmp = format!(".{name}.{}.{}.tmp", std::process::id(), monotonic_ns());
    path.with_file_name(tmp)
}

/// A random non-zero epoch, from getrandom, else from pid and time.
fn new_epoch(now_ns: u64) -> u64 {
    let mut buf = [0u8; 8];
    // SAFETY: `buf` is valid for 8 writable bytes.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), libc::GRND_NONBLOCK) };
    let mut epoch = u64::from_ne_bytes(buf);
    if n != 8 {
        epoch = now_ns ^ (u64::from(std::process::id()) << 32) ^ 0x9e37_79b9_7f4a_7c15;
    }
    epoch.max(1)
}

/// The kernel's boot id as 16 bytes (zero if unreadable).
fn boot_id() -> [u8; 16] {
    let mut out = [0u8; 16];
    let Ok(text) = std::fs::read_to_string("/proc/sys/kernel/random/boot_id") else {
        return out;
    };
    let digits = text.bytes().filter_map(|b| (b as char).to_digit(16));
    let mut i = 0;
    let mut hi = None;
    for d in digits {
        match hi.take() {
            None => hi = Some(d as u8),
            Some(h) => {
                if let Some(o) = out.get_mut(i) {
                    *o = (h << 4) | d as u8;
                }
                i += 1;
            }
        }
    }
    out
}

struct RemoveOnDrop(Option<PathBuf>);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}
