//! Initial snapshot: publishes rows that already exist, consistently with the stream.
//!
//! The slot is created with an exported snapshot; the rows are read in that snapshot
//! (REPEATABLE READ + SET TRANSACTION SNAPSHOT) through a server-side cursor in id
//! order, in bounded chunks, and routed exactly like streamed rows (plus the header
//! `walpost.snapshot: true`); streaming then starts at the slot's consistent point.
//! Every row committed before the snapshot comes from the snapshot, every row after it
//! from the stream: none twice, none missing.
//!
//! Records go through the same produce window (in-flight records and bytes, the
//! first-record-per-topic barrier, the watchdog) and the same permanent-error policy
//! (halt or dead letter) as streamed ones.
//!
//! Crash safety (`state`): before the slot is created, a row in
//! `<outbox schema>.walpost_snapshots` records that a snapshot for this slot has
//! started; it is marked finished only after Kafka acknowledged every snapshot record.
//! A walpost that finds an unfinished row drops the slot and starts the snapshot over
//! on a new one: the rows published by the interrupted attempt are published again
//! (at-least-once), none is lost.
//!
//! `--snapshot-filter` is checked by the server's parser as part of exactly the query
//! the cursor runs (one statement, never executed by the check), so a filter can
//! neither hold a second statement nor change what else the query does.
//!
//! Memory: one FETCH chunk plus the produce window, whatever the table size.
//!
//! A backfill (`--snapshot initial_only`, one outbox table) that halts on a row Kafka
//! refuses or that cannot be routed names where to resume: the lowest row (in id order)
//! that Kafka has not acknowledged, and the filter that selects it and every row after
//! it ([`texts::replay::backfill_resume_hint`]), so a replay need not start over from its first row.

mod progress;
pub mod replay;
mod state;

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use pgoutput::{ColumnValue, Lsn, TupleData};
use replication::ReplicationClient;
use router::Router;

use crate::error::{ErrorKind, PipelineError};
use crate::kafka::{self, DeliveryMemo, Event, Failure, Original, Outgoing, PermanentErrorPolicy, ProduceWindow};
use crate::postgres::catalog;
use crate::postgres::sql::ident;
use crate::settings::{Outbox, ReplayMark, Settings, SnapshotMode, SnapshotSettings, SourceSettings};
use crate::telemetry::Metrics;
use progress::Progress as SnapshotProgress;
use router::Record;

use crate::kafka::config::Transactional;
use crate::kafka::exactly_once::progress::Progress;
use crate::kafka::exactly_once::transaction::transaction_error;
pub(crate) use state::{mark_finished, mark_started, unfinished};

/// Header marking a record that came from the snapshot rather than the stream.
pub const HEADER_SNAPSHOT: &str = "walpost.snapshot";

/// Header marking a replayed record; its value is the replay's id.
pub const HEADER_REPLAY: &str = "walpost.replay";

/// Topics counted one by one in an [`Outcome`]; more are summed under "(other)".
const MAX_COUNTED_TOPICS: usize = 1000;

/// What a snapshot did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Rows read from the outbox tables.
    pub rows: u64,
    /// Records per topic (handed to Kafka and acknowledged; counted only, for a dry run).
    pub per_topic: BTreeMap<String, u64>,
}

/// Rows fetched per round trip.
const FETCH_ROWS: usize = 2000;

/// An exactly-once snapshot is one Kafka transaction: it may stay open this long (the
/// brokers' default `transaction.max.timeout.ms`, 15 minutes).
pub const TRANSACTION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(900);

/// `--delivery exactly-once`: the snapshot's Kafka transaction.
#[derive(Debug, Clone)]
pub struct Transaction {
    pub producer: Transactional,
    /// Committed with the rows: where the stream goes on.
    pub progress: Option<ProgressRecord>,
}

/// A progress record to commit with the snapshot.
#[derive(Debug, Clone)]
pub struct ProgressRecord {
    pub topic: String,
    pub key: String,
    pub value: Progress,
}

