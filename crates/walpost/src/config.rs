//! Configuration: a TOML file, `WALPOST_*` environment variables and flags, merged
//! once into a validated [`Settings`].
//!
//! Precedence: flag > environment variable > file > default. The file is parsed into
//! [`FileConfig`] with `deny_unknown_fields`, so a misspelt key is an error naming it,
//! never a silently ignored setting.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use router::RouterConfig;
use serde::Deserialize;

use crate::cli::RunArgs;

/// The TOML file as written by the user.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub postgres: Option<String>,
    pub table: Option<String>,
    pub slot: Option<String>,
    pub publication: Option<String>,
    pub metrics_addr: Option<String>,
    pub snapshot: Option<crate::snapshot::SnapshotMode>,
    pub snapshot_filter: Option<String>,
    #[serde(default)]
    pub kafka: KafkaFile,
    #[serde(default)]
    pub router: RouterFile,
    #[serde(default)]
    pub pipeline: PipelineFile,
    #[serde(default)]
    pub monitor: MonitorFile,
    /// Partition retention (see [`crate::retention`]).
    #[serde(default)]
    pub retention: crate::retention::RetentionFile,
    pub heartbeat_interval_secs: Option<u64>,
    pub slot_failover: Option<bool>,
    /// `halt` (default) or `dead_letter`.
    pub on_permanent_error: Option<String>,
    pub dead_letter_topic: Option<String>,
    #[serde(default)]
    pub outbox: Vec<OutboxFile>,
    #[serde(default)]
    pub messages: MessagesFile,
}

/// Slot monitor and alarm thresholds.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MonitorFile {
    /// Seconds between polls of pg_replication_slots.
    pub interval_secs: Option<u64>,
    /// Retained WAL bytes that raise a warning / a critical alarm.
    pub warning_bytes: Option<u64>,
    pub critical_bytes: Option<u64>,
    /// Streaming lag (seconds) that raises a warning / a critical alarm.
    pub warning_lag_secs: Option<f64>,
    pub critical_lag_secs: Option<f64>,
    /// An open transaction older than this raises a warning.
    pub long_transaction_secs: Option<f64>,
    /// Seconds between reminders while an alarm stays raised.
    pub reminder_secs: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaFile {
    pub brokers: Option<String>,
    /// Any librdkafka property, passed through (some are refused: see [`crate::sink`]).
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
}

/// Router options under Debezium's names. An option walpost does not know is an error
/// naming it (`deny_unknown_fields`), never silently ignored.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouterFile {
    #[serde(rename = "route.by.field")]
    pub route_by_field: Option<String>,
    #[serde(rename = "route.topic.regex")]
    pub topic_regex: Option<String>,
    #[serde(rename = "route.topic.replacement")]
    pub topic_replacement: Option<String>,
    #[serde(rename = "route.tombstone.on.empty.payload")]
    pub tombstone_on_empty_payload: Option<bool>,
    #[serde(rename = "table.field.event.key")]
    pub key_field: Option<String>,
    #[serde(rename = "table.field.event.payload")]
    pub payload_field: Option<String>,
    #[serde(rename = "table.field.event.id")]
    pub id_field: Option<String>,
    /// Column copied into the `eventType` header; "" for none.
    #[serde(rename = "table.field.event.type")]
    pub event_type_field: Option<String>,
    #[serde(rename = "table.field.event.timestamp")]
    pub timestamp_field: Option<String>,
    /// A JSON object column whose keys become headers (walpost extension).
    #[serde(rename = "table.field.event.headers")]
    pub headers_field: Option<String>,
    #[serde(rename = "table.fields.additional.placement")]
    pub additional_placement: Option<String>,
    /// `error` (default) or `ignore`.
    #[serde(rename = "table.field.additional.missing")]
    pub additional_missing: Option<String>,
    /// `warn` (default), `error` or `fatal`.
    #[serde(rename = "table.op.invalid.behavior")]
    pub op_invalid_behavior: Option<String>,
    /// Accepted for compatibility: walpost always emits JSON payloads as JSON.
    #[serde(rename = "table.expand.json.payload")]
    pub expand_json_payload: Option<bool>,
}

