//! `[contracts]`: a JSON Schema per event type, checked on every payload before it
//! reaches Kafka (the checking is the `contracts` crate's, run by the router).
//!
//! ```toml
//! [contracts]
//! dir = "/etc/walpost/contracts"   # <event type>.json, one per event type
//! unknown = "allow"                # or "refuse": an event type without a schema
//! max_depth = 32                   # levels a payload may nest; deeper: a breach
//! [contracts.schemas]              # beside the directory's: event type = file
//! "order.placed" = "orders/placed-v2.json"   # relative to dir, or absolute
//! ```
//!
//! Or a schema registry's subjects, with the records in its wire format:
//!
//! ```toml
//! [contracts]
//! value_format = "avro"            # or "json-schema"; "json" (default): no registry
//! key_format = "avro"              # keys by the subject <topic>-key; "string" (default)
//! [registry]
//! url = "https://registry:8081"    # --registry-url, WALPOST_REGISTRY_URL
//! subject_strategy = "record_name" # or "topic_name", "topic_record_name"
//! ca = "/etc/walpost/registry-ca.pem"
//! username = "walpost"             # password: WALPOST_REGISTRY_PASSWORD or password_file
//! cache_ttl = "5min"
//! timeout = "10s"
//! max_response_bytes = 8388608     # a longer answer is an error, read no further
//! allow_plaintext_credentials = false  # credentials over http:// to another host
//! [registry.versions]              # subject = pinned version (default: the latest)
//! "OrderPlaced" = 3
//! ```
//!
//! The registry contract itself is made by `app` (its HTTP client is an I/O edge, above
//! the settings); here it is only resolved and checked.
//!
//! Invariants: the schemas are read and built once, when the settings are resolved, so
//! a file that is not a schema stops walpost (and `walpost check`) before any event is
//! read; every outbox table and the table-less outbox share one set of contracts, keyed
//! by the event type (`table.field.event.type.header`'s column), which they must have.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use std::time::Duration;

use clap::ValueEnum;
use contracts::registry::{Format, RegistryOptions, SubjectStrategy};
use contracts::{Contracts, Limits, SchemaText, Unknown};
use router::ContractRef;
use serde::{Deserialize, Serialize};

use super::duration::Seconds;
use super::secrets::read_secret_file;
use super::{spelling, ConfigError, KeyFormat, SourceSettings, ValueFormat};

pub use registry::settings::{RegistryAuth, RegistrySettings};

/// `[contracts]` as the file (and `--contracts-dir`, `--contracts-unknown`) give it.
#[derive(Debug, Default, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ContractsFile {
    /// A directory of `<event type>.json` files.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dir: Option<PathBuf>,
    /// `allow` (default) or `refuse` an event whose type has no schema.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unknown: Option<UnknownEventType>,
    /// Event type -> schema file, beside (or instead of) the directory's files.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub schemas: BTreeMap<String, PathBuf>,
    /// `json` (default), `json-schema` or `avro` (the last two need `[registry]`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value_format: Option<ValueFormat>,
    /// `string` (default: the aggregate id's bytes), `json-schema` or `avro` (by the
    /// subject `<topic>-key`; need a registry value format).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_format: Option<KeyFormat>,
    /// Levels of objects and arrays a payload may nest (default 32); deeper: a breach.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_depth: Option<usize>,
}

/// `contracts.unknown` (`--contracts-unknown`): an event type without a schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, ValueEnum)]
#[serde(rename_all = "kebab-case")]
#[value(rename_all = "kebab-case")]
pub enum UnknownEventType {
    /// Published unchecked.
    Allow,
    /// A permanent error of that event.
    Refuse,
}

impl ContractsFile {
    pub(crate) fn is_empty(&self) -> bool {
        self.dir.is_none()
            && self.unknown.is_none()
            && self.schemas.is_empty()
            && self.value_format.is_none()
            && self.key_format.is_none()
            && self.max_depth.is_none()
    }

    /// The bounds of every check: `max_depth` from 1 to 128 (serde_json stops at 128
    /// levels, so a larger one would never be reached).
    fn limits(&self) -> Result<Limits, ConfigError> {
        match self.max_depth {
            None => Ok(Limits::default()),
            Some(max_depth @ 1..=128) => Ok(Limits { max_depth }),
            Some(other) => Err(ConfigError::Invalid {
                key: "contracts.max_depth",
                value: other.to_string(),
                expected: "a number of levels from 1 to 128",
            }),
        }
    }
}

