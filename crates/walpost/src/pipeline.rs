//! The streaming loop: slot -> decoder -> router -> Kafka -> checkpoint -> slot.
//!
//! One *session* is one replication connection plus one producer. A transient error
//! ends the session; [`run`] waits (capped exponential backoff) and starts a new one
//! from the slot's confirmed position, so everything not yet confirmed is sent again
//! (at-least-once, never a gap). A definite error ends [`run`].
//!
//! Invariants:
//! - The flush LSN sent to the server comes only from [`Checkpoint::flush_lsn`].
//! - WAL is read only while in-flight records and bytes are under their limits, so
//!   memory is bounded whatever the backlog; status updates keep flowing meanwhile.
//! - Only INSERTs into the configured table become records; a row that cannot be
//!   routed stops the pipeline instead of being skipped.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use pgoutput::wire::{PrimaryKeepalive, ReplicationMessage, XLogData};
use pgoutput::{Decoder, LogicalMessage, Lsn, Relation};
use rdkafka::ClientConfig;
use replication::{quote_ident, ReplicationClient, ReplicationStream, SlotSnapshot};
use router::{Record, ResolvedRelation, Router};
use tokio::sync::{mpsc, watch};

use crate::checkpoint::{Checkpoint, TxnSeq};
use crate::config::{OnPermanentError, OpInvalid, Settings};
use crate::error::PipelineError;
use crate::metrics::Metrics;
use crate::setup;
use crate::sink::{self, Delivery, KafkaSink, NewTopicBarrier, SendError};
use crate::snapshot::{self, SnapshotMode};

/// Crash seams for tests: `WALPOST_FAILPOINT=<name>` aborts the process there.
pub mod failpoint {
    use std::sync::OnceLock;

    /// After Kafka acknowledged records that advance the flush LSN, before it is sent.
    pub const AFTER_ACK_BEFORE_CONFIRM: &str = "after-ack-before-confirm";

    pub fn hit(name: &str) {
        static ACTIVE: OnceLock<Option<String>> = OnceLock::new();
        let active = ACTIVE.get_or_init(|| std::env::var("WALPOST_FAILPOINT").ok());
        if active.as_deref() == Some(name) {
            eprintln!("walpost: failpoint {name} reached, aborting");
            std::process::abort();
        }
    }
}

/// How a session ended without error.
enum SessionEnd {
    Shutdown,
}

/// Streams until shutdown (Ok) or a definite error.
pub async fn run(
    settings: &Settings,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), PipelineError> {
    let producer_config =
        sink::producer_config(&settings.kafka_brokers, &settings.kafka_properties).map_err(PipelineError::definite)?;
    let mut backoff = Backoff::new(settings.max_backoff);
    loop {
        let started = Instant::now();
        let result = session(settings, &producer_config, &metrics, &mut shutdown).await;
        metrics.set_streaming(false);
        match result {
            Ok(SessionEnd::Shutdown) => return Ok(()),
            Err(PipelineError::Definite(message)) => return Err(PipelineError::Definite(message)),
            Err(PipelineError::Transient(message)) => {
                if started.elapsed() > Duration::from_secs(30) {
                    backoff.reset();
                }
                let wait = backoff.next_delay();
                tracing::warn!(retry_in_ms = wait.as_millis() as u64, "{message}; reconnecting");
                metrics.reconnect();
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = shutdown.changed() => return Ok(()),
                }
            }
        }
    }
}

/// Capped exponential backoff: 250 ms, 500 ms, 1 s, ... up to `max`.
#[derive(Debug)]
struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(250);

    fn new(max: Duration) -> Backoff {
        Backoff { next: Self::FIRST, max }
    }

    fn next_delay(&mut self) -> Duration {
        let d = self.next.min(self.max);
        self.next = (self.next * 2).min(self.max);
        d
    }

    fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

