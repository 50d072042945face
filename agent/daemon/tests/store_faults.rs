//! The queue's store failing for a reason other than corruption: the agent stays up (no restart
//! loop), reports the fault in its status file, answers local clients that the store is
//! unavailable, holds safety events in memory (up to `queue.safety_hold_records`, the rest
//! counted as `buffer_overflow`), refuses and counts the other tiers, reopens the store with
//! backoff and, once it is back, writes every held safety event exactly once.
//!
//! Every agent here runs the packaged defaults (flush intervals, store retry backoff, hold size):
//! only paths, the broker's address and the placement for a shared test machine are set.
//!
//! - A store that cannot be opened (its file is a directory): runs anywhere.
//! - EIO without root: an `LD_PRELOAD` library (`edgewatch_test_kit::faults`, built with `cc`
//!   into the test's scratch directory) fails the running agent's writes, syncs and creations
//!   under its queue directory while a control file exists, or only its fsyncs; the agent
//!   drains to a real Mosquitto. It counts per file handle, so the test sees that the agent
//!   reopened its store on new handles and never wrote or synced again through one that met
//!   the fault. Runs anywhere.
//! - ENOSPC: the queue on a small loop-mounted ext4 that another file has all but filled before
//!   the agent starts; the agent's safety events take the rest.
//! - EIO: the queue's file system on a device-mapper linear device switched to dm's `error`
//!   target and back.
//!
//! The last two need root, loop devices, e2fsprogs and (EIO) dmsetup with a kernel that has
//! device-mapper. Elsewhere they print SKIP with the reason; with
//! `EDGEWATCH_REQUIRE_FAULT_INJECTION=1` (set by `.ci/run`, CI, which runs as root with loop
//! devices) a missing prerequisite fails them, except a kernel without device-mapper (neither
//! built in nor a module of the running kernel): no package can add a kernel driver, so the
//! device-mapper test says SKIP there too (the rule every privileged test shares:
//! `loopfs::decide`). `.config/nextest.toml` shows this binary's output
//! after every run, so a SKIP and its reason are in the run's summary.
#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.
#![allow(clippy::print_stdout)] // A SKIP says why on the test's output.

mod util;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use edgewatch_harness::agent::AgentProcess;
use edgewatch_harness::events::event_id;
use edgewatch_harness::mosquitto::Mosquitto;
use edgewatch_harness::process::Launch;
use edgewatch_proto::v1::{Event, LocalReply, LossCause, QueueLoss, Tier, event};
use edgewatch_queue::{BatchLimits, Queue, RawQueueConfig};
use edgewatch_test_kit::faults::{EioCounts, EioInjector, Ops};
use edgewatch_test_kit::loopfs::{self, LoopDevice, Missing, Mounted, run};
use prost::Message;
use util::{BIN, Collector, submit_all, test_event, wait_until};

/// The packaged default of `queue.safety_hold_records`.
const HOLD: usize = 4096;

/// The agent's configuration: packaged defaults except where its files go, the broker (an
/// address where nothing listens unless given), and placement on a shared machine.
fn config_text(dir: &Path, queue: &Path, broker_port: u16) -> String {
    format!(
        r#"
[machine]
id = "truck-9"
site = "pit-3"
class = "haul-truck"

[queue]
dir = "{queue}"

[uplink]
host = "127.0.0.1"
port = {broker_port}

[scheduling]
idle_priority = false

[ingest]
socket = "{dir}/agent.sock"

[status]
file = "{dir}/agent-status.json"

[thermal]
tegrastats_enabled = false
sysfs_root = "{dir}/no-sysfs"
"#,
        queue = queue.display(),
        dir = dir.display(),
    )
}

/// A port on which nothing listens: the agent backs off and never drains, so everything it
/// wrote is still in its queue when the test reads it.
fn dead_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

fn start_agent(dir: &Path, queue: &Path) -> AgentProcess {
    start_agent_on(dir, queue, dead_port(), Launch::new("info"))
}

/// An agent whose broker is at `broker_port`, launched with `launch` (its environment).
fn start_agent_on(dir: &Path, queue: &Path, broker_port: u16, launch: Launch) -> AgentProcess {
    let mut agent = AgentProcess::start(
        Path::new(BIN),
        dir,
        &config_text(dir, queue, broker_port),
        launch,
    )
    .unwrap();
    if let Err(error) = agent.wait_for_socket(Duration::from_secs(30)) {
        panic!("the agent did not stay up: {error}\n{}", agent.log());
    }
    agent
}

