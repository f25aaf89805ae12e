//! Every metric `walpost inbox` exports, on its own registry (the series every mode
//! exports, `walpost_streaming` and `walpost_halted`, are the `service` crate's): the
//! names in [`names`], listed with their type and help in [`METRICS`] (docs/metrics.md
//! is checked against that list), and the handles the inbox updates, [`InboxMetrics`].
//!
//! Why one file over 600 lines: the names, the `METRICS` table, their registration and the
//! read-backs the admin API's status takes from the same handles are read together when a
//! series is added or renamed; split, a rename would touch three files that must agree.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use daypart::{RetentionMetrics, RetentionNames};
use prometheus::{Gauge, Histogram, IntCounter, IntCounterVec, IntGauge, IntGaugeVec};
use service::telemetry::exposition::{MAX_TOPIC_SERIES, OTHER_TOPICS};
use service::telemetry::{now_ms, Exporter, Exposition, Health};

use crate::readiness::Readiness;

/// Metric names.
pub mod names {
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
    pub const INBOX_RETENTION_CREATED: &str = "walpost_inbox_retention_partitions_created_total";
    pub const INBOX_RETENTION_DROPPED: &str = "walpost_inbox_retention_partitions_dropped_total";
    pub const INBOX_RETENTION_SKIPPED: &str = "walpost_inbox_retention_partitions_skipped_total";
    pub const INBOX_RETENTION_PASSES: &str = "walpost_inbox_retention_passes_total";
    pub const INBOX_RETENTION_LAST_SUCCESS: &str = "walpost_inbox_retention_last_success_timestamp_seconds";
    pub const INBOX_FORCED_DROPS: &str = "walpost_inbox_retention_forced_drops_total";
    pub const INBOX_FORCED_OPEN: &str = "walpost_inbox_retention_forced_open_deliveries_total";
}

use names::*;