/// What a snapshot record stands for: its outbox table, event id, and its place in the
/// cursor's order.
#[derive(Debug, Clone)]
struct RowTag {
    outbox: usize,
    event_id: Bytes,
    seq: u64,
    /// The record's topic (set when it is queued), for the per-topic counts.
    topic: Option<Arc<str>>,
}

/// The filter that resumes a backfill at row `id`: the old filter (if any) and the id
/// column from `id` on, compared in the column's own type (as the cursor orders).
///
/// Text for the operator to pass to `--snapshot-filter`, which is SQL by contract: the
/// id is quoted into it here, and walpost itself never sends this text.
pub fn resume_filter(old: Option<&str>, id_field: &str, id: &str) -> String {
    let simple = id_field.chars().next().is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && id_field.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    let column = if simple { id_field.to_owned() } else { ident(id_field) };
    match old {
        Some(f) => format!("({f}) AND {column} >= {}", replication::quote_literal(id)),
        None => format!("{column} >= {}", replication::quote_literal(id)),
    }
}

/// The values of the cursor query's `$n` parameters (a replay's range and condition).
fn filter_params(snapshot: &SnapshotSettings) -> Vec<Option<&str>> {
    snapshot.replay.iter().flat_map(|r| &r.filter_params).map(|v| Some(v.as_str())).collect()
}

/// The query the cursor runs for one outbox table.
pub(crate) fn cursor_query(snapshot: &SnapshotSettings, outbox: &Outbox) -> String {
    let filter = snapshot.filter.as_deref().map(|f| format!(" WHERE ({f})")).unwrap_or_default();
    // t.*: the simple query protocol returns every value in its text form, the same
    // bytes pgoutput sends, and the row description names and types the columns just
    // as a Relation message does; ORDER BY sorts by the id column's own type.
    format!("SELECT t.* FROM {} AS t{filter} ORDER BY t.{}", outbox.table.quoted(), ident(&outbox.router.id_field))
}

/// Checks `--snapshot-filter` is one valid condition on every outbox table, by having
/// the server parse the cursor's query (never running it).
pub async fn validate_filter(
    sql: &mut ReplicationClient,
    snapshot: &SnapshotSettings,
    source: &SourceSettings,
) -> Result<(), PipelineError> {
    let Some(filter) = &snapshot.filter else { return Ok(()) };
    for outbox in &source.outboxes {
        sql.parse_only(&cursor_query(snapshot, outbox)).await.map_err(|e| {
            PipelineError::definite(ErrorKind::Config, format!(
                "--snapshot-filter \"{}\" is not a valid condition on {}: {e}; nothing was published (the filter must be one SQL expression, e.g. \"published_at IS NULL\")",
                filter, outbox.table
            ))
            .caused_by(e)
        })?;
    }
    Ok(())
}