/// `[registry]` as the file (and `--registry-url`) give it.
#[derive(Debug, Default, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RegistryFile {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// `record_name` (default), `topic_name` or `topic_record_name`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subject_strategy: Option<String>,
    /// The CA (PEM) that signed an https registry's certificate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca: Option<PathBuf>,
    /// Basic authentication's user; the password from `WALPOST_REGISTRY_PASSWORD` or
    /// `password_file`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password_file: Option<PathBuf>,
    /// A bearer token's file (or `WALPOST_REGISTRY_TOKEN`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_ttl: Option<Seconds>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Seconds>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub versions: BTreeMap<String, i32>,
    /// The longest answer (body) read from the registry, in bytes (default 8 MiB).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_response_bytes: Option<u64>,
    /// Sends the credentials over `http://` to a host that is not this one (default:
    /// refused).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_plaintext_credentials: Option<bool>,
}

impl RegistryFile {
    pub(crate) fn is_empty(&self) -> bool {
        self.url.is_none()
            && self.subject_strategy.is_none()
            && self.ca.is_none()
            && self.username.is_none()
            && self.password_file.is_none()
            && self.token_file.is_none()
            && self.cache_ttl.is_none()
            && self.timeout.is_none()
            && self.versions.is_empty()
            && self.max_response_bytes.is_none()
            && self.allow_plaintext_credentials.is_none()
    }
}

/// The default time a fetched schema is used before the registry is asked again.
pub const REGISTRY_CACHE_TTL: Duration = Duration::from_secs(300);
/// The default time a registry request may take.
pub const REGISTRY_TIMEOUT: Duration = Duration::from_secs(10);
/// Subjects the schema cache holds at most.
pub const REGISTRY_MAX_SUBJECTS: usize = 10_000;
/// The default longest registry answer: 8 MiB, far above any schema's text.
pub const REGISTRY_MAX_RESPONSE_BYTES: usize = 8 << 20;

/// `WALPOST_REGISTRY_PASSWORD`, `WALPOST_REGISTRY_TOKEN`: the registry's secrets from the
/// environment (never argv).
pub const REGISTRY_PASSWORD_ENV: &str = "WALPOST_REGISTRY_PASSWORD";
pub const REGISTRY_TOKEN_ENV: &str = "WALPOST_REGISTRY_TOKEN";

