//! Initial snapshot: publishes rows that already exist, consistently with the stream.
//!
//! The slot is created with an exported snapshot; the rows are read in that snapshot
//! (REPEATABLE READ + SET TRANSACTION SNAPSHOT) through a server-side cursor in id
//! order, in bounded chunks, and routed exactly like streamed rows (plus the header
//! `walpost.snapshot: true`); streaming then starts at the slot's consistent point.
//! Every row committed before the snapshot comes from the snapshot, every row after it
//! from the stream: none twice, none missing.
//!
//! Crash safety: before the slot is created, a row in `<outbox schema>.walpost_snapshots`
//! records that a snapshot for this slot has started; it is marked finished only after
//! Kafka acknowledged every snapshot record. A walpost that finds an unfinished row drops
//! the slot and starts the snapshot over on a new one: the rows published by the
//! interrupted attempt are published again (at-least-once), none is lost.
//!
//! Memory: one FETCH chunk plus the in-flight window of the producer, whatever the
//! table size.

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use pgoutput::{ColumnValue, TupleData};
use replication::{quote_ident, quote_literal, ReplicationClient};
use router::Router;
use tokio::sync::mpsc;

use crate::checkpoint::TxnSeq;
use crate::config::Settings;
use crate::error::PipelineError;
use crate::metrics::Metrics;
use crate::sink::{Delivery, KafkaSink, NewTopicBarrier, SendError};

/// When to snapshot the rows already in the outbox (Debezium's snapshot.mode names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum SnapshotMode {
    /// Stream only; rows that exist before the slot are not published.
    Never,
    /// Snapshot once, when walpost creates the slot; then stream.
    Initial,
    /// Snapshot, then exit 0 (a backfill; no slot is created).
    InitialOnly,
    /// Snapshot when the slot is missing or lost; then stream.
    WhenNeeded,
}

/// Header marking a record that came from the snapshot rather than the stream.
pub const HEADER_SNAPSHOT: &str = "walpost.snapshot";

/// Rows fetched per round trip.
const FETCH_ROWS: usize = 2000;

fn state_table(s: &Settings) -> String {
    format!("{}.walpost_snapshots", quote_ident(&s.table.schema))
}

/// Checks `--snapshot-filter` is a valid condition on the table.
pub async fn validate_filter(sql: &mut ReplicationClient, s: &Settings) -> Result<(), PipelineError> {
    if let Some(filter) = &s.snapshot_filter {
        for table in s.outboxes.iter().map(|o| &o.table) {
            sql.simple_query(&format!("EXPLAIN SELECT 1 FROM {} WHERE ({filter})", table.quoted())).await.map_err(
                |e| {
                    PipelineError::definite(format!(
                        "--snapshot-filter \"{filter}\" is not a valid condition on {table}: {e}"
                    ))
                },
            )?;
        }
    }
    Ok(())
}

/// Whether an earlier snapshot for this slot started and never finished.
pub async fn unfinished(sql: &mut ReplicationClient, s: &Settings) -> Result<bool, PipelineError> {
    let exists = sql
        .simple_query(&format!(
            "SELECT to_regclass({}) IS NOT NULL AS present",
            quote_literal(&format!("{}.walpost_snapshots", quote_ident(&s.table.schema)))
        ))
        .await?;
    if exists.first("present") != Some("t") {
        return Ok(false);
    }
    let r = sql
        .simple_query(&format!(
            "SELECT count(*) AS n FROM {} WHERE slot = {} AND finished_at IS NULL",
            state_table(s),
            quote_literal(&s.slot)
        ))
        .await?;
    Ok(r.first("n").is_some_and(|n| n != "0"))
}

/// Records that a snapshot for this slot is starting (before the slot exists).
pub async fn mark_started(sql: &mut ReplicationClient, s: &Settings) -> Result<(), PipelineError> {
    let table = state_table(s);
    sql.simple_query(&format!(
        "CREATE TABLE IF NOT EXISTS {table} (slot text PRIMARY KEY, started_at timestamptz NOT NULL, finished_at timestamptz, rows bigint);
         INSERT INTO {table} (slot, started_at) VALUES ({slot}, now())
         ON CONFLICT (slot) DO UPDATE SET started_at = now(), finished_at = NULL, rows = NULL",
        slot = quote_literal(&s.slot)
    ))
    .await
    .map_err(|e| {
        PipelineError::definite(format!(
            "cannot record snapshot progress in {table}: {e}; the snapshot modes need CREATE on schema {} and INSERT/UPDATE on that table (or create it beforehand: see README, Snapshot)",
            s.table.schema
        ))
    })?;
    Ok(())
}

