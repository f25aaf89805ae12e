//! The admin listener over HTTP/1.1 (hyper), plain or TLS (OpenSSL).
//!
//! Like the metrics server it runs on a thread of its own with its own single-threaded
//! runtime: a flood of slow clients or a slow handler never competes with the pipeline
//! for its threads.
//!
//! Invariants (no client can hold the listener):
//! - a client gets [`HEADER_TIMEOUT`] to finish the TLS handshake and again to send its
//!   request headers, and [`REQUEST_TIMEOUT`] for the whole exchange;
//! - at most [`MAX_CONNECTIONS`] are open; a new one beyond that closes the oldest;
//! - a body over [`MAX_BODY_BYTES`] is refused (413) before a handler sees it;
//! - every request is authenticated before it is routed (no token: 401 on any path),
//!   and an action needs an operator (403), audited either way.
//!
//! Shutdown: when the shutdown signal is raised the listener closes, open exchanges get
//! [`SHUTDOWN_GRACE`] to finish, then the thread ends.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, AUTHORIZATION, CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE, WWW_AUTHENTICATE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use openssl::ssl::{Ssl, SslAcceptor, SslFiletype, SslMethod};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_openssl::SslStream;

use crate::audit::{self, Audit, AuditRecord};
use crate::reply::{ApiError, Reply};
use crate::routes::{Access, Routes};
use crate::tokens::{Identity, Tokens};

/// Connections open at once; a new one beyond this closes the oldest.
pub const MAX_CONNECTIONS: usize = 64;
/// Time a client has for the TLS handshake, and then for its request headers.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Time a whole exchange may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The largest request body taken.
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Time open exchanges get to finish at shutdown.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// A mode's API: its routes and what each answers.
pub trait Api: Send + Sync + 'static {
    /// The mode's name for each of its routes.
    type Route: Copy + Send + Sync + std::fmt::Debug + 'static;

    fn routes(&self) -> &Routes<Self::Route>;

    /// Answers an authenticated, authorized request with a bounded body.
    fn handle(&self, call: Call<Self::Route>) -> impl std::future::Future<Output = Reply> + Send;
}

/// A request as a handler sees it.
#[derive(Debug)]
pub struct Call<R> {
    pub route: R,
    pub identity: Identity,
    pub params: Vec<(&'static str, String)>,
    /// The query string, undecoded.
    pub query: Option<String>,
    pub body: Bytes,
}

impl<R> Call<R> {
    /// The `{name}` parameter of the route.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
    }

    /// The body as `T`; 400 naming the problem (never the text) otherwise. `expected`
    /// describes the shape for the hint, e.g. `{"event_ids": ["..."]}`.
    pub fn json<T: serde::de::DeserializeOwned>(&self, expected: &str) -> Result<T, ApiError> {
        serde_json::from_slice(&self.body).map_err(|e| ApiError::bad_json(&e, expected))
    }
}

/// Why the listener cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ListenerError {
    #[error("cannot listen on {addr} for the admin API: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error("cannot use [admin] tls_cert {cert} and tls_key {key}: {reason}")]
    Tls { cert: String, key: String, reason: String },
    #[error("cannot start the admin listener's thread: {0}")]
    Thread(std::io::Error),
}

/// TLS from a certificate chain file and its key file (PEM).
pub fn tls_acceptor(cert: &Path, key: &Path) -> Result<SslAcceptor, ListenerError> {
    let fail = |reason: String| ListenerError::Tls {
        cert: cert.display().to_string(),
        key: key.display().to_string(),
        reason,
    };
    let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server()).map_err(|e| fail(e.to_string()))?;
    b.set_certificate_chain_file(cert).map_err(|e| fail(format!("the certificate: {e}")))?;
    b.set_private_key_file(key, SslFiletype::PEM).map_err(|e| fail(format!("the key: {e}")))?;
    b.check_private_key().map_err(|e| fail(format!("the key does not match the certificate: {e}")))?;
    Ok(b.build())
}

/// The running listener.
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
    thread: std::thread::JoinHandle<()>,
}

impl Server {
    /// The address it listens on (the port chosen when the configured one was 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Waits (blocking) until the listener stopped after shutdown.
    pub fn join(self) {
        let _ = self.thread.join();
    }
}

struct Shared<A, U> {
    api: A,
    audit: U,
    tokens: Tokens,
}

/// Binds `addr` (an address in use is an error at start) and serves `api` on a new
/// thread until `shutdown` becomes true.
pub fn serve<A: Api, U: Audit>(
    addr: SocketAddr,
    tls: Option<SslAcceptor>,
    tokens: Tokens,
    api: A,
    audit: U,
    mut shutdown: watch::Receiver<bool>,
) -> Result<Server, ListenerError> {
    let bind = |source| ListenerError::Bind { addr, source };
    let listener = std::net::TcpListener::bind(addr).map_err(bind)?;
    listener.set_nonblocking(true).map_err(bind)?;
    let local = listener.local_addr().map_err(bind)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(ListenerError::Thread)?;
    let shared = Arc::new(Shared { api, audit, tokens });
    let tls = tls.map(Arc::new);
    let scheme = if tls.is_some() { "https" } else { "http" };
    let thread = std::thread::Builder::new()
        .name("walpost-admin".into())
        .spawn(move || {
            runtime.block_on(async move {
                match TcpListener::from_std(listener) {
                    Ok(listener) => accept_loop(listener, tls, shared, &mut shutdown).await,
                    Err(e) => tracing::error!("cannot serve the admin API: {e}"),
                }
            })
        })
        .map_err(ListenerError::Thread)?;
    tracing::info!(addr = %local, "serving the admin API on {scheme}://{local}/api/v1/");
    Ok(Server { addr: local, thread })
}

