//! Where a session starts streaming: checks PostgreSQL, finds or creates the slot,
//! takes the initial snapshot when the settings ask for one, and starts replication
//! at the slot's confirmed position (or the new slot's consistent point).
//!
//! Invariants: the snapshot is taken only in the slot's exported snapshot (so the
//! stream continues exactly where it ends); a slot whose snapshot did not finish is
//! dropped and the snapshot starts over; a slot in use by another process is a
//! transient error (a hot standby waits); a lost slot is definite, unless
//! `--snapshot when_needed` re-creates it.
//!
//! Decoding on a standby, the slot, its exported snapshot and the rows read in
//! it are the standby's (PostgreSQL 16+ exports a snapshot during recovery), while the
//! lineage record, the snapshot's progress row and the progress key are written on the
//! primary ([`Writes`]). Creating the slot there waits for a running-transactions
//! record from the primary, which walpost asks for meanwhile
//! (`Lineage::create_slot`).

use std::time::Duration;

use pgoutput::Lsn;
use replication::{ReplicationClient, ReplicationStream, SlotSnapshot};

use super::session::Tag;
use crate::error::{ErrorKind, PipelineError};
use crate::kafka::config::Transactional;
use crate::kafka::exactly_once::progress::{self, Position, Progress, ProgressKey, SlotIdentity};
use crate::kafka::exactly_once::transaction::transaction_error;
use crate::kafka::exactly_once::ExactlyOnceState;
use crate::kafka::{self, DeliveryMemo, ProduceWindow};
use crate::postgres::lineage::{self, Lineage};
use crate::postgres::{catalog, preflight, sql, topology};
use crate::settings::{
    Delivery, ExactlyOnce, KafkaSettings, PostgresSettings, Settings, SnapshotMode, SourceSettings, StreamSettings,
};
use crate::snapshot;
use crate::snapshot::ProgressRecord;
use crate::telemetry::Metrics;

/// How a session began (built once per session: its size does not matter).
#[allow(clippy::large_enum_variant)]
pub(crate) enum Begun {
    /// Streaming from `start` with a producer ready.
    Streaming {
        stream: ReplicationStream,
        start: Lsn,
        window: ProduceWindow<Tag>,
        wal_sender_timeout: Option<Duration>,
        exactly_once: Option<ExactlyOnceState>,
    },
    /// `--snapshot initial_only` is done: every row is acknowledged.
    BackfillDone,
}

impl std::fmt::Debug for Begun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Begun::Streaming { start, .. } => write!(f, "Streaming from {start}"),
            Begun::BackfillDone => f.write_str("BackfillDone"),
        }
    }
}

