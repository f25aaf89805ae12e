//! Every metric `walpost run` exports, in one place, on the `prometheus` crate (the
//! series every mode exports, `walpost_streaming` and `walpost_halted`, are the
//! `service` crate's; `walpost inbox`'s are the `inbox` crate's).
//!
//! Names follow Prometheus conventions: `walpost_` prefix, unit suffixes (`_total`,
//! `_bytes`, `_seconds`). They are constants in [`names`], listed with their type and
//! help in [`METRICS`] (docs/metrics.md's table and the e2e scrape test are checked
//! against that list), so a misspelt name is a compile error, not a silently missing
//! series.
//!
//! Each subsystem owns a typed handle group ([`StreamMetrics`], [`KafkaMetrics`],
//! [`SlotMetrics`], [`SnapshotMetrics`], [`RetentionMetrics`], [`SpanMetrics`]) and updates it
//! directly; nothing is looked up by name at run time. Labels are low-cardinality and
//! never carry payload contents: error `class`, skip `reason`, reconnect `cause`, slot
//! `status`/alarm `level`, and `topic`, which is capped at [`MAX_TOPIC_SERIES`] distinct
//! values (further topics are counted under `(other)`: routed topics come from row
//! values, and one series per value would be unbounded).
//!
//! Why one file over 600 lines: the names, the `METRICS` table (docs/metrics.md is
//! checked against it) and the one `Metrics::new` that registers them are read together
//! when a metric is added; the handle groups of the contracts (with logic of their own)
//! and of the span exporter are their crates' ([`ContractMetrics`], [`SpanMetrics`]).
//!
//! Gauges that are ages (lag, time without an acknowledgement) and the `streaming`
//! flag are computed from [`Health`] when scraped, so they keep moving while the
//! pipeline is stuck.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use daypart::{RetentionMetrics, RetentionNames};
use prometheus::{Gauge, Histogram, IntCounter, IntCounterVec, IntGauge, IntGaugeVec};
use service::telemetry::exposition::{MAX_TOPIC_SERIES, OTHER_TOPICS};
use service::telemetry::{Exporter, Exposition};

use super::health::{AlarmLevel, Health};

pub use registry::metrics::ContractMetrics;
pub use service::telemetry::now_ms;

