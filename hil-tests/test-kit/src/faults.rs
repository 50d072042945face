//! Disk faults injected into a real process without root: an `LD_PRELOAD` library (built here,
//! with [`crate::preload`]) makes writes, syncs and file creations under one directory fail
//! with `EIO` while a control file exists, and counts what the process did to its files, so a
//! test can tell a process that opened a new handle after a failed fsync from one that went on
//! with the old one.
//!
//! ```text
//! test ── inject(): creates <scratch>/eio.on ──┐
//!      ── stop():   removes it                 │ access(2) on every guarded call
//!                                               ▼
//! process ─ open/openat ─► library: a file under <dir>? → handle number h in its fd's slot
//!         ─ write/pwrite/writev ─► under <dir> and eio.on: EIO       (else through, counted)
//!         ─ fsync/fdatasync ─────► under <dir> and eio.on: EIO, handle h marked failed
//!         ─ open(O_CREAT) of a new file under <dir>, eio.on: EIO, nothing created
//!         ─ dup/dup2/dup3/fcntl(F_DUPFD) ─► the copy carries the same handle; close clears it
//!                                     │ relaxed atomic adds
//!                                     ▼
//! counts file (4 KiB, MAP_SHARED): u64 magic | handles | writes_failed | syncs_failed |
//!     creates_failed | writes | syncs | reused | last_synced_handle | untracked |
//!     handles_failed | last_failed_handle
//! ```
//!
//! Invariants:
//! - Only calls on file descriptors opened (through `open`, `open64`, `openat`, `openat64` or
//!   their fortified forms) on a path under the directory are touched, judged by the kernel's
//!   name for the descriptor (`/proc/self/fd/N`), so relative paths and symlinks cannot escape;
//!   every other call goes straight to libc. A copy made by `dup`, `dup2`, `dup3` or
//!   `fcntl(F_DUPFD)` is the same handle; descriptors libc opens internally (`fopen`) are not
//!   followed. Not injected: reads, `ftruncate`, `fallocate`, `pwritev`, `sync_file_range`.
//! - A handle is one successful open of a file under the directory, numbered from 1 across
//!   every process sharing the counts file. A handle that met an injected error is marked
//!   failed until its descriptor is closed; `reused` counts every write or sync that reached
//!   the disk through a marked handle, so "never the old handle after an I/O error" is the
//!   check `reused == 0`. `handles_failed` counts handles as they are first marked (a process
//!   that gives up on a handle at its first error and tries again on a new one makes one per
//!   attempt); a copy made by `dup` is marked on its own.
//! - A process that did not load the library is detected (`loaded` stays false), so a missing
//!   preload can never pass as "no fault met".
//! - The control file lives outside the directory; which operations fail is fixed when the
//!   process starts ([`Ops`]).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::preload::{self, PreloadError};

/// Written by the library's constructor once it mapped the counts file.
pub const MAGIC: u64 = 0x6577_6569_6f66_6c74; // "eweioflt"

/// The library's environment: the guarded directory (canonical).
pub const ENV_DIR: &str = "EDGEWATCH_EIO_DIR";
/// The library's environment: the control file.
pub const ENV_CONTROL: &str = "EDGEWATCH_EIO_CONTROL";
/// The library's environment: the counts file.
pub const ENV_COUNTS: &str = "EDGEWATCH_EIO_COUNTS";
/// The library's environment: the operations that fail (`write`, `sync`, `create`, comma separated).
pub const ENV_OPS: &str = "EDGEWATCH_EIO_OPS";

const COUNTS_BYTES: u64 = 4096;
const WORDS: usize = 12;

const SOURCE: &str = r##"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

enum { OP_WRITE = 1, OP_SYNC = 2, OP_CREATE = 4 };

struct counts {
    uint64_t magic, handles, writes_failed, syncs_failed, creates_failed, writes, syncs, reused,
        last_synced_handle, untracked, handles_failed, last_failed_handle;
};

/* Per descriptor: (handle number << 1) | 1 once an injected error met it; 0 when the
   descriptor is not a file under the directory. */
#define SLOTS 65536
static uint64_t slots[SLOTS];

