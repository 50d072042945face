//! The tegrastats source: runs `tegrastats --interval <ms>` as a child and reads its standard
//! output line by line, restarting it with exponential backoff when it exits; or replays a
//! capture file at its own pace or faster. Each line is parsed with the allocation-free
//! [`tegrastats_parser::parse_line`] and handed out as a [`TegrastatsEvent`] borrowing the line.
//!
//! ```text
//!            spawn ok                 line                 EOF / read error
//!   Idle ─────────────► Running ───────────► (Sample | Malformed)      │
//!    ▲  └─ spawn fails ─┐   ▲  └───────────────────────────────────────┘
//!    │                  ▼   │                      reap (1 s grace, then SIGKILL)
//!    └──── Waiting(backoff) ◄──────────────────────── Exited
//! ```
//!
//! Invariants:
//! - [`TegrastatsSource::next`] is cancel-safe: the agent may drop it in a `select!` at any
//!   await point; a partly read line, a pending restart delay and a replay's position are kept
//!   in the source and resumed by the next call.
//! - A line that does not parse, is longer than [`MAX_LINE_BYTES`] or is not UTF-8 is counted
//!   ([`TegrastatsStatus::malformed`]) and reported as [`TegrastatsEvent::Malformed`]; it is never
//!   fatal. Blank lines are skipped.
//! - Every exit and every spawn failure is counted and reported with the delay before the next
//!   start; the delay doubles per exit from `backoff.min` up to `backoff.max`, and a run that
//!   lasted at least `backoff.max` resets it (`edgewatch_conventions::backoff`, no jitter: one
//!   local child has nobody to spread from).
//! - The child gets no stdin, its stderr is discarded, and it is killed when the source is
//!   dropped. It inherits the agent's CPU affinity and scheduling policy.
//! - Reading a line reuses one buffer: in steady state the child path does not allocate.
//! - Replay stamps the `k`-th line `k × interval` after the replay began, whatever the speed:
//!   accelerated replays compress real time, not event time (their event times run ahead of
//!   the wall clock; they are for tests and demonstrations).

use std::future::pending;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use edgewatch_conventions::backoff::{Backoff, Jitter};
use tegrastats_parser::{ParseError, Sample, parse_line};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};
use tokio::time::{Instant, sleep_until, timeout};

use super::clock;
use super::config::{TegrastatsConfig, TegrastatsSourceConfig};
use crate::sink::Now;

/// Longest line kept: real lines are under 1.2 KB; anything this long is not tegrastats.
pub const MAX_LINE_BYTES: usize = 16 * 1024;
/// How long an exited child's stdout may stay closed before the child is killed and reaped.
const REAP_GRACE: Duration = Duration::from_secs(1);

/// Why the source could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TegrastatsError {
    /// The replay capture (`thermal.replay`) could not be read.
    #[error("key `thermal.replay`: cannot read {}: {source}", path.display())]
    ReplayUnreadable {
        /// The capture file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
}

/// How a child run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitInfo {
    /// Exit code, when it exited.
    pub code: Option<i32>,
    /// Signal number, when a signal ended it.
    pub signal: Option<i32>,
    /// How long the run lasted.
    pub ran_for: Duration,
    /// Lines it printed.
    pub lines: u64,
}

impl ExitInfo {
    fn new(status: Option<ExitStatus>, ran_for: Duration, lines: u64) -> Self {
        Self {
            code: status.and_then(|s| s.code()),
            signal: status.and_then(|s| s.signal()),
            ran_for,
            lines,
        }
    }
}

/// Why a line was not a sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MalformedLine {
    /// The parser found no field (with the column it gave up at).
    Parse(ParseError),
    /// Longer than [`MAX_LINE_BYTES`], or cut short by the child's exit.
    Truncated,
    /// Not UTF-8.
    NotUtf8,
}

