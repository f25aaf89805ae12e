//! The produce window: the one place records wait between "routed" and "acknowledged".
//!
//! The stream and the snapshot both hand records to a [`ProduceWindow`] and take back
//! [`Event`]s; the window owns the producer, the in-flight accounting, the
//! first-record-per-topic barrier and the stall watchdog. It is driven, never
//! re-entered: [`ProduceWindow::enqueue`] only queues, and [`ProduceWindow::next_event`]
//! sends what may be sent and then waits for one delivery report.
//!
//! Invariants:
//! - Records leave the queue in the order they were enqueued.
//! - The barriers ([`super::barrier`]): the first record for a topic (since this producer
//!   was created) is sent with nothing else of its topic in flight, and nothing of its
//!   topic is sent after it until its report arrives (first records of other new topics
//!   go beside it); the first record for each partition is sent with nothing else of its
//!   partition in flight, and nothing else of its partition follows it until its report;
//!   a record marked alone ([`ProduceWindow::enqueue_alone`]) goes with nothing else in
//!   flight. A record that must wait stops the queue (records leave it in order). A
//!   first-of-its-topic or alone record is sent at once, not after `linger.ms`
//!   ([`Sink::send_alone_now`]): nothing of its own can join its batch.
//! - The in-flight counts drop on every report, whatever its outcome, so a rejected
//!   record never holds the window (a dead letter for it can always go).
//! - Memory: the queue holds at most the records routed from one WAL message plus
//!   their dead letters (callers read WAL only while [`ProduceWindow::has_room`]); in
//!   flight is bounded by the limits the caller checks.
//! - [`ProduceWindow::next_event`] is cancel-safe: a record is out of the queue only
//!   once librdkafka took it, and reports are taken from a channel.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use router::Record;
use tokio::sync::mpsc;

use super::barrier::{Barriers, Gate};
use super::sink::{KafkaSink, Original, Outcome, Report, SendError, Sink};
use super::Rejection;
use crate::error::{ErrorKind, PipelineError};
use crate::telemetry::metrics::KafkaMetrics;
use crate::telemetry::Health;

/// How long records may wait without any acknowledgement before the producer is given
/// its bootstrap servers again ([`Sink::rebootstrap`]), and how often that repeats.
const REBOOTSTRAP_AFTER: Duration = Duration::from_secs(5);

/// How much may be in flight, and how long Kafka may stay silent.
#[derive(Debug, Clone, Copy)]
pub struct WindowLimits {
    pub max_records: u64,
    pub max_bytes: u64,
    /// No report for this long while records wait: the producer is stuck.
    pub delivery_timeout: Duration,
}

/// A record on its way, tagged with what it stands for (`T`: the caller's identity
/// of the record, e.g. its transaction).
#[derive(Debug)]
pub struct Outgoing<T> {
    pub record: Record,
    /// Used when the record has no timestamp of its own (the commit time).
    pub timestamp_ms: Option<i64>,
    pub tag: T,
    /// `Some(class)`: this is a dead letter for a record rejected with `class`.
    pub dead_letter: Option<Arc<str>>,
}

/// What became of a record.
#[derive(Debug)]
pub enum Event<T> {
    /// Acknowledged (acks=all), at this topic, partition and offset. A dead letter's
    /// acknowledgement is counted in `walpost_dead_letters_total` here.
    Delivered { tag: T, dead_letter: bool, topic: Arc<str>, partition: i32, offset: i64 },
    /// Kafka will never take it. `producer_fatal`: the producer stopped for good
    /// because of it (the gap-less guarantee) and will deliver nothing more.
    Rejected {
        tag: T,
        rejection: Rejection,
        original: Box<Original>,
        dead_letter: bool,
        producer_fatal: Option<String>,
        /// The record was in flight alone: a refusal is about it, not a batch it shared.
        alone: bool,
    },
    /// Not delivered now; a new producer must send it again.
    Failed { tag: T, error: String },
}

struct InFlight<T> {
    tag: T,
    /// The barrier it went through.
    gate: Gate,
    bytes: u64,
    topic: Arc<str>,
    dead_letter: Option<Arc<str>>,
}