/// The status file's `store` section.
fn store_status(agent: &AgentProcess) -> serde_json::Value {
    agent.status_file()["store"].clone()
}

fn wait_for_store(agent: &mut AgentProcess, available: bool, timeout: Duration) {
    let reached = wait_until(timeout, || {
        store_status(agent)["available"].as_bool() == Some(available)
    });
    assert!(
        reached,
        "the status file never said available = {available}: {}\n{}",
        agent.status_file(),
        agent.log()
    );
    assert!(agent.running(), "the agent exited:\n{}", agent.log());
}

fn safety(id: i64) -> (Tier, Event) {
    (Tier::Safety, test_event(id, 10))
}

fn held(reply: &LocalReply) -> bool {
    !reply.accepted && reply.error.contains("unavailable") && reply.error.contains("held in memory")
}

fn overflowed(reply: &LocalReply) -> bool {
    !reply.accepted && reply.error.contains("hold buffer is full")
}

/// Everything a stopped agent's queue holds: (tier, seq) → event.
fn read_queue(queue_dir: &Path) -> BTreeMap<(Tier, u64), Event> {
    let (mut queue, _) = Queue::open(RawQueueConfig::new(queue_dir), SystemTime::now()).unwrap();
    let limits = BatchLimits {
        max_records: 10_000,
        max_bytes: 64 << 20,
    };
    let mut all = BTreeMap::new();
    while let Some(batch) = queue.next_batch(limits).unwrap() {
        for (seq, bytes) in batch.records() {
            all.insert((batch.tier(), seq), Event::decode(bytes).unwrap());
        }
    }
    all
}

/// Custom-event ids per tier, with how often each is stored.
fn stored_ids(all: &BTreeMap<(Tier, u64), Event>, tier: Tier) -> BTreeMap<i64, usize> {
    let mut ids = BTreeMap::new();
    for ((t, _), event) in all {
        if *t == tier
            && let Some(id) = event_id(event)
        {
            *ids.entry(id).or_default() += 1;
        }
    }
    ids
}

/// Records lost per (tier, cause), summed over the queue's `QueueLoss` reports.
fn losses(all: &BTreeMap<(Tier, u64), Event>) -> BTreeMap<(i32, i32), u64> {
    let mut sums = BTreeMap::new();
    for event in all.values() {
        if let Some(event::Kind::QueueLoss(QueueLoss {
            tier, cause, count, ..
        })) = &event.kind
        {
            *sums.entry((*tier, *cause)).or_default() += count;
        }
    }
    sums
}

/// `AgentHealth` events in the safety tier that name a store fault.
fn fault_health_reports(all: &BTreeMap<(Tier, u64), Event>) -> usize {
    all.iter()
        .filter(|((tier, _), event)| {
            *tier == Tier::Safety
                && matches!(&event.kind, Some(event::Kind::AgentHealth(h)) if !h.store_fault.is_empty())
        })
        .count()
}

