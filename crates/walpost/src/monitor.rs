//! Slot safety: how much WAL the slot pins, how far behind it is, and alarms.
//!
//! A task inside `walpost run` (also on a hot standby, which is how a paused or stuck
//! active instance still gets noticed) polls `pg_replication_slots` and
//! `pg_current_wal_lsn()` on an ordinary SQL connection every `[monitor]
//! interval_secs`, exports the figures as gauges, and raises alarms:
//! - `warning` / `critical` when retained WAL bytes or the streaming lag (age of the
//!   oldest unacknowledged transaction) pass their thresholds, or when `wal_status` is
//!   `unreserved` (critical: the next checkpoint may remove WAL the slot needs);
//! - `lost` is fatal: walpost stops with the error of runbooks/slot-lost.md;
//! - an outbox table that no longer exists or is no longer streamed by the publication
//!   is fatal too ([`OutboxWatch`]): runbooks/outbox-recreated.md.
//!
//! Alarms log once per change of level, then a reminder every `reminder_secs`;
//! `/readyz` fails while the level is critical.
//!
//! The evaluation is pure ([`evaluate`]); only [`query`] and [`run`] do I/O.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pgoutput::Lsn;
use replication::{quote_literal, ReplicationClient};
use serde::Serialize;
use tokio::sync::watch;

use crate::config::Settings;
use crate::error::PipelineError;
use crate::metrics::Metrics;
use crate::setup;

/// Alarm thresholds; bytes of retained WAL and seconds of streaming lag.
#[derive(Debug, Clone, PartialEq)]
pub struct Thresholds {
    pub warning_bytes: u64,
    pub critical_bytes: u64,
    pub warning_lag_secs: f64,
    pub critical_lag_secs: f64,
    pub long_transaction_secs: f64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            warning_bytes: 1 << 30,
            critical_bytes: 8 << 30,
            warning_lag_secs: 60.0,
            critical_lag_secs: 600.0,
            long_transaction_secs: 300.0,
        }
    }
}

/// What the server says about the slot, plus server-wide figures.
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
    /// current WAL position - restart_lsn: what the slot keeps on disk.
    pub retained_bytes: u64,
    /// current WAL position - confirmed_flush_lsn: written but not yet confirmed.
    pub unconfirmed_bytes: u64,
    /// Bytes that can still be written before the slot is in danger (PG 13+); None if unlimited.
    pub safe_wal_size_bytes: Option<i64>,
    pub max_slot_wal_keep_size: String,
    /// Age of the oldest open transaction on the server (they hold logical decoding back).
    pub oldest_transaction_age_secs: f64,
    /// pg_stat_replication.flush_lag of the process streaming from the slot, if any.
    pub flush_lag_secs: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
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
}

/// The outcome of one evaluation.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Level(AlarmLevel, Vec<String>),
    /// The slot is gone for good (wal_status = lost).
    Lost,
}

/// Pure: the alarm level for a status, a streaming lag and thresholds, with reasons.
pub fn evaluate(status: &SlotStatus, lag_secs: f64, t: &Thresholds) -> Verdict {
    if status.wal_status.as_deref() == Some("lost") {
        return Verdict::Lost;
    }
    let mut level = AlarmLevel::Ok;
    let mut reasons = Vec::new();
    let mut raise = |to: AlarmLevel, why: String| {
        level = level.max(to);
        reasons.push(why);
    };
    if status.wal_status.as_deref() == Some("unreserved") {
        raise(
            AlarmLevel::Critical,
            "wal_status is unreserved: the next checkpoint may remove WAL the slot needs".into(),
        );
    }
    if status.retained_bytes >= t.critical_bytes {
        raise(
            AlarmLevel::Critical,
            format!("slot retains {} bytes of WAL (critical at {})", status.retained_bytes, t.critical_bytes),
        );
    } else if status.retained_bytes >= t.warning_bytes {
        raise(
            AlarmLevel::Warning,
            format!("slot retains {} bytes of WAL (warning at {})", status.retained_bytes, t.warning_bytes),
        );
    }
    if lag_secs >= t.critical_lag_secs {
        raise(AlarmLevel::Critical, format!("streaming lag {lag_secs:.0} s (critical at {})", t.critical_lag_secs));
    } else if lag_secs >= t.warning_lag_secs {
        raise(AlarmLevel::Warning, format!("streaming lag {lag_secs:.0} s (warning at {})", t.warning_lag_secs));
    }
    if status.oldest_transaction_age_secs >= t.long_transaction_secs {
        raise(
            AlarmLevel::Warning,
            format!(
                "a transaction has been open for {:.0} s: logical decoding cannot pass it (see runbooks/long-transaction.md)",
                status.oldest_transaction_age_secs
            ),
        );
    }
    Verdict::Level(level, reasons)
}

