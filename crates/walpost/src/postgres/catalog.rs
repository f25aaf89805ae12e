//! Catalog queries: the slot's row, the publication's state, an outbox table's columns.
//! Read-only; each returns what it found and leaves judging it to the caller.

use bytes::Bytes;
use pgoutput::{Column, Lsn, Relation};
use replication::ReplicationClient;

use super::sql::ident;
use crate::error::{ErrorKind, PipelineError};
use crate::settings::{SourceSettings, TableName};

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

pub(crate) use slot_alarm::invalidated_by_conflict;

/// Our slot's row in pg_replication_slots, if it exists.
pub(crate) async fn slot_row(sql: &mut ReplicationClient, slot: &str) -> Result<Option<SlotRow>, PipelineError> {
    let r = sql
        .query(
            "SELECT plugin, slot_type, database, active_pid::text AS pid, wal_status, confirmed_flush_lsn::text AS confirmed, \
             pg_catalog.to_jsonb(s) ->> 'conflicting' AS conflicting, pg_catalog.to_jsonb(s) ->> 'invalidation_reason' AS invalidation_reason \
             FROM pg_replication_slots s WHERE slot_name = $1",
            &[Some(slot)],
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

/// The server process streaming from a slot, and where its client connects from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SlotHolder {
    pub pid: i32,
    /// `client_addr:client_port` (or `local` for a Unix socket); `None` when the
    /// server does not show it to this role (another role's connection: its client_port
    /// is NULL, while a Unix socket's is -1).
    pub client: Option<String>,
}

/// Who streams from `slot` (`None`: nobody, or no such slot). Reads the server's slots in
/// shared memory, cheap enough for a hot standby to ask twice a second.
pub(crate) async fn slot_holder(sql: &mut ReplicationClient, slot: &str) -> Result<Option<SlotHolder>, PipelineError> {
    let r = sql
        .query(
            "SELECT s.active_pid::text AS pid, \
             CASE WHEN r.client_port IS NULL THEN NULL WHEN r.client_port = -1 THEN 'local' \
             ELSE pg_catalog.host(r.client_addr) || ':' || r.client_port::text END AS client \
             FROM pg_catalog.pg_replication_slots s LEFT JOIN pg_catalog.pg_stat_replication r ON r.pid = s.active_pid \
             WHERE s.slot_name = $1 AND s.active_pid IS NOT NULL",
            &[Some(slot)],
        )
        .await?;
    let Some(pid) = parsed(r.first("pid"), "pg_replication_slots.active_pid", "a process id")? else {
        return Ok(None);
    };
    Ok(Some(SlotHolder { pid, client: r.first("client").map(str::to_owned) }))
}

/// Drops an inactive slot.
pub(crate) async fn drop_slot(sql: &mut ReplicationClient, slot: &str) -> Result<(), PipelineError> {
    sql.query("SELECT pg_catalog.pg_drop_replication_slot($1)", &[Some(slot)]).await?;
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
    let r = sql
        .query(
            "SELECT a.attname, a.atttypid::text, a.atttypmod::text FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid \
             JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            &[Some(table.schema.as_str()), Some(table.name.as_str())],
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
pub(crate) async fn publication_state(
    sql: &mut ReplicationClient,
    source: &SourceSettings,
) -> Result<Publication, PipelineError> {
    let publication = &source.publication;
    let pubname = Some(publication.as_str());
    let r = sql
        .query(
            "SELECT pubinsert::text AS ins, puballtables::text AS alltables FROM pg_publication WHERE pubname = $1",
            &[pubname],
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
    for table in source.published_tables() {
        let covered = sql
            .query(
                "SELECT pg_catalog.count(*) AS n FROM pg_publication_tables WHERE pubname = $1 AND schemaname = $2 AND tablename = $3",
                &[pubname, Some(table.schema.as_str()), Some(table.name.as_str())],
            )
            .await?;
        if covered.first("n") == Some("0") {
            return Err(PipelineError::definite(
                ErrorKind::Outbox,
                texts::outbox::publication_lacks_table(publication, table, &ident(publication), &table.quoted()),
            ));
        }
    }
    // A partitioned outbox must be published through its root, or rows arrive under
    // partition names and would not be recognised as outbox rows.
    let mut via_root_missing = Vec::new();
    for outbox in &source.outboxes {
        let r = sql
            .query(
                "SELECT n.nspname || '.' || c.relname AS t FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 JOIN pg_publication p ON p.pubname = $1 \
                 WHERE c.relkind = 'p' AND NOT p.pubviaroot AND n.nspname = $2 AND c.relname = $3",
                &[pubname, Some(outbox.table.schema.as_str()), Some(outbox.table.name.as_str())],
            )
            .await?;
        via_root_missing.extend(r.first("t").map(str::to_owned));
    }
    if !via_root_missing.is_empty() {
        let tables = via_root_missing.join(", ");
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

// What `walpost check` reads; `ops::check*` judge it.

/// A server limit `walpost check` compares with what is in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Capacity {
    /// `max_replication_slots` against `pg_replication_slots`.
    Slots,
    /// `max_wal_senders` against `pg_stat_replication`.
    Senders,
}

impl Capacity {
    /// The setting that limits it.
    pub(crate) fn setting(self) -> &'static str {
        match self {
            Capacity::Slots => "max_replication_slots",
            Capacity::Senders => "max_wal_senders",
        }
    }
}

/// How much of `capacity` is in use; `None` when it cannot be read.
pub(crate) async fn in_use(sql: &mut ReplicationClient, capacity: Capacity) -> Option<i64> {
    let text = match capacity {
        Capacity::Slots => "SELECT pg_catalog.count(*) AS n FROM pg_replication_slots",
        Capacity::Senders => "SELECT pg_catalog.count(*) AS n FROM pg_stat_replication",
    };
    sql.query(text, &[]).await.ok().and_then(|r| r.first("n").and_then(|n| n.parse().ok()))
}

/// Whether the role may read `table` (USAGE on its schema and SELECT on it); `None` when
/// there is no such table. Asked by oid, so it works without USAGE on the schema.
pub(crate) async fn may_select(sql: &mut ReplicationClient, table: &TableName) -> Result<Option<bool>, PipelineError> {
    let r = sql
        .query(
            "SELECT (pg_catalog.has_schema_privilege(n.oid, 'USAGE') AND pg_catalog.has_table_privilege(c.oid, 'SELECT'))::text AS ok
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2",
            &[Some(table.schema.as_str()), Some(table.name.as_str())],
        )
        .await?;
    Ok((!r.rows.is_empty()).then(|| r.first("ok") == Some("true")))
}

/// Whether the role may read and update the table `regclass` names (`None`: no answer);
/// false when it does not exist.
pub(crate) async fn may_select_and_update(sql: &mut ReplicationClient, regclass: &str) -> Option<bool> {
    sql.query(
        "SELECT (pg_catalog.to_regclass($1) IS NOT NULL AND pg_catalog.has_table_privilege(pg_catalog.to_regclass($1), 'SELECT, UPDATE'))::text AS ok",
        &[Some(regclass)],
    )
    .await
    .ok()
    .and_then(|r| r.first("ok").map(|v| v == "true"))
}

/// A size as PostgreSQL writes it in settings (`10GB`, `512kB`) in bytes.
pub(crate) async fn size_bytes(sql: &mut ReplicationClient, size: &str) -> Option<u64> {
    sql.query("SELECT pg_catalog.pg_size_bytes($1)::text AS b", &[Some(size)])
        .await
        .ok()
        .and_then(|r| r.first("b").and_then(|b| b.parse().ok()))
}

/// Whether the role sees `xact_start` of every role's sessions in pg_stat_activity.
pub(crate) async fn sees_every_session(sql: &mut ReplicationClient) -> Option<bool> {
    sql.query(
        "SELECT (pg_catalog.pg_has_role(current_user, 'pg_read_all_stats', 'USAGE')
                 OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user))::text AS ok",
        &[],
    )
    .await
    .ok()
    .and_then(|r| r.first("ok").map(|v| v == "true"))
}

/// The settings of a server walpost decodes on, as it reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RecoverySettings {
    /// `server_version_num`.
    pub version_num: u32,
    pub in_recovery: bool,
    pub hot_standby_feedback: bool,
    pub primary_slot_name: String,
    /// As SHOW prints it (`30s`, `-1`).
    pub max_standby_streaming_delay: String,
}

/// Reads [`RecoverySettings`].
pub(crate) async fn recovery_settings(sql: &mut ReplicationClient) -> Result<RecoverySettings, PipelineError> {
    let r = sql
        .query(
            "SELECT pg_catalog.current_setting('server_version_num') AS v, pg_catalog.pg_is_in_recovery()::text AS r,
                    pg_catalog.current_setting('hot_standby_feedback') AS f, pg_catalog.current_setting('primary_slot_name') AS p,
                    pg_catalog.current_setting('max_standby_streaming_delay') AS d",
            &[],
        )
        .await?;
    let get = |c: &str| r.first(c).unwrap_or_default().to_owned();
    Ok(RecoverySettings {
        version_num: get("v").parse().unwrap_or(0),
        in_recovery: get("r") == "true",
        hot_standby_feedback: get("f") == "on",
        primary_slot_name: get("p"),
        max_standby_streaming_delay: get("d"),
    })
}

/// What a primary offers a standby that decodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PrimaryForStandby {
    pub wal_level: String,
    /// The standby's physical slot exists on the primary.
    pub physical_slot: bool,
    pub may_log_standby_snapshot: bool,
}

