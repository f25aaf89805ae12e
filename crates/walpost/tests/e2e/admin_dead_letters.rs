//! `GET /api/v1/dead-letters` and `POST /api/v1/dead-letters/redrive` of `walpost run`
//! against a real PostgreSQL and Kafka: two contract breaches dead-lettered and listed
//! (payloads hidden, shown only to an operator with `[admin] show_payloads`), the schema
//! file relaxed so one passes, both redriven by id: the one arrives on its topic once
//! with its id header, the other stays a dead letter and says why; the redrive state in
//! the listing, audit rows without payload or token, and bad bodies refused. With a
//! schema registry (Apicurio, started by testkit), a redrive checks the subject's version
//! registered after the events were dead-lettered, not the one the stream cached.

use std::path::Path;

use super::admin::{
    admin_flags, json, request, scratch, status_when, tokens_file, OPERATOR_TOKEN, TIMEOUT, VIEWER_TOKEN,
};
use super::registry::{decode, register_avro};
use crate::support::*;

fn migration(name: &str) -> String {
    std::fs::read_to_string(format!("{}/../../migrations/outbox/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

/// The audit and redrive tables (outbox migrations 0004, 0006) with the grants
/// docs/control-plane.md gives walpost's role.
pub(super) fn redrive_tables(w: &World) {
    w.sql(&migration("0004_admin_audit.sql"));
    w.sql(&migration("0006_redrives.sql"));
    w.sql(&format!(
        "GRANT INSERT, SELECT ON events.walpost_admin_audit TO {0}; GRANT SELECT, INSERT ON events.walpost_redrives TO {0};",
        w.role
    ));
}

pub(super) fn schema(dir: &Path, amount: &str) {
    std::fs::write(
        dir.join("OrderPlaced.json"),
        format!(
            r#"{{"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
                "required": ["amount"], "properties": {{"amount": {amount}}}}}"#
        ),
    )
    .unwrap();
}

pub(super) fn insert(w: &World, payload: &str) -> String {
    w.sql(&format!(
        "INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload)
         VALUES ('order', '00000000-0000-4000-8000-000000000001', 'OrderPlaced', '{payload}') RETURNING id"
    ))
    .trim()
    .to_owned()
}

fn header<'a>(r: &'a Consumed, name: &str) -> Option<&'a str> {
    r.header(name).map(|v| std::str::from_utf8(v).unwrap())
}

pub(super) fn config(w: &World, dlq: &str, contracts: &Path, show_payloads: bool) -> String {
    let path = std::env::temp_dir().join(format!("{}-{show_payloads}.toml", w.db));
    std::fs::write(
        &path,
        format!(
            "on_permanent_error = \"dead_letter\"\ndead_letter_topic = \"{dlq}\"\n[contracts]\ndir = \"{}\"\n[admin]\nshow_payloads = {show_payloads}\n",
            contracts.display()
        ),
    )
    .unwrap();
    path.display().to_string()
}

