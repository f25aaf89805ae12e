//! `walpost run`'s admin API ([admin], docs/control-plane.md) against a real PostgreSQL
//! and Kafka: tokens and roles, the status of a streaming walpost, JSON errors, bounds
//! and a stalled client, the refusals at start, HTTPS with a certificate made by the
//! `openssl` CLI, and no token or hash in the log.
//!
//! Its actions (pause and resume, a viewer's 403 on them) are in `admin_pause.rs`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::*;

pub(crate) const VIEWER_TOKEN: &str = "e2e-viewer-7f3a9c01d2";
pub(crate) const OPERATOR_TOKEN: &str = "e2e-operator-91c2b7e44f";
pub(crate) const TIMEOUT: Duration = Duration::from_secs(60);

/// `printf %s "$TOKEN" | sha256sum`, as docs/control-plane.md makes a line.
fn sha256sum(token: &str) -> String {
    let out =
        Command::new("sh").args(["-c", "printf %s \"$1\" | sha256sum | cut -d' ' -f1", "sh", token]).output().unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

pub(crate) fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(testkit::unique_name(name));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub(crate) fn tokens_file(dir: &Path) -> PathBuf {
    let path = dir.join("admin-tokens");
    std::fs::write(
        &path,
        format!(
            "# e2e tokens\ngrafana viewer {}\noncall operator {}\n",
            sha256sum(VIEWER_TOKEN),
            sha256sum(OPERATOR_TOKEN)
        ),
    )
    .unwrap();
    path
}

/// `--admin-addr addr --admin-tokens-file <dir>/admin-tokens`: a listener on `addr` with
/// the tokens of [`tokens_file`] (written into `dir`), for `walpost run` and `walpost inbox`.
pub(crate) fn admin_flags(addr: &str, dir: &Path) -> Vec<String> {
    vec!["--admin-addr".into(), addr.into(), "--admin-tokens-file".into(), tokens_file(dir).display().to_string()]
}

/// One HTTP/1.1 exchange over plain TCP: (status, body).
fn exchange(addr: &str, request: &str) -> (u16, String) {
    // Refused while walpost starts: status 0, and the caller waits or fails.
    let Ok(mut s) = TcpStream::connect(addr) else { return (0, String::new()) };
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, out.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default())
}

pub(crate) fn request(addr: &str, method: &str, path: &str, token: Option<&str>, body: &str) -> (u16, String) {
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    exchange(
        addr,
        &format!("{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: {}\r\n\r\n{body}", body.len()),
    )
}

pub(crate) fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body:?}"))
}

