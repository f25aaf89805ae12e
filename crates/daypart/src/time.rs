//! Partition bounds as microseconds since the Unix epoch (UTC), and their names and
//! SQL literals, on `jiff`.

use jiff::tz::TimeZone;
use jiff::Timestamp;

pub const SECOND_MICROS: i64 = 1_000_000;
pub const DAY_MICROS: i64 = 86_400 * SECOND_MICROS;

/// The start of `t`'s UTC day.
pub fn day_floor(t: i64) -> i64 {
    t.div_euclid(DAY_MICROS) * DAY_MICROS
}

fn civil(t: i64) -> jiff::civil::DateTime {
    // Out-of-range bounds (beyond year 9999) cannot come from PostgreSQL timestamptz
    // partitions walpost reads; clamp rather than panic.
    let ts = Timestamp::from_microsecond(t).unwrap_or(if t < 0 { Timestamp::MIN } else { Timestamp::MAX });
    ts.to_zoned(TimeZone::UTC).datetime()
}

/// `<table>_pYYYYMMDD`, plus `_HHMMSS` when the range does not start at midnight;
/// at most 63 bytes (PostgreSQL's limit), keeping the date part.
pub fn partition_name(table: &str, lo: i64) -> String {
    let c = civil(lo);
    let suffix = if lo == day_floor(lo) {
        c.strftime("_p%Y%m%d").to_string()
    } else {
        c.strftime("_p%Y%m%d_%H%M%S").to_string()
    };
    let mut base = table.to_owned();
    while base.len() + suffix.len() > 63 {
        base.pop();
    }
    base + &suffix
}

/// A timestamptz literal in UTC: `2026-11-29 00:00:00+00` (microseconds when present).
pub fn literal_ts(t: i64) -> String {
    let c = civil(t);
    let micros = t.rem_euclid(SECOND_MICROS);
    let frac = if micros == 0 { String::new() } else { format!(".{micros:06}") };
    format!("{}{frac}+00", c.strftime("%Y-%m-%d %H:%M:%S"))
}

/// `2026-11-29` at midnight, the full UTC time otherwise.
pub fn display_ts(t: i64) -> String {
    if t == day_floor(t) {
        civil(t).strftime("%Y-%m-%d").to_string()
    } else {
        literal_ts(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: i64 = DAY_MICROS;
    /// 2026-11-29 00:00:00 UTC.
    pub(super) const NOV29: i64 = 1_795_910_400 * SECOND_MICROS;

    #[test]
    fn civil_dates_and_literals() {
        assert_eq!(literal_ts(0), "1970-01-01 00:00:00+00");
        assert_eq!(literal_ts(NOV29), "2026-11-29 00:00:00+00");
        assert_eq!(literal_ts(NOV29 + 3 * D + 3_723_000_001), "2026-12-02 01:02:03.000001+00");
        assert_eq!(literal_ts(951_782_400 * SECOND_MICROS), "2000-02-29 00:00:00+00");
        assert_eq!(literal_ts(-SECOND_MICROS), "1969-12-31 23:59:59+00");
        assert_eq!(display_ts(NOV29), "2026-11-29");
    }

    #[test]
    fn names_follow_the_range() {
        assert_eq!(partition_name("outbox", NOV29), "outbox_p20261129");
        assert_eq!(partition_name("outbox", NOV29 + 12 * 3600 * SECOND_MICROS), "outbox_p20261129_120000");
        let long = "x".repeat(80);
        assert_eq!(partition_name(&long, NOV29).len(), 63);
        assert!(partition_name(&long, NOV29).ends_with("_p20261129"));
    }
}
