//! Binaries of other workspace crates, for tests and tools that run them as real processes.
//!
//! Cargo gives `CARGO_BIN_EXE_*` only to a binary's own crate. These helpers find a workspace
//! binary in the running executable's profile directory: beside it for a binary
//! (`target/<profile>/<bin>`), one level up for a test (`target/<profile>/deps/<test>`); both
//! follow `CARGO_TARGET_DIR`. They first run `cargo build -p <package>` once per process, so the
//! binary is never missing or stale (a no-op when it is up to date).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use crate::{HarnessError, Result};

static BUILT: Mutex<BTreeMap<String, PathBuf>> = Mutex::new(BTreeMap::new());

/// Path of binary `bin` of workspace package `package`, built for the caller's own profile.
pub fn workspace_binary(package: &str, bin: &str) -> Result<PathBuf> {
    workspace_binary_in_profile(package, bin, None)
}

/// Path of binary `bin` of workspace package `package`, built for `profile` (e.g. `release`, for
/// tests that measure the shipped build) or, with `None`, for the caller's own profile. The
/// binary lands in the caller's target directory, under `<profile>/`.
pub fn workspace_binary_in_profile(
    package: &str,
    bin: &str,
    profile: Option<&str>,
) -> Result<PathBuf> {
    let mut paths = binaries_in(&profile_dir(profile)?, &[(package, bin)], &[])?;
    paths
        .pop()
        .ok_or_else(|| HarnessError::Config(format!("no binary {bin} built")))
}

/// Paths of several `(package, bin)` binaries, built by one `cargo build` (so its jobs overlap),
/// in the order asked, for the caller's own profile.
///
/// `unify_with` names packages selected in that build only for feature resolution: cargo unifies
/// dependency features over the packages it builds, so a program that selects its own package
/// here (and depends on the libraries of the binaries it runs) reuses every dependency its own
/// build compiled, instead of compiling a second variant of each.
pub fn workspace_binaries(wanted: &[(&str, &str)], unify_with: &[&str]) -> Result<Vec<PathBuf>> {
    binaries_in(&profile_dir(None)?, wanted, unify_with)
}

fn binaries_in(
    profile_dir: &Path,
    wanted: &[(&str, &str)],
    unify_with: &[&str],
) -> Result<Vec<PathBuf>> {
    let key = |package: &str, bin: &str| format!("{}/{package}/{bin}", profile_dir.display());
    let mut built = BUILT
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let missing: Vec<(&str, &str)> = wanted
        .iter()
        .copied()
        .filter(|(package, bin)| !built.contains_key(&key(package, bin)))
        .collect();
    if !missing.is_empty() {
        build(profile_dir, &missing, unify_with)?;
        for (package, bin) in missing {
            let path = profile_dir.join(bin);
            if !path.is_file() {
                return Err(HarnessError::Config(format!(
                    "no binary at {}",
                    path.display()
                )));
            }
            built.insert(key(package, bin), path);
        }
    }
    Ok(wanted
        .iter()
        .filter_map(|(package, bin)| built.get(&key(package, bin)).cloned())
        .collect())
}

/// `target/<profile>` of the running executable, or of `profile` beside it (cargo puts the `dev`
/// profile in `debug/`).
fn profile_dir(profile: Option<&str>) -> Result<PathBuf> {
    let exe = std::env::current_exe().map_err(HarnessError::io("locating the executable"))?;
    let mut dir = exe
        .parent()
        .ok_or_else(|| HarnessError::Config("the executable has no parent directory".into()))?;
    if dir.file_name().is_some_and(|name| name == "deps") {
        dir = dir.parent().ok_or_else(|| {
            HarnessError::Config("the test executable is not under target/<profile>/deps".into())
        })?;
    }
    match profile {
        None => Ok(dir.to_path_buf()),
        Some(profile) => {
            let target_dir = dir.parent().ok_or_else(|| {
                HarnessError::Config("no target directory above the profile".into())
            })?;
            Ok(target_dir.join(if profile == "dev" { "debug" } else { profile }))
        }
    }
}

fn build(profile_dir: &Path, wanted: &[(&str, &str)], unify_with: &[&str]) -> Result<()> {
    let profile = profile_dir
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    let target_dir = profile_dir
        .parent()
        .ok_or_else(|| HarnessError::Config("no target directory above the profile".into()))?;
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .current_dir(&workspace)
        .args(["build", "--quiet"])
        .env("CARGO_TARGET_DIR", target_dir);
    // `cargo run` and `cargo test` describe the running crate in the environment. Build scripts
    // that watch one of these variables (ring's watches `CARGO_MANIFEST_DIR`) would see it change
    // between this build and the user's own, and every build would recompile them and all their
    // dependents.
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(describes_running_crate) {
            command.env_remove(&name);
        }
    }
    if profile == "debug" && std::env::var_os("NEXTEST_RUN_ID").is_some() {
        // Under `cargo nextest run --workspace` (CI's test command) the binaries are already
        // built, with dependency features unified over every test of the workspace. A build that
        // selects fewer packages resolves other features, and would compile a second variant of
        // each crate whose features differ (about two minutes of the demo's end-to-end test).
        command.args(["--workspace", "--tests"]);
        for (_, bin) in wanted {
            command.args(["--bin", bin]);
        }
    } else {
        for package in unify_with {
            command.args(["-p", package]);
        }
        for (package, bin) in wanted {
            command.args(["-p", package, "--bin", bin]);
        }
    }
    if profile != "debug" {
        command.args(["--profile", &profile]);
    }
    let names = wanted
        .iter()
        .map(|(package, bin)| format!("-p {package} --bin {bin}"))
        .collect::<Vec<_>>()
        .join(" ");
    let status = command
        .status()
        .map_err(HarnessError::io(format!("running cargo build {names}")))?;
    if !status.success() {
        return Err(HarnessError::Config(format!("cargo build {names} failed")));
    }
    Ok(())
}

/// Whether `name` is a variable cargo sets for the crate it runs (not one configuring cargo).
fn describes_running_crate(name: &str) -> bool {
    name.starts_with("CARGO_PKG_")
        || matches!(
            name,
            "CARGO_MANIFEST_DIR"
                | "CARGO_MANIFEST_PATH"
                | "CARGO_MANIFEST_LINKS"
                | "CARGO_CRATE_NAME"
                | "CARGO_BIN_NAME"
                | "CARGO_PRIMARY_PACKAGE"
                | "CARGO_TARGET_TMPDIR"
                | "OUT_DIR"
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_running_crates_description_is_dropped_and_cargos_configuration_kept() {
        for name in [
            "CARGO_MANIFEST_DIR",
            "CARGO_PKG_NAME",
            "CARGO_BIN_NAME",
            "OUT_DIR",
        ] {
            assert!(describes_running_crate(name), "{name}");
        }
        for name in [
            "CARGO",
            "CARGO_HOME",
            "CARGO_TARGET_DIR",
            "CARGO_BUILD_JOBS",
            "PATH",
        ] {
            assert!(!describes_running_crate(name), "{name}");
        }
    }
}
