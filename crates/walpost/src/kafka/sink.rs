//! The producer: hands records to librdkafka and turns each delivery report into a
//! [`Report`] on a channel.
//!
//! Every record carries a sequence number as its delivery opaque; [`super::window`]
//! knows what each number stands for. Outcomes:
//! - [`Outcome::Delivered`]: acknowledged with acks=all;
//! - [`Outcome::Retryable`]: Kafka may take it later (broker gone, fatal idempotence
//!   state); the stream restarts from the last confirmed LSN with a new producer;
//! - [`Outcome::Rejected`]: Kafka will never take it (too large, not authorised, ...);
//!   the permanent-error policy halts or dead-letters it.
//!
//! librdkafka's log lines go to `tracing`; lines of one kind are logged once per
//! [`super::throttle::WINDOW`] (see [`super::throttle`]), and its warnings about configuration walpost set itself (not the
//! user) are debug lines ([`super::config::log_defaults`] says what walpost sets, once).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{DeliveryResult, Producer, ProducerContext};
use rdkafka::{ClientConfig, ClientContext};
use router::Record;
use tokio::sync::mpsc;

use super::barrier::Placement;
use super::config::SinkError;
use super::handoff::Handoff;
use super::rejection::{classify, Rejection};
use super::throttle::{left_out_note, LogThrottle};
use crate::telemetry::metrics::KafkaMetrics;
use crate::telemetry::now_ms;

/// librdkafka's log facility for records it counts as delivered because a later batch
/// of their partition was. When the earlier batch had failed before the broker wrote it
/// (a partition with no state for this producer id accepts any sequence number), those
/// records are lost; see `kafka::barrier`, which keeps that from happening, and
/// [`Outcome::ImplicitlyAcked`], which is what the sink does if it happens anyway.
pub(crate) const IMPLICIT_ACK: &str = "IMPLICITACK";

/// The sequence number of a report about no record of walpost's (e.g.
/// [`Outcome::ImplicitlyAcked`]).
pub(crate) const NO_RECORD: u64 = u64::MAX;

/// What happened to record `seq`.
#[derive(Debug)]
pub struct Report {
    pub seq: u64,
    pub outcome: Outcome,
}

/// See the module docs.
#[derive(Debug)]
pub enum Outcome {
    /// Where Kafka put it.
    Delivered {
        partition: i32,
        offset: i64,
    },
    Retryable {
        error: String,
    },
    Rejected {
        rejection: Rejection,
        original: Box<Original>,
    },
    /// librdkafka logged [`IMPLICIT_ACK`]: reports that follow may count records as
    /// delivered that Kafka never wrote. Comes before those reports (the log line and
    /// the reports share librdkafka's queue, in order). `line` is librdkafka's.
    ImplicitlyAcked {
        line: String,
    },
}

/// A copy of a rejected record, kept so it can go to the dead-letter topic.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Original {
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Vec<u8>)>,
}

impl Original {
    /// A copy of `record`'s key, value and headers.
    pub fn of(record: &Record) -> Original {
        Original {
            key: Some(record.key.to_vec()),
            value: record.value.as_ref().map(|v| v.to_vec()),
            headers: record.headers.iter().map(|(k, v)| (k.to_string(), v.to_vec())).collect(),
        }
    }
}

/// Handing a record over failed before it was sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendError {
    /// librdkafka's queue is full: try again after some deliveries.
    QueueFull,
    Rejected(Rejection),
    Retryable(String),
}

/// librdkafka callbacks: delivery reports to the window, logs to tracing.
#[derive(Debug)]
pub(crate) struct SinkContext {
    reports: mpsc::UnboundedSender<Report>,
    metrics: KafkaMetrics,
    /// Properties the user set: librdkafka's configuration warnings about others are noise.
    user_keys: BTreeSet<String>,
    /// Topics whose records are not events (the exactly-once progress topic): not counted
    /// in `walpost_events_published_total`.
    not_events: Vec<String>,
    throttle: LogThrottle,
}

impl SinkContext {
    /// A configuration warning about a property the user did not set.
    fn about_our_own_setting(&self, facility: &str, line: &str) -> bool {
        facility == "CONFWARN"
            && line
                .split(|c: char| c.is_whitespace() || c == '"' || c == '`')
                .filter(|w| w.contains('.') && w.chars().all(|c| c.is_ascii_lowercase() || c == '.' || c == '_'))
                .all(|property| !self.user_keys.contains(property))
    }
}

