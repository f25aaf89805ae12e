//! OpenTelemetry span export, from the standard `OTEL_*` environment variables (the
//! OpenTelemetry SDK configuration spec): nothing is exported unless
//! `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set.
//!
//! walpost's exporter speaks OTLP/HTTP with protobuf bodies (`http/protobuf`, the spec's
//! default protocol), over `http://` or `https://` (TLS: the system's roots or
//! `OTEL_EXPORTER_OTLP_CERTIFICATE`, a client certificate for mutual TLS), gzip-compressed
//! when `OTEL_EXPORTER_OTLP_COMPRESSION=gzip`; `grpc` and `http/json` are refused at
//! start-up by name (run a Collector beside walpost for those), never ignored.
//!
//! Headers (they usually carry a token) go to a remote endpoint only over TLS.

use std::path::PathBuf;
use std::time::Duration;

/// A variable whose value cannot be used (the text never shows a header's value, nor
/// an endpoint's credentials). The binary's configuration error says it the same way.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key} = '{value}' is not valid: expected {expected}")]
pub struct InvalidSetting {
    pub key: &'static str,
    pub value: String,
    pub expected: &'static str,
}

/// How spans are exported (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct OtelSettings {
    /// `host:port` of the OTLP/HTTP receiver.
    pub authority: String,
    /// `Some` for an `https://` endpoint.
    pub tls: Option<OtlpTls>,
    /// `OTEL_EXPORTER_OTLP_(TRACES_)COMPRESSION`.
    pub compression: Compression,
    /// The request path, `/v1/traces` unless a traces endpoint names another.
    pub path: String,
    /// `OTEL_EXPORTER_OTLP_(TRACES_)HEADERS`: sent with every export (e.g. a token).
    pub headers: Vec<(String, String)>,
    /// `OTEL_EXPORTER_OTLP_(TRACES_)TIMEOUT`: one export request at most this long.
    pub timeout: Duration,
    /// `OTEL_SERVICE_NAME` (else `service.name` of `OTEL_RESOURCE_ATTRIBUTES`, else `walpost`).
    pub service_name: String,
    /// `OTEL_RESOURCE_ATTRIBUTES`, `service.name` left out.
    pub resource: Vec<(String, String)>,
    pub sampler: Sampler,
    /// `OTEL_BSP_MAX_QUEUE_SIZE`: spans waiting for export; more are dropped (counted).
    pub max_queue: usize,
    /// `OTEL_BSP_MAX_EXPORT_BATCH_SIZE`: spans per export request.
    pub max_batch: usize,
    /// `OTEL_BSP_SCHEDULE_DELAY`: a partial batch waits at most this long.
    pub schedule_delay: Duration,
}

/// TLS to an `https://` endpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct OtlpTls {
    /// The endpoint's host, checked against its certificate (and sent as SNI).
    pub host: String,
    /// `OTEL_EXPORTER_OTLP_(TRACES_)CERTIFICATE`: the CA (PEM) that signed the endpoint's
    /// certificate; `None`: the system's trusted roots.
    pub ca_file: Option<PathBuf>,
    /// `OTEL_EXPORTER_OTLP_(TRACES_)CLIENT_CERTIFICATE` and `..._CLIENT_KEY` (PEM), for an
    /// endpoint that asks for a client certificate.
    pub client: Option<(PathBuf, PathBuf)>,
}

/// How an export request's body is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    /// `Content-Encoding: gzip`.
    Gzip,
}

/// `OTEL_TRACES_SAMPLER` (and `_ARG`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampler {
    /// What decides for a span without a parent (and for every span when not parent-based).
    pub root: RootSampler,
    /// `parentbased_*`: a row's sampled context is sampled, an unsampled one is not.
    pub parent_based: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RootSampler {
    AlwaysOn,
    AlwaysOff,
    /// `traceidratio`: this fraction of trace ids.
    Ratio(f64),
}

/// The names of the variables, for messages and the README.
pub const ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
pub const TRACES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";

