//! What an operator does to the inbox's handlers, over the SQL API of
//! migrations/inbox/0005_inbox_control.sql: the handlers at a glance, the review queue
//! grouped by error code or listed, retry and dismiss in bulk, pause and resume, and the
//! audit row of an action. The admin API's inbox endpoints are these calls and JSON.
//!
//! Invariants:
//! - every value is a bind parameter; the schema is the only name in the text, quoted;
//! - the SQL functions decide (authorisation per handler, the review queue only, the
//!   heads of ordered handlers, the bounds): this module adds no rule of its own, and
//!   checks the bounds before sending only so that a refusal costs no round trip;
//! - nothing here returns or logs a payload: the review listing has no payload column.
//!
//! Each call is one statement: rows come back as one JSON document built by PostgreSQL
//! (`json_agg`), read with serde, so no text-format parser of arrays or timestamps is
//! needed here. Times are UTC, RFC 3339, to the microsecond.

use std::fmt;

use replication::ReplicationClient;
use serde::{Deserialize, Serialize};
use service::sql::{array, ident};

/// The most event ids one retry or dismiss call takes (the SQL functions' bound too).
pub const MAX_EVENT_IDS: usize = 10_000;

/// The most messages one review listing returns (the SQL function's bound too).
pub const MAX_REVIEW_ROWS: u32 = 10_000;

/// A handler at a glance (a row of `inbox.handler_overview`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HandlerOverview {
    pub handler: String,
    /// Pending messages (due or waiting for their backoff), leased ones included.
    pub backlog: i64,
    /// Age of the oldest pending message, by its arrival; 0 when none.
    pub oldest_pending_seconds: f64,
    /// Pending messages a worker holds.
    pub leased: i64,
    pub review_required: i64,
    /// Attempts so far of the open messages (pending or review_required).
    pub attempts: i64,
    pub paused: bool,
    /// Leases that ran out without complete or fail, since the handler was registered.
    pub leases_lost: i64,
}

/// The review queue's messages of one last error code.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReviewGroup {
    pub error_code: Option<String>,
    pub count: i64,
    /// Arrival of the group's oldest and newest message.
    pub first_at: String,
    pub last_at: String,
    /// The event ids of the group's oldest messages, at most 10.
    pub sample_event_ids: Vec<String>,
}

/// One message in review_required, without its payload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReviewMessage {
    pub event_id: String,
    pub topic: String,
    /// Where it was read from Kafka; `None` when its message is gone (`message_missing`).
    pub partition: Option<i32>,
    pub offset: Option<i64>,
    pub event_type: Option<String>,
    pub attempts: i32,
    pub last_error_code: Option<String>,
    pub received_at: String,
}

/// Which messages of the review queue a retry or dismiss is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selection<'a> {
    /// These event ids (every topic's message of each), at most [`MAX_EVENT_IDS`].
    EventIds(&'a [String]),
    /// Every message whose last error code is this.
    ErrorCode(&'a str),
}

/// One action of the admin API, as `inbox.admin_audit` keeps it: never a token or a
/// payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuditRow<'a> {
    /// The token's NAME in the tokens file.
    pub token_name: &'a str,
    /// `viewer` or `operator`.
    pub role: &'a str,
    pub action: &'a str,
    pub target: Option<&'a str>,
    pub result: &'a str,
}

/// Why a call did nothing.
#[derive(Debug)]
pub enum ControlError {
    /// Refused before anything was sent: the input is over a bound.
    Refused(String),
    /// PostgreSQL refused it (see [`ControlError::sqlstate`]: `42501` not granted the
    /// handler, `22023` a bad error code or bound, `54000` too many ids), or the
    /// connection failed.
    Postgres(replication::Error),
    /// An answer this module cannot read (an inbox schema from before 0005, say).
    Unreadable(String),
}

impl ControlError {
    /// The SQLSTATE PostgreSQL answered with, if it answered.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            ControlError::Postgres(e) => e.sqlstate(),
            _ => None,
        }
    }

    /// Whether the caller's input is at fault (refused here, or by the SQL API's checks):
    /// asking again unchanged fails again.
    pub fn is_bad_input(&self) -> bool {
        match self {
            ControlError::Refused(_) => true,
            // invalid_parameter_value, null_value_not_allowed, program_limit_exceeded
            ControlError::Postgres(e) => matches!(e.sqlstate(), Some("22023" | "22004" | "54000")),
            ControlError::Unreadable(_) => false,
        }
    }
}

impl fmt::Display for ControlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ControlError::Refused(why) => f.write_str(why),
            ControlError::Postgres(e) => write!(f, "{e}"),
            ControlError::Unreadable(why) => write!(f, "unexpected answer from the inbox's SQL API: {why}"),
        }
    }
}