/// One more outbox table in the same slot and publication (`[[outbox]]`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutboxFile {
    pub table: String,
    #[serde(default)]
    pub router: RouterFile,
}

/// The table-less outbox: `pg_logical_emit_message(true, '<prefix>', '<json>')`.
#[derive(Debug, Default, Deserialize)]
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
}

impl RouterFile {
    /// `self`, with unset keys taken from `base`.
    fn or(&self, base: &RouterFile) -> RouterFile {
        macro_rules! pick {
            ($($f:ident),*) => { RouterFile { $($f: self.$f.clone().or_else(|| base.$f.clone())),* } };
        }
        pick!(
            route_by_field,
            topic_regex,
            topic_replacement,
            tombstone_on_empty_payload,
            key_field,
            payload_field,
            id_field,
            event_type_field,
            timestamp_field,
            headers_field,
            additional_placement,
            additional_missing,
            op_invalid_behavior,
            expand_json_payload
        )
    }

    /// The router configuration and the invalid-operation policy these options describe.
    fn resolve(&self) -> Result<(RouterConfig, OpInvalid), ConfigError> {
        let d = RouterConfig::default();
        let additional = match &self.additional_placement {
            Some(text) => router::AdditionalField::parse_list(text).map_err(|reason| ConfigError::Invalid {
                key: "table.fields.additional.placement",
                value: reason,
                expected: "column:header|envelope|partition[:alias], comma-separated",
            })?,
            None => Vec::new(),
        };
        let additional_missing_ignore = match self.additional_missing.as_deref() {
            None | Some("error") => false,
            Some("ignore") => true,
            Some(other) => {
                return Err(ConfigError::Invalid {
                    key: "table.field.additional.missing",
                    value: other.into(),
                    expected: "error or ignore",
                })
            }
        };
        let op_invalid = match self.op_invalid_behavior.as_deref() {
            None | Some("warn") => OpInvalid::Warn,
            Some("error") => OpInvalid::Error,
            Some("fatal") => OpInvalid::Fatal,
            Some(other) => {
                return Err(ConfigError::Invalid {
                    key: "table.op.invalid.behavior",
                    value: other.into(),
                    expected: "warn, error or fatal",
                })
            }
        };
        let config = RouterConfig {
            route_by_field: self.route_by_field.clone().unwrap_or(d.route_by_field),
            topic_regex: self.topic_regex.clone().filter(|r| !r.is_empty()),
            topic_pattern: self.topic_replacement.clone().unwrap_or(d.topic_pattern),
            key_field: self.key_field.clone().unwrap_or(d.key_field),
            payload_field: self.payload_field.clone().unwrap_or(d.payload_field),
            id_field: self.id_field.clone().unwrap_or(d.id_field),
            event_type_field: match &self.event_type_field {
                Some(f) if f.is_empty() => None,
                Some(f) => Some(f.clone()),
                None => d.event_type_field,
            },
            timestamp_field: self.timestamp_field.clone().filter(|f| !f.is_empty()),
            headers_field: self.headers_field.clone().filter(|f| !f.is_empty()),
            additional,
            additional_missing_ignore,
            tombstone_on_empty_payload: self.tombstone_on_empty_payload.unwrap_or(false),
        };
        if config.topic_pattern.is_empty() {
            return Err(ConfigError::Invalid {
                key: "route.topic.replacement",
                value: String::new(),
                expected: "a topic pattern such as outbox.event.${routedByValue}",
            });
        }
        router::Router::new(config.clone()).map_err(|e| ConfigError::Invalid {
            key: "route.topic.regex",
            value: e.to_string(),
            expected: "a regular expression (named groups as (?<name>...))",
        })?;
        Ok((config, op_invalid))
    }
}

/// What to do with an UPDATE/DELETE/TRUNCATE of an outbox table, or a message that may
/// not be published (Debezium's `table.op.invalid.behavior`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpInvalid {
    /// Log a warning and go on.
    Warn,
    /// Log an error and go on.
    Error,
    /// Stop walpost.
    Fatal,
}

