//! The C ABI for control loops written in C or C++; declared in `include/loop_probe.h`.
//!
//! Invariants:
//! - No panic crosses the boundary: every entry point runs inside `catch_unwind` and reports
//!   `LP_ERR_PANIC` (or does nothing, for `void` functions); the record path is panic-free
//!   regardless.
//! - Null pointers are accepted everywhere and rejected with `LP_ERR_INVALID` (or ignored).
//! - `lp_record` must be called from one thread at a time per handle; the other setters may be
//!   called from any thread. The handle keeps the recording state and the shared setters in
//!   separate fields, so the two never alias.
//! - The names, arities and constants here are checked against the header by a test.

use std::cell::UnsafeCell;
use std::ffi::{CStr, c_char, c_int};
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::clock::monotonic_ns;
use crate::layout::{self, AutonomyMode};
use crate::protocol::Cycle;
use crate::writer::{
    CreateError, MemoryLock, ProbeHandle, ProbeWriter, SetModelError, WriterConfig,
};

/// Success.
pub const LP_OK: c_int = 0;
/// A null pointer, bad UTF-8, or an out-of-range argument.
pub const LP_ERR_INVALID: c_int = 1;
/// Another live producer holds the probe file.
pub const LP_ERR_ALREADY_RUNNING: c_int = 2;
/// A filesystem or mapping call failed; `errno` is set.
pub const LP_ERR_IO: c_int = 3;
/// `mlock` failed and was required.
pub const LP_ERR_MLOCK: c_int = 4;
/// Another thread was writing the same header cell; nothing was changed.
pub const LP_ERR_BUSY: c_int = 5;
/// The model version string is longer than 64 bytes.
pub const LP_ERR_TOO_LONG: c_int = 6;
/// An internal panic was caught.
pub const LP_ERR_PANIC: c_int = 7;

/// Flag constants mirrored for the header check.
pub const LP_FLAG_OVERRUN: u32 = layout::FLAG_OVERRUN;
/// See [`layout::FLAG_DEADLINE_MISS`].
pub const LP_FLAG_DEADLINE_MISS: u32 = layout::FLAG_DEADLINE_MISS;
/// See [`layout::FLAG_SKIPPED`].
pub const LP_FLAG_SKIPPED: u32 = layout::FLAG_SKIPPED;
/// See [`layout::FLAG_DEGRADED`].
pub const LP_FLAG_DEGRADED: u32 = layout::FLAG_DEGRADED;
/// See [`layout::FLAG_FALLBACK`].
pub const LP_FLAG_FALLBACK: u32 = layout::FLAG_FALLBACK;
/// See [`AutonomyMode::Unknown`].
pub const LP_MODE_UNKNOWN: u32 = AutonomyMode::Unknown as u32;
/// See [`AutonomyMode::Idle`].
pub const LP_MODE_IDLE: u32 = AutonomyMode::Idle as u32;
/// See [`AutonomyMode::Manual`].
pub const LP_MODE_MANUAL: u32 = AutonomyMode::Manual as u32;
/// See [`AutonomyMode::Teleoperated`].
pub const LP_MODE_TELEOPERATED: u32 = AutonomyMode::Teleoperated as u32;
/// See [`AutonomyMode::Autonomous`].
pub const LP_MODE_AUTONOMOUS: u32 = AutonomyMode::Autonomous as u32;

/// The opaque handle C code holds.
pub struct LpWriter {
    /// Touched only by `lp_record`, from one thread at a time.
    writer: UnsafeCell<ProbeWriter>,
    /// Shared by every other entry point.
    handle: ProbeHandle,
}

fn guarded<F: FnOnce() -> c_int>(f: F) -> c_int {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(LP_ERR_PANIC)
}

fn set_errno(err: Option<i32>) {
    if let Some(code) = err {
        // SAFETY: __errno_location returns this thread's errno slot.
        unsafe { *libc::__errno_location() = code };
    }
}

/// Creates the probe file at `path` for a loop whose relative deadline is its period. On
/// success stores a handle in `*out`. As [`lp_writer_open_deadline`] with `deadline_ns` 0.
///
/// # Safety
/// `path` and `loop_name` must be NUL-terminated strings (or null); `out` must be valid for a
/// pointer write (or null).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lp_writer_open(
    path: *const c_char,
    loop_id: u32,
    loop_name: *const c_char,
    period_ns: u64,
    budget_ns: u64,
    capacity: u32,
    require_mlock: c_int,
    out: *mut *mut LpWriter,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe {
        lp_writer_open_deadline(
            path,
            loop_id,
            loop_name,
            period_ns,
            0,
            budget_ns,
            capacity,
            require_mlock,
            out,
        )
    }
}

