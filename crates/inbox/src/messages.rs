//! `walpost inbox`'s operator-facing texts. Each is quoted verbatim in the runbook it
//! names (checked by the walpost crate's `tests/runbooks.rs`), so change both together.

/// The runbook the inbox's operator texts point to.
pub const INBOX_RUNBOOK: &str = "runbooks/inbox-backlog.md";

/// `walpost inbox`'s fatal error for inbox tables that are missing or lack a column
/// (`what`: the missing tables and columns, or the server's error).
pub fn inbox_schema_incomplete(schema: &str, what: &str) -> String {
    format!(
        "the inbox schema is incomplete ({what}): run walpost migrate --inbox --schema {schema} (or start walpost inbox once with --create-schema) to create the inbox tables in schema {schema}; nothing was stored and no offset moved (see {INBOX_RUNBOOK})"
    )
}

/// What `walpost inbox --create-schema` was doing when the server refused it; the
/// server's error follows (a refused privilege stops; a deadlock or lock timeout is
/// retried).
pub fn inbox_migration_failed(schema: &str) -> String {
    format!(
        "--create-schema: cannot apply the inbox migration in schema {schema} (run walpost inbox as a role that may create it, the schema's owner or one with CREATE on the database, or run walpost migrate --inbox --schema {schema} as such a role and start without --create-schema; see {INBOX_RUNBOOK})"
    )
}

/// `walpost inbox`'s fatal error for a batch no partition of `messages` takes (its days
/// ahead were not made: retention off, or failing).
pub fn inbox_partition_missing(schema: &str) -> String {
    format!(
        "no partition of {schema}.messages (or of its deliveries and receipts) covers the time the batch arrived: walpost inbox creates the days ahead unless [inbox] retention = false; run it with retention on; nothing was stored and no offset moved (see {INBOX_RUNBOOK})"
    )
}

/// `walpost inbox`'s warning when a batch waited `ms` for the inbox's write lock (a lock
/// on `<schema>.offsets`) and did not get it; the batch is tried again.
pub fn inbox_write_lock_waited(schema: &str, ms: u64) -> String {
    format!(
        "a batch waited {ms} ms for the inbox's write lock (a lock on {schema}.offsets) and is tried again: another session holds a conflicting lock on that table (find it in pg_locks joined with pg_stat_activity, then end it with pg_terminate_backend; only roles that may write {schema}.offsets can take one; see {INBOX_RUNBOOK})"
    )
}

/// `walpost inbox`'s fatal error for a record it cannot store, with `on_invalid = halt`.
pub fn inbox_record_refused(topic: &str, partition: i32, offset: i64, why: &str) -> String {
    format!(
        "record {topic}/{partition}@{offset} cannot be stored in the inbox: {why}; the records before it are stored and its partition stops there: fix the producer, or set [inbox] on_invalid = \"reject\" to keep such records in the rejected table and go on (see {INBOX_RUNBOOK})"
    )
}

/// `walpost inbox`'s fatal error when its Kafka consumer thread ended without being
/// asked to (`why`: its panic message, or that it returned).
pub fn inbox_consumer_ended(why: &str) -> String {
    format!(
        "the inbox's Kafka consumer thread ended without being asked to ({why}): this is a walpost bug, report it with this line; nothing past the offsets stored in PostgreSQL is lost, a restart reads on from there"
    )
}
