//! Time arguments as users write them: `now`, `now-1h`, epoch numbers (seconds to
//! nanoseconds, told apart by digit count) and RFC 3339.

use std::sync::atomic::{AtomicI64, Ordering};

use crate::FormatError;

/// Wall-clock Unix nanoseconds: Kiln's one clock, for profile times, query defaults,
/// leases and tombstones alike. A clock before 1970 reads as 0.
pub fn now_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The wall clock as an arrival stamp: [`now_nanos`], but never the same value twice in
/// a process. A profile sent without a time is stamped with its arrival, and the stamp is
/// part of its identity (kiln-ingest `dedup.rs`): two requests with the same bytes must not
/// be taken for a retry because two cores read the clock in the same nanosecond. They do:
/// two threads reading it in a loop see the same value in about 1 read of 40.
pub fn arrival_nanos() -> i64 {
    static LAST: AtomicI64 = AtomicI64::new(0);
    let now = now_nanos();
    let mut last = LAST.load(Ordering::Relaxed);
    loop {
        let stamp = now.max(last.saturating_add(1));
        match LAST.compare_exchange_weak(last, stamp, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return stamp,
            Err(seen) => last = seen,
        }
    }
}

/// Wall-clock Unix milliseconds (see [`now_nanos`]).
pub fn now_ms() -> i64 {
    now_nanos() / 1_000_000
}

/// Parses a time into Unix nanoseconds, relative forms against `now_nanos`.
pub fn parse_time_nanos(value: &str, now_nanos: i64) -> Result<i64, FormatError> {
    let value = value.trim();
    if value.is_empty() {
        return Err(FormatError::malformed("empty time"));
    }
    if let Some(rest) = value.strip_prefix("now") {
        if rest.is_empty() {
            return Ok(now_nanos);
        }
        let (sign, duration) = match rest.as_bytes()[0] {
            b'-' => (-1, &rest[1..]),
            b'+' => (1, &rest[1..]),
            _ => {
                return Err(FormatError::malformed(format!(
                    "invalid relative time {value:?}"
                )))
            }
        };
        return Ok(now_nanos + sign * parse_duration_nanos(duration)?);
    }
    if value.bytes().all(|b| b.is_ascii_digit()) {
        return parse_epoch_nanos(value);
    }
    parse_rfc3339_nanos(value)
}

/// An epoch integer in seconds, milliseconds, microseconds or nanoseconds, told apart by
/// its number of digits (10, 13, 16, 19), as Pyroscope reads `from` and `until`.
pub fn parse_epoch_nanos(value: &str) -> Result<i64, FormatError> {
    let value = value.trim();
    let number: i64 = value.parse().map_err(|_| {
        FormatError::malformed(format!("invalid timestamp {value:?}: expected an integer"))
    })?;
    let nanos = match value.trim_start_matches('-').len() {
        0..=10 => number.checked_mul(1_000_000_000),
        11..=13 => number.checked_mul(1_000_000),
        14..=16 => number.checked_mul(1_000),
        _ => Some(number),
    };
    nanos.ok_or_else(|| FormatError::malformed(format!("timestamp {value:?} is out of range")))
}

/// Parses `1h`, `30m`, `15s`, `7d`, `500ms`, and sums like `1h30m`.
pub fn parse_duration_nanos(value: &str) -> Result<i64, FormatError> {
    let mut total: i64 = 0;
    let mut rest = value.trim();
    if rest.is_empty() {
        return Err(FormatError::malformed("empty duration"));
    }
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(|b| b.is_ascii_digit()).count();
        if digits == 0 {
            return Err(FormatError::malformed(format!(
                "invalid duration {value:?}"
            )));
        }
        let number: i64 = rest[..digits]
            .parse()
            .map_err(|_| FormatError::malformed(format!("invalid duration {value:?}")))?;
        rest = &rest[digits..];
        let unit_length = rest.bytes().take_while(|b| b.is_ascii_alphabetic()).count();
        let unit = match &rest[..unit_length] {
            "ns" => 1,
            "us" | "µs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "d" => 86_400_000_000_000,
            "w" => 604_800_000_000_000,
            other => {
                return Err(FormatError::malformed(format!(
                    "unknown duration unit {other:?} in {value:?}"
                )))
            }
        };
        rest = &rest[unit_length..];
        total = number
            .checked_mul(unit)
            .and_then(|n| total.checked_add(n))
            .ok_or_else(|| FormatError::malformed(format!("duration {value:?} is out of range")))?;
    }
    Ok(total)
}

/// Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_index = (month + 9) % 12;
    let day_of_year = (153 * month_index + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// Civil date and time of Unix seconds, for formatting.
pub fn civil_from_unix(seconds: i64) -> (i64, u32, u32, u32, u32, u32) {
    let days = seconds.div_euclid(86_400);
    let second_of_day = seconds.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * month_index + 2) / 5 + 1) as u32;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    } as u32;
    let year = year_of_era + era * 400 + if month <= 2 { 1 } else { 0 };
    (
        year,
        month,
        day,
        (second_of_day / 3600) as u32,
        (second_of_day / 60 % 60) as u32,
        (second_of_day % 60) as u32,
    )
}

/// RFC 3339 in UTC with nanoseconds: `2026-11-21T18:00:00.123456789Z`.
pub fn format_rfc3339(nanos: i64) -> String {
    let seconds = nanos.div_euclid(1_000_000_000);
    let fraction = nanos.rem_euclid(1_000_000_000);
    let (year, month, day, hour, minute, second) = civil_from_unix(seconds);
    if fraction == 0 {
        format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}Z")
    } else {
        format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}.{fraction:09}Z")
    }
}

