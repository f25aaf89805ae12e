//! `walpost inbox`'s admin API on the `admin` crate's listener (`[admin] addr`,
//! docs/control-plane.md): the handlers at a glance, a handler's review queue, retry and
//! dismiss in bulk, pause and resume, through `inbox::control` (the SQL API of
//! migrations/inbox/0005_inbox_control.sql); and a status from the process's metrics.
//!
//! Invariants:
//! - the API has a connection of its own (never the writer's), made at the first request
//!   as the inbox's role with `search_path` fixed, and used by one request at a time: a
//!   slow statement or a burst of requests never holds the ingest back;
//! - a statement runs at most [`STATEMENT_TIMEOUT`] (on the server and here); a
//!   connection whose request was cut off or failed below SQL is dropped, not reused;
//! - the SQL functions decide what a role may do to which handler: a refusal there
//!   (42501) is a 403 that says which grants, never a message with the statement or a
//!   value in it;
//! - an action's audit target is the handler and a summary of the selection (an error
//!   code, or how many ids and the first few), never a body or a payload.
//!
//! Why one file over 600 lines: the routes, their query and body parsing and the mapping
//! of the SQL API's errors are one API, read together; a third of it is unit tests.

use std::time::Duration;

use ::inbox::control::{self, ControlError, Selection};
use ::inbox::metrics::{InboxMetrics, PartitionLag};
use ::inbox::settings::InboxSettings;
use admin::{Api, ApiError, Call, Reply, Routes};
use hyper::StatusCode;
use replication::ReplicationClient;
use serde::{Deserialize, Serialize};
use tokio::sync::{watch, Mutex};

use crate::error::{ErrorKind, PipelineError};
use crate::settings::admin::AdminSettings;

/// The longest one statement of the API may run.
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(15);
/// Messages a review listing returns unless `?limit=N` says otherwise.
const DEFAULT_REVIEW_LIMIT: u32 = 100;
/// Event ids an audit target names (then how many more).
const AUDIT_IDS: usize = 5;

/// A call on the API's connection.
type Boxed<'c, T> = std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, ControlError>> + Send + 'c>>;

/// `walpost inbox`'s routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    Status,
    Handlers,
    Review,
    Retry,
    Dismiss,
    Pause,
    Resume,
}

fn routes() -> Routes<Route> {
    Routes::new()
        .get("/api/v1/inbox/status", Route::Status)
        .get("/api/v1/inbox/handlers", Route::Handlers)
        .get("/api/v1/inbox/handlers/{handler}/review", Route::Review)
        .post("/api/v1/inbox/handlers/{handler}/retry", Route::Retry)
        .post("/api/v1/inbox/handlers/{handler}/dismiss", Route::Dismiss)
        .post("/api/v1/inbox/handlers/{handler}/pause", Route::Pause)
        .post("/api/v1/inbox/handlers/{handler}/resume", Route::Resume)
}

/// What `GET /api/v1/inbox/status` answers: the process's own figures, no query.
#[derive(Debug, Serialize, PartialEq)]
pub(crate) struct Status {
    /// `starting`, `consuming` or `halted`.
    pub(crate) state: &'static str,
    pub(crate) group: String,
    pub(crate) schema: String,
    pub(crate) halted_reason: Option<String>,
    /// Partitions the group assigned to this instance.
    pub(crate) assigned_partitions: i64,
    /// Each assigned partition's lag in records, as librdkafka last reported it.
    pub(crate) consumer_lag: Vec<PartitionLag>,
    /// Records stored, duplicates and rejected since this process started.
    pub(crate) records_stored: u64,
    pub(crate) duplicates: u64,
    pub(crate) rejected: u64,
    /// Records stored per second over the last minute (`null` in the first 5 s), as
    /// `rate(walpost_inbox_records_total{result="stored"}[1m])`.
    pub(crate) records_per_second: Option<f64>,
}

/// The body of retry and dismiss: exactly one of the two.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SelectionBody {
    event_ids: Option<Vec<String>>,
    error_code: Option<String>,
}

const SELECTION_SHAPE: &str = r#"{"event_ids": ["..."]} or {"error_code": "..."}"#;

/// What a review listing asked for in its query.
#[derive(Debug, PartialEq, Eq)]
struct ReviewQuery {
    grouped: bool,
    error_code: Option<String>,
    limit: u32,
}

