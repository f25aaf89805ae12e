//! `walpost ctl` (docs/control-plane.md, "walpost ctl") as an operator runs it: the
//! binary against `walpost run`'s and `walpost inbox`'s admin listeners on a real
//! PostgreSQL and Kafka. Status, pause and resume of the relay (the pause holds events
//! out of Kafka, the resume delivers them); a replay started, followed, listed and
//! stopped; a viewer's refusal with the API's hint (exit 1); no token, an unreachable
//! listener (exit 2); the token from the environment or a file; HTTPS with a private CA.
//! Dead letters listed and redriven by id and by reason after the contract is relaxed.
//! The inbox's handlers, a handler paused and resumed, its review queue grouped, retried
//! by error code and dismissed by id, checked in SQL: by the commands of the inbox
//! runbooks as written (their `drill=ctl-...` blocks). No output ever holds a token.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use super::admin::{json, request, scratch, status_when, tokens_file, OPERATOR_TOKEN, TIMEOUT, VIEWER_TOKEN};
use super::drills::{sh_ok, Runbook};
use super::inbox_ingest::{create_topic, inbox_args, start_inbox};
use crate::support::*;

/// What one `walpost ctl` run gave.
struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs `walpost ctl ARGS` with only the `WALPOST_ADMIN_*` variables of `env` set, and
/// checks that neither token is in its output.
fn ctl(args: &[&str], env: &[(&str, &str)]) -> Ran {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_walpost"));
    cmd.arg("ctl").args(args);
    for name in ["WALPOST_ADMIN_URL", "WALPOST_ADMIN_TOKEN", "WALPOST_ADMIN_TOKEN_FILE", "WALPOST_ADMIN_CA_FILE"] {
        cmd.env_remove(name);
    }
    cmd.envs(env.iter().copied());
    let out = cmd.output().unwrap();
    let ran = Ran {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    };
    for token in [VIEWER_TOKEN, OPERATOR_TOKEN] {
        assert!(!ran.stdout.contains(token) && !ran.stderr.contains(token), "a token in the output of {args:?}");
    }
    ran
}

/// `walpost ctl ARGS` that must succeed: its JSON.
fn ctl_ok(args: &[&str], env: &[(&str, &str)]) -> serde_json::Value {
    let ran = ctl(args, env);
    assert_eq!(ran.code, 0, "walpost ctl {args:?}: {}{}", ran.stdout, ran.stderr);
    assert!(ran.stderr.is_empty(), "walpost ctl {args:?} wrote to stderr: {}", ran.stderr);
    json(&ran.stdout)
}

fn token_file(dir: &Path, token: &str) -> String {
    let path = dir.join("operator-token");
    std::fs::write(&path, format!("{token}\n")).unwrap();
    path.display().to_string()
}

