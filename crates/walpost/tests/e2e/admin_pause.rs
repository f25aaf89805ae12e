//! `POST /api/v1/pause` and `POST /api/v1/resume` of `walpost run` against a real
//! PostgreSQL and Kafka: refused without migration 0005 (the stream goes on), refused to a
//! viewer, then a pause that holds the slot's confirmed position, survives a restart, and
//! ends with every event delivered once, in order; each action audited.

use std::time::{Duration, Instant};

use super::admin::{admin_flags, json, request, scratch, status_when, OPERATOR_TOKEN, TIMEOUT, VIEWER_TOKEN};
use crate::support::*;

fn migration(name: &str) -> String {
    std::fs::read_to_string(format!("{}/../../migrations/outbox/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

/// The number of events of this world in Kafka now.
fn in_kafka(w: &World) -> usize {
    read_all(&w.kafka_bootstrap, &w.topic_prefix).len()
}

fn current_wal_lsn(w: &World) -> u64 {
    parse_lsn(&w.sql("SELECT pg_current_wal_lsn()")).unwrap()
}

/// Waits until the slot confirmed `lsn` (what Kafka acknowledged is confirmed).
fn wait_confirmed(w: &World, lsn: u64, p: &Walpost) {
    assert!(
        testkit::wait_until(TIMEOUT, || w.confirmed_flush_lsn().is_some_and(|c| c >= lsn)),
        "the slot never confirmed {lsn:X}:\n{}",
        p.log_text()
    );
}

#[test]
fn pause_holds_the_slot_across_a_restart_and_resume_delivers_once() {
    let w = World::new("admin-pause");
    let dir = scratch("admin-pause");
    w.sql(&migration("0004_admin_audit.sql"));
    w.sql(&format!("GRANT INSERT, SELECT ON events.walpost_admin_audit TO {};", w.role));
    let addr = format!("127.0.0.1:{}", testkit::free_port());
    let metrics = format!("127.0.0.1:{}", testkit::free_port());
    let mut args = w.args();
    args.extend(admin_flags(&addr, &dir));
    args.extend(["--metrics-addr".into(), metrics.clone()]);
    let mut p = Walpost::start(&args, &[]);
    assert!(w.wait_for_slot(TIMEOUT), "slot not created:\n{}", p.log_text());
    insert_batches(&w, 0, 1, 5, 5, &["order"]);
    consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 5, TIMEOUT);
    status_when(&addr, "streaming", &p);

    // Without migration 0005: refused, saying what to run; the stream goes on.
    let (code, body) = request(&addr, "POST", "/api/v1/pause", Some(OPERATOR_TOKEN), "");
    assert_eq!(code, 409, "{body}");
    assert!(json(&body)["hint"].as_str().unwrap().contains("walpost migrate"), "{body}");
    insert_batches(&w, 1, 1, 5, 5, &["order"]);
    consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 10, TIMEOUT);
    assert_eq!(status_when(&addr, "streaming", &p)["paused_by"], serde_json::Value::Null);

    w.sql(&migration("0005_pause.sql"));
    w.sql(&format!("GRANT SELECT, INSERT, UPDATE, DELETE ON events.walpost_pauses TO {};", w.role));
    // What was delivered is confirmed first: the restart below then sends nothing twice.
    wait_confirmed(&w, current_wal_lsn(&w), &p);

    let (code, body) = request(&addr, "POST", "/api/v1/pause", Some(VIEWER_TOKEN), "");
    assert_eq!(code, 403, "{body}");
    let (code, body) = request(&addr, "POST", "/api/v1/pause", Some(OPERATOR_TOKEN), "");
    assert_eq!(code, 200, "{body}");
    let paused = json(&body);
    assert_eq!((paused["state"].as_str(), paused["paused_by"].as_str()), (Some("paused"), Some("oncall")), "{body}");
    let before = current_wal_lsn(&w);
    insert_batches(&w, 2, 2, 5, 5, &["order"]);
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(in_kafka(&w), 10, "events reached Kafka while paused:\n{}", p.log_text());
    let confirmed = w.confirmed_flush_lsn().unwrap();
    assert!(confirmed <= before, "confirmed {confirmed:X} past {before:X} while paused");
    let status = status_when(&addr, "paused", &p);
    assert!(status["paused_by"].as_str().is_some_and(|b| b.starts_with("by oncall since")), "{status}");
    let (code, scraped) = request(&metrics, "GET", "/metrics", None, "");
    assert!(code == 200 && scraped.contains("\nwalpost_paused 1\n"), "{scraped}");
    let (code, ready) = request(&metrics, "GET", "/readyz", None, "");
    assert!(code == 200 && ready.starts_with("ready: paused by oncall"), "{code} {ready}");

    // A restart reads the pause before it streams.
    assert!(p.terminate(TIMEOUT).is_some_and(|s| s.success()), "{}", p.log_text());
    let mut p = Walpost::start(&args, &[]);
    status_when(&addr, "paused", &p);
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(in_kafka(&w), 10, "events reached Kafka after a restart while paused:\n{}", p.log_text());
    assert!(w.confirmed_flush_lsn().unwrap() <= before, "confirmed past the pause after a restart");

    let (code, body) = request(&addr, "POST", "/api/v1/resume", Some(OPERATOR_TOKEN), "");
    assert_eq!(code, 200, "{body}");
    assert_eq!(json(&body)["state"], "resumed", "{body}");
    let started = Instant::now();
    let records = wait_for_every_committed(&w, TIMEOUT);
    let a = audit(&w, &records);
    assert!(a.duplicates == 0 && a.reordered.is_empty() && a.phantoms.is_empty(), "{a:?}");
    assert_eq!(records.len(), 20, "{a:?}");
    assert!(started.elapsed() < Duration::from_secs(30), "resumed slowly: {:?}", started.elapsed());
    status_when(&addr, "streaming", &p);
    let (_, scraped) = request(&metrics, "GET", "/metrics", None, "");
    assert!(scraped.contains("\nwalpost_paused 0\n"), "{scraped}");
    assert_eq!(w.sql("SELECT count(*) FROM events.walpost_pauses"), "0");

    assert_eq!(
        w.sql(
            "SELECT string_agg(concat_ws('|', token_name, action, target, result), E'\\n' ORDER BY at)
             FROM events.walpost_admin_audit"
        ),
        format!(
            "oncall|POST /api/v1/pause||refused (409)\ngrafana|POST /api/v1/pause||forbidden\n\
             oncall|POST /api/v1/pause|slot={0}|ok\noncall|POST /api/v1/resume|slot={0}|ok",
            w.slot
        )
    );
    assert!(p.terminate(TIMEOUT).is_some_and(|s| s.success()), "{}", p.log_text());
    let log = p.log_text();
    assert!(log.contains("stream paused by oncall") && log.contains("stream resumed"), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}
