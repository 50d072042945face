//! CLOCK_MONOTONIC in nanoseconds: the time base of every timestamp in a probe file.
//!
//! Invariants:
//! - Producer and agent must pass times from this clock (or the same kernel clock read another
//!   way); liveness and plausibility checks compare them directly.

/// Now on CLOCK_MONOTONIC, in nanoseconds (0 if the clock cannot be read, which Linux never does
/// for this clock).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC is always supported on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_monotonic_clock_never_goes_back() {
        let a = monotonic_ns();
        let b = monotonic_ns();
        assert!(a > 0);
        assert!(b >= a);
    }
}