/// Metric names.
pub mod names {
    pub const EVENTS_PUBLISHED: &str = "walpost_events_published_total";
    pub const PUBLISHED_BYTES: &str = "walpost_published_bytes_total";
    pub const TRANSACTIONS: &str = "walpost_transactions_total";
    pub const KAFKA_TRANSACTIONS: &str = "walpost_kafka_transactions_total";
    pub const KAFKA_TRANSACTION_RECORDS: &str = "walpost_kafka_transaction_records_total";
    pub const KAFKA_TRANSACTION_COMMIT: &str = "walpost_kafka_transaction_commit_seconds";
    pub const RECEIVED_LSN: &str = "walpost_received_lsn";
    pub const CONFIRMED_LSN: &str = "walpost_confirmed_lsn";
    pub const IN_FLIGHT: &str = "walpost_kafka_in_flight_records";
    pub const UNACKNOWLEDGED: &str = "walpost_kafka_unacknowledged_seconds";
    pub const PRODUCE_ERRORS: &str = "walpost_produce_errors_total";
    pub const RECONNECTS: &str = "walpost_reconnects_total";
    pub const DEAD_LETTERS: &str = "walpost_dead_letters_total";
    pub const CONTRACT_CHECKS: &str = "walpost_contract_checks_total";
    pub const REGISTRY_REQUESTS: &str = "walpost_registry_requests_total";
    pub const REGISTRY_REQUEST_SECONDS: &str = "walpost_registry_request_seconds";
    pub const REGISTRY_CACHE: &str = "walpost_registry_cache_lookups_total";
    pub const SKIPPED: &str = "walpost_events_skipped_total";
    pub const LATENCY: &str = "walpost_end_to_end_latency_seconds";
    pub const LAG: &str = "walpost_lag_seconds";
    pub const SLOT_RETAINED: &str = "walpost_slot_retained_bytes";
    pub const SLOT_UNCONFIRMED: &str = "walpost_slot_unconfirmed_bytes";
    pub const SLOT_SAFE_WAL: &str = "walpost_slot_safe_wal_size_bytes";
    pub const SLOT_ACTIVE: &str = "walpost_slot_active";
    pub const ACTIVE: &str = "walpost_active";
    pub const PAUSED: &str = "walpost_paused";
    pub const SLOT_WAL_STATUS: &str = "walpost_slot_wal_status";
    pub const SLOT_ALARM: &str = "walpost_slot_alarm";
    pub const SLOT_CONFIRM_STALLED: &str = "walpost_slot_confirm_stalled_seconds";
    pub const OLDEST_TRANSACTION: &str = "walpost_oldest_transaction_age_seconds";
    pub const SNAPSHOT_ROWS: &str = "walpost_snapshot_rows_total";
    pub const SNAPSHOT_ESTIMATE: &str = "walpost_snapshot_rows_estimate";
    pub const SNAPSHOT_RUNNING: &str = "walpost_snapshot_running";
    pub const REPLAY_ROWS: &str = "walpost_replay_rows_total";
    pub const REPLAYS: &str = "walpost_replays_total";
    pub const RETENTION_CREATED: &str = "walpost_retention_partitions_created_total";
    pub const RETENTION_SEALED: &str = "walpost_retention_partitions_sealed_total";
    pub const RETENTION_DROPPED: &str = "walpost_retention_partitions_dropped_total";
    pub const RETENTION_SKIPPED: &str = "walpost_retention_partitions_skipped_total";
    pub const RETENTION_PASSES: &str = "walpost_retention_passes_total";
    pub const RETENTION_LAST_SUCCESS: &str = "walpost_retention_last_success_timestamp_seconds";
    pub const TRACE_CONTEXT_INVALID: &str = "walpost_trace_context_invalid_total";
    pub const SPANS_EXPORTED: &str = "walpost_spans_exported_total";
    pub const SPANS_DROPPED: &str = "walpost_spans_dropped_total";
}

use names::*;

