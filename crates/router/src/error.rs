//! Why a row cannot become a record, or a configuration cannot become a router.
//!
//! The texts name the table, the column, the option and the event id (when it can be
//! read), never a column value: the `topic`/`value` fields are `None` unless the router
//! was built with `log_values = true` (see [`crate::RouterConfig::log_values`]).

/// A row that cannot become a record, or an invalid router configuration.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum RouteError {
    #[error("table {table} has no column \"{column}\" (set by {config_key}): add the column or point {config_key} at an existing one")]
    MissingColumn { table: String, column: String, config_key: &'static str },
    #[error("column \"{column}\" of {table} (set by {config_key}) is NULL in {}: the event cannot be routed", event(.event_id))]
    NullField { table: String, column: String, config_key: &'static str, event_id: Option<Box<str>> },
    #[error(
        "the payload column \"{column}\" of {table} is NULL or empty in {} and route.tombstone.on.empty.payload is false",
        event(.event_id)
    )]
    EmptyPayload { table: String, column: String, event_id: Option<Box<str>> },
    #[error("column \"{column}\" of {table} arrived as an unchanged TOAST value in {}, which an INSERT never carries", event(.event_id))]
    UnchangedToast { table: String, column: String, event_id: Option<Box<str>> },
    #[error("the topic route.topic.replacement made from column \"{column}\" of {table} in {}{} is not a valid Kafka topic name: {reason}", event(.event_id), shown("topic", .topic))]
    InvalidTopic {
        table: String,
        column: String,
        event_id: Option<Box<str>>,
        topic: Option<Box<str>>,
        reason: &'static str,
    },
    #[error("the topic route.topic.replacement made from column \"{column}\" of {table} in {}{} is refused: {reason}", event(.event_id), shown("topic", .topic))]
    TopicNotAllowed {
        table: String,
        column: String,
        event_id: Option<Box<str>>,
        topic: Option<Box<str>>,
        reason: &'static str,
    },
    #[error("the topic route.topic.replacement made from column \"{column}\" of {table} in {}{} would be the router's topic number {}, but topics.max is {max}: rows must not open topics without bound; raise topics.max if the topics are meant, or fix the rows", event(.event_id), shown("topic", .topic), .max + 1)]
    TooManyTopics { table: String, column: String, event_id: Option<Box<str>>, topic: Option<Box<str>>, max: usize },
    #[error("the value of column \"{column}\" of {table} (route.by.field) in {}{} does not match route.topic.regex: fix the row or the regex, or set route.topic.regex.fallthrough = true to use such a value as the topic name as Debezium does", event(.event_id), shown("value", .value))]
    RouteNoMatch { table: String, column: String, event_id: Option<Box<str>>, value: Option<Box<str>> },
    #[error("the row of {table} holding {} is {size} bytes in the WAL, over the per-message limit of {limit} bytes ([pipeline] max_message_bytes): it was not read whole, so it cannot be published", event(.event_id))]
    TooLarge { table: String, event_id: Option<Box<str>>, size: usize, limit: usize },
    #[error("row has {got} columns but relation {table} describes {expected}")]
    ColumnCountMismatch { table: String, got: usize, expected: usize },
    #[error("column \"{column}\" of {table} ({config_key}) in {} has a value{} that is not {expected}", event(.event_id), shown("value", .value))]
    BadValue {
        table: String,
        column: String,
        config_key: &'static str,
        event_id: Option<Box<str>>,
        value: Option<Box<str>>,
        expected: &'static str,
    },
    #[error("{} of {table}{} breaks its contract: {breach}", event(.event_id), of_type(.event_type))]
    ContractBroken {
        table: String,
        event_id: Option<Box<str>>,
        event_type: Option<Box<str>>,
        breach: Box<crate::contract::Breach>,
    },
    /// Transient: the contract could not be read (a registry down); the event is tried
    /// again, never published unchecked.
    #[error("cannot check {} of {table} against its contract now: {reason}", event(.event_id))]
    ContractUnavailable { table: String, event_id: Option<Box<str>>, reason: String },
    #[error("route.topic.regex '{0}' is not a valid regular expression")]
    BadRegex(String),
    #[error("{key}: {reason}")]
    InvalidOption { key: &'static str, reason: String },
}

