//! Counting the heap allocations of a real process from outside: a small `LD_PRELOAD` library,
//! built with the system C compiler (`edgewatch_test_kit::preload`), interposes the malloc family and adds to counters in a
//! shared file that this side reads at any moment.
//!
//! ```text
//! counts file (4 KiB, MAP_SHARED):
//!   u64 magic | u64 allocations | u64 frees | u64 bytes | u64 armed | u64 traced | 2 × u64 (0)
//!   then TRACE_SLOTS × { u64 CLOCK_MONOTONIC ns | u32 bytes asked | u32 call }
//! ```
//!
//! While `armed` is non-zero (set by this side around a measured window), every call also takes
//! the next trace slot, up to [`TRACE_SLOTS`] (`traced` keeps counting past them): when a window
//! that should allocate nothing does, the report says when each call came and how large it was,
//! which tells a periodic task from a one-off on a shipped binary that carries no symbols.
//!
//! Invariants:
//! - The counted process makes no extra syscall, thread or signal to report: the counters are
//!   relaxed atomic adds in a shared mapping, read here with `pread`.
//! - A process that did not load the library is detected (the magic stays 0), so a missing
//!   preload can never pass as "zero allocations".
//! - Counted: `malloc`, `calloc`, `realloc`, `posix_memalign`, `aligned_alloc`, `memalign` (Rust's
//!   `System` allocator uses the first four); not counted: `valloc`/`pvalloc`, and memory the
//!   process maps itself.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use edgewatch_test_kit::preload::{self, PreloadError};

/// Written by the library's constructor once it mapped the file.
pub const MAGIC: u64 = 0x6577_616c_6c6f_6331; // "ewalloc1"

/// The environment variable naming the counts file.
pub const ENV: &str = "EDGEWATCH_ALLOC_COUNTS";

/// Calls traced while armed, at most (the rest are counted, not traced).
pub const TRACE_SLOTS: usize = 252;
const HEADER_BYTES: u64 = 64;
const SLOT_BYTES: u64 = 16;
const ARMED_OFFSET: u64 = 32;
const TRACED_OFFSET: u64 = 40;

const SOURCE: &str = r#"
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
extern void *__libc_memalign(size_t, size_t);

#define TRACE_SLOTS 252
struct slot { uint64_t at_ns; uint32_t bytes, call; };
struct counts {
    uint64_t magic, allocations, frees, bytes, armed, traced, reserved[2];
    struct slot slots[TRACE_SLOTS];
};
_Static_assert(sizeof(struct counts) <= 4096, "the counts file is one page");
static struct counts early;
static struct counts *counts = &early;

