//! A producer for unit tests: an in-memory model of librdkafka and a broker, driven by
//! the test, with the behaviour that matters to the produce window.
//!
//! Records handed over wait until the test answers them ([`ModelSink::answer`]). The
//! model partitions a record by its key (or its own partition) once it has seen the
//! topic, and writes each partition's records in the order they were handed over. A
//! partition where the modelled producer has not written yet behaves as a real broker
//! and librdkafka together do (issue 26): its first batch fails with a retriable error;
//! if a later record of the partition was handed over meanwhile, that later batch is
//! written and the first is reported delivered without being written (librdkafka's
//! implicit acknowledgement); if not, the first is retried and written.
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
pub const PARTITIONS: i32 = 3;

/// A record as the model wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
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
    /// Event ids refused for good.
    refused: BTreeSet<String>,
    handed_over: u64,
}

/// See the module docs. Clones share the model.
#[derive(Debug, Clone)]
pub struct ModelSink {
    state: Arc<Mutex<State>>,
    reports: mpsc::UnboundedSender<Report>,
}

/// The partition the model gives `key`.
pub fn partition_for(key: &[u8]) -> i32 {
    let sum: u32 = key.iter().map(|b| u32::from(*b)).sum();
    i32::try_from(sum % PARTITIONS.unsigned_abs()).unwrap_or(0)
}

impl ModelSink {
    pub fn new() -> (ModelSink, mpsc::UnboundedReceiver<Report>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (ModelSink { state: Arc::default(), reports: tx }, rx)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Refuse the record with this event id for good.
    pub fn refuse(&self, event_id: &str) {
        self.state().refused.insert(event_id.to_owned());
    }

    /// Answers every record handed over and not answered yet, partition by partition.
    pub fn answer(&self) {
        let mut state = self.state();
        let pending = std::mem::take(&mut state.pending);
        let mut by_partition: BTreeMap<(String, i32), Vec<Pending>> = BTreeMap::new();
        for p in pending {
            by_partition.entry((p.topic.clone(), p.partition)).or_default().push(p);
        }
        for (key, records) in by_partition {
            let fresh = !state.established.contains(&key);
            let implicit = fresh && records.len() > 1;
            for (i, p) in records.into_iter().enumerate() {
                let written = Written { topic: p.topic.clone(), partition: p.partition, event_id: p.event_id.clone() };
                let outcome = if state.refused.contains(&p.event_id) {
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
    pub fn announce_implicit_ack(&self) {
        let line = "t [2] 1 message(s) implicitly acked by subsequent batch success".to_owned();
        let _ = self.reports.send(Report { seq: super::sink::NO_RECORD, outcome: Outcome::ImplicitlyAcked { line } });
    }

    /// Records written, in order.
    pub fn written(&self) -> Vec<Written> {
        self.state().written.clone()
    }

    /// Records reported delivered that were never written.
    pub fn lost(&self) -> Vec<Written> {
        self.state().lost.clone()
    }

    /// Records handed over so far.
    pub fn handed_over(&self) -> u64 {
        self.state().handed_over
    }

    /// Records handed over and not answered.
    pub fn pending(&self) -> usize {
        self.state().pending.len()
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
}

/// Counts per key of `written`, for order checks: key -> event ids in written order.
pub fn by_partition(written: &[Written]) -> HashMap<(String, i32), Vec<String>> {
    let mut out: HashMap<(String, i32), Vec<String>> = HashMap::new();
    for w in written {
        out.entry((w.topic.clone(), w.partition)).or_default().push(w.event_id.clone());
    }
    out
}
