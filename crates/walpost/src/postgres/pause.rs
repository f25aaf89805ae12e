//! The stream's pause as a row of `events.walpost_pauses` (migrations/outbox/0005_pause.sql):
//! written by `POST /api/v1/pause`, deleted by `POST /api/v1/resume`, read before a session
//! streams and every few seconds after ([`follow`]).
//!
//! Why in the database and not only in the process: a restart, or a hot standby that takes
//! the slot over, must stay paused until an operator resumes; and a pause taken through
//! one instance's API must stop whichever instance streams. The process's copy is
//! [`Health::set_paused`](crate::telemetry::Health::set_paused), which the session reads at
//! every turn of its loop.
//!
//! The table is optional until an operator pauses: without it nothing is paused, and the
//! admin route answers that `walpost migrate` adds it.

use std::time::Duration;

use replication::{Config, ReplicationClient};
use tokio::sync::watch;

use crate::telemetry::Health;

/// The table of migration 0005, in schema `events` as the admin audit's.
pub const TABLE: &str = "events.walpost_pauses";

/// How often a running process re-reads the row.
pub const FOLLOW_EVERY: Duration = Duration::from_secs(3);

/// A pause as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paused {
    /// `paused_at` as PostgreSQL prints it.
    pub at: String,
    /// The token name that paused.
    pub by: String,
}

impl Paused {
    /// What `/readyz` and the log say after "paused".
    pub fn describe(&self) -> String {
        format!("by {} since {}", self.by, self.at)
    }
}

/// Why the row could not be read or written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PauseError {
    /// Migration 0005 was not applied.
    #[error("{TABLE} does not exist: apply migrations/outbox/0005_pause.sql (walpost migrate)")]
    NoTable,
    #[error("{TABLE}: {0}")]
    Sql(String),
}

fn sql_error(e: &replication::Error) -> PauseError {
    match e.sqlstate() {
        // undefined_table
        Some("42P01") => PauseError::NoTable,
        _ => PauseError::Sql(e.to_string()),
    }
}

/// The slot's pause, if any.
pub async fn read(sql: &mut ReplicationClient, slot: &str) -> Result<Option<Paused>, PauseError> {
    let q = format!("SELECT paused_at::text AS paused_at, paused_by FROM {TABLE} WHERE slot = $1");
    let rows = sql.query(&q, &[Some(slot)]).await.map_err(|e| sql_error(&e))?;
    Ok(match (rows.first("paused_at"), rows.first("paused_by")) {
        (Some(at), Some(by)) => Some(Paused { at: at.to_owned(), by: by.to_owned() }),
        _ => None,
    })
}

/// Pauses the slot's stream (a pause already there keeps its time and author).
pub async fn pause(sql: &mut ReplicationClient, slot: &str, by: &str) -> Result<Paused, PauseError> {
    let q = format!("INSERT INTO {TABLE} (slot, paused_by) VALUES ($1, $2) ON CONFLICT (slot) DO NOTHING");
    sql.query(&q, &[Some(slot), Some(by)]).await.map_err(|e| sql_error(&e))?;
    read(sql, slot).await?.ok_or_else(|| PauseError::Sql("the pause row was not written".into()))
}

/// Resumes the slot's stream; `Some`: the pause it ended.
pub async fn resume(sql: &mut ReplicationClient, slot: &str) -> Result<Option<Paused>, PauseError> {
    let q = format!("DELETE FROM {TABLE} WHERE slot = $1 RETURNING paused_at::text AS paused_at, paused_by");
    let rows = sql.query(&q, &[Some(slot)]).await.map_err(|e| sql_error(&e))?;
    Ok(match (rows.first("paused_at"), rows.first("paused_by")) {
        (Some(at), Some(by)) => Some(Paused { at: at.to_owned(), by: by.to_owned() }),
        _ => None,
    })
}

/// The process's copy of the pause now says `paused`; logs a change.
pub fn apply(health: &Health, slot: &str, paused: Option<&Paused>) {
    let now = paused.map(Paused::describe);
    if health.paused() != now {
        match &now {
            Some(by) => {
                tracing::warn!(%slot, "stream paused {by}: nothing is read from the slot until POST /api/v1/resume")
            }
            None => tracing::info!(%slot, "stream resumed"),
        }
        health.set_paused(now);
    }
}

