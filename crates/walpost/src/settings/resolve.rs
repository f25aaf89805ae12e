//! Flags and environment over the file over defaults, validated once.

use std::collections::BTreeMap;
use std::time::Duration;

use router::RouterConfig;

use super::duration::Seconds;
use super::{
    secrets, CloudEventsFile, ConfigError, Delivery, ExactlyOnce, ExactlyOnceFile, FileConfig, KafkaSettings, Messages,
    MonitorSettings, OnPermanentError, OpInvalid, Outbox, RetentionFile, RetentionSettings, RouterFile, Settings,
    SnapshotMode, SnapshotSettings, SourceSettings, StreamSettings, TableName, Thresholds,
};

/// What the command line (flags and `WALPOST_*` variables, already merged by it) sets.
/// `None` everywhere means "not given": the file or the default decides.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `postgres` came from the command line itself (not `WALPOST_POSTGRES`).
    pub postgres_on_argv: bool,
    /// `--metrics-addr` is on the command line itself (a backfill serves metrics only then).
    pub metrics_addr_on_argv: bool,
    /// `--on-permanent-error`.
    pub on_permanent_error: Option<String>,
    /// `--dead-letter-topic`.
    pub dead_letter_topic: Option<String>,
    pub postgres: Option<String>,
    pub kafka_brokers: Option<String>,
    pub table: Option<String>,
    pub slot: Option<String>,
    pub publication: Option<String>,
    pub topic: Option<String>,
    pub route_by_field: Option<String>,
    pub key_field: Option<String>,
    pub payload_field: Option<String>,
    pub id_field: Option<String>,
    pub event_type_field: Option<String>,
    pub metrics_addr: Option<String>,
    pub snapshot: Option<SnapshotMode>,
    pub snapshot_filter: Option<String>,
    pub heartbeat_interval: Option<Duration>,
    /// `--signal-table`.
    pub signal_table: Option<String>,
    pub slot_failover: bool,
    /// `KEY=VALUE` librdkafka properties; override `[kafka.properties]`.
    pub kafka_properties: Vec<String>,
    /// `walpost retention --keep-days` / `--days-ahead`.
    pub retention_keep_days: Option<u32>,
    pub retention_days_ahead: Option<u32>,
    /// `--postgres-password-file` / `WALPOST_POSTGRES_PASSWORD_FILE`.
    pub postgres_password_file: Option<std::path::PathBuf>,
    /// Secret Kafka properties from `WALPOST_KAFKA_*` variables: (property, value).
    pub kafka_secret_env: Vec<(String, String)>,
    /// `--delivery`: `at-least-once` or `exactly-once`.
    pub delivery: Option<String>,
    /// `--envelope`: `none` or `cloudevents`.
    pub envelope: Option<String>,
}

impl Settings {
    /// Merges `overrides` over `file` over defaults.
    pub fn resolve(overrides: &Overrides, file: FileConfig) -> Result<Settings, ConfigError> {
        resolve(overrides, file, true)
    }

    /// As [`Settings::resolve`], for commands that do not talk to Kafka.
    pub fn resolve_without_kafka(overrides: &Overrides, file: FileConfig) -> Result<Settings, ConfigError> {
        resolve(overrides, file, false)
    }
}

