//! Binaries of other workspace crates, for tests that run them as real processes.
//!
//! Cargo gives `CARGO_BIN_EXE_*` only to a binary's own crate. These helpers find a workspace
//! binary beside the running test executable (`target/<profile>/deps/<test>` →
//! `target/<profile>/`, which follows `CARGO_TARGET_DIR`), after running `cargo build -p <package>`
//! once per process so it is never missing or stale (a no-op when it is up to date).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use crate::{HarnessError, Result};

static BUILT: Mutex<BTreeMap<String, PathBuf>> = Mutex::new(BTreeMap::new());

/// Path of binary `bin` of workspace package `package`, built for the test's own profile.
pub fn workspace_binary(package: &str, bin: &str) -> Result<PathBuf> {
    let key = format!("{package}/{bin}");
    let mut built = BUILT
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(path) = built.get(&key) {
        return Ok(path.clone());
    }
    let exe = std::env::current_exe().map_err(HarnessError::io("locating the test executable"))?;
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| {
            HarnessError::Config("the test executable is not under target/<profile>/deps".into())
        })?
        .to_path_buf();
    let profile = profile_dir
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    let target_dir = profile_dir
        .parent()
        .ok_or_else(|| HarnessError::Config("no target directory above the profile".into()))?;
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = Command::new(cargo);
    build
        .current_dir(&workspace)
        .args(["build", "--quiet", "-p", package, "--bin", bin])
        .env("CARGO_TARGET_DIR", target_dir);
    if profile != "debug" {
        build.args(["--profile", &profile]);
    }
    let status = build.status().map_err(HarnessError::io(format!(
        "running cargo build -p {package}"
    )))?;
    if !status.success() {
        return Err(HarnessError::Config(format!(
            "cargo build -p {package} --bin {bin} failed"
        )));
    }
    let path = profile_dir.join(bin);
    if !path.is_file() {
        return Err(HarnessError::Config(format!(
            "no binary at {}",
            path.display()
        )));
    }
    built.insert(key, path.clone());
    Ok(path)
}
