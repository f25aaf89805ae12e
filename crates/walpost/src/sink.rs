//! The Kafka sink: produces routed records and reports each one's fate.
//!
//! Every record carries its transaction's [`TxnSeq`] as the delivery opaque; the
//! delivery callback turns librdkafka's report into a [`Delivery`]:
//! - `Delivered`: acknowledged with acks=all; the checkpoint may count it;
//! - `Retryable`: Kafka may take it later (timeout, broker gone, fatal idempotence
//!   state); the pipeline restarts from the last confirmed LSN with a new producer;
//! - `Rejected`: Kafka will never take it (too large, invalid topic, not authorised);
//!   the pipeline halts naming the event id and LSN.
//!
//! Ordering: acks=all + enable.idempotence=true keep per-partition order across
//! retries; `murmur2_random` puts a key in the same partition as Java clients and
//! Debezium. Settings that would break ordering or durability are refused.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientConfig, ClientContext};
use router::Record;
use tokio::sync::mpsc;

use crate::checkpoint::TxnSeq;
use crate::metrics::Metrics;

/// What happened to one produced record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    Delivered { txn: TxnSeq, bytes: u64 },
    Retryable { txn: TxnSeq, bytes: u64, error: String },
    Rejected { txn: TxnSeq, bytes: u64, rejection: Rejection, original: Option<Box<Original>> },
}

/// A copy of a rejected record, kept so it can go to the dead-letter topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Original {
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Vec<u8>)>,
}

impl Delivery {
    pub fn txn(&self) -> TxnSeq {
        match self {
            Delivery::Delivered { txn, .. } | Delivery::Retryable { txn, .. } | Delivery::Rejected { txn, .. } => *txn,
        }
    }

    pub fn bytes(&self) -> u64 {
        match self {
            Delivery::Delivered { bytes, .. }
            | Delivery::Retryable { bytes, .. }
            | Delivery::Rejected { bytes, .. } => *bytes,
        }
    }
}

/// A record Kafka will never accept, with what an operator needs to act.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub event_id: String,
    pub topic: String,
    pub code: String,
    pub error: String,
    pub fix: &'static str,
}

impl Rejection {
    /// The fatal error walpost stops with; quoted verbatim in runbooks/poison-record.md.
    pub fn operator_message(&self) -> String {
        format!(
            "Kafka rejected event id={} for topic {} permanently ({}: {}); nothing from its transaction on is confirmed, so the event is not lost: {}, then restart walpost (see runbooks/poison-record.md)",
            self.event_id, self.topic, self.code, self.error, self.fix
        )
    }
}

/// The sink cannot be set up as configured.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error("kafka property {key}={value} is refused: {reason}")]
    RefusedProperty { key: String, value: String, reason: &'static str },
    #[error("cannot create the Kafka producer: {0}")]
    Create(KafkaError),
}

/// Properties walpost sets unless the user overrides them (and may not override where
/// [`refuse_property`] says so).
const DEFAULTS: &[(&str, &str)] = &[
    ("acks", "all"),
    ("enable.idempotence", "true"),
    // A failure that could leave a gap in a partition (a later batch written, an earlier
    // one lost) becomes a fatal producer error instead: walpost then restarts from the
    // confirmed position, so an aggregate's events are never reordered.
    ("enable.gapless.guarantee", "true"),
    ("partitioner", "murmur2_random"),
    ("compression.type", "lz4"),
    ("linger.ms", "5"),
    ("client.id", "walpost"),
    // Connect to the brokers at once rather than on the first record: the idempotent
    // producer id is then requested while PostgreSQL is being checked, instead of by
    // librdkafka's 500 ms retry timer after the first record (start-to-first-ack).
    ("enable.sparse.connections", "false"),
    // Records never expire inside librdkafka: an expired queued record followed by a
    // delivered later one is a gap the idempotent producer does not prevent. A stalled
    // producer is restarted by the pipeline instead ([pipeline] delivery_timeout_secs).
    ("message.timeout.ms", "0"),
];