/// See the module docs. `S`: the producer (librdkafka's, or a test's).
pub struct ProduceWindow<T, S: Sink = KafkaSink> {
    /// `None` once closed.
    sink: Option<S>,
    reports: mpsc::UnboundedReceiver<Report>,
    limits: WindowLimits,
    queue: VecDeque<Outgoing<T>>,
    /// How many of the queue's first records go alone (see [`ProduceWindow::enqueue_alone`]).
    alone_marks: VecDeque<bool>,
    /// In-flight records by sequence number: `slots[seq - front_seq]`.
    slots: VecDeque<Option<InFlight<T>>>,
    front_seq: u64,
    records: u64,
    bytes: u64,
    /// The sequence number of a record in flight alone.
    alone: Option<u64>,
    /// Records in flight as the first of their topic.
    first_in_topic: u32,
    barriers: Barriers,
    /// When the window was made: the barriers' clock.
    created: Instant,
    /// librdkafka's implicit-acknowledgement line, once seen: from then on no delivery
    /// report counts (see [`Outcome::ImplicitlyAcked`]).
    doubt: Option<String>,
    /// librdkafka's queue was full at the last send attempt.
    queue_full: bool,
    /// The last report, or when records started waiting after none did.
    last_progress: Instant,
    /// Reports received; `last_progress`, the gauges and the health are brought up to
    /// date from it by [`ProduceWindow::sync_state`] (at the watchdog's checks), not per
    /// report: a clock read per record costs more than the record's bookkeeping.
    reported: u64,
    reported_at_sync: u64,
    /// Kafka answered (delivered or refused) since the last sync.
    answered: bool,
    /// When [`Sink::rebootstrap`] last ran (a stall of [`REBOOTSTRAP_AFTER`]).
    last_rebootstrap: Option<Instant>,
    metrics: KafkaMetrics,
    health: Arc<Health>,
}