/// Parses RFC 3339 (`2026-11-21T18:00:00Z`, `…+02:00`, fractional seconds). A missing
/// offset means UTC, as profefe's examples write it.
pub fn parse_rfc3339_nanos(value: &str) -> Result<i64, FormatError> {
    let invalid = || {
        FormatError::malformed(format!(
            "invalid time {value:?}: expected RFC 3339, epoch or now-1h"
        ))
    };
    let bytes = value.as_bytes();
    if bytes.len() < 19
        || bytes[4] != b'-'
        || bytes[7] != b'-'
        || !matches!(bytes[10], b'T' | b't' | b' ')
        || bytes[13] != b':'
        || bytes[16] != b':'
    {
        return Err(invalid());
    }
    let number = |range: std::ops::Range<usize>| -> Result<i64, FormatError> {
        value
            .get(range)
            .and_then(|s| s.parse::<i64>().ok())
            .ok_or_else(invalid)
    };
    let (year, month, day) = (number(0..4)?, number(5..7)?, number(8..10)?);
    let (hour, minute, second) = (number(11..13)?, number(14..16)?, number(17..19)?);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return Err(invalid());
    }
    let mut rest = &value[19..];
    let mut fraction_nanos = 0i64;
    if let Some(stripped) = rest.strip_prefix('.') {
        let digits = stripped.bytes().take_while(|b| b.is_ascii_digit()).count();
        if digits == 0 {
            return Err(invalid());
        }
        let mut fraction = stripped[..digits.min(9)].to_string();
        while fraction.len() < 9 {
            fraction.push('0');
        }
        fraction_nanos = fraction.parse().map_err(|_| invalid())?;
        rest = &stripped[digits..];
    }
    let offset_seconds = match rest {
        "" | "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes()[0] {
                b'+' => 1,
                b'-' => -1,
                _ => return Err(invalid()),
            };
            let offset = &rest[1..];
            if offset.len() != 5 || offset.as_bytes()[2] != b':' {
                return Err(invalid());
            }
            let hours: i64 = offset[0..2].parse().map_err(|_| invalid())?;
            let minutes: i64 = offset[3..5].parse().map_err(|_| invalid())?;
            sign * (hours * 3600 + minutes * 60)
        }
    };
    let seconds = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second
        - offset_seconds;
    seconds
        .checked_mul(1_000_000_000)
        .and_then(|n| n.checked_add(fraction_nanos))
        .ok_or_else(invalid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrival_stamps_are_unique_across_cores_and_follow_the_clock() {
        let before = now_nanos();
        let threads: Vec<_> = (0..2)
            .map(|_| {
                std::thread::spawn(|| (0..200_000).map(|_| arrival_nanos()).collect::<Vec<_>>())
            })
            .collect();
        let stamps: Vec<Vec<i64>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        for own in &stamps {
            assert!(own.windows(2).all(|w| w[0] < w[1]), "not increasing");
        }
        let mut all: Vec<i64> = stamps.concat();
        all.sort_unstable();
        let len = all.len();
        all.dedup();
        assert_eq!(all.len(), len, "{} stamps given twice", len - all.len());
        assert!(all[0] >= before);
        // Unique by a nanosecond at a time, so never ahead of the clock by much.
        assert!(all[len - 1] - now_nanos() < 1_000_000_000);
    }

    #[test]
    fn parses_every_form() {
        let now = 1_800_000_000_000_000_000;
        let cases = [
            ("now", now),
            ("now-1h", now - 3_600_000_000_000),
            ("now-1h30m", now - 5_400_000_000_000),
            ("1700000000", 1_700_000_000_000_000_000),
            ("1700000000000", 1_700_000_000_000_000_000),
            ("2023-11-14T22:13:20Z", 1_700_000_000_000_000_000),
            ("2023-11-15T00:13:20.5+02:00", 1_700_000_000_500_000_000),
            ("2023-11-14T22:13:20", 1_700_000_000_000_000_000),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_time_nanos(text, now).unwrap(), expected, "{text}");
        }
        for bad in ["yesterday", "now-1x", "", "2023-13-01T00:00:00Z"] {
            assert!(parse_time_nanos(bad, now).is_err(), "{bad}");
        }
    }

    #[test]
    fn epoch_timestamps_by_digit_count() {
        let cases = [
            ("1700000000", 1_700_000_000_000_000_000),
            ("1700000000123", 1_700_000_000_123_000_000),
            ("1700000000123456", 1_700_000_000_123_456_000),
            ("1700000000123456789", 1_700_000_000_123_456_789),
            ("-1", -1_000_000_000),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_epoch_nanos(text).unwrap(), expected, "{text}");
        }
        assert!(parse_epoch_nanos("soon").is_err());
        // Ten digits are seconds: this many overflow i64 nanoseconds, and are refused.
        let err = parse_epoch_nanos("9999999999").unwrap_err();
        assert!(err.to_string().contains("out of range"), "{err}");
    }

    #[test]
    fn formats_round_trip() {
        for nanos in [
            0,
            1_700_000_000_000_000_000,
            1_700_000_000_123_456_789,
            951_782_400_000_000_000,
        ] {
            assert_eq!(parse_rfc3339_nanos(&format_rfc3339(nanos)).unwrap(), nanos);
        }
        assert_eq!(
            format_rfc3339(1_700_000_000_000_000_000),
            "2023-11-14T22:13:20Z"
        );
    }
}
