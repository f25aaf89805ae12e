//! Signals: a row inserted into the signal table (Debezium's format: `id`, `type`,
//! `data`) asks for a replay while the stream goes on.
//!
//! `type = 'execute-snapshot'` with `data = {"data-collections": ["events.outbox"],
//! "type": "incremental", "additional-conditions": [{"data-collection": "events.outbox",
//! "filter": "..."}]}` replays the named outbox tables' rows that match the filter
//! (`snapshot::replay`, with the signal's id as the replay id). Other signal types, and
//! collections that are not outbox tables, are logged and counted as ignored.
//!
//! Invariants:
//! - A signal's filter is parsed by the `condition` crate and only its SQL form runs: a
//!   role that can insert signals can select outbox rows, never call a function or read
//!   another relation. Who may insert signals is checked at start (`[signal]
//!   allowed_roles`, `postgres::preflight::check_signal_rights`).
//! - A signal is read from the slot, so it is seen in commit order, once per stream.
//! - The signal's transaction is not confirmed until its replay has ended: the replay
//!   counts as one unacknowledged record of that transaction (see `checkpoint`). A crash
//!   before the end reads the signal again and runs the replay again; after the end the
//!   slot has moved past it and it is never acted on again.
//! - A bad signal (unreadable data, a filter the server refuses, a record Kafka refuses
//!   for good) never stops the stream: it is logged with the signal's id, counted as
//!   failed, and the transaction moves on. Transient failures (Kafka or PostgreSQL away)
//!   retry the replay with backoff.
//! - Replays run one at a time, each with its own connection and producer.

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinHandle;

use super::checkpoint::TxnSeq;
use crate::error::PipelineError;
use crate::settings::{Settings, TableName};
use crate::snapshot::replay::{self, ReplaySpec};
use crate::snapshot::Outcome;
use crate::telemetry::Metrics;

/// A signal row's three columns, as text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SignalRow {
    pub id: String,
    pub kind: String,
    pub data: Option<String>,
}

/// What a signal asks of walpost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// Replay these outbox tables (indexes into the settings' outboxes; one condition
    /// for all, as walpost replays one filter per signal).
    Replay { condition: Option<condition::Condition> },
    /// Not for walpost: why.
    Ignore(String),
}

#[derive(Debug, Deserialize)]
struct SnapshotData {
    #[serde(rename = "data-collections", default)]
    data_collections: Vec<String>,
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(rename = "additional-conditions", default)]
    additional_conditions: Vec<Condition>,
    /// Debezium 2.x's older spelling: one condition for every collection.
    #[serde(rename = "additional-condition", default)]
    additional_condition: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Condition {
    #[serde(rename = "data-collection")]
    data_collection: String,
    filter: String,
}

/// Reads a signal row. `Err`: the row is not a signal walpost can read (logged, counted).
pub(crate) fn parse(row: &SignalRow, outboxes: &[&TableName]) -> Result<Action, String> {
    if row.kind != "execute-snapshot" {
        return Ok(Action::Ignore(format!("signal type {} (walpost acts on execute-snapshot only)", row.kind)));
    }
    let data = row.data.as_deref().ok_or("execute-snapshot without data")?;
    let data: SnapshotData =
        serde_json::from_str(data).map_err(|e| format!("its data is not the expected JSON: {e}"))?;
    if let Some(kind) = data.kind.as_deref() {
        if !matches!(kind, "incremental" | "INCREMENTAL" | "blocking" | "BLOCKING") {
            return Err(format!("snapshot type {kind} is not incremental or blocking"));
        }
    }
    let names: Vec<String> = outboxes.iter().map(|t| t.to_string()).collect();
    let matching: Vec<&String> = data.data_collections.iter().filter(|c| names.contains(c)).collect();
    if matching.is_empty() {
        return Ok(Action::Ignore(format!(
            "data-collections {:?} names no outbox table ({})",
            data.data_collections,
            names.join(", ")
        )));
    }
    let mut conditions: Vec<&str> = data
        .additional_conditions
        .iter()
        .filter(|c| matching.contains(&&c.data_collection))
        .map(|c| c.filter.as_str())
        .collect();
    if let Some(c) = data.additional_condition.as_deref() {
        conditions.push(c);
    }
    // A signal's filter is another role's text: it runs only as the small grammar of
    // the `condition` crate (columns compared with constants), written back as SQL
    // whose strings are bind parameters.
    let mut parsed = Vec::with_capacity(conditions.len());
    for c in conditions {
        parsed.push(condition::parse(c).map_err(|e| {
            format!("its filter is not a condition walpost runs ({e}): a filter compares the outbox's columns with constants (=, <>, <, >, IN, BETWEEN, IS NULL, LIKE, AND, OR, NOT); function calls and subqueries are refused")
        })?);
    }
    let condition = match parsed.len() {
        0 => None,
        1 => parsed.pop(),
        _ => Some(condition::Condition::And(parsed)),
    };
    Ok(Action::Replay { condition })
}

