//! Contracts from a schema registry (the Confluent REST API: Confluent Schema Registry,
//! Apicurio's `ccompat`, Karapace, Redpanda): each event's subject is named by a
//! strategy, its schema fetched through the caller's [`SchemaSource`] and cached, and the
//! record's value written in the Confluent wire format: magic byte 0, the schema id (4
//! bytes, big-endian), then the payload unchanged (`json-schema`) or as Avro binary
//! (`avro`).
//!
//! Invariants:
//! - A record is framed or it is not published: an event whose subject is missing, whose
//!   schema is of the wrong kind or refuses it is a [`Breach`]; a registry that cannot
//!   be asked is [`ContractError::Unavailable`] (transient), never a pass.
//! - A cached schema is used until its time to live ends; after that it is fetched
//!   again, and while the registry cannot answer the cached one stays in use (as the
//!   registry clients' caches do), so an outage stops only subjects not seen before.
//! - Keys (`key_format`) are written by the subject `<topic>-key` (the Confluent
//!   serializers' default for keys), every record's key, tombstones included: the
//!   aggregate id as a string, or as a number when the key schema takes only numbers.
//! - The cache holds at most [`RegistryOptions::max_subjects`] subjects (the oldest
//!   goes first); schemas are fetched outside its lock.
//! - No I/O here: [`SchemaSource`] is the caller's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use router::{Breach, BreachReason, Checked, ContractError, Event, PayloadContract};

use crate::avro::{AvroWriter, Failure};
use crate::Limits;

/// How a record's value is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Validated by the subject's JSON Schema; the payload bytes after the wire header.
    JsonSchema,
    /// Converted to Avro binary by the subject's Avro schema, after the wire header.
    Avro,
}

impl Format {
    /// The registry's `schemaType` this format needs.
    pub fn schema_type(self) -> &'static str {
        match self {
            Format::JsonSchema => "JSON",
            Format::Avro => "AVRO",
        }
    }
}

/// How an event's subject is named (the Confluent serializers' strategies).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubjectStrategy {
    /// `<topic>-value`: one schema per topic.
    TopicName,
    /// The event type: one schema per event type, whatever its topic.
    RecordName,
    /// `<topic>-<event type>`.
    TopicRecordName,
}

impl SubjectStrategy {
    /// The subject of an event; `None` when the strategy needs an event type it lacks.
    pub fn subject(self, topic: &str, event_type: Option<&[u8]>) -> Option<String> {
        let event_type = || std::str::from_utf8(event_type?).ok();
        match self {
            SubjectStrategy::TopicName => Some(format!("{topic}-value")),
            SubjectStrategy::RecordName => event_type().map(str::to_owned),
            SubjectStrategy::TopicRecordName => event_type().map(|t| format!("{topic}-{t}")),
        }
    }
}

/// A schema as the registry holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registered {
    pub id: u32,
    pub version: i32,
    /// `schemaType`: `AVRO` (the registry's default when absent), `JSON`, `PROTOBUF`.
    pub schema_type: String,
    pub schema: String,
    /// How many other subjects it refers to (references are not followed).
    pub references: usize,
}

/// What the registry answered for a subject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fetched {
    Found(Registered),
    /// No such subject (or no such version of it).
    Missing,
}

/// Asks the registry (the caller's I/O). `Err` is a registry that cannot answer now:
/// the text says why, naming the registry and never a credential.
pub trait SchemaSource: Send + Sync {
    fn fetch(&self, subject: &str, version: Option<i32>) -> Result<Fetched, String>;
    fn describe(&self) -> String;
}

/// Whether a check found its subject in the cache (for the caller's metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    Hit,
    Miss,
}

/// How registry contracts behave.
#[derive(Debug, Clone)]
pub struct RegistryOptions {
    pub format: Format,
    pub strategy: SubjectStrategy,
    /// Subject -> the version to use instead of the latest.
    pub pinned: HashMap<String, i32>,
    /// How long a fetched schema (or a missing subject) is used before it is asked again.
    pub ttl: Duration,
    pub max_subjects: usize,
    /// How keys are written: `None` as they are (the aggregate id's bytes), else by the
    /// subject `<topic>-key` in this format.
    pub key_format: Option<Format>,
    /// What bounds each check (`contracts.max_depth`).
    pub limits: Limits,
}

/// Which part of a record a subject's schema writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Part {
    Value,
    Key,
}

/// A subject's schema, built.
enum Built {
    Json(jsonschema::Validator),
    Avro(AvroWriter),
}

/// What the cache holds for a subject.
enum Entry {
    Ready {
        name: Arc<str>,
        id: u32,
        built: Built,
    },
    /// A breach every event of the subject gets (missing, wrong kind, unusable).
    Refused(Breach),
}

