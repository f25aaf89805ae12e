//! Inbox retention: `messages`, `deliveries` and `receipts` are partitioned by the UTC
//! day a message arrived (`received_at`; a delivery and a receipt carry their message's),
//! one partition of each per day (`<table>_pYYYYMMDD`), and a day's three partitions are
//! dropped together, never emptied with DELETE.
//!
//! A *pass* runs when `walpost inbox` starts (before it consumes) and then every
//! `[inbox] retention_interval_secs`:
//!
//! 1. **Ahead.** Each of the three tables has a partition for every instant from the start
//!    of today to `retention_days_ahead` days after it (the outbox retention's gaps and
//!    its `create_partition`, which ATTACHes, so writers never wait for it).
//! 2. **Drop.** A day of `messages` whose whole range ends at or before `now -
//!    retention_keep_days` is dropped with the partitions of the same range of
//!    `deliveries` and `receipts`, in one transaction with `lock_timeout`, when none of
//!    the day's deliveries is open (`pending` or `review_required`): every handler has a
//!    receipt, or the review decision `dismissed`, for every message it matches. The open
//!    deliveries are counted after the locks are granted, so a handler registered
//!    meanwhile (whose deliveries are made for the stored messages) is seen.
//!    A day whose range ends at or before `now - retention_max_days` is dropped even with
//!    open deliveries, and reported: a WARN line with how many were open, counted in
//!    `walpost_inbox_retention_forced_drops_total` (and the deliveries in
//!    `..._forced_open_deliveries_total`) instead of `walpost_retention_partitions_dropped_total`,
//!    so an alert can tell it from a normal expiry.
//!
//! Invariants:
//! - only whole days go, by DROP TABLE; before `max_days`, never a day with an open
//!   delivery;
//! - the dedup window is the kept days: an event id arriving again after its day was
//!   dropped is stored again (docs/inbox.md says so; `keep_days` is its length);
//! - passes of several instances take turns (a session advisory lock on the schema's
//!   `messages`), and a default partition, if someone made one, is never dropped.

use replication::ReplicationClient;
use tokio::sync::watch;

use crate::metrics::InboxRetentionMetrics;
use crate::settings::{InboxRetention, InboxSettings};
use daypart::catalog::{self, Partition};
use daypart::ddl::{create_partition, in_transaction, keep_after};
use daypart::plan::{gaps, split_days};
use daypart::time::{day_floor, partition_name, DAY_MICROS};
use daypart::{Action, Line, Range, Reason};
use service::error::{ErrorKind, PipelineError};
use service::sql::ident;

/// The partitioned tables.
pub(crate) const TABLES: [&str; 3] = ["messages", "deliveries", "receipts"];

/// The order a drop locks them in (see `drop_day`).
const LOCK_ORDER: [&str; 3] = ["deliveries", "messages", "receipts"];

/// One thing a pass does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// Create the partition `name` of `table` for `[lo, hi)`.
    Create { table: &'static str, name: String, lo: i64, hi: i64 },
    /// Drop the day `range`: `partitions` of the three tables (those that exist);
    /// `forced`: older than `max_days`, dropped even with open deliveries.
    Drop { range: Range, partitions: Vec<Partition>, forced: bool },
    /// Nothing to do; the line says why.
    Keep(Line),
}