impl std::error::Error for ControlError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ControlError::Postgres(e) => Some(e),
            _ => None,
        }
    }
}

impl From<replication::Error> for ControlError {
    fn from(e: replication::Error) -> Self {
        ControlError::Postgres(e)
    }
}

/// Every handler, by name.
pub async fn handlers(sql: &mut ReplicationClient, schema: &str) -> Result<Vec<HandlerOverview>, ControlError> {
    let s = ident(schema);
    let text = format!(
        "SELECT coalesce(pg_catalog.json_agg(pg_catalog.to_json(o) ORDER BY o.handler), '[]')::text AS rows
         FROM {s}.handler_overview o"
    );
    rows(sql.query(&text, &[]).await?)
}

/// The review queue of `handler`, one group per last error code, largest first.
pub async fn review_groups(
    sql: &mut ReplicationClient,
    schema: &str,
    handler: &str,
) -> Result<Vec<ReviewGroup>, ControlError> {
    let s = ident(schema);
    let text = format!(
        "SELECT coalesce(pg_catalog.json_agg(pg_catalog.json_build_object(
                'error_code', g.error_code, 'count', g.count,
                'first_at', {first_at}, 'last_at', {last_at},
                'sample_event_ids', g.sample_event_ids) ORDER BY g.count DESC, g.error_code), '[]')::text AS rows
         FROM {s}.review_groups($1) g",
        first_at = utc("g.first_at"),
        last_at = utc("g.last_at"),
    );
    rows(sql.query(&text, &[Some(handler)]).await?)
}

/// The messages of `handler` in review_required (of `error_code`, when given), oldest
/// first, at most `max_rows` (1 to [`MAX_REVIEW_ROWS`]).
pub async fn review_messages(
    sql: &mut ReplicationClient,
    schema: &str,
    handler: &str,
    error_code: Option<&str>,
    max_rows: u32,
) -> Result<Vec<ReviewMessage>, ControlError> {
    if !(1..=MAX_REVIEW_ROWS).contains(&max_rows) {
        return Err(ControlError::Refused(format!(
            "a review listing returns 1 to {MAX_REVIEW_ROWS} messages ({max_rows} asked)"
        )));
    }
    let s = ident(schema);
    let text = format!(
        "SELECT coalesce(pg_catalog.json_agg(pg_catalog.json_build_object(
                'event_id', m.event_id, 'topic', m.topic, 'partition', m.\"partition\", 'offset', m.\"offset\",
                'event_type', m.event_type, 'attempts', m.attempts, 'last_error_code', m.last_error_code,
                'received_at', {received_at}) ORDER BY m.ordinality), '[]')::text AS rows
         FROM {s}.review_messages($1, $2::text, $3::integer) WITH ORDINALITY m",
        received_at = utc("m.received_at"),
    );
    let max_rows = max_rows.to_string();
    rows(sql.query(&text, &[Some(handler), error_code, Some(&max_rows)]).await?)
}

/// `inbox.retry` for the selected messages of `handler` in review_required: back to
/// pending, due now. Returns how many deliveries changed.
pub async fn retry(
    sql: &mut ReplicationClient,
    schema: &str,
    handler: &str,
    selection: Selection<'_>,
) -> Result<u64, ControlError> {
    bulk(sql, schema, handler, selection, "retry").await
}

/// `inbox.dismiss` for the selected messages of `handler` in review_required: closed
/// without a receipt. Returns how many deliveries changed.
pub async fn dismiss(
    sql: &mut ReplicationClient,
    schema: &str,
    handler: &str,
    selection: Selection<'_>,
) -> Result<u64, ControlError> {
    bulk(sql, schema, handler, selection, "dismiss").await
}

async fn bulk(
    sql: &mut ReplicationClient,
    schema: &str,
    handler: &str,
    selection: Selection<'_>,
    action: &str,
) -> Result<u64, ControlError> {
    let s = ident(schema);
    let answer = match selection {
        Selection::EventIds(ids) => {
            check_event_ids(ids.len())?;
            let text = format!("SELECT {s}.{action}_many($1, $2::text[])::text AS n");
            sql.query(&text, &[Some(handler), Some(&array(ids))]).await?
        }
        Selection::ErrorCode(code) => {
            let text = format!("SELECT {s}.{action}_by_error($1, $2)::text AS n");
            sql.query(&text, &[Some(handler), Some(code)]).await?
        }
    };
    let n = answer.first("n").ok_or_else(|| ControlError::Unreadable(format!("{action}: no count")))?;
    n.parse().map_err(|_| ControlError::Unreadable(format!("{action}: count {n:?}")))
}

/// Pauses `handler`: its claims return nothing until [`resume`]. `false`: no such handler.
pub async fn pause(sql: &mut ReplicationClient, schema: &str, handler: &str) -> Result<bool, ControlError> {
    switch(sql, schema, handler, "pause_handler").await
}

