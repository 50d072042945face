//! The agent's one clock: wall time, monotonic time, and the periodic tick of the sampling loop.
//! Every task of the daemon reads the time here; the pure cores it drives (samplers, queue,
//! pacing) take the time as an argument and read no clock themselves.
//!
//! Layout:
//! - [`wall`], [`instant`], [`monotonic_ns`], [`now`]: reading the clocks.
//! - [`unix_ms`], [`unix_ns`]: wall time as the integers events and status files carry.
//! - [`Periodic`]: the sampling loop's tick, on a [`timerfd`] or, failing that, tokio's timers.
//!
//! Invariants:
//! - Wall time is `SystemTime` (CLOCK_REALTIME): it stamps events and files, and it may step.
//!   Monotonic time is CLOCK_MONOTONIC, the clock the probes stamp their records with, so the
//!   samplers compare the two directly; [`instant`] reads the same clock as an `Instant`.
//! - Wall time before the Unix epoch reads as 0, and beyond the integer's range as its maximum.
//! - A [`Periodic`] tick on the timerfd, or on the fallback chosen at start, coalesces periods
//!   missed while the loop was busy (skipped, never caught up).
//! - Reading the time allocates nothing. tokio's own timers (sleeps, intervals, timeouts) keep the
//!   runtime's clock.

pub mod timerfd;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use edgewatch_samplers::Now;

use timerfd::Ticker;

/// Wall-clock time now.
pub fn wall() -> SystemTime {
    SystemTime::now()
}

/// Monotonic time now, as an `Instant` (for deadlines and ages inside the agent).
pub fn instant() -> Instant {
    Instant::now()
}

/// CLOCK_MONOTONIC in nanoseconds.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// Wall and monotonic time read together, as the samplers take them.
pub fn now() -> Now {
    Now {
        wall_unix_ns: unix_ns(wall()),
        monotonic_ns: monotonic_ns(),
    }
}

/// Milliseconds since the Unix epoch.
pub fn unix_ms(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Nanoseconds since the Unix epoch.
pub fn unix_ns(time: SystemTime) -> i64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// A periodic tick: a timerfd (see [`timerfd`]), or tokio's interval if the kernel refuses one
/// or the timerfd fails later.
pub struct Periodic {
    timer: Timer,
}

enum Timer {
    TimerFd(Ticker),
    Tokio(tokio::time::Interval),
}

impl Periodic {
    /// Arms a tick every `period`; the first comes one period from now on a timerfd (at once on
    /// the fallback). Must be called inside a tokio runtime with I/O and time enabled.
    pub fn new(period: Duration) -> Self {
        let timer = match Ticker::new(period) {
            Ok(ticker) => Timer::TimerFd(ticker),
            Err(error) => {
                tracing::warn!(%error, "No timerfd; sampling on the runtime's timers.");
                let mut interval = tokio::time::interval(period.max(timerfd::MIN_PERIOD));
                interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                Timer::Tokio(interval)
            }
        };
        Self { timer }
    }

    /// Waits for the next tick.
    pub async fn tick(&mut self) {
        match &mut self.timer {
            Timer::TimerFd(ticker) => {
                if let Err(error) = ticker.tick().await {
                    tracing::warn!(%error, "The sampling timerfd failed; sampling on the runtime's timers.");
                    self.timer = Timer::Tokio(tokio::time::interval(ticker.period()));
                }
            }
            Timer::Tokio(interval) => {
                interval.tick().await;
            }
        }
    }
}
