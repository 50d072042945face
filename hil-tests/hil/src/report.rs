//! The run's report: one Markdown file with every level's checks and numbers, and one PNG of the
//! wake-up latency distributions (agent on vs off when a level measured both).
//!
//! Invariants:
//! - Rendering is pure (the time is an argument); only [`write`] touches files.
//! - Every verdict in the report carries the numbers it was decided on, and a SKIP its reason.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::levels::Check;
use crate::levels::footprint::FootprintReport;
use crate::levels::interference::InterferenceReport;
use crate::levels::invariants::InvariantsReport;
use crate::levels::jetson::JetsonReport;
use crate::plot::{self, BLUE, Canvas, GREEN, ORANGE, Series};
use crate::stats::{LatencySummary, Verdict};

/// Everything one run measured.
#[derive(Default)]
pub struct RunReport<'a> {
    /// The command line that produced it.
    pub command: String,
    /// Seconds since the Unix epoch when the run ended.
    pub unix_s: u64,
    /// Machine facts: (name, value).
    pub machine: Vec<(String, String)>,
    /// Level 1.
    pub invariants: Option<&'a InvariantsReport>,
    /// Level 2.
    pub footprint: Option<&'a FootprintReport>,
    /// Level 3.
    pub interference: Option<&'a InterferenceReport>,
    /// Level 4.
    pub jetson: Option<&'a JetsonReport>,
}

/// `YYYY-MM-DD HH:MM` (UTC) of a Unix time (Howard Hinnant's civil-from-days).
pub fn utc(unix_s: u64) -> String {
    let days = (unix_s / 86_400) as i64;
    let secs = unix_s % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}",
        secs / 3600,
        secs % 3600 / 60
    )
}

fn us(ns: u64) -> String {
    format!("{:.1}", ns as f64 / 1000.0)
}

fn checks_table(out: &mut String, checks: &[Check]) {
    let _ = writeln!(out, "| check | result | measured |\n|---|---|---|");
    for c in checks {
        let _ = writeln!(
            out,
            "| {} | {} | {} |",
            c.name,
            match (c.skipped, c.pass) {
                (true, _) => "SKIP",
                (false, true) => "PASS",
                (false, false) => "**FAIL**",
            },
            c.detail.replace('|', "/")
        );
    }
    out.push('\n');
}

fn summary_row(out: &mut String, name: &str, s: &LatencySummary) {
    let _ = writeln!(
        out,
        "| {name} | {} | {} | {} | {} | {} | {} |",
        s.count,
        us(s.min_ns),
        us(s.p50_ns),
        us(s.p99_ns),
        us(s.p999_ns),
        us(s.max_ns)
    );
}

const SUMMARY_HEAD: &str = "| | cycles | min µs | p50 µs | p99 µs | p99.9 µs | max µs (logged, never gated) |\n|---|---|---|---|---|---|---|";

