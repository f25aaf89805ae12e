//! When to commit a Kafka transaction (`--delivery exactly-once`): the pure rule.
//!
//! PostgreSQL transactions are grouped into Kafka transactions bounded by records,
//! payload bytes and time. A Kafka transaction is committed between PostgreSQL
//! transactions, once a bound is reached. A PostgreSQL transaction is split across
//! Kafka transactions only when it alone passes the record or byte bound (twice the
//! bound, so an ordinary transaction just over it is not split): the split point is
//! after the record that reached it, and the progress record says how many of that
//! transaction's records are committed (see [`super::progress`]).
//!
//! Reading a backlog, the bounds are one: time, `backlog_transaction_ms` (1 s). A commit
//! stops the stream until the records in flight are acknowledged (about one produce
//! round trip, 60 ms on the benchmark's broker): at 150k events/s the record bound
//! committed every 70 ms, and the stream stood still a third of the time. Live, the
//! short bounds keep a `read_committed` consumer's latency; a backlog has none to keep.
//! Whether the stream reads a backlog is the live-send policy's measure
//! ([`crate::stream::live`]): the last PostgreSQL transaction with records was sent
//! 1 s or more after its commit.

use std::time::{Duration, Instant};

use pgoutput::Lsn;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use crate::error::{ErrorKind, PipelineError};
use crate::settings::ExactlyOnce;

/// What to do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Keep the transaction open.
    Wait,
    /// Commit, covering every PostgreSQL transaction up to the last complete one.
    Commit,
    /// Commit in the middle of a PostgreSQL transaction that alone is too large.
    Split,
}

/// The open Kafka transaction's counters.
#[derive(Debug, Clone, Copy)]
pub struct OpenTransaction {
    pub started: Instant,
    pub records: u64,
    pub bytes: u64,
    /// The commit end LSN of the last PostgreSQL transaction it holds completely.
    pub complete_up_to: Option<Lsn>,
    /// Records of the PostgreSQL transaction being read that it holds.
    pub records_of_open_pg_txn: u64,
    /// The stream reads a backlog (see the module docs).
    pub backlog: bool,
}

impl OpenTransaction {
    pub fn new(now: Instant) -> OpenTransaction {
        OpenTransaction {
            started: now,
            records: 0,
            bytes: 0,
            complete_up_to: None,
            records_of_open_pg_txn: 0,
            backlog: false,
        }
    }

    pub fn record(&mut self, bytes: u64) {
        self.records += 1;
        self.bytes += bytes;
        self.records_of_open_pg_txn += 1;
    }

    /// A PostgreSQL transaction committed (its end LSN).
    pub fn pg_commit(&mut self, end: Lsn) {
        self.complete_up_to = Some(end);
        self.records_of_open_pg_txn = 0;
    }
}

/// The bounds.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub records: u64,
    pub bytes: u64,
    pub interval: Duration,
    /// The only bound while the stream reads a backlog.
    pub backlog_interval: Duration,
}

impl From<&ExactlyOnce> for Bounds {
    fn from(e: &ExactlyOnce) -> Bounds {
        Bounds {
            records: e.max_transaction_records,
            bytes: e.max_transaction_bytes,
            interval: e.max_transaction_interval,
            backlog_interval: e.backlog_transaction_interval,
        }
    }
}

/// See the module docs. `in_pg_txn`: a PostgreSQL transaction is being read.
pub fn decide(t: &OpenTransaction, b: &Bounds, in_pg_txn: bool, now: Instant) -> Decision {
    let open_for = now.saturating_duration_since(t.started);
    let due = if t.backlog {
        open_for >= b.backlog_interval
    } else {
        t.records >= b.records || t.bytes >= b.bytes || open_for >= b.interval
    };
    if !in_pg_txn {
        return if due && (t.records > 0 || t.complete_up_to.is_some()) { Decision::Commit } else { Decision::Wait };
    }
    let oversized = t.records_of_open_pg_txn >= b.records.saturating_mul(2)
        || (t.records_of_open_pg_txn > 0 && t.bytes >= b.bytes.saturating_mul(2));
    if oversized {
        Decision::Split
    } else {
        Decision::Wait
    }
}

/// Whether `e` says another producer with this transactional id took over.
pub fn is_fenced(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(RDKafkaErrorCode::ProducerFenced | RDKafkaErrorCode::InvalidProducerEpoch | RDKafkaErrorCode::Fenced)
    )
}

/// A transaction call's error: fenced is definite (this instance must stop), the rest
/// transient (abort, restart from the committed position).
pub fn transaction_error(e: KafkaError) -> PipelineError {
    if is_fenced(&e) {
        return PipelineError::definite(ErrorKind::Fenced, fenced_message()).caused_by(e);
    }
    let unsupported = matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::UnsupportedVersion
                | RDKafkaErrorCode::TransactionalIdAuthorizationFailed
                | RDKafkaErrorCode::ClusterAuthorizationFailed
        )
    );
    if unsupported {
        return PipelineError::definite(ErrorKind::Kafka, texts::exactly_once::brokers_refuse_transactions(&e))
            .caused_by(e);
    }
    PipelineError::transient(
        ErrorKind::Fenced,
        format!("Kafka transaction failed ({e}); aborting it and restarting from the last committed position"),
    )
    .caused_by(e)
}