/// The API of one `walpost inbox`.
#[derive(Debug)]
pub(crate) struct InboxApi {
    routes: Routes<Route>,
    postgres: replication::Config,
    schema: String,
    group: String,
    metrics: InboxMetrics,
    /// The API's connection, out of its slot while a request uses it.
    sql: Mutex<Option<ReplicationClient>>,
    stored_rate: super::history::Rate,
}

impl Api for InboxApi {
    type Route = Route;

    fn routes(&self) -> &Routes<Route> {
        &self.routes
    }

    async fn handle(&self, call: Call<Route>) -> Reply {
        let handler = call.param("handler").map(percent_decode);
        match (call.route, handler) {
            (Route::Status, _) => Reply::ok(&self.status()),
            (Route::Handlers, _) => self.handlers().await,
            (_, None) => ApiError::internal("a handler route without its handler").into(),
            (_, Some(None)) => ApiError::new(
                StatusCode::BAD_REQUEST,
                "the handler name is not valid UTF-8",
                "percent-encode it as UTF-8",
            )
            .into(),
            (Route::Review, Some(Some(h))) => self.review(&h, call.query.as_deref()).await,
            (route @ (Route::Retry | Route::Dismiss), Some(Some(h))) => {
                let target = format!("handler={}", shown(&h, 200));
                match call.json::<SelectionBody>(SELECTION_SHAPE).and_then(selection) {
                    Err(e) => Reply::from(e).with_target(target),
                    Ok(body) => {
                        let target = format!("{target} {}", summary(&body));
                        self.bulk(route, &h, &body).await.with_target(target)
                    }
                }
            }
            (route @ (Route::Pause | Route::Resume), Some(Some(h))) => {
                let target = format!("handler={}", shown(&h, 200));
                self.switch(route == Route::Pause, &h).await.with_target(target)
            }
        }
    }
}

/// The selection of a retry or dismiss body: exactly one of `event_ids` (not empty) and
/// `error_code`.
fn selection(body: SelectionBody) -> Result<SelectionBody, ApiError> {
    let bad = |what: &str| ApiError::new(StatusCode::BAD_REQUEST, what, format!("send {SELECTION_SHAPE}"));
    match (&body.event_ids, &body.error_code) {
        (Some(_), Some(_)) => Err(bad("the body has both event_ids and error_code; one selects")),
        (None, None) => Err(bad("the body has neither event_ids nor error_code")),
        (Some(ids), None) if ids.is_empty() => Err(bad("event_ids is empty")),
        _ => Ok(body),
    }
}

/// The audit target's words for a selection.
fn summary(body: &SelectionBody) -> String {
    match (&body.event_ids, &body.error_code) {
        (_, Some(code)) if is_error_code(code) => format!("error_code={code}"),
        // Not a code inbox.fail could have written (the SQL refuses it): it may be a
        // message's text, so the audit records only that it was not a code.
        (_, Some(code)) => format!("error_code=(not a code, {} characters)", code.chars().count()),
        (Some(ids), None) => {
            let first: Vec<String> = ids.iter().take(AUDIT_IDS).map(|id| shown(id, 64)).collect();
            let more = ids.len().saturating_sub(AUDIT_IDS);
            let more = if more > 0 { format!(" and {more} more") } else { String::new() };
            format!("event_ids={} ({}{more})", ids.len(), first.join(","))
        }
        (None, None) => String::new(),
    }
}

/// The shape `inbox.fail` and the SQL API's `check_error_code` accept:
/// `^[A-Za-z0-9_.:-]{1,64}$`.
fn is_error_code(code: &str) -> bool {
    (1..=64).contains(&code.len()) && code.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.:-".contains(&b))
}

/// A client's text as an audit target or error shows it: control characters out (one
/// line per record), at most `max` characters.
fn shown(text: &str, max: usize) -> String {
    let mut out: String = text.chars().filter(|c| !c.is_control()).take(max).collect();
    if text.chars().count() > max {
        out.push('…');
    }
    out
}

