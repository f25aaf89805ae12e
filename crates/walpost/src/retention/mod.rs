//! Outbox retention on a table partitioned by time: partitions are created ahead and old
//! ones are dropped whole (a catalog operation), never emptied row by row with DELETE.
//!
//! One *pass* ([`pass`]: the pure [`plan`], then [`execute`]) runs on an ordinary SQL
//! connection. `walpost run` runs one at start and then every `[retention]
//! interval_secs` ([`task`]); `walpost retention [--dry-run]` runs one by hand
//! ([`command`]). Passes are serialised across walpost
//! instances by a session advisory lock keyed on the table, so a hot standby's pass and
//! the active one's never interleave. The task acts when the table is partitioned
//! (`[retention] enabled` unset), never with `enabled = false`, and warns with
//! `enabled = true` on an unpartitioned table. Days are UTC days.
//!
//! # What a pass does
//!
//! 1. **Ahead.** Every instant from the start of the current UTC day to
//!    `days_ahead` days after it is covered by a partition. Missing ranges are created as
//!    daily partitions named `<table>_pYYYYMMDD` (`CREATE TABLE ... (LIKE <table>)` then
//!    `ATTACH PARTITION`, which takes only a SHARE UPDATE EXCLUSIVE lock on the table, so
//!    inserts never wait for it).
//! 2. **Seal.** A partition whose whole range ends at or before `now() - keep_days` is
//!    sealed: in one transaction, with `lock_timeout`, walpost takes an ACCESS EXCLUSIVE
//!    lock on the partition (only on it, not on the table), adds
//!    `CONSTRAINT walpost_retired CHECK (false) NOT VALID`, reads
//!    `W = pg_current_wal_insert_lsn()` and stores it in the constraint's comment.
//! 3. **Drop.** A sealed partition is dropped (`DROP TABLE`, with `lock_timeout`) once
//!    the slot's `confirmed_flush_lsn >= W`.
//!
//! # The rule: a partition is dropped only when the slot has confirmed every row in it
//!
//! - The lock in step 2 is granted only when every transaction that ever wrote a row
//!   into the partition has committed or rolled back (a writer holds ROW EXCLUSIVE on it
//!   until its end). A transaction writes its commit record before it releases its
//!   locks, so every such commit record ends at or before `W`, which is read after the
//!   lock is granted.
//! - From the seal on, no row can enter the partition: `CHECK (false)` is enforced for
//!   new rows (`NOT VALID` only skips checking the existing ones). The partition is
//!   read-only (an INSERT or UPDATE of a row in its range fails, as an INSERT would
//!   after the drop).
//! - Hence when `confirmed_flush_lsn >= W` every row the partition holds belongs to a
//!   transaction the slot has confirmed, i.e. that walpost delivered to Kafka
//!   (walpost confirms a position only after Kafka acknowledged everything before it).
//!   At `confirmed_flush_lsn = W - 1` the partition is kept (`slot_behind`); at `W` it
//!   is dropped. The rule does not trust `occurred_at`, clocks or statistics.
//! - No drop without a usable slot: a missing slot, a slot of another database or an
//!   invalidated one (`wal_status = lost`, see runbooks/slot-lost.md, which recovers
//!   from these very rows) keeps every partition.
//! - The drop re-reads the seal under the table's lock in the same transaction, so an
//!   operator who removed the constraint (to unseal) is never overridden; the next pass
//!   seals again with a new `W`.
//!
//! The default partition is never dropped; if it holds rows a pass warns. Sub-second
//! partition bounds, MINVALUE lower bounds (the legacy partition of migration 0002)
//! and partitions not named by walpost are handled alike: only the bounds count.

pub(crate) mod execute;
pub(crate) mod plan;

use std::time::Duration;

use daypart::catalog::{self, Root};
use daypart::{Line, Outcome, Reason, RetentionMetrics};
use pgoutput::Lsn;
use replication::ReplicationClient;
use tokio::sync::watch;

use crate::error::{ErrorKind, PipelineError};
use crate::postgres::catalog::slot_row;
use crate::settings::{RetentionSettings, Settings, TableName};

