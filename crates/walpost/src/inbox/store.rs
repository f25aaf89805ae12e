//! The inbox's PostgreSQL side: the schema check, the stored offsets, and one batch per
//! transaction: the inbox's write lock, which of its event ids are stored already (one
//! indexed lookup in every day's partition), a binary COPY of the others straight into
//! `messages`, the rejected rows, the offsets, COMMIT.
//!
//! Invariants:
//! - a batch's messages, rejected rows and offsets commit together or not at all;
//! - an event id is stored once while its day is kept: the batch leaves out the ids
//!   `messages` holds and the repeats within it. `messages` is partitioned by day, so no
//!   key makes `event_id` unique by itself: writers of one inbox (instances of a group,
//!   or of several groups) take turns instead, by a transaction-level advisory lock held
//!   from before the lookup until COMMIT, so no other writer stores an id in between;
//! - writing the same batch twice (a retry after a connection lost during COMMIT) stores
//!   nothing twice: messages are unique by event id, rejected rows by their position,
//!   and offsets keep the larger value (`GREATEST`), so they never move backwards, even
//!   when a former owner of a partition commits late; only a partition whose log was
//!   rewound (see `ingest.rs`) has its offset written as it is.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use replication::{sqlstate, ReplicationClient};

use super::copy::{Encoded, COLUMNS};
use super::ingest::{Batch, Partition};
use crate::error::{ErrorKind, PipelineError};
use crate::postgres::messages::{inbox_migration_failed, inbox_partition_missing, inbox_schema_incomplete};
use crate::postgres::sql::{ident, literal, query};
use crate::settings::inbox::InboxSettings;

/// The inbox migration, applied by `--create-schema` (schema `inbox` renamed to the
/// configured one).
pub(crate) const MIGRATION: &str = include_str!("../../../../migrations/0004_inbox.sql");

/// The columns of `messages` the ingest writes.
const MESSAGE_COLUMNS: &[&str] = &[
    "event_id",
    "topic",
    "partition",
    "offset",
    "key",
    "headers",
    "payload",
    "payload_json",
    "event_type",
    "aggregate_id",
    "occurred_at",
];

/// What one written batch stored, per topic.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Written {
    pub(crate) stored: BTreeMap<Arc<str>, u64>,
    /// Records whose event id was already stored.
    pub(crate) duplicates: BTreeMap<Arc<str>, u64>,
    pub(crate) rejected: u64,
}

/// A connection to the inbox's database.
#[derive(Debug)]
pub(crate) struct Store {
    sql: ReplicationClient,
    schema: String,
    group: String,
}

impl Store {
    /// Connects and checks the schema (creating it first with `create_schema`).
    pub(crate) async fn connect(s: &InboxSettings) -> Result<Store, PipelineError> {
        let sql = ReplicationClient::connect_sql(&s.postgres).await?;
        let mut store = Store { sql, schema: s.schema.clone(), group: s.group.clone() };
        if s.create_schema {
            store.create_schema().await?;
        }
        store.check_schema().await?;
        query(&mut store.sql, "SET application_name = 'walpost inbox'").await?;
        Ok(store)
    }

    /// Applies the migration (idempotent) into the configured schema, in one transaction
    /// that instances starting together take in turn (an advisory lock: two concurrent
    /// `CREATE TABLE IF NOT EXISTS` of one table can fail). On a complete schema it takes
    /// no lock a writing instance holds; a deadlock or a timeout is retried, as transient.
    async fn create_schema(&mut self) -> Result<(), PipelineError> {
        let text = format!(
            "SELECT pg_advisory_xact_lock(hashtext({}));\n{}",
            literal(&format!("walpost inbox schema {}", self.schema)),
            migration_for(&self.schema)
        );
        query(&mut self.sql, &text).await.map_err(|e| e.context(inbox_migration_failed(&self.schema)))?;
        tracing::info!(schema = %self.schema, "inbox schema created or already present");
        Ok(())
    }