#[test]
fn an_agent_whose_store_cannot_open_stays_up_holds_safety_events_and_writes_each_once_when_it_opens()
 {
    let dir = tempfile::tempdir().unwrap();
    let queue = dir.path().join("queue");
    // Not corruption: the store's path cannot be opened as its directory at all.
    let blocker = queue.join("queue.log");
    std::fs::create_dir_all(&queue).unwrap();
    std::fs::write(&blocker, b"").unwrap();
    let mut agent = start_agent(dir.path(), &queue);
    wait_for_store(&mut agent, false, Duration::from_secs(10));
    let store = store_status(&agent);
    assert!(
        store["fault"].as_str().unwrap().contains("queue.log"),
        "{store}"
    );

    // More safety submissions than the hold takes, and one SLO submission.
    let mut submissions: Vec<_> = (1..=HOLD as i64 + 20).map(safety).collect();
    submissions.insert(5, (Tier::Slo, test_event(100_000, 10)));
    let replies = submit_all(&agent.socket(), submissions.clone());
    let slo_reply = &replies[5];
    assert!(
        !slo_reply.accepted && slo_reply.error.contains("unavailable"),
        "{slo_reply:?}"
    );
    let mut held_ids = Vec::new();
    let mut overflow_ids = Vec::new();
    for ((_, event), reply) in submissions.iter().zip(&replies) {
        let id = event_id(event).unwrap();
        if id == 100_000 {
            continue;
        }
        if held(reply) {
            held_ids.push(id);
        } else if overflowed(reply) {
            overflow_ids.push(id);
        } else {
            panic!("submission {id}: neither held nor overflowed: {reply:?}");
        }
    }
    assert!(!overflow_ids.is_empty(), "the hold is bounded");
    assert!(
        held_ids.len() <= HOLD && held_ids.len() + 1 >= HOLD,
        "the hold took {} submissions (its size is {HOLD}, one place may hold the fault report)",
        held_ids.len()
    );
    assert!(
        wait_until(
            Duration::from_secs(5),
            || store_status(&agent)["held_safety"].as_u64() == Some(HOLD as u64)
        ),
        "the status file shows the hold full: {}",
        store_status(&agent)
    );
    let cli = agent.command(&["status", "--json"]).unwrap();
    let cli: serde_json::Value = serde_json::from_slice(&cli.stdout).unwrap();
    assert_eq!(cli["agent"]["store"]["available"].as_bool(), Some(false));
    let as_of = agent.status_file()["as_of_unix_ms"].as_u64().unwrap();
    assert!(
        wait_until(
            Duration::from_secs(5),
            || agent.status_file()["as_of_unix_ms"].as_u64().unwrap() > as_of
        ),
        "the agent keeps running its tasks while the store is unavailable"
    );

    // The store becomes available: the next attempt opens it and writes what is held.
    std::fs::remove_file(&blocker).unwrap();
    wait_for_store(&mut agent, true, Duration::from_secs(90));
    let after = submit_all(&agent.socket(), vec![safety(200_000)]);
    assert!(after[0].accepted, "{:?}", after[0]);
    assert!(
        agent
            .terminate(Duration::from_secs(30))
            .status()
            .unwrap()
            .success()
    );

    let all = read_queue(&queue);
    let ids = stored_ids(&all, Tier::Safety);
    for id in &held_ids {
        assert_eq!(ids.get(id), Some(&1), "held safety event {id} written once");
    }
    for id in &overflow_ids {
        assert_eq!(
            ids.get(id),
            None,
            "overflowed safety event {id} not written"
        );
    }
    assert_eq!(ids.get(&200_000), Some(&1));
    assert_eq!(ids.len(), held_ids.len() + 1);
    assert!(stored_ids(&all, Tier::Slo).is_empty());
    let losses = losses(&all);
    assert_eq!(
        losses.get(&(Tier::Safety as i32, LossCause::BufferOverflow as i32)),
        Some(&(overflow_ids.len() as u64)),
        "each overflowed submission is counted once: {losses:?}"
    );
    assert_eq!(
        losses.get(&(Tier::Slo as i32, LossCause::DiskFull as i32)),
        Some(&1),
        "the refused SLO submission is counted: {losses:?}"
    );
    assert_eq!(
        fault_health_reports(&all),
        1,
        "one health report names the fault"
    );
}

// ------------------------------------------------------------------------------------------
// EIO without root: an LD_PRELOAD library fails the running agent's writes under its queue
// directory (`edgewatch_test_kit::faults`), on every machine.

/// What the broker received, by what the test checks.
struct Delivered {
    /// Custom-event id → the distinct (epoch, seq) it arrived under, in the safety tier.
    safety_ids: BTreeMap<i64, BTreeSet<(u64, u64)>>,
    /// (epoch, seq) → the fault named by each distinct `AgentHealth` with `store_fault` set, in
    /// the safety tier.
    fault_reports: BTreeMap<(u64, u64), String>,
    /// (tier, cause) → records lost, summed over distinct `QueueLoss` reports.
    losses: BTreeMap<(i32, i32), u64>,
}

fn delivered(collector: &Collector) -> Delivered {
    let mut seen = BTreeSet::new();
    let mut out = Delivered {
        safety_ids: BTreeMap::new(),
        fault_reports: BTreeMap::new(),
        losses: BTreeMap::new(),
    };
    for received in collector.snapshot() {
        // QoS 1 may deliver a batch twice: a record is its (tier, epoch, seq).
        if !seen.insert((received.tier as i32, received.epoch, received.seq)) {
            continue;
        }
        let at = (received.epoch, received.seq);
        if received.tier == Tier::Safety
            && let Some(id) = event_id(&received.event)
        {
            out.safety_ids.entry(id).or_default().insert(at);
        }
        match &received.event.kind {
            Some(event::Kind::AgentHealth(health))
                if received.tier == Tier::Safety && !health.store_fault.is_empty() =>
            {
                out.fault_reports.insert(at, health.store_fault.clone());
            }
            Some(event::Kind::QueueLoss(QueueLoss {
                tier, cause, count, ..
            })) => {
                *out.losses.entry((*tier, *cause)).or_default() += count;
            }
            _ => {}
        }
    }
    out
}