/// A path segment's `%XX` escapes decoded; `None` when the bytes are not UTF-8.
fn percent_decode(segment: &str) -> Option<String> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1).and_then(|b| hex(*b)), bytes.get(i + 2).and_then(|b| hex(*b))) {
            (b'%', Some(hi), Some(lo)) => {
                out.push((hi * 16 + lo) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// A query string's `key=value` pairs, decoded (`+` is a space).
fn query_pairs(query: &str) -> Result<Vec<(String, String)>, ApiError> {
    let bad = || ApiError::new(StatusCode::BAD_REQUEST, "the query string is not valid UTF-8", "percent-encode it");
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            Ok((
                percent_decode(&k.replace('+', " ")).ok_or_else(bad)?,
                percent_decode(&v.replace('+', " ")).ok_or_else(bad)?,
            ))
        })
        .collect()
}

/// `?group_by=error_code`, `?error_code=...`, `?limit=N` of a review listing.
fn review_query(query: Option<&str>) -> Result<ReviewQuery, ApiError> {
    let mut q = ReviewQuery { grouped: false, error_code: None, limit: DEFAULT_REVIEW_LIMIT };
    let bad = |what: String, hint: &str| ApiError::new(StatusCode::BAD_REQUEST, what, hint);
    for (key, value) in query_pairs(query.unwrap_or(""))? {
        match key.as_str() {
            "group_by" if value == "error_code" => q.grouped = true,
            "group_by" => {
                return Err(bad(format!("group_by={} is not a grouping", shown(&value, 64)), "group_by=error_code"))
            }
            "error_code" => q.error_code = Some(value),
            "limit" => {
                q.limit =
                    value.parse().ok().filter(|n| (1..=control::MAX_REVIEW_ROWS).contains(n)).ok_or_else(|| {
                        bad(
                            format!("limit={} is not a number of messages", shown(&value, 32)),
                            &format!("limit is 1 to {}", control::MAX_REVIEW_ROWS),
                        )
                    })?;
            }
            other => {
                return Err(bad(
                    format!("unknown query parameter {}", shown(other, 64)),
                    "this route takes group_by=error_code, or error_code and limit (payloads are not served)",
                ))
            }
        }
    }
    if q.grouped && q.error_code.is_some() {
        return Err(bad("group_by and error_code together".into(), "group, or list one error code's messages"));
    }
    Ok(q)
}

/// A refusal or failure of the SQL API as an answer: never the statement, never a value
/// the client did not send; the whole error goes to the log for a 5xx.
fn control_error(e: &ControlError, what: &str) -> ApiError {
    if e.sqlstate() == Some("42501") {
        return ApiError::new(
            StatusCode::FORBIDDEN,
            format!("the inbox's PostgreSQL role may not {what}"),
            "grant the role the admin API's calls and the handler, as docs/inbox.md \"Roles and grants\" says (GRANT EXECUTE on the control functions, SELECT on handler_overview, INSERT on admin_audit, SELECT inbox.grant_handler(handler, role))",
        );
    }
    if e.is_bad_input() {
        // Our own refusal, or the SQL API's check: its message names the bound, not a value.
        let text = match e {
            ControlError::Postgres(replication::Error::Server(m)) => m.message.clone(),
            other => other.to_string(),
        };
        return ApiError::new(StatusCode::BAD_REQUEST, text, "change the request: asking again unchanged fails again");
    }
    tracing::warn!(action = what, "admin API: the inbox's SQL API failed: {e}");
    match e {
        ControlError::Postgres(replication::Error::Server(m))
            if matches!(m.code.as_str(), "42883" | "42P01" | "42703" | "3F000") =>
        {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the inbox schema has no control API (SQLSTATE {})", m.code),
                "apply migrations/inbox/0005_inbox_control.sql: walpost migrate --inbox (or [inbox] create_schema)",
            )
        }
        ControlError::Postgres(replication::Error::Server(m)) => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("PostgreSQL refused the call (SQLSTATE {})", m.code),
            "see walpost's log",
        ),
        ControlError::Postgres(_) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "cannot reach the inbox's database",
            "see walpost's log; ask again once PostgreSQL answers",
        ),
        _ => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "unexpected answer from the inbox's SQL API",
            "see walpost's log; is migrations/inbox/0005_inbox_control.sql applied?",
        ),
    }
}

/// Whether the connection is as good after `e` as before: PostgreSQL answered (or nothing
/// was sent).
fn connection_survives(e: &ControlError) -> bool {
    match e {
        ControlError::Postgres(replication::Error::Server(_)) => true,
        ControlError::Postgres(_) => false,
        ControlError::Refused(_) | ControlError::Unreadable(_) => true,
    }
}

