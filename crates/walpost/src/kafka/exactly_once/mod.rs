//! `--delivery exactly-once`, all of it: Kafka transactions that each carry a progress
//! record, and a slot confirmed only up to what a committed transaction holds.
//!
//! - [`transaction`]: when to commit (the pure rule, [`transaction::decide`]), and what
//!   a transactional producer's errors mean (fenced, transactions refused).
//! - [`progress`]: the progress record (which WAL position the last committed Kafka
//!   transaction of a slot reached), its signature, the transactional id, the topic.
//! - this module: the session's side, [`ExactlyOnceState`]: the open Kafka
//!   transaction, when it is committed, the progress record every commit carries, and
//!   the confirm gate.
//!
//! The stream ([`crate::stream`]) drives the state; the snapshot
//! ([`crate::snapshot`]) commits its own transactions with a progress record.
//!
//! Invariants:
//! - A record is handed over only inside an open Kafka transaction.
//! - A commit carries a progress record naming the last PostgreSQL transaction it holds
//!   completely (and, for a split one, how many of its records it holds), so a restart
//!   skips exactly what is committed.
//! - The gate (the slot's confirmed position never passes the last committed progress
//!   record) moves only after `commit_transaction` returned, and only forward.
//! - A quiet outbox on a busy database still lets the slot advance: when nothing is
//!   pending, an empty Kafka transaction with a progress record moves the gate (at most
//!   once per status interval).
//! - A producer fenced by another instance (same transactional id) is a definite error:
//!   this instance stops instead of fencing the other one back.

pub mod progress;
pub mod transaction;

use std::time::{Duration, Instant};

use bytes::Bytes;
use pgoutput::Lsn;
use router::Record;

use super::sink::Sink;
use super::{Outgoing, ProduceWindow};
use crate::error::{ErrorKind, PipelineError};
use crate::settings::ExactlyOnce;
use progress::{Position, Progress, ProgressKey, SlotIdentity};
use transaction::{decide, is_fenced, transaction_error, Bounds, Decision, OpenTransaction};

/// How long an abort may take when a session ends.
const ABORT_TIMEOUT: Duration = Duration::from_secs(10);

/// See the module docs.
#[derive(Debug)]
pub(crate) struct ExactlyOnceState {
    identity: SlotIdentity,
    topic: std::sync::Arc<str>,
    bounds: Bounds,
    commit_timeout: Duration,
    open: Option<OpenTransaction>,
    /// The stream reads a backlog (as of the last PostgreSQL commit).
    backlog: bool,
    /// When the last PostgreSQL commit was read: none for the live interval means the
    /// backlog has ended, even when the server sent no keepalive to say so.
    last_pg_commit: Instant,
    committed: Lsn,
    last_idle_commit: Instant,
    idle_every: Duration,
    /// Signs the progress records (`None`: the lineage table cannot keep a key).
    key: Option<ProgressKey>,
}

/// What a commit should cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Due {
    No,
    /// Commit with this progress position.
    At(Position),
}

impl ExactlyOnceState {
    /// `committed`: the last committed progress position (or the slot's confirmed
    /// position when there is none).
    pub(crate) fn new(
        identity: SlotIdentity,
        e: &ExactlyOnce,
        committed: Lsn,
        idle_every: Duration,
        key: Option<ProgressKey>,
    ) -> ExactlyOnceState {
        ExactlyOnceState {
            key,
            identity,
            topic: std::sync::Arc::from(e.progress_topic.as_str()),
            bounds: Bounds::from(e),
            commit_timeout: e.transaction_timeout,
            open: None,
            backlog: false,
            last_pg_commit: Instant::now(),
            committed,
            last_idle_commit: Instant::now(),
            idle_every,
        }
    }

    /// The slot may be confirmed up to here.
    pub(crate) fn gate(&self) -> Lsn {
        self.committed
    }

    pub(crate) fn is_open(&self) -> bool {
        self.open.is_some()
    }

