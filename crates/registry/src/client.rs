//! The Confluent Schema Registry REST API, as walpost uses it: a subject's latest (or
//! pinned) version, a compatibility question, a registration. One connection per
//! request (schemas are cached, so requests are rare), plain or TLS, with basic or
//! bearer authentication. Errors name the registry by its URL (which never holds a
//! credential: `[registry]` refuses one there) and never show a credential.
//!
//! Invariants: an answer's body is read up to `registry.max_response_bytes` and no
//! further (a longer one is [`RegistryError::TooLarge`], whatever its Content-Length
//! says); a subject is one escaped path segment, and one that is `.` or `..` (which a
//! server or proxy would take as "this" or "the parent" path) is never sent.

use std::time::Duration;

use bytes::Bytes;
use contracts::registry::{Fetched, Registered};
use http_body_util::{BodyExt, Full, Limited};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use http_client::{ConnectError, Tls, TlsSetupError};

use crate::settings::{RegistryAuth, RegistrySettings};

/// A path segment: everything but RFC 3986's unreserved characters escaped.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// What went wrong with a registry request.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("cannot reach the schema registry at {0}: {1}")]
    Connect(String, std::io::Error),
    #[error("TLS with the schema registry at {0} failed: {1}")]
    Tls(String, String),
    #[error("the schema registry at {0} broke the exchange: {1}")]
    Http(String, hyper::Error),
    #[error("the schema registry at {0} did not answer within {1:?}")]
    Timeout(String, Duration),
    #[error("the schema registry at {0} refused walpost's credentials (HTTP {1}): check registry.username with WALPOST_REGISTRY_PASSWORD or registry.password_file, or the token (WALPOST_REGISTRY_TOKEN, registry.token_file)")]
    Unauthorized(String, u16),
    #[error("the schema registry at {url} answered HTTP {status}{}", code.map(|c| format!(" (error code {c})")).unwrap_or_default())]
    Status { url: String, status: u16, code: Option<i64> },
    #[error("the schema registry at {0} answered what is not its API ({1}): check registry.url (Apicurio's Confluent API is under /apis/ccompat/v7)")]
    Malformed(String, String),
    #[error("registry.url {0} is not an http:// or https:// URL with a host")]
    BadUrl(String),
    #[error("the schema registry at {0} answered with more than {1} bytes (registry.max_response_bytes): it was not read further; check registry.url, or raise registry.max_response_bytes if a schema is really that large")]
    TooLarge(String, usize),
    #[error("the schema registry at {url} refused the schema for subject {subject} (HTTP 409): it is not compatible with the subject's latest version under the subject's compatibility rule; nothing was registered. Run walpost contracts check to see which schemas break it, keep the change compatible (add optional fields, do not remove or retype one), or, if the consumers agree, change the subject's compatibility level in the registry or register it under a new subject")]
    Incompatible { url: String, subject: String },
    #[error("subject {0:?} cannot be asked for: . and .. name other paths of the registry's API, not a subject; fix the event type or the subject strategy")]
    DotSubject(String),
    #[error(transparent)]
    TlsSetup(#[from] TlsSetupError),
}

/// An answer to a compatibility question.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compatibility {
    Compatible,
    Incompatible,
    /// The subject has no version yet: anything is compatible with nothing.
    NewSubject,
}

/// See the module docs.
pub struct RegistryClient {
    /// For errors and logs: the URL as configured.
    url: String,
    authority: String,
    base_path: String,
    tls: Option<Tls>,
    authorization: Option<String>,
    timeout: Duration,
    max_response_bytes: usize,
}

impl std::fmt::Debug for RegistryClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryClient").field("url", &self.url).finish()
    }
}