/// librdkafka's retries while a fresh broker loads its coordinators ("Failed to acquire
/// idempotence PID from broker ...: Coordinator load in progress: retrying"): normal at a
/// broker's start, not an operator's concern (they are retried, and a lasting failure
/// shows as records not acknowledged).
fn transient_start_up(line: &str) -> bool {
    line.contains("Coordinator load in progress") || line.contains("Coordinator not available")
}

impl ClientContext for SinkContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        if fac == IMPLICIT_ACK {
            self.metrics.produce_error("implicit_ack");
            let _ = self
                .reports
                .send(Report { seq: NO_RECORD, outcome: Outcome::ImplicitlyAcked { line: log_message.to_owned() } });
        }
        // A failure that lasts (a refused SASL handshake) is logged every few hundred ms:
        // throttled by kind, as the inbox's consumer logs it.
        let quiet = self.about_our_own_setting(fac, log_message) || transient_start_up(log_message);
        kafka_common::librdkafka_line!(self.throttle, level, fac, log_message, quiet);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        // Connection failures are already in librdkafka's own log lines; they are counted
        // as they happen (records wait meanwhile, and fail only when a producer is closed).
        let logged_already = matches!(
            error.rdkafka_error_code(),
            Some(RDKafkaErrorCode::BrokerTransportFailure | RDKafkaErrorCode::AllBrokersDown)
        );
        if logged_already {
            self.metrics.produce_error("connection");
        }
        let admitted = if logged_already { None } else { self.throttle.admit("error", reason, Instant::now()) };
        match admitted {
            None => tracing::debug!(error = %error, "Kafka client error: {reason}"),
            Some(n) => tracing::warn!(error = %error, "Kafka client error: {reason}{}", left_out_note(n)),
        }
    }
}

impl ProducerContext for SinkContext {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, opaque: usize) {
        let seq = opaque as u64;
        let outcome = match result {
            Ok(msg) => {
                if !self.not_events.iter().any(|t| t == msg.topic()) {
                    self.metrics.published(msg.topic(), msg.payload_len() as u64);
                }
                if let Some(ts) = msg.timestamp().to_millis() {
                    self.metrics.latency.observe((now_ms() - ts).max(0) as f64 / 1000.0);
                }
                Outcome::Delivered { partition: msg.partition(), offset: msg.offset() }
            }
            Err((error, msg)) => match classify(error) {
                Some((code, fix)) => {
                    self.metrics.produce_error("rejected");
                    // Names are walpost's own (UTF-8); read as bytes all the same, since
                    // rust-rdkafka's `Headers` panics on a name that is not UTF-8.
                    let headers: Vec<(String, Vec<u8>)> = super::headers::raw(msg)
                        .into_iter()
                        .map(|(name, value)| {
                            (String::from_utf8_lossy(name).into_owned(), value.unwrap_or_default().to_vec())
                        })
                        .collect();
                    let event_id = headers
                        .iter()
                        .find(|(k, _)| k == router::HEADER_ID)
                        .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
                        .unwrap_or_default();
                    Outcome::Rejected {
                        rejection: Rejection {
                            event_id,
                            topic: msg.topic().to_owned(),
                            code: code.to_owned(),
                            error: error.to_string(),
                            fix,
                        },
                        original: Box::new(Original {
                            key: msg.key().map(<[u8]>::to_vec),
                            value: msg.payload().map(<[u8]>::to_vec),
                            headers,
                        }),
                    }
                }
                None => {
                    // A record purged when walpost closes a producer is not a failure of
                    // Kafka's (it is sent again by the next producer).
                    let purged = matches!(
                        error.rdkafka_error_code(),
                        Some(RDKafkaErrorCode::PurgeQueue | RDKafkaErrorCode::PurgeInflight)
                    );
                    if !purged {
                        self.metrics.produce_error("retryable");
                    }
                    Outcome::Retryable { error: error.to_string() }
                }
            },
        };
        // The receiver is gone only when the stream has stopped; nothing to confirm then.
        let _ = self.reports.send(Report { seq, outcome });
    }
}