/// Connects, checks, starts streaming and runs the loop until something ends it.
async fn session(
    s: &Settings,
    producer_config: &ClientConfig,
    metrics: &Arc<Metrics>,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<SessionEnd, PipelineError> {
    // The producer first: its broker connection and idempotent producer id are set up
    // in the background while PostgreSQL is checked, so the first record does not wait.
    let (sink, mut reports) = KafkaSink::new(producer_config, metrics.clone()).map_err(PipelineError::definite)?;
    let checked = async {
        let mut sql = ReplicationClient::connect_sql(&s.postgres).await?;
        setup::preflight(&mut sql, s).await?;
        if s.snapshot != SnapshotMode::Never {
            snapshot::validate_filter(&mut sql, s).await?;
        }
        Ok::<_, PipelineError>(sql)
    };
    if s.snapshot == SnapshotMode::InitialOnly {
        let mut sql = checked.await?;
        // A backfill: read in a fresh snapshot, no slot (it would only pin WAL).
        let rows = snapshot::run(&mut sql, s, None, &sink, &mut reports, metrics).await?;
        tracing::info!(rows, "--snapshot initial_only: every row is acknowledged by Kafka; exiting");
        sql.close().await;
        return Ok(SessionEnd::Shutdown);
    }
    // The replication connection is opened while PostgreSQL is checked (each connection
    // costs a backend start and an authentication); a failed check is reported first.
    let (checked, repl) = tokio::join!(checked, ReplicationClient::connect(&s.postgres));
    let mut sql = checked?;
    let mut repl = repl?;
    let mut slot = setup::slot_row(&mut sql, &s.slot).await?;
    let snapshots = matches!(s.snapshot, SnapshotMode::Initial | SnapshotMode::WhenNeeded);
    if snapshots && snapshot::unfinished(&mut sql, s).await? {
        if let Some(row) = &slot {
            if let Some(pid) = row.active_pid {
                return Err(PipelineError::transient(format!(
                    "replication slot \"{}\" is in use by server process {pid}; waiting to restart the unfinished snapshot",
                    s.slot
                )));
            }
            tracing::warn!(slot = %s.slot, "an earlier snapshot did not finish: dropping the slot and starting the snapshot over on a new one");
            setup::drop_slot(&mut sql, &s.slot).await?;
        }
        slot = None;
    }
    if s.snapshot == SnapshotMode::WhenNeeded && slot.as_ref().is_some_and(|r| r.wal_status.as_deref() == Some("lost"))
    {
        tracing::warn!(slot = %s.slot, "the slot was invalidated (wal_status = lost): --snapshot when_needed drops it and takes a new snapshot");
        setup::drop_slot(&mut sql, &s.slot).await?;
        slot = None;
    }

    let system = repl.identify_system().await?;
    tracing::debug!(system_id = %system.system_id, timeline = system.timeline, wal = %system.xlog_pos, "connected for replication");
    let start = match slot {
        Some(row) => {
            setup::check_slot(&row, s)?;
            if s.snapshot == SnapshotMode::Initial {
                tracing::info!(slot = %s.slot, "replication slot already exists: no snapshot will be taken (--snapshot initial snapshots only when it creates the slot; drop the slot to take a new one)");
            }
            row.confirmed_flush.unwrap_or(Lsn::ZERO)
        }
        None => {
            if snapshots {
                snapshot::mark_started(&mut sql, s).await?;
            }
            let export = if snapshots { SlotSnapshot::Export } else { SlotSnapshot::Nothing };
            let created = repl.create_logical_slot(&s.slot, "pgoutput", export, s.slot_failover).await?;
            tracing::info!(slot = %s.slot, consistent_point = %created.consistent_point, "created replication slot");
            if snapshots {
                let rows =
                    snapshot::run(&mut sql, s, created.snapshot_name.as_deref(), &sink, &mut reports, metrics).await?;
                snapshot::mark_finished(&mut sql, s, rows).await?;
            }
            created.consistent_point
        }
    };
    sql.close().await;

    let publications = quote_ident(&s.publication);
    let mut options = vec![("proto_version", "1"), ("publication_names", publications.as_str())];
    if s.messages.is_some() {
        // Logical decoding messages (pg_logical_emit_message), PostgreSQL 14+.
        options.push(("messages", "true"));
    }
    let stream = repl.start_logical_replication(&s.slot, start, &options).await?;
    tracing::info!(slot = %s.slot, from = %start, "streaming");
    metrics.set_streaming(true);
    metrics.set_confirmed_lsn(start.0);

    let mut session = Session {
        s,
        metrics: metrics.clone(),
        sink,
        reports,
        stream,
        decoder: Decoder::new(),
        routers: s
            .outboxes
            .iter()
            .map(|o| Router::new(o.router.clone()))
            .collect::<Result<_, _>>()
            .map_err(PipelineError::definite)?,
        message_router: match &s.messages {
            Some(m) => Some(Router::new(m.router.clone()).map_err(PipelineError::definite)?),
            None => None,
        },
        relations: HashMap::new(),
        checkpoint: Checkpoint::new(start),
        current: None,
        received: start,
        sent_flush: start,
        last_status: Instant::now(),
        in_flight_bytes: 0,
        acked_since_status: false,
        last_delivery: Instant::now(),
        new_topics: NewTopicBarrier::default(),
        shutdown: shutdown.clone(),
    };
    let result = session.stream_loop(shutdown).await;
    match &result {
        Ok(SessionEnd::Shutdown) => session.finish("shutdown").await,
        Err(PipelineError::Definite(_)) => session.finish("halting").await,
        // The connection may be gone; what was acked but not confirmed is sent again.
        Err(PipelineError::Transient(_)) => {}
    }
    result
}

fn rejected(r: &sink::Rejection) -> PipelineError {
    PipelineError::definite(r.operator_message())
}

/// What the pipeline knows about a relation from its last Relation message.
enum RelationEntry {
    /// Outbox number `.0` of `Settings::outboxes`.
    Outbox(usize, ResolvedRelation),
    /// An outbox table whose columns no longer match the configuration.
    Unroutable(usize, router::RouteError),
    /// Another table in the publication: its inserts are not outbox events.
    Other,
}

/// The transaction being read.
struct OpenTxn {
    seq: TxnSeq,
    commit_time_ms: i64,
    final_lsn: Lsn,
}

struct Session<'a> {
    s: &'a Settings,
    metrics: Arc<Metrics>,
    sink: KafkaSink,
    reports: mpsc::UnboundedReceiver<Delivery>,
    stream: ReplicationStream,
    decoder: Decoder,
    /// One router per outbox table, same order as `Settings::outboxes`.
    routers: Vec<Router>,
    message_router: Option<Router>,
    relations: HashMap<u32, RelationEntry>,
    checkpoint: Checkpoint,
    current: Option<OpenTxn>,
    received: Lsn,
    sent_flush: Lsn,
    last_status: Instant,
    in_flight_bytes: u64,
    /// The last delivery report, or when records started waiting after none did.
    last_delivery: Instant,
    /// The first record for a topic in this session goes alone.
    new_topics: NewTopicBarrier,
    /// Seen by waits outside the main loop ([`Session::await_all_acks`]).
    shutdown: watch::Receiver<bool>,
    /// Kafka acknowledged records since the last status update (for the failpoint).
    acked_since_status: bool,
}