impl InboxApi {
    fn status(&self) -> Status {
        let health = self.metrics.health();
        let halted = health.halted().map(str::to_owned);
        let state = match (&halted, health.is_streaming()) {
            (Some(_), _) => "halted",
            (None, true) => "consuming",
            (None, false) => "starting",
        };
        Status {
            state,
            group: self.group.clone(),
            schema: self.schema.clone(),
            halted_reason: halted,
            assigned_partitions: self.metrics.assigned_partitions(),
            consumer_lag: self.metrics.consumer_lags(),
            records_stored: self.metrics.records_total("stored"),
            duplicates: self.metrics.records_total("duplicate"),
            rejected: self.metrics.records_total("rejected"),
            records_per_second: self.stored_rate.lock().ok().and_then(|r| r.rate()),
        }
    }

    /// Runs `call` on the API's connection (made first when there is none), within
    /// [`STATEMENT_TIMEOUT`]. The connection goes back to its slot only when it is known
    /// to be usable: a request cut off mid-statement drops it with its future.
    async fn with_sql<T, F>(&self, what: &str, call: F) -> Result<T, ApiError>
    where
        F: for<'c> FnOnce(&'c mut ReplicationClient) -> Boxed<'c, T>,
    {
        let mut slot = self.sql.lock().await;
        let mut client = match slot.take() {
            Some(client) => client,
            None => match tokio::time::timeout(STATEMENT_TIMEOUT, connect(&self.postgres)).await {
                Ok(Ok(client)) => client,
                Ok(Err(e)) => return Err(control_error(&ControlError::Postgres(e), what)),
                Err(_) => {
                    tracing::warn!("admin API: no connection to the inbox's database within {STATEMENT_TIMEOUT:?}");
                    return Err(ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "cannot reach the inbox's database",
                        "see walpost's log; ask again once PostgreSQL answers",
                    ));
                }
            },
        };
        match tokio::time::timeout(STATEMENT_TIMEOUT + Duration::from_secs(1), call(&mut client)).await {
            Ok(Ok(value)) => {
                *slot = Some(client);
                Ok(value)
            }
            Ok(Err(e)) => {
                if connection_survives(&e) {
                    *slot = Some(client);
                }
                Err(control_error(&e, what))
            }
            Err(_) => Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the inbox's database did not answer within {} s", STATEMENT_TIMEOUT.as_secs()),
                "ask again; see walpost's log and the database's load",
            )),
        }
    }

    async fn handlers(&self) -> Reply {
        let schema = self.schema.clone();
        let answer = self
            .with_sql("read inbox.handler_overview", move |c| {
                Box::pin(async move { control::handlers(c, &schema).await })
            })
            .await;
        match answer {
            Ok(handlers) => Reply::ok(&serde_json::json!({ "handlers": handlers })),
            Err(e) => e.into(),
        }
    }

    async fn review(&self, handler: &str, query: Option<&str>) -> Reply {
        let q = match review_query(query) {
            Ok(q) => q,
            Err(e) => return e.into(),
        };
        let (schema, h) = (self.schema.clone(), handler.to_owned());
        if q.grouped {
            let answer = self
                .with_sql("read the handler's review queue", move |c| {
                    Box::pin(async move { control::review_groups(c, &schema, &h).await })
                })
                .await;
            return match answer {
                Ok(groups) => Reply::ok(&serde_json::json!({ "handler": handler, "groups": groups })),
                Err(e) => e.into(),
            };
        }
        let (code, limit) = (q.error_code.clone(), q.limit);
        let answer = self
            .with_sql("read the handler's review queue", move |c| {
                Box::pin(async move { control::review_messages(c, &schema, &h, code.as_deref(), limit).await })
            })
            .await;
        match answer {
            Ok(messages) => {
                Reply::ok(&serde_json::json!({ "handler": handler, "limit": q.limit, "messages": messages }))
            }
            Err(e) => e.into(),
        }
    }

    async fn bulk(&self, route: Route, handler: &str, body: &SelectionBody) -> Reply {
        let retry = route == Route::Retry;
        let (schema, h) = (self.schema.clone(), handler.to_owned());
        let (ids, code) = (body.event_ids.clone(), body.error_code.clone());
        let what = if retry { "retry the handler's messages" } else { "dismiss the handler's messages" };
        let answer = self
            .with_sql(what, move |c| {
                Box::pin(async move {
                    let selection = match (&ids, &code) {
                        (_, Some(code)) => Selection::ErrorCode(code),
                        (Some(ids), None) => Selection::EventIds(ids),
                        (None, None) => Selection::EventIds(&[]),
                    };
                    match retry {
                        true => control::retry(c, &schema, &h, selection).await,
                        false => control::dismiss(c, &schema, &h, selection).await,
                    }
                })
            })
            .await;
        match answer {
            Ok(count) => Reply::ok(&serde_json::json!({ "count": count })),
            Err(e) => e.into(),
        }
    }

    async fn switch(&self, pause: bool, handler: &str) -> Reply {
        let (schema, h) = (self.schema.clone(), handler.to_owned());
        let what = if pause { "pause the handler" } else { "resume the handler" };
        let answer = self
            .with_sql(what, move |c| {
                Box::pin(async move {
                    match pause {
                        true => control::pause(c, &schema, &h).await,
                        false => control::resume(c, &schema, &h).await,
                    }
                })
            })
            .await;
        match answer {
            Ok(true) => Reply::ok(&serde_json::json!({ "paused": pause })),
            Ok(false) => ApiError::new(
                StatusCode::NOT_FOUND,
                format!("no handler {} in the inbox", shown(handler, 200)),
                "GET /api/v1/inbox/handlers lists them",
            )
            .into(),
            Err(e) => e.into(),
        }
    }
}

