//! The slot's lineage: a record that walpost streamed from a slot, so that a slot which
//! disappears is told apart from a first start.
//!
//! A slot disappears in a failover to a server that did not have it (PostgreSQL before
//! 17, or a standby without slot synchronization) or when someone drops it. Creating a
//! new slot then starts at the new server's current WAL position and skips, silently,
//! every event committed since the old slot's confirmed position. Debezium does exactly
//! that; walpost refuses instead, and the runbook's recovery fills the gap.
//!
//! The record is a row of `<outbox schema>.walpost_slots` (slot, system identifier,
//! timeline, created_at): an ordinary table, so physical replication carries it to the
//! standby that is promoted later. A process also remembers, in memory, that it streamed
//! (for a role that may not create the table).
//!
//! Invariants:
//! - [`Lineage::create_slot`] is walpost's only way to create a slot (`walpost run`, its
//!   snapshot modes, `walpost slot create`; `tests/layers.rs` holds that no other module
//!   calls `create_logical_slot`), and it applies the rule: a slot known to have existed
//!   is re-created only by a session that republishes with a snapshot (`--snapshot
//!   initial` or `when_needed`: the snapshot publishes the rows the new slot would
//!   skip). Everything else stops with [`texts::slot::missing`], which names both ways on.
//! - `walpost slot drop` deletes the row (the operator chose the gap); every slot walpost
//!   creates and every session that streams write it.
//! - The table is optional: without the privilege to create it, walpost warns once and
//!   relies on its memory (which does not survive a restart of walpost itself).

use replication::{CreatedSlot, ReplicationClient, SlotSnapshot, SystemInfo};

use super::catalog::parsed;
use super::sql::ident;
use crate::error::{ErrorKind, PipelineError};
use crate::settings::{PostgresSettings, SourceSettings};

/// Where a slot was created (or first seen) by walpost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub system_id: String,
    pub timeline: u32,
    /// `created_at` as PostgreSQL prints it; `None` when only this process remembers.
    pub created_at: Option<String>,
}

impl Origin {
    /// What the operator texts say of it.
    pub fn as_text(&self) -> texts::slot::Origin<'_> {
        texts::slot::Origin {
            system_id: &self.system_id,
            timeline: self.timeline,
            created_at: self.created_at.as_deref(),
        }
    }
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct Lineage {
    /// The slot this process streamed from.
    streamed: Option<Origin>,
    /// The table could not be written: warned once.
    warned: bool,
}

fn table(source: &SourceSettings) -> String {
    format!("{}.walpost_slots", ident(&source.table().schema))
}

impl Lineage {
    /// Before a missing slot is created: `Err` (definite) when walpost streamed from it
    /// before and the snapshot mode would not republish what the new slot skips.
    /// `republishes`: the session takes a snapshot when it creates the slot.
    pub async fn check_missing(
        &self,
        sql: &mut ReplicationClient,
        source: &SourceSettings,
        now: &SystemInfo,
        republishes: bool,
    ) -> Result<(), PipelineError> {
        if republishes {
            return Ok(());
        }
        let known = match record_of(sql, source).await {
            Record::Streamed(origin) => Some(origin),
            Record::Unreadable(e) => {
                return Err(PipelineError::definite(ErrorKind::Slot, format!(
                    "replication slot \"{}\" does not exist and {} cannot be read ({e}), so walpost cannot tell whether it streamed from that slot before (a new slot would then skip events): grant SELECT, INSERT, UPDATE, DELETE on {} to walpost's role",
                    source.slot,
                    table(source),
                    table(source)
                )))
            }
            Record::Never | Record::NoTable => self.streamed.clone(),
        };
        match known {
            None => Ok(()),
            Some(origin) => Err(PipelineError::definite(
                ErrorKind::Slot,
                texts::slot::missing(
                    &source.slot,
                    sql.connected_host(),
                    origin.as_text(),
                    now.timeline,
                    &table(source),
                ),
            )),
        }
    }