fn resolve(o: &Overrides, file: FileConfig, need_kafka: bool) -> Result<Settings, ConfigError> {
    let pick = |flag: &Option<String>, file: Option<String>| flag.clone().or(file);
    let postgres = pick(&o.postgres, file.postgres).ok_or(ConfigError::Missing {
        key: "postgres",
        flag: "postgres",
        env: "POSTGRES",
    })?;
    let brokers = match pick(&o.kafka_brokers, file.kafka.brokers) {
        Some(b) => b,
        None if !need_kafka => String::new(),
        None => return Err(ConfigError::Missing { key: "kafka.brokers", flag: "kafka-brokers", env: "KAFKA_BROKERS" }),
    };
    let table = TableName::parse(&pick(&o.table, file.table).unwrap_or_else(|| "events.outbox".into()))?;
    let slot = pick(&o.slot, file.slot).unwrap_or_else(|| "walpost".into());
    validate_slot_name(&slot)?;
    let publication = pick(&o.publication, file.publication).unwrap_or_else(|| "walpost_outbox".into());
    validate_identifier(&publication).map_err(|expected| ConfigError::Invalid {
        key: "publication",
        value: publication.clone(),
        expected,
    })?;

    // Flags and WALPOST_* variables override the file's [router] for the first outbox;
    // [[outbox]] tables and [messages] inherit the result.
    let from_flags = RouterFile {
        route_by_field: o.route_by_field.clone(),
        topic_replacement: o.topic.clone(),
        key_field: o.key_field.clone(),
        payload_field: o.payload_field.clone(),
        id_field: o.id_field.clone(),
        event_type_header_field: o.event_type_field.clone(),
        ..RouterFile::default()
    };
    let base = from_flags.or(&file.router);
    let log_values = file.log_values.unwrap_or(false);
    let envelope = resolve_envelope(o.envelope.clone().or(file.envelope), &file.cloudevents)?;
    // The default CloudEvents source names the database and the table.
    let dbname = replication::Config::parse_with_env(&postgres, &|k| std::env::var(k).ok())
        .map(|c| c.dbname)
        .unwrap_or_default();
    let ce_for = |what: &str| envelope.as_ref().map(|e| e.for_source(&dbname, what));
    let (router, op_invalid) = resolve_router(&base, log_values, ce_for(&table.to_string()))?;
    let mut outboxes = vec![Outbox { table, router, op_invalid }];
    for extra in &file.outbox {
        let t = TableName::parse(&extra.table)?;
        let (r, op) = resolve_router(&extra.router.or(&base), log_values, ce_for(&t.to_string()))?;
        if outboxes.iter().any(|o| o.table == t) {
            return Err(ConfigError::Invalid {
                key: "outbox.table",
                value: extra.table.clone(),
                expected: "each outbox table once",
            });
        }
        outboxes.push(Outbox { table: t, router: r, op_invalid: op });
    }
    let messages = if file.messages.prefix_include.is_empty() {
        None
    } else {
        let (r, op) = resolve_router(&file.messages.router.or(&base), log_values, ce_for("messages"))?;
        Some(Messages {
            prefixes: file.messages.prefix_include.clone(),
            allow_non_transactional: file.messages.allow_non_transactional,
            allowed_roles: file.messages.allowed_roles.clone(),
            trust_all_roles: file.messages.trust_all_roles,
            router: r,
            op_invalid: op,
        })
    };
    let heartbeat_interval = match o.heartbeat_interval.or(file.heartbeat_interval_secs.map(|s| s.0)) {
        Some(d) if d.is_zero() => {
            return Err(ConfigError::Invalid {
                key: "heartbeat_interval",
                value: "0".into(),
                expected: "a positive duration (a number of seconds, or 500ms, 30s, 5min)",
            })
        }
        other => other,
    };
    let signal_table = match o.signal_table.clone().or(file.signal_table) {
        None => None,
        Some(text) => {
            let t = TableName::parse(&text)?;
            if outboxes.iter().any(|o| o.table == t) {
                return Err(ConfigError::Invalid {
                    key: "signal_table",
                    value: text,
                    expected: "a table of its own, not an outbox table",
                });
            }
            Some(t)
        }
    };
    let mut source = SourceSettings {
        slot,
        publication,
        slot_failover: o.slot_failover || file.slot_failover.unwrap_or(false),
        outboxes,
        messages,
        heartbeat_interval,
        signal_table,
        signal_allowed_roles: file.signal.allowed_roles.clone(),
        signal_trust_all_roles: file.signal.trust_all_roles,
    };

    let on_permanent_error = match o.on_permanent_error.clone().or(file.on_permanent_error).as_deref() {
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
    let dead_letter_topic =
        o.dead_letter_topic.clone().or(file.dead_letter_topic).unwrap_or_else(|| "walpost.dead_letter".into());
    let internal = dead_letter_topic.starts_with(router::INTERNAL_TOPIC_PREFIX);
    if router::validate_topic(&dead_letter_topic).is_err() || internal {
        return Err(ConfigError::Invalid {
            key: "dead_letter_topic",
            value: dead_letter_topic,
            expected: "a valid Kafka topic name not starting with __",
        });
    }
    let mut properties = match &file.kafka.properties_file {
        Some(path) => secrets::read_properties_file(path)?,
        None => BTreeMap::new(),
    };
    properties.extend(file.kafka.properties);
    properties.extend(o.kafka_secret_env.iter().cloned());
    for kv in &o.kafka_properties {
        let (k, v) = kv.split_once('=').ok_or_else(|| ConfigError::Invalid {
            key: "kafka-property",
            // Only the key part: the value may be a secret.
            value: kv.split('=').next().unwrap_or_default().to_owned(),
            expected: "KEY=VALUE, e.g. compression.type=zstd",
        })?;
        let key = k.trim().to_owned();
        if secrets::KAFKA_SECRET_PROPERTIES.contains(&key.as_str()) {
            tracing::warn!(
                "{key} was given with --kafka-property, on the command line, where other users of this machine can read it: use {} or [kafka] properties_file instead",
                secrets::kafka_secret_env_var(&key)
            );
        }
        properties.insert(key, v.trim().to_owned());
    }
    let delivery = resolve_delivery(o.delivery.clone().or(file.delivery), &file.exactly_once)?;
    if let (Some(t), Delivery::ExactlyOnce(_)) = (&source.signal_table, &delivery) {
        return Err(ConfigError::Invalid {
            key: "signal_table",
            value: t.to_string(),
            expected: "no signal table with delivery = exactly-once (a signal's replay is not inside the Kafka transactions): run walpost replay instead",
        });
    }
    let kafka = KafkaSettings { brokers, properties, on_permanent_error, dead_letter_topic, log_values, delivery };
    // walpost's own topics are never a row's destination.
    let mut reserved = vec![kafka.dead_letter_topic.clone()];
    if let Delivery::ExactlyOnce(e) = &kafka.delivery {
        reserved.push(e.progress_topic.clone());
    }
    for router in
        source.outboxes.iter_mut().map(|o| &mut o.router).chain(source.messages.iter_mut().map(|m| &mut m.router))
    {
        router.reserved_topics.clone_from(&reserved);
    }

    let snapshot_mode = o.snapshot.or(file.snapshot).unwrap_or(SnapshotMode::Never);
    let filter = pick(&o.snapshot_filter, file.snapshot_filter).filter(|f| !f.trim().is_empty());
    if filter.is_some() && snapshot_mode == SnapshotMode::Never {
        return Err(ConfigError::Invalid {
            key: "snapshot_filter",
            value: filter.unwrap_or_default(),
            expected: "no filter unless --snapshot is initial, initial_only or when_needed",
        });
    }

    let m = file.monitor;
    let defaults = Thresholds::default();
    let thresholds = Thresholds {
        warning_bytes: m.warning_bytes,
        critical_bytes: m.critical_bytes,
        warning_lag_secs: m.warning_lag_secs.map_or(defaults.warning_lag_secs, |s| s.0.as_secs_f64()),
        critical_lag_secs: m.critical_lag_secs.map_or(defaults.critical_lag_secs, |s| s.0.as_secs_f64()),
        long_transaction_secs: m.long_transaction_secs.map_or(defaults.long_transaction_secs, |s| s.0.as_secs_f64()),
        confirm_stalled_secs: m.confirm_stalled_secs.map_or(defaults.confirm_stalled_secs, |s| s.0.as_secs_f64()),
    };
    let bytes_out_of_order =
        matches!((thresholds.warning_bytes, thresholds.critical_bytes), (Some(w), Some(c)) if w > c);
    if bytes_out_of_order || thresholds.warning_lag_secs > thresholds.critical_lag_secs {
        return Err(ConfigError::Invalid {
            key: "monitor",
            value: format!("{thresholds:?}"),
            expected: "warning thresholds at or below the critical ones",
        });
    }
    let monitor = MonitorSettings {
        interval: secs("monitor.interval_secs", m.interval_secs, 10)?,
        thresholds,
        reminder: secs("monitor.reminder_secs", m.reminder_secs, 300)?,
    };

    let p = file.pipeline;
    let delivery_timeout = secs("pipeline.delivery_timeout_secs", p.delivery_timeout_secs, 60)?;
    let stream = StreamSettings {
        // 8 MiB: librdkafka holds a copy of every unacknowledged payload, so this bounds
        // walpost's memory in a drain; 16 MiB raised the peak RSS of a 1M-event drain by
        // ~10-20 MB without a measurable gain in rate (bench/results/analysis.md, issue 16).
        max_in_flight_bytes: positive("pipeline.max_in_flight_bytes", p.max_in_flight_bytes, 8 << 20)?,
        max_in_flight_records: positive("pipeline.max_in_flight_records", p.max_in_flight_records, 50_000)?,
        status_interval: secs("pipeline.status_interval_secs", p.status_interval_secs, 10)?,
        shutdown_timeout: secs("pipeline.shutdown_timeout_secs", p.shutdown_timeout_secs, 30)?,
        max_backoff: secs("pipeline.max_backoff_secs", p.max_backoff_secs, 30)?,
        delivery_timeout,
        // Half the producer restart by default, never more than 30 s: readiness drops first.
        unready_after: positive_duration(
            "pipeline.unready_after_secs",
            p.unready_after_secs.map(|s| s.0),
            (delivery_timeout / 2).clamp(Duration::from_secs(1), Duration::from_secs(30)),
        )?,
        // Kafka refuses a record over the producer's message.max.bytes (librdkafka's
        // default: 1,000,000) anyway; the slack is room for columns that are not in it.
        max_message_bytes: usize::try_from(positive(
            "pipeline.max_message_bytes",
            p.max_message_bytes,
            kafka
                .properties
                .get("message.max.bytes")
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(1_000_000)
                .saturating_add(MAX_MESSAGE_SLACK),
        )?)
        .unwrap_or(usize::MAX),
        // Two scrapes of a 30 s interval see it.
        halt_linger: p.halt_linger_secs.map_or(Duration::from_secs(60), |s| s.0),
    };

    // A backfill runs beside the service with the service's configuration: the port in
    // it is the service's, so a backfill serves metrics only when its own command line
    // names a port.
    let backfill_without_flag = snapshot_mode == SnapshotMode::InitialOnly && !o.metrics_addr_on_argv;
    let metrics_addr = match pick(&o.metrics_addr, file.metrics_addr) {
        Some(a) if backfill_without_flag && !a.is_empty() => {
            tracing::info!("a backfill (--snapshot initial_only) serves no metrics unless --metrics-addr is on its own command line: {a} is the service's");
            None
        }
        None => None,
        Some(a) if a.is_empty() => None,
        Some(a) => Some(a.parse().map_err(|_| ConfigError::Invalid {
            key: "metrics_addr",
            value: a,
            expected: "host:port with an IP address, e.g. 127.0.0.1:9187",
        })?),
    };
    let raw_postgres = postgres.clone();
    if o.postgres_on_argv
        && replication::Config::parse_with_env(&postgres, &|_| None).is_ok_and(|c| c.password().is_some())
    {
        tracing::warn!("{}", secrets::POSTGRES_PASSWORD_ON_ARGV);
    }
    let password_file = o.postgres_password_file.clone().or(file.postgres_password_file);
    let postgres = match &password_file {
        None => replication::Config::from_url(&postgres)?,
        Some(path) => {
            // The file wins over PGPASSWORD, not over a password in the connection string.
            let mut config = replication::Config::parse_with_env(&postgres, &|k| {
                (k != "PGPASSWORD").then(|| std::env::var(k).ok()).flatten()
            })?;
            config.set_password_if_missing(secrets::read_secret_file(path, "the PostgreSQL password")?);
            config
        }
    };
    let postgres = stream_from_primary(postgres, &raw_postgres)?;
    Ok(Settings {
        postgres,
        source,
        kafka,
        stream,
        snapshot: SnapshotSettings { mode: snapshot_mode, filter, replay: None },
        monitor,
        retention: resolve_retention(&file.retention, o.retention_keep_days, o.retention_days_ahead)?,
        metrics_addr,
        otel: super::otel::OtelSettings::from_env(&|k| std::env::var(k).ok())?,
    })
}

/// walpost streams from a primary only: without `target_session_attrs` (in the string or
/// PGTARGETSESSIONATTRS) it connects with `primary`, so a multi-host string settles on the
/// primary wherever it is; a value that could settle on a standby is refused.
fn stream_from_primary(mut config: replication::Config, text: &str) -> Result<replication::Config, ConfigError> {
    use replication::TargetSessionAttrs as T;
    let explicit = text.contains("target_session_attrs") || std::env::var_os("PGTARGETSESSIONATTRS").is_some();
    match config.target_session_attrs {
        T::ReadWrite | T::Primary => {}
        T::Any if !explicit => config.target_session_attrs = T::Primary,
        other => {
            return Err(ConfigError::Invalid {
                key: "target_session_attrs (in the PostgreSQL connection string or PGTARGETSESSIONATTRS)",
                value: other.as_str().to_owned(),
                expected: "read-write or primary (or none: walpost uses primary); walpost reads its slot and writes its tables on the primary only",
            })
        }
    }
    Ok(config)
}

fn resolve_delivery(mode: Option<String>, f: &ExactlyOnceFile) -> Result<Delivery, ConfigError> {
    match mode.as_deref() {
        None | Some("at-least-once") => Ok(Delivery::AtLeastOnce),
        Some("exactly-once") => {
            let d = ExactlyOnce::default();
            let progress_topic = f.progress_topic.clone().unwrap_or(d.progress_topic);
            if router::validate_topic(&progress_topic).is_err()
                || progress_topic.starts_with(router::INTERNAL_TOPIC_PREFIX)
            {
                return Err(ConfigError::Invalid {
                    key: "exactly_once.progress_topic",
                    value: progress_topic,
                    expected: "a valid Kafka topic name not starting with __",
                });
            }
            let e = ExactlyOnce {
                progress_topic,
                max_transaction_records: positive(
                    "exactly_once.max_transaction_records",
                    f.max_transaction_records,
                    d.max_transaction_records,
                )?,
                max_transaction_bytes: positive(
                    "exactly_once.max_transaction_bytes",
                    f.max_transaction_bytes,
                    d.max_transaction_bytes,
                )?,
                max_transaction_interval: positive_duration(
                    "exactly_once.max_transaction_ms",
                    f.max_transaction_ms.map(|m| m.0),
                    d.max_transaction_interval,
                )?,
                transaction_timeout: positive_duration(
                    "exactly_once.transaction_timeout_ms",
                    f.transaction_timeout_ms.map(|m| m.0),
                    d.transaction_timeout,
                )?,
            };
            if e.max_transaction_interval * 4 > e.transaction_timeout {
                return Err(ConfigError::Invalid {
                    key: "exactly_once.max_transaction_ms",
                    value: e.max_transaction_interval.as_millis().to_string(),
                    expected: "at most a quarter of exactly_once.transaction_timeout_ms",
                });
            }
            Ok(Delivery::ExactlyOnce(e))
        }
        Some(other) => Err(ConfigError::Invalid {
            key: "delivery",
            value: other.to_owned(),
            expected: "at-least-once or exactly-once",
        }),
    }
}

fn positive(key: &'static str, v: Option<u64>, default: u64) -> Result<u64, ConfigError> {
    match v {
        Some(0) => Err(ConfigError::Invalid { key, value: "0".into(), expected: "a positive number" }),
        Some(n) => Ok(n),
        None => Ok(default),
    }
}

/// A `*_secs` key: `default` seconds when unset; zero is refused.
fn secs(key: &'static str, v: Option<Seconds>, default: u64) -> Result<Duration, ConfigError> {
    positive_duration(key, v.map(|s| s.0), Duration::from_secs(default))
}

fn positive_duration(key: &'static str, v: Option<Duration>, default: Duration) -> Result<Duration, ConfigError> {
    match v {
        Some(d) if d.is_zero() => Err(ConfigError::Invalid {
            key,
            value: "0".into(),
            expected: "a positive duration (a number in the key's unit, or 500ms, 30s, 5min)",
        }),
        Some(d) => Ok(d),
        None => Ok(default),
    }
}

/// `envelope` and `[cloudevents]`, before the default source is known per table.
#[derive(Debug, Clone)]
struct EnvelopeChoice {
    mode: router::CloudEventsMode,
    source: Option<String>,
}

impl EnvelopeChoice {
    /// The configuration for one outbox (`what`: `schema.table`, or `messages`).
    fn for_source(&self, database: &str, what: &str) -> router::CloudEventsConfig {
        router::CloudEventsConfig {
            mode: self.mode,
            source: self.source.clone().unwrap_or_else(|| format!("/walpost/{database}/{what}")),
        }
    }
}

fn resolve_envelope(envelope: Option<String>, f: &CloudEventsFile) -> Result<Option<EnvelopeChoice>, ConfigError> {
    let cloudevents = match envelope.as_deref() {
        None | Some("none") => false,
        Some("cloudevents") => true,
        Some(other) => {
            return Err(ConfigError::Invalid { key: "envelope", value: other.into(), expected: "none or cloudevents" })
        }
    };
    if !cloudevents {
        if f.mode.is_some() || f.source.is_some() {
            return Err(ConfigError::Invalid {
                key: "cloudevents",
                value: "[cloudevents] settings".into(),
                expected: "envelope = \"cloudevents\" when [cloudevents] is set",
            });
        }
        return Ok(None);
    }
    let mode = match f.mode.as_deref() {
        None | Some("binary") => router::CloudEventsMode::Binary,
        Some("structured") => router::CloudEventsMode::Structured,
        Some(other) => {
            return Err(ConfigError::Invalid {
                key: "cloudevents.mode",
                value: other.into(),
                expected: "binary or structured",
            })
        }
    };
    if f.source.as_deref().is_some_and(|s| s.trim().is_empty()) {
        return Err(ConfigError::Invalid {
            key: "cloudevents.source",
            value: String::new(),
            expected: "a URI-reference such as /walpost/shop/events.outbox (or leave it out for that default)",
        });
    }
    Ok(Some(EnvelopeChoice { mode, source: f.source.clone() }))
}

/// The router configuration and the invalid-operation policy these options describe.
fn resolve_router(
    f: &RouterFile,
    log_values: bool,
    cloudevents: Option<router::CloudEventsConfig>,
) -> Result<(RouterConfig, OpInvalid), ConfigError> {
    let d = RouterConfig::default();
    let additional = match &f.additional_placement {
        Some(text) => router::AdditionalField::parse_list(text).map_err(ConfigError::Option)?,
        None => Vec::new(),
    };
    let event_type_header = match (&f.event_type_header_field, &f.event_type_field) {
        (Some(col), _) => Some(col.clone()),
        (None, Some(col)) => {
            tracing::warn!(
                "[router] \"table.field.event.type\" is deprecated (Debezium has no such option since 1.2): use \"{}\" for the eventType header",
                router::EVENT_TYPE_HEADER_OPTION
            );
            Some(col.clone())
        }
        (None, None) => None,
    };
    let additional_missing_ignore = match f.additional_missing.as_deref() {
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
    let op_invalid = match f.op_invalid_behavior.as_deref() {
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
        route_by_field: f.route_by_field.clone().unwrap_or(d.route_by_field),
        topic_regex: f.topic_regex.clone().filter(|r| !r.is_empty()),
        topic_pattern: f.topic_replacement.clone().unwrap_or(d.topic_pattern),
        key_field: f.key_field.clone().unwrap_or(d.key_field),
        payload_field: f.payload_field.clone().unwrap_or(d.payload_field),
        id_field: f.id_field.clone().unwrap_or(d.id_field),
        event_type_header_field: match event_type_header {
            Some(col) if col.is_empty() => None,
            Some(col) => Some(col),
            None => d.event_type_header_field,
        },
        topic_regex_fallthrough: f.topic_regex_fallthrough.unwrap_or(false),
        topics_allow: f.topics_allow.clone(),
        topics_max: match f.topics_max {
            Some(0) => {
                return Err(ConfigError::Invalid {
                    key: "topics.max",
                    value: "0".into(),
                    expected: "a positive number of topics",
                })
            }
            Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
            None => d.topics_max,
        },
        reserved_topics: Vec::new(),
        log_values,
        timestamp_field: f.timestamp_field.clone().filter(|c| !c.is_empty()),
        headers_field: f.headers_field.clone().filter(|c| !c.is_empty()),
        tracing_field: f.tracing_field.clone().filter(|c| !c.is_empty()),
        cloudevents,
        additional,
        additional_missing_ignore,
        tombstone_on_empty_payload: f.tombstone_on_empty_payload.unwrap_or(false),
    };
    if config.topic_pattern.is_empty() {
        return Err(ConfigError::Invalid {
            key: "route.topic.replacement",
            value: String::new(),
            expected: "a topic pattern such as outbox.event.${routedByValue}",
        });
    }
    router::Router::new(config.clone()).map_err(|e| match e {
        router::RouteError::BadRegex(_) => ConfigError::Invalid {
            key: "route.topic.regex",
            value: e.to_string(),
            expected: "a regular expression (named groups as (?<name>...))",
        },
        other => ConfigError::Option(other.to_string()),
    })?;
    Ok((config, op_invalid))
}

/// What `[pipeline] max_message_bytes` adds to the producer's `message.max.bytes` by
/// default: room for the columns of a row that do not go into its record.
pub(super) const MAX_MESSAGE_SLACK: u64 = 1 << 20;

/// The file's `[retention]` table over the defaults; `keep_days`/`days_ahead` overrides win.
pub(super) fn resolve_retention(
    file: &RetentionFile,
    keep_days: Option<u32>,
    days_ahead: Option<u32>,
) -> Result<RetentionSettings, ConfigError> {
    let d = RetentionSettings::default();
    let invalid =
        |key: &'static str, value: String, expected: &'static str| ConfigError::Invalid { key, value, expected };
    let interval = positive_duration("retention.interval_secs", file.interval_secs.map(|s| s.0), d.interval)?;
    let keep_days = keep_days.or(file.keep_days).unwrap_or(d.keep_days);
    if keep_days > 36_500 {
        return Err(invalid("retention.keep_days", keep_days.to_string(), "a number of days up to 36500"));
    }
    let days_ahead = days_ahead.or(file.days_ahead).unwrap_or(d.days_ahead);
    if days_ahead == 0 || days_ahead > 366 {
        return Err(invalid("retention.days_ahead", days_ahead.to_string(), "1 to 366 days"));
    }
    // 0 would mean "wait forever" to PostgreSQL, queueing every insert behind us.
    let lock_timeout =
        positive_duration("retention.lock_timeout_ms", file.lock_timeout_ms.map(|m| m.0), Duration::from_secs(1))?;
    Ok(RetentionSettings { enabled: file.enabled, interval, keep_days, days_ahead, lock_timeout })
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

/// A name walpost puts into SQL (publication, schema, table): 1 to 63 bytes of letters,
/// digits, `_` and `$`, not starting with a digit or `$`. Such a name needs no escaping
/// anywhere, whatever `standard_conforming_strings` says; walpost still quotes it.
pub fn validate_identifier(name: &str) -> Result<(), &'static str> {
    const EXPECTED: &str = "1 to 63 ASCII letters, digits, '_' or '$', not starting with a digit or '$'";
    let mut bytes = name.bytes();
    let first_ok = bytes.next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_');
    if first_ok && name.len() <= 63 && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'$') {
        Ok(())
    } else {
        Err(EXPECTED)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> FileConfig {
        FileConfig::parse(text).unwrap()
    }

    fn base() -> Overrides {
        Overrides {
            postgres: Some("postgres://u@h/d".into()),
            kafka_brokers: Some("k:1".into()),
            ..Overrides::default()
        }
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
        let o = Overrides {
            slot: Some("from_flag".into()),
            kafka_properties: vec!["linger.ms=20".into()],
            ..Overrides::default()
        };
        let s = Settings::resolve(&o, f).unwrap();
        assert_eq!(s.source.slot, "from_flag");
        assert_eq!(s.kafka.brokers, "k:9092");
        assert_eq!(s.router().route_by_field, "kind");
        assert_eq!(s.router().key_field, "aggregate_id");
        assert_eq!(*s.table(), TableName { schema: "events".into(), name: "outbox".into() });
        assert_eq!(s.source.publication, "walpost_outbox");
        assert_eq!(s.kafka.properties["compression.type"], "zstd");
        assert_eq!(s.kafka.properties["linger.ms"], "20");
    }

    /// The produce window's defaults: 8 MiB of payloads (librdkafka keeps a copy of each
    /// unacknowledged one, so this is most of a drain's memory; 16 MiB peaked at 57-62 MB
    /// RSS, 8 MiB at 41.5 MB: bench/results/analysis.md) and 50,000 records.
    #[test]
    fn the_produce_window_defaults_to_8_mib_and_50000_records() {
        let s = Settings::resolve(&base(), FileConfig::default()).unwrap();
        assert_eq!(s.stream.max_in_flight_bytes, 8 * 1024 * 1024);
        assert_eq!(s.stream.max_in_flight_records, 50_000);
    }

    #[test]
    fn walpost_connects_to_a_primary_whatever_the_host_order() {
        use replication::TargetSessionAttrs as T;
        let with = |url: &str| Overrides { postgres: Some(url.into()), ..base() };
        let s = Settings::resolve(&with("postgres://u@a:5432,b:5433/d"), FileConfig::default()).unwrap();
        assert_eq!(s.postgres.target_session_attrs, T::Primary, "no target_session_attrs: primary");
        assert_eq!(s.postgres.hosts.len(), 2);
        for (given, expected) in [("read-write", T::ReadWrite), ("primary", T::Primary)] {
            let url = format!("postgres://u@a,b/d?target_session_attrs={given}");
            assert_eq!(
                Settings::resolve(&with(&url), FileConfig::default()).unwrap().postgres.target_session_attrs,
                expected
            );
        }
        for refused in ["any", "standby", "prefer-standby", "read-only"] {
            let url = format!("host=a,b dbname=d user=u target_session_attrs={refused}");
            let err = Settings::resolve(&with(&url), FileConfig::default()).unwrap_err().to_string();
            assert!(err.contains(refused) && err.contains("primary only"), "{err}");
        }
    }

    #[test]
    fn unknown_keys_are_errors_naming_them() {
        let err = FileConfig::parse("postgress = 'x'").unwrap_err();
        assert!(err.contains("postgress"), "{err}");
        let err = FileConfig::parse("[router]\n\"route.by.feild\" = 'x'").unwrap_err();
        assert!(err.contains("route.by.feild"), "{err}");
    }

    #[test]
    fn missing_required_settings_say_how_to_set_them() {
        let err = Settings::resolve(&Overrides::default(), FileConfig::default()).unwrap_err().to_string();
        assert!(err.contains("--postgres") && err.contains("WALPOST_POSTGRES"), "{err}");
        let o = Overrides { postgres: Some("postgres://u@h/d".into()), ..Overrides::default() };
        let err = Settings::resolve(&o, FileConfig::default()).unwrap_err().to_string();
        assert!(err.contains("--kafka-brokers"), "{err}");
    }

    #[test]
    fn invalid_values_are_named() {
        let with = |f: fn(&mut Overrides)| {
            let mut o = base();
            f(&mut o);
            Settings::resolve(&o, FileConfig::default()).unwrap_err().to_string()
        };
        assert!(with(|o| o.slot = Some("Bad-Slot".into())).contains("slot"));
        assert!(with(|o| o.table = Some("a.b.c".into())).contains("table"));
        assert!(with(|o| o.metrics_addr = Some("localhost".into())).contains("metrics_addr"));
        assert!(with(|o| o.kafka_properties = vec!["novalue".into()]).contains("KEY=VALUE"));
    }

    /// Regression: a publication or table name with a quote or backslash reached SQL
    /// through quote-doubling alone, which `standard_conforming_strings = off` breaks.
    #[test]
    fn regression_names_that_need_escaping_are_refused() {
        for bad in ["pub'; DROP TABLE x; --", "a\\b", "x\"y", "1abc", ""] {
            let mut o = base();
            o.publication = Some(bad.into());
            let err = Settings::resolve(&o, FileConfig::default()).unwrap_err().to_string();
            assert!(err.contains("publication"), "{bad}: {err}");
            let mut o = base();
            o.table = Some(format!("events.{bad}"));
            assert!(Settings::resolve(&o, FileConfig::default()).is_err(), "{bad}");
        }
        for good in ["walpost_outbox", "Pub$1", "_x"] {
            assert_eq!(validate_identifier(good), Ok(()), "{good}");
        }
    }

    #[test]
    fn empty_event_type_field_disables_the_header() {
        let mut o = base();
        o.event_type_field = Some(String::new());
        let s = Settings::resolve(&o, FileConfig::default()).unwrap();
        assert_eq!(s.router().event_type_header_field, None);
        // The deprecated Debezium spelling still works.
        let f = file("[router]\n\"table.field.event.type\" = \"kind\"");
        let s = Settings::resolve(&base(), f).unwrap();
        assert_eq!(s.router().event_type_header_field.as_deref(), Some("kind"));
    }

    /// Every Debezium option walpost does not implement is refused by name, with why.
    #[test]
    fn unimplemented_debezium_options_are_refused_by_name() {
        for (key, _) in router::DEBEZIUM_OPTIONS_NOT_IMPLEMENTED {
            for section in ["[router]", "[[outbox]]\ntable = \"a.b\"\n[outbox.router]", "[messages.router]"] {
                let err = FileConfig::parse(&format!("{section}\n\"{key}\" = \"x\"\n")).unwrap_err();
                assert!(err.contains(key) && err.contains("does not implement"), "{section} {key}: {err}");
            }
        }
    }

    /// A TOML parse error names the position, never the line's text (a secret may be on it).
    #[test]
    fn parse_errors_do_not_echo_the_file() {
        let dir = std::env::temp_dir().join(testkit_free_name());
        std::fs::write(&dir, "[kafka.properties]\n\"sasl.password\" = \"hunter2-canary\" junk\n").unwrap();
        let err = FileConfig::load(&dir).unwrap_err().to_string();
        let _ = std::fs::remove_file(&dir);
        assert!(!err.contains("hunter2-canary"), "{err}");
        assert!(err.contains("not valid"), "{err}");
    }

    fn testkit_free_name() -> String {
        format!("walpost-parse-{}-{:?}.toml", std::process::id(), std::thread::current().id()).replace(['(', ')'], "")
    }

    #[test]
    fn retention_defaults_and_validation() {
        let c = resolve_retention(&RetentionFile::default(), None, None).unwrap();
        assert_eq!(c, RetentionSettings::default());
        assert_eq!((c.keep_days, c.days_ahead, c.interval.as_secs(), c.enabled), (7, 3, 3600, None));
        let f: RetentionFile = toml::from_str("enabled = true\nkeep_days = 30\ndays_ahead = 5").unwrap();
        let c = resolve_retention(&f, Some(2), None).unwrap();
        assert_eq!((c.enabled, c.keep_days, c.days_ahead), (Some(true), 2, 5));
        let bad: RetentionFile = toml::from_str("days_ahead = 0").unwrap();
        assert!(resolve_retention(&bad, None, None).unwrap_err().to_string().contains("retention.days_ahead"));
        let err = toml::from_str::<RetentionFile>("keep_dayz = 3").unwrap_err().to_string();
        assert!(err.contains("keep_dayz"), "{err}");
    }

    #[test]
    fn cloudevents_envelope_resolves_per_table() {
        assert!(Settings::resolve(&base(), FileConfig::default()).unwrap().router().cloudevents.is_none());
        let f = file(
            "envelope = \"cloudevents\"\n[[outbox]]\ntable = \"billing.outbox\"\n[messages]\n\"prefix.include\" = [\"outbox\"]",
        );
        let s = Settings::resolve(&base(), f).unwrap();
        let ce = |i: usize| s.source.outboxes[i].router.cloudevents.clone().unwrap();
        assert_eq!(ce(0).mode, router::CloudEventsMode::Binary);
        assert_eq!(ce(0).source, "/walpost/d/events.outbox", "database d of postgres://u@h/d");
        assert_eq!(ce(1).source, "/walpost/d/billing.outbox");
        assert_eq!(
            s.source.messages.as_ref().unwrap().router.cloudevents.as_ref().unwrap().source,
            "/walpost/d/messages"
        );
        let f = file("envelope = \"cloudevents\"\n[cloudevents]\nmode = \"structured\"\nsource = \"urn:shop\"");
        let o = Overrides { envelope: Some("none".into()), ..base() };
        let err = Settings::resolve(&o, f).unwrap_err().to_string();
        assert!(err.contains("cloudevents"), "the flag turned the envelope off while [cloudevents] is set: {err}");
        let f = file("envelope = \"cloudevents\"\n[cloudevents]\nmode = \"structured\"\nsource = \"urn:shop\"");
        let ce = Settings::resolve(&base(), f).unwrap().router().cloudevents.clone().unwrap();
        assert_eq!((ce.mode, ce.source.as_str()), (router::CloudEventsMode::Structured, "urn:shop"));
        let o = Overrides { envelope: Some("cloudevents".into()), ..base() };
        assert!(Settings::resolve(&o, FileConfig::default()).unwrap().router().cloudevents.is_some(), "--envelope");
        for (text, key) in [
            ("envelope = \"xml\"", "envelope"),
            ("envelope = \"cloudevents\"\n[cloudevents]\nmode = \"batch\"", "cloudevents.mode"),
            ("envelope = \"cloudevents\"\n[cloudevents]\nsource = \"\"", "cloudevents.source"),
            (
                "envelope = \"cloudevents\"\n[router]\n\"table.fields.additional.placement\" = \"event_type:header:ce_type\"",
                "collide",
            ),
            ("envelope = \"cloudevents\"\n[router]\n\"table.field.event.type.header\" = \"\"", "event type column"),
        ] {
            let err = Settings::resolve(&base(), file(text)).unwrap_err().to_string();
            assert!(err.contains(key), "{text}: {err}");
        }
        assert!(FileConfig::parse("[cloudevents]\nmodes = \"binary\"").unwrap_err().contains("modes"));
    }

    #[test]
    fn debeziums_tracing_option_names_the_trace_column() {
        for key in ["tracing.span.context.field", "table.field.event.tracing"] {
            let s = Settings::resolve(&base(), file(&format!("[router]\n\"{key}\" = \"trace\""))).unwrap();
            assert_eq!(s.router().tracing_field.as_deref(), Some("trace"), "{key}");
        }
    }

    #[test]
    fn readiness_drops_before_the_producer_restarts() {
        let s = Settings::resolve(&base(), FileConfig::default()).unwrap();
        assert_eq!(s.stream.unready_after, Duration::from_secs(30));
        assert!(s.stream.unready_after < s.stream.delivery_timeout);
        let f = file("[pipeline]\ndelivery_timeout_secs = 10");
        let s = Settings::resolve(&base(), f).unwrap();
        assert_eq!(s.stream.unready_after, Duration::from_secs(5));
    }

    /// Issue 29: every duration key takes a string with a unit beside its old number.
    #[test]
    fn durations_take_units_and_keep_their_old_numbers() {
        let text = "heartbeat_interval_secs = \"1min\"\ndelivery = \"exactly-once\"\n\
                    [pipeline]\nstatus_interval_secs = \"500ms\"\nhalt_linger_secs = 5\n\
                    [monitor]\nwarning_lag_secs = \"90s\"\ncritical_lag_secs = 600.5\n\
                    [exactly_once]\nmax_transaction_ms = \"2s\"\ntransaction_timeout_ms = 60000\n\
                    [retention]\ninterval_secs = \"2h\"\nlock_timeout_ms = \"1500ms\"";
        let s = Settings::resolve(&base(), file(text)).unwrap();
        assert_eq!(s.source.heartbeat_interval, Some(Duration::from_secs(60)));
        assert_eq!(s.stream.status_interval, Duration::from_millis(500));
        assert_eq!(s.stream.halt_linger, Duration::from_secs(5));
        assert_eq!((s.monitor.thresholds.warning_lag_secs, s.monitor.thresholds.critical_lag_secs), (90.0, 600.5));
        match &s.kafka.delivery {
            Delivery::ExactlyOnce(e) => {
                assert_eq!(e.max_transaction_interval, Duration::from_secs(2));
                assert_eq!(e.transaction_timeout, Duration::from_secs(60));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            (s.retention.interval, s.retention.lock_timeout),
            (Duration::from_secs(7200), Duration::from_millis(1500))
        );
        for zero in [
            "[pipeline]\nmax_backoff_secs = \"0s\"",
            "[retention]\nlock_timeout_ms = 0",
            "heartbeat_interval_secs = \"0ms\"",
        ] {
            let err = Settings::resolve(&base(), file(zero)).unwrap_err().to_string();
            assert!(err.contains("a positive duration"), "{zero}: {err}");
        }
        let err = FileConfig::parse("[pipeline]\nstatus_interval_secs = \"ten seconds\"").unwrap_err();
        assert!(err.contains("(status_interval_secs)") && err.contains("not a duration"), "{err}");
        assert!(!err.contains("ten seconds"), "a file's error shows no value: {err}");
    }
}
