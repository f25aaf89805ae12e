//! Slot safety: how much WAL the slot pins, how far behind it is, and alarms.
//!
//! A task inside `walpost run` (also on a hot standby, which is how a paused or stuck
//! active instance still gets noticed) polls `pg_replication_slots` and
//! `pg_current_wal_lsn()` on an ordinary SQL connection every `[monitor]
//! interval_secs` ([`status`]), exports the figures as gauges, and raises alarms
//! (`slot_alarm::evaluate`, a pure crate of its own):
//! - `warning` / `critical` when retained WAL or the walpost's own streaming lag pass
//!   their thresholds (byte thresholds default to fractions of the server's
//!   `max_slot_wal_keep_size`), when `wal_status` is `unreserved`, when the slot's
//!   confirmed position stands still while WAL is written, or when a transaction has
//!   been open too long (the log line names its server pid, application and client);
//! - `lost` is fatal: walpost stops with the error of runbooks/slot-lost.md;
//! - an outbox table that no longer exists or is no longer streamed by the publication
//!   is fatal too ([`outbox_watch`]): runbooks/outbox-recreated.md.
//!
//! Alarms log once per change of level, then a reminder every `reminder_secs`;
//! `/readyz` fails while the level is critical. Each poll's figures and verdict are
//! published as an [`Observation`] (the admin API's status reads the last one).
//! [`heartbeat`] keeps a quiet database's slot moving.

pub(crate) mod heartbeat;
pub(crate) mod outbox_watch;
pub(crate) mod status;

use std::time::{Duration, Instant};

use backoff::sleep_or_shutdown;
use replication::ReplicationClient;
use tokio::sync::watch;

use crate::postgres::preflight;
use crate::settings::{MonitorSettings, PostgresSettings, SourceSettings};
use crate::telemetry::metrics::lsn_gauge;
use crate::telemetry::{AlarmLevel, Metrics};
pub(crate) use slot_alarm::{evaluate, ConfirmWatch, Observed, Verdict};
pub(crate) use status::{query, SlotStatus};

/// What the last poll found: the slot's figures, the alarm level and its reasons.
#[derive(Debug, Clone)]
pub(crate) struct Observation {
    pub(crate) status: SlotStatus,
    pub(crate) level: AlarmLevel,
    pub(crate) reasons: Vec<String>,
}

