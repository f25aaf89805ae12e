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
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]

    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A registry in memory that can be switched off; counts its fetches.
    #[derive(Default)]
    struct Memory {
        subjects: Mutex<HashMap<String, Registered>>,
        down: std::sync::atomic::AtomicBool,
        fetches: AtomicUsize,
    }

    impl Memory {
        fn put(&self, subject: &str, id: u32, schema_type: &str, schema: &str) {
            let r = Registered {
                id,
                version: i32::try_from(id).unwrap(),
                schema_type: schema_type.into(),
                schema: schema.into(),
                references: 0,
            };
            self.subjects.lock().unwrap().insert(subject.into(), r);
        }
    }

    impl SchemaSource for Arc<Memory> {
        fn fetch(&self, subject: &str, _: Option<i32>) -> Result<Fetched, String> {
            self.fetches.fetch_add(1, Ordering::SeqCst);
            if self.down.load(Ordering::SeqCst) {
                return Err("the registry at mem does not answer".into());
            }
            Ok(self.subjects.lock().unwrap().get(subject).cloned().map_or(Fetched::Missing, Fetched::Found))
        }
        fn describe(&self) -> String {
            "mem".into()
        }
    }

    fn contracts(memory: &Arc<Memory>, format: Format, strategy: SubjectStrategy, ttl: Duration) -> RegistryContracts {
        let options = RegistryOptions {
            format,
            strategy,
            pinned: HashMap::new(),
            ttl,
            max_subjects: 2,
            key_format: None,
            limits: Limits::default(),
        };
        RegistryContracts::new(Arc::new(memory.clone()), options)
    }

    fn event<'a>(event_type: &'a str, topic: &'a str) -> Event<'a> {
        Event { event_type: Some(event_type.as_bytes()), topic }
    }

    const AMOUNT: &str = r#"{"type": "object", "required": ["amount"], "properties": {"amount": {"type": "integer"}}}"#;

    #[test]
    fn subjects_follow_the_strategies() {
        assert_eq!(SubjectStrategy::TopicName.subject("orders", None).as_deref(), Some("orders-value"));
        assert_eq!(SubjectStrategy::RecordName.subject("orders", Some(b"OrderPlaced")).as_deref(), Some("OrderPlaced"));
        assert_eq!(SubjectStrategy::RecordName.subject("orders", None), None);
        assert_eq!(
            SubjectStrategy::TopicRecordName.subject("orders", Some(b"OrderPlaced")).as_deref(),
            Some("orders-OrderPlaced")
        );
    }

    #[test]
    fn json_schema_frames_valid_payloads_and_refuses_the_rest_by_pointer() {
        let m = Arc::new(Memory::default());
        m.put("OrderPlaced", 7, "JSON", AMOUNT);
        let c = contracts(&m, Format::JsonSchema, SubjectStrategy::RecordName, Duration::from_secs(60));
        let framed = c.check(event("OrderPlaced", "t"), br#"{"amount": 5}"#).unwrap();
        assert_eq!(framed, Checked::Encoded(Bytes::from_static(b"\0\0\0\0\x07{\"amount\": 5}")));
        let ContractError::Breach(b) = c.check(event("OrderPlaced", "t"), br#"{"amount": "SECRET"}"#).unwrap_err()
        else {
            panic!("a breach")
        };
        assert_eq!(
            b.to_string(),
            "schema subject OrderPlaced version 7 (id 7) refuses it: the value at /amount fails \"type\" (schema path /properties/amount/type): fix the producing service, or the schema if the event is right"
        );
        let ContractError::Breach(missing) = c.check(event("Other", "t"), b"{}").unwrap_err() else { panic!() };
        assert_eq!(
            missing.to_string(),
            "the schema registry has no subject Other: register the schema (walpost contracts push), or fix the subject strategy"
        );
        let untyped = c.check(Event { event_type: None, topic: "t" }, b"{}").unwrap_err();
        assert!(matches!(untyped, ContractError::Breach(Breach { reason: BreachReason::NoEventType, .. })));
        assert_eq!(m.fetches.load(Ordering::SeqCst), 2, "one fetch per subject, the missing one cached too");
    }

    #[test]
    fn avro_writes_the_binary_after_the_header_and_a_json_subject_is_the_wrong_kind() {
        let m = Arc::new(Memory::default());
        m.put(
            "orders-value",
            3,
            "AVRO",
            r#"{"type": "record", "name": "O", "fields": [{"name": "amount", "type": "int"}]}"#,
        );
        m.put("json-value", 4, "JSON", AMOUNT);
        let c = contracts(&m, Format::Avro, SubjectStrategy::TopicName, Duration::from_secs(60));
        let framed = c.check(event("X", "orders"), br#"{"amount": -3}"#).unwrap();
        assert_eq!(framed, Checked::Encoded(Bytes::from_static(b"\0\0\0\0\x03\x05")));
        let ContractError::Breach(b) = c.check(event("X", "orders"), br#"{"amount": "SECRET"}"#).unwrap_err() else {
            panic!()
        };
        assert_eq!(
            b.to_string(),
            "the Avro schema of subject orders-value version 3 (id 3) cannot hold it: the value at /amount is not an int: fix the producing service, or the schema if the event is right"
        );
        let ContractError::Breach(kind) = c.check(event("X", "json"), b"{}").unwrap_err() else { panic!() };
        assert_eq!(
            kind.to_string(),
            "subject json-value version 4 (id 4) holds a JSON schema, but contracts.value_format needs schemaType AVRO: register such a schema under it, or change the format"
        );
        let ContractError::Breach(json) = c.check(event("X", "orders"), b"{not json").unwrap_err() else { panic!() };
        assert!(matches!(json.reason, BreachReason::NotJson { line: 1, column: 2 }), "{json:?}");
    }

    #[test]
    fn an_outage_stops_new_subjects_only_and_a_new_version_is_used_after_the_ttl() {
        let m = Arc::new(Memory::default());
        m.put("A", 1, "JSON", AMOUNT);
        m.put("B", 2, "JSON", "{}");
        let c = contracts(&m, Format::JsonSchema, SubjectStrategy::RecordName, Duration::from_millis(50));
        assert!(c.check(event("A", "t"), br#"{"amount": 1}"#).is_ok());
        m.down.store(true, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(60));
        assert!(c.check(event("A", "t"), br#"{"amount": 1}"#).is_ok(), "the stale schema stays in use");
        assert_eq!(
            c.check(event("B", "t"), b"{}").unwrap_err(),
            ContractError::Unavailable("the registry at mem does not answer".into())
        );
        m.down.store(false, Ordering::SeqCst);
        m.put("A", 5, "JSON", "{}");
        std::thread::sleep(Duration::from_millis(60));
        let framed = c.check(event("A", "t"), br#"{"amount": "now free"}"#).unwrap();
        let Checked::Encoded(bytes) = framed else { panic!() };
        assert_eq!(&bytes[..5], b"\0\0\0\0\x05", "the new version's id");
    }

    #[test]
    fn keys_are_written_by_the_topics_key_subject_as_a_string_or_a_number() {
        let m = Arc::new(Memory::default());
        m.put("orders-key", 11, "AVRO", r#""string""#);
        m.put("ids-key", 12, "AVRO", r#""long""#);
        m.put("typed-key", 13, "JSON", r#"{"type": "string", "pattern": "^o-"}"#);
        m.put("numbers-key", 14, "JSON", r#"{"type": "integer"}"#);
        m.put("orders-value", 3, "AVRO", r#""string""#);
        let options = |key_format| RegistryOptions {
            format: Format::Avro,
            strategy: SubjectStrategy::TopicName,
            pinned: HashMap::new(),
            ttl: Duration::from_secs(60),
            max_subjects: 100,
            key_format,
            limits: Limits::default(),
        };
        let plain = RegistryContracts::new(Arc::new(m.clone()), options(None));
        assert_eq!(plain.key("orders", b"o-1").unwrap(), None, "key_format string: the key unchanged");
        let avro = RegistryContracts::new(Arc::new(m.clone()), options(Some(Format::Avro)));
        // Avro string: zig-zag length 3 (6), then the bytes.
        assert_eq!(avro.key("orders", b"o-1").unwrap().unwrap(), Bytes::from_static(b"\0\0\0\0\x0b\x06o-1"));
        assert_eq!(avro.key("ids", b"-2").unwrap().unwrap(), Bytes::from_static(b"\0\0\0\0\x0c\x03"), "a long key");
        let ContractError::Breach(b) = avro.key("ids", b"o-SECRET").unwrap_err() else { panic!() };
        assert_eq!(
            b.to_string(),
            "the key schema subject ids-key version 12 (id 12) refuses the record's key (the aggregate id): it is not a long: fix the producing service's aggregate id, or the key schema"
        );
        let ContractError::Breach(missing) = avro.key("nothing", b"k").unwrap_err() else { panic!() };
        assert!(matches!(missing.reason, BreachReason::NoSubject), "{missing:?}");
        let json = RegistryContracts::new(Arc::new(m.clone()), options(Some(Format::JsonSchema)));
        assert_eq!(json.key("typed", b"o-1").unwrap().unwrap(), Bytes::from_static(b"\0\0\0\0\x0d\"o-1\""));
        assert_eq!(json.key("numbers", b"42").unwrap().unwrap(), Bytes::from_static(b"\0\0\0\0\x0e42"));
        let ContractError::Breach(b) = json.key("typed", b"SECRET").unwrap_err() else { panic!() };
        assert_eq!(
            b.to_string(),
            "the key schema subject typed-key version 13 (id 13) refuses the record's key (the aggregate id): it fails \"pattern\" (schema path /pattern): fix the producing service's aggregate id, or the key schema"
        );
        let ContractError::Breach(kind) = json.key("orders", b"o-1").unwrap_err() else { panic!() };
        assert!(kind.to_string().contains("but contracts.key_format needs schemaType JSON"), "{kind}");
        assert!(avro.check(event("X", "orders"), br#""v""#).is_ok(), "values and keys are cached apart");
    }

    #[test]
    fn the_cache_keeps_at_most_max_subjects() {
        let m = Arc::new(Memory::default());
        for (i, s) in ["A", "B", "C"].into_iter().enumerate() {
            m.put(s, u32::try_from(i).unwrap() + 1, "JSON", "{}");
        }
        let hits = Arc::new(AtomicUsize::new(0));
        let seen = hits.clone();
        let c = contracts(&m, Format::JsonSchema, SubjectStrategy::RecordName, Duration::from_secs(60)).observed(
            move |l| {
                if l == Lookup::Hit {
                    seen.fetch_add(1, Ordering::SeqCst);
                }
            },
        );
        for s in ["A", "B", "C", "C", "A"] {
            c.check(event(s, "t"), b"{}").unwrap();
        }
        assert_eq!(c.cache.lock().unwrap().len(), 2);
        assert_eq!(hits.load(Ordering::SeqCst), 1, "C once; A had gone first");
        assert_eq!(m.fetches.load(Ordering::SeqCst), 4);
    }

    #[test]
    fn hostile_schemas_and_payloads_are_breaches_within_the_limits() {
        let m = Arc::new(Memory::default());
        let cyclic = r#"{"type":"record","name":"R","fields":[{"name":"f","type":["R",{"type":"map","values":"int"}],"default":{}}]}"#;
        m.put("cyclic-value", 1, "AVRO", cyclic);
        m.put(
            "any-value",
            2,
            "AVRO",
            r#"{"type": "map", "values": ["null", "int", {"type": "map", "values": "int"}]}"#,
        );
        let c = contracts(&m, Format::Avro, SubjectStrategy::TopicName, Duration::from_secs(60));
        let ContractError::Breach(b) = c.check(event("X", "cyclic"), b"{}").unwrap_err() else { panic!() };
        assert_eq!(b.reason, BreachReason::NotAvro { pointer: "/f".into(), reason: crate::avro::TOO_DEEP });
        let deep = format!("{}{{}}{}", r#"{"a":"#.repeat(32), "}".repeat(32));
        let ContractError::Breach(b) = c.check(event("X", "any"), deep.as_bytes()).unwrap_err() else { panic!() };
        assert_eq!(b.reason, BreachReason::TooDeep { limit: 32 });
        let json = Arc::new(Memory::default());
        json.put("T", 3, "JSON", crate::tests::TWO_KINDS);
        let c = contracts(&json, Format::JsonSchema, SubjectStrategy::RecordName, Duration::from_secs(60));
        let payload = crate::tests::nested_c(22);
        let ContractError::Breach(b) = c.check(event("T", "t"), payload.as_bytes()).unwrap_err() else { panic!() };
        assert_eq!(b.reason, BreachReason::TooCostly { steps: Limits::steps_for(payload.len()) });
    }
}