/// The Markdown text.
pub fn markdown(r: &RunReport<'_>) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# HIL timing report — {} UTC\n", utc(r.unix_s));
    let _ = writeln!(out, "Produced by:\n\n```sh\n{}\n```\n", r.command);
    if !r.machine.is_empty() {
        let _ = writeln!(out, "| machine | |\n|---|---|");
        for (k, v) in &r.machine {
            let _ = writeln!(out, "| {k} | {} |", v.replace('|', "/"));
        }
        out.push('\n');
    }
    if let Some(inv) = r.invariants {
        let _ = writeln!(
            out,
            "## Level 1 — invariants: {}\n",
            if inv.pass() { "PASS" } else { "FAIL" }
        );
        checks_table(&mut out, &inv.checks);
        let s = &inv.steady;
        let _ = writeln!(
            out,
            "Steady state (definition in `docs/hil.md`): {:.1} s window after warm-up; {} allocations, {} frees, {} minor faults, {} threads; the two 1 kHz loops wrote {} cycles meanwhile; {} allocations before the first window (start-up and warm-up); events taken by the queue in the window: {}; {} earlier windows set aside (events in the queue, or faults without allocation while the kernel took pages){}.\n",
            s.window_s,
            s.allocations.allocations,
            s.allocations.frees,
            s.minor_faults,
            s.threads,
            s.cycles_in_window,
            s.warm_up_allocations,
            s.events_in_window.map_or_else(
                || "unknown (no queue snapshot)".to_owned(),
                |n| n.to_string()
            ),
            s.discarded.len(),
            if s.discarded.is_empty() {
                String::new()
            } else {
                format!(" ({})", s.discarded.join("; "))
            }
        );
        match (&inv.drain, &inv.drain_note) {
            (Some(d), _) => {
                let per = |n: u64, d: u64| {
                    if d == 0 {
                        "-".to_owned()
                    } else {
                        format!("{:.1}", n as f64 / d as f64)
                    }
                };
                let _ = writeln!(
                    out,
                    "Drain path (reported, not gated): {} events in {} batches drained in {:.1} s after the link came back (reconnection included): {} allocations ({} per batch, {} per event), {:.1} MiB allocated, {} frees, {} minor faults; VmHWM {:.1} → {:.1} MiB.\n",
                    d.events,
                    d.batches,
                    d.seconds,
                    d.allocations.allocations,
                    per(d.allocations.allocations, d.batches),
                    per(d.allocations.allocations, d.events),
                    d.allocations.bytes as f64 / 1048576.0,
                    d.allocations.frees,
                    d.minor_faults,
                    d.hwm_kib.0 as f64 / 1024.0,
                    d.hwm_kib.1 as f64 / 1024.0
                );
            }
            (None, Some(note)) => {
                let _ = writeln!(out, "Drain path: {note}.\n");
            }
            (None, None) => {}
        }
    }
    if let Some(f) = r.footprint {
        let _ = writeln!(
            out,
            "## Level 2 — footprint: {}\n",
            if f.pass() { "PASS" } else { "FAIL" }
        );
        checks_table(&mut out, &f.checks);
        let _ = writeln!(
            out,
            "| agent over {:.1} s at 10× poll rates | value |\n|---|---|\n| CPU (schedstat) | {:.3}% of one core ({:.1} ms) |\n| CPU (utime+stime) | {} ms |\n| wake-ups (voluntary switches) | {} ({:.1}/s) |\n| preemptions (involuntary switches) | {} |\n| VmHWM / VmRSS | {:.1} / {:.1} MiB |\n| minor faults | {} ({:.1}/s) |\n| threads | {} |\n| heap allocations (events flowing) | {} ({:.1}/s, {:.1} KiB/s) |\n",
            f.window_s,
            f.cpu_fraction() * 100.0,
            f.cpu_ns as f64 / 1e6,
            f.cpu_ticks_ms,
            f.voluntary,
            f.wakeups_per_s(),
            f.nonvoluntary,
            f.vm_hwm_kib as f64 / 1024.0,
            f.vm_rss_kib as f64 / 1024.0,
            f.minor_faults,
            f.minor_faults as f64 / f.window_s.max(1e-9),
            f.threads,
            f.allocations.allocations,
            f.allocations_per_s(),
            f.allocations.bytes as f64 / 1024.0 / f.window_s.max(1e-9)
        );
        let _ = writeln!(
            out,
            "Preemption against the reference (a SCHED_IDLE sleeper on the agent's CPUs waking {:.1} times a second for {} µs of CPU, the agent's pattern in the warm-up), same window:\n\n| | on CPU ms | wake-ups | preemptions | per second on CPU |\n|---|---|---|---|---|\n| agent | {:.1} | {} | {} | {:.0} |\n| reference | {:.1} | {} | {} | {:.0} |\n",
            f.reference_pattern.0,
            f.reference_pattern.1.as_micros(),
            f.cpu_ns as f64 / 1e6,
            f.voluntary,
            f.nonvoluntary,
            f.nonvoluntary as f64 / (f.cpu_ns as f64 / 1e9).max(1e-9),
            f.reference.run_ns as f64 / 1e6,
            f.reference.voluntary,
            f.reference.nonvoluntary,
            f.reference.nonvoluntary as f64 / (f.reference.run_ns as f64 / 1e9).max(1e-9),
        );
        if let Some(p) = &f.preemption {
            let _ = writeln!(
                out,
                "The neighbours explain up to {:.1} of the agent's preemptions (the reference's rate, upper 99.9% bound, times the agent's time on CPU); beyond that: {:.1}, against the old fixed allowance of {} (reported, not gated: whom a neighbour preempts depends on when both wake).\n",
                p.neighbours_upper, p.excess, p.allowance
            );
        }
        match &f.traced {
            Ok((agent, reference)) => {
                let _ = writeln!(
                    out,
                    "The scheduler's trace of the window (`sched:sched_switch`), time on a CPU per wake-up and who took the CPU on each preemption:\n\n| | wake-ups | p50 µs | p99 µs | longest µs | preemptions | by (most frequent first) |\n|---|---|---|---|---|---|---|"
                );
                for (name, runs) in [("agent", agent), ("reference", reference)] {
                    let by = runs
                        .preempted_by
                        .iter()
                        .take(4)
                        .map(|(who, n)| format!("{} ×{n}", who.replace('|', "/")))
                        .collect::<Vec<_>>()
                        .join(", ");
                    let _ = writeln!(
                        out,
                        "| {name} | {} | {} | {} | {} | {} | {} |",
                        runs.wake_up_cpu_ns.len(),
                        us(runs.wake_up_cpu_quantile(0.5)),
                        us(runs.wake_up_cpu_quantile(0.99)),
                        us(runs.longest_wake_up_ns()),
                        runs.preemptions,
                        if by.is_empty() { "—".into() } else { by }
                    );
                }
                out.push('\n');
            }
            Err(reason) => {
                let _ = writeln!(out, "SKIP: no scheduler trace: {reason}.\n");
            }
        }
        let _ = writeln!(
            out,
            "The two synthetic 1 kHz loops (SCHED_OTHER) meanwhile:\n\n{SUMMARY_HEAD}"
        );
        for (name, s, _) in &f.loop_latency {
            summary_row(&mut out, name, s);
        }
        out.push('\n');
    }
    if let Some(i) = r.interference {
        let _ = writeln!(out, "## Level 3 — interference: {}\n", i.verdict.word());
        if let Verdict::Skip { reason, .. } = &i.verdict {
            let _ = writeln!(out, "SKIP: {reason}.\n");
        }
        if let Some(n) = i.verdict.numbers() {
            let _ = writeln!(
                out,
                "Evidence: at least {} clean pairs, at least {:.0}% of the pairs run. Gate: PASS when the upper {:.0}% bootstrap bound of the median paired Δp99 is within max({:.0} µs, {:.0}% of the baseline), FAIL when the lower {:.0}% bound exceeds it, SKIP when the interval holds it.\n\n| | µs |\n|---|---|\n| clean pairs | {} of {} |\n| baseline (median agent-off p99) | {:.1} |\n| median paired Δp99 (on − off) | {:+.1} |\n| lower {:.0}% bound | {:+.1} |\n| upper {:.0}% bound | {:+.1} |\n| allowance | {:.1} |\n",
                i.rule.min_clean_pairs,
                i.rule.min_clean_fraction * 100.0,
                i.rule.confidence * 100.0,
                i.rule.floor_us,
                i.rule.fraction_of_baseline * 100.0,
                i.rule.confidence * 100.0,
                n.pairs,
                i.pairs.len(),
                n.baseline_us,
                n.median_delta_us,
                i.rule.confidence * 100.0,
                n.lower_bound_us,
                i.rule.confidence * 100.0,
                n.upper_bound_us,
                n.allowance_us
            );
        }
        if !i.pairs.is_empty() {
            let _ = writeln!(
                out,
                "Loop: SCHED_FIFO 80, mlockall, 1 kHz on CPU {}; agent on CPU {:?}; seed {}; backlog {} events; events acknowledged {} → {} over the pairs.\n",
                i.loop_cpu.map_or("-".into(), |c| c.to_string()),
                i.agent_cpus,
                i.seed,
                i.backlog_events,
                i.acked.0,
                i.acked.1
            );
            let _ = writeln!(out, "Clean blocks pooled:\n\n{SUMMARY_HEAD}");
            summary_row(
                &mut out,
                "agent off",
                &LatencySummary::of(&mut i.off_latencies.clone()),
            );
            summary_row(
                &mut out,
                "agent on",
                &LatencySummary::of(&mut i.on_latencies.clone()),
            );
            out.push('\n');
            let _ = writeln!(
                out,
                "| pair | order | p99 off µs | p99 on µs | Δ µs | max off / on µs | dropped because |\n|---|---|---|---|---|---|---|"
            );
            for (k, p) in i.pairs.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} | {:+.1} | {} / {} | {} |",
                    k + 1,
                    if p.on_first { "on, off" } else { "off, on" },
                    us(p.off.summary.p99_ns),
                    us(p.on.summary.p99_ns),
                    (p.on.summary.p99_ns as f64 - p.off.summary.p99_ns as f64) / 1000.0,
                    us(p.off.summary.max_ns),
                    us(p.on.summary.max_ns),
                    p.dropped().unwrap_or_else(|| "-".into())
                );
            }
            out.push('\n');
        }
        if !i.cyclictest.is_empty() {
            let _ = writeln!(
                out,
                "cyclictest (rt-tests) on the same CPU after the pairs, the external reference:\n\n| arm | cycles | min µs | avg µs | max µs | over 1 ms |\n|---|---|---|---|---|---|"
            );
            for (arm, result) in &i.cyclictest {
                match result {
                    Ok(c) => {
                        let _ = writeln!(
                            out,
                            "| {arm} | {} | {} | {} | {} | {} |",
                            c.cycles, c.min_us, c.avg_us, c.max_us, c.overflows
                        );
                    }
                    Err(why) => {
                        let _ = writeln!(
                            out,
                            "| {arm} | not run: {} | | | | |",
                            why.replace('|', "/")
                        );
                    }
                }
            }
            out.push('\n');
        }
        for note in &i.notes {
            let _ = writeln!(out, "Note: {note}.\n");
        }
    }
    if let Some(j) = r.jetson {
        let _ = writeln!(
            out,
            "## Level 4 — Jetson: {}\n",
            if j.verdict.pass { "PASS" } else { "FAIL" }
        );
        let _ = writeln!(out, "| platform | |\n|---|---|");
        for (k, v) in &j.platform {
            let _ = writeln!(out, "| {k} | {} |", v.replace('|', "/"));
        }
        let _ = writeln!(
            out,
            "\n| block | agent | cycles | min µs | avg µs | max µs | overflows | loop misses |\n|---|---|---|---|---|---|---|---|"
        );
        for (k, (b, c)) in j.blocks.iter().enumerate() {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                k + 1,
                if b.agent_on { "on" } else { "off" },
                c.cycles,
                c.min_us,
                c.avg_us,
                c.max_us,
                c.overflows,
                b.loop_misses
            );
        }
        let _ = writeln!(
            out,
            "\nGate: max(on) {} µs ≤ max(off) {} µs + 10 µs and zero misses ({}).\n",
            j.verdict.max_on_us, j.verdict.max_off_us, j.verdict.misses
        );
        for f in &j.verdict.failures {
            let _ = writeln!(out, "- FAIL: {f}");
        }
    }
    out
}

