//! The listener end to end on loopback: tokens, roles, routes, bounds, a stalled client, shutdown.

use std::io::{Read, Write};
use std::sync::Mutex;
use std::time::Instant;

use super::*;
use crate::tokens::sha256_hex;

#[derive(Debug, Clone, Copy)]
enum R {
    Status,
    Poke,
}

struct TestApi {
    routes: Routes<R>,
}

impl Api for TestApi {
    type Route = R;

    fn routes(&self) -> &Routes<R> {
        &self.routes
    }

    async fn handle(&self, call: Call<R>) -> Reply {
        match call.route {
            R::Status => Reply::ok(&serde_json::json!({"state": "streaming", "who": call.identity.name})),
            R::Poke => match call.json::<Vec<u32>>("an array of numbers") {
                Ok(v) => Reply::ok(&v.len()).with_target(format!("{} items", v.len())),
                Err(e) => e.into(),
            },
        }
    }
}

#[derive(Clone, Default)]
struct Rows(Arc<Mutex<Vec<AuditRecord>>>);

impl Audit for Rows {
    async fn record(&self, record: &AuditRecord) -> Result<(), String> {
        self.0.lock().unwrap().push(record.clone());
        Ok(())
    }
}

const VIEW: &str = "view-token-1";
const OP: &str = "op-token-2";

fn start() -> (SocketAddr, Rows, watch::Sender<bool>, Server) {
    let tokens = Tokens::parse(&format!(
        "viewer1 viewer {}\noncall operator {}\n",
        sha256_hex(VIEW.as_bytes()),
        sha256_hex(OP.as_bytes())
    ))
    .unwrap();
    let api = TestApi { routes: Routes::new().get("/api/v1/status", R::Status).post("/api/v1/poke/{what}", R::Poke) };
    let rows = Rows::default();
    let (stop, stopped) = watch::channel(false);
    let server = serve("127.0.0.1:0".parse().unwrap(), None, tokens, api, rows.clone(), stopped).unwrap();
    (server.addr(), rows, stop, server)
}

fn send(addr: SocketAddr, request: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
}

fn request(addr: SocketAddr, method: &str, path: &str, token: Option<&str>, body: &str) -> (u16, String) {
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    send(addr, &format!("{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: {}\r\n\r\n{body}", body.len()))
}

fn error_of(body: &str) -> (String, String) {
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    (v["error"].as_str().unwrap().to_owned(), v["hint"].as_str().unwrap().to_owned())
}

#[test]
fn tokens_roles_routes_and_bounds() {
    let (addr, rows, _stop, _server) = start();
    let (status, body) = request(addr, "GET", "/api/v1/status", None, "");
    assert_eq!(status, 401, "{body}");
    assert!(error_of(&body).1.contains("Bearer"));
    assert_eq!(request(addr, "GET", "/api/v1/status", Some("nope"), "").0, 401);
    assert_eq!(request(addr, "GET", "/nowhere", None, "").0, 401, "no route is told without a token");

    let (status, body) = request(addr, "GET", "/api/v1/status", Some(VIEW), "");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"who\":\"viewer1\""), "{body}");

    let (status, body) = request(addr, "GET", "/api/v1/nothing", Some(VIEW), "");
    assert_eq!(status, 404);
    assert!(error_of(&body).1.contains("/api/v1/status"), "{body}");
    assert_eq!(request(addr, "DELETE", "/api/v1/status", Some(OP), "").0, 405);

    let (status, body) = request(addr, "POST", "/api/v1/poke/x", Some(VIEW), "[1]");
    assert_eq!(status, 403, "{body}");
    assert!(error_of(&body).1.contains("operator"));
    let (status, body) = request(addr, "POST", "/api/v1/poke/x", Some(OP), "[1,2]");
    assert_eq!((status, body.as_str()), (200, "2"));
    let (status, body) = request(addr, "POST", "/api/v1/poke/x", Some(OP), "[1, \"CANARY\"");
    assert_eq!(status, 400);
    let (error, hint) = error_of(&body);
    assert!(error.contains("line 1") && !error.contains("CANARY") && hint.contains("array of numbers"), "{body}");

    let big = "1".repeat(70 * 1024);
    let (status, body) = request(addr, "POST", "/api/v1/poke/x", Some(OP), &big);
    assert_eq!(status, 413, "{body}");

    let rows = rows.0.lock().unwrap().clone();
    let summary: Vec<(String, &str, String)> =
        rows.iter().map(|r| (r.token_name.clone(), r.role.as_str(), r.result.clone())).collect();
    assert_eq!(
        summary,
        vec![
            ("viewer1".into(), "viewer", "forbidden".into()),
            ("oncall".into(), "operator", "ok".into()),
            ("oncall".into(), "operator", "refused (400)".into()),
            ("oncall".into(), "operator", "refused (413)".into()),
        ]
    );
    assert_eq!(rows[0].action, "POST /api/v1/poke/{what}");
    assert_eq!(rows[0].target, "what=x");
    assert_eq!(rows[1].target, "2 items");
}