    /// The tables the ingest writes exist with the columns it writes.
    pub(crate) async fn check_schema(&mut self) -> Result<(), PipelineError> {
        let r = query(
            &mut self.sql,
            &format!(
                "SELECT c.relname, a.attname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped \
                 WHERE n.nspname = {} AND c.relname IN ('messages', 'offsets', 'rejected')",
                literal(&self.schema)
            ),
        )
        .await?;
        let mut have: HashMap<&str, Vec<&str>> = HashMap::new();
        for i in 0..r.rows.len() {
            if let (Some(t), Some(c)) = (r.text(i, 0), r.text(i, 1)) {
                have.entry(t).or_default().push(c);
            }
        }
        let need: [(&str, &[&str]); 3] = [
            ("messages", MESSAGE_COLUMNS),
            ("offsets", &["group_id", "topic", "partition", "next_offset"]),
            ("rejected", &["topic", "partition", "offset", "reason"]),
        ];
        let mut missing = Vec::new();
        for (table, columns) in need {
            match have.get(table) {
                None => missing.push(format!("table {}.{table}", self.schema)),
                Some(present) => {
                    for c in columns.iter().filter(|c| !present.contains(c)) {
                        missing.push(format!("column {}.{table}.{c}", self.schema));
                    }
                }
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        Err(PipelineError::definite(
            ErrorKind::Config,
            inbox_schema_incomplete(&self.schema, &format!("missing: {}", missing.join(", "))),
        ))
    }

    /// The stored next offset of each of `partitions` that has one.
    pub(crate) async fn stored_offsets(
        &mut self,
        partitions: &[Partition],
    ) -> Result<HashMap<Partition, i64>, PipelineError> {
        if partitions.is_empty() {
            return Ok(HashMap::new());
        }
        let wanted: Vec<String> = partitions.iter().map(|(t, p)| format!("({}, {p})", literal(t))).collect();
        let text = format!(
            "SELECT topic, \"partition\", next_offset FROM {}.offsets \
             WHERE group_id = {} AND (topic, \"partition\") IN ({})",
            ident(&self.schema),
            literal(&self.group),
            wanted.join(", ")
        );
        let r = self.sql.simple_query(&text).await.map_err(|e| self.explain(e))?;
        let mut out = HashMap::new();
        for i in 0..r.rows.len() {
            let (Some(topic), Some(p), Some(next)) = (r.text(i, 0), r.text(i, 1), r.text(i, 2)) else { continue };
            let (Ok(p), Ok(next)) = (p.parse::<i32>(), next.parse::<i64>()) else {
                return Err(PipelineError::definite(
                    ErrorKind::Internal,
                    format!("{}.offsets holds a row walpost cannot read ({topic})", self.schema),
                ));
            };
            if let Some(key) = partitions.iter().find(|(t, q)| &**t == topic && *q == p) {
                out.insert(key.clone(), next);
            }
        }
        Ok(out)
    }

    /// Writes `batch` in one transaction (`copy` is its COPY stream, kept by the caller
    /// for a retry). On an error the transaction is rolled back.
    pub(crate) async fn write(&mut self, batch: &Batch, copy: &Encoded) -> Result<Written, PipelineError> {
        let result = self.write_in_transaction(batch, copy).await;
        if result.is_err() {
            // Ends the failed transaction (a no-op when none is open or the connection is gone).
            let _ = self.sql.simple_query("ROLLBACK").await;
        }
        result.map_err(|e| self.explain(e))
    }

    async fn write_in_transaction(&mut self, batch: &Batch, copy: &Encoded) -> Result<Written, replication::Error> {
        let schema = ident(&self.schema);
        self.sql.simple_query("BEGIN").await?;
        let mut written = Written { rejected: batch.rejected.len() as u64, ..Written::default() };
        if !copy.rows.is_empty() {
            self.sql.simple_query(&write_lock(&self.schema)).await?;
            let ids: Vec<String> = copy.rows.iter().map(|r| literal(&r.event_id)).collect();
            let r = self
                .sql
                .simple_query(&format!(
                    "SELECT event_id FROM {schema}.messages WHERE event_id = ANY (ARRAY[{}]::text[])",
                    ids.join(", ")
                ))
                .await?;
            let mut seen: std::collections::HashSet<&str> = (0..r.rows.len()).filter_map(|i| r.text(i, 0)).collect();
            // Left out: ids stored before, and repeats within the batch (the first stays).
            let skip: Vec<bool> = copy.rows.iter().map(|row| !seen.insert(&row.event_id)).collect();
            for (row, _) in copy.rows.iter().zip(&skip).filter(|(_, s)| **s) {
                *written.duplicates.entry(row.topic.clone()).or_default() += 1;
            }
            for (row, _) in copy.rows.iter().zip(&skip).filter(|(_, s)| !**s) {
                *written.stored.entry(row.topic.clone()).or_default() += 1;
            }
            if skip.iter().any(|s| !*s) {
                let names: Vec<&str> = COLUMNS.iter().map(|(n, _)| *n).collect();
                let text = format!("COPY {schema}.messages ({}) FROM STDIN (FORMAT binary)", names.join(", "));
                if skip.iter().any(|s| *s) {
                    self.sql.copy_in(&text, &copy.without(&skip)).await?;
                } else {
                    self.sql.copy_in(&text, &copy.data).await?;
                }
            }
        }
        crate::crash_seam!("inbox-after-copy");
        let mut text = String::new();
        if !batch.rejected.is_empty() {
            let rows: Vec<String> = batch
                .rejected
                .iter()
                .map(|r| {
                    format!("({}, {}, {}, {})", literal(&r.topic), r.partition, r.offset, literal(&r.why.to_string()))
                })
                .collect();
            text.push_str(&format!(
                "INSERT INTO {schema}.rejected (topic, \"partition\", \"offset\", reason) VALUES {} ON CONFLICT DO NOTHING;",
                rows.join(", ")
            ));
        }
        // A late write of a former owner never moves an offset back (GREATEST); a rewound
        // log does (its records were read again from a lower offset, and stored).
        for (rewound, update) in [
            (false, format!("GREATEST({schema}.offsets.next_offset, EXCLUDED.next_offset)")),
            (true, "EXCLUDED.next_offset".into()),
        ] {
            let rows: Vec<String> = batch
                .offsets
                .iter()
                .filter(|(p, _)| batch.rewound.contains(*p) == rewound)
                .map(|((t, p), next)| format!("({}, {}, {p}, {next})", literal(&self.group), literal(t)))
                .collect();
            if !rows.is_empty() {
                text.push_str(&format!(
                    "INSERT INTO {schema}.offsets (group_id, topic, \"partition\", next_offset) VALUES {} \
                     ON CONFLICT (group_id, topic, \"partition\") DO UPDATE SET next_offset = {update};",
                    rows.join(", ")
                ));
            }
        }
        text.push_str("COMMIT");
        self.sql.simple_query(&text).await?;
        Ok(written)
    }

    /// A server error about the schema is definite, with the fix; the rest keeps its class.
    fn explain(&self, e: replication::Error) -> PipelineError {
        let schema_gone = matches!(
            e.sqlstate(),
            Some(sqlstate::UNDEFINED_TABLE | sqlstate::UNDEFINED_COLUMN | sqlstate::UNDEFINED_FUNCTION)
        );
        // 23514 is what PostgreSQL answers for a row no partition takes (and the inbox's
        // tables hold no other CHECK a batch can break: next_offset >= 0 always holds).
        if e.sqlstate() == Some(sqlstate::CHECK_VIOLATION) {
            return PipelineError::definite(ErrorKind::Config, inbox_partition_missing(&self.schema)).caused_by(e);
        }
        if schema_gone {
            let what = e.to_string();
            return PipelineError::definite(ErrorKind::Config, inbox_schema_incomplete(&self.schema, &what))
                .caused_by(e);
        }
        PipelineError::from(e)
    }

    pub(crate) async fn close(self) {
        self.sql.close().await;
    }
}

/// Takes the inbox's write lock until the end of the transaction: keyed on the schema,
/// so every writer of one inbox takes the same one.
pub(crate) fn write_lock(schema: &str) -> String {
    format!("SELECT pg_advisory_xact_lock(hashtextextended({}, 0))", literal(&format!("walpost inbox write {schema}")))
}

/// The migration text with schema `inbox` renamed to `schema`: every `inbox.` qualifier
/// and the `CREATE SCHEMA` line (the migration names nothing else `inbox`).
pub(crate) fn migration_for(schema: &str) -> String {
    if schema == "inbox" {
        return MIGRATION.to_owned();
    }
    let quoted = ident(schema);
    MIGRATION
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .map(|l| l.replace("CREATE SCHEMA IF NOT EXISTS inbox;", &format!("CREATE SCHEMA IF NOT EXISTS {quoted};")))
        .map(|l| l.replace("inbox.", &format!("{quoted}.")))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_migration_moves_to_another_schema_whole() {
        let text = migration_for("billing_inbox");
        assert!(text.contains("CREATE SCHEMA IF NOT EXISTS \"billing_inbox\";"));
        assert!(text.contains("CREATE TABLE IF NOT EXISTS \"billing_inbox\".messages"));
        assert!(!text.contains(" inbox."), "no qualifier left in the default schema");
        assert_eq!(migration_for("inbox"), MIGRATION);
    }
}