/// Creates the probe file at `path` for a loop with relative deadline `deadline_ns` (0: the
/// period). On success stores a handle in `*out`.
///
/// # Safety
/// `path` and `loop_name` must be NUL-terminated strings (or null); `out` must be valid for a
/// pointer write (or null).
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn lp_writer_open_deadline(
    path: *const c_char,
    loop_id: u32,
    loop_name: *const c_char,
    period_ns: u64,
    deadline_ns: u64,
    budget_ns: u64,
    capacity: u32,
    require_mlock: c_int,
    out: *mut *mut LpWriter,
) -> c_int {
    guarded(|| {
        if path.is_null() || loop_name.is_null() || out.is_null() {
            return LP_ERR_INVALID;
        }
        // SAFETY: non-null and NUL-terminated per the contract.
        let (path, name) = unsafe { (CStr::from_ptr(path), CStr::from_ptr(loop_name)) };
        let (Ok(path), Ok(name)) = (path.to_str(), name.to_str()) else {
            return LP_ERR_INVALID;
        };
        let mut config = WriterConfig::new(loop_id, name, period_ns, budget_ns);
        config.deadline_ns = deadline_ns;
        if capacity != 0 {
            config.capacity = capacity;
        }
        if require_mlock != 0 {
            config.memory_lock = MemoryLock::Required;
        }
        match ProbeWriter::create(path, &config) {
            Ok(w) => {
                let handle = w.handle().clone();
                let boxed = Box::new(LpWriter {
                    writer: UnsafeCell::new(w),
                    handle,
                });
                // SAFETY: `out` is non-null and valid for writes per the contract.
                unsafe { *out = Box::into_raw(boxed) };
                LP_OK
            }
            Err(CreateError::InvalidConfig { .. }) => LP_ERR_INVALID,
            Err(CreateError::AlreadyRunning { .. }) => LP_ERR_ALREADY_RUNNING,
            Err(CreateError::Io { source, .. }) => {
                set_errno(source.raw_os_error());
                LP_ERR_IO
            }
            Err(CreateError::MemoryLock { source, .. }) => {
                set_errno(source.raw_os_error());
                LP_ERR_MLOCK
            }
        }
    })
}

/// Releases the handle: unmaps the file and drops the producer lock (the agent then sees the
/// producer as dead). The file stays for the agent to read.
///
/// # Safety
/// `w` must come from `lp_writer_open` and not be used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lp_writer_close(w: *mut LpWriter) {
    if w.is_null() {
        return;
    }
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `w` came from Box::into_raw in lp_writer_open and is not used again.
        drop(unsafe { Box::from_raw(w) });
    }));
}

/// Records one cycle. No syscalls, no locks, no allocation, no waiting.
/// `flags` may carry `LP_FLAG_DEGRADED` and `LP_FLAG_FALLBACK`; returns the flags stored (the
/// probe adds `LP_FLAG_OVERRUN`, `LP_FLAG_DEADLINE_MISS` and `LP_FLAG_SKIPPED`).
///
/// # Safety
/// `w` must be a live handle (or null), used by no other `lp_record` call at the same time.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lp_record(
    w: *mut LpWriter,
    cycle: u64,
    release_ns: u64,
    start_ns: u64,
    duration_ns: u64,
    flags: u32,
) -> u32 {
    if w.is_null() {
        return 0;
    }
    let c = Cycle {
        cycle,
        release_ns,
        start_ns,
        duration_ns,
        flags,
    };
    catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `w` is live and no other lp_record uses it concurrently (contract); the
        // setters only touch the separate `handle` field.
        let writer = unsafe { &mut *(*w).writer.get() };
        writer.record(&c)
    }))
    .unwrap_or(0)
}

/// Helper for the setters: the shared handle behind `w`.
///
/// # Safety
/// `w` must be a live handle or null.
unsafe fn handle<'a>(w: *const LpWriter) -> Option<&'a ProbeHandle> {
    // SAFETY: per the caller's contract; `handle` is never mutated after creation.
    unsafe { w.as_ref().map(|w| &w.handle) }
}