/// (name, type, help) of every metric `walpost inbox` exports, in docs/metrics.md's order.
pub const METRICS: &[(&str, &str, &str)] = &[
    (
        INBOX_RECORDS,
        "counter",
        "walpost inbox: records read, by topic (at most 256 topics, then \"(other)\") and result: stored, duplicate (event id already stored), rejected (to the rejected table).",
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
    (INBOX_RETENTION_CREATED, "counter", "walpost inbox: partitions created ahead by retention, of each of its three tables."),
    (
        INBOX_RETENTION_DROPPED,
        "counter",
        "walpost inbox: partitions dropped by retention (finished days, three partitions each; days dropped with open deliveries count in walpost_inbox_retention_forced_drops_total instead).",
    ),
    (INBOX_RETENTION_SKIPPED, "counter", "walpost inbox: partitions retention left in place although due, by reason."),
    (INBOX_RETENTION_PASSES, "counter", "walpost inbox: retention passes by result (ok, error)."),
    (
        INBOX_RETENTION_LAST_SUCCESS,
        "gauge",
        "walpost inbox: Unix time of the last retention pass without error (0: none yet).",
    ),
    (
        INBOX_FORCED_DROPS,
        "counter",
        "walpost inbox: days dropped by retention_max_days while deliveries in them were open (not in walpost_inbox_retention_partitions_dropped_total).",
    ),
    (
        INBOX_FORCED_OPEN,
        "counter",
        "walpost inbox: open deliveries (pending or review_required) dropped with those days.",
    ),
];

/// The names of the inbox's retention series.
const RETENTION_NAMES: RetentionNames = RetentionNames {
    created: INBOX_RETENTION_CREATED,
    sealed: None,
    dropped: INBOX_RETENTION_DROPPED,
    skipped: INBOX_RETENTION_SKIPPED,
    passes: INBOX_RETENTION_PASSES,
    last_success: INBOX_RETENTION_LAST_SUCCESS,
};

/// The inbox's retention: a pass's series, and the days dropped with open deliveries.
#[derive(Debug, Clone)]
pub struct InboxRetentionMetrics {
    pub pass: RetentionMetrics,
    /// Days dropped past `retention_max_days` with open deliveries.
    pub forced_drops: IntCounter,
    /// The open deliveries dropped with them.
    pub forced_open_deliveries: IntCounter,
}

/// Handlers with series of their own; the rest share [`OTHER_HANDLERS`]'s.
pub const MAX_HANDLER_SERIES: usize = 100;
/// The `handler` label of the handlers past [`MAX_HANDLER_SERIES`].
pub const OTHER_HANDLERS: &str = "(other)";

/// `walpost inbox`'s metrics, on its own registry.
#[derive(Debug, Clone)]
pub struct InboxMetrics {
    exposition: Exposition,
    pub retention: InboxRetentionMetrics,
    records: IntCounterVec,
    /// Topics with their own series (at most [`MAX_TOPIC_SERIES`]).
    topics: Arc<Mutex<std::collections::HashSet<String>>>,
    pub batches: IntCounter,
    pub write_seconds: Histogram,
    pub latency: Histogram,
    pub write_errors: IntCounter,
    collisions: IntCounter,
    consumer_lag: IntGaugeVec,
    backlog: IntGaugeVec,
    oldest_pending: prometheus::GaugeVec,
    open_attempts: IntGaugeVec,
    review_required: IntGaugeVec,
    /// `inbox.handlers.leases_lost` (cumulative in the database), as a counter.
    leases_lost: IntCounterVec,
    handlers: Arc<Mutex<std::collections::BTreeSet<String>>>,
    /// Seconds since the handler statistics were last read (set at scrape time).
    stats_age: Gauge,
    /// Unix ms of the last successful read of the handler statistics, or of the start of
    /// the task reading them; 0: no such task (not `walpost inbox`).
    stats_read_ms: Arc<AtomicI64>,
    /// Partitions the consumer group assigned to this instance (librdkafka's statistics).
    assigned_partitions: IntGauge,
    /// Partitions the group has stored offsets for (read with the handler statistics).
    group_partitions: IntGauge,
    /// Readiness: what the inbox tells `/readyz`.
    health: Arc<Health>,
    /// The inbox's own part of it.
    readiness: Arc<Readiness>,
}

impl InboxMetrics {
    /// Registers every metric of `walpost inbox`; `health` feeds `/readyz` and the
    /// gauges computed at scrape time.
    pub fn new(health: Arc<Health>) -> prometheus::Result<InboxMetrics> {
        let e = Exposition::new(health.clone(), METRICS)?;
        let readiness = Arc::new(Readiness::default());
        if health.add_condition(readiness.clone()).is_err() {
            // One Health per mode: a second registration is a wiring bug, not an input.
            return Err(prometheus::Error::Msg("the inbox's readiness is registered twice on one Health".into()));
        }
        let retention = InboxRetentionMetrics {
            pass: RetentionMetrics::register(&e, &RETENTION_NAMES)?,
            forced_drops: e.counter(INBOX_FORCED_DROPS)?,
            forced_open_deliveries: e.counter(INBOX_FORCED_OPEN)?,
        };
        Ok(InboxMetrics {
            records: e.counters(INBOX_RECORDS, &["topic", "result"])?,
            topics: Arc::new(Mutex::new(std::collections::HashSet::new())),
            batches: e.counter(INBOX_BATCHES)?,
            write_seconds: e.latency_histogram(INBOX_WRITE)?,
            latency: e.latency_histogram(INBOX_LATENCY)?,
            write_errors: e.counter(INBOX_WRITE_ERRORS)?,
            collisions: e.counter(INBOX_ID_COLLISIONS)?,
            consumer_lag: e.gauges(INBOX_CONSUMER_LAG, &["topic", "partition"])?,
            backlog: e.gauges(INBOX_BACKLOG, &["handler"])?,
            oldest_pending: e.float_gauges(INBOX_OLDEST_PENDING, &["handler"])?,
            open_attempts: e.gauges(INBOX_OPEN_ATTEMPTS, &["handler"])?,
            review_required: e.gauges(INBOX_REVIEW_REQUIRED, &["handler"])?,
            leases_lost: e.counters(INBOX_LEASES_LOST, &["handler"])?,
            handlers: Arc::new(Mutex::new(std::collections::BTreeSet::new())),
            stats_age: e.float_gauge(INBOX_STATS_AGE)?,
            stats_read_ms: Arc::new(AtomicI64::new(0)),
            assigned_partitions: e.gauge(INBOX_ASSIGNED)?,
            group_partitions: e.gauge(INBOX_GROUP_PARTITIONS)?,
            health,
            readiness,
            retention,
            exposition: e,
        })
    }

    /// The shared state `/healthz` and `/readyz` answer from.
    pub fn health(&self) -> &Arc<Health> {
        &self.health
    }

    /// Prometheus text exposition (format 0.0.4).
    pub fn encode(&self) -> String {
        self.update_at_scrape();
        self.exposition.encode()
    }
}

impl Exporter for InboxMetrics {
    fn encode(&self) -> String {
        InboxMetrics::encode(self)
    }

    fn health(&self) -> &Arc<Health> {
        InboxMetrics::health(self)
    }
}

/// One partition's consumer lag, as [`InboxMetrics::consumer_lags`] reads it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PartitionLag {
    pub topic: String,
    pub partition: i32,
    /// Records in the partition after the group's position.
    pub lag: i64,
}

