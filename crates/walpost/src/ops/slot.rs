//! `walpost slot status|create|drop`.
//!
//! `slot status` exits by the slot's state so scripts can rely on it:
//! 0 ok, 2 warning, 3 critical, 4 lost (invalidated, or missing although walpost streamed
//! from it: `events.walpost_slots` says so); 1 for any error (cannot connect, no such
//! slot and no record of one).

use std::fmt::Write as _;
use std::io::{BufRead, IsTerminal, Write};

use replication::{ReplicationClient, SlotSnapshot};

use crate::error::{ErrorKind, PipelineError};
use crate::monitor::{self, Observed, Verdict};
use crate::postgres::{catalog, lineage, preflight, topology};
use crate::settings::{Settings, SourceSettings};
use crate::telemetry::AlarmLevel;

/// Exit codes of `walpost slot status`.
pub(crate) mod exit {
    pub(crate) const OK: u8 = 0;
    pub(crate) const WARNING: u8 = 2;
    pub(crate) const CRITICAL: u8 = 3;
    pub(crate) const LOST: u8 = 4;
}

/// `walpost slot status`: prints the slot's figures and alarm; returns the exit code.
pub(crate) async fn status(s: &Settings, json: bool) -> Result<u8, PipelineError> {
    let slot = &s.source.slot;
    let mut sql = ReplicationClient::connect_sql(&s.postgres.server).await?;
    let status = monitor::query(&mut sql, slot).await?;
    if !status.exists {
        return missing(sql, &s.postgres.server, &s.source, json).await;
    }
    sql.close().await;
    // This command is not the streaming instance: its own lag is unknown, the slot's
    // figures are what it has.
    // A one-off look: a slot nothing streams from is a warning at once.
    let observed = Observed { inactive_secs: f64::INFINITY, ..Observed::default() };
    let verdict = monitor::evaluate(&status, observed, &s.monitor.thresholds);
    let (level, code, reasons) = match verdict {
        Verdict::Lost if status.is_conflicted() => {
            ("lost".to_owned(), exit::LOST, vec![texts::slot::conflicted(slot, status.invalidation_reason.as_deref())])
        }
        Verdict::Lost => ("lost".to_owned(), exit::LOST, vec![texts::slot::lost(slot)]),
        Verdict::Level(l, r) => {
            let code = match l {
                AlarmLevel::Ok => exit::OK,
                AlarmLevel::Warning => exit::WARNING,
                AlarmLevel::Critical => exit::CRITICAL,
            };
            (l.as_str().to_owned(), code, r)
        }
    };
    if json {
        let mut v = serde_json::to_value(&status).map_err(|e| PipelineError::definite(ErrorKind::Internal, e))?;
        v["alarm"] = serde_json::Value::String(level);
        v["reasons"] = serde_json::to_value(&reasons).map_err(|e| PipelineError::definite(ErrorKind::Internal, e))?;
        println!("{}", serde_json::to_string_pretty(&v).map_err(|e| PipelineError::definite(ErrorKind::Internal, e))?);
        return Ok(code);
    }
    let lost = status.is_lost();
    let bytes = |b: Option<u64>| match b {
        Some(b) => human_bytes(b),
        None if lost => "unknown (the slot was invalidated)".into(),
        None => "-".into(),
    };
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
    row(&mut t, "retained WAL", bytes(status.retained_bytes));
    row(&mut t, "unconfirmed WAL", bytes(status.unconfirmed_bytes));
    row(
        &mut t,
        "safe_wal_size",
        match (status.safe_wal_size_bytes, status.max_slot_wal_keep_size_bytes) {
            (Some(b), _) => human_bytes(b),
            (None, None) => "unlimited".into(),
            (None, Some(_)) if lost => "none (the slot was invalidated)".into(),
            (None, Some(_)) => "-".into(),
        },
    );
    row(&mut t, "max_slot_wal_keep_size", status.max_slot_wal_keep_size.clone());
    row(
        &mut t,
        "oldest open transaction",
        match &status.oldest_transaction {
            Some(o) => format!(
                "{:.0} s (server pid {}, application_name '{}', client {})",
                o.age_secs, o.pid, o.application_name, o.client_addr
            ),
            None => "none".into(),
        },
    );
    row(&mut t, "alarm", if reasons.is_empty() { level } else { format!("{level}: {}", reasons.join("; ")) });
    print!("{t}");
    Ok(code)
}

