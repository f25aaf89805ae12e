//! Signal rows read from the stream (Debezium's `execute-snapshot`): a replay runs
//! beside the stream and holds its signal's transaction unconfirmed until it ends.

use super::super::decode::OpenTxn;
use super::super::signal::{self, Action, Finished, SignalRow};
use super::{Session, LOG_TARGET};
use crate::error::{ErrorKind, PipelineError};
use crate::kafka::sink::Sink;
use crate::kafka::{Known, RecordId};
use crate::settings::TableName;
use crate::snapshot::replay::{self, ReplaySpec};
use crate::stream::source::Source;

impl<R: Source, S: Sink> Session<'_, R, S> {
    /// An operator paused the stream (`POST /api/v1/pause`, or the pause row read from
    /// the database): read nothing more until resumed.
    pub(super) fn paused(&self) -> bool {
        self.all_metrics.health().is_paused()
    }

    /// A signal row: a replay holds its transaction unconfirmed until it ends (see
    /// `signal`); anything else is logged and counted.
    pub(super) fn on_signal(&mut self, txn: &mut OpenTxn, row: SignalRow) -> Result<(), PipelineError> {
        let outboxes: Vec<&TableName> = self.s.source.outboxes.iter().map(|o| &o.table).collect();
        let snapshot_metrics = &self.all_metrics.snapshot;
        match signal::parse(&row, &outboxes) {
            Ok(Action::Replay { condition }) => {
                // The replay takes the place of a record of its transaction (its ordinal
                // names it across sessions, as a record's does).
                let id = RecordId { txn: txn.final_lsn, ordinal: txn.records };
                txn.records += 1;
                let checkpoint = &mut self.confirmer.checkpoint;
                let seq = *txn.seq.get_or_insert_with(|| checkpoint.begin(txn.final_lsn, txn.commit_time_ms));
                if self.memo.lookup(id) == Known::Acknowledged {
                    tracing::info!(target: LOG_TARGET, signal = ?row.id, "signal: its replay ended in an earlier session; not run again");
                    return checkpoint.record_skipped(seq).map_err(|e| PipelineError::definite(ErrorKind::Internal, e));
                }
                checkpoint.record_sent(seq).map_err(|e| PipelineError::definite(ErrorKind::Internal, e))?;
                self.running_replays.push((seq, id));
                let spec = ReplaySpec {
                    id: row.id.clone(),
                    since: None,
                    until: None,
                    condition: condition.map(replay::RowCondition::Checked),
                    time_column: replay::DEFAULT_TIME_COLUMN.to_owned(),
                    dry_run: false,
                    statement_timeout: replay::STATEMENT_TIMEOUT,
                };
                tracing::info!(target: LOG_TARGET, signal = ?row.id, "signal: replay started (the signal's transaction is confirmed once it ends)");
                self.replays.start(seq, row.id, spec, self.s, &self.all_metrics);
            }
            Ok(Action::Ignore(why)) => {
                tracing::info!(target: LOG_TARGET, signal = ?row.id, "signal ignored: {}", signal::printable(&why));
                snapshot_metrics.replay("ignored");
            }
            Err(why) => {
                tracing::warn!(target: LOG_TARGET, signal = ?row.id, "signal cannot be acted on: {}; insert a corrected signal row", signal::printable(&why));
                snapshot_metrics.replay("failed");
            }
        }
        Ok(())
    }

    /// A signal's replay ended: its transaction may be confirmed now, whatever the outcome.
    pub(super) fn replay_finished(&mut self, f: Finished) -> Result<(), PipelineError> {
        self.running_replays.retain(|(seq, _)| *seq != f.txn);
        match &f.result {
            Ok(outcome) => {
                tracing::info!(target: LOG_TARGET, signal = ?f.signal, rows = outcome.rows, "signal: replay done");
                self.all_metrics.snapshot.replay("done");
            }
            Err(e) => {
                tracing::error!(target: LOG_TARGET, signal = ?f.signal, "signal: replay failed: {}; the signal is dropped (insert a new signal row once fixed)", signal::printable(&e.to_string()));
                self.all_metrics.snapshot.replay("failed");
            }
        }
        self.confirmer.delivered(f.txn)
    }
}
