//! OpenTelemetry end to end, against a real trace backend started here:
//! walpost-otelcol, the OpenTelemetry Collector with its OTLP/HTTP receiver and file
//! exporter (tools/otelcol, built by scripts/fetch-test-tools.sh). A service span made by
//! the test is exported to the collector and its `traceparent` written with the outbox
//! row; the collector must then hold walpost's span in the same trace, child of the
//! service span, with the messaging attributes of the record Kafka holds.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::support::*;

const WAIT: Duration = Duration::from_secs(120);

/// The collector, killed on drop.
struct Collector {
    child: Child,
    port: u16,
    spans: PathBuf,
    log: PathBuf,
}

impl Collector {
    fn start() -> Collector {
        Collector::start_on(testkit::free_port())
    }

    fn start_on(port: u16) -> Collector {
        Collector::start_with(port, "")
    }

    /// A collector whose OTLP/HTTP receiver takes only TLS with a client certificate
    /// signed by `tls`'s CA (files from [`testkit::make_tls_files`]).
    fn start_tls(tls: &std::path::Path) -> Collector {
        let receiver_tls = format!(
            "        tls:\n          cert_file: {0}/server.crt\n          key_file: {0}/server.key\n          client_ca_file: {0}/ca.crt\n",
            tls.display()
        );
        Collector::start_with(testkit::free_port(), &receiver_tls)
    }

    /// `receiver_extra`: YAML lines added to the http receiver's settings.
    fn start_with(port: u16, receiver_extra: &str) -> Collector {
        let binary = std::env::var_os("WALPOST_OTELCOL").map(PathBuf::from).unwrap_or_else(|| {
            let cache = match std::env::var_os("WALPOST_TOOLS_CACHE") {
                Some(d) => PathBuf::from(d),
                None => {
                    PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into())).join(".cache/walpost/tools")
                }
            };
            cache.join("otelcol/walpost-otelcol")
        });
        assert!(
            binary.exists(),
            "{} is missing: run scripts/fetch-test-tools.sh (scripts/setup-deps.sh does)",
            binary.display()
        );
        let dir = std::env::temp_dir().join(testkit::unique_name("otelcol"));
        std::fs::create_dir_all(&dir).unwrap();
        let spans = dir.join("spans.jsonl");
        let config = dir.join("config.yaml");
        std::fs::write(
            &config,
            format!(
                "receivers:\n  otlp:\n    protocols:\n      http:\n        endpoint: 127.0.0.1:{port}\n{receiver_extra}\
                 exporters:\n  file:\n    path: {}\n\
                 service:\n  telemetry:\n    metrics:\n      level: none\n  pipelines:\n    traces:\n      receivers: [otlp]\n      exporters: [file]\n",
                spans.display()
            ),
        )
        .unwrap();
        let log = dir.join("collector.log");
        let child = Command::new(binary)
            .arg(format!("--config={}", config.display()))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let c = Collector { child, port, spans, log };
        assert!(
            testkit::wait_until(Duration::from_secs(30), || std::fs::read_to_string(&c.log)
                .is_ok_and(|l| l.contains("Everything is ready"))),
            "the collector did not start:\n{}",
            std::fs::read_to_string(&c.log).unwrap_or_default()
        );
        c
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every span the collector wrote, with its resource's service.name.
    fn spans(&self) -> Vec<(String, Value)> {
        let text = std::fs::read_to_string(&self.spans).unwrap_or_default();
        let mut out = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let Ok(doc) = serde_json::from_str::<Value>(line) else { continue };
            for rs in doc["resourceSpans"].as_array().into_iter().flatten() {
                let service = attribute(&rs["resource"], "service.name").unwrap_or_default();
                for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
                    for span in ss["spans"].as_array().into_iter().flatten() {
                        out.push((service.clone(), span.clone()));
                    }
                }
            }
        }
        out
    }

    /// Exports the test's own service span (OTLP/HTTP JSON), as an instrumented service would.
    fn export_service_span(&self, trace_id: &str, span_id: &str) {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        let body = serde_json::json!({"resourceSpans": [{
            "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "orders-service"}}]},
            "scopeSpans": [{"scope": {"name": "e2e"}, "spans": [{
                "traceId": trace_id, "spanId": span_id, "name": "place order", "kind": 2,
                "startTimeUnixNano": (now - 5_000_000).to_string(), "endTimeUnixNano": now.to_string()
            }]}]
        }]})
        .to_string();
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        write!(
            s,
            "POST /v1/traces HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn attribute(holder: &Value, key: &str) -> Option<String> {
    holder["attributes"].as_array()?.iter().find(|a| a["key"] == key).map(|a| {
        let v = &a["value"];
        v["stringValue"]
            .as_str()
            .map(str::to_owned)
            .or_else(|| v["intValue"].as_str().map(str::to_owned))
            .unwrap_or_else(|| v.to_string())
    })
}

fn scrape(port: u16, series: &str) -> Option<f64> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").ok()?;
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Waits until walpost's /metrics shows `series` at `value`; fails with what it shows and
/// walpost's log.
fn wait_for_series(port: u16, series: &str, value: f64, timeout: Duration, p: &Walpost) {
    assert!(
        testkit::wait_until(timeout, || scrape(port, series) == Some(value)),
        "{series} is {:?}, expected {value}\n{}",
        scrape(port, series),
        p.log_text()
    );
}

/// `bytes` random bytes in lower-case hex (a trace or span id).
fn hex(bytes: usize) -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut out = String::new();
    while out.len() < bytes * 2 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_usize(out.len());
        out.push_str(&format!("{:016x}", h.finish() | 1));
    }
    out.truncate(bytes * 2);
    out
}