static struct counts early;
static struct counts *counts = &early;
static char dir[PATH_MAX];
static size_t dir_len;
static char control[PATH_MAX];
static int ops;

static void *next_fn(const char *name, void **cache) {
    void *f = __atomic_load_n(cache, __ATOMIC_ACQUIRE);
    if (!f) {
        f = dlsym(RTLD_NEXT, name);
        __atomic_store_n(cache, f, __ATOMIC_RELEASE);
    }
    return f;
}
#define NEXT(type, name) ({ static void *cache_; (type)next_fn(name, &cache_); })

static struct counts *c(void) { return __atomic_load_n(&counts, __ATOMIC_ACQUIRE); }
static void add(uint64_t *field) { __atomic_fetch_add(field, 1, __ATOMIC_RELAXED); }

static int injecting(int op) {
    if (!(ops & op) || !control[0]) return 0;
    int saved = errno;
    int on = access(control, F_OK) == 0;
    errno = saved;
    return on;
}

static int is_under(const char *path, size_t len) {
    return dir_len && len >= dir_len && memcmp(path, dir, dir_len) == 0
        && (len == dir_len || path[dir_len] == '/');
}

static uint64_t handle_of(int fd) {
    if (fd < 0 || fd >= SLOTS) return 0;
    return __atomic_load_n(&slots[fd], __ATOMIC_ACQUIRE);
}

static void clear(int fd) {
    if (fd >= 0 && fd < SLOTS) __atomic_store_n(&slots[fd], 0, __ATOMIC_RELEASE);
}

static void mark_failed(int fd) {
    if (fd < 0 || fd >= SLOTS) return;
    uint64_t before = __atomic_fetch_or(&slots[fd], 1, __ATOMIC_ACQ_REL);
    if (before && !(before & 1)) {
        add(&c()->handles_failed);
        __atomic_store_n(&c()->last_failed_handle, before >> 1, __ATOMIC_RELAXED);
    }
}

static void track(int fd) {
    if (fd < 0 || !dir_len) return;
    int saved = errno;
    char link[32], target[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n <= 0 || !is_under(target, (size_t)n)) {
        clear(fd);
    } else {
        uint64_t handle = __atomic_add_fetch(&c()->handles, 1, __ATOMIC_RELAXED);
        if (fd < SLOTS) __atomic_store_n(&slots[fd], handle << 1, __ATOMIC_RELEASE);
        else add(&c()->untracked);
    }
    errno = saved;
}

static int opened(int fd) {
    if (fd >= 0) track(fd);
    return fd;
}

/* True if this open would create a new file under the directory while creations fail. */
static int refuse_create(int dirfd, const char *path, int flags) {
    if (!(flags & O_CREAT) || !dir_len || !path || !injecting(OP_CREATE)) return 0;
    int saved = errno;
    int refuse = 0;
    char full[PATH_MAX], parent[PATH_MAX];
    size_t len = strlen(path);
    if (faccessat(dirfd, path, F_OK, 0) == 0) goto done; /* it exists: not a creation */
    if (path[0] == '/') {
        if (len >= sizeof full) goto done;
        memcpy(full, path, len + 1);
    } else {
        size_t base;
        if (dirfd == AT_FDCWD) {
            if (!getcwd(full, sizeof full)) goto done;
            base = strlen(full);
        } else {
            char link[32];
            snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
            ssize_t n = readlink(link, full, sizeof full - 1);
            if (n <= 0) goto done;
            base = (size_t)n;
        }
        if (base + 1 + len >= sizeof full) goto done;
        full[base] = '/';
        memcpy(full + base + 1, path, len + 1);
    }
    char *slash = strrchr(full, '/');
    if (slash == full) slash[1] = 0;
    else *slash = 0;
    if (realpath(full, parent)) refuse = is_under(parent, strlen(parent));
done:
    errno = saved;
    return refuse;
}

static int refused(void) {
    add(&c()->creates_failed);
    errno = EIO;
    return -1;
}

static int needs_mode(int flags) {
    return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE;
}

