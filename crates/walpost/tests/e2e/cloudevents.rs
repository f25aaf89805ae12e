//! `envelope = "cloudevents"` end to end: walpost writes CloudEvents,
//! and the real CloudEvents SDK (Python `cloudevents`, Kafka binding, through
//! `confluent-kafka`; installed by scripts/fetch-test-tools.sh) decodes every record, in
//! binary and structured mode, tombstones included. The test then checks the SDK's
//! attributes against the committed rows and the raw bytes against PostgreSQL's text.

use std::process::Command;
use std::time::Duration;

use crate::support::*;

const WAIT: Duration = Duration::from_secs(120);

/// Every record of the world's topics as the CloudEvents SDK decodes it.
fn sdk_decode(w: &World) -> Vec<serde_json::Value> {
    let python = testkit::python();
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
/// expected `time` (or none) from the row's occurred_at and the raw record's timestamp.
fn check(
    w: &World,
    source: &str,
    structured: bool,
    time_of: &dyn Fn(&str, i64) -> Option<jiff::Timestamp>,
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
        // On the wire: a `time` only when walpost knows one. The SDK fills in the time it
        // decoded at when a record carries none, so its `time` is compared only then.
        let expected = time_of(occurred_at, r.timestamp.unwrap());
        // (A tombstone has no value to hold a structured event: its attributes are headers.)
        let wire = match (structured, r.value.as_deref()) {
            (true, Some(v)) => serde_json::from_slice::<serde_json::Value>(v).unwrap()["time"].as_str().map(time),
            _ => r.header("ce_time").map(|t| time(std::str::from_utf8(t).unwrap())),
        };
        assert_eq!(wire, expected, "time of event {id} on the wire");
        if let Some(t) = expected {
            assert_eq!(a["time"].as_str().map(time), Some(t), "time of event {id} as the SDK decodes it");
        }
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

/// Binary mode without a timestamp column: no `time` (a replayed copy could not carry the
/// commit time); the record's own timestamp is still the commit time.
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
        None
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
    let events = check(&w, "urn:walpost:e2e", true, &|occurred_at, _| Some(time(occurred_at)));
    println!("structured mode, as the SDK decodes it: {}", serde_json::to_string_pretty(&events[0]).unwrap());
}

/// Regression: a live record carried the commit time as `time` and the
/// replayed copy of the same event none, so a consumer saw one event in two shapes. Every
/// copy now carries the same attributes, with a timestamp column (its time) and without
/// (no time), as the CloudEvents SDK decodes them.
#[test]
fn regression_a_replayed_copy_carries_the_same_cloudevents_attributes_as_the_live_record() {
    for (name, column) in [("ce-copies-col", "\"table.field.event.timestamp\" = \"occurred_at\"\n"), ("ce-copies", "")]
    {
        let w = World::new(name);
        let toml =
            format!("envelope = \"cloudevents\"\n[router]\n\"route.tombstone.on.empty.payload\" = true\n{column}");
        let cfg = config(&w, &toml);
        let mut args = vec!["--config".to_string(), cfg.clone()];
        args.extend(w.args());
        let p = Walpost::start(&args, &[]);
        assert!(w.wait_for_slot(WAIT), "{}", p.log_text());
        insert_events(&w);
        consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 3, WAIT);
        let mut replay = w.args();
        replay[0] = "replay".into();
        replay.extend(["--config".to_string(), cfg, "--id".to_string(), "copies".to_string()]);
        let out = Command::new(env!("CARGO_BIN_EXE_walpost")).args(&replay).output().unwrap();
        assert!(out.status.success(), "walpost replay: {}", String::from_utf8_lossy(&out.stderr));
        consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 6, WAIT);
        let raw = read_all(&w.kafka_bootstrap, &w.topic_prefix);
        let events = sdk_decode(&w);
        assert_eq!((raw.len(), events.len()), (6, 6), "{name}: three events, live and replayed");
        // event id -> (replayed?, the SDK's attributes) of each copy.
        let mut copies: std::collections::BTreeMap<String, Vec<(bool, serde_json::Value)>> = Default::default();
        for e in &events {
            let r = raw
                .iter()
                .find(|r| {
                    Some(r.topic.as_str()) == e["topic"].as_str()
                        && Some(i64::from(r.partition)) == e["partition"].as_i64()
                        && Some(r.offset) == e["offset"].as_i64()
                })
                .expect("the SDK's record among the raw ones");
            let id = String::from_utf8(r.header("id").unwrap().to_vec()).unwrap();
            let mut attributes = e["attributes"].clone();
            // The SDK fills in the time it decoded at when a record carries none: what the
            // record carried is the `ce_time` header (binary mode).
            let wire_time = r.header("ce_time").map(|t| String::from_utf8(t.to_vec()).unwrap());
            if wire_time.is_none() {
                attributes.as_object_mut().unwrap().remove("time");
            }
            copies.entry(id).or_default().push((r.header("walpost.replay").is_some(), attributes));
        }
        assert_eq!(copies.len(), 3, "{name}: {copies:?}");
        for (id, c) in &copies {
            let live = c.iter().find(|(replayed, _)| !replayed).map(|(_, a)| a);
            let replayed = c.iter().find(|(replayed, _)| *replayed).map(|(_, a)| a);
            assert!(live.is_some() && replayed.is_some(), "{name}: event {id} has a live and a replayed copy: {c:?}");
            assert_eq!(live, replayed, "{name}: event {id}'s copies differ");
            let has_time = live.and_then(|a| a.get("time")).is_some();
            assert_eq!(
                has_time,
                !column.is_empty(),
                "{name}: event {id}: time only from the timestamp column: {live:?}"
            );
        }
    }
}
