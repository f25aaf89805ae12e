//! Decoding on a standby (PostgreSQL 16+): which kind of server walpost reads its slot
//! on, and the connection to the primary where it writes.
//!
//! With `target_session_attrs=standby` (or `prefer-standby`) walpost creates and reads
//! its slot on a standby, which is read-only. What walpost writes goes to the primary over
//! a second connection ([`connect_writer`]): the heartbeat, the slot's lineage record, the
//! publication when walpost creates it, retention's DDL and the snapshot's progress row.
//! Physical replication brings all of it back to the standby.
//!
//! Invariants:
//! - A writer is a server that is not in recovery: [`connect_writer`] checks, so a
//!   `postgres_primary` that reaches a standby is refused, never written to.
//! - When the standby walpost decodes on is promoted, it is the primary: the writer falls
//!   back to the decoding server's hosts with `read-write`, so writes follow the promotion.
//! - A feature that cannot reach the primary says once that it is off and why
//!   ([`PrimaryNotice`]), and never stops the stream.

use std::sync::atomic::{AtomicBool, Ordering};

use replication::{ReplicationClient, TargetSessionAttrs};

use crate::error::{ErrorKind, PipelineError};
use crate::settings::PostgresSettings;

/// Whether the server behind `sql` is in recovery (a standby).
pub(crate) async fn in_recovery(sql: &mut ReplicationClient) -> Result<bool, PipelineError> {
    let r = sql.simple_query("SELECT pg_catalog.pg_is_in_recovery()::text AS r").await?;
    match r.first("r") {
        Some("true") => Ok(true),
        Some("false") => Ok(false),
        other => Err(PipelineError::definite(
            ErrorKind::Postgres,
            format!("pg_is_in_recovery() returned {other:?}, which is not a boolean"),
        )),
    }
}

/// Whether `e` is `target_session_attrs=standby` finding no standby: a host answered as
/// a primary and every other one did not answer at all (down, unreachable). A host that
/// answered with an error (a standby starting up) may yet be the standby: not counted.
pub(crate) fn found_no_standby(e: &PipelineError) -> bool {
    use replication::Error as E;
    let Some(cause) = std::error::Error::source(e).and_then(|c| c.downcast_ref::<E>()) else {
        return false;
    };
    // The only mismatch `standby` reports is a primary.
    let primary = |e: &E| matches!(e, E::SessionAttrs { wanted: "standby", .. });
    let silent = |e: &E| matches!(e, E::Connect { .. } | E::ConnectTimeout { .. } | E::Io(_));
    match cause {
        e if primary(e) => true,
        E::NoUsableHost { failures, not_tried } => {
            not_tried.is_empty()
                && failures.iter().any(|f| primary(&f.error))
                && failures.iter().all(|f| primary(&f.error) || silent(&f.error))
        }
        _ => false,
    }
}

/// Whether walpost decodes on a standby now: the settings ask for one and the server
/// behind `sql` (the one the slot is read on) is in recovery. `prefer-standby` may have
/// settled on a primary, and a standby may have been promoted since.
pub(crate) async fn on_a_standby(
    postgres: &PostgresSettings,
    sql: &mut ReplicationClient,
) -> Result<bool, PipelineError> {
    Ok(postgres.standby_decoding() && in_recovery(sql).await?)
}

/// A connection to the server walpost writes on (see the module docs).
pub(crate) async fn connect_writer(postgres: &PostgresSettings) -> Result<ReplicationClient, PipelineError> {
    let Some(primary) = &postgres.primary else {
        return Ok(ReplicationClient::connect_sql(&postgres.server).await?);
    };
    let first = match ReplicationClient::connect_sql(primary).await {
        Ok(mut sql) => match in_recovery(&mut sql).await {
            Ok(false) => return Ok(sql),
            Ok(true) => {
                sql.close().await;
                format!("{} is a standby", primary.redacted())
            }
            Err(e) => e.to_string(),
        },
        Err(e) => PipelineError::from(e).to_string(),
    };
    // The decoding standby may have been promoted: then it is where walpost writes.
    let mut promoted = postgres.server.clone();
    promoted.target_session_attrs = TargetSessionAttrs::ReadWrite;
    if promoted != *primary {
        if let Ok(mut sql) = ReplicationClient::connect_sql(&promoted).await {
            if matches!(in_recovery(&mut sql).await, Ok(false)) {
                return Ok(sql);
            }
            sql.close().await;
        }
    }
    Err(PipelineError::transient(
        ErrorKind::Postgres,
        format!("cannot reach the primary for walpost's writes ({first}): set --postgres-primary (postgres_primary) to the primary"),
    ))
}

