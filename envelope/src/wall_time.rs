//! The envelope's wall-time form: RFC 3339 in UTC, `YYYY-MM-DDTHH:MM:SS[.f]Z`,
//! a real calendar date. Pure conversions only (callers read the clock); the
//! calendar arithmetic is `humantime`'s.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Render a time in the envelope's form, with millisecond precision.
pub fn format_millis(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// Render Unix nanoseconds (clamped at the epoch) in the envelope's form.
pub fn format_unix_ns(ns: i64) -> String {
    format_millis(UNIX_EPOCH + Duration::from_nanos(u64::try_from(ns).unwrap_or(0)))
}

/// Parse the envelope's form; `None` unless it has exactly that shape (upper
/// case `T` and `Z`, optional fraction) and names a real instant.
pub fn parse(s: &str) -> Option<SystemTime> {
    let b = s.as_bytes();
    if b.len() < 20 || b[b.len() - 1] != b'Z' || b[10] != b'T' {
        return None;
    }
    let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
    let shape = digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19);
    let fraction = &b[19..b.len() - 1];
    let fraction_ok = fraction.is_empty()
        || (fraction.len() >= 2
            && fraction[0] == b'.'
            && fraction[1..].iter().all(u8::is_ascii_digit));
    if !(shape && fraction_ok) {
        return None;
    }
    humantime::parse_rfc3339(s).ok()
}

/// Parse the envelope's form to Unix nanoseconds.
pub fn parse_unix_ns(s: &str) -> Option<i64> {
    let since = parse(s)?.duration_since(UNIX_EPOCH).ok()?;
    i64::try_from(since.as_nanos()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_instants_round_trip() {
        assert_eq!(format_unix_ns(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            format_unix_ns(951_782_400_123_000_000),
            "2000-02-29T00:00:00.123Z"
        );
        assert_eq!(
            parse_unix_ns("2000-02-29T00:00:00.123Z"),
            Some(951_782_400_123_000_000)
        );
        assert_eq!(
            parse_unix_ns("2026-12-02T11:00:00Z").map(|n| n % 1_000_000_000),
            Some(0)
        );
        assert_eq!(
            parse_unix_ns("2026-12-02T11:00:00.123456789Z").map(|n| n % 1_000_000_000),
            Some(123_456_789)
        );
    }

    #[test]
    fn impossible_dates_and_other_shapes_are_refused() {
        for bad in [
            "2026-02-30T00:00:00Z",
            "2025-02-29T00:00:00Z",
            "2026-13-01T00:00:00Z",
            "2026-12-02T24:00:00Z",
            "2026-12-02T11:60:00Z",
            "2026-12-02 11:00:00Z",
            "2026-12-02t11:00:00z",
            "2026-12-02T11:00:00+00:00",
            "2026-12-02T11:00:00.Z",
            "yesterday at noon",
            "",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
        assert!(parse("2024-02-29T23:59:59.999Z").is_some());
    }
}