/// What the source produced. `at` is when it happened (for a replay, the line's logical time).
// The sample is inline on purpose: boxing it would allocate for every line.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum TegrastatsEvent<'a> {
    /// A parsed line.
    Sample {
        /// The reading, borrowing the line.
        sample: Sample<'a>,
        /// When the line was read.
        at: Now,
    },
    /// A line that was not a sample (counted).
    Malformed {
        /// Why.
        error: MalformedLine,
        /// When.
        at: Now,
    },
    /// The child was started (first start or restart).
    Started {
        /// Its pid.
        pid: Option<u32>,
        /// Starts so far, this one included (restarts = starts − 1).
        starts: u64,
        /// When.
        at: Now,
    },
    /// The child exited; it is started again after `restart_in`.
    Exited {
        /// How it ended.
        exit: ExitInfo,
        /// The backoff delay before the next start.
        restart_in: Duration,
        /// Exits so far, this one included.
        exits: u64,
        /// When.
        at: Now,
    },
    /// The program could not be started; tried again after `restart_in`.
    SpawnFailed {
        /// Why (e.g. `NotFound`).
        error: io::ErrorKind,
        /// The backoff delay before the next try.
        restart_in: Duration,
        /// Failures so far.
        failures: u64,
        /// When.
        at: Now,
    },
    /// A looping replay started its capture over (continuity is kept).
    ReplayLooped {
        /// Completed passes.
        passes: u64,
        /// When (logical).
        at: Now,
    },
    /// A replay reached its end and does not loop; no event follows.
    ReplayFinished {
        /// When (logical).
        at: Now,
    },
}

impl TegrastatsEvent<'_> {
    /// When the event happened.
    pub fn at(&self) -> Now {
        match self {
            Self::Sample { at, .. }
            | Self::Malformed { at, .. }
            | Self::Started { at, .. }
            | Self::Exited { at, .. }
            | Self::SpawnFailed { at, .. }
            | Self::ReplayLooped { at, .. }
            | Self::ReplayFinished { at } => *at,
        }
    }
}

/// The source's counters and state, for the agent's status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TegrastatsStatus {
    /// A child is running now.
    pub running: bool,
    /// Its pid.
    pub pid: Option<u32>,
    /// Lines parsed into samples.
    pub samples: u64,
    /// Lines counted as malformed.
    pub malformed: u64,
    /// Successful starts.
    pub starts: u64,
    /// Starts after the first.
    pub restarts: u64,
    /// Child exits.
    pub exits: u64,
    /// Failed spawns.
    pub spawn_failures: u64,
    /// The last exit.
    pub last_exit: Option<ExitInfo>,
    /// The delay the next exit will get.
    pub next_backoff: Duration,
    /// Completed replay passes.
    pub replay_passes: u64,
    /// The replay reached its end.
    pub finished: bool,
}

/// Where tegrastats lines come from. Drive it with [`TegrastatsSource::next`] from the agent's
/// loop.
#[derive(Debug)]
pub struct TegrastatsSource {
    inner: Inner,
    status: TegrastatsStatus,
}

#[derive(Debug)]
enum Inner {
    Disabled,
    Child(Box<ChildRunner>),
    Replay(Replay),
}

// A lifecycle event (never a sample) is inline: boxing it would allocate on every pass of a
// looping replay.
#[allow(clippy::large_enum_variant)]
enum Step {
    Line(Now),
    Event(TegrastatsEvent<'static>),
}

enum LineCheck {
    Blank,
    Bad(MalformedLine),
    Text,
}

impl TegrastatsSource {
    /// A source for `config`. A replay reads its capture now; a child is spawned by the first
    /// [`TegrastatsSource::next`].
    ///
    /// # Errors
    ///
    /// [`TegrastatsError::ReplayUnreadable`] when the capture cannot be read.
    pub fn new(config: &TegrastatsConfig) -> Result<Self, TegrastatsError> {
        let interval_ms = u64::try_from(config.interval.as_millis()).unwrap_or(u64::MAX);
        let inner = match &config.source {
            TegrastatsSourceConfig::Disabled => Inner::Disabled,
            TegrastatsSourceConfig::Child { program } => Inner::Child(Box::new(ChildRunner {
                program: program.clone(),
                interval_arg: interval_ms.to_string(),
                backoff: Backoff::new(config.backoff.min, config.backoff.max),
                state: ChildState::Idle,
                line: Vec::with_capacity(2 * 1024),
                line_ready: false,
                overlong: false,
            })),
            TegrastatsSourceConfig::Replay {
                path,
                speed,
                looped,
            } => {
                let bytes =
                    std::fs::read(path).map_err(|source| TegrastatsError::ReplayUnreadable {
                        path: path.clone(),
                        source,
                    })?;
                Inner::Replay(Replay {
                    text: String::from_utf8_lossy(&bytes).into_owned(),
                    pos: 0,
                    line: (0, 0),
                    interval: config.interval,
                    speed: *speed,
                    looped: *looped,
                    origin: None,
                    index: 0,
                    pass_had_line: false,
                    finished: false,
                })
            }
        };
        Ok(Self {
            inner,
            status: TegrastatsStatus {
                next_backoff: config.backoff.min,
                ..TegrastatsStatus::default()
            },
        })
    }

