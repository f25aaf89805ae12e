//! The Kafka side of `walpost inbox`: a librdkafka consumer on a thread of its own,
//! handing records to the ingest (`inbox/mod.rs`) over a bounded channel, and serving
//! rebalances by asking the ingest first.
//!
//! Invariants:
//! - a partition is assigned at the offset stored in PostgreSQL (asked for in the
//!   rebalance callback, before `incremental_assign`), never at Kafka's committed offset:
//!   Kafka commits, made after each PostgreSQL commit, are for lag dashboards only;
//! - a revocation returns to librdkafka only after the ingest wrote every record of the
//!   revoked partitions it had (the next owner reads the offsets written with them);
//! - the channel is bounded, in records and in bytes (each record holds its key, headers
//!   and value of a [`ByteBudget`] until the ingest dropped it), and librdkafka's prefetch
//!   queue too (`queued.min.messages` = 1: one fetch at most), so memory stays bounded
//!   under any backlog and whatever the records' sizes;
//! - nothing of a record's key, value or headers is logged.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc as std_mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::types::{RDKafkaErrorCode, RDKafkaRespErr};
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};
use tokio::sync::mpsc;

use crate::budget::{ByteBudget, Held};
use crate::ingest::Partition;
use crate::metrics::InboxMetrics;
use crate::record::Record;
use crate::settings::{InboxSettings, Subscription};
use kafka_common::throttle::{left_out_note, LogThrottle};
use kafka_common::Role;

/// How long one poll waits, and so how soon a stop is seen.
const POLL: Duration = Duration::from_millis(100);

/// Where an assigned partition starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Start {
    /// The offset stored in PostgreSQL.
    Stored(i64),
    Beginning,
    End,
}

/// What the consumer thread tells the ingest.
#[derive(Debug)]
pub(crate) enum Event {
    /// A record, holding its bytes of the channel's budget until it is dropped.
    Record(Record, Held),
    /// Partitions are being assigned: answer where each starts.
    Assigned { partitions: Vec<Partition>, reply: std_mpsc::SyncSender<Vec<(Partition, Start)>> },
    /// Partitions are being revoked: answer once their records are written.
    Revoked { partitions: Vec<Partition>, reply: std_mpsc::SyncSender<()> },
    /// The consumer cannot go on (a fatal librdkafka error, an assignment it cannot make).
    Fatal(String),
}

/// Properties walpost sets on the consumer; the user's `[kafka.properties]` and
/// `--kafka-property` may change them except where `kafka_common::refusal` says.
pub(crate) const DEFAULTS: &[(&str, &str)] = &[
    ("isolation.level", "read_committed"),
    ("partition.assignment.strategy", "cooperative-sticky"),
    ("enable.auto.commit", "false"),
    ("enable.auto.offset.store", "false"),
    // A stored offset Kafka no longer holds (retention deleted it) restarts at the log's start.
    ("auto.offset.reset", "earliest"),
    ("client.id", "walpost-inbox"),
    // Bounded prefetch: at most 2 MiB queued per consumer, whatever the backlog. 4 MiB
    // gave the same rate and 6 MB more peak RSS (bench/inbox.sh: 27.7k records/s at 50.2 MB
    // against 28.2k at 44.0 MB; the ingest waits on PostgreSQL, not on Kafka).
    ("queued.max.messages.kbytes", "2048"),
    ("fetch.max.bytes", "2097152"),
    // librdkafka counts only values in queued.max.messages.kbytes, not keys or headers:
    // 800 records with 250 KB keys and 2-byte values were all prefetched (200 MB). So it
    // fetches again only once its queue is empty: one fetch (fetch.max.bytes, or one
    // larger record) per broker is queued at most, whatever the keys. The channel to the
    // ingest (2,048 records, batch_max_bytes) keeps the ingest busy meanwhile.
    ("queued.min.messages", "1"),
    // librdkafka waits this long (default 1 s) before fetching again once its queue was
    // full: with a bounded queue the consumer then ran dry for up to 1 s at a time
    // (bench/inbox.sh: 17k records/s before, 19k after, on 2 shared cores).
    ("fetch.queue.backoff.ms", "10"),
    ("reconnect.backoff.max.ms", "1000"),
];

/// The consumer thread and what stops it.
#[derive(Debug)]
pub(crate) struct ConsumerThread {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
    commits: std_mpsc::Sender<Vec<(Partition, i64)>>,
}

impl ConsumerThread {
    /// Asks the thread to stop: it leaves the group (revoking its partitions through the
    /// ingest) and ends, which closes the channel.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Kafka offset commits for dashboards, after PostgreSQL committed them.
    pub(crate) fn commit(&self, offsets: Vec<(Partition, i64)>) {
        let _ = self.commits.send(offsets);
    }

