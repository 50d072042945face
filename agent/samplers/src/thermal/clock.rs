//! The one place the thermal shells read the time: wall clock and CLOCK_MONOTONIC as a [`Now`].
//!
//! Invariants:
//! - Only the I/O shells (the tegrastats child runner and replay) call [`now`]; the pure logic
//!   is handed a [`Now`].
//! - Reading the clock neither allocates nor fails.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::sink::Now;

/// The current wall-clock and monotonic time.
pub fn now() -> Now {
    let wall_unix_ns = match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(since) => i64::try_from(since.as_nanos()).unwrap_or(i64::MAX),
        // A clock set before 1970: keep the sign rather than failing.
        Err(before) => i64::try_from(before.duration().as_nanos()).map_or(i64::MIN, |ns| -ns),
    };
    Now {
        wall_unix_ns,
        monotonic_ns: monotonic_ns(),
    }
}

/// CLOCK_MONOTONIC in nanoseconds (the `Instant` type hides its value).
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC is always supported on Linux,
    // so the call only writes `ts`.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    debug_assert_eq!(rc, 0, "CLOCK_MONOTONIC is always readable");
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_monotonic_clock_never_goes_back_and_the_wall_clock_is_after_2020() {
        let a = now();
        let b = now();
        assert!(b.monotonic_ns >= a.monotonic_ns);
        assert!(a.monotonic_ns > 0);
        assert!(a.wall_unix_ns > 1_577_836_800_000_000_000);
    }
}