/// Reads the slot's figures. `exists = false` when there is no such slot.
pub async fn query(sql: &mut ReplicationClient, slot: &str) -> Result<SlotStatus, PipelineError> {
    let r = sql
        .simple_query(&format!(
            "SELECT pg_current_wal_lsn()::text AS current,
                    s.plugin, s.active::text AS active, s.active_pid::text AS pid, s.wal_status,
                    s.restart_lsn::text AS restart, s.confirmed_flush_lsn::text AS confirmed,
                    greatest(pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn), 0)::bigint::text AS retained,
                    greatest(pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn), 0)::bigint::text AS unconfirmed,
                    s.safe_wal_size::text AS safe,
                    current_setting('max_slot_wal_keep_size') AS keep,
                    (SELECT coalesce(extract(epoch FROM max(now() - xact_start)), 0)::float8::text
                       FROM pg_stat_activity WHERE xact_start IS NOT NULL AND pid <> pg_backend_pid()
                       AND backend_type = 'client backend') AS oldest_xact,
                    (SELECT extract(epoch FROM r.flush_lag)::float8::text FROM pg_stat_replication r
                       WHERE r.pid = s.active_pid) AS flush_lag
             FROM (SELECT 1) AS one LEFT JOIN pg_replication_slots s ON s.slot_name = {}",
            quote_literal(slot)
        ))
        .await?;
    let get = |c: &str| r.first(c).map(str::to_owned);
    let num = |c: &str| r.first(c).and_then(|v| v.parse::<i64>().ok());
    Ok(SlotStatus {
        slot: slot.to_owned(),
        exists: get("plugin").is_some() || get("restart").is_some(),
        plugin: get("plugin"),
        active: r.first("active") == Some("true"),
        active_pid: num("pid"),
        wal_status: get("wal_status"),
        current_lsn: get("current").unwrap_or_default(),
        restart_lsn: get("restart"),
        confirmed_flush_lsn: get("confirmed"),
        retained_bytes: num("retained").unwrap_or(0).max(0).unsigned_abs(),
        unconfirmed_bytes: num("unconfirmed").unwrap_or(0).max(0).unsigned_abs(),
        safe_wal_size_bytes: num("safe"),
        max_slot_wal_keep_size: get("keep").unwrap_or_default(),
        oldest_transaction_age_secs: r.first("oldest_xact").and_then(|v| v.parse().ok()).unwrap_or(0.0),
        flush_lag_secs: r.first("flush_lag").and_then(|v| v.parse().ok()),
    })
}