impl OtelSettings {
    /// Reads the variables through `env`; `None` when no endpoint is set, the SDK is
    /// disabled (`OTEL_SDK_DISABLED=true`) or `OTEL_TRACES_EXPORTER=none`.
    pub fn from_env(env: &dyn Fn(&str) -> Option<String>) -> Result<Option<OtelSettings>, InvalidSetting> {
        let var = |k: &str| env(k).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
        let traces_or = |specific: &'static str, general: &'static str| {
            var(specific).map(|v| (specific, v)).or_else(|| var(general).map(|v| (general, v)))
        };
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        match var("OTEL_TRACES_EXPORTER").as_deref() {
            None | Some("otlp") => {}
            Some("none") => return Ok(None),
            Some(other) => {
                return Err(InvalidSetting {
                    key: "OTEL_TRACES_EXPORTER",
                    value: other.into(),
                    expected: "otlp or none (walpost exports spans over OTLP only)",
                })
            }
        }
        let (key, url, append) = match (var(TRACES_ENDPOINT), var(ENDPOINT)) {
            (Some(url), _) => (TRACES_ENDPOINT, url, false),
            (None, Some(url)) => (ENDPOINT, url, true),
            (None, None) => return Ok(None),
        };
        if let Some((key, protocol)) = traces_or("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL") {
            if protocol != "http/protobuf" {
                return Err(InvalidSetting {
                    key,
                    value: protocol,
                    expected: "http/protobuf (walpost exports OTLP over HTTP with protobuf: point it at a collector's OTLP/HTTP port, 4318 by default)",
                });
            }
        }
        let endpoint = parse_url(&url).ok_or_else(|| InvalidSetting {
            key,
            // Without user:password and query: the URL may carry credentials.
            value: redacted_url(&url),
            expected: "an http:// or https:// URL such as http://localhost:4318 or https://collector.example:4318",
        })?;
        let Endpoint { authority, host, path, https } = endpoint;
        // The general variable is a base URL: the signal's path is appended (spec).
        let path = if append { format!("{}/v1/traces", path.trim_end_matches('/')) } else { path };
        let headers = match traces_or("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS") {
            None => Vec::new(),
            Some((key, text)) => parse_pairs(&text).ok_or(InvalidSetting {
                key,
                // The values may be secrets (tokens): never echoed.
                value: "(not shown)".into(),
                expected: "key=value pairs separated by commas, values URL-encoded",
            })?,
        };
        if !headers.is_empty() && !https && !is_loopback(&authority) {
            let key = if var("OTEL_EXPORTER_OTLP_TRACES_HEADERS").is_some() {
                "OTEL_EXPORTER_OTLP_TRACES_HEADERS"
            } else {
                "OTEL_EXPORTER_OTLP_HEADERS"
            };
            return Err(InvalidSetting {
                key,
                value: "(not shown)".into(),
                expected: "no headers for a plain http:// endpoint on another host: they usually carry credentials, which would cross the network in cleartext; use an https:// endpoint, or a collector on this host (http://127.0.0.1:4318)",
            });
        }
        let file = |specific: &'static str, general: &'static str| {
            traces_or(specific, general).map(|(key, path)| (key, PathBuf::from(path)))
        };
        let ca = file("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "OTEL_EXPORTER_OTLP_CERTIFICATE");
        let cert = file("OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE", "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE");
        let client_key = file("OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY", "OTEL_EXPORTER_OTLP_CLIENT_KEY");
        let tls = if https {
            let client = match (cert, client_key) {
                (Some((_, cert)), Some((_, key))) => Some((cert, key)),
                (None, None) => None,
                (Some((key, path)), None) | (None, Some((key, path))) => {
                    return Err(InvalidSetting {
                        key,
                        value: path.display().to_string(),
                        expected: "both OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and OTEL_EXPORTER_OTLP_CLIENT_KEY (or their _TRACES_ forms), or neither",
                    })
                }
            };
            Some(OtlpTls { host, ca_file: ca.map(|(_, path)| path), client })
        } else if let Some((key, path)) = ca.or(cert).or(client_key) {
            // A certificate says TLS was meant: spans must not go in cleartext instead.
            return Err(InvalidSetting {
                key,
                value: path.display().to_string(),
                expected: "an https:// endpoint (certificates are for TLS; this endpoint is http://)",
            });
        } else {
            None
        };
        let compression = match traces_or("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "OTEL_EXPORTER_OTLP_COMPRESSION") {
            None => Compression::None,
            Some((_, v)) if v.eq_ignore_ascii_case("none") => Compression::None,
            Some((_, v)) if v.eq_ignore_ascii_case("gzip") => Compression::Gzip,
            Some((key, value)) => return Err(InvalidSetting { key, value, expected: "gzip or none" }),
        };
        let millis = |key: &'static str, default: u64| -> Result<u64, InvalidSetting> {
            match var(key) {
                None => Ok(default),
                Some(v) => v.parse::<u64>().ok().filter(|n| *n > 0).ok_or(InvalidSetting {
                    key,
                    value: v,
                    expected: "a positive number of milliseconds",
                }),
            }
        };
        let timeout = match var("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT") {
            Some(_) => millis("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", 10_000)?,
            None => millis("OTEL_EXPORTER_OTLP_TIMEOUT", 10_000)?,
        };
        let count = |key: &'static str, default: usize| -> Result<usize, InvalidSetting> {
            match var(key) {
                None => Ok(default),
                Some(v) => v.parse::<usize>().ok().filter(|n| (1..=1_000_000).contains(n)).ok_or(InvalidSetting {
                    key,
                    value: v,
                    expected: "a number from 1 to 1000000",
                }),
            }
        };
        let max_queue = count("OTEL_BSP_MAX_QUEUE_SIZE", 2048)?;
        let max_batch = count("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)?.min(max_queue);
        let schedule_delay = Duration::from_millis(millis("OTEL_BSP_SCHEDULE_DELAY", 5000)?);
        let mut resource = match var("OTEL_RESOURCE_ATTRIBUTES") {
            None => Vec::new(),
            Some(text) => parse_pairs(&text).ok_or(InvalidSetting {
                key: "OTEL_RESOURCE_ATTRIBUTES",
                value: text,
                expected: "key=value pairs separated by commas, values URL-encoded",
            })?,
        };
        let from_resource = resource.iter().position(|(k, _)| k == "service.name").map(|i| resource.remove(i).1);
        let service_name = var("OTEL_SERVICE_NAME").or(from_resource).unwrap_or_else(|| "walpost".into());
        Ok(Some(OtelSettings {
            authority,
            tls,
            compression,
            path,
            headers,
            timeout: Duration::from_millis(timeout),
            service_name,
            resource,
            sampler: sampler(var("OTEL_TRACES_SAMPLER"), var("OTEL_TRACES_SAMPLER_ARG"))?,
            max_queue,
            max_batch,
            schedule_delay,
        }))
    }
}