/// What a pass works on.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    /// Where the partitions are made, sealed and dropped: the primary.
    pub postgres: replication::Config,
    /// Decoding on a standby: the server whose slot's confirmed position decides the
    /// drops (the LSNs are the same WAL's); `None`: `postgres` holds the slot.
    pub slot_server: Option<replication::Config>,
    pub table: TableName,
    pub slot: String,
    pub config: RetentionSettings,
}

impl Target {
    pub(crate) fn from_settings(s: &Settings) -> Target {
        Target {
            postgres: s.postgres.writer().clone(),
            slot_server: s.postgres.primary.is_some().then(|| s.postgres.server.clone()),
            table: s.source.table().clone(),
            slot: s.source.slot.clone(),
            config: s.retention.clone(),
        }
    }
}

/// `walpost retention [--dry-run]`: one pass, one line per partition on stdout.
/// Fails (non-zero exit) when the pass or any action in it failed.
pub(crate) async fn command(s: &Settings, dry_run: bool) -> Result<(), PipelineError> {
    let target = Target::from_settings(s);
    tracing::info!(
        postgres = %target.postgres.redacted(),
        table = %target.table,
        slot = %target.slot,
        keep_days = target.config.keep_days,
        days_ahead = target.config.days_ahead,
        dry_run,
        "retention pass"
    );
    match pass(&target, dry_run).await? {
        Outcome::NotPartitioned => {
            Err(PipelineError::definite(ErrorKind::Outbox, not_partitioned_message(&target.table)))
        }
        Outcome::Busy => Err(PipelineError::transient(
            ErrorKind::Retention,
            format!(
                "another session is running a retention pass on {} (a running walpost?); try again later",
                target.table
            ),
        )),
        Outcome::Done(lines) => {
            for line in &lines {
                println!("{line}");
            }
            let failed: Vec<&Line> = lines.iter().filter(|l| l.reason == Reason::Error).collect();
            if failed.is_empty() {
                Ok(())
            } else {
                Err(PipelineError::definite(
                    ErrorKind::Outbox,
                    format!(
                        "{} partition action(s) failed: {}",
                        failed.len(),
                        failed.iter().map(|l| format!("{}: {}", l.partition, l.detail)).collect::<Vec<_>>().join("; ")
                    ),
                ))
            }
        }
    }
}

fn not_partitioned_message(table: &TableName) -> String {
    format!(
        "table {table} is not partitioned, so retention has nothing to manage: apply migrations/outbox/0002_outbox_partitioned.sql with walpost migrate (or partition it BY RANGE on a timestamp column)"
    )
}

/// The retention task of `walpost run`: a pass now, then every `interval` (sooner after
/// an error), until shutdown. Never ends walpost: failures are logged and counted.
pub(crate) async fn task(settings: Settings, metrics: RetentionMetrics, mut shutdown: watch::Receiver<bool>) {
    let target = Target::from_settings(&settings);
    let cfg = target.config.clone();
    if cfg.enabled == Some(false) {
        tracing::debug!("retention disabled ([retention] enabled = false)");
        return;
    }
    metrics.declare_skip_reasons(&Reason::SKIPPED.iter().map(|r| r.as_str()).collect::<Vec<_>>());
    let mut told_unpartitioned = false;
    loop {
        let wait = match pass(&target, false).await {
            Ok(Outcome::Done(lines)) => {
                let failed = lines.iter().any(|l| l.reason == Reason::Error);
                metrics.pass_finished(!failed);
                told_unpartitioned = false;
                for line in &lines {
                    line.count(&metrics);
                    daypart::log_line(line);
                }
                if failed {
                    cfg.interval.min(Duration::from_secs(60))
                } else {
                    cfg.interval
                }
            }
            Ok(Outcome::NotPartitioned) => {
                if !told_unpartitioned {
                    if cfg.enabled == Some(true) {
                        tracing::warn!("retention is enabled but {}", not_partitioned_message(&target.table));
                    } else {
                        tracing::info!(table = %target.table, "outbox table is not partitioned: retention is idle");
                    }
                    told_unpartitioned = true;
                }
                cfg.interval
            }
            Ok(Outcome::Busy) => {
                tracing::debug!(table = %target.table, "another session holds the retention lock; skipping this pass");
                cfg.interval
            }
            Err(e) => {
                metrics.pass_finished(false);
                let wait = cfg.interval.min(Duration::from_secs(60));
                tracing::warn!(retry_in_s = wait.as_secs(), "retention pass failed: {e}");
                wait
            }
        };
        if backoff::sleep_or_shutdown(wait, &mut shutdown).await {
            return;
        }
    }
}