/// Asks the primary (`primary`) about the standby whose `primary_slot_name` is `slot`.
pub(crate) async fn primary_for_standby(
    primary: &mut ReplicationClient,
    slot: &str,
) -> Result<PrimaryForStandby, PipelineError> {
    let r = primary
        .query(
            "SELECT pg_catalog.current_setting('wal_level') AS w,
                    EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_type = 'physical' AND slot_name = $1)::text AS slot,
                    coalesce(pg_catalog.has_function_privilege('pg_catalog.pg_log_standby_snapshot()', 'EXECUTE'), false)::text AS log",
            &[Some(slot)],
        )
        .await?;
    Ok(PrimaryForStandby {
        wal_level: r.first("w").unwrap_or_default().to_owned(),
        physical_slot: r.first("slot") == Some("true"),
        may_log_standby_snapshot: r.first("log") == Some("true"),
    })
}

/// What tells a managed PostgreSQL service apart: its own settings and roles.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ServiceMarkers {
    /// Setting names with a dot (extension and service settings).
    pub settings: Vec<String>,
    pub roles: Vec<String>,
    pub aurora_version: bool,
}

/// Reads the [`ServiceMarkers`] and `wal_level`.
pub(crate) async fn service_markers(sql: &mut ReplicationClient) -> Result<(ServiceMarkers, String), PipelineError> {
    let r = sql
        .query(
            "SELECT (SELECT pg_catalog.string_agg(name, ',') FROM (
                       SELECT name FROM pg_settings WHERE name ~ '^(rds|cloudsql|alloydb|azure|neon|supautils)\\.'
                       UNION SELECT n FROM pg_catalog.unnest(ARRAY['rds.extensions', 'rds.logical_replication',
                           'cloudsql.logical_decoding', 'cloudsql.iam_authentication', 'alloydb.logical_decoding',
                           'azure.extensions', 'neon.timeline_id', 'neon.tenant_id', 'neon.endpoint_id',
                           'supautils.privileged_extensions']) AS n WHERE pg_catalog.current_setting(n, true) IS NOT NULL) s) AS settings,
                    (SELECT pg_catalog.string_agg(rolname, ',') FROM pg_roles
                     WHERE rolname IN ('rds_superuser', 'cloudsqlsuperuser', 'alloydbsuperuser', 'azure_pg_admin',
                                       'neon_superuser', 'supabase_admin')) AS roles,
                    EXISTS (SELECT 1 FROM pg_proc WHERE proname = 'aurora_version')::text AS aurora,
                    pg_catalog.current_setting('wal_level') AS wal_level",
            &[],
        )
        .await?;
    let list = |c: &str| r.first(c).map(|v| v.split(',').map(str::to_owned).collect()).unwrap_or_default();
    let markers = ServiceMarkers {
        settings: list("settings"),
        roles: list("roles"),
        aurora_version: r.first("aurora") == Some("true"),
    };
    Ok((markers, r.first("wal_level").unwrap_or_default().to_owned()))
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
