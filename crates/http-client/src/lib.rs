//! HTTP/1.1 client connections for walpost's outbound HTTP (OTLP exports, the schema
//! registry, `walpost ctl`): hyper's client connection over a tokio TCP stream, or over
//! TLS with OpenSSL as walpost's PostgreSQL connections use it. The peer's certificate is
//! verified against the system's roots or the configured CA, and its name against the
//! URL's host. hyper is already walpost's HTTP server; callers keep a connection while
//! it works and open another after an error. [`Endpoint`] splits a base URL into what a
//! connection and a request need; [`read_body`] reads an answer up to a size.
//!
//! Invariants: certificate and key files are read when a [`Tls`] is made (at start-up),
//! so a missing or malformed one stops walpost with the file named, not at the first
//! request; a body is never read past the caller's limit, whatever its Content-Length says.

use std::path::Path;
use std::pin::Pin;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use openssl::ssl::{SslConnector, SslFiletype, SslMethod, SslVerifyMode};

/// What a TLS connection to a peer is made with.
pub struct Tls {
    connector: SslConnector,
    host: String,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").field("host", &self.host).finish()
    }
}

/// A certificate file could not be used (at start-up).
#[derive(Debug, thiserror::Error)]
#[error("cannot set up TLS for {peer}: {what} {path}: {reason}")]
pub struct TlsSetupError {
    peer: &'static str,
    what: &'static str,
    path: String,
    /// The I/O error, or OpenSSL's reasons (not its source-file locations).
    reason: String,
}

/// A file and what it is, as errors name it ("the CA file (registry.ca)").
pub type NamedFile<'a> = (&'static str, &'a Path);

impl Tls {
    /// `peer` names the other end in errors ("the OTLP endpoint"); `host` is checked
    /// against its certificate and sent as SNI; `client` is a certificate and its key.
    pub fn new(
        peer: &'static str,
        host: &str,
        ca: Option<NamedFile<'_>>,
        client: Option<(NamedFile<'_>, NamedFile<'_>)>,
    ) -> Result<Tls, TlsSetupError> {
        let none = Path::new("");
        // Verifies the peer against the system's default roots (set by `builder`).
        let mut b = SslConnector::builder(SslMethod::tls_client()).map_err(fail(peer, "OpenSSL", none))?;
        b.set_verify(SslVerifyMode::PEER);
        if let Some((what, ca)) = ca {
            readable(peer, what, ca)?;
            b.set_ca_file(ca).map_err(fail(peer, what, ca))?;
        }
        if let Some(((what, cert), (key_what, key))) = client {
            readable(peer, what, cert)?;
            b.set_certificate_chain_file(cert).map_err(fail(peer, what, cert))?;
            readable(peer, key_what, key)?;
            b.set_private_key_file(key, SslFiletype::PEM).map_err(fail(peer, key_what, key))?;
            b.check_private_key().map_err(fail(peer, "the client key, which does not match its certificate,", key))?;
        }
        b.set_alpn_protos(b"\x08http/1.1").map_err(fail(peer, "OpenSSL", none))?;
        Ok(Tls { connector: b.build(), host: host.to_owned() })
    }
}

/// Why a connection could not be made.
#[derive(Debug)]
pub enum ConnectError {
    Connect(std::io::Error),
    /// The handshake failed: why (the certificate's verification result when that was it).
    Tls(String),
    Http(hyper::Error),
}