    /// Creates the missing slot on `repl`'s server (`sql`: a connection to the same
    /// server), after [`Lineage::check_missing`]; `export`: the snapshot the slot exports,
    /// whose rows the caller then publishes before it streams. On a
    /// standby the primary is asked for running-transactions records meanwhile
    /// ([`super::topology::nudge_running_xacts`]), without which it may wait for minutes.
    pub async fn create_slot(
        &self,
        repl: &mut ReplicationClient,
        sql: &mut ReplicationClient,
        postgres: &PostgresSettings,
        source: &SourceSettings,
        system: &SystemInfo,
        export: SlotSnapshot,
    ) -> Result<CreatedSlot, PipelineError> {
        self.check_missing(sql, source, system, matches!(export, SlotSnapshot::Export)).await?;
        let on_standby = super::topology::on_a_standby(postgres, sql).await?;
        let nudge = on_standby.then(|| tokio::spawn(super::topology::nudge_running_xacts(postgres.clone())));
        let created = repl.create_logical_slot(&source.slot, "pgoutput", export, source.slot_failover).await;
        if let Some(nudge) = nudge {
            nudge.abort();
        }
        Ok(created?)
    }

    /// The session streams from the slot (`created`: walpost just created it): remember
    /// it, in memory and in the table.
    pub async fn record(
        &mut self,
        sql: &mut ReplicationClient,
        source: &SourceSettings,
        now: &SystemInfo,
        created: bool,
    ) {
        if let Some(before) = &self.streamed {
            if !created && (before.system_id != now.system_id || before.timeline != now.timeline) {
                tracing::info!(
                    slot = %source.slot,
                    host = %sql.connected_host(),
                    timeline = now.timeline,
                    previous_timeline = before.timeline,
                    "the slot is on a promoted server now (a failover slot kept in sync): resuming from its confirmed position"
                );
            }
        }
        self.streamed = Some(Origin { system_id: now.system_id.clone(), timeline: now.timeline, created_at: None });
        let t = table(source);
        let timeline = now.timeline.to_string();
        let row = [Some(source.slot.as_str()), Some(now.system_id.as_str()), Some(timeline.as_str())];
        let conflict = if created {
            "DO UPDATE SET system_identifier = EXCLUDED.system_identifier, timeline = EXCLUDED.timeline, created_at = EXCLUDED.created_at"
        } else {
            "DO NOTHING"
        };
        if let Err(e) = create_table_if_missing(sql, source).await {
            self.cannot_record(&t, &e, source);
            return;
        }
        let insert = format!(
            "INSERT INTO {t} (slot, system_identifier, timeline, created_at) VALUES ($1, $2, $3::integer, pg_catalog.now()) ON CONFLICT (slot) {conflict}"
        );
        if let Err(e) = sql.query(&insert, &row).await {
            self.cannot_record(&t, &e.to_string(), source);
        }
    }
}

impl Lineage {
    /// Warns once that the table cannot be written (`e`: why).
    fn cannot_record(&mut self, table: &str, e: &str, source: &SourceSettings) {
        if !self.warned {
            self.warned = true;
            tracing::warn!(
                "cannot record the slot in {table} ({e}): a slot lost in a failover is then detected only while this process runs; grant CREATE on schema {} or apply migrations/outbox/0003_walpost_slots.sql (walpost migrate)",
                source.table().schema
            );
        }
    }
}

/// Makes the lineage table when it is missing, from the outbox's migration 0003 (the one
/// place its DDL is), in the outbox table's schema; `Err`: why it could not.
async fn create_table_if_missing(sql: &mut ReplicationClient, source: &SourceSettings) -> Result<(), String> {
    let present = sql
        .query("SELECT pg_catalog.to_regclass($1) IS NOT NULL AS present", &[Some(table(source).as_str())])
        .await
        .map_err(|e| e.to_string())?;
    if present.first("present") == Some("t") {
        return Ok(());
    }
    migrate::create_walpost_slots(sql, &source.table().schema).await.map_err(|e| e.to_string())
}

/// What `events.walpost_slots` says of the slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// walpost streamed from it (since `created_at`).
    Streamed(Origin),
    /// No row for it: walpost never streamed from it (or `walpost slot drop` forgot it).
    Never,
    /// The table does not exist (migration 0003 not applied, and walpost could not make
    /// it): only a running walpost's memory knows.
    NoTable,
    /// The table exists but cannot be read (the error).
    Unreadable(String),
}

