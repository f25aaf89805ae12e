//! The web console of the admin listener (crates/admin/console/) in a real headless
//! Chromium (Debian's `chromium` and `chromium-driver`, driven over WebDriver by
//! `testkit::Chromedriver`), against a real `walpost run` and a real `walpost inbox`:
//! the files load without a token and carry the policy, the API does not; an operator
//! signs in, sees the slot and its state, pauses and resumes; a viewer sees no action;
//! the policy blocks inline script; an operator retries a review-required group of a
//! handler, and the rows change in SQL; a contract breach's dead letter is listed, redriven
//! from the page once the schema file is relaxed and arrives on its topic once; a replay
//! started from the page by a condition is followed to `done` with its counts; a viewer
//! sees neither redrive nor start.
//!
//! Without the browser or the driver these tests fail, saying what to install.
//! `WALPOST_CONSOLE_SCREENSHOTS=<dir>` writes the pages as PNGs there (docs/images/).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::Duration;

use testkit::{Browser, Chromedriver};

use super::admin::{json, request, scratch, status_when, tokens_file, OPERATOR_TOKEN, TIMEOUT, VIEWER_TOKEN};
use crate::inbox_ingest::{create_topic, inbox_args, start_inbox};
use crate::support::*;

const WAIT: Duration = Duration::from_secs(30);
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

fn driver() -> Chromedriver {
    Chromedriver::start().unwrap_or_else(|e| panic!("the console's browser tests cannot run: {e}"))
}

/// Writes the page as `name` when `WALPOST_CONSOLE_SCREENSHOTS` names a directory.
fn shot(b: &Browser, name: &str) {
    if let Some(dir) = std::env::var_os("WALPOST_CONSOLE_SCREENSHOTS").map(PathBuf::from) {
        std::fs::create_dir_all(&dir).unwrap();
        b.screenshot(&dir.join(name)).unwrap();
    }
}

/// GET `path` without a token: the status and the headers, lowercase names.
fn head_of(addr: &str, path: &str) -> (u16, Vec<(String, String)>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let head = out.split_once("\r\n\r\n").map(|(h, _)| h).unwrap_or_default();
    let headers = head
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    (status, headers)
}

fn header<'h>(headers: &'h [(String, String)], name: &str) -> Option<&'h str> {
    headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

/// Opens the console with a fresh tab state and signs in with `token`.
fn sign_in(b: &Browser, addr: &str, token: &str, who: &str) {
    // Forgets the tab's token on a page of the origin that runs no script of the console:
    // on the console itself a sign-in under way would store it again.
    b.navigate(&format!("http://{addr}/console/icon.svg")).unwrap();
    b.execute("sessionStorage.clear();", &[]).unwrap();
    b.navigate(&format!("http://{addr}/")).unwrap();
    let field = b.find("#token", WAIT).unwrap();
    // Typed, then Enter: the form works from the keyboard.
    b.send_keys(&field, &format!("{token}{ENTER}")).unwrap();
    b.wait_text("#identity", WAIT, |t| t == who).unwrap();
}

/// WebDriver's Enter and Escape keys.
const ENTER: char = '\u{E007}';
const ESCAPE: char = '\u{E00C}';

/// Waits until no confirmation is open.
fn wait_no_dialog(b: &Browser) {
    assert!(
        testkit::wait_until(WAIT, || b.find_all("dialog[open]").unwrap().is_empty()),
        "the confirmation stayed open"
    );
}

/// Clicks `css`, then the confirmation's button.
fn click_and_confirm(b: &Browser, css: &str) {
    b.click(&b.find(css, WAIT).unwrap()).unwrap();
    b.click(&b.find("dialog[open] #confirm", WAIT).unwrap()).unwrap();
}