/// See the module docs.
pub(crate) async fn begin(
    s: &Settings,
    metrics: &Metrics,
    memo: &mut DeliveryMemo,
    lineage: &mut Lineage,
) -> Result<Begun, PipelineError> {
    let kafka = s.kafka()?;
    let exactly_once = match &kafka.delivery {
        Delivery::ExactlyOnce(e) => Some(e),
        Delivery::AtLeastOnce => None,
    };
    // The producer first: its broker connection and idempotent producer id are set up
    // in the background while PostgreSQL is checked, so the first record does not wait.
    // A transactional producer waits for the slot instead: its transactional id fences
    // every other producer of this slot, which only the slot's holder may do.
    let mut window = match exactly_once {
        None => Some(kafka::open_window::<Tag>(kafka, &s.stream, metrics, None)?),
        Some(_) => None,
    };
    let checked = async {
        let mut sql = ReplicationClient::connect_sql(&s.postgres.server).await?;
        preflight::preflight(&mut sql, &s.postgres, &s.source).await?;
        if s.snapshot.mode != SnapshotMode::Never {
            snapshot::validate_filter(&mut sql, &s.snapshot, &s.source).await?;
        }
        Ok::<_, PipelineError>(sql)
    };
    if s.snapshot.mode == SnapshotMode::InitialOnly {
        let mut sql = checked.await?;
        if let Some(w) = window.take() {
            w.close(Duration::ZERO, |_| {}).await;
        }
        // A backfill: read in a fresh snapshot, no slot (it would only pin WAL); with
        // exactly-once, one Kafka transaction (all rows or none).
        let transaction = exactly_once.map(|_| snapshot::Transaction {
            producer: Transactional {
                id: format!("walpost-backfill-{}-{}", s.postgres.server.dbname, s.source.slot),
                timeout: snapshot::TRANSACTION_TIMEOUT,
            },
            progress: None,
        });
        let rows = snapshot::run(&mut sql, s, None, metrics, memo, transaction, None).await?.rows;
        tracing::info!(rows, "--snapshot initial_only: every row is acknowledged by Kafka; exiting");
        sql.close().await;
        return Ok(Begun::BackfillDone);
    }
    // The replication connection is opened while PostgreSQL is checked (each connection
    // costs a backend start and an authentication); a failed check is reported first.
    let (checked, repl) = tokio::join!(checked, ReplicationClient::connect(&s.postgres.server));
    let mut sql = checked?;
    let mut repl = repl?;
    if sql.connected_host() != repl.connected_host() {
        // Several hosts and a failover between the two connections: both must talk to
        // the server the slot is read from.
        sql.close().await;
        sql = ReplicationClient::connect_sql(&s.postgres.server.pinned_to(repl.connected_host())).await?;
        preflight::preflight(&mut sql, &s.postgres, &s.source).await?;
    }
    let mut writes = Writes::open(&s.postgres, &mut sql).await?;
    let slot_name = &s.source.slot;
    let mut slot = catalog::slot_row(&mut sql, slot_name).await?;
    let snapshots = matches!(s.snapshot.mode, SnapshotMode::Initial | SnapshotMode::WhenNeeded);
    if snapshots && snapshot::unfinished(&mut sql, &s.source).await? {
        if let Some(row) = &slot {
            if let Some(pid) = row.active_pid {
                return Err(PipelineError::waiting(ErrorKind::Slot, format!(
                    "replication slot \"{slot_name}\" is in use by server process {pid}; waiting to restart the unfinished snapshot"
                )));
            }
            tracing::warn!(slot = %slot_name, "an earlier snapshot did not finish: dropping the slot and starting the snapshot over on a new one");
            catalog::drop_slot(&mut sql, slot_name).await?;
        }
        slot = None;
    }
    if s.snapshot.mode == SnapshotMode::WhenNeeded
        && slot.as_ref().is_some_and(|r| r.wal_status.as_deref() == Some("lost"))
    {
        tracing::warn!(slot = %slot_name, "the slot was invalidated (wal_status = lost): --snapshot when_needed drops it and takes a new snapshot");
        catalog::drop_slot(&mut sql, slot_name).await?;
        slot = None;
    }

    let system = repl.identify_system().await?;
    let wal_sender_timeout = repl
        .simple_query("SHOW wal_sender_timeout")
        .await
        .ok()
        .and_then(|r| r.first("wal_sender_timeout").and_then(parse_interval));
    tracing::debug!(system_id = %system.system_id, timeline = system.timeline, wal = %system.xlog_pos, "connected for replication");
    let identity = SlotIdentity {
        system_id: system.system_id.clone(),
        database: s.postgres.server.dbname.clone(),
        slot: slot_name.clone(),
    };
    let (start, key) = match slot {
        Some(row) => {
            preflight::check_slot(&row, &s.postgres, &s.source)?;
            if s.snapshot.mode == SnapshotMode::Initial {
                tracing::info!(slot = %slot_name, "replication slot already exists: no snapshot will be taken (--snapshot initial snapshots only when it creates the slot; drop the slot to take a new one)");
            }
            if let Some(w) = writes.writer(&mut sql) {
                lineage.record(w, &s.source, &system, false).await;
            }
            (
                row.confirmed_flush.unwrap_or(Lsn::ZERO),
                signing_key(writes.writer(&mut sql), &s.source, exactly_once.is_some()).await,
            )
        }
        None => {
            // A slot walpost streamed from before is re-created only with a snapshot.
            if snapshots {
                snapshot::mark_started(writes.required(&mut sql, "the snapshot's progress row")?, &s.source).await?;
            }
            let export = if snapshots { SlotSnapshot::Export } else { SlotSnapshot::Nothing };
            let created = lineage.create_slot(&mut repl, &mut sql, &s.postgres, &s.source, &system, export).await?;
            tracing::info!(slot = %slot_name, consistent_point = %created.consistent_point, on_standby = writes.on_standby(), "created replication slot");
            if let Some(w) = writes.writer(&mut sql) {
                lineage.record(w, &s.source, &system, true).await;
            }
            let key = signing_key(writes.writer(&mut sql), &s.source, exactly_once.is_some()).await;
            if snapshots {
                // With exactly-once the snapshot is one Kafka transaction whose progress
                // record is the slot's consistent point: the stream goes on from there.
                let transaction = exactly_once.map(|e| snapshot::Transaction {
                    producer: Transactional { id: identity.transactional_id(), timeout: snapshot::TRANSACTION_TIMEOUT },
                    progress: Some(ProgressRecord {
                        topic: e.progress_topic.clone(),
                        key: identity.key(),
                        value: Progress::new(
                            &identity,
                            Position { lsn: created.consistent_point, partial: None },
                            key.as_ref(),
                        ),
                    }),
                });
                if let Some(e) = exactly_once {
                    progress::ensure_topic(&kafka.brokers, &kafka.properties, &e.progress_topic).await?;
                }
                let rows =
                    snapshot::run(&mut sql, s, created.snapshot_name.as_deref(), metrics, memo, transaction, None)
                        .await?
                        .rows;
                snapshot::mark_finished(writes.required(&mut sql, "the snapshot's progress row")?, &s.source, rows)
                    .await?;
            }
            (created.consistent_point, key)
        }
    };
    // Where the server's WAL ends now: no progress record walpost wrote can be beyond it.
    let wal_end = match exactly_once {
        Some(_) => catalog::wal_end(&mut sql).await?,
        None => system.xlog_pos,
    };
    sql.close().await;
    writes.close().await;

    let publications = sql::ident(&s.source.publication);
    let mut options = vec![("proto_version", "1"), ("publication_names", publications.as_str())];
    if s.source.messages.is_some() {
        // Logical decoding messages (pg_logical_emit_message), PostgreSQL 14+.
        options.push(("messages", "true"));
    }
    let mut stream = repl.start_logical_replication(slot_name, start, &options).await?;
    stream.set_max_message_len(s.stream.max_message_bytes);
    let (window, exactly_once) = match (window, exactly_once) {
        (Some(window), _) => (window, None),
        (None, Some(e)) => {
            let (window, state) =
                begin_transactions(kafka, &s.stream, metrics, memo, e, identity, start, key, wal_end).await?;
            (window, Some(state))
        }
        (None, None) => (kafka::open_window::<Tag>(kafka, &s.stream, metrics, None)?, None),
    };
    tracing::info!(slot = %slot_name, from = %start, exactly_once = exactly_once.is_some(), "streaming");
    Ok(Begun::Streaming { stream, start, window, wal_sender_timeout, exactly_once })
}

