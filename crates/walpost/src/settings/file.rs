//! The TOML file as the user writes it: every key optional, unknown keys refused
//! (`deny_unknown_fields`), nothing validated yet. [`super::resolve`] turns it (with
//! the flags and `WALPOST_*` variables) into [`super::Settings`].
//!
//! The same structs serialise back to TOML for `walpost import-debezium`, so what it
//! prints is exactly what this parser reads.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::duration::{Millis, Seconds};
use super::{ConfigError, ContractsFile, DeliveryMode, Envelope, OnPermanentError, RegistryFile, SnapshotMode};

mod admin;
mod inbox;
pub use admin::AdminFile;
pub use inbox::{InboxDedup, InboxFile, InboxOnInvalid, InboxStartFrom};

/// The whole file. A section of [`super::Settings`] reads its table here (`[pipeline]`:
/// the stream's, `[monitor]`, `[retention]`, `[inbox]`...) or, for the sections users'
/// files spell as top-level keys, those keys: `postgres*` (postgres), `table`, `slot*`,
/// `publication`, `heartbeat_interval_secs`, `signal_table`, `envelope` (source),
/// `on_permanent_error`, `dead_letter_topic`, `log_values`, `delivery` (kafka),
/// `snapshot*`, `metrics_addr` (telemetry). They stay top-level fields rather than
/// flattened structs: serde cannot refuse unknown keys through `flatten`.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub postgres: Option<String>,
    /// A file holding the PostgreSQL password (owner-only), when the connection string
    /// has none; it wins over PGPASSWORD.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub postgres_password_file: Option<std::path::PathBuf>,
    /// Decoding on a standby: the primary, where walpost writes (heartbeat, lineage
    /// record, publication, retention, snapshot progress). Default: `postgres`'s hosts
    /// with `target_session_attrs=read-write`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub postgres_primary: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub table: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slot: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub publication: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_addr: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<SnapshotMode>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot_filter: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub heartbeat_interval_secs: Option<Seconds>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slot_failover: Option<bool>,
    /// A table in Debezium's signal format (`id`, `type`, `data`): an `execute-snapshot`
    /// row replays outbox rows while the stream goes on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal_table: Option<String>,
    /// `halt` (default) or `dead_letter`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub on_permanent_error: Option<OnPermanentError>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dead_letter_topic: Option<String>,
    /// Errors, log lines and dead-letter headers may show column values (off: they
    /// name the event id, column and LSN instead).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_values: Option<bool>,
    /// `at-least-once` (default) or `exactly-once`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delivery: Option<DeliveryMode>,
    #[serde(default, skip_serializing_if = "ExactlyOnceFile::is_empty")]
    pub exactly_once: ExactlyOnceFile,
    /// `none` (default) or `cloudevents`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub envelope: Option<Envelope>,
    #[serde(default, skip_serializing_if = "CloudEventsFile::is_empty")]
    pub cloudevents: CloudEventsFile,
    /// JSON Schema contracts per event type (see docs/contracts.md).
    #[serde(default, skip_serializing_if = "ContractsFile::is_empty")]
    pub contracts: ContractsFile,
    #[serde(default, skip_serializing_if = "RegistryFile::is_empty")]
    pub registry: RegistryFile,
    #[serde(default)]
    pub kafka: KafkaFile,
    #[serde(default)]
    pub router: RouterFile,
    #[serde(default, skip_serializing_if = "PipelineFile::is_empty")]
    pub pipeline: PipelineFile,
    #[serde(default, skip_serializing_if = "MonitorFile::is_empty")]
    pub monitor: MonitorFile,
    /// Partition retention (see `crate::retention`).
    #[serde(default, skip_serializing_if = "RetentionFile::is_empty")]
    pub retention: RetentionFile,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outbox: Vec<OutboxFile>,
    #[serde(default, skip_serializing_if = "MessagesFile::is_empty")]
    pub messages: MessagesFile,
    /// Who may write the signal table (with `signal_table`).
    #[serde(default, skip_serializing_if = "SignalFile::is_empty")]
    pub signal: SignalFile,
    /// `walpost inbox`: Kafka into a consuming service's inbox tables.
    #[serde(default, skip_serializing_if = "InboxFile::is_empty")]
    pub inbox: InboxFile,
    /// The admin API listener (docs/control-plane.md).
    #[serde(default, skip_serializing_if = "AdminFile::is_empty")]
    pub admin: AdminFile,
}

