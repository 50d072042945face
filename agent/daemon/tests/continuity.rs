//! Counts stay exact through restarts, end to end: the real agent binary at its packaged default
//! configuration, the real synthetic loop, a real Mosquitto and the real gateway.
//!
//! - An agent SIGKILLed mid-run, and an agent stopped (SIGTERM) for 30 s, then started again,
//!   report exactly what the loop's own tally says it did: one series per model version from the
//!   loop's start, never a value lower than one already reported, and every activation, deadline
//!   miss, fallback, intervention and safe stop counted once.
//! - A producer restart is counted with no sample refused at the gateway, and with both epochs'
//!   tallies in full.
//! - Interventions submitted with `edgewatch-agent emit` count one each at the gateway, in series
//!   of their own beside the probe's, across an agent restart; a retried submission counts once.
//!
//! Two views are checked: what the agent published (the harness's collector decodes every
//! batch) and what the gateway stored (its store, read back once it stopped). At the gateway a
//! counter's total is its increase from zero at its start, with the increase rule's resets (a
//! value lower than the one before counts from zero); the agent's series start from zero at the
//! loop's start.
//!
//! The agent runs the packaged `config/agent.toml` with only the per-machine lines replaced
//! (identity, broker, queue directory, socket, status file, one probe) and two placement
//! settings (no core pinning, no SCHED_IDLE: the test machine runs other work on every core):
//! every interval (polls, snapshots, group commits, uplink) is the packaged default.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

mod util;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use edgewatch_gateway::store::{RawSeries, Store};
use edgewatch_harness::agent::AgentProcess;
use edgewatch_harness::binaries::workspace_binaries;
use edgewatch_harness::collector::{Collector, Received};
use edgewatch_harness::gateway::GatewayProcess;
use edgewatch_harness::mosquitto::Mosquitto;
use edgewatch_harness::process::Launch;
use edgewatch_proto::v1::{EventSource, ProbeState, event::Kind};
use edgewatch_slo::names::{label, metric, value};
use serde_json::Value;
use util::{BIN, wait_until};

const PACKAGED: &str = include_str!("../config/agent.toml");
const MACHINE: &str = "truck-17";
const LOOP: &str = "haul";
/// Long enough for the final counters of a loop to reach the gateway.
const SETTLE: Duration = Duration::from_secs(90);

/// `text` with `from` (which must occur exactly once) replaced by `to`.
fn replace_once(text: &str, from: &str, to: &str) -> String {
    assert_eq!(
        text.matches(from).count(),
        1,
        "the packaged configuration no longer holds `{from}` once"
    );
    text.replacen(from, to, 1)
}

/// The packaged configuration with this machine's lines and one probe at `probe`.
fn agent_config(dir: &Path, broker: SocketAddr, probe: &Path) -> String {
    let mut text = PACKAGED.to_owned();
    for (from, to) in [
        ("id = \"unprovisioned\"", format!("id = \"{MACHINE}\"")),
        ("site = \"unassigned\"", "site = \"pit-3\"".to_owned()),
        (
            "class = \"unclassified\"",
            "class = \"haul-truck\"".to_owned(),
        ),
        (
            "dir = \"/var/lib/edgewatch-agent\"",
            format!("dir = \"{}\"", dir.join("queue").display()),
        ),
        (
            "host = \"broker.invalid\"",
            "host = \"127.0.0.1\"".to_owned(),
        ),
        ("port = 8883", format!("port = {}", broker.port())),
        ("cores = [0, 1]", "cores = []".to_owned()),
        ("#idle_priority = true", "idle_priority = false".to_owned()),
        (
            "socket = \"/run/edgewatch/agent.sock\"",
            format!("socket = \"{}\"", dir.join("agent.sock").display()),
        ),
        (
            "file = \"/run/edgewatch/agent-status.json\"",
            format!("file = \"{}\"", dir.join("agent-status.json").display()),
        ),
        (
            "\n[thermal]\n",
            format!(
                "\n[thermal]\ntegrastats_enabled = false\nsysfs_root = \"{}\"\n",
                dir.join("no-sysfs").display()
            ),
        ),
    ] {
        text = replace_once(&text, from, &to);
    }
    text.push_str(&format!(
        "\n[[probe]]\npath = \"{}\"\nloop_name = \"{LOOP}\"\nmodel_name = \"det\"\n",
        probe.display()
    ));
    text
}

