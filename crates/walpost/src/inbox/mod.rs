//! `walpost inbox`: Kafka records into a consuming service's PostgreSQL inbox, exactly
//! once, next to the SQL API its handlers call (migrations/0004_inbox.sql, docs/inbox.md).
//!
//! Wiring: the consumer thread ([`consumer`]) reads records and serves rebalances; the
//! ingest ([`ingest`], pure) decides what a batch takes and where each partition stands;
//! the store ([`store`]) writes a batch's messages, rejected rows and offsets in one
//! transaction. This module only connects them and retries.
//!
//! Invariants (the ones that make "a crash at any point neither loses nor duplicates a
//! row"):
//! - a record's row and its partition's next offset commit in one PostgreSQL
//!   transaction; a partition is read again from the offset stored there;
//! - a batch that failed to commit is written again, unchanged, until it commits or the
//!   process stops (then it was never stored, and its records are read again): a retry of
//!   a batch that did commit stores nothing twice (`store.rs`);
//! - a record that cannot be stored is either a rejected row (with the reason) or a halt
//!   at it: never skipped, and no offset passes it.

pub(crate) mod consumer;
pub(crate) mod copy;
pub(crate) mod ingest;
pub(crate) mod record;
pub(crate) mod store;

use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use consumer::{Event, Start};
use ingest::{Ingest, Offer};
use store::Store;

use crate::error::{ErrorKind, PipelineError};
use crate::postgres::messages::inbox_record_refused;
use crate::settings::inbox::{InboxSettings, StartFrom};
use crate::telemetry::metrics::{now_ms, HandlerStats, InboxMetrics};
use crate::telemetry::Metrics;

/// Records in flight between the consumer thread and the ingest.
const CHANNEL_RECORDS: usize = 4096;
/// How long the loop sleeps with nothing to write.
const IDLE: Duration = Duration::from_millis(500);
/// Reconnect backoff bounds for PostgreSQL.
const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// Runs until `shutdown` flips (Ok) or an error an operator must fix (Err).
pub(crate) async fn run(
    s: &InboxSettings,
    metrics: &Metrics,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), PipelineError> {
    let Some(mut store) = connect(s, &mut shutdown, &metrics.inbox).await? else { return Ok(()) };
    let (tx, mut rx) = mpsc::channel(CHANNEL_RECORDS);
    let consumer =
        consumer::start(s, tx, metrics.inbox.clone()).map_err(|e| PipelineError::definite(ErrorKind::Kafka, e))?;
    tokio::spawn(handler_stats(s.clone(), metrics.inbox.clone(), shutdown.clone()));
    metrics.health().set_streaming(true);
    tracing::info!(group = %s.group, schema = %s.schema, "walpost inbox consuming");
    let mut ingest = Ingest::new(s.batch, s.headers.clone(), s.max_record_bytes, s.on_invalid);
    let mut w = Writer { store: &mut store, metrics: &metrics.inbox, shutdown: shutdown.clone(), settings: s };
    let mut halt: Option<PipelineError> = None;
    let mut stopping = false;
    loop {
        let wait = ingest.wait(Instant::now(), IDLE);
        let event = tokio::select! {
            e = rx.recv() => e,
            () = tokio::time::sleep(wait) => {
                if halt.is_none() {
                    if let Err(e) = w.flush(&mut ingest, &consumer).await {
                        halt = Some(e);
                        consumer.stop();
                    }
                }
                continue;
            }
            _ = shutdown.changed(), if !stopping => {
                stopping = true;
                consumer.stop();
                continue;
            }
        };
        // The consumer thread ended (stopped, or failed after telling why).
        let Some(event) = event else { break };
        if halt.is_some() {
            // Stopping: answer rebalances so the thread can leave, store nothing more.
            answer_while_stopping(event);
            continue;
        }
        let result = match event {
            Event::Record(r) => match ingest.offer(&r, Instant::now()) {
                Offer::Taken if ingest.full() => w.flush(&mut ingest, &consumer).await,
                Offer::Taken | Offer::NotOwned => Ok(()),
                Offer::Rewound { stored } => {
                    tracing::warn!(topic = %r.topic, partition = r.partition, offset = r.offset, stored, "the partition's log restarts below its stored offset (the topic was deleted and created again, or its offsets were reset): storing from here; event ids already in the inbox are not stored again");
                    if ingest.full() {
                        w.flush(&mut ingest, &consumer).await
                    } else {
                        Ok(())
                    }
                }
                Offer::Halt(refused) => w.flush(&mut ingest, &consumer).await.and(Err(PipelineError::definite(
                    ErrorKind::Routing,
                    inbox_record_refused(&refused.topic, refused.partition, refused.offset, &refused.why.to_string()),
                ))),
            },
            Event::Assigned { partitions, reply } => match w.flush(&mut ingest, &consumer).await {
                Err(e) => Err(e),
                Ok(()) => match w.stored_offsets(&partitions).await {
                    Err(e) => Err(e),
                    Ok(stored) => {
                        let mut starts = Vec::with_capacity(partitions.len());
                        for p in partitions {
                            let start = match (stored.get(&p), s.start_from) {
                                (Some(&n), _) => Start::Stored(n),
                                (None, StartFrom::Earliest) => Start::Beginning,
                                (None, StartFrom::Latest) => Start::End,
                            };
                            ingest.assign(p.clone(), if let Start::Stored(n) = start { n } else { 0 });
                            starts.push((p, start));
                        }
                        let _ = reply.send(starts);
                        Ok(())
                    }
                },
            },
            Event::Revoked { partitions, reply } => {
                let written = w.flush(&mut ingest, &consumer).await;
                if written.is_ok() {
                    for p in &partitions {
                        let _ = ingest.revoke(p);
                    }
                }
                let _ = reply.send(());
                written
            }
            Event::Fatal(message) => Err(PipelineError::definite(ErrorKind::Kafka, message)),
        };
        if let Err(e) = result {
            halt = Some(e);
            consumer.stop();
        }
    }
    if halt.is_none() {
        // The last batch (the consumer's close revoked and flushed already, normally).
        if let Err(e) = w.flush(&mut ingest, &consumer).await {
            halt = Some(e);
        }
    }
    consumer.join();
    metrics.health().set_streaming(false);
    store.close().await;
    match halt {
        Some(e) => Err(e),
        None => {
            tracing::info!("stopped");
            Ok(())
        }
    }
}

