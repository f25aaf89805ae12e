//! The router's configuration: which columns mean what, and how topics are named.

use crate::cloudevents::CloudEventsConfig;
use crate::options::AdditionalField;

/// The placeholder in the topic pattern.
pub const ROUTED_BY_VALUE: &str = "${routedByValue}";
/// The default of [`RouterConfig::topics_max`].
pub(crate) const DEFAULT_TOPICS_MAX: usize = 1000;
/// Debezium's default `route.topic.regex`.
pub const DEFAULT_TOPIC_REGEX: &str = "(?<routedByValue>.*)";
/// walpost's option naming the column of the `eventType` header
/// ([`RouterConfig::event_type_header_field`]); it replaces `table.field.event.type`.
pub const EVENT_TYPE_HEADER_OPTION: &str = "table.field.event.type.header";
/// walpost's name of the trace context column ([`RouterConfig::tracing_field`]).
pub const TRACING_OPTION: &str = "table.field.event.tracing";
/// Debezium's name of the same option.
pub const DEBEZIUM_TRACING_OPTION: &str = "tracing.span.context.field";

/// Which columns mean what, and how topics are named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouterConfig {
    /// `route.by.field`.
    pub route_by_field: String,
    /// `route.topic.regex`; `None` is Debezium's default, [`DEFAULT_TOPIC_REGEX`].
    pub topic_regex: Option<String>,
    /// `route.topic.regex.fallthrough` (walpost): a route value the regex does not match
    /// becomes the topic as it is (Debezium's behaviour) instead of an error.
    pub topic_regex_fallthrough: bool,
    /// `route.topic.replacement`.
    pub topic_pattern: String,
    /// `topics.allow` (walpost): topic prefixes, `re:<regex>` entries or `*`; `None`:
    /// the literal prefix of [`RouterConfig::topic_pattern`]. See
    /// [`TopicGuard`](crate::TopicGuard).
    pub topics_allow: Option<Vec<String>>,
    /// `topics.max` (walpost): how many distinct topics this router may route to; a row
    /// that would open one more is a routing error (halt or dead letter), so row values
    /// cannot create topics without bound.
    pub topics_max: usize,
    /// Topics walpost itself writes (its dead-letter and progress topics): never a
    /// destination for a row, whatever `topics.allow` says.
    pub reserved_topics: Vec<String>,
    /// `table.field.event.key`.
    pub key_field: String,
    /// `table.field.event.payload`.
    pub payload_field: String,
    /// `table.field.event.id`.
    pub id_field: String,
    /// [`EVENT_TYPE_HEADER_OPTION`] (walpost): column copied into the `eventType` header;
    /// `None` for none, which is Debezium's output.
    pub event_type_header_field: Option<String>,
    /// `table.field.event.timestamp`: record timestamp from this column.
    pub timestamp_field: Option<String>,
    /// `table.field.event.headers` (walpost): a JSON object column whose keys become headers.
    pub headers_field: Option<String>,
    /// [`TRACING_OPTION`] (Debezium's `tracing.span.context.field`): a column holding the
    /// writer's trace context as Debezium serialises it (`traceparent=...`).
    pub tracing_field: Option<String>,
    /// `envelope = "cloudevents"` (walpost): records are CloudEvents (see
    /// [`crate::cloudevents`]); `None`: Debezium's records.
    pub cloudevents: Option<CloudEventsConfig>,
    /// `table.fields.additional.placement`.
    pub additional: Vec<AdditionalField>,
    /// `table.field.additional.missing = ignore`: placements of missing columns are skipped.
    pub additional_missing_ignore: bool,
    /// `route.tombstone.on.empty.payload`.
    pub tombstone_on_empty_payload: bool,
    /// `log_values` (walpost): errors may show the column value or topic they are about.
    /// Off by default: errors then name only the table, column, option and event id.
    pub log_values: bool,
    /// `[contracts]` (walpost): the check every payload passes before it becomes a
    /// record; `None`: none.
    pub contract: Option<crate::ContractRef>,
}

impl Default for RouterConfig {
    fn default() -> Self {
        RouterConfig {
            route_by_field: "aggregate_type".into(),
            topic_regex: None,
            topic_regex_fallthrough: false,
            topic_pattern: format!("outbox.event.{ROUTED_BY_VALUE}"),
            topics_allow: None,
            topics_max: DEFAULT_TOPICS_MAX,
            reserved_topics: Vec::new(),
            key_field: "aggregate_id".into(),
            payload_field: "payload".into(),
            id_field: "id".into(),
            event_type_header_field: Some("event_type".into()),
            timestamp_field: None,
            headers_field: None,
            tracing_field: None,
            cloudevents: None,
            additional: Vec::new(),
            additional_missing_ignore: false,
            tombstone_on_empty_payload: false,
            log_values: false,
            contract: None,
        }
    }
}
