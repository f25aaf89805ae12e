//! `/metrics`, `/healthz` and `/readyz` over HTTP/1.1 (hyper).
//!
//! The server runs on a thread of its own with its own single-threaded runtime, so a
//! scrape never competes with the replication loop for its thread, and `/healthz`
//! still answers (503) when the pipeline's runtime is stuck.
//!
//! Invariants (a health probe answers under a flood of idle or half-sent requests):
//! - Every connection is accepted at once; a client gets [`HEADER_TIMEOUT`] (well under
//!   a 3 s probe timeout) to send its request headers and [`CONNECTION_TIMEOUT`] for the
//!   whole exchange.
//! - At most [`MAX_CONNECTIONS`] are open; a new one beyond that closes the oldest, so
//!   connections that hold a slot without finishing a request cannot keep a probe out.
//! - An accept error (e.g. out of file descriptors) backs off instead of spinning a core.
//! - A halted walpost lingering to be scraped (`halt_linger_secs`) hands its port to a
//!   new walpost started on the same host: the new one finds the port in use, asks
//!   [`RELEASE_PATH`], and the halted one answers, closes its listener and exits at once
//!   ([`Server::released`]). A running walpost refuses (409), as does any request from
//!   another host (403); the new one then fails with "address in use" as before.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use backoff::Backoff;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::exposition::Exporter;

/// Connections open at once; a new one beyond this closes the oldest.
pub const MAX_CONNECTIONS: usize = 256;
/// Time a client has to send its request headers.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(1);
/// Time a connection may take in all (a large /metrics to a slow reader).
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);

/// `POST` here asks a halted walpost to hand its port over (see the module docs).
pub const RELEASE_PATH: &str = "/halted/release";
/// How long a new walpost waits for a released port to become free.
const TAKEOVER_WAIT: Duration = Duration::from_secs(5);
/// Time the release request may take (connect, answer).
const RELEASE_TIMEOUT: Duration = Duration::from_secs(2);

/// The metrics server of this process.
#[derive(Debug)]
pub struct Server {
    released: watch::Receiver<bool>,
}

impl Server {
    /// Resolves once a new walpost took the port over from this (halted) one; never
    /// otherwise.
    pub async fn released(&mut self) {
        if self.released.wait_for(|r| *r).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Binds `addr` (so a port in use is an error at start-up, unless a halted walpost
/// holds it and hands it over) and serves on a new thread until the process exits or
/// the port is handed over.
pub fn serve<E: Exporter>(addr: SocketAddr, metrics: E) -> std::io::Result<Server> {
    let listener = bind(addr)?;
    listener.set_nonblocking(true)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let (release, released) = watch::channel(false);
    std::thread::Builder::new().name("walpost-http".into()).spawn(move || {
        runtime.block_on(async move {
            match TcpListener::from_std(listener) {
                Ok(listener) => accept_loop(listener, Arc::new(metrics), release).await,
                Err(e) => tracing::error!("cannot serve metrics: {e}"),
            }
        })
    })?;
    tracing::info!(%addr, "serving /metrics, /healthz, /readyz");
    Ok(Server { released })
}

/// Binds `addr`; when it is in use by a halted walpost, takes it over.
fn bind(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let in_use = match std::net::TcpListener::bind(addr) {
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => e,
        other => return other,
    };
    if !ask_release(addr) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            format!(
                "{in_use}: another process listens there and it is not a halted walpost (a running walpost with the same metrics_addr?): stop it, or choose another metrics_addr"
            ),
        ));
    }
    let deadline = Instant::now() + TAKEOVER_WAIT;
    loop {
        std::thread::sleep(Duration::from_millis(50));
        match std::net::TcpListener::bind(addr) {
            Ok(listener) => {
                tracing::info!(%addr, "took the metrics port over from a halted walpost that lingered on it (halt_linger_secs); it exits now");
                return Ok(listener);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && Instant::now() < deadline => {}
            Err(e) => return Err(e),
        }
    }
}

/// Asks whoever listens on `addr` to release it; whether it agreed (only a halted
/// walpost does).
fn ask_release(addr: SocketAddr) -> bool {
    let mut target = addr;
    if target.ip().is_unspecified() {
        target.set_ip(match target.ip() {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
        });
    }
    let Ok(mut s) = std::net::TcpStream::connect_timeout(&target, RELEASE_TIMEOUT) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(RELEASE_TIMEOUT));
    let _ = s.set_write_timeout(Some(RELEASE_TIMEOUT));
    let request =
        format!("POST {RELEASE_PATH} HTTP/1.1\r\nHost: walpost\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    if s.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut answer = Vec::new();
    let _ = s.take(4096).read_to_end(&mut answer);
    answer.starts_with(b"HTTP/1.1 200")
}

async fn accept_loop<E: Exporter>(listener: TcpListener, metrics: Arc<E>, release: watch::Sender<bool>) {
    // Oldest first: the connections a new one may close.
    let mut open: VecDeque<tokio::task::AbortHandle> = VecDeque::new();
    let mut backoff = Backoff::new(Duration::from_millis(10), Duration::from_secs(1));
    let release = Arc::new(release);
    let mut released = release.subscribe();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            // Handed over: closing the listener frees the port for the new walpost.
            _ = released.wait_for(|r| *r) => return,
        };
        let (stream, same_host) = match accepted {
            Ok((stream, peer)) => {
                backoff.reset();
                // Same host: over loopback, or to one of this host's addresses from itself.
                let local = stream.local_addr().map(|a| a.ip()).ok();
                let same_host = peer.ip().is_loopback() || Some(peer.ip()) == local;
                (stream, same_host)
            }
            Err(e) => {
                let delay = backoff.next_delay();
                tracing::warn!(
                    retry_in_ms = delay.as_millis() as u64,
                    "metrics server cannot accept a connection: {e}"
                );
                tokio::time::sleep(delay).await;
                continue;
            }
        };
        open.retain(|c| !c.is_finished());
        while open.len() >= MAX_CONNECTIONS {
            if let Some(oldest) = open.pop_front() {
                oldest.abort();
            }
        }
        let metrics = metrics.clone();
        let release = release.clone();
        let task = tokio::spawn(async move {
            let agreed = Arc::new(AtomicBool::new(false));
            let answered = agreed.clone();
            let service = service_fn(move |req| {
                let metrics = metrics.clone();
                let agreed = agreed.clone();
                async move { Ok::<_, std::convert::Infallible>(respond(&req, metrics.as_ref(), same_host, &agreed)) }
            });
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(CONNECTION_TIMEOUT, conn).await;
            // Only once the answer is out: the listener closes, then the process exits.
            if answered.load(Ordering::SeqCst) {
                let _ = release.send(true);
            }
        });
        open.push_back(task.abort_handle());
    }
}