/// The injected errno, as the agent's reason shows it.
const EIO_TEXT: &str = "os error 5";

/// The whole scenario, with `ops` failing in the queue directory while injected: the agent,
/// draining to a real Mosquitto at the packaged defaults, stays up, reports the fault, holds
/// safety events, reopens its store only through new handles, and delivers each held event once.
/// Returns the injector's counts at the moment the fault stopped and at the end.
fn eio_injected_and_stopped(ops: Ops) -> (EioCounts, EioCounts) {
    let work = tempfile::tempdir().unwrap();
    let injector = EioInjector::build(work.path(), &work.path().join("queue"), ops).unwrap();
    let queue = injector.dir().to_owned();
    let broker = Mosquitto::start().unwrap();
    let collector = Collector::start(broker.addr()).unwrap();
    let mut launch = Launch::new("info");
    for (key, value) in injector.env() {
        launch = launch.env(key, value);
    }
    let mut agent = start_agent_on(work.path(), &queue, broker.port(), launch);
    wait_for_store(&mut agent, true, Duration::from_secs(10));
    let opened = injector.counts().unwrap();
    assert!(
        opened.loaded && opened.handles >= 1,
        "the library is loaded and follows the store's file: {opened:?}"
    );

    // Before the fault: durable, and delivered (the link is up).
    let first = submit_all(&agent.socket(), vec![safety(1)]);
    assert!(first[0].accepted, "{:?}", first[0]);
    assert!(
        wait_until(Duration::from_secs(60), || delivered(&collector)
            .safety_ids
            .contains_key(&1)),
        "the first safety event never reached the broker:\n{}",
        agent.log()
    );

    injector.inject().unwrap();
    let at_fault = injector.counts().unwrap();
    // The commit that carries the next safety event meets EIO: it is held, not lost.
    let probe = submit_all(&agent.socket(), vec![safety(2)]);
    assert!(held(&probe[0]), "{:?}", probe[0]);
    wait_for_store(&mut agent, false, Duration::from_secs(10));
    let store = store_status(&agent);
    assert!(
        store["fault"].as_str().unwrap().contains(EIO_TEXT),
        "the status names the injected error: {store}"
    );
    let mut held_ids = check_degraded(&mut agent);
    held_ids.push(2);
    // The hold is exactly the held submissions and the one health report naming the fault.
    let expected_hold = held_ids.len() as u64 + 1;
    assert!(
        wait_until(
            Duration::from_secs(30),
            || store_status(&agent)["held_safety"].as_u64() == Some(expected_hold)
        ),
        "held_safety is {expected_hold}: {}",
        store_status(&agent)
    );
    assert_eq!(
        store_status(&agent)["hold_capacity"].as_u64(),
        Some(HOLD as u64)
    );
    // The failed commit meets EIO on the store's handle, and each reopen attempt on a new
    // handle of its own: the status counts them exactly, as the handles that met the fault.
    // (The queue's status snapshot is beside the status file, outside the failing directory,
    // and opens no handle there.) Two reopen attempts at least.
    let attempts_shown = || {
        let failed = injector.counts().unwrap().handles_failed - at_fault.handles_failed;
        let attempts = store_status(&agent)["attempts"].as_u64().unwrap_or(0);
        attempts >= 3 && attempts == failed
    };
    assert!(
        wait_until(Duration::from_secs(60), attempts_shown),
        "the status never showed the attempts made, one per handle that met the fault ({:?}): \
         {}\n{}",
        injector.counts().unwrap(),
        store_status(&agent),
        agent.log()
    );
    assert!(
        delivered(&collector).fault_reports.is_empty(),
        "the fault's health report is held with the safety events until the store is back"
    );
    assert!(agent.running(), "the agent exited:\n{}", agent.log());

    let at_stop = injector.counts().unwrap();
    assert!(
        at_stop.writes_failed + at_stop.syncs_failed
            > at_fault.writes_failed + at_fault.syncs_failed,
        "the agent met the injected errors: {at_stop:?}"
    );
    injector.stop().unwrap();
    wait_for_store(&mut agent, true, Duration::from_secs(60));
    assert!(
        agent.log().contains("The queue store is back"),
        "{}",
        agent.log()
    );

    // Delivered once each: the event from before the fault, every held one, the fault's report.
    let expected: BTreeSet<i64> = held_ids.iter().copied().chain([1]).collect();
    let complete = wait_until(Duration::from_secs(60), || {
        let got = delivered(&collector);
        expected.iter().all(|id| got.safety_ids.contains_key(id)) && !got.fault_reports.is_empty()
    });
    assert!(
        complete,
        "not everything held reached the broker:\n{}",
        agent.log()
    );
    assert!(
        agent
            .terminate(Duration::from_secs(30))
            .status()
            .unwrap()
            .success()
    );
    let end = injector.counts().unwrap();
    let got = delivered(&collector);
    let ids: BTreeSet<i64> = got.safety_ids.keys().copied().collect();
    assert_eq!(ids, expected, "the safety events that arrived");
    for (id, at) in &got.safety_ids {
        assert_eq!(at.len(), 1, "safety event {id} written once: {at:?}");
    }
    assert_eq!(
        got.fault_reports.len(),
        1,
        "one health report names the fault: {:?}",
        got.fault_reports
    );
    let report = got.fault_reports.values().next().unwrap();
    assert!(report.contains(EIO_TEXT), "{report}");
    assert!(
        !got.losses
            .keys()
            .any(|(tier, _)| *tier == Tier::Safety as i32),
        "no safety event was lost: {:?}",
        got.losses
    );
    // Not exact: the agent's own SLO counters (the thermal sampler's, every 10 s) are refused
    // while the store is unavailable too, and no reply or count outside the agent says how many.
    // The cannot-open test counts the refused submission exactly.
    assert!(
        got.losses
            .get(&(Tier::Slo as i32, LossCause::DiskFull as i32))
            .is_some_and(|count| *count >= 1),
        "the refused SLO submission is counted: {:?}",
        got.losses
    );

    // The store was written again only through handles opened after the fault stopped: none
    // that met an injected error wrote or synced again.
    assert_eq!(
        end.reused, 0,
        "a handle that met EIO was used again: {end:?}"
    );
    assert!(
        end.last_synced_handle > end.last_failed_handle,
        "the last sync went through a handle opened after the last one that met the fault: {end:?}"
    );
    assert_eq!(end.untracked, 0);
    (at_stop, end)
}