fn config(w: &World, text: &str) -> String {
    let path = std::env::temp_dir().join(format!("{}-otel.toml", w.db));
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// Rows with a trace context in the JSON headers column, in Debezium's column, an invalid
/// one, an unsampled one and none: the backend holds a span per sampled row, child of the
/// writer's span, with the record's topic, partition, offset and event id; the record's
/// traceparent names walpost's span; the invalid one is counted and its row published.
#[test]
fn otel_spans_reach_a_real_collector_as_children_of_the_rows_trace() {
    let collector = Collector::start();
    let w = World::new("otel-spans");
    w.sql("ALTER TABLE events.outbox ADD COLUMN headers jsonb, ADD COLUMN tracingspancontext text");
    let toml = "[router]\n\"table.field.event.headers\" = \"headers\"\n\"tracing.span.context.field\" = \"tracingspancontext\"\n";
    let metrics_port = testkit::free_port();
    let mut args = vec!["--config".to_string(), config(&w, toml)];
    args.extend(w.args());
    args.extend(["--metrics-addr".to_string(), format!("127.0.0.1:{metrics_port}")]);
    let endpoint = collector.endpoint();
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_SERVICE_NAME", "walpost-e2e"),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ];
    let p = Walpost::start(&args, &env);
    assert!(w.wait_for_slot(WAIT));

    let (trace, service_span) = (hex(16), hex(8));
    collector.export_service_span(&trace, &service_span);
    let parent = format!("00-{trace}-{service_span}-01");
    let debezium_trace = hex(16).chars().rev().collect::<String>();
    let debezium_parent = format!("00-{debezium_trace}-{service_span}-01");
    let unsampled = format!("00-{}-{service_span}-00", "ab".repeat(16));
    w.sql(&format!(
        r#"INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload, headers, tracingspancontext) VALUES
          ('order', '5f0c6b1e-0000-4000-8000-000000000001', 'OrderPlaced', '{{"n": 1}}', '{{"traceparent": "{parent}", "tracestate": "rojo=1"}}', NULL),
          ('order', '5f0c6b1e-0000-4000-8000-000000000002', 'OrderPlaced', '{{"n": 2}}', NULL, E'#Mon Nov 30 10:00:00 UTC 2026\ntraceparent={debezium_parent}\n'),
          ('order', '5f0c6b1e-0000-4000-8000-000000000003', 'OrderPlaced', '{{"n": 3}}', '{{"traceparent": "00-not-a-trace-context"}}', NULL),
          ('order', '5f0c6b1e-0000-4000-8000-000000000004', 'OrderPlaced', '{{"n": 4}}', '{{"traceparent": "{unsampled}"}}', NULL),
          ('order', '5f0c6b1e-0000-4000-8000-000000000005', 'OrderPlaced', '{{"n": 5}}', NULL, NULL)"#
    ));
    let records = consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 5, WAIT);
    let by_id = |id: i64| records.iter().find(|r| r.event_id() == id).unwrap_or_else(|| panic!("event {id}"));
    let traceparent = |id: i64| by_id(id).header("traceparent").map(|v| String::from_utf8(v.to_vec()).unwrap());

    // Sampled rows (1, 2), and root spans for the rows without a (valid) context (3, 5).
    let mut spans = Vec::new();
    assert!(
        testkit::wait_until(Duration::from_secs(30), || {
            spans = collector.spans().into_iter().filter(|(svc, _)| svc == "walpost-e2e").collect();
            spans.len() >= 4
        }),
        "walpost's spans did not reach the collector: {spans:?}\n{}",
        p.log_text()
    );
    assert_eq!(spans.len(), 4, "one span per sampled event, none for the unsampled row: {spans:#?}");
    let span_of = |id: i64| {
        spans
            .iter()
            .map(|(_, s)| s)
            .find(|s| attribute(s, "messaging.message.id") == Some(id.to_string()))
            .unwrap_or_else(|| panic!("no span for event {id}: {spans:#?}"))
    };
    for (id, trace_id) in [(1, trace.as_str()), (2, debezium_trace.as_str())] {
        let s = span_of(id);
        let r = by_id(id);
        assert_eq!(s["traceId"], trace_id, "event {id}: the row's trace");
        assert_eq!(s["parentSpanId"], service_span, "event {id}: child of the service span");
        assert_eq!(s["kind"], 4, "SPAN_KIND_PRODUCER");
        assert_eq!(s["name"], format!("send {}", r.topic));
        assert_eq!(attribute(s, "messaging.system").as_deref(), Some("kafka"));
        assert_eq!(attribute(s, "messaging.destination.name"), Some(r.topic.clone()));
        assert_eq!(attribute(s, "messaging.kafka.destination.partition"), Some(r.partition.to_string()));
        assert_eq!(attribute(s, "messaging.kafka.offset"), Some(r.offset.to_string()));
        assert!(attribute(s, "walpost.commit_lsn").is_some_and(|l| l.contains('/')), "{s}");
        let (start, end): (u64, u64) = (
            s["startTimeUnixNano"].as_str().unwrap().parse().unwrap(),
            s["endTimeUnixNano"].as_str().unwrap().parse().unwrap(),
        );
        assert!(start <= end && end - start < 60_000_000_000, "commit -> ack: {start} .. {end}");
        let ts_ms = r.timestamp.unwrap() as u64;
        assert_eq!(start / 1_000_000, ts_ms, "the span starts at the commit time (the record's timestamp)");
        assert_eq!(
            traceparent(id),
            Some(format!("00-{trace_id}-{}-01", s["spanId"].as_str().unwrap())),
            "event {id}: the record's traceparent names walpost's span"
        );
    }
    assert_eq!(span_of(1)["traceState"], "rojo=1");
    assert_eq!(by_id(1).header("tracestate"), Some(&b"rojo=1"[..]));
    for id in [3, 5] {
        let root = span_of(id);
        assert!(
            root.get("parentSpanId").is_none_or(|p| p.as_str() == Some("")),
            "no valid context: a root span {root}"
        );
        assert_ne!(root["traceId"], trace);
        assert_eq!(
            traceparent(id),
            Some(format!("00-{}-{}-01", root["traceId"].as_str().unwrap(), root["spanId"].as_str().unwrap())),
            "event {id}: the record's traceparent is walpost's root span (an invalid one is left out)"
        );
    }
    assert_eq!(traceparent(4), Some(unsampled), "an unsampled row keeps its own context");
    // The service span is in the same trace in the backend.
    let service: Vec<_> = collector.spans().into_iter().filter(|(svc, _)| svc == "orders-service").collect();
    assert!(service.iter().any(|(_, s)| s["traceId"] == trace && s["spanId"] == service_span), "{service:?}");

    wait_for_series(metrics_port, "walpost_spans_exported_total", 4.0, Duration::from_secs(10), &p);
    assert_eq!(scrape(metrics_port, "walpost_spans_dropped_total"), Some(0.0));
    assert_eq!(scrape(metrics_port, "walpost_trace_context_invalid_total"), Some(1.0));
    let log = p.log_text();
    assert!(log.contains("an invalid traceparent or tracestate was left out"), "{log}");
    assert!(!log.contains("not-a-trace-context"), "the invalid value is not logged");
}