/// Runs until `shutdown`; sends a fatal error (slot lost, outbox changed) on `fatal` and
/// returns. Every poll's [`Observation`] goes to `seen`.
pub(crate) async fn run(
    postgres: PostgresSettings,
    source: SourceSettings,
    config: MonitorSettings,
    metrics: Metrics,
    fatal: watch::Sender<Option<String>>,
    seen: watch::Sender<Option<Observation>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut level = AlarmLevel::Ok;
    let mut last_shapes: Vec<String> = Vec::new();
    let mut last_log = Instant::now();
    let mut sql: Option<ReplicationClient> = None;
    let mut outboxes = outbox_watch::OutboxWatch::default();
    let mut confirms = ConfirmWatch::default();
    let mut inactive_since: Option<Instant> = None;
    let mut pause = Duration::ZERO;
    loop {
        if sleep_or_shutdown(pause, &mut shutdown).await {
            return;
        }
        pause = config.interval;
        if sql.is_none() {
            match ReplicationClient::connect_sql(&postgres.server).await {
                Ok(c) => sql = Some(c),
                Err(e) => {
                    tracing::debug!("slot monitor cannot connect: {e}");
                    continue;
                }
            }
        }
        let Some(conn) = sql.as_mut() else { continue };
        let status = match query(conn, &source.slot).await {
            Ok(st) => st,
            Err(e) => {
                tracing::debug!("slot monitor query failed: {e}");
                sql = None;
                continue;
            }
        };
        let stalled = confirms.observe(status.confirmed(), status.current(), Instant::now());
        export(&metrics, &status, stalled.as_secs_f64());
        // The stream runs only after its own checks passed (and it created the
        // publication if missing): from then on a failing check is a change, not setup.
        outboxes.armed |= metrics.health().is_streaming();
        match outboxes.check(conn, &source).await {
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
        // Who may publish events ([messages]) or start replays (signals) is checked at
        // start; a GRANT while walpost runs must not open that up unnoticed.
        if outboxes.armed {
            for rights in [
                preflight::check_emit_message_rights(conn, &source).await,
                preflight::check_signal_rights(conn, &source).await,
            ] {
                match rights {
                    Ok(()) => {}
                    Err(e) if e.is_transient() => {
                        tracing::debug!("rights check failed: {e}");
                        sql = None;
                    }
                    Err(e) => {
                        let _ = fatal.send(Some(format!("{e} (changed while walpost was streaming)")));
                        return;
                    }
                }
            }
            if sql.is_none() {
                continue;
            }
        }
        if !status.exists {
            seen.send_replace(Some(Observation { status, level: AlarmLevel::Ok, reasons: Vec::new() }));
            continue;
        }
        inactive_since = if status.active { None } else { inactive_since.or(Some(Instant::now())) };
        let observed = Observed {
            lag_secs: metrics.stream.lag_seconds(),
            confirm_stalled_secs: stalled.as_secs_f64(),
            snapshot_running: metrics.snapshot.running.get() > 0,
            streaming: metrics.health().is_streaming(),
            kafka_silent_secs: metrics.health().unacknowledged_for().as_secs_f64(),
            inactive_secs: inactive_since.map_or(0.0, |t| t.elapsed().as_secs_f64()),
        };
        // Less than half the WAL budget left: a bulk write can use the rest within one
        // ordinary interval, so look every second.
        if let (Some(safe), Some(retained)) = (status.safe_wal_size_bytes, status.retained_bytes) {
            let budget = safe.saturating_add(retained);
            if budget > 0 && (safe as f64) < budget as f64 * slot_alarm::BUDGET_WARNING_SHARE {
                pause = pause.min(FAST_POLL);
            }
        }
        match evaluate(&status, observed, &config.thresholds) {
            Verdict::Lost => {
                set_level(&metrics, AlarmLevel::Critical);
                let message = if status.is_conflicted() {
                    texts::slot::conflicted(&source.slot, status.invalidation_reason.as_deref())
                } else {
                    texts::slot::lost(&source.slot)
                };
                let _ = fatal.send(Some(message));
                return;
            }
            Verdict::Level(new, reasons) => {
                set_level(&metrics, new);
                // A new reason (the WAL crossing a threshold during a lag warning) is
                // logged too, not only a new level; numbers alone changing are not.
                let shapes: Vec<String> = reasons.iter().map(|r| shape(r)).collect();
                let changed = new != level || shapes != last_shapes;
                let remind = new != AlarmLevel::Ok && last_log.elapsed() >= config.reminder;
                if changed || remind {
                    last_log = Instant::now();
                    log_alarm(&source.slot, new, &reasons, &status);
                }
                level = new;
                last_shapes = shapes;
                seen.send_replace(Some(Observation { status, level: new, reasons }));
            }
        }
    }
}

/// How often the slot is looked at while less than half its WAL budget is left.
const FAST_POLL: Duration = Duration::from_secs(1);

/// A reason without its numbers: what it is about.
fn shape(reason: &str) -> String {
    reason.chars().filter(|c| !c.is_ascii_digit()).collect()
}

fn set_level(metrics: &Metrics, level: AlarmLevel) {
    metrics.health().set_alarm(level);
    metrics.slot.set_alarm(level);
}

fn export(metrics: &Metrics, st: &SlotStatus, stalled_secs: f64) {
    let m = &metrics.slot;
    let bytes = |v: Option<u64>| v.map_or(0, lsn_gauge);
    m.retained_bytes.set(bytes(st.retained_bytes));
    m.unconfirmed_bytes.set(bytes(st.unconfirmed_bytes));
    m.safe_wal_size_bytes.set(match (st.safe_wal_size_bytes, st.max_slot_wal_keep_size_bytes) {
        (Some(safe), _) => lsn_gauge(safe),
        (None, None) => -1,
        (None, Some(_)) => 0,
    });
    m.active.set(i64::from(st.active));
    m.set_wal_status(st.wal_status.as_deref());
    m.confirm_stalled_seconds.set(stalled_secs);
    m.oldest_transaction_age_seconds.set(st.oldest_transaction_age_secs());
}

fn log_alarm(slot: &str, level: AlarmLevel, reasons: &[String], st: &SlotStatus) {
    let why = reasons.join("; ");
    // One runbook reference: the reason's own, else the WAL build-up runbook.
    let see = if why.contains(".md)") { String::new() } else { texts::alarm::see_wal_buildup() };
    let retained = st.retained_bytes.unwrap_or(0);
    // A transaction's pid only when the long-transaction reason names it.
    let (pid, app, client) = match &st.oldest_transaction {
        Some(o) if why.contains(&format!("transaction of server pid {} ", o.pid)) => {
            (Some(o.pid), o.application_name.as_str(), o.client_addr.as_str())
        }
        _ => (None, "", ""),
    };
    match (level, pid) {
        (AlarmLevel::Critical, Some(pid)) => tracing::error!(
            alarm = "critical",
            slot,
            retained_bytes = retained,
            wal_status = st.wal_status.as_deref().unwrap_or(""),
            oldest_xact_pid = pid,
            oldest_xact_application = app,
            oldest_xact_client = client,
            "slot alarm critical: {why}{see}"
        ),
        (AlarmLevel::Critical, None) => tracing::error!(
            alarm = "critical",
            slot,
            retained_bytes = retained,
            wal_status = st.wal_status.as_deref().unwrap_or(""),
            "slot alarm critical: {why}{see}"
        ),
        (AlarmLevel::Warning, Some(pid)) => tracing::warn!(
            alarm = "warning",
            slot,
            retained_bytes = retained,
            wal_status = st.wal_status.as_deref().unwrap_or(""),
            oldest_xact_pid = pid,
            oldest_xact_application = app,
            oldest_xact_client = client,
            "slot alarm warning: {why}{see}"
        ),
        (AlarmLevel::Warning, None) => tracing::warn!(
            alarm = "warning",
            slot,
            retained_bytes = retained,
            wal_status = st.wal_status.as_deref().unwrap_or(""),
            "slot alarm warning: {why}{see}"
        ),
        (AlarmLevel::Ok, _) => tracing::info!(alarm = "ok", slot, retained_bytes = retained, "slot alarm cleared"),
    }
}