pub async fn mark_finished(sql: &mut ReplicationClient, s: &Settings, rows: u64) -> Result<(), PipelineError> {
    sql.simple_query(&format!(
        "UPDATE {} SET finished_at = now(), rows = {rows} WHERE slot = {}",
        state_table(s),
        quote_literal(&s.slot)
    ))
    .await?;
    Ok(())
}

/// Reads every outbox table (in the exported snapshot `snapshot_name`, or in a fresh
/// REPEATABLE READ snapshot when `None`), publishes every row and waits until Kafka
/// acknowledged all of them. Returns the number of rows published.
pub async fn run(
    sql: &mut ReplicationClient,
    s: &Settings,
    snapshot_name: Option<&str>,
    sink: &KafkaSink,
    reports: &mut mpsc::UnboundedReceiver<Delivery>,
    metrics: &Arc<Metrics>,
) -> Result<u64, PipelineError> {
    let import = snapshot_name.map(|n| format!("SET TRANSACTION SNAPSHOT {};", quote_literal(n))).unwrap_or_default();
    // One transaction, so every table is read in the same snapshot.
    sql.simple_query(&format!("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; {import}")).await?;
    let mut estimate = 0;
    for outbox in &s.outboxes {
        estimate += estimate_rows(sql, &outbox.table).await.unwrap_or(0);
    }
    metrics.snapshot_started(estimate);
    let mut progress = Progress::new(estimate);
    let mut in_flight: u64 = 0;
    let mut sent: u64 = 0;
    let mut new_topics = NewTopicBarrier::default();
    for outbox in &s.outboxes {
        let table = &outbox.table;
        let mut router = Router::new(outbox.router.clone()).map_err(PipelineError::definite)?;
        let filter = s.snapshot_filter.as_deref().map(|f| format!(" WHERE ({f})")).unwrap_or_default();
        // t.*: the simple query protocol returns every value in its text form, the same
        // bytes pgoutput sends, and the row description names and types the columns just
        // as a Relation message does; ORDER BY sorts by the id column's own type.
        sql.simple_query(&format!(
            "DECLARE walpost_snapshot NO SCROLL CURSOR FOR SELECT t.* FROM {} AS t{filter} ORDER BY t.{}",
            table.quoted(),
            quote_ident(&outbox.router.id_field)
        ))
        .await?;
        tracing::info!(table = %table, estimate, filter = s.snapshot_filter.as_deref().unwrap_or(""), "snapshot started");
        let fetch = format!("FETCH {FETCH_ROWS} FROM walpost_snapshot");
        let mut resolved = None;
        loop {
            let chunk = sql.simple_query(&fetch).await?;
            if chunk.rows.is_empty() {
                break;
            }
            if resolved.is_none() {
                let columns = chunk.columns.iter().cloned().zip(chunk.column_types.iter().copied());
                let relation = crate::setup::relation_of(table, columns);
                resolved = Some(router.resolve(&relation).map_err(PipelineError::definite)?);
            }
            let Some(rel) = resolved.as_ref() else { break };
            for row in chunk.rows {
                while in_flight >= s.max_in_flight_records {
                    in_flight -= wait_delivery(reports, s).await?;
                    progress.acked(metrics);
                }
                let values: Vec<ColumnValue> =
                    row.into_iter().map(|v| v.map_or(ColumnValue::Null, ColumnValue::Text)).collect();
                let tuple = TupleData::from_values(&values);
                let mut record = router
                    .route(rel, &tuple)
                    .map_err(|e| PipelineError::definite(format!("cannot route a snapshot row of {table}: {e}")))?;
                record.headers.push((Arc::from(HEADER_SNAPSHOT), Bytes::from_static(b"true")));
                let first_for_topic = new_topics.must_go_alone(&record.topic);
                if first_for_topic {
                    while in_flight > 0 {
                        in_flight -= wait_delivery(reports, s).await?;
                        progress.acked(metrics);
                    }
                }
                match sink.send(TxnSeq(0), &record, None).await {
                    Ok(()) => {}
                    Err(SendError::Retryable(e)) => {
                        return Err(PipelineError::transient(format!("snapshot: cannot hand a record to Kafka: {e}")))
                    }
                    Err(SendError::Rejected(r)) => return Err(snapshot_rejected(&r)),
                }
                in_flight += 1;
                sent += 1;
                if first_for_topic {
                    in_flight -= wait_delivery(reports, s).await?;
                    progress.acked(metrics);
                    new_topics.settled(&record.topic);
                }
            }
            progress.tick(false);
        }
        sql.simple_query("CLOSE walpost_snapshot").await?;
    }
    while in_flight > 0 {
        in_flight -= wait_delivery(reports, s).await?;
        progress.acked(metrics);
    }
    sql.simple_query("COMMIT").await?;
    progress.tick(true);
    metrics.snapshot_finished();
    tracing::info!(
        tables = s.outboxes.len(),
        rows = sent,
        secs = progress.started.elapsed().as_secs_f64(),
        "snapshot finished"
    );
    Ok(sent)
}

