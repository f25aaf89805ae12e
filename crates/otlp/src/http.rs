//! One OTLP/HTTP export: `POST <path>` with a protobuf body, on a connection of
//! [`http_client`] (plain, or TLS verified against the system's roots or the
//! configured CA, and the URL's host); there is no pool: the connection is kept while it works and opened again
//! after an error. With gzip the body is compressed once per export, not per try.
//!
//! Retries as the OTLP specification asks: a refused connection, a broken exchange and the
//! answers 429, 502, 503 and 504 are tried again after 100 ms, doubling up to 2 s, until
//! the export's timeout (`OTEL_EXPORTER_OTLP_TIMEOUT`) is spent; any other answer is final.

use std::io::Write;
use std::time::Duration;

use backoff::Backoff;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;

use http_client::{ConnectError, Tls, TlsSetupError};

use crate::settings::OtlpTls;

/// An export the endpoint did not take.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ExportError {
    #[error("cannot connect to the OTLP endpoint {0}: {1}")]
    Connect(String, std::io::Error),
    #[error("TLS with the OTLP endpoint {0} failed: {1}")]
    Tls(String, String),
    #[error("OTLP export to {0} failed: {1}")]
    Http(String, hyper::Error),
    #[error("the OTLP endpoint {0} answered HTTP {1}")]
    Status(String, u16),
    #[error("OTLP export to {0} took longer than {1:?}")]
    Timeout(String, Duration),
    #[error("cannot build the OTLP request: {0}")]
    Request(#[from] hyper::http::Error),
}

/// The first wait before an export is tried again, and the longest.
const FIRST_RETRY_DELAY: Duration = Duration::from_millis(100);
const MAX_RETRY_DELAY: Duration = Duration::from_secs(2);

impl ExportError {
    /// Whether the OTLP specification has the exporter try again: the endpoint could
    /// not be reached or the exchange broke, or it answered "too many requests" or one of
    /// the gateway/unavailable statuses.
    fn is_retryable(&self) -> bool {
        match self {
            ExportError::Connect(..) | ExportError::Http(..) => true,
            ExportError::Status(_, code) => matches!(code, 429 | 502 | 503 | 504),
            // A certificate that does not verify stays so; the next batch tries again.
            ExportError::Tls(..) | ExportError::Timeout(..) | ExportError::Request(_) => false,
        }
    }
}

/// A connection to one endpoint, opened on demand.
pub(crate) struct Client {
    authority: String,
    path: String,
    headers: Vec<(String, String)>,
    timeout: Duration,
    tls: Option<Tls>,
    gzip: bool,
    sender: Option<SendRequest<Full<Bytes>>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Headers may carry tokens: not shown.
        f.debug_struct("Client").field("authority", &self.authority).field("path", &self.path).finish()
    }
}

impl Client {
    pub(crate) fn new(authority: String, path: String, headers: Vec<(String, String)>, timeout: Duration) -> Client {
        Client { authority, path, headers, timeout, tls: None, gzip: false, sender: None }
    }

    /// Connects over TLS: the files are read now, so a missing or malformed one stops
    /// walpost at start-up rather than dropping every span later.
    pub(crate) fn with_tls(mut self, tls: &OtlpTls) -> Result<Client, TlsSetupError> {
        let ca = tls.ca_file.as_deref().map(|ca| ("the CA file (OTEL_EXPORTER_OTLP_CERTIFICATE)", ca));
        let client = tls.client.as_ref().map(|(cert, key)| {
            (
                ("the client certificate (OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE)", cert.as_path()),
                ("the client key (OTEL_EXPORTER_OTLP_CLIENT_KEY)", key.as_path()),
            )
        });
        self.tls = Some(Tls::new("the OTLP endpoint", &tls.host, ca, client)?);
        Ok(self)
    }

    /// Sends bodies gzip-compressed (`Content-Encoding: gzip`).
    pub(crate) fn with_gzip(mut self) -> Client {
        self.gzip = true;
        self
    }

