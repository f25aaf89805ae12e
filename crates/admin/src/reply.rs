//! What the listener answers: a JSON body, and for errors `{"error": ..., "hint": ...}`
//! (what went wrong, then what to do). Error texts never repeat a request's body or
//! headers: a body may be a payload, a header a token.

use hyper::{Method, StatusCode};
use serde::Serialize;

/// An error answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    status: StatusCode,
    error: String,
    hint: String,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
    hint: &'a str,
}

impl ApiError {
    pub fn new(status: StatusCode, error: impl Into<String>, hint: impl Into<String>) -> ApiError {
        ApiError { status, error: error.into(), hint: hint.into() }
    }

    pub fn status(&self) -> StatusCode {
        self.status
    }

    pub fn error(&self) -> &str {
        &self.error
    }

    pub fn hint(&self) -> &str {
        &self.hint
    }

    pub(crate) fn unauthenticated(what: &str) -> ApiError {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            what,
            "send Authorization: Bearer <token> with a token whose sha256 is in [admin] tokens_file",
        )
    }

    pub(crate) fn forbidden(role: crate::Role) -> ApiError {
        ApiError::new(
            StatusCode::FORBIDDEN,
            format!("a {role} token may only read"),
            "actions need a token with the role operator in [admin] tokens_file",
        )
    }

    pub(crate) fn not_found<'p>(path: &str, known: impl Iterator<Item = &'p str>) -> ApiError {
        let mut known: Vec<&str> = known.collect();
        known.dedup();
        // The path is the client's own text; a long one is cut so the answer stays small.
        let shown: String = path.chars().take(200).collect();
        ApiError::new(StatusCode::NOT_FOUND, format!("no such route: {shown}"), format!("routes: {}", known.join(", ")))
    }

    pub(crate) fn method_not_allowed(method: &Method, allowed: &[&str]) -> ApiError {
        ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{method} is not allowed here"),
            format!("this route takes {}", allowed.join(", ")),
        )
    }

    pub(crate) fn too_large(limit: usize) -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than {limit} bytes"),
            "send fewer items per request",
        )
    }

    /// A body that is not the JSON a route takes: says where and what kind of problem,
    /// without the text itself (a value could be a payload).
    pub fn bad_json(e: &serde_json::Error, expected: &str) -> ApiError {
        use serde_json::error::Category;
        let what = match e.classify() {
            Category::Syntax => "the body is not valid JSON",
            Category::Eof => "the body ends before its JSON does",
            Category::Data => "the body's JSON does not have the expected fields or types",
            Category::Io => "the body could not be read",
        };
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("{what} (line {}, column {})", e.line(), e.column()),
            format!("expected {expected}"),
        )
    }

    pub fn internal(what: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, what, "see walpost's log")
    }

    pub(crate) fn body(&self) -> Vec<u8> {
        serde_json::to_vec(&ErrorBody { error: &self.error, hint: &self.hint }).unwrap_or_default()
    }
}

/// A handler's answer: a status, a JSON body and, for an action, what it acted on (the
/// audit line's target).
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: StatusCode,
    pub body: Vec<u8>,
    pub target: Option<String>,
}

impl Reply {
    /// 200 with `value` as JSON.
    pub fn ok<T: Serialize>(value: &T) -> Reply {
        match serde_json::to_vec(value) {
            Ok(body) => Reply { status: StatusCode::OK, body, target: None },
            Err(e) => ApiError::internal(format!("cannot encode the answer: {e}")).into(),
        }
    }

    /// The audit line's target of an action.
    pub fn with_target(mut self, target: impl Into<String>) -> Reply {
        self.target = Some(target.into());
        self
    }
}

impl From<ApiError> for Reply {
    fn from(e: ApiError) -> Reply {
        Reply { status: e.status, body: e.body(), target: None }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_json_says_where_and_not_what() {
        let e = serde_json::from_str::<Vec<u32>>("[1, \"CANARY-payload\"]").unwrap_err();
        let api = ApiError::bad_json(&e, "an array of numbers");
        assert_eq!(api.status(), StatusCode::BAD_REQUEST);
        assert!(api.error().contains("line 1, column"), "{api:?}");
        assert!(!api.error().contains("CANARY") && !api.hint().contains("CANARY"), "{api:?}");
        let body: serde_json::Value = serde_json::from_slice(&api.body()).unwrap();
        assert_eq!(body["hint"], "expected an array of numbers");
        let e = serde_json::from_str::<Vec<u32>>("[1,").unwrap_err();
        assert!(ApiError::bad_json(&e, "x").error().contains("ends before"));
    }
}