/// The binaries the tests run besides the agent: the synthetic loop and the gateway.
fn binaries() -> (PathBuf, PathBuf) {
    let mut paths = workspace_binaries(
        &[
            ("edgewatch-synthetic-loop", "edgewatch-synthetic-loop"),
            ("edgewatch-gateway", "edgewatch-gateway"),
        ],
        &[],
    )
    .unwrap();
    let gateway = paths.pop().unwrap();
    (paths.pop().unwrap(), gateway)
}

/// A broker, the gateway, the collector and the agent, each in `dir`.
struct Rig {
    /// Declared first: processes stop before their directory goes.
    agent: AgentProcess,
    gateway: GatewayProcess,
    collector: Collector,
    _broker: Mosquitto,
    loop_bin: PathBuf,
    probe: PathBuf,
    store: PathBuf,
    dir: tempfile::TempDir,
}

impl Rig {
    fn start() -> Rig {
        let (loop_bin, gateway_bin) = binaries();
        let dir = tempfile::Builder::new()
            .prefix("edgewatch-continuity-")
            .tempdir()
            .unwrap();
        let broker = Mosquitto::start().unwrap();
        let metrics =
            edgewatch_harness::net::loopback(edgewatch_harness::net::free_port().unwrap());
        let store = dir.path().join("gateway-store.redb");
        let gateway_config = dir.path().join("gateway.toml");
        std::fs::write(
            &gateway_config,
            format!(
                "[mqtt]\nhost = \"127.0.0.1\"\nport = {}\nclient_id = \"gw-continuity\"\n\
                 [ingest]\n[store]\npath = \"{}\"\n[metrics]\nlisten = \"{metrics}\"\n[http]\nenabled = false\n",
                broker.port(),
                store.display()
            ),
        )
        .unwrap();
        let gateway = GatewayProcess::start(
            &gateway_bin,
            &gateway_config,
            &dir.path().join("gateway.log"),
            metrics,
            Launch::new("info"),
            Duration::from_secs(60),
        )
        .unwrap();
        let collector = Collector::start(broker.addr()).unwrap();
        let probe = dir.path().join("haul.probe");
        let mut agent = AgentProcess::start(
            Path::new(BIN),
            dir.path(),
            &agent_config(dir.path(), broker.addr(), &probe),
            Launch::new("info"),
        )
        .unwrap();
        agent.wait_for_socket(Duration::from_secs(30)).unwrap();
        Rig {
            agent,
            gateway,
            collector,
            _broker: broker,
            loop_bin,
            probe,
            store,
            dir,
        }
    }

    /// Starts a synthetic loop on the probe: `seconds` at 25 Hz (40 ms period and deadline,
    /// 20 ms budget) with `script`.
    fn start_loop(&self, name: &str, seconds: u32, script: &str) -> SyntheticLoop {
        let path = self.dir.path().join(format!("{name}.pattern"));
        std::fs::write(&path, script).unwrap();
        let child = Command::new(&self.loop_bin)
            .arg("--probe")
            .arg(&self.probe)
            .args(["--loop-name", LOOP, "--rate-hz", "25", "--budget-ms", "20"])
            .args(["--duration", &format!("{seconds}s"), "--script"])
            .arg(&path)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        SyntheticLoop(Some(child))
    }

    fn respawn_agent(&mut self) {
        self.agent.respawn().unwrap();
        self.agent
            .wait_for_socket(Duration::from_secs(30))
            .unwrap_or_else(|error| panic!("{error}; log:\n{}", self.agent.log()));
    }

