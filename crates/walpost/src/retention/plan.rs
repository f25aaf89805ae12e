//! The pure half of a retention pass: from the catalog's partitions, the time and the
//! slot's confirmed position, which partitions to create, seal, drop or keep, and why.
//! [`super::execute`] carries the steps out. See the module docs of [`super`] for the rule.

use pgoutput::Lsn;

use crate::postgres::sql::ident;
use crate::settings::TableName;
use daypart::catalog::{Partition, Seal};
use daypart::plan::{gaps, split_days};
use daypart::time::{day_floor, partition_name, DAY_MICROS};
use daypart::{Action, Line, Range, Reason};

/// What [`plan`] needs to know.
#[derive(Debug, Clone)]
pub(crate) struct PlanInput<'a> {
    pub table: &'a TableName,
    pub slot_name: &'a str,
    /// Microseconds since the Unix epoch, the server's `now()`.
    pub now: i64,
    pub keep_days: u32,
    pub days_ahead: u32,
    pub partitions: &'a [Partition],
    /// The slot's confirmed position, or why no partition may be dropped.
    pub slot: Result<Lsn, Reason>,
}

/// One thing to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// Create the daily partition covering `range`.
    Create { display: String, quoted: String, range: Range },
    /// Seal `partitions[index]` (it is expired and not sealed, or its seal is unreadable).
    Seal { index: usize },
    /// Drop `partitions[index]`, sealed at `w`, which the slot has confirmed.
    Drop { index: usize, w: Lsn, confirmed: Lsn },
    /// Nothing to do; the line says why.
    Keep(Line),
}

/// See the module docs.
pub(crate) fn plan(input: &PlanInput<'_>) -> Vec<Step> {
    let mut steps = Vec::new();
    // 1. Ahead: every instant from the start of today to `days_ahead` days after it.
    let today = day_floor(input.now);
    let window = (today, today + (i64::from(input.days_ahead) + 1) * DAY_MICROS);
    let ranges: Vec<Range> = input.partitions.iter().filter(|p| !p.is_default).map(|p| p.range).collect();
    for (lo, hi) in gaps(window, &ranges).into_iter().flat_map(split_days) {
        let name = partition_name(&input.table.name, lo);
        steps.push(Step::Create {
            display: format!("{}.{name}", input.table.schema),
            quoted: format!("{}.{}", ident(&input.table.schema), ident(&name)),
            range: Range { lo: Some(lo), hi: Some(hi) },
        });
    }
    // 2 and 3. Seal and drop what expired; report everything else.
    let cutoff = input.now - i64::from(input.keep_days) * DAY_MICROS;
    for (index, p) in input.partitions.iter().enumerate() {
        let keep = |reason: Reason, detail: String| {
            Step::Keep(Line {
                partition: p.display.clone(),
                range: if p.is_default { "DEFAULT".into() } else { p.range.to_string() },
                action: Action::Keep,
                done: false,
                reason,
                detail,
            })
        };
        if p.is_default {
            steps.push(if p.has_rows {
                keep(
                    Reason::DefaultPartition,
                    format!(
                        "the default partition holds rows outside every range; retention never drops it: move them into ranged partitions, e.g. detach {} and re-insert its rows through {}",
                        p.display, input.table
                    ),
                )
            } else {
                keep(Reason::DefaultEmpty, String::new())
            });
            continue;
        }
        if p.detach_pending {
            steps.push(keep(
                Reason::DetachPending,
                format!("finish it with ALTER TABLE {} DETACH PARTITION {} FINALIZE", input.table.quoted(), p.quoted),
            ));
            continue;
        }
        let expired = matches!(p.range.hi, Some(hi) if hi <= cutoff);
        if !expired {
            let detail = match p.seal {
                Some(Seal::At(w)) => format!("sealed at {w}"),
                _ => String::new(),
            };
            steps.push(keep(Reason::NotOldEnough, detail));
            continue;
        }
        match p.seal {
            Some(Seal::At(w)) => steps.push(match drop_rule(w, input.slot) {
                Ok(confirmed) => Step::Drop { index, w, confirmed },
                Err(reason) => keep(reason, blocked_detail(w, input.slot_name, input.slot)),
            }),
            // Not sealed, or the seal's comment is unreadable: seal (again).
            _ => steps.push(Step::Seal { index }),
        }
    }
    steps
}

/// A partition sealed at `w` may be dropped once the slot confirmed `w`: returns the
/// confirmed position, or why not.
pub(crate) fn drop_rule(w: Lsn, slot: Result<Lsn, Reason>) -> Result<Lsn, Reason> {
    match slot {
        Err(reason) => Err(reason),
        Ok(confirmed) if confirmed < w => Err(Reason::SlotBehind),
        Ok(confirmed) => Ok(confirmed),
    }
}

