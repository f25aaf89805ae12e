//! Catalog queries: the slot's row, the publication's state, an outbox table's columns.
//! Read-only; each returns what it found and leaves judging it to the caller.

use bytes::Bytes;
use pgoutput::{Column, Lsn, Relation};
use replication::ReplicationClient;

use super::messages;
use super::sql::{ident, literal, query};
use crate::error::{ErrorKind, PipelineError};
use crate::settings::{Settings, TableName};

/// A catalog value: NULL (or no row) is `None`; text that does not parse as `T` is a
/// definite error naming the column, never a silent `None`: PostgreSQL wrote it, so it
/// means a server (or a proxy in front of it) walpost does not understand, or one of
/// walpost's own rows edited by hand.
pub(crate) fn parsed<T: std::str::FromStr>(
    value: Option<&str>,
    column: &str,
    what: &str,
) -> Result<Option<T>, PipelineError> {
    match value {
        None => Ok(None),
        Some(text) => text.trim().parse().map(Some).map_err(|_| {
            PipelineError::definite(ErrorKind::Postgres, format!(
                "PostgreSQL returned a {column} that is not {what}; walpost cannot go on with it (a server or proxy walpost does not understand, or a row edited by hand)"
            ))
        }),
    }
}

/// What pg_replication_slots says about our slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SlotRow {
    pub plugin: Option<String>,
    pub slot_type: String,
    pub database: Option<String>,
    pub active_pid: Option<i32>,
    pub wal_status: Option<String>,
    pub confirmed_flush: Option<Lsn>,
    /// PostgreSQL 16+: a recovery conflict invalidated this slot on a standby.
    pub conflicting: bool,
    /// PostgreSQL 17+: why the slot was invalidated.
    pub invalidation_reason: Option<String>,
}

impl SlotRow {
    /// Invalidated by a recovery conflict on a standby ([`invalidated_by_conflict`]).
    pub(crate) fn is_conflicted(&self) -> bool {
        invalidated_by_conflict(self.conflicting, self.invalidation_reason.as_deref())
    }
}

/// Whether a slot's `conflicting` (PostgreSQL 16+) and `invalidation_reason` (17+) say a
/// recovery conflict on a standby invalidated it: the primary removed catalog rows the slot
/// needs, or lowered wal_level. Such a slot can never be read again.
pub(crate) fn invalidated_by_conflict(conflicting: bool, invalidation_reason: Option<&str>) -> bool {
    conflicting || invalidation_reason.is_some_and(|r| r == "rows_removed" || r == "wal_level_insufficient")
}

/// Our slot's row in pg_replication_slots, if it exists.
pub(crate) async fn slot_row(sql: &mut ReplicationClient, slot: &str) -> Result<Option<SlotRow>, PipelineError> {
    let r = query(
        sql,
        &format!(
            "SELECT plugin, slot_type, database, active_pid::text AS pid, wal_status, confirmed_flush_lsn::text AS confirmed, \
             pg_catalog.to_jsonb(s) ->> 'conflicting' AS conflicting, pg_catalog.to_jsonb(s) ->> 'invalidation_reason' AS invalidation_reason \
             FROM pg_replication_slots s WHERE slot_name = {}",
            literal(slot)
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
        active_pid: parsed(r.first("pid"), "pg_replication_slots.active_pid", "a process id")?,
        wal_status: r.first("wal_status").map(str::to_owned),
        confirmed_flush: parsed(r.first("confirmed"), "pg_replication_slots.confirmed_flush_lsn", "an LSN")?,
        conflicting: r.first("conflicting") == Some("true"),
        invalidation_reason: r.first("invalidation_reason").map(str::to_owned),
    }))
}

/// Drops an inactive slot.
pub(crate) async fn drop_slot(sql: &mut ReplicationClient, slot: &str) -> Result<(), PipelineError> {
    query(sql, &format!("SELECT pg_catalog.pg_drop_replication_slot({})", literal(slot))).await?;
    tracing::info!(slot, "dropped replication slot");
    Ok(())
}

/// A column as a Relation message describes it: name, type oid, type modifier.
pub(crate) type ColumnDescription = (String, u32, i32);

/// The columns of a table, in order; empty when it does not exist.
pub(crate) async fn table_columns(
    sql: &mut ReplicationClient,
    table: &TableName,
) -> Result<Vec<ColumnDescription>, PipelineError> {
    let r = query(
        sql,
        &format!(
            "SELECT a.attname, a.atttypid::text, a.atttypmod::text FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid \
             JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = {} AND c.relname = {} AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            literal(&table.schema),
            literal(&table.name)
        ),
    )
    .await?;
    let mut columns = Vec::with_capacity(r.rows.len());
    for i in 0..r.rows.len() {
        let Some(name) = r.text(i, 0) else { continue };
        let type_oid = parsed(r.text(i, 1), "pg_attribute.atttypid", "a type oid")?.unwrap_or(0);
        let type_modifier = parsed(r.text(i, 2), "pg_attribute.atttypmod", "a type modifier")?.unwrap_or(-1);
        columns.push((name.to_owned(), type_oid, type_modifier));
    }
    Ok(columns)
}