    /// The source's counters.
    pub fn status(&self) -> TegrastatsStatus {
        self.status
    }

    /// Waits for the next event. Never resolves for a disabled source or a finished replay, so
    /// it can sit in a `select!`. Cancel-safe.
    pub async fn next(&mut self) -> TegrastatsEvent<'_> {
        let at = loop {
            let step = match &mut self.inner {
                Inner::Disabled => pending().await,
                Inner::Child(child) => child.step(&mut self.status).await,
                Inner::Replay(replay) => replay.step(&mut self.status).await,
            };
            let at = match step {
                Step::Line(at) => at,
                Step::Event(event) => return event,
            };
            match self.check_current() {
                LineCheck::Blank => {}
                LineCheck::Bad(error) => {
                    self.status.malformed += 1;
                    return TegrastatsEvent::Malformed { error, at };
                }
                LineCheck::Text => break at,
            }
        };
        let line = match &self.inner {
            Inner::Child(child) => child.line.as_slice(),
            Inner::Replay(replay) => replay.current(),
            Inner::Disabled => &[],
        };
        // `check` accepted the line as UTF-8.
        let text = std::str::from_utf8(line).unwrap_or_default();
        match parse_line(text) {
            Ok(sample) => {
                self.status.samples += 1;
                TegrastatsEvent::Sample { sample, at }
            }
            Err(error) => {
                self.status.malformed += 1;
                TegrastatsEvent::Malformed {
                    error: MalformedLine::Parse(error),
                    at,
                }
            }
        }
    }

    /// Stops the child (SIGKILL, then reaped) and stops producing events.
    pub async fn shutdown(&mut self) {
        if let Inner::Child(child) = &mut self.inner {
            if let ChildState::Running { child: process, .. } = &mut child.state {
                // Already gone is fine: the point is that it is not running.
                let _ = process.kill().await;
            }
            child.state = ChildState::Stopped;
        }
        self.inner = Inner::Disabled;
        self.status.running = false;
        self.status.pid = None;
    }

    fn check_current(&self) -> LineCheck {
        match &self.inner {
            Inner::Child(child) if child.overlong => LineCheck::Bad(MalformedLine::Truncated),
            Inner::Child(child) => check(&child.line),
            Inner::Replay(replay) => check(replay.current()),
            Inner::Disabled => LineCheck::Blank,
        }
    }
}

fn check(line: &[u8]) -> LineCheck {
    match std::str::from_utf8(line) {
        Err(_) => LineCheck::Bad(MalformedLine::NotUtf8),
        Ok(text) if text.trim().is_empty() => LineCheck::Blank,
        Ok(_) => LineCheck::Text,
    }
}

// ---------------------------------------------------------------------------------------------
// Child process.

// One per source, and the source already boxes its runner.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum ChildState {
    Idle,
    Waiting {
        until: Instant,
    },
    Running {
        child: Child,
        stdout: BufReader<ChildStdout>,
        started: Instant,
        lines: u64,
    },
    Stopped,
}

#[derive(Debug)]
struct ChildRunner {
    program: PathBuf,
    interval_arg: String,
    backoff: Backoff,
    state: ChildState,
    line: Vec<u8>,
    line_ready: bool,
    overlong: bool,
}