/// What `inbox.handler_stats` says of one handler.
#[derive(Debug, Clone, PartialEq)]
pub struct HandlerStats {
    pub handler: String,
    pub backlog: i64,
    pub oldest_pending_seconds: f64,
    pub open_attempts: i64,
    pub review_required: i64,
    /// Leases that ran out without `complete` or `fail`, since the handler was registered
    /// (`None`: the inbox's schema does not count them yet).
    pub leases_lost: Option<i64>,
}

impl InboxMetrics {
    /// `n` records of `topic` ended as `result` (`stored`, `duplicate`, `rejected`).
    pub fn records(&self, topic: &str, result: &'static str, n: u64) {
        if n == 0 {
            return;
        }
        let label = match self.topics.lock() {
            Ok(mut topics) if topics.contains(topic) || topics.len() < MAX_TOPIC_SERIES => {
                topics.insert(topic.to_owned());
                topic
            }
            _ => OTHER_TOPICS,
        };
        self.records.with_label_values(&[label, result]).inc_by(n);
    }

    /// `n` records whose event id another topic's message already has.
    pub fn collisions(&self, n: u64) {
        self.collisions.inc_by(n);
    }

    /// The consumer lag of each partition and the partitions assigned to this instance,
    /// from librdkafka's statistics JSON.
    pub fn set_consumer_lag_from_stats(&self, statistics: &[u8]) {
        let Ok(stats) = serde_json::from_slice::<serde_json::Value>(statistics) else { return };
        if let Some(n) = stats.pointer("/cgrp/assignment_size").and_then(serde_json::Value::as_i64) {
            self.assigned_partitions.set(n);
            self.readiness.set_assigned(n);
        }
        let Some(topics) = stats.get("topics").and_then(serde_json::Value::as_object) else { return };
        for (topic, t) in topics {
            let Some(partitions) = t.get("partitions").and_then(serde_json::Value::as_object) else { continue };
            for (partition, p) in partitions {
                // -1 is librdkafka's internal UA partition; a lag of -1 is unknown.
                let lag = p.get("consumer_lag").and_then(serde_json::Value::as_i64).unwrap_or(-1);
                let assigned = p.get("fetch_state").and_then(serde_json::Value::as_str).is_some_and(|s| s != "none");
                if partition != "-1" && lag >= 0 && assigned {
                    self.consumer_lag.with_label_values(&[topic.as_str(), partition.as_str()]).set(lag);
                }
            }
        }
    }

    /// A partition is no longer this instance's: its lag series goes.
    pub fn forget_partition(&self, topic: &str, partition: i32) {
        let _ = self.consumer_lag.remove_label_values(&[topic, &partition.to_string()]);
    }

