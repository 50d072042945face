//! Building an `LD_PRELOAD` library from C source at test time, with the system C compiler: how
//! the scaffolding reaches into a real process to interpose libc functions (the HIL rig's
//! allocation counter, the disk-fault injector in [`crate::faults`]).
//!
//! ```text
//! C source (a &str in the caller) ─► <dir>/<name>.c ─► $CC -O2 -shared -fPIC ─► <dir>/lib<name>.so
//! ```
//!
//! Invariants:
//! - Everything is written under the caller's directory; nothing is installed or cached
//!   elsewhere, so each test builds its own library from the source it ships.
//! - The compiler is `$CC`, else `cc`; a failure names it, says what it printed and how to get one.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Building a library failed.
#[derive(Debug, thiserror::Error)]
pub enum PreloadError {
    /// The source could not be written into the caller's directory.
    #[error("writing {path}: {source}")]
    Write {
        /// The source file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The C compiler could not be run, or refused the source.
    #[error(
        "building {library} with `{cc}` failed: {detail} (install a C compiler: apt-get install -y build-essential, or set CC)"
    )]
    Build {
        /// The compiler.
        cc: String,
        /// The library it was to build.
        library: PathBuf,
        /// What went wrong: the spawn error or the compiler's output.
        detail: String,
    },
}

/// Writes `source` to `<dir>/<name>.c`, builds `<dir>/lib<name>.so` from it (position
/// independent, linked with `libs`, e.g. `["dl"]`) and returns the library's path.
pub fn build(dir: &Path, name: &str, source: &str, libs: &[&str]) -> Result<PathBuf, PreloadError> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let source_path = dir.join(format!("{name}.c"));
    let library = dir.join(format!("lib{name}.so"));
    std::fs::write(&source_path, source).map_err(|error| PreloadError::Write {
        path: source_path.clone(),
        source: error,
    })?;
    let failed = |detail: String| PreloadError::Build {
        cc: cc.clone(),
        library: library.clone(),
        detail,
    };
    let output = Command::new(&cc)
        .args(["-O2", "-shared", "-fPIC", "-o"])
        .arg(&library)
        .arg(&source_path)
        .args(libs.iter().map(|lib| format!("-l{lib}")))
        .output()
        .map_err(|error| failed(error.to_string()))?;
    if !output.status.success() {
        return Err(failed(
            String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        ));
    }
    Ok(library)
}

/// The first `N` native-endian 64-bit words of `file`: how a preloaded library's counters,
/// written into a shared file by the library, are read back by the test.
pub fn read_words<const N: usize>(file: &File) -> std::io::Result<[u64; N]> {
    let mut words = [0u64; N];
    let mut buf = [0u8; 8];
    for (i, word) in words.iter_mut().enumerate() {
        file.read_exact_at(&mut buf, (i * 8) as u64)?;
        *word = u64::from_ne_bytes(buf);
    }
    Ok(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_the_compiler_refuses_is_an_error_naming_the_library_and_the_compilers_complaint() {
        let dir = tempfile::tempdir().unwrap();
        let error = build(dir.path(), "broken", "this is not C;", &[]).unwrap_err();
        let text = error.to_string();
        assert!(text.contains("libbroken.so"), "{text}");
        assert!(text.contains("error"), "{text}");
    }

    #[test]
    fn a_library_is_built_under_the_callers_directory() {
        let dir = tempfile::tempdir().unwrap();
        let library = build(dir.path(), "empty", "int edgewatch_empty;\n", &[]).unwrap();
        assert_eq!(library, dir.path().join("libempty.so"));
        assert!(library.is_file());
    }
}