/// One outbox table and how its rows are routed.
#[derive(Debug, Clone)]
pub struct Outbox {
    pub table: TableName,
    pub router: RouterConfig,
    pub op_invalid: OpInvalid,
}

/// What happens to a record that can never be published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnPermanentError {
    Halt,
    DeadLetter,
}

/// The table-less outbox, resolved.
#[derive(Debug, Clone)]
pub struct Messages {
    pub prefixes: Vec<String>,
    pub allow_non_transactional: bool,
    pub router: RouterConfig,
    pub op_invalid: OpInvalid,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineFile {
    /// Stop reading WAL while this many payload bytes are unacknowledged.
    pub max_in_flight_bytes: Option<u64>,
    /// Stop reading WAL while this many records are unacknowledged.
    pub max_in_flight_records: Option<u64>,
    /// Seconds between standby status updates when nothing else prompts one.
    pub status_interval_secs: Option<u64>,
    /// Seconds to wait for Kafka acknowledgements at shutdown.
    pub shutdown_timeout_secs: Option<u64>,
    /// Longest wait between reconnect attempts, in seconds.
    pub max_backoff_secs: Option<u64>,
    /// Restart the producer when Kafka acknowledges nothing for this long while records
    /// wait, in seconds.
    pub delivery_timeout_secs: Option<u64>,
}

/// A schema-qualified table name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableName {
    pub schema: String,
    pub name: String,
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.schema, self.name)
    }
}

impl TableName {
    pub fn parse(text: &str) -> Result<TableName, ConfigError> {
        let (schema, name) = text.split_once('.').unwrap_or(("public", text));
        let ok = |s: &str| !s.is_empty() && !s.contains('.') && !s.contains('"');
        if !ok(schema) || !ok(name) {
            return Err(ConfigError::Invalid {
                key: "table",
                value: text.into(),
                expected: "schema.name, e.g. events.outbox",
            });
        }
        Ok(TableName { schema: schema.into(), name: name.into() })
    }

    /// `"schema"."name"` for SQL.
    pub fn quoted(&self) -> String {
        format!("{}.{}", replication::quote_ident(&self.schema), replication::quote_ident(&self.name))
    }
}

/// Resolved, validated settings for `walpost run`.
#[derive(Debug, Clone)]
pub struct Settings {
    pub postgres: replication::Config,
    pub kafka_brokers: String,
    pub kafka_properties: BTreeMap<String, String>,
    pub table: TableName,
    pub slot: String,
    pub publication: String,
    pub router: RouterConfig,
    pub metrics_addr: Option<SocketAddr>,
    pub snapshot: crate::snapshot::SnapshotMode,
    pub snapshot_filter: Option<String>,
    pub max_in_flight_bytes: u64,
    pub max_in_flight_records: u64,
    pub status_interval: Duration,
    pub shutdown_timeout: Duration,
    pub max_backoff: Duration,
    /// See [`PipelineFile::delivery_timeout_secs`].
    pub delivery_timeout: Duration,
    pub monitor_interval: Duration,
    pub thresholds: crate::monitor::Thresholds,
    pub alarm_reminder: Duration,
    pub heartbeat_interval: Option<Duration>,
    pub slot_failover: bool,
    /// Every outbox table; the first is `table` / `router`.
    pub outboxes: Vec<Outbox>,
    pub on_permanent_error: OnPermanentError,
    pub dead_letter_topic: String,
    pub messages: Option<Messages>,
    pub retention: crate::retention::RetentionConfig,
}

/// Configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("config file {path} is not valid: {message}")]
    Parse { path: String, message: String },
    #[error("{key} is required: pass --{flag}, set WALPOST_{env}, or put {key} in the config file")]
    Missing { key: &'static str, flag: &'static str, env: &'static str },
    #[error("{key} = '{value}' is not valid: expected {expected}")]
    Invalid { key: &'static str, value: String, expected: &'static str },
    #[error(transparent)]
    Postgres(#[from] replication::ConfigError),
}

impl FileConfig {
    pub fn load(path: &Path) -> Result<FileConfig, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.display().to_string(), source })?;
        toml::from_str(&text)
            .map_err(|e| ConfigError::Parse { path: path.display().to_string(), message: e.to_string() })
    }
}

