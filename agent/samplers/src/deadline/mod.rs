//! The deadline sampler: polls every configured control-loop probe and turns what it reads into
//! SLO counters and safety events.
//!
//! The agent's shell owns one [`DeadlineSampler`] and calls [`DeadlineSampler::poll`] every
//! [`DeadlineSampler::poll_interval`] (default 250 ms) from its current-thread loop, passing the
//! time and the manifest's model (from [`crate::model::ModelWatcher`]); events go to its
//! [`EventSink`]. [`DeadlineSampler::status`] answers the agent's `status` command.
//!
//! Layout:
//! - [`config`]: `[deadline]` and `[[probe]]`, raw and validated, with the named defaults.
//! - [`tracker`]: one loop's accounting as pure logic (series per model version, header deltas,
//!   liveness transitions, rate-limited reports).
//! - [`resume`]: what the agent keeps of a loop's accounting to continue it after a restart.
//! - [`provisional`]: the activations a silent producer owes, counted before it recovers (pure).
//! - [`burst`]: miss-burst rules (pure). [`histogram`]: response-time buckets (pure).
//! - [`emit`]: the reused outgoing events.
//! - this module: the I/O shell around `loop_probe::ProbeReader` (open, liveness, reads).
//!
//! Invariants:
//! - One bad probe never stops the others: every failure is a state and a counted, rate-limited
//!   `ProbeStatus` `ANOMALY` for that loop, never a panic or an early return from `poll`.
//! - A refused file is not opened again until its (device, inode, size, mtime) changes; a
//!   missing file costs one `stat` per poll.
//! - Per poll and probe, a live producer costs two `fstat`s (guarding the mapping) and one
//!   `flock` (liveness), plus a `stat` of the path once a second, and no allocation; opening a
//!   probe (at start or after a restart) allocates.
//! - The mapping is read-only (the reader's invariant): nothing here can disturb the loop.
//! - After every poll in which a loop emitted anything, its state is kept through the sink
//!   (after those events, so the agent's queue writes both in one transaction); a restarted
//!   agent hands it back with [`DeadlineSampler::restore`] and the loop's counts go on where the
//!   durable events left them. [`DeadlineSampler::flush`] emits every series and keeps every
//!   state before the agent stops.

pub mod burst;
pub mod config;
pub mod emit;
pub mod histogram;
pub mod provisional;
pub mod resume;
pub mod tracker;

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

use edgewatch_proto::v1::{self, ModelVersion};
use loop_probe::{AutonomyMode, Liveness, OpenError, PollError, ProbeReader, RestartReason};

pub use config::{
    BurstRules, DeadlineConfig, HistogramBounds, ProbeConfig, RawDeadlineConfig, RawProbeConfig,
};
use emit::Emitter;
/// What a loop's deadline counters mean (re-exported for the agent's status).
pub use loop_probe::DeadlineSemantics;
use prost::Message;
use resume::LoopResume;
pub use tracker::{LoopCounts, LoopState};
use tracker::{LoopSettings, LoopTracker};

use crate::sink::{EventSink, Now};

/// Identity of a file as `stat` tells it, to avoid re-reading a refused file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct StatKey {
    dev: u64,
    ino: u64,
    size: i64,
    mtime: (i64, i64),
}

/// One configured probe: its reader (when open) and its tracker.
struct Probe {
    cfg: ProbeConfig,
    c_path: Option<CString>,
    reader: Option<ProbeReader>,
    /// A file refused at this identity.
    refused: Option<StatKey>,
    tracker: LoopTracker,
    /// When the next full liveness check (a `stat` of the path and a `flock`) is due, monotonic ns.
    full_liveness_due_ns: u64,
    /// The key its state is kept under ([`DeadlineSampler::state_key`]).
    key: String,
    /// It emitted since its state was last kept.
    keep: bool,
}

/// Bytes reserved for one loop's encoded state: four model versions with their histograms fit.
const STATE_CAPACITY: usize = 16 * 1024;

