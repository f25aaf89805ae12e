//! The inbox's PostgreSQL side: the schema check, the stored offsets, and one batch per
//! transaction: the inbox's write lock, which of its event ids are stored already (one
//! indexed lookup in every day's partition), a binary COPY of the others straight into
//! `messages`, the rejected rows, the offsets, COMMIT.
//!
//! Invariants:
//! - a batch's messages, rejected rows and offsets commit together or not at all;
//! - an event id is stored once per topic (or once in all, `[inbox] dedup = "global"`)
//!   while its day is kept: the batch leaves out the ids `messages` holds and the repeats
//!   within it. `messages` is partitioned by day, so no key makes an id unique by
//!   itself: writers of one inbox (instances of a group, or of several groups) take
//!   turns instead, by a lock on the `offsets` table held from before the lookup until
//!   COMMIT, so no other writer stores an id in between. A table lock, not an advisory
//!   one: any role may take any advisory lock, but only roles that may write `offsets`
//!   can take one that conflicts with this (`lock_timeout` bounds the wait, which is
//!   reported and retried);
//! - a record PostgreSQL refuses (a data-class SQLSTATE: a number or text its types or
//!   encoding cannot hold, a key too long for an index) fails only itself: the batch is
//!   written again record by record (a savepoint each), the refused one is rejected or
//!   halts at its offset (`on_invalid`), and the others are stored;
//! - writing the same batch twice (a retry after a connection lost during COMMIT) stores
//!   nothing twice: messages are unique by event id, rejected rows by their position,
//!   and offsets keep the larger value (`GREATEST`), so they never move backwards, even
//!   when a former owner of a partition commits late; only a partition whose log was
//!   rewound (see `ingest.rs`) has its offset written as it is.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use replication::{sqlstate, ReplicationClient};

use crate::copy::{Encoded, COLUMNS};
use crate::ingest::Refused;
use crate::ingest::{Batch, Partition};
use crate::messages::{
    inbox_migration_failed, inbox_partition_missing, inbox_schema_incomplete, inbox_write_lock_waited,
};
use crate::record::Invalid;
use crate::settings::{Dedup, InboxSettings, OnInvalid};
use service::error::{ErrorKind, PipelineError};
use service::sql::{array, ident, query};

/// How long a batch waits for the inbox's write lock before it says so and tries again.
const WRITE_LOCK_TIMEOUT_MS: u64 = 10_000;

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
    /// Records whose event id is stored (or in the batch) under another topic: stored
    /// with `dedup = "topic"`, duplicates with `"global"`.
    pub(crate) collisions: BTreeMap<Arc<str>, u64>,
    pub(crate) rejected: u64,
    /// Records PostgreSQL refused, stored in the rejected table (`on_invalid = reject`).
    pub(crate) refused: Vec<Refused>,
    /// The record PostgreSQL refused with `on_invalid = halt`: its partition's offset
    /// stays at it, the batch's other records are stored.
    pub(crate) halted: Option<Refused>,
}

/// A connection to the inbox's database.
#[derive(Debug)]
pub(crate) struct Store {
    sql: ReplicationClient,
    schema: String,
    group: String,
    dedup: Dedup,
    on_invalid: OnInvalid,
}

impl Store {
    /// Connects and checks the schema (creating it first with `create_schema`).
    pub(crate) async fn connect(s: &InboxSettings) -> Result<Store, PipelineError> {
        let sql = ReplicationClient::connect_sql(&s.postgres).await?;
        let mut store =
            Store { sql, schema: s.schema.clone(), group: s.group.clone(), dedup: s.dedup, on_invalid: s.on_invalid };
        if s.create_schema {
            store.create_schema().await?;
        }
        store.check_schema().await?;
        query(&mut store.sql, "SET application_name = 'walpost inbox'").await?;
        Ok(store)
    }

    /// Applies the inbox's pending migrations to the configured schema, as `walpost migrate
    /// --inbox --schema <schema>` does: instances starting together take turns (the
    /// runner's lock), and on a schema that has them all nothing runs, so no lock a writing
    /// instance holds is taken. A deadlock or a lost connection is retried, as transient.
    async fn create_schema(&mut self) -> Result<(), PipelineError> {
        let plan = migrate::migrate(&mut self.sql, migrate::Set::Inbox, &self.schema, false).await.map_err(|e| {
            let text = format!("{}: {e}", inbox_migration_failed(&self.schema));
            match e.is_transient() {
                true => PipelineError::transient(ErrorKind::Postgres, text),
                false => PipelineError::definite(ErrorKind::Postgres, text),
            }
        })?;
        tracing::info!(
            schema = %self.schema,
            applied = plan.pending().count(),
            recorded = plan.found_in_place().count(),
            "inbox schema up to date"
        );
        Ok(())
    }

