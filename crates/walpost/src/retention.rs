//! Outbox retention on a table partitioned by time: partitions are created ahead and old
//! ones are dropped whole (a catalog operation), never emptied row by row with DELETE.
//!
//! One *pass* ([`pass`]) runs on an ordinary SQL connection. `walpost run` runs one at
//! start and then every `[retention] interval_secs` ([`task`]); `walpost retention
//! [--dry-run]` runs one by hand ([`command`]). Passes are serialised across walpost
//! instances by a session advisory lock keyed on the table, so a hot standby's pass and
//! the active one's never interleave. The task acts when the table is partitioned
//! (`[retention] enabled` unset), never with `enabled = false`, and warns with
//! `enabled = true` on an unpartitioned table. Days are UTC days.
//!
//! # What a pass does
//!
//! 1. **Ahead.** Every instant from the start of the current UTC day to
//!    `days_ahead` days after it is covered by a partition. Missing ranges are created as
//!    daily partitions named `<table>_pYYYYMMDD` (`CREATE TABLE ... (LIKE <table>)` then
//!    `ATTACH PARTITION`, which takes only a SHARE UPDATE EXCLUSIVE lock on the table, so
//!    inserts never wait for it).
//! 2. **Seal.** A partition whose whole range ends at or before `now() - keep_days` is
//!    sealed: in one transaction, with `lock_timeout`, walpost takes an ACCESS EXCLUSIVE
//!    lock on the partition (only on it, not on the table), adds
//!    `CONSTRAINT walpost_retired CHECK (false) NOT VALID`, reads
//!    `W = pg_current_wal_insert_lsn()` and stores it in the constraint's comment.
//! 3. **Drop.** A sealed partition is dropped (`DROP TABLE`, with `lock_timeout`) once
//!    the slot's `confirmed_flush_lsn >= W`.
//!
//! # The rule: a partition is dropped only when the slot has confirmed every row in it
//!
//! - The lock in step 2 is granted only when every transaction that ever wrote a row
//!   into the partition has committed or rolled back (a writer holds ROW EXCLUSIVE on it
//!   until its end). A transaction writes its commit record before it releases its
//!   locks, so every such commit record ends at or before `W`, which is read after the
//!   lock is granted.
//! - From the seal on, no row can enter the partition: `CHECK (false)` is enforced for
//!   new rows (`NOT VALID` only skips checking the existing ones). The partition is
//!   read-only (an INSERT or UPDATE of a row in its range fails, as an INSERT would
//!   after the drop).
//! - Hence when `confirmed_flush_lsn >= W` every row the partition holds belongs to a
//!   transaction the slot has confirmed, i.e. that walpost delivered to Kafka
//!   (walpost confirms a position only after Kafka acknowledged everything before it).
//!   At `confirmed_flush_lsn = W - 1` the partition is kept (`slot_behind`); at `W` it
//!   is dropped. The rule does not trust `occurred_at`, clocks or statistics.
//! - No drop without a usable slot: a missing slot, a slot of another database or an
//!   invalidated one (`wal_status = lost`, see runbooks/slot-lost.md, which recovers
//!   from these very rows) keeps every partition.
//! - The drop re-reads the seal under the table's lock in the same transaction, so an
//!   operator who removed the constraint (to unseal) is never overridden; the next pass
//!   seals again with a new `W`.
//!
//! The default partition is never dropped; if it holds rows a pass warns. Sub-second
//! partition bounds, MINVALUE lower bounds (the legacy partition of migration 0002)
//! and partitions not named by walpost are handled alike: only the bounds count.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pgoutput::Lsn;
use replication::{quote_ident, quote_literal, QueryResult, ReplicationClient};
use serde::Deserialize;
use tokio::sync::watch;

use crate::cli::RetentionArgs;
use crate::config::{ConfigError, FileConfig, Settings, TableName};
use crate::error::PipelineError;
use crate::metrics::Metrics;
use crate::setup;

/// Name of the constraint that seals a partition; its comment holds the seal's WAL position.
pub const SEAL_CONSTRAINT: &str = "walpost_retired";

/// Prefix of the seal constraint's comment, followed by the LSN.
const SEAL_PREFIX: &str = "walpost retention: sealed at WAL ";

const SECOND_MICROS: i64 = 1_000_000;
const DAY_MICROS: i64 = 86_400 * SECOND_MICROS;

/// `[retention]` in the config file.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionFile {
    /// Run the retention task inside `walpost run`. Unset: run it when the table is partitioned.
    pub enabled: Option<bool>,
    /// Seconds between passes inside `walpost run` (default 3600).
    pub interval_secs: Option<u64>,
    /// Drop partitions whose whole range is older than this many days (default 7).
    pub keep_days: Option<u32>,
    /// Keep partitions created this many days ahead (default 3).
    pub days_ahead: Option<u32>,
    /// lock_timeout for every DDL statement of a pass, in milliseconds (default 1000).
    pub lock_timeout_ms: Option<u64>,
}

/// Resolved retention settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionConfig {
    /// `Some(false)`: no task in `walpost run`; `None`: the task acts when the table is partitioned.
    pub enabled: Option<bool>,
    pub interval: Duration,
    pub keep_days: u32,
    pub days_ahead: u32,
    pub lock_timeout: Duration,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig {
            enabled: None,
            interval: Duration::from_secs(3600),
            keep_days: 7,
            days_ahead: 3,
            lock_timeout: Duration::from_millis(1000),
        }
    }
}