/// Says once, per feature, that it is off while decoding on a standby without a reachable
/// primary, and why; says again once it works.
#[derive(Debug, Default)]
pub(crate) struct PrimaryNotice {
    off: AtomicBool,
}

impl PrimaryNotice {
    /// `feature` could not reach the primary (`why`); logged at WARN the first time.
    pub(crate) fn off(&self, feature: &str, consequence: &str, why: &PipelineError) {
        if !self.off.swap(true, Ordering::Relaxed) {
            tracing::warn!("{}", texts::standby::primary_feature_off(feature, consequence, &why.to_string()));
        }
    }

    /// `feature` reached the primary again.
    pub(crate) fn on(&self, feature: &str) {
        if self.off.swap(false, Ordering::Relaxed) {
            tracing::info!("decoding on a standby: {feature} reaches the primary again");
        }
    }
}

/// Asks the primary for a running-transactions record (`pg_log_standby_snapshot()`,
/// PostgreSQL 16+) every second, for as long as it runs: a logical slot created on a
/// standby becomes consistent only once it decodes such a record, which an idle primary
/// writes at most every 15 s (its background writer, only after other WAL) or at a
/// checkpoint. Without the right to call the function (it is a superuser's by default),
/// writes a logical message instead (any WAL makes the background writer log one within
/// 15 s), and says once what the slot waits for.
pub(crate) async fn nudge_running_xacts(postgres: PostgresSettings) {
    let mut told = false;
    let mut sql: Option<ReplicationClient> = None;
    let mut can_log = true;
    loop {
        if sql.is_none() {
            match connect_writer(&postgres).await {
                Ok(c) => sql = Some(c),
                Err(e) if !told => {
                    told = true;
                    tracing::info!("{}", texts::standby::slot_creation_waits_for_the_primary(&e.to_string()));
                }
                Err(_) => {}
            }
        }
        if let Some(conn) = sql.as_mut() {
            let statement = if can_log {
                "SELECT pg_catalog.pg_log_standby_snapshot()"
            } else {
                "SELECT pg_catalog.pg_logical_emit_message(false, 'walpost.nudge', '')"
            };
            match conn.simple_query(statement).await {
                Ok(_) => {}
                Err(e) if can_log && e.sqlstate() == Some(replication::sqlstate::INSUFFICIENT_PRIVILEGE) => {
                    can_log = false;
                    if !told {
                        told = true;
                        tracing::info!("{}", texts::standby::SLOT_CREATION_WAITS_FOR_A_GRANT);
                    }
                }
                Err(e) => {
                    tracing::debug!("asking the primary for a running-transactions record failed: {e}");
                    sql = None;
                }
            }
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use replication::{Error as E, HostFailure};

    use super::*;

    fn primary(host: &str) -> E {
        E::SessionAttrs {
            host: host.into(),
            wanted: "standby",
            found: "a primary (not in recovery)",
            needs: "a standby",
        }
    }

    fn down(host: &str) -> E {
        E::Connect { target: host.into(), source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused) }
    }

    fn hosts(errors: Vec<E>) -> PipelineError {
        let failures = errors.into_iter().map(|error| HostFailure { host: "h".into(), error }).collect();
        PipelineError::from(E::NoUsableHost { failures, not_tried: Vec::new() })
    }

    #[test]
    fn no_standby_is_a_primary_with_the_other_hosts_silent() {
        assert!(found_no_standby(&PipelineError::from(primary("a:5432"))), "the one host is a primary");
        assert!(found_no_standby(&hosts(vec![down("a"), primary("b")])), "the old primary down, the standby promoted");
        assert!(found_no_standby(&hosts(vec![primary("a"), primary("b")])));
        assert!(!found_no_standby(&hosts(vec![down("a"), down("b")])), "nothing answers: an outage");
        let starting = E::Protocol("the database system is starting up".into());
        assert!(!found_no_standby(&hosts(vec![primary("a"), starting])), "a standby may be starting up");
        assert!(!found_no_standby(&PipelineError::from(down("a"))));
        assert!(!found_no_standby(&PipelineError::transient(ErrorKind::Postgres, "x")), "no cause");
        let read_write = E::SessionAttrs { host: "a".into(), wanted: "read-write", found: "read-only", needs: "w" };
        assert!(!found_no_standby(&PipelineError::from(read_write)));
        let wrapped = PipelineError::from(primary("a")).context("connecting");
        assert!(found_no_standby(&wrapped), "context keeps the cause");
    }
}
