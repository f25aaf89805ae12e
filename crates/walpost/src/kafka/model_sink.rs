//! A producer for unit tests: an in-memory model of librdkafka and a broker, driven by
//! the test, with the behaviour that matters to the produce window.
//!
//! Records handed over wait until the test answers them ([`ModelSink::answer`]). The
//! model partitions a record by its key (or its own partition) once it has seen the
//! topic, and writes each partition's records in the order they were handed over. A
//! partition where the modelled producer has not written yet behaves as a real broker
//! and librdkafka together do (docs/decisions/0001-first-record-alone.md): its first batch
//! fails with a retriable error; if a later record of the partition was handed over
//! meanwhile, that later batch is written and the first is reported delivered without
//! being written (librdkafka's implicit acknowledgement); if not, the first is retried
//! and written.
//!
//! Scripts: [`ModelSink::refuse`] makes a record be refused for good (its event id).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use router::Record;
use tokio::sync::mpsc;

use super::barrier::Placement;
use super::rejection::Rejection;
use super::sink::{Original, Outcome, Report, SendError, Sink};

/// Partitions of every topic in the model.
pub(crate) const PARTITIONS: i32 = 3;

/// A record as the model wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Written {
    pub topic: String,
    pub partition: i32,
    pub event_id: String,
}

#[derive(Debug)]
struct Pending {
    seq: u64,
    topic: String,
    partition: i32,
    event_id: String,
    original: Original,
}

#[derive(Debug, Default)]
struct State {
    pending: Vec<Pending>,
    /// Topics the model has seen (partition counts known).
    known: BTreeSet<String>,
    /// (topic, partition) pairs the producer has written to.
    established: BTreeSet<(String, i32)>,
    written: Vec<Written>,
    /// Reported delivered, never written.
    lost: Vec<Written>,
    /// (topic, event id) pairs refused for good.
    refused: BTreeSet<(String, String)>,
    handed_over: u64,
    /// Transaction calls, in order (`begin`, `commit`, `abort`).
    transactions: Vec<&'static str>,
    /// Exactly-once: how many of `written` a committed Kafka transaction holds (what a
    /// `read_committed` consumer reads); the records after them are in the open one.
    committed: usize,
}

/// See the module docs. Clones share the model.
#[derive(Debug, Clone)]
pub(crate) struct ModelSink {
    state: Arc<Mutex<State>>,
    reports: mpsc::UnboundedSender<Report>,
}

/// The partition the model gives `key`.
pub(crate) fn partition_for(key: &[u8]) -> i32 {
    let sum: u32 = key.iter().map(|b| u32::from(*b)).sum();
    i32::try_from(sum % PARTITIONS.unsigned_abs()).unwrap_or(0)
}

