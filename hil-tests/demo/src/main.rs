//! `edgewatch-demo`: runs the all-in-one demo and prints the fleet's SLO and cost report.
//!
//! Exit status: 0 after the report, 64 for a bad argument, 1 when the run failed (the message
//! names the log to read).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Parser;
use edgewatch_conventions::config::EXIT_BAD_CONFIG;
use edgewatch_demo::run::{Options, Outcome, run};
use edgewatch_demo::scenario::Plan;

/// Default run length: long enough for every part of the story, short enough to watch.
const DEFAULT_DURATION: &str = "90s";
/// Run length of `--quick`.
const QUICK_DURATION: &str = "36s";

#[derive(Parser)]
#[command(
    name = "edgewatch-demo",
    version,
    about = "Runs a simulated fleet (real agents, control loops, embedded broker, gateway) and prints its SLO and cost report"
)]
struct Cli {
    /// How long the machines operate (e.g. 90s, 2m); 24 s to 1 h.
    #[arg(long, default_value = DEFAULT_DURATION, value_parser = run_length)]
    duration: Duration,
    /// A short run (36 s of operation), as the tests use.
    #[arg(long, conflicts_with = "duration")]
    quick: bool,
    /// Output directory (created); default: a new directory under the system temp directory.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// After the report, keep the broker, gateway and agents running until Ctrl-C, to explore
    /// them with the fleet page (its address is printed), `edgewatch-agent status` and
    /// `edgewatch-gateway report`.
    #[arg(long)]
    keep: bool,
}

/// `--duration` in the workspace's one duration grammar; [`Plan::new`] checks its range.
fn run_length(text: &str) -> Result<Duration, String> {
    edgewatch_conventions::duration::parse(text).map_err(|error| error.to_string())
}

fn default_out() -> PathBuf {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(0));
    let stamp: String = edgewatch_slo::format_rfc3339(ms - ms % 1000)
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .collect();
    std::env::temp_dir().join(format!("edgewatch-demo-{stamp}"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let duration = if cli.quick {
        run_length(QUICK_DURATION).unwrap_or(cli.duration)
    } else {
        cli.duration
    };
    let plan = match Plan::new(duration) {
        Ok(plan) => plan,
        Err(error) => {
            eprintln!("edgewatch-demo: {error}");
            return ExitCode::from(EXIT_BAD_CONFIG);
        }
    };
    let out = cli.out.unwrap_or_else(default_out);
    print_intro(&plan, &out);
    let options = Options {
        plan,
        out,
        keep: cli.keep,
    };
    match run(&options, &mut std::io::stdout()) {
        Ok(outcome) => {
            print_outcome(&outcome, &options);
            if let Some(kept) = outcome.kept {
                kept.wait();
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("edgewatch-demo: {error}");
            eprintln!(
                "edgewatch-demo: files of this run: {}",
                options.out.display()
            );
            ExitCode::FAILURE
        }
    }
}

fn print_intro(plan: &Plan, out: &std::path::Path) {
    println!(
        "edgewatch demo: {} machines operate for {} s, then the fleet's SLO and cost report.",
        plan.machines.len(),
        plan.duration.as_secs()
    );
    println!("Files (configs, queues, store, logs): {}", out.display());
    println!();
    for m in &plan.machines {
        println!(
            "  {:<14} {:<11} {:<10} {} {:<6} {}",
            m.id,
            m.class,
            m.site,
            edgewatch_demo::scenario::MODEL,
            m.model_version,
            m.role.describe()
        );
    }
    println!();
}

fn print_outcome(outcome: &Outcome, options: &Options) {
    let s = &outcome.summary;
    let out = &options.out;
    println!();
    println!("== Fleet SLO and cost report (edgewatch-gateway report) ==");
    println!();
    print!("{}", outcome.report);
    println!();
    println!(
        "Time scale: the SLOs have a 30-day period and burn-rate windows of 5 minutes to 3 days; \
         this fleet has {} s of data, so compliance and budgets cover the data present. At 99.99 %, \
         a handful of misses in a few thousand cycles exhausts a budget, which is why the policy \
         acts on them.",
        s.duration_s.round()
    );
    println!();
    println!(
        "What the control loops counted of themselves, by their own clocks (the report's rows add \
         up the machines of one class, site and version):"
    );
    for m in &s.machines {
        let t = &m.injected.tally.total;
        println!(
            "  {:<14} {:>5} activations  {:>3} deadline misses ({:>2} skipped)  {:>2} overruns  \
             {} fallbacks  {} interventions  {} safe stops  {:>5.1} s autonomous",
            m.id,
            t.activations,
            t.deadline_misses,
            t.skipped,
            t.overruns,
            t.fallbacks,
            t.interventions,
            t.safe_stops,
            t.autonomous_ns as f64 / 1e9
        );
    }
    let r = &s.restart;
    // Whole seconds since the loops started, as the progress lines stamp them.
    let offset = |ms: i64| (ms - s.loops_started_unix_ms) / 1000;
    println!(
        "{}'s agent was killed ({}) at {} s and started again at {} s; its loop ran on, and its \
         counts include what the loop did meanwhile.",
        r.machine,
        r.signal,
        offset(r.killed_unix_ms),
        offset(r.restarted_unix_ms)
    );
    println!();
    println!("Files of this run: {}", out.display());
    println!(
        "  configs   gateway/gateway.toml, machines/<id>/agent.toml (and loop.script, model.json)"
    );
    println!("  queues    machines/<id>/queue/");
    println!("  store     gateway/store.redb");
    println!("  logs      gateway/gateway.log, machines/<id>/agent.log, machines/<id>/loop.log");
    println!("  report    report.txt, report.json");
    println!("  FOCUS     focus.csv, focus-autonomy.csv");
    println!("  summary   demo-summary.json (timeline, each loop's tally, the agent restart)");
    println!();
    println!("Report again (or with --json):");
    println!(
        "  {} --config {} report --at {} --from {} --to {}",
        outcome.gateway_binary.display(),
        out.join("gateway/gateway.toml").display(),
        s.report_at,
        s.report_from,
        s.report_to
    );
    println!(
        "Took {:.0} s: build {:.0} s, setup {:.0} s, operation {:.0} s, drain {:.0} s, report {:.0} s.",
        s.timings.total_s,
        s.timings.build_s,
        s.timings.setup_s,
        s.timings.run_s,
        s.timings.drain_s,
        s.timings.report_s
    );
    println!();
    if outcome.kept.is_some() {
        println!(
            "Fleet page: {} (the gateway keeps serving it, with the broker and agents, until Ctrl-C)",
            outcome.page_url
        );
    } else {
        println!(
            "Fleet page: {} was served while the gateway ran; --keep keeps it, or serve it from \
             the store with:",
            outcome.page_url
        );
        println!(
            "  {} --config {} page",
            outcome.gateway_binary.display(),
            out.join("gateway/gateway.toml").display()
        );
    }
}