fn expand(histograms: &[&crate::cyclictest::CyclictestResult]) -> Vec<u64> {
    let mut v = Vec::new();
    for h in histograms {
        for &(bucket_us, count) in &h.histogram {
            v.extend(std::iter::repeat_n(bucket_us * 1000, count as usize));
        }
    }
    v.sort_unstable();
    v
}

/// The chart for the run, if it measured latencies.
pub fn chart(r: &RunReport<'_>) -> Option<Canvas> {
    let label = |arm: &str, sorted: &[u64]| {
        let s = LatencySummary::of(&mut sorted.to_vec());
        format!("{arm}: {} CYCLES, P99 {} µS", s.count, us(s.p99_ns))
    };
    let x_max = |all: &[&[u64]]| {
        let p = all
            .iter()
            .filter_map(|v| crate::stats::percentile(v, 99.9))
            .max()
            .unwrap_or(1000);
        ((p as f64 / 1000.0) * 1.2).max(10.0)
    };
    if let Some(i) = r.interference
        && !i.on_latencies.is_empty()
    {
        let (on, off) = (&i.on_latencies[..], &i.off_latencies[..]);
        return Some(plot::ccdf_chart(
            "FIFO 1 KHZ LOOP WAKE-UP LATENCY, AGENT ON VS OFF (CLEAN PAIRS)",
            &[
                Series {
                    label: label("AGENT OFF", off),
                    sorted_ns: off,
                    colour: BLUE,
                },
                Series {
                    label: label("AGENT ON", on),
                    sorted_ns: on,
                    colour: ORANGE,
                },
            ],
            x_max(&[on, off]),
            1e-4,
        ));
    }
    if let Some(j) = r.jetson {
        let pick = |on: bool| {
            expand(
                &j.blocks
                    .iter()
                    .filter(|(b, _)| b.agent_on == on)
                    .map(|(_, c)| c)
                    .collect::<Vec<_>>(),
            )
        };
        let (on, off) = (pick(true), pick(false));
        return Some(plot::ccdf_chart(
            "CYCLICTEST ON THE CONTROL CORE, AGENT ON VS OFF",
            &[
                Series {
                    label: label("AGENT OFF", &off),
                    sorted_ns: &off,
                    colour: BLUE,
                },
                Series {
                    label: label("AGENT ON", &on),
                    sorted_ns: &on,
                    colour: ORANGE,
                },
            ],
            x_max(&[&on, &off]),
            1e-6,
        ));
    }
    if let Some(f) = r.footprint
        && !f.loop_latency.is_empty()
    {
        let colours = [BLUE, GREEN];
        let series: Vec<Series<'_>> = f
            .loop_latency
            .iter()
            .zip(colours)
            .map(|((name, _, sorted), colour)| Series {
                label: label(&name.to_uppercase(), sorted),
                sorted_ns: sorted,
                colour,
            })
            .collect();
        let all: Vec<&[u64]> = f.loop_latency.iter().map(|(_, _, v)| &v[..]).collect();
        return Some(plot::ccdf_chart(
            "SCHED_OTHER 1 KHZ LOOPS BESIDE THE AGENT (FOOTPRINT RUN)",
            &series,
            x_max(&all),
            1e-4,
        ));
    }
    None
}

