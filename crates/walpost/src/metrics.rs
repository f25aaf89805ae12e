//! Every metric walpost exports, in one place, and the HTTP endpoint that serves them.
//!
//! Names follow Prometheus conventions: `walpost_` prefix, unit suffixes
//! (`_total`, `_bytes`, `_seconds`). Labels are low-cardinality and never carry payload
//! contents: `topic` (bounded by the routing configuration) and error `class`.
//!
//! Endpoints: `/metrics` (text format 0.0.4), `/healthz` (the process is alive),
//! `/readyz` (streaming from the slot right now).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// (name, type, help) of every exported metric, in output order. The README's metrics
/// table and the e2e scrape test are checked against this list.
pub const METRICS: &[(&str, &str, &str)] = &[
    ("walpost_events_published_total", "counter", "Records acknowledged by Kafka, by topic."),
    ("walpost_published_bytes_total", "counter", "Payload bytes acknowledged by Kafka."),
    ("walpost_transactions_total", "counter", "Committed transactions read from the slot."),
    ("walpost_received_lsn", "gauge", "Last WAL position received from the server."),
    ("walpost_confirmed_lsn", "gauge", "Last WAL position confirmed (flushed) to the slot."),
    ("walpost_kafka_in_flight_records", "gauge", "Records handed to the producer and not yet acknowledged."),
    ("walpost_produce_errors_total", "counter", "Failed deliveries by class (retryable, rejected)."),
    ("walpost_reconnects_total", "counter", "Pipeline restarts after a transient error."),
    ("walpost_dead_letters_total", "counter", "Events sent to the dead-letter topic, by error class."),
    ("walpost_events_skipped_total", "counter", "Changes that are not outbox events and were skipped, by reason."),
    ("walpost_streaming", "gauge", "1 while streaming from the replication slot."),
    ("walpost_end_to_end_latency_seconds", "histogram", "Commit timestamp to Kafka acknowledgement."),
    ("walpost_lag_seconds", "gauge", "Age of the oldest transaction read but not yet confirmed (0 when caught up)."),
    ("walpost_slot_retained_bytes", "gauge", "WAL the slot keeps: current WAL position minus restart_lsn."),
    ("walpost_slot_unconfirmed_bytes", "gauge", "Current WAL position minus the slot's confirmed_flush_lsn."),
    (
        "walpost_slot_safe_wal_size_bytes",
        "gauge",
        "Bytes that can be written before the slot is in danger (-1: unlimited).",
    ),
    ("walpost_slot_active", "gauge", "1 when some process is streaming from the slot."),
    ("walpost_slot_wal_status", "gauge", "1 for the slot's current wal_status (reserved, extended, unreserved, lost)."),
    ("walpost_slot_alarm", "gauge", "1 for each alarm level currently raised (warning, critical)."),
    ("walpost_oldest_transaction_age_seconds", "gauge", "Age of the oldest open transaction on the server."),
    ("walpost_snapshot_rows_total", "counter", "Snapshot rows acknowledged by Kafka."),
    ("walpost_snapshot_rows_estimate", "gauge", "Planner estimate of the rows the running snapshot reads."),
    ("walpost_snapshot_running", "gauge", "1 while a snapshot runs."),
    ("walpost_retention_partitions_created_total", "counter", "Outbox partitions created ahead by retention."),
    (
        "walpost_retention_partitions_sealed_total",
        "counter",
        "Expired outbox partitions sealed (made read-only, WAL position recorded).",
    ),
    (
        "walpost_retention_partitions_dropped_total",
        "counter",
        "Expired outbox partitions dropped after the slot confirmed their seal.",
    ),
    (
        "walpost_retention_partitions_skipped_total",
        "counter",
        "Partitions retention left in place although due, by reason.",
    ),
    ("walpost_retention_passes_total", "counter", "Retention passes by result (ok, error)."),
    (
        "walpost_retention_last_success_timestamp_seconds",
        "gauge",
        "Unix time of the last retention pass without error (0: none yet).",
    ),
];

