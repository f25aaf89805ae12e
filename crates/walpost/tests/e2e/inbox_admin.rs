//! `walpost inbox`'s admin API (`/api/v1/inbox`, docs/control-plane.md "The inbox's API")
//! against a real Kafka and PostgreSQL: records consumed by the inbox, a handler that fails
//! some of them (`inbox.claim` and `inbox.fail`, as a service's worker does) until they are
//! in review; then every route without a token, with a viewer's and with an operator's;
//! the handlers at a glance and the review queue with the numbers SQL has; retry and
//! dismiss in bulk changing exactly the messages selected; pause and resume as
//! `inbox.claim` sees them; bad input answered with a 4xx JSON error and a hint; and every
//! action in `inbox.admin_audit` and the log, with the token's name, never a token or a
//! payload.

use std::time::Instant;

use super::admin::{admin_flags, json, request, scratch, OPERATOR_TOKEN, TIMEOUT, VIEWER_TOKEN};
use crate::inbox_ingest::{create_topic, inbox_args, produce, start_inbox, wait_for_messages};
use crate::support::{strip_ansi, Walpost, World};

/// In every record's payload: it must never reach an answer, an audit row or the log.
const PAYLOAD_MARKER: &str = "card-4111-1111-1111-1111";
/// The records' event ids, in the order they were produced (one partition).
const EVENTS: usize = 10;

fn event_id(i: usize) -> String {
    format!("adm-{i}")
}

/// `inbox.claim` as (event id, lease token), in the order returned.
fn claim(w: &World, handler: &str, max_rows: u32) -> Vec<(String, String)> {
    w.sql(&format!("SELECT event_id, lease_token FROM inbox.claim('{handler}', {max_rows}, '1 hour')"))
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (id, token) = l.split_once('|').unwrap();
            (id.to_owned(), token.to_owned())
        })
        .collect()
}

fn claimed_ids(claimed: &[(String, String)]) -> Vec<&str> {
    claimed.iter().map(|(id, _)| id.as_str()).collect()
}

/// Every delivery as `handler:event id:state:attempts:last error code:leased`, by handler
/// and arrival.
fn deliveries(w: &World) -> String {
    w.sql(
        "SELECT string_agg(concat_ws(':', handler, event_id, state, attempts, coalesce(last_error_code, '-'),
                                     lease_until IS NOT NULL), ',' ORDER BY handler, seq)
         FROM inbox.deliveries",
    )
}

/// What [`deliveries`] says when the states are `billing` (per event, in order) and every
/// shipping delivery pending and untouched.
fn expected(billing: &[&str]) -> String {
    let mut rows: Vec<String> =
        billing.iter().enumerate().map(|(i, s)| format!("billing:{}:{s}", event_id(i))).collect();
    rows.extend((0..EVENTS).map(|i| format!("shipping:{}:pending:0:-:f", event_id(i))));
    rows.join(",")
}

/// billing's deliveries once the worker below has failed and completed them.
const REVIEWED: [&str; EVENTS] = [
    "review_required:1:http_503:f",
    "review_required:1:http_503:f",
    "review_required:1:http_503:f",
    "review_required:1:http_503:f",
    "review_required:1:http_503:f",
    "review_required:1:http_503:f",
    "review_required:1:validation.bad_sku:f",
    "review_required:1:validation.bad_sku:f",
    "done:0:-:f",
    "pending:0:-:t",
];

/// The inbox's API answer to `GET path` with the viewer's token, as JSON (200 asserted).
fn read(addr: &str, path: &str) -> serde_json::Value {
    let (code, body) = request(addr, "GET", path, Some(VIEWER_TOKEN), "");
    assert_eq!(code, 200, "GET {path}: {body}");
    assert!(!body.contains(PAYLOAD_MARKER), "a payload in GET {path}: {body}");
    json(&body)
}

/// `POST path` with the operator's token: (status, JSON body).
fn act(addr: &str, path: &str, body: &str) -> (u16, serde_json::Value) {
    let (code, answer) = request(addr, "POST", path, Some(OPERATOR_TOKEN), body);
    assert!(!answer.contains(PAYLOAD_MARKER), "a payload in POST {path}: {answer}");
    (code, json(&answer))
}

