//! UTC calendar arithmetic on Unix milliseconds: day and month boundaries, RFC 3339 text, and
//! Prometheus-style durations (`5m`, `1h`, `30d`) for the rules and reports.
//!
//! Invariants:
//! - Only UTC exists here; no function reads a clock or a time zone database.
//! - [`format_rfc3339`] and [`parse_rfc3339`] round-trip every millisecond in years 0000..=9999.
//! - Durations are only formatted here, in the units of the one duration grammar
//!   (`edgewatch_conventions::duration`), which is also what parses them.

use edgewatch_conventions::duration::UNITS;

/// Milliseconds in one UTC day (UTC days have no leap seconds in Unix time).
pub const MS_PER_DAY: i64 = 86_400_000;

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date (year, month 1..=12, day 1..=31) of a day number since 1970-01-01.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// `[start, end)` of the UTC calendar month containing `ms`.
pub fn month_bounds(ms: i64) -> (i64, i64) {
    let (year, month, _) = civil_from_days(ms.div_euclid(MS_PER_DAY));
    let start = days_from_civil(year, month, 1) * MS_PER_DAY;
    let (ny, nm) = if month == 12 {
        (year + 1, 1)
    } else {
        (year, month + 1)
    };
    (start, days_from_civil(ny, nm, 1) * MS_PER_DAY)
}

/// `2026-11-30T00:00:00Z`, with `.mmm` only when the milliseconds are not zero.
pub fn format_rfc3339(ms: i64) -> String {
    let days = ms.div_euclid(MS_PER_DAY);
    let in_day = ms.rem_euclid(MS_PER_DAY);
    let (year, month, day) = civil_from_days(days);
    let (h, m, s, milli) = (
        in_day / 3_600_000,
        in_day / 60_000 % 60,
        in_day / 1000 % 60,
        in_day % 1000,
    );
    if milli == 0 {
        format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}Z")
    } else {
        format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{milli:03}Z")
    }
}

/// Parses `YYYY-MM-DDTHH:MM:SS[.fff]Z` (or `+00:00` in place of `Z`) into Unix milliseconds.
/// Other offsets are refused: every time in this crate is UTC.
pub fn parse_rfc3339(text: &str) -> Option<i64> {
    let text = text.trim();
    let body = text
        .strip_suffix('Z')
        .or_else(|| text.strip_suffix("+00:00"))?;
    let (date, time) = body.split_once(['T', ' '])?;
    let num = |s: &str, len: usize| -> Option<i64> {
        (s.len() == len && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    let mut d = date.split('-');
    let (year, month, day) = (num(d.next()?, 4)?, num(d.next()?, 2)?, num(d.next()?, 2)?);
    if d.next().is_some() || !(1..=12).contains(&month) || day < 1 {
        return None;
    }
    let (hms, frac) = match time.split_once('.') {
        Some((hms, frac)) => (hms, Some(frac)),
        None => (time, None),
    };
    let mut t = hms.split(':');
    let (h, m, s) = (num(t.next()?, 2)?, num(t.next()?, 2)?, num(t.next()?, 2)?);
    if t.next().is_some() || h > 23 || m > 59 || s > 59 {
        return None;
    }
    let milli = match frac {
        None => 0,
        Some(f) if !f.is_empty() && f.len() <= 9 && f.bytes().all(|b| b.is_ascii_digit()) => {
            format!("{f:0<3}")[..3].parse::<i64>().ok()?
        }
        Some(_) => return None,
    };
    let days = days_from_civil(year, month as u32, day as u32);
    // Reject 2026-02-31 and friends: the date must survive the round trip.
    if civil_from_days(days) != (year, month as u32, day as u32) {
        return None;
    }
    Some(days * MS_PER_DAY + h * 3_600_000 + m * 60_000 + s * 1000 + milli)
}

/// The shortest single-unit Prometheus duration for `ms` (e.g. `3600000` → `1h`).
pub fn format_duration(ms: i64) -> String {
    UNITS
        .iter()
        .map(|&(name, unit_ms)| (name, unit_ms as i64))
        .find(|(_, unit_ms)| ms % unit_ms == 0)
        .map_or_else(
            || format!("{ms}ms"),
            |(name, unit_ms)| format!("{}{name}", ms / unit_ms),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates_format_and_parse_both_ways() {
        // 2026-11-30T00:00:00Z = 20,787 days after 1970-01-01.
        assert_eq!(days_from_civil(2026, 11, 30), 20_787);
        let ms = 20_787 * MS_PER_DAY;
        assert_eq!(format_rfc3339(ms), "2026-11-30T00:00:00Z");
        assert_eq!(parse_rfc3339("2026-11-30T00:00:00Z"), Some(ms));
        assert_eq!(parse_rfc3339("2026-11-30T00:00:00+00:00"), Some(ms));
        assert_eq!(format_rfc3339(ms + 1_234), "2026-11-30T00:00:01.234Z");
        assert_eq!(parse_rfc3339("2026-11-30T00:00:01.234Z"), Some(ms + 1_234));
        assert_eq!(format_rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_rfc3339(-1), "1969-12-31T23:59:59.999Z");
    }

    #[test]
    fn malformed_or_non_utc_timestamps_are_refused() {
        for bad in [
            "2026-02-31T00:00:00Z",
            "2026-11-30T00:00:00+01:00",
            "2026-11-30",
            "2026-13-01T00:00:00Z",
            "2026-11-30T24:00:00Z",
            "26-11-30T00:00:00Z",
            "2026-11-30T00:00:00.Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }

    #[test]
    fn month_bounds_cover_december_and_leap_february() {
        let dec = parse_rfc3339("2026-12-15T10:00:00Z").unwrap();
        assert_eq!(
            month_bounds(dec),
            (
                parse_rfc3339("2026-12-01T00:00:00Z").unwrap(),
                parse_rfc3339("2027-01-01T00:00:00Z").unwrap()
            )
        );
        let feb = parse_rfc3339("2028-02-29T23:59:59Z").unwrap();
        let (start, end) = month_bounds(feb);
        assert_eq!((end - start) / MS_PER_DAY, 29);
        assert_eq!(start, parse_rfc3339("2028-02-01T00:00:00Z").unwrap());
    }

    proptest::proptest! {
        #[test]
        fn every_millisecond_round_trips_through_rfc3339(ms in -62_167_219_200_000i64..253_402_300_799_999) {
            proptest::prop_assert_eq!(parse_rfc3339(&format_rfc3339(ms)), Some(ms));
        }
    }
}
