//! Every metric walpost exports, in one place, on the `prometheus` crate.
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
//! when a metric is added; the subsystems' handle groups with logic of their own live
//! beside it (`metrics/inbox.rs`).
//!
//! Gauges that are ages (lag, time without an acknowledgement) and the `streaming`
//! flag are computed from [`Health`] when scraped, so they keep moving while the
//! pipeline is stuck.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

use super::health::{AlarmLevel, Health};

mod contracts;
mod inbox;
pub use contracts::ContractMetrics;
pub use inbox::{HandlerStats, InboxMetrics};

/// Metric names.
pub mod names {
    pub const EVENTS_PUBLISHED: &str = "walpost_events_published_total";
    pub const PUBLISHED_BYTES: &str = "walpost_published_bytes_total";
    pub const TRANSACTIONS: &str = "walpost_transactions_total";
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
    pub const STREAMING: &str = "walpost_streaming";
    pub const HALTED: &str = "walpost_halted";
    pub const LATENCY: &str = "walpost_end_to_end_latency_seconds";
    pub const LAG: &str = "walpost_lag_seconds";
    pub const SLOT_RETAINED: &str = "walpost_slot_retained_bytes";
    pub const SLOT_UNCONFIRMED: &str = "walpost_slot_unconfirmed_bytes";
    pub const SLOT_SAFE_WAL: &str = "walpost_slot_safe_wal_size_bytes";
    pub const SLOT_ACTIVE: &str = "walpost_slot_active";
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
    pub const INBOX_RECORDS: &str = "walpost_inbox_records_total";
    pub const INBOX_BATCHES: &str = "walpost_inbox_batches_total";
    pub const INBOX_WRITE: &str = "walpost_inbox_write_seconds";
    pub const INBOX_LATENCY: &str = "walpost_inbox_latency_seconds";
    pub const INBOX_WRITE_ERRORS: &str = "walpost_inbox_write_errors_total";
    pub const INBOX_ID_COLLISIONS: &str = "walpost_inbox_event_id_collisions_total";
    pub const INBOX_CONSUMER_LAG: &str = "walpost_inbox_consumer_lag_records";
    pub const INBOX_BACKLOG: &str = "walpost_inbox_handler_backlog";
    pub const INBOX_OLDEST_PENDING: &str = "walpost_inbox_handler_oldest_pending_seconds";
    pub const INBOX_OPEN_ATTEMPTS: &str = "walpost_inbox_handler_open_attempts";
    pub const INBOX_REVIEW_REQUIRED: &str = "walpost_inbox_handler_review_required";
    pub const INBOX_LEASES_LOST: &str = "walpost_inbox_leases_lost_total";
    pub const INBOX_STATS_AGE: &str = "walpost_inbox_handler_stats_age_seconds";
    pub const INBOX_ASSIGNED: &str = "walpost_inbox_assigned_partitions";
    pub const INBOX_GROUP_PARTITIONS: &str = "walpost_inbox_group_partitions";
    pub const INBOX_FORCED_DROPS: &str = "walpost_inbox_retention_forced_drops_total";
    pub const INBOX_FORCED_OPEN: &str = "walpost_inbox_retention_forced_open_deliveries_total";
}

use names::*;