/* Only while armed: a vDSO clock read and a few stores, no call back into malloc. */
static inline void traced(struct counts *c, size_t n, uint32_t call) {
    if (!__atomic_load_n(&c->armed, __ATOMIC_RELAXED)) return;
    uint64_t i = __atomic_fetch_add(&c->traced, 1, __ATOMIC_RELAXED);
    if (i >= TRACE_SLOTS) return;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    c->slots[i].at_ns = (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
    c->slots[i].bytes = n > 0xffffffffULL ? 0xffffffffU : (uint32_t)n;
    __atomic_store_n(&c->slots[i].call, call, __ATOMIC_RELEASE);
}

__attribute__((constructor)) static void edgewatch_count_init(void) {
    const char *path = getenv("EDGEWATCH_ALLOC_COUNTS");
    if (!path) return;
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return;
    void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return;
    struct counts *c = p;
    c->allocations = early.allocations;
    c->frees = early.frees;
    c->bytes = early.bytes;
    __atomic_store_n(&c->magic, 0x6577616c6c6f6331ULL, __ATOMIC_RELEASE);
    __atomic_store_n(&counts, c, __ATOMIC_RELEASE);
}

static inline void counted(size_t n, uint32_t call) {
    struct counts *c = __atomic_load_n(&counts, __ATOMIC_ACQUIRE);
    __atomic_fetch_add(&c->allocations, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&c->bytes, n, __ATOMIC_RELAXED);
    traced(c, n, call);
}

/* Call numbers: 1 malloc, 2 calloc, 3 realloc, 4 posix_memalign, 5 aligned_alloc, 6 memalign,
   7 free. */
void *malloc(size_t n) { counted(n, 1); return __libc_malloc(n); }
void *calloc(size_t a, size_t b) { counted(a * b, 2); return __libc_calloc(a, b); }
void *realloc(void *p, size_t n) { counted(n, 3); return __libc_realloc(p, n); }
void free(void *p) {
    if (p) {
        struct counts *c = __atomic_load_n(&counts, __ATOMIC_ACQUIRE);
        __atomic_fetch_add(&c->frees, 1, __ATOMIC_RELAXED);
        traced(c, 0, 7);
    }
    __libc_free(p);
}
int posix_memalign(void **out, size_t align, size_t n) {
    counted(n, 4);
    void *p = __libc_memalign(align, n);
    if (!p) return ENOMEM;
    *out = p;
    return 0;
}
void *aligned_alloc(size_t align, size_t n) { counted(n, 5); return __libc_memalign(align, n); }
void *memalign(size_t align, size_t n) { counted(n, 6); return __libc_memalign(align, n); }
"#;

/// Building or reading the counter failed.
#[derive(Debug, thiserror::Error)]
pub enum CountError {
    /// The malloc-counting library could not be built.
    #[error(transparent)]
    Build(#[from] PreloadError),
    /// The counts file could not be created or read.
    #[error("counts file {path}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// Allocation counters at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    /// The library is loaded and counting into the file.
    pub loaded: bool,
    /// Allocation calls.
    pub allocations: u64,
    /// `free` calls with a non-null pointer.
    pub frees: u64,
    /// Bytes asked for.
    pub bytes: u64,
}

impl Counts {
    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &Counts) -> Counts {
        Counts {
            loaded: self.loaded && earlier.loaded,
            allocations: self.allocations.saturating_sub(earlier.allocations),
            frees: self.frees.saturating_sub(earlier.frees),
            bytes: self.bytes.saturating_sub(earlier.bytes),
        }
    }
}

/// One call of the malloc family made while the counter was armed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TracedCall {
    /// When, `CLOCK_MONOTONIC` ns (compare with [`monotonic_ns`]).
    pub at_ns: u64,
    /// Bytes asked for (0 for `free`).
    pub bytes: u32,
    /// Which call.
    pub call: &'static str,
}

/// The calls traced while armed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trace {
    /// Calls made while armed, traced or not.
    pub calls: u64,
    /// The first [`TRACE_SLOTS`] of them.
    pub traced: Vec<TracedCall>,
}

impl Trace {
    /// One line per traced call, times in ms after `since_ns`: "+1203.4 ms malloc 48 B".
    pub fn describe(&self, since_ns: u64) -> String {
        let mut lines: Vec<String> = self
            .traced
            .iter()
            .map(|c| {
                let ms = c.at_ns.saturating_sub(since_ns) as f64 / 1e6;
                match c.call {
                    "free" => format!("+{ms:.1} ms free"),
                    call => format!("+{ms:.1} ms {call} {} B", c.bytes),
                }
            })
            .collect();
        if self.calls > self.traced.len() as u64 {
            lines.push(format!(
                "({} more calls not traced)",
                self.calls - self.traced.len() as u64
            ));
        }
        lines.join("; ")
    }
}

/// `CLOCK_MONOTONIC` now, ns: the clock of [`TracedCall::at_ns`].
pub fn monotonic_ns() -> u64 {
    // SAFETY: clock_gettime fills the timespec we pass.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: a valid clock id and pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn call_name(call: u32) -> &'static str {
    match call {
        1 => "malloc",
        2 => "calloc",
        3 => "realloc",
        4 => "posix_memalign",
        5 => "aligned_alloc",
        6 => "memalign",
        7 => "free",
        _ => "unknown",
    }
}

/// The built library and one counts file.
#[derive(Debug)]
pub struct MallocCounter {
    library: PathBuf,
    counts: PathBuf,
    file: std::fs::File,
}

