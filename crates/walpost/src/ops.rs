//! Operator commands: `walpost check`, `walpost slot status|create|drop`.
//!
//! `check` runs every check even when an earlier one fails, prints one line per check
//! (`ok`, `warn` or `FAIL`, then what was found and, on failure, the fix) and reports
//! whether any failed. Connection strings are printed redacted.

use std::fmt::Write as _;
use std::io::{BufRead, IsTerminal, Write};
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::ClientConfig;
use replication::{quote_literal, ReplicationClient, SlotSnapshot};

use crate::config::Settings;
use crate::error::PipelineError;
use crate::monitor::{self, Verdict};
use crate::setup;

/// One line of `walpost check`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    Ok(String),
    Warn(String),
    Fail(String),
}

impl Check {
    pub fn line(&self) -> String {
        match self {
            Check::Ok(m) => format!("ok    {m}"),
            Check::Warn(m) => format!("warn  {m}"),
            Check::Fail(m) => format!("FAIL  {m}"),
        }
    }
}

fn from_result(ok: String, r: Result<(), PipelineError>) -> Check {
    match r {
        Ok(()) => Check::Ok(ok),
        Err(e) => Check::Fail(e.to_string()),
    }
}

/// Runs every preflight check; prints as it goes; returns all results.
pub async fn check(s: &Settings) -> Vec<Check> {
    let mut out = Vec::new();
    let mut emit = |c: Check| {
        println!("{}", c.line());
        out.push(c);
    };
    match ReplicationClient::connect_sql(&s.postgres).await {
        Err(e) => emit(Check::Fail(format!("connect to {}: {}", s.postgres.redacted(), PipelineError::from(e)))),
        Ok(mut sql) => {
            let version = sql.parameter("server_version").unwrap_or("?").to_owned();
            emit(Check::Ok(format!("connect to {} (PostgreSQL {version})", s.postgres.redacted())));
            for c in postgres_checks(&mut sql, s).await {
                emit(c);
            }
            sql.close().await;
        }
    }
    match ReplicationClient::connect(&s.postgres).await {
        Ok(repl) => {
            emit(Check::Ok("replication connection (replication=database) accepted".into()));
            repl.close().await;
        }
        Err(e) => {
            let hba = if e.sqlstate() == Some("28000") {
                "; pg_hba.conf needs a line for the 'replication' keyword or this database"
            } else {
                ""
            };
            emit(Check::Fail(format!("replication connection refused: {}{hba}", PipelineError::from(e))))
        }
    }
    for c in kafka_checks(s).await {
        emit(c);
    }
    out
}

async fn setting(sql: &mut ReplicationClient, name: &str) -> Option<String> {
    sql.simple_query(&format!("SELECT current_setting({}) AS v", quote_literal(name)))
        .await
        .ok()
        .and_then(|r| r.first("v").map(str::to_owned))
}

async fn postgres_checks(sql: &mut ReplicationClient, s: &Settings) -> Vec<Check> {
    let mut out = Vec::new();
    out.push(from_result("wal_level = logical".into(), setup::check_wal_level(sql).await));
    for (name, view) in [("max_replication_slots", "pg_replication_slots"), ("max_wal_senders", "pg_stat_replication")]
    {
        let max: i64 = setting(sql, name).await.and_then(|v| v.parse().ok()).unwrap_or(0);
        let used: i64 = sql
            .simple_query(&format!("SELECT count(*) AS n FROM {view}"))
            .await
            .ok()
            .and_then(|r| r.first("n").and_then(|n| n.parse().ok()))
            .unwrap_or(0);
        out.push(if used < max {
            Check::Ok(format!("{name} = {max} ({used} in use)"))
        } else {
            Check::Fail(format!(
                "{name} = {max} and {used} are in use: raise {name} in postgresql.conf and restart PostgreSQL"
            ))
        });
    }
    out.push(from_result("role has REPLICATION".into(), setup::check_role(sql).await));
    // By oid, so the check works even without USAGE on the schema (which it also needs).
    let select = sql
        .simple_query(&format!(
            "SELECT (has_schema_privilege(n.oid, 'USAGE') AND has_table_privilege(c.oid, 'SELECT'))::text AS ok
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = {} AND c.relname = {}",
            quote_literal(&s.table.schema),
            quote_literal(&s.table.name)
        ))
        .await;
    match select {
        Ok(r) if r.first("ok") == Some("true") => out.push(Check::Ok(format!("SELECT on {}", s.table))),
        Ok(r) if !r.rows.is_empty() => out.push(Check::Fail(format!(
            "the role cannot SELECT from {}: GRANT USAGE ON SCHEMA {} TO <role>; GRANT SELECT ON {} TO <role>",
            s.table,
            replication::quote_ident(&s.table.schema),
            s.table.quoted()
        ))),
        // The table is missing (the next check says so) or the query failed.
        _ => {}
    }
    out.push(from_result(format!("table {} has the mapped columns", s.table), setup::check_table(sql, s).await));
    out.push(match setup::publication_state(sql, s).await {
        Ok(setup::Publication::Missing) => Check::Warn(format!(
            "publication \"{}\" does not exist: walpost run creates it (needs ownership of {})",
            s.publication, s.table
        )),
        Ok(setup::Publication::Ready) => {
            Check::Ok(format!("publication \"{}\" publishes inserts of {}", s.publication, s.table))
        }
        Ok(setup::Publication::ReadyForAllTables) => Check::Warn(format!(
            "publication \"{}\" is FOR ALL TABLES: every table's changes are decoded and sent, and only {} is published",
            s.publication, s.table
        )),
        Err(e) => Check::Fail(e.to_string()),
    });
    out.push(match setup::slot_row(sql, &s.slot).await {
        Ok(None) => Check::Warn(format!("replication slot \"{}\" does not exist: walpost run creates it", s.slot)),
        Ok(Some(row)) => match setup::check_slot(&row, s) {
            Ok(()) => Check::Ok(format!(
                "replication slot \"{}\": logical pgoutput, wal_status {}",
                s.slot,
                row.wal_status.as_deref().unwrap_or("?")
            )),
            Err(PipelineError::Transient(m)) => Check::Warn(m),
            Err(e) => Check::Fail(e.to_string()),
        },
        Err(e) => Check::Fail(e.to_string()),
    });
    match setting(sql, "max_slot_wal_keep_size").await.as_deref() {
        Some("-1") => out.push(Check::Warn(
            "max_slot_wal_keep_size = -1 (unlimited): a stalled slot can fill the disk; set a finite value (see runbooks/slot-wal-buildup.md)".into(),
        )),
        Some(v) => out.push(Check::Ok(format!("max_slot_wal_keep_size = {v}"))),
        None => out.push(Check::Warn("max_slot_wal_keep_size could not be read (PostgreSQL 13+)".into())),
    }
    match setting(sql, "idle_in_transaction_session_timeout").await.as_deref() {
        Some("0") => out.push(Check::Warn(
            "idle_in_transaction_session_timeout = 0: a forgotten open transaction stalls logical decoding forever (see runbooks/long-transaction.md)".into(),
        )),
        Some(v) => out.push(Check::Ok(format!("idle_in_transaction_session_timeout = {v}"))),
        None => {}
    }
    out
}

