//! Watches that every outbox table still exists and is still streamed by the
//! publication. Neither a DROP nor a publication change is in the replication stream:
//! without this check, rows of a re-created outbox would never be decoded while the
//! slot is confirmed past them, silently. Armed once the tables have been seen
//! streamable or the stream runs, so a misconfiguration at start is reported by the
//! stream's start-up checks instead.

use replication::ReplicationClient;

use crate::error::PipelineError;
use crate::postgres::catalog;
use crate::settings::SourceSettings;

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct OutboxWatch {
    pub armed: bool,
    oids: Vec<String>,
}

impl OutboxWatch {
    /// `Ok(Some(message))`: fatal, stop with it. `Err`: the query failed (reconnect).
    pub(crate) async fn check(
        &mut self,
        sql: &mut ReplicationClient,
        source: &SourceSettings,
    ) -> Result<Option<String>, PipelineError> {
        let mut oids = Vec::with_capacity(source.outboxes.len());
        for outbox in &source.outboxes {
            let r = sql
                .query("SELECT pg_catalog.to_regclass($1)::oid::text AS oid", &[Some(outbox.table.quoted().as_str())])
                .await?;
            match r.first("oid") {
                Some(oid) => oids.push(oid.to_owned()),
                None if self.armed => {
                    return Ok(Some(texts::outbox::changed(&texts::outbox::dropped(&outbox.table))));
                }
                None => return Ok(None),
            }
        }
        match catalog::publication_state(sql, source).await {
            // Not created yet (the stream creates it); dropped, the walsender says so.
            Ok(catalog::Publication::Missing) => return Ok(None),
            Ok(catalog::Publication::Ready | catalog::Publication::ReadyForAllTables) => {}
            Err(e) if !e.is_transient() && self.armed => return Ok(Some(texts::outbox::changed(e.message()))),
            Err(e) if !e.is_transient() => return Ok(None),
            Err(e) => return Err(e),
        }
        if self.armed && !self.oids.is_empty() && oids != self.oids {
            // Replaced and published again (migrations/outbox/0002 does both in one
            // transaction, losing nothing); a gap between the two would lose rows.
            tracing::warn!(
                table = %source.table(),
                "{}",
                texts::outbox::RECREATED
            );
        }
        self.armed = true;
        self.oids = oids;
        Ok(None)
    }
}