    /// The stream has read everything the server had: the live bounds apply again until
    /// a PostgreSQL transaction read says otherwise.
    pub(crate) fn caught_up(&mut self) {
        self.backlog = false;
        if let Some(t) = self.open.as_mut() {
            t.backlog = false;
        }
    }

    /// Records handed over in the open transaction (0 when none is open).
    pub(crate) fn open_records(&self) -> u64 {
        self.open.map_or(0, |t| t.records)
    }

    /// Opens the Kafka transaction if none is: call before handing a record over.
    pub(crate) fn before_record<S: Sink>(&mut self, sink: Option<&S>) -> Result<(), PipelineError> {
        if self.open.is_none() {
            let sink =
                sink.ok_or_else(|| PipelineError::transient(ErrorKind::Kafka, "the Kafka producer is closed"))?;
            sink.begin_transaction().map_err(transaction_error)?;
            let mut t = OpenTransaction::new(Instant::now());
            t.backlog = self.backlog;
            self.open = Some(t);
        }
        Ok(())
    }

    /// A record of `bytes` was handed over in the open transaction.
    pub(crate) fn recorded(&mut self, bytes: u64) {
        if let Some(t) = self.open.as_mut() {
            t.record(bytes);
        }
    }

    /// A PostgreSQL transaction committed at `end`; `backlog`: the stream reads a
    /// backlog now (the transaction bounds then are one, `backlog_transaction_ms`).
    pub(crate) fn pg_commit(&mut self, end: Lsn, backlog: bool) {
        self.backlog = backlog;
        self.last_pg_commit = Instant::now();
        if let Some(t) = self.open.as_mut() {
            t.pg_commit(end);
            t.backlog = backlog;
        }
    }

    /// Whether to commit now. `reading`: the PostgreSQL transaction being read (its
    /// commit LSN and the records routed so far); `idle_at`: the position confirmable
    /// when nothing is pending (`None` otherwise).
    pub(crate) fn due(&self, reading: Option<(Lsn, u32)>, idle_at: Option<Lsn>, now: Instant) -> Due {
        match self.open {
            Some(mut t) => {
                if t.backlog
                    && reading.is_none()
                    && now.saturating_duration_since(self.last_pg_commit) >= self.bounds.interval
                {
                    // Nothing read for the live interval: the backlog is over.
                    t.backlog = false;
                }
                self.decide_open(&t, reading, now)
            }
            None => match idle_at {
                Some(at)
                    if at > self.committed
                        && now.saturating_duration_since(self.last_idle_commit) >= self.idle_every =>
                {
                    Due::At(Position { lsn: at, partial: None })
                }
                _ => Due::No,
            },
        }
    }

    fn decide_open(&self, t: &OpenTransaction, reading: Option<(Lsn, u32)>, now: Instant) -> Due {
        match decide(t, &self.bounds, reading.is_some(), now) {
            Decision::Wait => Due::No,
            Decision::Commit => Due::At(Position { lsn: t.complete_up_to.unwrap_or(self.committed), partial: None }),
            Decision::Split => Due::At(Position { lsn: t.complete_up_to.unwrap_or(self.committed), partial: reading }),
        }
    }

    /// The progress record for `position`, to queue in the open transaction; `tag`: the
    /// caller's identity for a record that is no event.
    pub(crate) fn progress_outgoing<T>(&self, position: Position, tag: T) -> Outgoing<T> {
        let record = Record {
            topic: self.topic.clone(),
            key: Bytes::from(self.identity.key()),
            value: Some(Progress::new(&self.identity, position, self.key.as_ref()).encode()),
            headers: Vec::new(),
            event_id: Bytes::new(),
            timestamp_ms: None,
            partition: None,
            trace: router::TraceOutcome::default(),
        };
        Outgoing { record, timestamp_ms: None, tag, dead_letter: None }
    }