/// What the produce window needs of a producer (`kafka::window`): librdkafka's
/// ([`KafkaSink`]), or one of the tests' own. Delivery reports come back on the
/// channel made with it, one per record handed over, tagged with its sequence number.
pub trait Sink {
    /// Hands one record over without waiting (its report comes later, as `seq`).
    fn send(&mut self, seq: u64, record: &Record, timestamp_ms: Option<i64>) -> Result<(), SendError>;
    /// Where `record` will be written, as far as that is known before it is sent.
    fn placement(&mut self, record: &Record) -> Placement;
    /// Send what is held now rather than after `linger.ms` (a live transaction).
    fn send_now(&self);
    /// [`Sink::send_now`] for a record sent alone, until [`Sink::alone_answered`].
    fn send_alone_now(&self);
    /// The record sent alone has its report.
    fn alone_answered(&self);
    /// Records wait and nothing is acknowledged: reconnect to the bootstrap servers.
    fn rebootstrap(&self);
    /// The producer stopped for good and delivers nothing more.
    fn fatal_error(&self) -> Option<String>;
    /// Flushes (at most `timeout`) and destroys the producer; reports of records
    /// delivered meanwhile still reach the channel.
    fn close(self, timeout: Duration) -> impl std::future::Future<Output = ()> + Send;
    /// `--delivery exactly-once`: opens a Kafka transaction (local, does not wait).
    fn begin_transaction(&self) -> Result<(), KafkaError>;
    /// Commits the open transaction with everything handed over in it.
    fn commit_transaction(&self, timeout: Duration)
        -> impl std::future::Future<Output = Result<(), KafkaError>> + Send;
    /// Aborts the open transaction: nothing of it is ever read.
    fn abort_transaction(&self, timeout: Duration) -> impl std::future::Future<Output = Result<(), KafkaError>> + Send;
}

impl Sink for KafkaSink {
    fn send(&mut self, seq: u64, record: &Record, timestamp_ms: Option<i64>) -> Result<(), SendError> {
        KafkaSink::send(self, seq, record, timestamp_ms)
    }

    fn placement(&mut self, record: &Record) -> Placement {
        self.handoff.placement(record)
    }

    fn send_now(&self) {
        KafkaSink::send_now(self)
    }

    fn send_alone_now(&self) {
        KafkaSink::send_alone_now(self)
    }

    fn alone_answered(&self) {
        KafkaSink::alone_answered(self)
    }

    fn rebootstrap(&self) {
        KafkaSink::rebootstrap(self);
    }

    fn fatal_error(&self) -> Option<String> {
        KafkaSink::fatal_error(self)
    }

    fn close(self, timeout: Duration) -> impl std::future::Future<Output = ()> + Send {
        KafkaSink::close(self, timeout)
    }

    fn begin_transaction(&self) -> Result<(), KafkaError> {
        KafkaSink::begin_transaction(self)
    }

    fn commit_transaction(
        &self,
        timeout: Duration,
    ) -> impl std::future::Future<Output = Result<(), KafkaError>> + Send {
        KafkaSink::commit_transaction(self, timeout)
    }

    fn abort_transaction(&self, timeout: Duration) -> impl std::future::Future<Output = Result<(), KafkaError>> + Send {
        KafkaSink::abort_transaction(self, timeout)
    }
}

/// Runs a blocking librdkafka call on a blocking thread.
async fn blocking(call: impl FnOnce() -> Result<(), KafkaError> + Send + 'static) -> Result<(), KafkaError> {
    tokio::task::spawn_blocking(call).await.unwrap_or_else(|_| Err(KafkaError::Canceled))
}

/// A producer plus the channel of its delivery reports.
pub struct KafkaSink {
    handoff: Handoff<SinkContext>,
    /// `bootstrap.servers`, handed to librdkafka again by [`KafkaSink::rebootstrap`].
    bootstrap: Option<std::ffi::CString>,
}

impl std::fmt::Debug for KafkaSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSink").field("in_flight", &self.handoff.producer().in_flight_count()).finish()
    }
}