impl Settings {
    /// Merges flags/env (already merged by clap) over the file over defaults.
    pub fn resolve(args: &RunArgs, file: FileConfig) -> Result<Settings, ConfigError> {
        Self::resolve_with(args, file, true)
    }

    /// As [`Settings::resolve`], for commands that do not talk to Kafka.
    pub fn resolve_without_kafka(args: &RunArgs, file: FileConfig) -> Result<Settings, ConfigError> {
        Self::resolve_with(args, file, false)
    }

    fn resolve_with(args: &RunArgs, file: FileConfig, need_kafka: bool) -> Result<Settings, ConfigError> {
        let pick = |flag: &Option<String>, file: Option<String>| flag.clone().or(file);
        let postgres = pick(&args.postgres, file.postgres).ok_or(ConfigError::Missing {
            key: "postgres",
            flag: "postgres",
            env: "POSTGRES",
        })?;
        let kafka_brokers = match pick(&args.kafka_brokers, file.kafka.brokers) {
            Some(b) => b,
            None if !need_kafka => String::new(),
            None => {
                return Err(ConfigError::Missing { key: "kafka.brokers", flag: "kafka-brokers", env: "KAFKA_BROKERS" })
            }
        };
        let table = TableName::parse(&pick(&args.table, file.table).unwrap_or_else(|| "events.outbox".into()))?;
        let slot = pick(&args.slot, file.slot).unwrap_or_else(|| "walpost".into());
        validate_slot_name(&slot)?;
        let publication = pick(&args.publication, file.publication).unwrap_or_else(|| "walpost_outbox".into());
        if publication.is_empty() || publication.len() > 63 {
            return Err(ConfigError::Invalid {
                key: "publication",
                value: publication,
                expected: "a name of 1 to 63 characters",
            });
        }
        // Flags and WALPOST_* variables override the file's [router] for the first outbox.
        let from_flags = RouterFile {
            route_by_field: args.route_by_field.clone(),
            topic_replacement: args.topic.clone(),
            key_field: args.key_field.clone(),
            payload_field: args.payload_field.clone(),
            id_field: args.id_field.clone(),
            event_type_field: args.event_type_field.clone(),
            ..RouterFile::default()
        };
        // Flags override [router]; [[outbox]] tables and [messages] inherit the result.
        let base = from_flags.or(&file.router);
        let (router, op_invalid) = base.resolve()?;
        let mut outboxes = vec![Outbox { table: table.clone(), router: router.clone(), op_invalid }];
        for extra in &file.outbox {
            let (r, op) = extra.router.or(&base).resolve()?;
            let t = TableName::parse(&extra.table)?;
            if outboxes.iter().any(|o| o.table == t) {
                return Err(ConfigError::Invalid {
                    key: "outbox.table",
                    value: extra.table.clone(),
                    expected: "each outbox table once",
                });
            }
            outboxes.push(Outbox { table: t, router: r, op_invalid: op });
        }
        let on_permanent_error = match file.on_permanent_error.as_deref() {
            None | Some("halt") => OnPermanentError::Halt,
            Some("dead_letter") => OnPermanentError::DeadLetter,
            Some(other) => {
                return Err(ConfigError::Invalid {
                    key: "on_permanent_error",
                    value: other.into(),
                    expected: "halt or dead_letter",
                })
            }
        };
        let dead_letter_topic = file.dead_letter_topic.clone().unwrap_or_else(|| "walpost.dead_letter".into());
        router::validate_topic(&dead_letter_topic).map_err(|e| ConfigError::Invalid {
            key: "dead_letter_topic",
            value: e.to_string(),
            expected: "a valid Kafka topic name",
        })?;
        let messages = if file.messages.prefix_include.is_empty() {
            None
        } else {
            let (r, op) = file.messages.router.or(&base).resolve()?;
            Some(Messages {
                prefixes: file.messages.prefix_include.clone(),
                allow_non_transactional: file.messages.allow_non_transactional,
                router: r,
                op_invalid: op,
            })
        };
        let metrics_addr = match pick(&args.metrics_addr, file.metrics_addr) {
            None => None,
            Some(a) if a.is_empty() => None,
            Some(a) => Some(a.parse().map_err(|_| ConfigError::Invalid {
                key: "metrics_addr",
                value: a,
                expected: "host:port with an IP address, e.g. 0.0.0.0:9187",
            })?),
        };
        let mut kafka_properties = file.kafka.properties;
        for kv in &args.kafka_property {
            let (k, v) = kv.split_once('=').ok_or_else(|| ConfigError::Invalid {
                key: "kafka-property",
                value: kv.clone(),
                expected: "KEY=VALUE, e.g. compression.type=zstd",
            })?;
            kafka_properties.insert(k.trim().to_owned(), v.trim().to_owned());
        }
        let snapshot = args.snapshot.or(file.snapshot).unwrap_or(crate::snapshot::SnapshotMode::Never);
        let snapshot_filter = pick(&args.snapshot_filter, file.snapshot_filter).filter(|f| !f.trim().is_empty());
        if snapshot_filter.is_some() && snapshot == crate::snapshot::SnapshotMode::Never {
            return Err(ConfigError::Invalid {
                key: "snapshot_filter",
                value: snapshot_filter.unwrap_or_default(),
                expected: "no filter unless --snapshot is initial, initial_only or when_needed",
            });
        }
        let m = file.monitor;
        let defaults = crate::monitor::Thresholds::default();
        let thresholds = crate::monitor::Thresholds {
            warning_bytes: m.warning_bytes.unwrap_or(defaults.warning_bytes),
            critical_bytes: m.critical_bytes.unwrap_or(defaults.critical_bytes),
            warning_lag_secs: m.warning_lag_secs.unwrap_or(defaults.warning_lag_secs),
            critical_lag_secs: m.critical_lag_secs.unwrap_or(defaults.critical_lag_secs),
            long_transaction_secs: m.long_transaction_secs.unwrap_or(defaults.long_transaction_secs),
        };
        if thresholds.warning_bytes > thresholds.critical_bytes
            || thresholds.warning_lag_secs > thresholds.critical_lag_secs
        {
            return Err(ConfigError::Invalid {
                key: "monitor",
                value: format!("{thresholds:?}"),
                expected: "warning thresholds at or below the critical ones",
            });
        }
        let heartbeat_interval = match args.heartbeat_interval.or(file.heartbeat_interval_secs) {
            Some(0) => {
                return Err(ConfigError::Invalid {
                    key: "heartbeat_interval",
                    value: "0".into(),
                    expected: "a positive number of seconds",
                })
            }
            other => other.map(Duration::from_secs),
        };
        let slot_failover = args.slot_failover || file.slot_failover.unwrap_or(false);
        let p = file.pipeline;
        let positive = |key: &'static str, v: Option<u64>, default: u64| -> Result<u64, ConfigError> {
            match v {
                Some(0) => Err(ConfigError::Invalid { key, value: "0".into(), expected: "a positive number" }),
                Some(n) => Ok(n),
                None => Ok(default),
            }
        };
        Ok(Settings {
            postgres: replication::Config::from_url(&postgres)?,
            kafka_brokers,
            kafka_properties,
            table,
            slot,
            publication,
            router,
            metrics_addr,
            snapshot,
            snapshot_filter,
            max_in_flight_bytes: positive("pipeline.max_in_flight_bytes", p.max_in_flight_bytes, 16 << 20)?,
            max_in_flight_records: positive("pipeline.max_in_flight_records", p.max_in_flight_records, 50_000)?,
            status_interval: Duration::from_secs(positive(
                "pipeline.status_interval_secs",
                p.status_interval_secs,
                10,
            )?),
            shutdown_timeout: Duration::from_secs(positive(
                "pipeline.shutdown_timeout_secs",
                p.shutdown_timeout_secs,
                30,
            )?),
            max_backoff: Duration::from_secs(positive("pipeline.max_backoff_secs", p.max_backoff_secs, 30)?),
            delivery_timeout: Duration::from_secs(positive(
                "pipeline.delivery_timeout_secs",
                p.delivery_timeout_secs,
                60,
            )?),
            monitor_interval: Duration::from_secs(positive("monitor.interval_secs", m.interval_secs, 10)?),
            thresholds,
            alarm_reminder: Duration::from_secs(positive("monitor.reminder_secs", m.reminder_secs, 300)?),
            heartbeat_interval,
            slot_failover,
            outboxes,
            on_permanent_error,
            dead_letter_topic,
            messages,
            retention: crate::retention::RetentionConfig::resolve(&file.retention, None, None)?,
        })
    }
}