async fn kafka_checks(s: &Settings) -> Vec<Check> {
    let mut out = Vec::new();
    let admin: AdminClient<DefaultClientContext> = match ClientConfig::new()
        .set("bootstrap.servers", &s.kafka_brokers)
        .set("socket.timeout.ms", "5000")
        .create()
    {
        Ok(a) => a,
        Err(e) => {
            out.push(Check::Fail(format!("Kafka client for {}: {e}", s.kafka_brokers)));
            return out;
        }
    };
    // A blocking librdkafka call: off the (single-threaded) runtime.
    let fetched = tokio::task::spawn_blocking(move || {
        let metadata = admin.inner().fetch_metadata(None, Duration::from_secs(10));
        (admin, metadata)
    })
    .await;
    let (admin, metadata) = match fetched {
        Ok(pair) => pair,
        Err(e) => {
            out.push(Check::Fail(format!("Kafka metadata request for {} failed: {e}", s.kafka_brokers)));
            return out;
        }
    };
    let md = match metadata {
        Ok(md) => md,
        Err(e) => {
            out.push(Check::Fail(format!(
                "Kafka at {} is not reachable: {e}; check --kafka-brokers and the network",
                s.kafka_brokers
            )));
            return out;
        }
    };
    out.push(Check::Ok(format!("Kafka at {}: {} broker(s)", s.kafka_brokers, md.brokers().len())));
    let prefix = s.router.topic_pattern.split(router::ROUTED_BY_VALUE).next().unwrap_or("");
    let present: Vec<String> = md
        .topics()
        .iter()
        .map(|t| t.name().to_owned())
        .filter(|n| n.starts_with(prefix) && !prefix.is_empty())
        .collect();
    let auto_create = match md.brokers().first() {
        Some(b) => admin
            .describe_configs(&[ResourceSpecifier::Broker(b.id())], &AdminOptions::new())
            .await
            .ok()
            .and_then(|r| r.into_iter().next())
            .and_then(|r| r.ok())
            .and_then(|c| c.get("auto.create.topics.enable").and_then(|e| e.value.clone())),
        None => None,
    };
    out.push(match auto_create.as_deref() {
        Some("true") => Check::Ok(format!(
            "topics: the brokers create them on first use ({} already match {}*)",
            present.len(),
            prefix
        )),
        _ if !present.is_empty() => Check::Warn(format!(
            "topics: auto.create.topics.enable is off or unknown; {} topic(s) match {}*: create any other routed topic before its first event",
            present.len(),
            prefix
        )),
        _ => Check::Fail(format!(
            "topics: no topic matches {prefix}* and the brokers do not create topics on first use: create the topics or set auto.create.topics.enable=true"
        )),
    });
    out
}

