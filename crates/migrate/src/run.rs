//! The runner: reads a schema's record and catalog, and applies what the plan says, each
//! migration in its own transaction, under a lock.
//!
//! Invariants:
//! - one runner per schema at a time: a session-level advisory lock on the schema's name,
//!   held from before the record is read until after the last COMMIT; a second runner
//!   waits for it, then reads a record that holds everything and applies nothing;
//! - a migration and its row in `<schema>.walpost_migrations` commit together: a
//!   migration is recorded if and only if it was applied (or found in place);
//! - a file edited after it was applied stops the runner before it applies anything;
//! - every migration runs with `search_path = <schema>, pg_temp`: what it creates goes
//!   into the schema, and pg_catalog (not named) is searched before it, so no object of
//!   another schema is bound to.

use replication::{quote_ident, validate_identifier, QueryResult, ReplicationClient};

use crate::error::Error;
use crate::files::{Migration, Set, WALPOST_SLOTS};
use crate::plan::{plan, Catalog, Plan, Recorded, State};

/// The record's table, in each migrated schema.
pub const RECORD_TABLE: &str = "walpost_migrations";

/// The first key of the runner's advisory locks ("wpmg"): the second is the schema name's
/// hash, so runners on different schemas do not wait for each other.
const LOCK_CLASS: &str = "2003856743";

/// Where the migrations of `set` stand in `schema`: one entry per file, and the record's
/// rows no file has. Changes nothing, takes no lock.
pub async fn status(sql: &mut ReplicationClient, set: Set, schema: &str) -> Result<Plan, Error> {
    validate_identifier("schema", schema)?;
    read(sql, set, schema).await
}

/// Applies the pending migrations of `set` to `schema` (created if missing), each in its
/// own transaction, and records them; records without running them the ones a database
/// migrated by hand holds already. Returns the plan it followed. `dry_run`: only the
/// plan, nothing changed (and no lock taken).
///
/// `Err(Error::Changed)` (nothing applied) when an applied migration's file changed.
pub async fn migrate(sql: &mut ReplicationClient, set: Set, schema: &str, dry_run: bool) -> Result<Plan, Error> {
    validate_identifier("schema", schema)?;
    if dry_run {
        let plan = read(sql, set, schema).await?;
        refuse_changed(set, schema, &plan)?;
        return Ok(plan);
    }
    lock(sql, schema).await?;
    let result = apply(sql, set, schema).await;
    // A connection that broke took the lock with it.
    let _ = sql
        .query("SELECT pg_catalog.pg_advisory_unlock($1::integer, pg_catalog.hashtext($2))", &lock_key(schema))
        .await;
    result
}

/// Creates the slots' lineage table in `schema` with the outbox's migration 0003 (not
/// recorded: walpost keeps the table beside its outbox, whose schema need not be the
/// migrations'), for a role that may create it there.
pub async fn create_walpost_slots(sql: &mut ReplicationClient, schema: &str) -> Result<(), Error> {
    validate_identifier("schema", schema)?;
    let file = &Set::Outbox.migrations()[WALPOST_SLOTS];
    transaction(sql, schema, file, None).await.map_err(|source| Error::Failed {
        file: format!("{}/{}", Set::Outbox.folder(), file.name),
        schema: schema.to_owned(),
        source: Box::new(source),
    })
}

/// Under the lock: the plan, then the record's table (with what was found in place), then
/// each pending migration.
async fn apply(sql: &mut ReplicationClient, set: Set, schema: &str) -> Result<Plan, Error> {
    let plan = read(sql, set, schema).await?;
    refuse_changed(set, schema, &plan)?;
    for r in &plan.unknown {
        tracing::warn!(
            schema,
            version = r.version,
            "schema {schema} records migration {} ({}), which this walpost does not have: it was applied by a newer walpost",
            r.version,
            r.name
        );
    }
    if !plan.recorded {
        create_record(sql, set, schema, &plan).await?;
    }
    for entry in plan.pending() {
        let Some(file) = set.migrations().iter().find(|m| m.version == entry.version) else { continue };
        let started = std::time::Instant::now();
        transaction(sql, schema, file, Some(&entry.checksum)).await.map_err(|source| Error::Failed {
            file: format!("{}/{}", set.folder(), file.name),
            schema: schema.to_owned(),
            source: Box::new(source),
        })?;
        tracing::info!(schema, "applied {}/{} in {} ms", set.folder(), file.name, started.elapsed().as_millis());
    }
    Ok(plan)
}