#define MODE_ARG(flags) \
    mode_t mode = 0; \
    if (needs_mode(flags)) { va_list ap; va_start(ap, flags); mode = (mode_t)va_arg(ap, int); va_end(ap); }

typedef int (*open_fn)(const char *, int, ...);
typedef int (*openat_fn)(int, const char *, int, ...);
typedef int (*open2_fn)(const char *, int);
typedef int (*openat2_fn)(int, const char *, int);

int open(const char *path, int flags, ...) {
    MODE_ARG(flags)
    if (refuse_create(AT_FDCWD, path, flags)) return refused();
    return opened(NEXT(open_fn, "open")(path, flags, mode));
}
int open64(const char *path, int flags, ...) {
    MODE_ARG(flags)
    if (refuse_create(AT_FDCWD, path, flags)) return refused();
    return opened(NEXT(open_fn, "open64")(path, flags, mode));
}
int openat(int dirfd, const char *path, int flags, ...) {
    MODE_ARG(flags)
    if (refuse_create(dirfd, path, flags)) return refused();
    return opened(NEXT(openat_fn, "openat")(dirfd, path, flags, mode));
}
int openat64(int dirfd, const char *path, int flags, ...) {
    MODE_ARG(flags)
    if (refuse_create(dirfd, path, flags)) return refused();
    return opened(NEXT(openat_fn, "openat64")(dirfd, path, flags, mode));
}
int __open_2(const char *path, int flags) {
    if (refuse_create(AT_FDCWD, path, flags)) return refused();
    return opened(NEXT(open2_fn, "__open_2")(path, flags));
}
int __open64_2(const char *path, int flags) {
    if (refuse_create(AT_FDCWD, path, flags)) return refused();
    return opened(NEXT(open2_fn, "__open64_2")(path, flags));
}
int __openat_2(int dirfd, const char *path, int flags) {
    if (refuse_create(dirfd, path, flags)) return refused();
    return opened(NEXT(openat2_fn, "__openat_2")(dirfd, path, flags));
}
int __openat64_2(int dirfd, const char *path, int flags) {
    if (refuse_create(dirfd, path, flags)) return refused();
    return opened(NEXT(openat2_fn, "__openat64_2")(dirfd, path, flags));
}

/* A copy of a descriptor is the same handle (the same open file description). */
static int copied(int old, int fd) {
    if (fd >= 0 && fd != old) {
        uint64_t h = handle_of(old);
        if (fd < SLOTS) __atomic_store_n(&slots[fd], h, __ATOMIC_RELEASE);
        else if (h) add(&c()->untracked);
    }
    return fd;
}

int close(int fd) {
    clear(fd);
    return NEXT(int (*)(int), "close")(fd);
}
int dup(int old) {
    return copied(old, NEXT(int (*)(int), "dup")(old));
}
int dup2(int old, int new) {
    return copied(old, NEXT(int (*)(int, int), "dup2")(old, new));
}
int dup3(int old, int new, int flags) {
    return copied(old, NEXT(int (*)(int, int, int), "dup3")(old, new, flags));
}
/* The third argument is passed on as glibc reads it: one pointer-sized word. */
static int fcntl_copied(int fd, int cmd, int result) {
    return (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC) ? copied(fd, result) : result;
}
int fcntl(int fd, int cmd, ...) {
    va_list ap;
    va_start(ap, cmd);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    return fcntl_copied(fd, cmd, NEXT(int (*)(int, int, ...), "fcntl")(fd, cmd, arg));
}
int fcntl64(int fd, int cmd, ...) {
    va_list ap;
    va_start(ap, cmd);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    return fcntl_copied(fd, cmd, NEXT(int (*)(int, int, ...), "fcntl64")(fd, cmd, arg));
}

/* True if the write must fail; counts it either way. */
static int write_fails(int fd) {
    uint64_t h = handle_of(fd);
    if (!h) return 0;
    if (injecting(OP_WRITE)) {
        mark_failed(fd);
        add(&c()->writes_failed);
        errno = EIO;
        return 1;
    }
    add(&c()->writes);
    if (h & 1) add(&c()->reused);
    return 0;
}