    /// Each assigned partition's consumer lag in records, as librdkafka last reported it
    /// (every `statistics.interval.ms`), by topic and partition: the admin API's status
    /// reads it here rather than asking Kafka.
    pub fn consumer_lags(&self) -> Vec<PartitionLag> {
        use prometheus::core::Collector;
        let mut lags: Vec<PartitionLag> = Vec::new();
        for family in self.consumer_lag.collect() {
            for m in family.get_metric() {
                let label = |name: &str| m.get_label().iter().find(|l| l.name() == name).map(|l| l.value());
                let (Some(topic), Some(partition)) = (label("topic"), label("partition").and_then(|p| p.parse().ok()))
                else {
                    continue;
                };
                lags.push(PartitionLag { topic: topic.to_owned(), partition, lag: m.get_gauge().get_value() as i64 });
            }
        }
        lags.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
        lags
    }

    /// Records read since start that ended as `result` (`stored`, `duplicate`,
    /// `rejected`), every topic.
    pub fn records_total(&self, result: &str) -> u64 {
        use prometheus::core::Collector;
        let mut total = 0.0;
        for family in self.records.collect() {
            for m in family.get_metric() {
                if m.get_label().iter().any(|l| l.name() == "result" && l.value() == result) {
                    total += m.get_counter().get_value();
                }
            }
        }
        total as u64
    }

    /// Partitions the group assigned to this instance (librdkafka's statistics).
    pub fn assigned_partitions(&self) -> i64 {
        self.assigned_partitions.get()
    }

    /// The handlers' statistics, just read; handlers no longer registered lose their series.
    ///
    /// Handler names are data (any service may register one): at most
    /// [`MAX_HANDLER_SERIES`] handlers have series of their own (one that has them keeps
    /// them; new ones take free places in the order given), the others are summed into
    /// the [`OTHER_HANDLERS`] series (its oldest pending age is their oldest).
    pub fn set_handler_stats(&self, stats: &[HandlerStats]) {
        self.stats_read_ms.store(now_ms(), Ordering::Relaxed);
        let Ok(mut known) = self.handlers.lock() else { return };
        let present: std::collections::BTreeSet<&str> = stats.iter().map(|s| s.handler.as_str()).collect();
        let mut own: std::collections::BTreeSet<String> =
            known.iter().filter(|h| present.contains(h.as_str())).cloned().collect();
        for s in stats {
            if own.len() >= MAX_HANDLER_SERIES {
                break;
            }
            if s.handler != OTHER_HANDLERS {
                own.insert(s.handler.clone());
            }
        }
        for gone in known.difference(&own) {
            self.remove_handler(gone);
        }
        let mut other: Option<HandlerStats> = None;
        for s in stats {
            if own.contains(&s.handler) {
                self.set_handler(s);
                continue;
            }
            let o = other.get_or_insert_with(|| HandlerStats {
                handler: OTHER_HANDLERS.to_owned(),
                backlog: 0,
                oldest_pending_seconds: 0.0,
                open_attempts: 0,
                review_required: 0,
                leases_lost: None,
            });
            o.backlog = o.backlog.saturating_add(s.backlog);
            o.oldest_pending_seconds = o.oldest_pending_seconds.max(s.oldest_pending_seconds);
            o.open_attempts = o.open_attempts.saturating_add(s.open_attempts);
            o.review_required = o.review_required.saturating_add(s.review_required);
            if let Some(lost) = s.leases_lost {
                o.leases_lost = Some(o.leases_lost.unwrap_or(0).saturating_add(lost));
            }
        }
        match other {
            Some(o) => self.set_handler(&o),
            None => self.remove_handler(OTHER_HANDLERS),
        }
        *known = own;
    }

    fn set_handler(&self, s: &HandlerStats) {
        let h = [s.handler.as_str()];
        self.backlog.with_label_values(&h).set(s.backlog);
        self.oldest_pending.with_label_values(&h).set(s.oldest_pending_seconds);
        self.open_attempts.with_label_values(&h).set(s.open_attempts);
        self.review_required.with_label_values(&h).set(s.review_required);
        if let Some(lost) = s.leases_lost {
            self.set_leases_lost(&h, lost);
        }
    }