    /// Commits the open transaction (opening an empty one for an idle position); the
    /// progress record for `position` must be queued already. The gate moves on success.
    pub(crate) async fn commit<T, S: Sink>(
        &mut self,
        window: &ProduceWindow<T, S>,
        position: Position,
    ) -> Result<(), PipelineError> {
        let sink =
            window.sink().ok_or_else(|| PipelineError::transient(ErrorKind::Kafka, "the Kafka producer is closed"))?;
        let idle = self.open.is_none();
        sink.commit_transaction(self.commit_timeout).await.map_err(transaction_error)?;
        crate::crash_seam!("after-kafka-commit-before-confirm");
        self.open = None;
        if position.lsn > self.committed {
            self.committed = position.lsn;
        }
        if idle {
            self.last_idle_commit = Instant::now();
        }
        Ok(())
    }

    /// Ends the session's transaction: aborts it (nothing of it is ever read). `Err`
    /// when the abort says this producer was fenced (stop: another instance owns it).
    pub(crate) async fn abort<S: Sink>(&mut self, sink: Option<&S>) -> Result<(), PipelineError> {
        self.open = None;
        let Some(sink) = sink else { return Ok(()) };
        match sink.abort_transaction(ABORT_TIMEOUT).await {
            Err(e) if is_fenced(&e) => Err(transaction_error(e)),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> ExactlyOnceState {
        let id = SlotIdentity { system_id: "1".into(), database: "d".into(), slot: "s".into() };
        let e = ExactlyOnce { max_transaction_records: 2, ..ExactlyOnce::default() };
        ExactlyOnceState::new(id, &e, Lsn(100), Duration::from_secs(10), None)
    }

    #[test]
    fn commit_positions_cover_complete_transactions_and_split_ones() {
        let mut s = state();
        s.open = Some(OpenTransaction::new(Instant::now()));
        s.recorded(1);
        s.recorded(1);
        s.pg_commit(Lsn(300), false);
        assert_eq!(s.due(None, None, Instant::now()), Due::At(Position { lsn: Lsn(300), partial: None }));
        s.open = Some(OpenTransaction::new(Instant::now()));
        for _ in 0..4 {
            s.recorded(1);
        }
        assert_eq!(
            s.due(Some((Lsn(400), 4)), None, Instant::now()),
            Due::At(Position { lsn: Lsn(100), partial: Some((Lsn(400), 4)) }),
            "a transaction twice the bound is split; nothing complete in it yet"
        );
    }

    /// A backlog's last Kafka transaction commits by the live bounds once nothing was
    /// read for the live interval (or a keepalive said the server waits for WAL), not
    /// after the backlog interval.
    #[test]
    fn a_backlog_ends_when_nothing_is_read_for_the_live_interval() {
        let mut s = state();
        let t0 = Instant::now();
        s.open = Some(OpenTransaction::new(t0));
        for _ in 0..3 {
            s.recorded(1);
        }
        s.pg_commit(Lsn(300), true);
        let read_at = s.last_pg_commit;
        let at = Due::At(Position { lsn: Lsn(300), partial: None });
        assert_eq!(s.due(None, None, read_at + Duration::from_millis(50)), Due::No, "a backlog, still reading");
        assert_eq!(s.due(Some((Lsn(400), 1)), None, read_at + Duration::from_millis(500)), Due::No, "inside one");
        assert_eq!(s.due(None, None, read_at + Duration::from_millis(100)), at, "quiet for the live interval");
        s.pg_commit(Lsn(300), true);
        s.caught_up();
        assert_eq!(s.due(None, None, s.last_pg_commit), at, "a keepalive said so");
    }

    #[test]
    fn an_idle_position_is_committed_at_most_once_per_interval() {
        let mut s = state();
        let later = Instant::now() + Duration::from_secs(11);
        assert_eq!(s.due(None, Some(Lsn(90)), later), Due::No, "not past the gate");
        assert_eq!(s.due(None, Some(Lsn(500)), Instant::now()), Due::No, "too soon");
        assert_eq!(s.due(None, Some(Lsn(500)), later), Due::At(Position { lsn: Lsn(500), partial: None }));
        s.last_idle_commit = later;
        assert_eq!(s.due(None, Some(Lsn(600)), later), Due::No);
    }
}