impl RetentionConfig {
    /// The file's `[retention]` table over the defaults; `keep_days`/`days_ahead` flags win.
    pub fn resolve(
        file: &RetentionFile,
        keep_days: Option<u32>,
        days_ahead: Option<u32>,
    ) -> Result<RetentionConfig, ConfigError> {
        let d = RetentionConfig::default();
        let invalid =
            |key: &'static str, value: String, expected: &'static str| ConfigError::Invalid { key, value, expected };
        let interval_secs = file.interval_secs.unwrap_or(d.interval.as_secs());
        if interval_secs == 0 {
            return Err(invalid("retention.interval_secs", "0".into(), "a positive number of seconds"));
        }
        let keep_days = keep_days.or(file.keep_days).unwrap_or(d.keep_days);
        if keep_days > 36_500 {
            return Err(invalid("retention.keep_days", keep_days.to_string(), "a number of days up to 36500"));
        }
        let days_ahead = days_ahead.or(file.days_ahead).unwrap_or(d.days_ahead);
        if days_ahead == 0 || days_ahead > 366 {
            return Err(invalid("retention.days_ahead", days_ahead.to_string(), "1 to 366 days"));
        }
        let lock_ms = file.lock_timeout_ms.unwrap_or(d.lock_timeout.as_millis() as u64);
        if lock_ms == 0 {
            // 0 would mean "wait forever" to PostgreSQL, queueing every insert behind us.
            return Err(invalid("retention.lock_timeout_ms", "0".into(), "a positive number of milliseconds"));
        }
        Ok(RetentionConfig {
            enabled: file.enabled,
            interval: Duration::from_secs(interval_secs),
            keep_days,
            days_ahead,
            lock_timeout: Duration::from_millis(lock_ms),
        })
    }
}

/// What a pass works on.
#[derive(Debug, Clone)]
pub struct Target {
    pub postgres: replication::Config,
    pub table: TableName,
    pub slot: String,
    pub config: RetentionConfig,
}

impl Target {
    pub fn from_settings(s: &Settings) -> Target {
        Target {
            postgres: s.postgres.clone(),
            table: s.table.clone(),
            slot: s.slot.clone(),
            config: s.retention.clone(),
        }
    }

    /// For `walpost retention`: the connection, table and slot as `walpost run` resolves
    /// them (flag > environment > file > default), without requiring Kafka settings;
    /// `--keep-days`/`--days-ahead` over `[retention]`.
    pub fn resolve(args: &RetentionArgs, file: FileConfig) -> Result<Target, ConfigError> {
        let retention = file.retention.clone();
        let settings = Settings::resolve_without_kafka(&args.run, file)?;
        let mut target = Target::from_settings(&settings);
        target.config = RetentionConfig::resolve(&retention, args.keep_days, args.days_ahead)?;
        Ok(target)
    }
}

// ---------------------------------------------------------------------------------
// Report
// ---------------------------------------------------------------------------------

/// What a pass did (or, in a dry run, would do) with one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Create,
    Seal,
    Drop,
    Keep,
}

/// Why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Created to cover the days ahead.
    Ahead,
    /// The whole range is older than the retention period.
    Expired,
    /// The range is not yet older than the retention period.
    NotOldEnough,
    /// Sealed, waiting for the slot to confirm the seal's WAL position.
    SlotBehind,
    /// The slot does not exist (or belongs to another database): nothing is dropped.
    SlotMissing,
    /// The slot was invalidated: nothing is dropped (runbooks/slot-lost.md needs the rows).
    SlotInvalidated,
    /// The lock was not granted within lock_timeout; retried next pass.
    LockTimeout,
    /// The default partition holds rows (never dropped; rows outside every range).
    DefaultPartition,
    /// The empty default partition (never dropped).
    DefaultEmpty,
    /// A `DETACH PARTITION ... CONCURRENTLY` by someone else is pending.
    DetachPending,
    /// The new partition conflicts with an existing table or with rows of the default partition.
    Conflict,
    /// Any other server error (see the detail).
    Error,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Ahead => "ahead",
            Reason::Expired => "expired",
            Reason::NotOldEnough => "not_old_enough",
            Reason::SlotBehind => "slot_behind",
            Reason::SlotMissing => "slot_missing",
            Reason::SlotInvalidated => "slot_invalidated",
            Reason::LockTimeout => "lock_timeout",
            Reason::DefaultPartition | Reason::DefaultEmpty => "default_partition",
            Reason::DetachPending => "detach_pending",
            Reason::Conflict => "conflict",
            Reason::Error => "error",
        }
    }

    /// Reasons counted in `walpost_retention_partitions_skipped_total`: the partition
    /// was due for an action and left as it was.
    pub const SKIPPED: &'static [Reason] = &[
        Reason::SlotBehind,
        Reason::SlotMissing,
        Reason::SlotInvalidated,
        Reason::LockTimeout,
        Reason::DefaultPartition,
        Reason::DetachPending,
        Reason::Conflict,
        Reason::Error,
    ];

    fn is_skip(self) -> bool {
        Reason::SKIPPED.contains(&self)
    }
}

/// One line of a pass report: one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// `schema.name`.
    pub partition: String,
    /// `[2026-11-29, 2026-11-30)`.
    pub range: String,
    pub action: Action,
    /// False in a dry run: the action was not taken.
    pub done: bool,
    pub reason: Reason,
    pub detail: String,
}

impl Line {
    fn action_word(&self) -> &'static str {
        match (self.action, self.done) {
            (Action::Create, true) => "created",
            (Action::Create, false) => "would-create",
            (Action::Seal, true) => "sealed",
            (Action::Seal, false) => "would-seal",
            (Action::Drop, true) => "dropped",
            (Action::Drop, false) => "would-drop",
            (Action::Keep, _) => "kept",
        }
    }

    /// The reason counted as a skip, if this line is one.
    pub fn skipped(&self) -> Option<Reason> {
        (self.action != Action::Drop && self.action != Action::Create && self.reason.is_skip()).then_some(self.reason)
    }
}

impl fmt::Display for Line {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:<32} {:<44} {:<12} {}", self.partition, self.range, self.action_word(), self.reason.as_str())?;
        if !self.detail.is_empty() {
            write!(f, " ({})", self.detail)?;
        }
        Ok(())
    }
}

/// How a pass ended.
#[derive(Debug)]
pub enum Outcome {
    /// The table is not partitioned (apply migrations/0002): nothing to do.
    NotPartitioned,
    /// Another session holds the retention lock for this table.
    Busy,
    /// One line per partition.
    Done(Vec<Line>),
}