/// Refuses settings that would break per-aggregate order, durability, or the one
/// delivery report per record the checkpoint depends on.
pub fn refuse_property(key: &str, value: &str) -> Option<&'static str> {
    let v = value.trim().to_ascii_lowercase();
    match key {
        "enable.idempotence" if v != "true" => {
            Some("without idempotence a retried batch can land after a later one and reorder an aggregate's events")
        }
        "acks" | "request.required.acks" if v != "all" && v != "-1" => {
            Some("walpost confirms WAL only after acks=all; fewer acks can lose acknowledged events")
        }
        "max.in.flight.requests.per.connection" | "max.in.flight" if v.parse::<u32>().map_or(true, |n| n > 5) => {
            Some("more than 5 in-flight requests breaks idempotent ordering")
        }
        "transactional.id" => Some("Kafka transactions are not used by walpost"),
        "message.timeout.ms" | "delivery.timeout.ms" if v != "0" => Some(
            "a record that expires in the producer's queue can leave a gap a later record skips over; set [pipeline] delivery_timeout_secs instead",
        ),
        "enable.gapless.guarantee" if v != "true" => {
            Some("without it a failed batch can leave a gap that a later batch of the same partition skips over")
        }
        "delivery.report.only.error" if v == "true" => {
            Some("walpost needs a delivery report for every record to confirm WAL positions")
        }
        "bootstrap.servers" | "metadata.broker.list" => Some("set the brokers with --kafka-brokers or [kafka] brokers"),
        "dr_cb" | "dr_msg_cb" | "opaque" => Some("set internally by walpost"),
        _ => None,
    }
}

/// Builds the producer configuration: defaults, then user properties (checked).
pub fn producer_config(brokers: &str, properties: &BTreeMap<String, String>) -> Result<ClientConfig, SinkError> {
    let mut cfg = ClientConfig::new();
    cfg.set("bootstrap.servers", brokers);
    for (k, v) in DEFAULTS {
        cfg.set(*k, *v);
    }
    for (k, v) in properties {
        if let Some(reason) = refuse_property(k, v) {
            return Err(SinkError::RefusedProperty { key: k.clone(), value: v.clone(), reason });
        }
        cfg.set(k, v);
    }
    if cfg.get("partitioner") != Some("murmur2_random") {
        tracing::warn!(
            partitioner = cfg.get("partitioner").unwrap_or_default(),
            "partitioner is not murmur2_random: keys will not map to the same partitions as Java clients and Debezium"
        );
    }
    // librdkafka's own debug output (`debug` = "broker,msg,...") comes through only if
    // the client's log level lets it; it is then logged at tracing's debug level.
    cfg.set_log_level(if cfg.get("debug").is_some_and(|d| !d.is_empty()) {
        RDKafkaLogLevel::Debug
    } else {
        RDKafkaLogLevel::Warning
    });
    Ok(cfg)
}

/// Sorts a Kafka error into "try again later" and "never".
pub fn classify(error: &KafkaError) -> Option<(&'static str, &'static str)> {
    use RDKafkaErrorCode as C;
    let code = error.rdkafka_error_code()?;
    let fix = match code {
        C::MessageSizeTooLarge | C::InvalidMessageSize | C::MessageBatchTooLarge => {
            "raise the topic's max.message.bytes and the producer's message.max.bytes, or make the payload smaller"
        }
        C::TopicAuthorizationFailed | C::ClusterAuthorizationFailed => {
            "grant the producer principal WRITE (and DESCRIBE) on the topic"
        }
        C::InvalidTopic => "fix route.topic.replacement or the route column value so the topic name is valid",
        C::UnknownTopic | C::UnknownTopicOrPartition => {
            "create the topic, or enable auto.create.topics.enable on the brokers"
        }
        C::InvalidRecord | C::InvalidMessage => "the broker refused the record's format; check broker logs",
        C::InvalidTimestamp => {
            "the record's timestamp is outside what the topic accepts (message.timestamp.before.max.ms / after.max.ms): fix the topic's limits or the timestamp column"
        }
        C::PolicyViolation => "the broker's create-topic or record policy refused it; check broker logs",
        _ => return None,
    };
    Some((code_name(code), fix))
}

fn code_name(code: RDKafkaErrorCode) -> &'static str {
    use RDKafkaErrorCode as C;
    match code {
        C::MessageSizeTooLarge => "message_size_too_large",
        C::InvalidMessageSize => "invalid_message_size",
        C::MessageBatchTooLarge => "message_batch_too_large",
        C::TopicAuthorizationFailed => "topic_authorization_failed",
        C::ClusterAuthorizationFailed => "cluster_authorization_failed",
        C::InvalidTopic => "invalid_topic",
        C::UnknownTopic | C::UnknownTopicOrPartition => "unknown_topic",
        C::InvalidRecord | C::InvalidMessage => "invalid_record",
        C::InvalidTimestamp => "invalid_timestamp",
        C::PolicyViolation => "policy_violation",
        _ => "other",
    }
}