    /// Waits until the agent reported `count` producer deaths of the loop and delivered what
    /// followed, and the gateway stored everything the broker carried.
    fn settle_after_deaths(&self, count: usize) {
        let delivered = wait_until(SETTLE, || {
            let received = self.collector.snapshot();
            let deaths: Vec<usize> = received
                .iter()
                .enumerate()
                .filter(|(_, r)| {
                    matches!(&r.event.kind, Some(Kind::ProbeStatus(s))
                        if s.state() == ProbeState::Died && loop_of(s.control_loop.as_ref()) == LOOP)
                })
                .map(|(i, _)| i)
                .collect();
            deaths.len() >= count
                && received[deaths[count - 1]..]
                    .iter()
                    .any(|r| matches!(r.event.kind, Some(Kind::DeadlineCounters(_))))
        });
        assert!(
            delivered,
            "the loop's final counters never arrived; agent log:\n{}",
            self.agent.log()
        );
        self.settle_gateway();
    }

    /// Waits until the gateway has taken in every event the broker carried (new or duplicate).
    fn settle_gateway(&self) {
        let caught_up = wait_until(SETTLE, || {
            let seen = self
                .gateway
                .metric("edgewatch_gateway_events_total")
                .unwrap_or(0.0)
                + self
                    .gateway
                    .metric("edgewatch_gateway_events_duplicate_total")
                    .unwrap_or(0.0);
            seen as usize >= self.collector.count()
        });
        assert!(caught_up, "the gateway did not take in every event");
    }

    /// Stops the gateway (checking it refused no sample as a conflict) and reads its store.
    fn gateway_store(&mut self) -> Store {
        assert_eq!(
            self.gateway
                .metric("edgewatch_gateway_samples_conflicting_total"),
            Some(0.0),
            "the gateway refused samples: two values at one series and timestamp"
        );
        self.gateway.terminate(Duration::from_secs(20));
        Store::open_read_only(&self.store).unwrap()
    }
}

/// A running synthetic loop; killed on drop.
struct SyntheticLoop(Option<Child>);

impl SyntheticLoop {
    /// Waits for its end and returns its JSON summary.
    fn summary(mut self) -> Value {
        let child = self.0.take().unwrap();
        let output = child.wait_with_output().unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice(&output.stdout).unwrap()
    }
}

impl Drop for SyntheticLoop {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn loop_of(l: Option<&edgewatch_proto::v1::LoopRef>) -> &str {
    l.map_or("", |l| l.loop_name.as_str())
}

/// The loop's own tally of what it did (its clock), plus what it recorded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Tally {
    activations: u64,
    deadline_misses: u64,
    cycles: u64,
    skipped: u64,
    overruns: u64,
    fallbacks: u64,
    interventions: u64,
    safe_stops: u64,
}

impl Tally {
    fn of(summary: &Value) -> Tally {
        let t = &summary["tally"]["total"];
        let n = |v: &Value| v.as_u64().unwrap();
        Tally {
            activations: n(&t["activations"]),
            deadline_misses: n(&t["deadline_misses"]),
            cycles: n(&summary["cycles"]),
            skipped: n(&t["skipped"]),
            overruns: n(&t["overruns"]),
            fallbacks: n(&t["fallbacks"]),
            interventions: n(&t["interventions"]),
            safe_stops: n(&t["safe_stops"]),
        }
    }

    fn plus(self, o: Tally) -> Tally {
        Tally {
            activations: self.activations + o.activations,
            deadline_misses: self.deadline_misses + o.deadline_misses,
            cycles: self.cycles + o.cycles,
            skipped: self.skipped + o.skipped,
            overruns: self.overruns + o.overruns,
            fallbacks: self.fallbacks + o.fallbacks,
            interventions: self.interventions + o.interventions,
            safe_stops: self.safe_stops + o.safe_stops,
        }
    }
}

/// Every distinct event the agent published (a record sent again after a restart once).
fn distinct(received: Vec<Received>) -> Vec<Received> {
    let mut seen = BTreeSet::new();
    received
        .into_iter()
        .filter(|r| seen.insert((r.tier as i32, r.epoch, r.seq)))
        .collect()
}

/// A published series: (producer epoch, model version, start).
type SeriesId = (u64, String, i64);
/// Its values in event-time order: (event time, activations, deadline misses).
type Published = BTreeMap<SeriesId, Vec<(i64, u64, u64)>>;