#[test]
fn eio_on_every_write_of_the_running_agents_queue_holds_safety_events_and_each_arrives_once_after_it()
 {
    let (at_stop, _) = eio_injected_and_stopped(Ops::ALL);
    assert!(at_stop.writes_failed >= 1, "{at_stop:?}");
}

#[test]
fn after_an_fsync_error_the_agent_writes_its_store_only_through_a_new_handle() {
    let (at_stop, end) = eio_injected_and_stopped(Ops::SYNCS);
    assert!(
        at_stop.syncs_failed >= 1 && at_stop.writes_failed == 0,
        "the writes went through and an fsync failed: {at_stop:?}"
    );
    assert!(end.syncs > at_stop.syncs, "{end:?}");
}

// ------------------------------------------------------------------------------------------
// Privileged fault injection.

/// True if `/proc/misc` (its text) lists device-mapper's control device: the driver is in the
/// running kernel, built in or loaded.
fn misc_lists_device_mapper(misc: &str) -> bool {
    misc.lines()
        .any(|line| line.split_whitespace().nth(1) == Some("device-mapper"))
}

/// True if `modules.dep` (its text) of the running kernel has device-mapper's module.
fn modules_dep_lists_dm_mod(dep: &str) -> bool {
    dep.lines().any(|line| {
        let module = line.split(':').next().unwrap_or("");
        let file = module.rsplit('/').next().unwrap_or("");
        file.starts_with("dm-mod.ko") || file.starts_with("dm_mod.ko")
    })
}