impl<T, S: Sink> std::fmt::Debug for ProduceWindow<T, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProduceWindow")
            .field("queued", &self.queue.len())
            .field("in_flight", &self.records)
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl<T, S: Sink> ProduceWindow<T, S> {
    pub fn new(
        sink: S,
        reports: mpsc::UnboundedReceiver<Report>,
        limits: WindowLimits,
        metrics: KafkaMetrics,
        health: Arc<Health>,
    ) -> ProduceWindow<T, S> {
        ProduceWindow {
            sink: Some(sink),
            reports,
            limits,
            queue: VecDeque::new(),
            alone_marks: VecDeque::new(),
            slots: VecDeque::new(),
            front_seq: 0,
            records: 0,
            bytes: 0,
            alone: None,
            first_in_topic: 0,
            barriers: Barriers::default(),
            created: Instant::now(),
            doubt: None,
            queue_full: false,
            last_progress: Instant::now(),
            reported: 0,
            reported_at_sync: 0,
            answered: false,
            last_rebootstrap: None,
            metrics,
            health,
        }
    }

    /// Whether the caller may produce more records (read more WAL): nothing queued and
    /// the in-flight records and bytes under their limits.
    pub fn has_room(&self) -> bool {
        self.queue.is_empty() && self.records < self.limits.max_records && self.bytes < self.limits.max_bytes
    }

    /// Nothing queued, nothing in flight.
    pub fn is_idle(&self) -> bool {
        self.queue.is_empty() && self.records == 0
    }

    /// Records handed to the producer and not yet reported on.
    pub fn in_flight(&self) -> u64 {
        self.records
    }

    /// Queues a record; [`ProduceWindow::next_event`] sends it when it may go.
    pub fn enqueue(&mut self, out: Outgoing<T>) {
        if self.is_idle() {
            // Nothing was waiting: the silence the watchdog measures starts now.
            self.last_progress = Instant::now();
        }
        self.queue.push_back(out);
        self.alone_marks.push_back(false);
    }

    /// Queues a record that goes alone: sent only when nothing is in flight, and nothing
    /// after it until its report. For records of a batch the broker refused: a refusal
    /// of a record in flight alone is about that record.
    pub fn enqueue_alone(&mut self, out: Outgoing<T>) {
        self.enqueue(out);
        if let Some(last) = self.alone_marks.back_mut() {
            *last = true;
        }
    }

    /// Takes the queue's first record and whether it goes alone.
    fn pop_queued(&mut self) -> Option<(Outgoing<T>, bool)> {
        let out = self.queue.pop_front()?;
        Some((out, self.alone_marks.pop_front().unwrap_or(false)))
    }

    /// Sends what may be sent, then waits for one report (no timer: the watchdog is
    /// [`ProduceWindow::check_stalled`], or [`ProduceWindow::next_event_within`]).
    /// Call only when not [`ProduceWindow::is_idle`] (it would wait forever).
    pub async fn next_event(&mut self) -> Result<Event<T>, PipelineError> {
        loop {
            if let Some(event) = self.send_queued() {
                return Ok(event);
            }
            if let Some(event) = self.wait_report().await? {
                return Ok(event);
            }
        }
    }

    /// Hands every queued record to librdkafka, waiting for reports while the barrier
    /// or librdkafka's full queue holds them back (and at most until the watchdog's
    /// delivery timeout). `Some(event)`: a report came first; handle it and call again.
    /// `None`: the queue is empty. Exactly-once needs this before a commit: a record
    /// still queued would be sent after it, outside any transaction.
    pub async fn send_queue(&mut self) -> Result<Option<Event<T>>, PipelineError> {
        self.sync_state();
        let deadline = tokio::time::Instant::from_std(self.last_progress + self.limits.delivery_timeout);
        loop {
            if let Some(event) = self.send_queued() {
                return Ok(Some(event));
            }
            if self.queue.is_empty() {
                return Ok(None);
            }
            match tokio::time::timeout_at(deadline, self.wait_report()).await {
                Ok(Ok(Some(event))) => return Ok(Some(event)),
                Ok(Ok(None)) => {}
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(self.stalled()),
            }
        }
    }

    /// A report that has arrived already, without waiting (`None`: none has).
    pub fn try_event(&mut self) -> Option<Event<T>> {
        while let Ok(report) = self.reports.try_recv() {
            if let Some(event) = self.on_report(report) {
                return Some(event);
            }
        }
        None
    }

    /// Waits for one report (a few milliseconds when librdkafka's queue was full, so
    /// the caller can send again); `None` when none came or it was about nothing.
    async fn wait_report(&mut self) -> Result<Option<Event<T>>, PipelineError> {
        let report = if self.queue_full {
            match tokio::time::timeout(Duration::from_millis(5), self.reports.recv()).await {
                Ok(report) => report,
                Err(_) => return Ok(None),
            }
        } else {
            self.reports.recv().await
        };
        match report {
            Some(report) => Ok(self.on_report(report)),
            None => Err(PipelineError::transient(ErrorKind::Kafka, "the Kafka client stopped reporting deliveries")),
        }
    }

    /// [`ProduceWindow::next_event`], ended by the watchdog when Kafka acknowledges
    /// nothing for the delivery timeout (for callers without a periodic check).
    pub async fn next_event_within(&mut self) -> Result<Event<T>, PipelineError> {
        self.sync_state();
        let deadline = tokio::time::Instant::from_std(self.last_progress + self.limits.delivery_timeout);
        match tokio::time::timeout_at(deadline, self.next_event()).await {
            Ok(event) => event,
            Err(_) => Err(self.stalled()),
        }
    }

    /// The watchdog: `Err` when records wait and Kafka has acknowledged nothing for the
    /// delivery timeout (restart the producer).
    pub fn check_stalled(&mut self) -> Result<(), PipelineError> {
        self.sync_state();
        if self.is_idle() {
            return Ok(());
        }
        let waited = self.last_progress.elapsed();
        if waited >= self.limits.delivery_timeout {
            return Err(self.stalled());
        }
        if waited >= REBOOTSTRAP_AFTER && self.last_rebootstrap.is_none_or(|at| at.elapsed() >= REBOOTSTRAP_AFTER) {
            let first_of_stall = self.last_rebootstrap.is_none();
            self.last_rebootstrap = Some(Instant::now());
            if let Some(sink) = &self.sink {
                sink.rebootstrap();
                if first_of_stall {
                    tracing::info!(
                        waited_s = waited.as_secs(),
                        records = self.records,
                        "Kafka acknowledged nothing while records waited; the producer was given the bootstrap servers again (repeated every 5 s until Kafka acknowledges)"
                    );
                }
            }
        }
        Ok(())
    }

    fn stalled(&self) -> PipelineError {
        PipelineError::transient(
            ErrorKind::Kafka,
            format!(
                "Kafka acknowledged no record for {} s while {} records waited; restarting the producer",
                self.last_progress.elapsed().as_secs(),
                self.records + self.queue.len() as u64
            ),
        )
    }

    /// Hands queued records to librdkafka now, while the barrier allows, without waiting
    /// for anything. A record refused on the spot comes back as an event.
    pub fn pump(&mut self) -> Option<Event<T>> {
        self.send_queued()
    }

    fn send_queued(&mut self) -> Option<Event<T>> {
        self.queue_full = false;
        let mut sent_alone = false;
        let mut sent_first = false;
        while let Some(next) = self.queue.front() {
            if self.alone.is_some() {
                break;
            }
            let Some(sink) = &mut self.sink else { break };
            let marked_alone = self.alone_marks.front().copied().unwrap_or(false);
            let placement = sink.placement(&next.record);
            let Some(gate) = self.barriers.gate(&next.record.topic, placement, marked_alone, self.records > 0) else {
                break;
            };
            let seq = self.front_seq + self.slots.len() as u64;
            match sink.send(seq, &next.record, next.timestamp_ms) {
                Ok(()) => {}
                Err(SendError::QueueFull) => {
                    self.queue_full = true;
                    break;
                }
                Err(SendError::Rejected(rejection)) => {
                    let (out, _) = self.pop_queued()?;
                    self.metrics.produce_error("rejected");
                    let original = Box::new(Original::of(&out.record));
                    return Some(Event::Rejected {
                        tag: out.tag,
                        rejection,
                        original,
                        dead_letter: out.dead_letter.is_some(),
                        producer_fatal: None,
                        alone: true,
                    });
                }
                Err(SendError::Retryable(error)) => {
                    let (out, _) = self.pop_queued()?;
                    self.metrics.produce_error("retryable");
                    return Some(Event::Failed {
                        tag: out.tag,
                        error: format!("cannot hand a record to Kafka: {error}"),
                    });
                }
            }
            let (out, _) = self.pop_queued()?;
            let bytes = out.record.value.as_ref().map_or(0, |v| v.len() as u64);
            if self.records == 0 {
                self.last_progress = Instant::now();
            }
            self.records += 1;
            self.bytes += bytes;
            self.barriers.sent(&out.record.topic, gate);
            match gate {
                Gate::Alone => {
                    self.alone = Some(seq);
                    sent_alone = true;
                }
                Gate::FirstInTopic => {
                    self.first_in_topic += 1;
                    sent_alone = true;
                }
                Gate::FirstInPartition(_) => sent_first = true,
                Gate::Open => {}
            }
            self.slots.push_back(Some(InFlight {
                tag: out.tag,
                gate,
                bytes,
                topic: out.record.topic,
                dead_letter: out.dead_letter,
            }));
        }
        // Nothing follows a record sent alone until its report: lingering for company
        // would only delay everything behind it.
        if let (true, Some(sink)) = (sent_alone, &self.sink) {
            sink.send_alone_now();
        } else if let (true, Some(sink)) = (sent_first, &self.sink) {
            // A partition's first record holds back what follows it in its partition.
            sink.send_now();
        }
        None
    }

    /// Asks the producer to send what it holds without waiting for `linger.ms`
    /// ([`Sink::send_now`]).
    pub fn send_now(&self) {
        if let Some(sink) = &self.sink {
            sink.send_now();
        }
    }

    /// How many records this window has handed to the producer so far.
    pub fn handed_over(&self) -> u64 {
        self.front_seq + self.slots.len() as u64
    }

    fn on_report(&mut self, report: Report) -> Option<Event<T>> {
        if let Outcome::ImplicitlyAcked { line } = &report.outcome {
            tracing::warn!(
                "librdkafka counted records as delivered because a later batch of their partition was ({line}); they may never have been written, so no report of this producer counts as an acknowledgement any more: restarting from the last confirmed position"
            );
            self.doubt = Some(line.clone());
            return None;
        }
        let index = usize::try_from(report.seq.checked_sub(self.front_seq)?).ok()?;
        let flight = self.slots.get_mut(index)?.take()?;
        while matches!(self.slots.front(), Some(None)) {
            self.slots.pop_front();
            self.front_seq += 1;
        }
        self.reported += 1;
        self.records -= 1;
        self.bytes = self.bytes.saturating_sub(flight.bytes);
        if !matches!(report.outcome, Outcome::Retryable { .. }) {
            // Kafka answered (a purged or failed record is no answer: it is sent again).
            self.answered = true;
        }
        let was_alone = self.alone == Some(report.seq);
        if was_alone {
            self.alone = None;
        }
        if flight.gate == Gate::FirstInTopic {
            self.first_in_topic = self.first_in_topic.saturating_sub(1);
        }
        if matches!(flight.gate, Gate::Alone | Gate::FirstInTopic) && self.alone.is_none() && self.first_in_topic == 0 {
            if let Some(sink) = &self.sink {
                sink.alone_answered();
            }
        }
        let dead_letter = flight.dead_letter.is_some();
        let outcome = match (report.outcome, &self.doubt) {
            (Outcome::Delivered { .. }, Some(line)) => Outcome::Retryable {
                error: format!("its delivery report follows librdkafka's implicit acknowledgement ({line})"),
            },
            (outcome, _) => outcome,
        };
        let delivered = match &outcome {
            Outcome::Delivered { partition, .. } => Some(*partition),
            _ => None,
        };
        self.barriers.answered(&flight.topic, flight.gate, delivered);
        let event = match outcome {
            Outcome::Delivered { partition, offset } => {
                if let Some(class) = &flight.dead_letter {
                    self.metrics.dead_letter(class);
                }
                Event::Delivered { tag: flight.tag, dead_letter, topic: flight.topic, partition, offset }
            }
            Outcome::Rejected { rejection, original } => Event::Rejected {
                tag: flight.tag,
                rejection,
                original,
                dead_letter,
                producer_fatal: self.producer_fatal(),
                alone: matches!(flight.gate, Gate::Alone | Gate::FirstInTopic),
            },
            Outcome::Retryable { error } => {
                Event::Failed { tag: flight.tag, error: format!("Kafka did not acknowledge a record ({error})") }
            }
            // Handled above (no record's report).
            Outcome::ImplicitlyAcked { .. } => return None,
        };
        Some(event)
    }

    /// In-flight gauge, and the health's "waiting for acknowledgements" clock started
    /// when records wait. Only reports move or stop it (`on_report`): a new window that
    /// is idle because its predecessor's records are not re-sent yet must not reset
    /// Kafka's silence.
    fn publish_state(&self) {
        self.metrics.in_flight.set(i64::try_from(self.records).unwrap_or(i64::MAX));
        if self.records > 0 {
            self.health.waiting_for_acks();
        }
    }

    /// Brings the watchdog's clock, the in-flight gauge and the health up to date with
    /// the reports received since the last call.
    pub fn sync_state(&mut self) {
        let minutes = self.created.elapsed().as_secs() / 60;
        self.barriers.set_minute(u32::try_from(minutes).unwrap_or(u32::MAX));
        if self.reported != self.reported_at_sync {
            self.reported_at_sync = self.reported;
            self.last_progress = Instant::now();
            self.last_rebootstrap = None;
        }
        if std::mem::take(&mut self.answered) {
            self.health.kafka_progress(self.records > 0);
        }
        self.publish_state();
    }

    /// The producer (`None` once closed).
    pub fn sink(&self) -> Option<&S> {
        self.sink.as_ref()
    }

    /// The producer stopped for good (see [`Event::Rejected`]).
    pub fn producer_fatal(&self) -> Option<String> {
        self.sink.as_ref().and_then(S::fatal_error)
    }

    /// Waits (at most `timeout`) for what is in flight, handing each event to
    /// `on_event`; queued records are not sent. Returns the tags of records never
    /// reported on, queued ones included.
    pub async fn drain(&mut self, timeout: Duration, mut on_event: impl FnMut(Event<T>)) -> Vec<T> {
        let deadline = tokio::time::Instant::now() + timeout;
        while self.records > 0 && self.producer_fatal().is_none() {
            match tokio::time::timeout_at(deadline, self.reports.recv()).await {
                Ok(Some(report)) => {
                    if let Some(event) = self.on_report(report) {
                        on_event(event);
                    }
                }
                Ok(None) | Err(_) => break,
            }
        }
        self.take_unreported()
    }

    /// Closes the producer off the runtime (flushing at most `timeout`), hands every
    /// report that arrived to `on_event`, and returns the tags of records that were
    /// never reported on (they may or may not be in Kafka).
    pub async fn close(mut self, timeout: Duration, mut on_event: impl FnMut(Event<T>)) -> Vec<T> {
        if let Some(sink) = self.sink.take() {
            sink.close(timeout).await;
        }
        while let Ok(report) = self.reports.try_recv() {
            if let Some(event) = self.on_report(report) {
                on_event(event);
            }
        }
        // The health's clock keeps running: the records left here are sent again by the
        // next producer (`stream::run` stops the clock when no such restart follows).
        self.metrics.in_flight.set(0);
        self.take_unreported()
    }

    fn take_unreported(&mut self) -> Vec<T> {
        let mut left: Vec<T> = self.slots.drain(..).flatten().map(|f| f.tag).collect();
        left.extend(self.queue.drain(..).map(|out| out.tag));
        self.alone_marks.clear();
        self.records = 0;
        self.bytes = 0;
        self.alone = None;
        self.first_in_topic = 0;
        left
    }
}

#[cfg(test)]
mod tests;
