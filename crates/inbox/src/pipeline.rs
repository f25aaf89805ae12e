//! The wiring of `walpost inbox`: the consumer thread ([`crate::consumer`]) reads
//! records and serves rebalances; the ingest ([`crate::ingest`], pure) decides what a
//! batch takes and where each partition stands; the writer task ([`crate::writer`])
//! writes one batch while the next fills, through the store ([`crate::store`]: a batch's
//! messages, rejected rows and offsets in one transaction). This module only connects
//! them.

use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use crate::consumer::{self, Event, Start};
use crate::ingest::{self, Ingest, Offer};
use crate::store::{retry_backoff, Store};
use crate::{budget, retention, writer};

use service::error::{ErrorKind, PipelineError};
use service::telemetry::now_ms;

use crate::messages::{inbox_consumer_ended, inbox_record_refused};
use crate::metrics::{HandlerStats, InboxMetrics};
use crate::settings::{InboxSettings, StartFrom};

/// Records in flight between the consumer thread and the ingest (at most; their bytes are
/// bounded too: by `batch_max_bytes`, see `budget`).
const CHANNEL_RECORDS: usize = 2048;
/// How long the loop sleeps with nothing to write.
const IDLE: Duration = Duration::from_millis(500);
/// Runs until `shutdown` flips (Ok) or an error an operator must fix (Err).
pub async fn run(
    s: &InboxSettings,
    metrics: &InboxMetrics,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), PipelineError> {
    let Some(store) = connect(s, &mut shutdown, metrics).await? else { return Ok(()) };
    if let Some(cfg) = s.retention {
        // Before consuming: today's partitions exist when the first batch is written.
        retention::pass_and_report(s, &cfg, &metrics.retention).await;
        tokio::spawn(retention::task(s.clone(), cfg, metrics.retention.clone(), shutdown.clone()));
    }
    let (tx, mut rx) = mpsc::channel(CHANNEL_RECORDS);
    let budget = budget::ByteBudget::new(s.batch.max_bytes);
    let consumer =
        consumer::start(s, tx, budget, metrics.clone()).map_err(|e| PipelineError::definite(ErrorKind::Kafka, e))?;
    tokio::spawn(handler_stats(s.clone(), metrics.clone(), shutdown.clone()));
    let (jobs, done) = writer::start(store, s.clone(), metrics.clone(), shutdown.clone());
    let mut p = Pipeline { jobs, done, in_flight: 0, metrics, consumer: &consumer };
    metrics.health().set_streaming(true);
    tracing::info!(group = %s.group, schema = %s.schema, "walpost inbox consuming");
    let mut ingest = Ingest::new(s.batch, s.headers.clone(), s.max_record_bytes, s.on_invalid);
    let mut halt: Option<PipelineError> = None;
    let mut stopping = false;
    loop {
        let wait = ingest.wait(Instant::now(), IDLE);
        let writing = p.in_flight > 0 && halt.is_none();
        let event = tokio::select! {
            e = rx.recv() => e,
            d = p.done.recv(), if writing => {
                if let Err(e) = p.completed(d, &mut ingest) {
                    halt = Some(e);
                    consumer.stop();
                }
                continue;
            }
            () = tokio::time::sleep(wait) => {
                if halt.is_none() {
                    if let Err(e) = p.submit(&mut ingest).await {
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
        // The consumer thread ended (stopped, or failed after telling why, or ended
        // without being asked to: below).
        let Some(event) = event else { break };
        if halt.is_some() {
            // Stopping: answer rebalances so the thread can leave, store nothing more.
            answer_while_stopping(event);
            continue;
        }
        let result = match event {
            // `_held`: the record's bytes go back to the channel's budget once it is in the batch.
            Event::Record(r, _held) => match ingest.offer(&r, Instant::now()) {
                Offer::Taken if ingest.full() => p.submit(&mut ingest).await,
                Offer::Taken | Offer::NotOwned => Ok(()),
                Offer::Rewound { stored } => {
                    tracing::warn!(topic = %r.topic, partition = r.partition, offset = r.offset, stored, "the partition's log restarts below its stored offset (the topic was deleted and created again, or its offsets were reset): storing from here; event ids already in the inbox are not stored again");
                    if ingest.full() {
                        p.submit(&mut ingest).await
                    } else {
                        Ok(())
                    }
                }
                Offer::Halt(refused) => p.drain(&mut ingest).await.and(Err(PipelineError::definite(
                    ErrorKind::Routing,
                    inbox_record_refused(&refused.topic, refused.partition, refused.offset, &refused.why.to_string()),
                ))),
            },
            Event::Assigned { partitions, reply } => match p.stored_offsets(&mut ingest, partitions.clone()).await {
                Err(e) => Err(e),
                Ok(stored) => {
                    let mut starts = Vec::with_capacity(partitions.len());
                    for part in partitions {
                        let start = match (stored.get(&part), s.start_from) {
                            (Some(&n), _) => Start::Stored(n),
                            (None, StartFrom::Earliest) => Start::Beginning,
                            (None, StartFrom::Latest) => Start::End,
                        };
                        ingest.assign(part.clone(), if let Start::Stored(n) = start { n } else { 0 });
                        starts.push((part, start));
                    }
                    let _ = reply.send(starts);
                    Ok(())
                }
            },
            Event::Revoked { partitions, reply } => {
                let written = p.drain(&mut ingest).await;
                if written.is_ok() {
                    for part in &partitions {
                        let _ = ingest.revoke(part);
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
        // The last batch (the consumer's close revoked and wrote them already, normally).
        if let Err(e) = p.drain(&mut ingest).await {
            halt = Some(e);
        }
    }
    drop(p);
    // A consumer thread that ended with nobody asking (a panic, where the binary's panic
    // hook has not exited already) must not look like a clean stop: that would exit 0,
    // and a service manager would not restart it.
    let unasked = !consumer.asked_to_stop();
    let panic = consumer.join();
    if unasked && halt.is_none() {
        let why = panic.map_or_else(|| "it returned".to_owned(), |m| format!("it panicked: {m}"));
        halt = Some(PipelineError::definite(ErrorKind::Internal, inbox_consumer_ended(&why)));
    }
    metrics.health().set_streaming(false);
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
        Event::Record(..) | Event::Fatal(_) => {}
    }
}

/// Batches on their way to the writer task: one is written while the next fills (so
/// PostgreSQL's time and Kafka's overlap), never more.
struct Pipeline<'a> {
    jobs: mpsc::Sender<writer::Job>,
    done: mpsc::Receiver<writer::Done>,
    in_flight: usize,
    metrics: &'a InboxMetrics,
    consumer: &'a consumer::ConsumerThread,
}

/// Batches being written at most (the one the writer holds).
const MAX_IN_FLIGHT: usize = 1;

impl Pipeline<'_> {
    /// Hands the open batch (if any) to the writer, first waiting for the one it is
    /// writing when that is the limit.
    async fn submit(&mut self, ingest: &mut Ingest) -> Result<(), PipelineError> {
        let batch = ingest.take();
        if batch.is_empty() {
            return Ok(());
        }
        while self.in_flight >= MAX_IN_FLIGHT {
            let d = self.done.recv().await;
            self.completed(d, ingest)?;
        }
        self.jobs.send(writer::Job::Write(batch)).await.map_err(|_| writer_gone())?;
        self.in_flight += 1;
        Ok(())
    }

    /// Hands over the open batch and waits until every batch is written.
    async fn drain(&mut self, ingest: &mut Ingest) -> Result<(), PipelineError> {
        self.submit(ingest).await?;
        while self.in_flight > 0 {
            let d = self.done.recv().await;
            self.completed(d, ingest)?;
        }
        Ok(())
    }

    /// A batch is written: its partitions stand at its offsets.
    fn completed(&mut self, done: Option<writer::Done>, ingest: &mut Ingest) -> Result<(), PipelineError> {
        self.in_flight = self.in_flight.saturating_sub(1);
        let (batch, written) = done.ok_or_else(writer_gone)??;
        self.metrics.batches.inc();
        for (topic, n) in &written.stored {
            self.metrics.records(topic, "stored", *n);
        }
        for (topic, n) in &written.duplicates {
            self.metrics.records(topic, "duplicate", *n);
        }
        for (topic, n) in &written.collisions {
            self.metrics.collisions(*n);
            tracing::warn!(topic = %topic, records = n, "event ids that another topic's messages already have: with [inbox] dedup = \"topic\" they are stored as messages of their own, with \"global\" they are duplicates");
        }
        for r in batch.rejected.iter().chain(&written.refused) {
            self.metrics.records(&r.topic, "rejected", 1);
            tracing::warn!(topic = %r.topic, partition = r.partition, offset = r.offset, reason = r.why.code(), "record stored in the rejected table: {}", r.why);
        }
        if let Some(r) = &written.halted {
            // The batch's other records are stored; the partition stands at this record.
            return Err(PipelineError::definite(
                ErrorKind::Routing,
                inbox_record_refused(&r.topic, r.partition, r.offset, &r.why.to_string()),
            ));
        }
        if let Some(oldest) = batch.oldest_timestamp_ms {
            self.metrics.latency.observe((now_ms() - oldest).max(0) as f64 / 1000.0);
        }
        ingest.committed(&batch);
        self.consumer.commit(batch.offsets.iter().map(|(p, n)| (p.clone(), *n)).collect());
        Ok(())
    }

    /// The stored offsets of `partitions`, once every batch before is written.
    async fn stored_offsets(
        &mut self,
        ingest: &mut Ingest,
        partitions: Vec<ingest::Partition>,
    ) -> Result<std::collections::HashMap<ingest::Partition, i64>, PipelineError> {
        self.drain(ingest).await?;
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.jobs.send(writer::Job::Offsets { partitions, reply }).await.map_err(|_| writer_gone())?;
        answer.await.map_err(|_| writer_gone())?
    }
}

fn writer_gone() -> PipelineError {
    PipelineError::definite(ErrorKind::Internal, "the inbox writer task ended unexpectedly")
}

/// The first connection: transient failures are retried until a stop.
async fn connect(
    s: &InboxSettings,
    shutdown: &mut watch::Receiver<bool>,
    metrics: &InboxMetrics,
) -> Result<Option<Store>, PipelineError> {
    let mut backoff = retry_backoff();
    loop {
        match Store::connect(s).await {
            Ok(store) => return Ok(Some(store)),
            Err(e) if e.is_transient() => {
                metrics.write_errors.inc();
                let delay = backoff.next_delay();
                tracing::warn!(
                    retry_in_ms = delay.as_millis() as u64,
                    "cannot connect to the inbox database (retrying): {e}"
                );
                if backoff::sleep_or_shutdown(delay, shutdown).await {
                    return Ok(None);
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// Reads the handler statistics view every `stats_interval` into the gauges, with the
/// partitions the group has stored offsets for: the probe `/readyz` counts on. A read
/// that fails (or takes longer than [`STATS_TIMEOUT`] or the interval) makes `/readyz`
/// answer not ready, and the gauges keep their values while
/// `walpost_inbox_handler_stats_age_seconds` grows.
async fn handler_stats(s: InboxSettings, metrics: InboxMetrics, mut shutdown: watch::Receiver<bool>) {
    metrics.handler_stats_started();
    let mut sql = None;
    let mut warned = false;
    let timeout = s.stats_interval.max(STATS_TIMEOUT);
    loop {
        let read = tokio::time::timeout(timeout, read_handler_stats(&s, &mut sql))
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {} s", timeout.as_secs())));
        match read {
            Ok((stats, group_partitions)) => {
                metrics.set_handler_stats(&stats);
                metrics.set_postgres_probe(Ok(group_partitions));
                if warned {
                    tracing::info!("reading {}.handler_stats again", s.schema);
                }
                warned = false;
            }
            Err(e) => {
                if !warned {
                    tracing::warn!("cannot read {}.handler_stats for the handler metrics: {e}", s.schema);
                    warned = true;
                }
                metrics.set_postgres_probe(Err(e));
                sql = None;
            }
        }
        if backoff::sleep_or_shutdown(s.stats_interval, &mut shutdown).await {
            return;
        }
    }
}

/// The longest a read of the handler statistics may take (unless `stats_interval` is longer).
const STATS_TIMEOUT: Duration = Duration::from_secs(5);

/// One read: each handler's statistics, and the partitions the group has stored offsets
/// for. `leases_lost` is read from `handlers` when it has it (an inbox migrated before
/// migrations/inbox/0002_inbox_hardening.sql has not).
async fn read_handler_stats(
    s: &InboxSettings,
    sql: &mut Option<replication::ReplicationClient>,
) -> Result<(Vec<HandlerStats>, i64), String> {
    let client = match sql {
        Some(client) => client,
        None => sql.insert(replication::ReplicationClient::connect_sql(&s.postgres).await.map_err(|e| e.to_string())?),
    };
    let schema = service::sql::ident(&s.schema);
    let text = format!(
        "SELECT s.handler, s.backlog, s.oldest_pending_seconds, s.open_attempts, s.review_required, \
         pg_catalog.to_jsonb(h) OPERATOR(pg_catalog.->>) 'leases_lost' AS leases_lost \
         FROM {schema}.handler_stats s JOIN {schema}.handlers h ON h.name OPERATOR(pg_catalog.=) s.handler"
    );
    let r = client.simple_query(&text).await.map_err(|e| e.to_string())?;
    let stats: Vec<HandlerStats> = (0..r.rows.len())
        .filter_map(|i| {
            Some(HandlerStats {
                handler: r.text(i, 0)?.to_owned(),
                backlog: r.text(i, 1)?.parse().ok()?,
                oldest_pending_seconds: r.text(i, 2)?.parse().ok()?,
                open_attempts: r.text(i, 3)?.parse().ok()?,
                review_required: r.text(i, 4)?.parse().ok()?,
                leases_lost: r.text(i, 5).and_then(|n| n.parse().ok()),
            })
        })
        .collect();
    let offsets = format!("SELECT pg_catalog.count(*) AS n FROM {schema}.offsets WHERE group_id = $1");
    let r = client.query(&offsets, &[Some(&s.group)]).await.map_err(|e| e.to_string())?;
    let group_partitions = r.first("n").and_then(|n| n.parse().ok()).unwrap_or(0);
    Ok((stats, group_partitions))
}