/// `Ok` if the running kernel has device-mapper (loading `dm_mod` when it is a module that is
/// not loaded yet).
fn kernel_device_mapper() -> Result<(), Missing> {
    let registered =
        || std::fs::read_to_string("/proc/misc").is_ok_and(|misc| misc_lists_device_mapper(&misc));
    if registered() {
        return Ok(());
    }
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_owned();
    let modules = Path::new("/lib/modules").join(&release);
    let dep = std::fs::read_to_string(modules.join("modules.dep")).unwrap_or_default();
    if !modules_dep_lists_dm_mod(&dep) {
        return Err(Missing::Kernel(format!(
            "the kernel {release} has no device-mapper driver: not built in (/proc/misc lists no \
             device-mapper) and no dm-mod module in {}/modules.dep",
            modules.display()
        )));
    }
    let loaded = run("modprobe", &["dm_mod"]);
    if registered() {
        return Ok(());
    }
    Err(Missing::Provisionable(format!(
        "the kernel {release} has a dm-mod module but it did not load: {}",
        loaded.err().unwrap_or_else(|| "modprobe succeeded".into())
    )))
}

/// `Ok` unless something this process needs to build loop-mounted file systems (and, with
/// `dm`, a device-mapper device) is missing.
fn prerequisites(dm: bool) -> Result<(), Missing> {
    let tools: &[&str] = if dm {
        &["mkfs.ext4", "dd", "dmsetup", "blockdev"]
    } else {
        &["mkfs.ext4", "dd"]
    };
    loopfs::prerequisites(tools).map_err(Missing::Provisionable)?;
    if dm {
        kernel_device_mapper()?;
        run("dmsetup", &["version"]).map_err(|error| {
            Missing::Provisionable(format!(
                "the kernel has device-mapper but dmsetup cannot reach it: {error}"
            ))
        })?;
    }
    Ok(())
}

/// Runs the test body if the prerequisites hold; otherwise SKIP (printed with the reason), or
/// fail where they are required (`loopfs::run_or_skip`, the rule every privileged test shares).
fn privileged(what: &str, dm: bool) -> bool {
    loopfs::run_or_skip(what, prerequisites(dm))
}

#[test]
fn device_mapper_is_found_registered_in_the_kernel_or_as_a_module_of_it() {
    let misc = " 58 memory_bandwidth\n236 device-mapper\n237 loop-control\n";
    assert!(misc_lists_device_mapper(misc));
    assert!(!misc_lists_device_mapper(" 237 loop-control\n 229 fuse\n"));
    let dep = "kernel/drivers/md/dm-crypt.ko.zst: kernel/drivers/md/dm-mod.ko.zst\n\
               kernel/drivers/md/dm-mod.ko.zst:\n";
    assert!(modules_dep_lists_dm_mod(dep));
    assert!(!modules_dep_lists_dm_mod(
        "kernel/drivers/block/loop.ko:\nkernel/fs/ext4/ext4.ko: kernel/fs/jbd2/jbd2.ko\n"
    ));
    assert!(!modules_dep_lists_dm_mod(""));
}

/// ext4 without a journal, mounted `errors=continue`: an I/O error fails the operation that met
/// it and leaves the file system writable once the device works again (a journal would abort and
/// hold the file system read-only until an fsck).
fn format_and_mount(device: &str, dir: &Path) -> Result<Mounted, String> {
    Mounted::ext4(
        device,
        &["-m", "0", "-O", "^has_journal"],
        dir,
        Some("errors=continue"),
    )
}

/// A device-mapper device mapping a loop device linearly, switchable to dm's `error` target
/// (every I/O fails with EIO) and back; removed on drop.
struct DmDevice {
    name: String,
    sectors: u64,
    backing: String,
}

impl DmDevice {
    fn linear(name: &str, backing: &LoopDevice) -> Result<Self, String> {
        let sectors: u64 = run("blockdev", &["--getsz", backing.path()])?
            .parse()
            .map_err(|e| format!("blockdev: {e}"))?;
        let device = Self {
            name: name.to_owned(),
            sectors,
            backing: backing.path().to_owned(),
        };
        run(
            "dmsetup",
            &["create", name, "--table", &device.linear_table()],
        )?;
        Ok(device)
    }

    fn path(&self) -> String {
        format!("/dev/mapper/{}", self.name)
    }

    fn linear_table(&self) -> String {
        format!("0 {} linear {} 0", self.sectors, self.backing)
    }

    fn switch_to(&self, table: &str) -> Result<(), String> {
        run("dmsetup", &["suspend", "--noflush", &self.name])?;
        run("dmsetup", &["load", &self.name, "--table", table])?;
        run("dmsetup", &["resume", &self.name]).map(|_| ())
    }

