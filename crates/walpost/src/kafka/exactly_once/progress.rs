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
//!
//! Trust: any Kafka client allowed to write the progress topic could produce a record
//! with a position ahead of the truth, and walpost would skip every event up to it. So walpost
//! signs each record (HMAC-SHA256, [`ProgressKey`]) with a key kept
//! beside the slot's lineage in PostgreSQL (`events.walpost_slots.progress_key`), and a
//! session trusts the last record only when its signature holds and its position is not
//! ahead of the server's WAL ([`Progress::check`]); anything else stops walpost with
//! [`texts::exactly_once::forged`] (runbooks/exactly-once.md) instead of skipping. A record without a
//! signature is accepted only in the start that made the key (records of a walpost
//! before signing existed).

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

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::error::{ErrorKind, PipelineError};
use crate::kafka::config::client_config;

/// The key progress records are signed with (see the module docs).
#[derive(Clone, PartialEq, Eq)]
pub struct ProgressKey {
    key: Vec<u8>,
    /// Made in this start: a record without a signature was written before walpost
    /// signed records, and is trusted once.
    pub made_now: bool,
}

impl std::fmt::Debug for ProgressKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProgressKey").field("made_now", &self.made_now).finish_non_exhaustive()
    }
}

impl ProgressKey {
    /// A key from its stored form (hex); `None` when it is not one.
    pub fn from_hex(text: &str, made_now: bool) -> Option<ProgressKey> {
        let key = hex_decode(text.trim())?;
        (key.len() >= 16).then_some(ProgressKey { key, made_now })
    }

    /// A new key's stored form: 32 random bytes as hex.
    pub fn generate_hex() -> Result<String, String> {
        let mut key = [0u8; 32];
        getrandom::fill(&mut key).map_err(|e| format!("no random bytes for the progress key: {e}"))?;
        Ok(hex_encode(&key))
    }

    fn mac(&self, text: &str) -> Option<Hmac<Sha256>> {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.key).ok()?;
        mac.update(text.as_bytes());
        Some(mac)
    }

    fn sign(&self, text: &str) -> Option<String> {
        Some(hex_encode(&self.mac(text)?.finalize().into_bytes()))
    }

    fn verify(&self, text: &str, signature: &str) -> bool {
        match (self.mac(text), hex_decode(signature)) {
            (Some(mac), Some(signature)) => mac.verify_slice(&signature).is_ok(),
            _ => false,
        }
    }
}

