//! Durations as operators write them: an integer and a unit, `500ms`, `5s`,
//! `2m`, `1h`, `30d`. A bare number is refused — `--window 5` once meant five
//! seconds in one place and five milliseconds in another — except through
//! [`parse_millis`], for flags whose name already says `-ms`.

use std::time::Duration;

/// Why a duration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// Nothing was given.
    #[error("empty duration: write e.g. 500ms, 5s, 2m")]
    Empty,
    /// A number without its unit.
    #[error("{0:?} has no unit: write {0}s, {0}ms or {0}m")]
    MissingUnit(String),
    /// A unit this parser does not know.
    #[error("{input:?}: unknown unit {unit:?} (use ms, s, m, h or d)")]
    UnknownUnit {
        /// The whole input.
        input: String,
        /// The unit part.
        unit: String,
    },
    /// The number part is not a non-negative integer.
    #[error("{0:?} is not a duration like 500ms, 5s or 2m")]
    NotANumber(String),
    /// Too large to represent.
    #[error("{0:?} is too large")]
    Overflow(String),
}

/// Parse `<integer><unit>` with unit `ms`, `s`, `m`, `h` or `d`.
pub fn parse_duration(input: &str) -> Result<Duration, DurationError> {
    let s = input.trim();
    if s.is_empty() {
        return Err(DurationError::Empty);
    }
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    if num.is_empty() {
        return Err(DurationError::NotANumber(s.to_string()));
    }
    let n: u64 = num
        .parse()
        .map_err(|_| DurationError::Overflow(s.to_string()))?;
    let per_unit_ms: u64 = match unit {
        "" => return Err(DurationError::MissingUnit(s.to_string())),
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        other => {
            return Err(DurationError::UnknownUnit {
                input: s.to_string(),
                unit: other.to_string(),
            });
        }
    };
    n.checked_mul(per_unit_ms)
        .map(Duration::from_millis)
        .ok_or_else(|| DurationError::Overflow(s.to_string()))
}

/// For flags named `...-ms`: a bare integer is milliseconds (the flag's name
/// says so); anything else is a [`parse_duration`] duration.
pub fn parse_millis(input: &str) -> Result<Duration, DurationError> {
    let s = input.trim();
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return s
            .parse::<u64>()
            .map(Duration::from_millis)
            .map_err(|_| DurationError::Overflow(s.to_string()));
    }
    parse_duration(s)
}

/// A duration as the parser reads it back: the largest unit that is exact.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    for (unit, per) in [
        ("d", 86_400_000u128),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms != 0 && ms.is_multiple_of(per) {
            return format!("{}{unit}", ms / per);
        }
    }
    format!("{ms}ms")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_are_required_and_read() {
        let ok = [
            ("500ms", 500),
            ("5s", 5_000),
            ("2m", 120_000),
            ("1h", 3_600_000),
            ("30d", 2_592_000_000),
            (" 10s ", 10_000),
            ("0s", 0),
        ];
        for (text, ms) in ok {
            assert_eq!(
                parse_duration(text),
                Ok(Duration::from_millis(ms)),
                "{text}"
            );
        }
        assert_eq!(
            parse_duration("5"),
            Err(DurationError::MissingUnit("5".into()))
        );
        assert_eq!(parse_duration(""), Err(DurationError::Empty));
        for bad in [
            "-1s",
            "s",
            "1.5s",
            "5 s",
            "5sec",
            "5S",
            "99999999999999999999s",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
        assert!(matches!(
            parse_duration("18446744073709551615d"),
            Err(DurationError::Overflow(_))
        ));
    }

    #[test]
    fn the_message_for_a_bare_number_teaches_the_fix() {
        let text = parse_duration("5").unwrap_err().to_string();
        assert!(text.contains("5s") && text.contains("5ms"), "{text}");
    }

    #[test]
    fn millis_flags_take_bare_numbers_or_durations() {
        assert_eq!(parse_millis("250"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_millis("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_millis("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_millis("2x").is_err());
        assert!(parse_millis("").is_err());
    }

    #[test]
    fn formatting_reads_back() {
        for d in [
            0, 1, 999, 1_000, 1_500, 60_000, 3_600_000, 86_400_000, 90_000,
        ] {
            let d = Duration::from_millis(d);
            assert_eq!(parse_duration(&format_duration(d)), Ok(d), "{d:?}");
        }
        assert_eq!(format_duration(Duration::from_millis(2000)), "2s");
    }
}