impl RegistryClient {
    pub fn new(s: &RegistrySettings) -> Result<RegistryClient, RegistryError> {
        let bad = || RegistryError::BadUrl(s.url.clone());
        let (https, rest) = match s.url.split_once("://") {
            Some(("https", rest)) => (true, rest),
            Some(("http", rest)) => (false, rest),
            _ => return Err(bad()),
        };
        let (host_port, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        if host_port.is_empty() || host_port.contains('@') {
            return Err(bad());
        }
        let has_port = match host_port.rfind(':') {
            Some(i) => !host_port[i..].contains(']'),
            None => false,
        };
        let authority =
            if has_port { host_port.to_owned() } else { format!("{host_port}:{}", if https { 443 } else { 80 }) };
        let host = match host_port.rfind(':') {
            Some(i) if has_port => &host_port[..i],
            _ => host_port,
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let tls = if https {
            let ca = s.ca.as_deref().map(|ca| ("the CA file (registry.ca)", ca));
            Some(Tls::new("the schema registry", host, ca, None)?)
        } else {
            None
        };
        let authorization = match &s.auth {
            RegistryAuth::None => None,
            RegistryAuth::Basic { username, password } => {
                use base64::Engine as _;
                let pair = format!("{username}:{password}");
                Some(format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(pair)))
            }
            RegistryAuth::Bearer(token) => Some(format!("Bearer {token}")),
        };
        Ok(RegistryClient {
            url: s.url.clone(),
            authority,
            base_path: path.trim_end_matches('/').to_owned(),
            tls,
            authorization,
            timeout: s.timeout,
            max_response_bytes: s.max_response_bytes,
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// `version`: a pinned one, or the latest.
    /// A subject that is `.` or `..` is missing: it cannot be asked for, so no registry
    /// holds it for walpost (an event type from a row's data may be anything).
    pub async fn version(&self, subject: &str, version: Option<i32>) -> Result<Fetched, RegistryError> {
        let v = version.map_or_else(|| "latest".to_owned(), |v| v.to_string());
        let Ok(subject) = segment(subject) else { return Ok(Fetched::Missing) };
        let path = format!("/subjects/{subject}/versions/{v}");
        let (status, body) = self.request("GET", &path, None).await?;
        if status == 404 {
            return Ok(Fetched::Missing);
        }
        let json = self.success(status, &body)?;
        let field = |name: &str| json.get(name).ok_or_else(|| self.malformed(format!("no \"{name}\" in its answer")));
        let id = field("id")?
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| self.malformed("an id that is not a number".into()))?;
        let version = field("version")?.as_i64().and_then(|n| i32::try_from(n).ok()).unwrap_or(0);
        let schema = field("schema")?.as_str().ok_or_else(|| self.malformed("a schema that is not a string".into()))?;
        let schema_type = json.get("schemaType").and_then(|t| t.as_str()).unwrap_or("AVRO").to_owned();
        let references = json.get("references").and_then(|r| r.as_array()).map_or(0, Vec::len);
        Ok(Fetched::Found(Registered { id, version, schema_type, schema: schema.to_owned(), references }))
    }

    /// Whether `schema` may follow the subject's latest version, by the subject's
    /// compatibility rule.
    pub async fn compatible(
        &self,
        subject: &str,
        schema_type: &str,
        schema: &str,
    ) -> Result<Compatibility, RegistryError> {
        let path = format!("/compatibility/subjects/{}/versions/latest", segment(subject)?);
        let (status, body) = self.request("POST", &path, Some(schema_body(schema_type, schema))).await?;
        if status == 404 {
            return Ok(Compatibility::NewSubject);
        }
        let json = self.success(status, &body)?;
        match json.get("is_compatible").and_then(serde_json::Value::as_bool) {
            Some(true) => Ok(Compatibility::Compatible),
            Some(false) => Ok(Compatibility::Incompatible),
            None => Err(self.malformed("no \"is_compatible\" in its answer".into())),
        }
    }

    /// Registers `schema` under the subject (a no-op when it is its latest already);
    /// its id.
    pub async fn register(&self, subject: &str, schema_type: &str, schema: &str) -> Result<u32, RegistryError> {
        let path = format!("/subjects/{}/versions", segment(subject)?);
        let (status, body) = self.request("POST", &path, Some(schema_body(schema_type, schema))).await?;
        if status == 409 {
            return Err(RegistryError::Incompatible { url: self.url.clone(), subject: subject.to_owned() });
        }
        let json = self.success(status, &body)?;
        json.get("id")
            .and_then(serde_json::Value::as_u64)
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| self.malformed("no \"id\" in its answer".into()))
    }

    /// The subjects it holds (a cheap request for start-up and `walpost check`).
    pub async fn subjects(&self) -> Result<usize, RegistryError> {
        let (status, body) = self.request("GET", "/subjects", None).await?;
        let json = self.success(status, &body)?;
        json.as_array().map(Vec::len).ok_or_else(|| self.malformed("a subject list that is not a list".into()))
    }

    fn success(&self, status: u16, body: &[u8]) -> Result<serde_json::Value, RegistryError> {
        if status == 401 || status == 403 {
            return Err(RegistryError::Unauthorized(self.url.clone(), status));
        }
        let json: Option<serde_json::Value> = serde_json::from_slice(body).ok();
        if !(200..300).contains(&status) {
            let code = json.as_ref().and_then(|j| j.get("error_code")).and_then(serde_json::Value::as_i64);
            return Err(RegistryError::Status { url: self.url.clone(), status, code });
        }
        json.ok_or_else(|| self.malformed("its answer is not JSON".into()))
    }

    fn malformed(&self, why: String) -> RegistryError {
        RegistryError::Malformed(self.url.clone(), why)
    }

    async fn request(&self, method: &str, path: &str, body: Option<Vec<u8>>) -> Result<(u16, Bytes), RegistryError> {
        match tokio::time::timeout(self.timeout, self.exchange(method, path, body)).await {
            Ok(answer) => answer,
            Err(_) => Err(RegistryError::Timeout(self.url.clone(), self.timeout)),
        }
    }

    async fn exchange(&self, method: &str, path: &str, body: Option<Vec<u8>>) -> Result<(u16, Bytes), RegistryError> {
        let url = || self.url.clone();
        let mut sender = http_client::connect(&self.authority, self.tls.as_ref()).await.map_err(|e| match e {
            ConnectError::Connect(e) => RegistryError::Connect(url(), e),
            ConnectError::Tls(why) => RegistryError::Tls(url(), why),
            ConnectError::Http(e) => RegistryError::Http(url(), e),
        })?;
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base_path))
            .header(hyper::header::HOST, self.authority.as_str())
            .header(hyper::header::ACCEPT, "application/vnd.schemaregistry.v1+json, application/json");
        if body.is_some() {
            request = request.header(hyper::header::CONTENT_TYPE, "application/vnd.schemaregistry.v1+json");
        }
        if let Some(a) = &self.authorization {
            request = request.header(hyper::header::AUTHORIZATION, a.as_str());
        }
        let request = request
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| self.malformed(format!("cannot build the request: {e}")))?;
        let response = sender.send_request(request).await.map_err(|e| RegistryError::Http(url(), e))?;
        let status = response.status().as_u16();
        let too_large = || RegistryError::TooLarge(url(), self.max_response_bytes);
        if response.headers().get(hyper::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            > u64::try_from(self.max_response_bytes).ok()
        {
            return Err(too_large());
        }
        let body = Limited::new(response.into_body(), self.max_response_bytes).collect().await.map_err(|e| {
            match e.downcast::<hyper::Error>() {
                Ok(e) => RegistryError::Http(url(), *e),
                Err(_) => too_large(), // http_body_util's LengthLimitError, the only other one.
            }
        })?;
        Ok((status, body.to_bytes()))
    }
}