/// `text` with control characters (a newline in a signal's id or filter) escaped, so a
/// signal row cannot write lines of its own into walpost's log.
pub(crate) fn printable(text: &str) -> String {
    text.chars().map(|c| if c.is_control() { c.escape_debug().to_string() } else { c.to_string() }).collect()
}

/// The replays signals started in this session: they run on their own tasks and report
/// back through a channel; dropping this aborts them (the next session reads their
/// signals again).
#[derive(Debug)]
pub(crate) struct Replays {
    tx: mpsc::UnboundedSender<Finished>,
    rx: mpsc::UnboundedReceiver<Finished>,
    running: Vec<JoinHandle<()>>,
    /// One replay at a time, in the order the signals came.
    turn: Arc<Semaphore>,
}

/// A replay ended; `txn` is the checkpoint sequence of the signal's transaction.
#[derive(Debug)]
pub(crate) struct Finished {
    pub txn: TxnSeq,
    pub signal: String,
    pub result: Result<Outcome, PipelineError>,
}

/// Between attempts of a replay that failed transiently.
const RETRY_AFTER: Duration = Duration::from_secs(5);

impl Default for Replays {
    fn default() -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Replays { tx, rx, running: Vec::new(), turn: Arc::new(Semaphore::new(1)) }
    }
}

impl Replays {
    /// Starts the replay of signal `signal` (of transaction `txn`); it runs after the
    /// ones started before it.
    pub(crate) fn start(&mut self, txn: TxnSeq, signal: String, spec: ReplaySpec, s: &Settings, metrics: &Metrics) {
        let (s, metrics, tx, turn) = (s.clone(), metrics.clone(), self.tx.clone(), self.turn.clone());
        self.running.retain(|t| !t.is_finished());
        let task = tokio::spawn(async move {
            // FIFO: tokio's semaphore serves waiters in order.
            let Ok(_turn) = turn.acquire_owned().await else { return };
            let result = loop {
                match replay::run(&s, &spec, &metrics, None).await {
                    Err(e) if e.is_transient() => {
                        tracing::warn!(signal = ?signal, "replay: {}; trying again in {} s", printable(&e.to_string()), RETRY_AFTER.as_secs());
                        tokio::time::sleep(RETRY_AFTER).await;
                    }
                    other => break other,
                }
            };
            let _ = tx.send(Finished { txn, signal, result });
        });
        self.running.push(task);
    }

    /// The next replay to end (pending forever when none runs).
    pub(crate) async fn next(&mut self) -> Option<Finished> {
        self.rx.recv().await
    }
}

impl Drop for Replays {
    fn drop(&mut self) {
        for task in &self.running {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outbox() -> TableName {
        TableName { schema: "events".into(), name: "outbox".into() }
    }

    fn row(kind: &str, data: &str) -> SignalRow {
        SignalRow { id: "s1".into(), kind: kind.into(), data: Some(data.into()) }
    }

    #[test]
    fn an_execute_snapshot_signal_for_the_outbox_is_a_replay_with_its_filter() {
        let t = outbox();
        let data = r#"{"data-collections": ["events.outbox"], "type": "incremental",
            "additional-conditions": [{"data-collection": "events.outbox", "filter": "aggregate_type = 'order'"},
                                      {"data-collection": "public.other", "filter": "x = 1"}]}"#;
        assert_eq!(
            parse(&row("execute-snapshot", data), &[&t]),
            Ok(Action::Replay { condition: Some(condition::parse("\"aggregate_type\" = 'order'").unwrap()) })
        );
        let hostile = r#"{"data-collections": ["events.outbox"],
            "additional-conditions": [{"data-collection": "events.outbox", "filter": "(SELECT pg_drop_replication_slot('victim')) IS NULL"}]}"#;
        let err = parse(&row("execute-snapshot", hostile), &[&t]).unwrap_err();
        assert!(err.contains("not a condition walpost runs"), "{err}");
        let all = r#"{"data-collections": ["events.outbox"]}"#;
        assert_eq!(parse(&row("execute-snapshot", all), &[&t]), Ok(Action::Replay { condition: None }));
    }

    #[test]
    fn other_signals_are_ignored_and_bad_ones_are_errors() {
        let t = outbox();
        assert!(matches!(parse(&row("log", "{}"), &[&t]), Ok(Action::Ignore(_))));
        let elsewhere = r#"{"data-collections": ["public.customers"]}"#;
        assert!(
            matches!(parse(&row("execute-snapshot", elsewhere), &[&t]), Ok(Action::Ignore(w)) if w.contains("public.customers"))
        );
        assert!(parse(&row("execute-snapshot", "not json"), &[&t]).is_err());
        let odd = r#"{"data-collections": ["events.outbox"], "type": "sideways"}"#;
        assert!(parse(&row("execute-snapshot", odd), &[&t]).unwrap_err().contains("sideways"));
        let none = SignalRow { id: "s".into(), kind: "execute-snapshot".into(), data: None };
        assert!(parse(&none, &[&t]).is_err());
    }
}
