//! The Outbox Event Router: one INSERTed outbox row in, one Kafka record out.
//!
//! Semantics and option names follow Debezium's Outbox Event Router where they apply:
//! - topic: the `route.by.field` value, rewritten by `route.topic.regex` /
//!   `route.topic.replacement` (default `(?<routedByValue>.*)` ->
//!   `outbox.event.${routedByValue}`); a value the regex does not match keeps its own
//!   name, as Debezium's RegexRouter does;
//! - key: text form of `table.field.event.key`;
//! - value: the `table.field.event.payload` bytes exactly as PostgreSQL sent them (JSON
//!   text of a json/jsonb column, the string of a text column, the bytes of bytea),
//!   never re-serialised; `table.fields.additional.placement` `:envelope` wraps it as
//!   `{"payload": <payload>, "<alias>": <value>}` (the payload still copied verbatim);
//! - headers: `id` (always), `eventType` (`table.field.event.type`), `:header`
//!   placements, and one header per key of a JSON headers column
//!   (`table.field.event.headers`, seed 002's `headers JSONB`; string values unquoted,
//!   so a W3C `traceparent` arrives intact);
//! - timestamp: `table.field.event.timestamp` if set, else the commit time;
//! - partition: a `:partition` placement (an integer column), else the partitioner.
//!
//! Invariants:
//! - Columns are found by name in the relation the server last described, so columns
//!   added or reordered mid-stream do not break routing.
//! - A row that cannot be routed (NULL key, NULL route value, invalid topic, NULL payload
//!   without `route.tombstone.on.empty.payload`, missing column) is an error naming the
//!   table, column and config key, never a silently dropped event.
//! - Key and payload bytes are `Bytes` slices of the decoded message: no copies.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use bytes::Bytes;
use pgoutput::{ColumnValue, Relation, TupleData};
use regex::Regex;

/// Header carrying the event id (Debezium: `id`).
pub const HEADER_ID: &str = "id";
/// Header carrying the event type.
pub const HEADER_EVENT_TYPE: &str = "eventType";
/// The placeholder in the topic pattern.
pub const ROUTED_BY_VALUE: &str = "${routedByValue}";
/// Debezium's default `route.topic.regex`.
pub const DEFAULT_TOPIC_REGEX: &str = "(?<routedByValue>.*)";

/// Where an additional column goes (`table.fields.additional.placement`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    Header(String),
    Envelope(String),
    Partition,
}

/// One `col:target[:alias]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdditionalField {
    pub column: String,
    pub placement: Placement,
}

impl AdditionalField {
    /// Parses Debezium's comma-separated `col:header[:alias],col:envelope[:alias],col:partition`.
    pub fn parse_list(text: &str) -> Result<Vec<AdditionalField>, String> {
        text.split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(|entry| {
                let parts: Vec<&str> = entry.split(':').map(str::trim).collect();
                let (column, target, alias) = match parts.as_slice() {
                    [c, t] => (*c, *t, None),
                    [c, t, a] => (*c, *t, Some(*a)),
                    _ => return Err(format!("'{entry}' is not column:header|envelope|partition[:alias]")),
                };
                if column.is_empty() {
                    return Err(format!("'{entry}' has no column name"));
                }
                let alias = alias.unwrap_or(column).to_owned();
                let placement = match target {
                    "header" => Placement::Header(alias),
                    "envelope" => Placement::Envelope(alias),
                    "partition" => Placement::Partition,
                    other => {
                        return Err(format!("'{entry}': placement '{other}' is not header, envelope or partition"))
                    }
                };
                Ok(AdditionalField { column: column.to_owned(), placement })
            })
            .collect()
    }
}

