//! Incremental sha256 of an engine file: a resumable job that hashes at most a given number of
//! bytes per step, so the agent's single thread is never held for long (engines are hundreds of
//! MiB). The shell drives it one step per tick.
//!
//! Invariants:
//! - A job is tied to the file's identity (device, inode, size, mtime) taken when it started; a
//!   file that changes under the job fails it with [`HashError::Changed`] rather than yielding a
//!   hash of mixed contents. The identity is checked again on the open fd before a hash is
//!   returned.
//! - Reads go through one buffer allocated at construction; a step allocates nothing.
//! - Pages read are dropped from the page cache after hashing (`POSIX_FADV_DONTNEED`), so
//!   hashing a large engine does not evict what the control loop and inference need.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

use sha2::{Digest, Sha256};

/// Identity of a file's contents as far as metadata tells: a change to any field means the file
/// must be read again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileKey {
    /// Device.
    pub dev: u64,
    /// Inode.
    pub ino: u64,
    /// Length in bytes.
    pub size: u64,
    /// Modification time, ns since the epoch.
    pub mtime_ns: i128,
}

impl FileKey {
    /// The key of `meta`.
    pub fn of(meta: &std::fs::Metadata) -> FileKey {
        FileKey {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
        }
    }

    /// `stat` of `path` (follows symlinks: a deployment that swaps a link is a new file).
    /// Allocates nothing for paths shorter than a few hundred bytes.
    pub fn stat(path: &Path) -> io::Result<FileKey> {
        std::fs::metadata(path).map(|m| FileKey::of(&m))
    }
}

/// Hashing failed; the job is gone.
#[derive(Debug, thiserror::Error)]
pub enum HashError {
    /// Opening or reading the file failed.
    #[error("engine {op} failed: {source}")]
    Io {
        /// The call.
        op: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The file changed (size, mtime, inode) while it was being hashed.
    #[error("engine file changed while it was being hashed")]
    Changed,
}

/// What a step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// No job.
    Idle,
    /// Hashed up to `done` of `total` bytes.
    Progress {
        /// Bytes hashed so far.
        done: u64,
        /// File length.
        total: u64,
    },
    /// The whole file is hashed.
    Done {
        /// The file the hash is of.
        key: FileKey,
        /// sha256.
        digest: [u8; 32],
    },
}

struct Job {
    file: File,
    key: FileKey,
    hasher: Sha256,
    offset: u64,
}

/// A resumable sha256 of one file at a time.
pub struct EngineHasher {
    buf: Box<[u8]>,
    job: Option<Job>,
}

impl std::fmt::Debug for EngineHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineHasher")
            .field("buf", &self.buf.len())
            .field("job", &self.job.as_ref().map(|j| (j.key, j.offset)))
            .finish()
    }
}

impl EngineHasher {
    /// A hasher reading `read_size` bytes per call (at least 4 KiB).
    pub fn new(read_size: usize) -> EngineHasher {
        EngineHasher {
            buf: vec![0u8; read_size.max(4096)].into_boxed_slice(),
            job: None,
        }
    }

    /// The file being hashed, if any.
    pub fn job_key(&self) -> Option<FileKey> {
        self.job.as_ref().map(|j| j.key)
    }

    /// Bytes hashed and total of the current job.
    pub fn progress(&self) -> Option<(u64, u64)> {
        self.job.as_ref().map(|j| (j.offset, j.key.size))
    }

    /// Starts hashing `path` (replacing any job). The key is taken from the opened fd.
    pub fn start(&mut self, path: &Path) -> Result<FileKey, HashError> {
        self.job = None;
        let file = File::open(path).map_err(|source| HashError::Io { op: "open", source })?;
        let meta = file.metadata().map_err(|source| HashError::Io {
            op: "fstat",
            source,
        })?;
        let key = FileKey::of(&meta);
        advise(&file, 0, 0, libc::POSIX_FADV_SEQUENTIAL);
        self.job = Some(Job {
            file,
            key,
            hasher: Sha256::new(),
            offset: 0,
        });
        Ok(key)
    }

