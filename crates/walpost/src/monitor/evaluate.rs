//! The alarm level for a slot's figures: pure, unit-tested, used by the monitor task
//! and by `walpost slot status`.
//!
//! Byte thresholds that are not configured follow the server, so an alarm always
//! fires before PostgreSQL invalidates the slot: with a finite
//! `max_slot_wal_keep_size` (M), warning at M/2 and critical at 4M/5 of retained WAL,
//! and the same fractions of `safe_wal_size` left; with an unlimited one, 1 GiB and 8 GiB.
//! `wal_status = unreserved` is critical; `lost` is its own verdict.

use std::time::{Duration, Instant};

use pgoutput::Lsn;

use super::status::SlotStatus;
use crate::settings::Thresholds;
use crate::telemetry::AlarmLevel;

/// Retained-WAL thresholds when `max_slot_wal_keep_size` is unlimited and none are set.
pub const UNLIMITED_WARNING_BYTES: u64 = 1 << 30;
pub const UNLIMITED_CRITICAL_BYTES: u64 = 8 << 30;

/// The byte thresholds in force for a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteLimits {
    pub warning: u64,
    pub critical: u64,
    /// `max_slot_wal_keep_size` in bytes, when finite.
    pub keep: Option<u64>,
}

impl ByteLimits {
    pub fn for_server(t: &Thresholds, max_slot_wal_keep_size: Option<u64>) -> ByteLimits {
        match max_slot_wal_keep_size {
            Some(keep) => ByteLimits {
                warning: t.warning_bytes.unwrap_or(keep / 2),
                critical: t.critical_bytes.unwrap_or(keep / 5 * 4),
                keep: Some(keep),
            },
            None => ByteLimits {
                warning: t.warning_bytes.unwrap_or(UNLIMITED_WARNING_BYTES),
                critical: t.critical_bytes.unwrap_or(UNLIMITED_CRITICAL_BYTES),
                keep: None,
            },
        }
    }
}

/// Configured byte thresholds that can never fire before the slot is invalidated.
pub fn unreachable_thresholds(t: &Thresholds, max_slot_wal_keep_size: Option<u64>) -> Vec<String> {
    let Some(keep) = max_slot_wal_keep_size else { return Vec::new() };
    [("warning_bytes", t.warning_bytes), ("critical_bytes", t.critical_bytes)]
        .into_iter()
        .filter_map(|(key, v)| v.filter(|v| *v >= keep).map(|v| (key, v)))
        .map(|(key, v)| {
            format!(
                "[monitor] {key} = {v} is at or above max_slot_wal_keep_size ({keep} bytes): PostgreSQL invalidates the slot before this alarm can fire; remove it (walpost then uses fractions of max_slot_wal_keep_size) or lower it"
            )
        })
        .collect()
}

/// The outcome of one evaluation.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Level(AlarmLevel, Vec<String>),
    /// The slot is gone for good (wal_status = lost).
    Lost,
}

/// What the monitor observed besides the slot row.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Observed {
    /// Age of the oldest transaction this instance read and has not confirmed.
    pub lag_secs: f64,
    /// How long the slot's confirmed position has stood still while WAL was written.
    pub confirm_stalled_secs: f64,
    /// This instance is taking the initial snapshot (the slot is not streamed meanwhile).
    pub snapshot_running: bool,
}

