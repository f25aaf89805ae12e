//! Handing records to librdkafka: the one module with `unsafe` calls into it.
//!
//! rust-rdkafka's `send` builds a `CString` of the topic name and lets librdkafka look
//! the topic up by name (a lock and a search of its topic list), for every record. Here
//! the topic handle is made once per topic and kept; the call is otherwise what
//! rust-rdkafka makes: librdkafka copies the payload (`RD_KAFKA_MSG_F_COPY`) and the
//! key, the delivery opaque is the record's sequence number.
//!
//! Invariants (what makes the `unsafe` calls sound):
//! - [`Handoff`] holds one application reference per topic handle and gives it back
//!   before the producer is destroyed (librdkafka's termination order: topics, then the
//!   handle); a message keeps its own reference to its topic, so clearing the cache
//!   never strands one.
//! - Every pointer handed to `rd_kafka_producev` is only read during the call:
//!   librdkafka copies payload, key and header values before it returns.
//! - Headers are built in a list the message owns once `rd_kafka_producev` succeeds; on
//!   failure they are ours and destroyed here.
//! - `SendNow`'s thread holds a producer of its own, so the client it flushes is alive
//!   for every call; the thread is stopped and joined before the producer is handed
//!   back to be destroyed.
//!
//! Partitions known before sending: every topic handle is made with a partitioner of
//! walpost's own ([`count_and_partition`]) that runs the configured librdkafka
//! partitioner and keeps the partition count it was called with, so
//! [`Handoff::placement`] can say which partition a record will go to before it is
//! handed over (the produce window's per-partition barrier needs that: see
//! `kafka::window`). The count is kept per topic name for the life of the process
//! ([`TopicCell`]), so librdkafka never calls into freed memory, whichever producer or
//! handle outlives which.
//!
//! Sending now: records of a backlog wait up to `linger.ms` (50 ms by default) to go in
//! large batches, which cuts what the broker spends per record (by up to half). A transaction read as
//! it commits should not wait: [`Handoff::send_now`] asks librdkafka to send everything it
//! holds at once. librdkafka's only way to say that is `rd_kafka_flush`, which treats
//! `linger.ms` as elapsed while some thread is inside it, and blocks; so a thread of its
//! own calls it, in slices of [`SEND_NOW_SLICE`], until every record is acknowledged or
//! the request's time is up ([`SEND_NOW_WAIT`]), and requests made meanwhile are one.

#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::{c_int, c_void, CStr, CString};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TryRecvError};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkafka::bindings as rd;
use rdkafka::bindings::rd_kafka_vtype_t::*;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{Producer, ProducerContext, ThreadedProducer};
use router::Record;

use super::barrier::Placement;

/// Topic handles kept before the cache is cleared (a topic's handle is then made again,
/// which costs one lookup).
pub(crate) const MAX_TOPIC_HANDLES: usize = 10_000;

/// How long one request to send now keeps librdkafka sending at once, unless every
/// record is acknowledged sooner: a live transaction touching many partitions goes out
/// in several waves of requests (at most 5 in flight per broker), and a wave that found
/// the flag gone would wait out `linger.ms` (50 ms by default: no longer than that).
pub(crate) const SEND_NOW_WAIT: Duration = Duration::from_millis(50);

/// The thread waits in slices of this long (one `rd_kafka_flush` call): long enough that
/// librdkafka's broker threads wake up within one on busy cores (they look at the flag
/// when they next run); the longest a stopped `SendNow` thread runs on.
pub(crate) const SEND_NOW_SLICE: Duration = Duration::from_millis(10);

/// How long a request made for a record sent alone keeps librdkafka sending at once
/// (ended sooner by its acknowledgement): the first record of a topic waits for the
/// topic's metadata (its creation, on first use) before it has a partition, and would
/// then wait for `linger.ms` if the flag were gone.
pub(crate) const SEND_ALONE_WAIT: Duration = Duration::from_secs(5);

/// The thread that makes librdkafka send now (see the module docs).
struct SendNow {
    ask: Option<SyncSender<()>>,
    /// Until when librdkafka is to send at once, in ms since `since`: requests move it
    /// later, the acknowledgement of a record sent alone moves it earlier.
    until_ms: Arc<AtomicU64>,
    since: Instant,
    thread: Option<JoinHandle<()>>,
}