/// Stops with every changed file named.
fn refuse_changed(set: Set, schema: &str, plan: &Plan) -> Result<(), Error> {
    let files: Vec<(String, String, String)> = plan
        .changed()
        .filter_map(|e| match &e.state {
            State::Changed { recorded_name, recorded_checksum } => Some((
                format!("{}/{}", set.folder(), e.name),
                format!("{recorded_name} with sha256 {recorded_checksum}"),
                e.checksum.clone(),
            )),
            _ => None,
        })
        .collect();
    if files.is_empty() {
        return Ok(());
    }
    Err(Error::Changed { schema: schema.to_owned(), files })
}

/// The session lock of the schema's runners; says so when it has to wait.
async fn lock(sql: &mut ReplicationClient, schema: &str) -> Result<(), Error> {
    let key = lock_key(schema);
    let failed =
        |source| Error::Sql { doing: "take the migration lock", schema: schema.to_owned(), source: Box::new(source) };
    let r = sql
        .query("SELECT pg_catalog.pg_try_advisory_lock($1::integer, pg_catalog.hashtext($2)) AS locked", &key)
        .await
        .map_err(failed)?;
    if r.first("locked") == Some("t") {
        return Ok(());
    }
    tracing::info!(schema, "another walpost migrate is migrating schema {schema}: waiting for its lock");
    sql.query("SELECT pg_catalog.pg_advisory_lock($1::integer, pg_catalog.hashtext($2))", &key)
        .await
        .map_err(failed)?;
    Ok(())
}

fn lock_key(schema: &str) -> [Option<&str>; 2] {
    [Some(LOCK_CLASS), Some(schema)]
}

/// The plan from the schema's catalog and record.
async fn read(sql: &mut ReplicationClient, set: Set, schema: &str) -> Result<Plan, Error> {
    let failed = |source| Error::Sql {
        doing: "read the applied migrations",
        schema: schema.to_owned(),
        source: Box::new(source),
    };
    let relations = sql
        .query(
            "SELECT c.relname, c.relkind::text, a.attname \
             FROM pg_catalog.pg_class c \
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             LEFT JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped \
             WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'v') AND NOT c.relispartition",
            &[Some(schema)],
        )
        .await
        .map_err(failed)?;
    let functions = sql
        .query(
            "SELECT p.proname FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace \
             WHERE n.nspname = $1",
            &[Some(schema)],
        )
        .await
        .map_err(failed)?;
    let catalog = catalog_of(&relations, &functions);
    let recorded = match catalog.relations.contains_key(RECORD_TABLE) {
        false => None,
        true => {
            let text = format!(
                "SELECT version, name, checksum, applied_at::text FROM {}.{RECORD_TABLE} ORDER BY version",
                quote_ident(schema)
            );
            let rows = sql.query(&text, &[]).await.map_err(failed)?;
            Some(records_of(&rows))
        }
    };
    Ok(plan(set.migrations(), recorded.as_deref(), &catalog))
}

fn catalog_of(relations: &QueryResult, functions: &QueryResult) -> Catalog {
    let mut catalog = Catalog::default();
    for i in 0..relations.rows.len() {
        let (Some(name), Some(kind)) = (relations.text(i, 0), relations.text(i, 1)) else { continue };
        let entry = catalog
            .relations
            .entry(name.to_owned())
            .or_insert_with(|| (kind.chars().next().unwrap_or('?'), Default::default()));
        if let Some(column) = relations.text(i, 2) {
            entry.1.insert(column.to_owned());
        }
    }
    catalog.functions = (0..functions.rows.len()).filter_map(|i| functions.text(i, 0)).map(str::to_owned).collect();
    catalog
}

