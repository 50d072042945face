//! The deadline SLO counts what its semantics say, and every row says which semantics it counts.
//! An activation misses its deadline when it completes after release + D or never runs; overruns
//! are a diagnostic. Agents with deadline semantics send `activations` and `deadline_misses`
//! (COMPLETION); agents from before send only `cycles` and `misses` (= overruns, UNSPECIFIED);
//! a loop whose probe predates deadlines (ABI 1) has no deadline misses at all (LEGACY_PROBE).
//!
//! Real batches go through a real Mosquitto into the real gateway binary at its packaged default
//! configuration (only the PROVISION lines filled in), a real Prometheus is fed by remote-write,
//! and `report --json` (and the table) from the embedded store and from `--prometheus` are
//! compared with each other and, exactly, with the counts the test injected.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

mod util;

use edgewatch_harness::mosquitto::Mosquitto;
use edgewatch_harness::prometheus::Prometheus;
use edgewatch_proto::v1::{
    Batch, DeadlineCounters, DeadlineSemantics, Event, LoopRef, ModelVersion, Tier, event,
};
use serde_json::Value;
use util::*;

const MINUTE_NS: i64 = 60_000_000_000;
/// Snapshots every five minutes for six hours.
const STEP_NS: i64 = 5 * MINUTE_NS;
const STEPS: u64 = 72;
/// 25 Hz for five minutes.
const PER_STEP: u64 = 7_500;
/// The default catalog's safety-control objective, as a budget.
const BUDGET: f64 = 1e-4;
const VERSION: &str = "5.0.0";
/// The loop's relative deadline: its period at 25 Hz.
const DEADLINE_NS: u64 = 40_000_000;

/// Cumulative counts of one snapshot.
#[derive(Clone, Copy)]
struct Counts {
    activations: u64,
    deadline_misses: u64,
    overruns: u64,
    skipped: u64,
}

/// The deadline counters an agent sends for `counts` under `semantics`: the fields of agents
/// from before deadlines always (`cycles` recorded, `misses` = overruns, `skipped`), the new
/// ones as the semantics has them.
fn counters(start_ns: i64, counts: Counts, semantics: DeadlineSemantics) -> event::Kind {
    let mut c = DeadlineCounters {
        control_loop: Some(LoopRef {
            loop_id: 1,
            loop_name: "safety".into(),
        }),
        model: Some(ModelVersion {
            name: "haul-perception".into(),
            version: VERSION.into(),
            ..Default::default()
        }),
        start_time_unix_ns: start_ns,
        period_ns: DEADLINE_NS,
        budget_ns: 30_000_000,
        cycles: counts.activations - counts.skipped,
        misses: counts.overruns,
        skipped: counts.skipped,
        ..Default::default()
    };
    match semantics {
        DeadlineSemantics::Unspecified => {}
        DeadlineSemantics::Completion => {
            c.activations = Some(counts.activations);
            c.deadline_misses = Some(counts.deadline_misses);
            c.overruns = Some(counts.overruns);
            c.deadline_ns = DEADLINE_NS;
        }
        DeadlineSemantics::LegacyProbe => {
            c.activations = Some(counts.activations);
            c.overruns = Some(counts.overruns);
        }
    }
    c.semantics = semantics as i32;
    event::Kind::DeadlineCounters(c)
}

/// One machine's SLO batches: snapshot `i` (from `first`) stamped `t0 + i × 5 min`, in batches
/// of twelve.
fn machine(
    id: &str,
    site: &str,
    t0: i64,
    snapshots: impl IntoIterator<Item = (u64, event::Kind)>,
) -> Vec<Batch> {
    let events: Vec<Event> = snapshots
        .into_iter()
        .map(|(i, kind)| Event {
            seq: i,
            event_time_unix_ns: t0 + i as i64 * STEP_NS,
            monotonic_ns: i,
            kind: Some(kind),
        })
        .collect();
    events
        .chunks(12)
        .map(|chunk| {
            let mut batch = batch(id, 3, Tier::Slo, chunk.to_vec());
            batch.site_id = site.into();
            batch
        })
        .collect()
}