fn migration(name: &str) -> String {
    std::fs::read_to_string(format!("{}/../../migrations/outbox/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

#[test]
fn console_relay_operator_pauses_and_resumes_a_viewer_sees_no_action_no_inline_script() {
    let driver = driver();
    let w = World::new("console-relay");
    let dir = scratch("console-relay");
    w.sql(&migration("0004_admin_audit.sql"));
    w.sql(&migration("0005_pause.sql"));
    w.sql(&format!(
        "GRANT INSERT, SELECT ON events.walpost_admin_audit TO {0};
         GRANT SELECT, INSERT, UPDATE, DELETE ON events.walpost_pauses TO {0};",
        w.role
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
    insert_batches(&w, 0, 1, 5, 5, &["order"]);
    consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 5, TIMEOUT);
    status_when(&addr, "streaming", &p);

    // The files load without a token, each with the policy; the API does not.
    for (path, kind) in [
        ("/", "text/html; charset=utf-8"),
        ("/console/app.js", "text/javascript; charset=utf-8"),
        ("/console/pages.js", "text/javascript; charset=utf-8"),
        ("/console/app.css", "text/css; charset=utf-8"),
        ("/console/runbooks/slot-wal-buildup.md", "text/plain; charset=utf-8"),
    ] {
        let (code, headers) = head_of(&addr, path);
        assert_eq!(code, 200, "{path}: {headers:?}");
        assert_eq!(header(&headers, "content-type"), Some(kind), "{path}");
        assert_eq!(header(&headers, "content-security-policy"), Some(CSP), "{path}");
        assert_eq!(header(&headers, "x-content-type-options"), Some("nosniff"), "{path}");
        assert_eq!(header(&headers, "referrer-policy"), Some("no-referrer"), "{path}");
        assert_eq!(header(&headers, "cache-control"), Some("no-store"), "{path}");
        assert_eq!(header(&headers, "set-cookie"), None, "{path}");
    }
    assert_eq!(request(&addr, "GET", "/api/v1/status", None, "").0, 401);
    assert_eq!(request(&addr, "GET", "/api/v1/whoami", None, "").0, 401);
    let (code, body) = request(&addr, "GET", "/api/v1/whoami", Some(VIEWER_TOKEN), "");
    assert_eq!((code, json(&body)), (200, serde_json::json!({"name": "grafana", "role": "viewer"})), "{body}");

    let b = driver.browser(1366, 860).unwrap();
    b.navigate(&format!("http://{addr}/")).unwrap();
    b.find("#token", WAIT).unwrap();
    shot(&b, "console-sign-in.png");
    // A token not in the file: the API's error and hint, still signed out.
    let field = b.find("#token", WAIT).unwrap();
    b.send_keys(&field, "not-a-token").unwrap();
    b.click(&b.find("#sign-in", WAIT).unwrap()).unwrap();
    let problem = b.wait_text("#problem", WAIT, |t| t.contains("401")).unwrap();
    assert!(problem.contains("the token is not in the tokens file") && problem.contains("Bearer"), "{problem}");

    sign_in(&b, &addr, OPERATOR_TOKEN, "oncall (operator)");
    b.wait_text("#f-state", WAIT, |t| t == "streaming").unwrap();
    b.wait_text("#f-slot", WAIT, |t| t == w.slot).unwrap();
    b.wait_text("#f-delivery", WAIT, |t| t == "at-least-once").unwrap();
    assert_eq!(b.execute("return document.cookie;", &[]).unwrap(), "", "no cookie");
    let kept = b.execute("return sessionStorage.getItem('walpost.console.token');", &[]).unwrap();
    assert_eq!(kept, OPERATOR_TOKEN, "the token is kept in the tab's sessionStorage");
    // The server's LSN comes with the monitor's first poll.
    b.wait_text("#f-server", TIMEOUT, |t| t.contains('/')).unwrap();
    shot(&b, "console-overview.png");

    // Escape backs out of the confirmation: nothing is paused.
    b.click(&b.find("#pause", WAIT).unwrap()).unwrap();
    b.send_keys(&b.find("dialog[open] #cancel", WAIT).unwrap(), &ESCAPE.to_string()).unwrap();
    wait_no_dialog(&b);
    assert_eq!(status_when(&addr, "streaming", &p)["paused_by"], serde_json::Value::Null);

    click_and_confirm(&b, "#pause");
    b.wait_text("#f-state", WAIT, |t| t == "paused").unwrap();
    let status = status_when(&addr, "paused", &p);
    assert!(status["paused_by"].as_str().is_some_and(|by| by.starts_with("by oncall since")), "{status}");
    b.wait_text("#f-paused-by", WAIT, |t| t.contains("by oncall since")).unwrap();
    assert!(b.find_all("#pause").unwrap().len() == 1 && b.find_all("#resume").unwrap().len() == 1);
    click_and_confirm(&b, "#resume");
    wait_no_dialog(&b);
    b.wait_text("#f-state", WAIT, |t| t == "streaming").unwrap();
    status_when(&addr, "streaming", &p);
    assert_eq!(
        w.sql(
            "SELECT string_agg(concat_ws('|', token_name, action, result), ',' ORDER BY at)
             FROM events.walpost_admin_audit"
        ),
        "oncall|POST /api/v1/pause|ok,oncall|POST /api/v1/resume|ok"
    );

    // A script element with inline text is refused by the policy: it never runs.
    let ran = b
        .execute(
            "window.inlineRan = false;
             const s = document.createElement('script');
             s.textContent = 'window.inlineRan = true;';
             document.head.appendChild(s);
             return window.inlineRan;",
            &[],
        )
        .unwrap();
    assert_eq!(ran, false, "an inline script ran despite the Content-Security-Policy");

    // A viewer: the same overview, no action.
    b.click(&b.find("#sign-out", WAIT).unwrap()).unwrap();
    b.find("#token", WAIT).unwrap();
    assert_eq!(b.execute("return sessionStorage.length;", &[]).unwrap(), 0, "signing out forgets the token");
    sign_in(&b, &addr, VIEWER_TOKEN, "grafana (viewer)");
    b.wait_text("#f-state", WAIT, |t| t == "streaming").unwrap();
    b.wait_text("#f-slot", WAIT, |t| t == w.slot).unwrap();
    assert!(b.find_all("#pause, #resume, button.danger").unwrap().is_empty(), "a viewer sees an action");
    assert!(p.terminate(TIMEOUT).is_some_and(|s| s.success()), "{}", p.log_text());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Messages of `handler` in review_required, each with its error code (max_attempts 1).
fn into_review(w: &World, handler: &str, failures: &[(&str, &str)]) {
    let rows: Vec<(&str, &str, &str, &str)> =
        failures.iter().map(|(id, _)| (*id, "orders", "", "OrderPlaced")).collect();
    crate::inbox::store(w, &rows);
    let claimed = w.sql(&format!("SELECT event_id || '|' || lease_token FROM inbox.claim('{handler}', 100, '1 hour')"));
    for line in claimed.lines().filter(|l| !l.is_empty()) {
        let (id, token) = line.split_once('|').unwrap();
        let code = failures.iter().find(|(i, _)| *i == id).unwrap().1;
        assert_eq!(w.sql(&format!("SELECT inbox.fail('{handler}', '{id}', '{token}', '{code}')")), "review_required");
    }
}

fn delivery_states(w: &World, handler: &str) -> String {
    w.sql(&format!(
        "SELECT string_agg(event_id || ':' || state || ':' || attempts, ',' ORDER BY event_id)
         FROM inbox.deliveries WHERE handler = '{handler}'"
    ))
}

#[test]
fn console_inbox_operator_retries_a_review_required_group() {
    let driver = driver();
    let w = World::new("console-inbox");
    w.sql(&inbox_migrations());
    let dir = scratch("console-inbox");
    let topic = format!("{}orders", w.topic_prefix);
    create_topic(&topic, 1);
    let addr = format!("127.0.0.1:{}", testkit::free_port());
    let tokens = tokens_file(&dir).display().to_string();
    let mut p =
        start_inbox(&inbox_args(&w, &topic, "svc", &["--admin-addr", &addr, "--admin-tokens-file", &tokens]), &[]);
    w.sql("SELECT inbox.register_handler('billing', '{}', '{}', 1, '1 second', '1 minute', false)");
    into_review(&w, "billing", &[("e1", "http_503"), ("e2", "http_503"), ("e3", "http_503"), ("b1", "bad_sku")]);
    assert!(
        testkit::wait_until(TIMEOUT, || request(&addr, "GET", "/api/v1/inbox/status", Some(VIEWER_TOKEN), "").0 == 200),
        "the admin listener of walpost inbox never answered:\n{}",
        p.log_text()
    );

    let b = driver.browser(1366, 860).unwrap();
    sign_in(&b, &addr, OPERATOR_TOKEN, "oncall (operator)");
    let row = b.wait_text("#handlers tbody tr", WAIT, |t| t.starts_with("billing")).unwrap();
    assert!(row.contains("Pause"), "{row}");
    b.wait_text("#f-group", WAIT, |t| t == "svc").unwrap();
    shot(&b, "console-inbox-handlers.png");
    b.click(&b.find("a[href='#/handlers/billing']", WAIT).unwrap()).unwrap();
    let groups = b.wait_text("#review-groups", WAIT, |t| t.contains("http_503") && t.contains("bad_sku")).unwrap();
    assert!(groups.contains("e1, e2, e3"), "{groups}");
    b.wait_text("#review-messages", WAIT, |t| t.contains("b1") && t.contains("e3")).unwrap();
    shot(&b, "console-inbox-review.png");

    click_and_confirm(&b, "button[data-action='retry'][data-code='http_503']");
    b.wait_text("#review-result .notice", WAIT, |t| t == "Retried 3 message(s) of http_503.").unwrap();
    assert_eq!(delivery_states(&w, "billing"), "b1:review_required:1,e1:pending:0,e2:pending:0,e3:pending:0");
    let groups = b.wait_text("#review-groups", WAIT, |t| !t.contains("http_503")).unwrap();
    assert!(groups.contains("bad_sku"), "{groups}");
    assert_eq!(
        w.sql("SELECT string_agg(token_name || '|' || action || '|' || coalesce(target, '-') || '|' || result, ',') FROM inbox.admin_audit"),
        "oncall|POST /api/v1/inbox/handlers/{handler}/retry|handler=billing error_code=http_503|ok"
    );

    // A viewer sees the queue, and neither retry nor dismiss nor pause.
    sign_in(&b, &addr, VIEWER_TOKEN, "grafana (viewer)");
    b.wait_text("#handlers tbody tr", WAIT, |t| t.starts_with("billing")).unwrap();
    assert!(b.find_all("button[data-action]").unwrap().is_empty(), "a viewer sees an action");
    b.click(&b.find("a[href='#/handlers/billing']", WAIT).unwrap()).unwrap();
    b.wait_text("#review-groups", WAIT, |t| t.contains("bad_sku")).unwrap();
    assert!(b.find_all("button[data-action]").unwrap().is_empty(), "a viewer sees an action");
    assert!(p.terminate(TIMEOUT).is_some_and(|s| s.success()), "{}", p.log_text());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn console_relay_operator_redrives_a_dead_letter_and_follows_a_replay_a_viewer_sees_no_action() {
    use super::admin_dead_letters::{config, insert, schema};

    let driver = driver();
    let w = World::new("console-dlq");
    let dir = scratch("console-dlq");
    super::admin_dead_letters::redrive_tables(&w);
    let contracts = dir.join("contracts");
    std::fs::create_dir_all(&contracts).unwrap();
    schema(&contracts, r#"{"type": "integer"}"#);
    let dlq = format!("{}dead", w.topic_prefix);
    let order = w.topic("order");
    let addr = format!("127.0.0.1:{}", testkit::free_port());
    let mut args = vec!["--config".to_string(), config(&w, &dlq, &contracts, false)];
    args.extend(w.args());
    args.extend([
        "--admin-addr".into(),
        addr.clone(),
        "--admin-tokens-file".into(),
        tokens_file(&dir).display().to_string(),
    ]);
    let mut p = Walpost::start(&args, &[]);
    assert!(w.wait_for_slot(TIMEOUT), "slot not created:\n{}", p.log_text());
    status_when(&addr, "streaming", &p);
    let valid: Vec<String> = (1..=3).map(|n| insert(&w, &format!(r#"{{"amount": {n}}}"#))).collect();
    let breach = insert(&w, r#"{"amount": "42"}"#);
    let records = consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 4, TIMEOUT);
    assert_eq!(records.iter().filter(|r| r.topic == dlq).count(), 1, "{records:?}");
    let with_id = |records: &[Consumed], topic: &str, id: &str| {
        records.iter().filter(|r| r.topic == topic && r.header("id") == Some(id.as_bytes())).count()
    };

    // The dead letter on the page, as the listing has it.
    let b = driver.browser(1366, 860).unwrap();
    sign_in(&b, &addr, OPERATOR_TOKEN, "oncall (operator)");
    b.click(&b.find("a[href='#/dead-letters']", WAIT).unwrap()).unwrap();
    let row = b.wait_text("#dead-letters tbody tr", WAIT, |t| t.contains(&breach)).unwrap();
    for part in ["OrderPlaced", order.as_str(), "contract_broken", "/amount", "not redriven"] {
        assert!(row.contains(part), "{part} missing in the row: {row}");
    }
    b.wait_text("#dl-about", WAIT, |t| t.contains(&dlq) && t.contains("payloads hidden")).unwrap();
    let reasons = b.execute("return [...document.querySelectorAll('#dl-reason option')].map((o) => o.value);", &[]);
    assert_eq!(reasons.unwrap(), serde_json::json!(["", "contract_broken"]));

    // The schema relaxed; the operator selects the dead letter and redrives it.
    schema(&contracts, r#"{"type": ["integer", "string"], "pattern": "^[0-9]+$"}"#);
    b.click(&b.find(&format!("#dead-letters input[data-event-id='{breach}']"), WAIT).unwrap()).unwrap();
    click_and_confirm(&b, "#redrive-selected");
    wait_no_dialog(&b);
    b.wait_text("#redrive-counts", WAIT, |t| {
        t == "redriven 1, still_refused 0, not_found 0, failed 0, not_attempted 0"
    })
    .unwrap();
    let result = b.wait_text("#redrive-results tbody tr", WAIT, |t| t.contains(&breach)).unwrap();
    assert!(result.contains("redriven") && result.contains(&order) && result.contains("events.outbox"), "{result}");
    b.wait_text("#dead-letters [data-redrive]", WAIT, |t| t.starts_with("redriven by oncall")).unwrap();
    shot(&b, "console-dead-letters.png");
    // All of a reason: the one dead letter of it is redriven already, so none is left.
    b.execute(
        "const s = document.getElementById('dl-reason'); s.value = 'contract_broken'; s.dispatchEvent(new Event('change'));",
        &[],
    )
    .unwrap();
    click_and_confirm(&b, "#redrive-reason");
    let problem = b.wait_text("#problem", WAIT, |t| t.contains("404")).unwrap();
    assert!(
        problem.starts_with("cannot redrive: no dead letter of reason contract_broken that was not redriven already")
            && problem.contains("What to do: GET /api/v1/dead-letters lists the reasons"),
        "{problem}"
    );

    // On its topic once; no new dead letter.
    let records = consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 5, TIMEOUT);
    std::thread::sleep(Duration::from_secs(2));
    let records = if records.len() == 5 { read_all(&w.kafka_bootstrap, &w.topic_prefix) } else { records };
    assert_eq!(records.len(), 5, "{records:?}");
    assert_eq!(with_id(&records, &order, &breach), 1, "{records:?}");
    assert_eq!(records.iter().filter(|r| r.topic == dlq).count(), 1, "no new dead letter: {records:?}");

    // A replay of the valid rows by a condition, started from the page and followed to its end.
    b.click(&b.find("a[href='#/replays']", WAIT).unwrap()).unwrap();
    b.wait_text("#replays-empty", WAIT, |t| t == "No replay since walpost started.").unwrap();
    let condition = format!("id < {breach}");
    b.send_keys(&b.find("#r-where", WAIT).unwrap(), &condition).unwrap();
    b.send_keys(&b.find("#r-id", WAIT).unwrap(), "from-console").unwrap();
    b.click(&b.find("#start-replay", WAIT).unwrap()).unwrap();
    let question = b.wait_text("dialog[open] #confirm-question", WAIT, |t| !t.is_empty()).unwrap();
    assert!(question.contains(&condition) && question.contains("from-console"), "{question}");
    b.click(&b.find("dialog[open] #confirm", WAIT).unwrap()).unwrap();
    b.wait_text("#f-replay-state", WAIT, |t| t == "done").unwrap();
    b.wait_text("#f-rows-read", WAIT, |t| t == "3").unwrap();
    b.wait_text("#f-events-published", WAIT, |t| t == "3").unwrap();
    b.wait_text("#f-selection", WAIT, |t| t == format!("where {condition}")).unwrap();
    b.click(&b.find("a[href='#/replays']", WAIT).unwrap()).unwrap();
    let listed = b.wait_text("#replays tbody tr", WAIT, |t| t.starts_with("from-console")).unwrap();
    assert!(listed.contains("done"), "{listed}");
    let records = consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 8, TIMEOUT);
    let mut replayed: Vec<String> = records
        .iter()
        .filter(|r| r.header("walpost.replay") == Some(b"from-console".as_slice()))
        .map(|r| r.event_id().to_string())
        .collect();
    replayed.sort_by_key(|id| id.parse::<i64>().unwrap());
    assert_eq!(replayed, valid, "each selected row once");

    // A viewer: the dead letter, its redrive state and the replay; no action.
    sign_in(&b, &addr, VIEWER_TOKEN, "grafana (viewer)");
    b.click(&b.find("a[href='#/dead-letters']", WAIT).unwrap()).unwrap();
    b.wait_text("#dead-letters [data-redrive]", WAIT, |t| t.starts_with("redriven by oncall")).unwrap();
    assert!(
        b.find_all("#redrive-selected, #redrive-reason, #dead-letters input, button.danger").unwrap().is_empty(),
        "a viewer sees an action"
    );
    b.click(&b.find("a[href='#/replays']", WAIT).unwrap()).unwrap();
    b.wait_text("#replays tbody tr", WAIT, |t| t.starts_with("from-console")).unwrap();
    assert!(
        b.find_all("#replay-form, #start-replay, [data-stop], button.danger").unwrap().is_empty(),
        "a viewer sees an action"
    );
    assert!(p.terminate(TIMEOUT).is_some_and(|s| s.success()), "{}", p.log_text());
    let _ = std::fs::remove_dir_all(&dir);
}
