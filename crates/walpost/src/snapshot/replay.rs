//! Replay: publishes outbox rows again, through the same router, beside a running stream
//! (`walpost replay`, or a signal row: see `stream::signal`).
//!
//! A replay is a snapshot of a range: the rows are read on one consistent snapshot
//! (REPEATABLE READ) through a server-side cursor in id order, one FETCH chunk at a
//! time (memory: a chunk plus the produce window), routed exactly as streamed rows, and
//! handed to a producer of its own. No slot is read, created or confirmed.
//!
//! Invariants:
//! - Every statement runs under the spec's statement timeout ([`STATEMENT_TIMEOUT`] by
//!   default); a condition from a signal row or
//!   `--where` is the `condition` crate's SQL (columns against constants), unless the
//!   operator passed `--unsafe-where`.
//! - The range and the condition's strings are bind parameters of the cursor's query,
//!   never SQL text.
//! - A range or condition the server cannot parse, or `--since` not before `--until`, is
//!   refused before anything is published.
//! - Every replayed record carries its original `id` header and `walpost.replay` = the
//!   replay's id; a dry run routes every row and publishes nothing.
//! - The replay ends only when Kafka acknowledged every record (or on an error, which
//!   says where to resume: see [`texts::replay::replay_resume_hint`]).
//! - A [`ReplayWatch`] (the admin API's replays) sees rows read and records acknowledged
//!   as they happen, and may ask the replay to stop: it stops before its next FETCH,
//!   waits for Kafka to acknowledge what it handed over, and ends without an error.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use replication::ReplicationClient;

use super::{cursor_query, Outcome};
use crate::error::{ErrorKind, PipelineError};
use crate::kafka::DeliveryMemo;
use crate::postgres::sql::ident;
use crate::settings::{ReplayMark, Settings, SnapshotMode, SnapshotSettings, SourceSettings};
use crate::telemetry::Metrics;
use condition::Condition;

/// How long one statement of a replay may run by default (`statement_timeout` on its
/// connection): a condition that would keep the server busy, or a lock it waits on, ends
/// the replay with an error instead of holding a signal's transaction unconfirmed.
pub(crate) const STATEMENT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// The time column a range applies to when the router names none.
pub(crate) const DEFAULT_TIME_COLUMN: &str = "occurred_at";

/// A replay's condition on the rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RowCondition {
    /// Parsed by the `condition` crate (a signal's filter, `--where`): its strings are
    /// bound as parameters.
    Checked(Condition),
    /// `--where` with `--unsafe-where`: SQL as the operator wrote it.
    Unchecked(String),
}

/// What to replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReplaySpec {
    /// The `walpost.replay` header's value.
    pub id: String,
    /// Rows whose time column is at or after this (a timestamp PostgreSQL reads).
    pub since: Option<String>,
    /// ... and before this.
    pub until: Option<String>,
    /// Any further condition on the rows.
    pub condition: Option<RowCondition>,
    /// The column `since` and `until` apply to.
    pub time_column: String,
    pub dry_run: bool,
    /// `statement_timeout` of the replay's connection.
    pub statement_timeout: std::time::Duration,
}

impl ReplaySpec {
    /// A replay id from the clock: `replay-20261130T220512Z`.
    pub(crate) fn new_id() -> String {
        let now = jiff::Timestamp::now();
        format!("replay-{}", now.strftime("%Y%m%dT%H%M%SZ"))
    }

    /// The cursor's condition (the range on the time column and the extra condition)
    /// and the values of its `$n` parameters.
    pub(crate) fn filter(&self) -> (Option<String>, Vec<String>) {
        let column = ident(&self.time_column);
        let mut parts = Vec::new();
        let mut params = Vec::new();
        for (bound, op) in [(&self.since, ">="), (&self.until, "<")] {
            if let Some(value) = bound {
                params.push(value.clone());
                parts.push(format!("{column} {op} ${}::timestamptz", params.len()));
            }
        }
        match &self.condition {
            Some(RowCondition::Checked(c)) => parts.push(format!("({})", c.to_sql(&mut params))),
            Some(RowCondition::Unchecked(sql)) => parts.push(format!("({sql})")),
            None => {}
        }
        ((!parts.is_empty()).then(|| parts.join(" AND ")), params)
    }

    /// The snapshot section of this replay's snapshot.
    pub(crate) fn snapshot(&self) -> SnapshotSettings {
        let (filter, filter_params) = self.filter();
        SnapshotSettings {
            mode: SnapshotMode::InitialOnly,
            filter,
            replay: Some(ReplayMark { id: self.id.clone(), dry_run: self.dry_run, filter_params }),
        }
    }
}

/// A running replay's figures and its stop, shared with whoever follows it.
#[derive(Debug, Default)]
pub struct ReplayWatch {
    rows_read: AtomicU64,
    published: AtomicU64,
    stop: AtomicBool,
    stopped: AtomicBool,
}

impl ReplayWatch {
    /// Rows fetched from the outbox tables so far.
    pub(crate) fn rows_read(&self) -> u64 {
        self.rows_read.load(Ordering::Relaxed)
    }

    /// Records Kafka acknowledged so far (a dry run: rows routed).
    pub(crate) fn published(&self) -> u64 {
        self.published.load(Ordering::Relaxed)
    }

