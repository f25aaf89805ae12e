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

#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::{c_int, c_void, CStr, CString};
use std::ptr::{self, NonNull};
use std::sync::Arc;

use rdkafka::bindings as rd;
use rdkafka::bindings::rd_kafka_vtype_t::*;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{Producer, ProducerContext, ThreadedProducer};
use router::Record;

/// Topic handles kept before the cache is cleared (a topic's handle is then made again,
/// which costs one lookup).
pub const MAX_TOPIC_HANDLES: usize = 10_000;

/// One application reference to a librdkafka topic handle.
#[derive(Debug)]
struct TopicHandle(NonNull<rd::rd_kafka_topic_t>);

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
pub struct Handoff<C: ProducerContext + 'static> {
    /// foldhash, not SipHash: looked up for every record.
    topics: HashMap<Arc<str>, TopicHandle, foldhash::fast::RandomState>,
    producer: ThreadedProducer<C>,
}

impl<C: ProducerContext + 'static> std::fmt::Debug for Handoff<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handoff").field("topics", &self.topics.len()).finish()
    }
}

impl<C: ProducerContext + 'static> Handoff<C> {
    pub fn new(producer: ThreadedProducer<C>) -> Handoff<C> {
        Handoff { topics: HashMap::default(), producer }
    }

    pub fn producer(&self) -> &ThreadedProducer<C> {
        &self.producer
    }

    /// Gives the topic handles back and returns the producer (to flush and destroy).
    pub fn into_producer(self) -> ThreadedProducer<C> {
        drop(self.topics);
        self.producer
    }

    /// `rd_kafka_brokers_add`: adds `servers` (a bootstrap list) to the brokers the
    /// client knows; a no-op for those it knows already. Returns how many it parsed.
    pub fn add_brokers(&self, servers: &CStr) -> i32 {
        // SAFETY: the client is alive (`self.producer` owns it); `servers` is a
        // NUL-terminated string librdkafka only reads and copies; rd_kafka_brokers_add
        // is thread-safe (it takes the handle's own lock).
        unsafe { rd::rd_kafka_brokers_add(self.producer.client().native_ptr(), servers.as_ptr()) }
    }

    fn topic(&mut self, topic: &Arc<str>) -> Result<*mut rd::rd_kafka_topic_t, KafkaError> {
        if let Some(handle) = self.topics.get(topic) {
            return Ok(handle.0.as_ptr());
        }
        let invalid = || KafkaError::MessageProduction(RDKafkaErrorCode::InvalidTopic);
        let name = CString::new(topic.as_bytes()).map_err(|_| invalid())?;
        // SAFETY: the client is alive (`self.producer` owns it); `name` is NUL-terminated
        // and only read; a null configuration means the producer's default topic
        // settings (what naming the topic in rd_kafka_producev uses too).
        let raw =
            unsafe { rd::rd_kafka_topic_new(self.producer.client().native_ptr(), name.as_ptr(), ptr::null_mut()) };
        let handle = TopicHandle(NonNull::new(raw).ok_or_else(invalid)?);
        if self.topics.len() >= MAX_TOPIC_HANDLES {
            self.topics.clear();
        }
        let raw = handle.0.as_ptr();
        self.topics.insert(topic.clone(), handle);
        Ok(raw)
    }

    /// Hands `record` to librdkafka as message `seq` (its delivery opaque).
    pub fn send(&mut self, seq: u64, record: &Record, timestamp_ms: Option<i64>) -> Result<(), KafkaError> {
        let topic = self.topic(&record.topic)?;
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
        Handoff::new(producer)
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
