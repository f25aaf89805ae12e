//! What the server says about the slot, plus server-wide figures, in one query.

use pgoutput::Lsn;
use replication::ReplicationClient;
use serde::Serialize;

use crate::error::PipelineError;
use crate::postgres::sql::literal;

/// The oldest open transaction on the server that has written WAL (it has a
/// transaction id): only such a transaction holds logical decoding back; a read-only one
/// (a report, walpost's own snapshot) does not.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct OldestTransaction {
    pub pid: i64,
    pub application_name: String,
    /// `local` for a Unix-socket client.
    pub client_addr: String,
    pub age_secs: f64,
}

/// See the module docs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct SlotStatus {
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
}

impl SlotStatus {
    pub(crate) fn is_lost(&self) -> bool {
        self.wal_status.as_deref() == Some("lost")
    }

    pub(crate) fn current(&self) -> Option<Lsn> {
        self.current_lsn.parse().ok()
    }

    pub(crate) fn confirmed(&self) -> Option<Lsn> {
        self.confirmed_flush_lsn.as_deref().and_then(|l| l.parse().ok())
    }

    pub(crate) fn oldest_transaction_age_secs(&self) -> f64 {
        self.oldest_transaction.as_ref().map_or(0.0, |t| t.age_secs)
    }
}

/// Reads the slot's figures. `exists = false` when there is no such slot.
pub(crate) async fn query(sql: &mut ReplicationClient, slot: &str) -> Result<SlotStatus, PipelineError> {
    let r = sql
        .simple_query(&format!(
            "SELECT pg_current_wal_lsn()::text AS current,
                    s.plugin, s.active::text AS active, s.active_pid::text AS pid, s.wal_status,
                    s.restart_lsn::text AS restart, s.confirmed_flush_lsn::text AS confirmed,
                    greatest(pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn), 0)::bigint::text AS retained,
                    greatest(pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn), 0)::bigint::text AS unconfirmed,
                    s.safe_wal_size::text AS safe,
                    current_setting('max_slot_wal_keep_size') AS keep,
                    CASE WHEN current_setting('max_slot_wal_keep_size') = '-1' THEN NULL
                         ELSE pg_size_bytes(current_setting('max_slot_wal_keep_size'))::text END AS keep_bytes,
                    o.pid::text AS oldest_pid, coalesce(o.application_name, '') AS oldest_app,
                    coalesce(host(o.client_addr), 'local') AS oldest_client,
                    greatest(extract(epoch FROM clock_timestamp() - o.xact_start), 0)::float8::text AS oldest_age
             FROM (SELECT 1) AS one
             LEFT JOIN pg_replication_slots s ON s.slot_name = {}
             LEFT JOIN LATERAL (SELECT a.pid, a.application_name, a.client_addr, a.xact_start FROM pg_stat_activity a
                 WHERE a.xact_start IS NOT NULL AND a.backend_xid IS NOT NULL AND a.pid <> pg_backend_pid()
                   AND a.backend_type = 'client backend'
                 ORDER BY a.xact_start LIMIT 1) o ON true",
            literal(slot)
        ))
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
    })
}
