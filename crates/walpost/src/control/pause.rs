//! `POST /api/v1/pause` and `POST /api/v1/resume` of `walpost run`: the row of
//! [`crate::postgres::pause`] first (so a restart or another instance stays paused), then
//! this process's copy in [`Health`], which the session reads at every turn of its loop.
//!
//! A pause that cannot be stored is refused and changes nothing: a pause that held only
//! until the next restart would resume the stream behind the operator's back.

use std::sync::Arc;

use admin::{ApiError, Reply};
use hyper::StatusCode;
use replication::{Config, ReplicationClient};
use serde::Serialize;
use tokio::sync::Mutex;

use crate::postgres::pause::{self, PauseError, Paused};
use crate::telemetry::Health;

/// What the two routes answer.
#[derive(Debug, Serialize, PartialEq)]
pub(crate) struct PauseState {
    /// `paused` or `resumed`.
    pub(crate) state: &'static str,
    pub(crate) slot: String,
    pub(crate) paused_at: Option<String>,
    pub(crate) paused_by: Option<String>,
}

/// The pause of one slot, over a connection made at the first call (and again after an
/// error), as the audit's.
#[derive(Debug)]
pub(crate) struct PauseControl {
    config: Config,
    slot: String,
    health: Arc<Health>,
    client: Mutex<Option<ReplicationClient>>,
}

impl PauseControl {
    pub(crate) fn new(config: Config, slot: String, health: Arc<Health>) -> PauseControl {
        PauseControl { config, slot, health, client: Mutex::new(None) }
    }

    /// Stores the pause and applies it here; `by`: the token's name.
    pub(crate) async fn pause(&self, by: &str) -> Reply {
        let stored = {
            let mut client = self.client.lock().await;
            match connected(&mut client, &self.config).await {
                Ok(c) => pause::pause(c, &self.slot, by).await.inspect_err(|_| *client = None),
                Err(e) => Err(e),
            }
        };
        match stored {
            Ok(p) => {
                pause::apply(&self.health, &self.slot, Some(&p));
                self.answer("paused", Some(p))
            }
            Err(e) => refused(&e, "paused").into(),
        }
    }

    /// Deletes the pause and resumes here (resuming what is not paused is no error).
    pub(crate) async fn resume(&self) -> Reply {
        let removed = {
            let mut client = self.client.lock().await;
            match connected(&mut client, &self.config).await {
                Ok(c) => pause::resume(c, &self.slot).await.inspect_err(|_| *client = None),
                Err(e) => Err(e),
            }
        };
        match removed {
            Ok(ended) => {
                pause::apply(&self.health, &self.slot, None);
                self.answer("resumed", ended)
            }
            Err(e) => refused(&e, "resumed").into(),
        }
    }

    fn answer(&self, state: &'static str, p: Option<Paused>) -> Reply {
        let (paused_at, paused_by) = p.map(|p| (p.at, p.by)).unzip();
        Reply::ok(&PauseState { state, slot: self.slot.clone(), paused_at, paused_by })
            .with_target(format!("slot={}", self.slot))
    }
}

async fn connected<'c>(
    client: &'c mut Option<ReplicationClient>,
    config: &Config,
) -> Result<&'c mut ReplicationClient, PauseError> {
    if client.is_none() {
        *client = Some(ReplicationClient::connect_sql(config).await.map_err(|e| PauseError::Sql(e.to_string()))?);
    }
    client.as_mut().ok_or_else(|| PauseError::Sql("no connection".into()))
}

/// The answer when the pause could not be stored: the stream is as it was.
fn refused(e: &PauseError, what: &str) -> ApiError {
    match e {
        PauseError::NoTable => ApiError::new(
            StatusCode::CONFLICT,
            format!("the stream cannot be {what}: {e}"),
            "run walpost migrate --postgres URL (it adds events.walpost_pauses); the stream is not affected",
        ),
        PauseError::Sql(_) => {
            tracing::warn!("admin API: the stream could not be {what}: {e}");
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the stream could not be {what}: {e}"),
                "nothing changed; try again, and see GRANT SELECT, INSERT, UPDATE, DELETE ON events.walpost_pauses in docs/control-plane.md",
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_table_is_a_conflict_that_names_the_migration() {
        let e = refused(&PauseError::NoTable, "paused");
        assert_eq!(e.status(), StatusCode::CONFLICT);
        assert!(e.error().contains("0005_pause.sql") && e.hint().contains("walpost migrate"), "{e:?}");
        assert_eq!(refused(&PauseError::Sql("x".into()), "resumed").status(), StatusCode::SERVICE_UNAVAILABLE);
    }
}
