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

use replication::sqlstate;

/// Whether retrying can help.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// Reconnect with backoff and resume from the confirmed position.
    Transient,
    /// Stop with the message; an operator must act.
    Definite,
}

/// What an error is about, for code that acts on it and for the operator (the halt's
/// log line and `walpost_halts_total{kind}`): the cause, not the module it came from.
/// The message stays the operator's text; the kind only sorts it.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// Settings, flags, the file, a filter or a replay range.
    Config,
    /// A role lacks rights walpost needs, or others hold rights they must not.
    Privilege,
    /// The PostgreSQL server: its setup, its errors, the connection to it.
    Postgres,
    /// The replication slot: missing, lost, of another kind, its lineage, held elsewhere.
    Slot,
    /// An outbox table or its publication: missing, changed, not streamable.
    Outbox,
    /// pgoutput bytes or messages walpost cannot decode or did not ask for.
    Protocol,
    /// A row that cannot become a record.
    Routing,
    /// Kafka: the producer, the brokers, a topic, a refused record.
    Kafka,
    /// Exactly-once progress records: unreadable, forged or from another cluster.
    Progress,
    /// Another instance took over (a fenced transactional producer).
    Fenced,
    /// The session must start again from the confirmed position (a freeze, the server
    /// ending the stream, a producer restart).
    Session,
    /// A retention pass.
    Retention,
    /// The schema registry: unreachable, refusing walpost, answering what it should not.
    Registry,
    /// The machine walpost runs on: a port, a signal handler, a thread, a file.
    Host,
    /// A broken invariant of walpost itself: a bug to report.
    Internal,
}

impl ErrorKind {
    /// The kind's name in logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Config => "config",
            ErrorKind::Privilege => "privilege",
            ErrorKind::Postgres => "postgres",
            ErrorKind::Slot => "slot",
            ErrorKind::Outbox => "outbox",
            ErrorKind::Protocol => "protocol",
            ErrorKind::Routing => "routing",
            ErrorKind::Kafka => "kafka",
            ErrorKind::Progress => "progress",
            ErrorKind::Fenced => "fenced",
            ErrorKind::Session => "session",
            ErrorKind::Retention => "retention",
            ErrorKind::Registry => "registry",
            ErrorKind::Host => "host",
            ErrorKind::Internal => "internal",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What ended a session or the whole stream.
#[derive(Debug)]
pub struct PipelineError {
    class: ErrorClass,
    kind: ErrorKind,
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
    fn new(class: ErrorClass, kind: ErrorKind, expected: bool, message: impl fmt::Display) -> Self {
        PipelineError { class, kind, expected, message: message.to_string(), source: None }
    }

    /// Retrying cannot help: walpost stops with `message`.
    pub fn definite(kind: ErrorKind, message: impl fmt::Display) -> Self {
        Self::new(ErrorClass::Definite, kind, false, message)
    }

    /// Retrying can help: the stream reconnects with backoff.
    pub fn transient(kind: ErrorKind, message: impl fmt::Display) -> Self {
        Self::new(ErrorClass::Transient, kind, false, message)
    }

    /// A transient state that is expected (a hot standby waiting for the slot).
    pub fn waiting(kind: ErrorKind, message: impl fmt::Display) -> Self {
        Self::new(ErrorClass::Transient, kind, true, message)
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    pub fn is_expected(&self) -> bool {
        self.expected
    }

    /// Puts `what` (what was being done) before the message; the class, kind and cause
    /// stay, so a deadlock while doing it is still retried and a refused privilege still
    /// stops.
    pub fn context(mut self, what: impl fmt::Display) -> Self {
        self.message = format!("{what}: {}", self.message);
        self
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
        let kind = match e.sqlstate() {
            Some(code) if code == sqlstate::INSUFFICIENT_PRIVILEGE => ErrorKind::Privilege,
            Some(code) if sqlstate::in_class(code, sqlstate::CLASS_INVALID_AUTHORIZATION) => ErrorKind::Privilege,
            Some(sqlstate::INVALID_CATALOG_NAME) => ErrorKind::Config,
            _ if matches!(e, replication::Error::Auth { .. } | replication::Error::AuthRefused { .. }) => {
                ErrorKind::Privilege
            }
            _ if matches!(e, replication::Error::Protocol(_) | replication::Error::MessageTooLarge(_)) => {
                ErrorKind::Protocol
            }
            _ => ErrorKind::Postgres,
        };
        PipelineError { class, kind, expected: false, message, source: Some(Box::new(e)) }
    }
}

/// Adds the fix to server errors whose cause is a known misconfiguration.
fn explain_server_error(e: &replication::Error) -> String {
    let hint = match e.sqlstate() {
        Some(sqlstate::INVALID_PASSWORD | sqlstate::INVALID_AUTHORIZATION_SPECIFICATION) => {
            " (check the user and password in --postgres, and that pg_hba.conf has a line for this database, role and address; see docs/least-privilege.md)"
        }
        Some(sqlstate::INSUFFICIENT_PRIVILEGE) => " (the role needs the REPLICATION attribute: ALTER ROLE <role> WITH REPLICATION)",
        Some(sqlstate::INVALID_CATALOG_NAME) => " (the database in --postgres does not exist)",
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
        assert_eq!(e.kind(), ErrorKind::Postgres);
        let e = PipelineError::definite(ErrorKind::Internal, "stop").caused_by(fmt::Error);
        assert_eq!((e.class(), e.kind()), (ErrorClass::Definite, ErrorKind::Internal));
        assert_eq!(e.to_string(), "stop");
        assert!(e.source().is_some());
    }

    #[test]
    fn server_errors_are_sorted_by_their_sqlstate() {
        let server = |code: &str| {
            replication::Error::Server(replication::ServerMessage {
                severity: "FATAL".into(),
                code: code.into(),
                message: "m".into(),
                detail: None,
                hint: None,
            })
        };
        for (code, kind) in [
            (sqlstate::INVALID_PASSWORD, ErrorKind::Privilege),
            (sqlstate::INVALID_AUTHORIZATION_SPECIFICATION, ErrorKind::Privilege),
            (sqlstate::INSUFFICIENT_PRIVILEGE, ErrorKind::Privilege),
            (sqlstate::INVALID_CATALOG_NAME, ErrorKind::Config),
            (sqlstate::OBJECT_IN_USE, ErrorKind::Postgres),
        ] {
            assert_eq!(PipelineError::from(server(code)).kind(), kind, "{code}");
        }
        let e = PipelineError::from(replication::Error::Protocol("bad".into()));
        assert_eq!((e.kind(), e.kind().as_str()), (ErrorKind::Protocol, "protocol"));
    }
}
