//! Block devices of a test's own: a loop device over an image file, a file system made and
//! mounted on it, and the device's I/O counters from `/sys/block/<name>/stat`.
//!
//! ```text
//! image file (caller's temp dir) ─► LoopDevice (/dev/loopN) ─► mkfs ─► Mounted (dir)
//!                                        └─ stat(): /sys/block/loopN/stat, sectors written
//! ```
//!
//! Invariants:
//! - What is made is undone on drop: a [`Mounted`] is unmounted (lazily if still busy), a
//!   [`LoopDevice`] detached. Declare the device before the mount so that the mount drops first.
//! - Nothing is attempted without its prerequisites: [`prerequisites`] says what is missing
//!   (root, loop devices, a tool), for the caller's SKIP line or failure.
//! - Commands run to completion; a failure is an `Err` naming the command and its stderr.
//! - One rule for every privileged test ([`decide`], [`run_or_skip`]): a missing prerequisite
//!   is a SKIP with its reason, except where [`REQUIRE_FAULT_INJECTION`] is set (`.ci/run`: CI
//!   runs as root with loop devices), where it fails the test; a driver the running kernel lacks
//!   stays a SKIP there too, since no package adds one.

use std::path::{Path, PathBuf};
use std::process::Command;

/// `Ok` if this process may attach loop devices and mount them, and every tool in `tools` (with
/// `losetup`, `mount` and `umount`) is on the `PATH`; otherwise the reason, for a SKIP line.
pub fn prerequisites(tools: &[&str]) -> Result<(), String> {
    if !is_root() {
        return Err("needs root for loop devices and mounts".into());
    }
    if !Path::new("/dev/loop-control").exists() {
        return Err("no /dev/loop-control (loop devices unavailable)".into());
    }
    for tool in ["losetup", "mount", "umount"].iter().chain(tools) {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            return Err(format!(
                "{tool} not found (packages mount, e2fsprogs, dmsetup)"
            ));
        }
    }
    Ok(())
}

/// Set (to anything) where privileged tests must run: a missing prerequisite fails them.
pub const REQUIRE_FAULT_INJECTION: &str = "EDGEWATCH_REQUIRE_FAULT_INJECTION";

/// Why a privileged test cannot run on this machine.
#[derive(Debug, PartialEq, Eq)]
pub enum Missing {
    /// Something a machine can be given (root, loop devices, a package such as e2fsprogs or
    /// dmsetup): where privileged tests are required, its absence fails the test.
    Provisionable(String),
    /// A driver the running kernel does not have, neither built in nor as a module: no package
    /// or setup step adds it, so the test says SKIP even where privileged tests are required.
    Kernel(String),
}

/// What a privileged test does on this machine.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Run,
    Skip(String),
    Fail(String),
}

/// The rule: run if everything is there; a missing kernel driver is always a SKIP; anything
/// else missing is a failure where privileged tests are `required`, a SKIP elsewhere.
pub fn decide(prerequisites: Result<(), Missing>, required: bool) -> Verdict {
    match prerequisites {
        Ok(()) => Verdict::Run,
        Err(Missing::Kernel(reason)) if required => Verdict::Skip(format!(
            "{reason} (a SKIP even with {REQUIRE_FAULT_INJECTION}: no package adds a kernel \
             driver)"
        )),
        Err(Missing::Kernel(reason)) => Verdict::Skip(reason),
        Err(Missing::Provisionable(reason)) if required => Verdict::Fail(reason),
        Err(Missing::Provisionable(reason)) => Verdict::Skip(reason),
    }
}

/// True where privileged tests must run ([`REQUIRE_FAULT_INJECTION`] is set).
pub fn required() -> bool {
    std::env::var_os(REQUIRE_FAULT_INJECTION).is_some()
}

/// Applies [`decide`] for the test `what`: `true` to run it; `false` after printing
/// `SKIP <what>: <reason>`; panics naming the missing prerequisite where it is required.
#[allow(clippy::print_stdout)] // A SKIP says why on the test's output.
pub fn run_or_skip(what: &str, prerequisites: Result<(), Missing>) -> bool {
    match decide(prerequisites, required()) {
        Verdict::Run => true,
        Verdict::Skip(reason) => {
            println!("SKIP {what}: {reason}");
            false
        }
        Verdict::Fail(reason) => {
            panic!("{what}: a prerequisite is missing where it is required: {reason}")
        }
    }
}

/// The effective user id is 0 (read from `/proc/self/status`, so that this crate needs no libc).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .find_map(|line| line.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1))
            == Some("0")
    })
}