/// The API's connection: the inbox's role and connection string, its own session.
async fn connect(config: &replication::Config) -> Result<ReplicationClient, replication::Error> {
    let mut client = ReplicationClient::connect_sql(config).await?;
    // Every name the calls use is schema-qualified; the functions keep their own path.
    client
        .simple_query(&format!(
            "SET application_name = 'walpost inbox admin'; SET search_path = pg_catalog, pg_temp; SET statement_timeout = {}",
            STATEMENT_TIMEOUT.as_millis()
        ))
        .await?;
    Ok(client)
}

/// Starts `walpost inbox`'s listener of `[admin]`: reads the tokens file and the TLS files
/// (an error there stops walpost at start), binds, serves on its own thread until
/// `shutdown`. Actions are audited in the inbox's `admin_audit`.
pub(crate) fn start(
    admin: &AdminSettings,
    settings: &InboxSettings,
    metrics: &InboxMetrics,
    shutdown: watch::Receiver<bool>,
) -> Result<admin::Server, PipelineError> {
    let (tokens, tls) = super::listener_files(admin)?;
    let api = InboxApi {
        routes: routes(),
        postgres: settings.postgres.clone(),
        schema: settings.schema.clone(),
        group: settings.group.clone(),
        metrics: metrics.clone(),
        sql: Mutex::new(None),
        stored_rate: {
            let metrics = metrics.clone();
            super::history::spawn_rate(move || metrics.records_total("stored"), shutdown.clone())
        },
    };
    tracing::info!(tokens = tokens.len(), tls = tls.is_some(), "admin API: tokens file read");
    let audit = admin::TableAudit::new(settings.postgres.clone(), &settings.schema, "admin_audit");
    admin::serve(admin.addr, tls, tokens, api, audit, shutdown)
        .map_err(|e| PipelineError::definite(ErrorKind::Host, e.to_string()))
}

#[cfg(test)]
mod tests {
    use hyper::Method;

    use super::*;

    #[test]
    fn every_post_is_an_action_and_every_get_a_read() {
        let r = routes();
        for action in ["retry", "dismiss", "pause", "resume"] {
            let found = r.find(&Method::POST, &format!("/api/v1/inbox/handlers/billing/{action}")).unwrap();
            assert_eq!(found.access, admin::Access::Act, "{action}");
            assert_eq!(found.params, vec![("handler", "billing".to_owned())]);
        }
        for path in ["/api/v1/inbox/status", "/api/v1/inbox/handlers", "/api/v1/inbox/handlers/b/review"] {
            assert_eq!(r.find(&Method::GET, path).unwrap().access, admin::Access::Read, "{path}");
        }
        assert_eq!(r.find(&Method::GET, "/api/v1/inbox/handlers/b/retry").unwrap_err().status(), 405);
        assert_eq!(r.find(&Method::GET, "/api/v1/status").unwrap_err().status(), 404);
    }