/// (name, type, help) of every exported metric, in docs/metrics.md's order.
pub const METRICS: &[(&str, &str, &str)] = &[
    (EVENTS_PUBLISHED, "counter", "Records acknowledged by Kafka, by topic (at most 256 topics, then \"(other)\")."),
    (PUBLISHED_BYTES, "counter", "Payload bytes acknowledged by Kafka."),
    (TRANSACTIONS, "counter", "Committed transactions read from the slot."),
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
    (STREAMING, "gauge", "1 while streaming from the replication slot."),
    (
        HALTED,
        "gauge",
        "1 while walpost has stopped on an error an operator must fix and serves its metrics a last time before it exits 1.",
    ),
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
    (RETENTION_CREATED, "counter", "Partitions created ahead by retention (walpost inbox: of each of its three tables)."),
    (RETENTION_SEALED, "counter", "Expired outbox partitions sealed (made read-only, WAL position recorded)."),
    (RETENTION_DROPPED, "counter", "Expired outbox partitions dropped after the slot confirmed their seal (walpost inbox: finished days, three partitions each)."),
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
    (
        INBOX_RECORDS,
        "counter",
        "walpost inbox: records read, by topic (capped as above) and result: stored, duplicate (event id already stored), rejected (to the rejected table).",
    ),
    (INBOX_BATCHES, "counter", "walpost inbox: transactions written to PostgreSQL."),
    (INBOX_WRITE, "histogram", "walpost inbox: time to write one batch (COPY, INSERT, offsets, COMMIT)."),
    (INBOX_LATENCY, "histogram", "walpost inbox: record timestamp to its commit in the inbox."),
    (
        INBOX_WRITE_ERRORS,
        "counter",
        "walpost inbox: batch writes that failed and were retried (PostgreSQL unreachable or restarting, the write lock not granted in time).",
    ),
    (
        INBOX_ID_COLLISIONS,
        "counter",
        "walpost inbox: records whose event id a message of another topic already has (stored with dedup = topic, duplicates with dedup = global).",
    ),
    (
        INBOX_CONSUMER_LAG,
        "gauge",
        "walpost inbox: records in Kafka past the consumer's position, by topic and partition (from librdkafka's statistics).",
    ),
    (
        INBOX_BACKLOG,
        "gauge",
        "walpost inbox: messages a handler has no receipt for and that are pending, by handler (at most 100 handlers, then \"(other)\").",
    ),
    (INBOX_OLDEST_PENDING, "gauge", "walpost inbox: age of a handler's oldest pending message, by handler."),
    (INBOX_OPEN_ATTEMPTS, "gauge", "walpost inbox: failed attempts on a handler's open messages, by handler."),
    (INBOX_REVIEW_REQUIRED, "gauge", "walpost inbox: a handler's messages in review_required, by handler."),
    (
        INBOX_LEASES_LOST,
        "counter",
        "walpost inbox: leases that ran out without complete or fail (a worker crashed or outran its lease), by handler, since it was registered.",
    ),
    (
        INBOX_STATS_AGE,
        "gauge",
        "walpost inbox: seconds since the handler statistics were last read (the handler gauges are that old).",
    ),
    (INBOX_ASSIGNED, "gauge", "walpost inbox: partitions the consumer group assigned to this instance."),
    (
        INBOX_GROUP_PARTITIONS,
        "gauge",
        "walpost inbox: partitions the consumer group has stored offsets for in the inbox (read with the handler statistics).",
    ),
    (
        INBOX_FORCED_DROPS,
        "counter",
        "walpost inbox: days dropped by retention_max_days while deliveries in them were open (not in walpost_retention_partitions_dropped_total).",
    ),
    (
        INBOX_FORCED_OPEN,
        "counter",
        "walpost inbox: open deliveries (pending or review_required) dropped with those days.",
    ),
];

/// Distinct `topic` label values of `walpost_events_published_total`; more are `(other)`.
pub const MAX_TOPIC_SERIES: usize = 256;
/// The `topic` label value past [`MAX_TOPIC_SERIES`] (no Kafka topic can be named so).
pub const OTHER_TOPICS: &str = "(other)";

/// Upper bounds (seconds) of the latency histogram buckets.
const LATENCY_BUCKETS: [f64; 14] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0, 300.0];

