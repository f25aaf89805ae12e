//! What one session learned that the next session of the same process needs: which
//! records of unconfirmed transactions Kafka already acknowledged (so a restart after a
//! transient error does not publish them twice), and which records Kafka refused for
//! good in a way that stopped the producer (so the next session sends them straight to
//! the dead-letter topic instead of stopping the producer again, which would loop).
//!
//! A record is named by its transaction's commit LSN and its position among the
//! transaction's routed records ([`RecordId`]): decoding the same WAL with the same
//! configuration gives the same names. Entries for transactions at or before the slot's
//! confirmed position are forgotten when a session starts (they are never read again),
//! so the memo holds at most the transactions that were unconfirmed at a restart.
//!
//! Skipping an acknowledged record keeps per-partition order: with idempotence and
//! the gap-less guarantee, what Kafka acknowledged of a partition is a prefix of what
//! was sent to it, so the records sent again are exactly the ones after that prefix.
//!
//! The memo lives in memory only: after a crash the slot's confirmed position is all
//! there is, and unconfirmed records are published again (at-least-once).

use std::collections::{HashMap, HashSet};

use pgoutput::Lsn;

use bytes::Bytes;

use super::exactly_once::progress::Position;
use super::Failure;

/// Names a record across sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RecordId {
    /// The commit LSN of its transaction (from the Begin message).
    pub txn: Lsn,
    /// Its position among the transaction's routed records.
    pub ordinal: u32,
}

/// What the memo knows of a record.
#[derive(Debug, PartialEq)]
pub enum Known<'a> {
    Nothing,
    /// In Kafka already: do not send it again.
    Acknowledged,
    /// Kafka refuses it for good: send its dead letter instead.
    Poisoned(&'a Failure),
    /// It shared a batch the broker refused: send it alone, to learn whether the
    /// refusal was about it.
    SendAlone,
}

#[derive(Debug, Default)]
struct TxnRecords {
    /// Records handed over for the transaction in the session that ended.
    handed_over: u64,
    /// Of those, the ones Kafka did not acknowledge.
    not_acknowledged: HashSet<u32>,
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct DeliveryMemo {
    /// Exactly-once: what the progress topic says is committed (it replaces the
    /// in-process knowledge of acknowledgements, which do not mean committed there).
    committed: Option<Position>,
    acknowledged: HashMap<Lsn, TxnRecords>,
    poisoned: HashMap<RecordId, Failure>,
    /// Records of a batch the broker refused as a whole (size): sent alone next time.
    suspects: HashSet<RecordId>,
    /// Snapshot rows (outbox number, event id) Kafka refused in a way that stopped the
    /// producer: the snapshot starts over and sends their dead letters instead.
    poisoned_rows: HashMap<(usize, Bytes), Failure>,
}

impl DeliveryMemo {
    /// Records what a session that ended left unconfirmed: for each pending transaction
    /// (commit LSN, records handed over), every record but `not_acknowledged` is in Kafka.
    pub fn remember(&mut self, pending: impl IntoIterator<Item = (Lsn, u64)>, not_acknowledged: &[RecordId]) {
        for (txn, handed_over) in pending {
            let entry = self.acknowledged.entry(txn).or_default();
            // This session handed over (or skipped) every record below `handed_over`:
            // an earlier session's "not acknowledged" there is out of date.
            entry.not_acknowledged.retain(|ordinal| u64::from(*ordinal) >= handed_over);
            entry.handed_over = entry.handed_over.max(handed_over);
        }
        for id in not_acknowledged {
            if let Some(entry) = self.acknowledged.get_mut(&id.txn) {
                entry.not_acknowledged.insert(id.ordinal);
            }
        }
    }

    /// A record Kafka refused in a way that stopped the producer.
    pub fn poison(&mut self, id: RecordId, failure: Failure) {
        self.suspects.remove(&id);
        self.poisoned.insert(id, failure);
    }

    /// A record that shared a batch the broker refused as a whole.
    pub fn suspect(&mut self, id: RecordId) {
        if !self.poisoned.contains_key(&id) {
            self.suspects.insert(id);
        }
    }

    /// Forgets transactions the slot has confirmed (`txn < confirmed`: their commit
    /// record ends after their commit LSN, so confirmed positions are past them).
    pub fn forget_confirmed(&mut self, confirmed: Lsn) {
        self.acknowledged.retain(|txn, _| *txn >= confirmed);
        self.poisoned.retain(|id, _| id.txn >= confirmed);
        self.suspects.retain(|id| id.txn >= confirmed);
    }

    /// A snapshot row Kafka refused in a way that stopped the producer.
    pub fn poison_row(&mut self, outbox: usize, event_id: Bytes, failure: Failure) {
        self.poisoned_rows.insert((outbox, event_id), failure);
    }

    /// The failure of a poisoned snapshot row, if it is one.
    pub fn poisoned_row(&self, outbox: usize, event_id: &Bytes) -> Option<&Failure> {
        self.poisoned_rows.get(&(outbox, event_id.clone()))
    }

    /// Exactly-once: every record up to `position` is committed in Kafka (the last
    /// committed progress record); forgets what sessions remembered of acknowledgements.
    pub fn set_committed(&mut self, position: Option<Position>) {
        self.committed = position;
        self.acknowledged.clear();
    }