impl SendNow {
    fn start<C: ProducerContext + 'static>(producer: ThreadedProducer<C>) -> SendNow {
        // One request waits; more while one waits only move the deadline.
        let (ask, asked) = sync_channel::<()>(1);
        let until_ms = Arc::new(AtomicU64::new(0));
        let since = Instant::now();
        let until = until_ms.clone();
        let slice = i32::try_from(SEND_NOW_SLICE.as_millis()).unwrap_or(i32::MAX);
        let thread = std::thread::Builder::new().name("walpost-send-now".into()).spawn(move || {
            let client = producer.client().native_ptr();
            while asked.recv().is_ok() {
                loop {
                    // SAFETY: the client is alive: `producer` (this thread's) owns a
                    // reference to it. rd_kafka_flush is thread-safe; with delivery
                    // reports as events (how rust-rdkafka sets the producer up) it only
                    // waits, it polls nothing. It treats linger.ms as elapsed while it runs.
                    let left = unsafe { rd::rd_kafka_flush(client, slice) };
                    if left == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
                        || millis_since(since) >= until.load(Ordering::Relaxed)
                    {
                        break;
                    }
                    // In slices, so that a closed channel ends the thread within one.
                    if let Err(TryRecvError::Disconnected) = asked.try_recv() {
                        return;
                    }
                }
            }
        });
        match thread {
            Ok(thread) => SendNow { ask: Some(ask), until_ms, since, thread: Some(thread) },
            Err(e) => {
                tracing::warn!(
                    "cannot start the thread that sends live transactions at once ({e}): they wait up to linger.ms"
                );
                SendNow { ask: None, until_ms, since, thread: None }
            }
        }
    }

    fn ask(&self, wait: Duration) {
        let Some(ask) = &self.ask else { return };
        self.until_ms.fetch_max(millis_since(self.since).saturating_add(millis(wait)), Ordering::Relaxed);
        // Full: a request is waiting already, and will see the new deadline.
        let _ = ask.try_send(());
    }

    /// Cuts the wait down to [`SEND_NOW_WAIT`] from now, if it is longer.
    fn shorten(&self) {
        self.until_ms.fetch_min(millis_since(self.since).saturating_add(millis(SEND_NOW_WAIT)), Ordering::Relaxed);
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn millis_since(since: Instant) -> u64 {
    millis(since.elapsed())
}

impl Drop for SendNow {
    fn drop(&mut self) {
        // Closing the channel ends the thread within one slice (SEND_NOW_SLICE).
        drop(self.ask.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A librdkafka partitioner function.
type PartitionerFn =
    unsafe extern "C" fn(*const rd::rd_kafka_topic_t, *const c_void, usize, i32, *mut c_void, *mut c_void) -> i32;

/// The partitioner `partitioner` (librdkafka's property) names, and whether it is
/// deterministic for a non-empty key (`false`: `random`, which never is) and for an
/// empty one (`consistent_random` picks at random for an empty key).
fn partitioner_named(partitioner: &str) -> (PartitionerFn, bool, bool) {
    match partitioner {
        "random" => (rd::rd_kafka_msg_partitioner_random, false, false),
        "consistent" => (rd::rd_kafka_msg_partitioner_consistent, true, true),
        "consistent_random" => (rd::rd_kafka_msg_partitioner_consistent_random, true, false),
        "murmur2" => (rd::rd_kafka_msg_partitioner_murmur2, true, true),
        "fnv1a" => (rd::rd_kafka_msg_partitioner_fnv1a, true, true),
        "fnv1a_random" => (rd::rd_kafka_msg_partitioner_fnv1a_random, true, true),
        // walpost's default, and librdkafka's answer to a name it does not know is a
        // configuration error before any handle is made.
        _ => (rd::rd_kafka_msg_partitioner_murmur2_random, true, true),
    }
}

/// What librdkafka's partitioner callback for one topic name reads and writes: the
/// partitioner to run, and the partition count of its last call (0: not called yet).
/// Made once per topic name and never freed (see the module docs); how many there can
/// be is bounded by the topics walpost may route to (`[kafka] max_topics`).
#[derive(Debug)]
struct TopicCell {
    partitioner: PartitionerFn,
    deterministic: bool,
    deterministic_empty_key: bool,
    partitions: AtomicI32,
}

/// The cell of topic `name` (made with `partitioner` the first time).
fn topic_cell(name: &str, partitioner: &str) -> &'static TopicCell {
    static CELLS: OnceLock<Mutex<HashMap<String, &'static TopicCell>>> = OnceLock::new();
    let cells = CELLS.get_or_init(Mutex::default);
    let mut cells = cells.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(cell) = cells.get(name) {
        return cell;
    }
    let (partitioner, deterministic, deterministic_empty_key) = partitioner_named(partitioner);
    let cell: &'static TopicCell = Box::leak(Box::new(TopicCell {
        partitioner,
        deterministic,
        deterministic_empty_key,
        partitions: AtomicI32::new(0),
    }));
    cells.insert(name.to_owned(), cell);
    cell
}

