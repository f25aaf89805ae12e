//! Preflight checks and idempotent setup on an ordinary SQL connection: wal_level,
//! the role's privileges, the outbox table and its mapped columns, the publication and
//! the slot's state. Each failure is a [`PipelineError::Definite`] whose text names
//! the problem and the command that fixes it.

use bytes::Bytes;
use pgoutput::{Column, Lsn, Relation};
use replication::{quote_ident, quote_literal, ReplicationClient};
use router::Router;

use crate::config::{Outbox, Settings, TableName};
use crate::error::PipelineError;

/// The runbook a lost slot points to.
pub const SLOT_LOST_RUNBOOK: &str = "runbooks/slot-lost.md";
/// The runbook an outbox table that stopped being streamed points to.
pub const OUTBOX_CHANGED_RUNBOOK: &str = "runbooks/outbox-recreated.md";

/// What pg_replication_slots says about our slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotRow {
    pub plugin: Option<String>,
    pub slot_type: String,
    pub database: Option<String>,
    pub active_pid: Option<i32>,
    pub wal_status: Option<String>,
    pub confirmed_flush: Option<Lsn>,
}

async fn query(sql: &mut ReplicationClient, text: &str) -> Result<replication::QueryResult, PipelineError> {
    Ok(sql.simple_query(text).await?)
}

/// Checks everything that does not depend on the slot; creates the publication if missing.
pub async fn preflight(sql: &mut ReplicationClient, s: &Settings) -> Result<(), PipelineError> {
    check_wal_level(sql).await?;
    check_role(sql).await?;
    check_table(sql, s).await?;
    ensure_publication(sql, s).await
}

pub async fn check_wal_level(sql: &mut ReplicationClient) -> Result<(), PipelineError> {
    let r = query(sql, "SHOW wal_level").await?;
    let level = r.first("wal_level").unwrap_or("unknown");
    if level != "logical" {
        return Err(PipelineError::definite(format!(
            "wal_level is '{level}' but walpost needs 'logical': run ALTER SYSTEM SET wal_level = logical (or set wal_level = logical in postgresql.conf) and restart PostgreSQL; a reload is not enough"
        )));
    }
    Ok(())
}

pub async fn check_role(sql: &mut ReplicationClient) -> Result<(), PipelineError> {
    let r = query(
        sql,
        "SELECT current_user AS name, rolsuper::text AS super, rolreplication::text AS repl FROM pg_roles WHERE rolname = current_user",
    )
    .await?;
    let name = r.first("name").unwrap_or("?").to_owned();
    if r.first("super") != Some("true") && r.first("repl") != Some("true") {
        return Err(PipelineError::definite(format!(
            "role \"{name}\" lacks the REPLICATION attribute: run ALTER ROLE {} WITH REPLICATION as a superuser",
            quote_ident(&name)
        )));
    }
    Ok(())
}

/// Every outbox table exists and holds its mapped columns (checked with the router's
/// own column lookup, so the error is the one a Relation message would give).
pub async fn check_table(sql: &mut ReplicationClient, s: &Settings) -> Result<(), PipelineError> {
    for outbox in &s.outboxes {
        check_outbox_table(sql, s, outbox).await?;
    }
    Ok(())
}

async fn check_outbox_table(sql: &mut ReplicationClient, s: &Settings, outbox: &Outbox) -> Result<(), PipelineError> {
    let table = &outbox.table;
    let r = query(
        sql,
        &format!(
            "SELECT a.attname, a.atttypid::text FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid \
             JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = {} AND c.relname = {} AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            quote_literal(&table.schema),
            quote_literal(&table.name)
        ),
    )
    .await?;
    if r.rows.is_empty() {
        return Err(PipelineError::definite(format!(
            "table {table} does not exist in database {}: apply migrations/0001_events_outbox.sql or pass --table schema.name",
            s.postgres.dbname
        )));
    }
    let relation = relation_of(
        table,
        (0..r.rows.len()).filter_map(|i| {
            let name = r.text(i, 0)?;
            Some((name.to_owned(), r.text(i, 1).and_then(|t| t.parse().ok()).unwrap_or(0)))
        }),
    );
    Router::new(outbox.router.clone()).and_then(|r| r.resolve(&relation)).map_err(PipelineError::definite)?;
    Ok(())
}