/// The lineage record of the slot.
pub async fn record_of(sql: &mut ReplicationClient, source: &SourceSettings) -> Record {
    let t = table(source);
    let present = match sql.query("SELECT pg_catalog.to_regclass($1) IS NOT NULL AS present", &[Some(t.as_str())]).await
    {
        Ok(r) => r.first("present") == Some("t"),
        Err(e) => return Record::Unreadable(e.to_string()),
    };
    if !present {
        return Record::NoTable;
    }
    let query = format!("SELECT system_identifier, timeline, created_at::text AS created_at FROM {t} WHERE slot = $1");
    match sql.query(&query, &[Some(source.slot.as_str())]).await {
        Err(e) => Record::Unreadable(e.to_string()),
        // A row says walpost streamed from the slot, whatever its other columns hold.
        Ok(r) => match r.first("system_identifier") {
            None => Record::Never,
            Some(system_id) => match parsed(r.first("timeline"), "events.walpost_slots.timeline", "a timeline id") {
                Err(e) => Record::Unreadable(e.to_string()),
                Ok(timeline) => Record::Streamed(Origin {
                    system_id: system_id.to_owned(),
                    timeline: timeline.unwrap_or(0),
                    created_at: r.first("created_at").map(str::to_owned),
                }),
            },
        },
    }
}

/// The table the lineage is kept in.
pub fn table_name(source: &SourceSettings) -> String {
    table(source)
}

/// A stored key and whether this call made it.
#[derive(Clone, PartialEq, Eq)]
pub struct StoredKey {
    pub hex: String,
    pub made_now: bool,
}

impl std::fmt::Debug for StoredKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredKey").field("made_now", &self.made_now).finish_non_exhaustive()
    }
}

/// The key exactly-once progress records are signed with (`kafka::progress`), kept in
/// the slot's lineage row and made on first use (`make` gives a new one's stored form).
/// `None` (warned) when the row or its `progress_key` column is not there and cannot be
/// made: records are then not signed and only checked against the server's WAL position.
pub async fn progress_key(
    sql: &mut ReplicationClient,
    source: &SourceSettings,
    make: impl FnOnce() -> Result<String, String>,
) -> Option<StoredKey> {
    let t = table(source);
    let slot = Some(source.slot.as_str());
    let warn = |e: String| {
        tracing::warn!("{}", texts::exactly_once::progress_key_not_kept(&t, &e));
    };
    // A table made by an older walpost or migration lacks the column; adding it needs
    // ownership (a failure shows in the query below).
    let _ = sql.simple_query(&format!("ALTER TABLE {t} ADD COLUMN IF NOT EXISTS progress_key text")).await;
    let made = match make() {
        Ok(hex) => hex,
        Err(e) => {
            warn(e);
            return None;
        }
    };
    let update =
        format!("UPDATE {t} SET progress_key = $1 WHERE slot = $2 AND progress_key IS NULL RETURNING progress_key");
    match sql.query(&update, &[Some(made.as_str()), slot]).await {
        Ok(r) if r.first("progress_key").is_some() => return Some(StoredKey { hex: made, made_now: true }),
        Ok(_) => {}
        Err(e) => {
            warn(e.to_string());
            return None;
        }
    }
    match sql.query(&format!("SELECT progress_key FROM {t} WHERE slot = $1"), &[slot]).await {
        Ok(r) => match r.first("progress_key") {
            Some(hex) => Some(StoredKey { hex: hex.to_owned(), made_now: false }),
            None => {
                warn(format!("no readable progress_key for slot {}", source.slot));
                None
            }
        },
        Err(e) => {
            warn(e.to_string());
            None
        }
    }
}

/// `walpost slot drop`: the operator chose to start over; forget the slot.
pub async fn forget(sql: &mut ReplicationClient, source: &SourceSettings) -> Result<(), PipelineError> {
    let t = table(source);
    let present = sql.query("SELECT pg_catalog.to_regclass($1) IS NOT NULL AS present", &[Some(t.as_str())]).await?;
    if present.first("present") == Some("t") {
        sql.query(&format!("DELETE FROM {t} WHERE slot = $1"), &[Some(source.slot.as_str())]).await?;
    }
    Ok(())
}