/// Drill of runbooks/otel-and-cloudevents.md: the Collector is down. Every event is
/// still published; the spans are dropped and counted; the runbook's log line, metrics and
/// reachability check show it; once a Collector listens there, spans flow again without a
/// restart.
#[test]
fn drill_otel_collector_down_drops_spans_never_events_and_recovers() {
    let runbook = crate::drills::Runbook::open("otel-and-cloudevents");
    let w = World::new("otel-down");
    let metrics_port = testkit::free_port();
    let collector_port = testkit::free_port();
    let endpoint = format!("http://127.0.0.1:{collector_port}");
    let url = format!("http://127.0.0.1:{metrics_port}");
    let mut args = w.args();
    args.extend(["--metrics-addr".to_string(), format!("127.0.0.1:{metrics_port}")]);
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ("OTEL_BSP_MAX_QUEUE_SIZE", "16"),
        // A failed export is retried for this long (1 s here, 10 s by default) before its
        // spans are dropped.
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "1000"),
    ];
    let p = Walpost::start(&args, &env);
    assert!(w.wait_for_slot(WAIT));
    insert_batches(&w, 0, 4, 50, 10, &["order"]);
    assert_eq!(consume_every_committed(&w, WAIT).len(), 200, "every event published");
    wait_for_series(metrics_port, "walpost_spans_dropped_total", 200.0, Duration::from_secs(30), &p);
    runbook.block("log").assert_lines_in(&p.log_text());
    let metrics = crate::drills::sh_ok(&runbook.block("metrics").fill(&[("url", &url)]));
    assert!(metrics.contains("walpost_spans_dropped_total 200"), "{metrics}");
    assert!(metrics.contains("walpost_spans_exported_total 0"), "{metrics}");
    let reach = runbook.block("reachability").fill(&[("endpoint", &endpoint)]);
    // curl fails (exit 7) and prints 000: nothing listens.
    let down = crate::drills::sh(&reach);
    assert_eq!(String::from_utf8_lossy(&down.stdout).trim(), "000", "nothing listens");

    // Resolution: a Collector there; no restart of walpost.
    let collector = Collector::start_on(collector_port);
    assert_eq!(crate::drills::sh_ok(&reach).trim(), "200", "the endpoint takes OTLP/HTTP");
    // Two transactions of 10, the second once the first's spans are out: a burst of 20
    // would overflow the 16-span queue (OTEL_BSP_MAX_QUEUE_SIZE) and drop 4 by design.
    insert_batches(&w, 4, 1, 10, 10, &["order"]);
    wait_for_series(metrics_port, "walpost_spans_exported_total", 10.0, Duration::from_secs(30), &p);
    insert_batches(&w, 5, 1, 10, 10, &["order"]);
    assert_eq!(consume_every_committed(&w, WAIT).len(), 220, "every event published");
    wait_for_series(metrics_port, "walpost_spans_exported_total", 20.0, Duration::from_secs(30), &p);
    // Exported means the Collector answered 200; its file exporter writes them a moment later.
    assert!(
        testkit::wait_until(Duration::from_secs(30), || collector.spans().len() >= 20),
        "the Collector wrote {} spans",
        collector.spans().len()
    );
    assert_eq!(collector.spans().len(), 20, "exactly the 20 spans of the events after the Collector came back");
    assert_eq!(scrape(metrics_port, "walpost_spans_dropped_total"), Some(200.0));
}

