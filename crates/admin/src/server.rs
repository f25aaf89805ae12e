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
//! - every request is authenticated before it is routed (no token: 401 on any path but
//!   the console's static files, [`crate::console`]), and an action needs an operator
//!   (403), audited either way;
//! - `GET /api/v1/whoami` answers any valid token with its name and role, in both modes:
//!   the console shows a viewer no action.
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
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, WWW_AUTHENTICATE};
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
use crate::console;
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
/// Time an audit row may take to be written before the answer goes out without it (the
/// log line is written first in any case).
pub const AUDIT_TIMEOUT: Duration = Duration::from_secs(5);
/// The listener's own route: who the token is.
pub const WHOAMI: &str = "/api/v1/whoami";

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
    tracing::info!(addr = %local, "serving the admin API on {scheme}://{local}/api/v1/ and its console on {scheme}://{local}/");
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
                tracing::warn!(
                    retry_in_ms = pause.as_millis() as u64,
                    "admin listener cannot accept a connection: {e}"
                );
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
    if let Some(asset) = console::find(req.method(), req.uri().path()) {
        return console::response(asset, req.method());
    }
    let identity = match authenticate(&req, &shared.tokens) {
        Ok(identity) => identity,
        Err(e) => return into_response(e.into()),
    };
    if req.method() == hyper::Method::GET && req.uri().path() == WHOAMI {
        return into_response(Reply::ok(&serde_json::json!({"name": identity.name, "role": identity.role.as_str()})));
    }
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
        let written = match tokio::time::timeout(AUDIT_TIMEOUT, shared.audit.record(&record)).await {
            Ok(written) => written,
            Err(_) => Err(format!("no answer within {} s", AUDIT_TIMEOUT.as_secs())),
        };
        if let Err(e) = written {
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
    console::secure(headers);
    if reply.status == StatusCode::UNAUTHORIZED {
        headers.insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    response
}

#[cfg(test)]
mod tests;
