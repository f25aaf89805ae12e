//! Which LSN may be confirmed to the slot.
//!
//! Invariants (DESIGN.md "Checkpoint"):
//! - [`Checkpoint::flush_lsn`] only ever moves forward.
//! - It moves to a transaction's commit end LSN only when every record of that
//!   transaction and of every earlier transaction has been delivered (acked by Kafka
//!   with acks=all), whatever order the acks arrive in.
//! - A keepalive position is confirmed only when nothing at all is pending: no open
//!   transaction, no unacknowledged record.
//!
//! Pure bookkeeping, no I/O: the pipeline feeds it events and asks it what to confirm.

use std::collections::VecDeque;

use pgoutput::Lsn;

/// Identifies one transaction in the checkpoint's order; carried through Kafka as the
/// delivery opaque.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TxnSeq(pub u64);

#[derive(Debug)]
struct PendingTxn {
    /// `None` until the Commit message arrives.
    end_lsn: Option<Lsn>,
    outstanding: u64,
    /// Commit time (ms since the Unix epoch), for the streaming-lag figure.
    commit_time_ms: i64,
}

/// Errors that mean the caller broke the protocol with the checkpoint: a bug, reported
/// instead of silently confirming the wrong position.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CheckpointError {
    #[error("delivery reported for transaction {0:?}, which is not pending")]
    UnknownTxn(TxnSeq),
    #[error("more deliveries than records sent for transaction {0:?}")]
    TooManyDeliveries(TxnSeq),
    #[error("transaction {0:?} committed twice")]
    DoubleCommit(TxnSeq),
}

/// Ordered tracker of transactions between "read from the slot" and "acked by Kafka".
#[derive(Debug)]
pub struct Checkpoint {
    pending: VecDeque<PendingTxn>,
    /// Sequence number of `pending[0]`.
    front_seq: u64,
    flushed: Lsn,
    in_flight_records: u64,
}

impl Checkpoint {
    /// Starts from the position the slot has already confirmed.
    pub fn new(confirmed: Lsn) -> Checkpoint {
        Checkpoint { pending: VecDeque::new(), front_seq: 0, flushed: confirmed, in_flight_records: 0 }
    }

    /// The position that may be sent as the flush LSN.
    pub fn flush_lsn(&self) -> Lsn {
        self.flushed
    }

    /// Commit time of the oldest transaction not yet confirmable: the streaming lag is
    /// measured from it.
    pub fn oldest_pending_commit_ms(&self) -> Option<i64> {
        self.pending.front().map(|t| t.commit_time_ms)
    }

    /// Records sent to Kafka and not yet acknowledged.
    pub fn in_flight_records(&self) -> u64 {
        self.in_flight_records
    }

    /// Nothing open, nothing unacknowledged.
    pub fn is_idle(&self) -> bool {
        self.pending.is_empty()
    }

    /// Number of transactions not yet confirmable.
    pub fn pending_transactions(&self) -> usize {
        self.pending.len()
    }

    /// A Begin message: opens the next transaction (committed at `commit_time_ms`).
    pub fn begin(&mut self, commit_time_ms: i64) -> TxnSeq {
        self.pending.push_back(PendingTxn { end_lsn: None, outstanding: 0, commit_time_ms });
        TxnSeq(self.front_seq + self.pending.len() as u64 - 1)
    }

    /// One record of `txn` handed to the producer.
    pub fn record_sent(&mut self, txn: TxnSeq) -> Result<(), CheckpointError> {
        let t = self.get_mut(txn)?;
        t.outstanding += 1;
        self.in_flight_records += 1;
        Ok(())
    }

    /// The Commit message of `txn`: its end LSN becomes confirmable once it is delivered.
    pub fn commit(&mut self, txn: TxnSeq, end_lsn: Lsn) -> Result<(), CheckpointError> {
        let t = self.get_mut(txn)?;
        if t.end_lsn.is_some() {
            return Err(CheckpointError::DoubleCommit(txn));
        }
        t.end_lsn = Some(end_lsn);
        self.advance();
        Ok(())
    }

    /// Kafka acknowledged one record of `txn`.
    pub fn delivered(&mut self, txn: TxnSeq) -> Result<(), CheckpointError> {
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
    pub fn idle_position(&mut self, wal_end: Lsn) {
        if self.pending.is_empty() && wal_end > self.flushed {
            self.flushed = wal_end;
        }
    }

    fn get_mut(&mut self, txn: TxnSeq) -> Result<&mut PendingTxn, CheckpointError> {
        let index = txn
            .0
            .checked_sub(self.front_seq)
            .and_then(|i| usize::try_from(i).ok())
            .ok_or(CheckpointError::UnknownTxn(txn))?;
        self.pending.get_mut(index).ok_or(CheckpointError::UnknownTxn(txn))
    }

    /// Pops the contiguous prefix of committed, fully delivered transactions.
    fn advance(&mut self) {
        while let Some(front) = self.pending.front() {
            match front.end_lsn {
                Some(end) if front.outstanding == 0 => {
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
        let t1 = c.begin(0);
        c.record_sent(t1).unwrap();
        c.record_sent(t1).unwrap();
        c.commit(t1, Lsn(200)).unwrap();
        let t2 = c.begin(0);
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
        let t1 = c.begin(0);
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
        let t = c.begin(0);
        c.commit(t, Lsn(20)).unwrap();
        assert_eq!(c.flush_lsn(), Lsn(20));
    }

    #[test]
    fn keepalive_position_only_when_idle() {
        let mut c = Checkpoint::new(Lsn(10));
        let t = c.begin(0);
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
        let t = c.begin(0);
        assert_eq!(c.delivered(t), Err(CheckpointError::TooManyDeliveries(t)));
        c.commit(t, Lsn(5)).unwrap();
        // t is confirmed and gone: a late ack for it is unknown, not silently applied.
        assert_eq!(c.delivered(t), Err(CheckpointError::UnknownTxn(t)));
        let t2 = c.begin(0);
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
                let t = c.begin(0);
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