/// Exactly-once, with the slot held: the transactional producer (fencing any earlier
/// one), the progress topic, and the last committed position, which the memo then
/// skips up to.
#[allow(clippy::too_many_arguments)] // what a transactional session starts from
async fn begin_transactions(
    kafka: &KafkaSettings,
    stream: &StreamSettings,
    metrics: &Metrics,
    memo: &mut DeliveryMemo,
    e: &ExactlyOnce,
    identity: SlotIdentity,
    start: Lsn,
    key: Option<ProgressKey>,
    wal_end: Lsn,
) -> Result<(ProduceWindow<Tag>, ExactlyOnceState), PipelineError> {
    let transactional = Transactional { id: identity.transactional_id(), timeout: e.transaction_timeout };
    let window = kafka::open_window::<Tag>(kafka, stream, metrics, Some(&transactional))?;
    let sink =
        window.sink().ok_or_else(|| PipelineError::transient(ErrorKind::Kafka, "the Kafka producer is closed"))?;
    sink.init_transactions(e.transaction_timeout).await.map_err(transaction_error)?;
    progress::ensure_topic(&kafka.brokers, &kafka.properties, &e.progress_topic).await?;
    let committed = match progress::read(&kafka.brokers, &kafka.properties, &e.progress_topic, &identity).await? {
        Some(p) => Some(p.check(&identity, &e.progress_topic, key.as_ref(), wal_end)?),
        None => None,
    };
    match committed {
        Some(p) if p.lsn < start => tracing::warn!(
            progress = %p.lsn, slot = %start,
            "{}", texts::exactly_once::PROGRESS_BEHIND_THE_SLOT
        ),
        None => {
            tracing::info!(topic = %e.progress_topic, "no committed progress for this slot yet: starting from the slot's confirmed position")
        }
        Some(_) => {}
    }
    memo.set_committed(committed);
    let gate = committed.map_or(start, |p| p.lsn.max(start));
    Ok((window, ExactlyOnceState::new(identity, e, gate, stream.status_interval, key)))
}