    fn remove_handler(&self, handler: &str) {
        let _ = self.backlog.remove_label_values(&[handler]);
        let _ = self.oldest_pending.remove_label_values(&[handler]);
        let _ = self.open_attempts.remove_label_values(&[handler]);
        let _ = self.review_required.remove_label_values(&[handler]);
        let _ = self.leases_lost.remove_label_values(&[handler]);
    }

    /// The counter follows the database's cumulative count; a count that went down (the
    /// handler was deleted and registered again) starts a new series, which Prometheus
    /// reads as a counter reset.
    fn set_leases_lost(&self, h: &[&str; 1], lost: i64) {
        let lost = u64::try_from(lost).unwrap_or(0);
        let mut counter = self.leases_lost.with_label_values(h);
        if counter.get() > lost {
            let _ = self.leases_lost.remove_label_values(h);
            counter = self.leases_lost.with_label_values(h);
        }
        counter.inc_by(lost - counter.get());
    }

    /// The task reading the handler statistics starts: their age counts from now until
    /// the first read.
    pub fn handler_stats_started(&self) {
        self.stats_read_ms.store(now_ms(), Ordering::Relaxed);
    }

    /// What the handler statistics' reader found out about the inbox's PostgreSQL: `Ok`
    /// with the partitions the group has stored offsets for, or why it could not read.
    pub fn set_postgres_probe(&self, probe: Result<i64, String>) {
        if let Ok(n) = probe {
            self.group_partitions.set(n);
        }
        self.readiness.set_postgres_probe(probe);
    }