fn hex_encode(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn hex_decode(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 || !text.is_ascii() {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

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
    /// HMAC-SHA256 of [`Progress::signed_text`] with the [`ProgressKey`], as hex.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub mac: Option<String>,
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
    /// A record for `position`, signed with `key` (unsigned without one: the lineage
    /// table, where the key is kept, is not available).
    pub fn new(id: &SlotIdentity, position: Position, key: Option<&ProgressKey>) -> Progress {
        let mut p = Progress {
            system_id: id.system_id.clone(),
            database: id.database.clone(),
            slot: id.slot.clone(),
            lsn: position.lsn.to_string(),
            partial: position.partial.map(|(txn, records)| Partial { txn: txn.to_string(), records }),
            mac: None,
        };
        p.mac = key.and_then(|k| k.sign(&p.signed_text()));
        p
    }

    /// What the signature covers: every field, in a fixed order.
    fn signed_text(&self) -> String {
        let partial = self.partial.as_ref().map(|p| format!("{}/{}", p.txn, p.records)).unwrap_or_default();
        format!("walpost-progress-1\n{}\n{}\n{}\n{}\n{partial}", self.system_id, self.database, self.slot, self.lsn)
    }

    /// The position, when walpost may trust it: the record is `id`'s, signed with `key`
    /// (when there is one), and not ahead of `wal_end` (the server's WAL position now).
    pub fn check(
        &self,
        id: &SlotIdentity,
        topic: &str,
        key: Option<&ProgressKey>,
        wal_end: Lsn,
    ) -> Result<Position, PipelineError> {
        let position = self.position_for(id, topic)?;
        let forged = |why: &str| {
            Err(PipelineError::definite(ErrorKind::Progress, texts::exactly_once::forged(topic, &id.key(), why)))
        };
        if let Some(key) = key {
            match &self.mac {
                Some(mac) if key.verify(&self.signed_text(), mac) => {}
                Some(_) => return forged(texts::exactly_once::FORGED_SIGNATURE_MISMATCH),
                None if key.made_now => {
                    tracing::info!(topic, "the last progress record carries no signature (written before walpost signed them); trusted once, every record from now on is signed");
                }
                None => return forged(texts::exactly_once::FORGED_UNSIGNED),
            }
        }
        if position.lsn > wal_end {
            return forged(&texts::exactly_once::forged_ahead_of_wal(&position.lsn, &wal_end));
        }
        Ok(position)
    }

    pub fn encode(&self) -> Bytes {
        Bytes::from(serde_json::to_vec(self).unwrap_or_default())
    }

    /// The position, if this record is about `id`'s slot; a definite error when it is
    /// another database's (a restored or replaced cluster with the same names).
    pub fn position_for(&self, id: &SlotIdentity, topic: &str) -> Result<Position, PipelineError> {
        if self.system_id != id.system_id {
            return Err(PipelineError::definite(
                ErrorKind::Progress,
                texts::exactly_once::another_cluster(topic, &id.key(), &self.system_id, &id.system_id),
            ));
        }
        let lsn = |text: &str| {
            text.parse::<Lsn>().map_err(|_| {
                PipelineError::definite(
                    ErrorKind::Progress,
                    format!("the progress record for {} in {topic} is unreadable", id.key()),
                )
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
        .map_err(|e| PipelineError::definite(ErrorKind::Config, e))?
        .create()
        .map_err(|e| PipelineError::definite(ErrorKind::Kafka, format!("cannot create a Kafka admin client: {e}")))?;
    let new = NewTopic::new(topic, 1, TopicReplication::Fixed(-1)).set("cleanup.policy", "compact");
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let results = admin.create_topics([&new], &opts).await.map_err(|e| {
        PipelineError::transient(ErrorKind::Kafka, format!("cannot create the progress topic {topic}: {e}"))
    })?;
    for result in results {
        match result {
            Ok(_) => tracing::info!(topic, "created the progress topic (compacted)"),
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((_, code)) => {
                return Err(PipelineError::transient(
                    ErrorKind::Kafka,
                    format!("cannot create the progress topic {topic}: {code}"),
                ))
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
    let mut cfg = client_config(brokers, properties).map_err(|e| PipelineError::definite(ErrorKind::Config, e))?;
    cfg.set("group.id", format!("walpost-progress-{}", id.transactional_id()))
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        // The end of the partition is known from a fetch that found nothing more, which
        // the broker holds for this long waiting for records: 500 ms by default, half of
        // an exactly-once start.
        .set("fetch.wait.max.ms", "10");
    let consumer: BaseConsumer<QuietContext> = cfg
        .create_with_context(QuietContext)
        .map_err(|e| PipelineError::definite(ErrorKind::Kafka, format!("cannot create a Kafka consumer: {e}")))?;
    let (topic, key) = (topic.to_owned(), id.key());
    tokio::task::spawn_blocking(move || read_blocking(&consumer, &topic, &key))
        .await
        .map_err(|e| PipelineError::transient(ErrorKind::Kafka, format!("reading the progress topic failed: {e}")))?
}

/// The progress reader's client context: the end of a partition is how the reader knows
/// it has read everything (`enable.partition.eof`), not an error to log (it was logged
/// at ERROR at every exactly-once start).
#[derive(Debug, Clone, Copy)]
struct QuietContext;

impl rdkafka::ClientContext for QuietContext {
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        // librdkafka reports it as PartitionEOF or as a global error with that code.
        if matches!(error, rdkafka::error::KafkaError::PartitionEOF(_))
            || error.rdkafka_error_code() == Some(RDKafkaErrorCode::PartitionEOF)
        {
            tracing::debug!("progress topic: end of partition");
        } else {
            tracing::warn!(error = %error, "Kafka client error while reading the progress topic: {reason}");
        }
    }
}

impl rdkafka::consumer::ConsumerContext for QuietContext {}

fn read_blocking(
    consumer: &BaseConsumer<QuietContext>,
    topic: &str,
    key: &str,
) -> Result<Option<Progress>, PipelineError> {
    let fail = |what: String| {
        PipelineError::transient(ErrorKind::Kafka, format!("cannot read the progress topic {topic}: {what}"))
    };
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
        let p = Progress::new(&id(), Position { lsn: Lsn(0x1_0000_0010), partial: Some((Lsn(0x20), 7)) }, None);
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

    /// Regression: a record any Kafka client can produce (the key is public: the
    /// database's system identifier is readable by every role) must not be trusted.
    #[test]
    fn only_a_record_signed_with_the_key_and_not_ahead_of_the_wal_is_trusted() {
        let key = ProgressKey::from_hex(&ProgressKey::generate_hex().unwrap(), false).unwrap();
        let at = Position { lsn: Lsn(0x500), partial: Some((Lsn(0x600), 3)) };
        let signed = Progress::new(&id(), at, Some(&key));
        assert_eq!(signed.check(&id(), "t", Some(&key), Lsn(0x1000)).unwrap(), at);
        assert_eq!(signed.check(&id(), "t", None, Lsn(0x1000)).unwrap(), at, "no key: only the WAL bound");
        let mut moved = signed.clone();
        moved.lsn = Lsn(0x900).to_string();
        let err = moved.check(&id(), "walpost.progress", Some(&key), Lsn(0x1000)).unwrap_err().to_string();
        assert!(err.contains("did not write") && err.contains("signature does not match"), "{err}");
        let unsigned = Progress::new(&id(), at, None);
        let err = unsigned.check(&id(), "t", Some(&key), Lsn(0x1000)).unwrap_err().to_string();
        assert!(err.contains("carries no signature"), "{err}");
        let fresh = ProgressKey { made_now: true, ..key.clone() };
        assert!(unsigned.check(&id(), "t", Some(&fresh), Lsn(0x1000)).is_ok(), "trusted once, as the key is made");
        let other = ProgressKey::from_hex(&ProgressKey::generate_hex().unwrap(), false).unwrap();
        assert!(signed.check(&id(), "t", Some(&other), Lsn(0x1000)).is_err(), "another key");
        let ahead = Progress::new(&id(), Position { lsn: Lsn(0x2000), partial: None }, Some(&key));
        let err = ahead.check(&id(), "t", Some(&key), Lsn(0x1000)).unwrap_err().to_string();
        assert!(err.contains("ahead of the server's WAL"), "{err}");
        assert!(!format!("{key:?}").contains(&hex_encode(&key.key)), "the key is never printed");
        assert_eq!(ProgressKey::from_hex("zz", false), None);
    }
}
