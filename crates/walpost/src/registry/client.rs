//! The Confluent Schema Registry REST API, as walpost uses it: a subject's latest (or
//! pinned) version, a compatibility question, a registration. One connection per
//! request (schemas are cached, so requests are rare), plain or TLS, with basic or
//! bearer authentication. Errors name the registry by its URL (which never holds a
//! credential: `[registry]` refuses one there) and never show a credential.

use std::time::Duration;

use bytes::Bytes;
use contracts::registry::{Fetched, Registered};
use http_body_util::{BodyExt, Full};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use crate::http_client::{self, ConnectError, Tls, TlsSetupError};
use crate::settings::{RegistryAuth, RegistrySettings};

/// A path segment: everything but RFC 3986's unreserved characters escaped.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// What went wrong with a registry request.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RegistryError {
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
    #[error(transparent)]
    TlsSetup(#[from] TlsSetupError),
}

/// An answer to a compatibility question.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Compatibility {
    Compatible,
    Incompatible,
    /// The subject has no version yet: anything is compatible with nothing.
    NewSubject,
}

/// See the module docs.
pub(crate) struct RegistryClient {
    /// For errors and logs: the URL as configured.
    url: String,
    authority: String,
    base_path: String,
    tls: Option<Tls>,
    authorization: Option<String>,
    timeout: Duration,
}

impl std::fmt::Debug for RegistryClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryClient").field("url", &self.url).finish()
    }
}

impl RegistryClient {
    pub(crate) fn new(s: &RegistrySettings) -> Result<RegistryClient, RegistryError> {
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
        })
    }

    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// `version`: a pinned one, or the latest.
    pub(crate) async fn version(&self, subject: &str, version: Option<i32>) -> Result<Fetched, RegistryError> {
        let v = version.map_or_else(|| "latest".to_owned(), |v| v.to_string());
        let path = format!("/subjects/{}/versions/{v}", segment(subject));
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
    pub(crate) async fn compatible(
        &self,
        subject: &str,
        schema_type: &str,
        schema: &str,
    ) -> Result<Compatibility, RegistryError> {
        let path = format!("/compatibility/subjects/{}/versions/latest", segment(subject));
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
    pub(crate) async fn register(&self, subject: &str, schema_type: &str, schema: &str) -> Result<u32, RegistryError> {
        let path = format!("/subjects/{}/versions", segment(subject));
        let (status, body) = self.request("POST", &path, Some(schema_body(schema_type, schema))).await?;
        let json = self.success(status, &body)?;
        json.get("id")
            .and_then(serde_json::Value::as_u64)
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| self.malformed("no \"id\" in its answer".into()))
    }

    /// The subjects it holds (a cheap request for start-up and `walpost check`).
    pub(crate) async fn subjects(&self) -> Result<usize, RegistryError> {
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
        let body = response.into_body().collect().await.map_err(|e| RegistryError::Http(url(), e))?.to_bytes();
        Ok((status, body))
    }
}

fn segment(subject: &str) -> String {
    utf8_percent_encode(subject, SEGMENT).to_string()
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
            },
            ca: None,
            auth,
            timeout: Duration::from_secs(1),
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
        assert_eq!(segment("orders-value"), "orders-value");
        assert_eq!(segment("a b/c"), "a%20b%2Fc");
    }
}