impl ChildRunner {
    async fn step(&mut self, status: &mut TegrastatsStatus) -> Step {
        loop {
            match &mut self.state {
                ChildState::Stopped => return pending().await,
                ChildState::Waiting { until } => {
                    sleep_until(*until).await;
                    self.state = ChildState::Idle;
                }
                ChildState::Idle => return self.spawn(status),
                ChildState::Running {
                    child,
                    stdout,
                    started,
                    lines,
                } => {
                    if self.line_ready {
                        self.line.clear();
                        self.line_ready = false;
                        self.overlong = false;
                    }
                    if let Ok(true) = read_line(stdout, &mut self.line, &mut self.overlong).await {
                        self.line_ready = true;
                        *lines += 1;
                        return Step::Line(clock::now());
                    }
                    // End of output (or a read error): the run is over.
                    if !self.line.is_empty() || self.overlong {
                        status.malformed += 1;
                    }
                    self.line.clear();
                    self.overlong = false;
                    let exit_status = reap(child).await;
                    let exit = ExitInfo::new(exit_status, started.elapsed(), *lines);
                    let restart_in = self.backoff.after_run(exit.ran_for, Jitter::None);
                    // Stamped before the deadline is set: the restart is at least `restart_in`
                    // after the event's time.
                    let at = clock::now();
                    self.state = ChildState::Waiting {
                        until: Instant::now() + restart_in,
                    };
                    status.exits += 1;
                    status.running = false;
                    status.pid = None;
                    status.last_exit = Some(exit);
                    status.next_backoff = self.backoff.ceiling();
                    tracing::warn!(
                        code = exit.code,
                        signal = exit.signal,
                        lines = exit.lines,
                        restart_in_ms = u64::try_from(restart_in.as_millis()).unwrap_or(u64::MAX),
                        "tegrastats exited; restarting after the backoff delay."
                    );
                    return Step::Event(TegrastatsEvent::Exited {
                        exit,
                        restart_in,
                        exits: status.exits,
                        at,
                    });
                }
            }
        }
    }

    fn spawn(&mut self, status: &mut TegrastatsStatus) -> Step {
        let spawned = Command::new(&self.program)
            .arg("--interval")
            .arg(&self.interval_arg)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn();
        let result = spawned.and_then(|mut child| match child.stdout.take() {
            Some(stdout) => Ok((child, stdout)),
            None => Err(io::Error::other("no stdout pipe")),
        });
        match result {
            Ok((child, stdout)) => {
                let pid = child.id();
                status.starts += 1;
                status.restarts = status.starts - 1;
                status.running = true;
                status.pid = pid;
                self.line.clear();
                self.line_ready = false;
                self.overlong = false;
                self.state = ChildState::Running {
                    child,
                    stdout: BufReader::new(stdout),
                    started: Instant::now(),
                    lines: 0,
                };
                tracing::debug!(pid, starts = status.starts, "tegrastats started.");
                Step::Event(TegrastatsEvent::Started {
                    pid,
                    starts: status.starts,
                    at: clock::now(),
                })
            }
            Err(error) => {
                let restart_in = self.backoff.after_run(Duration::ZERO, Jitter::None);
                let at = clock::now();
                self.state = ChildState::Waiting {
                    until: Instant::now() + restart_in,
                };
                status.spawn_failures += 1;
                status.next_backoff = self.backoff.ceiling();
                tracing::warn!(
                    %error,
                    program = %self.program.display(),
                    "tegrastats could not be started; retrying after the backoff delay."
                );
                Step::Event(TegrastatsEvent::SpawnFailed {
                    error: error.kind(),
                    restart_in,
                    failures: status.spawn_failures,
                    at,
                })
            }
        }
    }
}

/// Appends the rest of a line (without its `\n`) to `line`; `Ok(false)` at end of output.
/// Bytes past [`MAX_LINE_BYTES`] are dropped and flagged. Cancel-safe: what was read stays in
/// `line`.
async fn read_line<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    line: &mut Vec<u8>,
    overlong: &mut bool,
) -> io::Result<bool> {
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            return Ok(false);
        }
        let newline = available.iter().position(|&b| b == b'\n');
        let chunk = available
            .get(..newline.unwrap_or(available.len()))
            .unwrap_or_default();
        if *overlong || line.len() + chunk.len() > MAX_LINE_BYTES {
            *overlong = true;
        } else {
            line.extend_from_slice(chunk);
        }
        let consumed = newline.map_or(chunk.len(), |i| i + 1);
        reader.consume(consumed);
        if newline.is_some() {
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            return Ok(true);
        }
    }
}

/// The exit status of a child whose output ended, killing it if it lingers.
async fn reap(child: &mut Child) -> Option<ExitStatus> {
    if let Ok(Some(status)) = child.try_wait() {
        return Some(status);
    }
    if let Ok(Ok(status)) = timeout(REAP_GRACE, child.wait()).await {
        return Some(status);
    }
    let _ = child.kill().await;
    child.try_wait().ok().flatten()
}

// ---------------------------------------------------------------------------------------------
// Replay.

#[derive(Debug)]
struct Replay {
    text: String,
    /// Start of the next unread line.
    pos: usize,
    /// Byte range of the current line.
    line: (usize, usize),
    interval: Duration,
    speed: f64,
    looped: bool,
    /// Logical and real time of line 0.
    origin: Option<(Now, Instant)>,
    /// Lines delivered so far (sets the time of the next).
    index: u64,
    pass_had_line: bool,
    finished: bool,
}

