//! Which LSN may be confirmed to the slot.
//!
//! Invariants (DESIGN.md "Checkpoint"):
//! - [`Checkpoint::flush_lsn`] only ever moves forward.
//! - It moves to a transaction's commit end LSN only when every record of that
//!   transaction and of every earlier transaction has been delivered (acked by Kafka
//!   with acks=all), whatever order the acks arrive in.
//! - A keepalive position is confirmed only when nothing at all is pending: no open
//!   transaction, no unacknowledged record.
//! - Only transactions with records take memory: a transaction without outbox rows
//!   (PostgreSQL 14 sends BEGIN/COMMIT for every transaction) is confirmable at its
//!   commit when nothing is pending ([`Checkpoint::commit_empty`]), and otherwise moves
//!   the confirmable end of the newest pending one. So memory is bounded by the records
//!   in flight, whatever a stalled producer lets pile up in the WAL.
//!
//! Pure bookkeeping, no I/O: the stream feeds it events and asks it what to confirm.

use std::collections::VecDeque;

use pgoutput::Lsn;

/// Identifies one transaction in the checkpoint's order; carried through Kafka as the
/// delivery opaque.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct TxnSeq(pub u64);

#[derive(Debug)]
struct PendingTxn {
    /// The commit LSN from the Begin message: names the transaction across sessions.
    final_lsn: Lsn,
    /// `None` until the Commit message arrives.
    end_lsn: Option<Lsn>,
    /// Empty transactions that committed after this one: once it is confirmable, so
    /// are they.
    covers: Option<Lsn>,
    outstanding: u64,
    /// Records handed over for it (acknowledged or not).
    records: u64,
    /// Commit time (ms since the Unix epoch), for the streaming-lag figure.
    commit_time_ms: i64,
}

/// Errors that mean the caller broke the protocol with the checkpoint: a bug, reported
/// instead of silently confirming the wrong position.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum CheckpointError {
    #[error("delivery reported for transaction {0:?}, which is not pending")]
    UnknownTxn(TxnSeq),
    #[error("more deliveries than records sent for transaction {0:?}")]
    TooManyDeliveries(TxnSeq),
    #[error("transaction {0:?} committed twice")]
    DoubleCommit(TxnSeq),
}

/// Ordered tracker of transactions between "read from the slot" and "acked by Kafka".
#[derive(Debug)]
pub(crate) struct Checkpoint {
    pending: VecDeque<PendingTxn>,
    /// Sequence number of `pending[0]`.
    front_seq: u64,
    flushed: Lsn,
    in_flight_records: u64,
}

impl Checkpoint {
    /// Starts from the position the slot has already confirmed.
    pub(crate) fn new(confirmed: Lsn) -> Checkpoint {
        Checkpoint { pending: VecDeque::new(), front_seq: 0, flushed: confirmed, in_flight_records: 0 }
    }

    /// The position that may be sent as the flush LSN.
    pub(crate) fn flush_lsn(&self) -> Lsn {
        self.flushed
    }

    /// Commit time of the oldest transaction not yet confirmable: the streaming lag is
    /// measured from it.
    pub(crate) fn oldest_pending_commit_ms(&self) -> Option<i64> {
        self.pending.front().map(|t| t.commit_time_ms)
    }