/// Reads every outbox table (in the exported snapshot `snapshot_name`, or in a fresh
/// REPEATABLE READ snapshot when `None`), publishes every row and waits until Kafka
/// acknowledged all of them (a replay's dry run only routes and counts); a replay's
/// `watch` counts along and may stop it at a chunk boundary.
pub async fn run(
    sql: &mut ReplicationClient,
    s: &Settings,
    snapshot_name: Option<&str>,
    metrics: &Metrics,
    memo: &mut DeliveryMemo,
    transaction: Option<Transaction>,
    watch: Option<Arc<replay::ReplayWatch>>,
) -> Result<Outcome, PipelineError> {
    let window = kafka::open_window(s.kafka()?, &s.stream, metrics, transaction.as_ref().map(|t| &t.producer))?;
    if let Some(t) = &transaction {
        let sink =
            window.sink().ok_or_else(|| PipelineError::transient(ErrorKind::Kafka, "the Kafka producer is closed"))?;
        sink.init_transactions(t.producer.timeout).await.map_err(transaction_error)?;
        sink.begin_transaction().map_err(transaction_error)?;
    }
    let mut snapshot = Snapshot {
        s,
        window,
        policy: PermanentErrorPolicy::new(s.kafka()?),
        memo,
        progress: SnapshotProgress::new(metrics.snapshot.clone(), s.snapshot.replay.is_some()).watched(watch),
        trace_context_invalid: metrics.stream.trace_context_invalid.clone(),
        transactional: transaction.is_some(),
        next_seq: 0,
        unacknowledged: BTreeMap::new(),
        halted_on: None,
        per_topic: BTreeMap::new(),
    };
    let mut result = snapshot.publish_all(sql, snapshot_name).await;
    if let (Ok(_), Some(t)) = (&result, &transaction) {
        result = snapshot.commit(t).await.and(result);
    }
    if let (Err(_), Some(t)) = (&result, &transaction) {
        if let Some(sink) = snapshot.window.sink() {
            let _ = sink.abort_transaction(t.producer.timeout.min(std::time::Duration::from_secs(10))).await;
        }
    }
    if let Err(e) = &result {
        if !e.is_transient() {
            if let Some(hint) = snapshot.resume_hint().await {
                result = Err(PipelineError::definite(e.kind(), format!("{}; {hint}", e.message())));
            }
        }
    }
    metrics.snapshot.running.set(0);
    let Snapshot { window, per_topic, .. } = snapshot;
    window.close(std::time::Duration::ZERO, |_| {}).await;
    result.map(|rows| Outcome { rows, per_topic })
}

struct Snapshot<'a> {
    s: &'a Settings,
    window: ProduceWindow<RowTag>,
    policy: PermanentErrorPolicy,
    memo: &'a mut DeliveryMemo,
    progress: SnapshotProgress,
    /// Rows published without their invalid trace context (`walpost_trace_context_invalid_total`).
    trace_context_invalid: prometheus::IntCounter,
    /// One Kafka transaction (exactly-once).
    transactional: bool,
    /// The next row's place in the cursor's order.
    next_seq: u64,
    /// Rows handed to the window and not yet acknowledged (a dead letter in their place
    /// counts as acknowledged), by their place: the first is where a backfill resumes.
    unacknowledged: BTreeMap<u64, Bytes>,
    /// A row the snapshot halted on before handing it to the window.
    halted_on: Option<Bytes>,
    /// Records per topic: acknowledged, or (dry run) routed.
    per_topic: BTreeMap<String, u64>,
}

