//! `walpost inbox`'s metric handles (registered with the others in [`super::Metrics::new`]).

use std::sync::{Arc, Mutex};

use prometheus::{Histogram, IntCounter, IntCounterVec, IntGaugeVec};

use super::{MAX_TOPIC_SERIES, OTHER_TOPICS};

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
    pub(super) consumer_lag: IntGaugeVec,
    pub(super) backlog: IntGaugeVec,
    pub(super) oldest_pending: prometheus::GaugeVec,
    pub(super) open_attempts: IntGaugeVec,
    pub(super) review_required: IntGaugeVec,
    pub(super) handlers: Arc<Mutex<std::collections::BTreeSet<String>>>,
}

/// What `inbox.handler_stats` says of one handler.
#[derive(Debug, Clone, PartialEq)]
pub struct HandlerStats {
    pub handler: String,
    pub backlog: i64,
    pub oldest_pending_seconds: f64,
    pub open_attempts: i64,
    pub review_required: i64,
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

    /// The consumer lag of each partition, from librdkafka's statistics JSON.
    pub fn set_consumer_lag_from_stats(&self, statistics: &[u8]) {
        let Ok(stats) = serde_json::from_slice::<serde_json::Value>(statistics) else { return };
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

    /// The handlers' statistics; handlers no longer registered lose their series.
    pub fn set_handler_stats(&self, stats: &[HandlerStats]) {
        let Ok(mut known) = self.handlers.lock() else { return };
        let now: std::collections::BTreeSet<String> = stats.iter().map(|s| s.handler.clone()).collect();
        for gone in known.difference(&now) {
            let _ = self.backlog.remove_label_values(&[gone]);
            let _ = self.oldest_pending.remove_label_values(&[gone]);
            let _ = self.open_attempts.remove_label_values(&[gone]);
            let _ = self.review_required.remove_label_values(&[gone]);
        }
        for s in stats {
            let h = [s.handler.as_str()];
            self.backlog.with_label_values(&h).set(s.backlog);
            self.oldest_pending.with_label_values(&h).set(s.oldest_pending_seconds);
            self.open_attempts.with_label_values(&h).set(s.open_attempts);
            self.review_required.with_label_values(&h).set(s.review_required);
        }
        *known = now;
    }
}