/// Resumes `handler`. `false`: no such handler.
pub async fn resume(sql: &mut ReplicationClient, schema: &str, handler: &str) -> Result<bool, ControlError> {
    switch(sql, schema, handler, "resume_handler").await
}

async fn switch(
    sql: &mut ReplicationClient,
    schema: &str,
    handler: &str,
    function: &str,
) -> Result<bool, ControlError> {
    let text = format!("SELECT {}.{function}($1)::text AS found", ident(schema));
    match sql.query(&text, &[Some(handler)]).await?.first("found") {
        Some("true") => Ok(true),
        Some("false") => Ok(false),
        other => Err(ControlError::Unreadable(format!("{function}: {other:?}"))),
    }
}

/// Writes the audit row of one action.
pub async fn audit(sql: &mut ReplicationClient, schema: &str, row: &AuditRow<'_>) -> Result<(), ControlError> {
    let text = format!(
        "INSERT INTO {}.admin_audit (token_name, role, action, target, result) VALUES ($1, $2, $3, $4, $5)",
        ident(schema)
    );
    sql.query(&text, &[Some(row.token_name), Some(row.role), Some(row.action), row.target, Some(row.result)]).await?;
    Ok(())
}

/// Refuses a selection over [`MAX_EVENT_IDS`] before it is sent.
fn check_event_ids(n: usize) -> Result<(), ControlError> {
    if n > MAX_EVENT_IDS {
        return Err(ControlError::Refused(format!(
            "at most {MAX_EVENT_IDS} event ids a call ({n} given): split the selection, or select by error code"
        )));
    }
    Ok(())
}

/// A timestamptz column as UTC RFC 3339 text, to the microsecond, whatever the session's
/// TimeZone.
fn utc(column: &str) -> String {
    format!("pg_catalog.to_char({column} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')")
}

/// The JSON array in column `rows` of the one row.
fn rows<T: serde::de::DeserializeOwned>(answer: replication::QueryResult) -> Result<Vec<T>, ControlError> {
    let json = answer.first("rows").ok_or_else(|| ControlError::Unreadable("no rows column".into()))?;
    parse(json)
}

fn parse<T: serde::de::DeserializeOwned>(json: &str) -> Result<Vec<T>, ControlError> {
    serde_json::from_str(json).map_err(|e| ControlError::Unreadable(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_selection_over_the_bound_is_refused_before_sending() {
        assert!(check_event_ids(MAX_EVENT_IDS).is_ok());
        let e = check_event_ids(MAX_EVENT_IDS + 1).unwrap_err();
        assert!(e.is_bad_input());
        assert!(e.to_string().contains("at most 10000 event ids a call (10001 given)"), "{e}");
    }

    #[test]
    fn rows_are_read_from_postgres_json() {
        let groups: Vec<ReviewGroup> = parse(
            r#"[{"error_code": "http_503", "count": 3, "first_at": "2026-12-05T16:00:00.000001Z",
                 "last_at": "2026-12-05T16:00:02.000000Z", "sample_event_ids": ["e1", "e,2"]}]"#,
        )
        .unwrap();
        assert_eq!(groups[0].sample_event_ids, ["e1", "e,2"]);
        let messages: Vec<ReviewMessage> = parse(
            r#"[{"event_id": "e1", "topic": "t", "partition": null, "offset": null, "event_type": null,
                 "attempts": 2, "last_error_code": "message_missing", "received_at": "2026-12-05T16:00:00.000000Z"}]"#,
        )
        .unwrap();
        assert_eq!(messages[0].partition, None);
        let handlers: Vec<HandlerOverview> = parse(
            r#"[{"handler": "h", "backlog": 2, "oldest_pending_seconds": 1.5, "leased": 1, "review_required": 0,
                 "attempts": 4, "paused": true, "leases_lost": 0}]"#,
        )
        .unwrap();
        assert!(handlers[0].paused);
        let e = parse::<HandlerOverview>("[{}]").unwrap_err();
        assert!(!e.is_bad_input() && e.to_string().starts_with("unexpected answer"), "{e}");
    }

    #[test]
    fn json_names_the_fields_as_the_admin_api_returns_them() {
        let m = ReviewMessage {
            event_id: "e1".into(),
            topic: "t".into(),
            partition: Some(0),
            offset: Some(7),
            event_type: Some("OrderPlaced".into()),
            attempts: 5,
            last_error_code: Some("http_503".into()),
            received_at: "2026-12-05T16:00:00.000000Z".into(),
        };
        let v = serde_json::to_value(&m).unwrap();
        assert_eq!(v["offset"], 7);
        assert!(v.get("payload").is_none());
    }
}