/// A body sent in chunks without a length is bounded too.
#[test]
fn a_chunked_body_over_the_limit_is_413() {
    let (addr, _, _stop, _server) = start();
    let chunk = "1".repeat(16 * 1024);
    let mut req = format!(
        "POST /api/v1/poke/x HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {OP}\r\nTransfer-Encoding: chunked\r\n\r\n"
    );
    for _ in 0..5 {
        req.push_str(&format!("{:x}\r\n{chunk}\r\n", chunk.len()));
    }
    req.push_str("0\r\n\r\n");
    assert_eq!(send(addr, &req).0, 413);
}

/// A client that sends half its headers and stalls neither blocks another request
/// nor holds its connection past the header timeout.
#[test]
fn a_stalled_client_blocks_nobody() {
    let (addr, _, _stop, _server) = start();
    let mut slow = std::net::TcpStream::connect(addr).unwrap();
    slow.write_all(b"GET /api/v1/status HTTP/1.1\r\nHost").unwrap();
    let started = Instant::now();
    assert_eq!(request(addr, "GET", "/api/v1/status", Some(VIEW), "").0, 200);
    assert!(started.elapsed() < Duration::from_secs(1), "{:?}", started.elapsed());
    slow.set_read_timeout(Some(HEADER_TIMEOUT * 3)).unwrap();
    let mut out = Vec::new();
    let _ = slow.read_to_end(&mut out);
    assert!(started.elapsed() < HEADER_TIMEOUT * 2, "cut off after {:?}", started.elapsed());
}

#[test]
fn shutdown_closes_the_listener() {
    let (addr, _, stop, server) = start();
    stop.send(true).unwrap();
    server.join();
    assert!(std::net::TcpStream::connect(addr).is_err(), "still listening");
}

/// The console's files load without a token (the sign-in page must), with the policy;
/// the API beside them does not; whoami names any valid token.
#[test]
fn the_console_loads_without_a_token_and_whoami_names_the_token() {
    let (addr, rows, _stop, _server) = start();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut page = String::new();
    let _ = s.read_to_string(&mut page);
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    let head = page.split_once("\r\n\r\n").unwrap().0.to_ascii_lowercase();
    assert!(head.contains(&format!("content-security-policy: {}", console::CONTENT_SECURITY_POLICY)), "{head}");
    assert!(head.contains("content-type: text/html; charset=utf-8") && !head.contains("set-cookie"), "{head}");
    assert_eq!(request(addr, "GET", "/console/app.js", None, "").0, 200);
    assert_eq!(request(addr, "GET", "/console/runbooks/kafka-outage.md", None, "").0, 200);
    assert_eq!(request(addr, "POST", "/", None, "").0, 401, "only reads of the files are open");
    assert_eq!(request(addr, "GET", "/api/v1/status", None, "").0, 401);

    assert_eq!(request(addr, "GET", WHOAMI, None, "").0, 401);
    assert_eq!(request(addr, "GET", WHOAMI, Some("nope"), "").0, 401);
    let (status, body) = request(addr, "GET", WHOAMI, Some(VIEW), "");
    assert_eq!((status, body.as_str()), (200, r#"{"name":"viewer1","role":"viewer"}"#));
    let (status, body) = request(addr, "GET", WHOAMI, Some(OP), "");
    assert_eq!((status, body.as_str()), (200, r#"{"name":"oncall","role":"operator"}"#));
    assert!(rows.0.lock().unwrap().is_empty(), "reads are not audited");
}