fn respond<E: Exporter>(
    req: &Request<hyper::body::Incoming>,
    metrics: &E,
    same_host: bool,
    agreed: &AtomicBool,
) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match req.uri().path() {
        RELEASE_PATH if req.method() != hyper::Method::POST => {
            (StatusCode::METHOD_NOT_ALLOWED, "text/plain", "POST only\n".to_owned())
        }
        RELEASE_PATH if !same_host => {
            (StatusCode::FORBIDDEN, "text/plain", "only a walpost on the same host takes the port over\n".to_owned())
        }
        RELEASE_PATH => match metrics.health().halted() {
            Some(_) => {
                agreed.store(true, Ordering::SeqCst);
                tracing::info!("a new walpost takes the metrics port over: closing it and exiting now");
                (StatusCode::OK, "text/plain", "released\n".to_owned())
            }
            None => (
                StatusCode::CONFLICT,
                "text/plain",
                "this walpost is running, not halted: stop it before starting another on its metrics port\n".to_owned(),
            ),
        },
        "/metrics" => (StatusCode::OK, "text/plain; version=0.0.4", metrics.encode()),
        "/healthz" => match metrics.health().liveness() {
            Ok(()) => (StatusCode::OK, "text/plain", "ok\n".to_owned()),
            Err(why) => (StatusCode::SERVICE_UNAVAILABLE, "text/plain", format!("{why}\n")),
        },
        "/readyz" => match metrics.health().readiness() {
            Ok(()) => match (metrics.health().standby(), metrics.health().paused()) {
                (Some(holder), _) => (StatusCode::OK, "text/plain", format!("ready: a hot standby; {holder}\n")),
                (None, Some(by)) => (StatusCode::OK, "text/plain", format!("ready: paused {by}\n")),
                (None, None) => (StatusCode::OK, "text/plain", "ready\n".to_owned()),
            },
            Err(why) => (StatusCode::SERVICE_UNAVAILABLE, "text/plain", format!("{why}\n")),
        },
        _ => (StatusCode::NOT_FOUND, "text/plain", "not found\n".to_owned()),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(v) = hyper::header::HeaderValue::from_str(content_type) {
        response.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    response
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;
    use crate::telemetry::{Exposition, Health};

    type Metrics = Exposition;

    fn new_metrics() -> Metrics {
        Exposition::new(Arc::new(Health::new(Duration::from_secs(30), Duration::from_secs(60))), &[]).unwrap()
    }

    fn start() -> (SocketAddr, Metrics) {
        let metrics = new_metrics();
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = probe.local_addr().unwrap();
        drop(probe);
        serve(addr, metrics.clone()).unwrap();
        (addr, metrics)
    }

    fn get(addr: SocketAddr, parts: &[&str]) -> String {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        for part in parts {
            s.write_all(part.as_bytes()).unwrap();
            s.flush().unwrap();
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    /// Regression: a request line split over several TCP segments was answered 404
    /// (the hand-written server judged the request by its first read).
    #[test]
    fn regression_request_line_in_several_segments_is_read_whole() {
        let (addr, _) = start();
        let out = get(addr, &["GE", "T /hea", "lthz HTTP/1.1\r\n", "Host: x\r\n\r\n"]);
        assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
    }

    #[test]
    fn endpoints_answer_from_health_and_metrics() {
        let (addr, metrics) = start();
        let req = |path: &str| get(addr, &[&format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n")]);
        assert!(req("/readyz").starts_with("HTTP/1.1 503"), "not streaming yet");
        metrics.health().set_streaming(true);
        assert!(req("/readyz").starts_with("HTTP/1.1 200"));
        metrics.health().set_paused(Some("by ops since 2026-12-05 17:00:00+00".into()));
        let paused = req("/readyz");
        assert!(paused.starts_with("HTTP/1.1 200") && paused.contains("ready: paused by ops since"), "{paused}");
        metrics.health().set_paused(None);
        let m = req("/metrics");
        assert!(m.contains("walpost_streaming 1"), "{m}");
        assert!(req("/nope").starts_with("HTTP/1.1 404"));
    }

    /// Regression: a halted walpost lingering on its metrics port made the runbooks'
    /// immediate restart fail with "Address already in use". The new server takes the
    /// port over from a halted one, which closes its listener; a running one keeps it.
    #[test]
    fn regression_a_new_server_takes_the_port_over_from_a_halted_one_only() {
        let (addr, running) = start();
        let metrics = new_metrics();
        let refused = serve(addr, metrics.clone()).unwrap_err();
        assert_eq!(refused.kind(), std::io::ErrorKind::AddrInUse);
        assert!(refused.to_string().contains("not a halted walpost"), "{refused}");
        let req = |path: &str| get(addr, &[&format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n")]);
        assert!(req("/healthz").starts_with("HTTP/1.1 200"), "the running one still serves");
        let post = get(addr, &[&format!("POST {RELEASE_PATH} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")]);
        assert!(post.starts_with("HTTP/1.1 409"), "{post}");

        running.health().set_halted("Kafka rejected event id=1".into());
        assert!(req("/readyz").starts_with("HTTP/1.1 503"), "halted");
        serve(addr, metrics.clone()).expect("takes the port over");
        metrics.health().set_streaming(true);
        let ready = req("/readyz");
        assert!(ready.starts_with("HTTP/1.1 200"), "the new one answers: {ready}");
    }

    /// The halted one learns that it was released (and exits then).
    #[test]
    fn a_released_server_says_so() {
        let metrics = new_metrics();
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = probe.local_addr().unwrap();
        drop(probe);
        let mut server = serve(addr, metrics.clone()).unwrap();
        metrics.health().set_halted("halted for the test".into());
        assert!(ask_release(addr));
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async { tokio::time::timeout(Duration::from_secs(5), server.released()).await }).expect("released");
    }

    /// A client that connects and sends nothing is cut off; others are still served.
    #[test]
    fn silent_clients_do_not_hold_the_server() {
        let (addr, _) = start();
        let idle: Vec<_> = (0..MAX_CONNECTIONS).map(|_| std::net::TcpStream::connect(addr).unwrap()).collect();
        let started = Instant::now();
        let out = get(addr, &["GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"]);
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
        assert!(started.elapsed() < HEADER_TIMEOUT * 3, "{:?}", started.elapsed());
        drop(idle);
    }

    /// Regression: 40 idle half-sent requests made 4 of 8 health probes
    /// time out (3 s), 300 made all of them fail (32 slots, a 5 s header timeout). With
    /// 300 of them open (and kept open), every probe answers within 1 s.
    #[test]
    fn regression_health_answers_under_300_half_sent_requests() {
        let (addr, _) = start();
        let slow: Vec<std::net::TcpStream> = (0..300)
            .map(|_| {
                let mut s = std::net::TcpStream::connect(addr).unwrap();
                s.write_all(b"GET /healthz HTTP/1.1\r\nHost").unwrap();
                s
            })
            .collect();
        for probe in 0..8 {
            let started = Instant::now();
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
            let mut out = String::new();
            let _ = s.read_to_string(&mut out);
            assert!(out.starts_with("HTTP/1.1 200"), "probe {probe}: {out:?} after {:?}", started.elapsed());
            assert!(started.elapsed() < Duration::from_secs(1), "probe {probe} took {:?}", started.elapsed());
            std::thread::sleep(Duration::from_millis(100));
        }
        drop(slow);
    }
}
