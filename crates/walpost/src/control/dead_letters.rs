//! `GET /api/v1/dead-letters` of `walpost run`: the newest records of the dead-letter
//! topic, told from their headers (`kafka::policy::headers`), with each event's redrive
//! state from `events.walpost_redrives` (migrations/outbox/0006_redrives.sql).
//!
//! Invariants:
//! - the topic is read by a consumer of its own, made for one request and dropped after
//!   it: partitions assigned at their high watermark minus the limit, no group, no offset
//!   committed, `read_committed` (an aborted exactly-once transaction's dead letter is no
//!   dead letter); nothing of the stream's producer or slot is touched;
//! - a read is bounded: at most [`MAX_LIMIT`] records per partition, [`READ_DEADLINE`],
//!   librdkafka's fetch and queue sizes, one read at a time; a value is dropped as it
//!   arrives unless payloads may be shown, and then cut at [`MAX_PAYLOAD_BYTES`]; header
//!   values are cut at [`MAX_HEADER_CHARS`];
//! - a payload is shown only on `?payload=true`, to an operator, with
//!   `[admin] show_payloads = true`: anything else asking for it is refused, never
//!   silently answered without it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use admin::{ApiError, Call, Reply};
use hyper::StatusCode;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use replication::{Config, ReplicationClient};
use serde::Serialize;
use tokio::sync::Mutex;

use super::Route;
use crate::kafka::policy::headers;
use crate::settings::KafkaSettings;

/// Records a listing returns unless `?limit=N` says otherwise.
pub(crate) const DEFAULT_LIMIT: usize = 50;
/// The most `?limit=N` may ask for.
pub(crate) const MAX_LIMIT: usize = 500;
/// The longest a listing reads the topic.
pub(crate) const READ_DEADLINE: Duration = Duration::from_secs(10);
/// A shown payload is cut here.
pub(crate) const MAX_PAYLOAD_BYTES: usize = 64 * 1024;
/// A header value (the error message, ...) is cut here.
pub(crate) const MAX_HEADER_CHARS: usize = 2000;

/// The table of migration 0006.
pub(crate) const REDRIVES: &str = "events.walpost_redrives";

/// The header the router puts the event type in (`route.by.field`'s placement).
const EVENT_TYPE_HEADER: &str = "eventType";

/// What a listing asked for in its query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ListQuery {
    pub(crate) limit: usize,
    pub(crate) payload: bool,
}

/// One dead letter as the API shows it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct DeadLetter {
    pub(crate) event_id: Option<String>,
    pub(crate) event_type: Option<String>,
    pub(crate) original_topic: Option<String>,
    /// The error class (`contract_broken`, `message_size_too_large`, ...).
    pub(crate) reason: Option<String>,
    /// What went wrong, as the stream said it (never a column value unless `log_values`).
    pub(crate) message: Option<String>,
    /// A contract breach's JSON pointer into the payload (`/amount`).
    pub(crate) violation_pointer: Option<String>,
    /// The outbox table the event came from, when the message names it.
    pub(crate) outbox_table: Option<String>,
    pub(crate) lsn: Option<String>,
    /// When the dead letter was written (the record's timestamp, RFC 3339).
    pub(crate) time: Option<String>,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    /// The value was too large for Kafka and went without it.
    pub(crate) value_dropped: bool,
    /// The newest redrive of the event, if any.
    pub(crate) redrive: Option<RedriveState>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) payload: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) payload_truncated: Option<bool>,
    #[serde(skip)]
    pub(crate) timestamp_ms: Option<i64>,
}

/// A row of `events.walpost_redrives`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub(crate) struct RedriveState {
    /// `redriven`, `still_refused` or `not_found`.
    pub(crate) result: String,
    pub(crate) at: String,
    pub(crate) by: String,
    pub(crate) topic: Option<String>,
    pub(crate) partition: Option<i32>,
    pub(crate) offset: Option<i64>,
    pub(crate) reason: Option<String>,
}

/// What the listing answers.
#[derive(Debug, Serialize)]
struct Listing<'a> {
    topic: &'a str,
    /// Newest first.
    dead_letters: Vec<DeadLetter>,
    payloads: &'static str,
    /// Why the redrive states are unknown (migration 0006 missing, the database not
    /// answering); `null` when they were read.
    redrive_state_unavailable: Option<String>,
}