/// `walpost slot status`.
pub async fn slot_status(s: &Settings, json: bool) -> anyhow::Result<()> {
    let mut sql = ReplicationClient::connect_sql(&s.postgres).await.map_err(PipelineError::from)?;
    let status = monitor::query(&mut sql, &s.slot).await?;
    sql.close().await;
    if !status.exists {
        anyhow::bail!("replication slot \"{}\" does not exist (walpost run or walpost slot create makes it)", s.slot);
    }
    let verdict = monitor::evaluate(&status, status.flush_lag_secs.unwrap_or(0.0), &s.thresholds);
    let (level, reasons) = match verdict {
        Verdict::Lost => ("lost".to_owned(), vec![setup::slot_lost_message(&s.slot)]),
        Verdict::Level(l, r) => (l.as_str().to_owned(), r),
    };
    if json {
        let mut v = serde_json::to_value(&status)?;
        v["alarm"] = serde_json::Value::String(level);
        v["reasons"] = serde_json::to_value(&reasons)?;
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let mut t = String::new();
    let row = |t: &mut String, k: &str, v: String| {
        let _ = writeln!(t, "{k:<28} {v}");
    };
    row(&mut t, "slot", status.slot.clone());
    row(&mut t, "plugin", status.plugin.clone().unwrap_or_default());
    row(
        &mut t,
        "active",
        format!("{} (pid {})", status.active, status.active_pid.map_or("-".into(), |p| p.to_string())),
    );
    row(&mut t, "wal_status", status.wal_status.clone().unwrap_or_default());
    row(&mut t, "current WAL position", status.current_lsn.clone());
    row(&mut t, "restart_lsn", status.restart_lsn.clone().unwrap_or_default());
    row(&mut t, "confirmed_flush_lsn", status.confirmed_flush_lsn.clone().unwrap_or_default());
    row(&mut t, "retained WAL", human_bytes(status.retained_bytes));
    row(&mut t, "unconfirmed (lag bytes)", human_bytes(status.unconfirmed_bytes));
    row(&mut t, "lag seconds", status.flush_lag_secs.map_or("-".into(), |l| format!("{l:.1}")));
    row(
        &mut t,
        "safe_wal_size",
        status.safe_wal_size_bytes.map_or("unlimited".into(), |b| human_bytes(b.max(0).unsigned_abs())),
    );
    row(&mut t, "max_slot_wal_keep_size", status.max_slot_wal_keep_size.clone());
    row(&mut t, "oldest open transaction", format!("{:.0} s", status.oldest_transaction_age_secs));
    row(&mut t, "alarm", if reasons.is_empty() { level } else { format!("{level}: {}", reasons.join("; ")) });
    print!("{t}");
    Ok(())
}

fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let mut v = b as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {} ({b} bytes)", UNITS[unit])
}

/// `walpost slot create`: the publication (if missing) and the slot, no streaming.
pub async fn slot_create(s: &Settings) -> anyhow::Result<()> {
    let mut sql = ReplicationClient::connect_sql(&s.postgres).await.map_err(PipelineError::from)?;
    setup::preflight(&mut sql, s).await?;
    if setup::slot_row(&mut sql, &s.slot).await?.is_some() {
        anyhow::bail!("replication slot \"{}\" already exists", s.slot);
    }
    sql.close().await;
    let mut repl = ReplicationClient::connect(&s.postgres).await.map_err(PipelineError::from)?;
    let created = repl
        .create_logical_slot(&s.slot, "pgoutput", SlotSnapshot::Nothing, s.slot_failover)
        .await
        .map_err(PipelineError::from)?;
    repl.close().await;
    println!("created replication slot \"{}\" at {}", created.slot_name, created.consistent_point);
    Ok(())
}

/// `walpost slot drop`: asks for the slot name unless `yes`.
pub async fn slot_drop(s: &Settings, yes: bool) -> anyhow::Result<()> {
    if !yes {
        if !std::io::stdin().is_terminal() {
            anyhow::bail!("refusing to drop replication slot \"{}\" without confirmation: pass --yes", s.slot);
        }
        print!(
            "Dropping slot \"{}\" lets PostgreSQL discard the WAL it holds: events not yet confirmed will not be streamed.\nType the slot name to confirm: ",
            s.slot
        );
        std::io::stdout().flush()?;
        let mut answer = String::new();
        std::io::stdin().lock().read_line(&mut answer)?;
        if answer.trim() != s.slot {
            anyhow::bail!("not confirmed; slot \"{}\" kept", s.slot);
        }
    }
    let mut sql = ReplicationClient::connect_sql(&s.postgres).await.map_err(PipelineError::from)?;
    let Some(row) = setup::slot_row(&mut sql, &s.slot).await? else {
        anyhow::bail!("replication slot \"{}\" does not exist", s.slot);
    };
    if let Some(pid) = row.active_pid {
        anyhow::bail!("replication slot \"{}\" is in use by server process {pid}: stop walpost first", s.slot);
    }
    setup::drop_slot(&mut sql, &s.slot).await?;
    sql.close().await;
    println!("dropped replication slot \"{}\"", s.slot);
    Ok(())
}

/// Whether any check failed.
pub fn any_failed(checks: &[Check]) -> bool {
    checks.iter().any(|c| matches!(c, Check::Fail(_)))
}