ssize_t write(int fd, const void *buf, size_t n) {
    if (write_fails(fd)) return -1;
    return NEXT(ssize_t (*)(int, const void *, size_t), "write")(fd, buf, n);
}
ssize_t pwrite(int fd, const void *buf, size_t n, off_t offset) {
    if (write_fails(fd)) return -1;
    return NEXT(ssize_t (*)(int, const void *, size_t, off_t), "pwrite")(fd, buf, n, offset);
}
ssize_t pwrite64(int fd, const void *buf, size_t n, off64_t offset) {
    if (write_fails(fd)) return -1;
    return NEXT(ssize_t (*)(int, const void *, size_t, off64_t), "pwrite64")(fd, buf, n, offset);
}
ssize_t writev(int fd, const struct iovec *iov, int count) {
    if (write_fails(fd)) return -1;
    return NEXT(ssize_t (*)(int, const struct iovec *, int), "writev")(fd, iov, count);
}

/* True if the sync must fail; `*handle` is the descriptor's handle (0: not guarded). */
static int sync_fails(int fd, uint64_t *handle) {
    uint64_t h = handle_of(fd);
    *handle = h;
    if (!h) return 0;
    if (injecting(OP_SYNC)) {
        mark_failed(fd);
        add(&c()->syncs_failed);
        errno = EIO;
        return 1;
    }
    if (h & 1) add(&c()->reused);
    return 0;
}

static int synced(int result, uint64_t h) {
    if (h && result == 0) {
        add(&c()->syncs);
        __atomic_store_n(&c()->last_synced_handle, h >> 1, __ATOMIC_RELAXED);
    }
    return result;
}

int fsync(int fd) {
    uint64_t h;
    if (sync_fails(fd, &h)) return -1;
    return synced(NEXT(int (*)(int), "fsync")(fd), h);
}
int fdatasync(int fd) {
    uint64_t h;
    if (sync_fails(fd, &h)) return -1;
    return synced(NEXT(int (*)(int), "fdatasync")(fd), h);
}

__attribute__((constructor)) static void edgewatch_eio_init(void) {
    const char *o = getenv("EDGEWATCH_EIO_OPS");
    if (o) {
        if (strstr(o, "write")) ops |= OP_WRITE;
        if (strstr(o, "sync")) ops |= OP_SYNC;
        if (strstr(o, "create")) ops |= OP_CREATE;
    }
    const char *ctl = getenv("EDGEWATCH_EIO_CONTROL");
    if (ctl && strlen(ctl) < sizeof control) strcpy(control, ctl);
    const char *path = getenv("EDGEWATCH_EIO_COUNTS");
    if (path) {
        int fd = NEXT(open_fn, "open")(path, O_RDWR | O_CLOEXEC);
        if (fd >= 0) {
            void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            NEXT(int (*)(int), "close")(fd);
            if (p != MAP_FAILED) {
                struct counts *m = p;
                __atomic_fetch_add(&m->handles, early.handles, __ATOMIC_RELAXED);
                __atomic_store_n(&m->magic, 0x657765696f666c74ULL, __ATOMIC_RELEASE);
                __atomic_store_n(&counts, m, __ATOMIC_RELEASE);
            }
        }
    }
    const char *d = getenv("EDGEWATCH_EIO_DIR");
    if (d && strlen(d) < sizeof dir) {
        dir_len = strlen(d);
        memcpy(dir, d, dir_len + 1);
    }
}
"##;

/// Which operations fail while the fault is injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ops {
    /// `write`, `pwrite`, `pwrite64`, `writev`.
    pub writes: bool,
    /// `fsync`, `fdatasync`.
    pub syncs: bool,
    /// Opens with `O_CREAT` of a file that does not exist yet (nothing is created).
    pub creates: bool,
}

impl Ops {
    /// A device that fails every write: writes, syncs and creations.
    pub const ALL: Ops = Ops {
        writes: true,
        syncs: true,
        creates: true,
    };
    /// Only fsync and fdatasync fail: writes land in the page cache, their flush to the device
    /// fails (the case where a process must not trust its handle afterwards).
    pub const SYNCS: Ops = Ops {
        writes: false,
        syncs: true,
        creates: false,
    };

