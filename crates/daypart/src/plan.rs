//! The pure arithmetic of day partitions: what a window of days lacks, cut at UTC
//! midnights.

use crate::report::Range;
use crate::time::{day_floor, DAY_MICROS};

/// The parts of `window` (microseconds, `[lo, hi)`) no range of `ranges` covers.
pub fn gaps(window: (i64, i64), ranges: &[Range]) -> Vec<(i64, i64)> {
    let mut covered: Vec<(i64, i64)> = ranges
        .iter()
        .map(|r| (r.lo.unwrap_or(i64::MIN), r.hi.unwrap_or(i64::MAX)))
        .filter(|(lo, hi)| lo < hi && *hi > window.0 && *lo < window.1)
        .collect();
    covered.sort_unstable();
    let mut out = Vec::new();
    let mut at = window.0;
    for (lo, hi) in covered {
        if lo > at {
            out.push((at, lo.min(window.1)));
        }
        at = at.max(hi);
        if at >= window.1 {
            break;
        }
    }
    if at < window.1 {
        out.push((at, window.1));
    }
    out
}

/// Splits a gap at UTC midnights: one daily partition per piece.
pub fn split_days((lo, hi): (i64, i64)) -> Vec<(i64, i64)> {
    let mut out = Vec::new();
    let mut at = lo;
    while at < hi {
        let next = (day_floor(at) + DAY_MICROS).min(hi);
        out.push((at, next));
        at = next;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::SECOND_MICROS;

    const D: i64 = DAY_MICROS;
    /// 2026-11-29 00:00:00 UTC.
    const NOV29: i64 = 1_795_910_400 * SECOND_MICROS;

    fn r(lo: Option<i64>, hi: Option<i64>) -> Range {
        Range { lo, hi }
    }

    #[test]
    fn gaps_are_what_no_partition_covers() {
        let w = (NOV29, NOV29 + 4 * D);
        assert_eq!(gaps(w, &[]), vec![w]);
        // The legacy partition covers everything before the 30th; the 1st exists.
        let ranges = [r(None, Some(NOV29 + D)), r(Some(NOV29 + 2 * D), Some(NOV29 + 3 * D))];
        assert_eq!(gaps(w, &ranges), vec![(NOV29 + D, NOV29 + 2 * D), (NOV29 + 3 * D, NOV29 + 4 * D)]);
        // Fully covered, by a MAXVALUE range or by overlapping ones.
        assert!(gaps(w, &[r(Some(NOV29 - D), None)]).is_empty());
        assert!(gaps(w, &[r(Some(NOV29), Some(NOV29 + 2 * D)), r(Some(NOV29 + D), Some(NOV29 + 5 * D))]).is_empty());
        // A range ending mid-day leaves a partial day.
        let noon = NOV29 + D / 2;
        assert_eq!(gaps((NOV29, NOV29 + D), &[r(None, Some(noon))]), vec![(noon, NOV29 + D)]);
    }
    #[test]
    fn gaps_split_at_midnight() {
        let noon = NOV29 + D / 2;
        assert_eq!(split_days((noon, NOV29 + 2 * D)), vec![(noon, NOV29 + D), (NOV29 + D, NOV29 + 2 * D)]);
        assert_eq!(split_days((NOV29, NOV29 + D)), vec![(NOV29, NOV29 + D)]);
        assert!(split_days((NOV29, NOV29)).is_empty());
    }
}