/// After a halt: a rebalance still gets its answer (nothing assigned is kept; a
/// revocation has nothing to write), so the consumer thread can close.
fn answer_while_stopping(event: Event) {
    match event {
        Event::Assigned { reply, .. } => drop(reply),
        Event::Revoked { reply, .. } => {
            let _ = reply.send(());
        }
        Event::Record(_) | Event::Fatal(_) => {}
    }
}

/// The store with its retry policy.
struct Writer<'a> {
    store: &'a mut Store,
    metrics: &'a InboxMetrics,
    shutdown: watch::Receiver<bool>,
    settings: &'a InboxSettings,
}

impl Writer<'_> {
    /// Writes the open batch (if any), retrying transient failures with the same batch
    /// until it commits; then the partitions stand at its offsets.
    async fn flush(&mut self, ingest: &mut Ingest, consumer: &consumer::ConsumerThread) -> Result<(), PipelineError> {
        let mut batch = ingest.take();
        if batch.is_empty() {
            return Ok(());
        }
        let copy = batch.rows.finish();
        let mut backoff = MIN_BACKOFF;
        let written = loop {
            let started = Instant::now();
            match self.store.write(&batch, &copy).await {
                Ok(w) => {
                    self.metrics.write_seconds.observe(started.elapsed().as_secs_f64());
                    break w;
                }
                Err(e) if e.is_transient() => {
                    self.metrics.write_errors.inc();
                    tracing::warn!(
                        retry_in_ms = backoff.as_millis() as u64,
                        "cannot write a batch to the inbox (retrying the same batch): {e}"
                    );
                    if self.sleep_or_stop(backoff).await {
                        // Never committed: its records are read again after the restart.
                        return Err(PipelineError::transient(ErrorKind::Postgres, "stopped while PostgreSQL was unreachable; the unwritten batch is read again at the next start"));
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    if let Ok(Some(store)) = reconnect(self.settings).await {
                        *self.store = store;
                    }
                }
                Err(e) => return Err(e),
            }
        };
        crate::crash_seam!("inbox-after-commit");
        self.metrics.batches.inc();
        let now = now_ms();
        for (topic, n) in &written.stored {
            self.metrics.records(topic, "stored", *n);
        }
        for (topic, n) in &written.duplicates {
            self.metrics.records(topic, "duplicate", *n);
        }
        for r in &batch.rejected {
            self.metrics.records(&r.topic, "rejected", 1);
            tracing::warn!(topic = %r.topic, partition = r.partition, offset = r.offset, reason = r.why.code(), "record stored in the rejected table: {}", r.why);
        }
        if let Some(oldest) = batch.oldest_timestamp_ms {
            self.metrics.latency.observe((now - oldest).max(0) as f64 / 1000.0);
        }
        ingest.committed(&batch);
        consumer.commit(batch.offsets.iter().map(|(p, n)| (p.clone(), *n)).collect());
        Ok(())
    }

    async fn stored_offsets(
        &mut self,
        partitions: &[ingest::Partition],
    ) -> Result<std::collections::HashMap<ingest::Partition, i64>, PipelineError> {
        let mut backoff = MIN_BACKOFF;
        loop {
            match self.store.stored_offsets(partitions).await {
                Ok(o) => return Ok(o),
                Err(e) if e.is_transient() => {
                    tracing::warn!("cannot read the stored offsets (retrying): {e}");
                    if self.sleep_or_stop(backoff).await {
                        return Err(e);
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    if let Ok(Some(store)) = reconnect(self.settings).await {
                        *self.store = store;
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Sleeps `d`; true when a stop was asked for meanwhile (or before).
    async fn sleep_or_stop(&mut self, d: Duration) -> bool {
        if *self.shutdown.borrow() {
            return true;
        }
        tokio::select! {
            () = tokio::time::sleep(d) => *self.shutdown.borrow(),
            _ = self.shutdown.changed() => true,
        }
    }
}

/// The first connection: transient failures are retried until a stop.
async fn connect(
    s: &InboxSettings,
    shutdown: &mut watch::Receiver<bool>,
    metrics: &InboxMetrics,
) -> Result<Option<Store>, PipelineError> {
    let mut backoff = MIN_BACKOFF;
    loop {
        match Store::connect(s).await {
            Ok(store) => return Ok(Some(store)),
            Err(e) if e.is_transient() => {
                metrics.write_errors.inc();
                tracing::warn!(
                    retry_in_ms = backoff.as_millis() as u64,
                    "cannot connect to the inbox database (retrying): {e}"
                );
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    _ = shutdown.changed() => return Ok(None),
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
            Err(e) => return Err(e),
        }
    }
}

async fn reconnect(s: &InboxSettings) -> Result<Option<Store>, PipelineError> {
    match Store::connect(s).await {
        Ok(store) => Ok(Some(store)),
        Err(e) if e.is_transient() => Ok(None),
        Err(e) => Err(e),
    }
}

/// Reads the handler statistics view every `stats_interval` into the gauges.
async fn handler_stats(s: InboxSettings, metrics: InboxMetrics, mut shutdown: watch::Receiver<bool>) {
    let mut sql = None;
    let mut warned = false;
    loop {
        tokio::select! {
            () = tokio::time::sleep(s.stats_interval) => {}
            _ = shutdown.changed() => return,
        }
        if sql.is_none() {
            sql = replication::ReplicationClient::connect_sql(&s.postgres).await.ok();
        }
        let Some(client) = sql.as_mut() else { continue };
        let text = format!(
            "SELECT handler, backlog, oldest_pending_seconds, open_attempts, review_required FROM {}.handler_stats",
            crate::postgres::sql::ident(&s.schema)
        );
        match client.simple_query(&text).await {
            Ok(r) => {
                let stats: Vec<HandlerStats> = (0..r.rows.len())
                    .filter_map(|i| {
                        Some(HandlerStats {
                            handler: r.text(i, 0)?.to_owned(),
                            backlog: r.text(i, 1)?.parse().ok()?,
                            oldest_pending_seconds: r.text(i, 2)?.parse().ok()?,
                            open_attempts: r.text(i, 3)?.parse().ok()?,
                            review_required: r.text(i, 4)?.parse().ok()?,
                        })
                    })
                    .collect();
                metrics.set_handler_stats(&stats);
                warned = false;
            }
            Err(e) => {
                if !warned {
                    tracing::warn!("cannot read {}.handler_stats for the handler metrics: {e}", s.schema);
                    warned = true;
                }
                sql = None;
            }
        }
    }
}
