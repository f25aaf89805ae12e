//! One mode's Prometheus registry: the series every mode exports ([`METRICS`]: whether it
//! streams, whether it halted), computed from [`Health`] at scrape time, and constructors
//! that register a mode's own series under names of its table, with the help text the
//! table gives (docs/metrics.md is checked against the tables).

use std::sync::Arc;

use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

use super::health::Health;

/// (name, type, help) of metrics, in docs/metrics.md's order.
pub type MetricTable = &'static [(&'static str, &'static str, &'static str)];

/// Names of the series every mode exports.
pub mod names {
    pub const STREAMING: &str = "walpost_streaming";
    pub const HALTED: &str = "walpost_halted";
}

/// The series every mode exports.
pub const METRICS: MetricTable = &[
    (
        names::STREAMING,
        "gauge",
        "1 while streaming (walpost run: from the replication slot; walpost inbox: from Kafka into the inbox).",
    ),
    (
        names::HALTED,
        "gauge",
        "1 while walpost has stopped on an error an operator must fix and serves its metrics a last time before it exits 1.",
    ),
];

/// Distinct `topic` label values of a per-topic series; more are counted under [`OTHER_TOPICS`].
pub const MAX_TOPIC_SERIES: usize = 256;
/// The `topic` label value past [`MAX_TOPIC_SERIES`] (no Kafka topic can be named so).
pub const OTHER_TOPICS: &str = "(other)";

/// Upper bounds (seconds) of the latency histograms' buckets.
pub const LATENCY_BUCKETS: [f64; 14] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0, 300.0];

/// What the HTTP server serves: the text of `/metrics`, and the health `/healthz` and
/// `/readyz` answer from.
pub trait Exporter: Send + Sync + 'static {
    /// Prometheus text exposition (format 0.0.4).
    fn encode(&self) -> String;
    /// The shared state `/healthz` and `/readyz` answer from.
    fn health(&self) -> &Arc<Health>;
}

/// See the module docs.
#[derive(Debug, Clone)]
pub struct Exposition {
    registry: Registry,
    health: Arc<Health>,
    /// The mode's own metrics (names and help).
    table: MetricTable,
    streaming: IntGauge,
    halted: IntGauge,
}

impl Exposition {
    /// A registry with the common series; `table` lists the mode's own.
    pub fn new(health: Arc<Health>, table: MetricTable) -> prometheus::Result<Exposition> {
        let registry = Registry::new();
        let streaming = IntGauge::with_opts(Opts::new(names::STREAMING, help(METRICS, names::STREAMING)))?;
        registry.register(Box::new(streaming.clone()))?;
        let halted = IntGauge::with_opts(Opts::new(names::HALTED, help(METRICS, names::HALTED)))?;
        registry.register(Box::new(halted.clone()))?;
        Ok(Exposition { registry, health, table, streaming, halted })
    }

    fn opts(&self, name: &'static str) -> Opts {
        Opts::new(name, help(self.table, name))
    }

    fn register<T: prometheus::core::Collector + Clone + 'static>(
        &self,
        metric: prometheus::Result<T>,
    ) -> prometheus::Result<T> {
        let metric = metric?;
        self.registry.register(Box::new(metric.clone()))?;
        Ok(metric)
    }

    pub fn counter(&self, name: &'static str) -> prometheus::Result<IntCounter> {
        self.register(IntCounter::with_opts(self.opts(name)))
    }

    pub fn gauge(&self, name: &'static str) -> prometheus::Result<IntGauge> {
        self.register(IntGauge::with_opts(self.opts(name)))
    }

    pub fn float_gauge(&self, name: &'static str) -> prometheus::Result<Gauge> {
        self.register(Gauge::with_opts(self.opts(name)))
    }

    pub fn counters(&self, name: &'static str, labels: &[&str]) -> prometheus::Result<IntCounterVec> {
        self.register(IntCounterVec::new(self.opts(name), labels))
    }

    pub fn gauges(&self, name: &'static str, labels: &[&str]) -> prometheus::Result<IntGaugeVec> {
        self.register(IntGaugeVec::new(self.opts(name), labels))
    }

    pub fn float_gauges(&self, name: &'static str, labels: &[&str]) -> prometheus::Result<GaugeVec> {
        self.register(GaugeVec::new(self.opts(name), labels))
    }

    /// A histogram with [`LATENCY_BUCKETS`].
    pub fn latency_histogram(&self, name: &'static str) -> prometheus::Result<Histogram> {
        self.register(Histogram::with_opts(
            HistogramOpts::new(name, help(self.table, name)).buckets(LATENCY_BUCKETS.to_vec()),
        ))
    }

    /// The shared state the scrape-time gauges come from.
    pub fn health(&self) -> &Arc<Health> {
        &self.health
    }

    /// Prometheus text exposition; a mode sets its own scrape-time gauges before.
    pub fn encode(&self) -> String {
        self.streaming.set(i64::from(self.health.is_streaming()));
        self.halted.set(i64::from(self.health.halted().is_some()));
        let mut out = Vec::with_capacity(8192);
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            tracing::warn!("cannot encode metrics: {e}");
        }
        String::from_utf8(out).unwrap_or_default()
    }
}

impl Exporter for Exposition {
    fn encode(&self) -> String {
        Exposition::encode(self)
    }

    fn health(&self) -> &Arc<Health> {
        &self.health
    }
}

fn help(table: MetricTable, name: &str) -> &'static str {
    table.iter().find(|(n, _, _)| *n == name).map_or("", |(_, _, h)| *h)
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const OWN: MetricTable = &[("walpost_test_total", "counter", "A test's counter.")];

    #[test]
    fn a_mode_exports_the_common_series_and_its_own_with_their_help() {
        let health = Arc::new(Health::new(Duration::from_secs(30), Duration::from_secs(60)));
        let e = Exposition::new(health.clone(), OWN).unwrap();
        e.counter("walpost_test_total").unwrap().inc();
        health.set_streaming(true);
        let text = e.encode();
        assert!(text.contains("# HELP walpost_test_total A test's counter.\n"), "{text}");
        assert!(text.contains("walpost_test_total 1\n"), "{text}");
        assert!(text.contains("walpost_streaming 1\n"), "{text}");
        assert!(text.contains("walpost_halted 0\n"), "{text}");
        health.set_halted("stopped".into());
        assert!(e.encode().contains("walpost_halted 1\n"));
        let types = text.lines().filter(|l| l.starts_with("# TYPE ")).count();
        assert_eq!(types, METRICS.len() + OWN.len(), "{text}");
    }
}