/// The pure half of a pass: `tables` holds each of [`TABLES`] with its partitions;
/// `now` is the server's, in microseconds since the Unix epoch.
pub(crate) fn plan(now: i64, cfg: &InboxRetention, tables: &[(&'static str, Vec<Partition>)]) -> Vec<Step> {
    let mut steps = Vec::new();
    let today = day_floor(now);
    let window = (today, today + (i64::from(cfg.days_ahead) + 1) * DAY_MICROS);
    for (table, partitions) in tables {
        let ranges: Vec<Range> = partitions.iter().filter(|p| !p.is_default).map(|p| p.range).collect();
        for (lo, hi) in gaps(window, &ranges).into_iter().flat_map(split_days) {
            steps.push(Step::Create { table, name: partition_name(table, lo), lo, hi });
        }
    }
    let keep_cutoff = now - i64::from(cfg.keep_days) * DAY_MICROS;
    let max_cutoff = now - i64::from(cfg.max_days) * DAY_MICROS;
    let Some((_, messages)) = tables.iter().find(|(t, _)| *t == "messages") else { return steps };
    for p in messages.iter().filter(|p| !p.is_default) {
        let expired = matches!(p.range.hi, Some(hi) if hi <= keep_cutoff);
        if !expired {
            steps.push(Step::Keep(line(p, Action::Keep, Reason::NotOldEnough, String::new())));
            continue;
        }
        // The same range in every table (a day's deliveries and receipts live beside it).
        let partitions: Vec<Partition> = tables
            .iter()
            .filter_map(|(_, parts)| parts.iter().find(|q| !q.is_default && q.range == p.range))
            .cloned()
            .collect();
        let forced = matches!(p.range.hi, Some(hi) if hi <= max_cutoff);
        steps.push(Step::Drop { range: p.range, partitions, forced });
    }
    steps
}

fn line(p: &Partition, action: Action, reason: Reason, detail: String) -> Line {
    Line { partition: p.display.clone(), range: p.range.to_string(), action, done: false, reason, detail }
}

/// The retention task of `walpost inbox`: a pass every `interval` (sooner after an
/// error) until shutdown; the first one ran before consuming ([`pass`]).
pub(crate) async fn task(
    s: InboxSettings,
    cfg: InboxRetention,
    metrics: InboxRetentionMetrics,
    mut shutdown: watch::Receiver<bool>,
) {
    metrics.pass.declare_skip_reasons(&Reason::SKIPPED.iter().map(|r| r.as_str()).collect::<Vec<_>>());
    while !backoff::sleep_or_shutdown(cfg.interval, &mut shutdown).await {
        pass_and_report(&s, &cfg, &metrics).await;
    }
}

/// One pass, its lines logged and counted; false when it failed.
pub(crate) async fn pass_and_report(s: &InboxSettings, cfg: &InboxRetention, metrics: &InboxRetentionMetrics) -> bool {
    match pass(s, cfg).await {
        Ok(Some(lines)) => {
            let failed = lines.iter().any(|(l, _)| l.reason == Reason::Error);
            metrics.pass.pass_finished(!failed);
            for (l, forced_open) in &lines {
                count(l, *forced_open, metrics);
                if *forced_open > 0 {
                    tracing::warn!(partition = %l.partition, range = %l.range, detail = %l.detail, "inbox retention: dropped a day with open deliveries");
                } else {
                    daypart::log_line(l);
                }
            }
            !failed
        }
        Ok(None) => {
            tracing::debug!(schema = %s.schema, "another session holds the inbox retention lock; skipping this pass");
            true
        }
        Err(e) => {
            metrics.pass.pass_finished(false);
            tracing::warn!(retry_in_s = cfg.interval.as_secs(), "inbox retention pass failed: {e}");
            false
        }
    }
}

/// Counts a pass's line: a day dropped past `max_days` with `forced_open` open deliveries
/// is a forced drop, apart from the days that expired with every delivery closed.
fn count(line: &Line, forced_open: i64, metrics: &InboxRetentionMetrics) {
    if forced_open > 0 && line.done {
        metrics.forced_drops.inc();
        metrics.forced_open_deliveries.inc_by(forced_open.unsigned_abs());
    } else {
        line.count(&metrics.pass);
    }
}

/// What a pass did: each line, with the open deliveries a forced drop took with it (0
/// for every other line).
type Lines = Vec<(Line, i64)>;

/// Runs one pass on its own connection; `Ok(None)`: another session is running one.
pub(crate) async fn pass(s: &InboxSettings, cfg: &InboxRetention) -> Result<Option<Lines>, PipelineError> {
    let mut sql = ReplicationClient::connect_sql(&s.postgres).await?;
    let result = pass_on(&mut sql, &s.schema, cfg).await;
    sql.close().await;
    result
}

async fn pass_on(
    sql: &mut ReplicationClient,
    schema: &str,
    cfg: &InboxRetention,
) -> Result<Option<Lines>, PipelineError> {
    sql.simple_query("SET TimeZone = 'UTC'; SET DateStyle = 'ISO, YMD'; SET search_path = pg_catalog, pg_temp").await?;
    let mut tables = Vec::with_capacity(TABLES.len());
    for table in TABLES {
        let r = sql
            .query(
                "SELECT c.oid::text AS oid, c.relkind::text AS kind FROM pg_class c \
                 JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2",
                &[Some(schema), Some(table)],
            )
            .await?;
        if r.first("kind") != Some("p") {
            return Err(PipelineError::definite(ErrorKind::Config, inbox_not_partitioned(schema, table)));
        }
        let oid = r.first("oid").unwrap_or_default().to_owned();
        tables.push((table, oid));
    }
    // The key is the schema's messages table: passes on one inbox take turns.
    let lock_key = "pg_catalog.hashtextextended('walpost inbox retention ' || $1::text, 0)";
    let messages_oid = Some(tables[0].1.as_str());
    let got =
        sql.query(&format!("SELECT pg_catalog.pg_try_advisory_lock({lock_key})::text AS got"), &[messages_oid]).await?;
    if got.first("got") != Some("true") {
        return Ok(None);
    }
    let result = async {
        let now = catalog::server_now_micros(sql).await?;
        let mut with_partitions = Vec::with_capacity(tables.len());
        for (table, oid) in &tables {
            with_partitions.push((*table, catalog::partitions(sql, oid).await?));
        }
        let mut lines = Vec::new();
        for step in plan(now, cfg, &with_partitions) {
            lines.push(execute(sql, schema, cfg, step).await?);
        }
        Ok(lines)
    }
    .await;
    let _ = sql.query(&format!("SELECT pg_catalog.pg_advisory_unlock({lock_key})"), &[messages_oid]).await;
    result.map(Some)
}

async fn execute(
    sql: &mut ReplicationClient,
    schema: &str,
    cfg: &InboxRetention,
    step: Step,
) -> Result<(Line, i64), PipelineError> {
    match step {
        Step::Keep(line) => Ok((line, 0)),
        Step::Create { table, name, lo, hi } => {
            let range = Range { lo: Some(lo), hi: Some(hi) };
            let mut line = Line {
                partition: format!("{schema}.{name}"),
                range: range.to_string(),
                action: Action::Create,
                done: false,
                reason: Reason::Ahead,
                detail: String::new(),
            };
            let root = format!("{}.{}", ident(schema), ident(table));
            let quoted = format!("{}.{}", ident(schema), ident(&name));
            match create_partition(sql, &root, &quoted, (lo, hi), cfg.lock_timeout).await {
                Ok(()) => line.done = true,
                Err(e) => keep_after(&mut line, e, "not created")?,
            }
            Ok((line, 0))
        }
        Step::Drop { range, partitions, forced } => {
            let shown: Vec<&str> = partitions.iter().map(|p| p.display.as_str()).collect();
            let mut line = Line {
                partition: shown.join(", "),
                range: range.to_string(),
                action: Action::Drop,
                done: false,
                reason: if forced { Reason::MaxAge } else { Reason::Expired },
                detail: String::new(),
            };
            let mut forced_open = 0;
            match drop_day(sql, schema, cfg, &partitions, forced).await {
                Ok(Dropped::Yes { open }) => {
                    line.done = true;
                    forced_open = open;
                    if open > 0 {
                        line.detail = format!(
                            "older than retention_max_days ({} days): dropped with {open} open deliveries (pending or review_required)",
                            cfg.max_days
                        );
                    }
                }
                Ok(Dropped::Open(open)) => {
                    line.action = Action::Keep;
                    line.reason = Reason::OpenDeliveries;
                    line.detail = format!(
                        "{open} deliveries are pending or review_required: dropped once each has a receipt or is dismissed, or after retention_max_days ({} days)",
                        cfg.max_days
                    );
                }
                Err(e) => {
                    line.action = Action::Keep;
                    keep_after(&mut line, e, "not dropped")?;
                }
            }
            Ok((line, forced_open))
        }
    }
}

enum Dropped {
    Yes { open: i64 },
    Open(i64),
}

/// Drops a day's `partitions` when none of its deliveries is open (or `forced`).
async fn drop_day(
    sql: &mut ReplicationClient,
    schema: &str,
    cfg: &InboxRetention,
    partitions: &[Partition],
    forced: bool,
) -> Result<Dropped, replication::Error> {
    // The locks DROP TABLE takes (each table, then its partition), taken first, so the
    // count below sees every delivery the day will ever have. The order avoids a cycle
    // with the two writers that take two of these tables: the ingest (messages, then
    // deliveries by the trigger) is kept out by the inbox's write lock, taken first; a
    // claim (deliveries, then messages) meets deliveries first here as well.
    let mut locks = vec![super::store::write_lock(schema)];
    for table in LOCK_ORDER {
        locks.push(format!("LOCK TABLE ONLY {}.{} IN ACCESS EXCLUSIVE MODE", ident(schema), ident(table)));
    }
    for table in LOCK_ORDER {
        let prefix = format!("{schema}.{table}_");
        for p in partitions.iter().filter(|p| p.display.starts_with(&prefix)) {
            locks.push(format!("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE", p.quoted));
        }
    }
    let deliveries = partitions.iter().find(|p| p.display.starts_with(&format!("{schema}.deliveries_"))).cloned();
    let schema = schema.to_owned();
    let drop = (!partitions.is_empty())
        .then(|| format!("DROP TABLE {}", partitions.iter().map(|p| p.quoted.as_str()).collect::<Vec<_>>().join(", ")));
    let outcome = in_transaction(sql, cfg.lock_timeout, |sql| {
        Box::pin(async move {
            for l in &locks {
                sql.simple_query(l).await?;
            }
            let open = match &deliveries {
                None => 0,
                Some(d) => sql
                    .simple_query(&format!(
                        "SELECT pg_catalog.count(*)::text AS open FROM {} WHERE state IN ('pending', 'review_required')",
                        d.quoted
                    ))
                    .await?
                    .first("open")
                    .and_then(|n| n.parse::<i64>().ok())
                    .unwrap_or(0),
            };
            if open > 0 && !forced {
                return Ok(Some(Err(open)));
            }
            if let Some(drop) = &drop {
                sql.simple_query(drop).await?;
            }
            if open > 0 {
                repair_heads(sql, &schema).await?;
            }
            Ok(Some(Ok(open)))
        })
    })
    .await?;
    // A kept day rolls back (nothing to commit); the closure's Some(Err) says why.
    Ok(match outcome {
        Some(Ok(open)) => Dropped::Yes { open },
        Some(Err(open)) => Dropped::Open(open),
        None => Dropped::Open(0),
    })
}

/// After a day was dropped with open deliveries: an ordered handler's aggregate whose
/// head (its earliest open delivery, migrations/inbox/0004_inbox_heads.sql) was in that
/// day would wait for it forever, so every ordered handler's heads are rebuilt from the
/// deliveries left, in the drop's transaction (which holds `deliveries` alone). An inbox
/// migrated before 0004 has no heads: nothing to do.
async fn repair_heads(sql: &mut ReplicationClient, schema: &str) -> Result<(), replication::Error> {
    let present = sql
        .query(
            "SELECT pg_catalog.count(*)::text AS n FROM pg_catalog.pg_proc p \
             JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace \
             WHERE n.nspname = $1 AND p.proname = 'repair_heads'",
            &[Some(schema)],
        )
        .await?;
    if present.first("n") == Some("0") {
        return Ok(());
    }
    let s = ident(schema);
    sql.simple_query(&format!("SELECT {s}.repair_heads(h.name) FROM {s}.handlers h WHERE h.ordered ORDER BY h.name"))
        .await?;
    Ok(())
}

/// The error for an inbox whose tables are not partitioned by day.
pub(crate) fn inbox_not_partitioned(schema: &str, table: &str) -> String {
    format!(
        "{schema}.{table} is not partitioned by day, so the inbox's retention cannot drop old days: create the inbox with walpost migrate --inbox (or --create-schema), or set [inbox] retention = false"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use daypart::time::SECOND_MICROS;

    const D: i64 = DAY_MICROS;
    /// 2026-11-29 00:00:00 UTC.
    const NOV29: i64 = 1_795_910_400 * SECOND_MICROS;

    fn part(table: &str, lo: i64) -> Partition {
        let name = partition_name(table, lo);
        Partition {
            quoted: format!("inbox.{name}"),
            display: format!("inbox.{name}"),
            is_default: false,
            has_rows: false,
            range: Range { lo: Some(lo), hi: Some(lo + D) },
            detach_pending: false,
            seal: None,
        }
    }

    fn days(table: &'static str, from: i64, n: i64) -> (&'static str, Vec<Partition>) {
        (table, (0..n).map(|i| part(table, from + i * D)).collect())
    }

    fn cfg() -> InboxRetention {
        InboxRetention { keep_days: 7, max_days: 9, days_ahead: 2, ..InboxRetention::default() }
    }

    #[test]
    fn days_ahead_are_made_in_each_table_that_lacks_them() {
        let now = NOV29 + 5 * 3600 * SECOND_MICROS;
        // messages has today and tomorrow; deliveries only today; receipts nothing.
        let tables = [days("messages", NOV29, 2), days("deliveries", NOV29, 1), ("receipts", Vec::new())];
        let created: Vec<String> = plan(now, &cfg(), &tables)
            .into_iter()
            .filter_map(|s| match s {
                Step::Create { name, lo, hi, .. } => {
                    assert_eq!(hi - lo, D, "{name}");
                    Some(name)
                }
                _ => None,
            })
            .collect();
        assert_eq!(
            created,
            [
                "messages_p20261201",
                "deliveries_p20261130",
                "deliveries_p20261201",
                "receipts_p20261129",
                "receipts_p20261130",
                "receipts_p20261201"
            ]
        );
    }

    #[test]
    fn a_day_goes_after_keep_days_with_its_siblings_and_is_forced_after_max_days() {
        let now = NOV29 + 3600 * SECOND_MICROS;
        // Eleven days, from ten days ago to today, in all three tables.
        let from = NOV29 - 10 * D;
        let tables = [days("messages", from, 11), days("deliveries", from, 11), days("receipts", from, 11)];
        let mut drops = Vec::new();
        let mut kept = 0;
        for step in plan(now, &InboxRetention { days_ahead: 0, ..cfg() }, &tables) {
            match step {
                Step::Drop { range, partitions, forced } => drops.push((range.lo.unwrap(), partitions.len(), forced)),
                Step::Keep(l) => {
                    assert_eq!(l.reason, Reason::NotOldEnough);
                    kept += 1;
                }
                Step::Create { name, .. } => panic!("nothing to create: {name}"),
            }
        }
        // Ends at or before now - 7 days: the days from ten to eight days ago (the day
        // seven days ago ends 1 h after the cutoff). Before now - 9 days: ten ago only.
        assert_eq!(drops, [(NOV29 - 10 * D, 3, true), (NOV29 - 9 * D, 3, false), (NOV29 - 8 * D, 3, false)]);
        assert_eq!(kept, 8);
    }

    /// The drill: a day dropped with open deliveries counted as a normal expiry.
    #[test]
    fn a_forced_drop_is_counted_apart_from_a_normal_expiry() {
        let health = std::sync::Arc::new(service::telemetry::Health::new(
            std::time::Duration::from_secs(30),
            std::time::Duration::from_secs(60),
        ));
        let m = crate::metrics::InboxMetrics::new(health).unwrap().retention;
        let dropped = |reason| Line {
            partition: "inbox.messages_p20261101".into(),
            range: String::new(),
            action: Action::Drop,
            done: true,
            reason,
            detail: String::new(),
        };
        count(&dropped(Reason::Expired), 0, &m);
        count(&dropped(Reason::MaxAge), 0, &m);
        assert_eq!((m.pass.dropped.get(), m.forced_drops.get()), (2, 0), "nothing open: a normal expiry");
        count(&dropped(Reason::MaxAge), 4, &m);
        assert_eq!((m.pass.dropped.get(), m.forced_drops.get()), (2, 1));
        assert_eq!(m.forced_open_deliveries.get(), 4);
    }

    #[test]
    fn the_default_partition_is_neither_dropped_nor_counted_as_a_day() {
        let now = NOV29;
        let mut default = part("messages", NOV29 - 20 * D);
        default.is_default = true;
        default.range = Range { lo: None, hi: None };
        let tables = [("messages", vec![default]), days("deliveries", NOV29, 3), days("receipts", NOV29, 3)];
        let steps = plan(now, &cfg(), &tables);
        assert!(steps.iter().all(|s| !matches!(s, Step::Drop { .. } | Step::Keep(_))), "{steps:?}");
        assert_eq!(steps.iter().filter(|s| matches!(s, Step::Create { table: "messages", .. })).count(), 3);
    }
}