struct Cached {
    at: Instant,
    entry: Arc<Entry>,
}

/// See the module docs.
pub struct RegistryContracts {
    source: Arc<dyn SchemaSource>,
    options: RegistryOptions,
    cache: Mutex<HashMap<(Part, String), Cached>>,
    observe: Option<Box<dyn Fn(Lookup) + Send + Sync>>,
}

impl std::fmt::Debug for RegistryContracts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryContracts")
            .field("registry", &self.source.describe())
            .field("options", &self.options)
            .finish()
    }
}

impl RegistryContracts {
    pub fn new(source: Arc<dyn SchemaSource>, options: RegistryOptions) -> RegistryContracts {
        RegistryContracts { source, options, cache: Mutex::default(), observe: None }
    }

    /// Calls `observe` on every lookup of a subject in the cache.
    pub fn observed(mut self, observe: impl Fn(Lookup) + Send + Sync + 'static) -> RegistryContracts {
        self.observe = Some(Box::new(observe));
        self
    }

    /// The subject's entry: cached while fresh, else fetched; a stale one is kept when
    /// the registry cannot answer.
    fn entry(&self, part: Part, subject: String, format: Format) -> Result<Arc<Entry>, ContractError> {
        let cached = (part, subject);
        let subject = cached.1.as_str();
        let stale = {
            let cache = self.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            match cache.get(&cached) {
                Some(c) if c.at.elapsed() < self.options.ttl => {
                    self.note(Lookup::Hit);
                    return Ok(c.entry.clone());
                }
                other => other.map(|c| c.entry.clone()),
            }
        };
        self.note(Lookup::Miss);
        let version = self.options.pinned.get(subject).copied();
        let entry = match self.source.fetch(subject, version) {
            Ok(fetched) => Arc::new(build(part, subject, version, fetched, format)),
            Err(reason) => return stale.ok_or(ContractError::Unavailable(reason)),
        };
        let mut cache = self.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if cache.len() >= self.options.max_subjects && !cache.contains_key(&cached) {
            let oldest = cache.iter().min_by_key(|(_, c)| c.at).map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                cache.remove(&oldest);
            }
        }
        cache.insert(cached, Cached { at: Instant::now(), entry: entry.clone() });
        Ok(entry)
    }

    fn note(&self, lookup: Lookup) {
        if let Some(observe) = &self.observe {
            observe(lookup);
        }
    }
}

/// A subject's schema as `format` needs it, or the breach every use of it gets.
fn build(part: Part, subject: &str, version: Option<i32>, fetched: Fetched, format: Format) -> Entry {
    let refused = |name: String, reason| Entry::Refused(Breach { schema: Some(Arc::from(name)), reason });
    let r = match fetched {
        Fetched::Missing => {
            let name = match version {
                Some(v) => format!("subject {subject} version {v}"),
                None => format!("subject {subject}"),
            };
            return refused(name, BreachReason::NoSubject);
        }
        Fetched::Found(r) => r,
    };
    let name = format!("subject {subject} version {} (id {})", r.version, r.id);
    let wanted = format.schema_type();
    if !r.schema_type.eq_ignore_ascii_case(wanted) {
        let setting = match part {
            Part::Value => "contracts.value_format",
            Part::Key => "contracts.key_format",
        };
        return refused(name, BreachReason::WrongSchemaType { found: r.schema_type, wanted, setting });
    }
    if r.references > 0 {
        let reason = "it refers to other subjects, which walpost does not follow".to_owned();
        return refused(name, BreachReason::Unusable { reason });
    }
    let built = match format {
        Format::JsonSchema => serde_json::from_str::<serde_json::Value>(&r.schema)
            .map_err(|e| format!("not JSON: {e}"))
            .and_then(|schema| crate::build_json_schema(&schema).map_err(|e| format!("not a JSON Schema: {e}")))
            .map(Built::Json),
        Format::Avro => AvroWriter::new(&r.schema).map(Built::Avro),
    };
    match built {
        Ok(built) => Entry::Ready { name: Arc::from(name), id: r.id, built },
        Err(reason) => refused(name, BreachReason::Unusable { reason }),
    }
}

