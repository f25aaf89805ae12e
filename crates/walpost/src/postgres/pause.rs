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

/// Reads the pause once, before the stream starts (bounded). A stored pause holds from the
/// first session on; a read that fails does not hold the stream: the pause lives on the
/// writer, which may be down while the stream can go on (decoding on a promoted standby
/// whose primary is gone), and [`follow`] reads it again every [`FOLLOW_EVERY`].
pub async fn read_at_start(config: &Config, slot: &str, health: &Health) {
    let read = async {
        let mut sql = ReplicationClient::connect_sql(config).await.map_err(|e| PauseError::Sql(e.to_string()))?;
        read(&mut sql, slot).await
    };
    match tokio::time::timeout(Duration::from_secs(10), read).await {
        Ok(Ok(paused)) => apply(health, slot, paused.as_ref()),
        Ok(Err(PauseError::NoTable)) => tracing::debug!("{TABLE} does not exist: the stream cannot be paused"),
        Ok(Err(e)) => tracing::warn!(
            "cannot read the stream's pause at start ({e}); the stream starts and the pause is read again in a few seconds (if the server refused it: GRANT SELECT, INSERT, UPDATE, DELETE ON {TABLE} TO walpost's role, docs/least-privilege.md)"
        ),
        Err(_) => {
            tracing::warn!("cannot read the stream's pause at start (no answer in 10 s); read again in a few seconds")
        }
    }
}

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