/// The alarm level for a status, what was observed and thresholds, with reasons.
pub fn evaluate(status: &SlotStatus, observed: Observed, t: &Thresholds) -> Verdict {
    if status.is_lost() {
        return Verdict::Lost;
    }
    let limits = ByteLimits::for_server(t, status.max_slot_wal_keep_size_bytes);
    let mut level = AlarmLevel::Ok;
    let mut reasons = Vec::new();
    let mut raise = |to: AlarmLevel, why: String| {
        level = level.max(to);
        reasons.push(why);
    };
    if status.wal_status.as_deref() == Some("unreserved") {
        raise(
            AlarmLevel::Critical,
            "wal_status is unreserved: the next checkpoint may remove WAL the slot needs; do not run CHECKPOINT, raise max_slot_wal_keep_size first".into(),
        );
    }
    let retained = status.retained_bytes.unwrap_or(0);
    if retained >= limits.critical {
        raise(AlarmLevel::Critical, format!("slot retains {retained} bytes of WAL (critical at {})", limits.critical));
    } else if retained >= limits.warning {
        raise(AlarmLevel::Warning, format!("slot retains {retained} bytes of WAL (warning at {})", limits.warning));
    }
    if let (Some(keep), Some(safe)) = (limits.keep, status.safe_wal_size_bytes) {
        if safe <= keep / 5 {
            raise(AlarmLevel::Critical, format!("only {safe} bytes of WAL can be written before the slot is invalidated (max_slot_wal_keep_size {keep})"));
        } else if safe <= keep / 2 {
            raise(AlarmLevel::Warning, format!("only {safe} bytes of WAL can be written before the slot is in danger (max_slot_wal_keep_size {keep})"));
        }
    }
    let lag = observed.lag_secs;
    if lag >= t.critical_lag_secs {
        raise(AlarmLevel::Critical, format!("streaming lag {lag:.0} s (critical at {})", t.critical_lag_secs));
    } else if lag >= t.warning_lag_secs {
        raise(AlarmLevel::Warning, format!("streaming lag {lag:.0} s (warning at {})", t.warning_lag_secs));
    }
    let stalled = observed.confirm_stalled_secs;
    if stalled >= t.confirm_stalled_secs && !observed.snapshot_running {
        let who = match status.active_pid {
            Some(pid) => format!("the process streaming from it (server pid {pid}) may be stuck"),
            None => "no process streams from it".to_owned(),
        };
        raise(
            AlarmLevel::Warning,
            format!("the slot's confirmed position has not moved for {stalled:.0} s while WAL was written: {who}"),
        );
    }
    if let Some(o) = &status.oldest_transaction {
        if o.age_secs >= t.long_transaction_secs {
            raise(
                AlarmLevel::Warning,
                format!(
                    "transaction of server pid {} (application_name '{}', client {}) has been open for {:.0} s: logical decoding cannot pass it (see runbooks/long-transaction.md)",
                    o.pid, o.application_name, o.client_addr, o.age_secs
                ),
            );
        }
    }
    Verdict::Level(level, reasons)
}

/// Measures how long the slot's confirmed position has stood still while the server's
/// WAL position was past it.
#[derive(Debug, Default)]
pub struct ConfirmWatch {
    last: Option<(Lsn, Instant)>,
}