/// The loop's `DeadlineCounters` as published, per series.
fn published_series(received: &[Received]) -> Published {
    let mut series = Published::new();
    for r in received {
        if let Some(Kind::DeadlineCounters(c)) = &r.event.kind
            && loop_of(c.control_loop.as_ref()) == LOOP
        {
            let version = c
                .model
                .as_ref()
                .map_or(String::new(), |m| m.version.clone());
            series
                .entry((c.producer_epoch, version, c.start_time_unix_ns))
                .or_default()
                .push((
                    r.event.event_time_unix_ns,
                    c.activations.unwrap(),
                    c.deadline_misses.unwrap(),
                ));
        }
    }
    for samples in series.values_mut() {
        samples.sort();
    }
    series
}

/// Checks that no published series ever went down and that their last values add up to
/// `tally`; returns the series.
fn check_published(received: &[Received], tally: &Tally) -> Published {
    let series = published_series(received);
    let (mut activations, mut misses) = (0, 0);
    for (key, samples) in &series {
        assert!(
            samples
                .windows(2)
                .all(|w| w[1].1 >= w[0].1 && w[1].2 >= w[0].2),
            "series {key:?} went down: {samples:?}"
        );
        let last = samples.last().unwrap();
        activations += last.1;
        misses += last.2;
    }
    assert_eq!(
        (activations, misses),
        (tally.activations, tally.deadline_misses),
        "published activations and deadline misses against the loop's tally; series: {series:?}"
    );
    series
}

/// The series of `metric` of the machine (and of the loop, for loop series).
fn stored(store: &Store, metric: &str) -> Vec<RawSeries> {
    store
        .query(metric, 0, i64::MAX)
        .unwrap()
        .into_iter()
        .filter(|s| {
            s.labels
                .iter()
                .any(|(n, v)| n == label::MACHINE_ID && v == MACHINE)
                && s.labels.iter().all(|(n, v)| n != label::LOOP || v == LOOP)
        })
        .collect()
}

fn label_of<'a>(series: &'a RawSeries, name: &str) -> Option<&'a str> {
    series
        .labels
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// A counter's total from zero at its start: the sum of its increases, a value lower than the
/// one before counting from zero (a reset).
fn increase_from_zero(samples: &[(i64, f64)]) -> f64 {
    let mut previous = 0.0;
    let mut total = 0.0;
    for &(_, v) in samples {
        total += if v >= previous { v - previous } else { v };
        previous = v;
    }
    total
}

/// The total of `metric` over the series `select` keeps; with `monotonic`, asserts that none of
/// them ever went down (no reset).
fn gateway_total(
    store: &Store,
    metric: &str,
    select: impl Fn(&RawSeries) -> bool,
    monotonic: bool,
) -> u64 {
    let mut total = 0.0;
    for s in stored(store, metric).iter().filter(|s| select(s)) {
        if monotonic {
            assert!(
                s.samples.windows(2).all(|w| w[1].1 >= w[0].1),
                "{metric} {:?} went down: {:?}",
                s.labels,
                s.samples
            );
        }
        total += increase_from_zero(&s.samples);
    }
    total as u64
}

fn probe_source(s: &RawSeries) -> bool {
    label_of(s, label::SOURCE).is_none_or(|v| v == value::PROBE)
}

/// Checks the gateway's totals of the loop's counters against `tally`.
fn check_gateway(store: &Store, tally: &Tally, monotonic: bool) {
    let all = |_: &RawSeries| true;
    let got = Tally {
        activations: tally.activations,
        deadline_misses: tally.deadline_misses,
        cycles: gateway_total(store, metric::CONTROL_CYCLES, all, monotonic),
        skipped: gateway_total(store, metric::CONTROL_SKIPPED, all, monotonic),
        overruns: gateway_total(store, metric::CONTROL_MISSED, all, monotonic),
        fallbacks: gateway_total(store, metric::SAFETY_FALLBACKS, all, monotonic),
        interventions: gateway_total(store, metric::INTERVENTIONS, probe_source, monotonic),
        safe_stops: gateway_total(store, metric::SAFE_STOPS, probe_source, monotonic),
    };
    assert_eq!(&got, tally, "the gateway's totals against the loop's tally");
}