/// Shared counters and gauges; cheap to update from any thread.
#[derive(Debug, Default)]
pub struct Metrics {
    events_by_topic: Mutex<BTreeMap<String, u64>>,
    published_bytes: AtomicU64,
    transactions: AtomicU64,
    received_lsn: AtomicU64,
    confirmed_lsn: AtomicU64,
    in_flight: AtomicU64,
    errors_retryable: AtomicU64,
    errors_rejected: AtomicU64,
    reconnects: AtomicU64,
    streaming: AtomicBool,
    snapshot_rows: AtomicU64,
    snapshot_estimate: AtomicU64,
    snapshot_running: AtomicBool,
    latency: Histogram,
    lag_ms: AtomicU64,
    slot: Mutex<Option<crate::monitor::SlotStatus>>,
    alarm: AtomicU64,
    dead_letters: Mutex<BTreeMap<String, u64>>,
    skipped: Mutex<BTreeMap<String, u64>>,
    /// Partition retention counters (`walpost_retention_*`).
    pub retention: crate::retention::RetentionMetrics,
}

/// Upper bounds (seconds) of the latency histogram buckets.
const LATENCY_BUCKETS: [f64; 14] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0, 300.0];

/// A fixed-bucket histogram of atomics (cumulative counts are computed when rendered).
#[derive(Debug, Default)]
struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    overflow: AtomicU64,
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    fn observe(&self, seconds: f64) {
        let seconds = seconds.max(0.0);
        match LATENCY_BUCKETS.iter().position(|&b| seconds <= b) {
            Some(i) => self.buckets[i].fetch_add(1, Ordering::Relaxed),
            None => self.overflow.fetch_add(1, Ordering::Relaxed),
        };
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add((seconds * 1e6) as u64, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str) {
        let mut cumulative = 0;
        for (bound, n) in LATENCY_BUCKETS.iter().zip(&self.buckets) {
            cumulative += n.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        cumulative += self.overflow.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
        let _ = writeln!(out, "{name}_sum {}", self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6);
        let _ = writeln!(out, "{name}_count {}", self.count.load(Ordering::Relaxed));
    }
}

impl Metrics {
    pub fn record_published(&self, topic: &str, bytes: u64) {
        if let Ok(mut map) = self.events_by_topic.lock() {
            match map.get_mut(topic) {
                Some(n) => *n += 1,
                None => {
                    map.insert(topic.to_owned(), 1);
                }
            }
        }
        self.published_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn produce_error(&self, class: &str) {
        let counter = if class == "rejected" { &self.errors_rejected } else { &self.errors_retryable };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn transaction(&self) {
        self.transactions.fetch_add(1, Ordering::Relaxed);
    }

    pub fn set_received_lsn(&self, lsn: u64) {
        self.received_lsn.store(lsn, Ordering::Relaxed);
    }

    pub fn set_confirmed_lsn(&self, lsn: u64) {
        self.confirmed_lsn.store(lsn, Ordering::Relaxed);
    }

    pub fn set_in_flight(&self, n: u64) {
        self.in_flight.store(n, Ordering::Relaxed);
    }

    pub fn reconnect(&self) {
        self.reconnects.fetch_add(1, Ordering::Relaxed);
    }

    pub fn set_streaming(&self, on: bool) {
        self.streaming.store(on, Ordering::Relaxed);
    }

    pub fn dead_letter(&self, class: &str) {
        bump(&self.dead_letters, class);
    }

    pub fn skipped(&self, reason: &str) {
        bump(&self.skipped, reason);
    }

    /// One record acknowledged `seconds` after its transaction committed.
    pub fn observe_latency(&self, seconds: f64) {
        self.latency.observe(seconds);
    }

    /// Streaming lag from the commit time of the oldest unconfirmed transaction.
    pub fn set_lag_from(&self, oldest_commit_ms: Option<i64>) {
        let lag = oldest_commit_ms.map_or(0, |t| (now_ms() - t).max(0).unsigned_abs());
        self.lag_ms.store(lag, Ordering::Relaxed);
    }

    pub fn lag_seconds(&self) -> f64 {
        self.lag_ms.load(Ordering::Relaxed) as f64 / 1000.0
    }

    pub fn set_slot(&self, status: &crate::monitor::SlotStatus) {
        if let Ok(mut slot) = self.slot.lock() {
            *slot = Some(status.clone());
        }
    }

    pub fn set_alarm(&self, level: crate::monitor::AlarmLevel) {
        self.alarm.store(level as u64, Ordering::Relaxed);
    }

    /// Streaming and no critical slot alarm.
    pub fn is_ready(&self) -> bool {
        self.is_streaming() && self.alarm.load(Ordering::Relaxed) < crate::monitor::AlarmLevel::Critical as u64
    }

    pub fn snapshot_started(&self, estimate: u64) {
        self.snapshot_estimate.store(estimate, Ordering::Relaxed);
        self.snapshot_running.store(true, Ordering::Relaxed);
    }

    pub fn snapshot_row(&self) {
        self.snapshot_rows.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot_finished(&self) {
        self.snapshot_running.store(false, Ordering::Relaxed);
    }

    pub fn is_streaming(&self) -> bool {
        self.streaming.load(Ordering::Relaxed)
    }

    /// Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(2048);
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        for (name, kind, help) in METRICS {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            match *name {
                "walpost_events_published_total" => {
                    if let Ok(map) = self.events_by_topic.lock() {
                        for (topic, n) in map.iter() {
                            let _ = writeln!(out, "{name}{{topic=\"{}\"}} {n}", escape_label(topic));
                        }
                    }
                }
                "walpost_produce_errors_total" => {
                    let _ = writeln!(out, "{name}{{class=\"retryable\"}} {}", load(&self.errors_retryable));
                    let _ = writeln!(out, "{name}{{class=\"rejected\"}} {}", load(&self.errors_rejected));
                }
                "walpost_published_bytes_total" => sample(&mut out, name, load(&self.published_bytes)),
                "walpost_transactions_total" => sample(&mut out, name, load(&self.transactions)),
                "walpost_received_lsn" => sample(&mut out, name, load(&self.received_lsn)),
                "walpost_confirmed_lsn" => sample(&mut out, name, load(&self.confirmed_lsn)),
                "walpost_kafka_in_flight_records" => sample(&mut out, name, load(&self.in_flight)),
                "walpost_reconnects_total" => sample(&mut out, name, load(&self.reconnects)),
                "walpost_streaming" => sample(&mut out, name, u64::from(self.is_streaming())),
                "walpost_end_to_end_latency_seconds" => self.latency.render(&mut out, name),
                "walpost_dead_letters_total" => labeled(&mut out, name, "class", &self.dead_letters),
                "walpost_events_skipped_total" => labeled(&mut out, name, "reason", &self.skipped),
                "walpost_lag_seconds" => {
                    let _ = writeln!(out, "{name} {}", self.lag_seconds());
                }
                "walpost_slot_alarm" => {
                    let level = self.alarm.load(Ordering::Relaxed);
                    let _ = writeln!(out, "{name}{{level=\"warning\"}} {}", u64::from(level == 1));
                    let _ = writeln!(out, "{name}{{level=\"critical\"}} {}", u64::from(level == 2));
                }
                "walpost_slot_retained_bytes"
                | "walpost_slot_unconfirmed_bytes"
                | "walpost_slot_safe_wal_size_bytes"
                | "walpost_slot_active"
                | "walpost_slot_wal_status"
                | "walpost_oldest_transaction_age_seconds" => self.render_slot(&mut out, name),
                "walpost_snapshot_rows_total" => sample(&mut out, name, load(&self.snapshot_rows)),
                "walpost_snapshot_rows_estimate" => sample(&mut out, name, load(&self.snapshot_estimate)),
                "walpost_snapshot_running" => {
                    sample(&mut out, name, u64::from(self.snapshot_running.load(Ordering::Relaxed)))
                }
                retention if retention.starts_with("walpost_retention_") => self.retention.render(&mut out, retention),
                _ => {}
            }
        }
        out
    }
}

impl Metrics {
    fn render_slot(&self, out: &mut String, name: &str) {
        let Ok(slot) = self.slot.lock() else { return };
        let Some(st) = slot.as_ref().filter(|st| st.exists) else {
            return;
        };
        match name {
            "walpost_slot_retained_bytes" => sample(out, name, st.retained_bytes),
            "walpost_slot_unconfirmed_bytes" => sample(out, name, st.unconfirmed_bytes),
            "walpost_slot_safe_wal_size_bytes" => {
                let _ = writeln!(out, "{name} {}", st.safe_wal_size_bytes.unwrap_or(-1));
            }
            "walpost_slot_active" => sample(out, name, u64::from(st.active)),
            "walpost_slot_wal_status" => {
                for status in ["reserved", "extended", "unreserved", "lost"] {
                    let on = st.wal_status.as_deref() == Some(status);
                    let _ = writeln!(out, "{name}{{status=\"{status}\"}} {}", u64::from(on));
                }
            }
            "walpost_oldest_transaction_age_seconds" => {
                let _ = writeln!(out, "{name} {}", st.oldest_transaction_age_secs);
            }
            _ => {}
        }
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Increments a counter with a low-cardinality label (error classes, reasons).
fn bump(map: &Mutex<BTreeMap<String, u64>>, label: &str) {
    if let Ok(mut m) = map.lock() {
        *m.entry(label.to_owned()).or_insert(0) += 1;
    }
}

fn labeled(out: &mut String, name: &str, label: &str, map: &Mutex<BTreeMap<String, u64>>) {
    if let Ok(m) = map.lock() {
        for (value, n) in m.iter() {
            let _ = writeln!(out, "{name}{{{label}=\"{}\"}} {n}", escape_label(value));
        }
    }
}

fn sample(out: &mut String, name: &str, value: u64) {
    let _ = writeln!(out, "{name} {value}");
}

fn escape_label(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// Serves /metrics, /healthz and /readyz until the process exits.
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> std::io::Result<()> {
    let listener = TcpListener::bind(addr).await?;
    tracing::info!(%addr, "serving /metrics, /healthz, /readyz");
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                continue;
            };
            let metrics = metrics.clone();
            tokio::spawn(async move {
                // The request line may arrive in several segments: read until it is whole
                // (or 8 KiB, or 5 s), never judge a request by its first read.
                let mut buf = Vec::with_capacity(1024);
                let read_line = async {
                    let mut chunk = [0u8; 1024];
                    while !buf.windows(2).any(|w| w == b"\r\n") && buf.len() < 8192 {
                        match conn.read(&mut chunk).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => buf.extend_from_slice(chunk.get(..n).unwrap_or_default()),
                        }
                    }
                };
                if tokio::time::timeout(std::time::Duration::from_secs(5), read_line).await.is_err() {
                    return;
                }
                let request = String::from_utf8_lossy(&buf);
                let path = request.split_whitespace().nth(1).unwrap_or("/");
                let (status, body) = match path {
                    "/metrics" => ("200 OK", metrics.render()),
                    "/healthz" => ("200 OK", "ok\n".to_owned()),
                    "/readyz" if metrics.is_ready() => ("200 OK", "ready\n".to_owned()),
                    "/readyz" if metrics.is_streaming() => {
                        ("503 Service Unavailable", "slot alarm critical\n".to_owned())
                    }
                    "/readyz" => ("503 Service Unavailable", "not streaming\n".to_owned()),
                    _ => ("404 Not Found", "not found\n".to_owned()),
                };
                let response = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(response.as_bytes()).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: a request line split over several TCP segments was answered 404
    /// (the server judged the request by its first read).
    #[tokio::test]
    async fn regression_request_line_in_several_segments_is_read_whole() {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = probe.local_addr().unwrap();
        drop(probe);
        serve(addr, Arc::new(Metrics::default())).await.unwrap();
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        for part in ["GE", "T /hea", "lthz HTTP/1.1\r\n", "Host: x\r\n\r\n"] {
            s.write_all(part.as_bytes()).await.unwrap();
            s.flush().await.unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
    }

    #[test]
    fn renders_every_metric_with_help_and_type() {
        let m = Metrics::default();
        m.record_published("outbox.event.order", 10);
        m.record_published("outbox.event.order", 5);
        m.produce_error("rejected");
        let text = m.render();
        for (name, kind, _) in METRICS {
            assert!(text.contains(&format!("# TYPE {name} {kind}")), "{name}");
        }
        assert!(text.contains("walpost_events_published_total{topic=\"outbox.event.order\"} 2"));
        assert!(text.contains("walpost_published_bytes_total 15"));
        assert!(text.contains("walpost_produce_errors_total{class=\"rejected\"} 1"));
    }
}