/// (name, type, help) of every exported metric, in docs/metrics.md's order.
pub const METRICS: &[(&str, &str, &str)] = &[
    (EVENTS_PUBLISHED, "counter", "Records acknowledged by Kafka, by topic (at most 256 topics, then \"(other)\")."),
    (PUBLISHED_BYTES, "counter", "Payload bytes acknowledged by Kafka."),
    (TRANSACTIONS, "counter", "Committed transactions read from the slot."),
    (
        KAFKA_TRANSACTIONS,
        "counter",
        "With --delivery exactly-once: Kafka transactions the stream committed (each with its progress record).",
    ),
    (
        KAFKA_TRANSACTION_RECORDS,
        "counter",
        "With --delivery exactly-once: records in the committed Kafka transactions, progress records not counted.",
    ),
    (
        KAFKA_TRANSACTION_COMMIT,
        "histogram",
        "With --delivery exactly-once: how long a commit stopped the stream (its last records sent and acknowledged, then the commit itself).",
    ),
    (RECEIVED_LSN, "gauge", "Last WAL position received from the server."),
    (CONFIRMED_LSN, "gauge", "Last WAL position confirmed (flushed) to the slot."),
    (IN_FLIGHT, "gauge", "Records handed to the producer and not yet acknowledged."),
    (UNACKNOWLEDGED, "gauge", "Seconds since Kafka last acknowledged a record while records wait (0: nothing waits)."),
    (
        PRODUCE_ERRORS,
        "counter",
        "Kafka errors as they happen, by class: retryable (a record failed, sent again), rejected (never), connection (a broker unreachable).",
    ),
    (RECONNECTS, "counter", "Stream restarts after a transient error, by cause (postgres, kafka)."),
    (DEAD_LETTERS, "counter", "Events acknowledged on the dead-letter topic, by error class."),
    (
        CONTRACT_CHECKS,
        "counter",
        "With [contracts]: payloads checked, by event type (those with a schema; others are (other)) and result (valid, breach).",
    ),
    (
        REGISTRY_REQUESTS,
        "counter",
        "With [registry]: schema requests to the registry, by result (found, missing, error).",
    ),
    (REGISTRY_REQUEST_SECONDS, "histogram", "With [registry]: how long schema requests to the registry took."),
    (
        REGISTRY_CACHE,
        "counter",
        "With [registry]: subject lookups in walpost's schema cache, by result (hit, miss: asked the registry).",
    ),
    (SKIPPED, "counter", "Changes that are not outbox events and were skipped, by reason."),
    (LATENCY, "histogram", "Commit timestamp to Kafka acknowledgement."),
    (LAG, "gauge", "Age of the oldest transaction walpost read but has not confirmed (0 when caught up)."),
    (SLOT_RETAINED, "gauge", "WAL the slot keeps: current WAL position minus restart_lsn."),
    (SLOT_UNCONFIRMED, "gauge", "Current WAL position minus the slot's confirmed_flush_lsn."),
    (
        SLOT_SAFE_WAL,
        "gauge",
        "Bytes that can be written before the slot is in danger (-1: unlimited; 0: past the limit).",
    ),
    (SLOT_ACTIVE, "gauge", "1 when some process is streaming from the slot."),
    (
        ACTIVE,
        "gauge",
        "1 when this instance streams from the slot (and while it reconnects after), 0 while it waits as a hot standby for another process to release it.",
    ),
    (
        PAUSED,
        "gauge",
        "1 while an operator paused the stream (POST /api/v1/pause): walpost reads nothing from the slot until resumed.",
    ),
    (SLOT_WAL_STATUS, "gauge", "1 for the slot's current wal_status (reserved, extended, unreserved, lost)."),
    (SLOT_ALARM, "gauge", "1 for each alarm level currently raised (warning, critical)."),
    (
        SLOT_CONFIRM_STALLED,
        "gauge",
        "Seconds since the slot's confirmed position last moved while WAL was written past it.",
    ),
    (OLDEST_TRANSACTION, "gauge", "Age of the oldest open transaction on the server."),
    (SNAPSHOT_ROWS, "counter", "Snapshot rows acknowledged by Kafka."),
    (SNAPSHOT_ESTIMATE, "gauge", "Planner estimate of the rows the running snapshot reads."),
    (SNAPSHOT_RUNNING, "gauge", "1 while a snapshot runs."),
    (REPLAY_ROWS, "counter", "Replayed rows acknowledged by Kafka (walpost replay and signals)."),
    (REPLAYS, "counter", "Replays by outcome (signals: done, failed, ignored)."),
    (RETENTION_CREATED, "counter", "Partitions created ahead by retention."),
    (RETENTION_SEALED, "counter", "Expired outbox partitions sealed (made read-only, WAL position recorded)."),
    (RETENTION_DROPPED, "counter", "Expired outbox partitions dropped after the slot confirmed their seal."),
    (RETENTION_SKIPPED, "counter", "Partitions retention left in place although due, by reason."),
    (RETENTION_PASSES, "counter", "Retention passes by result (ok, error)."),
    (RETENTION_LAST_SUCCESS, "gauge", "Unix time of the last retention pass without error (0: none yet)."),
    (
        TRACE_CONTEXT_INVALID,
        "counter",
        "Rows whose traceparent or tracestate was invalid and left out of the record's headers.",
    ),
    (SPANS_EXPORTED, "counter", "Spans the OTLP endpoint accepted (with OTEL_EXPORTER_OTLP_ENDPOINT)."),
    (
        SPANS_DROPPED,
        "counter",
        "Spans not exported: the export queue was full, or the OTLP endpoint failed or refused them.",
    ),
];

