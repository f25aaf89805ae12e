//! `walpost inbox`'s metric handles (registered with the others in [`super::Metrics::new`]).

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use prometheus::{Gauge, Histogram, IntCounter, IntCounterVec, IntGauge, IntGaugeVec};

use super::{now_ms, MAX_TOPIC_SERIES, OTHER_TOPICS};
use crate::telemetry::Health;

/// Handlers with series of their own; the rest share [`OTHER_HANDLERS`]'s.
pub(super) const MAX_HANDLER_SERIES: usize = 100;
/// The `handler` label of the handlers past [`MAX_HANDLER_SERIES`].
pub(super) const OTHER_HANDLERS: &str = "(other)";

/// `walpost inbox`'s metrics.
#[derive(Debug, Clone)]
pub struct InboxMetrics {
    pub(super) records: IntCounterVec,
    /// Topics with their own series (at most [`MAX_TOPIC_SERIES`]).
    pub(super) topics: Arc<Mutex<std::collections::HashSet<String>>>,
    pub batches: IntCounter,
    pub write_seconds: Histogram,
    pub latency: Histogram,
    pub write_errors: IntCounter,
    pub(super) collisions: IntCounter,
    pub(super) consumer_lag: IntGaugeVec,
    pub(super) backlog: IntGaugeVec,
    pub(super) oldest_pending: prometheus::GaugeVec,
    pub(super) open_attempts: IntGaugeVec,
    pub(super) review_required: IntGaugeVec,
    /// `inbox.handlers.leases_lost` (cumulative in the database), as a counter.
    pub(super) leases_lost: IntCounterVec,
    pub(super) handlers: Arc<Mutex<std::collections::BTreeSet<String>>>,
    /// Seconds since the handler statistics were last read (set at scrape time).
    pub(super) stats_age: Gauge,
    /// Unix ms of the last successful read of the handler statistics, or of the start of
    /// the task reading them; 0: no such task (not `walpost inbox`).
    pub(super) stats_read_ms: Arc<AtomicI64>,
    /// Partitions the consumer group assigned to this instance (librdkafka's statistics).
    pub(super) assigned_partitions: IntGauge,
    /// Partitions the group has stored offsets for (read with the handler statistics).
    pub(super) group_partitions: IntGauge,
    /// Readiness: what the inbox tells `/readyz`.
    pub(super) health: Arc<Health>,
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
            self.health.set_inbox_assigned_partitions(n);
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
        self.health.set_inbox_postgres(probe);
    }

    /// The gauges computed at scrape time.
    pub(super) fn update_at_scrape(&self) {
        let read = self.stats_read_ms.load(Ordering::Relaxed);
        let age = if read == 0 { 0.0 } else { (now_ms() - read).max(0) as f64 / 1000.0 };
        self.stats_age.set(age);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::telemetry::Metrics;

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
        let m = Metrics::new(Arc::new(Health::new(Duration::from_secs(30), Duration::from_secs(60)))).unwrap();
        let many: Vec<HandlerStats> = (0..5_000).map(|i| handler(&format!("h{i:04}"), 1)).collect();
        m.inbox.set_handler_stats(&many);
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
        m.inbox.set_handler_stats(&next);
        let text = m.encode();
        assert_eq!(series(&text, "walpost_inbox_handler_backlog").len(), 100, "{text}");
        assert!(text.contains("walpost_inbox_handler_backlog{handler=\"h0099\"} 3"));
        assert!(text.contains("walpost_inbox_handler_backlog{handler=\"new\"} 7"));
        assert!(!text.contains("handler=\"(other)\"") && !text.contains("handler=\"h0000\""), "{text}");
    }
}
