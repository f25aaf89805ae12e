//! The two error classes at the pipeline boundary.
//!
//! - [`ErrorClass::Transient`]: the network, a restarting server, a slot held by
//!   another instance, a Kafka outage. The stream reconnects with capped exponential
//!   backoff and resumes from the slot's confirmed position.
//! - [`ErrorClass::Definite`]: retrying cannot help (configuration, privileges, a
//!   lost slot, a record Kafka will never take, malformed protocol bytes). walpost
//!   stops (exit 1) with the message, which says what is wrong and what to do; the
//!   runbooks quote these messages verbatim (checked by `tests/runbooks.rs`).
//!
//! A [`PipelineError`] keeps the error that caused it as its `source()`, so callers
//! can still ask a PostgreSQL error for its SQLSTATE. Its `Display` is the operator's
//! message alone: where the cause matters to the operator the message already says it.
//!
//! Neither class ever confirms an LSN past an unacknowledged record.

use std::error::Error as StdError;
use std::fmt;

/// Whether retrying can help.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// Reconnect with backoff and resume from the confirmed position.
    Transient,
    /// Stop with the message; an operator must act.
    Definite,
}

/// What ended a session or the whole stream.
#[derive(Debug)]
pub struct PipelineError {
    class: ErrorClass,
    /// A transient state that is expected and needs no one (a hot standby waiting for
    /// the slot): logged at INFO, not WARN.
    expected: bool,
    message: String,
    source: Option<Box<dyn StdError + Send + Sync + 'static>>,
}

impl fmt::Display for PipelineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl StdError for PipelineError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn StdError + 'static))
    }
}

impl PipelineError {
    pub fn definite(message: impl fmt::Display) -> Self {
        PipelineError { class: ErrorClass::Definite, expected: false, message: message.to_string(), source: None }
    }

    pub fn transient(message: impl fmt::Display) -> Self {
        PipelineError { class: ErrorClass::Transient, expected: false, message: message.to_string(), source: None }
    }

    /// A transient state that is expected (a hot standby waiting for the slot).
    pub fn waiting(message: impl fmt::Display) -> Self {
        PipelineError { class: ErrorClass::Transient, expected: true, message: message.to_string(), source: None }
    }

    pub fn is_expected(&self) -> bool {
        self.expected
    }

    /// Keeps `source` as the cause (its text is not added to the message).
    pub fn caused_by(mut self, source: impl StdError + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    pub fn class(&self) -> ErrorClass {
        self.class
    }

    pub fn is_transient(&self) -> bool {
        self.class == ErrorClass::Transient
    }

    /// The operator's message (the `Display` text).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The PostgreSQL SQLSTATE of the cause, when the cause is a server error.
    pub fn sqlstate(&self) -> Option<&str> {
        self.source.as_deref()?.downcast_ref::<replication::Error>()?.sqlstate()
    }
}

impl From<replication::Error> for PipelineError {
    fn from(e: replication::Error) -> Self {
        let class = if e.is_transient() { ErrorClass::Transient } else { ErrorClass::Definite };
        let message = match class {
            ErrorClass::Transient => e.to_string(),
            ErrorClass::Definite => explain_server_error(&e),
        };
        PipelineError { class, expected: false, message, source: Some(Box::new(e)) }
    }
}

/// Adds the fix to server errors whose cause is a known misconfiguration.
fn explain_server_error(e: &replication::Error) -> String {
    let hint = match e.sqlstate() {
        Some("28P01") | Some("28000") => {
            " (check the user and password in --postgres, and that pg_hba.conf has a line for this database, role and address; see docs/least-privilege.md)"
        }
        Some("42501") => " (the role needs the REPLICATION attribute: ALTER ROLE <role> WITH REPLICATION)",
        Some("3D000") => " (the database in --postgres does not exist)",
        _ => "",
    };
    format!("{e}{hint}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cause_is_kept_and_the_class_follows_it() {
        let io = replication::Error::Io(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset"));
        let e = PipelineError::from(io);
        assert!(e.is_transient());
        assert!(e.source().is_some_and(|s| s.to_string().contains("reset")));
        let e = PipelineError::definite("stop").caused_by(fmt::Error);
        assert_eq!(e.class(), ErrorClass::Definite);
        assert_eq!(e.to_string(), "stop");
        assert!(e.source().is_some());
    }
}