/// The registry and every subsystem's handles.
#[derive(Debug, Clone)]
pub struct Metrics {
    exposition: Exposition,
    pub stream: StreamMetrics,
    pub kafka: KafkaMetrics,
    pub slot: SlotMetrics,
    pub snapshot: SnapshotMetrics,
    pub retention: RetentionMetrics,
    pub spans: SpanMetrics,
    pub contracts: ContractMetrics,
    unacknowledged: Gauge,
    lag: Gauge,
    /// From [`Health::is_paused`] at scrape time.
    paused: IntGauge,
}

/// The replication stream's metrics.
#[derive(Debug, Clone)]
pub struct StreamMetrics {
    pub transactions: IntCounter,
    pub received_lsn: IntGauge,
    pub confirmed_lsn: IntGauge,
    reconnects: IntCounterVec,
    skipped: IntCounterVec,
    lag: Arc<LagClock>,
    /// Rows whose trace context was invalid (dropped from the headers).
    pub trace_context_invalid: IntCounter,
    /// 1: this instance holds the slot; 0: a hot standby (or not started yet).
    pub active: IntGauge,
}

/// Why the stream reconnected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReconnectCause {
    Postgres,
    Kafka,
}

/// The wall-clock commit time of the oldest unconfirmed transaction, for the lag gauge.
#[derive(Debug, Default)]
struct LagClock {
    oldest_commit_ms: std::sync::atomic::AtomicI64,
}

impl StreamMetrics {
    pub fn reconnect(&self, cause: ReconnectCause) {
        let label = match cause {
            ReconnectCause::Postgres => "postgres",
            ReconnectCause::Kafka => "kafka",
        };
        self.reconnects.with_label_values(&[label]).inc();
    }

    /// A change that is not an outbox event was skipped (`reason` is a fixed word).
    pub fn skipped(&self, reason: &'static str) {
        self.skipped.with_label_values(&[reason]).inc();
    }

    /// The oldest transaction read and not yet confirmed committed at this Unix time
    /// (ms); `None`: nothing is unconfirmed.
    pub fn set_oldest_unconfirmed_commit(&self, unix_ms: Option<i64>) {
        self.lag.oldest_commit_ms.store(unix_ms.unwrap_or(0), std::sync::atomic::Ordering::Relaxed);
    }

    /// Seconds since the oldest unconfirmed transaction committed (0 when caught up).
    pub fn lag_seconds(&self) -> f64 {
        match self.lag.oldest_commit_ms.load(std::sync::atomic::Ordering::Relaxed) {
            0 => 0.0,
            t => (now_ms() - t).max(0) as f64 / 1000.0,
        }
    }
}

/// The producer's metrics.
#[derive(Debug, Clone)]
pub struct KafkaMetrics {
    published: IntCounterVec,
    /// foldhash, not SipHash: looked up for every acknowledged record.
    topics: Arc<Mutex<HashMap<String, IntCounter, foldhash::fast::RandomState>>>,
    pub published_bytes: IntCounter,
    pub in_flight: IntGauge,
    produce_errors: IntCounterVec,
    dead_letters: IntCounterVec,
    pub latency: Histogram,
    /// Exactly-once: committed Kafka transactions, their records, their commits' time.
    pub transactions: IntCounter,
    pub transaction_records: IntCounter,
    pub transaction_commit: Histogram,
}

impl KafkaMetrics {
    /// One record acknowledged on `topic`, `bytes` of payload.
    pub fn published(&self, topic: &str, bytes: u64) {
        if let Ok(mut topics) = self.topics.lock() {
            match topics.get(topic) {
                Some(c) => c.inc(),
                None => {
                    let label = if topics.len() < MAX_TOPIC_SERIES { topic } else { OTHER_TOPICS };
                    let c = self.published.with_label_values(&[label]);
                    c.inc();
                    if topics.len() < MAX_TOPIC_SERIES {
                        topics.insert(topic.to_owned(), c);
                    }
                }
            }
        }
        self.published_bytes.inc_by(bytes);
    }

