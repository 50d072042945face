//! A periodic timer on a Linux `timerfd`: the sampling loop's clock.
//!
//! tokio re-arms its timers through the runtime's driver, and a re-armed timer that becomes the
//! earliest wakes the driver through its eventfd. On the agent's current-thread runtime every tick
//! of a 100 Hz `Interval` cost a `write`, two more `epoll_wait`s and an extra scheduler turn
//! (seen by the HIL footprint level under `strace`). The kernel re-arms a periodic timerfd by
//! itself: a tick is one readiness event and one `read`.
//!
//! Invariants:
//! - Periods that expired while the loop was busy are coalesced into one tick whose count says
//!   how many there were, as `MissedTickBehavior::Skip` would.
//! - No allocation after [`Ticker::new`]. The first tick comes one period after creation.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// The shortest period a ticker accepts; shorter ones are raised to it.
pub const MIN_PERIOD: Duration = Duration::from_millis(1);

/// A periodic timer registered with the runtime's reactor.
#[derive(Debug)]
pub struct Ticker {
    fd: AsyncFd<OwnedFd>,
    period: Duration,
}

impl Ticker {
    /// Arms a timer on `CLOCK_MONOTONIC` that expires every `period` (at least [`MIN_PERIOD`]).
    /// Must be called inside a tokio runtime with I/O enabled.
    pub fn new(period: Duration) -> io::Result<Self> {
        let period = period.max(MIN_PERIOD);
        // SAFETY: timerfd_create takes no pointers; the result is checked below.
        let raw = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let every = libc::timespec {
            tv_sec: libc::time_t::try_from(period.as_secs()).unwrap_or(libc::time_t::MAX),
            tv_nsec: libc::c_long::from(period.subsec_nanos()),
        };
        let spec = libc::itimerspec {
            it_interval: every,
            it_value: every,
        };
        // SAFETY: `fd` is a timerfd, `spec` a valid itimerspec; the old value is not wanted (null).
        let rc = unsafe { libc::timerfd_settime(fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: an `OwnedFd` is an open descriptor that stays open, and the same, until the
        // `AsyncFd` that owns it is dropped.
        let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
            .map_err(io::Error::from)?;
        Ok(Self { fd, period })
    }

    /// The period, after raising it to [`MIN_PERIOD`].
    pub fn period(&self) -> Duration {
        self.period
    }

    /// Waits for the next expiry and returns how many periods expired since the last tick (≥ 1).
    pub async fn tick(&self) -> io::Result<u64> {
        loop {
            let mut guard = self.fd.readable().await?;
            let mut expirations = [0u8; 8];
            // SAFETY: reads at most 8 bytes into an 8-byte buffer from a descriptor we own.
            let n = unsafe {
                libc::read(
                    self.fd.get_ref().as_raw_fd(),
                    expirations.as_mut_ptr().cast(),
                    expirations.len(),
                )
            };
            if n == 8 {
                // The timer is unreadable again until its next expiry, which the reactor sees as
                // a new edge: clearing here loses no tick and saves a `read` that would fail.
                guard.clear_ready();
                return Ok(u64::from_ne_bytes(expirations));
            }
            let error = io::Error::last_os_error();
            if n < 0 && error.kind() == io::ErrorKind::WouldBlock {
                guard.clear_ready();
                continue;
            }
            if n < 0 {
                return Err(error);
            }
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "a timerfd read returned fewer than 8 bytes",
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn ticks_come_one_period_apart_and_never_early() {
        runtime().block_on(async {
            let start = Instant::now();
            let ticker = Ticker::new(Duration::from_millis(20)).unwrap();
            for k in 1..=5u32 {
                let count = ticker.tick().await.unwrap();
                assert!(count >= 1);
                assert!(start.elapsed() >= Duration::from_millis(20) * k);
            }
        });
    }

    #[test]
    fn periods_missed_while_busy_come_back_as_one_tick_with_their_count() {
        runtime().block_on(async {
            let ticker = Ticker::new(Duration::from_millis(5)).unwrap();
            std::thread::sleep(Duration::from_millis(60));
            let count = ticker.tick().await.unwrap();
            assert!(count >= 10, "{count} expirations in 60 ms of 5 ms periods");
            // The next tick reports new expiries only: a few periods at most, not the same ones.
            let next = ticker.tick().await.unwrap();
            assert!((1..count).contains(&next), "{next} after {count}");
        });
    }

    #[test]
    fn a_zero_period_is_raised_to_the_minimum() {
        runtime().block_on(async {
            let ticker = Ticker::new(Duration::ZERO).unwrap();
            assert_eq!(ticker.period(), MIN_PERIOD);
            assert!(ticker.tick().await.unwrap() >= 1);
        });
    }
}
