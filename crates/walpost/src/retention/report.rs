//! What a retention pass did (or, in a dry run, would do), one [`Line`] per partition,
//! and the metrics a report counts.

use std::fmt;

use super::time::display_ts;
use crate::telemetry::metrics::RetentionMetrics;

/// What a pass did with one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    Create,
    Seal,
    Drop,
    Keep,
}

/// Why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reason {
    /// Created to cover the days ahead.
    Ahead,
    /// The whole range is older than the retention period.
    Expired,
    /// The range is not yet older than the retention period.
    NotOldEnough,
    /// Sealed, waiting for the slot to confirm the seal's WAL position.
    SlotBehind,
    /// The slot does not exist (or belongs to another database): nothing is dropped.
    SlotMissing,
    /// The slot was invalidated: nothing is dropped (runbooks/slot-lost.md needs the rows).
    SlotInvalidated,
    /// The lock was not granted within lock_timeout; retried next pass.
    LockTimeout,
    /// The default partition holds rows (never dropped; rows outside every range).
    DefaultPartition,
    /// The empty default partition (never dropped).
    DefaultEmpty,
    /// A `DETACH PARTITION ... CONCURRENTLY` by someone else is pending.
    DetachPending,
    /// The new partition conflicts with an existing table or with rows of the default partition.
    Conflict,
    /// Any other server error (see the detail).
    Error,
    /// Inbox: a day whose deliveries are not all done or dismissed.
    OpenDeliveries,
    /// Inbox: a day older than `retention_max_days`, dropped whatever was open.
    MaxAge,
}

impl Reason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Reason::Ahead => "ahead",
            Reason::Expired => "expired",
            Reason::NotOldEnough => "not_old_enough",
            Reason::SlotBehind => "slot_behind",
            Reason::SlotMissing => "slot_missing",
            Reason::SlotInvalidated => "slot_invalidated",
            Reason::LockTimeout => "lock_timeout",
            Reason::DefaultPartition | Reason::DefaultEmpty => "default_partition",
            Reason::DetachPending => "detach_pending",
            Reason::Conflict => "conflict",
            Reason::Error => "error",
            Reason::OpenDeliveries => "open_deliveries",
            Reason::MaxAge => "max_age",
        }
    }

    /// Reasons counted in `walpost_retention_partitions_skipped_total`: the partition
    /// was due for an action and left as it was.
    pub(crate) const SKIPPED: &'static [Reason] = &[
        Reason::SlotBehind,
        Reason::SlotMissing,
        Reason::SlotInvalidated,
        Reason::LockTimeout,
        Reason::DefaultPartition,
        Reason::DetachPending,
        Reason::Conflict,
        Reason::Error,
        Reason::OpenDeliveries,
    ];

    fn is_skip(self) -> bool {
        Reason::SKIPPED.contains(&self)
    }
}

/// A range partition's bounds in microseconds since the Unix epoch (UTC); None = MINVALUE/MAXVALUE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Range {
    pub lo: Option<i64>,
    pub hi: Option<i64>,
}

impl fmt::Display for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |t: Option<i64>, inf: &str| t.map(display_ts).unwrap_or_else(|| inf.to_owned());
        write!(f, "[{}, {})", show(self.lo, "MINVALUE"), show(self.hi, "MAXVALUE"))
    }
}

/// One line of a pass report: one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Line {
    /// `schema.name`.
    pub partition: String,
    /// `[2026-11-29, 2026-11-30)`.
    pub range: String,
    pub action: Action,
    /// False in a dry run, or when the action failed: it was not taken.
    pub done: bool,
    pub reason: Reason,
    pub detail: String,
}

impl Line {
    pub(crate) fn action_word(&self) -> &'static str {
        match (self.action, self.done) {
            (Action::Create, true) => "created",
            (Action::Create, false) => "would-create",
            (Action::Seal, true) => "sealed",
            (Action::Seal, false) => "would-seal",
            (Action::Drop, true) => "dropped",
            (Action::Drop, false) => "would-drop",
            (Action::Keep, _) => "kept",
        }
    }

    /// The reason counted as a skip, if this line is one: a partition left in place
    /// although it was due (kept, or sealed and kept).
    pub(crate) fn skipped(&self) -> Option<Reason> {
        matches!(self.action, Action::Keep | Action::Seal).then_some(self.reason).filter(|r| r.is_skip())
    }

    /// Counts what this line did (actions taken) and what it skipped.
    pub(crate) fn count(&self, m: &RetentionMetrics) {
        if self.done {
            match self.action {
                Action::Create => m.created.inc(),
                Action::Seal => m.sealed.inc(),
                Action::Drop => m.dropped.inc(),
                Action::Keep => {}
            }
        }
        if let Some(reason) = self.skipped() {
            m.skipped(reason.as_str());
        }
    }
}

impl fmt::Display for Line {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:<32} {:<44} {:<12} {}", self.partition, self.range, self.action_word(), self.reason.as_str())?;
        if !self.detail.is_empty() {
            write!(f, " ({})", self.detail)?;
        }
        Ok(())
    }
}

/// How a pass ended.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// The table is not partitioned (apply migrations/0002): nothing to do.
    NotPartitioned,
    /// Another session holds the retention lock for this table.
    Busy,
    /// One line per partition.
    Done(Vec<Line>),
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::telemetry::{Health, Metrics};

    /// Regression: skips were never counted (only lines of actions taken were, and a
    /// skip is never an action taken); the old test passed on an impossible line.
    #[test]
    fn regression_skipped_partitions_are_counted_by_reason() {
        let metrics = Metrics::new(Arc::new(Health::new(Duration::from_secs(1), Duration::from_secs(1)))).unwrap();
        let m = &metrics.retention;
        let line = |action, done, reason| Line {
            partition: "events.outbox_p20261129".into(),
            range: String::new(),
            action,
            done,
            reason,
            detail: String::new(),
        };
        // What passes really produce.
        line(Action::Create, true, Reason::Ahead).count(m);
        line(Action::Seal, true, Reason::SlotBehind).count(m);
        line(Action::Keep, false, Reason::SlotBehind).count(m);
        line(Action::Keep, false, Reason::LockTimeout).count(m);
        line(Action::Keep, false, Reason::NotOldEnough).count(m);
        line(Action::Drop, true, Reason::Expired).count(m);
        let out = metrics.encode();
        assert!(out.contains("walpost_retention_partitions_created_total 1"), "{out}");
        assert!(out.contains("walpost_retention_partitions_sealed_total 1"), "{out}");
        assert!(out.contains("walpost_retention_partitions_dropped_total 1"), "{out}");
        assert!(out.contains("walpost_retention_partitions_skipped_total{reason=\"slot_behind\"} 2"), "{out}");
        assert!(out.contains("walpost_retention_partitions_skipped_total{reason=\"lock_timeout\"} 1"), "{out}");
        assert!(!out.contains("not_old_enough"), "{out}");
    }
}