/// A Relation message's equivalent for a table described by the catalog or a row
/// description: so checks and snapshots resolve columns exactly as streaming does.
pub fn relation_of(table: &TableName, columns: impl IntoIterator<Item = (String, u32)>) -> Relation {
    Relation {
        xid: None,
        oid: 0,
        namespace: Bytes::from(table.schema.clone()),
        name: Bytes::from(table.name.clone()),
        replica_identity: b'd',
        columns: columns
            .into_iter()
            .map(|(name, type_oid)| Column { flags: 0, name: Bytes::from(name), type_oid, type_modifier: -1 })
            .collect(),
    }
}

/// Whether the publication exists (and, if it does, publishes our inserts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Publication {
    Missing,
    Ready,
    /// Ready, but FOR ALL TABLES: every table's changes are decoded and sent.
    ReadyForAllTables,
}

/// Checks an existing publication publishes inserts of the table; read-only.
pub async fn publication_state(sql: &mut ReplicationClient, s: &Settings) -> Result<Publication, PipelineError> {
    let pubname = quote_literal(&s.publication);
    let r = query(
        sql,
        &format!("SELECT pubinsert::text AS ins, puballtables::text AS alltables FROM pg_publication WHERE pubname = {pubname}"),
    )
    .await?;
    if r.rows.is_empty() {
        return Ok(Publication::Missing);
    }
    if r.first("ins") != Some("true") {
        return Err(PipelineError::definite(format!(
            "publication \"{}\" does not publish inserts: run ALTER PUBLICATION {} SET (publish = 'insert')",
            s.publication,
            quote_ident(&s.publication)
        )));
    }
    for table in s.outboxes.iter().map(|o| &o.table) {
        let covered = query(
            sql,
            &format!(
                "SELECT count(*) AS n FROM pg_publication_tables WHERE pubname = {pubname} AND schemaname = {} AND tablename = {}",
                quote_literal(&table.schema),
                quote_literal(&table.name)
            ),
        )
        .await?;
        if covered.first("n") == Some("0") {
            return Err(PipelineError::definite(publication_lacks_table(&s.publication, table)));
        }
    }
    // A partitioned outbox must be published through its root, or rows arrive under
    // partition names and would not be recognised as outbox rows.
    let via_root_missing = query(
        sql,
        &format!(
            "SELECT string_agg(n.nspname || '.' || c.relname, ', ') AS t FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             JOIN pg_publication p ON p.pubname = {pubname}
             WHERE c.relkind = 'p' AND NOT p.pubviaroot AND (n.nspname, c.relname) IN ({})",
            s.outboxes
                .iter()
                .map(|o| format!("({}, {})", quote_literal(&o.table.schema), quote_literal(&o.table.name)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    )
    .await?;
    if let Some(tables) = via_root_missing.first("t") {
        return Err(PipelineError::definite(format!(
            "publication \"{}\" publishes the partitioned table {tables} partition by partition: run ALTER PUBLICATION {} SET (publish_via_partition_root = true)",
            s.publication,
            quote_ident(&s.publication)
        )));
    }
    if r.first("alltables") == Some("true") {
        Ok(Publication::ReadyForAllTables)
    } else {
        Ok(Publication::Ready)
    }
}

/// The error for a publication that exists without the outbox table in it.
pub fn publication_lacks_table(publication: &str, table: &TableName) -> String {
    format!(
        "publication \"{publication}\" exists but does not include {table}: run ALTER PUBLICATION {} ADD TABLE {}, or choose another --publication",
        quote_ident(publication),
        table.quoted()
    )
}

/// Creates the publication when missing; checks an existing one publishes our inserts.
pub async fn ensure_publication(sql: &mut ReplicationClient, s: &Settings) -> Result<(), PipelineError> {
    match publication_state(sql, s).await? {
        Publication::Ready => return Ok(()),
        Publication::ReadyForAllTables => {
            tracing::warn!(publication = %s.publication, "publication is FOR ALL TABLES: every table's changes are decoded and sent, and only {} is published", s.table);
            return Ok(());
        }
        Publication::Missing => {}
    }
    let tables = s.outboxes.iter().map(|o| o.table.quoted()).collect::<Vec<_>>().join(", ");
    let create = format!(
        "CREATE PUBLICATION {} FOR TABLE {tables} WITH (publish = 'insert', publish_via_partition_root = true)",
        quote_ident(&s.publication),
    );
    sql.simple_query(&create).await.map_err(|e| {
        PipelineError::definite(format!(
            "cannot create publication \"{}\": {e}; create it as the table owner or a superuser with: {create}",
            s.publication
        ))
    })?;
    tracing::info!(publication = %s.publication, table = %s.table, "created publication");
    Ok(())
}

/// Our slot's row in pg_replication_slots, if it exists.
pub async fn slot_row(sql: &mut ReplicationClient, slot: &str) -> Result<Option<SlotRow>, PipelineError> {
    let r = query(
        sql,
        &format!(
            "SELECT plugin, slot_type, database, active_pid::text AS pid, wal_status, confirmed_flush_lsn::text AS confirmed \
             FROM pg_replication_slots WHERE slot_name = {}",
            quote_literal(slot)
        ),
    )
    .await?;
    if r.rows.is_empty() {
        return Ok(None);
    }
    Ok(Some(SlotRow {
        plugin: r.first("plugin").map(str::to_owned),
        slot_type: r.first("slot_type").unwrap_or("logical").to_owned(),
        database: r.first("database").map(str::to_owned),
        active_pid: r.first("pid").and_then(|p| p.parse().ok()),
        wal_status: r.first("wal_status").map(str::to_owned),
        confirmed_flush: r.first("confirmed").and_then(|l| l.parse().ok()),
    }))
}

/// Drops an inactive slot.
pub async fn drop_slot(sql: &mut ReplicationClient, slot: &str) -> Result<(), PipelineError> {
    query(sql, &format!("SELECT pg_drop_replication_slot({})", quote_literal(slot))).await?;
    tracing::info!(slot, "dropped replication slot");
    Ok(())
}

/// Checks an existing slot can be used by this instance now.
pub fn check_slot(row: &SlotRow, s: &Settings) -> Result<(), PipelineError> {
    let slot = &s.slot;
    if row.slot_type != "logical" || row.plugin.as_deref() != Some("pgoutput") {
        return Err(PipelineError::definite(format!(
            "replication slot \"{slot}\" exists but is a {} slot with plugin {}; walpost needs a logical pgoutput slot: drop it with SELECT pg_drop_replication_slot('{slot}') if nothing else uses it, or choose another --slot",
            row.slot_type,
            row.plugin.as_deref().unwrap_or("none")
        )));
    }
    if row.database.as_deref() != Some(s.postgres.dbname.as_str()) {
        return Err(PipelineError::definite(format!(
            "replication slot \"{slot}\" belongs to database {}, not {}: connect to that database or choose another --slot",
            row.database.as_deref().unwrap_or("?"),
            s.postgres.dbname
        )));
    }
    if row.wal_status.as_deref() == Some("lost") {
        return Err(PipelineError::definite(slot_lost_message(slot)));
    }
    if let Some(pid) = row.active_pid {
        return Err(PipelineError::transient(format!(
            "replication slot \"{slot}\" is in use by server process {pid} (another walpost instance?); waiting for it to be released"
        )));
    }
    Ok(())
}

/// The fatal error for an invalidated slot; quoted verbatim in the runbook.
pub fn slot_lost_message(slot: &str) -> String {
    format!(
        "replication slot \"{slot}\" was invalidated (wal_status = lost): PostgreSQL removed WAL it still needed, so events committed since its confirmed position may never reach Kafka; follow {SLOT_LOST_RUNBOOK}"
    )
}

/// The fatal error for an outbox table that stopped being streamed while walpost ran;
/// `why` is what the check found (the table is gone, or the publication check's own
/// error). Quoted verbatim in runbooks/outbox-recreated.md.
pub fn outbox_changed_message(why: &str) -> String {
    format!(
        "{why}; this changed while walpost was streaming, and rows written since then are not in the replication stream (the slot may be confirmed past them), so walpost stopped: put the table back in the publication, backfill its rows with `walpost run --snapshot initial_only`, then restart walpost; follow {OUTBOX_CHANGED_RUNBOOK}"
    )
}

/// The `why` of [`outbox_changed_message`] for a dropped table.
pub fn outbox_dropped(table: &TableName) -> String {
    format!("outbox table {table} no longer exists")
}