    fn body(json: &str) -> Result<SelectionBody, ApiError> {
        serde_json::from_str::<SelectionBody>(json)
            .map_err(|e| ApiError::bad_json(&e, SELECTION_SHAPE))
            .and_then(selection)
    }

    #[test]
    fn a_selection_is_ids_or_an_error_code_never_both() {
        assert_eq!(body(r#"{"event_ids": ["a", "b"]}"#).unwrap().event_ids.unwrap(), ["a", "b"]);
        assert_eq!(body(r#"{"error_code": "http_503"}"#).unwrap().error_code.as_deref(), Some("http_503"));
        for bad in
            [r#"{"event_ids": ["a"], "error_code": "x"}"#, "{}", r#"{"event_ids": []}"#, r#"{"ids": ["a"]}"#, "{"]
        {
            let e = body(bad).unwrap_err();
            assert_eq!(e.status(), StatusCode::BAD_REQUEST, "{bad}");
            assert!(e.hint().contains("event_ids"), "{bad}: {e:?}");
        }
    }

    #[test]
    fn audit_targets_summarise_the_selection() {
        let ids: Vec<String> = (1..=7).map(|i| format!("e{i}")).collect();
        let many = SelectionBody { event_ids: Some(ids), error_code: None };
        assert_eq!(summary(&many), "event_ids=7 (e1,e2,e3,e4,e5 and 2 more)");
        let code = SelectionBody { event_ids: None, error_code: Some("http_503\nforged line".into()) };
        assert_eq!(summary(&code), "error_code=(not a code, 20 characters)");
        let code = SelectionBody { event_ids: None, error_code: Some("validation.bad_sku:v2-x".into()) };
        assert_eq!(summary(&code), "error_code=validation.bad_sku:v2-x");
        let long = SelectionBody { event_ids: None, error_code: Some("x".repeat(65)) };
        assert_eq!(summary(&long), "error_code=(not a code, 65 characters)");
        assert_eq!(shown(&"x".repeat(70), 64).chars().count(), 65);
    }

    #[test]
    fn names_and_queries_are_percent_decoded() {
        assert_eq!(percent_decode("billing%20v2").as_deref(), Some("billing v2"));
        assert_eq!(percent_decode("caf%C3%A9%2").as_deref(), Some("café%2"));
        assert_eq!(percent_decode("%FF"), None);
        let q = review_query(Some("group_by=error_code")).unwrap();
        assert!(q.grouped && q.limit == DEFAULT_REVIEW_LIMIT);
        let q = review_query(Some("error_code=http%5F503&limit=5")).unwrap();
        assert_eq!(q, ReviewQuery { grouped: false, error_code: Some("http_503".into()), limit: 5 });
        for bad in
            ["limit=0", "limit=10001", "limit=x", "group_by=topic", "payload=true", "group_by=error_code&error_code=x"]
        {
            assert_eq!(review_query(Some(bad)).unwrap_err().status(), StatusCode::BAD_REQUEST, "{bad}");
        }
    }

    #[test]
    fn status_comes_from_the_metrics() {
        let health =
            std::sync::Arc::new(crate::telemetry::Health::new(Duration::from_secs(30), Duration::from_secs(60)));
        let metrics = InboxMetrics::new(health.clone()).unwrap();
        metrics.records("orders", "stored", 4);
        metrics.records("orders", "duplicate", 2);
        let api = InboxApi {
            routes: routes(),
            postgres: replication::Config::parse("postgres://u@127.0.0.1:1/db").unwrap(),
            schema: "inbox".into(),
            group: "svc".into(),
            metrics,
            sql: Mutex::new(None),
            stored_rate: std::sync::Arc::default(),
        };
        let s = api.status();
        assert_eq!((s.state, s.records_stored, s.duplicates, s.rejected), ("starting", 4, 2, 0));
        health.set_streaming(true);
        let json = serde_json::to_value(api.status()).unwrap();
        assert_eq!(json["state"], "consuming");
        assert!(json["records_per_second"].is_null() && json["consumer_lag"].as_array().unwrap().is_empty());
        let t = std::time::Instant::now();
        if let Ok(mut r) = api.stored_rate.lock() {
            r.push(t, 4);
            r.push(t + Duration::from_secs(5), 54);
        }
        assert_eq!(api.status().records_per_second, Some(10.0));
    }
}