impl FileConfig {
    /// Reads and parses `path`. A parse error names the key or position, never the
    /// text of the line (it may hold a secret).
    pub fn load(path: &Path) -> Result<FileConfig, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.display().to_string(), source })?;
        let file = FileConfig::parse(&text)
            .map_err(|message| ConfigError::Parse { path: path.display().to_string(), message })?;
        if let Some(secret) = file.secret_held() {
            super::secrets::require_private(path, secret)?;
        }
        Ok(file)
    }

    /// What secret the file itself holds, if any (a password in `postgres`, a secret
    /// Kafka property).
    pub fn secret_held(&self) -> Option<&'static str> {
        let has_password = |url: &Option<String>| {
            url.as_deref()
                .and_then(|url| replication::Config::parse_with_env(url, &|_| None).ok())
                .is_some_and(|c| c.password().is_some())
        };
        if has_password(&self.postgres) {
            return Some("a PostgreSQL password (in postgres)");
        }
        if has_password(&self.postgres_primary) {
            return Some("a PostgreSQL password (in postgres_primary)");
        }
        super::secrets::has_kafka_secret(self.kafka.properties.keys())
            .map(|_| "a secret Kafka property (in [kafka.properties])")
    }

    /// Parses a file's text. Debezium options walpost does not implement are refused
    /// by name with the reason (before the generic "unknown field").
    pub fn parse(text: &str) -> Result<FileConfig, String> {
        let table: toml::Table = toml::from_str(text).map_err(|e| parse_error_message(&e, text))?;
        for (section, router) in router_tables(&table) {
            for key in router.keys() {
                if let Some((_, why)) = router::DEBEZIUM_OPTIONS_NOT_IMPLEMENTED.iter().find(|(k, _)| k == key) {
                    return Err(format!(
                        "[{section}] \"{key}\" is a Debezium option walpost does not implement: {why}"
                    ));
                }
            }
        }
        // From the text again (not the table): the error then knows its line.
        toml::from_str(text).map_err(|e: toml::de::Error| parse_error_message(&e, text))
    }
}

/// Every router table of a file: `[router]`, `[[outbox]]`'s `router`, `[messages.router]`.
fn router_tables(table: &toml::Table) -> Vec<(&'static str, &toml::Table)> {
    let mut out = Vec::new();
    if let Some(r) = table.get("router").and_then(toml::Value::as_table) {
        out.push(("router", r));
    }
    for outbox in table.get("outbox").and_then(toml::Value::as_array).into_iter().flatten() {
        if let Some(r) = outbox.get("router").and_then(toml::Value::as_table) {
            out.push(("outbox.router", r));
        }
    }
    if let Some(r) = table.get("messages").and_then(|m| m.get("router")).and_then(toml::Value::as_table) {
        out.push(("messages.router", r));
    }
    out
}

/// `toml`'s error text quotes the offending line (which may hold a secret): keep only
/// its position and message.
fn parse_error_message(e: &toml::de::Error, text: &str) -> String {
    let message = without_value(e.message());
    match e.span().and_then(|span| text.get(..span.start)) {
        Some(before) => {
            let line = before.matches('\n').count() + 1;
            let line_start = before.rsplit('\n').next().unwrap_or("");
            let column = line_start.chars().count() + 1;
            // The key the value belongs to, when the error is in a `key = value` line.
            match line_start.split_once('=').map(|(k, _)| k.trim()).filter(|k| !k.is_empty() && !k.starts_with('[')) {
                Some(key) => format!("TOML parse error at line {line}, column {column} ({key}): {message}"),
                None => format!("TOML parse error at line {line}, column {column}: {message}"),
            }
        }
        None => format!("TOML parse error: {message}"),
    }
}

/// serde's type errors quote the value (`invalid type: string "...", expected u64`),
/// which may be a secret in the wrong key: keep its kind, drop the value.
fn without_value(message: &str) -> String {
    let mut out = message.to_owned();
    for marker in ["invalid type: ", "invalid value: "] {
        if let Some(start) = out.find(marker).map(|i| i + marker.len()) {
            let end = out.get(start..).and_then(|rest| rest.find(", expected")).map_or(out.len(), |e| start + e);
            let kind = out.get(start..end).and_then(|v| v.split([' ', '"', '`']).next()).unwrap_or("").to_owned();
            out.replace_range(start..end, &format!("{kind} (value not shown)"));
        }
    }
    out
}