impl MallocCounter {
    /// Builds the library into `dir` and creates a zeroed counts file there.
    pub fn build(dir: &Path) -> Result<Self, CountError> {
        let library = preload::build(dir, "malloc_count", SOURCE, &[])?;
        let counts = dir.join("malloc_counts");
        let io = |source| CountError::File {
            path: counts.clone(),
            source,
        };
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&counts)
            .map_err(io)?;
        file.set_len(4096).map_err(io)?;
        Ok(Self {
            library,
            counts,
            file,
        })
    }

    /// Environment for the counted process: `LD_PRELOAD` and the counts file.
    pub fn env(&self) -> [(&'static str, PathBuf); 2] {
        [
            ("LD_PRELOAD", self.library.clone()),
            (ENV, self.counts.clone()),
        ]
    }

    /// Starts tracing each call (from an empty trace), until [`MallocCounter::disarm`].
    pub fn arm(&self) -> Result<(), CountError> {
        self.write_word(TRACED_OFFSET, 0)?;
        self.write_word(ARMED_OFFSET, 1)
    }

    /// Stops tracing; the trace stays readable.
    pub fn disarm(&self) -> Result<(), CountError> {
        self.write_word(ARMED_OFFSET, 0)
    }

    /// The calls traced since the last [`MallocCounter::arm`].
    pub fn trace(&self) -> Result<Trace, CountError> {
        let io = |source| CountError::File {
            path: self.counts.clone(),
            source,
        };
        let mut word = [0u8; 8];
        self.file
            .read_exact_at(&mut word, TRACED_OFFSET)
            .map_err(io)?;
        let calls = u64::from_ne_bytes(word);
        let mut slots = vec![0u8; TRACE_SLOTS * SLOT_BYTES as usize];
        self.file
            .read_exact_at(&mut slots, HEADER_BYTES)
            .map_err(io)?;
        let traced = slots
            .chunks_exact(SLOT_BYTES as usize)
            .take(calls.min(TRACE_SLOTS as u64) as usize)
            .map(|slot| TracedCall {
                at_ns: u64::from_ne_bytes(slot[0..8].try_into().expect("8 bytes")),
                bytes: u32::from_ne_bytes(slot[8..12].try_into().expect("4 bytes")),
                call: call_name(u32::from_ne_bytes(
                    slot[12..16].try_into().expect("4 bytes"),
                )),
            })
            .collect();
        Ok(Trace { calls, traced })
    }

    fn write_word(&self, offset: u64, value: u64) -> Result<(), CountError> {
        self.file
            .write_all_at(&value.to_ne_bytes(), offset)
            .map_err(|source| CountError::File {
                path: self.counts.clone(),
                source,
            })
    }

    /// The counters now.
    pub fn read(&self) -> Result<Counts, CountError> {
        let words = preload::read_words::<4>(&self.file).map_err(|source| CountError::File {
            path: self.counts.clone(),
            source,
        })?;
        let word = |i: usize| words[i];
        Ok(Counts {
            loaded: word(0) == MAGIC,
            allocations: word(1),
            frees: word(2),
            bytes: word(3),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_counted(counter: &MallocCounter) -> std::process::ExitStatus {
        std::process::Command::new("/bin/ls")
            .arg("/")
            .envs(counter.env())
            .stdout(std::process::Stdio::null())
            .status()
            .expect("running /bin/ls")
    }

    #[test]
    fn an_armed_counter_traces_each_call_with_its_time_and_size_and_a_disarmed_one_none() {
        let dir = tempfile::tempdir().unwrap();
        let counter = MallocCounter::build(dir.path()).unwrap();

        counter.arm().unwrap();
        let before = monotonic_ns();
        assert!(run_counted(&counter).success());
        let after = monotonic_ns();
        counter.disarm().unwrap();
        let counts = counter.read().unwrap();
        let trace = counter.trace().unwrap();
        assert!(counts.loaded, "{counts:?}");
        assert!(trace.calls > 0, "ls allocates: {trace:?}");
        assert!(trace.calls <= counts.allocations + counts.frees);
        assert_eq!(
            trace.traced.len() as u64,
            trace.calls.min(TRACE_SLOTS as u64)
        );
        for call in &trace.traced {
            assert!((before..=after).contains(&call.at_ns), "{call:?}");
            assert_ne!(call.call, "unknown", "{call:?}");
        }
        let asked: u64 = trace.traced.iter().map(|c| u64::from(c.bytes)).sum();
        assert!(
            asked > 0 && asked <= counts.bytes,
            "{asked} of {}",
            counts.bytes
        );
        assert!(trace.describe(before).contains(" ms "));

        // Disarmed: counted, not traced.
        assert!(run_counted(&counter).success());
        assert!(counter.read().unwrap().allocations > 0);
        assert_eq!(counter.trace().unwrap(), trace);
    }
}
