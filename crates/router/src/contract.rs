//! Event contracts: a check every payload passes before it becomes a record.
//!
//! The router only asks; what a contract is (JSON Schema files, a schema registry) lives
//! in the `contracts` crate, which implements [`PayloadContract`]. The check runs on the
//! payload bytes the record would carry (before any envelope), for every way a row
//! reaches the router: streamed, snapshotted, replayed, or a table-less message. A
//! breach is a [`crate::RouteError::ContractBroken`], a permanent error of that event
//! under the pipeline's policy (halt, or dead letter), never a silent skip.
//!
//! Invariant: a [`Breach`] names the schema, the JSON pointer of the failing value and
//! the schema keyword that failed, never a value of the payload.

use std::fmt;
use std::sync::Arc;

/// Validates a payload against the contract of its event type, and may give the bytes
/// the record carries instead (a schema registry's wire format).
pub trait PayloadContract: Send + Sync {
    /// `event`: the row's event type and the topic its record goes to. `payload`: the
    /// bytes the record would carry (never a tombstone).
    fn check(&self, event: Event<'_>, payload: &[u8]) -> Result<Checked, ContractError>;

    /// What the contract is, for logs and `Debug` (a directory, a registry URL).
    fn describe(&self) -> String;

    /// The event types it holds a schema for: names the operator configured, so fit
    /// for metric labels (a row's event type is not).
    fn event_types(&self) -> Vec<String> {
        Vec::new()
    }

    /// Whether the event type of a payload it accepted is a name the operator
    /// configured (a registry subject named after the event type), so that it may
    /// become a metric label once seen. Beside [`PayloadContract::event_types`], for
    /// contracts that do not know their event types in advance.
    fn accepted_types_are_configured(&self) -> bool {
        false
    }

    /// The bytes the record's key carries instead of `key` (the aggregate id as the row
    /// gives it), when the contract writes keys too (a schema registry's `<topic>-key`
    /// subject); `None`: the key as it is. Asked for every record, tombstones included,
    /// so every record of a topic has a key of one form.
    fn key(&self, topic: &str, key: &[u8]) -> Result<Option<bytes::Bytes>, ContractError> {
        let _ = (topic, key);
        Ok(None)
    }
}

/// What a contract is asked about besides the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event<'a> {
    /// The row's event type (the `eventType` header's value), if it has one.
    pub event_type: Option<&'a [u8]>,
    /// The topic the record goes to (registry subjects may be named after it).
    pub topic: &'a str,
}

/// A payload the contract accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checked {
    /// The record carries the payload's bytes unchanged.
    Unchanged,
    /// The record carries these bytes instead (for example magic byte, schema id, Avro).
    Encoded(bytes::Bytes),
}

/// Why a contract did not accept a payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContractError {
    /// The payload breaks its contract: a permanent error of that event.
    Breach(Breach),
    /// The contract could not be read now (a schema registry that is down or slow): a
    /// transient error; the event is neither published nor refused, it is tried again.
    Unavailable(String),
}

impl From<Breach> for ContractError {
    fn from(b: Breach) -> Self {
        ContractError::Breach(b)
    }
}

/// A shared [`PayloadContract`] in a [`crate::RouterConfig`]. Two configurations are
/// equal when they share the same contract object.
#[derive(Clone)]
pub struct ContractRef(pub Arc<dyn PayloadContract>);

impl PartialEq for ContractRef {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for ContractRef {}

impl fmt::Debug for ContractRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ContractRef({})", self.0.describe())
    }
}

/// Why a payload does not meet its contract.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Breach {
    /// The schema the payload was checked against (a file name, a subject and version);
    /// `None` when there is none for its event type.
    pub schema: Option<Arc<str>>,
    pub reason: BreachReason,
}