/// Retention counters, part of [`Metrics`].
#[derive(Debug, Default)]
pub struct RetentionMetrics {
    created: AtomicU64,
    sealed: AtomicU64,
    dropped: AtomicU64,
    skipped: Mutex<BTreeMap<&'static str, u64>>,
    passes_ok: AtomicU64,
    passes_error: AtomicU64,
    last_success_secs: AtomicU64,
}

impl RetentionMetrics {
    fn record(&self, line: &Line) {
        if !line.done {
            return;
        }
        match line.action {
            Action::Create => {
                self.created.fetch_add(1, Ordering::Relaxed);
            }
            Action::Seal => {
                self.sealed.fetch_add(1, Ordering::Relaxed);
            }
            Action::Drop => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
            Action::Keep => {}
        }
        if let Some(reason) = line.skipped() {
            if let Ok(mut map) = self.skipped.lock() {
                *map.entry(reason.as_str()).or_insert(0) += 1;
            }
        }
    }

    fn pass_finished(&self, ok: bool) {
        if ok {
            self.passes_ok.fetch_add(1, Ordering::Relaxed);
            let now =
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
            self.last_success_secs.store(now, Ordering::Relaxed);
        } else {
            self.passes_error.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Samples of the `walpost_retention_*` metric `name` (HELP/TYPE are written by the caller).
    pub fn render(&self, out: &mut String, name: &str) {
        use std::fmt::Write as _;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        match name {
            "walpost_retention_partitions_created_total" => {
                let _ = writeln!(out, "{name} {}", load(&self.created));
            }
            "walpost_retention_partitions_sealed_total" => {
                let _ = writeln!(out, "{name} {}", load(&self.sealed));
            }
            "walpost_retention_partitions_dropped_total" => {
                let _ = writeln!(out, "{name} {}", load(&self.dropped));
            }
            "walpost_retention_partitions_skipped_total" => {
                let map = self.skipped.lock().map(|m| m.clone()).unwrap_or_default();
                for reason in Reason::SKIPPED {
                    let n = map.get(reason.as_str()).copied().unwrap_or(0);
                    let _ = writeln!(out, "{name}{{reason=\"{}\"}} {n}", reason.as_str());
                }
            }
            "walpost_retention_passes_total" => {
                let _ = writeln!(out, "{name}{{result=\"ok\"}} {}", load(&self.passes_ok));
                let _ = writeln!(out, "{name}{{result=\"error\"}} {}", load(&self.passes_error));
            }
            "walpost_retention_last_success_timestamp_seconds" => {
                let _ = writeln!(out, "{name} {}", load(&self.last_success_secs));
            }
            _ => {}
        }
    }
}

// ---------------------------------------------------------------------------------
// Entry points
// ---------------------------------------------------------------------------------

/// `walpost retention [--dry-run]`: one pass, one line per partition on stdout.
/// Fails (non-zero exit) when the pass or any action in it failed.
pub async fn command(args: &RetentionArgs, file: FileConfig) -> Result<(), PipelineError> {
    let target = Target::resolve(args, file).map_err(PipelineError::definite)?;
    tracing::info!(
        postgres = %target.postgres.redacted(),
        table = %target.table,
        slot = %target.slot,
        keep_days = target.config.keep_days,
        days_ahead = target.config.days_ahead,
        dry_run = args.dry_run,
        "retention pass"
    );
    match pass(&target, args.dry_run, None).await? {
        Outcome::NotPartitioned => Err(PipelineError::definite(not_partitioned_message(&target.table))),
        Outcome::Busy => Err(PipelineError::transient(format!(
            "another session is running a retention pass on {} (a running walpost?); try again later",
            target.table
        ))),
        Outcome::Done(lines) => {
            for line in &lines {
                println!("{line}");
            }
            let failed: Vec<&Line> = lines.iter().filter(|l| l.reason == Reason::Error).collect();
            if failed.is_empty() {
                Ok(())
            } else {
                Err(PipelineError::definite(format!(
                    "{} partition action(s) failed: {}",
                    failed.len(),
                    failed.iter().map(|l| format!("{}: {}", l.partition, l.detail)).collect::<Vec<_>>().join("; ")
                )))
            }
        }
    }
}

fn not_partitioned_message(table: &TableName) -> String {
    format!(
        "table {table} is not partitioned, so retention has nothing to manage: apply migrations/0002_outbox_partitioned.sql (or partition it BY RANGE on a timestamp column)"
    )
}

/// The retention task of `walpost run`: a pass now, then every `interval` (sooner after
/// an error), until shutdown. Never ends walpost: failures are logged and counted.
pub async fn task(settings: Settings, metrics: Arc<Metrics>, mut shutdown: watch::Receiver<bool>) {
    let target = Target::from_settings(&settings);
    let cfg = target.config.clone();
    if cfg.enabled == Some(false) {
        tracing::debug!("retention disabled ([retention] enabled = false)");
        return;
    }
    let mut told_unpartitioned = false;
    loop {
        let wait = match pass(&target, false, Some(&metrics.retention)).await {
            Ok(Outcome::Done(lines)) => {
                let failed = lines.iter().any(|l| l.reason == Reason::Error);
                metrics.retention.pass_finished(!failed);
                told_unpartitioned = false;
                for line in &lines {
                    log_line(line);
                }
                if failed {
                    cfg.interval.min(Duration::from_secs(60))
                } else {
                    cfg.interval
                }
            }
            Ok(Outcome::NotPartitioned) => {
                if !told_unpartitioned {
                    if cfg.enabled == Some(true) {
                        tracing::warn!("retention is enabled but {}", not_partitioned_message(&target.table));
                    } else {
                        tracing::info!(table = %target.table, "outbox table is not partitioned: retention is idle");
                    }
                    told_unpartitioned = true;
                }
                cfg.interval
            }
            Ok(Outcome::Busy) => {
                tracing::debug!(table = %target.table, "another session holds the retention lock; skipping this pass");
                cfg.interval
            }
            Err(e) => {
                metrics.retention.pass_finished(false);
                let wait = cfg.interval.min(Duration::from_secs(60));
                tracing::warn!(retry_in_s = wait.as_secs(), "retention pass failed: {e}");
                wait
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.changed() => return,
        }
    }
}

fn log_line(l: &Line) {
    let (p, r, d) = (&l.partition, &l.range, &l.detail);
    match (l.action, l.reason) {
        (Action::Keep, Reason::NotOldEnough | Reason::DefaultEmpty) => {
            tracing::debug!(partition = %p, range = %r, "retention: kept, {}", l.reason.as_str())
        }
        (Action::Keep, Reason::LockTimeout | Reason::SlotBehind)
        | (Action::Seal, _)
        | (Action::Create, _)
        | (Action::Drop, _) => {
            tracing::info!(partition = %p, range = %r, reason = l.reason.as_str(), detail = %d, "retention: {}", l.action_word())
        }
        (Action::Keep, _) => {
            tracing::warn!(partition = %p, range = %r, reason = l.reason.as_str(), detail = %d, "retention: kept, {}", l.reason.as_str())
        }
    }
}

// ---------------------------------------------------------------------------------
// One pass
// ---------------------------------------------------------------------------------

/// A partition as the catalog describes it.
#[derive(Debug, Clone)]
struct Partition {
    /// `"schema"."name"` for SQL.
    quoted: String,
    /// `schema.name` for people.
    display: String,
    is_default: bool,
    range: Range,
    detach_pending: bool,
    /// The seal's WAL position, when sealed with a readable comment.
    seal: Option<Seal>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seal {
    /// The constraint exists; its comment gives W.
    At(Lsn),
    /// The constraint exists but its comment is missing or unreadable: seal again.
    Unknown,
}

/// A range partition's bounds in microseconds since the Unix epoch (UTC); None = MINVALUE/MAXVALUE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub lo: Option<i64>,
    pub hi: Option<i64>,
}

impl fmt::Display for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |t: Option<i64>, inf: &str| t.map(display_ts).unwrap_or_else(|| inf.to_owned());
        write!(f, "[{}, {})", show(self.lo, "MINVALUE"), show(self.hi, "MAXVALUE"))
    }
}

fn ddl_error(e: &replication::Error) -> Option<Reason> {
    match e.sqlstate() {
        Some("55P03") => Some(Reason::LockTimeout),
        // duplicate_table, invalid_object_definition (overlap), check_violation (default partition rows)
        Some("42P07") | Some("42P17") | Some("23514") => Some(Reason::Conflict),
        _ => None,
    }
}

/// Runs one pass. `dry_run` reads only. `metrics` counts what was done.
pub async fn pass(t: &Target, dry_run: bool, metrics: Option<&RetentionMetrics>) -> Result<Outcome, PipelineError> {
    let mut sql = ReplicationClient::connect_sql(&t.postgres).await?;
    let result = pass_on(&mut sql, t, dry_run).await;
    sql.close().await;
    if let (Some(m), Ok(Outcome::Done(lines))) = (metrics, &result) {
        for line in lines {
            m.record(line);
        }
    }
    result
}

async fn pass_on(sql: &mut ReplicationClient, t: &Target, dry_run: bool) -> Result<Outcome, PipelineError> {
    // Bounds are read and written as UTC text; names are qualified, so no search_path games.
    sql.simple_query("SET TimeZone = 'UTC'").await?;
    sql.simple_query("SET DateStyle = 'ISO, YMD'").await?;
    sql.simple_query("SET search_path = pg_catalog, pg_temp").await?;

    let root = sql
        .simple_query(&format!(
            "SELECT c.oid::text AS oid, c.relkind::text AS kind, pt.partstrat::text AS strat, \
                    pt.partnatts::text AS natts, format_type(a.atttypid, a.atttypmod) AS keytype \
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             LEFT JOIN pg_partitioned_table pt ON pt.partrelid = c.oid \
             LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = pt.partattrs[0] \
             WHERE n.nspname = {} AND c.relname = {}",
            quote_literal(&t.table.schema),
            quote_literal(&t.table.name)
        ))
        .await?;
    let Some(root_oid) = root.first("oid").map(str::to_owned) else {
        return Err(PipelineError::definite(format!(
            "table {} does not exist in database {}: apply migrations/0001_events_outbox.sql and 0002_outbox_partitioned.sql, or pass --table",
            t.table, t.postgres.dbname
        )));
    };
    if root.first("kind") != Some("p") {
        return Ok(Outcome::NotPartitioned);
    }
    let keytype = root.first("keytype").unwrap_or("an expression");
    if root.first("strat") != Some("r")
        || root.first("natts") != Some("1")
        || !matches!(keytype, "timestamp with time zone" | "timestamp without time zone")
    {
        return Err(PipelineError::definite(format!(
            "table {} is partitioned, but retention handles only RANGE partitioning on one timestamptz or timestamp column (partition key type: {keytype})",
            t.table
        )));
    }

    if !dry_run {
        let lock = sql
            .simple_query(&format!(
                "SELECT pg_try_advisory_lock(hashtextextended('walpost retention ' || {root_oid}, 0))::text AS got"
            ))
            .await?;
        if lock.first("got") != Some("true") {
            return Ok(Outcome::Busy);
        }
    }

    let now_r = sql.simple_query("SELECT floor(extract(epoch FROM now()) * 1000000)::bigint::text AS now").await?;
    let now: i64 = now_r
        .first("now")
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| PipelineError::definite("cannot read now() from PostgreSQL"))?;
    let partitions = list_partitions(sql, &root_oid).await?;

