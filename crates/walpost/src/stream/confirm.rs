//! Confirming positions to the slot: the [`Checkpoint`] decides what may be confirmed,
//! the [`Confirmer`] decides when a standby status update goes out.
//!
//! Invariants:
//! - The flush LSN sent to the server comes only from [`Checkpoint::flush_lsn`], so it
//!   never passes an unacknowledged record and never moves backwards.
//! - An update goes out within [`MIN_STATUS_GAP`] of the flush position moving (so a
//!   crash re-sends at most what was acknowledged in that gap plus what was in flight),
//!   at least every `status_interval`, and whenever the server asks for one.

use std::time::{Duration, Instant};

use pgoutput::Lsn;

use super::checkpoint::{Checkpoint, TxnSeq};
use super::source::Source;
use crate::error::{ErrorKind, PipelineError};
use crate::telemetry::metrics::{lsn_gauge, StreamMetrics};

/// Do not send status updates more often than this just because the flush LSN moved.
pub(crate) const MIN_STATUS_GAP: Duration = Duration::from_millis(200);

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Confirmer {
    pub checkpoint: Checkpoint,
    received: Lsn,
    sent_flush: Lsn,
    last_status: Instant,
    status_interval: Duration,
    /// Kafka acknowledged records since the last status update (for the crash seam).
    acked_since_status: bool,
    /// Exactly-once: never confirm past the last committed progress record.
    gate: Option<Lsn>,
    metrics: StreamMetrics,
}

impl Confirmer {
    /// Starts from the position the slot has confirmed.
    pub(crate) fn new(start: Lsn, status_interval: Duration, metrics: StreamMetrics) -> Confirmer {
        metrics.confirmed_lsn.set(lsn_gauge(start.0));
        Confirmer {
            checkpoint: Checkpoint::new(start),
            received: start,
            sent_flush: start,
            last_status: Instant::now(),
            status_interval,
            acked_since_status: false,
            gate: None,
            metrics,
        }
    }

    /// What may be confirmed: the checkpoint's position, held back by the gate.
    pub(crate) fn flush_lsn(&self) -> Lsn {
        match self.gate {
            Some(gate) => self.checkpoint.flush_lsn().min(gate),
            None => self.checkpoint.flush_lsn(),
        }
    }

    /// Exactly-once: the last committed progress position.
    pub(crate) fn set_gate(&mut self, gate: Lsn) {
        self.gate = Some(gate);
    }

    /// The furthest WAL position received.
    pub(crate) fn received_lsn(&self) -> Lsn {
        self.received
    }

    /// WAL up to `lsn` was received.
    pub(crate) fn received(&mut self, lsn: Lsn) {
        if lsn > self.received {
            self.received = lsn;
            self.metrics.received_lsn.set(lsn_gauge(lsn.0));
        }
    }

    /// A keepalive reported the server's WAL end; confirmable when nothing is pending
    /// and no transaction is open.
    pub(crate) fn keepalive(&mut self, wal_end: Lsn, in_transaction: bool) {
        self.received(wal_end);
        if !in_transaction {
            self.checkpoint.idle_position(wal_end);
        }
    }

    /// Kafka acknowledged one record of `txn`.
    pub(crate) fn delivered(&mut self, txn: TxnSeq) -> Result<(), PipelineError> {
        self.checkpoint.delivered(txn).map_err(|e| PipelineError::definite(ErrorKind::Internal, e))?;
        self.acked_since_status = true;
        Ok(())
    }

    /// Sends a status update if the flush position moved or the interval elapsed.
    pub(crate) async fn maybe_send(&mut self, stream: &mut impl Source) -> Result<(), PipelineError> {
        if self.flush_lsn() != self.sent_flush || self.last_status.elapsed() >= self.status_interval {
            self.send(stream, false).await?;
        }
        Ok(())
    }

    /// Sends a status update now.
    pub(crate) async fn send(&mut self, stream: &mut impl Source, reply: bool) -> Result<(), PipelineError> {
        let flush = self.flush_lsn();
        if flush != self.sent_flush && self.acked_since_status {
            crate::crash_seam!("after-ack-before-confirm");
        }
        let write = self.received.max(flush);
        stream.send_status(write, flush, flush, reply).await?;
        self.sent_flush = flush;
        self.acked_since_status = false;
        self.last_status = Instant::now();
        self.metrics.confirmed_lsn.set(lsn_gauge(flush.0));
        Ok(())
    }
}