/// Which columns mean what, and how topics are named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouterConfig {
    /// `route.by.field`.
    pub route_by_field: String,
    /// `route.topic.regex`; `None` is Debezium's default (the whole value).
    pub topic_regex: Option<String>,
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
    /// `table.field.event.timestamp`: record timestamp from this column.
    pub timestamp_field: Option<String>,
    /// A JSON object column whose keys become headers.
    pub headers_field: Option<String>,
    /// `table.fields.additional.placement`.
    pub additional: Vec<AdditionalField>,
    /// `table.field.additional.missing = ignore`: placements of missing columns are skipped.
    pub additional_missing_ignore: bool,
    /// `route.tombstone.on.empty.payload`.
    pub tombstone_on_empty_payload: bool,
}

impl Default for RouterConfig {
    fn default() -> Self {
        RouterConfig {
            route_by_field: "aggregate_type".into(),
            topic_regex: None,
            topic_pattern: format!("outbox.event.{ROUTED_BY_VALUE}"),
            key_field: "aggregate_id".into(),
            payload_field: "payload".into(),
            id_field: "id".into(),
            event_type_field: Some("event_type".into()),
            timestamp_field: None,
            headers_field: None,
            additional: Vec::new(),
            additional_missing_ignore: false,
            tombstone_on_empty_payload: false,
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
    #[error(
        "the payload column \"{column}\" of {table} is NULL or empty and route.tombstone.on.empty.payload is false"
    )]
    EmptyPayload { table: String, column: String },
    #[error("column \"{column}\" of {table} arrived as an unchanged TOAST value, which an INSERT never carries")]
    UnchangedToast { table: String, column: String },
    #[error("topic name '{topic}' produced by route.topic.replacement is not a valid Kafka topic: {reason}")]
    InvalidTopic { topic: String, reason: &'static str },
    #[error("row has {got} columns but relation {table} describes {expected}")]
    ColumnCountMismatch { table: String, got: usize, expected: usize },
    #[error("column \"{column}\" of {table} ({config_key}) has value '{value}', which is not {expected}")]
    BadValue { table: String, column: String, config_key: &'static str, value: String, expected: &'static str },
    #[error("route.topic.regex '{0}' is not a valid regular expression")]
    BadRegex(String),
}

impl RouteError {
    /// A short, stable class name for metrics and dead-letter headers.
    pub fn class(&self) -> &'static str {
        match self {
            RouteError::MissingColumn { .. } => "missing_column",
            RouteError::NullField { .. } => "null_field",
            RouteError::EmptyPayload { .. } => "empty_payload",
            RouteError::UnchangedToast { .. } => "unchanged_toast",
            RouteError::InvalidTopic { .. } => "invalid_topic",
            RouteError::ColumnCountMismatch { .. } => "column_count",
            RouteError::BadValue { .. } => "bad_value",
            RouteError::BadRegex(_) => "bad_regex",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct ResolvedExtra {
    index: usize,
    placement: Placement,
    name: Arc<str>,
    json: JsonKind,
}

/// How a column's text form is written into a JSON envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum JsonKind {
    /// json/jsonb and numbers: the text is already JSON.
    Raw,
    /// bool: `t`/`f`.
    Bool,
    /// Anything else: a JSON string.
    String,
}

fn json_kind(type_oid: u32) -> JsonKind {
    match type_oid {
        114 | 3802 | 20 | 21 | 23 | 700 | 701 | 1700 => JsonKind::Raw,
        16 => JsonKind::Bool,
        _ => JsonKind::String,
    }
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
    payload_json: JsonKind,
    event_type: Option<usize>,
    timestamp: Option<usize>,
    headers: Option<usize>,
    extra: Vec<ResolvedExtra>,
}

/// One Kafka record, ready to produce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub topic: Arc<str>,
    pub key: Bytes,
    /// `None` is a tombstone.
    pub value: Option<Bytes>,
    pub headers: Vec<(Arc<str>, Bytes)>,
    /// Event id in text form (for error messages and dead letters; never logged with payloads).
    pub event_id: Bytes,
    /// From `table.field.event.timestamp` (ms since the Unix epoch); `None`: commit time.
    pub timestamp_ms: Option<i64>,
    /// From a `:partition` placement.
    pub partition: Option<i32>,
}

/// Maps outbox rows to records; holds a small cache of topic names.
#[derive(Debug)]
pub struct Router {
    config: RouterConfig,
    regex: Option<Regex>,
    topics: HashMap<Bytes, Arc<str>>,
    header_id: Arc<str>,
    header_type: Arc<str>,
}

/// Topic names are cached per route value; past this many distinct values the cache is
/// cleared instead of growing without bound.
const TOPIC_CACHE_LIMIT: usize = 4096;

impl Router {
    /// Builds a router; fails only on an invalid `route.topic.regex`.
    pub fn new(config: RouterConfig) -> Result<Router, RouteError> {
        let regex = match config.topic_regex.as_deref() {
            None => None,
            Some(r) if r == DEFAULT_TOPIC_REGEX => None,
            Some(r) => Some(Regex::new(&format!("^(?:{r})$")).map_err(|_| RouteError::BadRegex(r.to_owned()))?),
        };
        Ok(Router {
            config,
            regex,
            topics: HashMap::new(),
            header_id: Arc::from(HEADER_ID),
            header_type: Arc::from(HEADER_EVENT_TYPE),
        })
    }

