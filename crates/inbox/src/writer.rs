//! The writer task: owns the inbox's PostgreSQL connection and does its jobs in order
//! (write a batch, read stored offsets), so one batch is written while the ingest fills
//! the next one.
//!
//! Invariants: jobs are done in the order they are sent, so an offsets read sees every
//! batch sent before it; a batch whose write failed transiently is written again,
//! unchanged (on a new connection), until it commits or walpost stops; each write is
//! answered once, in order, on the done channel, and the task ends after the first
//! error it answers with.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot, watch};

use crate::ingest::{Batch, Partition};
use crate::metrics::InboxMetrics;
use crate::settings::InboxSettings;
use crate::store::{reconnect, retry_backoff, Store, Written};
use service::error::{ErrorKind, PipelineError};

/// A job for the writer.
#[derive(Debug)]
pub(super) enum Job {
    Write(Batch),
    Offsets { partitions: Vec<Partition>, reply: oneshot::Sender<Result<HashMap<Partition, i64>, PipelineError>> },
}

/// The answer to a [`Job::Write`]: the batch, and what its transaction stored.
pub(super) type Done = Result<(Batch, Written), PipelineError>;

/// Starts the task on `store`.
pub(super) fn start(
    store: Store,
    settings: InboxSettings,
    metrics: InboxMetrics,
    shutdown: watch::Receiver<bool>,
) -> (mpsc::Sender<Job>, mpsc::Receiver<Done>) {
    let (jobs, jobs_rx) = mpsc::channel(1);
    let (done_tx, done) = mpsc::channel(2);
    let w = Writer { store, settings, metrics, shutdown };
    tokio::spawn(w.run(jobs_rx, done_tx));
    (jobs, done)
}

struct Writer {
    store: Store,
    settings: InboxSettings,
    metrics: InboxMetrics,
    shutdown: watch::Receiver<bool>,
}

impl Writer {
    async fn run(mut self, mut jobs: mpsc::Receiver<Job>, done: mpsc::Sender<Done>) {
        while let Some(job) = jobs.recv().await {
            match job {
                Job::Write(mut batch) => {
                    let result = self.write(&mut batch).await.map(|w| (batch, w));
                    let failed = result.is_err();
                    if done.send(result).await.is_err() || failed {
                        break;
                    }
                }
                Job::Offsets { partitions, reply } => {
                    let result = self.stored_offsets(&partitions).await;
                    let failed = result.is_err();
                    let _ = reply.send(result);
                    if failed {
                        break;
                    }
                }
            }
        }
        self.store.close().await;
    }

    /// Writes `batch`, retrying transient failures with the same batch until it commits.
    async fn write(&mut self, batch: &mut Batch) -> Result<Written, PipelineError> {
        let copy = batch.rows.finish();
        let mut backoff = retry_backoff();
        loop {
            let started = Instant::now();
            match self.store.write(batch, &copy).await {
                Ok(w) => {
                    self.metrics.write_seconds.observe(started.elapsed().as_secs_f64());
                    crate::crash_seam!("inbox-after-commit");
                    return Ok(w);
                }
                Err(e) if e.is_transient() => {
                    self.metrics.write_errors.inc();
                    let delay = backoff.next_delay();
                    tracing::warn!(
                        retry_in_ms = delay.as_millis() as u64,
                        "cannot write a batch to the inbox (retrying the same batch): {e}"
                    );
                    if self.sleep_or_stop(delay).await {
                        // Never committed: its records are read again at the next start.
                        return Err(PipelineError::transient(
                            ErrorKind::Postgres,
                            "stopped while PostgreSQL was unreachable; the unwritten batch is read again at the next start",
                        ));
                    }
                    if let Ok(Some(store)) = reconnect(&self.settings).await {
                        self.store = store;
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn stored_offsets(&mut self, partitions: &[Partition]) -> Result<HashMap<Partition, i64>, PipelineError> {
        let mut backoff = retry_backoff();
        loop {
            match self.store.stored_offsets(partitions).await {
                Ok(o) => return Ok(o),
                Err(e) if e.is_transient() => {
                    tracing::warn!("cannot read the stored offsets (retrying): {e}");
                    if self.sleep_or_stop(backoff.next_delay()).await {
                        return Err(e);
                    }
                    if let Ok(Some(store)) = reconnect(&self.settings).await {
                        self.store = store;
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Sleeps `d`; true when a stop was asked for meanwhile (or before).
    async fn sleep_or_stop(&mut self, d: Duration) -> bool {
        backoff::sleep_or_shutdown(d, &mut self.shutdown).await
    }
}