/// Why a sealed partition stays, for its line.
pub(crate) fn blocked_detail(w: Lsn, slot_name: &str, slot: Result<Lsn, Reason>) -> String {
    match slot {
        Ok(confirmed) => format!("sealed at {w}; slot {slot_name} confirmed {confirmed}"),
        Err(reason) => format!("sealed at {w}; slot {slot_name}: {}", reason.as_str()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use daypart::time::SECOND_MICROS;

    const D: i64 = DAY_MICROS;
    /// 2026-11-29 00:00:00 UTC.
    const NOV29: i64 = 1_795_910_400 * SECOND_MICROS;

    fn r(lo: Option<i64>, hi: Option<i64>) -> Range {
        Range { lo, hi }
    }

    fn table() -> TableName {
        TableName { schema: "events".into(), name: "outbox".into() }
    }

    fn day(offset: i64, seal: Option<Seal>) -> Partition {
        let lo = NOV29 + offset * D;
        Partition {
            quoted: format!("\"events\".\"outbox_{offset}\""),
            display: format!("events.outbox_{offset}"),
            is_default: false,
            has_rows: false,
            range: r(Some(lo), Some(lo + D)),
            detach_pending: false,
            seal,
        }
    }

    fn input<'a>(t: &'a TableName, partitions: &'a [Partition], slot: Result<Lsn, Reason>) -> PlanInput<'a> {
        PlanInput { table: t, slot_name: "walpost", now: NOV29 + D / 2, keep_days: 7, days_ahead: 1, partitions, slot }
    }

    fn kept(steps: &[Step], display: &str) -> Option<Reason> {
        steps.iter().find_map(|s| match s {
            Step::Keep(l) if l.partition == display => Some(l.reason),
            _ => None,
        })
    }

    #[test]
    fn creates_ahead_and_keeps_what_is_young() {
        let t = table();
        let parts = [day(0, None)];
        let steps = plan(&input(&t, &parts, Ok(Lsn(0))));
        let created: Vec<_> = steps
            .iter()
            .filter_map(|s| match s {
                Step::Create { display, range, .. } => Some((display.clone(), *range)),
                _ => None,
            })
            .collect();
        assert_eq!(created, vec![("events.outbox_p20261130".into(), r(Some(NOV29 + D), Some(NOV29 + 2 * D)))]);
        assert_eq!(kept(&steps, "events.outbox_0"), Some(Reason::NotOldEnough));
    }

    /// The rule: an expired partition is sealed first, dropped only once the slot
    /// confirmed the seal position, never without a usable slot.
    #[test]
    fn expired_partitions_are_sealed_then_dropped_exactly_when_the_slot_confirms() {
        let t = table();
        let w = Lsn(5000);
        let parts = [day(-9, None), day(-8, Some(Seal::At(w))), day(-10, Some(Seal::Unknown))];
        let steps = plan(&input(&t, &parts, Ok(Lsn(4999))));
        assert!(steps.contains(&Step::Seal { index: 0 }));
        assert!(steps.contains(&Step::Seal { index: 2 }), "an unreadable seal is sealed again");
        assert_eq!(kept(&steps, "events.outbox_-8"), Some(Reason::SlotBehind), "W - 1 confirmed: kept");
        let steps = plan(&input(&t, &parts, Ok(w)));
        assert!(steps.contains(&Step::Drop { index: 1, w, confirmed: w }), "W confirmed: dropped");
        for why in [Reason::SlotMissing, Reason::SlotInvalidated] {
            let steps = plan(&input(&t, &parts, Err(why)));
            assert_eq!(kept(&steps, "events.outbox_-8"), Some(why));
            assert!(!steps.iter().any(|s| matches!(s, Step::Drop { .. })));
        }
    }

    #[test]
    fn default_and_detaching_partitions_are_never_touched() {
        let t = table();
        let mut default = day(-30, None);
        default.is_default = true;
        default.has_rows = true;
        let mut detaching = day(-20, Some(Seal::At(Lsn(1))));
        detaching.detach_pending = true;
        let parts = [default, detaching];
        let steps = plan(&input(&t, &parts, Ok(Lsn(100))));
        assert_eq!(kept(&steps, "events.outbox_-30"), Some(Reason::DefaultPartition));
        assert_eq!(kept(&steps, "events.outbox_-20"), Some(Reason::DetachPending));
        assert!(!steps.iter().any(|s| matches!(s, Step::Drop { .. } | Step::Seal { .. })));
    }
}
