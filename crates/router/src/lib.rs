//! The Outbox Event Router: one INSERTed outbox row in, one Kafka record out.
//!
//! Semantics follow Debezium's Outbox Event Router where they apply:
//! - topic = `route.topic.replacement` with `${routedByValue}` replaced by the text of
//!   the `route.by.field` column (default pattern `outbox.event.${routedByValue}`);
//! - key = text form of the key column (`aggregate_id`);
//! - value = the payload column's bytes exactly as PostgreSQL sent them (JSON text
//!   of a `jsonb` column, the string of a `text` column): never re-serialised;
//! - header `id` = the event id column, header `eventType` = the event type column.
//!
//! Invariants:
//! - Columns are found by name in the relation the server last described, so columns
//!   added or reordered mid-stream do not break routing ([`Router::resolve`] again on
//!   every Relation message).
//! - A row that cannot be routed (NULL key, NULL route value, topic name Kafka would
//!   refuse, missing column) is an error naming the table, column and config key,
//!   never a silently dropped event.
//! - Payload and key bytes are `Bytes` slices of the decoded message: no copies.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use pgoutput::{ColumnValue, Relation, TupleData};

/// Header carrying the event id (Debezium: `id`).
pub const HEADER_ID: &str = "id";
/// Header carrying the event type.
pub const HEADER_EVENT_TYPE: &str = "eventType";
/// The placeholder in the topic pattern.
pub const ROUTED_BY_VALUE: &str = "${routedByValue}";

/// Which columns mean what, and how topics are named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouterConfig {
    /// `route.by.field`.
    pub route_by_field: String,
    /// `route.topic.replacement`.
    pub topic_pattern: String,
    /// `table.field.event.key`.
    pub key_field: String,
    /// `table.field.event.payload`.
    pub payload_field: String,
    /// `table.field.event.id`.
    pub id_field: String,
    /// Column copied into the `eventType` header; `None` for none.
    pub event_type_field: Option<String>,
}

impl Default for RouterConfig {
    fn default() -> Self {
        RouterConfig {
            route_by_field: "aggregate_type".into(),
            topic_pattern: format!("outbox.event.{ROUTED_BY_VALUE}"),
            key_field: "aggregate_id".into(),
            payload_field: "payload".into(),
            id_field: "id".into(),
            event_type_field: Some("event_type".into()),
        }
    }
}

