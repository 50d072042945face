//! Lines parsed per second and heap allocations per line, against a whitespace-split baseline
//! measured in the same run, over every real capture line.
//!
//! `cargo bench -p tegrastats-parser --bench throughput` prints a Markdown table (medians over
//! the rounds). Without `--bench` (as under `cargo test --all-targets`) it runs one short round
//! as a smoke test.

#![allow(clippy::print_stdout)]

use std::hint::black_box;
use std::path::Path;
use std::str::FromStr;
use std::time::{Duration, Instant};

use edgewatch_test_kit::alloc::CountingAllocator;
use tegrastats_parser::{OwnedSample, parse_line};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator::new();

/// One way of going over a line.
struct Workload {
    name: &'static str,
    run: fn(&str),
}

fn split_baseline(line: &str) {
    for token in black_box(line).split_ascii_whitespace() {
        black_box(token);
    }
}

fn borrowed_parse(line: &str) {
    let _ = black_box(parse_line(black_box(line)));
}

fn owned_parse(line: &str) {
    let _ = black_box(OwnedSample::from_str(black_box(line)));
}

const WORKLOADS: [Workload; 3] = [
    Workload {
        name: "baseline: split on ASCII whitespace",
        run: split_baseline,
    },
    Workload {
        name: "`parse_line` (borrowed `Sample`)",
        run: borrowed_parse,
    },
    Workload {
        name: "`OwnedSample::from_str`",
        run: owned_parse,
    },
];

fn lines() -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("tests/data")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "txt"))
        .collect();
    files.sort();
    files
        .iter()
        .flat_map(|path| {
            let text = std::fs::read_to_string(path).expect("capture");
            text.lines().map(str::to_owned).collect::<Vec<_>>()
        })
        .collect()
}

/// Time for `reps` passes over all lines.
fn time(workload: &Workload, lines: &[String], reps: u32) -> Duration {
    let start = Instant::now();
    for _ in 0..reps {
        for line in lines {
            (workload.run)(line);
        }
    }
    start.elapsed()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let full = std::env::args().any(|arg| arg == "--bench");
    let lines = lines();
    let (rounds, round_target) = if full {
        (31, Duration::from_millis(40))
    } else {
        (1, Duration::from_millis(1))
    };

    // Passes per round so that the slowest workload takes about `round_target`.
    let one_pass = WORKLOADS
        .iter()
        .map(|w| time(w, &lines, 1))
        .max()
        .unwrap_or_default()
        .max(Duration::from_nanos(1));
    let reps = (round_target.as_nanos() / one_pass.as_nanos()).clamp(1, 100_000) as u32;

    // Rounds interleave the workloads, so drift in machine load hits them all alike.
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); WORKLOADS.len()];
    for _ in 0..rounds {
        for (workload, rate) in WORKLOADS.iter().zip(rates.iter_mut()) {
            let elapsed = time(workload, &lines, reps);
            rate.push(f64::from(reps) * lines.len() as f64 / elapsed.as_secs_f64());
        }
    }

    let allocations: Vec<f64> = WORKLOADS
        .iter()
        .map(|workload| {
            let before = ALLOCATOR.allocations();
            time(workload, &lines, 1);
            (ALLOCATOR.allocations() - before) as f64 / lines.len() as f64
        })
        .collect();

    let medians: Vec<f64> = rates.into_iter().map(median).collect();
    let bytes: usize = lines.iter().map(String::len).sum();
    println!(
        "{} capture lines ({} bytes, {:.0} bytes/line), {rounds} rounds of {reps} passes, \
         size_of::<Sample>() = {} bytes; medians:",
        lines.len(),
        bytes,
        bytes as f64 / lines.len() as f64,
        std::mem::size_of::<tegrastats_parser::Sample<'static>>()
    );
    println!();
    println!("| workload | lines/s (median) | ns/line | allocations/line | time vs baseline |");
    println!("|---|---:|---:|---:|---:|");
    for ((workload, rate), allocs) in WORKLOADS.iter().zip(&medians).zip(&allocations) {
        println!(
            "| {} | {:.0} | {:.0} | {:.2} | {:.1}x |",
            workload.name,
            rate,
            1e9 / rate,
            allocs,
            medians[0] / rate
        );
    }
}