/// The dead letters of one `walpost run`.
#[derive(Debug)]
pub(crate) struct DeadLetters {
    kafka: Option<KafkaSettings>,
    postgres: Config,
    show_payloads: bool,
    /// One read of the topic at a time: a burst of requests waits, never multiplies the
    /// memory a read may take.
    reading: Mutex<()>,
}

impl DeadLetters {
    pub(crate) fn new(kafka: Option<KafkaSettings>, postgres: Config, show_payloads: bool) -> DeadLetters {
        DeadLetters { kafka, postgres, show_payloads, reading: Mutex::new(()) }
    }

    /// `GET /api/v1/dead-letters`.
    pub(crate) async fn list(&self, call: &Call<Route>) -> Reply {
        let query = match list_query(call.query.as_deref()) {
            Ok(q) => q,
            Err(e) => return e.into(),
        };
        if query.payload {
            if !call.identity.role.may_act() {
                return ApiError::new(
                    StatusCode::FORBIDDEN,
                    "payloads are shown to operators only",
                    "leave out payload=true, or use a token with the role operator",
                )
                .into();
            }
            if !self.show_payloads {
                return ApiError::new(
                    StatusCode::FORBIDDEN,
                    "payloads are not shown: [admin] show_payloads is off",
                    "leave out payload=true, or set [admin] show_payloads = true and restart walpost",
                )
                .into();
            }
        }
        let Some(kafka) = &self.kafka else {
            return ApiError::new(StatusCode::CONFLICT, "this walpost has no [kafka] section", "configure [kafka]")
                .into();
        };
        let letters = {
            let _one = self.reading.lock().await;
            match read_newest(kafka, query).await {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(topic = %kafka.dead_letter_topic, "admin API: cannot read the dead-letter topic: {e}");
                    return ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("cannot read the dead-letter topic {}: {e}", kafka.dead_letter_topic),
                        "check that Kafka is reachable and walpost's principal may READ and DESCRIBE the topic; try again",
                    )
                    .into();
                }
            }
        };
        let (letters, unavailable) = self.with_redrive_states(letters).await;
        Reply::ok(&Listing {
            topic: &kafka.dead_letter_topic,
            dead_letters: letters,
            payloads: if query.payload { "shown" } else { "hidden" },
            redrive_state_unavailable: unavailable,
        })
    }

    /// The letters with their newest redrive; a table that cannot be read leaves them
    /// without, and says why.
    async fn with_redrive_states(&self, mut letters: Vec<DeadLetter>) -> (Vec<DeadLetter>, Option<String>) {
        let ids: BTreeSet<&str> = letters.iter().filter_map(|l| l.event_id.as_deref()).collect();
        if ids.is_empty() {
            return (letters, None);
        }
        let ids: Vec<&str> = ids.into_iter().collect();
        match tokio::time::timeout(Duration::from_secs(10), redrive_states(&self.postgres, &ids)).await {
            Ok(Ok(states)) => {
                for l in &mut letters {
                    l.redrive = l.event_id.as_ref().and_then(|id| states.get(id)).cloned();
                }
                (letters, None)
            }
            Ok(Err(e)) => (letters, Some(e)),
            Err(_) => (letters, Some(format!("{REDRIVES} did not answer within 10 s"))),
        }
    }
}

/// The newest redrive row of each of `ids`.
pub(crate) async fn redrive_states(config: &Config, ids: &[&str]) -> Result<BTreeMap<String, RedriveState>, String> {
    let mut sql = ReplicationClient::connect_sql(config).await.map_err(|e| e.to_string())?;
    let ids = serde_json::to_string(ids).map_err(|e| e.to_string())?;
    let q = format!(
        "SELECT DISTINCT ON (event_id) event_id, result, at::text AS at, by_token, topic, \"partition\"::text AS p, \
                \"offset\"::text AS o, reason \
         FROM {REDRIVES} WHERE event_id IN (SELECT pg_catalog.jsonb_array_elements_text($1::jsonb)) \
         ORDER BY event_id, at DESC"
    );
    let rows = sql.query(&q, &[Some(ids.as_str())]).await;
    sql.close().await;
    let rows = rows.map_err(|e| match e.sqlstate() {
        Some("42P01") => {
            format!("{REDRIVES} does not exist: apply migrations/outbox/0006_redrives.sql (walpost migrate)")
        }
        _ => format!("{REDRIVES}: {e}"),
    })?;
    let mut out = BTreeMap::new();
    for row in 0..rows.rows.len() {
        let col = |name: &str| rows.columns.iter().position(|c| c == name).and_then(|i| rows.text(row, i));
        let owned = |name: &str| col(name).map(str::to_owned);
        let Some(id) = owned("event_id") else { continue };
        out.insert(
            id,
            RedriveState {
                result: owned("result").unwrap_or_default(),
                at: owned("at").unwrap_or_default(),
                by: owned("by_token").unwrap_or_default(),
                topic: owned("topic"),
                partition: col("p").and_then(|p| p.parse().ok()),
                offset: col("o").and_then(|o| o.parse().ok()),
                reason: owned("reason"),
            },
        );
    }
    Ok(out)
}