impl Replay {
    fn current(&self) -> &[u8] {
        self.text
            .as_bytes()
            .get(self.line.0..self.line.1)
            .unwrap_or_default()
    }

    fn logical(&self, origin: Now) -> Now {
        let offset = self
            .interval
            .checked_mul(u32::try_from(self.index).unwrap_or(u32::MAX))
            .unwrap_or(Duration::MAX);
        let ns = u64::try_from(offset.as_nanos()).unwrap_or(u64::MAX);
        Now {
            wall_unix_ns: origin
                .wall_unix_ns
                .saturating_add(i64::try_from(ns).unwrap_or(i64::MAX)),
            monotonic_ns: origin.monotonic_ns.saturating_add(ns),
        }
    }

    async fn step(&mut self, status: &mut TegrastatsStatus) -> Step {
        if self.finished {
            return pending().await;
        }
        let (origin_now, origin_instant) = *self
            .origin
            .get_or_insert_with(|| (clock::now(), Instant::now()));
        let offset = self
            .interval
            .checked_mul(u32::try_from(self.index).unwrap_or(u32::MAX))
            .unwrap_or(Duration::MAX);
        // Wait before touching any state, so a cancelled wait loses nothing.
        sleep_until(origin_instant + offset.div_f64(self.speed)).await;
        loop {
            if self.pos >= self.text.len() {
                if self.looped && self.pass_had_line {
                    self.pos = 0;
                    self.pass_had_line = false;
                    status.replay_passes += 1;
                    return Step::Event(TegrastatsEvent::ReplayLooped {
                        passes: status.replay_passes,
                        at: self.logical(origin_now),
                    });
                }
                self.finished = true;
                status.finished = true;
                status.replay_passes += 1;
                return Step::Event(TegrastatsEvent::ReplayFinished {
                    at: self.logical(origin_now),
                });
            }
            let rest = self.text.get(self.pos..).unwrap_or_default();
            let len = rest.find('\n').unwrap_or(rest.len());
            let mut end = self.pos + len;
            self.line = (self.pos, end);
            self.pos = end + 1;
            if rest.get(..len).is_some_and(|l| l.ends_with('\r')) {
                end -= 1;
                self.line.1 = end;
            }
            if self.current().iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            self.pass_had_line = true;
            let at = self.logical(origin_now);
            self.index += 1;
            return Step::Line(at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_checked_for_blankness_and_utf8_before_parsing() {
        assert!(matches!(check(b"  "), LineCheck::Blank));
        assert!(matches!(
            check(b"RAM \xff"),
            LineCheck::Bad(MalformedLine::NotUtf8)
        ));
        assert!(matches!(check(b"RAM 1/2MB"), LineCheck::Text));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn reading_lines_strips_crlf_keeps_partial_lines_and_flags_overlong_ones() {
        let data: &[u8] = b"first\r\nsecond\nthird";
        let mut reader = BufReader::with_capacity(4, data);
        let mut line = Vec::new();
        let mut overlong = false;
        assert!(
            read_line(&mut reader, &mut line, &mut overlong)
                .await
                .unwrap()
        );
        assert_eq!(line, b"first");
        line.clear();
        assert!(
            read_line(&mut reader, &mut line, &mut overlong)
                .await
                .unwrap()
        );
        assert_eq!(line, b"second");
        line.clear();
        assert!(
            !read_line(&mut reader, &mut line, &mut overlong)
                .await
                .unwrap()
        );
        assert_eq!(line, b"third", "a partial line stays in the buffer");

        let long = vec![b'x'; MAX_LINE_BYTES + 10];
        let mut data = long.clone();
        data.extend_from_slice(b"\nRAM\n");
        let mut reader = BufReader::new(data.as_slice());
        let mut line = Vec::new();
        let mut overlong = false;
        assert!(
            read_line(&mut reader, &mut line, &mut overlong)
                .await
                .unwrap()
        );
        assert!(overlong);
        assert!(line.len() <= MAX_LINE_BYTES);
        line.clear();
        overlong = false;
        assert!(
            read_line(&mut reader, &mut line, &mut overlong)
                .await
                .unwrap()
        );
        assert_eq!((line.as_slice(), overlong), (&b"RAM"[..], false));
    }
}