/// OTLP over https with a client certificate (the Collector's receiver demands one),
/// gzip bodies and a header: the spans arrive. Then the same Collector with a CA that did
/// not sign its certificate: every event is still published, the spans are dropped and
/// counted, and the log names the failed verification (runbooks/otel-and-cloudevents.md).
#[test]
fn otel_over_https_with_a_client_certificate_and_gzip() {
    let tls = std::env::temp_dir().join(testkit::unique_name("otel-tls"));
    testkit::make_tls_files(&tls).unwrap();
    let other_ca = std::env::temp_dir().join(testkit::unique_name("otel-other-ca"));
    testkit::make_tls_files(&other_ca).unwrap();
    let collector = Collector::start_tls(&tls);
    let endpoint = format!("https://127.0.0.1:{}", collector.port);
    let file = |dir: &std::path::Path, name: &str| dir.join(name).display().to_string();
    let w = World::new("otel-https");
    let run = |ca: &str, batch: u32| {
        let metrics_port = testkit::free_port();
        let mut args = w.args();
        args.extend(["--metrics-addr".to_string(), format!("127.0.0.1:{metrics_port}")]);
        let (cert, key) = (file(&tls, "client.crt"), file(&tls, "client.key"));
        let env = [
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", format!("{endpoint}/v1/traces")),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", ca.to_string()),
            ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", cert),
            ("OTEL_EXPORTER_OTLP_CLIENT_KEY", key),
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip".to_string()),
            // Over https a header may go to another host; here it only has to be accepted.
            ("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20e2e-token".to_string()),
            ("OTEL_SERVICE_NAME", "walpost-https".to_string()),
            ("OTEL_BSP_SCHEDULE_DELAY", "50".to_string()),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2000".to_string()),
        ];
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let p = Walpost::start(&args, &env);
        assert!(w.wait_for_slot(WAIT), "{}", p.log_text());
        insert_batches(&w, batch, 1, 10, 5, &["order"]);
        assert_eq!(consume_every_committed(&w, WAIT).len() as u32, (batch + 1) * 10, "every event published");
        (p, metrics_port)
    };

    let (mut p, metrics_port) = run(&file(&tls, "ca.crt"), 0);
    wait_for_series(metrics_port, "walpost_spans_exported_total", 10.0, Duration::from_secs(30), &p);
    assert_eq!(scrape(metrics_port, "walpost_spans_dropped_total"), Some(0.0));
    assert!(
        testkit::wait_until(Duration::from_secs(30), || collector.spans().len() >= 10),
        "the Collector wrote {} spans\n{}",
        collector.spans().len(),
        std::fs::read_to_string(&collector.log).unwrap_or_default()
    );
    let spans = collector.spans();
    assert_eq!(spans.len(), 10, "{spans:?}");
    assert!(spans.iter().all(|(svc, _)| svc == "walpost-https"), "{spans:?}");
    let log = p.log_text();
    assert!(log.contains(&format!("endpoint={endpoint}/v1/traces")), "the endpoint is logged with its scheme:\n{log}");
    assert!(!log.contains("e2e-token"), "a header's value is never logged");
    p.terminate(Duration::from_secs(30));

    // A CA that did not sign the Collector's certificate.
    let (p, metrics_port) = run(&file(&other_ca, "ca.crt"), 1);
    wait_for_series(metrics_port, "walpost_spans_dropped_total", 10.0, Duration::from_secs(30), &p);
    assert_eq!(scrape(metrics_port, "walpost_spans_exported_total"), Some(0.0));
    let log = p.log_text();
    assert!(
        log.contains(&format!(
            "TLS with the OTLP endpoint 127.0.0.1:{} failed: the endpoint's certificate did not verify:",
            collector.port
        )),
        "{log}"
    );
    let line = "failed: the endpoint's certificate did not verify: unable to get local issuer certificate; those spans are dropped (walpost_spans_dropped_total)";
    assert!(log.contains(line), "{log}");
    let runbook =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../runbooks/otel-and-cloudevents.md"))
            .unwrap();
    assert!(runbook.contains(line), "runbooks/otel-and-cloudevents.md quotes the TLS warning");
    assert_eq!(collector.spans().len(), 10, "nothing reached the Collector without a verified TLS session");
}