impl KafkaSink {
    /// `not_events`: topics whose records are not counted as published events.
    pub fn new(
        config: &ClientConfig,
        user_keys: BTreeSet<String>,
        not_events: Vec<String>,
        metrics: KafkaMetrics,
    ) -> Result<(KafkaSink, mpsc::UnboundedReceiver<Report>), SinkError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let context = SinkContext { reports: tx, metrics, user_keys, not_events, throttle: LogThrottle::default() };
        let producer = config.create_with_context(context).map_err(SinkError::Create)?;
        let bootstrap = config.get("bootstrap.servers").and_then(|b| std::ffi::CString::new(b).ok());
        let partitioner = config.get("partitioner").unwrap_or("murmur2_random");
        Ok((KafkaSink { handoff: Handoff::new(producer, partitioner), bootstrap }, rx))
    }

    /// Gives librdkafka the bootstrap servers again (returns librdkafka's count of them).
    ///
    /// Why: librdkafka (2.10 and later) forgets the bootstrap entries once it has
    /// metadata, and forgets a broker that a metadata response no longer lists. A broker
    /// that shuts down answers metadata without itself, so with one broker (or when the
    /// last known ones leave together) the client is left knowing no broker at all. It
    /// then never connects again: its own re-bootstrap timer starts only when a metadata
    /// request is sent, and with no broker none is. Adding the servers back is a no-op
    /// for those it still knows.
    pub fn rebootstrap(&self) -> i32 {
        let Some(servers) = &self.bootstrap else { return 0 };
        self.handoff.add_brokers(servers)
    }

    /// Hands one record to librdkafka without waiting ([`super::produce`]).
    pub fn send(&mut self, seq: u64, record: &Record, timestamp_ms: Option<i64>) -> Result<(), SendError> {
        match self.handoff.send(seq, record, timestamp_ms) {
            Ok(()) => Ok(()),
            Err(KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull)) => Err(SendError::QueueFull),
            Err(error) => Err(match classify(&error) {
                Some((code, fix)) => SendError::Rejected(Rejection {
                    event_id: String::from_utf8_lossy(&record.event_id).into_owned(),
                    topic: record.topic.to_string(),
                    code: code.to_owned(),
                    error: error.to_string(),
                    fix,
                }),
                None => SendError::Retryable(error.to_string()),
            }),
        }
    }

    /// Sends what librdkafka holds without waiting for `linger.ms` ([`super::produce`]):
    /// for a transaction read as it committed. Does not block.
    pub fn send_now(&self) {
        self.handoff.send_now();
    }

    /// [`KafkaSink::send_now`] for a record sent alone: until it is acknowledged.
    pub fn send_alone_now(&self) {
        self.handoff.send_alone_now();
    }

    /// The record sent alone has its report ([`super::handoff::Handoff::alone_answered`]).
    pub fn alone_answered(&self) {
        self.handoff.alone_answered();
    }

    /// `init_transactions`: fences any earlier producer with the same transactional id
    /// and aborts what it left open. Blocking: runs off the runtime.
    pub async fn init_transactions(&self, timeout: Duration) -> Result<(), KafkaError> {
        let producer = self.handoff.producer().clone();
        blocking(move || producer.init_transactions(timeout)).await
    }

    /// `begin_transaction` (local, does not wait).
    pub fn begin_transaction(&self) -> Result<(), KafkaError> {
        self.handoff.producer().begin_transaction()
    }

    /// `commit_transaction`: waits for every record's acknowledgement and commits them
    /// with the transaction.
    pub async fn commit_transaction(&self, timeout: Duration) -> Result<(), KafkaError> {
        let commit = self.handoff.committer();
        blocking(move || commit(timeout)).await
    }

    /// `abort_transaction`: nothing of the open transaction is ever read.
    pub async fn abort_transaction(&self, timeout: Duration) -> Result<(), KafkaError> {
        let producer = self.handoff.producer().clone();
        blocking(move || producer.abort_transaction(timeout)).await
    }

    /// The producer's fatal error (e.g. the gap-less guarantee after a record failed
    /// for good): it will deliver nothing more.
    pub fn fatal_error(&self) -> Option<String> {
        self.handoff.producer().client().fatal_error().map(|(code, reason)| format!("{code}: {reason}"))
    }

    /// Flushes (at most `timeout`) and destroys the producer on a blocking thread, so
    /// the runtime's only thread never waits for librdkafka. Reports of records
    /// delivered meanwhile still reach the channel.
    pub async fn close(self, timeout: Duration) {
        let handoff = self.handoff;
        let closing = tokio::task::spawn_blocking(move || {
            let producer = handoff.into_producer();
            let _ = producer.flush(timeout);
            drop(producer);
        });
        let _ = closing.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: every start on a fresh broker logged
    /// `WARN librdkafka: Failed to acquire idempotence PID ... Coordinator load in
    /// progress: retrying`. Those retries are debug lines now; other lines are not.
    #[test]
    fn regression_idempotence_pid_retries_at_a_brokers_start_are_not_warnings() {
        let line =
            "Failed to acquire idempotence PID from broker localhost:9092/1: Coordinator load in progress: retrying";
        assert!(transient_start_up(line));
        assert!(transient_start_up(
            "Failed to acquire transactional PID from broker b/1: Coordinator not available: retrying"
        ));
        assert!(!transient_start_up("localhost:9092/1: Connect to ipv4#127.0.0.1:9092 failed: Connection refused"));
    }
}