    /// Drops the current job.
    pub fn cancel(&mut self) {
        self.job = None;
    }

    /// Hashes up to `max_bytes` more (at least one read).
    pub fn step(&mut self, max_bytes: u64) -> Result<Step, HashError> {
        let Some(job) = self.job.as_mut() else {
            return Ok(Step::Idle);
        };
        let start = job.offset;
        let mut budget = max_bytes.max(1);
        while job.offset < job.key.size && budget > 0 {
            let want = (job.key.size - job.offset)
                .min(budget)
                .min(self.buf.len() as u64) as usize;
            let Some(buf) = self.buf.get_mut(..want) else {
                break;
            };
            let n = match job.file.read_at(buf, job.offset) {
                Ok(0) => {
                    self.job = None;
                    return Err(HashError::Changed);
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(source) => {
                    self.job = None;
                    return Err(HashError::Io { op: "read", source });
                }
            };
            job.hasher.update(buf.get(..n).unwrap_or_default());
            job.offset += n as u64;
            budget = budget.saturating_sub(n as u64);
        }
        advise(
            &job.file,
            start,
            job.offset - start,
            libc::POSIX_FADV_DONTNEED,
        );
        if job.offset < job.key.size {
            return Ok(Step::Progress {
                done: job.offset,
                total: job.key.size,
            });
        }
        let Some(job) = self.job.take() else {
            return Ok(Step::Idle);
        };
        let now = job.file.metadata().map_err(|source| HashError::Io {
            op: "fstat",
            source,
        })?;
        if FileKey::of(&now) != job.key {
            return Err(HashError::Changed);
        }
        Ok(Step::Done {
            key: job.key,
            digest: job.hasher.finalize().into(),
        })
    }
}

fn advise(file: &File, offset: u64, len: u64, advice: libc::c_int) {
    let (Ok(off), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
        return;
    };
    // SAFETY: posix_fadvise on an fd we own; it only passes integers. Advice is a hint, so its
    // result is not needed.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), off, len, advice) };
}

/// Lowercase hex of a digest.
pub fn hex(digest: &[u8; 32]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(64);
    for b in digest {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest_of(data: &[u8]) -> [u8; 32] {
        Sha256::digest(data).into()
    }

    #[test]
    fn hashing_in_small_steps_gives_the_one_shot_digest() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("e.engine");
        let data: Vec<u8> = (0..1_000_003u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&p, &data).unwrap();
        let mut h = EngineHasher::new(4096);
        let key = h.start(&p).unwrap();
        assert_eq!(key.size, data.len() as u64);
        let mut steps = 0;
        let digest = loop {
            steps += 1;
            match h.step(100_000).unwrap() {
                Step::Progress { done, total } => assert!(done < total),
                Step::Done { digest, .. } => break digest,
                Step::Idle => panic!("job vanished"),
            }
        };
        assert_eq!(steps, 11, "100 kB per step over 1 MB");
        assert_eq!(digest, digest_of(&data));
        assert_eq!(
            hex(&digest_of(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(h.step(1).unwrap(), Step::Idle);
    }

    #[test]
    fn a_file_rewritten_while_hashed_fails_the_job() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("e.engine");
        std::fs::write(&p, vec![1u8; 100_000]).unwrap();
        let mut h = EngineHasher::new(4096);
        h.start(&p).unwrap();
        assert!(matches!(h.step(10_000).unwrap(), Step::Progress { .. }));
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(50_000)
            .unwrap();
        let r = loop {
            match h.step(10_000) {
                Ok(Step::Progress { .. }) => continue,
                other => break other,
            }
        };
        assert!(matches!(r, Err(HashError::Changed)), "{r:?}");
        assert_eq!(h.job_key(), None);
    }
}
