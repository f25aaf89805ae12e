//! One OTLP/HTTP export: `POST <path>` with a protobuf body, on hyper's HTTP/1.1 client
//! connection over a tokio TCP stream (hyper is already walpost's HTTP server; no pool,
//! no TLS: the connection is kept while it works and opened again after an error).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

/// An export the endpoint did not take.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ExportError {
    #[error("cannot connect to the OTLP endpoint {0}: {1}")]
    Connect(String, std::io::Error),
    #[error("OTLP export to {0} failed: {1}")]
    Http(String, hyper::Error),
    #[error("the OTLP endpoint {0} answered HTTP {1}")]
    Status(String, u16),
    #[error("OTLP export to {0} took longer than {1:?}")]
    Timeout(String, Duration),
    #[error("cannot build the OTLP request: {0}")]
    Request(#[from] hyper::http::Error),
}

/// A connection to one endpoint, opened on demand.
pub(crate) struct Client {
    authority: String,
    path: String,
    headers: Vec<(String, String)>,
    timeout: Duration,
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
        Client { authority, path, headers, timeout, sender: None }
    }

    /// Posts one `ExportTraceServiceRequest`; the whole exchange within the timeout.
    pub(crate) async fn export(&mut self, body: Vec<u8>) -> Result<(), ExportError> {
        let timeout = self.timeout;
        match tokio::time::timeout(timeout, self.post(Bytes::from(body))).await {
            Ok(result) => result.inspect_err(|_| self.sender = None),
            Err(_) => {
                self.sender = None;
                Err(ExportError::Timeout(self.authority.clone(), timeout))
            }
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
        let stream = tokio::net::TcpStream::connect(self.authority.as_str())
            .await
            .map_err(|e| ExportError::Connect(self.authority.clone(), e))?;
        let _ = stream.set_nodelay(true);
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| ExportError::Http(self.authority.clone(), e))?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(sender)
    }
}
