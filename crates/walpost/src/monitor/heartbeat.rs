//! Emits an empty transactional logical message every interval, so a quiet database on
//! a busy server still gives the slot something to confirm.

use std::time::Duration;

use replication::ReplicationClient;

use crate::settings::Settings;

/// Runs until the process ends; failures are logged at debug level and retried.
pub(crate) async fn run(s: Settings, interval: Duration) {
    let mut sql: Option<ReplicationClient> = None;
    let mut tick = tokio::time::interval(interval);
    loop {
        tick.tick().await;
        if sql.is_none() {
            sql = ReplicationClient::connect_sql(&s.postgres).await.ok();
        }
        if let Some(conn) = sql.as_mut() {
            if let Err(e) = conn.simple_query("SELECT pg_logical_emit_message(true, 'walpost.heartbeat', '')").await {
                tracing::debug!("heartbeat failed: {e}");
                sql = None;
            }
        }
    }
}