impl ModelSink {
    pub(crate) fn new() -> (ModelSink, mpsc::UnboundedReceiver<Report>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (ModelSink { state: Arc::default(), reports: tx }, rx)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Refuse the record with this event id for good on `topic` (its dead letter, on
    /// another topic, is taken).
    pub(crate) fn refuse(&self, topic: &str, event_id: &str) {
        self.state().refused.insert((topic.to_owned(), event_id.to_owned()));
    }

    /// Answers every record handed over and not answered yet, partition by partition.
    pub(crate) fn answer(&self) {
        let pending = std::mem::take(&mut self.state().pending);
        self.answer_these(pending);
    }

    /// Answers the first `n` records handed over and not answered yet.
    pub(crate) fn answer_first(&self, n: usize) {
        let mut state = self.state();
        let at = n.min(state.pending.len());
        let rest = state.pending.split_off(at);
        let first = std::mem::replace(&mut state.pending, rest);
        drop(state);
        self.answer_these(first);
    }

    fn answer_these(&self, pending: Vec<Pending>) {
        let mut state = self.state();
        let mut by_partition: BTreeMap<(String, i32), Vec<Pending>> = BTreeMap::new();
        for p in pending {
            by_partition.entry((p.topic.clone(), p.partition)).or_default().push(p);
        }
        for (key, records) in by_partition {
            let fresh = !state.established.contains(&key);
            let implicit = fresh && records.len() > 1;
            for (i, p) in records.into_iter().enumerate() {
                let written = Written { topic: p.topic.clone(), partition: p.partition, event_id: p.event_id.clone() };
                let outcome = if state.refused.contains(&(p.topic.clone(), p.event_id.clone())) {
                    Outcome::Rejected {
                        rejection: Rejection {
                            event_id: p.event_id.clone(),
                            topic: p.topic.clone(),
                            code: "policy_violation".into(),
                            error: "refused by the model".into(),
                            fix: "none",
                        },
                        original: Box::new(p.original),
                    }
                } else {
                    if implicit && i == 0 {
                        // Failed before it was written; acknowledged by the next batch.
                        state.lost.push(written);
                    } else {
                        state.written.push(written);
                        state.established.insert(key.clone());
                    }
                    Outcome::Delivered { partition: p.partition, offset: 0 }
                };
                let _ = self.reports.send(Report { seq: p.seq, outcome });
            }
        }
    }

    /// Sends what librdkafka's log line "implicitly acked" turns into.
    pub(crate) fn announce_implicit_ack(&self) {
        let line = "t [2] 1 message(s) implicitly acked by subsequent batch success".to_owned();
        let _ = self.reports.send(Report { seq: super::sink::NO_RECORD, outcome: Outcome::ImplicitlyAcked { line } });
    }

    /// Records written, in order.
    pub(crate) fn written(&self) -> Vec<Written> {
        self.state().written.clone()
    }

    /// Exactly-once: the written records of committed Kafka transactions, in order.
    pub(crate) fn committed(&self) -> Vec<Written> {
        let state = self.state();
        state.written.iter().take(state.committed).cloned().collect()
    }

    /// Records reported delivered that were never written.
    pub(crate) fn lost(&self) -> Vec<Written> {
        self.state().lost.clone()
    }

    /// Records handed over and not answered.
    pub(crate) fn pending(&self) -> usize {
        self.state().pending.len()
    }

    /// The transaction calls so far.
    pub(crate) fn transactions(&self) -> Vec<&'static str> {
        self.state().transactions.clone()
    }

    /// Answers the pending records in a random order across partitions (each partition's
    /// own records stay in order, as librdkafka reports them), from `seed`.
    pub(crate) fn answer_shuffled(&self, seed: u64) {
        let mut state = self.state();
        let mut pending = std::mem::take(&mut state.pending);
        // A small xorshift: the order is the seed's, replayable.
        let mut x = seed | 1;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut keys: Vec<(String, i32)> = pending.iter().map(|p| (p.topic.clone(), p.partition)).collect();
        keys.sort();
        keys.dedup();
        let mut order: Vec<(u64, (String, i32))> = keys.into_iter().map(|k| (next(), k)).collect();
        order.sort();
        drop(state);
        for (_, key) in order {
            let (mine, rest): (Vec<Pending>, Vec<Pending>) =
                pending.into_iter().partition(|p| p.topic == key.0 && p.partition == key.1);
            pending = rest;
            self.answer_these(mine);
        }
    }
}

impl Sink for ModelSink {
    fn send(&mut self, seq: u64, record: &Record, _timestamp_ms: Option<i64>) -> Result<(), SendError> {
        let mut state = self.state();
        let topic = record.topic.to_string();
        state.known.insert(topic.clone());
        state.handed_over += 1;
        let partition = record.partition.unwrap_or_else(|| partition_for(&record.key));
        state.pending.push(Pending {
            seq,
            topic,
            partition,
            event_id: String::from_utf8_lossy(&record.event_id).into_owned(),
            original: Original::of(record),
        });
        Ok(())
    }

    fn placement(&mut self, record: &Record) -> Placement {
        if let Some(p) = record.partition {
            return Placement::Partition(p);
        }
        if self.state().known.contains(&*record.topic) {
            Placement::Partition(partition_for(&record.key))
        } else {
            Placement::Unknown
        }
    }

    fn send_now(&self) {}

    fn send_alone_now(&self) {}

    fn alone_answered(&self) {}

    fn rebootstrap(&self) {}

    fn fatal_error(&self) -> Option<String> {
        None
    }

    async fn close(self, _timeout: Duration) {}

    fn begin_transaction(&self) -> Result<(), rdkafka::error::KafkaError> {
        self.state().transactions.push("begin");
        Ok(())
    }

    async fn commit_transaction(&self, _timeout: Duration) -> Result<(), rdkafka::error::KafkaError> {
        // What librdkafka's commit does: every record handed over is answered first.
        self.answer();
        let mut state = self.state();
        state.transactions.push("commit");
        state.committed = state.written.len();
        Ok(())
    }

    async fn abort_transaction(&self, _timeout: Duration) -> Result<(), rdkafka::error::KafkaError> {
        let mut state = self.state();
        state.transactions.push("abort");
        // An aborted transaction's records are never read.
        let committed = state.committed;
        state.written.truncate(committed);
        state.pending.clear();
        Ok(())
    }
}

/// Counts per key of `written`, for order checks: key -> event ids in written order.
pub(crate) fn by_partition(written: &[Written]) -> HashMap<(String, i32), Vec<String>> {
    let mut out: HashMap<(String, i32), Vec<String>> = HashMap::new();
    for w in written {
        out.entry((w.topic.clone(), w.partition)).or_default().push(w.event_id.clone());
    }
    out
}
