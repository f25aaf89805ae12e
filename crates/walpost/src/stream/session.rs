//! One session: one replication stream and one produce window, from the start position
//! until shutdown or an error. Its parts each do one job: [`Decoding`] (protocol
//! state), [`Routing`] (rows to records), the [`ProduceWindow`] (records to Kafka), the
//! [`Confirmer`] (acknowledgements to the slot); the session only moves data between
//! them in one loop, and never waits inside a step (nothing re-enters).

use std::time::{Duration, Instant};

use otlp::{PendingSpan, Placed, Tracer};
use pgoutput::wire::{PrimaryKeepalive, ReplicationMessage, XLogData};
use replication::ReplicationStream;
use tokio::sync::watch;

use super::live::LivePolicy;
use super::source::Source;
use crate::kafka::sink::Sink;
use crate::kafka::KafkaSink;

use super::checkpoint::TxnSeq;
use super::confirm::{Confirmer, MIN_STATUS_GAP};
use super::decode::{Change, Decoding, OpenTxn};
use super::route::{unroutable_halt, Routed, Routing};
use super::signal::Replays;
use crate::error::{ErrorKind, PipelineError};
use crate::kafka::exactly_once::ExactlyOnceState;
use crate::kafka::{
    DeliveryMemo, Event, Failure, Known, Original, Outgoing, PermanentErrorPolicy, ProduceWindow, RecordId,
};
use crate::settings::{KafkaSettings, Settings};
use crate::telemetry::metrics::StreamMetrics;
use crate::telemetry::now_ms;
use crate::telemetry::Metrics;

/// The log target of the session's lines wherever their code lives (the files of
/// `session/` included): operators filter on it (`WALPOST_LOG`) and runbooks quote it.
const LOG_TARGET: &str = "walpost::stream::session";

/// A loop turn that comes this long after the previous one, when the server's
/// `wal_sender_timeout` is unknown or off, means the process was stopped.
pub(crate) const FROZEN_AFTER_DEFAULT: Duration = Duration::from_secs(60);

/// How long a loop turn may come after the previous one before the session counts as
/// frozen: the process was stopped (SIGSTOP, a paused VM) or starved long enough for the
/// walsender to give up on it (`wal_sender_timeout`) and hand the slot to a standby, so
/// what this session read must not be published late.
pub(crate) fn frozen_after(wal_sender_timeout: Option<Duration>) -> Duration {
    match wal_sender_timeout {
        Some(t) if !t.is_zero() => (t * 9 / 10).max(Duration::from_secs(1)),
        _ => FROZEN_AFTER_DEFAULT,
    }
}

/// How long a restart waits for the old producer's in-flight records.
const RESTART_FLUSH: Duration = Duration::from_secs(5);

/// What a record in the window stands for: a record of a transaction, or (`txn` is
/// `None`) an exactly-once progress record; `span`: its producer span, when spans are
/// exported and the record is sampled (ended at the acknowledgement).
#[derive(Debug, Clone)]
pub(crate) struct Tag {
    pub txn: Option<TxnSeq>,
    pub id: RecordId,
    pub span: Option<Box<PendingSpan>>,
}

/// How a session ended without error.
#[derive(Debug)]
pub(crate) enum SessionEnd {
    Shutdown,
}

/// Why a transient error ended the session, for the reconnect metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Culprit {
    Postgres,
    Kafka,
}

/// Messages (or delivery reports) handled in one turn of the loop when more are ready.
const BURST: usize = 256;

/// What a session is made of besides the settings and the metrics: the WAL it reads,
/// where it starts, its routing and produce window, and the optional parts.
#[derive(Debug)]
pub(crate) struct Parts<R: Source = ReplicationStream, S: Sink = KafkaSink> {
    pub stream: R,
    /// The slot's confirmed position (or the new slot's consistent point).
    pub start: pgoutput::Lsn,
    pub routing: Routing,
    pub window: ProduceWindow<Tag, S>,
    /// See [`frozen_after`].
    pub frozen_after: Duration,
    /// `--delivery exactly-once`.
    pub exactly_once: Option<ExactlyOnceState>,
    /// Spans, when exported.
    pub tracer: Option<Tracer>,
}