    fn fail_every_io(&self) -> Result<(), String> {
        self.switch_to(&format!("0 {} error", self.sectors))
    }

    fn work_again(&self) -> Result<(), String> {
        self.switch_to(&self.linear_table())
    }
}

impl Drop for DmDevice {
    fn drop(&mut self) {
        let _ = run("dmsetup", &["remove", "--retry", &self.name]);
    }
}

/// Another file taking all but `keep_free` bytes of the file system holding `path` (its blocks
/// allocated, not sparse).
fn fill_leaving(path: &Path, keep_free: u64) {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::io::AsRawFd;
    let dir = std::ffi::CString::new(path.parent().unwrap().as_os_str().as_bytes()).unwrap();
    // SAFETY: statvfs is plain old data; all zeros is a valid value of it.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string and an out-parameter of the right type.
    let status = unsafe { libc::statvfs(dir.as_ptr(), &mut stat) };
    assert_eq!(status, 0, "{}", std::io::Error::last_os_error());
    // The test runs as root, as does its agent: both may use the blocks reserved for root.
    let free = stat.f_bfree as u64 * stat.f_frsize as u64;
    let len = free.saturating_sub(keep_free);
    let file = std::fs::File::create(path).unwrap();
    // SAFETY: an open file descriptor and a length that fits an off_t on a 32 MiB file system.
    let done = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len as libc::off_t) };
    assert_eq!(done, 0, "{}", std::io::Error::last_os_error());
    file.sync_all().unwrap();
}

/// Submits safety events of 60 KB until one is answered as held (its commit met the full
/// disk), then waits for the status file to say the store is unavailable. Returns the ids of
/// those held.
///
/// Safety events, not bulk ones: a failed commit keeps them in memory, and every reopen attempt
/// writes them again with whatever came since, more than the commit that failed needed, on a
/// disk with no more room than then. The store stays unavailable until the test frees space,
/// however late its checks come. (After a failed commit of bulk events nothing is held, and
/// the reopen a second later writes the few small records it then has into the slack of a
/// segment's last block: the store is back.)
fn fill_until_unavailable(agent: &mut AgentProcess, first_id: i64) -> Vec<i64> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut id = first_id;
    let mut held_ids = Vec::new();
    while held_ids.is_empty() {
        assert!(
            Instant::now() < deadline,
            "the store never failed:\n{}",
            agent.log()
        );
        let ids: Vec<i64> = (id..id + 4).collect();
        let batch = ids
            .iter()
            .map(|&id| (Tier::Safety, test_event(id, 60_000)))
            .collect();
        for (id, reply) in ids.into_iter().zip(submit_all(&agent.socket(), batch)) {
            if held(&reply) {
                held_ids.push(id);
            } else {
                assert!(reply.accepted, "safety event {id}: {reply:?}");
            }
        }
        id += 4;
        std::thread::sleep(Duration::from_millis(50));
    }
    wait_for_store(agent, false, Duration::from_secs(30));
    held_ids
}

/// What both privileged tests check once the store has failed: the agent is up and says so,
/// safety submissions are held and answered so, an SLO one is refused. Returns the held ids.
fn check_degraded(agent: &mut AgentProcess) -> Vec<i64> {
    let store = store_status(agent);
    assert!(!store["fault"].as_str().unwrap_or("").is_empty(), "{store}");
    let submissions = vec![
        safety(1_001),
        safety(1_002),
        (Tier::Slo, test_event(1_003, 10)),
        safety(1_004),
    ];
    let replies = submit_all(&agent.socket(), submissions);
    assert!(
        held(&replies[0]) && held(&replies[1]) && held(&replies[3]),
        "{replies:?}\n{}\n{}",
        agent.status_file(),
        agent.log()
    );
    assert!(
        !replies[2].accepted && replies[2].error.contains("unavailable"),
        "{:?}",
        replies[2]
    );
    assert!(agent.running(), "the agent exited:\n{}", agent.log());
    vec![1_001, 1_002, 1_004]
}

/// After the store is back and the agent stopped: the first safety event and every held one
/// are stored exactly once.
fn check_written_once(queue: &Path, held_ids: &[i64]) {
    let all = read_queue(queue);
    let ids = stored_ids(&all, Tier::Safety);
    assert_eq!(
        ids.get(&1),
        Some(&1),
        "the safety event from before the fault"
    );
    for id in held_ids {
        assert_eq!(ids.get(id), Some(&1), "held safety event {id} written once");
    }
    assert_eq!(
        fault_health_reports(&all),
        1,
        "one health report names the fault"
    );
}