/// A sink that passes everything on and notes whether anything was emitted.
struct Noting<'a, S: ?Sized> {
    sink: &'a mut S,
    emitted: bool,
}

impl<S: EventSink + ?Sized> EventSink for Noting<'_, S> {
    fn emit(&mut self, tier: v1::Tier, event: &v1::Event) {
        self.emitted = true;
        self.sink.emit(tier, event);
    }

    fn keep(&mut self, key: &str, state: &[u8]) {
        self.sink.keep(key, state);
    }
}

/// How often a probe whose producer holds its lock gets the full liveness check, which alone sees
/// a new file at the probe's path while the old producer still lives.
const FULL_LIVENESS_INTERVAL_NS: u64 = 1_000_000_000;

/// What the agent's `status` command shows per loop.
#[derive(Debug, Clone, Copy)]
pub struct LoopStatus<'a> {
    /// Probe path.
    pub path: &'a Path,
    /// Loop name (the probe's, else the configured one).
    pub loop_name: &'a str,
    /// The agent's view of the producer.
    pub state: LoopState,
    /// Time since the probe was last read successfully.
    pub last_sample_age: Option<Duration>,
    /// Producer epoch and pid.
    pub producer: Option<(u64, u32)>,
    /// Header totals and the agent's own counts.
    pub counts: LoopCounts,
    /// What the loop's deadline counters mean (legacy: its probe, ABI 1, measures no deadline
    /// misses).
    pub semantics: DeadlineSemantics,
    /// The model counters go to now (empty name and version: unknown).
    pub model: &'a ModelVersion,
    /// The loop's autonomy mode.
    pub mode: v1::AutonomyMode,
    /// Why the probe is unusable, if it is.
    pub problem: Option<&'static str>,
}

/// Polls every configured probe; see the module doc.
pub struct DeadlineSampler {
    cfg: DeadlineConfig,
    probes: Vec<Probe>,
    /// Probe indices, the autonomy source first (its mode is the machine's for the others).
    order: Vec<usize>,
    emitter: Emitter,
    /// When the sampler was created, CLOCK_MONOTONIC: producers started before are "found
    /// running" and their earlier counts are not attributed, unless an earlier run kept them.
    started_ns: u64,
    next_snapshot_ns: u64,
    /// A loop's encoded state, reused.
    state: Vec<u8>,
}

impl std::fmt::Debug for DeadlineSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeadlineSampler")
            .field("probes", &self.probes.len())
            .field("next_snapshot_ns", &self.next_snapshot_ns)
            .finish()
    }
}

impl DeadlineSampler {
    /// A sampler over `cfg`'s probes, started at `now`. Nothing is opened until the first poll.
    pub fn new(cfg: DeadlineConfig, now: Now) -> DeadlineSampler {
        let to_ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let probes: Vec<Probe> = cfg
            .probes
            .iter()
            .map(|p| Probe {
                cfg: p.clone(),
                c_path: CString::new(p.path.as_os_str().as_bytes()).ok(),
                reader: None,
                refused: None,
                full_liveness_due_ns: 0,
                key: DeadlineSampler::state_key(&p.path),
                keep: false,
                tracker: LoopTracker::new(LoopSettings {
                    burst: p.burst,
                    histogram: p.histogram.clone(),
                    burst_min_interval_ns: to_ns(cfg.burst_min_interval),
                    status_min_interval_ns: to_ns(cfg.status_min_interval),
                    model_name: p.model_name.clone(),
                    autonomy_source: p.autonomy_source,
                    configured_name: p.loop_name.clone().unwrap_or_default(),
                    path: p.path.display().to_string(),
                }),
            })
            .collect();
        let mut order: Vec<usize> = (0..probes.len()).collect();
        order.sort_by_key(|i| !probes.get(*i).is_some_and(|p| p.cfg.autonomy_source));
        DeadlineSampler {
            next_snapshot_ns: now
                .monotonic_ns
                .saturating_add(to_ns(cfg.snapshot_interval)),
            cfg,
            probes,
            order,
            emitter: Emitter::new(),
            started_ns: now.monotonic_ns,
            state: Vec::with_capacity(STATE_CAPACITY),
        }
    }