/// Do not send status updates more often than this just because the flush LSN moved.
const MIN_STATUS_GAP: Duration = Duration::from_millis(200);

impl Session<'_> {
    async fn stream_loop(&mut self, shutdown: &mut watch::Receiver<bool>) -> Result<SessionEnd, PipelineError> {
        let mut tick = tokio::time::interval(MIN_STATUS_GAP);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let can_read = self.checkpoint.in_flight_records() < self.s.max_in_flight_records
                && self.in_flight_bytes < self.s.max_in_flight_bytes;
            tokio::select! {
                biased;
                _ = shutdown.changed() => return Ok(SessionEnd::Shutdown),
                Some(report) = self.reports.recv() => self.on_delivery(report).await?,
                _ = tick.tick() => {
                    self.metrics.set_lag_from(self.checkpoint.oldest_pending_commit_ms());
                    self.check_delivery_progress()?;
                    self.maybe_send_status(false).await?
                }
                message = self.stream.next(), if can_read => match message? {
                    Some(ReplicationMessage::XLogData(x)) => self.on_xlog(x).await?,
                    Some(ReplicationMessage::PrimaryKeepalive(k)) => self.on_keepalive(k).await?,
                    None => return Err(PipelineError::transient("PostgreSQL ended the replication stream")),
                },
            }
        }
    }

    /// librdkafka never expires a record (message.timeout.ms = 0), so a producer that
    /// stops acknowledging (a broker gone for good, or the client stuck after a broker
    /// restart) is restarted here: the session ends, the producer is dropped with what
    /// it still holds, and the next session re-sends from the confirmed position. What
    /// reached the broker is a prefix of each partition's records, so nothing is
    /// reordered.
    fn check_delivery_progress(&self) -> Result<(), PipelineError> {
        if self.checkpoint.in_flight_records() > 0 && self.last_delivery.elapsed() >= self.s.delivery_timeout {
            return Err(self.stalled());
        }
        Ok(())
    }

    fn stalled(&self) -> PipelineError {
        PipelineError::transient(format!(
            "Kafka acknowledged no record for {} s while {} records waited; restarting the producer from the last confirmed position {}",
            self.last_delivery.elapsed().as_secs(),
            self.checkpoint.in_flight_records(),
            self.checkpoint.flush_lsn()
        ))
    }

    async fn on_delivery(&mut self, report: Delivery) -> Result<(), PipelineError> {
        self.last_delivery = Instant::now();
        self.in_flight_bytes = self.in_flight_bytes.saturating_sub(report.bytes());
        match report {
            Delivery::Delivered { txn, .. } => {
                self.checkpoint.delivered(txn).map_err(PipelineError::definite)?;
                self.acked_since_status = true;
                self.metrics.set_in_flight(self.checkpoint.in_flight_records());
                Ok(())
            }
            Delivery::Retryable { error, .. } => Err(PipelineError::transient(format!(
                "Kafka did not acknowledge a record ({error}); restarting from the last confirmed position {}",
                self.checkpoint.flush_lsn()
            ))),
            Delivery::Rejected { txn, rejection, original, .. } => {
                let dead_letter = self.s.on_permanent_error == OnPermanentError::DeadLetter
                    && rejection.topic != self.s.dead_letter_topic;
                match original {
                    Some(o) if dead_letter => {
                        let mut headers: Vec<(Arc<str>, Bytes)> =
                            o.headers.into_iter().map(|(k, v)| (Arc::from(k.as_str()), Bytes::from(v))).collect();
                        headers.retain(|(k, _)| !k.starts_with("walpost.error."));
                        let record = self.dead_letter_record(
                            rejection.code.clone(),
                            format!("{}: {}", rejection.error, rejection.fix),
                            &rejection.topic,
                            Bytes::from(rejection.event_id.clone()),
                            o.key.map(Bytes::from),
                            o.value.map(Bytes::from),
                            headers,
                        );
                        // The dead letter takes the rejected record's place in its
                        // transaction: the transaction is confirmable once it is acked.
                        self.send(txn, &record, None).await?;
                        self.checkpoint.delivered(txn).map_err(PipelineError::definite)?;
                        Ok(())
                    }
                    _ => Err(rejected(&rejection)),
                }
            }
        }
    }

    /// A record for the dead-letter topic: the original key and value, the original
    /// headers, and headers saying what went wrong and where the event came from.
    #[allow(clippy::too_many_arguments)]
    fn dead_letter_record(
        &self,
        class: String,
        message: String,
        original_topic: &str,
        event_id: Bytes,
        key: Option<Bytes>,
        value: Option<Bytes>,
        mut headers: Vec<(Arc<str>, Bytes)>,
    ) -> Record {
        let lsn = self.current.as_ref().map(|t| t.final_lsn).unwrap_or(self.received);
        self.metrics.dead_letter(&class);
        tracing::warn!(event_id = %String::from_utf8_lossy(&event_id), class = %class, dead_letter_topic = %self.s.dead_letter_topic, "sending an event that can never be published to the dead-letter topic");
        let h = |k: &str, v: String| (Arc::from(k), Bytes::from(v));
        // A record refused for its size would be refused again on the dead-letter topic:
        // send it without its value; the event id and LSN find it in the outbox.
        let too_large =
            matches!(class.as_str(), "message_size_too_large" | "invalid_message_size" | "message_batch_too_large");
        let value = if too_large {
            headers.push(h("walpost.value.dropped", "too large for Kafka; read it from the outbox by event id".into()));
            None
        } else {
            value
        };
        headers.push(h("walpost.error.class", class));
        headers.push(h("walpost.error.message", message));
        headers.push(h("walpost.original.topic", original_topic.to_owned()));
        headers.push(h("walpost.event.id", String::from_utf8_lossy(&event_id).into_owned()));
        headers.push(h("walpost.lsn", lsn.to_string()));
        Record {
            topic: Arc::from(self.s.dead_letter_topic.as_str()),
            key: key.unwrap_or_default(),
            value,
            headers,
            event_id,
            timestamp_ms: None,
            partition: None,
        }
    }

    /// Hands a record to Kafka as part of `txn`; a rejection found before sending goes
    /// the same way as one reported later. The first record for a topic in a session
    /// goes alone ([`NewTopicBarrier`]).
    async fn send(&mut self, txn: TxnSeq, record: &Record, timestamp_ms: Option<i64>) -> Result<(), PipelineError> {
        let first_for_topic = self.new_topics.must_go_alone(&record.topic);
        if first_for_topic {
            self.await_all_acks().await?;
        }
        match self.sink.send(txn, record, timestamp_ms).await {
            Ok(()) => {}
            Err(SendError::Retryable(e)) => {
                return Err(PipelineError::transient(format!("cannot hand a record to Kafka: {e}")))
            }
            Err(SendError::Rejected(r)) => {
                let dead_letter =
                    self.s.on_permanent_error == OnPermanentError::DeadLetter && r.topic != self.s.dead_letter_topic;
                if !dead_letter {
                    return Err(rejected(&r));
                }
                let dlq = self.dead_letter_record(
                    r.code.clone(),
                    format!("{}: {}", r.error, r.fix),
                    &r.topic,
                    record.event_id.clone(),
                    Some(record.key.clone()),
                    record.value.clone(),
                    record.headers.clone(),
                );
                return Box::pin(self.send(txn, &dlq, None)).await;
            }
        }
        if self.checkpoint.in_flight_records() == 0 {
            // Nothing was waiting: the silence the watchdog measures starts now.
            self.last_delivery = Instant::now();
        }
        self.checkpoint.record_sent(txn).map_err(PipelineError::definite)?;
        self.in_flight_bytes += record.value.as_ref().map_or(0, |v| v.len() as u64);
        self.metrics.set_in_flight(self.checkpoint.in_flight_records());
        if first_for_topic && self.await_all_acks().await? {
            self.new_topics.settled(&record.topic);
        }
        Ok(())
    }

    /// Handles delivery reports until Kafka has answered for every record handed to it,
    /// within the delivery timeout.
    /// `Ok(false)`: a shutdown was requested before everything was acknowledged (the
    /// main loop then sees it and finishes the session).
    async fn await_all_acks(&mut self) -> Result<bool, PipelineError> {
        let deadline = tokio::time::Instant::now() + self.s.delivery_timeout;
        let mut shutdown = self.shutdown.clone();
        while self.checkpoint.in_flight_records() > 0 {
            if *shutdown.borrow() {
                return Ok(false);
            }
            let report = tokio::select! {
                biased;
                _ = shutdown.changed() => return Ok(false),
                report = tokio::time::timeout_at(deadline, self.reports.recv()) => report,
            };
            match report {
                Ok(Some(report)) => Box::pin(self.on_delivery(report)).await?,
                Ok(None) => return Err(PipelineError::transient("the Kafka client stopped reporting deliveries")),
                Err(_) => return Err(self.stalled()),
            }
        }
        Ok(true)
    }

    /// A row or message that cannot be routed: dead letter or halt, by configuration.
    async fn unroutable(
        &mut self,
        txn: TxnSeq,
        error: router::RouteError,
        salvage: (Option<Bytes>, Option<Bytes>, Option<Bytes>),
        final_lsn: Lsn,
    ) -> Result<(), PipelineError> {
        if self.s.on_permanent_error != OnPermanentError::DeadLetter {
            return Err(PipelineError::definite(format!(
                "cannot route a row of the transaction committing at {final_lsn}: {error}; nothing past {} was confirmed (set on_permanent_error = \"dead_letter\" to divert such rows instead of halting)",
                self.checkpoint.flush_lsn()
            )));
        }
        let (id, key, payload) = salvage;
        let record = self.dead_letter_record(
            error.class().to_owned(),
            error.to_string(),
            "",
            id.unwrap_or_default(),
            key,
            payload,
            Vec::new(),
        );
        self.send(txn, &record, None).await
    }

    /// An UPDATE/DELETE/TRUNCATE of an outbox table, or a message that may not be
    /// published: `table.op.invalid.behavior` decides.
    fn invalid_operation(&self, behavior: OpInvalid, what: &str) -> Result<(), PipelineError> {
        self.metrics.skipped(match behavior {
            OpInvalid::Fatal => "fatal",
            _ => "invalid_operation",
        });
        match behavior {
            OpInvalid::Warn => {
                tracing::warn!("{what}: not an outbox event, skipped (table.op.invalid.behavior = warn)");
                Ok(())
            }
            OpInvalid::Error => {
                tracing::error!("{what}: not an outbox event, skipped (table.op.invalid.behavior = error)");
                Ok(())
            }
            OpInvalid::Fatal => Err(PipelineError::definite(format!(
                "{what}, and table.op.invalid.behavior = fatal: only INSERTs into the outbox are events; publish inserts only (ALTER PUBLICATION ... SET (publish = 'insert')) or relax the setting"
            ))),
        }
    }

    async fn on_keepalive(&mut self, k: PrimaryKeepalive) -> Result<(), PipelineError> {
        self.received = self.received.max(k.wal_end);
        self.metrics.set_received_lsn(self.received.0);
        if self.current.is_none() {
            self.checkpoint.idle_position(k.wal_end);
        }
        if k.reply_requested {
            self.send_status(k.reply_requested).await?;
        }
        Ok(())
    }

    async fn on_xlog(&mut self, x: XLogData) -> Result<(), PipelineError> {
        self.received = self.received.max(x.wal_start);
        self.metrics.set_received_lsn(self.received.0);
        let message = self.decoder.decode(x.data).map_err(|e| {
            PipelineError::definite(format!(
                "malformed pgoutput message at LSN {}: {e}; nothing past {} was confirmed. This is a walpost or server bug: report it with the server version",
                x.wal_start,
                self.checkpoint.flush_lsn()
            ))
        })?;
        match message {
            LogicalMessage::Begin(b) => {
                if self.current.is_some() {
                    return Err(PipelineError::definite("pgoutput protocol: Begin inside an open transaction"));
                }
                let unix_micros = pgoutput::pg_epoch_micros_to_unix_micros(b.commit_time);
                let commit_time_ms = unix_micros.div_euclid(1000);
                self.current = Some(OpenTxn {
                    seq: self.checkpoint.begin(commit_time_ms),
                    commit_time_ms,
                    final_lsn: b.final_lsn,
                });
            }
            LogicalMessage::Commit(c) => {
                let txn = self
                    .current
                    .take()
                    .ok_or_else(|| PipelineError::definite("pgoutput protocol: Commit without Begin"))?;
                self.checkpoint.commit(txn.seq, c.end_lsn).map_err(PipelineError::definite)?;
                self.metrics.transaction();
            }
            LogicalMessage::Relation(r) => self.on_relation(&r),
            LogicalMessage::Insert(insert) => {
                let txn = self
                    .current
                    .as_ref()
                    .ok_or_else(|| PipelineError::definite("pgoutput protocol: Insert outside a transaction"))?;
                let (seq, ts, final_lsn) = (txn.seq, txn.commit_time_ms, txn.final_lsn);
                let routed = match self.relations.get(&insert.relation_oid) {
                    Some(RelationEntry::Outbox(i, rel)) => {
                        let router = self.routers.get_mut(*i).ok_or_else(|| PipelineError::definite("router index"))?;
                        router.route(rel, &insert.tuple).map_err(|e| (e, router.salvage(rel, &insert.tuple)))
                    }
                    Some(RelationEntry::Unroutable(_, e)) => Err((e.clone(), (None, None, None))),
                    Some(RelationEntry::Other) => return Ok(()),
                    None => {
                        return Err(PipelineError::definite(format!(
                            "pgoutput protocol: Insert for relation {} before its Relation message",
                            insert.relation_oid
                        )))
                    }
                };
                match routed {
                    Ok(record) => self.send(seq, &record, Some(ts)).await?,
                    Err((e, salvage)) => self.unroutable(seq, e, salvage, final_lsn).await?,
                }
            }
            LogicalMessage::Update(u) => self.on_other_operation("UPDATE", &[u.relation_oid])?,
            LogicalMessage::Delete(d) => self.on_other_operation("DELETE", &[d.relation_oid])?,
            LogicalMessage::Truncate(t) => self.on_other_operation("TRUNCATE", &t.relation_oids)?,
            LogicalMessage::Message(m) => self.on_message(m).await?,
            // The publication sends inserts only; anything else on a table walpost did
            // not set up is not an outbox event.
            LogicalMessage::Origin(_) | LogicalMessage::Type(_) => {}
            LogicalMessage::StreamStart(_)
            | LogicalMessage::StreamStop
            | LogicalMessage::StreamCommit(_)
            | LogicalMessage::StreamAbort(_)
            | LogicalMessage::BeginPrepare(_)
            | LogicalMessage::Prepare(_)
            | LogicalMessage::CommitPrepared(_)
            | LogicalMessage::RollbackPrepared(_)
            | LogicalMessage::StreamPrepare(_) => {
                return Err(PipelineError::definite(
                    "pgoutput sent a streamed or two-phase transaction message, which walpost does not request (proto_version 1): report this with the server version",
                ))
            }
        }
        Ok(())
    }

    fn on_relation(&mut self, r: &Relation) {
        let outbox = self.s.outboxes.iter().position(|o| {
            r.namespace.as_ref() == o.table.schema.as_bytes() && r.name.as_ref() == o.table.name.as_bytes()
        });
        let entry = match outbox.and_then(|i| Some((i, self.routers.get(i)?))) {
            None => RelationEntry::Other,
            Some((i, router)) => match router.resolve(r) {
                Ok(resolved) => RelationEntry::Outbox(i, resolved),
                Err(e) => {
                    tracing::warn!("outbox table changed: {e}");
                    RelationEntry::Unroutable(i, e)
                }
            },
        };
        self.relations.insert(r.oid, entry);
    }

    /// UPDATE/DELETE/TRUNCATE: only an outbox table's count as invalid operations.
    fn on_other_operation(&self, op: &str, relation_oids: &[u32]) -> Result<(), PipelineError> {
        for oid in relation_oids {
            if let Some(RelationEntry::Outbox(i, _) | RelationEntry::Unroutable(i, _)) = self.relations.get(oid) {
                let outbox = self.s.outboxes.get(*i).ok_or_else(|| PipelineError::definite("outbox index"))?;
                self.invalid_operation(outbox.op_invalid, &format!("{op} on outbox table {}", outbox.table))?;
            }
        }
        Ok(())
    }

    /// A logical decoding message: an event when its prefix is configured.
    async fn on_message(&mut self, m: pgoutput::Message) -> Result<(), PipelineError> {
        let Some(config) = &self.s.messages else {
            return Ok(());
        };
        let prefix = String::from_utf8_lossy(&m.prefix);
        if !config.prefixes.iter().any(|p| *p == prefix) {
            return Ok(());
        }
        let source = format!("message prefix {prefix}");
        let (seq, ts, final_lsn, own_txn) = match (&self.current, m.transactional) {
            (Some(t), true) => (t.seq, Some(t.commit_time_ms), t.final_lsn, false),
            (None, false) if config.allow_non_transactional => {
                (self.checkpoint.begin(crate::metrics::now_ms()), None, m.lsn, true)
            }
            (None, false) => {
                return self.invalid_operation(
                    config.op_invalid,
                    &format!(
                        "non-transactional message with prefix {prefix} at {} (allow_non_transactional is false)",
                        m.lsn
                    ),
                )
            }
            _ => return Err(PipelineError::definite("pgoutput protocol: message outside its transaction")),
        };
        let router = self.message_router.as_mut().ok_or_else(|| PipelineError::definite("message router"))?;
        match router.route_json(&m.content, &source) {
            Ok(record) => self.send(seq, &record, ts).await?,
            Err(e) => self.unroutable(seq, e, (None, None, Some(m.content.clone())), final_lsn).await?,
        }
        if own_txn {
            // Everything before the message's position was already decoded and sent.
            self.checkpoint.commit(seq, m.lsn).map_err(PipelineError::definite)?;
        }
        Ok(())
    }

    /// Sends a status update if the flush position moved or the interval elapsed.
    async fn maybe_send_status(&mut self, force: bool) -> Result<(), PipelineError> {
        let moved = self.checkpoint.flush_lsn() != self.sent_flush;
        if force || moved || self.last_status.elapsed() >= self.s.status_interval {
            self.send_status(false).await?;
        }
        Ok(())
    }

    async fn send_status(&mut self, reply: bool) -> Result<(), PipelineError> {
        let flush = self.checkpoint.flush_lsn();
        if flush != self.sent_flush && self.acked_since_status {
            failpoint::hit(failpoint::AFTER_ACK_BEFORE_CONFIRM);
        }
        let write = self.received.max(flush);
        self.stream.send_status(write, flush, flush, reply).await?;
        self.sent_flush = flush;
        self.acked_since_status = false;
        self.last_status = Instant::now();
        self.metrics.set_confirmed_lsn(flush.0);
        Ok(())
    }

    /// Stops reading, waits (bounded) for outstanding acknowledgements, confirms what
    /// was delivered and closes the stream.
    async fn finish(mut self, why: &str) {
        let deadline = tokio::time::Instant::now() + self.s.shutdown_timeout;
        while self.checkpoint.in_flight_records() > 0 {
            match tokio::time::timeout_at(deadline, self.reports.recv()).await {
                Ok(Some(Delivery::Delivered { txn, bytes })) => {
                    self.in_flight_bytes = self.in_flight_bytes.saturating_sub(bytes);
                    if self.checkpoint.delivered(txn).is_err() {
                        break;
                    }
                }
                // A failed record blocks everything after it: nothing more to confirm.
                Ok(Some(_)) | Ok(None) => break,
                Err(_) => {
                    tracing::warn!(
                        unacknowledged = self.checkpoint.in_flight_records(),
                        "Kafka did not acknowledge everything within the shutdown timeout; those events will be sent again on restart"
                    );
                    break;
                }
            }
        }
        match self.send_status(false).await {
            Ok(()) => {
                tracing::info!(confirmed = %self.checkpoint.flush_lsn(), "{why}: confirmed position sent")
            }
            Err(e) => tracing::warn!("{why}: could not send the final position: {e}"),
        }
        self.stream.close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_secs(2));
        let delays: Vec<_> = (0..6).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(delays, vec![250, 500, 1000, 2000, 2000, 2000]);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(250));
    }
}