fn snapshot_rejected(r: &crate::sink::Rejection) -> PipelineError {
    PipelineError::definite(format!(
        "Kafka rejected snapshot event id={} for topic {} permanently ({}: {}): {}, then restart walpost; the snapshot starts over",
        r.event_id, r.topic, r.code, r.error, r.fix
    ))
}

/// Waits for one delivery report, at most `[pipeline] delivery_timeout_secs`; returns 1
/// when delivered, an error otherwise.
async fn wait_delivery(reports: &mut mpsc::UnboundedReceiver<Delivery>, s: &Settings) -> Result<u64, PipelineError> {
    let Ok(report) = tokio::time::timeout(s.delivery_timeout, reports.recv()).await else {
        return Err(PipelineError::transient(format!(
            "Kafka acknowledged no snapshot record for {} s; the snapshot starts over",
            s.delivery_timeout.as_secs()
        )));
    };
    match report {
        Some(Delivery::Delivered { .. }) => Ok(1),
        Some(Delivery::Retryable { error, .. }) => Err(PipelineError::transient(format!(
            "Kafka did not acknowledge a snapshot record ({error}); the snapshot starts over"
        ))),
        Some(Delivery::Rejected { rejection: r, .. }) => Err(snapshot_rejected(&r)),
        None => Err(PipelineError::transient("the Kafka producer stopped during the snapshot")),
    }
}

/// The planner's row estimate for the table (or the sum over its partitions).
async fn estimate_rows(sql: &mut ReplicationClient, table: &crate::config::TableName) -> Result<u64, PipelineError> {
    let rel = quote_literal(&table.quoted());
    let r = sql
        .simple_query(&format!(
            "SELECT coalesce(sum(greatest(c.reltuples, 0)), 0)::bigint AS n FROM pg_class c
             WHERE c.oid = {rel}::regclass OR c.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = {rel}::regclass)"
        ))
        .await?;
    Ok(r.first("n").and_then(|n| n.parse().ok()).unwrap_or(0))
}

/// Rows done, total (estimate), rate and ETA: log lines, metrics, and a progress bar
/// when stderr is a terminal.
struct Progress {
    started: Instant,
    last_log: Instant,
    estimate: u64,
    done: u64,
    tty: bool,
}

impl Progress {
    fn new(estimate: u64) -> Progress {
        Progress {
            started: Instant::now(),
            last_log: Instant::now(),
            estimate,
            done: 0,
            tty: std::io::stderr().is_terminal(),
        }
    }

    fn acked(&mut self, metrics: &Metrics) {
        self.done += 1;
        metrics.snapshot_row();
    }

    fn tick(&mut self, last: bool) {
        let elapsed = self.started.elapsed().as_secs_f64().max(0.001);
        let rate = self.done as f64 / elapsed;
        let total = self.estimate.max(self.done);
        let eta = if rate > 0.0 { (total - self.done) as f64 / rate } else { 0.0 };
        if self.tty {
            const WIDTH: u64 = 30;
            let filled = (self.done * WIDTH).checked_div(total).map_or(WIDTH, |f| f.min(WIDTH));
            let bar = format!("{}{}", "#".repeat(filled as usize), ".".repeat((WIDTH - filled) as usize));
            let mut err = std::io::stderr();
            let _ = write!(err, "\rsnapshot [{bar}] {}/{} rows {:.0} rows/s ETA {:.0}s ", self.done, total, rate, eta);
            if last {
                let _ = writeln!(err);
            }
        }
        if last || self.last_log.elapsed() >= Duration::from_secs(5) {
            self.last_log = Instant::now();
            tracing::info!(
                rows_done = self.done,
                rows_total_estimate = total,
                rows_per_sec = rate.round() as u64,
                eta_secs = eta.round() as u64,
                "snapshot progress"
            );
        }
    }
}