    /// The key a probe's state is kept under: `deadline/` and its path (a path longer than 200
    /// bytes is shortened to a hash of the whole and its last 160 bytes).
    pub fn state_key(path: &Path) -> String {
        let bytes = path.as_os_str().as_bytes();
        let text = String::from_utf8_lossy(bytes);
        if text.len() <= 200 {
            return format!("deadline/{text}");
        }
        // FNV-1a: stable across runs and builds.
        let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
        });
        let mut from = text.len() - 160;
        while !text.is_char_boundary(from) {
            from += 1;
        }
        format!("deadline/{hash:016x}~{}", &text[from..])
    }

    /// Takes what an earlier run of the agent kept for each probe, read through `kept` (the
    /// queue's key-value area): a loop whose producer is still the same epoch is continued (see
    /// [`resume`]). Call before the first poll. A state that does not decode is ignored.
    pub fn restore<'a>(&mut self, kept: impl Fn(&str) -> Option<&'a [u8]>) {
        for p in &mut self.probes {
            if let Some(state) = kept(&p.key).and_then(LoopResume::decode_kept) {
                p.tracker.restore(state);
            }
        }
    }

    /// The agent is stopping: reads every probe once more, emits every series' current values
    /// and the autonomy seconds (due or not) and keeps every loop's state, so that all of it is
    /// queued before the last flush and a later run continues from there.
    pub fn flush<S: EventSink + ?Sized>(
        &mut self,
        now: Now,
        manifest: Option<&ModelVersion>,
        sink: &mut S,
    ) {
        self.poll(now, manifest, sink);
        for p in &mut self.probes {
            p.tracker.report_all(now, &mut self.emitter, sink);
            p.keep = true;
        }
        self.keep_states(sink);
    }

    /// Keeps the state of every loop that emitted since it was last kept.
    fn keep_states<S: EventSink + ?Sized>(&mut self, sink: &mut S) {
        for p in &mut self.probes {
            if !p.keep {
                continue;
            }
            p.keep = false;
            self.state.clear();
            // Encoding into a Vec cannot run out of room; it grows only past the reservation.
            let _ = p.tracker.kept_state().encode(&mut self.state);
            sink.keep(&p.key, &self.state);
        }
    }

    /// How often the shell should call [`poll`](Self::poll).
    pub fn poll_interval(&self) -> Duration {
        self.cfg.poll_interval
    }

    /// The validated configuration.
    pub fn config(&self) -> &DeadlineConfig {
        &self.cfg
    }

    /// Reads every probe once and emits what changed; every snapshot interval also emits the
    /// cumulative SLO snapshots. `manifest` is the model the manifest names (used for loops
    /// whose probe has no model slot set).
    pub fn poll<S: EventSink + ?Sized>(
        &mut self,
        now: Now,
        manifest: Option<&ModelVersion>,
        sink: &mut S,
    ) {
        let mut machine_mode = AutonomyMode::Unknown;
        let stall_min_ns = self.stall_min_ns();
        for k in 0..self.order.len() {
            let Some(&i) = self.order.get(k) else {
                continue;
            };
            let Some(p) = self.probes.get_mut(i) else {
                continue;
            };
            let mut noting = Noting {
                sink: &mut *sink,
                emitted: false,
            };
            poll_probe(
                p,
                stall_min_ns,
                self.started_ns,
                now,
                manifest,
                machine_mode,
                &mut self.emitter,
                &mut noting,
            );
            p.keep |= noting.emitted;
            if p.cfg.autonomy_source {
                machine_mode = p.tracker.own_mode();
            }
        }
        if now.monotonic_ns >= self.next_snapshot_ns {
            for p in &mut self.probes {
                let mut noting = Noting {
                    sink: &mut *sink,
                    emitted: false,
                };
                p.tracker.snapshot(now, &mut self.emitter, &mut noting);
                p.keep |= noting.emitted;
            }
            let interval = u64::try_from(self.cfg.snapshot_interval.as_nanos()).unwrap_or(u64::MAX);
            self.next_snapshot_ns = self.next_snapshot_ns.saturating_add(interval);
            if self.next_snapshot_ns <= now.monotonic_ns {
                self.next_snapshot_ns = now.monotonic_ns.saturating_add(interval);
            }
        }
        self.keep_states(sink);
    }

    fn stall_min_ns(&self) -> u64 {
        u64::try_from(self.cfg.stall_min.as_nanos()).unwrap_or(u64::MAX)
    }

    /// Per loop: liveness, age of the last sample, counters, model and mode.
    pub fn status(&self, now: Now) -> impl Iterator<Item = LoopStatus<'_>> {
        self.probes.iter().map(move |p| {
            let t = &p.tracker;
            LoopStatus {
                path: &p.cfg.path,
                loop_name: t.loop_name(),
                state: t.state(),
                last_sample_age: t
                    .last_sample_ns()
                    .map(|l| Duration::from_nanos(now.monotonic_ns.saturating_sub(l))),
                producer: t.info().map(|i| (i.epoch, i.pid)),
                counts: *t.counts(),
                semantics: t.semantics(),
                model: t.model(),
                mode: tracker::wire(t.mode()),
                problem: t.problem(),
            }
        })
    }

    /// The trackers, for tests and tools that inspect series directly.
    pub fn trackers(&self) -> impl Iterator<Item = &LoopTracker> {
        self.probes.iter().map(|p| &p.tracker)
    }
}