/// librdkafka callbacks: delivery reports to the pipeline, logs to tracing.
#[derive(Debug)]
pub struct SinkContext {
    reports: mpsc::UnboundedSender<Delivery>,
    metrics: Arc<Metrics>,
}

impl ClientContext for SinkContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        match level {
            RDKafkaLogLevel::Emerg | RDKafkaLogLevel::Alert | RDKafkaLogLevel::Critical | RDKafkaLogLevel::Error => {
                tracing::error!(facility = fac, "librdkafka: {log_message}")
            }
            RDKafkaLogLevel::Warning => tracing::warn!(facility = fac, "librdkafka: {log_message}"),
            _ => tracing::debug!(facility = fac, "librdkafka: {log_message}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::warn!(error = %error, "Kafka client error: {reason}");
    }
}

impl ProducerContext for SinkContext {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, opaque: usize) {
        let txn = TxnSeq(opaque as u64);
        let report = match result {
            Ok(msg) => {
                let bytes = msg.payload_len() as u64;
                self.metrics.record_published(msg.topic(), bytes);
                if let Some(ts) = msg.timestamp().to_millis() {
                    self.metrics.observe_latency((crate::metrics::now_ms() - ts) as f64 / 1000.0);
                }
                Delivery::Delivered { txn, bytes }
            }
            Err((error, msg)) => {
                let bytes = msg.payload_len() as u64;
                match classify(error) {
                    Some((code, fix)) => {
                        self.metrics.produce_error("rejected");
                        let event_id = msg
                            .headers()
                            .and_then(|h| h.iter().find(|h| h.key == router::HEADER_ID).and_then(|h| h.value))
                            .map(|v| String::from_utf8_lossy(v).into_owned())
                            .unwrap_or_default();
                        let original = Original {
                            key: msg.key().map(<[u8]>::to_vec),
                            value: msg.payload().map(<[u8]>::to_vec),
                            headers: msg
                                .headers()
                                .map(|h| {
                                    h.iter().map(|h| (h.key.to_owned(), h.value.unwrap_or_default().to_vec())).collect()
                                })
                                .unwrap_or_default(),
                        };
                        Delivery::Rejected {
                            txn,
                            bytes,
                            rejection: Rejection {
                                event_id,
                                topic: msg.topic().to_owned(),
                                code: code.to_owned(),
                                error: error.to_string(),
                                fix,
                            },
                            original: Some(Box::new(original)),
                        }
                    }
                    None => {
                        self.metrics.produce_error("retryable");
                        Delivery::Retryable { txn, bytes, error: error.to_string() }
                    }
                }
            }
        };
        // The receiver is gone only when the pipeline has stopped; nothing to confirm then.
        let _ = self.reports.send(report);
    }
}

/// Which topics have acknowledged a record since the producer was created.
///
/// The first record for a topic goes alone: everything in flight is acknowledged
/// first, then that record is sent and acknowledged before anything else. A topic the
/// broker has just created (auto-create) can take one produce request and refuse an
/// earlier one that arrived before the creation was applied; the refused records are
/// never written (KAFKA-15591), and sending them again after the later ones would
/// reorder an aggregate. One acknowledged record means the creation is applied for every
/// partition of the topic. Callers own the waiting (the stream and the snapshot handle
/// delivery reports differently); this type owns the rule.
#[derive(Debug, Default)]
pub struct NewTopicBarrier {
    settled: HashSet<Arc<str>>,
}

impl NewTopicBarrier {
    /// True when no record for `topic` was acknowledged yet: wait for everything in
    /// flight, send the record, and wait for it before sending anything else.
    pub fn must_go_alone(&self, topic: &Arc<str>) -> bool {
        !self.settled.contains(topic)
    }

    /// A record for `topic` was acknowledged.
    pub fn settled(&mut self, topic: &Arc<str>) {
        self.settled.insert(topic.clone());
    }
}

/// A producer plus the stream of its delivery reports.
pub struct KafkaSink {
    producer: ThreadedProducer<SinkContext>,
}

impl std::fmt::Debug for KafkaSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSink").field("in_flight", &self.producer.in_flight_count()).finish()
    }
}

