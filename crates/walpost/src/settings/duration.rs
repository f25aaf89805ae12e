//! Durations as people write them in flags and files: `30s`, `500ms`, `5min`, `2h`,
//! `1d`, or a bare number of seconds (the older `*_secs` form).

use std::time::Duration;

/// Parses `text`; the error says what is accepted.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let bad = || {
        format!(
            "'{text}' is not a duration: write a number with a unit (500ms, 30s, 5min, 2h, 1d) or a number of seconds"
        )
    };
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let ms = match unit.trim() {
        "" | "s" | "sec" | "secs" => n.checked_mul(1_000),
        "ms" => Some(n),
        "m" | "min" | "mins" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        "d" => n.checked_mul(86_400_000),
        _ => None,
    };
    ms.map(Duration::from_millis).ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_and_bare_seconds() {
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("5min"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration(" 1d "), Ok(Duration::from_secs(86_400)));
        for bad in ["", "s", "5 parsecs", "-1s", "1.5s", "99999999999999999999s"] {
            assert!(parse_duration(bad).unwrap_err().contains("is not a duration"), "{bad}");
        }
    }
}
