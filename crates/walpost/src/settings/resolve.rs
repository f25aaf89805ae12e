//! Flags and environment over the file over defaults, validated once.

use std::collections::BTreeMap;

use router::RouterConfig;

mod sections;

use super::{secrets, CloudEventsFile, ConfigError, Delivery, Envelope, FileConfig, OpInvalid, RouterFile, Settings};
pub(in crate::settings) use sections::positive_duration;
use sections::{
    resolve_kafka, resolve_monitor, resolve_postgres, resolve_retention, resolve_snapshot, resolve_source,
    resolve_stream, resolve_telemetry,
};

mod overrides;
pub use overrides::Overrides;

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

/// Every section from its part of the file (with the flags layered on), then the checks
/// that span sections.
fn resolve(o: &Overrides, mut file: FileConfig, need_kafka: bool) -> Result<Settings, ConfigError> {
    o.layer_onto(&mut file);
    let postgres = resolve_postgres(o, &mut file)?;
    let mut source = resolve_source(&mut file, &postgres.server.dbname)?;
    if postgres.standby_decoding() && source.slot_failover {
        return Err(ConfigError::Invalid {
            key: "slot_failover",
            value: "true".into(),
            expected: "false when decoding on a standby: PostgreSQL creates failover slots on a primary only (a standby's slot is its own)",
        });
    }
    let kafka = resolve_kafka(o, &mut file, &source, need_kafka)?;
    if let Some(k) = &kafka {
        // walpost's own topics are never a row's destination.
        let mut reserved = vec![k.dead_letter_topic.clone()];
        if let Delivery::ExactlyOnce(e) = &k.delivery {
            reserved.push(e.progress_topic.clone());
        }
        for router in source.routers_mut() {
            router.reserved_topics.clone_from(&reserved);
        }
    }
    let registry =
        super::contracts::resolve_registry(&file.contracts, &file.registry, &source, &|k| std::env::var(k).ok())?;
    super::contracts::attach(&file.contracts, &mut source)?;
    let contracts = file.contracts.clone();
    let snapshot = resolve_snapshot(&mut file)?;
    let telemetry = resolve_telemetry(o, &mut file, snapshot.mode)?;
    Ok(Settings {
        postgres,
        source,
        stream: resolve_stream(file.pipeline, kafka.as_ref().map(|k| &k.properties))?,
        kafka,
        snapshot,
        monitor: resolve_monitor(file.monitor)?,
        retention: resolve_retention(&file.retention)?,
        telemetry,
        registry,
        admin: super::admin::resolve(&file.admin)?,
        contracts,
    })
}

/// `[kafka] properties_file`, then `[kafka.properties]`, then the secret `WALPOST_KAFKA_*`
/// variables, then `--kafka-property` (a secret there is warned about, never shown).
pub(super) fn resolve_kafka_properties(
    o: &Overrides,
    kafka: &super::KafkaFile,
) -> Result<BTreeMap<String, String>, ConfigError> {
    let mut properties = match &kafka.properties_file {
        Some(path) => secrets::read_properties_file(path)?,
        None => BTreeMap::new(),
    };
    properties.extend(kafka.properties.clone());
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
    Ok(properties)
}

/// `metrics_addr`: unset or empty for none.
pub(super) fn resolve_metrics_addr(text: Option<String>) -> Result<Option<std::net::SocketAddr>, ConfigError> {
    match text {
        None => Ok(None),
        Some(a) if a.is_empty() => Ok(None),
        Some(a) => Ok(Some(a.parse().map_err(|_| ConfigError::Invalid {
            key: "metrics_addr",
            value: a,
            expected: "host:port with an IP address, e.g. 127.0.0.1:9187",
        })?)),
    }
}