impl KafkaSink {
    pub fn new(
        config: &ClientConfig,
        metrics: Arc<Metrics>,
    ) -> Result<(KafkaSink, mpsc::UnboundedReceiver<Delivery>), SinkError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let producer = config.create_with_context(SinkContext { reports: tx, metrics }).map_err(SinkError::Create)?;
        Ok((KafkaSink { producer }, rx))
    }

    /// Hands one record to librdkafka. `Err` carries a rejection found before sending
    /// (e.g. larger than message.max.bytes); queue-full waits here.
    pub async fn send(&self, txn: TxnSeq, record: &Record, timestamp_ms: Option<i64>) -> Result<(), SendError> {
        let mut headers = OwnedHeaders::new_with_capacity(record.headers.len());
        for (name, value) in &record.headers {
            headers = headers.insert(Header { key: name.as_ref(), value: Some(value.as_ref()) });
        }
        let opaque = usize::try_from(txn.0).unwrap_or(usize::MAX);
        let mut base = BaseRecord::with_opaque_to(&record.topic, opaque).key(record.key.as_ref()).headers(headers);
        if let Some(value) = &record.value {
            base = base.payload(value.as_ref());
        }
        if let Some(ts) = record.timestamp_ms.or(timestamp_ms) {
            base = base.timestamp(ts);
        }
        if let Some(p) = record.partition {
            base = base.partition(p);
        }
        loop {
            match self.producer.send(base) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    base = back;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err((error, _)) => {
                    return Err(match classify(&error) {
                        Some((code, fix)) => SendError::Rejected(Rejection {
                            event_id: String::from_utf8_lossy(&record.event_id).into_owned(),
                            topic: record.topic.to_string(),
                            code: code.to_owned(),
                            error: error.to_string(),
                            fix,
                        }),
                        None => SendError::Retryable(error.to_string()),
                    })
                }
            }
        }
    }
}

/// Failure to hand a record to the producer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendError {
    Rejected(Rejection),
    Retryable(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordering_breaking_properties_are_refused() {
        for (k, v) in [
            ("enable.idempotence", "false"),
            ("acks", "1"),
            ("request.required.acks", "0"),
            ("max.in.flight.requests.per.connection", "10"),
            ("transactional.id", "x"),
            ("bootstrap.servers", "h:1"),
            ("message.timeout.ms", "30000"),
            ("delivery.timeout.ms", "120000"),
        ] {
            let mut props = BTreeMap::new();
            props.insert(k.to_owned(), v.to_owned());
            let err = producer_config("h:9092", &props).unwrap_err().to_string();
            assert!(err.contains(k), "{err}");
        }
        for (k, v) in [
            ("acks", "all"),
            ("acks", "-1"),
            ("max.in.flight", "5"),
            ("compression.type", "zstd"),
            ("message.timeout.ms", "0"),
        ] {
            let mut props = BTreeMap::new();
            props.insert(k.to_owned(), v.to_owned());
            assert!(producer_config("h:9092", &props).is_ok(), "{k}={v}");
        }
    }

    #[test]
    fn defaults_are_durable_and_java_compatible() {
        let cfg = producer_config("h:9092", &BTreeMap::new()).unwrap();
        assert_eq!(cfg.get("acks"), Some("all"));
        assert_eq!(cfg.get("enable.idempotence"), Some("true"));
        assert_eq!(cfg.get("partitioner"), Some("murmur2_random"));
        assert_eq!(cfg.get("compression.type"), Some("lz4"));
        assert!(matches!(cfg.log_level, RDKafkaLogLevel::Warning));
    }

    #[test]
    fn librdkafka_debug_property_lets_its_debug_logs_through() {
        let mut props = BTreeMap::new();
        props.insert("debug".to_owned(), "broker,msg".to_owned());
        assert!(matches!(producer_config("h:9092", &props).unwrap().log_level, RDKafkaLogLevel::Debug));
    }

    #[test]
    fn permanent_and_transient_errors_are_told_apart() {
        let too_large = KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge);
        assert_eq!(classify(&too_large).map(|c| c.0), Some("message_size_too_large"));
        let timed_out = KafkaError::MessageProduction(RDKafkaErrorCode::MessageTimedOut);
        assert_eq!(classify(&timed_out), None);
        let transport = KafkaError::MessageProduction(RDKafkaErrorCode::BrokerTransportFailure);
        assert_eq!(classify(&transport), None);
        let denied = KafkaError::MessageProduction(RDKafkaErrorCode::TopicAuthorizationFailed);
        assert!(classify(&denied).unwrap().1.contains("WRITE"));
    }
}