/// The error of an instance fenced by another; quoted in runbooks/exactly-once.md.
pub fn fenced_message() -> String {
    texts::exactly_once::FENCED.to_owned()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn bounds() -> Bounds {
        Bounds {
            records: 10,
            bytes: 1000,
            interval: Duration::from_millis(100),
            backlog_interval: Duration::from_millis(1_000),
        }
    }

    #[test]
    fn commits_between_postgres_transactions_once_a_bound_is_reached() {
        let t0 = Instant::now();
        let mut t = OpenTransaction::new(t0);
        for _ in 0..5 {
            t.record(10);
        }
        assert_eq!(decide(&t, &bounds(), true, t0), Decision::Wait);
        t.pg_commit(Lsn(100));
        assert_eq!(decide(&t, &bounds(), false, t0), Decision::Wait, "no bound reached");
        assert_eq!(decide(&t, &bounds(), false, t0 + Duration::from_millis(100)), Decision::Commit, "time");
        for _ in 0..5 {
            t.record(10);
        }
        assert_eq!(decide(&t, &bounds(), true, t0), Decision::Wait, "never inside a PostgreSQL transaction");
        t.pg_commit(Lsn(200));
        assert_eq!(decide(&t, &bounds(), false, t0), Decision::Commit, "records");
    }

    #[test]
    fn fenced_is_definite_and_quoted() {
        let e = transaction_error(KafkaError::MessageProduction(RDKafkaErrorCode::ProducerFenced));
        assert!(!e.is_transient() && e.to_string() == fenced_message(), "{e}");
    }

    #[test]
    fn only_a_postgres_transaction_twice_the_bound_is_split() {
        let t0 = Instant::now();
        let mut t = OpenTransaction::new(t0);
        for _ in 0..19 {
            t.record(1);
        }
        assert_eq!(decide(&t, &bounds(), true, t0 + Duration::from_secs(9)), Decision::Wait);
        t.record(1);
        assert_eq!(decide(&t, &bounds(), true, t0), Decision::Split);
    }

    #[test]
    fn a_backlog_commits_by_time_alone_and_going_live_commits_at_once() {
        let t0 = Instant::now();
        let mut t = OpenTransaction::new(t0);
        t.backlog = true;
        for _ in 0..500 {
            t.record(100);
        }
        t.pg_commit(Lsn(100));
        let b = bounds();
        assert_eq!(decide(&t, &b, false, t0 + Duration::from_millis(999)), Decision::Wait, "past records and bytes");
        assert_eq!(decide(&t, &b, false, t0 + Duration::from_millis(1_000)), Decision::Commit, "backlog interval");
        t.backlog = false;
        assert_eq!(decide(&t, &b, false, t0), Decision::Commit, "live again: the short bounds, passed long ago");
        t.backlog = true;
        for _ in 0..20 {
            t.record(1);
        }
        assert_eq!(
            decide(&t, &b, true, t0),
            Decision::Split,
            "a PostgreSQL transaction twice the record bound is split in a backlog too"
        );
    }

    proptest! {
        /// Any sequence of transactions, read live or from a backlog: a commit never
        /// comes inside a PostgreSQL transaction unless that transaction alone has twice
        /// the record bound, and between them only once the bounds that apply say so.
        #[test]
        fn splits_only_oversized_transactions(txns in proptest::collection::vec((0u64..40, any::<bool>()), 1..30)) {
            let t0 = Instant::now();
            let mut t = OpenTransaction::new(t0);
            let b = bounds();
            for (i, &(n, backlog)) in txns.iter().enumerate() {
                let now = t0 + Duration::from_millis(50 * i as u64);
                for _ in 0..n {
                    t.record(1);
                    match decide(&t, &b, true, now) {
                        Decision::Split => {
                            prop_assert!(t.records_of_open_pg_txn >= 2 * b.records);
                            // The next Kafka transaction holds none of it yet.
                            t = OpenTransaction::new(now);
                        }
                        Decision::Commit => prop_assert!(false, "commit inside a transaction"),
                        Decision::Wait => {}
                    }
                }
                t.pg_commit(Lsn(i as u64 + 1));
                t.backlog = backlog;
                if decide(&t, &b, false, now) == Decision::Commit {
                    let open_for = now.saturating_duration_since(t.started);
                    if backlog {
                        prop_assert!(open_for >= b.backlog_interval);
                    } else {
                        prop_assert!(t.records >= b.records || t.bytes >= b.bytes || open_for >= b.interval);
                    }
                    t = OpenTransaction::new(now);
                }
            }
        }
    }
}