/// See the module docs. `R`: the WAL source (the replication stream, or a test's);
/// `S`: the producer (librdkafka, or a test's model).
pub(crate) struct Session<'a, R: Source = ReplicationStream, S: Sink = KafkaSink> {
    s: &'a Settings,
    metrics: StreamMetrics,
    stream: R,
    decoding: Decoding,
    routing: Routing,
    window: ProduceWindow<Tag, S>,
    confirmer: Confirmer,
    policy: PermanentErrorPolicy,
    memo: &'a mut DeliveryMemo,
    /// Records of this session Kafka did not acknowledge (failed or refused).
    not_acknowledged: Vec<RecordId>,
    /// When records go out at once rather than after `linger.ms`.
    live: LivePolicy,
    culprit: Culprit,
    frozen: bool,
    frozen_after: Duration,
    /// When the loop last checked it was not frozen ([`Session::beat`]).
    last_beat: Instant,
    /// `--delivery exactly-once`.
    exactly_once: Option<ExactlyOnceState>,
    /// Spans (`OTEL_EXPORTER_OTLP_ENDPOINT`); `None`: nothing is traced.
    tracer: Option<Tracer>,
    /// Replays asked for by signal rows, and what they need to run.
    replays: Replays,
    /// The replays running: their transaction and the record id they stand for.
    running_replays: Vec<(TxnSeq, RecordId)>,
    all_metrics: Metrics,
}

impl<R: Source, S: Sink> std::fmt::Debug for Session<'_, R, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("window", &self.window).field("confirmed", &self.confirmer.flush_lsn()).finish()
    }
}

