//! `envelope = "cloudevents"` end to end (issue 17, part 2): walpost writes CloudEvents,
//! and the real CloudEvents SDK (Python `cloudevents`, Kafka binding, through
//! `confluent-kafka`; installed by scripts/fetch-test-tools.sh) decodes every record, in
//! binary and structured mode, tombstones included. The test then checks the SDK's
//! attributes against the committed rows and the raw bytes against PostgreSQL's text.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::support::*;

const WAIT: Duration = Duration::from_secs(120);

fn tools_cache() -> PathBuf {
    match std::env::var_os("WALPOST_TOOLS_CACHE") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into())).join(".cache/walpost/tools"),
    }
}

/// Every record of the world's topics as the CloudEvents SDK decodes it.
fn sdk_decode(w: &World) -> Vec<serde_json::Value> {
    let python = std::env::var_os("WALPOST_CE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| tools_cache().join("ce-venv/bin/python"));
    assert!(
        python.exists(),
        "{} is missing: run scripts/fetch-test-tools.sh (scripts/setup-deps.sh does)",
        python.display()
    );
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/e2e/ce_consume.py");
    let out = Command::new(&python).args([script, &w.kafka_bootstrap, &w.topic_prefix]).output().unwrap();
    assert!(
        out.status.success(),
        "the CloudEvents SDK could not decode the records:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn config(w: &World, text: &str) -> String {
    let path = std::env::temp_dir().join(format!("{}-ce.toml", w.db));
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// The rows of this test: (id, aggregate_id, event_type, payload text or NULL, occurred_at UTC).
fn rows(w: &World) -> Vec<(String, String, String, Option<String>, String)> {
    w.sql(
        "SELECT id, aggregate_id, event_type, coalesce(payload::text, '<null>'),
                to_char(occurred_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')
         FROM events.outbox ORDER BY id",
    )
    .lines()
    .filter(|l| !l.is_empty())
    .map(|l| {
        let f: Vec<&str> = l.splitn(5, '|').collect();
        let payload = (f[3] != "<null>").then(|| f[3].to_owned());
        (f[0].to_owned(), f[1].to_owned(), f[2].to_owned(), payload, f[4].to_owned())
    })
    .collect()
}

fn insert_events(w: &World) {
    w.sql("ALTER TABLE events.outbox ALTER COLUMN payload DROP NOT NULL");
    w.sql(
        r#"BEGIN;
        INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload) VALUES
          ('order', '5f0c6b1e-0000-4000-8000-000000000001', 'OrderPlaced', '{"orderId": "o-1", "amount": 19900, "note": "caf\u00e9 \"quoted\""}'),
          ('order', '5f0c6b1e-0000-4000-8000-000000000002', 'Order"Shipped\', '{"lines": [1, 2.50, {"deep": null}], "ok": true}'),
          ('order', '5f0c6b1e-0000-4000-8000-000000000001', 'OrderDeleted', NULL);
        COMMIT;"#,
    );
}

fn time(s: &str) -> jiff::Timestamp {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

/// Checks every decoded event against its row and the raw record; `time_of` gives the
/// expected `time` from the row's occurred_at and the raw record's timestamp.
fn check(
    w: &World,
    source: &str,
    structured: bool,
    time_of: &dyn Fn(&str, i64) -> jiff::Timestamp,
) -> Vec<serde_json::Value> {
    let raw = read_all(&w.kafka_bootstrap, &w.topic_prefix);
    let events = sdk_decode(w);
    let rows = rows(w);
    assert_eq!((raw.len(), events.len(), rows.len()), (3, 3, 3), "{events:#?}");
    for (r, e) in raw.iter().zip(&events) {
        assert_eq!((e["topic"].as_str(), e["offset"].as_i64()), (Some(r.topic.as_str()), Some(r.offset)));
        let id = std::str::from_utf8(r.header("id").unwrap()).unwrap();
        let (_, aggregate_id, event_type, payload, occurred_at) = rows.iter().find(|row| row.0 == id).unwrap();
        let a = &e["attributes"];
        assert_eq!(a["specversion"], "1.0");
        assert_eq!(a["id"], id.to_owned());
        assert_eq!(a["source"], source);
        assert_eq!(a["type"], event_type.to_owned());
        assert_eq!(a["subject"], aggregate_id.to_owned());
        assert_eq!(a["partitionkey"], aggregate_id.to_owned(), "the SDK's partitionkey is the record key");
        assert_eq!(r.key.as_deref(), Some(aggregate_id.as_bytes()));
        assert_eq!(r.partition, java_partition(aggregate_id.as_bytes(), 3), "the aggregate's partition");
        assert_eq!(time(a["time"].as_str().unwrap()), time_of(occurred_at, r.timestamp.unwrap()), "time of event {id}");
        match payload {
            None => {
                assert_eq!(e["tombstone"], true);
                assert_eq!(r.value, None, "a tombstone stays a tombstone");
                assert!(a.get("datacontenttype").is_none() && e["data"].is_null(), "{e}");
                assert!(r.header("ce_id").is_some(), "a tombstone carries the attribute headers");
            }
            Some(text) => {
                assert_eq!(a["datacontenttype"], "application/json");
                let want: serde_json::Value = serde_json::from_str(text).unwrap();
                assert_eq!(e["data"], want, "event {id}: the SDK's data is the row's payload");
                let value = std::str::from_utf8(r.value.as_deref().unwrap()).unwrap();
                if structured {
                    assert!(value.contains(&format!("\"data\":{text}}}")), "payload bytes spliced verbatim: {value}");
                    assert_eq!(r.header("content-type"), Some(&b"application/cloudevents+json"[..]));
                    assert!(r.header("ce_id").is_none(), "structured: no attribute headers");
                } else {
                    assert_eq!(value, text, "binary: the value is the payload as PostgreSQL sent it");
                    assert_eq!(r.header("content-type"), Some(&b"application/json"[..]));
                }
            }
        }
    }
    events
}

/// Binary mode, `time` from the commit time (no timestamp column): the record's timestamp.
#[test]
fn cloudevents_binary_mode_decodes_with_the_sdk() {
    let w = World::new("ce-binary");
    let toml = "envelope = \"cloudevents\"\n[router]\n\"route.tombstone.on.empty.payload\" = true\n";
    let mut args = vec!["--config".to_string(), config(&w, toml)];
    args.extend(w.args());
    let _p = Walpost::start(&args, &[]);
    assert!(w.wait_for_slot(WAIT));
    insert_events(&w);
    consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 3, WAIT);
    let source = format!("/walpost/{}/events.outbox", w.db);
    let events = check(&w, &source, false, &|occurred_at, record_ms| {
        // The record's timestamp is the commit time cut to whole milliseconds, and
        // occurred_at (now(), the transaction's start) has microseconds: a commit in the
        // same millisecond as the start has a record timestamp below occurred_at. Compare
        // both at millisecond precision (CI failed once on the microsecond comparison).
        let commit = jiff::Timestamp::from_millisecond(record_ms).unwrap();
        let started_ms = time(occurred_at).as_millisecond();
        assert!(
            (0..60_000).contains(&(record_ms - started_ms)),
            "commit {commit} (record timestamp) is not within a minute after occurred_at {occurred_at}"
        );
        commit
    });
    println!("binary mode, as the SDK decodes it: {}", serde_json::to_string_pretty(&events[0]).unwrap());
}

/// Structured mode with a configured source and `time` from the timestamp column, at its
/// full precision.
#[test]
fn cloudevents_structured_mode_decodes_with_the_sdk() {
    let w = World::new("ce-structured");
    let toml = r#"
envelope = "cloudevents"
[cloudevents]
mode = "structured"
source = "urn:walpost:e2e"
[router]
"route.tombstone.on.empty.payload" = true
"table.field.event.timestamp" = "occurred_at"
"#;
    let mut args = vec!["--config".to_string(), config(&w, toml)];
    args.extend(w.args());
    let _p = Walpost::start(&args, &[]);
    assert!(w.wait_for_slot(WAIT));
    insert_events(&w);
    consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 3, WAIT);
    let events = check(&w, "urn:walpost:e2e", true, &|occurred_at, _| time(occurred_at));
    println!("structured mode, as the SDK decodes it: {}", serde_json::to_string_pretty(&events[0]).unwrap());
}
