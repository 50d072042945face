//! Privileged test plumbing: loop-mounted ext4 images and the kernel's writeback settings, each
//! undone on drop. Tests that need them call `privileged_or_skip` and print SKIP with the reason.
#![allow(dead_code, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// `Err(reason)` unless this process may mount loop devices and the tools exist.
pub fn privileged() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err("needs root for loop mounts".into());
    }
    if !Path::new("/dev/loop-control").exists() {
        return Err("no /dev/loop-control (loop devices unavailable)".into());
    }
    for tool in ["mkfs.ext4", "mount", "umount", "losetup"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            return Err(format!("{tool} not found (package e2fsprogs / mount)"));
        }
    }
    Ok(())
}

pub fn run(cmd: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd} {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Creates a `bytes`-sized ext4 image at `image`.
pub fn make_ext4(image: &Path, bytes: u64) -> Result<(), String> {
    let file = std::fs::File::create(image).map_err(|e| e.to_string())?;
    file.set_len(bytes).map_err(|e| e.to_string())?;
    drop(file);
    run(
        "mkfs.ext4",
        &["-q", "-F", "-m", "0", image.to_str().unwrap()],
    )
}

/// An image mounted through a loop device; unmounted (and the loop device released) on drop.
pub struct Mount {
    pub dir: PathBuf,
    mounted: bool,
}

impl Mount {
    pub fn new(image: &Path, dir: &Path) -> Result<Self, String> {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        run(
            "mount",
            &["-o", "loop", image.to_str().unwrap(), dir.to_str().unwrap()],
        )?;
        Ok(Self {
            dir: dir.to_owned(),
            mounted: true,
        })
    }

    pub fn unmount(mut self) -> Result<(), String> {
        self.mounted = false;
        run("umount", &[self.dir.to_str().unwrap()])
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.mounted {
            let _ = run("umount", &["-l", self.dir.to_str().unwrap()]);
        }
    }
}

const DIRTY_KNOBS: [&str; 6] = [
    "dirty_writeback_centisecs",
    "dirty_expire_centisecs",
    "dirty_background_bytes",
    "dirty_bytes",
    "dirty_background_ratio",
    "dirty_ratio",
];

/// Holds the kernel's writeback back (dirty pages stay in memory until an fsync forces them
/// out), restoring every setting on drop.
pub struct WritebackHeld {
    saved: Vec<(&'static str, String)>,
}

impl WritebackHeld {
    pub fn new() -> Result<Self, String> {
        let mut saved = Vec::new();
        for knob in DIRTY_KNOBS {
            let value = std::fs::read_to_string(format!("/proc/sys/vm/{knob}"))
                .map_err(|e| format!("reading vm.{knob}: {e}"))?;
            saved.push((knob, value.trim().to_owned()));
        }
        let held = Self { saved };
        for (knob, value) in [
            ("dirty_writeback_centisecs", "0"),
            ("dirty_expire_centisecs", "360000"),
            ("dirty_ratio", "90"),
            ("dirty_background_ratio", "80"),
        ] {
            std::fs::write(format!("/proc/sys/vm/{knob}"), value)
                .map_err(|e| format!("setting vm.{knob}: {e}"))?;
        }
        Ok(held)
    }
}

impl Drop for WritebackHeld {
    fn drop(&mut self) {
        // Ratios and byte limits exclude each other: restore the ratios, then any non-zero byte
        // limit (writing one zeroes its ratio, as it was).
        for (knob, value) in &self.saved {
            let is_bytes = knob.ends_with("_bytes");
            if is_bytes && value == "0" {
                continue;
            }
            if !is_bytes && knob.ends_with("_ratio") {
                let bytes_knob = knob.replace("_ratio", "_bytes");
                let bytes_set = self.saved.iter().any(|(k, v)| *k == bytes_knob && v != "0");
                if bytes_set {
                    continue;
                }
            }
            let _ = std::fs::write(format!("/proc/sys/vm/{knob}"), value);
        }
    }
}