fn sampler(name: Option<String>, arg: Option<String>) -> Result<Sampler, InvalidSetting> {
    let ratio = || -> Result<RootSampler, InvalidSetting> {
        match &arg {
            None => Ok(RootSampler::Ratio(1.0)),
            Some(a) => a.parse::<f64>().ok().filter(|r| (0.0..=1.0).contains(r)).map(RootSampler::Ratio).ok_or(
                InvalidSetting { key: "OTEL_TRACES_SAMPLER_ARG", value: a.clone(), expected: "a ratio from 0 to 1" },
            ),
        }
    };
    let (root, parent_based) = match name.as_deref().unwrap_or("parentbased_always_on") {
        "always_on" => (RootSampler::AlwaysOn, false),
        "always_off" => (RootSampler::AlwaysOff, false),
        "traceidratio" => (ratio()?, false),
        "parentbased_always_on" => (RootSampler::AlwaysOn, true),
        "parentbased_always_off" => (RootSampler::AlwaysOff, true),
        "parentbased_traceidratio" => (ratio()?, true),
        other => {
            return Err(InvalidSetting {
                key: "OTEL_TRACES_SAMPLER",
                value: other.into(),
                expected: "always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off or parentbased_traceidratio",
            })
        }
    };
    Ok(Sampler { root, parent_based })
}