/// A 4xx error answer with its error saying `what` and a hint saying `hint`.
fn refused_with(answer: (u16, serde_json::Value), status: u16, what: &str, hint: &str) {
    let (code, body) = answer;
    assert_eq!(code, status, "{body}");
    assert!(body["error"].as_str().is_some_and(|e| e.contains(what)), "wanted {what:?} in the error: {body}");
    assert!(body["hint"].as_str().is_some_and(|h| h.contains(hint)), "wanted {hint:?} in the hint: {body}");
}

/// One consuming `walpost inbox` with its admin listener, ten records stored and two
/// handlers registered: `billing` (max_attempts 1) and `shipping`.
struct Inbox {
    w: World,
    p: Walpost,
    addr: String,
    dir: std::path::PathBuf,
    topic: String,
}

fn consuming_inbox(name: &str) -> Inbox {
    let w = World::new(name);
    let dir = scratch(name);
    let topic = format!("{}payments", w.topic_prefix);
    create_topic(&topic, 1);
    let records: Vec<(String, Option<String>, Vec<u8>)> = (0..EVENTS)
        .map(|i| {
            let value = format!(r#"{{"n": {i}, "card": "{PAYLOAD_MARKER}"}}"#);
            (format!("customer-{i}"), Some(event_id(i)), value.into_bytes())
        })
        .collect();
    produce(&w.kafka_bootstrap, &topic, &records);
    let addr = format!("127.0.0.1:{}", testkit::free_port());
    let mut args = inbox_args(&w, &topic, "svc", &["--create-schema"]);
    args.extend(admin_flags(&addr, &dir));
    let p = start_inbox(&args, &[]);
    wait_for_messages(&w, EVENTS as i64, &p);
    // Registered after the records are stored: each gets every stored message.
    for (handler, max_attempts) in [("billing", 1), ("shipping", 5)] {
        w.sql(&format!(
            "SELECT inbox.register_handler('{handler}', '{{}}', '{{}}', {max_attempts}, '1 second', '1 minute', false)"
        ));
    }
    Inbox { w, p, addr, dir, topic }
}

/// billing's worker: claims all ten, fails six with http_503 and two with
/// validation.bad_sku (max_attempts 1: each goes to review), completes one and keeps the
/// last one leased.
fn billing_worker_fails_some(w: &World) {
    let claimed = claim(w, "billing", 100);
    assert_eq!(claimed_ids(&claimed), (0..EVENTS).map(event_id).collect::<Vec<_>>());
    for (i, (id, token)) in claimed.iter().enumerate() {
        let call = match i {
            0..=5 => format!("inbox.fail('billing', '{id}', '{token}', 'http_503')"),
            6 | 7 => format!("inbox.fail('billing', '{id}', '{token}', 'validation.bad_sku')"),
            8 => format!("inbox.complete('billing', '{id}', '{token}')::text"),
            _ => continue,
        };
        let state = w.sql(&format!("SELECT {call}"));
        assert_eq!(state, if i == 8 { "true" } else { "review_required" }, "{id}");
    }
    assert_eq!(deliveries(w), expected(&REVIEWED));
}

/// Without a token every route is 401; a viewer reads (200) and is refused every action
/// (403, nothing changed); an operator reads too.
fn tokens_and_roles(inbox: &Inbox) {
    let addr = &inbox.addr;
    let reads = [
        "/api/v1/inbox/status",
        "/api/v1/inbox/handlers",
        "/api/v1/inbox/handlers/billing/review",
        "/api/v1/inbox/handlers/billing/review?group_by=error_code",
    ];
    let actions = [
        ("retry", r#"{"error_code": "http_503"}"#),
        ("dismiss", r#"{"event_ids": ["adm-0"]}"#),
        ("pause", ""),
        ("resume", ""),
    ];
    let posts: Vec<(String, &str)> =
        actions.iter().map(|(a, body)| (format!("/api/v1/inbox/handlers/billing/{a}"), *body)).collect();
    for (method, path, body) in
        reads.iter().map(|p| ("GET", p.to_string(), "")).chain(posts.iter().map(|(p, b)| ("POST", p.clone(), *b)))
    {
        for token in [None, Some("not-a-token")] {
            let (code, answer) = request(addr, method, &path, token, body);
            assert_eq!(code, 401, "{method} {path} with {token:?}: {answer}");
            assert!(json(&answer)["hint"].as_str().unwrap().contains("Bearer"), "{answer}");
        }
    }
    for path in reads {
        read(addr, path);
        let (code, body) = request(addr, "GET", path, Some(OPERATOR_TOKEN), "");
        assert_eq!(code, 200, "an operator reads {path}: {body}");
    }
    for (path, body) in &posts {
        let (code, answer) = request(addr, "POST", path, Some(VIEWER_TOKEN), body);
        assert_eq!(code, 403, "a viewer's POST {path}: {answer}");
        assert!(json(&answer)["hint"].as_str().unwrap().contains("operator"), "{answer}");
    }
    assert_eq!(deliveries(&inbox.w), expected(&REVIEWED), "a viewer changed nothing");
    assert_eq!(inbox.w.sql("SELECT paused FROM inbox.handlers WHERE name = 'billing'"), "f");
}

/// The handlers at a glance and billing's review queue, grouped and listed.
fn handlers_and_review(addr: &str) {
    let handlers = read(addr, "/api/v1/inbox/handlers");
    let list = handlers["handlers"].as_array().unwrap();
    assert_eq!(list.len(), 2, "{handlers}");
    let (billing, shipping) = (&list[0], &list[1]);
    assert_eq!(billing["handler"], "billing", "{handlers}");
    // Pending: adm-9 (leased); review: eight with one attempt each; adm-8 is done.
    let numbers = |h: &serde_json::Value| {
        ["backlog", "leased", "review_required", "attempts", "leases_lost"].map(|k| h[k].as_i64().unwrap())
    };
    assert_eq!(numbers(billing), [1, 1, 8, 8, 0], "{billing}");
    assert_eq!(billing["paused"], false, "{billing}");
    assert!(billing["oldest_pending_seconds"].as_f64().is_some_and(|s| s > 0.0), "{billing}");
    assert_eq!(shipping["handler"], "shipping", "{handlers}");
    assert_eq!(numbers(shipping), [10, 0, 0, 0, 0], "{shipping}");
    assert_eq!(shipping["paused"], false, "{shipping}");

    let grouped = read(addr, "/api/v1/inbox/handlers/billing/review?group_by=error_code");
    assert_eq!(grouped["handler"], "billing", "{grouped}");
    let groups = grouped["groups"].as_array().unwrap();
    let summary: Vec<(String, i64, Vec<String>)> = groups
        .iter()
        .map(|g| {
            let ids = g["sample_event_ids"].as_array().unwrap().iter().map(|i| i.as_str().unwrap().to_owned());
            (g["error_code"].as_str().unwrap().to_owned(), g["count"].as_i64().unwrap(), ids.collect())
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("http_503".to_owned(), 6, (0..6).map(event_id).collect::<Vec<_>>()),
            ("validation.bad_sku".to_owned(), 2, vec![event_id(6), event_id(7)])
        ],
        "{grouped}"
    );
    for g in groups {
        let (first, last) = (g["first_at"].as_str().unwrap(), g["last_at"].as_str().unwrap());
        assert!(first.ends_with('Z') && first <= last, "{g}");
    }

    let listed = read(addr, "/api/v1/inbox/handlers/billing/review");
    assert_eq!(listed["limit"], 100, "the default limit: {listed}");
    let messages = listed["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 8, "{listed}");
    for (i, m) in messages.iter().enumerate() {
        let code = if i < 6 { "http_503" } else { "validation.bad_sku" };
        assert_eq!(m["event_id"], event_id(i).as_str(), "{m}");
        assert_eq!((m["partition"].as_i64(), m["offset"].as_i64()), (Some(0), Some(i as i64)), "{m}");
        assert_eq!((m["event_type"].as_str(), m["attempts"].as_i64()), (Some("T"), Some(1)), "{m}");
        assert_eq!(m["last_error_code"], code, "{m}");
        assert!(m.get("payload").is_none(), "no payload in a listing: {m}");
    }
    let one = read(addr, "/api/v1/inbox/handlers/billing/review?error_code=validation.bad_sku&limit=1");
    let one = one["messages"].as_array().unwrap();
    assert_eq!(one.iter().map(|m| m["event_id"].as_str().unwrap()).collect::<Vec<_>>(), ["adm-6"]);
    let nobody = read(addr, "/api/v1/inbox/handlers/nobody/review?group_by=error_code");
    assert!(nobody["groups"].as_array().is_some_and(Vec::is_empty), "an unknown handler's queue: {nobody}");
}

/// Retry by error code, dismiss by ids (a pending one among them is left alone), each
/// checked in SQL; an unknown handler's count is 0.
fn retry_and_dismiss(inbox: &Inbox) {
    let (addr, w) = (&inbox.addr, &inbox.w);
    let (code, body) = act(addr, "/api/v1/inbox/handlers/billing/retry", r#"{"error_code": "http_503"}"#);
    assert_eq!((code, &body), (200, &serde_json::json!({ "count": 6 })));
    let mut states = REVIEWED;
    states[..6].fill("pending:0:-:f");
    assert_eq!(deliveries(w), expected(&states), "the six back to pending, due now; the rest as it was");

    // adm-6 in review, adm-0 pending since the retry, an id the inbox never saw.
    let (code, body) =
        act(addr, "/api/v1/inbox/handlers/billing/dismiss", r#"{"event_ids": ["adm-6", "adm-0", "nope"]}"#);
    assert_eq!((code, &body), (200, &serde_json::json!({ "count": 1 })));
    states[6] = "dismissed:1:validation.bad_sku:f";
    assert_eq!(deliveries(w), expected(&states), "adm-6 dismissed, adm-0 left pending");
    assert_eq!(w.sql("SELECT count(*) FROM inbox.receipts WHERE event_id = 'adm-6'"), "0", "closed without a receipt");

    let (code, body) = act(addr, "/api/v1/inbox/handlers/nobody/retry", r#"{"error_code": "http_503"}"#);
    assert_eq!((code, &body), (200, &serde_json::json!({ "count": 0 })));
    assert_eq!(deliveries(w), expected(&states));
}

/// Paused, billing's claim gets nothing while shipping's gets its rows; resumed, billing's
/// claim gets the six retried. An unknown handler is a 404.
fn pause_and_resume(inbox: &Inbox) {
    let (addr, w) = (&inbox.addr, &inbox.w);
    let (code, body) = act(addr, "/api/v1/inbox/handlers/billing/pause", "");
    assert_eq!((code, &body), (200, &serde_json::json!({ "paused": true })));
    let handlers = read(addr, "/api/v1/inbox/handlers");
    let paused: Vec<bool> = handlers["handlers"].as_array().unwrap().iter().map(|h| h["paused"] == true).collect();
    assert_eq!(paused, [true, false], "{handlers}");
    assert_eq!(claim(w, "billing", 100), Vec::<(String, String)>::new(), "a paused handler is offered nothing");
    let shipping = claim(w, "shipping", 3);
    assert_eq!(claimed_ids(&shipping), ["adm-0", "adm-1", "adm-2"], "another handler still gets rows");

    let (code, body) = act(addr, "/api/v1/inbox/handlers/billing/resume", "");
    assert_eq!((code, &body), (200, &serde_json::json!({ "paused": false })));
    let billing = claim(w, "billing", 100);
    assert_eq!(claimed_ids(&billing), (0..6).map(event_id).collect::<Vec<_>>(), "the retried six, due now");
    assert_eq!(inbox.w.sql("SELECT paused FROM inbox.handlers WHERE name = 'billing'"), "f");

    refused_with(
        act(addr, "/api/v1/inbox/handlers/nobody/pause", ""),
        404,
        "no handler nobody in the inbox",
        "GET /api/v1/inbox/handlers",
    );
}

/// Bad bodies, queries and routes: a 4xx JSON error saying what is wrong and what to send,
/// never the body's text; nothing changed.
fn bad_input(inbox: &Inbox) {
    let (addr, w) = (&inbox.addr, &inbox.w);
    let before = deliveries(w);
    let retry = "/api/v1/inbox/handlers/billing/retry";
    let dismiss = "/api/v1/inbox/handlers/billing/dismiss";
    let shape = r#"{"event_ids": ["..."]} or {"error_code": "..."}"#;
    let unterminated = format!(r#"{{"error_code": "{PAYLOAD_MARKER}"#);
    refused_with(act(addr, retry, &unterminated), 400, "the body ends before its JSON does", shape);
    refused_with(act(addr, retry, "error_code=http_503"), 400, "the body is not valid JSON", shape);
    let unknown_field = format!(r#"{{"payload": "{PAYLOAD_MARKER}"}}"#);
    refused_with(act(addr, dismiss, &unknown_field), 400, "does not have the expected fields", shape);
    refused_with(
        act(addr, retry, r#"{"event_ids": ["adm-7"], "error_code": "validation.bad_sku"}"#),
        400,
        "both event_ids and error_code",
        shape,
    );
    refused_with(act(addr, dismiss, "{}"), 400, "neither event_ids nor error_code", shape);
    refused_with(act(addr, dismiss, ""), 400, "the body ends before its JSON does", shape);
    refused_with(act(addr, dismiss, r#"{"event_ids": []}"#), 400, "event_ids is empty", shape);
    // Refused by the SQL API's check, which names the rule and not the value.
    let (code, body) = act(addr, retry, r#"{"error_code": "the card was declined"}"#);
    refused_with((code, body.clone()), 400, "an error code is a short code", "change the request");
    assert!(!body.to_string().contains("declined"), "{body}");
    assert_eq!(deliveries(w), before, "a refused action changed nothing");

    for (query, what, hint) in [
        ("group_by=topic", "group_by=topic is not a grouping", "group_by=error_code"),
        ("limit=0", "limit=0 is not a number of messages", "limit is 1 to 10000"),
        ("payload=true", "unknown query parameter payload", "payloads are not served"),
        ("group_by=error_code&error_code=x", "group_by and error_code together", "group"),
    ] {
        let (code, body) =
            request(addr, "GET", &format!("/api/v1/inbox/handlers/billing/review?{query}"), Some(VIEWER_TOKEN), "");
        refused_with((code, json(&body)), 400, what, hint);
    }
    for (method, path) in [("GET", "/api/v1/inbox/nothing"), ("POST", "/api/v1/inbox/handlers/billing/explode")] {
        let (code, body) = request(addr, method, path, Some(OPERATOR_TOKEN), "{}");
        refused_with((code, json(&body)), 404, &format!("no such route: {path}"), "/api/v1/inbox/handlers");
    }
    let (code, body) = request(addr, "GET", retry, Some(OPERATOR_TOKEN), "");
    refused_with((code, json(&body)), 405, "GET is not allowed here", "POST");
    assert_eq!(deliveries(w), before);
}

/// Every route of `walpost inbox`'s API against a consuming inbox, from tokens to audit.
#[test]
fn inbox_admin_reviews_retries_dismisses_and_pauses_handlers_audited() {
    let mut inbox = consuming_inbox("inbox-admin");
    billing_worker_fails_some(&inbox.w);
    let deadline = Instant::now() + TIMEOUT;
    let status = loop {
        let status = read(&inbox.addr, "/api/v1/inbox/status");
        // The assignment and the lag come with librdkafka's statistics (every 10 s).
        let lags = status["consumer_lag"].as_array().map_or(0, Vec::len);
        if status["state"] == "consuming" && status["assigned_partitions"] == 1 && lags == 1 {
            break status;
        }
        if Instant::now() > deadline {
            break status;
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    };
    assert_eq!((status["state"].as_str(), status["group"].as_str()), (Some("consuming"), Some("svc")), "{status}");
    assert_eq!((status["assigned_partitions"].as_i64(), status["records_stored"].as_u64()), (Some(1), Some(10)));
    let lag = &status["consumer_lag"][0];
    assert!(lag["topic"] == inbox.topic.as_str() && lag["partition"] == 0 && lag["lag"] == 0, "{status}");
    assert!(status["halted_reason"].is_null(), "{status}");
    // Sampled every 5 s from the start: the 10 records stored in the first minute make
    // the rate positive once a second sample is taken, and at most 10 a second.
    let deadline = Instant::now() + std::time::Duration::from_secs(20);
    let rate = loop {
        let s = read(&inbox.addr, "/api/v1/inbox/status");
        match s["records_per_second"].as_f64() {
            Some(r) if r > 0.0 => break r,
            _ if Instant::now() > deadline => panic!("no records_per_second above 0 in 20 s: {s}"),
            _ => std::thread::sleep(std::time::Duration::from_millis(500)),
        }
    };
    assert!(rate <= 10.0, "10 records over at least a second: {rate}");

    tokens_and_roles(&inbox);
    handlers_and_review(&inbox.addr);
    retry_and_dismiss(&inbox);
    pause_and_resume(&inbox);
    bad_input(&inbox);

    // One row per action (reads and unauthenticated requests are none): the token's name
    // and role, the route, the handler and selection, the result.
    let route = |a: &str| format!("POST /api/v1/inbox/handlers/{{handler}}/{a}");
    let mut want: Vec<String> = ["retry", "dismiss", "pause", "resume"]
        .iter()
        .map(|a| format!("grafana|viewer|{}|handler=billing|forbidden", route(a)))
        .collect();
    want.extend([
        format!("oncall|operator|{}|handler=billing error_code=http_503|ok", route("retry")),
        format!("oncall|operator|{}|handler=billing event_ids=3 (adm-6,adm-0,nope)|ok", route("dismiss")),
        format!("oncall|operator|{}|handler=nobody error_code=http_503|ok", route("retry")),
        format!("oncall|operator|{}|handler=billing|ok", route("pause")),
        format!("oncall|operator|{}|handler=billing|ok", route("resume")),
        format!("oncall|operator|{}|handler=nobody|refused (404)", route("pause")),
    ]);
    for a in ["retry", "retry", "dismiss", "retry", "dismiss", "dismiss", "dismiss"] {
        want.push(format!("oncall|operator|{}|handler=billing|refused (400)", route(a)));
    }
    want.push(format!(
        "oncall|operator|{}|handler=billing error_code=(not a code, 21 characters)|refused (400)",
        route("retry")
    ));
    let audit = inbox.w.sql(
        "SELECT string_agg(concat_ws('|', token_name, role, action, target, result), E'\\n' ORDER BY at)
         FROM inbox.admin_audit",
    );
    assert_eq!(audit, want.join("\n"));
    assert_eq!(inbox.w.sql("SELECT count(*) FROM inbox.admin_audit WHERE at > now() - interval '5 minutes'"), "18");
    for secret in [VIEWER_TOKEN, OPERATOR_TOKEN, PAYLOAD_MARKER, "card was declined"] {
        assert!(!audit.contains(secret), "{secret} in the audit rows:\n{audit}");
    }

    assert!(inbox.p.terminate(TIMEOUT).is_some_and(|s| s.success()), "{}", inbox.p.log_text());
    let log = strip_ansi(&inbox.p.log_text());
    assert!(log.contains("serving the admin API on http://"), "{log}");
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("admin action")).collect();
    assert_eq!(lines.len(), 18, "one log line per action:\n{log}");
    for needle in [
        "token_name=oncall",
        "token_name=grafana",
        "target=handler=billing error_code=http_503",
        "target=handler=billing event_ids=3 (adm-6,adm-0,nope)",
        "result=refused (404)",
    ] {
        assert!(lines.iter().any(|l| l.contains(needle)), "no audit line with {needle:?}:\n{}", lines.join("\n"));
    }
    // A refused error code may be a message's text: recorded by its length only.
    for secret in [VIEWER_TOKEN, OPERATOR_TOKEN, PAYLOAD_MARKER, "card was declined"] {
        assert!(!log.contains(secret), "{secret} in the log:\n{log}");
    }
    let _ = std::fs::remove_dir_all(&inbox.dir);
}