/// What went wrong; no variant holds a payload value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BreachReason {
    /// The row has no event type, and events without a contract are refused.
    NoEventType,
    /// No schema for this event type, and events without a contract are refused.
    NoContract,
    /// The payload is not JSON: where the parser stopped.
    NotJson { line: usize, column: usize },
    /// A schema registry holds no schema under the subject (or not the pinned version).
    NoSubject,
    /// The subject's schema is of another kind than the configured format needs.
    WrongSchemaType {
        found: String,
        wanted: &'static str,
        /// The setting that asks for it: `contracts.value_format` or `contracts.key_format`.
        setting: &'static str,
    },
    /// The subject's schema cannot be used (it does not parse, it refers to others).
    Unusable { reason: String },
    /// The payload does not fit the subject's Avro schema: where, and why (never the
    /// value itself).
    NotAvro { pointer: String, reason: &'static str },
    /// The record's key does not fit the key schema (`contracts.key_format`): why, in
    /// the schema's terms (never the key itself).
    BadKey { reason: String },
    /// The payload nests deeper than `contracts.max_depth` levels (objects and arrays):
    /// it is refused before any schema walks it.
    TooDeep { limit: usize },
    /// Checking the payload took more than its step budget (a recursive schema whose
    /// unions branch at every level): refused rather than checked for minutes.
    TooCostly { steps: u64 },
    /// The payload is JSON the schema does not accept: the first violation.
    Invalid {
        /// JSON pointer of the failing value in the payload ("" is the whole payload).
        pointer: String,
        /// The schema keyword that failed (`type`, `required`, ...).
        keyword: String,
        /// JSON pointer of that keyword in the schema.
        schema_path: String,
    },
}

impl fmt::Display for Breach {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let schema = self.schema.as_deref().unwrap_or("(none)");
        match &self.reason {
            BreachReason::NoEventType => write!(
                f,
                "it has no event type, and contracts.unknown = refuse: give the row an event type, or set contracts.unknown = allow"
            ),
            BreachReason::NoContract => write!(
                f,
                "contracts.dir holds no schema for its event type, and contracts.unknown = refuse: add the schema, or set contracts.unknown = allow"
            ),
            BreachReason::NoSubject => write!(
                f,
                "the schema registry has no {schema}: register the schema (walpost contracts push), or fix the subject strategy"
            ),
            BreachReason::WrongSchemaType { found, wanted, setting } => write!(
                f,
                "{schema} holds a {found} schema, but {setting} needs schemaType {wanted}: register such a schema under it, or change the format"
            ),
            BreachReason::Unusable { reason } => write!(
                f,
                "{schema} cannot be used ({reason}): register a self-contained schema under it"
            ),
            BreachReason::NotAvro { pointer, reason } => {
                let at = if pointer.is_empty() { "the payload itself" } else { pointer.as_str() };
                write!(
                    f,
                    "the Avro schema of {schema} cannot hold it: the value at {at} {reason}: fix the producing service, or the schema if the event is right"
                )
            }
            BreachReason::BadKey { reason } => write!(
                f,
                "the key schema {schema} refuses the record's key (the aggregate id): {reason}: fix the producing service's aggregate id, or the key schema"
            ),
            BreachReason::NotJson { line, column } => write!(
                f,
                "its payload is not JSON (the parser stopped at line {line}, column {column}), so schema {schema} cannot accept it: fix the producing service"
            ),
            BreachReason::TooDeep { limit } => write!(
                f,
                "its payload nests deeper than {limit} levels, the limit of contract checks (contracts.max_depth), so schema {schema} cannot accept it: fix the producing service, or raise contracts.max_depth if such events are right"
            ),
            BreachReason::TooCostly { steps } => write!(
                f,
                "checking it against schema {schema} took more than {steps} steps, the budget of one contract check (a recursive anyOf, oneOf or union tried at every level of a deep payload): fix the producing service, or tell the schema's branches apart (a required field, a const) so that one fails at once"
            ),
            BreachReason::Invalid { pointer, keyword, schema_path } => {
                let at = if pointer.is_empty() { "the payload itself" } else { pointer.as_str() };
                write!(
                    f,
                    "schema {schema} refuses it: the value at {at} fails \"{keyword}\" (schema path {schema_path}): fix the producing service, or the schema if the event is right"
                )
            }
        }
    }
}