    /// (commit LSN, records handed over) of every transaction not yet confirmable.
    pub(crate) fn pending(&self) -> impl Iterator<Item = (Lsn, u64)> + '_ {
        self.pending.iter().map(|t| (t.final_lsn, t.records))
    }

    /// The commit LSN (from its Begin message) of a pending transaction.
    #[cfg(test)]
    pub(crate) fn final_lsn(&self, txn: TxnSeq) -> Option<Lsn> {
        self.index(txn).and_then(|i| self.pending.get(i)).map(|t| t.final_lsn)
    }

    /// Records sent to Kafka and not yet acknowledged.
    #[cfg(test)]
    pub(crate) fn in_flight_records(&self) -> u64 {
        self.in_flight_records
    }

    /// Nothing open, nothing unacknowledged.
    pub(crate) fn is_idle(&self) -> bool {
        self.pending.is_empty()
    }

    /// Number of transactions not yet confirmable.
    pub(crate) fn pending_transactions(&self) -> usize {
        self.pending.len()
    }

    /// Opens the next transaction, committing at `final_lsn` at `commit_time_ms`: call
    /// it for a transaction's first record (a transaction without records needs only
    /// [`Checkpoint::commit_empty`]).
    pub(crate) fn begin(&mut self, final_lsn: Lsn, commit_time_ms: i64) -> TxnSeq {
        self.pending.push_back(PendingTxn {
            final_lsn,
            end_lsn: None,
            covers: None,
            outstanding: 0,
            records: 0,
            commit_time_ms,
        });
        TxnSeq(self.front_seq + self.pending.len() as u64 - 1)
    }

    /// One record of `txn` handed to the producer.
    pub(crate) fn record_sent(&mut self, txn: TxnSeq) -> Result<(), CheckpointError> {
        let t = self.get_mut(txn)?;
        t.outstanding += 1;
        t.records += 1;
        self.in_flight_records += 1;
        Ok(())
    }

    /// One record of `txn` that needs no delivery (it is in Kafka already): counted as
    /// handed over, never as outstanding.
    pub(crate) fn record_skipped(&mut self, txn: TxnSeq) -> Result<(), CheckpointError> {
        self.get_mut(txn)?.records += 1;
        Ok(())
    }

    /// A transaction without records committed, ending at `end_lsn`.
    pub(crate) fn commit_empty(&mut self, end_lsn: Lsn) {
        match self.pending.back_mut() {
            Some(newest) => newest.covers = Some(newest.covers.map_or(end_lsn, |c| c.max(end_lsn))),
            None => {
                if end_lsn > self.flushed {
                    self.flushed = end_lsn;
                }
            }
        }
    }

    /// The Commit message of `txn`: its end LSN becomes confirmable once it is delivered.
    pub(crate) fn commit(&mut self, txn: TxnSeq, end_lsn: Lsn) -> Result<(), CheckpointError> {
        let t = self.get_mut(txn)?;
        if t.end_lsn.is_some() {
            return Err(CheckpointError::DoubleCommit(txn));
        }
        t.end_lsn = Some(end_lsn);
        self.advance();
        Ok(())
    }

    /// Kafka acknowledged one record of `txn`.
    pub(crate) fn delivered(&mut self, txn: TxnSeq) -> Result<(), CheckpointError> {
        let t = self.get_mut(txn)?;
        if t.outstanding == 0 {
            return Err(CheckpointError::TooManyDeliveries(txn));
        }
        t.outstanding -= 1;
        self.in_flight_records -= 1;
        self.advance();
        Ok(())
    }

    /// A keepalive reported the server's WAL position. When nothing is pending, every
    /// transaction that committed before it has been delivered (or had no outbox
    /// rows), so it is safe to confirm: an idle outbox does not pin WAL.
    pub(crate) fn idle_position(&mut self, wal_end: Lsn) {
        if self.pending.is_empty() && wal_end > self.flushed {
            self.flushed = wal_end;
        }
    }

    fn index(&self, txn: TxnSeq) -> Option<usize> {
        txn.0.checked_sub(self.front_seq).and_then(|i| usize::try_from(i).ok())
    }

    fn get_mut(&mut self, txn: TxnSeq) -> Result<&mut PendingTxn, CheckpointError> {
        let index = self.index(txn).ok_or(CheckpointError::UnknownTxn(txn))?;
        self.pending.get_mut(index).ok_or(CheckpointError::UnknownTxn(txn))
    }

    /// Pops the contiguous prefix of committed, fully delivered transactions.
    fn advance(&mut self) {
        while let Some(front) = self.pending.front() {
            match front.end_lsn {
                Some(end) if front.outstanding == 0 => {
                    let end = front.covers.map_or(end, |c| c.max(end));
                    if end > self.flushed {
                        self.flushed = end;
                    }
                    self.pending.pop_front();
                    self.front_seq += 1;
                }
                _ => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn out_of_order_acks_confirm_only_the_contiguous_prefix() {
        let mut c = Checkpoint::new(Lsn(100));
        let t1 = c.begin(Lsn(0), 0);
        c.record_sent(t1).unwrap();
        c.record_sent(t1).unwrap();
        c.commit(t1, Lsn(200)).unwrap();
        let t2 = c.begin(Lsn(0), 0);
        c.record_sent(t2).unwrap();
        c.commit(t2, Lsn(300)).unwrap();

        // t2 acked first (another partition was faster): nothing may be confirmed.
        c.delivered(t2).unwrap();
        assert_eq!(c.flush_lsn(), Lsn(100));
        c.delivered(t1).unwrap();
        assert_eq!(c.flush_lsn(), Lsn(100), "t1 still has one record unacked");
        c.delivered(t1).unwrap();
        assert_eq!(c.flush_lsn(), Lsn(300), "t1 done and t2 done: both confirmable");
        assert!(c.is_idle());
    }

    #[test]
    fn an_open_transaction_holds_back_later_ones() {
        let mut c = Checkpoint::new(Lsn(0));
        let t1 = c.begin(Lsn(0), 0);
        c.record_sent(t1).unwrap();
        c.delivered(t1).unwrap();
        // Delivered but not committed yet (Commit message still to come).
        assert_eq!(c.flush_lsn(), Lsn(0));
        c.commit(t1, Lsn(50)).unwrap();
        assert_eq!(c.flush_lsn(), Lsn(50));
    }

    #[test]
    fn empty_transactions_confirm_at_commit() {
        let mut c = Checkpoint::new(Lsn(10));
        let t = c.begin(Lsn(0), 0);
        c.commit(t, Lsn(20)).unwrap();
        assert_eq!(c.flush_lsn(), Lsn(20));
        c.commit_empty(Lsn(30));
        assert_eq!(c.flush_lsn(), Lsn(30), "nothing pending: confirmable at once");
    }

    /// Regression: one pending entry per BEGIN was kept while the producer stalled, so
    /// 100k empty transactions (PostgreSQL 14 sends them) grew memory without bound.
    #[test]
    fn regression_empty_transactions_behind_a_pending_one_take_no_memory() {
        let mut c = Checkpoint::new(Lsn(10));
        let t = c.begin(Lsn(20), 0);
        c.record_sent(t).unwrap();
        c.commit(t, Lsn(21)).unwrap();
        for i in 0..100_000u64 {
            c.commit_empty(Lsn(100 + i));
        }
        assert_eq!(c.pending_transactions(), 1);
        assert_eq!(c.flush_lsn(), Lsn(10), "nothing passes the unacknowledged record");
        c.delivered(t).unwrap();
        assert_eq!(c.flush_lsn(), Lsn(100 + 99_999), "the empty ones after it come along");
    }

    #[test]
    fn pending_transactions_name_their_commit_lsn_and_records() {
        let mut c = Checkpoint::new(Lsn(0));
        let t = c.begin(Lsn(500), 0);
        c.record_sent(t).unwrap();
        c.record_skipped(t).unwrap();
        assert_eq!(c.final_lsn(t), Some(Lsn(500)));
        assert_eq!(c.pending().collect::<Vec<_>>(), vec![(Lsn(500), 2)]);
        assert_eq!(c.in_flight_records(), 1);
    }

    #[test]
    fn keepalive_position_only_when_idle() {
        let mut c = Checkpoint::new(Lsn(10));
        let t = c.begin(Lsn(0), 0);
        c.record_sent(t).unwrap();
        c.idle_position(Lsn(500));
        assert_eq!(c.flush_lsn(), Lsn(10), "a record is in flight");
        c.commit(t, Lsn(40)).unwrap();
        c.idle_position(Lsn(500));
        assert_eq!(c.flush_lsn(), Lsn(10), "committed but unacked");
        c.delivered(t).unwrap();
        assert_eq!(c.flush_lsn(), Lsn(40));
        c.idle_position(Lsn(500));
        assert_eq!(c.flush_lsn(), Lsn(500));
        c.idle_position(Lsn(300));
        assert_eq!(c.flush_lsn(), Lsn(500), "never backwards");
    }

    #[test]
    fn protocol_misuse_is_reported() {
        let mut c = Checkpoint::new(Lsn(0));
        assert_eq!(c.delivered(TxnSeq(3)), Err(CheckpointError::UnknownTxn(TxnSeq(3))));
        let t = c.begin(Lsn(0), 0);
        assert_eq!(c.delivered(t), Err(CheckpointError::TooManyDeliveries(t)));
        c.commit(t, Lsn(5)).unwrap();
        // t is confirmed and gone: a late ack for it is unknown, not silently applied.
        assert_eq!(c.delivered(t), Err(CheckpointError::UnknownTxn(t)));
        let t2 = c.begin(Lsn(0), 0);
        c.record_sent(t2).unwrap();
        c.commit(t2, Lsn(6)).unwrap();
        assert_eq!(c.commit(t2, Lsn(7)), Err(CheckpointError::DoubleCommit(t2)));
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
        /// Any interleaving of acks: the flush LSN never decreases and never passes a
        /// transaction with an unacked record or one of its predecessors.
        #[test]
        fn flush_never_passes_an_unacked_record(
            sizes in proptest::collection::vec(0u64..4, 1..12),
            order in proptest::collection::vec(any::<prop::sample::Index>(), 0..64),
        ) {
            let mut c = Checkpoint::new(Lsn(0));
            let mut unacked: Vec<(TxnSeq, u64)> = Vec::new(); // (txn, end lsn) per record
            let mut txns = Vec::new();
            for (i, &n) in sizes.iter().enumerate() {
                let t = c.begin(Lsn(0), 0);
                let end = (i as u64 + 1) * 100;
                for _ in 0..n { c.record_sent(t).unwrap(); unacked.push((t, end)); }
                c.commit(t, Lsn(end)).unwrap();
                txns.push(end);
            }
            let mut last = c.flush_lsn();
            for idx in order {
                if unacked.is_empty() { break; }
                let (t, _) = unacked.remove(idx.index(unacked.len()));
                c.delivered(t).unwrap();
                let now = c.flush_lsn();
                prop_assert!(now >= last);
                // The first transaction with an unacked record bounds the flush LSN.
                if let Some(min_end) = unacked.iter().map(|&(_, e)| e).min() {
                    prop_assert!(now.0 < min_end, "flushed {} past unacked txn ending {}", now, min_end);
                }
                last = now;
            }
            if unacked.is_empty() {
                prop_assert_eq!(c.flush_lsn(), Lsn(*txns.last().unwrap()));
            }
        }
    }
}
