//! Replays on `walpost run`'s admin API against a real PostgreSQL and Kafka: a replay
//! by a `where` condition started, followed to its end and found in Kafka (each selected
//! row once, with its id and the replay's header) while the live stream goes on; a long
//! replay stopped at a chunk boundary with what it published kept; at most two at once;
//! refusals (the condition grammar, `unsafe_where`, unknown fields, an unknown id); roles
//! (no token 401, a viewer 403 on actions and 200 on reads); audit rows without payloads.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use super::admin::{json, request, scratch, status_when, tokens_file, OPERATOR_TOKEN, TIMEOUT, VIEWER_TOKEN};
use crate::support::*;

const WAIT: Duration = Duration::from_secs(120);
/// Rows of the long replay: enough that it still runs when it is stopped.
const BULK: i64 = 300_000;
/// In every bulk row's payload: must not reach the log or the audit.
const CANARY: &str = "CANARY-replay-payload";

fn migration(name: &str) -> String {
    std::fs::read_to_string(format!("{}/../../migrations/outbox/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

fn ids_where(w: &World, condition: &str) -> Vec<i64> {
    w.sql(&format!("SELECT id FROM events.outbox WHERE {condition} ORDER BY id"))
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect()
}

fn get(addr: &str, path: &str) -> serde_json::Value {
    let (code, body) = request(addr, "GET", path, Some(VIEWER_TOKEN), "");
    assert_eq!(code, 200, "GET {path}: {body}");
    json(&body)
}

/// The replay once `done` says so (polling its GET as a viewer).
fn replay_when(addr: &str, id: &str, p: &Walpost, done: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let r = get(addr, &format!("/api/v1/replays/{id}"));
        if done(&r) {
            return r;
        }
        assert!(Instant::now() < deadline, "replay {id} never got there: {r}\n{}", p.log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn start(addr: &str, body: &str) -> serde_json::Value {
    let (code, answer) = request(addr, "POST", "/api/v1/replays", Some(OPERATOR_TOKEN), body);
    assert_eq!(code, 202, "{body}: {answer}");
    let r = json(&answer);
    assert_eq!(r["state"], "running", "{answer}");
    r
}

fn stop(addr: &str, id: &str) -> serde_json::Value {
    let (code, answer) = request(addr, "DELETE", &format!("/api/v1/replays/{id}"), Some(OPERATOR_TOKEN), "");
    assert_eq!(code, 200, "{answer}");
    json(&answer)
}

fn bulk_in_kafka(w: &World) -> i64 {
    high_watermarks(&w.kafka_bootstrap, &w.topic("bulk")).values().sum()
}

#[test]
fn admin_replays_start_follow_and_stop_beside_the_stream() {
    let w = World::new("admin-replays");
    let dir = scratch("admin-replays");
    w.sql(&migration("0004_admin_audit.sql"));
    w.sql(&format!("GRANT INSERT, SELECT ON events.walpost_admin_audit TO {};", w.role));
    // Written before the slot exists, so the stream never publishes them: only replays do.
    w.sql(&format!(
        "INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload)
         SELECT 'bulk', ('00000000-0000-4000-8000-' || lpad((g % 50)::text, 12, '0'))::uuid, 'B',
                jsonb_build_object('n', g, 'note', '{CANARY}')
         FROM generate_series(1, {BULK}) AS g"
    ));
    let addr = format!("127.0.0.1:{}", testkit::free_port());
    let mut args = w.args();
    args.extend([
        "--admin-addr".into(),
        addr.clone(),
        "--admin-tokens-file".into(),
        tokens_file(&dir).display().to_string(),
    ]);
    let mut p = Walpost::start(&args, &[]);
    assert!(w.wait_for_slot(TIMEOUT), "slot not created:\n{}", p.log_text());
    insert_batches(&w, 0, 2, 10, 5, &["order"]);
    insert_batches(&w, 2, 2, 10, 5, &["payment"]);
    consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 40, WAIT);
    status_when(&addr, "streaming", &p);

    // Tokens and roles.
    let body = r#"{"where": "aggregate_type = 'payment'", "id": "fix-42"}"#;
    for (method, path) in [("POST", "/api/v1/replays"), ("GET", "/api/v1/replays"), ("DELETE", "/api/v1/replays/x")] {
        assert_eq!(request(&addr, method, path, None, body).0, 401, "{method} {path}");
    }
    let (code, answer) = request(&addr, "POST", "/api/v1/replays", Some(VIEWER_TOKEN), body);
    assert_eq!(code, 403, "{answer}");

    // Refusals: nothing starts.
    let (code, answer) = request(
        &addr,
        "POST",
        "/api/v1/replays",
        Some(OPERATOR_TOKEN),
        r#"{"where": "(SELECT count(*) FROM pg_authid) > 0"}"#,
    );
    assert_eq!(code, 400, "{answer}");
    let refused = json(&answer);
    assert!(refused["error"].as_str().unwrap().contains("not a condition walpost runs"), "{answer}");
    assert!(refused["hint"].as_str().unwrap().contains("compare columns with constants"), "{answer}");
    let (code, answer) = request(
        &addr,
        "POST",
        "/api/v1/replays",
        Some(OPERATOR_TOKEN),
        r#"{"where": "app.f(payload)", "unsafe_where": true}"#,
    );
    assert_eq!(code, 400, "{answer}");
    assert!(json(&answer)["error"].as_str().unwrap().contains("unsafe_where is not offered"), "{answer}");
    let (code, answer) = request(&addr, "POST", "/api/v1/replays", Some(OPERATOR_TOKEN), r#"{"wher": "id = 1"}"#);
    assert_eq!(code, 400, "{answer}");
    // An empty body selects nothing: replaying every row is asked for by name.
    let (code, answer) = request(&addr, "POST", "/api/v1/replays", Some(OPERATOR_TOKEN), r#"{"id": "oops"}"#);
    assert_eq!(code, 400, "{answer}");
    assert!(json(&answer)["hint"].as_str().unwrap().contains(r#""all": true"#), "{answer}");
    let both = r#"{"all": true, "where": "id = 1"}"#;
    let (code, answer) = request(&addr, "POST", "/api/v1/replays", Some(OPERATOR_TOKEN), both);
    assert_eq!(code, 400, "{answer}");
    let (code, answer) = request(&addr, "GET", "/api/v1/replays/nope", Some(VIEWER_TOKEN), "");
    assert_eq!(code, 404, "{answer}");
    assert!(json(&answer)["hint"].as_str().unwrap().contains("GET /api/v1/replays"), "{answer}");
    assert_eq!(get(&addr, "/api/v1/replays")["replays"], serde_json::json!([]));

    // A replay by a condition, followed to its end while live events keep coming.
    let started = start(&addr, body);
    assert_eq!(started["id"], "fix-42");
    insert_batches(&w, 4, 3, 10, 5, &["order"]);
    let done = replay_when(&addr, "fix-42", &p, |r| r["state"] != "running");
    assert_eq!(done["state"], "done", "{done}\n{}", p.log_text());
    assert_eq!((done["rows_read"].as_u64(), done["events_published"].as_u64()), (Some(20), Some(20)), "{done}");
    assert!(done["finished_at"].is_string() && done["error"].is_null(), "{done}");
    let live_ids = ids_where(&w, "aggregate_type IN ('order', 'payment')");
    assert_eq!(live_ids.len(), 70);
    let records = consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 70 + 20, WAIT);
    let replayed: Vec<&Consumed> =
        records.iter().filter(|r| r.header("walpost.replay") == Some(b"fix-42".as_slice())).collect();
    let mut replayed_ids: Vec<i64> = replayed.iter().map(|r| r.event_id()).collect();
    replayed_ids.sort_unstable();
    assert_eq!(replayed_ids, ids_where(&w, "aggregate_type = 'payment'"), "each selected row once");
    assert!(replayed.iter().all(|r| r.topic == w.topic("payment")), "routed as streamed");
    let live: Vec<i64> =
        records.iter().filter(|r| r.header("walpost.replay").is_none()).map(Consumed::event_id).collect();
    assert_eq!(live.len(), live_ids.len(), "the stream sent something twice or lost it");
    assert_eq!(live.iter().copied().collect::<HashSet<_>>(), live_ids.iter().copied().collect(), "live events");
    let (code, answer) = request(&addr, "POST", "/api/v1/replays", Some(OPERATOR_TOKEN), body);
    assert_eq!(code, 409, "an id is used once: {answer}");

    // A long replay, stopped at a chunk boundary: what it published stays published.
    start(&addr, r#"{"where": "aggregate_type = 'bulk'", "id": "big"}"#);
    replay_when(&addr, "big", &p, |r| r["rows_read"].as_i64() > Some(0) || r["state"] != "running");
    let (code, answer) = request(&addr, "DELETE", "/api/v1/replays/big", Some(VIEWER_TOKEN), "");
    assert_eq!(code, 403, "{answer}");
    let stopped = stop(&addr, "big");
    assert_eq!(stopped["state"], "stopped", "{stopped}\n{}", p.log_text());
    assert_eq!(stopped["stop_requested"], true, "{stopped}");
    let (read, published) = (stopped["rows_read"].as_i64().unwrap(), stopped["events_published"].as_i64().unwrap());
    assert!(read < BULK && published <= read, "{stopped}");
    std::thread::sleep(Duration::from_secs(2));
    let later = get(&addr, "/api/v1/replays/big");
    assert_eq!((later["state"].clone(), later["events_published"].as_i64()), ("stopped".into(), Some(published)));
    let in_kafka = bulk_in_kafka(&w);
    assert!(in_kafka >= published && in_kafka < BULK, "{in_kafka} bulk records in Kafka, {published} published");
    assert_eq!(stop(&addr, "big")["state"], "stopped", "stopping a stopped replay changes nothing");

    // At most two at once.
    let first = start(&addr, r#"{"where": "aggregate_type = 'bulk'"}"#);
    let second = start(&addr, r#"{"where": "aggregate_type = 'bulk' AND id > 0"}"#);
    assert_ne!(first["id"], second["id"], "two replays started in one second have their own ids");
    let (code, answer) =
        request(&addr, "POST", "/api/v1/replays", Some(OPERATOR_TOKEN), r#"{"since": "2026-01-01T00:00:00Z"}"#);
    assert_eq!(code, 409, "{answer}");
    assert!(json(&answer)["hint"].as_str().unwrap().contains("DELETE /api/v1/replays/"), "{answer}");
    for r in [&first, &second] {
        let id = r["id"].as_str().unwrap();
        let end = stop(&addr, id);
        assert_eq!(end["state"], "stopped", "{end}");
    }
    let listed = get(&addr, "/api/v1/replays");
    let ids: Vec<&str> = listed["replays"].as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [second["id"].as_str().unwrap(), first["id"].as_str().unwrap(), "big", "fix-42"], "newest first");
    assert_eq!(listed["running"], 0);

    // The stream went on meanwhile and still does.
    insert_batches(&w, 7, 2, 10, 5, &["order"]);
    let orders = consume_at_least(&w.kafka_bootstrap, &w.topic("order"), 70, WAIT);
    assert_eq!(orders.iter().map(Consumed::event_id).collect::<HashSet<_>>().len(), 70);
    status_when(&addr, "streaming", &p);
    assert!(p.is_running(), "{}", p.log_text());

    let audit = w.sql(
        "SELECT string_agg(concat_ws('|', token_name, action, target, result), E'\\n' ORDER BY at)
         FROM events.walpost_admin_audit",
    );
    assert!(audit.contains("grafana|POST /api/v1/replays||forbidden"), "{audit}");
    assert!(
        audit.contains("oncall|POST /api/v1/replays|replay=fix-42 selection=where where=aggregate_type = 'payment'|ok"),
        "{audit}"
    );
    assert!(
        audit.contains(
            "oncall|POST /api/v1/replays|selection=where where=(SELECT count(*) FROM pg_authid) > 0|refused (400)"
        ),
        "{audit}"
    );
    assert!(audit.contains("oncall|DELETE /api/v1/replays/{id}|replay=big|ok"), "{audit}");
    assert!(audit.contains("grafana|DELETE /api/v1/replays/{id}|id=big|forbidden"), "{audit}");
    assert!(p.terminate(TIMEOUT).is_some_and(|s| s.success()), "{}", p.log_text());
    let log = p.log_text();
    assert!(!log.contains(CANARY) && !audit.contains(CANARY), "a payload in the log or the audit");
    assert!(log.contains("admin API: replay asked to stop") && log.contains("admin API: replay ended"), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}