    pub fn config(&self) -> &RouterConfig {
        &self.config
    }

    /// Finds the mapped columns in a Relation message.
    pub fn resolve(&self, relation: &Relation) -> Result<ResolvedRelation, RouteError> {
        let table =
            format!("{}.{}", String::from_utf8_lossy(&relation.namespace), String::from_utf8_lossy(&relation.name));
        let position = |column: &str| relation.columns.iter().position(|c| c.name.as_ref() == column.as_bytes());
        let find = |column: &str, config_key: &'static str| {
            position(column).ok_or_else(|| RouteError::MissingColumn {
                table: table.clone(),
                column: column.to_owned(),
                config_key,
            })
        };
        let optional = |column: &Option<String>, config_key: &'static str| match column {
            Some(col) => find(col, config_key).map(Some),
            None => Ok(None),
        };
        let c = &self.config;
        let payload = find(&c.payload_field, "table.field.event.payload")?;
        let mut extra = Vec::with_capacity(c.additional.len());
        for a in &c.additional {
            let Some(index) = position(&a.column) else {
                if c.additional_missing_ignore {
                    continue;
                }
                return Err(RouteError::MissingColumn {
                    table: table.clone(),
                    column: a.column.clone(),
                    config_key: "table.fields.additional.placement",
                });
            };
            let name: Arc<str> = match &a.placement {
                Placement::Header(alias) | Placement::Envelope(alias) => Arc::from(alias.as_str()),
                Placement::Partition => Arc::from(a.column.as_str()),
            };
            let type_oid = relation.columns.get(index).map_or(0, |c| c.type_oid);
            extra.push(ResolvedExtra { index, placement: a.placement.clone(), name, json: json_kind(type_oid) });
        }
        Ok(ResolvedRelation {
            id: find(&c.id_field, "table.field.event.id")?,
            key: find(&c.key_field, "table.field.event.key")?,
            route: find(&c.route_by_field, "route.by.field")?,
            payload_json: json_kind(relation.columns.get(payload).map_or(0, |c| c.type_oid)),
            payload,
            event_type: optional(&c.event_type_field, "table.field.event.type")?,
            timestamp: optional(&c.timestamp_field, "table.field.event.timestamp")?,
            headers: optional(&c.headers_field, "table.field.event.headers")?,
            extra,
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
        let mut timestamp = None;
        let mut headers_json = None;
        let mut extra: Vec<Option<ColumnValue>> = vec![None; rel.extra.len()];
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
                event_type = Some(value.clone());
            }
            if Some(index) == rel.timestamp {
                timestamp = Some(value.clone());
            }
            if Some(index) == rel.headers {
                headers_json = Some(value.clone());
            }
            for (slot, e) in extra.iter_mut().zip(&rel.extra) {
                if e.index == index {
                    *slot = Some(value.clone());
                }
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
        let payload = bytes_of(payload, &rel.table, &c.payload_field)?.filter(|p| !p.is_empty());
        if payload.is_none() && !c.tombstone_on_empty_payload {
            return Err(RouteError::EmptyPayload { table: rel.table.clone(), column: c.payload_field.clone() });
        }
        let mut headers = Vec::with_capacity(2 + rel.extra.len());
        headers.push((self.header_id.clone(), event_id.clone()));
        if let Some(col) = &c.event_type_field {
            if let Some(t) = bytes_of(event_type, &rel.table, col)? {
                headers.push((self.header_type.clone(), t));
            }
        }
        let timestamp_ms = match (&c.timestamp_field, timestamp) {
            (Some(col), Some(v)) => match bytes_of(Some(v), &rel.table, col)? {
                Some(text) => Some(parse_timestamp_ms(&text).ok_or_else(|| RouteError::BadValue {
                    table: rel.table.clone(),
                    column: col.clone(),
                    config_key: "table.field.event.timestamp",
                    value: String::from_utf8_lossy(&text).into_owned(),
                    expected: "a timestamp (YYYY-MM-DD HH:MM:SS[.ffffff][+HH[:MM]])",
                })?),
                None => None,
            },
            _ => None,
        };
        if let (Some(col), Some(v)) = (&c.headers_field, headers_json) {
            if let Some(json) = bytes_of(Some(v), &rel.table, col)? {
                expand_json_headers(&json, &mut headers).map_err(|expected| RouteError::BadValue {
                    table: rel.table.clone(),
                    column: col.clone(),
                    config_key: "table.field.event.headers",
                    value: "(not shown)".into(),
                    expected,
                })?;
            }
        }
        let mut partition = None;
        let mut envelope: Vec<(&ResolvedExtra, Option<Bytes>)> = Vec::new();
        for (e, v) in rel.extra.iter().zip(extra) {
            let v = bytes_of(v, &rel.table, &e.name)?;
            match &e.placement {
                Placement::Header(_) => {
                    if let Some(v) = v {
                        headers.push((e.name.clone(), v));
                    }
                }
                Placement::Envelope(_) => envelope.push((e, v)),
                Placement::Partition => {
                    let text = v.unwrap_or_default();
                    let p = std::str::from_utf8(&text).ok().and_then(|t| t.parse::<i32>().ok()).filter(|p| *p >= 0);
                    partition = Some(p.ok_or_else(|| RouteError::BadValue {
                        table: rel.table.clone(),
                        column: e.name.to_string(),
                        config_key: "table.fields.additional.placement",
                        value: String::from_utf8_lossy(&text).into_owned(),
                        expected: "a non-negative integer partition number",
                    })?);
                }
            }
        }
        let value = if envelope.is_empty() {
            payload
        } else {
            Some(build_envelope(payload.as_ref(), rel.payload_json, &envelope))
        };
        let topic = self.topic_for(route_value)?;
        Ok(Record { topic, key, value, headers, event_id, timestamp_ms, partition })
    }

    /// The id, key and payload of a row that could not be routed, as far as they can be
    /// read: for dead-letter records.
    pub fn salvage(&self, rel: &ResolvedRelation, row: &TupleData) -> (Option<Bytes>, Option<Bytes>, Option<Bytes>) {
        let get = |i: usize| match row.get(i) {
            Some(ColumnValue::Text(b)) | Some(ColumnValue::Binary(b)) => Some(b),
            _ => None,
        };
        (get(rel.id), get(rel.key), get(rel.payload))
    }

    /// Routes a table-less event: a JSON object written with `pg_logical_emit_message`,
    /// whose fields are named by the same options as an outbox table's columns
    /// (`route.by.field`, `table.field.event.key`, `...id`, `...payload`, `...type`).
    /// The payload is the field's JSON text, a slice of `content` (no copy).
    pub fn route_json(&mut self, content: &Bytes, source: &str) -> Result<Record, RouteError> {
        let map: HashMap<String, &serde_json::value::RawValue> =
            serde_json::from_slice(content).map_err(|_| RouteError::BadValue {
                table: source.to_owned(),
                column: "(message content)".into(),
                config_key: "messages.prefix.include",
                value: "(not shown)".into(),
                expected: "a JSON object",
            })?;
        let c = &self.config;
        // Strings are unescaped (a key or topic is the string, not its JSON quoting);
        // numbers and other values keep their JSON text.
        let text = |name: &str| -> Option<Bytes> {
            let raw = map.get(name)?.get();
            if raw == "null" {
                return None;
            }
            match serde_json::from_str::<String>(raw) {
                Ok(s) => Some(Bytes::from(s)),
                Err(_) => Some(Bytes::copy_from_slice(raw.as_bytes())),
            }
        };
        let required = |name: &str, config_key: &'static str| {
            text(name).ok_or_else(|| RouteError::NullField {
                table: source.to_owned(),
                column: name.to_owned(),
                config_key,
            })
        };
        let key = required(&c.key_field, "table.field.event.key")?;
        let route_value = required(&c.route_by_field, "route.by.field")?;
        let event_id = required(&c.id_field, "table.field.event.id")?;
        let payload = map.get(c.payload_field.as_str()).map(|raw| raw.get()).filter(|raw| *raw != "null").map(|raw| {
            let offset = raw.as_ptr() as usize - content.as_ptr() as usize;
            content.slice(offset..offset + raw.len())
        });
        if payload.is_none() && !c.tombstone_on_empty_payload {
            return Err(RouteError::EmptyPayload { table: source.to_owned(), column: c.payload_field.clone() });
        }
        let mut headers = vec![(self.header_id.clone(), event_id.clone())];
        if let Some(t) = c.event_type_field.as_deref().and_then(text) {
            headers.push((self.header_type.clone(), t));
        }
        let topic = self.topic_for(route_value)?;
        Ok(Record { topic, key, value: payload, headers, event_id, timestamp_ms: None, partition: None })
    }