/// The record's rows; a row walpost cannot read (a version that is no number) is left
/// out, and its migration then counts as pending.
fn records_of(rows: &QueryResult) -> Vec<Recorded> {
    (0..rows.rows.len())
        .filter_map(|i| {
            Some(Recorded {
                version: rows.text(i, 0)?.parse().ok()?,
                name: rows.text(i, 1)?.to_owned(),
                checksum: rows.text(i, 2)?.to_owned(),
                applied_at: rows.text(i, 3).unwrap_or_default().to_owned(),
            })
        })
        .collect()
}

/// The schema (when missing) and its record's table, with a row for each migration found
/// in place, in one transaction.
async fn create_record(sql: &mut ReplicationClient, set: Set, schema: &str, plan: &Plan) -> Result<(), Error> {
    let failed = |source| Error::Sql {
        doing: "create the record of applied migrations",
        schema: schema.to_owned(),
        source: Box::new(source),
    };
    let q = quote_ident(schema);
    let result: Result<(), replication::Error> = async {
        sql.simple_query("BEGIN").await?;
        // CREATE SCHEMA IF NOT EXISTS needs CREATE on the database even when the schema
        // exists: asked only when it does not.
        let exists = sql
            .query("SELECT EXISTS (SELECT FROM pg_catalog.pg_namespace WHERE nspname = $1) AS present", &[Some(schema)])
            .await?;
        if exists.first("present") != Some("t") {
            sql.simple_query(&format!("CREATE SCHEMA {q}")).await?;
        }
        sql.simple_query(&format!(
            "CREATE TABLE IF NOT EXISTS {q}.{RECORD_TABLE} (
                version    integer PRIMARY KEY,
                name       text NOT NULL,
                checksum   text NOT NULL,
                applied_at timestamptz NOT NULL DEFAULT pg_catalog.now()
            );
            COMMENT ON TABLE {q}.{RECORD_TABLE} IS
                'walpost migrate: the migrations applied to this schema (file name, sha256 of the file); never edited by hand'"
        ))
        .await?;
        for entry in plan.found_in_place() {
            let version = entry.version.to_string();
            record(sql, schema, &version, entry.name, &entry.checksum).await?;
            tracing::info!(schema, "recorded {}/{}: its objects are there (applied before walpost migrate)", set.folder(), entry.name);
        }
        sql.simple_query("COMMIT").await?;
        Ok(())
    }
    .await;
    if result.is_err() {
        let _ = sql.simple_query("ROLLBACK").await;
    }
    result.map_err(failed)
}

async fn record(
    sql: &mut ReplicationClient,
    schema: &str,
    version: &str,
    name: &str,
    checksum: &str,
) -> Result<(), replication::Error> {
    let text = format!(
        "INSERT INTO {}.{RECORD_TABLE} (version, name, checksum) VALUES ($1::integer, $2, $3)",
        quote_ident(schema)
    );
    sql.query(&text, &[Some(version), Some(name), Some(checksum)]).await.map(drop)
}

/// One migration in one transaction with `search_path = <schema>, pg_temp`, recorded
/// there with `checksum` when given.
async fn transaction(
    sql: &mut ReplicationClient,
    schema: &str,
    file: &Migration,
    checksum: Option<&str>,
) -> Result<(), replication::Error> {
    let result: Result<(), replication::Error> = async {
        sql.simple_query("BEGIN").await?;
        sql.simple_query(&format!("SET LOCAL search_path = {}, pg_temp", quote_ident(schema))).await?;
        sql.simple_query(file.sql).await?;
        if let Some(checksum) = checksum {
            record(sql, schema, &file.version.to_string(), file.name, checksum).await?;
        }
        // Tests: hold the lock (and the transaction) open while a second runner starts.
        #[cfg(feature = "failpoints")]
        fail::fail_point!("migrate::before_commit");
        sql.simple_query("COMMIT").await?;
        Ok(())
    }
    .await;
    if result.is_err() {
        let _ = sql.simple_query("ROLLBACK").await;
    }
    result
}
