//! Event contracts: one schema per event type, checked on every outbox payload before
//! walpost hands it to Kafka. Two kinds implement the router's
//! [`PayloadContract`]: [`Contracts`] (JSON Schema files) and
//! [`registry::RegistryContracts`] (a schema registry's subjects, with the Confluent wire
//! format; its I/O is the caller's [`registry::SchemaSource`]).
//!
//! The router asks a contract about every payload of every path (stream, snapshot,
//! replay, table-less messages), so a payload that breaks its contract becomes a
//! permanent error of that event (halt or dead letter), never a record.
//!
//! Invariants:
//! - File contracts only read the payload bytes: the record carries them unchanged.
//! - A [`Breach`] names the schema, the JSON pointer of the first failing value and the
//!   keyword that failed; never a value of the payload (an `additionalProperties`
//!   breach does not list the extra names either).
//! - No I/O: the caller reads the files and hands over their text, and nothing is
//!   fetched while validating (a `$ref` to another document is refused when the schema
//!   is built, since no retriever is compiled in).
//! - Formats (`"format": "date-time"`, `email`, `uuid`...) are asserted on every draft,
//!   as registries' JSON Schema serializers do, not only annotated.
//! - Hostile payloads: serde_json stops at 128 levels of nesting (then the payload is
//!   "not JSON"), and a payload nesting deeper than [`Limits::max_depth`] (32 by
//!   default) is a breach before any schema walks it.
//! - Recursive schemas: a check takes at most [`Limits::steps_for`] steps (a JSON
//!   Schema's subschemas applied, an Avro writer's types entered), so a union of
//!   recursive branches whose errors double at every level is a breach in a bounded
//!   time and memory, never minutes and gigabytes (see `budget`).

use std::collections::HashMap;
use std::sync::Arc;

use router::{Breach, BreachReason, Checked, ContractError, Event, PayloadContract};

mod avro;
mod budget;
pub mod registry;

/// `contracts.max_depth`'s default: levels of objects and arrays a payload may nest.
pub const DEFAULT_MAX_DEPTH: usize = 32;
/// Steps every check may take, whatever its payload's size.
pub const STEPS_PER_CHECK: u64 = 100_000;
/// Steps a check may take beside those, per byte of its payload.
pub const STEPS_PER_BYTE: u64 = 16;

/// What bounds one contract check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Levels of objects and arrays a payload may nest (`contracts.max_depth`); an Avro
    /// value's fields' defaults count too.
    pub max_depth: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { max_depth: DEFAULT_MAX_DEPTH }
    }
}

impl Limits {
    /// The step budget of a check of a `len`-byte payload: [`STEPS_PER_CHECK`] plus
    /// [`STEPS_PER_BYTE`] per byte (a check that is linear in its payload stays far
    /// below it; one that doubles at every level reaches it).
    pub fn steps_for(len: usize) -> u64 {
        STEPS_PER_CHECK.saturating_add(STEPS_PER_BYTE.saturating_mul(u64::try_from(len).unwrap_or(u64::MAX)))
    }

    /// The payload as JSON, refused when it nests deeper than `max_depth`.
    fn parse(&self, schema: &Arc<str>, payload: &[u8]) -> Result<serde_json::Value, Breach> {
        let value = parse(schema, payload)?;
        if too_deep(&value, self.max_depth) {
            return Err(Breach {
                schema: Some(schema.clone()),
                reason: BreachReason::TooDeep { limit: self.max_depth },
            });
        }
        Ok(value)
    }
}

/// Whether `value` nests more than `limit` levels of objects and arrays (`{}` is one).
fn too_deep(value: &serde_json::Value, limit: usize) -> bool {
    use serde_json::Value;
    let mut containers: Vec<(&Value, usize)> = vec![(value, 1)];
    while let Some((v, level)) = containers.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match v {
            Value::Array(items) => Box::new(items.iter()),
            Value::Object(fields) => Box::new(fields.values()),
            _ => continue,
        };
        if level > limit {
            return true;
        }
        containers.extend(children.filter(|c| c.is_array() || c.is_object()).map(|c| (c, level + 1)));
    }
    false
}

/// A schema as the caller read it.
#[derive(Debug, Clone)]
pub struct SchemaText {
    /// The event type it is the contract of (the `eventType` header's value).
    pub event_type: String,
    /// Where it came from, as errors and breaches show it (a path, a file name).
    pub name: String,
    pub text: Vec<u8>,
}

/// What to do with an event whose type has no schema (or that has no type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unknown {
    /// Published unchecked.
    Allow,
    /// A breach: the event halts walpost or is dead-lettered.
    Refuse,
}

/// A schema that cannot be a contract.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LoadError {
    #[error("contract {name}: not JSON (line {line}, column {column}: {reason}): fix the file")]
    NotJson { name: String, line: usize, column: usize, reason: String },
    #[error("contract {name}: not a valid JSON Schema ({reason}): fix the file; a $ref to another document is not fetched, so inline what it refers to under $defs")]
    NotASchema { name: String, reason: String },
    #[error("contract {name} and contract {other} are both for event type {event_type}: keep one")]
    Duplicate { event_type: String, name: String, other: String },
}

struct Contract {
    name: Arc<str>,
    validator: jsonschema::Validator,
}

/// The contracts of every event type. See the crate docs.
pub struct Contracts {
    by_type: HashMap<Box<[u8]>, Contract>,
    unknown: Unknown,
    origin: String,
    limits: Limits,
}