    fn env_value(self) -> String {
        let names = [
            (self.writes, "write"),
            (self.syncs, "sync"),
            (self.creates, "create"),
        ];
        names
            .iter()
            .filter(|(on, _)| *on)
            .map(|(_, name)| *name)
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// Setting up or reading the injector failed.
#[derive(Debug, thiserror::Error)]
pub enum FaultError {
    /// The library could not be built.
    #[error(transparent)]
    Build(#[from] PreloadError),
    /// A file of the injector (the guarded directory, the counts or control file) could not be
    /// made, read or removed.
    #[error("{}: {source}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The control file was placed under the guarded directory (it would guard itself).
    #[error("the control file {} is under the guarded directory {}", control.display(), dir.display())]
    ControlInsideDirectory {
        /// The control file.
        control: PathBuf,
        /// The guarded directory.
        dir: PathBuf,
    },
}

/// What the process did to files under the directory, at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EioCounts {
    /// The library is loaded and counting into the file.
    pub loaded: bool,
    /// Handles opened on files under the directory; also the number of the newest one.
    pub handles: u64,
    /// Writes refused with an injected EIO.
    pub writes_failed: u64,
    /// fsync/fdatasync calls refused with an injected EIO.
    pub syncs_failed: u64,
    /// Creations refused with an injected EIO.
    pub creates_failed: u64,
    /// Writes that went through.
    pub writes: u64,
    /// fsync/fdatasync calls that succeeded.
    pub syncs: u64,
    /// Writes or syncs that went through a handle which had met an injected error.
    pub reused: u64,
    /// The handle of the last successful sync (0: none yet).
    pub last_synced_handle: u64,
    /// Handles on descriptors beyond the library's table (not followed; must stay 0).
    pub untracked: u64,
    /// Handles that met an injected error (each counted once, when it first met one).
    pub handles_failed: u64,
    /// The handle that most recently met an injected error for the first time (0: none yet).
    pub last_failed_handle: u64,
}

/// The built library, its counts file and its control file, for one guarded directory.
#[derive(Debug)]
pub struct EioInjector {
    library: PathBuf,
    dir: PathBuf,
    control: PathBuf,
    counts: PathBuf,
    file: std::fs::File,
    ops: Ops,
}

impl EioInjector {
    /// Builds the library into `scratch` and creates its counts file there, to fail `ops` on
    /// files under `dir` (created if missing; `scratch` must not be inside it).
    pub fn build(scratch: &Path, dir: &Path, ops: Ops) -> Result<Self, FaultError> {
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| FaultError::File { path, source }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let dir = std::fs::canonicalize(dir).map_err(io(dir))?;
        let scratch = std::fs::canonicalize(scratch).map_err(io(scratch))?;
        let control = scratch.join("eio.on");
        if control.starts_with(&dir) {
            return Err(FaultError::ControlInsideDirectory { control, dir });
        }
        let library = preload::build(&scratch, "eio_inject", SOURCE, &["dl"])?;
        let counts = scratch.join("eio_counts");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&counts)
            .map_err(io(&counts))?;
        file.set_len(COUNTS_BYTES).map_err(io(&counts))?;
        Ok(Self {
            library,
            dir,
            control,
            counts,
            file,
            ops,
        })
    }

    /// Environment for the process: `LD_PRELOAD` and the library's settings.
    pub fn env(&self) -> Vec<(&'static str, OsString)> {
        vec![
            ("LD_PRELOAD", self.library.clone().into()),
            (ENV_DIR, self.dir.clone().into()),
            (ENV_CONTROL, self.control.clone().into()),
            (ENV_COUNTS, self.counts.clone().into()),
            (ENV_OPS, self.ops.env_value().into()),
        ]
    }

    /// The guarded directory, canonical.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// From now on, the operations fail (the control file exists).
    pub fn inject(&self) -> Result<(), FaultError> {
        std::fs::write(&self.control, b"").map_err(|source| FaultError::File {
            path: self.control.clone(),
            source,
        })
    }

    /// From now on, the operations go through again (the control file is gone).
    pub fn stop(&self) -> Result<(), FaultError> {
        match std::fs::remove_file(&self.control) {
            Err(source) if source.kind() != std::io::ErrorKind::NotFound => Err(FaultError::File {
                path: self.control.clone(),
                source,
            }),
            _ => Ok(()),
        }
    }

    /// The counters now.
    pub fn counts(&self) -> Result<EioCounts, FaultError> {
        let words =
            preload::read_words::<WORDS>(&self.file).map_err(|source| FaultError::File {
                path: self.counts.clone(),
                source,
            })?;
        let word = |i: usize| words[i];
        Ok(EioCounts {
            loaded: word(0) == MAGIC,
            handles: word(1),
            writes_failed: word(2),
            syncs_failed: word(3),
            creates_failed: word(4),
            writes: word(5),
            syncs: word(6),
            reused: word(7),
            last_synced_handle: word(8),
            untracked: word(9),
            handles_failed: word(10),
            last_failed_handle: word(11),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::process::{Command, Output};

    use super::*;

    /// A process that opens `argv[1]`, writes and fsyncs it once, waits while `argv[2]` exists,
    /// then writes and fsyncs through the same descriptor again: a process reusing its handle.
    const REUSER: &str = r#"
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
    if (argc < 3) return 2;
    int fd = open(argv[1], O_RDWR | O_CREAT, 0644);
    if (fd < 0) { perror("open"); return 2; }
    int first = write(fd, "a", 1) == 1 && fsync(fd) == 0;
    printf("first %s\n", first ? "ok" : "failed");
    fflush(stdout);
    while (access(argv[2], F_OK) == 0) usleep(10000);
    int second = write(fd, "b", 1) == 1 && fsync(fd) == 0;
    printf("second %s\n", second ? "ok" : "failed");
    return 0;
}
"#;

    struct Setup {
        _scratch: tempfile::TempDir,
        guarded: PathBuf,
        outside: PathBuf,
        injector: EioInjector,
    }

    fn setup(ops: Ops) -> Setup {
        let scratch = tempfile::tempdir().unwrap();
        let guarded = scratch.path().join("guarded");
        let outside = scratch.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        let injector = EioInjector::build(scratch.path(), &guarded, ops).unwrap();
        Setup {
            guarded: injector.dir().to_owned(),
            outside,
            injector,
            _scratch: scratch,
        }
    }

    fn run(injector: &EioInjector, program: &str, args: &[&std::ffi::OsStr]) -> Output {
        let mut command = Command::new(program);
        command.args(args);
        for (key, value) in injector.env() {
            command.env(key, value);
        }
        command.output().unwrap()
    }

    /// `dd` writing one block into `file` and fsyncing it.
    fn dd(injector: &EioInjector, file: &Path) -> Output {
        let of = format!("of={}", file.display());
        run(
            injector,
            "dd",
            &[
                "if=/dev/zero".as_ref(),
                of.as_ref(),
                "bs=512".as_ref(),
                "count=1".as_ref(),
                "conv=notrunc,fsync".as_ref(),
                "status=none".as_ref(),
            ],
        )
    }

    #[test]
    fn while_the_control_file_exists_writes_under_the_directory_fail_with_eio_and_elsewhere_succeed()
     {
        let s = setup(Ops::ALL);
        let inside = s.guarded.join("existing");
        std::fs::write(&inside, b"").unwrap();
        let outside = s.outside.join("file");

        let before = dd(&s.injector, &inside);
        assert!(before.status.success(), "{before:?}");
        let counts = s.injector.counts().unwrap();
        assert!(counts.loaded);
        assert_eq!((counts.handles, counts.writes, counts.syncs), (1, 1, 1));

        s.injector.inject().unwrap();
        let failed = dd(&s.injector, &inside);
        assert!(!failed.status.success());
        let stderr = String::from_utf8_lossy(&failed.stderr);
        assert!(stderr.contains("Input/output error"), "{stderr}");
        let elsewhere = dd(&s.injector, &outside);
        assert!(elsewhere.status.success(), "{elsewhere:?}");
        let counts = s.injector.counts().unwrap();
        assert_eq!(counts.handles, 2, "the file outside is no handle");
        assert_eq!(
            (counts.writes_failed, counts.writes, counts.syncs),
            (1, 1, 1)
        );
        assert_eq!((counts.handles_failed, counts.last_failed_handle), (1, 2));

        s.injector.stop().unwrap();
        let after = dd(&s.injector, &inside);
        assert!(after.status.success(), "{after:?}");
        let counts = s.injector.counts().unwrap();
        assert_eq!((counts.handles, counts.writes, counts.syncs), (3, 2, 2));
        assert_eq!(counts.last_synced_handle, 3);
        assert_eq!((counts.reused, counts.untracked), (0, 0));
    }

    #[test]
    fn a_new_file_under_the_directory_is_not_created_while_creations_fail() {
        let s = setup(Ops::ALL);
        s.injector.inject().unwrap();
        let new = s.guarded.join("sub-new");
        let script = format!("printf x > '{}'", new.display());
        let output = run(&s.injector, "sh", &["-c".as_ref(), script.as_ref()]);
        assert!(!output.status.success());
        assert!(!new.exists());
        assert_eq!(s.injector.counts().unwrap().creates_failed, 1);

        let outside = s.outside.join("new");
        let script = format!("printf x > '{}'", outside.display());
        let output = run(&s.injector, "sh", &["-c".as_ref(), script.as_ref()]);
        assert!(output.status.success(), "{output:?}");
        assert_eq!(std::fs::read(&outside).unwrap(), b"x");
    }

    #[test]
    fn a_sync_only_fault_lets_writes_through_and_fails_the_fsync() {
        let s = setup(Ops::SYNCS);
        let inside = s.guarded.join("existing");
        std::fs::write(&inside, b"").unwrap();
        s.injector.inject().unwrap();
        let output = dd(&s.injector, &inside);
        assert!(!output.status.success());
        let counts = s.injector.counts().unwrap();
        assert_eq!((counts.writes, counts.writes_failed), (1, 0));
        assert_eq!((counts.syncs, counts.syncs_failed), (0, 1));
        assert_eq!((counts.handles_failed, counts.last_failed_handle), (1, 1));
        assert_eq!(counts.reused, 0, "dd closed the handle whose fsync failed");
    }

    #[test]
    fn a_handle_used_again_after_its_fsync_failed_is_counted_as_reused() {
        let s = setup(Ops::SYNCS);
        let program = preload_free_program(&s, "reuser", REUSER);
        let file = s.guarded.join("reused");
        s.injector.inject().unwrap();
        let child = {
            let mut command = Command::new(&program);
            command
                .arg(&file)
                .arg(&s.injector.control)
                .stdout(std::process::Stdio::piped());
            for (key, value) in s.injector.env() {
                command.env(key, value);
            }
            command.spawn().unwrap()
        };
        let first_failed = (0..500).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            s.injector.counts().unwrap().syncs_failed == 1
        });
        assert!(first_failed, "the first fsync met the fault");
        s.injector.stop().unwrap();
        let output = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert_eq!(stdout, "first failed\nsecond ok\n");
        let counts = s.injector.counts().unwrap();
        assert_eq!(counts.handles, 1);
        assert_eq!(
            counts.reused, 2,
            "the second write and fsync went through the failed handle"
        );
        assert_eq!(counts.last_synced_handle, 1);
        assert_eq!(
            (counts.handles_failed, counts.last_failed_handle),
            (1, 1),
            "the handle is counted failed once, however often it is used again"
        );
    }

    /// Builds a small C program (an executable, not a library) into the scratch directory.
    fn preload_free_program(s: &Setup, name: &str, source: &str) -> PathBuf {
        let dir = s.outside.clone();
        let source_path = dir.join(format!("{name}.c"));
        let program = dir.join(name);
        std::fs::write(&source_path, source).unwrap();
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
        let output = Command::new(cc)
            .arg("-o")
            .arg(&program)
            .arg(&source_path)
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        program
    }
}
