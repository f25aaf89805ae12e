//! Emits an empty transactional logical message every interval, so a quiet database on
//! a busy server still gives the slot something to confirm. Decoding on a standby, the
//! message is written on the primary (a standby cannot write WAL) and reaches the slot
//! through replication; without a reachable primary the heartbeat is off, said once.

use std::time::Duration;

use backoff::sleep_or_shutdown;
use replication::ReplicationClient;
use tokio::sync::watch;

use crate::postgres::topology::{connect_writer, PrimaryNotice};
use crate::settings::PostgresSettings;

/// Runs until `shutdown`; failures are logged at debug level and retried.
pub(crate) async fn run(postgres: PostgresSettings, interval: Duration, mut shutdown: watch::Receiver<bool>) {
    let mut sql: Option<ReplicationClient> = None;
    let notice = PrimaryNotice::default();
    loop {
        if sql.is_none() {
            match connect_writer(&postgres).await {
                Ok(c) => {
                    notice.on("the heartbeat");
                    sql = Some(c);
                }
                Err(e) if postgres.standby_decoding() => notice.off(
                    "the heartbeat",
                    "a quiet outbox may hold WAL on the standby until other tables change",
                    &e,
                ),
                Err(e) => tracing::debug!("heartbeat cannot connect: {e}"),
            }
        }
        if let Some(conn) = sql.as_mut() {
            if let Err(e) =
                conn.simple_query("SELECT pg_catalog.pg_logical_emit_message(true, 'walpost.heartbeat', '')").await
            {
                tracing::debug!("heartbeat failed: {e}");
                sql = None;
            }
        }
        if sleep_or_shutdown(interval, &mut shutdown).await {
            return;
        }
    }
}