    let mut lines = Vec::new();
    let root_quoted = t.table.quoted();

    // 1. Ahead.
    let today = day_floor(now);
    let window = (today, today + (i64::from(t.config.days_ahead) + 1) * DAY_MICROS);
    let ranges: Vec<Range> = partitions.iter().filter(|p| !p.is_default).map(|p| p.range).collect();
    for piece in gaps(window, &ranges).into_iter().flat_map(split_days) {
        let name = partition_name(&t.table.name, piece.0);
        let quoted = format!("{}.{}", quote_ident(&t.table.schema), quote_ident(&name));
        let range = Range { lo: Some(piece.0), hi: Some(piece.1) };
        let mut line = Line {
            partition: format!("{}.{name}", t.table.schema),
            range: range.to_string(),
            action: Action::Create,
            done: false,
            reason: Reason::Ahead,
            detail: String::new(),
        };
        if !dry_run {
            match create_partition(sql, t, &root_quoted, &quoted, piece).await {
                Ok(()) => line.done = true,
                Err(e) if e.is_transient() => return Err(e.into()),
                Err(e) => {
                    line.action = Action::Keep;
                    line.reason = ddl_error(&e).unwrap_or(Reason::Error);
                    line.detail = format!("not created: {e}");
                }
            }
        }
        lines.push(line);
    }

