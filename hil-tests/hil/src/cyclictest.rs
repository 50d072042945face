//! cyclictest (rt-tests) as the external reference: its command line, its output parsed, and the
//! Jetson gate on its per-block maxima.
//!
//! Two output forms are read:
//! - `-q` without `-h`: one line per thread at exit,
//!   `T: 0 (20837) P:80 I:1000 C:    954 Min:      7 Act: 8291 Avg:   79 Max:    8424`.
//! - `-h N` (histogram): `NNNNNN CCCCCC` rows, one count column per thread, then `# Total:`,
//!   `# Min Latencies:`, `# Avg Latencies:`, `# Max Latencies:`, `# Histogram Overflows:` with one
//!   value per thread.
//!
//! Invariants:
//! - Pure: parsing and the gate read no files and no clock.
//! - A number that does not parse is an error naming the line, never a zero.

/// What one cyclictest run reports for its first (only) measuring thread, µs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CyclictestResult {
    /// Cycles measured (with `-h`: inside the histogram plus overflows).
    pub cycles: u64,
    /// Smallest latency.
    pub min_us: u64,
    /// Average latency.
    pub avg_us: u64,
    /// Largest latency.
    pub max_us: u64,
    /// Latencies above the histogram's range (`-h` only).
    pub overflows: u64,
    /// Histogram: (latency µs, count) for every non-empty bucket (`-h` only).
    pub histogram: Vec<(u64, u64)>,
}

/// Output that is not cyclictest's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// A line has a field that does not parse.
    #[error("line {line}: cannot read `{text}`")]
    BadLine {
        /// 1-based line number.
        line: usize,
        /// The line.
        text: String,
    },
    /// Neither a `T:` line nor histogram totals were found.
    #[error("no cyclictest result in the output (no `T:` line, no `# Max Latencies:`)")]
    NoResult,
}

fn field(line: &str, key: &str) -> Option<u64> {
    let rest = &line[line.find(key)? + key.len()..];
    rest.split_whitespace().next()?.parse().ok()
}

/// Parses cyclictest's output (either form) for the first thread.
pub fn parse(output: &str) -> Result<CyclictestResult, ParseError> {
    let mut result = CyclictestResult::default();
    let mut found = false;
    let mut histogram_total = None;
    for (n, line) in output.lines().enumerate() {
        let bad = || ParseError::BadLine {
            line: n + 1,
            text: line.to_owned(),
        };
        let line = line.trim_end();
        if let Some(rest) = line.strip_prefix("T:") {
            let get = |key| field(rest, key).ok_or_else(bad);
            result.cycles = get("C:")?;
            result.min_us = get("Min:")?;
            result.avg_us = get("Avg:")?;
            result.max_us = get("Max:")?;
            found = true;
            // Only the first thread.
            break;
        }
        if let Some(rest) = line.strip_prefix("# ") {
            let first = |rest: &str| -> Result<u64, ParseError> {
                rest.split_whitespace()
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(bad)
            };
            if let Some(v) = rest.strip_prefix("Total:") {
                histogram_total = Some(first(v)?);
            } else if let Some(v) = rest.strip_prefix("Min Latencies:") {
                result.min_us = first(v)?;
            } else if let Some(v) = rest.strip_prefix("Avg Latencies:") {
                result.avg_us = first(v)?;
            } else if let Some(v) = rest.strip_prefix("Max Latencies:") {
                result.max_us = first(v)?;
                found = true;
            } else if let Some(v) = rest.strip_prefix("Histogram Overflows:") {
                result.overflows = first(v)?;
            }
            continue;
        }
        let mut words = line.split_whitespace();
        if let (Some(bucket), Some(count)) = (words.next(), words.next())
            && bucket.bytes().all(|b| b.is_ascii_digit())
        {
            let bucket: u64 = bucket.parse().map_err(|_| bad())?;
            let count: u64 = count.parse().map_err(|_| bad())?;
            if count > 0 {
                result.histogram.push((bucket, count));
            }
        }
    }
    if !found {
        return Err(ParseError::NoResult);
    }
    // `# Total:` counts the samples inside the histogram; overflows come on top.
    if let Some(total) = histogram_total {
        result.cycles = total + result.overflows;
    }
    Ok(result)
}

/// The command line for one measuring block: `-m` (mlockall), SCHED_FIFO at `priority`, one
/// thread pinned to `cpu`, 1 ms interval, a histogram up to `histogram_us`, quiet, for
/// `seconds`, the main thread on `main_cpus` (cyclictest's own bookkeeping stays off the
/// measured core).
pub fn args(
    cpu: usize,
    priority: u8,
    seconds: u64,
    histogram_us: u64,
    main_cpus: &str,
) -> Vec<String> {
    let mut args = vec![
        "-m".to_owned(),
        "-p".to_owned(),
        priority.to_string(),
        "-a".to_owned(),
        cpu.to_string(),
        "-t".to_owned(),
        "1".to_owned(),
        "-i".to_owned(),
        "1000".to_owned(),
        "-h".to_owned(),
        histogram_us.to_string(),
        "-q".to_owned(),
        "-D".to_owned(),
        format!("{seconds}s"),
    ];
    if !main_cpus.is_empty() {
        args.push(format!("--mainaffinity={main_cpus}"));
    }
    args
}

