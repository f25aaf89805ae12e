//! The Outbox Event Router: one INSERTed outbox row in, one Kafka record out.
//!
//! Semantics and option names follow Debezium's Outbox Event Router
//! (`outbox-event-router.adoc`); CONFORMANCE.md beside this crate lists every case the
//! conformance suite (`tests/conformance.rs`) checks and every deliberate difference.
//!
//! - topic: the `route.by.field` value matched by `route.topic.regex` (whole value, default
//!   `(?<routedByValue>.*)`) and rewritten by `route.topic.replacement` (default
//!   `outbox.event.${routedByValue}`; Java's replacement syntax: `$1`, `${name}`, `\$`).
//!   A value the regex does not match is a [`RouteError::RouteNoMatch`]; with
//!   `route.topic.regex.fallthrough = true` it is used as the topic unchanged, as
//!   Debezium's RegexRouter does. Every topic then passes the [`TopicGuard`].
//! - key: `table.field.event.key`; value: `table.field.event.payload`. Text, json, jsonb,
//!   uuid and numbers are the bytes PostgreSQL sent (never re-serialised); bytea is
//!   decoded from its text form to its bytes (see [`value`] for every type).
//! - value shape: with any `:envelope` placement configured the value is
//!   `{"payload": <payload>, "<alias>": <value>, ...}` for every row, whether or not the
//!   row's table has the column (`table.field.additional.missing = ignore` leaves the
//!   field out, not the envelope); json/jsonb payloads are copied into it verbatim.
//! - tombstone: with `route.tombstone.on.empty.payload = true` a NULL payload, or a text
//!   one that is empty after trimming, is a record with no value, envelope or not.
//!   Without it, such a row is [`RouteError::EmptyPayload`] (Debezium would emit it).
//! - headers: `id` (always), `:header` placements, one per key of a JSON object column
//!   (`table.field.event.headers`, a walpost extension; strings unquoted, so a W3C
//!   `traceparent` arrives intact), and `eventType` from
//!   [`RouterConfig::event_type_header_field`] (a walpost extension, option
//!   [`EVENT_TYPE_HEADER_OPTION`]: Debezium 0.9-1.1 put its `table.field.event.type`
//!   column into the value envelope, and Debezium 1.2 and later neither document nor read
//!   that option). Header values are what Kafka's `SimpleHeaderConverter` writes for
//!   Debezium's value: booleans `true`/`false`, bytea in base64. A NULL header column adds
//!   no header.
//! - timestamp: `table.field.event.timestamp` (timestamp or timestamptz, in ms; NULL:
//!   none), else the caller's commit time. Parsed with `jiff`.
//! - partition: a `:partition` placement (an integer column; NULL: none), else the
//!   partitioner.
//! - contract: with [`RouterConfig::contract`] set, every payload (not tombstones) is
//!   checked against its event type's contract before the envelope is built; a breach is
//!   [`RouteError::ContractBroken`] (see [`contract`]).
//!
//! walpost's own options beside Debezium's: [`RouterConfig::topics_allow`]
//! (`topics.allow`), [`RouterConfig::topic_regex_fallthrough`]
//! (`route.topic.regex.fallthrough`), [`RouterConfig::log_values`] (`log_values`),
//! [`RouterConfig::headers_field`] and [`RouterConfig::event_type_header_field`].
//! [`DEBEZIUM_OPTIONS_IMPLEMENTED`] and [`DEBEZIUM_OPTIONS_NOT_IMPLEMENTED`] list
//! Debezium's.
//!
//! Invariants:
//! - Columns are found by name in the relation the server last described, so columns
//!   added or reordered mid-stream do not break routing.
//! - A row that cannot be routed is an error naming the table, column, option and event
//!   id, never a silently dropped event; the error carries no column value unless
//!   `log_values` is set.
//! - Every topic a record gets is a valid Kafka name, outside Kafka's internal `__` topics,
//!   and allowed by `topics.allow`.
//! - Key and payload bytes of text-like columns are `Bytes` slices of the decoded message:
//!   no copies. No input panics.

pub mod cloudevents;
mod config;
pub mod contract;
mod error;
mod options;
mod route;
mod topic;
pub mod tracecontext;
pub mod value;

pub use cloudevents::{CloudEventsConfig, CloudEventsMode};
pub use config::{
    RouterConfig, DEBEZIUM_TRACING_OPTION, DEFAULT_TOPIC_REGEX, EVENT_TYPE_HEADER_OPTION, ROUTED_BY_VALUE,
    TRACING_OPTION,
};
pub use contract::{Breach, BreachReason, Checked, ContractError, ContractRef, Event, PayloadContract};
pub use error::{RouteError, ERROR_CLASSES};
pub use options::{
    AdditionalField, Placement, ADDITIONAL_PLACEMENT, DEBEZIUM_OPTIONS_IMPLEMENTED, DEBEZIUM_OPTIONS_NOT_IMPLEMENTED,
};
pub use route::{Record, ResolvedRelation, Router, SalvageColumns, HEADER_EVENT_TYPE, HEADER_ID};
pub use topic::{
    validate_topic, TopicGuard, TopicRejection, INTERNAL_TOPIC_PREFIX, TOPICS_ALLOW_ANY, TOPICS_ALLOW_REGEX,
};
pub use tracecontext::{TraceOutcome, TraceParent};
pub use value::{decode_bytea, parse_timestamp, parse_timestamp_ms};

#[cfg(test)]
mod proptests;