    // 2 and 3. Seal and drop, and report everything else.
    let cutoff = now - i64::from(t.config.keep_days) * DAY_MICROS;
    let mut slot: Option<Result<Lsn, Reason>> = None;
    for p in &partitions {
        let mut line = Line {
            partition: p.display.clone(),
            range: if p.is_default { "DEFAULT".into() } else { p.range.to_string() },
            action: Action::Keep,
            done: false,
            reason: Reason::NotOldEnough,
            detail: String::new(),
        };
        if p.is_default {
            let rows = sql.simple_query(&format!("SELECT EXISTS (SELECT 1 FROM {}) ::text AS rows", p.quoted)).await?;
            if rows.first("rows") == Some("true") {
                line.reason = Reason::DefaultPartition;
                line.detail = format!(
                    "the default partition holds rows outside every range; retention never drops it: move them into ranged partitions, e.g. detach {} and re-insert its rows through {}",
                    p.display, t.table
                );
            } else {
                line.reason = Reason::DefaultEmpty;
            }
            lines.push(line);
            continue;
        }
        if p.detach_pending {
            line.reason = Reason::DetachPending;
            line.detail = format!("finish it with ALTER TABLE {root_quoted} DETACH PARTITION {} FINALIZE", p.quoted);
            lines.push(line);
            continue;
        }
        let expired = matches!(p.range.hi, Some(hi) if hi <= cutoff);
        if !expired {
            if let Some(Seal::At(w)) = p.seal {
                line.detail = format!("sealed at {w}");
            }
            lines.push(line);
            continue;
        }
        // Seal (or re-seal when the comment is unreadable).
        let w = match p.seal {
            Some(Seal::At(w)) => w,
            _ if dry_run => {
                line.action = Action::Seal;
                line.reason = Reason::Expired;
                line.detail = "then dropped once the slot confirms the seal position".into();
                lines.push(line);
                continue;
            }
            _ => match seal(sql, t, p).await {
                Ok(w) => {
                    line.action = Action::Seal;
                    line.done = true;
                    w
                }
                Err(e) if e.is_transient() => return Err(e.into()),
                Err(e) => {
                    line.reason = ddl_error(&e).unwrap_or(Reason::Error);
                    line.detail = format!("not sealed: {e}");
                    lines.push(line);
                    continue;
                }
            },
        };
        // Drop once the slot confirmed W.
        let confirmed = match &slot {
            Some(s) => *s,
            None => {
                let s = slot_position(sql, t).await?;
                slot = Some(s);
                s
            }
        };
        match confirmed {
            Err(reason) => {
                line.reason = reason;
                line.detail = format!("sealed at {w}; slot {}: {}", t.slot, reason.as_str());
            }
            Ok(c) if c < w => {
                line.reason = Reason::SlotBehind;
                line.detail = format!("sealed at {w}; slot {} confirmed {c}", t.slot);
            }
            Ok(c) if dry_run => {
                line.action = Action::Drop;
                line.reason = Reason::Expired;
                line.detail = format!("sealed at {w}; slot {} confirmed {c}", t.slot);
            }
            Ok(c) => match drop_partition(sql, t, &root_quoted, p, w).await {
                Ok(true) => {
                    line.action = Action::Drop;
                    line.done = true;
                    line.reason = Reason::Expired;
                    line.detail = format!("sealed at {w}; slot {} confirmed {c}", t.slot);
                }
                Ok(false) => {
                    // The seal changed under us (removed or renewed by someone): next pass.
                    line.action = Action::Keep;
                    line.reason = Reason::Conflict;
                    line.detail = "the seal changed since this pass read it; seen again next pass".into();
                }
                Err(e) if e.is_transient() => return Err(e.into()),
                Err(e) => {
                    line.action = Action::Keep;
                    line.reason = ddl_error(&e).unwrap_or(Reason::Error);
                    line.detail = format!("sealed at {w}; not dropped: {e}");
                }
            },
        }
        lines.push(line);
    }
    if !dry_run {
        sql.simple_query(&format!(
            "SELECT pg_advisory_unlock(hashtextextended('walpost retention ' || {root_oid}, 0))"
        ))
        .await?;
    }
    Ok(Outcome::Done(lines))
}

/// The text-to-epoch conversion of one bound (`'...'`, MINVALUE or MAXVALUE), in SQL.
fn bound_micros_sql(expr: &str) -> String {
    format!(
        "CASE WHEN {expr} IS NULL OR {expr} IN ('MINVALUE', 'MAXVALUE') THEN NULL \
              WHEN NOT isfinite(btrim({expr}, '''')::timestamptz) THEN NULL \
              ELSE floor(extract(epoch FROM btrim({expr}, '''')::timestamptz) * 1000000)::bigint::text END"
    )
}