#[test]
fn dead_letters_are_listed_without_payloads_and_redriven_once_after_the_schema_is_relaxed() {
    let w = World::new("admin-dlq");
    let dir = scratch("admin-dlq");
    redrive_tables(&w);
    let contracts = dir.join("contracts");
    std::fs::create_dir_all(&contracts).unwrap();
    schema(&contracts, r#"{"type": "integer"}"#);
    let dlq = format!("{}dead", w.topic_prefix);
    let addr = format!("127.0.0.1:{}", testkit::free_port());
    let args_with = |show_payloads: bool| {
        let mut args = vec!["--config".to_string(), config(&w, &dlq, &contracts, show_payloads)];
        args.extend(w.args());
        args.extend([
            "--admin-addr".into(),
            addr.clone(),
            "--admin-tokens-file".into(),
            tokens_file(&dir).display().to_string(),
        ]);
        args
    };
    let mut p = Walpost::start(&args_with(false), &[]);
    assert!(w.wait_for_slot(TIMEOUT), "slot not created:\n{}", p.log_text());
    status_when(&addr, "streaming", &p);

    // Before any dead letter: an empty listing, not an error.
    let (code, body) = request(&addr, "GET", "/api/v1/dead-letters", Some(VIEWER_TOKEN), "");
    assert_eq!(code, 200, "{body}");
    assert_eq!(json(&body)["dead_letters"].as_array().map(Vec::len), Some(0), "{body}");

    let valid = insert(&w, r#"{"amount": 7}"#);
    let passes_later = insert(&w, r#"{"amount": "42", "note": "SECRET-A"}"#);
    let stays = insert(&w, r#"{"amount": "SECRET-B"}"#);
    let records = consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 3, TIMEOUT);
    assert_eq!(records.iter().filter(|r| r.topic == dlq).count(), 2, "{records:?}");
    assert_eq!(header(records.iter().find(|r| r.topic == w.topic("order")).unwrap(), "id"), Some(valid.as_str()));

    // A viewer lists them, newest first, without payloads.
    let (code, body) = request(&addr, "GET", "/api/v1/dead-letters", Some(VIEWER_TOKEN), "");
    assert_eq!(code, 200, "{body}");
    assert!(!body.contains("SECRET"), "a payload in the listing: {body}");
    let listing = json(&body);
    assert_eq!((listing["topic"].as_str(), listing["payloads"].as_str()), (Some(dlq.as_str()), Some("hidden")));
    let letters = listing["dead_letters"].as_array().unwrap();
    let ids: Vec<&str> = letters.iter().map(|l| l["event_id"].as_str().unwrap()).collect();
    assert_eq!(ids, [stays.as_str(), passes_later.as_str()], "newest first: {body}");
    for l in letters {
        assert_eq!(l["reason"], "contract_broken", "{l}");
        assert_eq!(l["event_type"], "OrderPlaced", "{l}");
        assert_eq!(l["original_topic"], w.topic("order").as_str(), "{l}");
        assert_eq!(l["violation_pointer"], "/amount", "{l}");
        assert_eq!(l["outbox_table"], "events.outbox", "{l}");
        assert!(l["time"].as_str().is_some_and(|t| t.starts_with("20")), "{l}");
        assert!(l["redrive"].is_null() && l.get("payload").is_none(), "{l}");
    }
    assert!(listing["redrive_state_unavailable"].is_null(), "{body}");
    let (code, body) = request(&addr, "GET", "/api/v1/dead-letters?limit=1", Some(VIEWER_TOKEN), "");
    assert_eq!(code, 200, "{body}");
    assert_eq!(json(&body)["dead_letters"].as_array().map(Vec::len), Some(1), "{body}");
    for bad in ["limit=0", "limit=501", "limit=x", "payload=yes", "color=red"] {
        let (code, body) = request(&addr, "GET", &format!("/api/v1/dead-letters?{bad}"), Some(VIEWER_TOKEN), "");
        assert_eq!(code, 400, "{bad}: {body}");
        assert!(json(&body)["hint"].as_str().unwrap().contains("limit=N"), "{body}");
    }

    // Payloads: refused to a viewer, and to an operator while show_payloads is off.
    let (code, body) = request(&addr, "GET", "/api/v1/dead-letters?payload=true", Some(VIEWER_TOKEN), "");
    assert_eq!(code, 403, "{body}");
    assert!(!body.contains("SECRET"), "{body}");
    let (code, body) = request(&addr, "GET", "/api/v1/dead-letters?payload=true", Some(OPERATOR_TOKEN), "");
    assert_eq!(code, 403, "{body}");
    assert!(json(&body)["hint"].as_str().unwrap().contains("show_payloads"), "{body}");

    // Bad bodies: clear 400s; a viewer may not redrive.
    let route = "/api/v1/dead-letters/redrive";
    let both = format!(r#"{{"event_ids": ["{stays}"], "reason": "contract_broken"}}"#);
    let huge = serde_json::json!({ "event_ids": (0..1000).map(|i| i.to_string()).collect::<Vec<_>>() }).to_string();
    for (bad, says) in [
        (both.as_str(), "both"),
        ("{}", "neither"),
        (huge.as_str(), "at most 100"),
        (r#"{"event_ids": "#, "JSON"),
        (r#"{"ids": ["1"]}"#, "expected fields"),
    ] {
        let (code, body) = request(&addr, "POST", route, Some(OPERATOR_TOKEN), bad);
        assert_eq!(code, 400, "{bad}: {body}");
        let e = json(&body);
        assert!(e["error"].as_str().unwrap().contains(says), "{bad}: {body}");
        assert!(e["hint"].as_str().unwrap().contains("event_ids"), "{bad}: {body}");
    }
    let by_ids = format!(r#"{{"event_ids": ["{passes_later}", "{stays}", "987654321", "not-a-number"]}}"#);
    let (code, body) = request(&addr, "POST", route, Some(VIEWER_TOKEN), &by_ids);
    assert_eq!(code, 403, "{body}");

    // The schema relaxed: an amount may be digits in a string. One passes now.
    schema(&contracts, r#"{"type": ["integer", "string"], "pattern": "^[0-9]+$"}"#);
    let (code, body) = request(&addr, "POST", route, Some(OPERATOR_TOKEN), &by_ids);
    assert_eq!(code, 200, "{body}");
    assert!(!body.contains("SECRET"), "a payload in the answer: {body}");
    let answer = json(&body);
    assert_eq!(
        (&answer["redriven"], &answer["still_refused"], &answer["not_found"]),
        (&serde_json::json!(1), &serde_json::json!(1), &serde_json::json!(2)),
        "{body}"
    );
    let results = answer["results"].as_array().unwrap();
    let redriven = &results[0];
    assert_eq!(
        (redriven["event_id"].as_str(), redriven["result"].as_str()),
        (Some(passes_later.as_str()), Some("redriven"))
    );
    assert_eq!(redriven["topic"], w.topic("order").as_str(), "{body}");
    assert!(redriven["partition"].is_i64() && redriven["offset"].is_i64(), "{body}");
    let refused = &results[1];
    assert_eq!(
        (refused["event_id"].as_str(), refused["result"].as_str()),
        (Some(stays.as_str()), Some("still_refused"))
    );
    assert_eq!(refused["reason"], "contract_broken", "{body}");
    assert!(refused["detail"].as_str().unwrap().contains("the value at /amount fails \"pattern\""), "{body}");
    let missing = &results[2];
    assert_eq!((missing["event_id"].as_str(), missing["result"].as_str()), (Some("987654321"), Some("not_found")));
    assert!(missing["detail"].as_str().unwrap().contains("events.outbox"), "{body}");
    assert_eq!(
        (results[3]["event_id"].as_str(), results[3]["result"].as_str()),
        (Some("not-a-number"), Some("not_found"))
    );

    // By reason: the one redriven already is skipped, the other still refused.
    let (code, body) = request(&addr, "POST", route, Some(OPERATOR_TOKEN), r#"{"reason": "contract_broken"}"#);
    assert_eq!(code, 200, "{body}");
    let by_reason = json(&body);
    let attempted: Vec<(&str, &str)> = by_reason["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["event_id"].as_str().unwrap(), r["result"].as_str().unwrap()))
        .collect();
    assert_eq!(attempted, [(stays.as_str(), "still_refused")], "{body}");
    let (code, body) = request(&addr, "POST", route, Some(OPERATOR_TOKEN), r#"{"reason": "no_such_reason"}"#);
    assert_eq!(code, 404, "{body}");

    // Exactly once on its topic, with its id header; no new dead letter.
    let records = consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 4, TIMEOUT);
    std::thread::sleep(std::time::Duration::from_secs(2));
    let records = if records.len() == 4 { read_all(&w.kafka_bootstrap, &w.topic_prefix) } else { records };
    assert_eq!(records.len(), 4, "{records:?}");
    let on_topic: Vec<&Consumed> = records.iter().filter(|r| r.topic == w.topic("order")).collect();
    let again: Vec<&&Consumed> = on_topic.iter().filter(|r| header(r, "id") == Some(passes_later.as_str())).collect();
    assert_eq!(again.len(), 1, "{records:?}");
    assert_eq!(
        (again[0].partition, again[0].offset),
        (redriven["partition"].as_i64().unwrap() as i32, redriven["offset"].as_i64().unwrap())
    );
    assert_eq!(header(again[0], "eventType"), Some("OrderPlaced"));
    let row = w.sql(&format!("SELECT payload::text FROM events.outbox WHERE id = {passes_later}"));
    assert_eq!(again[0].value.as_deref(), Some(row.trim().as_bytes()), "the row's payload as the stream sends it");
    assert_eq!(records.iter().filter(|r| r.topic == dlq).count(), 2, "no new dead letter: {records:?}");

    // The listing shows the redrive state.
    let (_, body) = request(&addr, "GET", "/api/v1/dead-letters", Some(VIEWER_TOKEN), "");
    let listing = json(&body);
    let state = |id: &str| {
        listing["dead_letters"].as_array().unwrap().iter().find(|l| l["event_id"] == id).unwrap()["redrive"].clone()
    };
    assert_eq!(
        (state(&passes_later)["result"].as_str(), state(&passes_later)["by"].as_str()),
        (Some("redriven"), Some("oncall"))
    );
    assert_eq!(state(&passes_later)["offset"], redriven["offset"], "{body}");
    assert_eq!(state(&stays)["result"], "still_refused", "{body}");

    // Audit: counts and ids, never a payload or a token.
    let audit = w.sql(
        "SELECT string_agg(concat_ws('|', token_name, action, target, result), E'\\n' ORDER BY at)
         FROM events.walpost_admin_audit WHERE action LIKE '%redrive'",
    );
    let expected = format!(
        "oncall|POST {route}||refused (400)\n\
         oncall|POST {route}||refused (400)\n\
         oncall|POST {route}||refused (400)\n\
         oncall|POST {route}||refused (400)\n\
         oncall|POST {route}||refused (400)\n\
         grafana|POST {route}||forbidden\n\
         oncall|POST {route}|event_ids=4 ({passes_later},{stays},987654321,not-a-number) redriven=1 still_refused=1 not_found=2 failed=0 not_attempted=0|ok\n\
         oncall|POST {route}|reason=contract_broken redriven=0 still_refused=1 not_found=0 failed=0 not_attempted=0|ok\n\
         oncall|POST {route}|reason=no_such_reason|refused (404)"
    );
    assert_eq!(audit, expected);
    let stored = w.sql("SELECT string_agg(concat_ws('|', event_id, outbox_table, by_token, result, reason), E'\\n' ORDER BY at) FROM events.walpost_redrives");
    assert!(!stored.contains("SECRET") && !stored.contains(OPERATOR_TOKEN), "{stored}");
    assert!(stored.contains(&format!("{passes_later}|events.outbox|oncall|redriven")), "{stored}");

    // With show_payloads: an operator sees them (a viewer still does not).
    assert!(p.terminate(TIMEOUT).is_some_and(|s| s.success()), "{}", p.log_text());
    let log = p.log_text();
    assert!(!log.contains("SECRET") && !log.contains(OPERATOR_TOKEN) && !log.contains(VIEWER_TOKEN), "{log}");
    let mut p = Walpost::start(&args_with(true), &[]);
    status_when(&addr, "streaming", &p);
    let (code, body) = request(&addr, "GET", "/api/v1/dead-letters?payload=true", Some(VIEWER_TOKEN), "");
    assert_eq!(code, 403, "{body}");
    let (code, body) = request(&addr, "GET", "/api/v1/dead-letters?payload=true", Some(OPERATOR_TOKEN), "");
    assert_eq!(code, 200, "{body}");
    let listing = json(&body);
    assert_eq!(listing["payloads"], "shown", "{body}");
    let shown = listing["dead_letters"].as_array().unwrap().iter().find(|l| l["event_id"] == stays.as_str()).unwrap();
    assert_eq!(shown["payload"], r#"{"amount": "SECRET-B"}"#, "{body}");
    assert_eq!(shown["payload_truncated"], false, "{body}");
    assert!(p.terminate(TIMEOUT).is_some_and(|s| s.success()), "{}", p.log_text());
    let _ = std::fs::remove_dir_all(&dir);
}

const STRICT_ORDER: &str = r#"{"type": "record", "name": "OrderPlaced", "namespace": "shop",
  "fields": [{"name": "order_id", "type": "string"}, {"name": "amount", "type": "long"}]}"#;
/// The amount may be a string too: backward compatible (a union reads a long).
const RELAXED_ORDER: &str = r#"{"type": "record", "name": "OrderPlaced", "namespace": "shop",
  "fields": [{"name": "order_id", "type": "string"}, {"name": "amount", "type": ["long", "string"]}]}"#;

/// With `[registry]`, a redrive checks the subject's version registered after the events
/// were dead-lettered, while the stream's cache (its 5 min default) still holds the one
/// they broke: the event the new version holds is published framed by the new version's
/// id, the other stays a dead letter naming the version that refused it, and the stream
/// goes on framing live events by the version it cached.
#[test]
fn dead_letters_redriven_with_a_registry_are_checked_by_the_subjects_new_version() {
    let registry = testkit::SchemaRegistry::start();
    let url = registry.url();
    let w = World::new("admin-dlq-registry");
    let dir = scratch("admin-dlq-registry");
    redrive_tables(&w);
    let strict_id = register_avro(&url, "OrderPlaced", STRICT_ORDER);
    let dlq = format!("{}dead", w.topic_prefix);
    let config = dir.join("walpost.toml");
    std::fs::write(
        &config,
        format!(
            "on_permanent_error = \"dead_letter\"\ndead_letter_topic = \"{dlq}\"\n[contracts]\nvalue_format = \"avro\"\n[registry]\nurl = \"{url}\"\n"
        ),
    )
    .unwrap();
    let addr = format!("127.0.0.1:{}", testkit::free_port());
    let mut args = vec!["--config".to_string(), config.display().to_string()];
    args.extend(w.args());
    args.extend(admin_flags(&addr, &dir));
    let mut p = Walpost::start(&args, &[]);
    assert!(w.wait_for_slot(TIMEOUT), "slot not created:\n{}", p.log_text());
    status_when(&addr, "streaming", &p);

    let passes_later = insert(&w, r#"{"order_id": "o-1", "amount": "42"}"#);
    let stays = insert(&w, r#"{"order_id": "o-2", "amount": ["SECRET-B"]}"#);
    let records = consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 2, TIMEOUT);
    assert_eq!(records.iter().filter(|r| r.topic == dlq).count(), 2, "{records:?}");
    let (code, body) = request(&addr, "GET", "/api/v1/dead-letters", Some(VIEWER_TOKEN), "");
    assert_eq!(code, 200, "{body}");
    let listing = json(&body);
    let letters = listing["dead_letters"].as_array().unwrap();
    let ids: Vec<&str> = letters.iter().map(|l| l["event_id"].as_str().unwrap()).collect();
    assert_eq!(ids, [stays.as_str(), passes_later.as_str()], "newest first: {body}");
    for l in letters {
        assert_eq!((l["reason"].as_str(), l["violation_pointer"].as_str()), (Some("contract_broken"), Some("/amount")));
    }

    // A relaxed version registered while walpost runs: the redrive checks it at once.
    let relaxed_id = register_avro(&url, "OrderPlaced", RELAXED_ORDER);
    assert_ne!(relaxed_id, strict_id);
    let route = "/api/v1/dead-letters/redrive";
    let by_ids = format!(r#"{{"event_ids": ["{passes_later}", "{stays}"]}}"#);
    let (code, body) = request(&addr, "POST", route, Some(OPERATOR_TOKEN), &by_ids);
    assert_eq!(code, 200, "{body}");
    assert!(!body.contains("SECRET"), "a payload in the answer: {body}");
    let answer = json(&body);
    assert_eq!((answer["redriven"].as_u64(), answer["still_refused"].as_u64()), (Some(1), Some(1)), "{body}");
    let results = answer["results"].as_array().unwrap();
    let redriven = &results[0];
    assert_eq!(
        (redriven["event_id"].as_str(), redriven["result"].as_str(), redriven["topic"].as_str()),
        (Some(passes_later.as_str()), Some("redriven"), Some(w.topic("order").as_str())),
        "{body}"
    );
    let refused = &results[1];
    assert_eq!(
        (refused["event_id"].as_str(), refused["result"].as_str()),
        (Some(stays.as_str()), Some("still_refused"))
    );
    assert_eq!(refused["reason"], "contract_broken", "{body}");
    let detail = refused["detail"].as_str().unwrap();
    assert!(
        detail.contains(&format!("subject OrderPlaced version 2 (id {relaxed_id}) cannot hold it: the value at /amount fits no branch of its union")),
        "{body}"
    );

    // A live event: the stream goes on, with the version it cached.
    let live = insert(&w, r#"{"order_id": "o-3", "amount": 3}"#);
    let records = consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 4, TIMEOUT);
    std::thread::sleep(std::time::Duration::from_secs(2));
    let records = if records.len() == 4 { read_all(&w.kafka_bootstrap, &w.topic_prefix) } else { records };
    assert_eq!(records.len(), 4, "{records:?}");
    assert_eq!(records.iter().filter(|r| r.topic == dlq).count(), 2, "no new dead letter: {records:?}");
    let on_topic = |id: &str| -> Vec<&Consumed> {
        records.iter().filter(|r| r.topic == w.topic("order") && header(r, "id") == Some(id)).collect()
    };
    let again = on_topic(&passes_later);
    assert_eq!(again.len(), 1, "exactly once: {records:?}");
    assert_eq!(
        (i64::from(again[0].partition), again[0].offset),
        (redriven["partition"].as_i64().unwrap(), redriven["offset"].as_i64().unwrap())
    );
    let framing = |r: &Consumed| {
        let value = r.value.as_deref().unwrap();
        assert_eq!(value[0], 0, "magic byte");
        u32::from_be_bytes(value[1..5].try_into().unwrap())
    };
    assert_eq!(framing(again[0]), relaxed_id, "framed by the relaxed version's id");
    let streamed = on_topic(&live);
    assert_eq!(streamed.len(), 1, "{records:?}");
    assert_eq!(framing(streamed[0]), strict_id, "the stream keeps its cached version");
    let mut decoded = decode(&w, &w.topic("order"), &url, "avro");
    decoded.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        decoded,
        [
            (passes_later.clone(), relaxed_id, serde_json::json!({"order_id": "o-1", "amount": "42"})),
            (live.clone(), strict_id, serde_json::json!({"order_id": "o-3", "amount": 3})),
        ]
    );

    let (_, body) = request(&addr, "GET", "/api/v1/dead-letters", Some(VIEWER_TOKEN), "");
    let listing = json(&body);
    let state = |id: &str| {
        listing["dead_letters"].as_array().unwrap().iter().find(|l| l["event_id"] == id).unwrap()["redrive"]["result"]
            .clone()
    };
    assert_eq!((state(&passes_later), state(&stays)), ("redriven".into(), "still_refused".into()), "{body}");
    assert!(p.terminate(TIMEOUT).is_some_and(|s| s.success()), "{}", p.log_text());
    let log = p.log_text();
    assert!(!log.contains("SECRET") && !log.contains(OPERATOR_TOKEN), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}