fn stat_key(path: &CString) -> io::Result<StatKey> {
    // SAFETY: an all-zero `stat` is a valid value of this plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated; stat writes into `st`, which is valid and writable.
    let rc = unsafe { libc::stat(path.as_ptr(), &mut st) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(StatKey {
        dev: st.st_dev,
        ino: st.st_ino,
        size: st.st_size,
        mtime: (st.st_mtime, st.st_mtime_nsec),
    })
}

fn open_error_detail(e: &OpenError) -> &'static str {
    match e {
        OpenError::Io { .. } => "probe file cannot be opened or mapped",
        OpenError::TooSmall { .. } => "probe file is shorter than its header or ring (truncated)",
        OpenError::BadMagic { .. } => "probe file has a bad magic number (not a probe)",
        OpenError::UnsupportedAbi { .. } => "probe file has an unsupported ABI version",
        OpenError::InvalidHeader { .. } => "probe header holds an invalid field",
        OpenError::ReplacedDuringOpen { .. } => "probe file kept being replaced while opened",
    }
}

fn poll_error_detail(e: &PollError) -> &'static str {
    match e {
        PollError::FileShrunk { .. } => "probe file shrank while mapped",
        PollError::ProducerRestarted(_) => "probe producer restarted during a read",
        PollError::Io { .. } => "probe liveness or size check failed",
        PollError::Busy { .. } => "probe cell stayed claimed by a writer (writer died holding it?)",
        PollError::Implausible { what } => what,
    }
}