async fn list_partitions(sql: &mut ReplicationClient, root_oid: &str) -> Result<Vec<Partition>, PipelineError> {
    let r = sql
        .simple_query(&format!(
            "SELECT n.nspname AS schema, c.relname AS name, \
                    (pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT')::text AS is_default, \
                    {lo} AS lo, {hi} AS hi, \
                    coalesce((to_jsonb(i) ->> 'inhdetachpending')::boolean, false)::text AS pending, \
                    (s.oid IS NOT NULL)::text AS sealed, obj_description(s.oid, 'pg_constraint') AS seal \
             FROM pg_inherits i \
             JOIN pg_class c ON c.oid = i.inhrelid \
             JOIN pg_namespace n ON n.oid = c.relnamespace \
             LEFT JOIN LATERAL (SELECT regexp_match(pg_get_expr(c.relpartbound, c.oid), \
                 '^FOR VALUES FROM \\((.+)\\) TO \\((.+)\\)$') AS m) b ON true \
             LEFT JOIN LATERAL (SELECT k.oid FROM pg_constraint k WHERE k.conrelid = c.oid \
                 AND k.conname = {seal} AND k.contype = 'c' AND pg_get_constraintdef(k.oid) LIKE 'CHECK (false)%') s ON true \
             WHERE i.inhparent = {root_oid} \
             ORDER BY n.nspname, c.relname",
            lo = bound_micros_sql("b.m[1]"),
            hi = bound_micros_sql("b.m[2]"),
            seal = quote_literal(SEAL_CONSTRAINT),
        ))
        .await?;
    let mut out = Vec::with_capacity(r.rows.len());
    for row in 0..r.rows.len() {
        let get = |name: &str| -> Option<&str> {
            let idx = r.columns.iter().position(|c| c == name)?;
            r.text(row, idx)
        };
        let (schema, name) = (get("schema").unwrap_or_default(), get("name").unwrap_or_default());
        let micros = |name: &str| get(name).and_then(|v| v.parse::<i64>().ok());
        out.push(Partition {
            quoted: format!("{}.{}", quote_ident(schema), quote_ident(name)),
            display: format!("{schema}.{name}"),
            is_default: get("is_default") == Some("true"),
            range: Range { lo: micros("lo"), hi: micros("hi") },
            detach_pending: get("pending") == Some("true"),
            seal: (get("sealed") == Some("true")).then(|| parse_seal(get("seal"))),
        });
    }
    Ok(out)
}

fn parse_seal(comment: Option<&str>) -> Seal {
    comment
        .and_then(|c| c.strip_prefix(SEAL_PREFIX))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|lsn| lsn.trim_end_matches(';').parse().ok())
        .map(Seal::At)
        .unwrap_or(Seal::Unknown)
}

fn seal_comment(w: Lsn, slot: &str) -> String {
    format!(
        "{SEAL_PREFIX}{w}; walpost drops this partition once replication slot {slot} has confirmed {w} (every row in it was committed before); drop this constraint to unseal"
    )
}

/// Runs `statements` in one transaction with lock_timeout; rolls back on error.
async fn in_transaction(
    sql: &mut ReplicationClient,
    lock_timeout: Duration,
    statements: &[String],
) -> Result<Vec<QueryResult>, replication::Error> {
    let mut results = Vec::new();
    let mut all = vec!["BEGIN".to_owned(), format!("SET LOCAL lock_timeout = '{}ms'", lock_timeout.as_millis())];
    all.extend_from_slice(statements);
    for s in &all {
        match sql.simple_query(s).await {
            Ok(r) => results.push(r),
            Err(e) => {
                if !e.is_transient() {
                    let _ = sql.simple_query("ROLLBACK").await;
                }
                return Err(e);
            }
        }
    }
    sql.simple_query("COMMIT").await?;
    Ok(results)
}

async fn create_partition(
    sql: &mut ReplicationClient,
    t: &Target,
    root: &str,
    quoted: &str,
    (lo, hi): (i64, i64),
) -> Result<(), replication::Error> {
    // CREATE TABLE ... PARTITION OF would take ACCESS EXCLUSIVE on the table; ATTACH
    // takes SHARE UPDATE EXCLUSIVE, which inserts do not wait for.
    in_transaction(
        sql,
        t.config.lock_timeout,
        &[
            format!(
                "CREATE TABLE {quoted} (LIKE {root} INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING GENERATED \
                 INCLUDING IDENTITY INCLUDING STORAGE INCLUDING COMMENTS)"
            ),
            format!(
                "ALTER TABLE {root} ATTACH PARTITION {quoted} FOR VALUES FROM ({}) TO ({})",
                quote_literal(&literal_ts(lo)),
                quote_literal(&literal_ts(hi))
            ),
        ],
    )
    .await
    .map(|_| ())
}

/// Seals `p` and returns W (see the module docs).
async fn seal(sql: &mut ReplicationClient, t: &Target, p: &Partition) -> Result<Lsn, replication::Error> {
    sql.simple_query("BEGIN").await?;
    let result: Result<Lsn, replication::Error> = async {
        sql.simple_query(&format!("SET LOCAL lock_timeout = '{}ms'", t.config.lock_timeout.as_millis())).await?;
        sql.simple_query(&format!("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE", p.quoted)).await?;
        if p.seal.is_none() {
            sql.simple_query(&format!(
                "ALTER TABLE {} ADD CONSTRAINT {} CHECK (false) NOT VALID",
                p.quoted,
                quote_ident(SEAL_CONSTRAINT)
            ))
            .await?;
        }
        // Read after the lock: every writer of the partition has ended.
        let r = sql.simple_query("SELECT pg_current_wal_insert_lsn()::text AS w").await?;
        let w: Lsn = r
            .first("w")
            .and_then(|w| w.parse().ok())
            .ok_or_else(|| replication::Error::Protocol("pg_current_wal_insert_lsn() returned no LSN".into()))?;
        sql.simple_query(&format!(
            "COMMENT ON CONSTRAINT {} ON {} IS {}",
            quote_ident(SEAL_CONSTRAINT),
            p.quoted,
            quote_literal(&seal_comment(w, &t.slot))
        ))
        .await?;
        sql.simple_query("COMMIT").await?;
        Ok(w)
    }
    .await;
    if let Err(e) = &result {
        if !e.is_transient() {
            let _ = sql.simple_query("ROLLBACK").await;
        }
    }
    result
}