/// Publishes `batches`, waits until the gateway acknowledged them, and returns `report --json`
/// and the table at `at_ms` from the store, after checking that Prometheus gives the same
/// report and that nothing was refused.
async fn publish_and_report(client_id: &str, batches: &[Batch], at_ms: i64) -> (Value, String) {
    let broker = Mosquitto::start().unwrap();
    let prometheus = Prometheus::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let url = prometheus.remote_write_url();
    let gateway = Gateway::start_packaged(dir.path(), broker.addr(), client_id, Some(&url));
    let messages: Vec<_> = batches.iter().map(message).collect();
    let total = messages.len() as f64;
    publish_all(broker.addr(), &format!("agent-{client_id}"), &messages).await;
    gateway.wait_metric("edgewatch_gateway_messages_acked_total", |v| v == total);

    let at = edgewatch_slo::format_rfc3339(at_ms);
    let base = prometheus.base_url();
    let json = |source: Option<&str>| {
        let mut args = vec!["report", "--json", "--at", &at];
        if let Some(url) = source {
            args.extend(["--prometheus", url]);
        }
        serde_json::from_str::<Value>(&gateway.command(&args)).unwrap()
    };
    let from_store = json(None);
    let from_prometheus = json(Some(&base));
    assert_eq!(from_store, from_prometheus, "the two sources disagree");
    let text = gateway.command(&["report", "--at", &at]);
    let text_prometheus = gateway.command(&["report", "--at", &at, "--prometheus", &base]);
    assert_eq!(text, text_prometheus);
    for row in from_store["slo"]["rows"].as_array().unwrap() {
        assert!(row["incomplete"].is_null(), "refused: {row:#}");
    }
    (from_store, text)
}

/// The one `safety-control` row of `site`.
fn row<'a>(report: &'a Value, site: &str) -> &'a Value {
    let rows = report["slo"]["rows"].as_array().unwrap();
    let found: Vec<&Value> = rows
        .iter()
        .filter(|r| r["slo"] == "safety-control" && r["site"] == site)
        .collect();
    assert_eq!(found.len(), 1, "safety-control rows of {site}: {rows:#?}");
    found[0]
}

/// The table line of `safety-control` for `site`.
fn line<'a>(text: &'a str, site: &str) -> &'a str {
    text.lines()
        .find(|l| l.starts_with("safety-control") && l.contains(&format!(" {site} ")))
        .unwrap_or_else(|| panic!("no safety-control line for {site}:\n{text}"))
}

fn assert_close(actual: &Value, expected: f64, what: &str) {
    let actual = actual
        .as_f64()
        .unwrap_or_else(|| panic!("{what}: {actual}"));
    assert!(
        (actual - expected).abs() <= 1e-12 * expected.abs().max(1.0),
        "{what}: {actual}, expected {expected}"
    );
}

/// The row's burn rates as (window, long, short).
fn burn_rates(row: &Value) -> Vec<(String, Value, Value)> {
    row["burn_rates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["window"].as_str().unwrap().to_owned(),
                b["long"].clone(),
                b["short"].clone(),
            )
        })
        .collect()
}