/// A row that cannot become a record.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum RouteError {
    #[error("table {table} has no column \"{column}\" (set by {config_key}): add the column or point {config_key} at an existing one")]
    MissingColumn { table: String, column: String, config_key: &'static str },
    #[error("column \"{column}\" of {table} (set by {config_key}) is NULL in this row: the event cannot be routed")]
    NullField { table: String, column: String, config_key: &'static str },
    #[error("column \"{column}\" of {table} arrived as an unchanged TOAST value, which an INSERT never carries")]
    UnchangedToast { table: String, column: String },
    #[error("topic name '{topic}' produced by route.topic.replacement is not a valid Kafka topic: {reason}")]
    InvalidTopic { topic: String, reason: &'static str },
    #[error("row has {got} columns but relation {table} describes {expected}")]
    ColumnCountMismatch { table: String, got: usize, expected: usize },
}

/// A relation's column positions for the mapped fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedRelation {
    pub table: String,
    columns: usize,
    id: usize,
    key: usize,
    route: usize,
    payload: usize,
    event_type: Option<usize>,
}

/// One Kafka record, ready to produce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub topic: Arc<str>,
    pub key: Bytes,
    /// `None` is a tombstone (NULL payload).
    pub value: Option<Bytes>,
    pub headers: Vec<(&'static str, Bytes)>,
    /// Event id in text form (for error messages and dead letters; not logged with payloads).
    pub event_id: Bytes,
}

/// Maps outbox rows to records; holds a small cache of topic names.
#[derive(Debug)]
pub struct Router {
    config: RouterConfig,
    topics: HashMap<Bytes, Arc<str>>,
}

/// Topic names are cached per route value; past this many distinct values the cache is
/// cleared instead of growing without bound.
const TOPIC_CACHE_LIMIT: usize = 4096;

impl Router {
    pub fn new(config: RouterConfig) -> Router {
        Router { config, topics: HashMap::new() }
    }

    pub fn config(&self) -> &RouterConfig {
        &self.config
    }

    /// Finds the mapped columns in a Relation message.
    pub fn resolve(&self, relation: &Relation) -> Result<ResolvedRelation, RouteError> {
        let table = format!(
            "{}.{}",
            String::from_utf8_lossy(&relation.namespace),
            String::from_utf8_lossy(&relation.name)
        );
        let find = |column: &str, config_key: &'static str| {
            relation
                .columns
                .iter()
                .position(|c| c.name.as_ref() == column.as_bytes())
                .ok_or_else(|| RouteError::MissingColumn {
                    table: table.clone(),
                    column: column.to_owned(),
                    config_key,
                })
        };
        let c = &self.config;
        Ok(ResolvedRelation {
            id: find(&c.id_field, "table.field.event.id")?,
            key: find(&c.key_field, "table.field.event.key")?,
            route: find(&c.route_by_field, "route.by.field")?,
            payload: find(&c.payload_field, "table.field.event.payload")?,
            event_type: match &c.event_type_field {
                Some(col) => Some(find(col, "table.field.event.type")?),
                None => None,
            },
            columns: relation.columns.len(),
            table,
        })
    }

    /// Turns one inserted row into a record.
    pub fn route(&mut self, rel: &ResolvedRelation, row: &TupleData) -> Result<Record, RouteError> {
        if row.len() != rel.columns {
            return Err(RouteError::ColumnCountMismatch {
                table: rel.table.clone(),
                got: row.len(),
                expected: rel.columns,
            });
        }
        let mut id = None;
        let mut key = None;
        let mut route = None;
        let mut payload = None;
        let mut event_type = None;
        // One pass over the row; a column may fill several roles (e.g. key = id).
        for (index, value) in row.iter().enumerate() {
            if index == rel.payload {
                payload = Some(value.clone());
            }
            if index == rel.key {
                key = Some(value.clone());
            }
            if index == rel.route {
                route = Some(value.clone());
            }
            if index == rel.id {
                id = Some(value.clone());
            }
            if Some(index) == rel.event_type {
                event_type = Some(value);
            }
        }
        let c = &self.config;
        let required = |v: Option<ColumnValue>, column: &str, config_key: &'static str| {
            bytes_of(v, &rel.table, column)?.ok_or_else(|| RouteError::NullField {
                table: rel.table.clone(),
                column: column.to_owned(),
                config_key,
            })
        };
        let key = required(key, &c.key_field, "table.field.event.key")?;
        let route_value = required(route, &c.route_by_field, "route.by.field")?;
        let event_id = required(id, &c.id_field, "table.field.event.id")?;
        let value = bytes_of(payload, &rel.table, &c.payload_field)?;
        let mut headers = Vec::with_capacity(2);
        headers.push((HEADER_ID, event_id.clone()));
        if let Some(col) = &c.event_type_field {
            if let Some(t) = bytes_of(event_type, &rel.table, col)? {
                headers.push((HEADER_EVENT_TYPE, t));
            }
        }
        let topic = self.topic_for(route_value)?;
        Ok(Record { topic, key, value, headers, event_id })
    }

    fn topic_for(&mut self, route_value: Bytes) -> Result<Arc<str>, RouteError> {
        if let Some(t) = self.topics.get(&route_value) {
            return Ok(t.clone());
        }
        let topic = self
            .config
            .topic_pattern
            .replace(ROUTED_BY_VALUE, &String::from_utf8_lossy(&route_value));
        validate_topic(&topic)?;
        if self.topics.len() >= TOPIC_CACHE_LIMIT {
            self.topics.clear();
        }
        let topic: Arc<str> = topic.into();
        self.topics.insert(route_value, topic.clone());
        Ok(topic)
    }
}

