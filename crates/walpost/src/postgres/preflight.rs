//! Start-up checks and idempotent setup on an ordinary SQL connection: wal_level, the
//! role's privileges, the outbox tables and their mapped columns, the publication and
//! the slot's state. Each failure is a definite [`PipelineError`] whose text names the
//! problem and the command that fixes it.

use replication::ReplicationClient;
use router::Router;

use super::catalog::{self, Publication, SlotRow};
use super::sql::{ident, query};
use crate::error::{ErrorKind, PipelineError};
use crate::settings::{Outbox, PostgresSettings, SourceSettings, TableName};

/// Checks everything that does not depend on the slot; creates the publication if missing.
pub(crate) async fn preflight(
    sql: &mut ReplicationClient,
    postgres: &PostgresSettings,
    source: &SourceSettings,
) -> Result<(), PipelineError> {
    check_wal_level(sql).await?;
    check_role(sql).await?;
    check_tables(sql, postgres, source).await?;
    check_emit_message_rights(sql, source).await?;
    check_signal_rights(sql, source).await?;
    ensure_publication(sql, postgres, source).await
}

/// With a signal table, whoever can INSERT into it can make walpost replay outbox rows:
/// refuses to run while PUBLIC, or a role outside `[signal] allowed_roles`, can
/// (superusers always can; walpost's own role is allowed), unless `[signal]
/// trust_all_roles = true`. A missing table is `check_tables`' to report.
pub(crate) async fn check_signal_rights(
    sql: &mut ReplicationClient,
    source: &SourceSettings,
) -> Result<(), PipelineError> {
    let Some(table) = &source.signal_table else { return Ok(()) };
    if source.signal_trust_all_roles {
        return Ok(());
    }
    let quoted = table.quoted();
    let r = sql
        .query(
            "SELECT pg_catalog.has_table_privilege('public', c.oid, 'INSERT')::text AS public,
                    (SELECT pg_catalog.string_agg(r.rolname, ', ' ORDER BY r.rolname) FROM pg_roles r
                     WHERE NOT r.rolsuper AND r.rolname <> current_user AND pg_catalog.left(r.rolname, 3) <> 'pg_'
                       AND pg_catalog.has_table_privilege(r.oid, c.oid, 'INSERT')) AS roles
             FROM pg_class c WHERE c.oid = pg_catalog.to_regclass($1)",
            &[Some(quoted.as_str())],
        )
        .await?;
    if r.first("public") == Some("true") {
        return Err(PipelineError::definite(ErrorKind::Privilege, texts::replay::signal_table_public(table, &quoted)));
    }
    let unexpected: Vec<&str> = r
        .first("roles")
        .unwrap_or_default()
        .split(", ")
        .filter(|role| !role.is_empty() && !source.signal_allowed_roles.iter().any(|a| a == role))
        .collect();
    if !unexpected.is_empty() {
        let idents: Vec<String> = unexpected.iter().map(|r| ident(r)).collect();
        let message = texts::replay::signal_table_roles(table, &quoted, &unexpected, &idents);
        return Err(PipelineError::definite(ErrorKind::Privilege, message));
    }
    Ok(())
}

/// With the table-less outbox (`[messages]`), whoever can execute
/// `pg_logical_emit_message` can publish events: refuses to run while PUBLIC, or a role
/// outside `[messages] allowed_roles`, can (superusers always can; walpost's own role
/// is allowed), unless `[messages] trust_all_roles = true`.
pub(crate) async fn check_emit_message_rights(
    sql: &mut ReplicationClient,
    source: &SourceSettings,
) -> Result<(), PipelineError> {
    let Some(m) = &source.messages else { return Ok(()) };
    if m.trust_all_roles {
        return Ok(());
    }
    let r = query(
        sql,
        "SELECT pg_catalog.string_agg(p.oid::regprocedure::text, '; ' ORDER BY p.oid) FILTER (WHERE pg_catalog.has_function_privilege('public', p.oid, 'EXECUTE')) AS public_fns,
                pg_catalog.string_agg(p.oid::regprocedure::text, '; ' ORDER BY p.oid) AS fns
         FROM pg_proc p WHERE p.proname = 'pg_logical_emit_message' AND p.pronamespace = 'pg_catalog'::regnamespace",
    )
    .await?;
    let fns = r.first("fns").unwrap_or("pg_logical_emit_message(boolean,text,text)").to_owned();
    let revoke =
        fns.split("; ").map(|f| format!("REVOKE EXECUTE ON FUNCTION {f} FROM PUBLIC;")).collect::<Vec<_>>().join(" ");
    let grant = fns
        .split("; ")
        .map(|f| format!("GRANT EXECUTE ON FUNCTION {f} TO <application role>;"))
        .collect::<Vec<_>>()
        .join(" ");
    if r.first("public_fns").is_some() {
        return Err(PipelineError::definite(ErrorKind::Privilege, format!(
            "pg_logical_emit_message is executable by PUBLIC, so with [messages] any role that can log in can publish events: as a superuser run {revoke} {grant} and list the application roles in [messages] allowed_roles (or set [messages] trust_all_roles = true to accept every role)"
        )));
    }
    let others = query(
        sql,
        "SELECT pg_catalog.string_agg(DISTINCT r.rolname, ', ' ORDER BY r.rolname) AS roles FROM pg_roles r JOIN pg_proc p
           ON p.proname = 'pg_logical_emit_message' AND p.pronamespace = 'pg_catalog'::regnamespace
         WHERE NOT r.rolsuper AND r.rolname <> current_user AND pg_catalog.left(r.rolname, 3) <> 'pg_'
           AND pg_catalog.has_function_privilege(r.oid, p.oid, 'EXECUTE')",
    )
    .await?;
    let unexpected: Vec<&str> = others
        .first("roles")
        .unwrap_or_default()
        .split(", ")
        .filter(|r| !r.is_empty() && !m.allowed_roles.iter().any(|a| a == r))
        .collect();
    if !unexpected.is_empty() {
        return Err(PipelineError::definite(ErrorKind::Privilege, format!(
            "roles {} can execute pg_logical_emit_message and so publish events through [messages], but are not in [messages] allowed_roles: add them there if they may, or REVOKE EXECUTE on {fns} from them",
            unexpected.join(", ")
        )));
    }
    Ok(())
}