    /// Whether [`Self::stop`] was called.
    pub(crate) fn asked_to_stop(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Stops the thread and waits for it: `Some(message)` when it panicked.
    pub(crate) fn join(mut self) -> Option<String> {
        self.stop();
        let panic = self.handle.take()?.join().err()?;
        let message = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".to_owned());
        Some(message)
    }
}

/// The librdkafka configuration of the consumer, or the property refused.
pub(crate) fn client_config(s: &InboxSettings) -> Result<ClientConfig, String> {
    let mut cfg = kafka_common::client_config(Role::Consumer, &s.brokers, &s.properties).map_err(|e| e.to_string())?;
    for (k, v) in DEFAULTS.iter().filter(|(k, _)| !s.properties.contains_key(*k)) {
        cfg.set(*k, *v);
    }
    cfg.set("group.id", &s.group);
    cfg.set("statistics.interval.ms", s.stats_interval.as_millis().to_string());
    Ok(cfg)
}

/// Starts the consumer thread: it subscribes and sends [`Event`]s to `events`.
pub(crate) fn start(
    s: &InboxSettings,
    events: mpsc::Sender<Event>,
    budget: Arc<ByteBudget>,
    metrics: InboxMetrics,
) -> Result<ConsumerThread, String> {
    let cfg = client_config(s)?;
    let context = InboxContext { events: events.clone(), metrics, throttle: LogThrottle::default() };
    let consumer: BaseConsumer<InboxContext> =
        cfg.create_with_context(context).map_err(|e| format!("cannot create the Kafka consumer: {e}"))?;
    let subscription: Vec<String> = match &s.subscription {
        Subscription::Topics(t) => t.clone(),
        // librdkafka reads a subscription starting with ^ as a regular expression.
        Subscription::Regex(r) => vec![if r.starts_with('^') { r.clone() } else { format!("^{r}") }],
    };
    let names: Vec<&str> = subscription.iter().map(String::as_str).collect();
    consumer.subscribe(&names).map_err(|e| format!("cannot subscribe to {}: {e}", subscription.join(", ")))?;
    let stop = Arc::new(AtomicBool::new(false));
    let (commits, commit_rx) = std_mpsc::channel();
    let thread_stop = stop.clone();
    let handle = std::thread::Builder::new()
        .name("walpost-inbox-consumer".into())
        .spawn(move || poll_loop(consumer, events, &budget, commit_rx, thread_stop))
        .map_err(|e| format!("cannot start the consumer thread: {e}"))?;
    Ok(ConsumerThread { stop, handle: Some(handle), commits })
}

fn poll_loop(
    consumer: BaseConsumer<InboxContext>,
    events: mpsc::Sender<Event>,
    budget: &Arc<ByteBudget>,
    commits: std_mpsc::Receiver<Vec<(Partition, i64)>>,
    stop: Arc<AtomicBool>,
) {
    // One Arc<str> per topic name: records share it instead of copying the name.
    let mut topics: HashMap<String, Arc<str>> = HashMap::new();
    while !stop.load(Ordering::Relaxed) {
        while let Ok(offsets) = commits.try_recv() {
            let mut tpl = TopicPartitionList::new();
            for ((t, p), next) in &offsets {
                let _ = tpl.add_partition_offset(t, *p, Offset::Offset(*next));
            }
            // Dashboards only; a partition revoked meanwhile fails here harmlessly.
            let _ = consumer.commit(&tpl, CommitMode::Async);
        }
        match consumer.poll(POLL) {
            None => {}
            Some(Ok(m)) => {
                // Tests: the thread ending (or panicking) without being asked to.
                #[cfg(feature = "failpoints")]
                fail::fail_point!("inbox-consumer-record", |_| {});
                let topic = match topics.get(m.topic()) {
                    Some(t) => t.clone(),
                    None => {
                        let t: Arc<str> = m.topic().into();
                        topics.insert(m.topic().to_owned(), t.clone());
                        t
                    }
                };
                // As bytes: rust-rdkafka's `Headers` panics on a name that is not UTF-8.
                let headers = kafka_common::headers::raw(&m)
                    .into_iter()
                    .map(|(name, value)| (Bytes::copy_from_slice(name), value.map(Bytes::copy_from_slice)))
                    .collect();
                let record = Record {
                    topic,
                    partition: m.partition(),
                    offset: m.offset(),
                    key: m.key().map(Bytes::copy_from_slice),
                    value: m.payload().map(Bytes::copy_from_slice),
                    headers,
                    timestamp_ms: m.timestamp().to_millis(),
                };
                // Waits while the records in flight hold the whole budget.
                let Some(held) = budget.acquire(record.bytes(), &stop) else { break };
                if events.blocking_send(Event::Record(record, held)).is_err() {
                    break;
                }
            }
            Some(Err(e)) => {
                if let Some(fatal) = fatal_message(&e) {
                    let _ = events.blocking_send(Event::Fatal(fatal));
                    break;
                }
                consumer.context().warn_rarely(&e);
            }
        }
    }
    // Dropping the consumer closes it: it leaves the group, revoking through the ingest.
    drop(consumer);
}

fn fatal_message(e: &KafkaError) -> Option<String> {
    let code = e.rdkafka_error_code()?;
    matches!(code, RDKafkaErrorCode::Fatal | RDKafkaErrorCode::GroupAuthorizationFailed).then(|| {
        format!("the Kafka consumer stopped: {e} (check the brokers, the group's ACLs and [kafka.properties])")
    })
}

/// The consumer's context: rebalances go through the ingest.
struct InboxContext {
    events: mpsc::Sender<Event>,
    metrics: InboxMetrics,
    /// Consumer errors (they repeat every poll) and librdkafka's log lines (a failure that
    /// lasts, such as a refused SASL handshake, every few hundred ms): each kind logged
    /// once per window, as the producer's are.
    throttle: LogThrottle,
}

impl InboxContext {
    fn warn_rarely(&self, e: &KafkaError) {
        let kind = format!("{:?}", e.rdkafka_error_code());
        if let Some(n) = self.throttle.admit("poll", &kind, Instant::now()) {
            // A deleted topic's partitions report UnknownTopicOrPartition here; the
            // group drops them at its next rebalance.
            tracing::warn!("Kafka consumer: {e}{}", left_out_note(n));
        }
    }