/// The partitioner callback of every topic handle walpost makes: keeps the count and
/// runs the configured partitioner.
///
/// # Safety
/// Called by librdkafka only, with the topic's opaque, which is a `&'static TopicCell`
/// (set in `Handoff::topic`), and the key as librdkafka holds it.
unsafe extern "C" fn count_and_partition(
    rkt: *const rd::rd_kafka_topic_t,
    key: *const c_void,
    keylen: usize,
    partition_cnt: i32,
    rkt_opaque: *mut c_void,
    msg_opaque: *mut c_void,
) -> i32 {
    // SAFETY: the opaque is a `&'static TopicCell` or null (never anything else).
    let Some(cell) = (unsafe { rkt_opaque.cast::<TopicCell>().cast_const().as_ref() }) else {
        // SAFETY: librdkafka's own partitioner, called as librdkafka calls it.
        return unsafe {
            rd::rd_kafka_msg_partitioner_murmur2_random(rkt, key, keylen, partition_cnt, ptr::null_mut(), msg_opaque)
        };
    };
    cell.partitions.store(partition_cnt, Ordering::Relaxed);
    // SAFETY: as above; the built-in partitioners read only the key and the count.
    unsafe { (cell.partitioner)(rkt, key, keylen, partition_cnt, ptr::null_mut(), msg_opaque) }
}

/// One application reference to a librdkafka topic handle, and the topic's cell.
#[derive(Debug)]
struct TopicHandle(NonNull<rd::rd_kafka_topic_t>, &'static TopicCell);

// SAFETY: librdkafka topic handles are reference counted under their own lock and may
// be used and released from any thread.
unsafe impl Send for TopicHandle {}
// SAFETY: as above; `&TopicHandle` only hands the pointer to thread-safe calls.
unsafe impl Sync for TopicHandle {}

impl Drop for TopicHandle {
    fn drop(&mut self) {
        // SAFETY: the handle came from rd_kafka_topic_new and is released once, here,
        // before the producer's client (see `Handoff`).
        unsafe { rd::rd_kafka_topic_destroy(self.0.as_ptr()) }
    }
}

/// A producer and its topic handles; hands records over.
///
/// Holding the producer here is what keeps the handles sound: a handle is made from
/// this producer's client, and the handles (declared first) are dropped before it.
pub(crate) struct Handoff<C: ProducerContext + 'static> {
    /// foldhash, not SipHash: looked up for every record.
    topics: HashMap<Arc<str>, TopicHandle, foldhash::fast::RandomState>,
    /// The `partitioner` property the producer was made with.
    partitioner: String,
    send_now: SendNow,
    producer: ThreadedProducer<C>,
}

impl<C: ProducerContext + 'static> std::fmt::Debug for Handoff<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handoff").field("topics", &self.topics.len()).finish()
    }
}

