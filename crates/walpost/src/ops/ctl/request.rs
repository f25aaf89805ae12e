//! [`Action`]s of `walpost ctl` and the [`Request`] each one is (pure): the route, the
//! escaped path segments and query, the JSON body.

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde_json::{json, Value};

use super::CtlError;

/// A path segment: everything but RFC 3986's unreserved characters escaped.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// Which inbox messages a retry or dismiss is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Selection {
    EventIds(Vec<String>),
    ErrorCode(String),
}

/// Which dead letters a redrive is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Redrive {
    EventIds(Vec<String>),
    Reason(String),
}

/// A replay to start: `walpost replay`'s flags, each optional as there (the API refuses
/// a start that selects nothing unless `all` says so).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ReplayStart {
    pub(crate) condition: Option<String>,
    pub(crate) since: Option<String>,
    pub(crate) until: Option<String>,
    /// The replay's id (the `walpost.replay` header).
    pub(crate) id: Option<String>,
    pub(crate) time_column: Option<String>,
    pub(crate) dry_run: bool,
    pub(crate) all: bool,
}

/// One command of `walpost ctl`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    Whoami,
    Status,
    Pause,
    Resume,
    DeadLetters { limit: Option<u32>, payload: bool },
    Redrive(Redrive),
    ReplayStart(ReplayStart),
    ReplayList,
    ReplayShow(String),
    ReplayStop(String),
    InboxStatus,
    InboxHandlers,
    InboxReview { handler: String, grouped: bool, error_code: Option<String>, limit: Option<u32> },
    InboxRetry { handler: String, selection: Selection },
    InboxDismiss { handler: String, selection: Selection },
    InboxPause(String),
    InboxResume(String),
}

/// What goes to the listener (the token aside).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Request {
    pub(crate) method: &'static str,
    /// Under the URL's path: `/api/v1/...`, with its query.
    pub(crate) path: String,
    pub(crate) body: Option<Value>,
}

impl Action {
    /// The request this action is (pure).
    pub(crate) fn request(&self) -> Result<Request, CtlError> {
        let get = |path: String| Ok(Request { method: "GET", path, body: None });
        let post = |path: String, body: Option<Value>| Ok(Request { method: "POST", path, body });
        match self {
            Action::Whoami => get("/api/v1/whoami".into()),
            Action::Status => get("/api/v1/status".into()),
            Action::Pause => post("/api/v1/pause".into(), None),
            Action::Resume => post("/api/v1/resume".into(), None),
            Action::DeadLetters { limit, payload } => {
                let mut query = Vec::new();
                if let Some(n) = limit {
                    query.push(format!("limit={n}"));
                }
                if *payload {
                    query.push("payload=true".into());
                }
                get(with_query("/api/v1/dead-letters", &query))
            }
            Action::Redrive(Redrive::EventIds(ids)) => {
                post("/api/v1/dead-letters/redrive".into(), Some(json!({ "event_ids": ids })))
            }
            Action::Redrive(Redrive::Reason(reason)) => {
                post("/api/v1/dead-letters/redrive".into(), Some(json!({ "reason": reason })))
            }
            Action::ReplayStart(start) => post("/api/v1/replays".into(), Some(replay_body(start))),
            Action::ReplayList => get("/api/v1/replays".into()),
            Action::ReplayShow(id) => get(format!("/api/v1/replays/{}", segment(id)?)),
            Action::ReplayStop(id) => {
                Ok(Request { method: "DELETE", path: format!("/api/v1/replays/{}", segment(id)?), body: None })
            }
            Action::InboxStatus => get("/api/v1/inbox/status".into()),
            Action::InboxHandlers => get("/api/v1/inbox/handlers".into()),
            Action::InboxReview { handler, grouped, error_code, limit } => {
                let mut query = Vec::new();
                if *grouped {
                    query.push("group_by=error_code".to_owned());
                }
                if let Some(code) = error_code {
                    query.push(format!("error_code={}", utf8_percent_encode(code, SEGMENT)));
                }
                if let Some(n) = limit {
                    query.push(format!("limit={n}"));
                }
                get(with_query(&format!("/api/v1/inbox/handlers/{}/review", segment(handler)?), &query))
            }
            Action::InboxRetry { handler, selection } => {
                post(format!("/api/v1/inbox/handlers/{}/retry", segment(handler)?), Some(selection_body(selection)))
            }
            Action::InboxDismiss { handler, selection } => {
                post(format!("/api/v1/inbox/handlers/{}/dismiss", segment(handler)?), Some(selection_body(selection)))
            }
            Action::InboxPause(handler) => post(format!("/api/v1/inbox/handlers/{}/pause", segment(handler)?), None),
            Action::InboxResume(handler) => post(format!("/api/v1/inbox/handlers/{}/resume", segment(handler)?), None),
        }
    }
}

fn with_query(path: &str, query: &[String]) -> String {
    if query.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{}", query.join("&"))
    }
}

/// The fields given, and no others: an absent one takes the API's default.
fn replay_body(start: &ReplayStart) -> Value {
    let mut body = serde_json::Map::new();
    let texts = [
        ("where", &start.condition),
        ("since", &start.since),
        ("until", &start.until),
        ("id", &start.id),
        ("time_column", &start.time_column),
    ];
    for (field, value) in texts {
        if let Some(value) = value {
            body.insert(field.to_owned(), Value::from(value.as_str()));
        }
    }
    if start.dry_run {
        body.insert("dry_run".to_owned(), Value::Bool(true));
    }
    if start.all {
        body.insert("all".to_owned(), Value::Bool(true));
    }
    Value::Object(body)
}