/// A 25 Hz pattern of everything the tally counts, spread over `seconds`: overruns, late starts
/// past the deadline, skips, a hang, fallbacks, interventions, safe stops and mode changes.
fn busy_pattern(seconds: u32) -> String {
    let mut script = String::from(
        "mode autonomous at 0s\nmodel 4.2.1 at 0s\nskip every 97\n\
         overrun 3x at cycles 40..43\nlate-start 45ms at cycles 60..63\nhang 2s at 3s\n",
    );
    let mut t = 5;
    while t + 3 < seconds {
        script.push_str(&format!(
            "fallback at {t}s\nintervention at {}s\nsafe-stop at {}s\n\
             overrun 2x at cycles {}..{}\nlate-start 50ms at cycle {}\n",
            t + 1,
            t + 2,
            t * 25 + 10,
            t * 25 + 13,
            t * 25 + 20,
        ));
        if t % 10 == 5 {
            script.push_str(&format!(
                "mode manual at {}s\nmode autonomous at {}s\n",
                t,
                t + 2
            ));
        }
        t += 4;
    }
    script
}

#[test]
fn an_agent_sigkilled_and_restarted_mid_run_reports_exactly_the_loops_tally() {
    let mut rig = Rig::start();
    let run = rig.start_loop("run", 26, &busy_pattern(26));
    // Past the first snapshot, so the series were reported before the kill.
    std::thread::sleep(Duration::from_secs(12));
    rig.agent.kill();
    std::thread::sleep(Duration::from_secs(5));
    rig.respawn_agent();
    let tally = Tally::of(&run.summary());
    rig.settle_after_deaths(1);

    let received = distinct(rig.collector.snapshot());
    let series = check_published(&received, &tally);
    assert_eq!(
        series.len(),
        1,
        "one series, continued across the restart with its start: {series:?}"
    );
    let store = rig.gateway_store();
    check_gateway(&store, &tally, true);
}

#[test]
fn an_agent_stopped_for_30_s_then_started_reports_exactly_the_loops_tally() {
    let mut rig = Rig::start();
    let run = rig.start_loop("run", 50, &busy_pattern(50));
    std::thread::sleep(Duration::from_secs(12));
    let stopped = rig.agent.terminate(Duration::from_secs(30));
    assert!(
        matches!(stopped, edgewatch_harness::process::Termination::Exited(s) if s.success()),
        "{stopped:?}"
    );
    std::thread::sleep(Duration::from_secs(30));
    rig.respawn_agent();
    let tally = Tally::of(&run.summary());
    rig.settle_after_deaths(1);

    let received = distinct(rig.collector.snapshot());
    let series = check_published(&received, &tally);
    assert_eq!(
        series.len(),
        1,
        "one series, continued across the stop with its start: {series:?}"
    );
    let store = rig.gateway_store();
    check_gateway(&store, &tally, true);
}

#[test]
fn a_producer_restart_is_counted_with_no_refused_sample_and_both_epochs_tallies() {
    let mut rig = Rig::start();
    // The first epoch's counters all end above the second's first values, so that the gateway's
    // increase rule sees the restart as the reset it is (fallbacks are not reported at skipped
    // activations: none falls on a multiple of 50).
    let first = rig.start_loop(
        "first",
        14,
        "mode autonomous at 0s\nmodel 4.2.1 at 0s\nskip every 50\noverrun 3x at cycles 30..34\n\
         fallback at 2200ms\nfallback at 3200ms\nintervention at 4s\nintervention at 5s\n\
         safe-stop at 6s\nsafe-stop at 7s\n",
    );
    let first = Tally::of(&first.summary());
    assert_eq!(
        (first.fallbacks, first.interventions, first.safe_stops),
        (2, 2, 2)
    );
    // The agent is held while the loop is replaced, so that it finds the new producer at the
    // probe's path in place of the old one (a restart, not a death then a start).
    rig.agent.pause();
    let second = rig.start_loop(
        "second",
        8,
        "mode autonomous at 0s\nmodel 4.2.1 at 0s\nskip every 60\noverrun 2x at cycle 20\n\
         fallback at 3s\nintervention at 4s\nsafe-stop at 5s\n",
    );
    std::thread::sleep(Duration::from_secs(1));
    rig.agent.resume();
    let second = Tally::of(&second.summary());
    rig.settle_after_deaths(1);

    let both = first.plus(second);
    let received = distinct(rig.collector.snapshot());
    let series = check_published(&received, &both);
    let epochs: BTreeSet<u64> = series.keys().map(|k| k.0).collect();
    assert_eq!(epochs.len(), 2, "{series:?}");
    let restarted = received.iter().any(|r| {
        matches!(&r.event.kind, Some(Kind::ProbeStatus(s)) if s.state() == ProbeState::Restarted)
    });
    assert!(restarted, "the agent saw a restart, not a death");
    let store = rig.gateway_store();
    check_gateway(&store, &both, false);
}