/// Reports a change of autonomy mode (`LP_MODE_*`) at `now_ns` (CLOCK_MONOTONIC).
///
/// # Safety
/// `w` must be a live handle (or null).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lp_set_autonomy(w: *const LpWriter, mode: u32, now_ns: u64) -> c_int {
    guarded(|| {
        // SAFETY: forwarded contract.
        let Some(h) = (unsafe { handle(w) }) else {
            return LP_ERR_INVALID;
        };
        let Some(mode) = AutonomyMode::from_u64(u64::from(mode)) else {
            return LP_ERR_INVALID;
        };
        match h.set_autonomy(mode, now_ns) {
            Ok(()) => LP_OK,
            Err(_) => LP_ERR_BUSY,
        }
    })
}

/// Publishes the model version: an id hash and a NUL-terminated UTF-8 string of at most 64
/// bytes.
///
/// # Safety
/// `w` must be a live handle (or null); `version` a NUL-terminated string (or null).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lp_set_model_version(
    w: *const LpWriter,
    id_hash: u64,
    version: *const c_char,
) -> c_int {
    guarded(|| {
        // SAFETY: forwarded contract.
        let Some(h) = (unsafe { handle(w) }) else {
            return LP_ERR_INVALID;
        };
        if version.is_null() {
            return LP_ERR_INVALID;
        }
        // SAFETY: non-null and NUL-terminated per the contract.
        let Ok(v) = unsafe { CStr::from_ptr(version) }.to_str() else {
            return LP_ERR_INVALID;
        };
        match h.set_model_version(id_hash, v) {
            Ok(()) => LP_OK,
            Err(SetModelError::TooLong { .. }) => LP_ERR_TOO_LONG,
            Err(SetModelError::Busy(_)) => LP_ERR_BUSY,
        }
    })
}

/// Counts an operator intervention.
///
/// # Safety
/// `w` must be a live handle (or null).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lp_count_intervention(w: *const LpWriter) {
    // SAFETY: forwarded contract.
    if let Some(h) = unsafe { handle(w) } {
        h.count_intervention();
    }
}

/// Counts a safe stop.
///
/// # Safety
/// `w` must be a live handle (or null).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lp_count_safe_stop(w: *const LpWriter) {
    // SAFETY: forwarded contract.
    if let Some(h) = unsafe { handle(w) } {
        h.count_safe_stop();
    }
}

/// Counts a fallback to the safety controller.
///
/// # Safety
/// `w` must be a live handle (or null).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lp_count_fallback(w: *const LpWriter) {
    // SAFETY: forwarded contract.
    if let Some(h) = unsafe { handle(w) } {
        h.count_fallback();
    }
}

/// 1 if the ring is locked into RAM, 0 if not (or `w` is null).
///
/// # Safety
/// `w` must be a live handle (or null).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lp_memory_locked(w: *const LpWriter) -> c_int {
    guarded(|| {
        // SAFETY: forwarded contract.
        match unsafe { handle(w) } {
            Some(h) => c_int::from(h.memory_locked()),
            None => 0,
        }
    })
}

/// Now on CLOCK_MONOTONIC, in nanoseconds: the time base for every timestamp passed in.
#[unsafe(no_mangle)]
pub extern "C" fn lp_now_ns() -> u64 {
    monotonic_ns()
}

/// The ring capacity recommended for a loop of this period (16 s of records, 1024..65536).
#[unsafe(no_mangle)]
pub extern "C" fn lp_recommended_capacity(period_ns: u64) -> u32 {
    layout::recommended_capacity(period_ns)
}

/// A static description of an `LP_*` return code.
#[unsafe(no_mangle)]
pub extern "C" fn lp_strerror(code: c_int) -> *const c_char {
    let s: &'static CStr = match code {
        LP_OK => c"success",
        LP_ERR_INVALID => c"invalid argument",
        LP_ERR_ALREADY_RUNNING => c"probe file held by a live producer",
        LP_ERR_IO => c"I/O error (see errno)",
        LP_ERR_MLOCK => c"mlock failed (see errno)",
        LP_ERR_BUSY => c"header cell busy; nothing changed",
        LP_ERR_TOO_LONG => c"model version longer than 64 bytes",
        LP_ERR_PANIC => c"internal error",
        _ => c"unknown error code",
    };
    s.as_ptr()
}