/// Writes `report.md` (and `latency.png` when there is a chart) into `dir`.
pub fn write(dir: &Path, r: &RunReport<'_>) -> std::io::Result<(PathBuf, Option<PathBuf>)> {
    std::fs::create_dir_all(dir)?;
    let mut text = markdown(r);
    let png = match chart(r) {
        Some(canvas) => {
            let path = dir.join("latency.png");
            std::fs::write(&path, canvas.png().map_err(std::io::Error::other)?)?;
            text.push_str("![Wake-up latency distributions](latency.png)\n");
            Some(path)
        }
        None => None,
    };
    let md = dir.join("report.md");
    std::fs::write(&md, text)?;
    Ok((md, png))
}

/// Facts about this machine for the report header.
pub fn machine_facts() -> Vec<(String, String)> {
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".into());
    let kernel = std::fs::read_to_string("/proc/version")
        .map(|v| v.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default();
    let preempt = std::fs::read_to_string("/sys/kernel/debug/sched/preempt")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "(unknown)".into());
    vec![
        (
            "CPUs available".into(),
            format!("{:?}", crate::procfs::own_cpus()),
        ),
        ("CPU".into(), cpu_model),
        ("kernel".into(), kernel),
        ("preemption".into(), preempt),
        (
            "load average".into(),
            std::fs::read_to_string("/proc/loadavg")
                .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
                .unwrap_or_default(),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates_follow_the_civil_calendar() {
        assert_eq!(utc(0), "1970-01-01 00:00");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00");
        assert_eq!(utc(1_764_513_000), "2025-11-30 14:30");
    }
}