/// Runs `cmd args` to completion: its trimmed stdout, or an error naming it with its stderr.
pub fn run(cmd: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(format!(
            "{cmd} {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Creates (or truncates) `image` as a sparse file of `bytes`.
pub fn sparse_image(image: &Path, bytes: u64) -> Result<(), String> {
    let file = std::fs::File::create(image).map_err(|e| format!("{}: {e}", image.display()))?;
    file.set_len(bytes)
        .map_err(|e| format!("{}: {e}", image.display()))
}

/// A loop device over an image file; detached on drop.
#[derive(Debug)]
pub struct LoopDevice {
    path: String,
}

impl LoopDevice {
    /// Attaches the first free loop device to `image`.
    pub fn attach(image: &Path) -> Result<Self, String> {
        let image = image.to_str().ok_or("the image path is not UTF-8")?;
        let path = run("losetup", &["-f", "--show", image])?;
        Ok(Self { path })
    }

    /// `/dev/loopN`.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The kernel's name of the device, `loopN`.
    pub fn name(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or(&self.path)
    }

    /// The device's I/O counters now.
    pub fn stat(&self) -> Result<BlockStat, String> {
        let path = format!("/sys/block/{}/stat", self.name());
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
        BlockStat::parse(&text).ok_or_else(|| format!("{path}: unreadable: {text:?}"))
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = run("losetup", &["-d", &self.path]);
    }
}

/// The counters of `/sys/block/<dev>/stat` that tests read (Documentation/block/stat.rst).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockStat {
    /// Field 1: read requests completed.
    pub reads: u64,
    /// Field 3: 512-byte sectors read.
    pub sectors_read: u64,
    /// Field 5: write requests completed.
    pub writes: u64,
    /// Field 7: 512-byte sectors written.
    pub sectors_written: u64,
}

impl BlockStat {
    /// Parses the file's whitespace-separated fields; `None` if fewer than seven are numbers.
    pub fn parse(text: &str) -> Option<Self> {
        let fields: Vec<u64> = text
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        Some(Self {
            reads: *fields.first()?,
            sectors_read: *fields.get(2)?,
            writes: *fields.get(4)?,
            sectors_written: *fields.get(6)?,
        })
    }

    /// Bytes written to the device (sectors are 512 bytes in this file, whatever the device's
    /// block size).
    pub fn bytes_written(&self) -> u64 {
        self.sectors_written * 512
    }
}

/// A file system mounted at `dir`; unmounted on drop.
#[derive(Debug)]
pub struct Mounted {
    dir: PathBuf,
    /// False once [`Mounted::unmount`] succeeded: nothing left for the drop to undo.
    mounted: bool,
}

impl Mounted {
    /// Makes an ext4 file system on `device` (`mkfs.ext4 -q -F` with `mkfs_args`, for example
    /// `["-O", "^has_journal"]`; none for the defaults a distribution installs) and mounts it
    /// at `dir` (created if missing) with `options` (`-o`, if any).
    pub fn ext4(
        device: &str,
        mkfs_args: &[&str],
        dir: &Path,
        options: Option<&str>,
    ) -> Result<Self, String> {
        let mut args = vec!["-q", "-F"];
        args.extend_from_slice(mkfs_args);
        args.push(device);
        run("mkfs.ext4", &args)?;
        Self::mount(device, dir, options)
    }

    /// Mounts the file system on `device` at `dir` (created if missing).
    pub fn mount(device: &str, dir: &Path, options: Option<&str>) -> Result<Self, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let target = dir.to_str().ok_or("the mount point is not UTF-8")?;
        let mut args = Vec::new();
        if let Some(options) = options {
            args.extend(["-o", options]);
        }
        args.extend([device, target]);
        run("mount", &args)?;
        Ok(Self {
            dir: dir.to_owned(),
            mounted: true,
        })
    }

    /// The mount point.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Unmounts now, failing (rather than unmounting lazily, as a drop does) if the file
    /// system is still busy.
    pub fn unmount(mut self) -> Result<(), String> {
        let target = self.dir.to_str().ok_or("the mount point is not UTF-8")?;
        run("umount", &[target])?;
        self.mounted = false;
        Ok(())
    }

    /// Writes the file system's dirty data and metadata to the device (`sync -f`), so that a
    /// device counter read next includes what the page cache still held.
    pub fn sync(&self) -> Result<(), String> {
        let target = self.dir.to_str().ok_or("the mount point is not UTF-8")?;
        run("sync", &["-f", target]).map(|_| ())
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if !self.mounted {
            return;
        }
        let Some(target) = self.dir.to_str() else {
            return;
        };
        if run("umount", &[target]).is_err() {
            let _ = run("umount", &["-l", target]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_without_a_driver_is_a_skip_even_where_privileged_tests_are_required() {
        let no_driver = || Err(Missing::Kernel("no device-mapper".into()));
        for required in [false, true] {
            assert!(
                matches!(decide(no_driver(), required), Verdict::Skip(reason) if reason.contains("no device-mapper")),
                "required = {required}"
            );
        }
    }

    #[test]
    fn a_missing_tool_or_loop_device_fails_where_privileged_tests_are_required_and_skips_elsewhere()
    {
        let no_tool = || Err(Missing::Provisionable("dmsetup not found".into()));
        assert_eq!(
            decide(no_tool(), true),
            Verdict::Fail("dmsetup not found".into())
        );
        assert_eq!(
            decide(no_tool(), false),
            Verdict::Skip("dmsetup not found".into())
        );
        assert_eq!(decide(Ok(()), true), Verdict::Run);
        assert_eq!(decide(Ok(()), false), Verdict::Run);
    }

    #[test]
    fn the_stat_file_gives_sectors_written_from_its_seventh_field() {
        // A loop device's line: 17 fields, padded with spaces.
        let text = "     120        0     4816       31      350       12    24680      410        0      512      441        0        0        0        0        9        3\n";
        let stat = BlockStat::parse(text).unwrap();
        assert_eq!(
            stat,
            BlockStat {
                reads: 120,
                sectors_read: 4816,
                writes: 350,
                sectors_written: 24680,
            }
        );
        assert_eq!(stat.bytes_written(), 24680 * 512);
    }

    #[test]
    fn a_stat_line_with_too_few_or_unreadable_fields_is_refused() {
        assert_eq!(BlockStat::parse("1 2 3 4 5 6"), None);
        assert_eq!(BlockStat::parse("1 2 3 4 5 6 x"), None);
        assert_eq!(BlockStat::parse(""), None);
    }
}