impl std::fmt::Debug for Contracts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Contracts")
            .field("origin", &self.origin)
            .field("event_types", &self.event_types())
            .field("unknown", &self.unknown)
            .field("limits", &self.limits)
            .finish()
    }
}

impl Contracts {
    /// Builds a validator per schema. `origin` says where they came from (a directory),
    /// for logs.
    pub fn new(schemas: Vec<SchemaText>, unknown: Unknown, origin: impl Into<String>) -> Result<Contracts, LoadError> {
        let mut by_type: HashMap<Box<[u8]>, Contract> = HashMap::with_capacity(schemas.len());
        for s in schemas {
            let schema: serde_json::Value = serde_json::from_slice(&s.text).map_err(|e| LoadError::NotJson {
                name: s.name.clone(),
                line: e.line(),
                column: e.column(),
                reason: e.to_string(),
            })?;
            let validator =
                build_json_schema(&schema).map_err(|reason| LoadError::NotASchema { name: s.name.clone(), reason })?;
            let key: Box<[u8]> = s.event_type.as_bytes().into();
            if let Some(other) = by_type.get(&key) {
                return Err(LoadError::Duplicate {
                    event_type: s.event_type,
                    name: s.name,
                    other: other.name.to_string(),
                });
            }
            by_type.insert(key, Contract { name: Arc::from(s.name.as_str()), validator });
        }
        Ok(Contracts { by_type, unknown, origin: origin.into(), limits: Limits::default() })
    }

    /// The same contracts, bounded by `limits` instead of the defaults.
    pub fn with_limits(mut self, limits: Limits) -> Contracts {
        self.limits = limits;
        self
    }

    /// The event types with a schema, sorted.
    pub fn event_types(&self) -> Vec<String> {
        let mut types: Vec<String> = self.by_type.keys().map(|k| String::from_utf8_lossy(k).into_owned()).collect();
        types.sort();
        types
    }

    pub fn unknown(&self) -> Unknown {
        self.unknown
    }

    fn unknown_event(&self, reason: BreachReason) -> Result<(), Breach> {
        match self.unknown {
            Unknown::Allow => Ok(()),
            Unknown::Refuse => Err(Breach { schema: None, reason }),
        }
    }

    /// Checks `payload` against the schema of `event_type`.
    pub fn validate(&self, event_type: Option<&[u8]>, payload: &[u8]) -> Result<(), Breach> {
        let Some(event_type) = event_type else {
            return self.unknown_event(BreachReason::NoEventType);
        };
        let Some(contract) = self.by_type.get(event_type) else {
            return self.unknown_event(BreachReason::NoContract);
        };
        let value = self.limits.parse(&contract.name, payload)?;
        validate_json(&contract.name, &contract.validator, &value, Limits::steps_for(payload.len()))
    }
}

/// The payload as JSON, or the breach saying where it stopped being JSON.
fn parse(schema: &Arc<str>, payload: &[u8]) -> Result<serde_json::Value, Breach> {
    serde_json::from_slice(payload).map_err(|e| Breach {
        schema: Some(schema.clone()),
        reason: BreachReason::NotJson { line: e.line(), column: e.column() },
    })
}

/// The first violation of `validator` as a breach of `schema`, found in at most `budget`
/// steps: first whether there is one (jsonschema remembers recursive answers, so this is
/// cheap), then, only for an invalid payload, where it is (another `budget`).
fn validate_json(
    schema: &Arc<str>,
    validator: &jsonschema::Validator,
    value: &serde_json::Value,
    budget: u64,
) -> Result<(), Breach> {
    let costly = || Breach { schema: Some(schema.clone()), reason: BreachReason::TooCostly { steps: budget } };
    match budget::run(budget, || validator.is_valid(value)) {
        Some(true) => return Ok(()),
        Some(false) => {}
        None => return Err(costly()),
    }
    let first = budget::run(budget, || {
        validator.validate(value).err().map(|e| BreachReason::Invalid {
            pointer: e.instance_path().as_str().to_owned(),
            keyword: e.kind().keyword().to_owned(),
            schema_path: e.schema_path().as_str().to_owned(),
        })
    });
    match first {
        Some(Some(reason)) => Err(Breach { schema: Some(schema.clone()), reason }),
        // Invalid, though validate found nothing: jsonschema's two answers disagree.
        Some(None) => Err(Breach {
            schema: Some(schema.clone()),
            reason: BreachReason::Invalid {
                pointer: String::new(),
                keyword: "(unknown)".into(),
                schema_path: String::new(),
            },
        }),
        None => Err(costly()),
    }
}

/// Whether `value` passes `validator`, in at most `budget` steps (`None`: past it).
fn is_valid_within(validator: &jsonschema::Validator, value: &serde_json::Value, budget: u64) -> Option<bool> {
    budget::run(budget, || validator.is_valid(value))
}

/// A JSON Schema built as every contract builds it: formats asserted, no retriever,
/// every subschema's steps counted.
fn build_json_schema(schema: &serde_json::Value) -> Result<jsonschema::Validator, String> {
    budget::with_steps(jsonschema::options().should_validate_formats(true))
        .build(&budget::counted(schema))
        .map_err(|e| e.to_string())
}

impl PayloadContract for Contracts {
    fn check(&self, event: Event<'_>, payload: &[u8]) -> Result<Checked, ContractError> {
        self.validate(event.event_type, payload).map(|()| Checked::Unchanged).map_err(ContractError::Breach)
    }

    fn describe(&self) -> String {
        format!("{} event types from {}", self.by_type.len(), self.origin)
    }

    fn event_types(&self) -> Vec<String> {
        Contracts::event_types(self)
    }
}

#[cfg(test)]
mod tests;