/// `[kafka]`.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaFile {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub brokers: Option<String>,
    /// librdkafka properties from a `key=value` file (owner-only when it holds a
    /// secret); `[kafka.properties]` and flags override it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub properties_file: Option<std::path::PathBuf>,
    /// Any librdkafka property, passed through (some are refused: see `crate::kafka`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub properties: BTreeMap<String, String>,
}

/// `[router]`, `[outbox.router]`, `[messages.router]`: Debezium's Event Router option
/// names. An option walpost does not know is an error naming it, never silently ignored.
#[derive(Debug, Default, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RouterFile {
    #[serde(rename = "route.by.field", skip_serializing_if = "Option::is_none")]
    pub route_by_field: Option<String>,
    #[serde(rename = "route.topic.regex", skip_serializing_if = "Option::is_none")]
    pub topic_regex: Option<String>,
    #[serde(rename = "route.topic.replacement", skip_serializing_if = "Option::is_none")]
    pub topic_replacement: Option<String>,
    /// A route value the regex does not match becomes the topic as it is (Debezium's
    /// behaviour) instead of a routing error (walpost).
    #[serde(rename = "route.topic.regex.fallthrough", skip_serializing_if = "Option::is_none")]
    pub topic_regex_fallthrough: Option<bool>,
    /// Topics records may go to: prefixes, `re:<regex>`, or `*` (walpost).
    #[serde(rename = "topics.allow", skip_serializing_if = "Option::is_none")]
    pub topics_allow: Option<Vec<String>>,
    /// How many distinct topics rows may be routed to (walpost; default 1000).
    #[serde(rename = "topics.max", skip_serializing_if = "Option::is_none")]
    pub topics_max: Option<u64>,
    #[serde(rename = "route.tombstone.on.empty.payload", skip_serializing_if = "Option::is_none")]
    pub tombstone_on_empty_payload: Option<bool>,
    #[serde(rename = "table.field.event.key", skip_serializing_if = "Option::is_none")]
    pub key_field: Option<String>,
    #[serde(rename = "table.field.event.payload", skip_serializing_if = "Option::is_none")]
    pub payload_field: Option<String>,
    #[serde(rename = "table.field.event.id", skip_serializing_if = "Option::is_none")]
    pub id_field: Option<String>,
    /// Column copied into the `eventType` header (walpost); "" for none.
    #[serde(rename = "table.field.event.type.header", skip_serializing_if = "Option::is_none")]
    pub event_type_header_field: Option<String>,
    /// Deprecated spelling of `table.field.event.type.header` (not a Debezium option
    /// since Debezium 1.2); accepted with a warning.
    #[serde(rename = "table.field.event.type", skip_serializing_if = "Option::is_none")]
    pub event_type_field: Option<String>,
    #[serde(rename = "table.field.event.timestamp", skip_serializing_if = "Option::is_none")]
    pub timestamp_field: Option<String>,
    /// A JSON object column whose keys become headers (walpost extension).
    #[serde(rename = "table.field.event.headers", skip_serializing_if = "Option::is_none")]
    pub headers_field: Option<String>,
    /// A column with the writer's trace context in Debezium's serialised form
    /// (`traceparent=...`); Debezium's name `tracing.span.context.field` is accepted.
    #[serde(
        rename = "table.field.event.tracing",
        alias = "tracing.span.context.field",
        skip_serializing_if = "Option::is_none"
    )]
    pub tracing_field: Option<String>,
    #[serde(rename = "table.fields.additional.placement", skip_serializing_if = "Option::is_none")]
    pub additional_placement: Option<String>,
    /// `error` (default) or `ignore`.
    #[serde(rename = "table.field.additional.missing", skip_serializing_if = "Option::is_none")]
    pub additional_missing: Option<String>,
    /// `warn` (default), `error` or `fatal`.
    #[serde(rename = "table.op.invalid.behavior", skip_serializing_if = "Option::is_none")]
    pub op_invalid_behavior: Option<String>,
    /// Accepted for compatibility: walpost always emits JSON payloads as JSON.
    #[serde(rename = "table.expand.json.payload", skip_serializing_if = "Option::is_none")]
    pub expand_json_payload: Option<bool>,
}