fn migration(name: &str) -> String {
    std::fs::read_to_string(format!("{}/../../migrations/outbox/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

#[test]
fn ctl_reads_status_pauses_and_resumes_the_relay_with_clear_refusals() {
    let w = World::new("ctl-relay");
    let dir = scratch("ctl-relay");
    w.sql(&migration("0004_admin_audit.sql"));
    w.sql(&migration("0005_pause.sql"));
    w.sql(&format!("GRANT INSERT, SELECT ON events.walpost_admin_audit TO {};", w.role));
    w.sql(&format!("GRANT SELECT, INSERT, UPDATE, DELETE ON events.walpost_pauses TO {};", w.role));
    let addr = format!("127.0.0.1:{}", testkit::free_port());
    let url = format!("http://{addr}");
    let mut args = w.args();
    args.extend([
        "--admin-addr".into(),
        addr.clone(),
        "--admin-tokens-file".into(),
        tokens_file(&dir).display().to_string(),
    ]);
    let p = Walpost::start(&args, &[]);
    assert!(w.wait_for_slot(TIMEOUT), "slot not created:\n{}", p.log_text());
    insert_batches(&w, 0, 1, 5, 5, &["order"]);
    consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 5, TIMEOUT);
    status_when(&addr, "streaming", &p);

    let viewer = [("WALPOST_ADMIN_TOKEN", VIEWER_TOKEN)];
    let status = ctl_ok(&["--admin", &url, "status"], &viewer);
    assert_eq!((status["state"].as_str(), status["slot"].as_str()), (Some("streaming"), Some(w.slot.as_str())));
    // The URL from the environment, the JSON pretty for people and jq alike.
    let ran = ctl(&["status"], &[("WALPOST_ADMIN_URL", &url), ("WALPOST_ADMIN_TOKEN", VIEWER_TOKEN)]);
    assert!(ran.code == 0 && ran.stdout.starts_with("{\n  \""), "{}{}", ran.stdout, ran.stderr);

    // A viewer may not act: exit 1 with the API's error and hint; nothing paused.
    let ran = ctl(&["--admin", &url, "pause"], &viewer);
    assert_eq!(ran.code, 1, "{}{}", ran.stdout, ran.stderr);
    assert!(ran.stdout.is_empty(), "{}", ran.stdout);
    assert!(ran.stderr.contains("HTTP 403") && ran.stderr.contains("a viewer token may only read"), "{}", ran.stderr);
    assert!(ran.stderr.contains("hint: actions need a token with the role operator"), "{}", ran.stderr);
    // A token the listener does not know: 401, exit 1.
    let ran = ctl(&["--admin", &url, "status"], &[("WALPOST_ADMIN_TOKEN", "not-a-known-token")]);
    assert!(ran.code == 1 && ran.stderr.contains("HTTP 401") && ran.stderr.contains("hint:"), "{}", ran.stderr);
    assert!(!ran.stderr.contains("not-a-known-token"), "{}", ran.stderr);
    // No token at all: exit 2 before anything is sent, saying where a token comes from.
    let ran = ctl(&["--admin", &url, "pause"], &[]);
    assert_eq!(ran.code, 2, "{}{}", ran.stdout, ran.stderr);
    assert!(ran.stderr.contains("WALPOST_ADMIN_TOKEN") && ran.stderr.contains("--token-file"), "{}", ran.stderr);
    // A token on the command line is not a thing walpost ctl takes.
    let ran = ctl(&["--admin", &url, "--token", OPERATOR_TOKEN, "status"], &[]);
    assert_eq!(ran.code, 2, "{}", ran.stderr);
    // Nobody listening: exit 2, naming the URL.
    let closed = format!("http://127.0.0.1:{}", testkit::free_port());
    let ran = ctl(&["--admin", &closed, "status"], &viewer);
    assert!(ran.code == 2 && ran.stderr.contains("cannot reach the admin API at") && ran.stderr.contains(&closed));
    assert_eq!(w.sql("SELECT count(*) FROM events.walpost_pauses"), "0");

    // The operator's token from a file: pause, and the status says so.
    let file = token_file(&dir, OPERATOR_TOKEN);
    let operator = [("WALPOST_ADMIN_TOKEN_FILE", file.as_str())];
    let paused = ctl_ok(&["--admin", &url, "pause"], &operator);
    assert_eq!((paused["state"].as_str(), paused["paused_by"].as_str()), (Some("paused"), Some("oncall")), "{paused}");
    let deadline = Instant::now() + TIMEOUT;
    while ctl_ok(&["--admin", &url, "status"], &viewer)["state"] != "paused" {
        assert!(Instant::now() < deadline, "the status never said paused:\n{}", p.log_text());
        std::thread::sleep(Duration::from_millis(250));
    }
    let status = ctl_ok(&["--admin", &url, "--token-file", &file, "status"], &[]);
    assert!(status["paused_by"].as_str().is_some_and(|b| b.starts_with("by oncall since")), "{status}");
    insert_batches(&w, 1, 1, 5, 5, &["order"]);
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(read_all(&w.kafka_bootstrap, &w.topic_prefix).len(), 5, "events reached Kafka while paused");

    // Resume: the held events arrive, each once.
    let resumed = ctl_ok(&["--admin", &url, "resume"], &operator);
    assert_eq!(resumed["state"], "resumed", "{resumed}");
    let records = wait_for_every_committed(&w, TIMEOUT);
    let a = audit(&w, &records);
    assert!(a.duplicates == 0 && a.phantoms.is_empty() && records.len() == 10, "{a:?}");
    assert_eq!(ctl_ok(&["--admin", &url, "status"], &viewer)["state"], "streaming");

    // A replay of the orders beside the stream: started, followed to its end, stopped
    // (it has ended: nothing changes), listed; each record once more, with its header.
    let ran = ctl(&["--admin", &url, "replay", "start", "--where", "aggregate_type = 'order'"], &viewer);
    assert!(ran.code == 1 && ran.stderr.contains("HTTP 403"), "{}", ran.stderr);
    let started = ctl_ok(
        &["--admin", &url, "replay", "start", "--where", "aggregate_type = 'order'", "--id", "ctl-r1"],
        &operator,
    );
    assert_eq!((started["id"].as_str(), started["state"].as_str()), (Some("ctl-r1"), Some("running")), "{started}");
    let deadline = Instant::now() + TIMEOUT;
    let done = loop {
        let r = ctl_ok(&["--admin", &url, "replay", "show", "ctl-r1"], &viewer);
        if r["state"] != "running" {
            break r;
        }
        assert!(Instant::now() < deadline, "the replay never ended: {r}\n{}", p.log_text());
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!((done["state"].as_str(), done["events_published"].as_u64()), (Some("done"), Some(10)), "{done}");
    let replayed = read_all(&w.kafka_bootstrap, &w.topic_prefix)
        .iter()
        .filter(|r| r.header("walpost.replay") == Some(b"ctl-r1".as_slice()))
        .count();
    assert_eq!(replayed, 10);
    let listed = ctl_ok(&["--admin", &url, "replay", "list"], &viewer);
    assert!(listed["replays"].as_array().is_some_and(|l| l.iter().any(|r| r["id"] == "ctl-r1")), "{listed}");
    assert_eq!(ctl_ok(&["--admin", &url, "replay", "stop", "ctl-r1"], &operator)["state"], "done");
    // A condition outside the grammar: the API's 400 and hint, nothing started.
    let ran = ctl(&["--admin", &url, "replay", "start", "--where", "pg_sleep(1) IS NULL"], &operator);
    assert!(ran.code == 1 && ran.stderr.contains("HTTP 400") && ran.stderr.contains("hint: "), "{}", ran.stderr);
    let ran = ctl(&["--admin", &url, "replay", "show", "no-such-replay"], &viewer);
    assert!(ran.code == 1 && ran.stderr.contains("HTTP 404"), "{}", ran.stderr);

    assert_eq!(
        w.sql(
            "SELECT string_agg(concat_ws('|', token_name, action, result), E'\\n' ORDER BY at)
             FROM events.walpost_admin_audit WHERE action LIKE '%/pause' OR action LIKE '%/resume'"
        ),
        "grafana|POST /api/v1/pause|forbidden\noncall|POST /api/v1/pause|ok\noncall|POST /api/v1/resume|ok"
    );
    let log = p.log_text();
    assert!(!log.contains(OPERATOR_TOKEN) && !log.contains(VIEWER_TOKEN), "a token in the log");
}

/// `OrderPlaced.json` in `dir`, its `amount` as given.
fn order_schema(dir: &Path, amount: &str) {
    std::fs::write(
        dir.join("OrderPlaced.json"),
        format!(
            r#"{{"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
                "required": ["amount"], "properties": {{"amount": {amount}}}}}"#
        ),
    )
    .unwrap();
}

#[test]
fn ctl_lists_dead_letters_and_redrives_them_by_id_and_by_reason() {
    let w = World::new("ctl-dlq");
    let dir = scratch("ctl-dlq");
    super::admin_dead_letters::redrive_tables(&w);
    let contracts = dir.join("contracts");
    std::fs::create_dir_all(&contracts).unwrap();
    order_schema(&contracts, r#"{"type": "integer"}"#);
    let dlq = format!("{}dead", w.topic_prefix);
    let config = dir.join("walpost.toml");
    std::fs::write(
        &config,
        format!(
            "on_permanent_error = \"dead_letter\"\ndead_letter_topic = \"{dlq}\"\n[contracts]\ndir = \"{}\"\n",
            contracts.display()
        ),
    )
    .unwrap();
    let addr = format!("127.0.0.1:{}", testkit::free_port());
    let mut args = vec!["--config".to_owned(), config.display().to_string()];
    args.extend(w.args());
    args.extend([
        "--admin-addr".into(),
        addr.clone(),
        "--admin-tokens-file".into(),
        tokens_file(&dir).display().to_string(),
    ]);
    let p = Walpost::start(&args, &[]);
    assert!(w.wait_for_slot(TIMEOUT), "slot not created:\n{}", p.log_text());
    status_when(&addr, "streaming", &p);

    let insert = |payload: &str| {
        w.sql(&format!(
            "INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload)
             VALUES ('order', '00000000-0000-4000-8000-000000000001', 'OrderPlaced', '{payload}') RETURNING id"
        ))
        .trim()
        .to_owned()
    };
    let passes_later = insert(r#"{"amount": "42", "note": "SECRET-A"}"#);
    let stays = insert(r#"{"amount": "SECRET-B"}"#);
    consume_at_least(&w.kafka_bootstrap, &dlq, 2, TIMEOUT);

    let url = format!("http://{addr}");
    let file = token_file(&dir, OPERATOR_TOKEN);
    let viewer = [("WALPOST_ADMIN_URL", url.as_str()), ("WALPOST_ADMIN_TOKEN", VIEWER_TOKEN)];
    let operator = [("WALPOST_ADMIN_URL", url.as_str()), ("WALPOST_ADMIN_TOKEN_FILE", file.as_str())];
    assert_eq!(ctl_ok(&["whoami"], &operator)["role"], "operator");

    // Listed newest first, never with a payload; a viewer's --payload is the API's 403.
    let ran = ctl(&["dead-letters", "--limit", "10"], &viewer);
    assert!(ran.code == 0 && !ran.stdout.contains("SECRET"), "{}{}", ran.stdout, ran.stderr);
    let listing = json(&ran.stdout);
    let ids: Vec<&str> =
        listing["dead_letters"].as_array().unwrap().iter().filter_map(|l| l["event_id"].as_str()).collect();
    assert_eq!(ids, [stays.as_str(), passes_later.as_str()], "{listing}");
    assert_eq!(ctl_ok(&["dead-letters", "--limit", "1"], &viewer)["dead_letters"].as_array().map(Vec::len), Some(1));
    let ran = ctl(&["dead-letters", "--payload"], &viewer);
    assert!(ran.code == 1 && ran.stderr.contains("HTTP 403") && !ran.stderr.contains("SECRET"), "{}", ran.stderr);
    let ran = ctl(&["redrive", "--event-id", &stays], &viewer);
    assert!(ran.code == 1 && ran.stderr.contains("HTTP 403"), "{}", ran.stderr);

    // The schema relaxed: digits in a string pass. Redriven by id: one arrives, one stays.
    order_schema(&contracts, r#"{"type": ["integer", "string"], "pattern": "^[0-9]+$"}"#);
    let answer = ctl_ok(&["redrive", "--event-id", &passes_later, "--event-id", &stays], &operator);
    assert_eq!((answer["redriven"].as_u64(), answer["still_refused"].as_u64()), (Some(1), Some(1)), "{answer}");
    let arrived = consume_at_least(&w.kafka_bootstrap, &w.topic("order"), 1, TIMEOUT);
    let ids: Vec<&[u8]> = arrived.iter().filter_map(|r| r.header("id")).collect();
    assert_eq!(ids, [passes_later.as_bytes()], "the redriven event once, with its id");
    // By reason: what was redriven is skipped, the one still refused is tried again.
    let answer = ctl_ok(&["redrive", "--reason", "contract_broken"], &operator);
    let results = answer["results"].as_array().unwrap();
    assert_eq!(results.len(), 1, "{answer}");
    assert_eq!(
        (results[0]["event_id"].as_str(), results[0]["result"].as_str()),
        (Some(stays.as_str()), Some("still_refused"))
    );
    let listing = ctl_ok(&["dead-letters"], &viewer);
    let redriven =
        listing["dead_letters"].as_array().unwrap().iter().find(|l| l["event_id"] == passes_later.as_str()).cloned();
    assert_eq!(redriven.map(|l| l["redrive"]["result"].clone()), Some(serde_json::json!("redriven")), "{listing}");
    let log = p.log_text();
    assert!(!log.contains(OPERATOR_TOKEN) && !log.contains(VIEWER_TOKEN), "a token in the log");
}

#[test]
fn ctl_over_https_verifies_the_listener_against_the_given_ca() {
    let w = World::new("ctl-tls");
    let dir = scratch("ctl-tls");
    let (cert, key) = (dir.join("admin.crt"), dir.join("admin.key"));
    let made = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=walpost-admin"])
        .args(["-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let port = testkit::free_port();
    let config = dir.join("walpost.toml");
    std::fs::write(
        &config,
        format!(
            "[admin]\naddr = \"127.0.0.1:{port}\"\ntokens_file = \"{}\"\ntls_cert = \"{}\"\ntls_key = \"{}\"\n",
            tokens_file(&dir).display(),
            cert.display(),
            key.display()
        ),
    )
    .unwrap();
    let mut args = vec!["--config".to_owned(), config.display().to_string()];
    args.extend(w.args());
    let p = Walpost::start(&args, &[]);
    assert!(w.wait_for_slot(TIMEOUT), "slot not created:\n{}", p.log_text());

    let ca = cert.display().to_string();
    let https = format!("https://127.0.0.1:{port}");
    let viewer = [("WALPOST_ADMIN_TOKEN", VIEWER_TOKEN)];
    let deadline = Instant::now() + TIMEOUT;
    let status = loop {
        let ran = ctl(&["--admin", &https, "--ca-file", &ca, "status"], &viewer);
        if ran.code == 0 {
            break json(&ran.stdout);
        }
        assert!(Instant::now() < deadline, "no answer over https: {}\n{}", ran.stderr, p.log_text());
        std::thread::sleep(Duration::from_millis(250));
    };
    assert_eq!(status["slot"], w.slot.as_str(), "{status}");
    // The CA from the environment, the name checked against the certificate's DNS name.
    let by_name = format!("https://localhost:{port}");
    let status = ctl_ok(&["--admin", &by_name, "status"], &[("WALPOST_ADMIN_CA_FILE", &ca), viewer[0]]);
    assert_eq!(status["slot"], w.slot.as_str(), "{status}");
    // Without the CA the certificate is not trusted: exit 2, saying what to give.
    let ran = ctl(&["--admin", &https, "status"], &viewer);
    assert_eq!(ran.code, 2, "{}{}", ran.stdout, ran.stderr);
    assert!(ran.stderr.contains("TLS with the admin API") && ran.stderr.contains("--ca-file"), "{}", ran.stderr);
    // Plain HTTP to a TLS listener gets no answer walpost ctl takes.
    let ran = ctl(&["--admin", &format!("http://127.0.0.1:{port}"), "status"], &viewer);
    assert_eq!(ran.code, 2, "{}{}", ran.stdout, ran.stderr);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Each line of a runbook's `drill=<tag>` block, filled, run in a shell with the admin
/// listener's URL and the operator's token file exported as the runbook says: its JSON.
fn runbook_lines(
    runbook: &str,
    tag: &str,
    vars: &[(&str, &str)],
    url: &str,
    token_file: &str,
) -> Vec<serde_json::Value> {
    let text = Runbook::open(runbook).block(tag).fill(vars);
    let mut answers = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let out = sh_ok(&format!("export WALPOST_ADMIN_URL='{url}' WALPOST_ADMIN_TOKEN_FILE='{token_file}'\n{line}"));
        assert!(!out.contains(OPERATOR_TOKEN), "the token in the output of {line}");
        answers.push(json(&out));
    }
    answers
}

/// A handler's deliveries as `event_id:state`, in id order.
fn states(w: &World, handler: &str) -> String {
    w.sql(&format!(
        "SELECT string_agg(event_id || ':' || state, ',' ORDER BY event_id) FROM inbox.deliveries WHERE handler = '{handler}'"
    ))
}

#[test]
fn ctl_lists_pauses_and_works_the_review_queue_of_an_inbox() {
    let w = World::new("ctl-inbox");
    let dir = scratch("ctl-inbox");
    w.sql(&inbox_migrations());
    // A name with a character the path escapes (`:`), and one to stay untouched.
    let handler = "billing:eu";
    for name in [handler, "mail"] {
        w.sql(&format!("SELECT inbox.register_handler('{name}', '{{}}', '{{}}', 1, '1 second', '1 minute', false)"));
    }
    let rows: Vec<(&str, &str, &str, &str)> =
        ["a1", "a2", "a3", "b1", "b2"].iter().map(|id| (*id, "t", "", "T")).collect();
    crate::inbox::store(&w, &rows);
    // Every message fails once (max_attempts 1): review_required, by error code.
    let claimed = w.sql(&format!("SELECT event_id, lease_token FROM inbox.claim('{handler}', 100, '1 hour')"));
    for line in claimed.lines().filter(|l| !l.is_empty()) {
        let (id, lease) = line.split_once('|').unwrap();
        let code = if id.starts_with('a') { "http_503" } else { "validation.bad_sku" };
        assert_eq!(w.sql(&format!("SELECT inbox.fail('{handler}', '{id}', '{lease}', '{code}')")), "review_required");
    }

    let topic = format!("{}ctl", w.topic_prefix);
    create_topic(&topic, 1);
    let addr = format!("127.0.0.1:{}", testkit::free_port());
    let tokens = tokens_file(&dir).display().to_string();
    let args = inbox_args(&w, &topic, "ctl-svc", &["--admin-addr", &addr, "--admin-tokens-file", &tokens]);
    let p = start_inbox(&args, &[]);
    let up =
        testkit::wait_until(TIMEOUT, || request(&addr, "GET", "/api/v1/inbox/status", Some(VIEWER_TOKEN), "").0 == 200);
    assert!(up, "the inbox's admin API never answered:\n{}", p.log_text());
    let url = format!("http://{addr}");
    let viewer = [("WALPOST_ADMIN_URL", url.as_str()), ("WALPOST_ADMIN_TOKEN", VIEWER_TOKEN)];
    let file = token_file(&dir, OPERATOR_TOKEN);
    let operator = [("WALPOST_ADMIN_URL", url.as_str()), ("WALPOST_ADMIN_TOKEN_FILE", file.as_str())];

    let status = ctl_ok(&["inbox", "status"], &viewer);
    assert_eq!(status["group"], "ctl-svc", "{status}");
    let of = |v: &serde_json::Value, name: &str| {
        v["handlers"].as_array().unwrap().iter().find(|h| h["handler"] == name).cloned().unwrap_or_default()
    };
    // runbooks/inbox-backlog.md, Diagnose: the handlers, then the ingest.
    let diagnosed = runbook_lines("inbox-backlog", "ctl-handlers", &[], &url, &file);
    let billing = of(&diagnosed[0], handler);
    assert_eq!(
        (billing["review_required"].as_i64(), billing["paused"].as_bool()),
        (Some(5), Some(false)),
        "{diagnosed:?}"
    );
    assert_eq!(of(&diagnosed[0], "mail")["backlog"].as_i64(), Some(5), "{diagnosed:?}");
    assert_eq!(diagnosed[1]["group"], "ctl-svc", "{diagnosed:?}");

    // Pause and resume, by the escaped name (runbooks/inbox-backlog.md, Act 3); a viewer may not.
    let ran = ctl(&["inbox", "pause", handler], &viewer);
    assert!(ran.code == 1 && ran.stderr.contains("HTTP 403"), "{}", ran.stderr);
    assert_eq!(w.sql(&format!("SELECT paused FROM inbox.handlers WHERE name = '{handler}'")), "f");
    let rb = Runbook::open("inbox-backlog").block("ctl-pause").fill(&[("handler", handler)]);
    let (pause, resume) = rb.trim().split_once('\n').unwrap();
    assert!(pause.contains(" pause ") && resume.contains(" resume "), "{rb}");
    let export = format!("export WALPOST_ADMIN_URL='{url}' WALPOST_ADMIN_TOKEN_FILE='{file}'\n");
    assert_eq!(json(&sh_ok(&format!("{export}{pause}")))["paused"], true);
    assert_eq!(w.sql(&format!("SELECT paused FROM inbox.handlers WHERE name = '{handler}'")), "t");
    assert_eq!(of(&ctl_ok(&["inbox", "handlers"], &viewer), handler)["paused"], true);
    assert_eq!(json(&sh_ok(&format!("{export}{resume}")))["paused"], false);
    assert_eq!(w.sql(&format!("SELECT paused FROM inbox.handlers WHERE name = '{handler}'")), "f");
    let ran = ctl(&["inbox", "pause", "nobody"], &operator);
    assert!(ran.code == 1 && ran.stderr.contains("HTTP 404"), "{}", ran.stderr);

    // runbooks/inbox-review-required.md: the queue grouped, one code's messages, then
    // a retry by error code and a dismiss by id.
    let vars = [("handler", handler), ("error-code", "validation.bad_sku"), ("event-id", "b1")];
    let review = runbook_lines("inbox-review-required", "ctl-review", &vars, &url, &file);
    let groups: Vec<String> = review[0]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| format!("{}={}", g["error_code"].as_str().unwrap_or("-"), g["count"]))
        .collect();
    assert_eq!(groups.join(","), "http_503=3,validation.bad_sku=2", "{review:?}");
    let listed: Vec<&str> =
        review[1]["messages"].as_array().unwrap().iter().filter_map(|m| m["event_id"].as_str()).collect();
    assert_eq!(listed, ["b1", "b2"], "{review:?}");
    let limited = ctl_ok(&["inbox", "review", handler, "--error-code", "http_503", "--limit", "1"], &viewer);
    assert_eq!(limited["messages"].as_array().map(Vec::len), Some(1), "{limited}");
    let retried = runbook_lines(
        "inbox-review-required",
        "ctl-retry",
        &[("handler", handler), ("error-code", "http_503")],
        &url,
        &file,
    );
    assert_eq!(retried[0]["count"], 3, "{retried:?}");
    let dismissed = runbook_lines("inbox-review-required", "ctl-dismiss", &vars, &url, &file);
    assert_eq!(dismissed[0]["count"], 1, "{dismissed:?}");
    let dismissed = ctl_ok(&["inbox", "dismiss", handler, "--event-id", "b2", "--event-id", "a1"], &operator);
    assert_eq!(dismissed["count"], 1, "only b2 waits for review: {dismissed}");
    assert_eq!(states(&w, handler), "a1:pending,a2:pending,a3:pending,b1:dismissed,b2:dismissed");
    assert_eq!(states(&w, "mail"), "a1:pending,a2:pending,a3:pending,b1:pending,b2:pending");
    assert_eq!(
        w.sql(&format!(
            "SELECT count(*) FROM inbox.admin_audit WHERE token_name = 'oncall' AND result = 'ok' AND target LIKE 'handler={handler}%'"
        )),
        "5"
    );
    let log = p.log_text();
    assert!(!log.contains(OPERATOR_TOKEN) && !log.contains(VIEWER_TOKEN), "a token in the log");
}