impl ConfirmWatch {
    pub fn observe(&mut self, confirmed: Option<Lsn>, current: Option<Lsn>, now: Instant) -> Duration {
        let (Some(confirmed), Some(current)) = (confirmed, current) else {
            self.last = None;
            return Duration::ZERO;
        };
        match self.last {
            Some((seen, since)) if seen == confirmed && current > confirmed => now.saturating_duration_since(since),
            _ => {
                self.last = Some((confirmed, now));
                Duration::ZERO
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::monitor::status::OldestTransaction;

    fn status(retained: u64, wal_status: &str) -> SlotStatus {
        SlotStatus {
            slot: "walpost".into(),
            exists: true,
            plugin: Some("pgoutput".into()),
            active: true,
            active_pid: Some(1),
            wal_status: Some(wal_status.into()),
            current_lsn: "0/0".into(),
            restart_lsn: Some("0/0".into()),
            confirmed_flush_lsn: Some("0/0".into()),
            retained_bytes: Some(retained),
            unconfirmed_bytes: Some(retained),
            safe_wal_size_bytes: None,
            max_slot_wal_keep_size: "-1".into(),
            max_slot_wal_keep_size_bytes: None,
            oldest_transaction: None,
        }
    }

    fn t() -> Thresholds {
        Thresholds {
            warning_bytes: Some(100),
            critical_bytes: Some(1000),
            warning_lag_secs: 10.0,
            critical_lag_secs: 100.0,
            long_transaction_secs: 60.0,
            confirm_stalled_secs: 30.0,
        }
    }

    fn level(v: Verdict) -> AlarmLevel {
        match v {
            Verdict::Level(l, _) => l,
            Verdict::Lost => panic!("unexpected lost"),
        }
    }

    fn lag(secs: f64) -> Observed {
        Observed { lag_secs: secs, confirm_stalled_secs: 0.0, snapshot_running: false }
    }

    #[test]
    fn byte_thresholds_at_their_edges() {
        assert_eq!(level(evaluate(&status(99, "reserved"), lag(0.0), &t())), AlarmLevel::Ok);
        assert_eq!(level(evaluate(&status(100, "reserved"), lag(0.0), &t())), AlarmLevel::Warning);
        assert_eq!(level(evaluate(&status(999, "extended"), lag(0.0), &t())), AlarmLevel::Warning);
        assert_eq!(level(evaluate(&status(1000, "reserved"), lag(0.0), &t())), AlarmLevel::Critical);
    }

    /// Regression: the default thresholds (1 GiB, 8 GiB) sat above a 64 MB
    /// max_slot_wal_keep_size, so the slot was lost before any alarm.
    #[test]
    fn regression_default_thresholds_fire_before_max_slot_wal_keep_size() {
        let defaults = Thresholds::default();
        let keep = 64 << 20;
        let mut st = status(0, "reserved");
        st.max_slot_wal_keep_size_bytes = Some(keep);
        st.retained_bytes = Some(keep / 2);
        assert_eq!(level(evaluate(&st, lag(0.0), &defaults)), AlarmLevel::Warning);
        st.retained_bytes = Some(keep / 5 * 4);
        assert_eq!(level(evaluate(&st, lag(0.0), &defaults)), AlarmLevel::Critical);
        st.retained_bytes = Some(keep / 4);
        st.safe_wal_size_bytes = Some(keep / 10);
        assert_eq!(level(evaluate(&st, lag(0.0), &defaults)), AlarmLevel::Critical, "safe_wal_size nearly gone");
        assert_eq!(ByteLimits::for_server(&defaults, None).warning, UNLIMITED_WARNING_BYTES);
    }

    #[test]
    fn thresholds_that_cannot_fire_are_named() {
        let mut t = Thresholds::default();
        assert!(unreachable_thresholds(&t, Some(64 << 20)).is_empty());
        t.warning_bytes = Some(1 << 30);
        let found = unreachable_thresholds(&t, Some(64 << 20));
        assert_eq!(found.len(), 1);
        assert!(found[0].contains("warning_bytes"), "{found:?}");
        assert!(unreachable_thresholds(&t, None).is_empty(), "unlimited: anything can fire");
    }

    #[test]
    fn lag_unreserved_stalls_and_long_transactions() {
        assert_eq!(level(evaluate(&status(0, "reserved"), lag(10.0), &t())), AlarmLevel::Warning);
        assert_eq!(level(evaluate(&status(0, "reserved"), lag(100.0), &t())), AlarmLevel::Critical);
        assert_eq!(level(evaluate(&status(0, "unreserved"), lag(0.0), &t())), AlarmLevel::Critical);
        let stalled = Observed { lag_secs: 0.0, confirm_stalled_secs: 31.0, snapshot_running: false };
        match evaluate(&status(0, "reserved"), stalled, &t()) {
            Verdict::Level(AlarmLevel::Warning, reasons) => assert!(reasons[0].contains("server pid 1"), "{reasons:?}"),
            other => panic!("{other:?}"),
        }
        let snapshotting = Observed { snapshot_running: true, ..stalled };
        assert_eq!(
            level(evaluate(&status(0, "reserved"), snapshotting, &t())),
            AlarmLevel::Ok,
            "a snapshot holds the stream back"
        );
        let mut st = status(0, "reserved");
        st.oldest_transaction = Some(OldestTransaction {
            pid: 4242,
            application_name: "billing".into(),
            client_addr: "10.0.0.7".into(),
            age_secs: 61.0,
        });
        match evaluate(&st, lag(0.0), &t()) {
            Verdict::Level(AlarmLevel::Warning, reasons) => {
                let r = &reasons[0];
                assert!(
                    r.contains("4242")
                        && r.contains("billing")
                        && r.contains("10.0.0.7")
                        && r.contains("long-transaction"),
                    "{r}"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn lost_is_its_own_verdict() {
        assert_eq!(evaluate(&status(0, "lost"), lag(0.0), &t()), Verdict::Lost);
    }

    #[test]
    fn confirm_watch_measures_only_while_wal_is_written_past_it() {
        let mut w = ConfirmWatch::default();
        let t0 = Instant::now();
        let s = Duration::from_secs;
        assert_eq!(w.observe(Some(Lsn(10)), Some(Lsn(20)), t0), Duration::ZERO);
        assert_eq!(w.observe(Some(Lsn(10)), Some(Lsn(30)), t0 + s(5)), s(5));
        assert_eq!(w.observe(Some(Lsn(25)), Some(Lsn(30)), t0 + s(6)), Duration::ZERO, "it moved");
        assert_eq!(w.observe(Some(Lsn(30)), Some(Lsn(30)), t0 + s(20)), Duration::ZERO, "caught up");
        assert_eq!(w.observe(Some(Lsn(30)), Some(Lsn(30)), t0 + s(40)), Duration::ZERO, "nothing to confirm");
    }
}
