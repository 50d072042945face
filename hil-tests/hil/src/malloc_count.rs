//! Counting the heap allocations of a real process from outside: a small `LD_PRELOAD` library,
//! built with the system C compiler (`edgewatch_test_kit::preload`), interposes the malloc family and adds to counters in a
//! shared file that this side reads at any moment.
//!
//! ```text
//! counts file (4 KiB, MAP_SHARED):  u64 magic | u64 allocations | u64 frees | u64 bytes
//! ```
//!
//! Invariants:
//! - The counted process makes no extra syscall, thread or signal to report: the counters are
//!   relaxed atomic adds in a shared mapping, read here with `pread`.
//! - A process that did not load the library is detected (the magic stays 0), so a missing
//!   preload can never pass as "zero allocations".
//! - Counted: `malloc`, `calloc`, `realloc`, `posix_memalign`, `aligned_alloc`, `memalign` (Rust's
//!   `System` allocator uses the first four); not counted: `valloc`/`pvalloc`, and memory the
//!   process maps itself.

use std::path::{Path, PathBuf};

use edgewatch_test_kit::preload::{self, PreloadError};

/// Written by the library's constructor once it mapped the file.
pub const MAGIC: u64 = 0x6577_616c_6c6f_6331; // "ewalloc1"

/// The environment variable naming the counts file.
pub const ENV: &str = "EDGEWATCH_ALLOC_COUNTS";

const SOURCE: &str = r#"
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
extern void *__libc_memalign(size_t, size_t);

struct counts { uint64_t magic, allocations, frees, bytes; };
static struct counts early;
static struct counts *counts = &early;

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

static inline void counted(size_t n) {
    struct counts *c = __atomic_load_n(&counts, __ATOMIC_ACQUIRE);
    __atomic_fetch_add(&c->allocations, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&c->bytes, n, __ATOMIC_RELAXED);
}

void *malloc(size_t n) { counted(n); return __libc_malloc(n); }
void *calloc(size_t a, size_t b) { counted(a * b); return __libc_calloc(a, b); }
void *realloc(void *p, size_t n) { counted(n); return __libc_realloc(p, n); }
void free(void *p) {
    if (p) {
        struct counts *c = __atomic_load_n(&counts, __ATOMIC_ACQUIRE);
        __atomic_fetch_add(&c->frees, 1, __ATOMIC_RELAXED);
    }
    __libc_free(p);
}
int posix_memalign(void **out, size_t align, size_t n) {
    counted(n);
    void *p = __libc_memalign(align, n);
    if (!p) return ENOMEM;
    *out = p;
    return 0;
}
void *aligned_alloc(size_t align, size_t n) { counted(n); return __libc_memalign(align, n); }
void *memalign(size_t align, size_t n) { counted(n); return __libc_memalign(align, n); }
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