/// Every [`RouteError::class`], for metrics that declare their label values up front.
pub const ERROR_CLASSES: &[&str] = &[
    "missing_column",
    "null_field",
    "empty_payload",
    "unchanged_toast",
    "invalid_topic",
    "topic_not_allowed",
    "too_many_topics",
    "route_no_match",
    "message_too_large",
    "column_count",
    "bad_value",
    "contract_broken",
    "contract_unavailable",
    "bad_regex",
    "invalid_option",
];

impl RouteError {
    /// A short, stable class name for metrics and dead-letter headers (one of
    /// [`ERROR_CLASSES`]).
    pub fn class(&self) -> &'static str {
        match self {
            RouteError::MissingColumn { .. } => "missing_column",
            RouteError::NullField { .. } => "null_field",
            RouteError::EmptyPayload { .. } => "empty_payload",
            RouteError::UnchangedToast { .. } => "unchanged_toast",
            RouteError::InvalidTopic { .. } => "invalid_topic",
            RouteError::TopicNotAllowed { .. } => "topic_not_allowed",
            RouteError::TooManyTopics { .. } => "too_many_topics",
            RouteError::RouteNoMatch { .. } => "route_no_match",
            RouteError::TooLarge { .. } => "message_too_large",
            RouteError::ColumnCountMismatch { .. } => "column_count",
            RouteError::BadValue { .. } => "bad_value",
            RouteError::ContractBroken { .. } => "contract_broken",
            RouteError::ContractUnavailable { .. } => "contract_unavailable",
            RouteError::BadRegex(_) => "bad_regex",
            RouteError::InvalidOption { .. } => "invalid_option",
        }
    }

    /// The event id the error is about, when the row's id could be read.
    pub fn event_id(&self) -> Option<&str> {
        match self {
            RouteError::NullField { event_id, .. }
            | RouteError::EmptyPayload { event_id, .. }
            | RouteError::UnchangedToast { event_id, .. }
            | RouteError::InvalidTopic { event_id, .. }
            | RouteError::TopicNotAllowed { event_id, .. }
            | RouteError::TooManyTopics { event_id, .. }
            | RouteError::TooLarge { event_id, .. }
            | RouteError::RouteNoMatch { event_id, .. }
            | RouteError::BadValue { event_id, .. }
            | RouteError::ContractBroken { event_id, .. }
            | RouteError::ContractUnavailable { event_id, .. } => event_id.as_deref(),
            RouteError::MissingColumn { .. }
            | RouteError::ColumnCountMismatch { .. }
            | RouteError::BadRegex(_)
            | RouteError::InvalidOption { .. } => None,
        }
    }
}

fn event(event_id: &Option<Box<str>>) -> String {
    match event_id {
        Some(id) => format!("event id {id}"),
        None => "a row without a readable event id".into(),
    }
}

fn of_type(event_type: &Option<Box<str>>) -> String {
    match event_type {
        Some(t) => format!(" (event type {t})"),
        None => String::new(),
    }
}

fn shown(what: &str, value: &Option<Box<str>>) -> String {
    match value {
        Some(v) => format!(" ({what} '{v}', shown because log_values = true)"),
        None => String::new(),
    }
}

/// Longest event id or value text an error carries.
const SHOWN_MAX_CHARS: usize = 200;

/// The text of an event id or (with `log_values`) a value for an error message.
pub(crate) fn display_text(bytes: &[u8]) -> Box<str> {
    let text = String::from_utf8_lossy(bytes);
    match text.char_indices().nth(SHOWN_MAX_CHARS) {
        Some((cut, _)) => format!("{}...", text.get(..cut).unwrap_or_default()).into(),
        None => text.into(),
    }
}