async fn accept_loop<A: Api, U: Audit>(
    listener: TcpListener,
    tls: Option<Arc<SslAcceptor>>,
    shared: Arc<Shared<A, U>>,
    shutdown: &mut watch::Receiver<bool>,
) {
    // Oldest first: the connections a new one may close.
    let mut open: VecDeque<tokio::task::JoinHandle<()>> = VecDeque::new();
    let mut pause = Duration::from_millis(10);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.wait_for(|s| *s) => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => {
                pause = Duration::from_millis(10);
                stream
            }
            Err(e) => {
                // Out of file descriptors, say: back off rather than spin a core.
                tracing::warn!(retry_in_ms = pause.as_millis() as u64, "admin listener cannot accept a connection: {e}");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        open.retain(|c| !c.is_finished());
        while open.len() >= MAX_CONNECTIONS {
            if let Some(oldest) = open.pop_front() {
                oldest.abort();
            }
        }
        let shared = shared.clone();
        let tls = tls.clone();
        open.push_back(tokio::spawn(async move {
            let exchange = async {
                match tls {
                    None => serve_io(stream, shared).await,
                    Some(acceptor) => {
                        let Ok(ssl) = Ssl::new(acceptor.context()) else { return };
                        let Ok(mut stream) = SslStream::new(ssl, stream) else { return };
                        match tokio::time::timeout(HEADER_TIMEOUT, Pin::new(&mut stream).accept()).await {
                            Ok(Ok(())) => serve_io(stream, shared).await,
                            Ok(Err(e)) => tracing::debug!("admin TLS handshake failed: {e}"),
                            Err(_) => tracing::debug!("admin TLS handshake timed out"),
                        }
                    }
                }
            };
            let _ = tokio::time::timeout(REQUEST_TIMEOUT, exchange).await;
        }));
    }
    drop(listener);
    let grace = async {
        for c in open.iter_mut() {
            let _ = c.await;
        }
    };
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, grace).await;
    for c in &open {
        c.abort();
    }
    tracing::debug!("admin listener stopped");
}

async fn serve_io<I, A, U>(io: I, shared: Arc<Shared<A, U>>)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    A: Api,
    U: Audit,
{
    let service = service_fn(move |req| {
        let shared = shared.clone();
        async move { Ok::<_, std::convert::Infallible>(respond(req, &shared).await) }
    });
    let _ = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .keep_alive(false)
        .serve_connection(TokioIo::new(io), service)
        .await;
}

/// Authenticates, routes, authorizes, bounds the body, then asks the handler; audits actions.
async fn respond<A: Api, U: Audit>(req: Request<Incoming>, shared: &Shared<A, U>) -> Response<Full<Bytes>> {
    let identity = match authenticate(&req, &shared.tokens) {
        Ok(identity) => identity,
        Err(e) => return into_response(e.into()),
    };
    let found = match shared.api.routes().find(req.method(), req.uri().path()) {
        Ok(found) => found,
        Err(e) => return into_response(e.into()),
    };
    let act = found.access == Access::Act;
    let target = found.params.iter().map(|(n, v)| format!("{n}={v}")).collect::<Vec<_>>().join(" ");
    let reply = if act && !identity.role.may_act() {
        ApiError::forbidden(identity.role).into()
    } else {
        match read_body(req).await {
            Err(e) => e.into(),
            Ok((query, body)) => {
                let call = Call { route: found.route, identity: identity.clone(), params: found.params, query, body };
                shared.api.handle(call).await
            }
        }
    };
    if act {
        let record = AuditRecord {
            token_name: identity.name,
            role: identity.role,
            action: found.action,
            target: reply.target.clone().unwrap_or(target),
            result: audit::result_of(reply.status),
        };
        audit::log(&record);
        if let Err(e) = shared.audit.record(&record).await {
            tracing::warn!(target: audit::LOG_TARGET, action = %record.action, "cannot write the audit row: {e}");
        }
    }
    into_response(reply)
}

/// The identity of the request's bearer token.
fn authenticate(req: &Request<Incoming>, tokens: &Tokens) -> Result<Identity, ApiError> {
    let Some(value) = req.headers().get(AUTHORIZATION) else {
        return Err(ApiError::unauthenticated("no Authorization header"));
    };
    let token = value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| ApiError::unauthenticated("the Authorization header is not Bearer <token>"))?;
    tokens.authenticate(token).ok_or_else(|| ApiError::unauthenticated("the token is not in the tokens file"))
}

/// The query and the body, at most [`MAX_BODY_BYTES`] of it.
async fn read_body(req: Request<Incoming>) -> Result<(Option<String>, Bytes), ApiError> {
    let declared = req.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return Err(ApiError::too_large(MAX_BODY_BYTES));
    }
    let query = req.uri().query().map(str::to_owned);
    match Limited::new(req.into_body(), MAX_BODY_BYTES).collect().await {
        Ok(body) => Ok((query, body.to_bytes())),
        Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => {
            Err(ApiError::too_large(MAX_BODY_BYTES))
        }
        Err(e) => Err(ApiError::new(StatusCode::BAD_REQUEST, format!("cannot read the body: {e}"), "send it again")),
    }
}

fn into_response(reply: Reply) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(reply.body)));
    *response.status_mut() = reply.status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    if reply.status == StatusCode::UNAUTHORIZED {
        headers.insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    response
}

#[cfg(test)]
mod tests {
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
        send(
            addr,
            &format!("{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: {}\r\n\r\n{body}", body.len()),
        )
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
        let mut req =
            format!("POST /api/v1/poke/x HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {OP}\r\nTransfer-Encoding: chunked\r\n\r\n");
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
}