impl Snapshot<'_> {
    /// Exactly-once: the progress record goes in with the rows, then the commit.
    async fn commit(&mut self, t: &Transaction) -> Result<u64, PipelineError> {
        if let Some(p) = &t.progress {
            let record = Record {
                topic: Arc::from(p.topic.as_str()),
                key: Bytes::from(p.key.clone()),
                value: Some(p.value.encode()),
                headers: Vec::new(),
                event_id: Bytes::new(),
                timestamp_ms: None,
                partition: None,
                trace: router::TraceOutcome::default(),
            };
            let tag = RowTag { outbox: usize::MAX, event_id: Bytes::new(), seq: u64::MAX, topic: None };
            self.window.enqueue(Outgoing { record, timestamp_ms: None, tag, dead_letter: None });
            while !self.window.is_idle() {
                let event = self.next_event().await?;
                self.on_event(event)?;
            }
        }
        let sink = self
            .window
            .sink()
            .ok_or_else(|| PipelineError::transient(ErrorKind::Kafka, "the Kafka producer is closed"))?;
        sink.commit_transaction(t.producer.timeout).await.map_err(transaction_error)?;
        Ok(0)
    }

    /// A backfill of one table halted: waits (at most the shutdown timeout) for what is
    /// in flight, then names the lowest row Kafka has not acknowledged and the filter
    /// that resumes there.
    async fn resume_hint(&mut self) -> Option<String> {
        let s = self.s;
        if s.snapshot.mode != SnapshotMode::InitialOnly || s.source.outboxes.len() != 1 {
            return None;
        }
        let unacknowledged = &mut self.unacknowledged;
        self.window
            .drain(s.stream.shutdown_timeout, |event| {
                if let Event::Delivered { tag, .. } = event {
                    unacknowledged.remove(&tag.seq);
                }
            })
            .await;
        let id = self.unacknowledged.values().next().or(self.halted_on.as_ref())?;
        let id = String::from_utf8_lossy(id).into_owned();
        let outbox = s.source.outboxes.first()?;
        if !filter_params(&s.snapshot).is_empty() {
            // A replay's filter holds parameters, not text to paste: name the row instead.
            return Some(texts::replay::replay_resume_hint(&id, &resume_filter(None, &outbox.router.id_field, &id)));
        }
        Some(texts::replay::backfill_resume_hint(
            &id,
            &resume_filter(s.snapshot.filter.as_deref(), &outbox.router.id_field, &id),
        ))
    }

    async fn publish_all(
        &mut self,
        sql: &mut ReplicationClient,
        snapshot_name: Option<&str>,
    ) -> Result<u64, PipelineError> {
        let s = self.s;
        // One transaction, so every table is read in the same snapshot.
        sql.simple_query("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY").await?;
        if let Some(name) = snapshot_name {
            sql.set_transaction_snapshot(name).await?;
        }
        let mut estimate = 0;
        for outbox in &s.source.outboxes {
            estimate += match s.snapshot.filter {
                Some(_) => {
                    state::estimate_query_rows(sql, &cursor_query(&s.snapshot, outbox), &filter_params(&s.snapshot))
                        .await
                        .unwrap_or(0)
                }
                None => state::estimate_rows(sql, &outbox.table).await.unwrap_or(0),
            };
        }
        self.progress.start(estimate);
        let mut sent: u64 = 0;
        for (index, outbox) in s.source.outboxes.iter().enumerate() {
            if self.progress.stops_here() {
                break;
            }
            sent += self.publish_table(sql, index, outbox).await?;
        }
        while !self.window.is_idle() {
            let event = self.next_event().await?;
            self.on_event(event)?;
        }
        sql.simple_query("COMMIT").await?;
        self.progress.finish();
        tracing::info!(tables = s.source.outboxes.len(), rows = sent, "snapshot finished");
        Ok(sent)
    }

    async fn publish_table(
        &mut self,
        sql: &mut ReplicationClient,
        index: usize,
        outbox: &Outbox,
    ) -> Result<u64, PipelineError> {
        let table = &outbox.table;
        let mut router =
            Router::new(outbox.router.clone()).map_err(|e| PipelineError::definite(ErrorKind::Config, e))?;
        let declare =
            format!("DECLARE walpost_snapshot NO SCROLL CURSOR FOR {}", cursor_query(&self.s.snapshot, outbox));
        sql.query(&declare, &filter_params(&self.s.snapshot)).await?;
        tracing::info!(table = %table, filtered = self.s.snapshot.filter.is_some(), "snapshot of table started");
        let fetch = format!("FETCH {FETCH_ROWS} FROM walpost_snapshot");
        let mut resolved = None;
        let mut sent = 0;
        let mut invalid_trace_context = 0u64;
        loop {
            if self.progress.stops_here() {
                break;
            }
            let chunk = sql.simple_query(&fetch).await?;
            if chunk.rows.is_empty() {
                break;
            }
            self.progress.read(chunk.rows.len());
            if resolved.is_none() {
                let columns = chunk
                    .columns
                    .iter()
                    .cloned()
                    .zip(chunk.column_types.iter().copied())
                    .zip(chunk.column_type_modifiers.iter().copied())
                    .map(|((name, oid), typmod)| (name, oid, typmod));
                let relation = catalog::relation_of(table, columns);
                resolved = Some(router.resolve(&relation).map_err(|e| PipelineError::definite(ErrorKind::Config, e))?);
            }
            let Some(rel) = resolved.as_ref() else { break };
            for row in chunk.rows {
                while !self.window.has_room() {
                    let event = self.next_event().await?;
                    self.on_event(event)?;
                }
                let values: Vec<ColumnValue> =
                    row.into_iter().map(|v| v.map_or(ColumnValue::Null, ColumnValue::Text)).collect();
                let tuple = TupleData::from_values(&values);
                let seq = self.next_seq;
                self.next_seq += 1;
                let routed = router.route(rel, &tuple);
                if let Some(ReplayMark { dry_run: true, .. }) = &self.s.snapshot.replay {
                    let topic = match &routed {
                        Ok(record) => record.topic.to_string(),
                        Err(e) => format!("(unroutable: {})", e.class()),
                    };
                    self.count(topic);
                    self.progress.acked();
                    sent += 1;
                    continue;
                }
                let out = match routed {
                    Ok(mut record) => {
                        if record.trace.invalid {
                            self.trace_context_invalid.inc();
                            invalid_trace_context += 1;
                        }
                        match &self.s.snapshot.replay {
                            Some(mark) => record
                                .headers
                                .push((Arc::from(HEADER_REPLAY), Bytes::copy_from_slice(mark.id.as_bytes()))),
                            None => record.headers.push((Arc::from(HEADER_SNAPSHOT), Bytes::from_static(b"true"))),
                        }
                        let tag = RowTag { outbox: index, event_id: record.event_id.clone(), seq, topic: None };
                        match self.memo.poisoned_row(index, &record.event_id).cloned() {
                            Some(failure) => self.dead_letter(&failure, Original::of(&record), tag)?,
                            None => Outgoing { record, timestamp_ms: None, tag, dead_letter: None },
                        }
                    }
                    Err(error) => {
                        crate::error::contract_unavailable(&error)?;
                        let mut breached =
                            crate::error::breached_record(&error, || router.route_unchecked(rel, &tuple));
                        if let Some(record) = breached.as_mut() {
                            match &self.s.snapshot.replay {
                                Some(mark) => record
                                    .headers
                                    .push((Arc::from(HEADER_REPLAY), Bytes::copy_from_slice(mark.id.as_bytes()))),
                                None => record.headers.push((Arc::from(HEADER_SNAPSHOT), Bytes::from_static(b"true"))),
                            }
                        }
                        let (id, key, value) = router.salvage(rel, &tuple);
                        let event_id = id.unwrap_or_default();
                        if !self.policy.dead_letters() {
                            let again = if self.s.snapshot.mode == SnapshotMode::InitialOnly {
                                ""
                            } else {
                                "; the snapshot starts over once fixed"
                            };
                            self.halted_on = Some(event_id.clone());
                            return Err(PipelineError::definite(ErrorKind::Routing, format!(
                                "cannot route a snapshot row of {table} (id={}): {error}{again} (set on_permanent_error = \"dead_letter\" to divert such rows instead of halting)",
                                String::from_utf8_lossy(&event_id)
                            )));
                        }
                        let failure = Failure {
                            class: error.class().to_owned(),
                            message: error.to_string(),
                            original_topic: breached.as_ref().map(|r| r.topic.to_string()).unwrap_or_default(),
                            event_id: event_id.clone(),
                            lsn: Lsn::ZERO,
                            too_large: false,
                        };
                        let original = match &breached {
                            Some(record) => Original::of(record),
                            None => Original {
                                key: key.map(|k| k.to_vec()),
                                value: value.map(|v| v.to_vec()),
                                headers: Vec::new(),
                            },
                        };
                        self.dead_letter(&failure, original, RowTag { outbox: index, event_id, seq, topic: None })?
                    }
                };
                let mut out = out;
                out.tag.topic = Some(out.record.topic.clone());
                self.unacknowledged.insert(seq, out.tag.event_id.clone());
                self.window.enqueue(out);
                if let Some(event) = self.window.pump() {
                    self.on_event(event)?;
                }
                sent += 1;
            }
            self.progress.tick(false);
        }
        sql.simple_query("CLOSE walpost_snapshot").await?;
        if invalid_trace_context > 0 {
            // Once per table, not per row: a backfill can hold many such rows.
            tracing::warn!(
                table = %table,
                rows = invalid_trace_context,
                "snapshot: rows with an invalid traceparent or tracestate were published without it"
            );
        }
        Ok(sent)
    }

    /// One more record for `topic` (bounded: past [`MAX_COUNTED_TOPICS`] topics, the
    /// rest are summed under "(other)").
    fn count(&mut self, topic: String) {
        let key = if self.per_topic.len() < MAX_COUNTED_TOPICS || self.per_topic.contains_key(&topic) {
            topic
        } else {
            "(other)".to_owned()
        };
        *self.per_topic.entry(key).or_default() += 1;
    }

    async fn next_event(&mut self) -> Result<Event<RowTag>, PipelineError> {
        self.window
            .next_event_within()
            .await
            .map_err(|e| PipelineError::transient(ErrorKind::Kafka, format!("{e}; the snapshot starts over")))
    }

    fn dead_letter(
        &self,
        failure: &Failure,
        original: Original,
        tag: RowTag,
    ) -> Result<Outgoing<RowTag>, PipelineError> {
        let record = self.policy.dead_letter(failure, original).ok_or_else(|| {
            PipelineError::definite(ErrorKind::Internal, "a snapshot dead letter outside dead-letter mode")
        })?;
        Ok(Outgoing { record, timestamp_ms: None, tag, dead_letter: Some(failure.class.as_str().into()) })
    }

    fn on_event(&mut self, event: Event<RowTag>) -> Result<(), PipelineError> {
        match event {
            Event::Delivered { tag, .. } => {
                self.unacknowledged.remove(&tag.seq);
                if tag.outbox != usize::MAX {
                    self.progress.acked();
                    if let Some(topic) = tag.topic {
                        self.count(topic.to_string());
                    }
                }
                Ok(())
            }
            Event::Failed { error, .. } => {
                Err(PipelineError::transient(ErrorKind::Kafka, format!("{error}; the snapshot starts over")))
            }
            Event::Rejected { dead_letter: true, rejection, .. } => Err(self.policy.dead_letter_refused(&rejection)),
            Event::Rejected { rejection, .. } if !self.policy.dead_letters() => {
                let then = if self.s.snapshot.mode == SnapshotMode::InitialOnly {
                    ""
                } else {
                    texts::replay::SNAPSHOT_STARTS_OVER
                };
                Err(PipelineError::definite(
                    ErrorKind::Kafka,
                    texts::replay::snapshot_rejected(
                        &rejection.event_id,
                        &rejection.topic,
                        &rejection.code,
                        &rejection.error,
                        rejection.fix,
                        then,
                    ),
                ))
            }
            Event::Rejected { tag, rejection, original, producer_fatal, .. } => {
                let failure = Failure::rejected(&rejection, Lsn::ZERO);
                // In a Kafka transaction a refused record fails the whole transaction.
                let producer_fatal = producer_fatal
                    .or_else(|| self.transactional.then(|| "the Kafka transaction must be aborted".to_owned()));
                if let Some(fatal) = producer_fatal {
                    self.memo.poison_row(tag.outbox, tag.event_id, failure);
                    return Err(PipelineError::transient(ErrorKind::Kafka, format!(
                        "Kafka refused snapshot event id={} for good and its producer stopped ({fatal}); the snapshot starts over and sends it to the dead-letter topic",
                        rejection.event_id
                    )));
                }
                let out = self.dead_letter(&failure, *original, tag)?;
                self.window.enqueue(out);
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resume_filter_keeps_the_old_filter_and_compares_in_the_column_type() {
        assert_eq!(resume_filter(None, "id", "4711"), "id >= '4711'");
        assert_eq!(
            resume_filter(Some("occurred_at >= '2026-11-28'"), "id", "4711"),
            "(occurred_at >= '2026-11-28') AND id >= '4711'"
        );
        assert_eq!(resume_filter(None, "EventId", "a'b"), "\"EventId\" >= 'a''b'");
        let hint = texts::replay::backfill_resume_hint("4711", "id >= '4711'");
        assert!(hint.contains("--snapshot-filter \"id >= '4711'\"") && hint.contains("runbooks/replay.md"), "{hint}");
    }
}