/// `?limit=N&payload=true`: 400 naming the key for anything else.
pub(crate) fn list_query(query: Option<&str>) -> Result<ListQuery, ApiError> {
    let mut q = ListQuery { limit: DEFAULT_LIMIT, payload: false };
    let shape = format!("use ?limit=N (1 to {MAX_LIMIT}, {DEFAULT_LIMIT} by default) and ?payload=true");
    for pair in query.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "limit" => {
                q.limit = value.parse().ok().filter(|n| (1..=MAX_LIMIT).contains(n)).ok_or_else(|| {
                    ApiError::new(StatusCode::BAD_REQUEST, format!("limit must be 1 to {MAX_LIMIT}"), shape.clone())
                })?
            }
            "payload" => {
                q.payload = match value {
                    "true" => true,
                    "false" => false,
                    _ => {
                        return Err(ApiError::new(
                            StatusCode::BAD_REQUEST,
                            "payload must be true or false",
                            shape.clone(),
                        ))
                    }
                }
            }
            _ => {
                let shown: String = key.chars().filter(|c| !c.is_control()).take(64).collect();
                return Err(ApiError::new(StatusCode::BAD_REQUEST, format!("unknown query key {shown}"), shape));
            }
        }
    }
    Ok(q)
}

/// The newest `query.limit` dead letters, newest first (by record time, then offset).
pub(crate) async fn read_newest(kafka: &KafkaSettings, query: ListQuery) -> Result<Vec<DeadLetter>, String> {
    let consumer = consumer(kafka)?;
    let topic = kafka.dead_letter_topic.clone();
    let read = tokio::task::spawn_blocking(move || read_blocking(&consumer, &topic, query));
    let mut letters = match tokio::time::timeout(READ_DEADLINE + Duration::from_secs(5), read).await {
        Ok(Ok(r)) => r?,
        Ok(Err(e)) => return Err(e.to_string()),
        Err(_) => return Err(format!("no answer within {} s", READ_DEADLINE.as_secs() + 5)),
    };
    letters.sort_by_key(|l| std::cmp::Reverse((l.timestamp_ms, l.offset, l.partition)));
    letters.truncate(query.limit);
    Ok(letters)
}

/// The listing consumer's client context: the end of a partition is how a read knows it
/// is done (`enable.partition.eof`), not an error to log.
#[derive(Debug, Clone, Copy)]
struct QuietContext;

impl rdkafka::ClientContext for QuietContext {
    fn error(&self, error: KafkaError, reason: &str) {
        if matches!(error, KafkaError::PartitionEOF(_))
            || error.rdkafka_error_code() == Some(rdkafka::error::RDKafkaErrorCode::PartitionEOF)
        {
            tracing::debug!("dead-letter topic: end of partition");
        } else {
            tracing::warn!(error = %error, "Kafka client error while reading the dead-letter topic: {reason}");
        }
    }
}

impl rdkafka::consumer::ConsumerContext for QuietContext {}

/// A consumer for one read: no group offsets, bounded fetches.
fn consumer(kafka: &KafkaSettings) -> Result<BaseConsumer<QuietContext>, String> {
    let mut cfg = crate::kafka::config::client_config(&kafka.brokers, &kafka.properties).map_err(|e| e.to_string())?;
    // A group id librdkafka wants for a consumer; nothing is ever committed to it.
    cfg.set("group.id", "walpost-admin-dead-letters")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .set("fetch.wait.max.ms", "50")
        .set("max.partition.fetch.bytes", "1048576")
        .set("fetch.max.bytes", "16777216")
        .set("queued.max.messages.kbytes", "16384");
    cfg.create_with_context(QuietContext).map_err(|e| format!("cannot create a Kafka consumer: {e}"))
}

