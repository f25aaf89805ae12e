//! The I/O half of a retention pass: carries out [`super::plan::Step`]s with DDL, each
//! in one transaction with `lock_timeout` (`in_transaction`), and reports a line per
//! partition. Only DDL errors that say "try again" (a lock timeout, a conflict) become
//! a kept line; a lost connection ends the pass.

use daypart::catalog::{parse_seal, seal_comment, Partition, Seal, SEAL_CONSTRAINT};
use daypart::ddl::{create_partition, in_transaction, keep_after};
use daypart::{Action, Line, Reason};
use pgoutput::Lsn;
use replication::ReplicationClient;

use super::plan::{blocked_detail, drop_rule, Step};
use super::Target;
use crate::error::{ErrorKind, PipelineError};
use crate::postgres::sql::{ident, run_formatted};

/// Carries out `steps` (in a dry run, only reports them).
pub(crate) async fn execute(
    sql: &mut ReplicationClient,
    t: &Target,
    partitions: &[Partition],
    slot: Result<Lsn, Reason>,
    steps: Vec<Step>,
    dry_run: bool,
) -> Result<Vec<Line>, PipelineError> {
    let mut lines = Vec::with_capacity(steps.len());
    for step in steps {
        let line = match step {
            Step::Keep(line) => line,
            Step::Create { display, quoted, range } => {
                let mut line = Line {
                    partition: display,
                    range: range.to_string(),
                    action: Action::Create,
                    done: false,
                    reason: Reason::Ahead,
                    detail: String::new(),
                };
                if !dry_run {
                    let (lo, hi) = (range.lo.unwrap_or(i64::MIN), range.hi.unwrap_or(i64::MAX));
                    match create_partition(sql, &t.table.quoted(), &quoted, (lo, hi), t.config.lock_timeout).await {
                        Ok(()) => line.done = true,
                        Err(e) => keep_after(&mut line, e, "not created")?,
                    }
                }
                line
            }
            Step::Seal { index } => {
                let p = partitions
                    .get(index)
                    .ok_or_else(|| PipelineError::definite(ErrorKind::Internal, "retention: partition index"))?;
                let mut line = partition_line(p, Action::Seal, Reason::Expired);
                if dry_run {
                    line.detail = "then dropped once the slot confirms the seal position".into();
                } else {
                    match seal(sql, t, p).await {
                        Ok(w) => {
                            line.done = true;
                            line.detail = blocked_detail(w, &t.slot, slot);
                            // Dropped in a later pass: the slot has to confirm W first.
                            line.reason = drop_rule(w, slot).err().unwrap_or(Reason::SlotBehind);
                        }
                        Err(e) => {
                            line.action = Action::Keep;
                            keep_after(&mut line, e, "not sealed")?;
                        }
                    }
                }
                line
            }
            Step::Drop { index, w, confirmed } => {
                let p = partitions
                    .get(index)
                    .ok_or_else(|| PipelineError::definite(ErrorKind::Internal, "retention: partition index"))?;
                let mut line = partition_line(p, Action::Drop, Reason::Expired);
                line.detail = format!("sealed at {w}; slot {} confirmed {confirmed}", t.slot);
                if !dry_run {
                    match drop_partition(sql, t, p, w).await {
                        Ok(true) => line.done = true,
                        Ok(false) => {
                            // The seal changed under us (removed or renewed by someone).
                            line.action = Action::Keep;
                            line.reason = Reason::Conflict;
                            line.detail = "the seal changed since this pass read it; seen again next pass".into();
                        }
                        Err(e) => {
                            line.action = Action::Keep;
                            keep_after(&mut line, e, &format!("sealed at {w}; not dropped"))?;
                        }
                    }
                }
                line
            }
        };
        lines.push(line);
    }
    Ok(lines)
}

fn partition_line(p: &Partition, action: Action, reason: Reason) -> Line {
    Line {
        partition: p.display.clone(),
        range: p.range.to_string(),
        action,
        done: false,
        reason,
        detail: String::new(),
    }
}

/// Seals `p` and returns W (see the module docs of [`super`]).
async fn seal(sql: &mut ReplicationClient, t: &Target, p: &Partition) -> Result<Lsn, replication::Error> {
    let lock = format!("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE", p.quoted);
    let add = (p.seal.is_none())
        .then(|| format!("ALTER TABLE {} ADD CONSTRAINT {} CHECK (false) NOT VALID", p.quoted, ident(SEAL_CONSTRAINT)));
    let slot = t.slot.clone();
    let quoted = p.quoted.clone();
    let sealed = in_transaction(sql, t.config.lock_timeout, |sql| {
        Box::pin(async move {
            sql.simple_query(&lock).await?;
            if let Some(add) = &add {
                sql.simple_query(add).await?;
            }
            // Read after the lock: every writer of the partition has ended.
            let r = sql.simple_query("SELECT pg_catalog.pg_current_wal_insert_lsn()::text AS w").await?;
            let w: Lsn = r
                .first("w")
                .and_then(|w| w.parse().ok())
                .ok_or_else(|| replication::Error::Protocol("pg_current_wal_insert_lsn() returned no LSN".into()))?;
            // COMMENT takes no parameters: PostgreSQL quotes the comment (%L) into its text.
            let comment = seal_comment(w, &slot);
            run_formatted(
                sql,
                "COMMENT ON CONSTRAINT %I ON %s IS %L",
                &[Some(SEAL_CONSTRAINT), Some(&quoted), Some(&comment)],
            )
            .await?;
            Ok(Some(w))
        })
    })
    .await?;
    sealed.ok_or_else(|| replication::Error::Protocol("seal produced no position".into()))
}

/// Drops `p` if it is still a partition of the table sealed at `w`. Ok(false): the seal changed.
async fn drop_partition(
    sql: &mut ReplicationClient,
    t: &Target,
    p: &Partition,
    w: Lsn,
) -> Result<bool, replication::Error> {
    let root = t.table.quoted();
    let quoted = p.quoted.clone();
    let dropped = in_transaction(sql, t.config.lock_timeout, |sql| {
        Box::pin(async move {
            // The locks DROP TABLE takes, in its order, before re-reading the seal.
            sql.simple_query(&format!("LOCK TABLE ONLY {root} IN ACCESS EXCLUSIVE MODE")).await?;
            sql.simple_query(&format!("LOCK TABLE {quoted} IN ACCESS EXCLUSIVE MODE")).await?;
            let r = sql
                .query(
                    "SELECT pg_catalog.obj_description(k.oid, 'pg_constraint') AS seal FROM pg_constraint k \
                     JOIN pg_inherits i ON i.inhrelid = k.conrelid AND i.inhparent = $1::regclass \
                     WHERE k.conrelid = $2::regclass AND k.conname = $3 AND k.contype = 'c' \
                     AND pg_catalog.pg_get_constraintdef(k.oid) LIKE 'CHECK (false)%'",
                    &[Some(&root), Some(&quoted), Some(SEAL_CONSTRAINT)],
                )
                .await?;
            if r.rows.is_empty() || parse_seal(r.first("seal")) != Seal::At(w) {
                return Ok(None);
            }
            sql.simple_query(&format!("DROP TABLE {quoted}")).await?;
            Ok(Some(()))
        })
    })
    .await?;
    Ok(dropped.is_some())
}