fn bytes_of(value: Option<ColumnValue>, table: &str, column: &str) -> Result<Option<Bytes>, RouteError> {
    match value {
        None | Some(ColumnValue::Null) => Ok(None),
        Some(ColumnValue::Text(b)) | Some(ColumnValue::Binary(b)) => Ok(Some(b)),
        Some(ColumnValue::UnchangedToast) => Err(RouteError::UnchangedToast {
            table: table.to_owned(),
            column: column.to_owned(),
        }),
    }
}

/// Kafka's rules for topic names: 1..=249 characters of `[a-zA-Z0-9._-]`, not `.`/`..`.
pub fn validate_topic(topic: &str) -> Result<(), RouteError> {
    let invalid = |reason| Err(RouteError::InvalidTopic { topic: topic.to_owned(), reason });
    if topic.is_empty() {
        return invalid("it is empty");
    }
    if topic.len() > 249 {
        return invalid("it is longer than 249 characters");
    }
    if topic == "." || topic == ".." {
        return invalid("'.' and '..' are reserved");
    }
    if !topic.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-') {
        return invalid("only ASCII letters, digits, '.', '_' and '-' are allowed");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pgoutput::Column;

    fn relation(cols: &[&str]) -> Relation {
        Relation {
            xid: None,
            oid: 16384,
            namespace: Bytes::from_static(b"events"),
            name: Bytes::from_static(b"outbox"),
            replica_identity: b'd',
            columns: cols
                .iter()
                .map(|c| Column {
                    flags: 0,
                    name: Bytes::copy_from_slice(c.as_bytes()),
                    type_oid: 25,
                    type_modifier: -1,
                })
                .collect(),
        }
    }

    fn text(s: &str) -> ColumnValue {
        ColumnValue::Text(Bytes::copy_from_slice(s.as_bytes()))
    }

    const SEED_000: &[&str] = &[
        "id", "aggregate_type", "aggregate_id", "event_type", "payload", "occurred_at",
        "published_at", "retry_count", "last_error", "next_retry_at",
    ];

    fn seed_row(route: ColumnValue, key: ColumnValue, payload: ColumnValue) -> TupleData {
        TupleData::from_values(&[
            text("42"),
            route,
            key,
            text("OrderPlaced"),
            payload,
            text("2026-11-29 08:00:00+00"),
            ColumnValue::Null,
            text("0"),
            ColumnValue::Null,
            ColumnValue::Null,
        ])
    }

    #[test]
    fn routes_seed_row_with_defaults() {
        let mut router = Router::new(RouterConfig::default());
        let rel = router.resolve(&relation(SEED_000)).unwrap();
        let payload = r#"{"orderId": "o-1", "amount": 19900}"#;
        let rec = router
            .route(&rel, &seed_row(text("order"), text("5f0c6b1e-0000-4000-8000-000000000001"), text(payload)))
            .unwrap();
        assert_eq!(&*rec.topic, "outbox.event.order");
        assert_eq!(rec.key.as_ref(), b"5f0c6b1e-0000-4000-8000-000000000001");
        assert_eq!(rec.value.as_deref(), Some(payload.as_bytes()));
        assert_eq!(
            rec.headers,
            vec![("id", Bytes::from_static(b"42")), ("eventType", Bytes::from_static(b"OrderPlaced"))]
        );
        assert_eq!(rec.event_id.as_ref(), b"42");
    }

    #[test]
    fn columns_are_found_by_name_after_reordering() {
        let mut router = Router::new(RouterConfig::default());
        let cols = ["payload", "extra", "event_type", "aggregate_id", "id", "aggregate_type"];
        let rel = router.resolve(&relation(&cols)).unwrap();
        let row = TupleData::from_values(&[text("{}"), text("x"), text("T"), text("k"), text("7"), text("billing")]);
        let rec = router.route(&rel, &row).unwrap();
        assert_eq!(&*rec.topic, "outbox.event.billing");
        assert_eq!(rec.key.as_ref(), b"k");
        assert_eq!(rec.event_id.as_ref(), b"7");
    }

    #[test]
    fn one_column_can_fill_two_roles() {
        let mut router = Router::new(RouterConfig { key_field: "id".into(), ..RouterConfig::default() });
        let rel = router.resolve(&relation(SEED_000)).unwrap();
        let rec = router.route(&rel, &seed_row(text("order"), text("agg"), text("{}"))).unwrap();
        assert_eq!(rec.key.as_ref(), b"42");
        assert_eq!(rec.event_id.as_ref(), b"42");
    }

    #[test]
    fn custom_pattern_and_event_type_column() {
        let mut router = Router::new(RouterConfig {
            topic_pattern: "prod.${routedByValue}.events".into(),
            event_type_field: Some("type".into()),
            ..RouterConfig::default()
        });
        let rel = router.resolve(&relation(&["id", "aggregate_type", "aggregate_id", "type", "payload"])).unwrap();
        let row = TupleData::from_values(&[text("1"), text("user"), text("u1"), text("Created"), text("{}")]);
        let rec = router.route(&rel, &row).unwrap();
        assert_eq!(&*rec.topic, "prod.user.events");
        assert_eq!(rec.headers[1], ("eventType", Bytes::from_static(b"Created")));
    }

    #[test]
    fn missing_column_names_table_column_and_key() {
        let router = Router::new(RouterConfig::default());
        let err = router.resolve(&relation(&["id", "aggregate_type", "payload", "event_type"])).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("events.outbox") && msg.contains("aggregate_id") && msg.contains("table.field.event.key"), "{msg}");
    }

    #[test]
    fn null_key_or_route_is_an_error_not_a_skip() {
        let mut router = Router::new(RouterConfig::default());
        let rel = router.resolve(&relation(SEED_000)).unwrap();
        let err = router.route(&rel, &seed_row(text("order"), ColumnValue::Null, text("{}"))).unwrap_err();
        assert!(matches!(err, RouteError::NullField { ref column, .. } if column == "aggregate_id"), "{err}");
        let err = router.route(&rel, &seed_row(ColumnValue::Null, text("k"), text("{}"))).unwrap_err();
        assert!(matches!(err, RouteError::NullField { ref column, .. } if column == "aggregate_type"), "{err}");
    }

    #[test]
    fn null_payload_is_a_tombstone() {
        let mut router = Router::new(RouterConfig::default());
        let rel = router.resolve(&relation(SEED_000)).unwrap();
        let rec = router.route(&rel, &seed_row(text("order"), text("k"), ColumnValue::Null)).unwrap();
        assert_eq!(rec.value, None);
    }

    #[test]
    fn invalid_topic_after_substitution() {
        let mut router = Router::new(RouterConfig::default());
        let rel = router.resolve(&relation(SEED_000)).unwrap();
        for bad in ["order lines", "주문", "a/b"] {
            let err = router.route(&rel, &seed_row(text(bad), text("k"), text("{}"))).unwrap_err();
            assert!(matches!(err, RouteError::InvalidTopic { .. }), "{bad:?}: {err}");
        }
        let long = "x".repeat(240);
        let err = router.route(&rel, &seed_row(text(&long), text("k"), text("{}"))).unwrap_err();
        assert!(err.to_string().contains("249"), "{err}");
    }

    #[test]
    fn column_count_mismatch_is_an_error() {
        let mut router = Router::new(RouterConfig::default());
        let rel = router.resolve(&relation(SEED_000)).unwrap();
        let short = TupleData::from_values(&[text("1")]);
        assert!(matches!(router.route(&rel, &short), Err(RouteError::ColumnCountMismatch { .. })));
    }

    #[test]
    fn topic_cache_stays_bounded() {
        let mut router = Router::new(RouterConfig::default());
        let rel = router.resolve(&relation(SEED_000)).unwrap();
        for i in 0..(TOPIC_CACHE_LIMIT + 10) {
            let rec = router.route(&rel, &seed_row(text(&format!("t{i}")), text("k"), text("{}"))).unwrap();
            assert_eq!(&*rec.topic, format!("outbox.event.t{i}"));
        }
        assert!(router.topics.len() <= TOPIC_CACHE_LIMIT);
    }
}