/// Six hours and two minutes ago, so that the last snapshot is two minutes old; the report is
/// evaluated a minute after it, so its 1 h window holds exactly the last twelve snapshots and
/// its 5 min window the last one.
fn timeline() -> (i64, i64) {
    let t0 = now_ns() - STEPS as i64 * STEP_NS - 2 * MINUTE_NS;
    let at_ms = (t0 + STEPS as i64 * STEP_NS + MINUTE_NS) / 1_000_000;
    (t0, at_ms)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_completion_without_overrun_is_a_miss_and_an_overrun_meeting_its_deadline_is_not() {
    let (t0, at_ms) = timeline();
    // pit-late: no step overruns its budget, but one activation an interval completes after
    // its deadline (it started late), then twenty an interval in the last hour.
    let late = |i: u64| Counts {
        activations: PER_STEP * i,
        deadline_misses: if i <= 60 { i } else { 60 + 20 * (i - 60) },
        overruns: 0,
        skipped: 0,
    };
    // pit-overrun: five steps an interval overrun their budget and still complete within D.
    let overrun = |i: u64| Counts {
        activations: PER_STEP * i,
        deadline_misses: 0,
        overruns: 5 * i,
        skipped: 0,
    };
    let completion = DeadlineSemantics::Completion;
    let mut batches = machine(
        "truck-late",
        "pit-late",
        t0,
        (1..=STEPS).map(|i| (i, counters(t0, late(i), completion))),
    );
    batches.extend(machine(
        "truck-overrun",
        "pit-overrun",
        t0,
        (1..=STEPS).map(|i| (i, counters(t0, overrun(i), completion))),
    ));
    let (report, text) = publish_and_report("gw-completion", &batches, at_ms).await;

    // Late completions: 300 deadline misses of 540,000 activations, 240 of them in the last
    // hour's 90,000 and 20 in the last interval's 7,500.
    let row_late = row(&report, "pit-late");
    let activations = (PER_STEP * STEPS) as f64;
    assert_eq!(row_late["total_events"], activations, "{row_late:#}");
    assert_eq!(row_late["bad_events"], 300.0, "{row_late:#}");
    let ratio = 300.0 / activations;
    assert_close(&row_late["compliance"], 1.0 - ratio, "compliance");
    assert_close(
        &row_late["budget_remaining"],
        1.0 - ratio / BUDGET,
        "budget remaining",
    );
    let burns = burn_rates(row_late);
    assert_eq!(burns[0].0, "1h/5m");
    assert_close(&burns[0].1, 240.0 / 90_000.0 / BUDGET, "1h burn");
    assert_close(&burns[0].2, 20.0 / 7_500.0 / BUDGET, "5m burn");
    // The 6 h window is the whole history: burn 5.56, below the 6h/30m factor of 6.
    assert_close(&burns[1].1, ratio / BUDGET, "6h burn");
    assert_eq!(
        row_late["alerts_firing"],
        serde_json::json!(["SloErrorBudgetBurn1h5m", "SloErrorBudgetBurn3d6h"])
    );
    assert_eq!(
        row_late["policy_actions"],
        serde_json::json!([
            "halt rollout of haul-perception 5.0.0 to haul-truck at pit-late",
            "freeze rollouts of haul-perception 5.0.0 to class haul-truck"
        ])
    );

    // Overruns that met their deadline: no deadline miss, whatever the overrun count.
    let row_overrun = row(&report, "pit-overrun");
    assert_eq!(row_overrun["total_events"], activations, "{row_overrun:#}");
    assert_eq!(row_overrun["bad_events"], 0.0, "{row_overrun:#}");
    assert_eq!(row_overrun["compliance"], 1.0);
    assert_eq!(row_overrun["budget_remaining"], 1.0);
    for (window, long, short) in burn_rates(row_overrun) {
        assert_eq!((long, short), (0.0.into(), 0.0.into()), "{window}");
    }
    assert_eq!(row_overrun["alerts_firing"], serde_json::json!([]));
    assert_eq!(row_overrun["policy_actions"], serde_json::json!([]));

    // Both rows say what they count.
    for (row, site) in [(row_late, "pit-late"), (row_overrun, "pit-overrun")] {
        assert_eq!(row["semantics"], "completion", "{row:#}");
        assert!(row["activations_not_judged"].is_null(), "{row:#}");
        assert!(row["incomplete"].is_null(), "{row:#}");
        assert!(
            line(&text, site).contains(" completion "),
            "{}",
            line(&text, site)
        );
    }
    assert!(text.lines().nth(1).unwrap().contains("SEMANTICS"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_before_deadlines_gives_a_legacy_row_and_an_upgraded_one_says_what_it_leaves_out()
{
    let (t0, at_ms) = timeline();
    let unspecified = DeadlineSemantics::Unspecified;
    // pit-old: an agent from before deadlines throughout: two overruns an interval, which it
    // sends as `misses`.
    let old = |i: u64| Counts {
        activations: PER_STEP * i,
        deadline_misses: 0,
        overruns: 2 * i,
        skipped: i / 10,
    };
    let mut batches = machine(
        "truck-old",
        "pit-old",
        t0,
        (1..=STEPS).map(|i| (i, counters(t0, old(i), unspecified))),
    );
    // pit-mix: the same agent for three hours, then an agent with deadline semantics, whose
    // counters start at its first sight of the loop.
    let half = STEPS / 2;
    let upgraded_at = t0 + half as i64 * STEP_NS + 1_000_000_000;
    let new = |j: u64| Counts {
        activations: PER_STEP * j,
        deadline_misses: j,
        overruns: 0,
        skipped: 0,
    };
    batches.extend(machine(
        "truck-mix",
        "pit-mix",
        t0,
        (1..=half)
            .map(|i| (i, counters(t0, old(i), unspecified)))
            .chain((half + 1..=STEPS).map(|i| {
                let counts = new(i - half);
                (
                    i,
                    counters(upgraded_at, counts, DeadlineSemantics::Completion),
                )
            })),
    ));
    let (report, text) = publish_and_report("gw-legacy", &batches, at_ms).await;

    // The old computation on the old series: (cycles − misses) / cycles, misses being overruns.
    let legacy = row(&report, "pit-old");
    let cycles = (PER_STEP * STEPS - STEPS / 10) as f64;
    assert_eq!(legacy["total_events"], cycles, "{legacy:#}");
    assert_eq!(legacy["bad_events"], (2 * STEPS) as f64, "{legacy:#}");
    let ratio = (2 * STEPS) as f64 / cycles;
    assert_close(&legacy["compliance"], 1.0 - ratio, "legacy compliance");
    assert_close(
        &legacy["budget_remaining"],
        1.0 - ratio / BUDGET,
        "legacy budget",
    );
    assert_eq!(legacy["semantics"], "legacy_agent", "{legacy:#}");
    // Its activations (recorded + skipped) were judged against no deadline.
    assert_eq!(
        legacy["activations_not_judged"],
        serde_json::json!({ "legacy_agent": (PER_STEP * STEPS) as f64, "legacy_probe": 0.0 })
    );
    // Alerts and policy follow the row's computation, and say which it is.
    assert_eq!(
        legacy["alerts_firing"],
        serde_json::json!(["SloErrorBudgetBurn3d6h"])
    );
    assert_eq!(
        legacy["policy_actions"],
        serde_json::json!(["freeze rollouts of haul-perception 5.0.0 to class haul-truck"])
    );
    let old_line = line(&text, "pit-old");
    assert!(
        old_line.contains("legacy (overruns, agent before deadlines)"),
        "{old_line}"
    );

    // The upgraded machine's row counts the deadline SLI from its upgrade on, and says how many
    // activations of the period it leaves out, and why.
    let mixed = row(&report, "pit-mix");
    assert_eq!(mixed["semantics"], "completion", "{mixed:#}");
    assert_eq!(mixed["total_events"], (PER_STEP * half) as f64, "{mixed:#}");
    assert_eq!(mixed["bad_events"], half as f64, "{mixed:#}");
    assert_close(
        &mixed["compliance"],
        1.0 - half as f64 / (PER_STEP * half) as f64,
        "mixed compliance",
    );
    assert_eq!(
        mixed["activations_not_judged"],
        serde_json::json!({ "legacy_agent": (PER_STEP * half) as f64, "legacy_probe": 0.0 })
    );
    let mix_line = line(&text, "pit-mix");
    assert!(
        mix_line.contains(" completion ")
            && mix_line.contains(&format!(
                "{} activations not judged (agent before deadlines)",
                PER_STEP * half
            )),
        "{mix_line}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loop_whose_probe_predates_deadlines_is_not_measured_and_never_shows_100_percent() {
    let (t0, at_ms) = timeline();
    // pit-abi1: an agent with deadline semantics reading an ABI 1 probe: activations and
    // overruns exact, deadline misses absent.
    let probe = |i: u64| Counts {
        activations: PER_STEP * i,
        deadline_misses: 0,
        overruns: 3 * i,
        skipped: i / 6,
    };
    let batches = machine(
        "truck-abi1",
        "pit-abi1",
        t0,
        (1..=STEPS).map(|i| (i, counters(t0, probe(i), DeadlineSemantics::LegacyProbe))),
    );
    let (report, text) = publish_and_report("gw-abi1", &batches, at_ms).await;

    let row = row(&report, "pit-abi1");
    assert!(row["compliance"].is_null(), "{row:#}");
    assert!(row["budget_remaining"].is_null(), "{row:#}");
    assert!(row["bad_events"].is_null(), "{row:#}");
    for (window, long, short) in burn_rates(row) {
        assert!(long.is_null() && short.is_null(), "{window}: {row:#}");
    }
    assert_eq!(row["alerts_firing"], serde_json::json!([]));
    assert_eq!(row["policy_actions"], serde_json::json!([]));
    assert_eq!(row["semantics"], "legacy_probe", "{row:#}");
    // What is known is counted: the activations, none of them judged.
    let activations = (PER_STEP * STEPS) as f64;
    assert_eq!(row["total_events"], activations);
    assert_eq!(
        row["activations_not_judged"],
        serde_json::json!({ "legacy_agent": 0.0, "legacy_probe": activations })
    );
    let abi1 = line(&text, "pit-abi1");
    assert!(abi1.contains("not measured (probe ABI 1)"), "{abi1}");
    assert!(!abi1.contains("100.0000%"), "{abi1}");
    assert!(!abi1.contains(" ok"), "{abi1}");
}