    /// Posts one `ExportTraceServiceRequest`, retried (see the module docs) while the
    /// timeout lasts; the last error when it never succeeded.
    pub(crate) async fn export(&mut self, body: Vec<u8>) -> Result<(), ExportError> {
        let body = Bytes::from(if self.gzip { gzip(&body) } else { body });
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut backoff = Backoff::new(FIRST_RETRY_DELAY, MAX_RETRY_DELAY);
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let error = match tokio::time::timeout(left, self.post(body.clone())).await {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(e)) => e,
                Err(_) => ExportError::Timeout(self.authority.clone(), self.timeout),
            };
            self.sender = None;
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let wait = backoff.next_delay();
            if !error.is_retryable() || left <= wait {
                return Err(error);
            }
            tokio::time::sleep(wait).await;
        }
    }

    async fn post(&mut self, body: Bytes) -> Result<(), ExportError> {
        let sender = match self.sender.take() {
            Some(s) if !s.is_closed() => s,
            _ => self.connect().await?,
        };
        let mut sender = sender;
        sender.ready().await.map_err(|e| ExportError::Http(self.authority.clone(), e))?;
        let mut request = hyper::Request::post(self.path.as_str())
            .header(hyper::header::HOST, self.authority.as_str())
            .header(hyper::header::CONTENT_TYPE, "application/x-protobuf");
        if self.gzip {
            request = request.header(hyper::header::CONTENT_ENCODING, "gzip");
        }
        for (k, v) in &self.headers {
            request = request.header(k.as_str(), v.as_str());
        }
        let response = sender
            .send_request(request.body(Full::new(body))?)
            .await
            .map_err(|e| ExportError::Http(self.authority.clone(), e))?;
        let status = response.status();
        // Read the (small) body so the connection can carry the next request.
        let _ = response.into_body().collect().await;
        self.sender = Some(sender);
        if status.is_success() {
            Ok(())
        } else {
            Err(ExportError::Status(self.authority.clone(), status.as_u16()))
        }
    }

    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, ExportError> {
        let authority = || self.authority.clone();
        http_client::connect(&self.authority, self.tls.as_ref()).await.map_err(|e| match e {
            ConnectError::Connect(e) => ExportError::Connect(authority(), e),
            ConnectError::Tls(why) => ExportError::Tls(authority(), why),
            ConnectError::Http(e) => ExportError::Http(authority(), e),
        })
    }
}