    /// The tables the ingest writes exist with the columns it writes.
    pub(crate) async fn check_schema(&mut self) -> Result<(), PipelineError> {
        let r = self
            .sql
            .query(
                "SELECT c.relname, a.attname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped \
                 WHERE n.nspname = $1 AND c.relname IN ('messages', 'offsets', 'rejected', 'deliveries', 'handler_grants')",
                &[Some(&self.schema)],
            )
            .await?;
        let mut have: HashMap<&str, Vec<&str>> = HashMap::new();
        for i in 0..r.rows.len() {
            if let (Some(t), Some(c)) = (r.text(i, 0), r.text(i, 1)) {
                have.entry(t).or_default().push(c);
            }
        }
        let need: [(&str, &[&str]); 5] = [
            ("messages", MESSAGE_COLUMNS),
            // migrations/inbox/0002_inbox_hardening.sql: dedup per topic, handler grants.
            ("deliveries", &["topic", "isolated", "lease_rows"]),
            ("handler_grants", &["handler", "grantee"]),
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
        let topics = array(partitions.iter().map(|(t, _)| t));
        let numbers = array(partitions.iter().map(|(_, p)| p));
        let text = format!(
            "SELECT topic, \"partition\", next_offset FROM {}.offsets \
             WHERE group_id = $1 AND (topic, \"partition\") IN \
               (SELECT * FROM ROWS FROM (pg_catalog.unnest($2::text[]), pg_catalog.unnest($3::int[])))",
            ident(&self.schema),
        );
        let r = self
            .sql
            .query(&text, &[Some(&self.group), Some(&topics), Some(&numbers)])
            .await
            .map_err(|e| self.explain(e))?;
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
    /// for a retry). On an error the transaction is rolled back. A record PostgreSQL
    /// refuses makes the batch be written again record by record, so only it fails.
    pub(crate) async fn write(&mut self, batch: &Batch, copy: &Encoded) -> Result<Written, PipelineError> {
        let mut result = self.write_in_transaction(batch, copy, false).await;
        if let Err(e) = &result {
            // Ends the failed transaction (a no-op when none is open or the connection is gone).
            let _ = self.sql.simple_query("ROLLBACK").await;
            if let Some(code) = e.sqlstate().filter(|c| refuses_one_record(c)) {
                tracing::warn!(
                    sqlstate = code,
                    records = copy.rows.len(),
                    "PostgreSQL refused a record of the batch: writing the batch again record by record to find it"
                );
                result = self.write_in_transaction(batch, copy, true).await;
                if result.is_err() {
                    let _ = self.sql.simple_query("ROLLBACK").await;
                }
            }
        }
        result.map_err(|e| self.explain(e))
    }

    async fn write_in_transaction(
        &mut self,
        batch: &Batch,
        copy: &Encoded,
        one_by_one: bool,
    ) -> Result<Written, replication::Error> {
        let schema = ident(&self.schema);
        let mut written = Written { rejected: batch.rejected.len() as u64, ..Written::default() };
        let mut offsets = batch.offsets.clone();
        // Records to store make the batch a transaction, begun with the write lock in one
        // round trip; without them the batch's one statement below is a transaction itself.
        let in_block = !copy.rows.is_empty();
        if in_block {
            self.sql
                .simple_query(&format!(
                    "BEGIN; SET LOCAL lock_timeout = '{WRITE_LOCK_TIMEOUT_MS}ms'; {}; SET LOCAL lock_timeout = DEFAULT",
                    write_lock(&self.schema)
                ))
                .await?;
            let ids = array(copy.rows.iter().map(|r| &r.event_id));
            let r = self
                .sql
                .query(
                    &format!("SELECT event_id, topic FROM {schema}.messages WHERE event_id = ANY ($1::text[])"),
                    &[Some(&ids)],
                )
                .await?;
            let stored = (0..r.rows.len()).filter_map(|i| Some((r.text(i, 0)?, r.text(i, 1)?)));
            let skip = self.duplicates(stored, &copy.rows, &mut written);
            if skip.iter().any(|s| !*s) {
                let names: Vec<&str> = COLUMNS.iter().map(|(n, _)| *n).collect();
                let text = format!("COPY {schema}.messages ({}) FROM STDIN (FORMAT binary)", names.join(", "));
                if one_by_one {
                    self.copy_one_by_one(&text, copy, &skip, &mut written, &mut offsets).await?;
                } else if skip.iter().any(|s| *s) {
                    self.sql.copy_in(&text, &copy.without(&skip)).await?;
                } else {
                    self.sql.copy_in(&text, &copy.data).await?;
                }
            }
        }
        crate::crash_seam!("inbox-after-copy");
        // Past a halt, its partition's records are read again at the next start.
        let read_again = |topic: &str, partition: i32, offset: i64| {
            written
                .halted
                .as_ref()
                .is_some_and(|h| &*h.topic == topic && h.partition == partition && offset >= h.offset)
        };
        let rejected: Vec<&Refused> = batch
            .rejected
            .iter()
            .chain(&written.refused)
            .filter(|r| !read_again(&r.topic, r.partition, r.offset))
            .collect();
        let (advanced, rewound): (Vec<_>, Vec<_>) = offsets.iter().partition(|(p, _)| !batch.rewound.contains(*p));
        if !(rejected.is_empty() && offsets.is_empty()) {
            // The rows of each table are columns of arrays, one parameter each, zipped by
            // ROWS FROM (the multi-argument unnest is that, but only unqualified): one
            // statement however many rows. A late write of a former owner never moves an
            // offset back (GREATEST); a rewound log does (its records were read again from
            // a lower offset, and stored). The two offset inserts touch other partitions.
            let text = format!(
                "WITH rejected AS (\
                   INSERT INTO {schema}.rejected (topic, \"partition\", \"offset\", reason) \
                   SELECT * FROM ROWS FROM (pg_catalog.unnest($1::text[]), pg_catalog.unnest($2::int[]), \
                     pg_catalog.unnest($3::bigint[]), pg_catalog.unnest($4::text[])) \
                   ON CONFLICT DO NOTHING), \
                 advanced AS (\
                   INSERT INTO {schema}.offsets (group_id, topic, \"partition\", next_offset) \
                   SELECT $5::text, * FROM ROWS FROM (pg_catalog.unnest($6::text[]), \
                     pg_catalog.unnest($7::int[]), pg_catalog.unnest($8::bigint[])) \
                   ON CONFLICT (group_id, topic, \"partition\") \
                   DO UPDATE SET next_offset = GREATEST({schema}.offsets.next_offset, EXCLUDED.next_offset)), \
                 rewound AS (\
                   INSERT INTO {schema}.offsets (group_id, topic, \"partition\", next_offset) \
                   SELECT $5::text, * FROM ROWS FROM (pg_catalog.unnest($9::text[]), \
                     pg_catalog.unnest($10::int[]), pg_catalog.unnest($11::bigint[])) \
                   ON CONFLICT (group_id, topic, \"partition\") DO UPDATE SET next_offset = EXCLUDED.next_offset) \
                 SELECT 1"
            );
            let params = [
                array(rejected.iter().map(|r| &r.topic)),
                array(rejected.iter().map(|r| r.partition)),
                array(rejected.iter().map(|r| r.offset)),
                array(rejected.iter().map(|r| &r.why)),
                self.group.clone(),
                array(advanced.iter().map(|((t, _), _)| t)),
                array(advanced.iter().map(|((_, p), _)| p)),
                array(advanced.iter().map(|(_, next)| next)),
                array(rewound.iter().map(|((t, _), _)| t)),
                array(rewound.iter().map(|((_, p), _)| p)),
                array(rewound.iter().map(|(_, next)| next)),
            ];
            let params: Vec<Option<&str>> = params.iter().map(|p| Some(p.as_str())).collect();
            self.sql.query(&text, &params).await?;
        }
        if in_block {
            self.sql.simple_query("COMMIT").await?;
        }
        Ok(written)
    }

    /// Which rows of the batch are duplicates (`true`: left out), given the (event id,
    /// topic) pairs `messages` holds for the batch's ids; counts them, the stored ones and
    /// the collisions into `written`.
    fn duplicates<'a>(
        &self,
        stored: impl Iterator<Item = (&'a str, &'a str)>,
        rows: &'a [super::copy::Row],
        written: &mut Written,
    ) -> Vec<bool> {
        let mut seen: std::collections::HashSet<(&str, &str)> = std::collections::HashSet::new();
        let mut topics_of: HashMap<&str, &str> = HashMap::new();
        for (id, topic) in stored {
            seen.insert((id, topic));
            topics_of.entry(id).or_insert(topic);
        }
        // The first of repeats within the batch stays.
        rows.iter()
            .map(|row| {
                let other_topic = topics_of.get(&*row.event_id).is_some_and(|t| *t != &*row.topic)
                    && !seen.contains(&(&*row.event_id, &*row.topic));
                if other_topic {
                    *written.collisions.entry(row.topic.clone()).or_default() += 1;
                }
                let duplicate = !seen.insert((&row.event_id, &row.topic))
                    || (self.dedup == Dedup::Global && topics_of.contains_key(&*row.event_id) && other_topic);
                topics_of.entry(&row.event_id).or_insert(&row.topic);
                let counts = if duplicate { &mut written.duplicates } else { &mut written.stored };
                *counts.entry(row.topic.clone()).or_default() += 1;
                duplicate
            })
            .collect()
    }

    /// The batch's rows one by one, each behind a savepoint: a row PostgreSQL refuses
    /// with a data-class SQLSTATE is rejected alone, or (`on_invalid = halt`) stops its
    /// partition there (`offsets` then stays at it, and its later rows are left out).
    async fn copy_one_by_one(
        &mut self,
        text: &str,
        copy: &Encoded,
        skip: &[bool],
        written: &mut Written,
        offsets: &mut BTreeMap<Partition, i64>,
    ) -> Result<(), replication::Error> {
        for (i, row) in copy.rows.iter().enumerate() {
            if skip.get(i).copied().unwrap_or(true) {
                continue;
            }
            if let Some(h) = &written.halted {
                if h.topic == row.topic && h.partition == row.partition {
                    // Read again at the next start, from the halted record.
                    if let Some(n) = written.stored.get_mut(&row.topic) {
                        *n = n.saturating_sub(1);
                    }
                    continue;
                }
            }
            self.sql.simple_query("SAVEPOINT walpost_record").await?;
            match self.sql.copy_in(text, &copy.only(i)).await {
                Ok(_) => {
                    self.sql.simple_query("RELEASE SAVEPOINT walpost_record").await?;
                }
                Err(e) => {
                    let Some(code) = e.sqlstate().filter(|c| refuses_one_record(c)).map(str::to_owned) else {
                        return Err(e);
                    };
                    self.sql.simple_query("ROLLBACK TO SAVEPOINT walpost_record").await?;
                    let refused = Refused {
                        topic: row.topic.clone(),
                        partition: row.partition,
                        offset: row.offset,
                        why: Invalid::RefusedByPostgres { sqlstate: code },
                    };
                    if let Some(n) = written.stored.get_mut(&row.topic) {
                        *n = n.saturating_sub(1);
                    }
                    if self.on_invalid == OnInvalid::Halt {
                        offsets.insert((row.topic.clone(), row.partition), row.offset);
                        written.halted = Some(refused);
                    } else {
                        written.refused.push(refused);
                    }
                }
            }
        }
        Ok(())
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
        // Another session holds a lock that conflicts with the write lock (a role that may
        // write the offsets table, a long transaction, an ALTER): said, then retried.
        if e.sqlstate() == Some(sqlstate::LOCK_NOT_AVAILABLE) {
            return PipelineError::transient(
                ErrorKind::Postgres,
                inbox_write_lock_waited(&self.schema, WRITE_LOCK_TIMEOUT_MS),
            )
            .caused_by(e);
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

/// A data-class SQLSTATE: PostgreSQL refused a value of one record (22xxx: a number out
/// of range, text the encoding cannot hold; 54xxx: an index row too long), not the batch.
fn refuses_one_record(code: &str) -> bool {
    code.starts_with("22") || code.starts_with("54")
}

/// How the retries on PostgreSQL wait: from 100 ms, doubling, up to 10 s.
pub(crate) fn retry_backoff() -> backoff::Backoff {
    backoff::Backoff::new(std::time::Duration::from_millis(100), std::time::Duration::from_secs(10))
}

/// A new connection after a transient failure: `None` when it failed transiently again.
pub(crate) async fn reconnect(s: &InboxSettings) -> Result<Option<Store>, PipelineError> {
    match Store::connect(s).await {
        Ok(store) => Ok(Some(store)),
        Err(e) if e.is_transient() => Ok(None),
        Err(e) => Err(e),
    }
}

/// Takes the inbox's write lock until the end of the transaction: the `offsets` table of
/// the schema in SHARE ROW EXCLUSIVE mode (it conflicts with itself, so every writer of one
/// inbox takes turns; reading the table does not conflict with it). The caller bounds
/// the wait (`lock_timeout`).
pub(crate) fn write_lock(schema: &str) -> String {
    format!("LOCK TABLE {}.offsets IN SHARE ROW EXCLUSIVE MODE", ident(schema))
}
