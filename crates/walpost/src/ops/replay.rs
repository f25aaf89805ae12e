//! `walpost replay`: flags into a [`ReplaySpec`], a warning when the range reaches into
//! partitions retention already dropped, the replay, and its summary on stdout.
//!
//! The admin API's `POST /api/v1/replays` (`control::replays`) builds its spec with the
//! same [`spec`] and [`row_condition`] and runs it with the same [`execute`], on a task of
//! the running `walpost run`.

use std::sync::Arc;

use replication::ReplicationClient;

use crate::error::{ErrorKind, PipelineError};
use crate::settings::{Settings, SourceSettings};
use crate::snapshot::replay::{self, ReplaySpec, ReplayWatch, RowCondition, DEFAULT_TIME_COLUMN};
use crate::snapshot::Outcome;
use crate::telemetry::{Health, Metrics};

/// `--where`'s text as a row condition: parsed by the `condition` crate (columns compared
/// with constants) unless `unsafe_where`: then it runs as written, as any SQL.
pub(crate) fn row_condition(text: String, unsafe_where: bool) -> Result<RowCondition, condition::ConditionError> {
    if unsafe_where {
        return Ok(RowCondition::Unchecked(text));
    }
    condition::parse(&text).map(RowCondition::Checked)
}

/// The replay the flags describe (`condition`: see [`row_condition`]).
#[allow(clippy::too_many_arguments)] // one per flag
pub(crate) fn spec(
    source: &SourceSettings,
    id: Option<String>,
    since: Option<String>,
    until: Option<String>,
    condition: Option<RowCondition>,
    time_column: Option<String>,
    dry_run: bool,
    statement_timeout: Option<std::time::Duration>,
) -> ReplaySpec {
    let time_column = time_column
        .or_else(|| source.outboxes.first().and_then(|o| o.router.timestamp_field.clone()))
        .unwrap_or_else(|| DEFAULT_TIME_COLUMN.to_owned());
    ReplaySpec {
        id: id.unwrap_or_else(ReplaySpec::new_id),
        since,
        until,
        condition,
        time_column,
        dry_run,
        statement_timeout: statement_timeout.unwrap_or(replay::STATEMENT_TIMEOUT),
    }
}

/// `walpost replay`'s condition: `--where` refused by the grammar stops the command.
pub(crate) fn cli_condition(text: Option<String>, unsafe_where: bool) -> Result<Option<RowCondition>, PipelineError> {
    text.map(|t| row_condition(t, unsafe_where))
        .transpose()
        .map_err(|e| PipelineError::definite(ErrorKind::Config, texts::replay::where_refused(&e)))
}

/// Runs the replay and prints its summary.
pub(crate) async fn command(s: &Settings, spec: &ReplaySpec) -> Result<(), PipelineError> {
    let outcome = execute(s, spec, None).await?;
    print!("{}", summary(spec, &outcome));
    Ok(())
}

/// Runs a replay on its own PostgreSQL connection and Kafka producer, counting into
/// metrics of its own (a replay beside `walpost run` must not move the stream's
/// in-flight gauge or its Kafka clock); first warns when the range reaches into
/// partitions retention dropped. `watch`: see [`ReplayWatch`].
pub(crate) async fn execute(
    s: &Settings,
    spec: &ReplaySpec,
    watch: Option<Arc<ReplayWatch>>,
) -> Result<Outcome, PipelineError> {
    if let Some(since) = &spec.since {
        let mut sql = ReplicationClient::connect_sql(&s.postgres.server).await?;
        for outbox in &s.source.outboxes {
            if let Some(oldest) = oldest_partition_start(&mut sql, &outbox.table.quoted(), since).await {
                tracing::warn!(
                    table = %outbox.table,
                    replay = %spec.id,
                    "the range starts at {since}, but the oldest partition of {} starts at {oldest}: rows before it were dropped by retention and cannot be replayed",
                    outbox.table
                );
            }
        }
        sql.close().await;
    }
    let health = Arc::new(Health::new(std::time::Duration::MAX, std::time::Duration::MAX));
    let metrics = Metrics::new(health).map_err(|e| PipelineError::definite(ErrorKind::Internal, e))?;
    replay::run(s, spec, &metrics, watch).await
}

/// For a table partitioned by range, the oldest partition's lower bound when it is after
/// `since` (`None`: not partitioned, a partition reaching back without bound, or the
/// range starts inside what exists).
async fn oldest_partition_start(sql: &mut ReplicationClient, table: &str, since: &str) -> Option<String> {
    let r = sql
        .query(
            "WITH b AS (SELECT pg_catalog.pg_get_expr(c.relpartbound, c.oid) AS bound \
                        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = $1::regclass), \
                  lo AS (SELECT pg_catalog.min((pg_catalog.regexp_match(bound, '^FOR VALUES FROM \\(''([^'']+)''\\)'))[1]::timestamptz) AS oldest, \
                                pg_catalog.bool_or(bound LIKE 'FOR VALUES FROM (MINVALUE)%' OR bound = 'DEFAULT') AS unbounded FROM b) \
             SELECT oldest::text AS oldest FROM lo WHERE NOT coalesce(unbounded, true) AND oldest > $2::timestamptz",
            &[Some(table), Some(since)],
        )
        .await
        .ok()?;
    r.first("oldest").map(str::to_owned)
}

/// What a replay did, for people: a line, then one per topic.
pub(crate) fn summary(spec: &ReplaySpec, outcome: &Outcome) -> String {
    let published: u64 = outcome.per_topic.values().sum();
    let mut text = if spec.dry_run {
        format!("replay {} (dry run): {} rows read, {published} would be published\n", spec.id, outcome.rows)
    } else {
        format!("replay {}: {} rows read, {published} published\n", spec.id, outcome.rows)
    };
    let width = outcome.per_topic.keys().map(String::len).max().unwrap_or(0);
    for (topic, n) in &outcome.per_topic {
        text.push_str(&format!("  {topic:<width$}  {n}\n"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_counts_per_topic() {
        let spec = ReplaySpec {
            id: "r1".into(),
            since: None,
            until: None,
            condition: None,
            time_column: "occurred_at".into(),
            dry_run: true,
            statement_timeout: replay::STATEMENT_TIMEOUT,
        };
        let outcome = Outcome {
            rows: 3,
            per_topic: [("outbox.event.order".to_owned(), 2), ("outbox.event.payment".to_owned(), 1)].into(),
        };
        assert_eq!(
            summary(&spec, &outcome),
            "replay r1 (dry run): 3 rows read, 3 would be published\n  outbox.event.order    2\n  outbox.event.payment  1\n"
        );
    }
}