/// A new HTTP/1.1 connection to `authority` (host:port), over TLS when `tls` is given.
pub async fn connect(authority: &str, tls: Option<&Tls>) -> Result<SendRequest<Full<Bytes>>, ConnectError> {
    let stream = tokio::net::TcpStream::connect(authority).await.map_err(ConnectError::Connect)?;
    let _ = stream.set_nodelay(true);
    let Some(tls) = tls else {
        let (sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(ConnectError::Http)?;
        tokio::spawn(connection);
        return Ok(sender);
    };
    // `into_ssl` sets the name to verify (a host name, or an IP address) and SNI.
    let ssl =
        tls.connector.configure().and_then(|c| c.into_ssl(&tls.host)).map_err(|e| ConnectError::Tls(e.to_string()))?;
    let mut stream = tokio_openssl::SslStream::new(ssl, stream).map_err(|e| ConnectError::Tls(e.to_string()))?;
    if let Err(e) = Pin::new(&mut stream).connect().await {
        let verify = stream.ssl().verify_result();
        let why = if verify == openssl::x509::X509VerifyResult::OK {
            e.to_string()
        } else {
            format!("the endpoint's certificate did not verify: {}", verify.error_string())
        };
        return Err(ConnectError::Tls(why));
    }
    let (sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(ConnectError::Http)?;
    tokio::spawn(connection);
    Ok(sender)
}

/// An `http://` or `https://` base URL, split: where to connect, the name a certificate
/// must carry, and the path prefix of every request. A URL with credentials
/// (`user:pass@`) is refused: a secret does not belong in a URL that errors show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub https: bool,
    /// host:port, the port defaulted from the scheme.
    pub authority: String,
    /// The host without brackets, as TLS verifies it.
    pub host: String,
    /// The URL's path without its trailing `/` (empty for none).
    pub base_path: String,
}

impl Endpoint {
    /// `None` when `url` is not an http:// or https:// URL with a host (and no
    /// credentials, query or fragment).
    pub fn parse(url: &str) -> Option<Endpoint> {
        let (https, rest) = match url.split_once("://") {
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("https") => (true, rest),
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => (false, rest),
            _ => return None,
        };
        let (host_port, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        if host_port.is_empty() || host_port.contains(['@', '?', '#']) || path.contains(['?', '#']) {
            return None;
        }
        let port_at = host_port.rfind(':').filter(|&i| !host_port[i..].contains(']'));
        let (host, port) = match port_at {
            Some(i) => (&host_port[..i], Some(&host_port[i + 1..])),
            None => (host_port, None),
        };
        if port.is_some_and(|p| p.parse::<u16>().is_err()) {
            return None;
        }
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if bare.is_empty() || bare.contains(char::is_whitespace) {
            return None;
        }
        let authority = match port {
            Some(_) => host_port.to_owned(),
            None => format!("{host}:{}", if https { 443 } else { 80 }),
        };
        Some(Endpoint { https, authority, host: bare.to_owned(), base_path: path.trim_end_matches('/').to_owned() })
    }
}

/// Why an answer's body could not be read.
#[derive(Debug)]
pub enum BodyError {
    /// Longer than the limit (by its Content-Length, or as it came).
    TooLarge(usize),
    Http(hyper::Error),
}

/// The body of `response`, read up to `limit` bytes and no further.
pub async fn read_body(response: hyper::Response<hyper::body::Incoming>, limit: usize) -> Result<Bytes, BodyError> {
    let declared =
        response.headers().get(hyper::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared > u64::try_from(limit).ok() {
        return Err(BodyError::TooLarge(limit));
    }
    match Limited::new(response.into_body(), limit).collect().await {
        Ok(body) => Ok(body.to_bytes()),
        Err(e) => match e.downcast::<hyper::Error>() {
            Ok(e) => Err(BodyError::Http(*e)),
            // http_body_util's LengthLimitError, the only other one.
            Err(_) => Err(BodyError::TooLarge(limit)),
        },
    }
}

/// Names the file and the OpenSSL step that failed, for `map_err`.
fn fail(
    peer: &'static str,
    what: &'static str,
    path: &Path,
) -> impl FnOnce(openssl::error::ErrorStack) -> TlsSetupError {
    let path = path.display().to_string();
    move |stack| {
        let mut reasons: Vec<&str> = Vec::new();
        for reason in stack.errors().iter().filter_map(openssl::error::Error::reason) {
            if !reasons.contains(&reason) {
                reasons.push(reason);
            }
        }
        let reason = if reasons.is_empty() { stack.to_string() } else { reasons.join("; ") };
        TlsSetupError { peer, what, path, reason }
    }
}

/// A missing or unreadable file, named as the OS names it (OpenSSL's text for it is a
/// stack of source locations).
fn readable(peer: &'static str, what: &'static str, path: &Path) -> Result<(), TlsSetupError> {
    match std::fs::File::open(path) {
        Ok(_) => Ok(()),
        Err(e) => Err(TlsSetupError { peer, what, path: path.display().to_string(), reason: e.to_string() }),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn endpoints_default_the_port_keep_the_path_and_refuse_what_is_not_a_plain_url() {
        let e = Endpoint::parse("http://127.0.0.1:9188").unwrap();
        assert_eq!(
            (e.https, e.authority.as_str(), e.host.as_str(), e.base_path.as_str()),
            (false, "127.0.0.1:9188", "127.0.0.1", "")
        );
        let e = Endpoint::parse("https://walpost.internal/admin/").unwrap();
        assert_eq!(
            (e.https, e.authority.as_str(), e.host.as_str(), e.base_path.as_str()),
            (true, "walpost.internal:443", "walpost.internal", "/admin")
        );
        let e = Endpoint::parse("HTTP://[::1]:9188/").unwrap();
        assert_eq!((e.authority.as_str(), e.host.as_str(), e.base_path.as_str()), ("[::1]:9188", "::1", ""));
        assert_eq!(Endpoint::parse("http://[::1]").unwrap().authority, "[::1]:80");
        for bad in [
            "ftp://h",
            "http://",
            "h:9188",
            "http://u:p@h:1",
            "http://h:port",
            "http://h:99999",
            "http://h/?q",
            "http://:80",
        ] {
            assert_eq!(Endpoint::parse(bad), None, "{bad}");
        }
    }
}