    fn topic_for(&mut self, route_value: Bytes) -> Result<Arc<str>, RouteError> {
        if let Some(t) = self.topics.get(&route_value) {
            return Ok(t.clone());
        }
        let value = String::from_utf8_lossy(&route_value);
        let topic = match &self.regex {
            None => self.config.topic_pattern.replace(ROUTED_BY_VALUE, &value),
            Some(re) => match re.captures(&value) {
                Some(caps) => {
                    let mut out = String::new();
                    caps.expand(&self.config.topic_pattern, &mut out);
                    out
                }
                // Debezium's RegexRouter leaves a non-matching name unchanged.
                None => value.into_owned(),
            },
        };
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
        Some(ColumnValue::UnchangedToast) => {
            Err(RouteError::UnchangedToast { table: table.to_owned(), column: column.to_owned() })
        }
    }
}

/// `{"payload": <payload>, "<alias>": <value>, ...}`; the payload bytes are copied in
/// verbatim when the column is JSON (no re-serialisation of the payload).
fn build_envelope(
    payload: Option<&Bytes>,
    payload_kind: JsonKind,
    fields: &[(&ResolvedExtra, Option<Bytes>)],
) -> Bytes {
    let mut out = Vec::with_capacity(payload.map_or(0, |p| p.len()) + 64 * (fields.len() + 1));
    out.extend_from_slice(b"{\"payload\":");
    write_json_value(&mut out, payload.map(|p| p.as_ref()), payload_kind);
    for (field, value) in fields {
        out.push(b',');
        write_json_string(&mut out, field.name.as_bytes());
        out.push(b':');
        write_json_value(&mut out, value.as_deref(), field.json);
    }
    out.push(b'}');
    Bytes::from(out)
}