impl RouterFile {
    /// `self`, with unset keys taken from `base`.
    pub fn or(&self, base: &RouterFile) -> RouterFile {
        macro_rules! pick {
            ($($f:ident),*) => { RouterFile { $($f: self.$f.clone().or_else(|| base.$f.clone())),* } };
        }
        pick!(
            route_by_field,
            topic_regex,
            topic_replacement,
            topic_regex_fallthrough,
            topics_allow,
            topics_max,
            event_type_header_field,
            tombstone_on_empty_payload,
            key_field,
            payload_field,
            id_field,
            event_type_field,
            timestamp_field,
            headers_field,
            tracing_field,
            additional_placement,
            additional_missing,
            op_invalid_behavior,
            expand_json_payload
        )
    }
}

/// One more outbox table in the same slot and publication (`[[outbox]]`).
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OutboxFile {
    pub table: String,
    #[serde(default)]
    pub router: RouterFile,
}

/// The table-less outbox: `pg_logical_emit_message(true, '<prefix>', '<json>')`.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MessagesFile {
    /// Prefixes whose messages are events; none: messages are not requested.
    #[serde(rename = "prefix.include", default)]
    pub prefix_include: Vec<String>,
    /// Publish non-transactional messages too (they cannot be rolled back).
    #[serde(default)]
    pub allow_non_transactional: bool,
    /// JSON field names of the envelope, under the router's option names.
    #[serde(default)]
    pub router: RouterFile,
    /// Roles that may execute `pg_logical_emit_message`; walpost refuses to run while
    /// any other (PUBLIC included) can, since every such role could publish events.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_roles: Vec<String>,
    /// Accept every role that can execute it (not recommended).
    #[serde(default)]
    pub trust_all_roles: bool,
}

impl MessagesFile {
    fn is_empty(&self) -> bool {
        self.prefix_include.is_empty()
    }
}

/// `[signal]`: who may start replays through the signal table.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SignalFile {
    /// Roles that may INSERT into the signal table; walpost refuses to run while any
    /// other (PUBLIC included) can, since every such role could start replays.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_roles: Vec<String>,
    /// Accept every role that can insert signals (not recommended).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub trust_all_roles: bool,
}

impl SignalFile {
    fn is_empty(&self) -> bool {
        self.allowed_roles.is_empty() && !self.trust_all_roles
    }
}

/// `[cloudevents]`: the CloudEvents envelope (with `envelope = "cloudevents"`).
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CloudEventsFile {
    /// `binary` (default: attributes in `ce_*` headers) or `structured` (one JSON document).
    pub mode: Option<String>,
    /// The `source` attribute; default `/walpost/<database>/<schema>.<table>`.
    pub source: Option<String>,
}

impl CloudEventsFile {
    fn is_empty(&self) -> bool {
        self.mode.is_none() && self.source.is_none()
    }
}

/// `[exactly_once]`: Kafka transactions (with `delivery = "exactly-once"`).
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ExactlyOnceFile {
    pub progress_topic: Option<String>,
    pub max_transaction_records: Option<u64>,
    pub max_transaction_bytes: Option<u64>,
    pub max_transaction_ms: Option<Millis>,
    pub backlog_transaction_ms: Option<Millis>,
    pub transaction_timeout_ms: Option<Millis>,
}

impl ExactlyOnceFile {
    fn is_empty(&self) -> bool {
        self.progress_topic.is_none()
            && self.max_transaction_records.is_none()
            && self.max_transaction_bytes.is_none()
            && self.max_transaction_ms.is_none()
            && self.backlog_transaction_ms.is_none()
            && self.transaction_timeout_ms.is_none()
    }
}

