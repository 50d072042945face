//! Helpers shared by the integration tests: clocks, scratch directories, configs, event
//! filters, and the real `edgewatch-synthetic-loop` binary.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use edgewatch_proto::v1::{Event, ProbeState, Tier, event::Kind};
use edgewatch_samplers::deadline::{DeadlineConfig, RawDeadlineConfig, RawProbeConfig};
use edgewatch_samplers::{CollectingSink, Now};

/// Both clocks, read now.
pub fn now() -> Now {
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    Now {
        wall_unix_ns: i64::try_from(wall.as_nanos()).unwrap(),
        monotonic_ns: loop_probe::clock::monotonic_ns(),
    }
}

/// A scratch directory in /dev/shm (where probes live in production), else in the temp dir.
pub fn scratch() -> tempfile::TempDir {
    let b = &mut tempfile::Builder::new();
    b.prefix("samplers-test");
    if Path::new("/dev/shm").is_dir() {
        b.tempdir_in("/dev/shm")
    } else {
        b.tempdir()
    }
    .unwrap()
}

/// A probe entry for `path`.
pub fn probe(path: &Path) -> RawProbeConfig {
    RawProbeConfig {
        path: Some(path.to_path_buf()),
        ..RawProbeConfig::default()
    }
}

/// A fast config for tests: 100 Hz polls, snapshots every `snapshot_s`, no rate limits unless
/// set by `tweak`.
pub fn config(
    probes: Vec<RawProbeConfig>,
    snapshot_s: f64,
    tweak: impl FnOnce(&mut RawDeadlineConfig),
) -> DeadlineConfig {
    let mut d = RawDeadlineConfig {
        poll_hz: Some(100.0),
        snapshot_interval_s: Some(snapshot_s),
        burst_min_interval_s: Some(0.0),
        status_min_interval_s: Some(0.0),
        ..RawDeadlineConfig::default()
    };
    tweak(&mut d);
    DeadlineConfig::from_raw(&d, &probes).unwrap()
}

/// Events of one tier and kind, via `pick`.
pub fn picked<'a, T: 'a>(
    sink: &'a CollectingSink,
    tier: Tier,
    pick: impl Fn(&'a Kind) -> Option<&'a T> + 'a,
) -> impl Iterator<Item = &'a T> + 'a {
    sink.events
        .iter()
        .filter(move |(t, _)| *t == tier)
        .filter_map(move |(_, e): &'a (Tier, Event)| e.kind.as_ref().and_then(&pick))
}

/// Probe states reported for the loop named `loop_name`, in order.
pub fn states(sink: &CollectingSink, loop_name: &str) -> Vec<ProbeState> {
    picked(sink, Tier::Safety, |k| match k {
        Kind::ProbeStatus(s) => Some(s),
        _ => None,
    })
    .filter(|s| {
        s.control_loop
            .as_ref()
            .is_some_and(|l| l.loop_name == loop_name)
    })
    .map(|s| s.state())
    .collect()
}

/// The `edgewatch-synthetic-loop` binary of this workspace, built for the profile these tests
/// were built with.
///
/// Cargo gives `CARGO_BIN_EXE_*` only to the binary's own crate, so this finds it beside the
/// test executable (`target/<profile>/deps/<test>` → `target/<profile>/`), which also follows
/// `CARGO_TARGET_DIR`, and runs `cargo build -p edgewatch-synthetic-loop` once per test run
/// first so the binary is never missing or stale (a no-op when it is up to date).
pub fn synthetic_loop() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let exe = std::env::current_exe().unwrap();
        let profile_dir = exe.parent().and_then(Path::parent).unwrap().to_path_buf();
        let profile = profile_dir
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let target_dir = profile_dir.parent().unwrap();
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut build = Command::new(cargo);
        build
            .current_dir(&workspace)
            .args(["build", "--quiet", "-p", "edgewatch-synthetic-loop"])
            .env("CARGO_TARGET_DIR", target_dir);
        if profile != "debug" {
            build.args([
                "--profile",
                if profile == "release" {
                    "release"
                } else {
                    &profile
                },
            ]);
        }
        let status = build.status().unwrap();
        assert!(status.success(), "building edgewatch-synthetic-loop failed");
        let bin = profile_dir.join("edgewatch-synthetic-loop");
        assert!(bin.is_file(), "no binary at {}", bin.display());
        bin
    })
}
