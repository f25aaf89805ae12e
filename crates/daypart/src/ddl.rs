//! DDL on day partitions, each statement group in one transaction with `lock_timeout`
//! ([`in_transaction`]): a partition created with `CREATE TABLE ... (LIKE ...)` then
//! `ATTACH PARTITION` ([`create_partition`]), and how a failed DDL becomes a kept line
//! ([`keep_after`]). Only DDL errors that say "try again" (a lock timeout, a conflict)
//! become a kept line; a lost connection ends the pass.

use std::future::Future;
use std::pin::Pin;

use replication::{sqlstate, ReplicationClient};
use service::error::PipelineError;
use service::sql::run_formatted;

use crate::report::{Line, Reason};
use crate::time::literal_ts;

/// A failed DDL: a kept line when the server said no, the pass's error when the
/// connection failed.
pub fn keep_after(line: &mut Line, e: replication::Error, what: &str) -> Result<(), PipelineError> {
    if e.is_transient() {
        return Err(e.into());
    }
    line.reason = match e.sqlstate() {
        Some(sqlstate::LOCK_NOT_AVAILABLE) => Reason::LockTimeout,
        // duplicate_table, invalid_object_definition (overlap), check_violation (default partition rows)
        Some(sqlstate::DUPLICATE_TABLE | sqlstate::INVALID_OBJECT_DEFINITION | sqlstate::CHECK_VIOLATION) => {
            Reason::Conflict
        }
        _ => Reason::Error,
    };
    line.detail = format!("{what}: {e}");
    Ok(())
}

/// The work of [`in_transaction`], on its connection.
pub type Work<'a, T> = Pin<Box<dyn Future<Output = Result<T, replication::Error>> + Send + 'a>>;

/// Runs `work` in one transaction with `lock_timeout`; rolls back when it fails (or
/// returns `Ok(None)`: nothing to commit), commits otherwise.
pub async fn in_transaction<T>(
    sql: &mut ReplicationClient,
    lock_timeout: std::time::Duration,
    work: impl for<'c> FnOnce(&'c mut ReplicationClient) -> Work<'c, Option<T>>,
) -> Result<Option<T>, replication::Error> {
    sql.simple_query("BEGIN").await?;
    let result = async {
        let timeout = format!("{}ms", lock_timeout.as_millis());
        sql.query("SELECT pg_catalog.set_config('lock_timeout', $1, true)", &[Some(&timeout)]).await?;
        work(sql).await
    }
    .await;
    match result {
        Ok(Some(value)) => {
            sql.simple_query("COMMIT").await?;
            Ok(Some(value))
        }
        Ok(None) => {
            sql.simple_query("ROLLBACK").await?;
            Ok(None)
        }
        Err(e) => {
            if !e.is_transient() {
                let _ = sql.simple_query("ROLLBACK").await;
            }
            Err(e)
        }
    }
}

/// Creates partition `quoted` of table `root` (both quoted and qualified) for `[lo, hi)`.
pub async fn create_partition(
    sql: &mut ReplicationClient,
    root: &str,
    quoted: &str,
    (lo, hi): (i64, i64),
    lock_timeout: std::time::Duration,
) -> Result<(), replication::Error> {
    // CREATE TABLE ... PARTITION OF would take ACCESS EXCLUSIVE on the table; ATTACH
    // takes SHARE UPDATE EXCLUSIVE, which inserts do not wait for.
    let create = format!(
        "CREATE TABLE {quoted} (LIKE {root} INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING GENERATED \
         INCLUDING IDENTITY INCLUDING STORAGE INCLUDING COMMENTS)"
    );
    let (root, quoted) = (root.to_owned(), quoted.to_owned());
    let (lo, hi) = (literal_ts(lo), literal_ts(hi));
    in_transaction(sql, lock_timeout, |sql| {
        Box::pin(async move {
            sql.simple_query(&create).await?;
            // ATTACH takes no parameters: PostgreSQL quotes the bounds (%L) into its text.
            run_formatted(
                sql,
                "ALTER TABLE %s ATTACH PARTITION %s FOR VALUES FROM (%L) TO (%L)",
                &[Some(&root), Some(&quoted), Some(&lo), Some(&hi)],
            )
            .await?;
            Ok(Some(()))
        })
    })
    .await
    .map(|_| ())
}