/// The tests that need root (and loop devices, e2fsprogs, device-mapper): each says SKIP with the
/// reason where it cannot run, and `.config/nextest.toml` shows their output in every run.
mod privileged {
    use super::*;

    #[test]
    fn a_full_disk_keeps_the_agent_up_holding_safety_events_until_space_returns() {
        if !privileged("disk-full fault injection", false) {
            return;
        }
        let work = tempfile::tempdir().unwrap();
        let image = work.path().join("small.img");
        loopfs::sparse_image(&image, 32 * 1024 * 1024).unwrap();
        let device = LoopDevice::attach(&image).unwrap();
        let mount = format_and_mount(device.path(), &work.path().join("mnt")).unwrap();
        // Another file takes all but 4 MiB before the agent starts, so the queue can reserve
        // no blocks ahead of its segments: a failed commit gives back only what it wrote.
        let filler = mount.dir().join("filler");
        fill_leaving(&filler, 4 * 1024 * 1024);
        let queue = mount.dir().join("queue");
        let mut agent = start_agent(work.path(), &queue);
        wait_for_store(&mut agent, true, Duration::from_secs(10));
        let first = submit_all(&agent.socket(), vec![safety(1)]);
        assert!(first[0].accepted, "{:?}", first[0]);

        // The queue's appends take the rest; its commits then fail.
        let mut held_ids = fill_until_unavailable(&mut agent, 10_000);
        held_ids.extend(check_degraded(&mut agent));

        std::fs::remove_file(&filler).unwrap();
        wait_for_store(&mut agent, true, Duration::from_secs(120));
        assert!(
            agent
                .terminate(Duration::from_secs(30))
                .status()
                .unwrap()
                .success()
        );
        check_written_once(&queue, &held_ids);
        let all = read_queue(&queue);
        let losses = losses(&all);
        assert!(
            losses
                .get(&(Tier::Slo as i32, LossCause::DiskFull as i32))
                .is_some_and(|n| *n >= 1),
            "the refused SLO submission is counted: {losses:?}"
        );
        drop(mount);
    }

    #[test]
    fn an_io_error_under_the_store_keeps_the_agent_up_holding_safety_events_until_the_device_works()
    {
        if !privileged("EIO fault injection (device-mapper error target)", true) {
            return;
        }
        let work = tempfile::tempdir().unwrap();
        let image = work.path().join("disk.img");
        loopfs::sparse_image(&image, 64 * 1024 * 1024).unwrap();
        let backing = LoopDevice::attach(&image).unwrap();
        let dm =
            DmDevice::linear(&format!("edgewatch-eio-{}", std::process::id()), &backing).unwrap();
        let mount = format_and_mount(&dm.path(), &work.path().join("mnt")).unwrap();
        let queue = mount.dir().join("queue");
        let mut agent = start_agent(work.path(), &queue);
        wait_for_store(&mut agent, true, Duration::from_secs(10));
        let first = submit_all(&agent.socket(), vec![safety(1)]);
        assert!(first[0].accepted, "{:?}", first[0]);

        dm.fail_every_io().unwrap();
        // The next commit meets EIO (its write or its fsync).
        let probe = submit_all(&agent.socket(), vec![safety(2)]);
        assert!(held(&probe[0]), "{:?}", probe[0]);
        wait_for_store(&mut agent, false, Duration::from_secs(10));
        let mut held_ids = check_degraded(&mut agent);
        held_ids.push(2);
        let attempts = store_status(&agent)["attempts"].as_u64().unwrap_or(0);

        // The device works again. After an fsync error the agent must not trust what it had open:
        // it reopens the store from the device (a new handle, the log's recovery).
        dm.work_again().unwrap();
        wait_for_store(&mut agent, true, Duration::from_secs(120));
        assert!(
            agent.log().contains("The queue store is back"),
            "{}",
            agent.log()
        );
        let _ = attempts;
        assert!(
            agent
                .terminate(Duration::from_secs(30))
                .status()
                .unwrap()
                .success()
        );
        check_written_once(&queue, &held_ids);
        drop(mount);
        drop(dm);
        drop(backing);
    }
}
