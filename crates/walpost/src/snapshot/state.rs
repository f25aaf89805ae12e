//! The snapshot's crash-safety record, `<outbox schema>.walpost_snapshots`, and the
//! planner's row estimate for progress.

use replication::ReplicationClient;

use crate::error::{ErrorKind, PipelineError};
use crate::postgres::catalog::parsed;
use crate::postgres::sql::ident;
use crate::settings::{SourceSettings, TableName};

fn state_table(source: &SourceSettings) -> String {
    format!("{}.walpost_snapshots", ident(&source.table().schema))
}

/// Whether an earlier snapshot for this slot started and never finished.
pub(crate) async fn unfinished(sql: &mut ReplicationClient, source: &SourceSettings) -> Result<bool, PipelineError> {
    let exists = sql
        .query("SELECT pg_catalog.to_regclass($1) IS NOT NULL AS present", &[Some(state_table(source).as_str())])
        .await?;
    if exists.first("present") != Some("t") {
        return Ok(false);
    }
    let r = sql
        .query(
            &format!(
                "SELECT pg_catalog.count(*) AS n FROM {} WHERE slot = $1 AND finished_at IS NULL",
                state_table(source)
            ),
            &[Some(source.slot.as_str())],
        )
        .await?;
    Ok(r.first("n").is_some_and(|n| n != "0"))
}

/// Records that a snapshot for this slot is starting (before the slot exists).
pub(crate) async fn mark_started(sql: &mut ReplicationClient, source: &SourceSettings) -> Result<(), PipelineError> {
    let table = state_table(source);
    let slot = [Some(source.slot.as_str())];
    let statements = [
        (format!(
            "CREATE TABLE IF NOT EXISTS {table} (slot text PRIMARY KEY, started_at timestamptz NOT NULL, finished_at timestamptz, rows bigint)"
        ), &[][..]),
        (format!(
            "INSERT INTO {table} (slot, started_at) VALUES ($1, pg_catalog.now()) ON CONFLICT (slot) DO UPDATE SET started_at = pg_catalog.now(), finished_at = NULL, rows = NULL"
        ), &slot[..]),
    ];
    for (statement, params) in statements {
        sql.query(&statement, params).await.map_err(|e| {
            PipelineError::definite(ErrorKind::Privilege, format!(
                "cannot record snapshot progress in {table}: {e}; the snapshot modes need CREATE on schema {} and INSERT/UPDATE on that table (or create it beforehand: see docs/snapshot-and-replay.md)",
                source.table().schema
            ))
            .caused_by(e)
        })?;
    }
    Ok(())
}

pub(crate) async fn mark_finished(
    sql: &mut ReplicationClient,
    source: &SourceSettings,
    rows: u64,
) -> Result<(), PipelineError> {
    let rows = rows.to_string();
    sql.query(
        &format!(
            "UPDATE {} SET finished_at = pg_catalog.now(), rows = $1::bigint WHERE slot = $2",
            state_table(source)
        ),
        &[Some(rows.as_str()), Some(source.slot.as_str())],
    )
    .await?;
    Ok(())
}

/// The planner's row estimate for the table (or the sum over its partitions).
pub(super) async fn estimate_rows(sql: &mut ReplicationClient, table: &TableName) -> Result<u64, PipelineError> {
    let r = sql
        .query(
            "SELECT coalesce(pg_catalog.sum(greatest(c.reltuples, 0)), 0)::bigint AS n FROM pg_class c
             WHERE c.oid = $1::regclass OR c.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = $1::regclass)",
            &[Some(table.quoted().as_str())],
        )
        .await?;
    Ok(parsed(r.first("n"), "sum of pg_class.reltuples", "a row count")?.unwrap_or(0))
}

/// The planner's estimate of the rows `query` returns (`EXPLAIN`'s top line), for a
/// filtered snapshot or replay: the table's size would promise hours for a one-row replay.
/// `params`: the values of `query`'s `$n`.
pub(super) async fn estimate_query_rows(
    sql: &mut ReplicationClient,
    query: &str,
    params: &[Option<&str>],
) -> Result<u64, PipelineError> {
    let r = sql.query(&format!("EXPLAIN {query}"), params).await?;
    let plan = r.first("QUERY PLAN").unwrap_or_default();
    Ok(plan
        .split("rows=")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0))
}