/// Runs until the process ends; sends the slot-lost error on `fatal` and returns.
pub async fn run(s: Settings, metrics: Arc<Metrics>, fatal: watch::Sender<Option<String>>) {
    let mut level = AlarmLevel::Ok;
    let mut last_log = Instant::now();
    let mut sql: Option<ReplicationClient> = None;
    let mut outboxes = OutboxWatch::default();
    let mut tick = tokio::time::interval(s.monitor_interval);
    loop {
        tick.tick().await;
        if sql.is_none() {
            match ReplicationClient::connect_sql(&s.postgres).await {
                Ok(c) => sql = Some(c),
                Err(e) => {
                    tracing::debug!("slot monitor cannot connect: {e}");
                    continue;
                }
            }
        }
        let Some(conn) = sql.as_mut() else { continue };
        let status = match query(conn, &s.slot).await {
            Ok(st) => st,
            Err(e) => {
                tracing::debug!("slot monitor query failed: {e}");
                sql = None;
                continue;
            }
        };
        metrics.set_slot(&status);
        // The pipeline streams only after its own checks passed (and it created the
        // publication if missing): from then on a failing check is a change, not setup.
        outboxes.armed |= metrics.is_streaming();
        match outboxes.check(conn, &s).await {
            Ok(None) => {}
            Ok(Some(message)) => {
                let _ = fatal.send(Some(message));
                return;
            }
            Err(e) => {
                tracing::debug!("outbox check failed: {e}");
                sql = None;
                continue;
            }
        }
        if !status.exists {
            continue;
        }
        let lag = metrics.lag_seconds();
        match evaluate(&status, lag, &s.thresholds) {
            Verdict::Lost => {
                metrics.set_alarm(AlarmLevel::Critical);
                let _ = fatal.send(Some(setup::slot_lost_message(&s.slot)));
                return;
            }
            Verdict::Level(new, reasons) => {
                metrics.set_alarm(new);
                let changed = new != level;
                let remind = new != AlarmLevel::Ok && last_log.elapsed() >= s.alarm_reminder;
                if changed || remind {
                    last_log = Instant::now();
                    let why = reasons.join("; ");
                    match new {
                        AlarmLevel::Critical => {
                            tracing::error!(alarm = "critical", slot = %s.slot, retained_bytes = status.retained_bytes, "slot alarm critical: {why} (see runbooks/slot-wal-buildup.md)")
                        }
                        AlarmLevel::Warning => {
                            tracing::warn!(alarm = "warning", slot = %s.slot, retained_bytes = status.retained_bytes, "slot alarm warning: {why} (see runbooks/slot-wal-buildup.md)")
                        }
                        AlarmLevel::Ok => {
                            tracing::info!(alarm = "ok", slot = %s.slot, retained_bytes = status.retained_bytes, "slot alarm cleared")
                        }
                    }
                }
                level = new;
            }
        }
    }
}

/// Watches that every outbox table still exists and is still streamed by the
/// publication. Neither a DROP nor a publication change is in the replication stream:
/// without this check, rows of a re-created outbox would never be decoded while the
/// slot is confirmed past them, silently. Armed once the tables have been seen
/// streamable or the pipeline streams, so a misconfiguration at start is reported by
/// the pipeline's start-up checks instead.
#[derive(Debug, Default)]
struct OutboxWatch {
    armed: bool,
    oids: Vec<String>,
}

impl OutboxWatch {
    /// `Ok(Some(message))`: fatal, stop with it. `Err`: the query failed (reconnect).
    async fn check(&mut self, sql: &mut ReplicationClient, s: &Settings) -> Result<Option<String>, PipelineError> {
        let mut oids = Vec::with_capacity(s.outboxes.len());
        for outbox in &s.outboxes {
            let r = sql
                .simple_query(&format!(
                    "SELECT to_regclass({})::oid::text AS oid",
                    quote_literal(&outbox.table.quoted())
                ))
                .await?;
            match r.first("oid") {
                Some(oid) => oids.push(oid.to_owned()),
                None if self.armed => {
                    return Ok(Some(setup::outbox_changed_message(&setup::outbox_dropped(&outbox.table))));
                }
                None => return Ok(None),
            }
        }
        match setup::publication_state(sql, s).await {
            // Not created yet (the pipeline creates it); dropped, the walsender says so.
            Ok(setup::Publication::Missing) => return Ok(None),
            Ok(setup::Publication::Ready | setup::Publication::ReadyForAllTables) => {}
            Err(PipelineError::Definite(why)) if self.armed => return Ok(Some(setup::outbox_changed_message(&why))),
            Err(PipelineError::Definite(_)) => return Ok(None),
            Err(e) => return Err(e),
        }
        if self.armed && !self.oids.is_empty() && oids != self.oids {
            // Replaced and published again (migrations/0002 does both in one
            // transaction, losing nothing); a gap between the two would lose rows.
            tracing::warn!(
                table = %s.table,
                "an outbox table was re-created while walpost was streaming and is in the publication again; rows written to it before it joined the publication were not streamed (see {})",
                setup::OUTBOX_CHANGED_RUNBOOK
            );
        }
        self.armed = true;
        self.oids = oids;
        Ok(None)
    }
}