/// Drops `p` if it is still a partition of the table sealed at `w`. Ok(false): the seal changed.
async fn drop_partition(
    sql: &mut ReplicationClient,
    t: &Target,
    root: &str,
    p: &Partition,
    w: Lsn,
) -> Result<bool, replication::Error> {
    sql.simple_query("BEGIN").await?;
    let result: Result<bool, replication::Error> = async {
        sql.simple_query(&format!("SET LOCAL lock_timeout = '{}ms'", t.config.lock_timeout.as_millis())).await?;
        // The locks DROP TABLE takes, in its order, before re-reading the seal.
        sql.simple_query(&format!("LOCK TABLE ONLY {root} IN ACCESS EXCLUSIVE MODE")).await?;
        sql.simple_query(&format!("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE", p.quoted)).await?;
        let r = sql
            .simple_query(&format!(
                "SELECT obj_description(k.oid, 'pg_constraint') AS seal FROM pg_constraint k \
                 JOIN pg_inherits i ON i.inhrelid = k.conrelid AND i.inhparent = {}::regclass \
                 WHERE k.conrelid = {}::regclass AND k.conname = {} AND k.contype = 'c' \
                 AND pg_get_constraintdef(k.oid) LIKE 'CHECK (false)%'",
                quote_literal(root),
                quote_literal(&p.quoted),
                quote_literal(SEAL_CONSTRAINT)
            ))
            .await?;
        if r.rows.is_empty() || parse_seal(r.first("seal")) != Seal::At(w) {
            sql.simple_query("ROLLBACK").await?;
            return Ok(false);
        }
        sql.simple_query(&format!("DROP TABLE {}", p.quoted)).await?;
        sql.simple_query("COMMIT").await?;
        Ok(true)
    }
    .await;
    if let Err(e) = &result {
        if !e.is_transient() {
            let _ = sql.simple_query("ROLLBACK").await;
        }
    }
    result
}

/// The slot's confirmed position, or why no partition may be dropped.
async fn slot_position(sql: &mut ReplicationClient, t: &Target) -> Result<Result<Lsn, Reason>, PipelineError> {
    let row = setup::slot_row(sql, &t.slot).await?;
    Ok(match row {
        None => Err(Reason::SlotMissing),
        Some(r) if r.database.as_deref() != Some(t.postgres.dbname.as_str()) => Err(Reason::SlotMissing),
        Some(r) if r.wal_status.as_deref() == Some("lost") => Err(Reason::SlotInvalidated),
        Some(r) => r.confirmed_flush.ok_or(Reason::SlotMissing),
    })
}

// ---------------------------------------------------------------------------------
// Time arithmetic (UTC, microseconds since the Unix epoch)
// ---------------------------------------------------------------------------------

fn day_floor(t: i64) -> i64 {
    t.div_euclid(DAY_MICROS) * DAY_MICROS
}

/// The parts of `window` no range covers, in order.
pub fn gaps(window: (i64, i64), ranges: &[Range]) -> Vec<(i64, i64)> {
    let mut covered: Vec<(i64, i64)> = ranges
        .iter()
        .map(|r| (r.lo.unwrap_or(i64::MIN), r.hi.unwrap_or(i64::MAX)))
        .filter(|(lo, hi)| lo < hi && *hi > window.0 && *lo < window.1)
        .collect();
    covered.sort_unstable();
    let mut out = Vec::new();
    let mut at = window.0;
    for (lo, hi) in covered {
        if lo > at {
            out.push((at, lo.min(window.1)));
        }
        at = at.max(hi);
        if at >= window.1 {
            break;
        }
    }
    if at < window.1 {
        out.push((at, window.1));
    }
    out
}

/// Splits a gap at UTC midnights: one daily partition per piece.
pub fn split_days((lo, hi): (i64, i64)) -> Vec<(i64, i64)> {
    let mut out = Vec::new();
    let mut at = lo;
    while at < hi {
        let next = (day_floor(at) + DAY_MICROS).min(hi);
        out.push((at, next));
        at = next;
    }
    out
}

/// `<table>_pYYYYMMDD`, plus `_HHMMSS` when the range does not start at midnight.
pub fn partition_name(table: &str, lo: i64) -> String {
    let c = Civil::from_micros(lo);
    let suffix = if lo == day_floor(lo) {
        format!("_p{:04}{:02}{:02}", c.year, c.month, c.day)
    } else {
        format!("_p{:04}{:02}{:02}_{:02}{:02}{:02}", c.year, c.month, c.day, c.hour, c.minute, c.second)
    };
    // PostgreSQL truncates names to 63 bytes; keep the date part.
    let mut base = table.to_owned();
    while base.len() + suffix.len() > 63 {
        base.pop();
    }
    base + &suffix
}

/// A timestamptz literal in UTC: `2026-11-29 00:00:00+00`.
pub fn literal_ts(t: i64) -> String {
    let c = Civil::from_micros(t);
    let frac = if c.micros == 0 { String::new() } else { format!(".{:06}", c.micros) };
    format!("{:04}-{:02}-{:02} {:02}:{:02}:{:02}{frac}+00", c.year, c.month, c.day, c.hour, c.minute, c.second)
}

/// `2026-11-29` at midnight, the full UTC time otherwise.
fn display_ts(t: i64) -> String {
    if t == day_floor(t) {
        let c = Civil::from_micros(t);
        format!("{:04}-{:02}-{:02}", c.year, c.month, c.day)
    } else {
        literal_ts(t)
    }
}

struct Civil {
    year: i64,
    month: u32,
    day: u32,
    hour: u32,
    minute: u32,
    second: u32,
    micros: u32,
}