impl PayloadContract for RegistryContracts {
    fn check(&self, event: Event<'_>, payload: &[u8]) -> Result<Checked, ContractError> {
        let Some(subject) = self.options.strategy.subject(event.topic, event.event_type) else {
            return Err(Breach { schema: None, reason: BreachReason::NoEventType }.into());
        };
        let entry = self.entry(Part::Value, subject, self.options.format)?;
        let (name, id, built) = match entry.as_ref() {
            Entry::Refused(breach) => return Err(breach.clone().into()),
            Entry::Ready { name, id, built } => (name, *id, built),
        };
        let limits = self.options.limits;
        let value = limits.parse(name, payload)?;
        let budget = Limits::steps_for(payload.len());
        let mut out = Vec::with_capacity(payload.len().saturating_add(5));
        out.push(0);
        out.extend_from_slice(&id.to_be_bytes());
        match built {
            Built::Json(validator) => {
                crate::validate_json(name, validator, &value, budget)?;
                out.extend_from_slice(payload);
            }
            Built::Avro(writer) => writer.write(&value, &mut out, limits, budget).map_err(|f| Breach {
                schema: Some(name.clone()),
                reason: match f {
                    Failure::Mismatch((pointer, reason)) => BreachReason::NotAvro { pointer, reason },
                    Failure::Costly(steps) => BreachReason::TooCostly { steps },
                },
            })?,
        }
        Ok(Checked::Encoded(Bytes::from(out)))
    }

    /// A subject named after the event type exists only when the operator registered
    /// it; `topic_name` subjects say nothing about the event type.
    fn accepted_types_are_configured(&self) -> bool {
        self.options.strategy != SubjectStrategy::TopicName
    }

    fn key(&self, topic: &str, key: &[u8]) -> Result<Option<Bytes>, ContractError> {
        let Some(format) = self.options.key_format else { return Ok(None) };
        let entry = self.entry(Part::Key, format!("{topic}-key"), format)?;
        let (name, id, built) = match entry.as_ref() {
            Entry::Refused(breach) => return Err(breach.clone().into()),
            Entry::Ready { name, id, built } => (name, *id, built),
        };
        let refused = |reason: String| Breach { schema: Some(name.clone()), reason: BreachReason::BadKey { reason } };
        let text = std::str::from_utf8(key).map_err(|_| refused("it is not UTF-8 text".into()))?;
        // The aggregate id is text; a key schema that takes only numbers gets it as one.
        let as_string = serde_json::Value::String(text.to_owned());
        let as_number = serde_json::from_str::<serde_json::Number>(text).ok().map(serde_json::Value::Number);
        let limits = self.options.limits;
        let budget = Limits::steps_for(key.len());
        let costly = || Breach { schema: Some(name.clone()), reason: BreachReason::TooCostly { steps: budget } };
        let mut out = Vec::with_capacity(key.len().saturating_add(8));
        out.push(0);
        out.extend_from_slice(&id.to_be_bytes());
        match built {
            Built::Json(validator) => {
                let first = match crate::validate_json(name, validator, &as_string, budget) {
                    Ok(()) => {
                        serde_json::to_writer(&mut out, &as_string).map_err(|e| refused(e.to_string()))?;
                        return Ok(Some(Bytes::from(out)));
                    }
                    Err(Breach { reason: BreachReason::Invalid { keyword, schema_path, .. }, .. }) => {
                        format!("it fails \"{keyword}\" (schema path {schema_path})")
                    }
                    Err(other) => return Err(other.into()),
                };
                match as_number.map(|n| crate::is_valid_within(validator, &n, budget)) {
                    Some(Some(true)) => out.extend_from_slice(text.as_bytes()),
                    Some(None) => return Err(costly().into()),
                    _ => return Err(refused(first).into()),
                }
            }
            Built::Avro(writer) => {
                let header = out.len();
                match writer.write(&as_string, &mut out, limits, budget) {
                    Ok(()) => {}
                    Err(Failure::Costly(_)) => return Err(costly().into()),
                    Err(Failure::Mismatch((_, reason))) => {
                        out.truncate(header);
                        let number = as_number.map(|n| writer.write(&n, &mut out, limits, budget));
                        match number {
                            Some(Ok(())) => {}
                            Some(Err(Failure::Costly(_))) => return Err(costly().into()),
                            _ => return Err(refused(format!("it {reason}")).into()),
                        }
                    }
                }
            }
        }
        Ok(Some(Bytes::from(out)))
    }

    fn describe(&self) -> String {
        let strategy = match self.options.strategy {
            SubjectStrategy::TopicName => "topic_name",
            SubjectStrategy::RecordName => "record_name",
            SubjectStrategy::TopicRecordName => "topic_record_name",
        };
        let format = match self.options.format {
            Format::JsonSchema => "json-schema",
            Format::Avro => "avro",
        };
        let keys = match self.options.key_format {
            None => "",
            Some(Format::JsonSchema) => ", json-schema keys",
            Some(Format::Avro) => ", avro keys",
        };
        format!("{format} records{keys} by the subjects ({strategy}) of {}", self.source.describe())
    }
}

#[cfg(test)]
mod tests;
