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

/// Starts the workload on `dir`, lets it run for `after`, SIGKILLs it and returns its stdout.
pub fn run_and_kill(dir: &Path, run: u64, seed: u64, budget: u64, after: Duration) -> String {
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
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        let _ = stdout.read_to_string(&mut out);
        out
    });
    std::thread::sleep(after);
    // Child::kill sends SIGKILL on Unix.
    let _ = child.kill();
    let status = child.wait().unwrap();
    assert!(
        status.code().is_none() || status.success(),
        "workload failed by itself: {status}"
    );
    reader.join().unwrap()
}
