//! A hot standby: a second `walpost run` on the same slot finds it held by another
//! process and waits here, on one SQL connection, asking PostgreSQL every
//! [`POLL_EVERY`] who holds the slot, and returns as soon as nobody does so the next
//! session starts at once.
//!
//! Why poll the catalog rather than retry the session with backoff: a session's start
//! opens a producer (at-least-once) and two connections, which is too much to repeat
//! twice a second, and a backoff that grows to `max_backoff_secs` would make a take-over
//! wait as long. PostgreSQL releases the slot as soon as it sees the holder's connection
//! close (a `kill -9` or a graceful stop); a holder cut off without a close keeps it
//! until `wal_sender_timeout` (docs/kubernetes.md says why walpost waits for that).
//!
//! While waiting: `walpost_active` is 0, `/readyz` answers 200 saying it is a standby (a
//! standby is healthy and must not hold up a rolling update), and the holder is logged
//! once per server process.

use std::time::Duration;

use replication::ReplicationClient;
use tokio::sync::watch;

use crate::error::PipelineError;
use crate::postgres::catalog;
use crate::settings::Settings;
use crate::telemetry::Metrics;

/// How often a hot standby asks who holds the slot: the take-over's delay at most.
pub(crate) const POLL_EVERY: Duration = Duration::from_millis(500);

/// How a wait for the slot ended.
#[derive(Debug)]
pub(crate) enum Waited {
    /// Nobody holds the slot: start a session now.
    Released,
    Shutdown,
    /// The catalog could not be read: the caller retries with its backoff.
    Failed(PipelineError),
}

/// Waits until nobody holds the slot (see the module docs). `last_holder`: the server
/// process logged last, kept across waits so a holder is logged once.
pub(crate) async fn wait_for_release(
    s: &Settings,
    metrics: &Metrics,
    last_holder: &mut Option<i32>,
    shutdown: &mut watch::Receiver<bool>,
) -> Waited {
    metrics.stream.active.set(0);
    let waited = tokio::select! {
        w = poll(s, metrics, last_holder) => w,
        _ = shutdown.changed() => Waited::Shutdown,
    };
    metrics.health().set_standby(None);
    waited
}

async fn poll(s: &Settings, metrics: &Metrics, last_holder: &mut Option<i32>) -> Waited {
    let mut sql = match ReplicationClient::connect_sql(&s.postgres.server).await {
        Ok(sql) => sql,
        Err(e) => return Waited::Failed(e.into()),
    };
    let slot = &s.source.slot;
    let waited = loop {
        match catalog::slot_holder(&mut sql, slot).await {
            Ok(None) => break Waited::Released,
            Ok(Some(holder)) => {
                let text = texts::slot::held_by(slot, holder.pid, holder.client.as_deref());
                if *last_holder != Some(holder.pid) {
                    *last_holder = Some(holder.pid);
                    tracing::info!("{text}");
                }
                metrics.health().set_standby(Some(text));
            }
            Err(e) => break Waited::Failed(e),
        }
        tokio::time::sleep(POLL_EVERY).await;
    };
    sql.close().await;
    waited
}
