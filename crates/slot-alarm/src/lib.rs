//! The alarm level for a replication slot's figures: pure, unit-tested, used by `walpost
//! run`'s monitor task and by `walpost slot status` (which read the figures: this crate
//! does no I/O).
//!
//! Byte thresholds that are not configured follow the server, so an alarm always
//! fires before PostgreSQL invalidates the slot: with a finite
//! `max_slot_wal_keep_size` (M), warning at M/2 and critical at 4M/5 of retained WAL;
//! with an unlimited one, 1 GiB and 8 GiB. The slot's WAL budget is
//! `safe_wal_size + retained WAL` (M while the slot is reserved): warning when less than
//! [`BUDGET_WARNING_SHARE`] of it is left, critical under [`BUDGET_CRITICAL_SHARE`] (the
//! same rule as deploy/prometheus/slot-check.sql and alerts.yml). `wal_status =
//! unreserved` is critical; `lost` is its own verdict. A slot nothing streams from is a
//! warning (the monitor waits `confirm_stalled_secs` before saying so, to ride out a
//! reconnect; `walpost slot status` and slot-check.sql say so at once).
//!
//! A reason says what this walpost knows first (Kafka silent, a backlog being read)
//! before it suspects another process, and names a transaction's server pid only in the
//! long-transaction reason, for a transaction that holds the slot back (it wrote WAL).

use std::time::{Duration, Instant};

use pgoutput::Lsn;
use serde::Serialize;

/// The slot alarm level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AlarmLevel {
    Ok = 0,
    Warning = 1,
    Critical = 2,
}

impl AlarmLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            AlarmLevel::Ok => "ok",
            AlarmLevel::Warning => "warning",
            AlarmLevel::Critical => "critical",
        }
    }

    pub fn from_u8(v: u8) -> AlarmLevel {
        match v {
            0 => AlarmLevel::Ok,
            1 => AlarmLevel::Warning,
            _ => AlarmLevel::Critical,
        }
    }
}

/// Alarm thresholds: bytes of retained WAL, seconds of streaming lag, seconds the
/// slot's confirmed position stood still while WAL was written.
///
/// Byte thresholds left unset follow the server: fractions of
/// `max_slot_wal_keep_size` when it is finite (so they fire before PostgreSQL
/// invalidates the slot), fixed sizes when it is unlimited ([`ByteLimits`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Thresholds {
    pub warning_bytes: Option<u64>,
    pub critical_bytes: Option<u64>,
    pub warning_lag_secs: f64,
    pub critical_lag_secs: f64,
    pub long_transaction_secs: f64,
    pub confirm_stalled_secs: f64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            warning_bytes: None,
            critical_bytes: None,
            warning_lag_secs: 60.0,
            critical_lag_secs: 600.0,
            long_transaction_secs: 300.0,
            confirm_stalled_secs: 120.0,
        }
    }
}

/// The oldest open transaction on the server that has written WAL (it has a
/// transaction id): only such a transaction holds logical decoding back; a read-only one
/// (a report, walpost's own snapshot) does not.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OldestTransaction {
    pub pid: i64,
    pub application_name: String,
    /// `local` for a Unix-socket client.
    pub client_addr: String,
    pub age_secs: f64,
}

/// What the server says about the slot, plus server-wide figures (`walpost run`'s
/// monitor reads them in one query; `walpost slot status` prints them as JSON).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SlotStatus {
    pub slot: String,
    pub exists: bool,
    pub plugin: Option<String>,
    pub active: bool,
    pub active_pid: Option<i64>,
    pub wal_status: Option<String>,
    pub current_lsn: String,
    pub restart_lsn: Option<String>,
    pub confirmed_flush_lsn: Option<String>,
    /// current WAL position - restart_lsn: what the slot keeps on disk (`None` when the
    /// slot lost its restart position, i.e. it was invalidated).
    pub retained_bytes: Option<u64>,
    /// current WAL position - confirmed_flush_lsn: written but not yet confirmed.
    pub unconfirmed_bytes: Option<u64>,
    /// Bytes that can still be written before the slot is in danger (PG 13+); `None`
    /// if unlimited; 0 once past the limit (the server reports a negative number).
    pub safe_wal_size_bytes: Option<u64>,
    /// `max_slot_wal_keep_size` as the server reports it (e.g. `64MB`, `-1`).
    pub max_slot_wal_keep_size: String,
    /// The same in bytes; `None`: unlimited.
    pub max_slot_wal_keep_size_bytes: Option<u64>,
    pub oldest_transaction: Option<OldestTransaction>,
    /// The server is a standby (in recovery).
    pub in_recovery: bool,
    /// PostgreSQL 16+: a recovery conflict invalidated the slot (`conflicting`).
    pub conflicting: bool,
    /// PostgreSQL 17+: why the slot was invalidated (`wal_removed`, `rows_removed`,
    /// `wal_level_insufficient`, `idle_timeout`), if it was.
    pub invalidation_reason: Option<String>,
}

impl SlotStatus {
    pub fn is_lost(&self) -> bool {
        self.wal_status.as_deref() == Some("lost")
    }

