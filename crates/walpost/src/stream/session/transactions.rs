//! Exactly-once: when the session commits its Kafka transaction (a bound reached, an
//! idle position worth recording, a shutdown), with the progress record last in it.

use std::time::{Duration, Instant};

use pgoutput::Lsn;

use super::{Culprit, Session, Tag};
use crate::error::PipelineError;
use crate::kafka::exactly_once::Due;
use crate::kafka::sink::Sink;
use crate::kafka::RecordId;
use crate::stream::source::Source;

impl<R: Source, S: Sink> Session<'_, R, S> {
    /// Exactly-once: commits the open Kafka transaction now (what it holds completely).
    pub(super) async fn commit_now(&mut self) -> Result<(), PipelineError> {
        let Some(eos) = self.exactly_once.as_ref() else { return Ok(()) };
        if !eos.is_open() {
            return Ok(());
        }
        let due = eos.due(None, None, Instant::now() + Duration::from_secs(86_400));
        self.commit_kafka_transaction(due).await
    }

    /// Exactly-once: commits the Kafka transaction when a bound says so (or an idle
    /// position is worth recording).
    pub(super) async fn maybe_commit(&mut self) -> Result<(), PipelineError> {
        let Some(eos) = self.exactly_once.as_ref() else { return Ok(()) };
        let reading = self.decoding.current_ref().map(|t| (t.final_lsn, t.records));
        let checkpoint = &self.confirmer.checkpoint;
        let idle_at = (checkpoint.is_idle() && reading.is_none()).then(|| checkpoint.flush_lsn());
        let due = eos.due(reading, idle_at, Instant::now());
        self.commit_kafka_transaction(due).await
    }

    async fn commit_kafka_transaction(&mut self, due: Due) -> Result<(), PipelineError> {
        let Due::At(position) = due else { return Ok(()) };
        let Some(eos) = self.exactly_once.as_mut() else { return Ok(()) };
        let started = Instant::now();
        let records = eos.open_records();
        eos.before_record(self.window.sink())?;
        // The progress record is no event: no transaction, id or span of the stream's.
        let tag = Tag { txn: None, id: RecordId { txn: Lsn::ZERO, ordinal: 0 }, span: None };
        self.window.enqueue(eos.progress_outgoing(position, tag));
        // Everything routed so far, the progress record last, goes into this
        // transaction: a record left queued would be sent after the commit.
        while let Some(event) = self.window.send_queue().await.map_err(|e| self.kafka_failed(e))? {
            self.on_event(event)?;
        }
        let Some(eos) = self.exactly_once.as_mut() else { return Ok(()) };
        eos.commit(&self.window, position).await.inspect_err(|_| self.culprit = Culprit::Kafka)?;
        self.confirmer.set_gate(eos.gate());
        let kafka = &self.all_metrics.kafka;
        kafka.transaction_commit.observe(started.elapsed().as_secs_f64());
        kafka.transactions.inc();
        kafka.transaction_records.inc_by(records);
        Ok(())
    }

    /// A keepalive: the walsender pings before it sleeps waiting for WAL, a backlog's
    /// end. The last Kafka transaction then commits by the live bounds, not a second later.
    pub(super) fn server_waits_for_wal(&mut self) {
        if let (Some(eos), false) = (self.exactly_once.as_mut(), self.decoding.in_transaction()) {
            eos.caught_up();
        }
    }
}