#[allow(clippy::too_many_arguments)]
fn poll_probe<S: EventSink + ?Sized>(
    p: &mut Probe,
    stall_min_ns: u64,
    started_ns: u64,
    now: Now,
    manifest: Option<&ModelVersion>,
    machine_mode: AutonomyMode,
    em: &mut Emitter,
    sink: &mut S,
) {
    if p.reader.is_none() {
        try_open(p, started_ns, now, em, sink);
    }
    let Some(reader) = p.reader.as_ref() else {
        return;
    };
    // The path is examined every poll only once the lock says the producer is gone; while it
    // lives, once a second.
    let liveness = if now.monotonic_ns >= p.full_liveness_due_ns {
        p.full_liveness_due_ns = now.monotonic_ns.saturating_add(FULL_LIVENESS_INTERVAL_NS);
        reader.liveness(now.monotonic_ns)
    } else {
        reader.liveness_while_locked(now.monotonic_ns)
    };
    match liveness {
        Ok(Liveness::Alive) => {
            sample(
                p,
                now,
                now.monotonic_ns,
                true,
                manifest,
                machine_mode,
                em,
                sink,
            );
            p.tracker.alive(now, em, sink);
        }
        Ok(Liveness::Stalled { heartbeat_age_ns }) => {
            // Silent but alive: the activations it owes are counted provisionally.
            sample(
                p,
                now,
                now.monotonic_ns,
                true,
                manifest,
                machine_mode,
                em,
                sink,
            );
            if heartbeat_age_ns >= stall_min_ns {
                p.tracker.stalled(now, em, sink);
            } else {
                p.tracker.alive(now, em, sink);
            }
        }
        Ok(Liveness::Dead) => {
            if p.tracker.state() != LoopState::Dead {
                // What the producer left is still mapped: read it, then close its books, its
                // last values stamped at its last heartbeat (where its autonomy time stops too).
                let heartbeat = p
                    .reader
                    .as_ref()
                    .and_then(|r| r.summary().ok())
                    .map_or(now.monotonic_ns, |s| s.heartbeat_ns);
                let at = p.tracker.final_stamp(now, heartbeat);
                sample(p, at, heartbeat, false, manifest, machine_mode, em, sink);
                p.tracker.died(now, at, em, sink);
            }
        }
        Ok(Liveness::Restarted(reason)) => {
            let old_mapped =
                reason == RestartReason::NewInode && p.tracker.state() != LoopState::Dead;
            let heartbeat = if old_mapped {
                p.reader
                    .as_ref()
                    .and_then(|r| r.summary().ok())
                    .map(|s| s.heartbeat_ns)
            } else {
                None
            }
            .or(p.tracker.last_heartbeat_ns())
            .unwrap_or(now.monotonic_ns);
            let ended = p.tracker.info().is_some();
            // The old epoch's last values go at its last heartbeat, the new one's first values at
            // this poll: never one timestamp for both under the same labels.
            let at = p.tracker.final_stamp(now, heartbeat);
            if old_mapped {
                // The old file is unlinked but still mapped: take its last records first.
                sample(p, at, heartbeat, false, manifest, machine_mode, em, sink);
            }
            p.tracker.end_epoch_at(at, em, sink);
            p.reader = None;
            try_open(p, started_ns, now, em, sink);
            let same_ms = ended
                && at.wall_unix_ns.div_euclid(1_000_000) >= now.wall_unix_ns.div_euclid(1_000_000);
            // Within the old epoch's last millisecond the new one waits for the next poll.
            if p.reader.is_some() && !same_ms {
                // Its liveness is known at the next poll; until then it owes nothing.
                sample(
                    p,
                    now,
                    now.monotonic_ns,
                    false,
                    manifest,
                    machine_mode,
                    em,
                    sink,
                );
            }
        }
        Err(e) => fail(p, &e, now, em, sink),
    }
}

/// A read failed: a shrunk file is closed and refused until it changes; anything else is an
/// anomaly and the next poll tries again.
fn fail<S: EventSink + ?Sized>(
    p: &mut Probe,
    e: &PollError,
    now: Now,
    em: &mut Emitter,
    sink: &mut S,
) {
    let detail = poll_error_detail(e);
    match e {
        PollError::FileShrunk { .. } => {
            p.reader = None;
            p.refused = p.c_path.as_ref().and_then(|c| stat_key(c).ok());
            p.tracker.faulty(detail, now, em, sink);
        }
        PollError::ProducerRestarted(_) => {}
        _ => p.tracker.anomaly(detail, now, em, sink),
    }
}