    /// Records acknowledged on every topic since start (the sum of the `topic` series).
    pub fn published_total(&self) -> u64 {
        let Ok(topics) = self.topics.lock() else { return 0 };
        let named: u64 = topics.values().map(IntCounter::get).sum();
        // The overflow series exists only once the named ones are full: asking for it
        // earlier would make it.
        let other =
            if topics.len() >= MAX_TOPIC_SERIES { self.published.with_label_values(&[OTHER_TOPICS]).get() } else { 0 };
        named + other
    }

    /// A Kafka error; `class` is `retryable`, `rejected` or `connection`.
    pub fn produce_error(&self, class: &'static str) {
        self.produce_errors.with_label_values(&[class]).inc();
    }

    /// A dead letter was acknowledged; `class` is the error class (a fixed word).
    pub fn dead_letter(&self, class: &str) {
        self.dead_letters.with_label_values(&[class]).inc();
    }

    /// Makes the dead-letter series for `classes` exist at 0 (so rates and alerts work
    /// before the first one).
    pub fn declare_dead_letter_classes<'c>(&self, classes: impl IntoIterator<Item = &'c str>) {
        for class in classes {
            let _ = self.dead_letters.with_label_values(&[class]);
        }
    }
}

/// The slot monitor's gauges.
#[derive(Debug, Clone)]
pub struct SlotMetrics {
    pub retained_bytes: IntGauge,
    pub unconfirmed_bytes: IntGauge,
    pub safe_wal_size_bytes: IntGauge,
    pub active: IntGauge,
    wal_status: IntGaugeVec,
    alarm: IntGaugeVec,
    pub confirm_stalled_seconds: Gauge,
    pub oldest_transaction_age_seconds: Gauge,
}

impl SlotMetrics {
    /// Sets the `status` series: 1 for `current`, 0 for the others.
    pub fn set_wal_status(&self, current: Option<&str>) {
        for status in ["reserved", "extended", "unreserved", "lost"] {
            self.wal_status.with_label_values(&[status]).set(i64::from(current == Some(status)));
        }
    }

    pub fn set_alarm(&self, level: AlarmLevel) {
        self.alarm.with_label_values(&["warning"]).set(i64::from(level == AlarmLevel::Warning));
        self.alarm.with_label_values(&["critical"]).set(i64::from(level == AlarmLevel::Critical));
    }
}

/// The snapshot's metrics.
#[derive(Debug, Clone)]
pub struct SnapshotMetrics {
    pub rows: IntCounter,
    pub estimate: IntGauge,
    pub running: IntGauge,
    pub replay_rows: IntCounter,
    replays: IntCounterVec,
}

impl SnapshotMetrics {
    /// A replay ended: `outcome` is `done`, `failed` or `ignored` (a signal walpost does
    /// not act on).
    pub fn replay(&self, outcome: &'static str) {
        self.replays.with_label_values(&[outcome]).inc();
    }
}

/// The OTLP span exporter's counters are the `otlp` crate's.
pub use otlp::SpanMetrics;

/// The names of the relay's retention series.
pub const RETENTION_NAMES: RetentionNames = RetentionNames {
    created: RETENTION_CREATED,
    sealed: Some(RETENTION_SEALED),
    dropped: RETENTION_DROPPED,
    skipped: RETENTION_SKIPPED,
    passes: RETENTION_PASSES,
    last_success: RETENTION_LAST_SUCCESS,
};

