//! The web console: a handful of static files built into the binary (crates/admin/console/,
//! plain HTML, CSS and JavaScript; no CDN, no build step), and the runbooks its alarms
//! link to, served on the admin listener of either mode.
//!
//! Invariants:
//! - only `GET` and `HEAD` of a path in [`ASSETS`] or [`RUNBOOKS`] is served without a
//!   token: the sign-in page must load before there is one. Everything else (the API)
//!   stays behind the token, and a file tells nothing about the process;
//! - every answer carries [`CONTENT_SECURITY_POLICY`] (no inline script or style, no
//!   other origin, no framing) and `nosniff`, `no-referrer`, `no-store`; no cookie is
//!   ever set: the page keeps its token in the tab's sessionStorage and sends it as the
//!   bearer header.

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_SECURITY_POLICY as CSP, CONTENT_TYPE, REFERRER_POLICY};
use hyper::{Method, Response, StatusCode};

/// The policy of every console answer.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// One file of the console.
#[derive(Debug)]
pub struct Asset {
    pub path: &'static str,
    pub content_type: &'static str,
    pub body: &'static [u8],
}

const HTML: &str = "text/html; charset=utf-8";
const TEXT: &str = "text/plain; charset=utf-8";

/// The console's own files.
pub const ASSETS: &[Asset] = &[
    Asset { path: "/", content_type: HTML, body: include_bytes!("../console/index.html") },
    Asset {
        path: "/console/app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../console/app.js"),
    },
    Asset {
        path: "/console/pages.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../console/pages.js"),
    },
    Asset {
        path: "/console/app.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("../console/app.css"),
    },
    Asset { path: "/console/icon.svg", content_type: "image/svg+xml", body: include_bytes!("../console/icon.svg") },
];

macro_rules! runbook {
    ($file:literal) => {
        Asset {
            path: concat!("/console/runbooks/", $file),
            content_type: TEXT,
            body: include_bytes!(concat!("../../../runbooks/", $file)),
        }
    };
}

/// The runbooks (runbooks/ of the repository), as text: an alarm's link works without
/// internet. A runbook `runbooks/x.md` is at `/console/runbooks/x.md`.
pub const RUNBOOKS: &[Asset] = &[
    runbook!("exactly-once.md"),
    runbook!("inbox-backlog.md"),
    runbook!("inbox-replay.md"),
    runbook!("inbox-review-required.md"),
    runbook!("kafka-maintenance.md"),
    runbook!("kafka-outage.md"),
    runbook!("long-transaction.md"),
    runbook!("otel-and-cloudevents.md"),
    runbook!("outbox-recreated.md"),
    runbook!("poison-record.md"),
    runbook!("replay.md"),
    runbook!("slot-lost.md"),
    runbook!("slot-wal-buildup.md"),
    runbook!("standby-decoding.md"),
    runbook!("upgrade-and-failover.md"),
];

/// The console file a request asks for, if it asks for one.
pub fn find(method: &Method, path: &str) -> Option<&'static Asset> {
    if method != Method::GET && method != Method::HEAD {
        return None;
    }
    ASSETS.iter().chain(RUNBOOKS).find(|a| a.path == path)
}

/// The answer with a console file, its headers set.
pub fn response(asset: &Asset, method: &Method) -> Response<Full<Bytes>> {
    let body = if method == Method::HEAD { Bytes::new() } else { Bytes::from_static(asset.body) };
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(asset.content_type));
    secure(headers);
    response
}

/// The headers every console answer carries.
pub(crate) fn secure(headers: &mut hyper::HeaderMap) {
    headers.insert(CSP, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    headers.insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    headers.insert(REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serves_its_files_to_get_and_head_only() {
        for path in ["/", "/console/app.js", "/console/app.css", "/console/icon.svg", "/console/runbooks/slot-lost.md"]
        {
            assert!(find(&Method::GET, path).is_some(), "{path}");
            assert!(find(&Method::HEAD, path).is_some(), "{path}");
            assert!(find(&Method::POST, path).is_none(), "{path}");
        }
        for path in ["/api/v1/status", "/console/", "/console/../Cargo.toml", "/index.html", "/console/runbooks/x.md"] {
            assert!(find(&Method::GET, path).is_none(), "{path}");
        }
    }

    #[test]
    fn every_runbook_of_the_repository_is_served() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../runbooks");
        for entry in std::fs::read_dir(dir).unwrap() {
            let name = entry.unwrap().file_name().into_string().unwrap();
            if name.ends_with(".md") {
                assert!(find(&Method::GET, &format!("/console/runbooks/{name}")).is_some(), "add {name} to RUNBOOKS");
            }
        }
    }

    #[test]
    fn no_file_has_inline_script_or_style() {
        let html = std::str::from_utf8(find(&Method::GET, "/").unwrap().body).unwrap();
        assert!(html.contains("<script src=\"/console/app.js\" defer></script>"), "{html}");
        assert!(
            !html.contains("<style")
                && !html.contains("style=")
                && !html.contains(" onclick=")
                && !html.contains(" onsubmit="),
            "{html}"
        );
        for path in ["/console/app.js", "/console/pages.js"] {
            let js = std::str::from_utf8(find(&Method::GET, path).unwrap().body).unwrap();
            assert!(!js.contains("innerHTML") && !js.contains("eval(") && !js.contains("document.cookie"), "{path}");
        }
    }

    #[test]
    fn answers_carry_the_policy() {
        let r = response(find(&Method::GET, "/").unwrap(), &Method::GET);
        let h = r.headers();
        assert_eq!(h[CSP], CONTENT_SECURITY_POLICY);
        assert_eq!(h[CONTENT_TYPE], HTML);
        assert_eq!(h["x-content-type-options"], "nosniff");
        assert_eq!(h[REFERRER_POLICY], "no-referrer");
        assert_eq!(h[CACHE_CONTROL], "no-store");
        assert!(h.get(hyper::header::SET_COOKIE).is_none());
    }
}