    pub fn lookup(&self, id: RecordId) -> Known<'_> {
        if let Some(f) = self.poisoned.get(&id) {
            return Known::Poisoned(f);
        }
        if let Some(c) = self.committed {
            let in_split = c.partial.is_some_and(|(txn, records)| txn == id.txn && id.ordinal < records);
            if id.txn < c.lsn || in_split {
                return Known::Acknowledged;
            }
        }
        match self.acknowledged.get(&id.txn) {
            Some(t) if u64::from(id.ordinal) < t.handed_over && !t.not_acknowledged.contains(&id.ordinal) => {
                Known::Acknowledged
            }
            // A suspect delivered alone in a later session is acknowledged above.
            _ if self.suspects.contains(&id) => Known::SendAlone,
            _ => Known::Nothing,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.acknowledged.is_empty() && self.poisoned.is_empty() && self.suspects.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(txn: u64, ordinal: u32) -> RecordId {
        RecordId { txn: Lsn(txn), ordinal }
    }

    /// Regression: a record one session did not get acknowledged and the next session
    /// did stayed "not acknowledged", so a third session published it a second time.
    #[test]
    fn regression_a_later_session_acknowledging_a_record_clears_the_earlier_verdict() {
        let mut m = DeliveryMemo::default();
        m.remember([(Lsn(100), 3)], &[id(100, 0), id(100, 1), id(100, 2)]);
        assert_eq!(m.lookup(id(100, 0)), Known::Nothing);
        m.remember([(Lsn(100), 2)], &[id(100, 1)]);
        assert_eq!(m.lookup(id(100, 0)), Known::Acknowledged, "acknowledged in the second session");
        assert_eq!(m.lookup(id(100, 1)), Known::Nothing);
        assert_eq!(m.lookup(id(100, 2)), Known::Nothing, "not handed over by the second session");
    }

    #[test]
    fn a_suspect_goes_alone_until_it_is_acknowledged_or_poisoned() {
        let mut m = DeliveryMemo::default();
        m.suspect(id(100, 1));
        assert_eq!(m.lookup(id(100, 1)), Known::SendAlone);
        assert_eq!(m.lookup(id(100, 0)), Known::Nothing);
        // Delivered alone in the next session, which then ended before the confirm.
        m.remember([(Lsn(100), 3)], &[]);
        assert_eq!(m.lookup(id(100, 1)), Known::Acknowledged);
        let mut m = DeliveryMemo::default();
        m.suspect(id(100, 1));
        let failure = Failure {
            class: "message_size_too_large".into(),
            message: String::new(),
            original_topic: String::new(),
            event_id: Bytes::new(),
            lsn: Lsn(100),
            too_large: true,
        };
        m.poison(id(100, 1), failure);
        assert!(matches!(m.lookup(id(100, 1)), Known::Poisoned(_)), "refused alone: poisoned");
        m.forget_confirmed(Lsn(200));
        assert!(m.is_empty());
    }

    #[test]
    fn acknowledged_records_of_unconfirmed_transactions_are_known() {
        let mut m = DeliveryMemo::default();
        m.remember([(Lsn(100), 3), (Lsn(200), 2)], &[id(100, 1), id(200, 0), id(200, 1)]);
        assert_eq!(m.lookup(id(100, 0)), Known::Acknowledged);
        assert_eq!(m.lookup(id(100, 1)), Known::Nothing, "in flight when the session ended");
        assert_eq!(m.lookup(id(100, 2)), Known::Acknowledged);
        assert_eq!(m.lookup(id(100, 3)), Known::Nothing, "never handed over");
        assert_eq!(m.lookup(id(200, 0)), Known::Nothing);
        assert_eq!(m.lookup(id(300, 0)), Known::Nothing);
        // A second session handed over all three records of txn 100 again (sending 1,
        // skipping 0 and 2) and ended before the confirm with nothing unacknowledged.
        m.remember([(Lsn(100), 3)], &[]);
        assert_eq!(m.lookup(id(100, 1)), Known::Acknowledged, "acknowledged in the second session");
        m.forget_confirmed(Lsn(150));
        assert_eq!(m.lookup(id(100, 0)), Known::Nothing);
        assert_eq!(m.lookup(id(200, 0)), Known::Nothing);
        m.forget_confirmed(Lsn(300));
        assert!(m.is_empty());
    }

    #[test]
    fn committed_progress_covers_transactions_and_a_split_ones_first_records() {
        let mut m = DeliveryMemo::default();
        m.remember([(Lsn(100), 3)], &[]);
        m.set_committed(Some(Position { lsn: Lsn(500), partial: Some((Lsn(600), 2)) }));
        assert_eq!(m.lookup(id(499, 9)), Known::Acknowledged, "committed before the position");
        assert_eq!(m.lookup(id(500, 0)), Known::Nothing);
        assert_eq!(m.lookup(id(600, 1)), Known::Acknowledged, "the split transaction's first two");
        assert_eq!(m.lookup(id(600, 2)), Known::Nothing);
        m.set_committed(None);
        assert_eq!(m.lookup(id(100, 0)), Known::Nothing, "acknowledged is not committed");
    }

    #[test]
    fn poisoned_records_win() {
        let mut m = DeliveryMemo::default();
        let f = Failure {
            class: "message_size_too_large".into(),
            message: "m".into(),
            original_topic: "t".into(),
            event_id: Bytes::from_static(b"9"),
            lsn: Lsn(100),
            too_large: true,
        };
        m.remember([(Lsn(100), 1)], &[]);
        m.poison(id(100, 0), f);
        assert!(matches!(m.lookup(id(100, 0)), Known::Poisoned(f) if f.event_id == Bytes::from_static(b"9")));
    }
}