    /// Invalidated by a recovery conflict on a standby ([`invalidated_by_conflict`]).
    pub fn is_conflicted(&self) -> bool {
        invalidated_by_conflict(self.conflicting, self.invalidation_reason.as_deref())
    }

    pub fn current(&self) -> Option<Lsn> {
        self.current_lsn.parse().ok()
    }

    pub fn confirmed(&self) -> Option<Lsn> {
        self.confirmed_flush_lsn.as_deref().and_then(|l| l.parse().ok())
    }

    pub fn oldest_transaction_age_secs(&self) -> f64 {
        self.oldest_transaction.as_ref().map_or(0.0, |t| t.age_secs)
    }
}

/// Whether a slot's `conflicting` (PostgreSQL 16+) and `invalidation_reason` (17+) say a
/// recovery conflict on a standby invalidated it: the primary removed catalog rows the slot
/// needs, or lowered wal_level. Such a slot can never be read again.
pub fn invalidated_by_conflict(conflicting: bool, invalidation_reason: Option<&str>) -> bool {
    conflicting || invalidation_reason.is_some_and(|r| r == "rows_removed" || r == "wal_level_insufficient")
}

/// Retained-WAL thresholds when `max_slot_wal_keep_size` is unlimited and none are set.
pub const UNLIMITED_WARNING_BYTES: u64 = 1 << 30;
pub const UNLIMITED_CRITICAL_BYTES: u64 = 8 << 30;

/// Less than this share of the slot's WAL budget left is a warning.
pub const BUDGET_WARNING_SHARE: f64 = 0.5;
/// Less than this share left is critical.
pub const BUDGET_CRITICAL_SHARE: f64 = 0.2;

/// Kafka silent for this long while records wait is what a stalled confirm is about
/// (records waiting at all hold the confirm back).
pub const KAFKA_SILENT_SECS: f64 = 1.0;

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
        .map(|(key, v)| texts::alarm::threshold_unreachable(key, v, keep))
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
    /// This process streams from the slot (it is the slot's active process).
    pub streaming: bool,
    /// How long Kafka has acknowledged nothing while this process's records wait.
    pub kafka_silent_secs: f64,
    /// How long no process has streamed from the slot (`f64::INFINITY` for a one-off
    /// look such as `walpost slot status`).
    pub inactive_secs: f64,
}