/// Runs one pass on its own connection. `dry_run` reads only.
pub(crate) async fn pass(t: &Target, dry_run: bool) -> Result<Outcome, PipelineError> {
    let mut sql = ReplicationClient::connect_sql(&t.postgres).await?;
    let mut slot_sql = match &t.slot_server {
        Some(server) => match ReplicationClient::connect_sql(server).await {
            Ok(c) => Some(c),
            Err(e) => {
                sql.close().await;
                return Err(e.into());
            }
        },
        None => None,
    };
    let result = pass_on(&mut sql, slot_sql.as_mut(), t, dry_run).await;
    sql.close().await;
    if let Some(c) = slot_sql {
        c.close().await;
    }
    result
}

async fn pass_on(
    sql: &mut ReplicationClient,
    slot_sql: Option<&mut ReplicationClient>,
    t: &Target,
    dry_run: bool,
) -> Result<Outcome, PipelineError> {
    // Bounds are read and written as UTC text; names are qualified, so no search_path games.
    sql.simple_query("SET TimeZone = 'UTC'").await?;
    sql.simple_query("SET DateStyle = 'ISO, YMD'").await?;
    sql.simple_query("SET search_path = pg_catalog, pg_temp").await?;
    let root_oid = match catalog::root(sql, &t.table.schema, &t.table.name).await? {
        Root::Missing => {
            return Err(PipelineError::definite(ErrorKind::Outbox, format!(
                "table {} does not exist in database {}: run walpost migrate (migrations/outbox/), or pass --table",
                t.table, t.postgres.dbname
            )))
        }
        Root::NotPartitioned => return Ok(Outcome::NotPartitioned),
        Root::Unsupported(how) => {
            return Err(PipelineError::definite(ErrorKind::Outbox, format!(
                "table {} is partitioned, but retention handles only RANGE partitioning on one timestamptz or timestamp column ({how})",
                t.table
            )))
        }
        Root::Range { oid } => oid,
    };
    // The key is the table's: passes on one table take turns, on two tables do not wait.
    let lock_key = "pg_catalog.hashtextextended('walpost retention ' || $1::text, 0)";
    if !dry_run {
        let lock = sql
            .query(&format!("SELECT pg_catalog.pg_try_advisory_lock({lock_key})::text AS got"), &[Some(&root_oid)])
            .await?;
        if lock.first("got") != Some("true") {
            return Ok(Outcome::Busy);
        }
    }
    let result = async {
        let now = catalog::server_now_micros(sql).await?;
        let partitions = catalog::partitions(sql, &root_oid).await?;
        let slot = match slot_sql {
            Some(standby) => slot_position(standby, t).await?,
            None => slot_position(sql, t).await?,
        };
        let steps = plan::plan(&plan::PlanInput {
            table: &t.table,
            slot_name: &t.slot,
            now,
            keep_days: t.config.keep_days,
            days_ahead: t.config.days_ahead,
            partitions: &partitions,
            slot,
        });
        execute::execute(sql, t, &partitions, slot, steps, dry_run).await
    }
    .await;
    if !dry_run {
        let _ = sql.query(&format!("SELECT pg_catalog.pg_advisory_unlock({lock_key})"), &[Some(&root_oid)]).await;
    }
    Ok(Outcome::Done(result?))
}

/// The slot's confirmed position, or why no partition may be dropped.
async fn slot_position(sql: &mut ReplicationClient, t: &Target) -> Result<Result<Lsn, Reason>, PipelineError> {
    Ok(match slot_row(sql, &t.slot).await? {
        None => Err(Reason::SlotMissing),
        Some(r) if r.database.as_deref() != Some(t.postgres.dbname.as_str()) => Err(Reason::SlotMissing),
        Some(r) if r.wal_status.as_deref() == Some("lost") => Err(Reason::SlotInvalidated),
        Some(r) => r.confirmed_flush.ok_or(Reason::SlotMissing),
    })
}