impl Metrics {
    /// Registers every metric; `health` feeds the gauges computed at scrape time.
    pub fn new(health: Arc<Health>) -> prometheus::Result<Metrics> {
        let e = Exposition::new(health, METRICS)?;
        let stream = StreamMetrics {
            transactions: e.counter(TRANSACTIONS)?,
            received_lsn: e.gauge(RECEIVED_LSN)?,
            confirmed_lsn: e.gauge(CONFIRMED_LSN)?,
            reconnects: e.counters(RECONNECTS, &["cause"])?,
            skipped: e.counters(SKIPPED, &["reason"])?,
            lag: Arc::new(LagClock::default()),
            trace_context_invalid: e.counter(TRACE_CONTEXT_INVALID)?,
            active: e.gauge(ACTIVE)?,
        };
        for cause in ["postgres", "kafka"] {
            let _ = stream.reconnects.with_label_values(&[cause]);
        }
        for reason in ["invalid_operation", "fatal"] {
            let _ = stream.skipped.with_label_values(&[reason]);
        }
        let kafka = KafkaMetrics {
            published: e.counters(EVENTS_PUBLISHED, &["topic"])?,
            topics: Arc::new(Mutex::new(HashMap::default())),
            published_bytes: e.counter(PUBLISHED_BYTES)?,
            in_flight: e.gauge(IN_FLIGHT)?,
            produce_errors: e.counters(PRODUCE_ERRORS, &["class"])?,
            dead_letters: e.counters(DEAD_LETTERS, &["class"])?,
            latency: e.latency_histogram(LATENCY)?,
            transactions: e.counter(KAFKA_TRANSACTIONS)?,
            transaction_records: e.counter(KAFKA_TRANSACTION_RECORDS)?,
            transaction_commit: e.latency_histogram(KAFKA_TRANSACTION_COMMIT)?,
        };
        for class in ["retryable", "rejected", "connection"] {
            let _ = kafka.produce_errors.with_label_values(&[class]);
        }
        let slot = SlotMetrics {
            retained_bytes: e.gauge(SLOT_RETAINED)?,
            unconfirmed_bytes: e.gauge(SLOT_UNCONFIRMED)?,
            safe_wal_size_bytes: e.gauge(SLOT_SAFE_WAL)?,
            active: e.gauge(SLOT_ACTIVE)?,
            wal_status: e.gauges(SLOT_WAL_STATUS, &["status"])?,
            alarm: e.gauges(SLOT_ALARM, &["level"])?,
            confirm_stalled_seconds: e.float_gauge(SLOT_CONFIRM_STALLED)?,
            oldest_transaction_age_seconds: e.float_gauge(OLDEST_TRANSACTION)?,
        };
        slot.set_alarm(AlarmLevel::Ok);
        slot.set_wal_status(None);
        let snapshot = SnapshotMetrics {
            rows: e.counter(SNAPSHOT_ROWS)?,
            estimate: e.gauge(SNAPSHOT_ESTIMATE)?,
            running: e.gauge(SNAPSHOT_RUNNING)?,
            replay_rows: e.counter(REPLAY_ROWS)?,
            replays: e.counters(REPLAYS, &["outcome"])?,
        };
        for outcome in ["done", "failed", "ignored"] {
            let _ = snapshot.replays.with_label_values(&[outcome]);
        }
        let retention = RetentionMetrics::register(&e, &RETENTION_NAMES)?;
        let spans = SpanMetrics { exported: e.counter(SPANS_EXPORTED)?, dropped: e.counter(SPANS_DROPPED)? };
        let contracts = ContractMetrics {
            checks: e.counters(CONTRACT_CHECKS, &["event_type", "result"])?,
            registry_requests: e.counters(REGISTRY_REQUESTS, &["result"])?,
            registry_seconds: e.latency_histogram(REGISTRY_REQUEST_SECONDS)?,
            registry_cache: e.counters(REGISTRY_CACHE, &["result"])?,
        };
        let unacknowledged = e.float_gauge(UNACKNOWLEDGED)?;
        let lag = e.float_gauge(LAG)?;
        let paused = e.gauge(PAUSED)?;
        Ok(Metrics {
            exposition: e,
            stream,
            kafka,
            slot,
            snapshot,
            retention,
            spans,
            contracts,
            unacknowledged,
            lag,
            paused,
        })
    }

    /// The shared state the scrape-time gauges come from.
    pub fn health(&self) -> &Arc<Health> {
        self.exposition.health()
    }