/// `edgewatch-agent emit` of an intervention, with a submission id when given.
fn emit_intervention(config: &Path, id: Option<&str>) -> String {
    let mut command = Command::new(BIN);
    command.args(["emit", "--config"]).arg(config).args([
        "--tier",
        "safety",
        "--kind",
        "intervention",
        "--attr",
        "reason=obstacle",
    ]);
    if let Some(id) = id {
        command.args(["--id", id]);
    }
    let output = command.output().unwrap();
    assert!(
        output.status.success(),
        "emit failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn three_interventions_emitted_over_the_socket_count_three_beside_the_probes() {
    let mut rig = Rig::start();
    // A loop that reports no model, so that its interventions carry the same model labels as
    // the socket's.
    let run = rig.start_loop(
        "run",
        12,
        "mode autonomous at 0s\nintervention at 1s\nintervention at 9s\n",
    );
    let config = rig.agent.config();
    for _ in 0..3 {
        emit_intervention(&config, None);
        std::thread::sleep(Duration::from_millis(300));
    }
    // The count goes on where it was after a restart.
    std::thread::sleep(Duration::from_secs(2));
    rig.agent.kill();
    rig.respawn_agent();
    emit_intervention(&config, None);
    let tally = Tally::of(&run.summary());
    assert_eq!(tally.interventions, 2);
    rig.settle_after_deaths(1);
    rig.settle_gateway();

    let store = rig.gateway_store();
    let local = |s: &RawSeries| label_of(s, label::SOURCE) == Some(value::LOCAL);
    assert_eq!(
        gateway_total(&store, metric::INTERVENTIONS, local, true),
        4,
        "three, then one after the restart"
    );
    assert_eq!(
        gateway_total(&store, metric::INTERVENTIONS, probe_source, true),
        tally.interventions,
        "the probe's interventions, in their own series"
    );
}

#[test]
fn a_retried_submission_counts_once_and_is_answered_as_the_original() {
    let mut rig = Rig::start();
    let config = rig.agent.config();
    let first = emit_intervention(&config, Some("operator-7f3a"));
    let retry = emit_intervention(&config, Some("operator-7f3a"));
    assert_eq!(first, retry, "the retry gets the original's answer");
    // Remembered across a restart too.
    rig.agent.kill();
    rig.respawn_agent();
    let again = emit_intervention(&config, Some("operator-7f3a"));
    assert_eq!(first, again);
    emit_intervention(&config, Some("operator-7f3b"));
    let published = wait_until(SETTLE, || {
        let local: Vec<u64> = distinct(rig.collector.snapshot())
            .iter()
            .filter_map(|r| match &r.event.kind {
                Some(Kind::Intervention(i)) if i.source() == EventSource::Local => Some(i.total),
                _ => None,
            })
            .collect();
        local == [1, 2]
    });
    assert!(
        published,
        "two interventions, totals 1 and 2, were not published"
    );
    rig.settle_gateway();
    let store = rig.gateway_store();
    let local = |s: &RawSeries| label_of(s, label::SOURCE) == Some(value::LOCAL);
    assert_eq!(gateway_total(&store, metric::INTERVENTIONS, local, true), 2);
}
