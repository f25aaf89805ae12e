//! `walpost ctl`: the admin API (docs/control-plane.md) from a terminal. An [`Action`]
//! becomes one [`Request`] (pure, [`request`]), which goes to the admin listener with the operator's
//! [`Token`] over one connection (http:// or https://, `http_client`), bounded in time
//! and size; the answer becomes an [`Outcome`] (pure): its JSON on stdout, or the API's
//! `error` and `hint` on stderr.
//!
//! Exit codes, for scripts: [`exit::OK`] the API did it; [`exit::API_ERROR`] the API
//! answered an error (4xx, 5xx); [`exit::USAGE`] walpost ctl could not ask (a bad flag or
//! URL, no token, the listener unreachable, TLS, a timeout, an answer that is not the
//! admin API's). clap's own usage errors exit 2 too.
//!
//! Invariants: the token comes from `WALPOST_ADMIN_TOKEN` or a file, never from argv (a
//! command line is visible to every user of the machine); it is sent only in the
//! `Authorization` header and appears in no output, error or `Debug`; redirects are not
//! followed (the token would go where the redirect says); an answer is read up to
//! [`MAX_ANSWER_BYTES`] and no further.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use http_client::{BodyError, ConnectError, Endpoint, Tls};
use serde_json::Value;

mod request;
pub(crate) use request::{Action, Redrive, ReplayStart, Request, Selection};

/// Exit codes of `walpost ctl`.
pub(crate) mod exit {
    pub(crate) const OK: u8 = 0;
    pub(crate) const API_ERROR: u8 = 1;
    pub(crate) const USAGE: u8 = 2;
}

/// The longest answer read (a dead-letter listing with payloads is the largest).
pub(crate) const MAX_ANSWER_BYTES: usize = 32 << 20;
/// The longest token file read: a token is a line.
const MAX_TOKEN_FILE_BYTES: u64 = 4096;
/// The variable the token may come from.
pub(crate) const TOKEN_ENV: &str = "WALPOST_ADMIN_TOKEN";

/// Why walpost ctl could not ask (exit 2). Never holds the token.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CtlError {
    #[error("no admin URL: give --admin URL or set WALPOST_ADMIN_URL (the listener's [admin] addr, e.g. http://127.0.0.1:9188)")]
    NoUrl,
    #[error("--admin {0} is not an http:// or https:// URL with a host (and no user, query or fragment), e.g. https://walpost.internal:9188")]
    BadUrl(String),
    #[error("--ca-file is for an https:// admin URL; {0} is plain HTTP")]
    CaWithoutTls(String),
    #[error("no admin token: set {TOKEN_ENV}, or give --token-file FILE (WALPOST_ADMIN_TOKEN_FILE) holding it; a token is never taken from the command line, where other users of the machine can read it")]
    NoToken,
    #[error("both {TOKEN_ENV} and a token file (--token-file, WALPOST_ADMIN_TOKEN_FILE) are set: unset one, so it is clear which token acts")]
    TwoTokens,
    #[error("the token {0}")]
    BadToken(String),
    #[error("the token file {0}: {1}")]
    TokenFile(String, String),
    #[error("{0} is not a handler name that can be asked for: . and .. name other paths of the API")]
    DotName(String),
    #[error(transparent)]
    TlsSetup(#[from] http_client::TlsSetupError),
    #[error("cannot reach the admin API at {0}: {1} (is walpost running with [admin] addr there?)")]
    Connect(String, std::io::Error),
    #[error("TLS with the admin API at {0} failed: {1} (for a private CA, give --ca-file or WALPOST_ADMIN_CA_FILE)")]
    Tls(String, String),
    #[error("the admin API at {0} broke the exchange: {1}")]
    Http(String, hyper::Error),
    #[error("the admin API at {0} did not answer within {1:?} (--timeout)")]
    Timeout(String, Duration),
    #[error("the admin API at {0} answered with more than {1} bytes: not read further (ask for fewer, e.g. --limit)")]
    TooLarge(String, usize),
    #[error("{0} answered what is not walpost's admin API ({1}): check --admin")]
    NotTheApi(String, String),
}