    /// The gauges computed at scrape time.
    fn update_at_scrape(&self) {
        let read = self.stats_read_ms.load(Ordering::Relaxed);
        let age = if read == 0 { 0.0 } else { (now_ms() - read).max(0) as f64 / 1000.0 };
        self.stats_age.set(age);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn metrics() -> InboxMetrics {
        InboxMetrics::new(Arc::new(Health::new(Duration::from_secs(30), Duration::from_secs(60)))).unwrap()
    }

    /// `walpost inbox` exports its own series and the common ones, none of `walpost run`'s.
    #[test]
    fn every_listed_metric_is_exported_with_its_type_and_nothing_else() {
        let m = metrics();
        m.records("orders", "stored", 3);
        m.collisions(1);
        m.retention.pass.skipped("open_deliveries");
        m.set_consumer_lag_from_stats(
            br#"{"topics": {"orders": {"partitions": {"0": {"consumer_lag": 4, "fetch_state": "active"}, "-1": {"consumer_lag": -1}}}}}"#,
        );
        m.set_handler_stats(&[HandlerStats {
            handler: "billing".into(),
            backlog: 2,
            oldest_pending_seconds: 1.5,
            open_attempts: 1,
            review_required: 0,
            leases_lost: Some(3),
        }]);
        let text = m.encode();
        for (name, kind, _) in METRICS.iter().chain(service::telemetry::exposition::METRICS) {
            assert!(text.contains(&format!("# TYPE {name} {kind}")), "{name} missing:\n{text}");
        }
        let exported: Vec<&str> =
            text.lines().filter_map(|l| l.strip_prefix("# TYPE ")).filter_map(|l| l.split(' ').next()).collect();
        assert_eq!(exported.len(), METRICS.len() + service::telemetry::exposition::METRICS.len(), "{exported:?}");
        let common = ["walpost_streaming", "walpost_halted"];
        assert!(
            exported.iter().all(|e| e.starts_with("walpost_inbox_") || common.contains(e)),
            "only the inbox's series: {exported:?}"
        );
        assert!(text.contains("walpost_inbox_records_total{result=\"stored\",topic=\"orders\"} 3"), "{text}");
        assert!(text.contains("walpost_inbox_event_id_collisions_total 1"), "{text}");
        assert!(text.contains("walpost_inbox_consumer_lag_records{partition=\"0\",topic=\"orders\"} 4"), "{text}");
        assert!(text.contains("walpost_inbox_handler_backlog{handler=\"billing\"} 2"));
        assert!(text.contains("walpost_inbox_leases_lost_total{handler=\"billing\"} 3"), "{text}");
        assert!(
            text.contains("walpost_inbox_retention_partitions_skipped_total{reason=\"open_deliveries\"} 1"),
            "{text}"
        );
        m.set_handler_stats(&[]);
        assert!(!m.encode().contains("handler=\"billing\""), "an unregistered handler's series go");
    }

    /// The admin API's status reads the lags and totals from the series, no query.
    #[test]
    fn lags_and_totals_are_read_back_for_the_admin_status() {
        let m = metrics();
        assert!(m.consumer_lags().is_empty() && m.records_total("stored") == 0);
        m.records("orders", "stored", 3);
        m.records("refunds", "stored", 2);
        m.records("orders", "duplicate", 1);
        m.set_consumer_lag_from_stats(
            br#"{"cgrp": {"assignment_size": 2}, "topics": {"orders": {"partitions": {"1": {"consumer_lag": 7, "fetch_state": "active"}, "0": {"consumer_lag": 4, "fetch_state": "active"}}}}}"#,
        );
        let lags = m.consumer_lags();
        assert_eq!(
            lags,
            [
                PartitionLag { topic: "orders".into(), partition: 0, lag: 4 },
                PartitionLag { topic: "orders".into(), partition: 1, lag: 7 }
            ]
        );
        assert_eq!((m.records_total("stored"), m.records_total("duplicate"), m.records_total("rejected")), (5, 1, 0));
        assert_eq!(m.assigned_partitions(), 2);
        m.forget_partition("orders", 1);
        assert_eq!(m.consumer_lags().len(), 1);
    }

    fn handler_with(name: &str, leases_lost: Option<i64>) -> HandlerStats {
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
        m.handler_stats_started();
        std::thread::sleep(Duration::from_millis(200));
        let age = value(&m.encode(), "walpost_inbox_handler_stats_age_seconds").unwrap();
        assert!(age >= 0.2, "counts from the reader's start until a first read: {age}");
        m.set_handler_stats(&[handler_with("billing", Some(2)), handler_with("mailer", None)]);
        let text = m.encode();
        assert!(value(&text, "walpost_inbox_handler_stats_age_seconds").unwrap() < 0.2, "a read resets it: {text}");
        assert_eq!(value(&text, "walpost_inbox_leases_lost_total{handler=\"billing\"}"), Some(2.0));
        assert!(!text.contains("walpost_inbox_leases_lost_total{handler=\"mailer\"}"), "no column, no series");
        m.set_handler_stats(&[handler_with("billing", Some(5))]);
        assert_eq!(value(&m.encode(), "walpost_inbox_leases_lost_total{handler=\"billing\"}"), Some(5.0));
        m.set_handler_stats(&[handler_with("billing", Some(1))]);
        assert_eq!(
            value(&m.encode(), "walpost_inbox_leases_lost_total{handler=\"billing\"}"),
            Some(1.0),
            "re-registered"
        );
        m.set_handler_stats(&[]);
        assert!(!m.encode().contains("walpost_inbox_leases_lost_total{"), "an unregistered handler's series go");
    }

    /// The inbox drill: during a PostgreSQL outage `/readyz` answered ready.
    #[test]
    fn an_inbox_is_not_ready_while_its_postgres_fails_or_it_holds_no_partition_of_its_group() {
        let m = metrics();
        let h = m.health();
        h.set_streaming(true);
        assert_eq!(h.readiness(), Ok(()), "nothing known yet: ready");
        m.set_postgres_probe(Err("connection refused".into()));
        let e = h.readiness().unwrap_err();
        assert!(e.contains("inbox's PostgreSQL") && e.contains("connection refused"), "{e}");
        m.set_postgres_probe(Ok(0));
        assert_eq!(h.readiness(), Ok(()), "a group with no stored offsets: nothing to hold yet");
        m.set_postgres_probe(Ok(4));
        assert!(h.readiness().unwrap_err().contains("holds no partition"), "assignment not known yet");
        m.set_consumer_lag_from_stats(br#"{"cgrp": {"assignment_size": 0}, "topics": {}}"#);
        assert!(h.readiness().unwrap_err().contains("stored offsets for 4 partitions"));
        m.set_consumer_lag_from_stats(br#"{"cgrp": {"assignment_size": 2}, "topics": {}}"#);
        assert_eq!(h.readiness(), Ok(()));
        m.set_postgres_probe(Err("timeout".into()));
        assert!(h.readiness().unwrap_err().contains("timeout"));
    }

    #[test]
    fn the_assigned_partitions_come_from_the_consumer_groups_statistics() {
        let m = metrics();
        m.health().set_streaming(true);
        m.set_postgres_probe(Ok(3));
        m.set_consumer_lag_from_stats(br#"{"cgrp": {"state": "up", "assignment_size": 0}, "topics": {}}"#);
        assert_eq!(value(&m.encode(), "walpost_inbox_assigned_partitions"), Some(0.0));
        assert_eq!(value(&m.encode(), "walpost_inbox_group_partitions"), Some(3.0));
        assert!(m.health().readiness().unwrap_err().contains("holds no partition"));
        m.set_consumer_lag_from_stats(br#"{"cgrp": {"state": "up", "assignment_size": 3}, "topics": {}}"#);
        assert_eq!(value(&m.encode(), "walpost_inbox_assigned_partitions"), Some(3.0));
        assert_eq!(m.health().readiness(), Ok(()));
    }

    fn handler(name: &str, backlog: i64) -> HandlerStats {
        HandlerStats {
            handler: name.to_owned(),
            backlog,
            oldest_pending_seconds: backlog as f64,
            open_attempts: 1,
            review_required: 0,
            leases_lost: Some(2),
        }
    }

    fn series(text: &str, metric: &str) -> Vec<String> {
        text.lines().filter(|l| l.starts_with(&format!("{metric}{{"))).map(str::to_owned).collect()
    }

    /// Regression: handler names are data, and 5,000 registered handlers made 20,012
    /// series. At most MAX_HANDLER_SERIES have their own; the rest are summed in (other).
    #[test]
    fn regression_handler_series_are_capped_with_the_rest_as_other() {
        let m = metrics();
        let many: Vec<HandlerStats> = (0..5_000).map(|i| handler(&format!("h{i:04}"), 1)).collect();
        m.set_handler_stats(&many);
        let text = m.encode();
        for metric in [
            "walpost_inbox_handler_backlog",
            "walpost_inbox_handler_oldest_pending_seconds",
            "walpost_inbox_handler_open_attempts",
            "walpost_inbox_handler_review_required",
            "walpost_inbox_leases_lost_total",
        ] {
            assert_eq!(series(&text, metric).len(), MAX_HANDLER_SERIES + 1, "{metric}");
        }
        assert!(text.contains("walpost_inbox_handler_backlog{handler=\"h0000\"} 1"), "the first come keep theirs");
        assert!(text.contains("walpost_inbox_handler_backlog{handler=\"(other)\"} 4900"), "summed");
        assert!(text.contains("walpost_inbox_handler_open_attempts{handler=\"(other)\"} 4900"));
        assert!(text.contains("walpost_inbox_leases_lost_total{handler=\"(other)\"} 9800"));

        // A handler that has its series keeps it when new ones come first; a place freed
        // goes to the next; with room for all, (other) goes.
        let mut next: Vec<HandlerStats> = vec![handler("new", 7)];
        next.extend((1..100).map(|i| handler(&format!("h{i:04}"), 3)));
        m.set_handler_stats(&next);
        let text = m.encode();
        assert_eq!(series(&text, "walpost_inbox_handler_backlog").len(), 100, "{text}");
        assert!(text.contains("walpost_inbox_handler_backlog{handler=\"h0099\"} 3"));
        assert!(text.contains("walpost_inbox_handler_backlog{handler=\"new\"} 7"));
        assert!(!text.contains("handler=\"(other)\"") && !text.contains("handler=\"h0000\""), "{text}");
    }
}
