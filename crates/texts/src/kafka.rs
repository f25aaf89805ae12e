//! Kafka: records it will never take (and what fixes each cause), and topics whose
//! durability cannot keep an acknowledged event.

use crate::runbook::{KAFKA_MAINTENANCE, POISON_RECORD};

/// The fatal error for a record Kafka will never take (`code`: its class, `fix`: one of
/// the `FIX_*` texts). Quoted in runbooks/poison-record.md.
pub fn poison_record(event_id: &str, topic: &str, code: &str, error: &str, fix: &str) -> String {
    format!(
        "Kafka rejected event id={event_id} for topic {topic} permanently ({code}: {error}); nothing from its transaction on is confirmed, so the event is not lost: {fix}, then restart walpost (see {POISON_RECORD})"
    )
}

/// The fix for a record too large for the topic or the producer.
pub const FIX_SIZE: &str =
    "raise the topic's max.message.bytes and the producer's message.max.bytes, or make the payload smaller";
/// The fix for a principal that may not write the topic.
pub const FIX_AUTHORIZATION: &str = "grant the producer principal WRITE (and DESCRIBE) on the topic";
/// The fix for a topic name Kafka refuses.
pub const FIX_TOPIC_NAME: &str = "fix route.topic.replacement or the route column value so the topic name is valid";
/// The fix for a topic that does not exist.
pub const FIX_UNKNOWN_TOPIC: &str = "create the topic, or enable auto.create.topics.enable on the brokers";
/// The fix for a record whose format the broker refuses.
pub const FIX_RECORD_FORMAT: &str = "the broker refused the record's format; check broker logs";
/// The fix for a timestamp outside the topic's limits.
pub const FIX_TIMESTAMP: &str = "the record's timestamp is outside what the topic accepts (message.timestamp.before.max.ms / after.max.ms): fix the topic's limits or the timestamp column";
/// The fix for a broker policy that refused the record.
pub const FIX_POLICY: &str = "the broker's create-topic or record policy refused it; check broker logs";

/// `walpost check`'s warning for an existing topic (`weakness`: its replication factor
/// or `min.insync.replicas` below 2). Quoted in runbooks/kafka-maintenance.md.
pub fn durability_warning(topic: &str, weakness: &str) -> String {
    format!(
        "durability: topic {topic} has {weakness}: walpost produces with acks=all, which waits for min.insync.replicas copies only, so an acknowledged event can be on one broker and lost with its disk; give the topic 3 replicas (kafka-reassign-partitions) and set min.insync.replicas=2 (kafka-configs --alter --entity-type topics --entity-name {topic} --add-config min.insync.replicas=2), see {KAFKA_MAINTENANCE}"
    )
}

/// `walpost check`'s warning for the brokers' defaults (`weakness` as in
/// [`durability_warning`]). Quoted in runbooks/kafka-maintenance.md.
pub fn defaults_warning(weakness: &str) -> String {
    format!(
        "durability: topics created on first use get the brokers' defaults, {weakness} (default.replication.factor, min.insync.replicas): an acknowledged event can be on one broker and lost with its disk; set default.replication.factor=3 and min.insync.replicas=2 on the brokers, or create the outbox topics beforehand with them, see {KAFKA_MAINTENANCE}"
    )
}