impl Civil {
    /// Howard Hinnant's days-to-civil, proleptic Gregorian calendar.
    fn from_micros(t: i64) -> Civil {
        let days = t.div_euclid(DAY_MICROS);
        let in_day = t.rem_euclid(DAY_MICROS);
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = yoe + era * 400 + i64::from(month <= 2);
        let secs = in_day / SECOND_MICROS;
        Civil {
            year,
            month,
            day,
            hour: (secs / 3600) as u32,
            minute: (secs / 60 % 60) as u32,
            second: (secs % 60) as u32,
            micros: (in_day % SECOND_MICROS) as u32,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests may fail loudly
mod tests {
    use super::*;

    const D: i64 = DAY_MICROS;
    /// 2026-11-29 00:00:00 UTC.
    const NOV29: i64 = 1_795_910_400 * SECOND_MICROS;

    fn r(lo: Option<i64>, hi: Option<i64>) -> Range {
        Range { lo, hi }
    }

    #[test]
    fn civil_dates_and_literals() {
        assert_eq!(literal_ts(0), "1970-01-01 00:00:00+00");
        assert_eq!(literal_ts(NOV29), "2026-11-29 00:00:00+00");
        assert_eq!(literal_ts(NOV29 + 3 * D + 3_723_000_001), "2026-12-02 01:02:03.000001+00");
        assert_eq!(literal_ts(951_782_400 * SECOND_MICROS), "2000-02-29 00:00:00+00");
        assert_eq!(literal_ts(-SECOND_MICROS), "1969-12-31 23:59:59+00");
        assert_eq!(display_ts(NOV29), "2026-11-29");
        assert_eq!(r(None, Some(NOV29)).to_string(), "[MINVALUE, 2026-11-29)");
    }

    #[test]
    fn names_follow_the_range() {
        assert_eq!(partition_name("outbox", NOV29), "outbox_p20261129");
        assert_eq!(partition_name("outbox", NOV29 + 12 * 3600 * SECOND_MICROS), "outbox_p20261129_120000");
        let long = "x".repeat(80);
        assert_eq!(partition_name(&long, NOV29).len(), 63);
        assert!(partition_name(&long, NOV29).ends_with("_p20261129"));
    }

    #[test]
    fn gaps_are_what_no_partition_covers() {
        let w = (NOV29, NOV29 + 4 * D);
        assert_eq!(gaps(w, &[]), vec![w]);
        // The legacy partition covers everything before the 30th; the 1st exists.
        let ranges = [r(None, Some(NOV29 + D)), r(Some(NOV29 + 2 * D), Some(NOV29 + 3 * D))];
        assert_eq!(gaps(w, &ranges), vec![(NOV29 + D, NOV29 + 2 * D), (NOV29 + 3 * D, NOV29 + 4 * D)]);
        // Fully covered, by a MAXVALUE range or by overlapping ones.
        assert!(gaps(w, &[r(Some(NOV29 - D), None)]).is_empty());
        assert!(gaps(w, &[r(Some(NOV29), Some(NOV29 + 2 * D)), r(Some(NOV29 + D), Some(NOV29 + 5 * D))]).is_empty());
        // A range ending mid-day leaves a partial day.
        let noon = NOV29 + D / 2;
        assert_eq!(gaps((NOV29, NOV29 + D), &[r(None, Some(noon))]), vec![(noon, NOV29 + D)]);
    }

    #[test]
    fn gaps_split_at_midnight() {
        let noon = NOV29 + D / 2;
        assert_eq!(split_days((noon, NOV29 + 2 * D)), vec![(noon, NOV29 + D), (NOV29 + D, NOV29 + 2 * D)]);
        assert_eq!(split_days((NOV29, NOV29 + D)), vec![(NOV29, NOV29 + D)]);
        assert!(split_days((NOV29, NOV29)).is_empty());
    }

    #[test]
    fn seal_comment_round_trips() {
        let w: Lsn = "16/B374D848".parse().unwrap();
        assert_eq!(parse_seal(Some(&seal_comment(w, "walpost"))), Seal::At(w));
        assert_eq!(parse_seal(None), Seal::Unknown);
        assert_eq!(parse_seal(Some("hand-written")), Seal::Unknown);
    }

    #[test]
    fn config_defaults_and_validation() {
        let c = RetentionConfig::resolve(&RetentionFile::default(), None, None).unwrap();
        assert_eq!(c, RetentionConfig::default());
        assert_eq!((c.keep_days, c.days_ahead, c.interval.as_secs(), c.enabled), (7, 3, 3600, None));
        let file: RetentionFile = toml::from_str("enabled = true\nkeep_days = 30\ndays_ahead = 5").unwrap();
        let c = RetentionConfig::resolve(&file, Some(2), None).unwrap();
        assert_eq!((c.enabled, c.keep_days, c.days_ahead), (Some(true), 2, 5));
        let bad: RetentionFile = toml::from_str("days_ahead = 0").unwrap();
        assert!(RetentionConfig::resolve(&bad, None, None).unwrap_err().to_string().contains("retention.days_ahead"));
        let err = toml::from_str::<RetentionFile>("keep_dayz = 3").unwrap_err().to_string();
        assert!(err.contains("keep_dayz"), "{err}");
    }

    #[test]
    fn skipped_lines_are_counted_by_reason() {
        let m = RetentionMetrics::default();
        let line = |action, done, reason| Line {
            partition: "events.outbox_p20261129".into(),
            range: String::new(),
            action,
            done,
            reason,
            detail: String::new(),
        };
        m.record(&line(Action::Create, true, Reason::Ahead));
        m.record(&line(Action::Seal, true, Reason::SlotBehind));
        m.record(&line(Action::Keep, true, Reason::LockTimeout));
        m.record(&line(Action::Keep, true, Reason::NotOldEnough));
        m.record(&line(Action::Drop, true, Reason::Expired));
        let mut out = String::new();
        for name in [
            "walpost_retention_partitions_created_total",
            "walpost_retention_partitions_sealed_total",
            "walpost_retention_partitions_dropped_total",
            "walpost_retention_partitions_skipped_total",
        ] {
            m.render(&mut out, name);
        }
        assert!(out.contains("walpost_retention_partitions_created_total 1"), "{out}");
        assert!(out.contains("walpost_retention_partitions_sealed_total 1"), "{out}");
        assert!(out.contains("walpost_retention_partitions_dropped_total 1"), "{out}");
        assert!(out.contains("walpost_retention_partitions_skipped_total{reason=\"slot_behind\"} 1"), "{out}");
        assert!(out.contains("walpost_retention_partitions_skipped_total{reason=\"lock_timeout\"} 1"), "{out}");
        assert!(!out.contains("not_old_enough"), "{out}");
    }
}