    /// Asks the replay to stop before its next FETCH.
    pub(crate) fn request_stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    pub(crate) fn stop_requested(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// The replay ended early because it was asked to (not: it had read every row before
    /// it saw the request).
    pub(crate) fn stopped_early(&self) -> bool {
        self.stopped.load(Ordering::Relaxed)
    }

    pub(super) fn read(&self, rows: usize) {
        self.rows_read.fetch_add(rows as u64, Ordering::Relaxed);
    }

    pub(super) fn acked(&self) {
        self.published.fetch_add(1, Ordering::Relaxed);
    }

    /// At a chunk boundary: whether to stop here (and remember that it did).
    pub(super) fn stops_here(&self) -> bool {
        let stop = self.stop_requested();
        if stop {
            self.stopped.store(true, Ordering::Relaxed);
        }
        stop
    }
}

/// Checks the range and the condition against the server without publishing anything.
pub(crate) async fn validate(
    sql: &mut ReplicationClient,
    source: &SourceSettings,
    spec: &ReplaySpec,
) -> Result<(), PipelineError> {
    for (flag, value) in [("--since", &spec.since), ("--until", &spec.until)] {
        if let Some(v) = value {
            sql.query("SELECT $1::timestamptz", &[Some(v.as_str())]).await.map_err(|e| {
                PipelineError::definite(ErrorKind::Config, format!(
                    "replay: {flag} '{v}' is not a timestamp PostgreSQL reads ({e}); nothing was published (e.g. 2026-11-28T00:00:00Z)"
                ))
            })?;
        }
    }
    if let (Some(since), Some(until)) = (&spec.since, &spec.until) {
        let r = sql
            .query(
                "SELECT ($1::timestamptz >= $2::timestamptz)::text AS bad",
                &[Some(since.as_str()), Some(until.as_str())],
            )
            .await?;
        if r.first("bad") == Some("true") {
            return Err(PipelineError::definite(
                ErrorKind::Config,
                format!("replay: --since '{since}' is not before --until '{until}'; nothing was published"),
            ));
        }
    }
    let snapshot = spec.snapshot();
    for outbox in &source.outboxes {
        sql.parse_only(&cursor_query(&snapshot, outbox)).await.map_err(|e| {
            PipelineError::definite(ErrorKind::Config, format!(
                "replay: the range and --where are not a valid condition on {} ({e}); nothing was published (the range applies to column {}: --time-column names another)",
                outbox.table, spec.time_column
            ))
            .caused_by(e)
        })?;
    }
    Ok(())
}

/// Runs a replay to its end: every selected row acknowledged by Kafka (or, dry run,
/// routed and counted), or until `watch` asks it to stop.
pub(crate) async fn run(
    s: &Settings,
    spec: &ReplaySpec,
    metrics: &Metrics,
    watch: Option<Arc<ReplayWatch>>,
) -> Result<Outcome, PipelineError> {
    // The snapshot machinery, run with this replay's snapshot section.
    let r = Settings { snapshot: spec.snapshot(), ..s.clone() };
    let mut sql = ReplicationClient::connect_sql(&r.postgres.server).await?;
    let timeout_ms = spec.statement_timeout.as_millis().max(1).to_string();
    sql.query("SELECT pg_catalog.set_config('statement_timeout', $1, false)", &[Some(timeout_ms.as_str())]).await?;
    validate(&mut sql, &s.source, spec).await?;
    tracing::info!(replay = %spec.id, dry_run = spec.dry_run, "replay started");
    let mut memo = DeliveryMemo::default();
    let outcome = super::run(&mut sql, &r, None, metrics, &mut memo, None, watch).await;
    sql.close().await;
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> ReplaySpec {
        ReplaySpec {
            id: "r1".into(),
            since: None,
            until: None,
            condition: None,
            time_column: DEFAULT_TIME_COLUMN.into(),
            dry_run: false,
            statement_timeout: STATEMENT_TIMEOUT,
        }
    }

    #[test]
    fn the_filter_is_the_range_and_the_condition_with_values_as_parameters() {
        assert_eq!(spec().filter(), (None, Vec::new()), "no range, no condition: every row");
        let condition = condition::parse("aggregate_type = 'order' OR true").unwrap();
        let s = ReplaySpec {
            since: Some("2026-11-28T00:00:00Z".into()),
            until: Some("2026-11-29 00:00+01".into()),
            condition: Some(RowCondition::Checked(condition)),
            time_column: "Created At".into(),
            ..spec()
        };
        let (filter, params) = s.filter();
        assert_eq!(
            filter.unwrap(),
            "\"Created At\" >= $1::timestamptz AND \"Created At\" < $2::timestamptz AND (((\"aggregate_type\" = $3) OR TRUE))"
        );
        assert_eq!(params, ["2026-11-28T00:00:00Z", "2026-11-29 00:00+01", "order"]);
        let hostile = ReplaySpec { since: Some("x' OR '1'='1".into()), ..spec() };
        assert_eq!(hostile.filter(), (Some("\"occurred_at\" >= $1::timestamptz".into()), vec!["x' OR '1'='1".into()]));
        let unchecked = ReplaySpec { condition: Some(RowCondition::Unchecked("id > 7".into())), ..spec() };
        assert_eq!(unchecked.filter(), (Some("(id > 7)".into()), Vec::new()));
    }

    #[test]
    fn replay_ids_name_the_time() {
        let id = ReplaySpec::new_id();
        assert!(
            id.starts_with("replay-20") && id.ends_with('Z') && id.len() == "replay-20261130T220512Z".len(),
            "{id}"
        );
    }
}
