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

/// Validates a payload against the contract of its event type.
pub trait PayloadContract: Send + Sync {
    /// `event_type`: the row's event type (the `eventType` header's value), if it has
    /// one. `payload`: the bytes the record carries (never a tombstone).
    fn check(&self, event_type: Option<&[u8]>, payload: &[u8]) -> Result<(), Breach>;

    /// What the contract is, for logs and `Debug` (a directory, a registry URL).
    fn describe(&self) -> String;

    /// The event types it holds a schema for: names the operator configured, so fit
    /// for metric labels (a row's event type is not).
    fn event_types(&self) -> Vec<String> {
        Vec::new()
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
            BreachReason::NotJson { line, column } => write!(
                f,
                "its payload is not JSON (the parser stopped at line {line}, column {column}), so schema {schema} cannot accept it: fix the producing service"
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