/// The operator's token. Its `Debug` does not show it.
pub(crate) struct Token(String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

/// The listener to ask, and how.
#[derive(Debug)]
pub(crate) struct Target {
    url: String,
    endpoint: Endpoint,
    tls: Option<Tls>,
    timeout: Duration,
}

/// What the answer means to the operator.
#[derive(Debug, PartialEq)]
pub(crate) enum Outcome {
    /// The answer's JSON, pretty, for stdout (empty for an empty answer).
    Done(String),
    /// An error answer: its status, `error` and `hint` (exit 1).
    Refused { status: u16, error: String, hint: Option<String> },
}

/// The token from `WALPOST_ADMIN_TOKEN` (`from_env`) or a file (`file`), exactly one.
pub(crate) fn token(from_env: Option<std::ffi::OsString>, file: Option<&Path>) -> Result<Token, CtlError> {
    let text = match (from_env, file) {
        (Some(_), Some(_)) => return Err(CtlError::TwoTokens),
        (None, None) => return Err(CtlError::NoToken),
        (Some(value), None) => value
            .into_string()
            .map_err(|_| CtlError::BadToken(format!("in {TOKEN_ENV} is not valid UTF-8")))?
            .trim()
            .to_owned(),
        (None, Some(path)) => read_token_file(path)?,
    };
    if text.is_empty() {
        return Err(match file {
            Some(path) => CtlError::TokenFile(path.display().to_string(), "it is empty".into()),
            None => CtlError::BadToken(format!("in {TOKEN_ENV} is empty")),
        });
    }
    if !text.bytes().all(|b| b.is_ascii_graphic()) {
        let from = file.map_or_else(|| TOKEN_ENV.to_owned(), |p| p.display().to_string());
        return Err(CtlError::BadToken(format!(
            "in {from} has a space, a line break or a character that is not printable ASCII inside it: a token is one word (the file holds the token alone, not a tokens-file line)"
        )));
    }
    Ok(Token(text))
}

fn read_token_file(path: &Path) -> Result<String, CtlError> {
    let fail = |why: String| CtlError::TokenFile(path.display().to_string(), why);
    let meta = std::fs::metadata(path).map_err(|e| fail(e.to_string()))?;
    if meta.len() > MAX_TOKEN_FILE_BYTES {
        return Err(fail(format!("it is larger than {MAX_TOKEN_FILE_BYTES} bytes: it should hold the token alone")));
    }
    let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
    Ok(text.trim().to_owned())
}

impl Target {
    /// `url` from --admin or `WALPOST_ADMIN_URL`; the CA file is read here.
    pub(crate) fn new(url: Option<&str>, ca_file: Option<&Path>, timeout: Duration) -> Result<Target, CtlError> {
        let url = url.ok_or(CtlError::NoUrl)?.trim_end_matches('/').to_owned();
        let endpoint = Endpoint::parse(&url).ok_or_else(|| CtlError::BadUrl(url.clone()))?;
        let tls = match (endpoint.https, ca_file) {
            (false, Some(_)) => return Err(CtlError::CaWithoutTls(url)),
            (false, None) => None,
            (true, ca) => {
                Some(Tls::new("the admin API", &endpoint.host, ca.map(|p| ("the CA file (--ca-file)", p)), None)?)
            }
        };
        Ok(Target { url, endpoint, tls, timeout })
    }

    /// Sends `request` with `token`: the answer's status and body.
    pub(crate) async fn send(&self, request: &Request, token: &Token) -> Result<(u16, Bytes), CtlError> {
        match tokio::time::timeout(self.timeout, self.exchange(request, token)).await {
            Ok(answer) => answer,
            Err(_) => Err(CtlError::Timeout(self.url.clone(), self.timeout)),
        }
    }

    async fn exchange(&self, request: &Request, token: &Token) -> Result<(u16, Bytes), CtlError> {
        let url = || self.url.clone();
        let mut sender =
            http_client::connect(&self.endpoint.authority, self.tls.as_ref()).await.map_err(|e| match e {
                ConnectError::Connect(e) => CtlError::Connect(url(), e),
                ConnectError::Tls(why) => CtlError::Tls(url(), why),
                ConnectError::Http(e) => CtlError::Http(url(), e),
            })?;
        let body = request.body.as_ref().map(Value::to_string).unwrap_or_default();
        let mut builder = hyper::Request::builder()
            .method(request.method)
            .uri(format!("{}{}", self.endpoint.base_path, request.path))
            .header(hyper::header::HOST, self.endpoint.authority.as_str())
            .header(hyper::header::ACCEPT, "application/json")
            .header(hyper::header::AUTHORIZATION, format!("Bearer {}", token.0));
        if request.body.is_some() {
            builder = builder.header(hyper::header::CONTENT_TYPE, "application/json");
        }
        // The error of a request that cannot be built would name the part: the path is the
        // operator's text, the header the token, so only the path is shown.
        let built = builder
            .body(Full::new(Bytes::from(body)))
            .map_err(|_| CtlError::BadUrl(format!("{}{}", self.url, request.path)))?;
        let response = sender.send_request(built).await.map_err(|e| CtlError::Http(url(), e))?;
        let status = response.status().as_u16();
        let body = http_client::read_body(response, MAX_ANSWER_BYTES).await.map_err(|e| match e {
            BodyError::TooLarge(limit) => CtlError::TooLarge(url(), limit),
            BodyError::Http(e) => CtlError::Http(url(), e),
        })?;
        Ok((status, body))
    }

    pub(crate) fn url(&self) -> &str {
        &self.url
    }
}

/// What an answer means (pure): a success's JSON pretty, an error's `error` and `hint`.
/// A success that is not JSON, or a redirect, is not the admin API's answer.
pub(crate) fn outcome(url: &str, status: u16, body: &[u8]) -> Result<Outcome, CtlError> {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    match status {
        200..=299 => {
            if body.iter().all(u8::is_ascii_whitespace) {
                return Ok(Outcome::Done(String::new()));
            }
            let value =
                parsed.ok_or_else(|| CtlError::NotTheApi(url.to_owned(), format!("HTTP {status}, not JSON")))?;
            Ok(Outcome::Done(serde_json::to_string_pretty(&value).unwrap_or_default()))
        }
        400..=599 => {
            let field = |name: &str| parsed.as_ref()?.get(name)?.as_str().map(str::to_owned);
            let error = field("error")
                .unwrap_or_else(|| format!("HTTP {status} without walpost's JSON error (a proxy in between?)"));
            Ok(Outcome::Refused { status, error, hint: field("hint") })
        }
        _ => Err(CtlError::NotTheApi(url.to_owned(), format!("HTTP {status}; redirects are not followed"))),
    }
}

/// How to ask: the flags and variables of `walpost ctl`, resolved by the caller.
#[derive(Debug)]
pub(crate) struct Options {
    pub(crate) url: Option<String>,
    pub(crate) ca_file: Option<PathBuf>,
    pub(crate) token_file: Option<PathBuf>,
    pub(crate) token_env: Option<std::ffi::OsString>,
    pub(crate) timeout: Duration,
}

/// `walpost ctl`: asks, prints the answer (stdout) or the error (stderr); the exit code.
/// Output that cannot be written (a reader that went away, as `| head` does) is not an
/// error of the action, which is done: `println!` would panic there.
pub(crate) async fn command(options: Options, action: &Action) -> u8 {
    use std::io::Write as _;
    let outcome = ask(options, action).await;
    let (mut out, mut err) = (std::io::stdout().lock(), std::io::stderr().lock());
    match outcome {
        Ok(Outcome::Done(json)) => {
            if !json.is_empty() {
                let _ = writeln!(out, "{json}");
            }
            exit::OK
        }
        Ok(Outcome::Refused { status, error, hint }) => {
            let _ = writeln!(err, "walpost ctl: the admin API refused (HTTP {status}): {error}");
            if let Some(hint) = hint {
                let _ = writeln!(err, "hint: {hint}");
            }
            exit::API_ERROR
        }
        Err(e) => {
            let _ = writeln!(err, "walpost ctl: {e}");
            exit::USAGE
        }
    }
}

async fn ask(options: Options, action: &Action) -> Result<Outcome, CtlError> {
    let request = action.request()?;
    let target = Target::new(options.url.as_deref(), options.ca_file.as_deref(), options.timeout)?;
    let token = token(options.token_env, options.token_file.as_deref())?;
    let (status, body) = target.send(&request, &token).await?;
    outcome(target.url(), status, &body)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_token_comes_from_one_place_and_is_never_shown() {
        let dir = std::env::temp_dir().join(format!("walpost-ctl-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, "s3cret-token\n").unwrap();
        let t = token(None, Some(&file)).unwrap();
        assert_eq!(t.0, "s3cret-token");
        assert!(!format!("{t:?}").contains("s3cret"));
        assert_eq!(token(Some("  env-token\n".into()), None).unwrap().0, "env-token");
        assert!(matches!(token(None, None), Err(CtlError::NoToken)));
        assert!(matches!(token(Some("x".into()), Some(&file)), Err(CtlError::TwoTokens)));
        std::fs::write(&file, "oncall operator s3cret\n").unwrap();
        let e = token(None, Some(&file)).unwrap_err().to_string();
        assert!(e.contains("one word") && !e.contains("s3cret"), "{e}");
        let e = token(Some("two words".into()), None).unwrap_err().to_string();
        assert!(e.contains(TOKEN_ENV) && !e.contains("words"), "{e}");
        std::fs::write(&file, "\n").unwrap();
        assert!(token(None, Some(&file)).unwrap_err().to_string().contains("empty"));
        std::fs::write(&file, "x".repeat(5000)).unwrap();
        assert!(token(None, Some(&file)).unwrap_err().to_string().contains("larger than"));
        let e = token(None, Some(&dir.join("missing"))).unwrap_err().to_string();
        assert!(e.contains("missing") && e.contains("No such file"), "{e}");
        for e in [CtlError::NoToken, CtlError::TwoTokens] {
            assert!(e.to_string().contains(TOKEN_ENV), "{e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn answers_are_json_on_success_and_error_and_hint_on_refusal() {
        let url = "http://127.0.0.1:9188";
        assert_eq!(
            outcome(url, 200, br#"{"state":"paused"}"#).unwrap(),
            Outcome::Done("{\n  \"state\": \"paused\"\n}".into())
        );
        assert_eq!(outcome(url, 204, b"").unwrap(), Outcome::Done(String::new()));
        assert_eq!(
            outcome(url, 403, br#"{"error":"a viewer token may only read","hint":"use an operator's"}"#).unwrap(),
            Outcome::Refused {
                status: 403,
                error: "a viewer token may only read".into(),
                hint: Some("use an operator's".into())
            }
        );
        let Outcome::Refused { error, hint, .. } = outcome(url, 502, b"<html>bad gateway</html>").unwrap() else {
            panic!("a 502 is a refusal")
        };
        assert!(error.contains("HTTP 502") && hint.is_none(), "{error}");
        assert!(matches!(outcome(url, 200, b"<html>"), Err(CtlError::NotTheApi(..))));
        let e = outcome(url, 302, b"").unwrap_err().to_string();
        assert!(e.contains("302") && e.contains("--admin"), "{e}");
    }

    #[test]
    fn targets_take_http_and_https_urls_only() {
        let t = Target::new(Some("http://127.0.0.1:9188/"), None, Duration::from_secs(1)).unwrap();
        assert_eq!(
            (t.url(), t.endpoint.authority.as_str(), t.tls.is_none()),
            ("http://127.0.0.1:9188", "127.0.0.1:9188", true)
        );
        let t = Target::new(Some("https://walpost.internal"), None, Duration::from_secs(1)).unwrap();
        assert!(t.tls.is_some());
        assert!(matches!(Target::new(None, None, Duration::from_secs(1)), Err(CtlError::NoUrl)));
        assert!(matches!(Target::new(Some("127.0.0.1:9188"), None, Duration::from_secs(1)), Err(CtlError::BadUrl(_))));
        let ca = Path::new("/nonexistent/ca.pem");
        assert!(matches!(
            Target::new(Some("http://h:1"), Some(ca), Duration::from_secs(1)),
            Err(CtlError::CaWithoutTls(_))
        ));
        let e = Target::new(Some("https://h:1"), Some(ca), Duration::from_secs(1)).unwrap_err().to_string();
        assert!(e.contains("--ca-file") && e.contains("/nonexistent/ca.pem"), "{e}");
    }
}