fn read_blocking(
    consumer: &BaseConsumer<QuietContext>,
    topic: &str,
    query: ListQuery,
) -> Result<Vec<DeadLetter>, String> {
    let started = Instant::now();
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(5)).map_err(|e| e.to_string())?;
    let Some(t) = metadata.topics().first() else { return Ok(Vec::new()) };
    if let Some(e) = t.error() {
        if e == rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART {
            // No dead letter was ever written.
            return Ok(Vec::new());
        }
        return Err(format!("{e:?}"));
    }
    let limit = i64::try_from(query.limit).unwrap_or(i64::MAX);
    let mut tpl = TopicPartitionList::new();
    let mut open = BTreeSet::new();
    for p in t.partitions() {
        let left = READ_DEADLINE.saturating_sub(started.elapsed());
        let (low, high) = consumer.fetch_watermarks(topic, p.id(), left).map_err(|e| e.to_string())?;
        if high > low {
            tpl.add_partition_offset(topic, p.id(), Offset::Offset(low.max(high - limit)))
                .map_err(|e| e.to_string())?;
            open.insert(p.id());
        }
    }
    if open.is_empty() {
        return Ok(Vec::new());
    }
    consumer.assign(&tpl).map_err(|e| e.to_string())?;
    let mut letters = Vec::new();
    let mut per_partition: BTreeMap<i32, usize> = BTreeMap::new();
    while !open.is_empty() {
        let left = READ_DEADLINE.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Err(format!("not read to its end within {} s", READ_DEADLINE.as_secs()));
        }
        match consumer.poll(left.min(Duration::from_millis(500))) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(p))) => {
                open.remove(&p);
            }
            Some(Err(e)) => return Err(e.to_string()),
            Some(Ok(m)) => {
                let n = per_partition.entry(m.partition()).or_default();
                *n += 1;
                if *n <= query.limit {
                    letters.push(letter(&m, query.payload));
                }
            }
        }
    }
    Ok(letters)
}

/// A record as the API shows it.
fn letter(m: &impl Message, payload: bool) -> DeadLetter {
    let mut hs: BTreeMap<&str, String> = BTreeMap::new();
    if let Some(h) = m.headers() {
        for header in h.iter() {
            if let Some(v) = header.value {
                // The last of a name wins, as the stream adds its own after the original's.
                hs.insert(header.key, cut(&String::from_utf8_lossy(v), MAX_HEADER_CHARS));
            }
        }
    }
    let message = hs.get(headers::MESSAGE).cloned();
    let (payload, payload_truncated) = match (payload, m.payload()) {
        (true, Some(v)) => {
            let truncated = v.len() > MAX_PAYLOAD_BYTES;
            (Some(String::from_utf8_lossy(&v[..v.len().min(MAX_PAYLOAD_BYTES)]).into_owned()), Some(truncated))
        }
        _ => (None, None),
    };
    let timestamp_ms = m.timestamp().to_millis();
    DeadLetter {
        event_id: hs.get(headers::EVENT_ID).or_else(|| hs.get("id")).cloned(),
        event_type: hs.get(EVENT_TYPE_HEADER).cloned(),
        original_topic: hs.get(headers::ORIGINAL_TOPIC).cloned().filter(|t| !t.is_empty()),
        reason: hs.get(headers::CLASS).cloned(),
        violation_pointer: message.as_deref().and_then(violation_pointer),
        outbox_table: message.as_deref().and_then(outbox_table),
        message,
        lsn: hs.get(headers::LSN).cloned(),
        time: timestamp_ms.and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok()).map(|t| t.to_string()),
        partition: m.partition(),
        offset: m.offset(),
        value_dropped: hs.contains_key(headers::VALUE_DROPPED),
        redrive: None,
        payload,
        payload_truncated,
        timestamp_ms,
    }
}