    fn partitions(tpl: &TopicPartitionList) -> Vec<Partition> {
        tpl.elements().iter().map(|e| (Arc::from(e.topic()), e.partition())).collect()
    }

    fn assign(&self, c: &BaseConsumer<Self>, tpl: &TopicPartitionList) {
        let partitions = Self::partitions(tpl);
        let (reply, answer) = std_mpsc::sync_channel(1);
        let starts = match self.events.blocking_send(Event::Assigned { partitions, reply }) {
            Ok(()) => answer.recv().ok(),
            Err(_) => None,
        };
        // No answer: the ingest is stopping. Assign nothing it would not store.
        let Some(starts) = starts else { return };
        let mut with = TopicPartitionList::new();
        for ((t, p), start) in &starts {
            let offset = match start {
                Start::Stored(n) => Offset::Offset(*n),
                Start::Beginning => Offset::Beginning,
                Start::End => Offset::End,
            };
            let _ = with.add_partition_offset(t, *p, offset);
        }
        let assigned = match c.rebalance_protocol() {
            RebalanceProtocol::Cooperative => c.incremental_assign(&with),
            _ => c.assign(&with),
        };
        if let Err(e) = assigned {
            let _ = self.events.blocking_send(Event::Fatal(format!("cannot take the assigned partitions: {e}")));
        }
        let stored: BTreeMap<String, usize> = starts.iter().fold(BTreeMap::new(), |mut m, ((t, _), _)| {
            *m.entry(t.to_string()).or_default() += 1;
            m
        });
        tracing::info!(partitions = ?stored, "partitions assigned, each at its offset stored in PostgreSQL");
    }

    fn revoke(&self, c: &BaseConsumer<Self>, tpl: &TopicPartitionList) {
        let partitions = Self::partitions(tpl);
        let (reply, answer) = std_mpsc::sync_channel(1);
        if self.events.blocking_send(Event::Revoked { partitions: partitions.clone(), reply }).is_ok() {
            let _ = answer.recv();
        }
        for (t, p) in &partitions {
            self.metrics.forget_partition(t, *p);
        }
        let revoked = match c.rebalance_protocol() {
            RebalanceProtocol::Cooperative => c.incremental_unassign(tpl),
            _ => c.unassign(),
        };
        if let Err(e) = revoked {
            tracing::warn!("cannot release revoked partitions: {e}");
        }
        tracing::info!(
            partitions = partitions.len(),
            lost = c.assignment_lost(),
            "partitions revoked after their records were stored"
        );
    }
}

impl ClientContext for InboxContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        kafka_common::librdkafka_line!(self.throttle, level, fac, log_message, false);
    }

    fn stats_raw(&self, statistics: &[u8]) {
        self.metrics.set_consumer_lag_from_stats(statistics);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        match self.throttle.admit("error", reason, Instant::now()) {
            Some(n) => tracing::warn!("Kafka consumer: {error}: {reason}{}", left_out_note(n)),
            None => tracing::debug!("Kafka consumer: {error}: {reason}"),
        }
    }
}

impl ConsumerContext for InboxContext {
    fn rebalance(&self, c: &BaseConsumer<Self>, err: RDKafkaRespErr, tpl: &mut TopicPartitionList) {
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => self.assign(c, tpl),
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => self.revoke(c, tpl),
            other => {
                let code: RDKafkaErrorCode = other.into();
                tracing::warn!("Kafka rebalance error: {code}; releasing the assignment");
                let _ = c.unassign();
            }
        }
    }
}