fn write_json_value(out: &mut Vec<u8>, value: Option<&[u8]>, kind: JsonKind) {
    match (value, kind) {
        (None, _) => out.extend_from_slice(b"null"),
        (Some(v), JsonKind::Raw) => out.extend_from_slice(v),
        (Some(v), JsonKind::Bool) => out.extend_from_slice(if v == b"t" || v == b"true" { b"true" } else { b"false" }),
        (Some(v), JsonKind::String) => write_json_string(out, v),
    }
}

fn write_json_string(out: &mut Vec<u8>, s: &[u8]) {
    out.push(b'"');
    for ch in String::from_utf8_lossy(s).chars() {
        match ch {
            '"' => out.extend_from_slice(b"\\\""),
            '\\' => out.extend_from_slice(b"\\\\"),
            '\n' => out.extend_from_slice(b"\\n"),
            '\r' => out.extend_from_slice(b"\\r"),
            '\t' => out.extend_from_slice(b"\\t"),
            c if (c as u32) < 0x20 => {
                let mut buf = String::new();
                let _ = write!(buf, "\\u{:04x}", c as u32);
                out.extend_from_slice(buf.as_bytes());
            }
            c => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    out.push(b'"');
}

/// One header per key of a JSON object; strings unquoted, other values as JSON text.
fn expand_json_headers(json: &[u8], headers: &mut Vec<(Arc<str>, Bytes)>) -> Result<(), &'static str> {
    let map: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(json).map_err(|_| "a JSON object")?;
    for (k, v) in map {
        let value = match v {
            serde_json::Value::String(s) => Bytes::from(s),
            other => Bytes::from(other.to_string()),
        };
        headers.push((Arc::from(k.as_str()), value));
    }
    Ok(())
}

/// Parses PostgreSQL's ISO text form of timestamp/timestamptz (walpost's connections
/// set DateStyle=ISO and TimeZone=UTC): `2026-11-29 08:00:00.123456+00`.
pub fn parse_timestamp_ms(text: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(text).ok()?.trim();
    let (date, rest) = s.split_once([' ', 'T'])?;
    let mut d = date.split('-');
    let (y, mo, da): (i64, i64, i64) = (d.next()?.parse().ok()?, d.next()?.parse().ok()?, d.next()?.parse().ok()?);
    // Split the time from an offset: the last '+' or '-' after the seconds.
    let (time, offset_secs) = match rest.rfind(['+', '-']) {
        Some(i) if i >= 8 => {
            let (t, off) = rest.split_at(i);
            let sign = if off.starts_with('-') { -1 } else { 1 };
            let mut parts = off.get(1..)?.split(':');
            let h: i64 = parts.next()?.parse().ok()?;
            let m: i64 = parts.next().map_or(Some(0), |m| m.parse().ok())?;
            let sec: i64 = parts.next().map_or(Some(0), |x| x.parse().ok())?;
            (t, sign * (h * 3600 + m * 60 + sec))
        }
        _ => (rest, 0),
    };
    let mut t = time.split(':');
    let (h, mi): (i64, i64) = (t.next()?.parse().ok()?, t.next()?.parse().ok()?);
    let sec_text = t.next()?;
    let (sec, frac) = sec_text.split_once('.').unwrap_or((sec_text, ""));
    let sec: i64 = sec.parse().ok()?;
    let millis: i64 = format!("{frac:0<3}").get(..3)?.parse().ok()?;
    if !(1..=12).contains(&mo) || !(1..=31).contains(&da) || h > 24 || mi > 59 || sec > 60 {
        return None;
    }
    // Days from the civil date (proleptic Gregorian), as in Howard Hinnant's algorithm.
    let yy = if mo <= 2 { y - 1 } else { y };
    let era = yy.div_euclid(400);
    let yoe = yy - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + da - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 86_400 + h * 3600 + mi * 60 + sec - offset_secs) * 1000) + millis)
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
mod tests;