fn selection_body(selection: &Selection) -> Value {
    match selection {
        Selection::EventIds(ids) => json!({ "event_ids": ids }),
        Selection::ErrorCode(code) => json!({ "error_code": code }),
    }
}

/// `name` as one path segment; `.` and `..` are refused (a server may resolve them as
/// dot-segments even escaped).
fn segment(name: &str) -> Result<String, CtlError> {
    if name == "." || name == ".." {
        return Err(CtlError::DotName(name.to_owned()));
    }
    Ok(utf8_percent_encode(name, SEGMENT).to_string())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn request(action: Action) -> (String, String, Option<String>) {
        let r = action.request().unwrap();
        (r.method.to_owned(), r.path, r.body.map(|b| b.to_string()))
    }

    #[test]
    fn every_action_is_its_route_and_body() {
        let ids = || vec!["e1".to_owned(), "e 2".to_owned()];
        let cases = [
            (Action::Whoami, "GET", "/api/v1/whoami", None),
            (Action::Status, "GET", "/api/v1/status", None),
            (Action::Pause, "POST", "/api/v1/pause", None),
            (Action::Resume, "POST", "/api/v1/resume", None),
            (Action::DeadLetters { limit: None, payload: false }, "GET", "/api/v1/dead-letters", None),
            (
                Action::DeadLetters { limit: Some(5), payload: true },
                "GET",
                "/api/v1/dead-letters?limit=5&payload=true",
                None,
            ),
            (
                Action::Redrive(Redrive::EventIds(ids())),
                "POST",
                "/api/v1/dead-letters/redrive",
                Some(r#"{"event_ids":["e1","e 2"]}"#),
            ),
            (
                Action::Redrive(Redrive::Reason("schema".into())),
                "POST",
                "/api/v1/dead-letters/redrive",
                Some(r#"{"reason":"schema"}"#),
            ),
            (
                Action::ReplayStart(ReplayStart {
                    condition: Some("aggregate_type = 'order'".into()),
                    ..ReplayStart::default()
                }),
                "POST",
                "/api/v1/replays",
                Some(r#"{"where":"aggregate_type = 'order'"}"#),
            ),
            (
                Action::ReplayStart(ReplayStart {
                    condition: Some("c".into()),
                    since: Some("a".into()),
                    until: Some("b".into()),
                    id: Some("fix-42".into()),
                    time_column: Some("created_at".into()),
                    dry_run: true,
                    all: false,
                }),
                "POST",
                "/api/v1/replays",
                Some(
                    r#"{"dry_run":true,"id":"fix-42","since":"a","time_column":"created_at","until":"b","where":"c"}"#,
                ),
            ),
            (
                Action::ReplayStart(ReplayStart { all: true, ..ReplayStart::default() }),
                "POST",
                "/api/v1/replays",
                Some(r#"{"all":true}"#),
            ),
            (Action::ReplayList, "GET", "/api/v1/replays", None),
            (Action::ReplayShow("replay-1".into()), "GET", "/api/v1/replays/replay-1", None),
            (Action::ReplayStop("r/1".into()), "DELETE", "/api/v1/replays/r%2F1", None),
            (Action::InboxStatus, "GET", "/api/v1/inbox/status", None),
            (Action::InboxHandlers, "GET", "/api/v1/inbox/handlers", None),
            (
                Action::InboxReview { handler: "billing".into(), grouped: true, error_code: None, limit: None },
                "GET",
                "/api/v1/inbox/handlers/billing/review?group_by=error_code",
                None,
            ),
            (
                Action::InboxReview {
                    handler: "bill ing/é".into(),
                    grouped: false,
                    error_code: Some("http 503&x".into()),
                    limit: Some(10),
                },
                "GET",
                "/api/v1/inbox/handlers/bill%20ing%2F%C3%A9/review?error_code=http%20503%26x&limit=10",
                None,
            ),
            (
                Action::InboxRetry { handler: "h".into(), selection: Selection::ErrorCode("http_503".into()) },
                "POST",
                "/api/v1/inbox/handlers/h/retry",
                Some(r#"{"error_code":"http_503"}"#),
            ),
            (
                Action::InboxDismiss { handler: "h".into(), selection: Selection::EventIds(ids()) },
                "POST",
                "/api/v1/inbox/handlers/h/dismiss",
                Some(r#"{"event_ids":["e1","e 2"]}"#),
            ),
            (Action::InboxPause("a.b".into()), "POST", "/api/v1/inbox/handlers/a.b/pause", None),
            (Action::InboxResume("a?b".into()), "POST", "/api/v1/inbox/handlers/a%3Fb/resume", None),
        ];
        for (action, method, path, body) in cases {
            let want = (method.to_owned(), path.to_owned(), body.map(str::to_owned));
            assert_eq!(request(action.clone()), want, "{action:?}");
        }
        for dot in [".", ".."] {
            assert!(matches!(Action::InboxPause(dot.into()).request(), Err(CtlError::DotName(_))));
        }
    }
}