pub(crate) async fn check_wal_level(sql: &mut ReplicationClient) -> Result<(), PipelineError> {
    let r = query(sql, "SHOW wal_level").await?;
    let level = r.first("wal_level").unwrap_or("unknown");
    if level != "logical" {
        return Err(PipelineError::definite(ErrorKind::Postgres, format!(
            "wal_level is '{level}' but walpost needs 'logical': run ALTER SYSTEM SET wal_level = logical (or set wal_level = logical in postgresql.conf) and restart PostgreSQL; a reload is not enough"
        )));
    }
    Ok(())
}

pub(crate) async fn check_role(sql: &mut ReplicationClient) -> Result<(), PipelineError> {
    let r = query(
        sql,
        "SELECT current_user AS name, rolsuper::text AS super, rolreplication::text AS repl FROM pg_roles WHERE rolname = current_user",
    )
    .await?;
    let name = r.first("name").unwrap_or("?").to_owned();
    if r.first("super") != Some("true") && r.first("repl") != Some("true") {
        return Err(PipelineError::definite(
            ErrorKind::Privilege,
            format!(
                "role \"{name}\" lacks the REPLICATION attribute: run ALTER ROLE {} WITH REPLICATION as a superuser",
                ident(&name)
            ),
        ));
    }
    Ok(())
}

/// Every outbox table exists and holds its mapped columns (checked with the router's
/// own column lookup, so the error is the one a Relation message would give).
pub(crate) async fn check_tables(
    sql: &mut ReplicationClient,
    postgres: &PostgresSettings,
    source: &SourceSettings,
) -> Result<(), PipelineError> {
    for outbox in &source.outboxes {
        check_outbox_table(sql, postgres, outbox).await?;
    }
    if let Some(table) = &source.signal_table {
        let columns = catalog::table_columns(sql, table).await?;
        let missing: Vec<&str> =
            ["id", "type", "data"].into_iter().filter(|c| !columns.iter().any(|col| col.0 == *c)).collect();
        if !missing.is_empty() {
            return Err(PipelineError::definite(ErrorKind::Config, format!(
                "signal table {table} {}: it needs Debezium's columns id, type and data, e.g. CREATE TABLE {} (id varchar(42) PRIMARY KEY, type varchar(32) NOT NULL, data varchar(2048))",
                if columns.is_empty() { "does not exist".to_owned() } else { format!("has no column {}", missing.join(", ")) },
                table.quoted()
            )));
        }
    }
    Ok(())
}

async fn check_outbox_table(
    sql: &mut ReplicationClient,
    postgres: &PostgresSettings,
    outbox: &Outbox,
) -> Result<(), PipelineError> {
    let table = &outbox.table;
    let columns = catalog::table_columns(sql, table).await?;
    if columns.is_empty() {
        return Err(PipelineError::definite(ErrorKind::Outbox, format!(
            "table {table} does not exist in database {}: run walpost migrate (migrations/outbox/) or pass --table schema.name",
            postgres.server.dbname
        )));
    }
    let relation = catalog::relation_of(table, columns);
    Router::new(outbox.router.clone())
        .and_then(|r| r.resolve(&relation))
        .map_err(|e| PipelineError::definite(ErrorKind::Config, e))?;
    Ok(())
}