/// One Jetson block: agent on or off, cyclictest's result and the synthetic loop's misses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JetsonBlock {
    /// Whether the agent ran during the block.
    pub agent_on: bool,
    /// cyclictest's maximum, µs.
    pub max_us: u64,
    /// Deadline misses the 25 Hz loop counted during the block.
    pub loop_misses: u64,
}

/// The Jetson gate's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JetsonVerdict {
    /// All conditions hold.
    pub pass: bool,
    /// Largest maximum over agent-on blocks, µs.
    pub max_on_us: u64,
    /// Largest maximum over agent-off blocks, µs.
    pub max_off_us: u64,
    /// Misses over all blocks.
    pub misses: u64,
    /// One sentence per failed condition.
    pub failures: Vec<String>,
}

/// Gate: max(on) ≤ max(off) + `slack_us` and zero loop misses; both arms must have run.
pub fn jetson_gate(blocks: &[JetsonBlock], slack_us: u64) -> JetsonVerdict {
    let max_of = |on: bool| {
        blocks
            .iter()
            .filter(|b| b.agent_on == on)
            .map(|b| b.max_us)
            .max()
    };
    let (on, off) = (max_of(true), max_of(false));
    let misses = blocks.iter().map(|b| b.loop_misses).sum();
    let mut failures = Vec::new();
    match (on, off) {
        (Some(on), Some(off)) if on > off + slack_us => failures.push(format!(
            "max latency with the agent on ({on} µs) exceeds the agent-off max ({off} µs) + {slack_us} µs"
        )),
        (Some(_), Some(_)) => {}
        _ => failures.push("both agent-on and agent-off blocks are needed".to_owned()),
    }
    if misses > 0 {
        failures.push(format!(
            "the 25 Hz loop missed {misses} deadlines (zero allowed)"
        ));
    }
    JetsonVerdict {
        pass: failures.is_empty(),
        max_on_us: on.unwrap_or(0),
        max_off_us: off.unwrap_or(0),
        misses,
        failures,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_line_gives_cycles_min_avg_and_max() {
        let r = parse("# /dev/cpu_dma_latency set to 0us\nT: 0 (20837) P:80 I:1000 C:    954 Min:      7 Act: 8291 Avg:   79 Max:    8424\n").unwrap();
        assert_eq!((r.cycles, r.min_us, r.avg_us, r.max_us), (954, 7, 79, 8424));
        assert!(r.histogram.is_empty());
    }

    #[test]
    fn a_histogram_gives_its_buckets_totals_and_overflows() {
        let text = "# Histogram\n000000 000000\n000003 000010\n000004 000002\n# Total: 000000012\n# Min Latencies: 00003\n# Avg Latencies: 00005\n# Max Latencies: 00450\n# Histogram Overflows: 00001\n# Histogram Overflow at cycle number:\n# Thread 0: 00094\n";
        let r = parse(text).unwrap();
        assert_eq!(r.histogram, vec![(3, 10), (4, 2)]);
        assert_eq!(
            (r.cycles, r.min_us, r.avg_us, r.max_us, r.overflows),
            (13, 3, 5, 450, 1)
        );
    }

    #[test]
    fn output_without_results_is_refused() {
        assert_eq!(parse("hello\n"), Err(ParseError::NoResult));
        assert!(matches!(
            parse("T: 0 (1) P:80 I:1000 C: x Min: 1 Avg: 2 Max: 3\n"),
            Err(ParseError::BadLine { line: 1, .. })
        ));
    }

    #[test]
    fn the_command_line_pins_one_fifo_thread_with_a_histogram() {
        let a = args(3, 95, 600, 400, "0-2");
        assert_eq!(
            a.join(" "),
            "-m -p 95 -a 3 -t 1 -i 1000 -h 400 -q -D 600s --mainaffinity=0-2"
        );
    }

    fn block(agent_on: bool, max_us: u64, loop_misses: u64) -> JetsonBlock {
        JetsonBlock {
            agent_on,
            max_us,
            loop_misses,
        }
    }

    #[test]
    fn the_jetson_gate_allows_ten_microseconds_over_the_agent_off_maximum() {
        let v = jetson_gate(&[block(false, 40, 0), block(true, 50, 0)], 10);
        assert!(v.pass, "{v:?}");
        let v = jetson_gate(
            &[block(false, 40, 0), block(true, 51, 0), block(false, 30, 0)],
            10,
        );
        assert!(!v.pass);
        assert_eq!((v.max_on_us, v.max_off_us), (51, 40));
        assert!(v.failures[0].contains("51 µs"), "{:?}", v.failures);
    }

    #[test]
    fn the_jetson_gate_fails_on_any_miss_and_on_a_missing_arm() {
        let v = jetson_gate(&[block(false, 40, 0), block(true, 20, 1)], 10);
        assert!(!v.pass);
        assert_eq!(v.misses, 1);
        let v = jetson_gate(&[block(true, 20, 0)], 10);
        assert!(!v.pass);
        assert!(v.failures[0].contains("both"), "{:?}", v.failures);
    }
}