/// `body` gzip-compressed (the default level, as OpenTelemetry's SDKs use).
fn gzip(body: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::with_capacity(body.len() / 4), flate2::Compression::default());
    // Writing into a Vec cannot fail.
    let _ = encoder.write_all(body);
    encoder.finish().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use http_body_util::Empty;
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;

    use super::*;

    /// An endpoint that answers each request with the next status of `statuses` (the
    /// last one from then on); returns its address and the count of requests it saw.
    async fn endpoint(statuses: Vec<u16>) -> (String, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let seen = Arc::new(AtomicUsize::new(0));
        let counter = seen.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { return };
                let (counter, statuses) = (counter.clone(), statuses.clone());
                tokio::spawn(async move {
                    let service = service_fn(move |_request| {
                        let n = counter.fetch_add(1, Ordering::SeqCst);
                        let status = statuses.get(n).or(statuses.last()).copied().unwrap_or(200);
                        async move { hyper::Response::builder().status(status).body(Empty::<Bytes>::new()) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        (addr, seen)
    }

    #[tokio::test]
    async fn unavailable_and_too_many_requests_are_tried_again_until_taken() {
        let (addr, seen) = endpoint(vec![503, 429, 200]).await;
        let mut client = Client::new(addr, "/v1/traces".into(), Vec::new(), Duration::from_secs(5));
        client.export(vec![1, 2, 3]).await.unwrap();
        assert_eq!(seen.load(Ordering::SeqCst), 3, "two retries, then taken");
    }

    #[tokio::test]
    async fn a_refusal_is_final_and_retries_stop_at_the_timeout() {
        let (addr, seen) = endpoint(vec![400]).await;
        let mut client = Client::new(addr, "/v1/traces".into(), Vec::new(), Duration::from_secs(5));
        let e = client.export(vec![1]).await.unwrap_err();
        assert!(matches!(e, ExportError::Status(_, 400)), "{e}");
        assert_eq!(seen.load(Ordering::SeqCst), 1, "400 is not retried");

        let (addr, seen) = endpoint(vec![503]).await;
        let mut client = Client::new(addr, "/v1/traces".into(), Vec::new(), Duration::from_millis(700));
        let started = std::time::Instant::now();
        let e = client.export(vec![1]).await.unwrap_err();
        assert!(matches!(e, ExportError::Status(_, 503)), "{e}");
        let tries = seen.load(Ordering::SeqCst);
        assert!((2..=4).contains(&tries), "100, 200, 400 ms waits within 700 ms: {tries} tries");
        assert!(started.elapsed() < Duration::from_millis(1_500), "{:?}", started.elapsed());
    }

    #[tokio::test]
    async fn an_endpoint_that_is_down_is_retried_then_reported() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        drop(listener);
        let mut client = Client::new(addr, "/v1/traces".into(), Vec::new(), Duration::from_millis(400));
        let e = client.export(vec![1]).await.unwrap_err();
        assert!(matches!(e, ExportError::Connect(..)), "{e}");
    }

    #[tokio::test]
    async fn a_gzip_body_is_marked_and_decompresses_to_the_request() {
        use http_body_util::BodyExt as _;
        use std::io::Read as _;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let service = service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                let tx = tx.clone();
                async move {
                    let encoding = request.headers().get(hyper::header::CONTENT_ENCODING).cloned();
                    let body = request.into_body().collect().await.unwrap().to_bytes();
                    let _ = tx.send((encoding, body));
                    hyper::Response::builder().status(200).body(Empty::<Bytes>::new())
                }
            });
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        });
        let request: Vec<u8> = (0..4096u32).map(|i| (i % 7) as u8).collect();
        let mut client = Client::new(addr, "/v1/traces".into(), Vec::new(), Duration::from_secs(5)).with_gzip();
        client.export(request.clone()).await.unwrap();
        let (encoding, body) = rx.recv().await.unwrap();
        assert_eq!(encoding.as_ref().map(|v| v.as_bytes()), Some(&b"gzip"[..]));
        assert!(body.len() < request.len() / 4, "compressed: {} bytes", body.len());
        let mut plain = Vec::new();
        flate2::read::GzDecoder::new(&body[..]).read_to_end(&mut plain).unwrap();
        assert_eq!(plain, request);
    }

    /// The start-up refusals for unusable certificate files, as
    /// runbooks/otel-and-cloudevents.md quotes them.
    #[test]
    fn unusable_certificate_files_are_named_as_the_runbook_quotes() {
        let runbook = include_str!("../../../runbooks/otel-and-cloudevents.md");
        let dir = std::env::temp_dir().join(format!("walpost-otlp-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let garbage = dir.join("ca.crt");
        std::fs::write(&garbage, "not a certificate\n").unwrap();
        let tls =
            |ca: &std::path::Path| OtlpTls { host: "collector".into(), ca_file: Some(ca.to_path_buf()), client: None };
        let client = || Client::new("collector:4318".into(), "/v1/traces".into(), Vec::new(), Duration::from_secs(1));
        let missing = client().with_tls(&tls(std::path::Path::new("/etc/walpost/ca.crt"))).unwrap_err().to_string();
        let malformed = client().with_tls(&tls(&garbage)).unwrap_err().to_string();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(
            missing,
            "cannot set up TLS for the OTLP endpoint: the CA file (OTEL_EXPORTER_OTLP_CERTIFICATE) /etc/walpost/ca.crt: No such file or directory (os error 2)"
        );
        assert!(runbook.contains(&missing), "{missing}");
        let malformed = malformed.replace(&garbage.display().to_string(), "/etc/walpost/ca.crt");
        assert!(runbook.contains(&malformed), "the runbook must quote: {malformed}");
    }
}