/// Where a session writes: the server it decodes on, or the primary when that is a
/// standby (see `postgres::topology`).
enum Writes {
    /// On the primary: writes go where the slot is read.
    Here,
    /// On a standby, with the primary reached.
    Primary(Box<ReplicationClient>),
    /// On a standby, and the primary cannot be reached now: why.
    Unreachable(PipelineError),
}

impl Writes {
    /// Asks the decoding server (`sql`) whether it is a standby, and if so connects to
    /// the primary; a primary that cannot be reached is said once here, not fatal.
    async fn open(postgres: &PostgresSettings, sql: &mut ReplicationClient) -> Result<Writes, PipelineError> {
        if !topology::on_a_standby(postgres, sql).await? {
            return Ok(Writes::Here);
        }
        Ok(match topology::connect_writer(postgres).await {
            Ok(primary) => Writes::Primary(Box::new(primary)),
            Err(e) => {
                tracing::warn!("{}", texts::standby::without_primary(&e.to_string()));
                Writes::Unreachable(e)
            }
        })
    }

    fn on_standby(&self) -> bool {
        !matches!(self, Writes::Here)
    }

    /// The connection to write on, if there is one.
    fn writer<'a>(&'a mut self, sql: &'a mut ReplicationClient) -> Option<&'a mut ReplicationClient> {
        match self {
            Writes::Here => Some(sql),
            Writes::Primary(primary) => Some(&mut **primary),
            Writes::Unreachable(_) => None,
        }
    }

    /// The connection to write on for `what`, which cannot do without it: a primary
    /// that cannot be reached is a transient error (the session starts over).
    fn required<'a>(
        &'a mut self,
        sql: &'a mut ReplicationClient,
        what: &str,
    ) -> Result<&'a mut ReplicationClient, PipelineError> {
        match self {
            Writes::Here => Ok(sql),
            Writes::Primary(primary) => Ok(&mut **primary),
            Writes::Unreachable(e) => Err(PipelineError::transient(
                ErrorKind::Postgres,
                texts::standby::needs_the_primary(what, &e.to_string()),
            )),
        }
    }

    async fn close(self) {
        if let Writes::Primary(primary) = self {
            primary.close().await;
        }
    }
}

/// Exactly-once: the key progress records are signed with, kept in the lineage row.
/// `None` without a connection to write on (decoding on a standby, primary unreachable).
async fn signing_key(
    sql: Option<&mut ReplicationClient>,
    source: &SourceSettings,
    exactly_once: bool,
) -> Option<ProgressKey> {
    if !exactly_once {
        return None;
    }
    let Some(sql) = sql else {
        tracing::warn!("{}", texts::exactly_once::progress_unsigned_without_the_primary(&source.slot));
        return None;
    };
    let stored = lineage::progress_key(sql, source, ProgressKey::generate_hex).await?;
    let key = ProgressKey::from_hex(&stored.hex, stored.made_now);
    if key.is_none() {
        tracing::warn!("{}", texts::exactly_once::progress_key_unreadable(&source.slot));
    }
    key
}

/// A PostgreSQL duration setting as SHOW prints it (`60s`, `500ms`, `1min`, `0`).
fn parse_interval(text: &str) -> Option<Duration> {
    let digits: String = text.chars().take_while(char::is_ascii_digit).collect();
    let n: u64 = digits.parse().ok()?;
    Some(match &text[digits.len()..] {
        "" | "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "min" => Duration::from_secs(n * 60),
        "h" => Duration::from_secs(n * 3600),
        "d" => Duration::from_secs(n * 86_400),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_as_show_prints_them() {
        assert_eq!(parse_interval("60s"), Some(Duration::from_secs(60)));
        assert_eq!(parse_interval("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_interval("2min"), Some(Duration::from_secs(120)));
        assert_eq!(parse_interval("0"), Some(Duration::ZERO));
        assert_eq!(parse_interval("soon"), None);
    }
}