/// A Relation message's equivalent for a table described by the catalog or a row
/// description: so checks and snapshots resolve columns exactly as streaming does.
pub(crate) fn relation_of(table: &TableName, columns: impl IntoIterator<Item = ColumnDescription>) -> Relation {
    Relation {
        xid: None,
        oid: 0,
        namespace: Bytes::from(table.schema.clone()),
        name: Bytes::from(table.name.clone()),
        replica_identity: b'd',
        columns: columns
            .into_iter()
            .map(|(name, type_oid, type_modifier)| Column {
                flags: 0,
                name: Bytes::from(name),
                type_oid,
                type_modifier,
            })
            .collect(),
    }
}

/// Whether the publication exists (and, if it does, publishes our inserts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Publication {
    Missing,
    Ready,
    /// Ready, but FOR ALL TABLES: every table's changes are decoded and sent.
    ReadyForAllTables,
}

/// Checks an existing publication publishes inserts of every outbox table through the
/// partition root; read-only. A publication that exists but does not is a definite error.
pub(crate) async fn publication_state(sql: &mut ReplicationClient, s: &Settings) -> Result<Publication, PipelineError> {
    let publication = &s.source.publication;
    let pubname = literal(publication);
    let r = query(
        sql,
        &format!("SELECT pubinsert::text AS ins, puballtables::text AS alltables FROM pg_publication WHERE pubname = {pubname}"),
    )
    .await?;
    if r.rows.is_empty() {
        return Ok(Publication::Missing);
    }
    if r.first("ins") != Some("true") {
        return Err(PipelineError::definite(
            ErrorKind::Outbox,
            format!(
            "publication \"{publication}\" does not publish inserts: run ALTER PUBLICATION {} SET (publish = 'insert')",
            ident(publication)
        ),
        ));
    }
    for table in s.source.published_tables() {
        let covered = query(
            sql,
            &format!(
                "SELECT pg_catalog.count(*) AS n FROM pg_publication_tables WHERE pubname = {pubname} AND schemaname = {} AND tablename = {}",
                literal(&table.schema),
                literal(&table.name)
            ),
        )
        .await?;
        if covered.first("n") == Some("0") {
            return Err(PipelineError::definite(
                ErrorKind::Outbox,
                messages::publication_lacks_table(publication, table),
            ));
        }
    }
    // A partitioned outbox must be published through its root, or rows arrive under
    // partition names and would not be recognised as outbox rows.
    let via_root_missing = query(
        sql,
        &format!(
            "SELECT pg_catalog.string_agg(n.nspname || '.' || c.relname, ', ') AS t FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             JOIN pg_publication p ON p.pubname = {pubname}
             WHERE c.relkind = 'p' AND NOT p.pubviaroot AND (n.nspname, c.relname) IN ({})",
            s.source
                .outboxes
                .iter()
                .map(|o| format!("({}, {})", literal(&o.table.schema), literal(&o.table.name)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    )
    .await?;
    if let Some(tables) = via_root_missing.first("t") {
        return Err(PipelineError::definite(ErrorKind::Outbox, format!(
            "publication \"{publication}\" publishes the partitioned table {tables} partition by partition: run ALTER PUBLICATION {} SET (publish_via_partition_root = true)",
            ident(publication)
        )));
    }
    if r.first("alltables") == Some("true") {
        Ok(Publication::ReadyForAllTables)
    } else {
        Ok(Publication::Ready)
    }
}

/// The end of the server's WAL now: the insert position on a primary, the position
/// received from the primary on a standby.
pub(crate) async fn wal_end(sql: &mut ReplicationClient) -> Result<Lsn, PipelineError> {
    let r = sql
        .simple_query(
            "SELECT CASE WHEN pg_catalog.pg_is_in_recovery() THEN pg_catalog.pg_last_wal_receive_lsn() ELSE pg_catalog.pg_current_wal_insert_lsn() END::text AS lsn",
        )
        .await?;
    let text = r.first("lsn").unwrap_or_default();
    text.parse::<Lsn>().map_err(|_| {
        PipelineError::definite(
            ErrorKind::Postgres,
            format!("the server reported its WAL position as '{text}', which is not an LSN"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: a malformed catalog value was `.parse().ok()`, so `None`, as if the
    /// column were NULL: an unreadable confirmed position read as "no position".
    #[test]
    fn regression_a_malformed_catalog_value_is_an_error_not_none() {
        assert_eq!(parsed::<Lsn>(Some("16/B374D848"), "c", "an LSN").unwrap(), Some(Lsn(0x16_B374_D848)));
        assert_eq!(parsed::<i32>(None, "c", "a process id").unwrap(), None);
        let e = parsed::<Lsn>(Some("16-B374"), "pg_replication_slots.confirmed_flush_lsn", "an LSN").unwrap_err();
        assert!(!e.is_transient(), "{e}");
        assert!(e.to_string().contains("pg_replication_slots.confirmed_flush_lsn that is not an LSN"), "{e}");
        assert!(!e.to_string().contains("16-B374"), "the value is not shown: {e}");
    }
}