/// The status once its `state` is `want`.
pub(crate) fn status_when(addr: &str, want: &str, p: &Walpost) -> serde_json::Value {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let (code, body) = request(addr, "GET", "/api/v1/status", Some(VIEWER_TOKEN), "");
        if code == 200 && json(&body)["state"] == want {
            return json(&body);
        }
        assert!(Instant::now() < deadline, "state never {want}: {code} {body}\n{}", p.log_text());
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Neither token nor any hash of the tokens file is in the log.
fn assert_no_secret_in(log: &str) {
    for secret in [VIEWER_TOKEN, OPERATOR_TOKEN] {
        assert!(!log.contains(secret), "a token in the log:\n{log}");
        assert!(!log.contains(&sha256sum(secret)), "a hash in the log:\n{log}");
    }
}

#[test]
fn admin_api_serves_status_to_tokens_only_within_bounds() {
    let w = World::new("admin-api");
    let dir = scratch("admin-api");
    let addr = format!("127.0.0.1:{}", testkit::free_port());
    let mut args = w.args();
    args.extend(admin_flags(&addr, &dir));
    let mut p = Walpost::start(&args, &[]);
    assert!(w.wait_for_slot(TIMEOUT), "slot not created:\n{}", p.log_text());
    insert_batches(&w, 0, 1, 5, 5, &["order"]);
    consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 5, TIMEOUT);

    let status = status_when(&addr, "streaming", &p);
    assert_eq!(status["slot"], w.slot.as_str(), "{status}");
    assert_eq!(status["delivery"], "at-least-once", "{status}");
    assert!(status["halted_reason"].is_null(), "{status}");
    assert!(status["alarms"].as_array().is_some_and(Vec::is_empty), "{status}");
    // The rate is sampled every 5 s from the start: the 5 events published in the first
    // minute make it positive once a second sample is taken.
    let deadline = Instant::now() + Duration::from_secs(20);
    let rate = loop {
        let s = json(&request(&addr, "GET", "/api/v1/status", Some(VIEWER_TOKEN), "").1);
        match s["events_per_second"].as_f64() {
            Some(r) if r > 0.0 => break r,
            _ if Instant::now() > deadline => panic!("no events_per_second above 0 in 20 s: {s}"),
            _ => std::thread::sleep(Duration::from_millis(500)),
        }
    };
    assert!(rate <= 5.0, "5 events over at least a second: {rate}");
    // The last hour for the console's chart: a point every 10 s from the start, for any token.
    let (code, body) = request(&addr, "GET", "/api/v1/status/history", Some(VIEWER_TOKEN), "");
    assert_eq!(code, 200, "{body}");
    let history = json(&body);
    assert_eq!(history["every_seconds"], 10, "{history}");
    let points = history["points"].as_array().expect("points");
    assert!(!points.is_empty() && points.len() <= 360, "{history}");
    let first = &points[0];
    assert!(first["at"].as_u64().is_some_and(|at| at > 1_700_000_000_000), "{history}");
    assert!(first.get("lag_bytes").is_some() && first.get("events_per_second").is_some(), "{history}");
    assert_eq!(request(&addr, "GET", "/api/v1/status/history", None, "").0, 401);
    // The monitor's first poll comes a second after start, then every interval.
    let deadline = Instant::now() + TIMEOUT;
    let polled = loop {
        let s = json(&request(&addr, "GET", "/api/v1/status", Some(OPERATOR_TOKEN), "").1);
        if !s["server_lsn"].is_null() || Instant::now() > deadline {
            break s;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(polled["server_lsn"].as_str().is_some_and(|l| l.contains('/')), "{polled}");
    assert!(polled["confirmed_lsn"].as_str().is_some_and(|l| l.contains('/')), "{polled}");
    assert!(polled["lag_bytes"].is_u64(), "{polled}");

    let (code, body) = request(&addr, "GET", "/api/v1/status", None, "");
    assert_eq!(code, 401, "{body}");
    assert!(json(&body)["hint"].as_str().unwrap().contains("Bearer"), "{body}");
    assert_eq!(request(&addr, "GET", "/api/v1/status", Some("not-a-token"), "").0, 401);

    let (code, body) = request(&addr, "GET", "/api/v1/nothing-here", Some(VIEWER_TOKEN), "");
    assert_eq!(code, 404, "{body}");
    let error = json(&body);
    assert!(error["error"].as_str().unwrap().contains("/api/v1/nothing-here"), "{body}");
    assert!(error["hint"].as_str().unwrap().contains("/api/v1/status"), "{body}");
    // POST on the status is a wrong method, whoever asks.
    assert_eq!(request(&addr, "POST", "/api/v1/status", Some(VIEWER_TOKEN), "{}").0, 405);

    let (code, body) = request(&addr, "GET", "/api/v1/status", Some(VIEWER_TOKEN), &"x".repeat(70 * 1024));
    assert_eq!(code, 413, "{body}");
    assert!(json(&body)["error"].as_str().unwrap().contains("65536"), "{body}");

    // Half a request line and a header, then nothing: another client is served at once.
    let mut stalled = TcpStream::connect(&addr).unwrap();
    stalled.write_all(b"GET /api/v1/status HTTP/1.1\r\nAuthoriz").unwrap();
    let started = Instant::now();
    let (code, _) = request(&addr, "GET", "/api/v1/status", Some(VIEWER_TOKEN), "");
    assert_eq!(code, 200);
    assert!(started.elapsed() < Duration::from_secs(2), "took {:?} beside a stalled client", started.elapsed());
    stalled.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let mut rest = Vec::new();
    let _ = stalled.read_to_end(&mut rest);
    assert!(started.elapsed() < Duration::from_secs(10), "the stalled client was held {:?}", started.elapsed());

    // The stream went on.
    insert_batches(&w, 1, 1, 5, 5, &["order"]);
    consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 10, TIMEOUT);
    assert!(p.terminate(TIMEOUT).is_some_and(|s| s.success()), "{}", p.log_text());
    let log = p.log_text();
    assert!(log.contains("serving the admin API on http://"), "{log}");
    assert_no_secret_in(&log);
    let _ = std::fs::remove_dir_all(&dir);
}

/// walpost with `extra` arguments exits 1, before reaching PostgreSQL, saying `what`.
fn refused(extra: &[&str], config: Option<&str>, what: &str) {
    let dir = scratch("admin-refused");
    let mut args: Vec<String> = Vec::new();
    if let Some(text) = config {
        let path = dir.join("walpost.toml");
        std::fs::write(&path, text).unwrap();
        args.extend(["--config".into(), path.display().to_string()]);
    }
    args.extend(
        ["run", "--postgres", "postgres://walpost@127.0.0.1:1/nowhere", "--kafka-brokers", "127.0.0.1:1"]
            .iter()
            .map(|a| (*a).to_owned()),
    );
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    let mut p = Walpost::start(&args, &[]);
    let status = p.wait_exit(TIMEOUT).expect("walpost exits");
    let log = p.log_text();
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(log.contains(what), "wanted {what:?} in:\n{log}");
    assert!(!log.contains("serving the admin API"), "{log}");
    assert_no_secret_in(&log);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn admin_refusals_at_start_say_what_to_do() {
    let dir = scratch("admin-tokens");
    let tokens = tokens_file(&dir).display().to_string();
    let port = testkit::free_port();
    let loopback = format!("127.0.0.1:{port}");
    let anywhere = format!("0.0.0.0:{port}");
    refused(&["--admin-addr", &loopback], None, "needs [admin] tokens_file");
    refused(&["--admin-addr", &anywhere, "--admin-tokens-file", &tokens], None, "is not a loopback address");
    refused(
        &["--admin-addr", &loopback, "--admin-tokens-file", &tokens],
        Some("[admin]\ntls_cert = \"/nonexistent.crt\"\n"),
        "tls_cert is set without [admin] tls_key",
    );
    // A token in the file in clear, where its hash belongs: the line, never the text.
    let bad = dir.join("bad-tokens");
    std::fs::write(&bad, format!("grafana viewer {}\noncall operator {OPERATOR_TOKEN}\n", sha256sum(VIEWER_TOKEN)))
        .unwrap();
    refused(
        &["--admin-addr", &loopback, "--admin-tokens-file", &bad.display().to_string()],
        None,
        "tokens file line 2: the SHA256 field is not 64 hex digits",
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn admin_api_over_tls_off_loopback() {
    let w = World::new("admin-tls");
    let dir = scratch("admin-tls");
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
            "[admin]\naddr = \"0.0.0.0:{port}\"\ntokens_file = \"{}\"\ntls_cert = \"{}\"\ntls_key = \"{}\"\n",
            tokens_file(&dir).display(),
            cert.display(),
            key.display()
        ),
    )
    .unwrap();
    let mut args = vec!["--config".to_owned(), config.display().to_string()];
    args.extend(w.args());
    let mut p = Walpost::start(&args, &[]);
    assert!(w.wait_for_slot(TIMEOUT), "slot not created:\n{}", p.log_text());

    let curl = |scheme: &str, token: &str| {
        Command::new("curl")
            .args(["-sS", "--max-time", "10", "--cacert"])
            .arg(&cert)
            .args(["-H", &format!("Authorization: Bearer {token}"), "-w", "\n%{http_code}"])
            .arg(format!("{scheme}://127.0.0.1:{port}/api/v1/status"))
            .output()
            .unwrap()
    };
    let deadline = Instant::now() + TIMEOUT;
    let body = loop {
        let out = curl("https", VIEWER_TOKEN);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if let Some((body, "200")) = text.rsplit_once('\n') {
            break body.to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "no answer over https: {text} {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            p.log_text()
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    assert_eq!(json(&body)["slot"], w.slot.as_str(), "{body}");
    let out = curl("https", "not-a-token");
    assert!(String::from_utf8_lossy(&out.stdout).ends_with("\n401"), "{out:?}");
    let plain = curl("http", VIEWER_TOKEN);
    assert!(!String::from_utf8_lossy(&plain.stdout).ends_with("\n200"), "plain HTTP was served: {plain:?}");

    assert!(p.terminate(TIMEOUT).is_some_and(|s| s.success()), "{}", p.log_text());
    let log = p.log_text();
    assert!(log.contains("serving the admin API on https://"), "{log}");
    assert_no_secret_in(&log);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The relay's audit writer against migration 0004 and the grant docs/control-plane.md
/// gives walpost's role (INSERT alone): rows land with bind parameters (a quote in a
/// target is data), and the role can neither change nor remove them.
#[test]
fn audit_rows_land_in_the_table_with_insert_alone() {
    let w = World::postgres_only("admin-audit");
    let migration = format!("{}/../../migrations/outbox/0004_admin_audit.sql", env!("CARGO_MANIFEST_DIR"));
    w.sql(&std::fs::read_to_string(migration).unwrap());
    w.sql(&format!("GRANT INSERT ON events.walpost_admin_audit TO {};", w.role));
    let audit = admin::TableAudit::new(replication::Config::parse(&w.url).unwrap(), "events", "walpost_admin_audit");
    let record = |target: &str, result: &str| admin::AuditRecord {
        token_name: "oncall".into(),
        role: admin::Role::Operator,
        action: "POST /api/v1/pause".into(),
        target: target.into(),
        result: result.into(),
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        use admin::Audit;
        audit.record(&record("slot it's", "ok")).await.unwrap();
        audit.record(&record("", "forbidden")).await.unwrap();
    });
    assert_eq!(
        w.sql("SELECT string_agg(concat_ws('|', token_name, role, action, target, result), E'\\n' ORDER BY at, result DESC)
               FROM events.walpost_admin_audit"),
        "oncall|operator|POST /api/v1/pause|slot it's|ok\noncall|operator|POST /api/v1/pause||forbidden"
    );
    assert_eq!(w.sql("SELECT count(*) FROM events.walpost_admin_audit WHERE at > now() - interval '1 minute'"), "2");
    for change in ["UPDATE events.walpost_admin_audit SET result = 'ok'", "DELETE FROM events.walpost_admin_audit"] {
        let refused = w.pg.psql_as(&w.role, &w.db, change).unwrap_err().to_string();
        assert!(refused.contains("permission denied"), "{change}: {refused}");
    }
}

/// A second walpost on the same slot says `waiting` and who holds the slot, with the
/// slot's confirmed position from the server (not its own: it confirmed nothing), and
/// `streaming` once it took over.
#[test]
fn a_hot_standby_says_waiting_then_streaming() {
    let w = World::new("admin-standby");
    let dir = scratch("admin-standby");
    let mut active = w.streaming_walpost(3, TIMEOUT);
    let addr = format!("127.0.0.1:{}", testkit::free_port());
    let mut args = w.args();
    args.extend(admin_flags(&addr, &dir));
    let mut standby = Walpost::start(&args, &[]);
    let waiting = status_when(&addr, "waiting", &standby);
    assert!(waiting["slot_holder"].as_str().is_some_and(|h| !h.is_empty()), "{waiting}");
    assert!(waiting["lag_seconds"].is_null() && waiting["in_flight"].is_null(), "{waiting}");
    let deadline = Instant::now() + TIMEOUT;
    let polled = loop {
        let s = json(&request(&addr, "GET", "/api/v1/status", Some(VIEWER_TOKEN), "").1);
        if !s["confirmed_lsn"].is_null() || Instant::now() > deadline {
            break s;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(polled["confirmed_lsn"].as_str().and_then(parse_lsn), w.confirmed_flush_lsn(), "{polled}");

    assert!(active.terminate(TIMEOUT).is_some_and(|s| s.success()), "{}", active.log_text());
    let took_over = status_when(&addr, "streaming", &standby);
    assert!(took_over["slot_holder"].is_null(), "{took_over}");
    insert_batches(&w, 1, 1, 3, 3, &["order"]);
    consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 6, TIMEOUT);
    assert!(standby.terminate(TIMEOUT).is_some_and(|s| s.success()), "{}", standby.log_text());
    assert_no_secret_in(&standby.log_text());
    let _ = std::fs::remove_dir_all(&dir);
}
