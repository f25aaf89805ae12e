//! What a retention pass did (or, in a dry run, would do), one [`Line`] per partition,
//! and the metrics a report counts.

use std::fmt;

use crate::metrics::RetentionMetrics;
use crate::time::display_ts;

/// What a pass did with one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Create,
    Seal,
    Drop,
    Keep,
}

/// Why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
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
    pub fn as_str(self) -> &'static str {
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

    /// Reasons counted in the skipped series (`walpost_retention_partitions_skipped_total`,
    /// `walpost_inbox_retention_partitions_skipped_total`): the partition
    /// was due for an action and left as it was.
    pub const SKIPPED: &'static [Reason] = &[
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
pub struct Range {
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
pub struct Line {
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
    pub fn action_word(&self) -> &'static str {
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
    pub fn skipped(&self) -> Option<Reason> {
        matches!(self.action, Action::Keep | Action::Seal).then_some(self.reason).filter(|r| r.is_skip())
    }

    /// Counts what this line did (actions taken) and what it skipped.
    pub fn count(&self, m: &RetentionMetrics) {
        if self.done {
            match self.action {
                Action::Create => m.created.inc(),
                Action::Seal => {
                    if let Some(sealed) = &m.sealed {
                        sealed.inc()
                    }
                }
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
pub enum Outcome {
    /// The table is not partitioned (apply migrations/outbox/0002): nothing to do.
    NotPartitioned,
    /// Another session holds the retention lock for this table.
    Busy,
    /// One line per partition.
    Done(Vec<Line>),
}

/// Logs a pass's line: at DEBUG what needs nobody, at INFO what was done or waits for
/// something that comes by itself, at WARN what an operator should look at.
pub fn log_line(l: &Line) {
    let (p, r, d) = (&l.partition, &l.range, &l.detail);
    match (l.action, l.reason) {
        (Action::Keep, Reason::NotOldEnough | Reason::DefaultEmpty) => {
            tracing::debug!(partition = %p, range = %r, "retention: kept, {}", l.reason.as_str())
        }
        (Action::Keep, Reason::LockTimeout | Reason::SlotBehind)
        | (Action::Seal, _)
        | (Action::Create, _)
        | (Action::Drop, _) => {
            tracing::info!(partition = %p, range = %r, reason = l.reason.as_str(), detail = %d, "retention: {}", l.action_word())
        }
        (Action::Keep, _) => {
            tracing::warn!(partition = %p, range = %r, reason = l.reason.as_str(), detail = %d, "retention: kept, {}", l.reason.as_str())
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use service::telemetry::{Exposition, Health};

    use super::*;
    use crate::metrics::RetentionNames;

    /// Regression: skips were never counted (only lines of actions taken were, and a
    /// skip is never an action taken); the old test passed on an impossible line.
    #[test]
    fn regression_skipped_partitions_are_counted_by_reason() {
        const TABLE: service::telemetry::MetricTable = &[
            ("walpost_retention_partitions_created_total", "counter", "A count."),
            ("walpost_retention_partitions_sealed_total", "counter", "A count."),
            ("walpost_retention_partitions_dropped_total", "counter", "A count."),
            ("walpost_retention_partitions_skipped_total", "counter", "A count."),
            ("walpost_retention_passes_total", "counter", "A count."),
            ("walpost_retention_last_success_timestamp_seconds", "gauge", "A time."),
        ];
        let names = RetentionNames {
            created: TABLE[0].0,
            sealed: Some(TABLE[1].0),
            dropped: TABLE[2].0,
            skipped: TABLE[3].0,
            passes: TABLE[4].0,
            last_success: TABLE[5].0,
        };
        let metrics =
            Exposition::new(Arc::new(Health::new(Duration::from_secs(1), Duration::from_secs(1))), TABLE).unwrap();
        let m = &RetentionMetrics::register(&metrics, &names).unwrap();
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
