//! What the server says about the slot, plus server-wide figures, in one query.
//!
//! On a standby (decoding there, PostgreSQL 16+) the server's WAL position is what it has
//! replayed (`pg_current_wal_lsn()` fails during recovery), and the slot's
//! `conflicting` (16+) and `invalidation_reason` (17+) say whether a recovery conflict
//! invalidated it. Columns a major lacks read as NULL (`to_jsonb` of the row), so one
//! query serves every major.

use replication::ReplicationClient;
pub(crate) use slot_alarm::{OldestTransaction, SlotStatus};

use crate::error::PipelineError;

/// Reads the slot's figures. `exists = false` when there is no such slot.
pub(crate) async fn query(sql: &mut ReplicationClient, slot: &str) -> Result<SlotStatus, PipelineError> {
    let r = sql
        .query(
            "SELECT w.current::text AS current, w.recovery::text AS recovery,
                    s.plugin, s.active::text AS active, s.active_pid::text AS pid, s.wal_status,
                    s.restart_lsn::text AS restart, s.confirmed_flush_lsn::text AS confirmed,
                    greatest(pg_catalog.pg_wal_lsn_diff(w.current, s.restart_lsn), 0)::bigint::text AS retained,
                    greatest(pg_catalog.pg_wal_lsn_diff(w.current, s.confirmed_flush_lsn), 0)::bigint::text AS unconfirmed,
                    pg_catalog.to_jsonb(s) ->> 'conflicting' AS conflicting,
                    pg_catalog.to_jsonb(s) ->> 'invalidation_reason' AS invalidation_reason,
                    s.safe_wal_size::text AS safe,
                    pg_catalog.current_setting('max_slot_wal_keep_size') AS keep,
                    CASE WHEN pg_catalog.current_setting('max_slot_wal_keep_size') = '-1' THEN NULL
                         ELSE pg_catalog.pg_size_bytes(pg_catalog.current_setting('max_slot_wal_keep_size'))::text END AS keep_bytes,
                    o.pid::text AS oldest_pid, coalesce(o.application_name, '') AS oldest_app,
                    coalesce(pg_catalog.host(o.client_addr), 'local') AS oldest_client,
                    greatest(extract(epoch FROM pg_catalog.clock_timestamp() - o.xact_start), 0)::float8::text AS oldest_age
             FROM (SELECT pg_catalog.pg_is_in_recovery() AS recovery,
                          CASE WHEN pg_catalog.pg_is_in_recovery() THEN pg_catalog.pg_last_wal_replay_lsn() ELSE pg_catalog.pg_current_wal_lsn() END AS current) AS w
             LEFT JOIN pg_replication_slots s ON s.slot_name = $1
             LEFT JOIN LATERAL (SELECT a.pid, a.application_name, a.client_addr, a.xact_start FROM pg_stat_activity a
                 WHERE a.xact_start IS NOT NULL AND a.backend_xid IS NOT NULL AND a.pid <> pg_catalog.pg_backend_pid()
                   AND a.backend_type = 'client backend'
                 ORDER BY a.xact_start LIMIT 1) o ON true",
            &[Some(slot)],
        )
        .await?;
    let get = |c: &str| r.first(c).map(str::to_owned);
    let num = |c: &str| r.first(c).and_then(|v| v.parse::<i64>().ok());
    let bytes = |c: &str| num(c).map(|n| n.max(0).unsigned_abs());
    let oldest = match (num("oldest_pid"), r.first("oldest_age").and_then(|v| v.parse::<f64>().ok())) {
        (Some(pid), Some(age_secs)) => Some(OldestTransaction {
            pid,
            application_name: get("oldest_app").unwrap_or_default(),
            client_addr: get("oldest_client").unwrap_or_default(),
            age_secs,
        }),
        _ => None,
    };
    Ok(SlotStatus {
        slot: slot.to_owned(),
        exists: get("plugin").is_some() || get("wal_status").is_some(),
        plugin: get("plugin"),
        active: r.first("active") == Some("true"),
        active_pid: num("pid"),
        wal_status: get("wal_status"),
        current_lsn: get("current").unwrap_or_default(),
        restart_lsn: get("restart"),
        confirmed_flush_lsn: get("confirmed"),
        retained_bytes: get("restart").and(bytes("retained")),
        unconfirmed_bytes: get("confirmed").and(bytes("unconfirmed")),
        safe_wal_size_bytes: bytes("safe"),
        max_slot_wal_keep_size: get("keep").unwrap_or_default(),
        max_slot_wal_keep_size_bytes: bytes("keep_bytes"),
        oldest_transaction: oldest,
        in_recovery: r.first("recovery") == Some("true"),
        conflicting: r.first("conflicting") == Some("true"),
        invalidation_reason: get("invalidation_reason"),
    })
}