/// Reads the pause once, before the stream starts. A server that does not answer leaves
/// the stream held ("not read yet") until [`follow`] reads the row: a stored pause must
/// hold across a restart, so an unknown one is not taken for "not paused". An answer that
/// is an error (a missing grant) is logged with what to do, and the stream is not held by it.
pub async fn read_at_start(config: &Config, slot: &str, health: &Health) {
    let read = async {
        let mut sql =
            ReplicationClient::connect_sql(config).await.map_err(|e| (true, PauseError::Sql(e.to_string())))?;
        read(&mut sql, slot).await.map_err(|e| (false, e))
    };
    let unreachable = |why: &str| {
        tracing::warn!("cannot read the stream's pause at start ({why}); nothing is read from the slot until it is read, every {} s", FOLLOW_EVERY.as_secs());
        health.set_paused(Some(NOT_READ_YET.to_owned()));
    };
    match tokio::time::timeout(Duration::from_secs(10), read).await {
        Ok(Ok(paused)) => apply(health, slot, paused.as_ref()),
        Ok(Err((_, PauseError::NoTable))) => tracing::debug!("{TABLE} does not exist: the stream cannot be paused"),
        Ok(Err((true, e))) => unreachable(&e.to_string()),
        Ok(Err((false, e))) => tracing::warn!(
            "cannot read the stream's pause at start ({e}); the stream starts unpaused: GRANT SELECT, INSERT, UPDATE, DELETE ON {TABLE} TO walpost's role (docs/least-privilege.md)"
        ),
        Err(_) => unreachable("no answer in 10 s"),
    }
}

/// What the process's pause says while the row was not read yet.
pub const NOT_READ_YET: &str = "unknown: the pause row was not read yet";

/// Re-reads the pause every [`FOLLOW_EVERY`] until shutdown, so a pause or resume taken
/// through another instance's API (or by hand in the table) takes effect here. A read
/// that fails keeps the state as it was.
pub async fn follow(config: Config, slot: String, health: std::sync::Arc<Health>, mut shutdown: watch::Receiver<bool>) {
    let mut sql: Option<ReplicationClient> = None;
    let mut warned = false;
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            () = tokio::time::sleep(FOLLOW_EVERY) => {}
        }
        if sql.is_none() {
            sql = ReplicationClient::connect_sql(&config).await.ok();
        }
        let Some(client) = sql.as_mut() else { continue };
        match tokio::time::timeout(Duration::from_secs(10), read(client, &slot)).await {
            Ok(Ok(paused)) => {
                warned = false;
                apply(&health, &slot, paused.as_ref());
            }
            Ok(Err(PauseError::NoTable)) => apply(&health, &slot, None),
            Ok(Err(e)) => {
                if !warned {
                    warned = true;
                    tracing::warn!("cannot read the stream's pause ({e}); it stays as it was");
                }
                sql = None;
            }
            Err(_) => sql = None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_pause_not_read_at_start_holds_the_stream_until_read() {
        let h = Health::new(Duration::from_secs(30), Duration::from_secs(60));
        // Nothing listens on port 1: the read cannot reach a server.
        let config =
            Config::from_url("postgres://walpost@127.0.0.1:1/db?connect_timeout=1").expect("a connection string");
        read_at_start(&config, "walpost", &h).await;
        assert_eq!(h.paused().as_deref(), Some(NOT_READ_YET));
        // The first answer of follow's reads replaces it: here, no pause stored.
        apply(&h, "walpost", None);
        assert!(!h.is_paused());
    }

    #[test]
    fn a_change_of_pause_reaches_health() {
        let h = Health::new(Duration::from_secs(30), Duration::from_secs(60));
        let p = Paused { at: "2026-12-05 17:00:00+00".into(), by: "ops".into() };
        apply(&h, "walpost", Some(&p));
        assert!(h.is_paused());
        assert_eq!(h.paused().as_deref(), Some("by ops since 2026-12-05 17:00:00+00"));
        apply(&h, "walpost", None);
        assert!(!h.is_paused() && h.paused().is_none());
    }
}