/// PostgreSQL's rule for slot names: lower-case letters, digits and underscores, at most 63.
fn validate_slot_name(slot: &str) -> Result<(), ConfigError> {
    let ok = !slot.is_empty()
        && slot.len() <= 63
        && slot.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(ConfigError::Invalid {
            key: "slot",
            value: slot.into(),
            expected: "1 to 63 lower-case letters, digits or underscores",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    fn args(extra: &[&str]) -> RunArgs {
        let mut argv = vec!["walpost", "run"];
        argv.extend_from_slice(extra);
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Run(args) => args,
            other => panic!("{other:?}"),
        }
    }

    fn file(text: &str) -> FileConfig {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn flag_beats_file_beats_default() {
        let f = file(
            r#"
            postgres = "postgres://u:p@h/db"
            slot = "from_file"
            [kafka]
            brokers = "k:9092"
            [kafka.properties]
            "compression.type" = "zstd"
            [router]
            "route.by.field" = "kind"
            "#,
        );
        let s = Settings::resolve(&args(&["--slot", "from_flag", "--kafka-property", "linger.ms=20"]), f).unwrap();
        assert_eq!(s.slot, "from_flag");
        assert_eq!(s.kafka_brokers, "k:9092");
        assert_eq!(s.router.route_by_field, "kind");
        assert_eq!(s.router.key_field, "aggregate_id");
        assert_eq!(s.table, TableName { schema: "events".into(), name: "outbox".into() });
        assert_eq!(s.publication, "walpost_outbox");
        assert_eq!(s.kafka_properties["compression.type"], "zstd");
        assert_eq!(s.kafka_properties["linger.ms"], "20");
    }

    #[test]
    fn unknown_keys_are_errors_naming_them() {
        let err = toml::from_str::<FileConfig>("postgress = 'x'").unwrap_err().to_string();
        assert!(err.contains("postgress"), "{err}");
        let err = toml::from_str::<FileConfig>("[router]\n\"route.by.feild\" = 'x'").unwrap_err().to_string();
        assert!(err.contains("route.by.feild"), "{err}");
    }

    #[test]
    fn missing_required_settings_say_how_to_set_them() {
        let err = Settings::resolve(&args(&[]), FileConfig::default()).unwrap_err().to_string();
        assert!(err.contains("--postgres") && err.contains("WALPOST_POSTGRES"), "{err}");
        let err = Settings::resolve(&args(&["--postgres", "postgres://u@h/d"]), FileConfig::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("--kafka-brokers"), "{err}");
    }

    #[test]
    fn invalid_values_are_named() {
        let base = ["--postgres", "postgres://u@h/d", "--kafka-brokers", "k:1"];
        let with = |extra: &[&str]| {
            let mut v = base.to_vec();
            v.extend_from_slice(extra);
            Settings::resolve(&args(&v), FileConfig::default()).unwrap_err().to_string()
        };
        assert!(with(&["--slot", "Bad-Slot"]).contains("slot"));
        assert!(with(&["--table", "a.b.c"]).contains("table"));
        assert!(with(&["--metrics-addr", "localhost"]).contains("metrics_addr"));
        assert!(with(&["--kafka-property", "novalue"]).contains("KEY=VALUE"));
    }

    #[test]
    fn empty_event_type_field_disables_the_header() {
        let s = Settings::resolve(
            &args(&["--postgres", "postgres://u@h/d", "--kafka-brokers", "k:1", "--event-type-field", ""]),
            FileConfig::default(),
        )
        .unwrap();
        assert_eq!(s.router.event_type_field, None);
    }
}