/// The registry settings when `contracts.value_format` needs them; checks that the rest
/// of the configuration fits a framed record.
pub(crate) fn resolve_registry(
    contracts: &ContractsFile,
    registry: &RegistryFile,
    source: &SourceSettings,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<RegistrySettings>, ConfigError> {
    let format = match contracts.value_format {
        None | Some(ValueFormat::Json) => None,
        Some(ValueFormat::JsonSchema) => Some(Format::JsonSchema),
        Some(ValueFormat::Avro) => Some(Format::Avro),
    };
    let key_format = match contracts.key_format {
        None | Some(KeyFormat::String) => None,
        Some(KeyFormat::JsonSchema) => Some(Format::JsonSchema),
        Some(KeyFormat::Avro) => Some(Format::Avro),
    };
    let Some(format) = format else {
        if key_format.is_some() {
            return Err(ConfigError::Invalid {
                key: "contracts.key_format",
                value: contracts.key_format.map(spelling).unwrap_or_default(),
                expected: "string unless contracts.value_format is json-schema or avro (keys are written by the registry that writes the values)",
            });
        }
        if let Some(url) = &registry.url {
            return Err(ConfigError::Invalid {
                key: "registry.url",
                value: url.clone(),
                expected: "a registry only with contracts.value_format = json-schema or avro, which use it",
            });
        }
        return Ok(None);
    };
    let refuse = |key: &'static str, expected: &'static str| ConfigError::Invalid {
        key,
        value: contracts.value_format.map(spelling).unwrap_or_default(),
        expected,
    };
    if contracts.dir.is_some() || !contracts.schemas.is_empty() || contracts.unknown.is_some() {
        return Err(refuse(
            "contracts.value_format",
            "json when contracts.dir, [contracts.schemas] or contracts.unknown are set: schemas come from files or from the registry, not both",
        ));
    }
    if registry.url.as_deref().is_none_or(|u| u.trim().is_empty()) {
        return Err(refuse("contracts.value_format", "json unless [registry] url (--registry-url) is set"));
    }
    for router in source.routers() {
        let envelope = router.additional.iter().any(|a| matches!(a.placement, router::Placement::Envelope(_)));
        if router.cloudevents.is_some() || envelope {
            return Err(refuse(
                "contracts.value_format",
                "json with envelope = cloudevents or envelope fields: a registry's record is the payload alone",
            ));
        }
    }
    let mut settings = registry_settings(registry, None, format, env)?;
    settings.options.key_format = key_format;
    settings.options.limits = contracts.limits()?;
    let strategy = settings.options.strategy;
    if strategy != SubjectStrategy::TopicName {
        let untyped = source.routers().any(|r| r.event_type_header_field.is_none());
        if untyped {
            return Err(ConfigError::Option(format!(
                "registry.subject_strategy = {} names subjects by the event type, but an outbox has none: set {} to its event type column, or use topic_name",
                registry.subject_strategy.as_deref().unwrap_or("record_name"),
                router::EVENT_TYPE_HEADER_OPTION
            )));
        }
    }
    Ok(Some(settings))
}

/// `[registry]`'s connection, strategy and cache, for `run` (through [`resolve_registry`])
/// and `walpost contracts`; `strategy` is a flag's, over the file's.
pub fn registry_settings(
    registry: &RegistryFile,
    strategy: Option<&str>,
    format: Format,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<RegistrySettings, ConfigError> {
    let Some(url) = registry.url.clone().filter(|u| !u.trim().is_empty()) else {
        return Err(ConfigError::Missing { key: "registry.url", flag: "registry-url", env: "REGISTRY_URL" });
    };
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(ConfigError::Invalid { key: "registry.url", value: url, expected: "an http:// or https:// URL" });
    }
    if url.split("://").nth(1).is_some_and(|rest| rest.split('/').next().is_some_and(|host| host.contains('@'))) {
        return Err(ConfigError::Option(
            "registry.url holds credentials: put the user in registry.username and the password in WALPOST_REGISTRY_PASSWORD or registry.password_file".into(),
        ));
    }
    let strategy = match strategy.or(registry.subject_strategy.as_deref()) {
        None | Some("record_name") => SubjectStrategy::RecordName,
        Some("topic_name") => SubjectStrategy::TopicName,
        Some("topic_record_name") => SubjectStrategy::TopicRecordName,
        Some(other) => {
            return Err(ConfigError::Invalid {
                key: "registry.subject_strategy",
                value: other.into(),
                expected: "record_name, topic_name or topic_record_name",
            })
        }
    };
    let password = match (&registry.password_file, env(REGISTRY_PASSWORD_ENV)) {
        (Some(file), _) => Some(read_secret_file(file, "the registry password")?),
        (None, p) => p,
    };
    let token = match (&registry.token_file, env(REGISTRY_TOKEN_ENV)) {
        (Some(file), _) => Some(read_secret_file(file, "the registry token")?),
        (None, t) => t,
    };
    let auth = match (&registry.username, password, token) {
        (Some(_), _, Some(_)) => {
            return Err(ConfigError::Option(
                "[registry]: a username (basic authentication) and a token (bearer) are both set: keep one".into(),
            ))
        }
        (Some(username), Some(password), None) => RegistryAuth::Basic { username: username.clone(), password },
        (Some(_), None, None) => {
            return Err(ConfigError::Option(format!(
                "[registry] username is set without a password: set {REGISTRY_PASSWORD_ENV} or registry.password_file"
            )))
        }
        (None, _, Some(token)) => RegistryAuth::Bearer(token),
        (None, _, None) => RegistryAuth::None,
    };
    if auth != RegistryAuth::None {
        plaintext_credentials(&url, registry.allow_plaintext_credentials.unwrap_or(false))?;
    }
    let max_response_bytes = match registry.max_response_bytes {
        None => REGISTRY_MAX_RESPONSE_BYTES,
        Some(n) => usize::try_from(n).ok().filter(|n| *n >= 1024).ok_or_else(|| ConfigError::Invalid {
            key: "registry.max_response_bytes",
            value: n.to_string(),
            expected: "a number of bytes, at least 1024",
        })?,
    };
    let options = RegistryOptions {
        format,
        strategy,
        pinned: registry.versions.iter().map(|(k, v)| (k.clone(), *v)).collect(),
        ttl: registry.cache_ttl.map_or(REGISTRY_CACHE_TTL, |s| s.0),
        max_subjects: REGISTRY_MAX_SUBJECTS,
        key_format: None,
        limits: Limits::default(),
    };
    let timeout = registry.timeout.map_or(REGISTRY_TIMEOUT, |s| s.0);
    let url = url.trim_end_matches('/').to_owned();
    Ok(RegistrySettings { url, options, ca: registry.ca.clone(), auth, timeout, max_response_bytes })
}

/// Credentials go over `http://` only to this machine (with a warning), or anywhere
/// when `registry.allow_plaintext_credentials` says so: on the network, anyone on the
/// path could read them (Basic authentication is the password in base64), as walpost
/// refuses a PostgreSQL password over plain TCP unless `require_auth` allows it.
fn plaintext_credentials(url: &str, allowed: bool) -> Result<(), ConfigError> {
    let Some(rest) = url.strip_prefix("http://") else { return Ok(()) };
    let authority = rest.split('/').next().unwrap_or_default();
    if allowed {
        tracing::warn!(
            "[registry] sends its credentials over plain http:// to {authority} (registry.allow_plaintext_credentials = true): anyone on the network path can read them; use an https:// registry URL"
        );
        return Ok(());
    }
    if is_loopback(authority) {
        tracing::warn!(
            "[registry] sends its credentials over plain http:// to {authority}, this machine: use an https:// registry URL unless the registry only listens here"
        );
        return Ok(());
    }
    Err(ConfigError::Option(format!(
        "[registry] has credentials (username or token), but registry.url is plain http:// to {authority}, where anyone on the network path could read them: use an https:// registry URL (registry.ca for its CA), or set registry.allow_plaintext_credentials = true to send them anyway"
    )))
}

/// Whether `authority` (`host` or `host:port`) is this machine.
fn is_loopback(authority: &str) -> bool {
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Gives every router of `source` the contracts of `f`, if any; each must have an event
/// type column, since the event type picks the schema.
pub(crate) fn attach(f: &ContractsFile, source: &mut SourceSettings) -> Result<(), ConfigError> {
    let Some(contract) = resolve_contracts(f)? else {
        return Ok(());
    };
    let untyped =
        source.outboxes.iter().find(|o| o.router.event_type_header_field.is_none()).map(|o| o.table.to_string());
    let untyped = untyped.or_else(|| {
        source.messages.as_ref().filter(|m| m.router.event_type_header_field.is_none()).map(|_| "[messages]".to_owned())
    });
    if let Some(table) = untyped {
        return Err(ConfigError::Option(format!(
            "[contracts] needs each event's type, but {table} has none: set {} to its event type column",
            router::EVENT_TYPE_HEADER_OPTION
        )));
    }
    for router in source.routers_mut() {
        router.contract = Some(contract.clone());
    }
    Ok(())
}

/// Reads and builds the contracts; `None` when none are configured.
pub(crate) fn resolve_contracts(f: &ContractsFile) -> Result<Option<ContractRef>, ConfigError> {
    let unknown = match f.unknown {
        None | Some(UnknownEventType::Allow) => Unknown::Allow,
        Some(UnknownEventType::Refuse) => Unknown::Refuse,
    };
    if f.dir.is_none() && f.schemas.is_empty() {
        if f.unknown.is_some() {
            return Err(ConfigError::Invalid {
                key: "contracts.unknown",
                value: f.unknown.map(spelling).unwrap_or_default(),
                expected: "a setting beside contracts.dir or [contracts.schemas], which hold the schemas",
            });
        }
        return Ok(None);
    }
    let mut texts = Vec::new();
    let mut origin = Vec::new();
    if let Some(dir) = &f.dir {
        origin.push(dir.display().to_string());
        let entries = std::fs::read_dir(dir).map_err(|e| contract_error(dir, &e.to_string()))?;
        let mut files: Vec<PathBuf> = Vec::new();
        for entry in entries {
            let path = entry.map_err(|e| contract_error(dir, &e.to_string()))?.path();
            if path.extension().is_some_and(|e| e == "json") && path.is_file() {
                files.push(path);
            }
        }
        files.sort();
        for path in files {
            let event_type = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            if f.schemas.contains_key(&event_type) {
                continue; // [contracts.schemas] names this event type's file itself.
            }
            texts.push(read_schema(event_type, &path)?);
        }
    }
    for (event_type, file) in &f.schemas {
        let path = match &f.dir {
            Some(dir) if file.is_relative() => dir.join(file),
            _ => file.clone(),
        };
        texts.push(read_schema(event_type.clone(), &path)?);
    }
    if !f.schemas.is_empty() {
        origin.push("[contracts.schemas]".into());
    }
    let limits = f.limits()?;
    let built = Contracts::new(texts, unknown, origin.join(" and "))
        .map_err(|e| ConfigError::Option(format!("{e} (see docs/contracts.md)")))?
        .with_limits(limits);
    Ok(Some(ContractRef(Arc::new(built))))
}

fn read_schema(event_type: String, path: &Path) -> Result<SchemaText, ConfigError> {
    let text = std::fs::read(path).map_err(|e| contract_error(path, &e.to_string()))?;
    Ok(SchemaText { event_type, name: path.display().to_string(), text })
}

fn contract_error(path: &Path, reason: &str) -> ConfigError {
    ConfigError::Option(format!("contracts: cannot read {}: {reason} (see docs/contracts.md)", path.display()))
}

#[cfg(test)]
mod tests;
