//! The web console of the admin listener (crates/admin/console/) in a real headless
//! Chromium (Debian's `chromium` and `chromium-driver`, driven over WebDriver by
//! `testkit::Chromedriver`), against a real `walpost run` and a real `walpost inbox`:
//! the files load without a token and carry the policy, the API does not; an operator
//! signs in, sees the slot and its state, pauses and resumes; a viewer sees no action;
//! the policy blocks inline script; an operator retries a review-required group of a
//! handler, and the rows change in SQL.
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
        "oncall|POST /api/v1/inbox/handlers/{name}/retry|handler=billing error_code=http_503|ok"
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