fn try_open<S: EventSink + ?Sized>(
    p: &mut Probe,
    started_ns: u64,
    now: Now,
    em: &mut Emitter,
    sink: &mut S,
) {
    let Some(c_path) = &p.c_path else {
        p.tracker
            .faulty("probe path contains a NUL byte", now, em, sink);
        return;
    };
    let key = match stat_key(c_path) {
        Ok(k) => k,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            p.tracker.waiting();
            return;
        }
        Err(_) => {
            p.tracker
                .anomaly("probe file cannot be examined (stat failed)", now, em, sink);
            return;
        }
    };
    if p.refused == Some(key) {
        return;
    }
    let reader = match ProbeReader::open(&p.cfg.path) {
        Ok(r) => r,
        Err(OpenError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
            p.tracker.waiting();
            return;
        }
        Err(e) => {
            p.refused = Some(key);
            p.tracker.faulty(open_error_detail(&e), now, em, sink);
            return;
        }
    };
    if let Some(expected) = &p.cfg.loop_name
        && reader.info().loop_name() != expected
    {
        p.refused = Some(key);
        p.tracker.faulty(
            "probe announces a loop name other than the configured loop_name",
            now,
            em,
            sink,
        );
        return;
    }
    p.refused = None;
    let info = *reader.info();
    let baseline = if info.start_ns < started_ns {
        match reader.summary() {
            Ok(s) => Some((s, reader.autonomy().ok())),
            Err(e) => {
                p.tracker.anomaly(poll_error_detail(&e), now, em, sink);
                return;
            }
        }
    } else {
        None
    };
    if info.semantics() == DeadlineSemantics::Legacy {
        tracing::warn!(
            path = %p.cfg.path.display(),
            loop_name = info.loop_name(),
            "Probe is ABI 1: the loop declares no deadline, so its deadline misses are not \
             measured; activations and overruns are reported, with legacy semantics."
        );
    }
    p.tracker.start_epoch(&info, baseline, now, em, sink);
    p.reader = Some(reader);
}

/// One read pass: model slot and mode, new records, then the summary. `holds_lock`: the
/// producer was seen holding its lock, so what it owes while silent is counted.
#[allow(clippy::too_many_arguments)]
fn sample<S: EventSink + ?Sized>(
    p: &mut Probe,
    now: Now,
    autonomy_at_ns: u64,
    holds_lock: bool,
    manifest: Option<&ModelVersion>,
    machine_mode: AutonomyMode,
    em: &mut Emitter,
    sink: &mut S,
) {
    let Some(reader) = p.reader.as_mut() else {
        return;
    };
    let tracker = &mut p.tracker;
    // One shrink check (`fstat`) for the pass's four reads.
    let mut pass = match reader.pass() {
        Ok(pass) => pass,
        Err(e) => return fail(p, &e, now, em, sink),
    };
    let slot = match pass.model_version() {
        Ok(s) => s,
        Err(e) => {
            tracker.anomaly(poll_error_detail(&e), now, em, sink);
            None
        }
    };
    let autonomy = match pass.autonomy() {
        Ok(a) => Some(a),
        Err(e) => {
            tracker.anomaly(poll_error_detail(&e), now, em, sink);
            None
        }
    };
    tracker.begin_poll(slot.as_ref(), manifest, machine_mode, now, em, sink);
    let read = pass
        .poll(now.monotonic_ns, &mut |rec| tracker.record(rec))
        .and_then(|stats| pass.summary().map(|summary| (stats, summary)));
    let (stats, summary) = match read {
        Ok(read) => read,
        Err(e) => return fail(p, &e, now, em, sink),
    };
    let tracker = &mut p.tracker;
    tracker.end_poll(
        &summary,
        &stats,
        autonomy.as_ref().map(|a| (a, autonomy_at_ns)),
        holds_lock,
        now,
        em,
        sink,
    );
}
