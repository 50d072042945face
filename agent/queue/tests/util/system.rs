//! Privileged test plumbing: loop-mounted ext4 images (the test kit's `loopfs`) and the kernel's
//! writeback settings, each undone on drop. Tests that need them call [`privileged`]: a missing
//! prerequisite is a SKIP with the reason, or a failure where privileged tests are required
//! (`EDGEWATCH_REQUIRE_FAULT_INJECTION`, set by `.ci/run`).
#![allow(dead_code, clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use edgewatch_test_kit::loopfs::{self, LoopDevice, Missing, Mounted};

/// True if the test `what` may run here (root, loop devices, e2fsprogs); otherwise SKIP printed
/// with the reason (`false`), or a panic where privileged tests are required.
pub fn privileged(what: &str) -> bool {
    loopfs::run_or_skip(
        what,
        loopfs::prerequisites(&["mkfs.ext4"]).map_err(Missing::Provisionable),
    )
}

/// Creates a `bytes`-sized ext4 image at `image` (no blocks reserved for root).
pub fn make_ext4(image: &Path, bytes: u64) -> Result<(), String> {
    loopfs::sparse_image(image, bytes)?;
    let image = image.to_str().ok_or("the image path is not UTF-8")?;
    loopfs::run("mkfs.ext4", &["-q", "-F", "-m", "0", image]).map(|_| ())
}

/// An image mounted through a loop device of its own; unmounted and the device detached on drop.
pub struct Mount {
    pub dir: PathBuf,
    // Declared before the device: the file system is unmounted before the device goes.
    mounted: Mounted,
    _device: LoopDevice,
}

impl Mount {
    pub fn new(image: &Path, dir: &Path) -> Result<Self, String> {
        let device = LoopDevice::attach(image)?;
        let mounted = Mounted::mount(device.path(), dir, None)?;
        Ok(Self {
            dir: dir.to_owned(),
            mounted,
            _device: device,
        })
    }

    /// Unmounts now (an error if the file system is busy) and detaches the device.
    pub fn unmount(self) -> Result<(), String> {
        self.mounted.unmount()
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
