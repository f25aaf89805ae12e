//! Exactly-once delivery's memory in Kafka: which WAL position the last committed
//! Kafka transaction of a slot reached.
//!
//! Every Kafka transaction walpost commits holds, besides its records, one progress
//! record on a compacted topic: key `<database>/<slot>`, value the commit end LSN of
//! the last PostgreSQL transaction it completed (and, when a PostgreSQL transaction too
//! large for one Kafka transaction was split, how many of the next one's records it
//! already holds). A new session reads the last committed progress record
//! (read_committed) and skips everything it covers: nothing is published twice. The
//! slot's confirmed position follows the progress record, never leads it.
//!
//! The transactional id is derived from the slot's identity (system identifier,
//! database, slot), stable across restarts and failovers (a promoted standby keeps the
//! system identifier): a second or zombie instance is fenced by the broker.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use pgoutput::Lsn;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};

use super::config::client_config;
use crate::error::PipelineError;

/// What a slot is, across restarts and failovers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotIdentity {
    pub system_id: String,
    pub database: String,
    pub slot: String,
}

impl SlotIdentity {
    /// The producer's `transactional.id`.
    pub fn transactional_id(&self) -> String {
        format!("walpost-{}-{}-{}", self.system_id, self.database, self.slot)
    }

    /// The progress record's key.
    pub fn key(&self) -> String {
        format!("{}/{}", self.database, self.slot)
    }
}

/// A progress record's value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    pub system_id: String,
    pub database: String,
    pub slot: String,
    /// Every PostgreSQL transaction that commits before this position is in Kafka.
    pub lsn: String,
    /// A split transaction: its commit LSN (Begin's final LSN) and how many of its records
    /// are in Kafka already.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub partial: Option<Partial>,
}

/// See [`Progress::partial`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Partial {
    pub txn: String,
    pub records: u32,
}

/// What the progress topic says, as LSNs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub lsn: Lsn,
    pub partial: Option<(Lsn, u32)>,
}

impl Progress {
    pub fn new(id: &SlotIdentity, position: Position) -> Progress {
        Progress {
            system_id: id.system_id.clone(),
            database: id.database.clone(),
            slot: id.slot.clone(),
            lsn: position.lsn.to_string(),
            partial: position.partial.map(|(txn, records)| Partial { txn: txn.to_string(), records }),
        }
    }

    pub fn encode(&self) -> Bytes {
        Bytes::from(serde_json::to_vec(self).unwrap_or_default())
    }

    /// The position, if this record is about `id`'s slot; a definite error when it is
    /// another database's (a restored or replaced cluster with the same names).
    pub fn position_for(&self, id: &SlotIdentity, topic: &str) -> Result<Position, PipelineError> {
        if self.system_id != id.system_id {
            return Err(PipelineError::definite(format!(
                "the progress topic {topic} holds a record for {} from another PostgreSQL cluster (system identifier {}, this one is {}): the cluster was restored or replaced, so that position means nothing here; follow runbooks/exactly-once.md (delete the record, or use another progress_topic)",
                id.key(),
                self.system_id,
                id.system_id
            )));
        }
        let lsn = |text: &str| {
            text.parse::<Lsn>().map_err(|_| {
                PipelineError::definite(format!("the progress record for {} in {topic} is unreadable", id.key()))
            })
        };
        Ok(Position {
            lsn: lsn(&self.lsn)?,
            partial: match &self.partial {
                Some(p) => Some((lsn(&p.txn)?, p.records)),
                None => None,
            },
        })
    }
}

/// Creates the progress topic (compacted) if it does not exist.
pub async fn ensure_topic(
    brokers: &str,
    properties: &BTreeMap<String, String>,
    topic: &str,
) -> Result<(), PipelineError> {
    let admin: AdminClient<DefaultClientContext> = client_config(brokers, properties)
        .map_err(PipelineError::definite)?
        .create()
        .map_err(|e| PipelineError::definite(format!("cannot create a Kafka admin client: {e}")))?;
    let new = NewTopic::new(topic, 1, TopicReplication::Fixed(-1)).set("cleanup.policy", "compact");
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let results = admin
        .create_topics([&new], &opts)
        .await
        .map_err(|e| PipelineError::transient(format!("cannot create the progress topic {topic}: {e}")))?;
    for result in results {
        match result {
            Ok(_) => tracing::info!(topic, "created the progress topic (compacted)"),
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((_, code)) => {
                return Err(PipelineError::transient(format!("cannot create the progress topic {topic}: {code}")))
            }
        }
    }
    Ok(())
}