/// `subject` as one path segment; `.` and `..` are refused (escaping them as `%2E` is
/// not enough: RFC 3986 lets a server decode that before it resolves dot-segments).
fn segment(subject: &str) -> Result<String, RegistryError> {
    if subject == "." || subject == ".." {
        return Err(RegistryError::DotSubject(subject.to_owned()));
    }
    Ok(utf8_percent_encode(subject, SEGMENT).to_string())
}

fn schema_body(schema_type: &str, schema: &str) -> Vec<u8> {
    serde_json::json!({"schemaType": schema_type, "schema": schema}).to_string().into_bytes()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn settings(url: &str, auth: RegistryAuth) -> RegistrySettings {
        RegistrySettings {
            url: url.into(),
            options: contracts::registry::RegistryOptions {
                format: contracts::registry::Format::Avro,
                strategy: contracts::registry::SubjectStrategy::RecordName,
                pinned: Default::default(),
                ttl: Duration::from_secs(1),
                max_subjects: 1,
                key_format: None,
                limits: contracts::Limits::default(),
            },
            ca: None,
            auth,
            timeout: Duration::from_secs(1),
            max_response_bytes: 1 << 20,
        }
    }

    #[test]
    fn urls_give_the_authority_and_the_base_path_and_credentials_stay_hidden() {
        let c = RegistryClient::new(&settings("http://reg:8081/apis/ccompat/v7", RegistryAuth::None)).unwrap();
        assert_eq!((c.authority.as_str(), c.base_path.as_str()), ("reg:8081", "/apis/ccompat/v7"));
        let c = RegistryClient::new(&settings("http://[::1]", RegistryAuth::Bearer("s3cret".into()))).unwrap();
        assert_eq!(c.authority, "[::1]:80");
        assert_eq!(c.authorization.as_deref(), Some("Bearer s3cret"));
        assert!(!format!("{c:?}").contains("s3cret"));
        let basic = RegistryAuth::Basic { username: "u".into(), password: "p".into() };
        assert_eq!(
            RegistryClient::new(&settings("http://r/", basic)).unwrap().authorization.as_deref(),
            Some("Basic dTpw")
        );
        for bad in ["ftp://r", "http://", "http://u:p@r:1"] {
            assert!(
                matches!(RegistryClient::new(&settings(bad, RegistryAuth::None)), Err(RegistryError::BadUrl(_))),
                "{bad}"
            );
        }
        assert_eq!(segment("orders-value").unwrap(), "orders-value");
        assert_eq!(segment("a b/c").unwrap(), "a%20b%2Fc");
    }

    /// A server on 127.0.0.1 that answers every request with `answer` (after reading
    /// the request), and records what it was asked.
    fn serve(
        answer: impl Fn(&mut std::net::TcpStream) + Send + 'static,
    ) -> (String, std::sync::mpsc::Receiver<String>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (asked, requests) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for mut stream in listener.incoming().flatten() {
                use std::io::Read;
                let mut buf = [0u8; 8192];
                let n = stream.read(&mut buf).unwrap_or(0);
                let _ = asked.send(String::from_utf8_lossy(&buf[..n]).into_owned());
                answer(&mut stream);
            }
        });
        (url, requests)
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
    }

    #[test]
    fn regression_an_answer_longer_than_max_response_bytes_is_refused_while_read() {
        use std::io::Write;
        // 64 MiB announced and sent, or sent chunked without a length: the client (1 MiB
        // cap) stops reading at the cap instead of holding it all (1 GiB took 4.2 GB).
        let (sized, _) = serve(|s| {
            let _ =
                s.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 67108864\r\n\r\n");
            let chunk = vec![b' '; 1 << 20];
            for _ in 0..64 {
                if s.write_all(&chunk).is_err() {
                    return;
                }
            }
        });
        let (chunked, _) = serve(|s| {
            let _ =
                s.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n");
            let mut chunk = format!("{:x}\r\n", 1 << 16).into_bytes();
            chunk.extend(std::iter::repeat_n(b' ', 1 << 16));
            chunk.extend_from_slice(b"\r\n");
            for _ in 0..1024 {
                if s.write_all(&chunk).is_err() {
                    return;
                }
            }
        });
        for url in [sized, chunked] {
            let c = RegistryClient::new(&settings(&url, RegistryAuth::None)).unwrap();
            let started = std::time::Instant::now();
            let e = runtime().block_on(c.version("OrderPlaced", None)).unwrap_err();
            assert!(matches!(e, RegistryError::TooLarge(_, 1_048_576)), "{e:?}");
            assert_eq!(
                e.to_string(),
                format!("the schema registry at {url} answered with more than 1048576 bytes (registry.max_response_bytes): it was not read further; check registry.url, or raise registry.max_response_bytes if a schema is really that large")
            );
            assert!(started.elapsed() < Duration::from_secs(1), "{:?}", started.elapsed());
        }
        // An answer under the cap is read whole.
        let (small, _) = serve(|s| {
            let body = r#"{"id": 7, "version": 1, "schema": "\"string\""}"#;
            let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len());
            let _ = s.write_all(head.as_bytes());
            let _ = s.write_all(body.as_bytes());
        });
        let c = RegistryClient::new(&settings(&small, RegistryAuth::None)).unwrap();
        assert!(matches!(runtime().block_on(c.version("OrderPlaced", None)), Ok(Fetched::Found(r)) if r.id == 7));
    }

    #[test]
    fn regression_dot_subjects_are_never_sent_as_path_segments() {
        use std::io::Write;
        let (url, requests) = serve(|s| {
            let _ = s.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n");
        });
        let c = RegistryClient::new(&settings(&url, RegistryAuth::None)).unwrap();
        for dots in [".", ".."] {
            assert_eq!(runtime().block_on(c.version(dots, None)).unwrap(), Fetched::Missing, "{dots}");
            let e = runtime().block_on(c.register(dots, "AVRO", "\"string\"")).unwrap_err();
            assert!(e.to_string().contains("cannot be asked for: . and .. name other paths"), "{e}");
        }
        assert!(requests.try_recv().is_err(), "nothing was asked");
        assert_eq!(runtime().block_on(c.version("...", None)).unwrap(), Fetched::Missing);
        let asked = requests.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(asked.starts_with("GET /subjects/.../versions/latest "), "{asked}");
        assert_eq!(segment(".a").unwrap(), ".a");
    }

    #[test]
    fn an_incompatible_schema_pushed_says_so_and_what_to_do() {
        use std::io::Write;
        let (url, _) = serve(|s| {
            let body =
                r#"{"error_code": 409, "message": "Schema being registered is incompatible with an earlier schema"}"#;
            let head = format!("HTTP/1.1 409 Conflict\r\ncontent-length: {}\r\n\r\n", body.len());
            let _ = s.write_all(head.as_bytes());
            let _ = s.write_all(body.as_bytes());
        });
        let c = RegistryClient::new(&settings(&url, RegistryAuth::None)).unwrap();
        let e = runtime().block_on(c.register("OrderPlaced", "AVRO", "\"string\"")).unwrap_err().to_string();
        assert!(e.contains("refused the schema for subject OrderPlaced (HTTP 409): it is not compatible with the subject's latest version"), "{e}");
        assert!(e.contains("Run walpost contracts check"), "{e}");
    }
}