/// The JSON pointer of a contract breach's message: a JSON Schema's `... the value at
/// /amount fails "type" ...`, an Avro schema's `... the value at /amount is not a long: ...`
/// (its reasons begin `is`, `fits`, `has` or `does`); `the payload itself` is the root,
/// the empty pointer.
pub(crate) fn violation_pointer(message: &str) -> Option<String> {
    let (_, rest) = message.split_once("the value at ")?;
    if rest.starts_with("the payload itself ") {
        return Some(String::new());
    }
    let end = [" fails ", " is ", " fits ", " has ", " does "].iter().filter_map(|after| rest.find(after)).min()?;
    let pointer = &rest[..end];
    (pointer.is_empty() || pointer.starts_with('/')).then(|| pointer.to_owned())
}

/// The outbox table of a breach's message: `event id 8812 of events.outbox (event type ...`.
pub(crate) fn outbox_table(message: &str) -> Option<String> {
    let rest = message.strip_prefix("event id ")?;
    let (_, rest) = rest.split_once(" of ")?;
    let table = rest.split([' ', ':']).next()?;
    (!table.is_empty()).then(|| table.to_owned())
}

/// At most `max` characters, control characters out.
pub(crate) fn cut(text: &str, max: usize) -> String {
    let mut out: String = text.chars().filter(|c| !c.is_control()).take(max).collect();
    if text.chars().count() > max {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_is_bounded_and_names_what_is_wrong() {
        assert_eq!(list_query(None).unwrap(), ListQuery { limit: DEFAULT_LIMIT, payload: false });
        assert_eq!(list_query(Some("limit=7&payload=true")).unwrap(), ListQuery { limit: 7, payload: true });
        for (bad, says) in [
            ("limit=0", "limit must be"),
            ("limit=501", "limit must be"),
            ("limit=x", "limit must be"),
            ("payload=yes", "payload must be"),
            ("color=red", "unknown query key color"),
        ] {
            let e = list_query(Some(bad)).unwrap_err();
            assert_eq!(e.status(), StatusCode::BAD_REQUEST, "{bad}");
            assert!(e.error().contains(says) && e.hint().contains("limit=N"), "{bad}: {e:?}");
        }
    }

    #[test]
    fn a_breach_message_gives_its_pointer_and_table() {
        let m = "event id 8812 of events.outbox (event type OrderPlaced) breaks its contract: schema /c/OrderPlaced.json refuses it: the value at /amount fails \"type\" (schema path /properties/amount/type): fix the producing service, or the schema if the event is right";
        assert_eq!(violation_pointer(m).as_deref(), Some("/amount"));
        assert_eq!(outbox_table(m).as_deref(), Some("events.outbox"));
        let root = "event id 1 of \"Shop\".outbox: schema x refuses it: the value at  fails \"required\"";
        assert_eq!(violation_pointer(root).as_deref(), Some(""), "the root's pointer is empty");
        let itself = "schema x refuses it: the value at the payload itself fails \"required\"";
        assert_eq!(violation_pointer(itself).as_deref(), Some(""), "the root's pointer is empty");
        for (avro, pointer) in [
            (
                "the value at /amount is not a long: fix the producing service, or the schema if the event is right",
                "/amount",
            ),
            ("the value at /lines/0/sku fits no branch of its union: fix", "/lines/0/sku"),
            ("the value at /note is missing, and its field has no default: fix", "/note"),
            ("the value at /extra has a field its record does not declare: fix", "/extra"),
            ("the value at /code does not have the fixed type's size: fix", "/code"),
            ("the value at the payload itself is not an object: fix", ""),
        ] {
            let m = format!("event id 2 of events.outbox (event type OrderPlaced) breaks its contract: the Avro schema of subject OrderPlaced version 1 (id 7) cannot hold it: {avro}");
            assert_eq!(violation_pointer(&m).as_deref(), Some(pointer), "{m}");
        }
        let key = "the key schema subject t-key version 1 (id 9) refuses the record's key (the aggregate id): the value at the key itself fails \"pattern\"";
        assert_eq!(violation_pointer(key), None, "not a pointer into the payload");
        assert_eq!(outbox_table(root).as_deref(), Some("\"Shop\".outbox"));
        assert_eq!(violation_pointer("Message size too large: raise it"), None);
        assert_eq!(outbox_table("Message size too large: raise it"), None);
    }

    #[test]
    fn cut_bounds_and_drops_control_characters() {
        assert_eq!(cut("a\nb", 10), "ab");
        assert_eq!(cut("abcdef", 3), "abc…");
    }
}