/// Creates the publication when missing; checks an existing one publishes our inserts.
pub(crate) async fn ensure_publication(
    sql: &mut ReplicationClient,
    postgres: &PostgresSettings,
    source: &SourceSettings,
) -> Result<(), PipelineError> {
    let publication = &source.publication;
    match catalog::publication_state(sql, source).await? {
        Publication::Ready => return Ok(()),
        Publication::ReadyForAllTables => {
            tracing::warn!(publication = %publication, "publication is FOR ALL TABLES: every table's changes are decoded and sent, and only {} is published", source.table());
            return Ok(());
        }
        Publication::Missing => {}
    }
    let tables = source.published_tables().map(TableName::quoted).collect::<Vec<_>>().join(", ");
    let create = format!(
        "CREATE PUBLICATION {} FOR TABLE {tables} WITH (publish = 'insert', publish_via_partition_root = true)",
        ident(publication),
    );
    if super::topology::on_a_standby(postgres, sql).await? {
        return create_on_the_primary(sql, postgres, source, &create).await;
    }
    sql.simple_query(&create).await.map_err(|e| {
        PipelineError::definite(ErrorKind::Privilege, format!(
            "cannot create publication \"{publication}\": {e}; create it as the table owner or a superuser with: {create}"
        ))
        .caused_by(e)
    })?;
    tracing::info!(publication = %publication, table = %source.table(), "created publication");
    Ok(())
}

/// Decoding on a standby: a publication is catalog data, so it is made on the primary
/// and read on the standby once replayed there (waited for, up to [`REPLAY_WAIT`]).
async fn create_on_the_primary(
    standby: &mut ReplicationClient,
    postgres: &PostgresSettings,
    source: &SourceSettings,
    create: &str,
) -> Result<(), PipelineError> {
    let publication = &source.publication;
    let mut primary = super::topology::connect_writer(postgres).await.map_err(|e| {
        PipelineError::transient(
            ErrorKind::Postgres,
            texts::standby::publication_needs_the_primary(publication, &e.to_string(), create),
        )
    })?;
    let created = async {
        primary.simple_query(create).await.map_err(|e| {
            PipelineError::definite(ErrorKind::Privilege, format!(
                "cannot create publication \"{publication}\" on the primary: {e}; create it there as the table owner or a superuser with: {create}"
            ))
            .caused_by(e)
        })?;
        let r = query(&mut primary, "SELECT pg_catalog.pg_current_wal_insert_lsn()::text AS lsn").await?;
        Ok::<_, PipelineError>(r.first("lsn").unwrap_or("0/0").to_owned())
    }
    .await;
    primary.close().await;
    let lsn = created?;
    let wait = "SELECT (pg_catalog.pg_last_wal_replay_lsn() >= $1::pg_lsn)::text AS done";
    let deadline = std::time::Instant::now() + REPLAY_WAIT;
    while standby.query(wait, &[Some(lsn.as_str())]).await?.first("done") != Some("true") {
        if std::time::Instant::now() >= deadline {
            return Err(PipelineError::transient(ErrorKind::Postgres, format!(
                "created publication \"{publication}\" on the primary, but the standby has not replayed it within {REPLAY_WAIT:?}: check the standby's replication"
            )));
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    tracing::info!(publication = %publication, table = %source.table(), "created publication on the primary");
    Ok(())
}

/// How long a publication walpost created on the primary may take to reach the standby.
const REPLAY_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Checks an existing slot can be used by this instance now.
pub(crate) fn check_slot(
    row: &SlotRow,
    postgres: &PostgresSettings,
    source: &SourceSettings,
) -> Result<(), PipelineError> {
    let slot = &source.slot;
    if row.slot_type != "logical" || row.plugin.as_deref() != Some("pgoutput") {
        return Err(PipelineError::definite(ErrorKind::Slot, format!(
            "replication slot \"{slot}\" exists but is a {} slot with plugin {}; walpost needs a logical pgoutput slot: drop it with SELECT pg_drop_replication_slot('{slot}') if nothing else uses it, or choose another --slot",
            row.slot_type,
            row.plugin.as_deref().unwrap_or("none")
        )));
    }
    if row.database.as_deref() != Some(postgres.server.dbname.as_str()) {
        return Err(PipelineError::definite(ErrorKind::Slot, format!(
            "replication slot \"{slot}\" belongs to database {}, not {}: connect to that database or choose another --slot",
            row.database.as_deref().unwrap_or("?"),
            postgres.server.dbname
        )));
    }
    if row.is_conflicted() {
        return Err(PipelineError::definite(
            ErrorKind::Slot,
            texts::slot::conflicted(slot, row.invalidation_reason.as_deref()),
        ));
    }
    if row.wal_status.as_deref() == Some("lost") {
        return Err(PipelineError::definite(ErrorKind::Slot, texts::slot::lost(slot)));
    }
    if let Some(pid) = row.active_pid {
        return Err(PipelineError::waiting(ErrorKind::Slot, texts::slot::in_use(slot, pid)));
    }
    Ok(())
}
