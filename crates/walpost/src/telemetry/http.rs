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

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use super::metrics::Metrics;

/// Connections open at once; a new one beyond this closes the oldest.
pub(crate) const MAX_CONNECTIONS: usize = 256;
/// Time a client has to send its request headers.
pub(crate) const HEADER_TIMEOUT: Duration = Duration::from_secs(1);
/// Time a connection may take in all (a large /metrics to a slow reader).
pub(crate) const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);

/// Binds `addr` (so a port in use is an error at start-up) and serves on a new thread
/// until the process exits.
pub(crate) fn serve(addr: SocketAddr, metrics: Metrics) -> std::io::Result<()> {
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    std::thread::Builder::new().name("walpost-http".into()).spawn(move || {
        runtime.block_on(async move {
            match TcpListener::from_std(listener) {
                Ok(listener) => accept_loop(listener, Arc::new(metrics)).await,
                Err(e) => tracing::error!("cannot serve metrics: {e}"),
            }
        })
    })?;
    tracing::info!(%addr, "serving /metrics, /healthz, /readyz");
    Ok(())
}

async fn accept_loop(listener: TcpListener, metrics: Arc<Metrics>) {
    // Oldest first: the connections a new one may close.
    let mut open: VecDeque<tokio::task::AbortHandle> = VecDeque::new();
    let mut backoff = Duration::from_millis(10);
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => {
                backoff = Duration::from_millis(10);
                stream
            }
            Err(e) => {
                tracing::warn!(
                    retry_in_ms = backoff.as_millis() as u64,
                    "metrics server cannot accept a connection: {e}"
                );
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
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
        let task = tokio::spawn(async move {
            let service = service_fn(move |req| {
                let metrics = metrics.clone();
                async move { Ok::<_, std::convert::Infallible>(respond(&req, &metrics)) }
            });
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(CONNECTION_TIMEOUT, conn).await;
        });
        open.push_back(task.abort_handle());
    }
}

fn respond(req: &Request<hyper::body::Incoming>, metrics: &Metrics) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match req.uri().path() {
        "/metrics" => (StatusCode::OK, "text/plain; version=0.0.4", metrics.encode()),
        "/healthz" => match metrics.health().liveness() {
            Ok(()) => (StatusCode::OK, "text/plain", "ok\n".to_owned()),
            Err(why) => (StatusCode::SERVICE_UNAVAILABLE, "text/plain", format!("{why}\n")),
        },
        "/readyz" => match metrics.health().readiness() {
            Ok(()) => (StatusCode::OK, "text/plain", "ready\n".to_owned()),
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
    use crate::telemetry::Health;

    fn start() -> (SocketAddr, Metrics) {
        let metrics = Metrics::new(Arc::new(Health::new(Duration::from_secs(30), Duration::from_secs(60)))).unwrap();
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
        let m = req("/metrics");
        assert!(m.contains("walpost_streaming 1"), "{m}");
        assert!(req("/nope").starts_with("HTTP/1.1 404"));
    }

    /// A client that connects and sends nothing is cut off; others are still served.
    #[test]
    fn silent_clients_do_not_hold_the_server() {
        let (addr, _) = start();
        let idle: Vec<_> = (0..MAX_CONNECTIONS).map(|_| std::net::TcpStream::connect(addr).unwrap()).collect();
        let started = std::time::Instant::now();
        let out = get(addr, &["GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"]);
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
        assert!(started.elapsed() < HEADER_TIMEOUT * 3, "{:?}", started.elapsed());
        drop(idle);
    }

    /// Regression (issue 27, M2): 40 idle half-sent requests made 4 of 8 health probes
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
            let started = std::time::Instant::now();
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