/// `url` without user information, query or fragment (for messages).
fn redacted_url(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    let (authority, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let shown = if authority.contains('@') { format!("****@{host}") } else { host.to_owned() };
    let path = if path.is_empty() { String::new() } else { format!("/{path}") };
    if scheme.is_empty() {
        format!("{shown}{path}")
    } else {
        format!("{scheme}://{shown}{path}")
    }
}

/// Whether `authority` (`host:port`) is this machine.
fn is_loopback(authority: &str) -> bool {
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// An endpoint URL, taken apart.
struct Endpoint {
    /// `host:port`, the port filled in (80 or 443) when the URL has none.
    authority: String,
    /// The host alone (an IPv6 literal without its brackets), for TLS.
    host: String,
    path: String,
    https: bool,
}

/// `http(s)://host[:port][/path]`; `None` for anything else, user information, a query
/// or a fragment included.
fn parse_url(url: &str) -> Option<Endpoint> {
    let (rest, https) = match url.strip_prefix("https://") {
        Some(rest) => (rest, true),
        None => (url.strip_prefix("http://")?, false),
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (rest.get(..i)?, rest.get(i..)?),
        None => (rest, ""),
    };
    if authority.is_empty() || authority.contains('@') || path.contains(['?', '#']) {
        return None;
    }
    // An IPv6 literal keeps its brackets; a port, when given, must be a number.
    let port = match authority.strip_prefix('[') {
        Some(v6) => v6.split_once(']')?.1.strip_prefix(':'),
        None => authority.split_once(':').map(|(_, p)| p),
    };
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split_once(']')?.0,
        None => authority.split_once(':').map_or(authority, |(h, _)| h),
    };
    if host.is_empty() {
        return None;
    }
    let host = host.to_owned();
    let authority = match port {
        Some(p) => {
            p.parse::<u16>().ok()?;
            authority.to_owned()
        }
        None => format!("{authority}:{}", if https { 443 } else { 80 }),
    };
    Some(Endpoint { authority, host, path: if path.is_empty() { "/".into() } else { path.to_owned() }, https })
}

/// `k=v,k2=v2` (W3C baggage style, values percent-decoded).
fn parse_pairs(text: &str) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=')?;
        let k = k.trim();
        if k.is_empty() {
            return None;
        }
        out.push((k.to_owned(), percent_decode(v.trim())?));
    }
    Some(out)
}