impl<C: ProducerContext + 'static> Handoff<C> {
    /// `partitioner`: the producer's `partitioner` property (librdkafka's names).
    pub(crate) fn new(producer: ThreadedProducer<C>, partitioner: &str) -> Handoff<C> {
        Handoff {
            topics: HashMap::default(),
            partitioner: partitioner.to_owned(),
            send_now: SendNow::start(producer.clone()),
            producer,
        }
    }

    /// Where `record` will be written, as far as that is known before it is sent: its
    /// own partition, or what the partitioner picks for its key given the topic's
    /// partition count as librdkafka last saw it.
    pub(crate) fn placement(&mut self, record: &Record) -> Placement {
        if let Some(p) = record.partition {
            return Placement::Partition(p);
        }
        let Ok((raw, cell)) = self.topic(&record.topic) else { return Placement::Unknown };
        let count = cell.partitions.load(Ordering::Relaxed);
        if count <= 0 {
            return Placement::Unknown;
        }
        let deterministic = if record.key.is_empty() { cell.deterministic_empty_key } else { cell.deterministic };
        if !deterministic {
            return Placement::AnyOf(count);
        }
        // SAFETY: a built-in partitioner, called as librdkafka calls it (the key is valid
        // for its length and only read; the topic handle is alive: `self.topics` holds it).
        let p = unsafe {
            (cell.partitioner)(
                raw,
                record.key.as_ptr().cast(),
                record.key.len(),
                count,
                ptr::null_mut(),
                ptr::null_mut(),
            )
        };
        if (0..count).contains(&p) {
            Placement::Partition(p)
        } else {
            Placement::Unknown
        }
    }

    /// Asks librdkafka to send what it holds without waiting for `linger.ms`, for
    /// [`SEND_NOW_WAIT`] (see the module docs). Does not block.
    pub(crate) fn send_now(&self) {
        self.send_now.ask(SEND_NOW_WAIT);
    }

    /// [`Handoff::send_now`] for a record sent alone: until [`Handoff::alone_answered`],
    /// or for [`SEND_ALONE_WAIT`].
    pub(crate) fn send_alone_now(&self) {
        self.send_now.ask(SEND_ALONE_WAIT);
    }

    /// The record sent alone has its report: what follows it (a backlog, perhaps) need
    /// not be sent at once for longer than a live request would be.
    pub(crate) fn alone_answered(&self) {
        self.send_now.shorten();
    }

    pub(crate) fn producer(&self) -> &ThreadedProducer<C> {
        &self.producer
    }

    /// [`commit_transaction`] on a producer of its own, to run off the runtime.
    pub(crate) fn committer(&self) -> impl FnOnce(Duration) -> Result<(), KafkaError> + Send + 'static {
        let producer = self.producer.clone();
        move |timeout| commit_transaction(&producer, timeout)
    }

    /// Gives the topic handles back, stops the send-now thread (waits for it: at most
    /// [`SEND_NOW_SLICE`]) and returns the producer (to flush and destroy).
    pub(crate) fn into_producer(self) -> ThreadedProducer<C> {
        drop(self.topics);
        drop(self.send_now);
        self.producer
    }

    /// `rd_kafka_brokers_add`: adds `servers` (a bootstrap list) to the brokers the
    /// client knows; a no-op for those it knows already. Returns how many it parsed.
    pub(crate) fn add_brokers(&self, servers: &CStr) -> i32 {
        // SAFETY: the client is alive (`self.producer` owns it); `servers` is a
        // NUL-terminated string librdkafka only reads and copies; rd_kafka_brokers_add
        // is thread-safe (it takes the handle's own lock).
        unsafe { rd::rd_kafka_brokers_add(self.producer.client().native_ptr(), servers.as_ptr()) }
    }

    fn topic(&mut self, topic: &Arc<str>) -> Result<(*mut rd::rd_kafka_topic_t, &'static TopicCell), KafkaError> {
        if let Some(handle) = self.topics.get(topic) {
            return Ok((handle.0.as_ptr(), handle.1));
        }
        let invalid = || KafkaError::MessageProduction(RDKafkaErrorCode::InvalidTopic);
        let name = CString::new(topic.as_bytes()).map_err(|_| invalid())?;
        if name.as_bytes().len() > 512 {
            // librdkafka's own limit (it would refuse the handle).
            return Err(invalid());
        }
        let cell = topic_cell(topic, &self.partitioner);
        let client = self.producer.client().native_ptr();
        // SAFETY: the client is alive (`self.producer` owns it). The configuration is a
        // copy of the producer's default topic settings (what naming the topic in
        // rd_kafka_producev uses too) with walpost's partitioner callback and the
        // topic's 'static cell as its opaque; rd_kafka_topic_new takes it over (and
        // destroys it when the topic exists already: that topic's opaque is then the
        // same cell, made for the same name). `name` is NUL-terminated and only read.
        let raw = unsafe {
            let conf = rd::rd_kafka_default_topic_conf_dup(client);
            if !conf.is_null() {
                rd::rd_kafka_topic_conf_set_partitioner_cb(conf, Some(count_and_partition));
                rd::rd_kafka_topic_conf_set_opaque(conf, ptr::from_ref(cell).cast_mut().cast());
            }
            rd::rd_kafka_topic_new(client, name.as_ptr(), conf)
        };
        let handle = TopicHandle(NonNull::new(raw).ok_or_else(invalid)?, cell);
        if self.topics.len() >= MAX_TOPIC_HANDLES {
            self.topics.clear();
        }
        let raw = handle.0.as_ptr();
        self.topics.insert(topic.clone(), handle);
        Ok((raw, cell))
    }

    /// Hands `record` to librdkafka as message `seq` (its delivery opaque).
    pub(crate) fn send(&mut self, seq: u64, record: &Record, timestamp_ms: Option<i64>) -> Result<(), KafkaError> {
        let (topic, _) = self.topic(&record.topic)?;
        let client = self.producer.client().native_ptr();
        // SAFETY: a fresh list; every name and value is copied into it by header_add.
        let headers = unsafe { rd::rd_kafka_headers_new(record.headers.len()) };
        for (name, value) in &record.headers {
            // SAFETY: `headers` is the list made above; name and value are valid for their
            // lengths (at most isize::MAX bytes, as any allocation) and only read.
            unsafe {
                rd::rd_kafka_header_add(
                    headers,
                    name.as_ptr().cast(),
                    name.len() as isize,
                    value.as_ptr().cast(),
                    value.len() as isize,
                );
            }
        }
        let (payload, payload_len) =
            record.value.as_ref().map_or((ptr::null_mut(), 0), |v| (v.as_ptr().cast_mut().cast::<c_void>(), v.len()));
        // The opaque is the number itself, as rust-rdkafka's `usize` opaque reads it back.
        let opaque = ptr::without_provenance_mut::<c_void>(usize::try_from(seq).unwrap_or(usize::MAX));
        // SAFETY: the argument list is what rd_kafka_producev reads for each tag (topic
        // handle, int32 partition, int flags, pointer + size_t for value and key, opaque
        // pointer, int64 timestamp, headers list) and ends with END. F_COPY: librdkafka
        // copies the payload (the key always) before it returns.
        let code = unsafe {
            rd::rd_kafka_producev(
                client,
                RD_KAFKA_VTYPE_RKT,
                topic,
                RD_KAFKA_VTYPE_PARTITION,
                record.partition.unwrap_or(-1),
                RD_KAFKA_VTYPE_MSGFLAGS,
                rd::RD_KAFKA_MSG_F_COPY as c_int,
                RD_KAFKA_VTYPE_VALUE,
                payload,
                payload_len,
                RD_KAFKA_VTYPE_KEY,
                record.key.as_ptr().cast::<c_void>(),
                record.key.len(),
                RD_KAFKA_VTYPE_OPAQUE,
                opaque,
                RD_KAFKA_VTYPE_TIMESTAMP,
                record.timestamp_ms.or(timestamp_ms).unwrap_or(0),
                RD_KAFKA_VTYPE_HEADERS,
                headers,
                RD_KAFKA_VTYPE_END,
            )
        };
        if code == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return Ok(());
        }
        // SAFETY: librdkafka refused the message: the headers are ours again and nothing
        // refers to them.
        unsafe { rd::rd_kafka_headers_destroy(headers) };
        Err(KafkaError::MessageProduction(code.into()))
    }
}