/// The last committed progress record for `id` (read_committed), if any. Blocking
/// librdkafka calls run off the runtime.
pub async fn read(
    brokers: &str,
    properties: &BTreeMap<String, String>,
    topic: &str,
    id: &SlotIdentity,
) -> Result<Option<Progress>, PipelineError> {
    let mut cfg = client_config(brokers, properties).map_err(PipelineError::definite)?;
    cfg.set("group.id", format!("walpost-progress-{}", id.transactional_id()))
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true");
    let consumer: BaseConsumer =
        cfg.create().map_err(|e| PipelineError::definite(format!("cannot create a Kafka consumer: {e}")))?;
    let (topic, key) = (topic.to_owned(), id.key());
    tokio::task::spawn_blocking(move || read_blocking(&consumer, &topic, &key))
        .await
        .map_err(|e| PipelineError::transient(format!("reading the progress topic failed: {e}")))?
}

fn read_blocking(consumer: &BaseConsumer, topic: &str, key: &str) -> Result<Option<Progress>, PipelineError> {
    let fail = |what: String| PipelineError::transient(format!("cannot read the progress topic {topic}: {what}"));
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10)).map_err(|e| fail(e.to_string()))?;
    let partitions: Vec<i32> = metadata.topics().iter().flat_map(|t| t.partitions().iter().map(|p| p.id())).collect();
    let mut last: Option<(i64, Progress)> = None;
    for partition in partitions {
        // Up to the last stable offset: read_committed stops there.
        let (low, high) =
            consumer.fetch_watermarks(topic, partition, Duration::from_secs(10)).map_err(|e| fail(e.to_string()))?;
        if high <= low {
            continue;
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, partition, Offset::Beginning).map_err(|e| fail(e.to_string()))?;
        consumer.assign(&tpl).map_err(|e| fail(e.to_string()))?;
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            if std::time::Instant::now() > deadline {
                return Err(fail("no end of partition within 30 s".into()));
            }
            match consumer.poll(Duration::from_millis(500)) {
                None => continue,
                Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) => break,
                Some(Err(e)) => return Err(fail(e.to_string())),
                Some(Ok(m)) => {
                    if m.key() != Some(key.as_bytes()) {
                        continue;
                    }
                    match m.payload() {
                        // A tombstone: the record was deleted by an operator.
                        None => last = None,
                        Some(v) => {
                            let p: Progress = serde_json::from_slice(v).map_err(|_| {
                                fail(format!("the record for {key} at offset {} is unreadable", m.offset()))
                            })?;
                            if last.as_ref().is_none_or(|(o, _)| m.offset() > *o) {
                                last = Some((m.offset(), p));
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(last.map(|(_, p)| p))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> SlotIdentity {
        SlotIdentity { system_id: "7714".into(), database: "shop".into(), slot: "walpost".into() }
    }

    #[test]
    fn progress_round_trips_and_refuses_another_cluster() {
        let p = Progress::new(&id(), Position { lsn: Lsn(0x1_0000_0010), partial: Some((Lsn(0x20), 7)) });
        let back: Progress = serde_json::from_slice(&p.encode()).unwrap();
        assert_eq!(
            back.position_for(&id(), "t").unwrap(),
            Position { lsn: Lsn(0x1_0000_0010), partial: Some((Lsn(0x20), 7)) }
        );
        let other = SlotIdentity { system_id: "9999".into(), ..id() };
        let err = back.position_for(&other, "walpost.progress").unwrap_err();
        assert!(!err.is_transient() && err.to_string().contains("another PostgreSQL cluster"), "{err}");
        assert_eq!(id().transactional_id(), "walpost-7714-shop-walpost");
        assert_eq!(id().key(), "shop/walpost");
    }
}