/// Emits an empty transactional logical message every `interval`, so a quiet database
/// on a busy server still gives the slot something to confirm.
pub async fn heartbeat(s: Settings, interval: Duration) {
    let mut sql: Option<ReplicationClient> = None;
    let mut tick = tokio::time::interval(interval);
    loop {
        tick.tick().await;
        if sql.is_none() {
            sql = ReplicationClient::connect_sql(&s.postgres).await.ok();
        }
        if let Some(conn) = sql.as_mut() {
            if let Err(e) = conn.simple_query("SELECT pg_logical_emit_message(true, 'walpost.heartbeat', '')").await {
                tracing::debug!("heartbeat failed: {e}");
                sql = None;
            }
        }
    }
}

/// Parses an LSN column of a status for display; `None` when absent.
pub fn lsn(text: &Option<String>) -> Option<Lsn> {
    text.as_deref().and_then(|t| t.parse().ok())
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
            restart_lsn: None,
            confirmed_flush_lsn: None,
            retained_bytes: retained,
            unconfirmed_bytes: retained,
            safe_wal_size_bytes: None,
            max_slot_wal_keep_size: "-1".into(),
            oldest_transaction_age_secs: 0.0,
            flush_lag_secs: None,
        }
    }

    fn t() -> Thresholds {
        Thresholds {
            warning_bytes: 100,
            critical_bytes: 1000,
            warning_lag_secs: 10.0,
            critical_lag_secs: 100.0,
            long_transaction_secs: 60.0,
        }
    }

    fn level(v: Verdict) -> AlarmLevel {
        match v {
            Verdict::Level(l, _) => l,
            Verdict::Lost => panic!("unexpected lost"),
        }
    }

    #[test]
    fn byte_thresholds_at_their_edges() {
        assert_eq!(level(evaluate(&status(99, "reserved"), 0.0, &t())), AlarmLevel::Ok);
        assert_eq!(level(evaluate(&status(100, "reserved"), 0.0, &t())), AlarmLevel::Warning);
        assert_eq!(level(evaluate(&status(999, "extended"), 0.0, &t())), AlarmLevel::Warning);
        assert_eq!(level(evaluate(&status(1000, "reserved"), 0.0, &t())), AlarmLevel::Critical);
    }

    #[test]
    fn lag_unreserved_and_long_transactions() {
        assert_eq!(level(evaluate(&status(0, "reserved"), 10.0, &t())), AlarmLevel::Warning);
        assert_eq!(level(evaluate(&status(0, "reserved"), 100.0, &t())), AlarmLevel::Critical);
        assert_eq!(level(evaluate(&status(0, "unreserved"), 0.0, &t())), AlarmLevel::Critical);
        let mut st = status(0, "reserved");
        st.oldest_transaction_age_secs = 61.0;
        match evaluate(&st, 0.0, &t()) {
            Verdict::Level(AlarmLevel::Warning, reasons) => {
                assert!(reasons[0].contains("long-transaction"))
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn lost_is_its_own_verdict() {
        assert_eq!(evaluate(&status(0, "lost"), 0.0, &t()), Verdict::Lost);
    }
}