/// `commit_transaction` without rust-rdkafka's flush loop, which polls for up to 100 ms a
/// turn a queue the `ThreadedProducer`'s thread empties: each commit slept ~100 ms. A
/// flush with the whole timeout only waits (reports are events), `linger.ms` as elapsed;
/// the commit's own flush then finds nothing left.
fn commit_transaction<C: ProducerContext + 'static>(
    producer: &ThreadedProducer<C>,
    timeout: Duration,
) -> Result<(), KafkaError> {
    let deadline = Instant::now() + timeout;
    let ms = c_int::try_from(timeout.as_millis()).unwrap_or(c_int::MAX);
    // SAFETY: `producer` owns a reference to the client; rd_kafka_flush is thread-safe.
    let left = unsafe { rd::rd_kafka_flush(producer.client().native_ptr(), ms) };
    if left != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        return Err(KafkaError::Flush(left.into()));
    }
    producer.commit_transaction(deadline.saturating_duration_since(Instant::now()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests may fail loudly
mod tests {
    use bytes::Bytes;
    use rdkafka::producer::DefaultProducerContext;
    use rdkafka::ClientConfig;

    use super::*;

    /// A producer whose broker does not exist: records are taken and wait (never expire).
    fn handoff(max_messages: u32) -> Handoff<DefaultProducerContext> {
        let producer = ClientConfig::new()
            .set("bootstrap.servers", "127.0.0.1:1")
            .set("message.timeout.ms", "0")
            .set("queue.buffering.max.messages", max_messages.to_string())
            .create()
            .unwrap();
        Handoff::new(producer, "murmur2_random")
    }

    fn record(topic: &str, value: Option<&'static [u8]>) -> Record {
        Record {
            topic: Arc::from(topic),
            key: Bytes::from_static(b"k"),
            value: value.map(Bytes::from_static),
            headers: vec![(Arc::from("id"), Bytes::from_static(b"1")), (Arc::from("empty"), Bytes::new())],
            event_id: Bytes::from_static(b"1"),
            timestamp_ms: None,
            partition: None,
            trace: router::TraceOutcome::default(),
        }
    }

    #[test]
    fn a_topic_handle_is_made_once_per_topic_and_records_are_taken() {
        let mut h = handoff(100);
        for seq in 0..5 {
            h.send(seq, &record("orders", Some(b"{}")), None).unwrap();
        }
        h.send(5, &record("payments", Some(b"")), Some(1_700_000_000_000)).unwrap();
        h.send(6, &record("payments", None), None).unwrap(); // a tombstone
        assert_eq!(h.topics.len(), 2);
        drop(h.into_producer());
    }

    #[test]
    fn names_librdkafka_cannot_take_are_invalid_topics() {
        let mut h = handoff(100);
        for bad in ["nul\0inside".to_owned(), "t".repeat(600)] {
            let err = h.send(1, &record(&bad, Some(b"{}")), None).unwrap_err();
            assert_eq!(err, KafkaError::MessageProduction(RDKafkaErrorCode::InvalidTopic), "{bad:.20}");
        }
        assert!(h.topics.is_empty(), "no handle is kept for a name librdkafka refused");
    }

    /// Asking to send now never blocks the caller, however often it asks (a request made
    /// while one runs is the same request), and handing the producer back stops the
    /// thread (the test would hang otherwise).
    #[test]
    fn send_now_does_not_block_and_ends_with_the_handoff() {
        let mut h = handoff(100);
        h.send(0, &record("orders", Some(b"{}")), None).unwrap();
        let asking = Instant::now();
        for _ in 0..1_000 {
            h.send_now();
        }
        h.send_alone_now();
        // Were each request a wait, 1,000 of them would take 1,000 x SEND_NOW_WAIT.
        assert!(asking.elapsed() < SEND_NOW_WAIT * 10, "send_now blocked: {:?}", asking.elapsed());
        assert!(h.send_now.thread.is_some(), "the send-now thread is running");
        // The record is never delivered (no broker), so the thread is inside its
        // SEND_ALONE_WAIT: handing the producer back still ends it within a slice.
        std::thread::sleep(SEND_NOW_SLICE * 3);
        let stopping = Instant::now();
        drop(h.into_producer());
        assert!(stopping.elapsed() < SEND_ALONE_WAIT / 2, "the send-now thread ran on: {:?}", stopping.elapsed());
    }

    /// Before librdkafka partitioned a record of a topic its partitions are unknown;
    /// after, a record's partition is what librdkafka's murmur2 partitioner gives its key
    /// (Kafka's own test vector: murmur2("foobar") = -790332482), and a record's own
    /// partition always wins.
    #[test]
    fn placement_follows_the_partitioner_once_the_count_is_seen() {
        let mut h = handoff(100);
        let topic = "placement-test-topic";
        let mut r = record(topic, Some(b"{}"));
        r.key = Bytes::from_static(b"foobar");
        assert_eq!(h.placement(&r), Placement::Unknown);
        // What librdkafka does once the topic's metadata says 7 partitions.
        let (raw, cell) = h.topic(&r.topic).unwrap();
        // SAFETY: as librdkafka calls it: the topic's cell as opaque, a valid key.
        let p = unsafe {
            count_and_partition(
                raw,
                r.key.as_ptr().cast(),
                r.key.len(),
                7,
                ptr::from_ref(cell).cast_mut().cast(),
                ptr::null_mut(),
            )
        };
        let expected = (-790_332_482_i32 & 0x7fff_ffff) % 7;
        assert_eq!(p, expected);
        assert_eq!(h.placement(&r), Placement::Partition(expected));
        r.partition = Some(5);
        assert_eq!(h.placement(&r), Placement::Partition(5));
        drop(h.into_producer());
    }

    /// A refused record (here: the queue is full) gives its headers back (the error
    /// path), and the error is librdkafka's code, which the window waits on.
    #[test]
    fn a_full_queue_is_reported_as_such() {
        let mut h = handoff(2);
        h.send(0, &record("orders", Some(b"{}")), None).unwrap();
        h.send(1, &record("orders", Some(b"{}")), None).unwrap();
        let err = h.send(2, &record("orders", Some(b"{}")), None).unwrap_err();
        assert_eq!(err, KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull));
    }
}