/// `[pipeline]`: the produce window and the replication session.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineFile {
    /// Stop reading WAL while this many payload bytes are unacknowledged.
    pub max_in_flight_bytes: Option<u64>,
    /// Stop reading WAL while this many records are unacknowledged.
    pub max_in_flight_records: Option<u64>,
    /// Seconds between standby status updates when nothing else prompts one.
    pub status_interval_secs: Option<Seconds>,
    /// Seconds to wait for Kafka acknowledgements at shutdown.
    pub shutdown_timeout_secs: Option<Seconds>,
    /// Longest wait between reconnect attempts, in seconds.
    pub max_backoff_secs: Option<Seconds>,
    /// Restart the producer when Kafka acknowledges nothing for this long while records
    /// wait, in seconds.
    pub delivery_timeout_secs: Option<Seconds>,
    /// `/readyz` fails once Kafka has acknowledged nothing for this long while records
    /// wait, in seconds (well before the producer restart).
    pub unready_after_secs: Option<Seconds>,
    /// A WAL message (one row) larger than this is never buffered whole: it is a
    /// permanent error of its event (halt or dead letter).
    pub max_message_bytes: Option<u64>,
    /// After a halt, serve `walpost_halted 1` on /metrics this long before exiting 1.
    pub halt_linger_secs: Option<Seconds>,
    /// With `target_session_attrs=standby`: stop (exit 1) once the hosts have answered
    /// only as primaries (or not at all) this long, in seconds.
    pub no_standby_timeout_secs: Option<Seconds>,
}

impl PipelineFile {
    fn is_empty(&self) -> bool {
        self.max_in_flight_bytes.is_none()
            && self.max_in_flight_records.is_none()
            && self.status_interval_secs.is_none()
            && self.shutdown_timeout_secs.is_none()
            && self.max_backoff_secs.is_none()
            && self.delivery_timeout_secs.is_none()
            && self.unready_after_secs.is_none()
            && self.max_message_bytes.is_none()
            && self.halt_linger_secs.is_none()
            && self.no_standby_timeout_secs.is_none()
    }
}

/// `[monitor]`: slot monitor and alarm thresholds.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MonitorFile {
    /// Seconds between polls of pg_replication_slots.
    pub interval_secs: Option<Seconds>,
    /// Retained WAL bytes that raise a warning / a critical alarm.
    pub warning_bytes: Option<u64>,
    pub critical_bytes: Option<u64>,
    /// Streaming lag (seconds) that raises a warning / a critical alarm.
    pub warning_lag_secs: Option<Seconds>,
    pub critical_lag_secs: Option<Seconds>,
    /// An open transaction older than this raises a warning.
    pub long_transaction_secs: Option<Seconds>,
    /// The slot's confirmed position standing still this long while WAL is written past
    /// it raises a warning (an active instance that is stuck).
    pub confirm_stalled_secs: Option<Seconds>,
    /// Seconds between reminders while an alarm stays raised.
    pub reminder_secs: Option<Seconds>,
}

impl MonitorFile {
    fn is_empty(&self) -> bool {
        self.interval_secs.is_none()
            && self.warning_bytes.is_none()
            && self.critical_bytes.is_none()
            && self.warning_lag_secs.is_none()
            && self.critical_lag_secs.is_none()
            && self.long_transaction_secs.is_none()
            && self.confirm_stalled_secs.is_none()
            && self.reminder_secs.is_none()
    }
}

/// `[retention]`.
#[derive(Debug, Default, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionFile {
    /// Run the retention task inside `walpost run`. Unset: run it when the table is partitioned.
    pub enabled: Option<bool>,
    /// Seconds between passes inside `walpost run` (default 3600).
    pub interval_secs: Option<Seconds>,
    /// Drop partitions whose whole range is older than this many days (default 7).
    pub keep_days: Option<u32>,
    /// Keep partitions created this many days ahead (default 3).
    pub days_ahead: Option<u32>,
    /// lock_timeout for every DDL statement of a pass, in milliseconds (default 1000).
    pub lock_timeout_ms: Option<Millis>,
}

impl RetentionFile {
    fn is_empty(&self) -> bool {
        self.enabled.is_none()
            && self.interval_secs.is_none()
            && self.keep_days.is_none()
            && self.days_ahead.is_none()
            && self.lock_timeout_ms.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: a TOML type error echoed the value (a misplaced secret printed).
    #[test]
    fn regression_type_errors_do_not_show_the_value() {
        let e = FileConfig::parse("slot_failover = \"CANARY-secret\"").unwrap_err();
        assert!(!e.contains("CANARY") && e.contains("value not shown") && e.contains("line 1"), "{e}");
        let e = FileConfig::parse("[pipeline]\nmax_in_flight_bytes = \"CANARY\"").unwrap_err();
        assert!(!e.contains("CANARY"), "{e}");
    }
}