    /// Prometheus text exposition (format 0.0.4).
    pub fn encode(&self) -> String {
        self.unacknowledged.set(self.health().unacknowledged_for().as_secs_f64());
        self.lag.set(self.stream.lag_seconds());
        self.paused.set(i64::from(self.health().is_paused()));
        self.exposition.encode()
    }
}

impl Exporter for Metrics {
    fn encode(&self) -> String {
        Metrics::encode(self)
    }

    fn health(&self) -> &Arc<Health> {
        Metrics::health(self)
    }
}

/// An LSN (or any u64 position) as a gauge value; positions past i64::MAX are clamped.
pub fn lsn_gauge(position: u64) -> i64 {
    i64::try_from(position).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn metrics() -> Metrics {
        Metrics::new(Arc::new(Health::new(Duration::from_secs(30), Duration::from_secs(60)))).unwrap()
    }

    #[test]
    fn every_listed_metric_is_exported_with_its_type_and_nothing_else() {
        let m = metrics();
        m.kafka.published("outbox.event.order", 10);
        m.kafka.published("outbox.event.order", 5);
        m.kafka.produce_error("rejected");
        m.kafka.declare_dead_letter_classes(["invalid_topic"]);
        m.retention.skipped("slot_behind");
        m.contracts.checks.with_label_values(&["(other)", "valid"]).inc();
        m.contracts.registry_requests.with_label_values(&["found"]).inc();
        m.contracts.registry_seconds.observe(0.01);
        m.contracts.registry_cache.with_label_values(&["hit"]).inc();
        let text = m.encode();
        for (name, kind, _) in METRICS {
            assert!(text.contains(&format!("# TYPE {name} {kind}")), "{name} missing:\n{text}");
        }
        let exported: Vec<&str> =
            text.lines().filter_map(|l| l.strip_prefix("# TYPE ")).filter_map(|l| l.split(' ').next()).collect();
        let common = service::telemetry::exposition::METRICS;
        assert_eq!(exported.len(), METRICS.len() + common.len(), "{exported:?}");
        assert!(exported.iter().all(|e| !e.starts_with("walpost_inbox_")), "no series of walpost inbox: {exported:?}");
        assert!(text.contains("walpost_events_published_total{topic=\"outbox.event.order\"} 2"), "{text}");
        assert!(text.contains("walpost_published_bytes_total 15"));
        assert!(text.contains("walpost_produce_errors_total{class=\"rejected\"} 1"));
        assert!(text.contains("walpost_produce_errors_total{class=\"retryable\"} 0"));
        assert!(text.contains("walpost_reconnects_total{cause=\"kafka\"} 0"));
    }

    /// Routed topics come from row values: their series are capped.
    #[test]
    fn topic_series_are_capped() {
        let m = metrics();
        for i in 0..(MAX_TOPIC_SERIES + 50) {
            m.kafka.published(&format!("t{i}"), 1);
        }
        m.kafka.published("t0", 1);
        let text = m.encode();
        let series = text.lines().filter(|l| l.starts_with("walpost_events_published_total{")).count();
        assert_eq!(series, MAX_TOPIC_SERIES + 1, "one series per capped topic plus (other)");
        assert!(text.contains("walpost_events_published_total{topic=\"(other)\"} 50"), "{text}");
        assert!(text.contains("walpost_events_published_total{topic=\"t0\"} 2"));
    }

    #[test]
    fn ages_come_from_health_at_scrape_time() {
        let m = metrics();
        m.stream.set_oldest_unconfirmed_commit(Some(now_ms() - 5_000));
        m.health().set_streaming(true);
        let text = m.encode();
        let lag: f64 =
            text.lines().find_map(|l| l.strip_prefix("walpost_lag_seconds ")).and_then(|v| v.parse().ok()).unwrap();
        assert!((4.9..60.0).contains(&lag), "{lag}");
        assert!(text.contains("walpost_streaming 1"));
    }
}
