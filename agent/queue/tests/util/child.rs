//! Runs the `queue-workload` binary as a real child process and kills it with SIGKILL.
#![allow(dead_code, clippy::unwrap_used, clippy::print_stdout)]

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Small deterministic generator for the tests' own choices (kill delays, seeds).
pub struct Rng(pub u64);

impl Rng {
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// Seed for a crash test: `EDGEWATCH_QUEUE_SEED` or a fixed default, printed so a failure can be
/// replayed.
pub fn seed(default: u64) -> u64 {
    let seed = std::env::var("EDGEWATCH_QUEUE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    println!("seed {seed} (EDGEWATCH_QUEUE_SEED to replay)");
    seed
}

/// `name` from the environment, or `default`.
pub fn env_count(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// When to SIGKILL the workload.
#[derive(Clone, Copy, Debug)]
pub enum KillAt {
    /// This long after the process started (possibly while it opens and repairs the queue).
    AfterSpawn(Duration),
    /// This long after it reported the queue open (while it writes).
    AfterOpen(Duration),
}

impl KillAt {
    /// Mostly while writing, sometimes while opening: one kill in five lands at a random moment
    /// from the start.
    pub fn random(rng: &mut Rng, max_ms: u64) -> Self {
        let after = Duration::from_millis(rng.below(max_ms));
        if rng.below(5) == 0 {
            Self::AfterSpawn(after)
        } else {
            Self::AfterOpen(after)
        }
    }
}

/// Starts the workload on `dir`, SIGKILLs it at `kill` and returns its stdout.
pub fn run_and_kill(dir: &Path, run: u64, seed: u64, budget: u64, kill: KillAt) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_queue-workload"))
        .arg(dir)
        .arg(run.to_string())
        .arg(seed.to_string())
        .arg(budget.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let (opened_tx, opened) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        let mut buf = [0u8; 8192];
        let mut told = false;
        loop {
            match stdout.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    out.extend_from_slice(&buf[..n]);
                    if !told && out.contains(&b'\n') {
                        told = true;
                        let _ = opened_tx.send(());
                    }
                }
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    });
    match kill {
        KillAt::AfterSpawn(after) => std::thread::sleep(after),
        KillAt::AfterOpen(after) => {
            // A child that never opens is killed after the timeout and fails the check later.
            let _ = opened.recv_timeout(Duration::from_secs(20));
            std::thread::sleep(after);
        }
    }
    // Child::kill sends SIGKILL on Unix.
    let _ = child.kill();
    let status = child.wait().unwrap();
    assert!(
        status.code().is_none() || status.success(),
        "workload failed by itself: {status}"
    );
    reader.join().unwrap()
}