/// The alarm level for a status, what was observed and thresholds, with reasons.
pub fn evaluate(status: &SlotStatus, observed: Observed, t: &Thresholds) -> Verdict {
    if status.is_lost() || status.is_conflicted() {
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
        raise(AlarmLevel::Critical, texts::alarm::UNRESERVED.into());
    }
    let retained = status.retained_bytes.unwrap_or(0);
    if retained >= limits.critical {
        raise(AlarmLevel::Critical, format!("slot retains {retained} bytes of WAL (critical at {})", limits.critical));
    } else if retained >= limits.warning {
        raise(AlarmLevel::Warning, format!("slot retains {retained} bytes of WAL (warning at {})", limits.warning));
    }
    if let (Some(_), Some(safe)) = (limits.keep, status.safe_wal_size_bytes) {
        let budget = safe.saturating_add(retained);
        let share = if budget == 0 { 0.0 } else { safe as f64 / budget as f64 };
        let left = format!(
            "{:.0}% of the slot's WAL budget is left ({safe} bytes of safe_wal_size: what the server can still write before it invalidates the slot)",
            share * 100.0
        );
        if share < BUDGET_CRITICAL_SHARE {
            raise(AlarmLevel::Critical, format!("{left}, under {:.0}%", BUDGET_CRITICAL_SHARE * 100.0));
        } else if share < BUDGET_WARNING_SHARE {
            raise(AlarmLevel::Warning, format!("{left}, under {:.0}%", BUDGET_WARNING_SHARE * 100.0));
        }
    }
    let lag = observed.lag_secs;
    if lag >= t.critical_lag_secs {
        raise(AlarmLevel::Critical, format!("streaming lag {lag:.0} s (critical at {})", t.critical_lag_secs));
    } else if lag >= t.warning_lag_secs {
        raise(AlarmLevel::Warning, format!("streaming lag {lag:.0} s (warning at {})", t.warning_lag_secs));
    }
    let inactive = !status.active && observed.inactive_secs >= t.confirm_stalled_secs && !observed.snapshot_running;
    if inactive {
        raise(AlarmLevel::Warning, texts::alarm::no_process_streams());
    }
    let stalled = observed.confirm_stalled_secs;
    if stalled >= t.confirm_stalled_secs && !observed.snapshot_running && !inactive && status.active {
        let why = if !observed.streaming {
            match status.active_pid {
                Some(pid) => format!("the process holding it (server pid {pid}) is not this walpost and may be stuck"),
                None => "another process holds it".to_owned(),
            }
        } else if observed.kafka_silent_secs >= KAFKA_SILENT_SECS {
            texts::alarm::kafka_silent(observed.kafka_silent_secs)
        } else if lag >= t.warning_lag_secs {
            format!("walpost is reading a backlog: its oldest unconfirmed transaction committed {lag:.0} s ago")
        } else {
            "walpost streams from it and is inside a transaction it has not read to its commit (a long or large transaction upstream)".to_owned()
        };
        raise(
            AlarmLevel::Warning,
            format!("the slot's confirmed position has not moved for {stalled:.0} s while WAL was written: {why}"),
        );
    }
    if let Some(o) = &status.oldest_transaction {
        if o.age_secs >= t.long_transaction_secs {
            raise(
                AlarmLevel::Warning,
                texts::alarm::long_transaction(o.pid, &o.application_name, &o.client_addr, o.age_secs),
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
            in_recovery: false,
            conflicting: false,
            invalidation_reason: None,
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
        Observed { lag_secs: secs, streaming: true, ..Observed::default() }
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
        st.safe_wal_size_bytes = Some(keep / 20);
        assert_eq!(level(evaluate(&st, lag(0.0), &defaults)), AlarmLevel::Critical, "safe_wal_size nearly gone");
        st.safe_wal_size_bytes = Some(keep / 5);
        assert_eq!(level(evaluate(&st, lag(0.0), &defaults)), AlarmLevel::Warning, "under half the budget left");
        st.safe_wal_size_bytes = Some(keep);
        assert_eq!(level(evaluate(&st, lag(0.0), &defaults)), AlarmLevel::Ok);
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
        // Another process holds the slot: it may be stuck, and its pid is named.
        let elsewhere = Observed { confirm_stalled_secs: 31.0, ..Observed::default() };
        match evaluate(&status(0, "reserved"), elsewhere, &t()) {
            Verdict::Level(AlarmLevel::Warning, reasons) => {
                assert!(reasons[0].contains("server pid 1") && reasons[0].contains("not this walpost"), "{reasons:?}")
            }
            other => panic!("{other:?}"),
        }
        let stalled = Observed { confirm_stalled_secs: 31.0, streaming: true, ..Observed::default() };
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

    /// Regression: during a Kafka outage the alarm said "the process
    /// streaming from it (server pid 3942) may be stuck" while walpost was healthy (and the
    /// pid stale). What walpost knows comes first, and no pid is named for its own stream.
    #[test]
    fn regression_a_stalled_confirm_says_what_walpost_knows() {
        let reason = |o: Observed| match evaluate(&status(0, "reserved"), o, &t()) {
            Verdict::Level(_, reasons) => reasons.join("; "),
            other => panic!("{other:?}"),
        };
        let base = Observed { confirm_stalled_secs: 31.0, streaming: true, ..Observed::default() };
        let kafka = reason(Observed { kafka_silent_secs: 40.0, ..base });
        assert!(kafka.contains("Kafka has acknowledged nothing for 40 s") && !kafka.contains("pid"), "{kafka}");
        let backlog = reason(Observed { lag_secs: 20.0, ..base });
        assert!(backlog.contains("reading a backlog") && !backlog.contains("pid"), "{backlog}");
        assert!(!reason(base).contains("pid"));
    }

    /// Regression: `walpost slot status` said "ok" for a slot nothing
    /// streamed from, while slot-check.sql called it a warning. One rule: a warning (the
    /// monitor after confirm_stalled_secs, a one-off look at once).
    #[test]
    fn regression_a_slot_nothing_streams_from_is_a_warning() {
        let mut st = status(0, "reserved");
        st.active = false;
        st.active_pid = None;
        let once = Observed { inactive_secs: f64::INFINITY, ..Observed::default() };
        assert_eq!(level(evaluate(&st, once, &t())), AlarmLevel::Warning);
        let reconnecting = Observed { inactive_secs: 5.0, ..Observed::default() };
        assert_eq!(level(evaluate(&st, reconnecting, &t())), AlarmLevel::Ok, "a reconnect is not an alarm");
        let gone = Observed { inactive_secs: 31.0, confirm_stalled_secs: 31.0, ..Observed::default() };
        match evaluate(&st, gone, &t()) {
            Verdict::Level(AlarmLevel::Warning, reasons) => assert_eq!(reasons.len(), 1, "{reasons:?}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn lost_is_its_own_verdict() {
        assert_eq!(evaluate(&status(0, "lost"), lag(0.0), &t()), Verdict::Lost);
        // A slot on a standby invalidated by a recovery conflict is lost too,
        // whatever wal_status says (16: conflicting; 17+: invalidation_reason).
        let conflicted = SlotStatus { conflicting: true, ..status(0, "reserved") };
        assert_eq!(evaluate(&conflicted, lag(0.0), &t()), Verdict::Lost);
        let rows_removed = SlotStatus { invalidation_reason: Some("rows_removed".into()), ..status(0, "reserved") };
        assert_eq!(evaluate(&rows_removed, lag(0.0), &t()), Verdict::Lost);
        let idle = SlotStatus { invalidation_reason: Some("idle_timeout".into()), ..status(0, "reserved") };
        assert_ne!(evaluate(&idle, lag(0.0), &t()), Verdict::Lost, "not a recovery conflict");
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