impl<'a, R: Source, S: Sink> Session<'a, R, S> {
    pub(crate) fn new(
        s: &'a Settings,
        kafka: &KafkaSettings,
        all_metrics: &Metrics,
        parts: Parts<R, S>,
        memo: &'a mut DeliveryMemo,
    ) -> Session<'a, R, S> {
        let Parts { stream, start, routing, window, frozen_after, exactly_once, tracer } = parts;
        let metrics = all_metrics.stream.clone();
        let mut confirmer = Confirmer::new(start, s.stream.status_interval, metrics.clone());
        if let Some(e) = &exactly_once {
            confirmer.set_gate(e.gate());
        }
        Session {
            s,
            confirmer,
            metrics,
            stream,
            decoding: Decoding::default(),
            routing,
            window,
            policy: PermanentErrorPolicy::new(kafka),
            memo,
            not_acknowledged: Vec::new(),
            live: LivePolicy::default(),
            culprit: Culprit::Postgres,
            frozen: false,
            frozen_after,
            last_beat: Instant::now(),
            exactly_once,
            tracer,
            replays: Replays::default(),
            running_replays: Vec::new(),
            all_metrics: all_metrics.clone(),
        }
    }

    /// Streams until shutdown or an error, then ends the session as that requires.
    pub(crate) async fn run(
        mut self,
        shutdown: &mut watch::Receiver<bool>,
    ) -> (Result<SessionEnd, PipelineError>, Culprit) {
        let mut result = self.stream_loop(shutdown).await;
        let culprit = self.culprit;
        match &result {
            Ok(SessionEnd::Shutdown) => {
                if let Err(e) = self.commit_now().await {
                    tracing::warn!(
                        "shutdown: the last Kafka transaction was not committed ({e}); it is sent again on restart"
                    );
                }
                self.finish("shutdown").await
            }
            Err(e) if !e.is_transient() => self.finish("halting").await,
            Err(_) => {
                // An aborted transaction that says this producer was fenced: stop.
                if let Some(fenced) = self.restart().await {
                    result = Err(fenced);
                }
            }
        }
        (result, culprit)
    }

    async fn stream_loop(&mut self, shutdown: &mut watch::Receiver<bool>) -> Result<SessionEnd, PipelineError> {
        let mut tick = tokio::time::interval(MIN_STATUS_GAP);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        self.last_beat = Instant::now();
        let mut last_trace = Instant::now();
        let mut pause = self.all_metrics.health().watch_paused();
        loop {
            self.beat()?;
            let handed_over = self.window.handed_over();
            // This turn stopped reading with messages perhaps still buffered.
            let mut more_buffered = false;
            tokio::select! {
                biased;
                _ = shutdown.changed() => return Ok(SessionEnd::Shutdown),
                // A pause or resume: the next turn reads, or not, at once.
                Ok(()) = pause.changed() => {}
                event = self.window.next_event(), if !self.window.is_idle() => {
                    let event = event.map_err(|e| self.kafka_failed(e))?;
                    self.on_event(event)?;
                    // Reports that arrived meanwhile, in this turn.
                    for _ in 0..BURST {
                        match self.window.try_event() {
                            Some(event) => self.on_event(event)?,
                            None => break,
                        }
                    }
                }
                _ = tick.tick() => {
                    self.window.check_stalled().map_err(|e| self.kafka_failed(e))?;
                    self.maybe_commit().await?;
                    if self.paused() {
                        // What was read before the pause is committed, so the slot's
                        // confirmed position catches up while nothing more is read.
                        self.commit_now().await?;
                    }
                    if last_trace.elapsed() >= Duration::from_secs(5) {
                        last_trace = Instant::now();
                        tracing::debug!(
                            window = ?self.window,
                            pending_transactions = self.confirmer.checkpoint.pending_transactions(),
                            in_transaction = self.decoding.in_transaction(),
                            confirmed = %self.confirmer.flush_lsn(),
                            received = %self.confirmer.received_lsn(),
                            "session state"
                        );
                    }
                    self.metrics.set_oldest_unconfirmed_commit(self.confirmer.checkpoint.oldest_pending_commit_ms());
                    self.confirmer.maybe_send(&mut self.stream).await?;
                }
                Some(finished) = self.replays.next() => self.replay_finished(finished)?,
                // Paused: nothing is read (the server's WAL waits in the slot); delivery
                // reports, the tick and its status updates keep the connection alive.
                message = self.stream.next(), if self.window.has_room() && !self.paused() => {
                    self.on_read(message).await?;
                    more_buffered = true;
                    // The rest of a burst the socket delivered at once, in this turn: one
                    // turn of this loop per message costs more than the message.
                    for _ in 0..BURST {
                        self.beat()?;
                        if let Some(event) = self.window.pump() {
                            self.on_event(event)?;
                        }
                        if !self.window.has_room() || self.paused() {
                            break;
                        }
                        match self.stream.try_next().transpose() {
                            Some(read) => self.on_read(read).await?,
                            None => {
                                more_buffered = false;
                                break;
                            }
                        }
                    }
                }
            }
            // Hand what was just routed to librdkafka now: the next turn's conditions are
            // evaluated before any branch runs, and a queued record would keep WAL from
            // being read until an acknowledgement came (one record per round trip).
            self.beat()?;
            if let Some(event) = self.window.pump() {
                self.on_event(event)?;
            }
            // Live records are sent once nothing read waits behind them (`live`).
            if self.live.end_of_turn(self.window.handed_over() != handed_over, more_buffered) {
                self.window.send_now();
            }
            self.maybe_commit().await?;
        }
    }

    /// The producer failed or stalled: the session restarts from the confirmed position.
    fn kafka_failed(&mut self, e: PipelineError) -> PipelineError {
        self.culprit = Culprit::Kafka;
        PipelineError::transient(
            ErrorKind::Session,
            format!("{e} from the last confirmed position {}", self.confirmer.flush_lsn()),
        )
    }

    fn on_event(&mut self, event: Event<Tag>) -> Result<(), PipelineError> {
        match event {
            Event::Delivered { tag, topic, partition, offset, .. } => {
                if let (Some(span), Some(tracer)) = (tag.span, &self.tracer) {
                    tracer.finish(*span, Placed { topic: &topic, partition, offset, commit_lsn: tag.id.txn });
                }
                match tag.txn {
                    Some(txn) => self.confirmer.delivered(txn),
                    None => Ok(()),
                }
            }
            Event::Failed { tag, error } => {
                self.not_acknowledged.push(tag.id);
                self.culprit = Culprit::Kafka;
                Err(PipelineError::transient(
                    ErrorKind::Session,
                    format!("{error}; restarting from the last confirmed position {}", self.confirmer.flush_lsn()),
                ))
            }
            Event::Rejected { tag, rejection, original, dead_letter, producer_fatal, alone } => {
                // In a Kafka transaction a refused record makes the whole transaction
                // fail: it is aborted, and the next one sends the dead letter instead.
                let producer_fatal = producer_fatal.or_else(|| {
                    self.exactly_once.is_some().then(|| "the Kafka transaction must be aborted".to_owned())
                });
                if dead_letter || !self.policy.dead_letters() || producer_fatal.is_some() {
                    self.not_acknowledged.push(tag.id);
                }
                if dead_letter {
                    return Err(self.policy.dead_letter_refused(&rejection));
                }
                if !self.policy.dead_letters() {
                    return Err(self.policy.halt_rejected(&rejection));
                }
                let failure = Failure::rejected(&rejection, tag.id.txn);
                if let Some(fatal) = producer_fatal {
                    self.culprit = Culprit::Kafka;
                    if refused_as_a_batch(&rejection, alone) {
                        // The broker refused the batch this record shared; which record
                        // is too large it does not say: the next session sends the
                        // batch's records alone, and only a record refused on its own
                        // becomes a dead letter.
                        self.memo.suspect(tag.id);
                        return Err(PipelineError::transient(ErrorKind::Kafka, format!(
                            "Kafka refused a batch holding event id={} ({}) and its producer stopped ({fatal}); a new producer sends the batch's events one at a time to find the one too large",
                            rejection.event_id, rejection.code
                        )));
                    }
                    // The producer will deliver nothing more, the dead letter included:
                    // the next producer sends the dead letter in the record's place.
                    self.memo.poison(tag.id, failure);
                    return Err(PipelineError::transient(ErrorKind::Kafka, format!(
                        "Kafka refused event id={} for good and its producer stopped ({fatal}); a new producer sends it to the dead-letter topic",
                        rejection.event_id
                    )));
                }
                let class = failure.class.clone();
                if let Some(record) = self.policy.dead_letter(&failure, *original) {
                    // The dead letter takes the refused record's place in its transaction.
                    self.window.enqueue(Outgoing { record, timestamp_ms: None, tag, dead_letter: Some(class.into()) });
                }
                Ok(())
            }
        }
    }

    /// What the stream gave: a message, or a message too large to read whole (a
    /// permanent error of its event, [`Session::on_oversized`]), or an error.
    async fn on_read(
        &mut self,
        read: Result<Option<ReplicationMessage>, replication::Error>,
    ) -> Result<(), PipelineError> {
        match read {
            Err(replication::Error::MessageTooLarge(o)) => self.on_oversized(&o),
            other => self.on_message(other?).await,
        }
    }

    /// A WAL message over `[pipeline] max_message_bytes`: read and dropped by the stream
    /// without being buffered; its event halts or is dead-lettered (with its id and key
    /// when the row's first columns hold them), like a record Kafka refuses.
    fn on_oversized(&mut self, o: &replication::Oversized) -> Result<(), PipelineError> {
        let Ok(ReplicationMessage::XLogData(x)) = pgoutput::wire::parse_copy_data(o.prefix.clone()) else {
            return Err(PipelineError::definite(
                ErrorKind::Protocol,
                format!(
                    "a replication message of {} bytes, over [pipeline] max_message_bytes ({}), is not WAL data",
                    o.len, o.limit
                ),
            ));
        };
        self.confirmer.received(x.wal_start);
        let routed = self.routing.oversized(&x.data, o.len, o.limit)?;
        if matches!(routed, Routed::NotAnEvent) {
            return Ok(());
        }
        if self.decoding.in_transaction() {
            return self.publish_in_open_txn(routed);
        }
        // A non-transactional message: a transaction of its own at its position.
        let mut txn = OpenTxn { final_lsn: x.wal_start, commit_time_ms: now_ms(), seq: None, records: 0 };
        self.publish(&mut txn, routed, None)?;
        match txn.seq {
            Some(seq) => self
                .confirmer
                .checkpoint
                .commit(seq, x.wal_start)
                .map_err(|e| PipelineError::definite(ErrorKind::Internal, e)),
            None => {
                self.confirmer.checkpoint.commit_empty(x.wal_start);
                Ok(())
            }
        }
    }

    async fn on_message(&mut self, message: Option<ReplicationMessage>) -> Result<(), PipelineError> {
        match message {
            Some(ReplicationMessage::XLogData(x)) => self.on_xlog(x),
            Some(ReplicationMessage::PrimaryKeepalive(k)) => self.on_keepalive(k).await,
            None => Err(PipelineError::transient(ErrorKind::Session, "PostgreSQL ended the replication stream")),
        }
    }

    async fn on_keepalive(&mut self, k: PrimaryKeepalive) -> Result<(), PipelineError> {
        self.confirmer.keepalive(k.wal_end, self.decoding.in_transaction());
        self.server_waits_for_wal();
        if k.reply_requested {
            self.confirmer.send(&mut self.stream, true).await?;
        }
        Ok(())
    }

    fn on_xlog(&mut self, x: XLogData) -> Result<(), PipelineError> {
        self.confirmer.received(x.wal_start);
        let send_time = x.send_time;
        match self.decoding.decode(x, self.confirmer.flush_lsn())? {
            Change::Begin | Change::Nothing => {}
            Change::Commit { txn, end_lsn } => {
                if txn.seq.is_some() {
                    // Both times are the server's clock: no skew with walpost's.
                    let sent_ms = pgoutput::pg_epoch_micros_to_unix_micros(send_time) / 1000;
                    self.live.commit(sent_ms.saturating_sub(txn.commit_time_ms));
                }
                if let Some(eos) = self.exactly_once.as_mut() {
                    eos.pg_commit(end_lsn, !self.live.is_live());
                }
                match txn.seq {
                    Some(seq) => self
                        .confirmer
                        .checkpoint
                        .commit(seq, end_lsn)
                        .map_err(|e| PipelineError::definite(ErrorKind::Internal, e))?,
                    None => self.confirmer.checkpoint.commit_empty(end_lsn),
                }
                self.metrics.transactions.inc();
            }
            Change::Relation(r) => self.routing.relation(&r),
            Change::Insert { relation_oid, tuple } => {
                let routed = self.routing.insert(relation_oid, &tuple)?;
                self.publish_in_open_txn(routed)?;
            }
            Change::Other { op, relation_oids } => self.routing.other_operation(op, &relation_oids)?,
            Change::Message(m) => {
                let commit_time = if m.transactional {
                    self.decoding.current_ref().map(|t| t.commit_time_ms)
                } else {
                    Some(now_ms())
                };
                let routed = self.routing.message(&m, commit_time)?;
                if m.transactional {
                    self.publish_in_open_txn(routed)?;
                } else if !matches!(routed, Routed::NotAnEvent) {
                    // A transaction of its own, committed at the message's position:
                    // everything before it was already decoded and handed over.
                    let mut txn = OpenTxn { final_lsn: m.lsn, commit_time_ms: now_ms(), seq: None, records: 0 };
                    self.publish(&mut txn, routed, None)?;
                    match txn.seq {
                        Some(seq) => self
                            .confirmer
                            .checkpoint
                            .commit(seq, m.lsn)
                            .map_err(|e| PipelineError::definite(ErrorKind::Internal, e))?,
                        None => self.confirmer.checkpoint.commit_empty(m.lsn),
                    }
                }
            }
        }
        Ok(())
    }

    fn publish_in_open_txn(&mut self, routed: Routed) -> Result<(), PipelineError> {
        let Some(mut txn) = self.decoding.current().cloned() else {
            return Err(PipelineError::definite(
                ErrorKind::Session,
                "pgoutput protocol: a change outside a transaction",
            ));
        };
        let commit_time = Some(txn.commit_time_ms);
        self.publish(&mut txn, routed, commit_time)?;
        if let Some(open) = self.decoding.current() {
            *open = txn;
        }
        Ok(())
    }

    /// Hands one routed change of `txn` to the window (or to the dead-letter topic, or
    /// halts), unless the memo knows it is in Kafka already.
    fn publish(&mut self, txn: &mut OpenTxn, routed: Routed, commit_time_ms: Option<i64>) -> Result<(), PipelineError> {
        let (mut record, mut dead_letter) = match routed {
            Routed::NotAnEvent => return Ok(()),
            Routed::Signal(row) => return self.on_signal(txn, row),
            Routed::Record(record) => (record, None),
            Routed::Unroutable { error, salvage, event_id, original_topic } => {
                if !self.policy.dead_letters() {
                    return Err(unroutable_halt(&error, txn.final_lsn, self.confirmer.flush_lsn()));
                }
                let failure = Failure {
                    class: error.class().to_owned(),
                    message: error.to_string(),
                    original_topic,
                    event_id,
                    lsn: txn.final_lsn,
                    too_large: matches!(error, router::RouteError::TooLarge { .. }),
                };
                match self.policy.dead_letter(&failure, *salvage) {
                    Some(record) => (record, Some(failure.class)),
                    None => return Err(unroutable_halt(&error, txn.final_lsn, self.confirmer.flush_lsn())),
                }
            }
        };
        let id = RecordId { txn: txn.final_lsn, ordinal: txn.records };
        txn.records += 1;
        let checkpoint = &mut self.confirmer.checkpoint;
        let seq = *txn.seq.get_or_insert_with(|| checkpoint.begin(txn.final_lsn, txn.commit_time_ms));
        let mut send_alone = false;
        match self.memo.lookup(id) {
            Known::Nothing => {}
            Known::Acknowledged => {
                return checkpoint.record_skipped(seq).map_err(|e| PipelineError::definite(ErrorKind::Internal, e));
            }
            Known::SendAlone => send_alone = true,
            Known::Poisoned(failure) => {
                let original = Original::of(&record);
                let failure = failure.clone();
                record = self.policy.dead_letter(&failure, original).ok_or_else(|| {
                    PipelineError::definite(ErrorKind::Session, "a poisoned record outside dead-letter mode")
                })?;
                dead_letter = Some(failure.class);
            }
        }
        checkpoint.record_sent(seq).map_err(|e| PipelineError::definite(ErrorKind::Internal, e))?;
        if let Some(eos) = self.exactly_once.as_mut() {
            eos.before_record(self.window.sink())?;
            eos.recorded(record.value.as_ref().map_or(0, |v| v.len() as u64));
        }
        let span = match (&mut self.tracer, &dead_letter) {
            (Some(tracer), None) => start_span(tracer, &mut record, txn.commit_time_ms),
            _ => None,
        };
        let out = Outgoing {
            record,
            timestamp_ms: commit_time_ms,
            tag: Tag { txn: Some(seq), id, span },
            dead_letter: dead_letter.map(Into::into),
        };
        if send_alone {
            self.window.enqueue_alone(out);
        } else {
            self.window.enqueue(out);
        }
        Ok(())
    }
}

/// A producer span for `record` if the sampler says so; the record's `traceparent` then
/// names it (the consumer's span becomes its child), and its `tracestate` stays.
fn start_span(tracer: &mut Tracer, record: &mut router::Record, commit_time_ms: i64) -> Option<Box<PendingSpan>> {
    let span =
        tracer.start(record.trace.parent.as_ref(), record.trace.state.as_ref(), commit_time_ms, &record.event_id)?;
    let header = bytes::Bytes::from(span.traceparent());
    match record.headers.iter_mut().find(|(k, _)| &**k == router::tracecontext::TRACEPARENT) {
        Some((_, v)) => *v = header,
        None => record.headers.push((tracer.traceparent_header(), header)),
    }
    Some(Box::new(span))
}

/// Whether a refusal may be about another record of the batch this one shared: the
/// broker judges a batch's size as a whole, and reports every record of it refused.
fn refused_as_a_batch(rejection: &crate::kafka::Rejection, alone: bool) -> bool {
    !alone && matches!(rejection.code.as_str(), "message_size_too_large" | "message_batch_too_large")
}

mod ending;
mod signals;
#[cfg(test)]
mod tests;
mod transactions;