/// The connection string with its password file, warning about a password on argv.
/// `postgres` with the password file applied. `argv_warning`: the connection string came
/// from the command line, and this is the warning (naming its flag) for a password in it.
fn postgres_config(
    argv_warning: Option<&'static str>,
    password_file: Option<&std::path::Path>,
    postgres: &str,
) -> Result<replication::Config, ConfigError> {
    if let Some(warning) = argv_warning {
        if replication::Config::parse_with_env(postgres, &|_| None).is_ok_and(|c| c.password().is_some()) {
            tracing::warn!("{warning}");
        }
    }
    let postgres = match password_file {
        None => replication::Config::from_url(postgres)?,
        Some(path) => {
            // The file wins over PGPASSWORD, not over a password in the connection string.
            let mut config = replication::Config::parse_with_env(postgres, &|k| {
                (k != "PGPASSWORD").then(|| std::env::var(k).ok()).flatten()
            })?;
            config.set_password_if_missing(secrets::read_secret_file(path, "the PostgreSQL password")?);
            config
        }
    };
    Ok(postgres)
}

/// `postgres` for a mode that writes (`walpost inbox`): required, on a primary.
pub(super) fn resolve_inbox_postgres(o: &Overrides, file: &mut FileConfig) -> Result<replication::Config, ConfigError> {
    let text =
        file.postgres.take().ok_or(ConfigError::Missing { key: "postgres", flag: "postgres", env: "POSTGRES" })?;
    let on_argv = o.postgres_on_argv.then_some(secrets::POSTGRES_PASSWORD_ON_ARGV);
    let config = postgres_config(on_argv, file.postgres_password_file.take().as_deref(), &text)?;
    match decoding_server(config, &text)? {
        (config, None) => Ok(config),
        (config, Some(_)) => Err(ConfigError::Invalid {
            key: "target_session_attrs (in the PostgreSQL connection string or PGTARGETSESSIONATTRS)",
            value: config.target_session_attrs.as_str().to_owned(),
            expected:
                "read-write or primary (or none: walpost uses primary); walpost inbox writes its tables on the primary",
        }),
    }
}

/// Where the slot is read, and where walpost writes when that is a standby.
///
/// Without `target_session_attrs` (in the string or PGTARGETSESSIONATTRS) walpost connects
/// with `primary`, so a multi-host string settles on the primary wherever it is.
/// `standby` or `prefer-standby` decode on a standby (PostgreSQL 16+); walpost then
/// writes on the primary through a second connection: the same hosts with `read-write`
/// (the caller puts `postgres_primary` in its place when given). `any` and `read-only`
/// are refused: they could settle on either, and walpost must know which it wants.
fn decoding_server(
    mut config: replication::Config,
    text: &str,
) -> Result<(replication::Config, Option<replication::Config>), ConfigError> {
    use replication::TargetSessionAttrs as T;
    let explicit = text.contains("target_session_attrs") || std::env::var_os("PGTARGETSESSIONATTRS").is_some();
    match config.target_session_attrs {
        T::ReadWrite | T::Primary => Ok((config, None)),
        T::Any if !explicit => {
            config.target_session_attrs = T::Primary;
            Ok((config, None))
        }
        T::Standby | T::PreferStandby => {
            let mut primary = config.clone();
            primary.target_session_attrs = T::ReadWrite;
            Ok((config, Some(primary)))
        }
        other => Err(ConfigError::Invalid {
            key: "target_session_attrs (in the PostgreSQL connection string or PGTARGETSESSIONATTRS)",
            value: other.as_str().to_owned(),
            expected: "primary or read-write (decode on the primary; none: primary), or standby or prefer-standby (decode on a standby, PostgreSQL 16+)",
        }),
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

fn resolve_envelope(envelope: Option<Envelope>, f: &CloudEventsFile) -> Result<Option<EnvelopeChoice>, ConfigError> {
    if envelope.unwrap_or(Envelope::Plain) == Envelope::Plain {
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
        // Set for every router at once, after they resolve: see [contracts].
        contract: None,
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
mod tests;