fn percent_decode(v: &str) -> Option<String> {
    replication::percent_decode(v).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(vars: &[(&str, &str)]) -> Result<Option<OtelSettings>, InvalidSetting> {
        let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        OtelSettings::from_env(&|k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
    }

    /// Regression: the endpoint was echoed with its user:password and query, and
    /// headers (a token) went in cleartext to a remote collector.
    #[test]
    fn regression_endpoint_credentials_are_not_echoed_nor_sent_in_cleartext() {
        let err =
            from(&[(ENDPOINT, "https://user:CANARY@collector.example:4318/x?token=CANARY")]).unwrap_err().to_string();
        assert!(!err.contains("CANARY") && err.contains("https://****@collector.example:4318/x"), "{err}");
        let remote = [
            (ENDPOINT, "http://collector.example:4318"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20CANARY"),
        ];
        let err = from(&remote).unwrap_err().to_string();
        assert!(!err.contains("CANARY") && err.contains("cleartext"), "{err}");
        let tls = [
            (ENDPOINT, "https://collector.example:4318"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20CANARY"),
        ];
        assert!(from(&tls).unwrap().is_some_and(|s| s.tls.is_some()), "headers go to a remote endpoint over TLS");
        for local in ["http://127.0.0.1:4318", "http://localhost:4318", "http://[::1]:4318"] {
            let vars = [(ENDPOINT, local), ("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20x")];
            assert!(from(&vars).unwrap().is_some(), "{local}");
        }
    }

    #[test]
    fn nothing_without_an_endpoint() {
        assert_eq!(from(&[("OTEL_SERVICE_NAME", "x")]).unwrap(), None);
        assert_eq!(from(&[(ENDPOINT, "http://c:4318"), ("OTEL_SDK_DISABLED", "true")]).unwrap(), None);
        assert_eq!(from(&[(ENDPOINT, "http://c:4318"), ("OTEL_TRACES_EXPORTER", "none")]).unwrap(), None);
    }

    #[test]
    fn defaults_and_the_standard_variables() {
        let s = from(&[(ENDPOINT, "http://collector:4318")]).unwrap().unwrap();
        assert_eq!((s.authority.as_str(), s.path.as_str()), ("collector:4318", "/v1/traces"));
        assert_eq!(s.sampler, Sampler { root: RootSampler::AlwaysOn, parent_based: true });
        assert_eq!((s.max_queue, s.max_batch, s.schedule_delay), (2048, 512, Duration::from_millis(5000)));
        assert_eq!((s.service_name.as_str(), s.timeout), ("walpost", Duration::from_secs(10)));
        let s = from(&[
            (ENDPOINT, "http://collector/base/"),
            (TRACES_ENDPOINT, "http://[::1]:4318/custom"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20t0k,x-tenant=a"),
            ("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-resource,deployment.environment=prod"),
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
            ("OTEL_BSP_SCHEDULE_DELAY", "200"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "1500"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((s.authority.as_str(), s.path.as_str()), ("[::1]:4318", "/custom"), "the traces endpoint, as is");
        assert_eq!(s.headers, vec![("authorization".into(), "Bearer t0k".into()), ("x-tenant".into(), "a".into())]);
        assert_eq!(s.service_name, "from-resource");
        assert_eq!(s.resource, vec![("deployment.environment".into(), "prod".into())]);
        assert_eq!(s.sampler, Sampler { root: RootSampler::Ratio(0.25), parent_based: true });
        assert_eq!((s.schedule_delay, s.timeout), (Duration::from_millis(200), Duration::from_millis(1500)));
        let s = from(&[
            (ENDPOINT, "http://c"),
            ("OTEL_SERVICE_NAME", "svc"),
            ("OTEL_RESOURCE_ATTRIBUTES", "service.name=r"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((s.authority.as_str(), s.service_name.as_str()), ("c:80", "svc"));
    }

    /// `https://`: port 443 unless given, the host for the certificate check, the
    /// certificate files and compression from the general or the traces variables.
    #[test]
    fn https_endpoints_certificates_and_compression() {
        let s = from(&[(ENDPOINT, "https://collector.example")]).unwrap().unwrap();
        assert_eq!((s.authority.as_str(), s.path.as_str()), ("collector.example:443", "/v1/traces"));
        let tls = s.tls.unwrap();
        assert_eq!((tls.host.as_str(), tls.ca_file, tls.client), ("collector.example", None, None));
        assert_eq!(s.compression, Compression::None);
        let s = from(&[
            (TRACES_ENDPOINT, "https://[::1]:4318/v1/traces"),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/general-ca.pem"),
            ("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "/ca.pem"),
            ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "/client.pem"),
            ("OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY", "/client.key"),
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "none"),
            ("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "GZIP"),
        ])
        .unwrap()
        .unwrap();
        let tls = s.tls.unwrap();
        assert_eq!((s.authority.as_str(), tls.host.as_str()), ("[::1]:4318", "::1"));
        assert_eq!(tls.ca_file, Some(PathBuf::from("/ca.pem")), "the traces variable wins");
        assert_eq!(tls.client, Some((PathBuf::from("/client.pem"), PathBuf::from("/client.key"))));
        assert_eq!(s.compression, Compression::Gzip);
        let plain = from(&[(ENDPOINT, "http://c:4318")]).unwrap().unwrap();
        assert_eq!((plain.tls, plain.compression), (None, Compression::None));
    }

    /// What walpost cannot do is refused by name, never ignored; secrets are not echoed.
    #[test]
    fn unsupported_settings_are_refused_by_name() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[(ENDPOINT, "c:4318")], "http:// or https:// URL"),
            (&[(ENDPOINT, "http://c:notaport")], "http:// or https:// URL"),
            (&[(ENDPOINT, "https://:4318")], "http:// or https:// URL"),
            (&[(ENDPOINT, "http://c:4318"), ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/ca.pem")], "an https:// endpoint"),
            (
                &[(ENDPOINT, "https://c:4318"), ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "/c.pem")],
                "OTEL_EXPORTER_OTLP_CLIENT_KEY",
            ),
            (&[(ENDPOINT, "http://c:4318"), ("OTEL_EXPORTER_OTLP_COMPRESSION", "zstd")], "gzip or none"),
            (&[(ENDPOINT, "http://c:4317"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")], "OTEL_EXPORTER_OTLP_PROTOCOL"),
            (&[(ENDPOINT, "http://c:4318"), ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")], "http/protobuf"),
            (&[(ENDPOINT, "http://c:4318"), ("OTEL_TRACES_SAMPLER", "sometimes")], "OTEL_TRACES_SAMPLER"),
            (
                &[
                    (ENDPOINT, "http://c:4318"),
                    ("OTEL_TRACES_SAMPLER", "traceidratio"),
                    ("OTEL_TRACES_SAMPLER_ARG", "2"),
                ],
                "ratio",
            ),
            (&[(ENDPOINT, "http://c:4318"), ("OTEL_TRACES_EXPORTER", "zipkin")], "OTEL_TRACES_EXPORTER"),
            (&[(ENDPOINT, "http://c:4318"), ("OTEL_BSP_MAX_QUEUE_SIZE", "0")], "OTEL_BSP_MAX_QUEUE_SIZE"),
        ];
        for (vars, expected) in cases {
            let err = from(vars).unwrap_err().to_string();
            assert!(err.contains(expected), "{vars:?}: {err}");
        }
        let err = from(&[(ENDPOINT, "http://c:4318"), ("OTEL_EXPORTER_OTLP_HEADERS", "secret-token-without-key")])
            .unwrap_err()
            .to_string();
        assert!(!err.contains("secret-token"), "{err}");
    }
}