/// `slot status` of a slot that does not exist: which way on applies depends on whether
/// walpost streamed from it (the same rule `walpost run` and `walpost slot create` apply).
async fn missing(
    mut sql: ReplicationClient,
    server: &replication::Config,
    source: &SourceSettings,
    json: bool,
) -> Result<u8, PipelineError> {
    let slot = &source.slot;
    let table = lineage::table_name(source);
    let record = lineage::record_of(&mut sql, source).await;
    let host = sql.connected_host().clone();
    sql.close().await;
    let (code, level, message) = match record {
        lineage::Record::Streamed(origin) => {
            let mut repl = ReplicationClient::connect(&server.pinned_to(&host)).await?;
            let now = repl.identify_system().await?;
            repl.close().await;
            (exit::LOST, "lost", texts::slot::missing(slot, &host, origin.as_text(), now.timeline, &table))
        }
        lineage::Record::Never => {
            return Err(PipelineError::definite(ErrorKind::Slot, texts::slot::never_streamed(slot, &table)));
        }
        lineage::Record::NoTable => {
            return Err(PipelineError::definite(
                ErrorKind::Slot,
                texts::slot::lineage_unknown(slot, &table, "does not exist"),
            ));
        }
        lineage::Record::Unreadable(e) => {
            return Err(PipelineError::definite(
                ErrorKind::Slot,
                texts::slot::lineage_unknown(slot, &table, &format!("cannot be read: {e}")),
            ));
        }
    };
    if json {
        let v = serde_json::json!({ "slot": slot, "exists": false, "alarm": level, "reasons": [message] });
        println!("{}", serde_json::to_string_pretty(&v).map_err(|e| PipelineError::definite(ErrorKind::Internal, e))?);
    } else {
        println!("{:<28} {slot}", "slot");
        println!("{:<28} does not exist", "state");
        println!("{:<28} {level}: {message}", "alarm");
    }
    Ok(code)
}

fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let mut v = b as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {} ({b} bytes)", UNITS.get(unit).copied().unwrap_or("B"))
}

/// `walpost slot create`: the publication (if missing) and the slot, no streaming.
pub(crate) async fn create(s: &Settings) -> Result<(), PipelineError> {
    let slot = &s.source.slot;
    let mut repl = ReplicationClient::connect(&s.postgres.server).await?;
    let mut sql = ReplicationClient::connect_sql(&s.postgres.server.pinned_to(repl.connected_host())).await?;
    preflight::preflight(&mut sql, &s.postgres, &s.source).await?;
    if catalog::slot_row(&mut sql, slot).await?.is_some() {
        return Err(PipelineError::definite(ErrorKind::Slot, format!("replication slot \"{slot}\" already exists")));
    }
    let system = repl.identify_system().await?;
    // No snapshot is published here: a slot walpost streamed from before is refused.
    let lineage = lineage::Lineage::default();
    let created =
        lineage.create_slot(&mut repl, &mut sql, &s.postgres, &s.source, &system, SlotSnapshot::Nothing).await?;
    repl.close().await;
    if topology::on_a_standby(&s.postgres, &mut sql).await? {
        // On a standby the lineage is written on the primary.
        match topology::connect_writer(&s.postgres).await {
            Ok(mut primary) => {
                lineage::Lineage::default().record(&mut primary, &s.source, &system, true).await;
                primary.close().await;
            }
            Err(e) => tracing::warn!("the slot's lineage record is not written: {e}"),
        }
    } else {
        lineage::Lineage::default().record(&mut sql, &s.source, &system, true).await;
    }
    sql.close().await;
    println!("created replication slot \"{}\" at {}", created.slot_name, created.consistent_point);
    Ok(())
}

/// `walpost slot drop`: asks for the slot name unless `yes`.
pub(crate) async fn drop(s: &Settings, yes: bool) -> Result<(), PipelineError> {
    let slot = &s.source.slot;
    if !yes {
        if !std::io::stdin().is_terminal() {
            return Err(PipelineError::definite(
                ErrorKind::Slot,
                format!("refusing to drop replication slot \"{slot}\" without confirmation: pass --yes"),
            ));
        }
        print!(
            "Dropping slot \"{slot}\" lets PostgreSQL discard the WAL it holds: events not yet confirmed will not be streamed.\nType the slot name to confirm: "
        );
        let mut answer = String::new();
        let read = std::io::stdout().flush().and_then(|()| std::io::stdin().lock().read_line(&mut answer));
        if read.is_err() || answer.trim() != slot {
            return Err(PipelineError::definite(ErrorKind::Slot, format!("not confirmed; slot \"{slot}\" kept")));
        }
    }
    let mut sql = ReplicationClient::connect_sql(&s.postgres.server).await?;
    let Some(row) = catalog::slot_row(&mut sql, slot).await? else {
        return Err(PipelineError::definite(ErrorKind::Slot, format!("replication slot \"{slot}\" does not exist")));
    };
    if let Some(pid) = row.active_pid {
        return Err(PipelineError::definite(
            ErrorKind::Slot,
            format!("replication slot \"{slot}\" is in use by server process {pid}: stop walpost first"),
        ));
    }
    catalog::drop_slot(&mut sql, slot).await?;
    // The operator chose to start over: a new slot is not a lost one. On a standby the
    // lineage is the primary's.
    if topology::on_a_standby(&s.postgres, &mut sql).await? {
        let mut primary = topology::connect_writer(&s.postgres).await?;
        lineage::forget(&mut primary, &s.source).await?;
        primary.close().await;
    } else {
        lineage::forget(&mut sql, &s.source).await?;
    }
    sql.close().await;
    println!("dropped replication slot \"{slot}\"");
    Ok(())
}