fn help(name: &'static str) -> &'static str {
    METRICS.iter().find(|(n, _, _)| *n == name).map_or("", |(_, _, h)| *h)
}

fn opts(name: &'static str) -> Opts {
    Opts::new(name, help(name))
}

/// A registered metric of any kind.
trait Register: prometheus::core::Collector + Clone + 'static {}
impl<T: prometheus::core::Collector + Clone + 'static> Register for T {}

fn register<T: Register>(registry: &Registry, metric: prometheus::Result<T>) -> prometheus::Result<T> {
    let metric = metric?;
    registry.register(Box::new(metric.clone()))?;
    Ok(metric)
}

/// The registry and every subsystem's handles.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    health: Arc<Health>,
    pub stream: StreamMetrics,
    pub kafka: KafkaMetrics,
    pub slot: SlotMetrics,
    pub snapshot: SnapshotMetrics,
    pub retention: RetentionMetrics,
    pub spans: SpanMetrics,
    pub inbox: InboxMetrics,
    pub contracts: ContractMetrics,
    streaming: IntGauge,
    halted: IntGauge,
    unacknowledged: Gauge,
    lag: Gauge,
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

/// The OTLP span exporter's counters.
#[derive(Debug, Clone)]
pub struct SpanMetrics {
    pub exported: IntCounter,
    pub dropped: IntCounter,
}

/// Retention's metrics.
#[derive(Debug, Clone)]
pub struct RetentionMetrics {
    pub created: IntCounter,
    pub sealed: IntCounter,
    pub dropped: IntCounter,
    skipped: IntCounterVec,
    passes: IntCounterVec,
    pub last_success: IntGauge,
    /// `walpost inbox`: days dropped past `retention_max_days` with open deliveries.
    pub inbox_forced_drops: IntCounter,
    /// `walpost inbox`: the open deliveries dropped with them.
    pub inbox_forced_open_deliveries: IntCounter,
}

impl RetentionMetrics {
    /// A partition due for an action was left in place for `reason` (a fixed word).
    pub fn skipped(&self, reason: &'static str) {
        self.skipped.with_label_values(&[reason]).inc();
    }

    /// Makes the skip series for `reasons` exist at 0 (so a rate over them works).
    pub fn declare_skip_reasons(&self, reasons: &[&'static str]) {
        for r in reasons {
            let _ = self.skipped.with_label_values(&[r]);
        }
    }

    pub fn pass_finished(&self, ok: bool) {
        self.passes.with_label_values(&[if ok { "ok" } else { "error" }]).inc();
        if ok {
            self.last_success.set(now_ms() / 1000);
        }
    }
}

impl Metrics {
    /// Registers every metric; `health` feeds the gauges computed at scrape time.
    pub fn new(health: Arc<Health>) -> prometheus::Result<Metrics> {
        let r = Registry::new();
        let counter = |name| register(&r, IntCounter::with_opts(opts(name)));
        let gauge = |name| register(&r, IntGauge::with_opts(opts(name)));
        let fgauge = |name| register(&r, Gauge::with_opts(opts(name)));
        let counters = |name, label: &str| register(&r, IntCounterVec::new(opts(name), &[label]));
        let stream = StreamMetrics {
            transactions: counter(TRANSACTIONS)?,
            received_lsn: gauge(RECEIVED_LSN)?,
            confirmed_lsn: gauge(CONFIRMED_LSN)?,
            reconnects: counters(RECONNECTS, "cause")?,
            skipped: counters(SKIPPED, "reason")?,
            lag: Arc::new(LagClock::default()),
            trace_context_invalid: counter(TRACE_CONTEXT_INVALID)?,
        };
        for cause in ["postgres", "kafka"] {
            let _ = stream.reconnects.with_label_values(&[cause]);
        }
        for reason in ["invalid_operation", "fatal"] {
            let _ = stream.skipped.with_label_values(&[reason]);
        }
        let kafka = KafkaMetrics {
            published: counters(EVENTS_PUBLISHED, "topic")?,
            topics: Arc::new(Mutex::new(HashMap::default())),
            published_bytes: counter(PUBLISHED_BYTES)?,
            in_flight: gauge(IN_FLIGHT)?,
            produce_errors: counters(PRODUCE_ERRORS, "class")?,
            dead_letters: counters(DEAD_LETTERS, "class")?,
            latency: register(
                &r,
                Histogram::with_opts(HistogramOpts::new(LATENCY, help(LATENCY)).buckets(LATENCY_BUCKETS.to_vec())),
            )?,
        };
        for class in ["retryable", "rejected", "connection"] {
            let _ = kafka.produce_errors.with_label_values(&[class]);
        }
        let slot = SlotMetrics {
            retained_bytes: gauge(SLOT_RETAINED)?,
            unconfirmed_bytes: gauge(SLOT_UNCONFIRMED)?,
            safe_wal_size_bytes: gauge(SLOT_SAFE_WAL)?,
            active: gauge(SLOT_ACTIVE)?,
            wal_status: register(&r, IntGaugeVec::new(opts(SLOT_WAL_STATUS), &["status"]))?,
            alarm: register(&r, IntGaugeVec::new(opts(SLOT_ALARM), &["level"]))?,
            confirm_stalled_seconds: fgauge(SLOT_CONFIRM_STALLED)?,
            oldest_transaction_age_seconds: fgauge(OLDEST_TRANSACTION)?,
        };
        slot.set_alarm(AlarmLevel::Ok);
        slot.set_wal_status(None);
        let snapshot = SnapshotMetrics {
            rows: counter(SNAPSHOT_ROWS)?,
            estimate: gauge(SNAPSHOT_ESTIMATE)?,
            running: gauge(SNAPSHOT_RUNNING)?,
            replay_rows: counter(REPLAY_ROWS)?,
            replays: counters(REPLAYS, "outcome")?,
        };
        for outcome in ["done", "failed", "ignored"] {
            let _ = snapshot.replays.with_label_values(&[outcome]);
        }
        let retention = RetentionMetrics {
            created: counter(RETENTION_CREATED)?,
            sealed: counter(RETENTION_SEALED)?,
            dropped: counter(RETENTION_DROPPED)?,
            skipped: counters(RETENTION_SKIPPED, "reason")?,
            passes: counters(RETENTION_PASSES, "result")?,
            last_success: gauge(RETENTION_LAST_SUCCESS)?,
            inbox_forced_drops: counter(INBOX_FORCED_DROPS)?,
            inbox_forced_open_deliveries: counter(INBOX_FORCED_OPEN)?,
        };
        for result in ["ok", "error"] {
            let _ = retention.passes.with_label_values(&[result]);
        }
        let spans = SpanMetrics { exported: counter(SPANS_EXPORTED)?, dropped: counter(SPANS_DROPPED)? };
        let gauges = |name, label: &str| register(&r, IntGaugeVec::new(opts(name), &[label]));
        let histogram = |name| {
            register(&r, Histogram::with_opts(HistogramOpts::new(name, help(name)).buckets(LATENCY_BUCKETS.to_vec())))
        };
        let inbox = InboxMetrics {
            records: register(&r, IntCounterVec::new(opts(INBOX_RECORDS), &["topic", "result"]))?,
            topics: Arc::new(Mutex::new(std::collections::HashSet::new())),
            batches: counter(INBOX_BATCHES)?,
            write_seconds: histogram(INBOX_WRITE)?,
            latency: histogram(INBOX_LATENCY)?,
            write_errors: counter(INBOX_WRITE_ERRORS)?,
            collisions: counter(INBOX_ID_COLLISIONS)?,
            consumer_lag: register(&r, IntGaugeVec::new(opts(INBOX_CONSUMER_LAG), &["topic", "partition"]))?,
            backlog: gauges(INBOX_BACKLOG, "handler")?,
            oldest_pending: register(&r, prometheus::GaugeVec::new(opts(INBOX_OLDEST_PENDING), &["handler"]))?,
            open_attempts: gauges(INBOX_OPEN_ATTEMPTS, "handler")?,
            review_required: gauges(INBOX_REVIEW_REQUIRED, "handler")?,
            leases_lost: counters(INBOX_LEASES_LOST, "handler")?,
            handlers: Arc::new(Mutex::new(std::collections::BTreeSet::new())),
            stats_age: fgauge(INBOX_STATS_AGE)?,
            stats_read_ms: Arc::new(std::sync::atomic::AtomicI64::new(0)),
            assigned_partitions: gauge(INBOX_ASSIGNED)?,
            group_partitions: gauge(INBOX_GROUP_PARTITIONS)?,
            health: health.clone(),
        };
        let contracts = ContractMetrics {
            checks: register(&r, IntCounterVec::new(opts(CONTRACT_CHECKS), &["event_type", "result"]))?,
            registry_requests: register(&r, IntCounterVec::new(opts(REGISTRY_REQUESTS), &["result"]))?,
            registry_seconds: histogram(REGISTRY_REQUEST_SECONDS)?,
            registry_cache: register(&r, IntCounterVec::new(opts(REGISTRY_CACHE), &["result"]))?,
        };
        let streaming = gauge(STREAMING)?;
        let halted = gauge(HALTED)?;
        let unacknowledged = fgauge(UNACKNOWLEDGED)?;
        let lag = fgauge(LAG)?;
        Ok(Metrics {
            registry: r,
            health,
            stream,
            kafka,
            slot,
            snapshot,
            retention,
            spans,
            inbox,
            contracts,
            streaming,
            halted,
            unacknowledged,
            lag,
        })
    }

    /// The shared state the scrape-time gauges come from.
    pub fn health(&self) -> &Arc<Health> {
        &self.health
    }

    /// Prometheus text exposition (format 0.0.4).
    pub fn encode(&self) -> String {
        self.streaming.set(i64::from(self.health.is_streaming()));
        self.halted.set(i64::from(self.health.halted().is_some()));
        self.unacknowledged.set(self.health.unacknowledged_for().as_secs_f64());
        self.lag.set(self.stream.lag_seconds());
        self.inbox.update_at_scrape();
        let mut out = Vec::with_capacity(8192);
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            tracing::warn!("cannot encode metrics: {e}");
        }
        String::from_utf8(out).unwrap_or_default()
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
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
        m.inbox.records("orders", "stored", 3);
        m.inbox.collisions(1);
        m.inbox.set_consumer_lag_from_stats(
            br#"{"topics": {"orders": {"partitions": {"0": {"consumer_lag": 4, "fetch_state": "active"}, "-1": {"consumer_lag": -1}}}}}"#,
        );
        m.inbox.set_handler_stats(&[HandlerStats {
            handler: "billing".into(),
            backlog: 2,
            oldest_pending_seconds: 1.5,
            open_attempts: 1,
            review_required: 0,
            leases_lost: Some(3),
        }]);
        let text = m.encode();
        for (name, kind, _) in METRICS {
            assert!(text.contains(&format!("# TYPE {name} {kind}")), "{name} missing:\n{text}");
        }
        let exported: Vec<&str> =
            text.lines().filter_map(|l| l.strip_prefix("# TYPE ")).filter_map(|l| l.split(' ').next()).collect();
        assert_eq!(exported.len(), METRICS.len(), "{exported:?}");
        assert!(text.contains("walpost_events_published_total{topic=\"outbox.event.order\"} 2"), "{text}");
        assert!(text.contains("walpost_published_bytes_total 15"));
        assert!(text.contains("walpost_produce_errors_total{class=\"rejected\"} 1"));
        assert!(text.contains("walpost_produce_errors_total{class=\"retryable\"} 0"));
        assert!(text.contains("walpost_reconnects_total{cause=\"kafka\"} 0"));
        assert!(text.contains("walpost_inbox_records_total{result=\"stored\",topic=\"orders\"} 3"), "{text}");
        assert!(text.contains("walpost_inbox_event_id_collisions_total 1"), "{text}");
        assert!(text.contains("walpost_inbox_consumer_lag_records{partition=\"0\",topic=\"orders\"} 4"), "{text}");
        assert!(text.contains("walpost_inbox_handler_backlog{handler=\"billing\"} 2"));
        assert!(text.contains("walpost_inbox_leases_lost_total{handler=\"billing\"} 3"), "{text}");
        m.inbox.set_handler_stats(&[]);
        assert!(!m.encode().contains("handler=\"billing\""), "an unregistered handler's series go");
    }

    fn handler(name: &str, leases_lost: Option<i64>) -> HandlerStats {
        HandlerStats {
            handler: name.into(),
            backlog: 0,
            oldest_pending_seconds: 0.0,
            open_attempts: 0,
            review_required: 0,
            leases_lost,
        }
    }

    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    /// The drill's frozen gauges: their age is exported, and the lost leases the view
    /// counts are a counter per handler.
    #[test]
    fn handler_statistics_carry_their_age_and_the_lost_leases() {
        let m = metrics();
        assert_eq!(value(&m.encode(), "walpost_inbox_handler_stats_age_seconds"), Some(0.0), "not an inbox");
        m.inbox.handler_stats_started();
        std::thread::sleep(Duration::from_millis(200));
        let age = value(&m.encode(), "walpost_inbox_handler_stats_age_seconds").unwrap();
        assert!(age >= 0.2, "counts from the reader's start until a first read: {age}");
        m.inbox.set_handler_stats(&[handler("billing", Some(2)), handler("mailer", None)]);
        let text = m.encode();
        assert!(value(&text, "walpost_inbox_handler_stats_age_seconds").unwrap() < 0.2, "a read resets it: {text}");
        assert_eq!(value(&text, "walpost_inbox_leases_lost_total{handler=\"billing\"}"), Some(2.0));
        assert!(!text.contains("walpost_inbox_leases_lost_total{handler=\"mailer\"}"), "no column, no series");
        m.inbox.set_handler_stats(&[handler("billing", Some(5))]);
        assert_eq!(value(&m.encode(), "walpost_inbox_leases_lost_total{handler=\"billing\"}"), Some(5.0));
        m.inbox.set_handler_stats(&[handler("billing", Some(1))]);
        assert_eq!(
            value(&m.encode(), "walpost_inbox_leases_lost_total{handler=\"billing\"}"),
            Some(1.0),
            "re-registered"
        );
        m.inbox.set_handler_stats(&[]);
        assert!(!m.encode().contains("walpost_inbox_leases_lost_total{"), "an unregistered handler's series go");
    }

    #[test]
    fn the_assigned_partitions_come_from_the_consumer_groups_statistics() {
        let m = metrics();
        m.health().set_streaming(true);
        m.inbox.set_postgres_probe(Ok(3));
        m.inbox.set_consumer_lag_from_stats(br#"{"cgrp": {"state": "up", "assignment_size": 0}, "topics": {}}"#);
        assert_eq!(value(&m.encode(), "walpost_inbox_assigned_partitions"), Some(0.0));
        assert_eq!(value(&m.encode(), "walpost_inbox_group_partitions"), Some(3.0));
        assert!(m.health().readiness().unwrap_err().contains("holds no partition"));
        m.inbox.set_consumer_lag_from_stats(br#"{"cgrp": {"state": "up", "assignment_size": 3}, "topics": {}}"#);
        assert_eq!(value(&m.encode(), "walpost_inbox_assigned_partitions"), Some(3.0));
        assert_eq!(m.health().readiness(), Ok(()));
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
