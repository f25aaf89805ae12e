use crate::frame::{FrameError, ServerMessage};
use crate::sqlstate::{self, in_class};

/// Everything that can go wrong on a replication connection.
///
/// [`Error::is_transient`] splits them in two: transient errors (the network, a
/// server restarting, a slot held by another process, a standby where a primary is
/// wanted) are worth a reconnect with backoff; the rest (bad password, a refusal to
/// send a password, missing privilege, malformed bytes) will fail the same way again
/// and need an operator.
///
/// Texts name hosts as `host:port` or by redacted URL (see `Config::redacted`), never
/// the password. Underlying errors stay reachable through `source()`; their text is
/// also part of this error's own text, because callers log `Display` alone.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot connect to PostgreSQL at {target}: {source}")]
    Connect { target: String, source: std::io::Error },
    #[error("timed out after {secs} s connecting to PostgreSQL at {target}")]
    ConnectTimeout { target: String, secs: u64 },
    #[error("connection to PostgreSQL lost: {0}")]
    Io(#[from] std::io::Error),
    #[error(
        "PostgreSQL refused TLS but sslmode={0} requires it: enable ssl on the server or use sslmode=prefer/disable"
    )]
    TlsRefused(&'static str),
    #[error("TLS to PostgreSQL failed: {message}")]
    Tls {
        message: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    #[error("PostgreSQL authentication failed: {message}")]
    Auth {
        message: String,
        #[source]
        source: Option<std::io::Error>,
    },
    /// walpost would not authenticate the way the server asked: a password to a server
    /// whose identity is not verified, a method `require_auth` excludes, or no channel
    /// binding under `channel_binding=require`. Nothing secret was sent.
    #[error("walpost did not authenticate to PostgreSQL at {host}: {reason}")]
    AuthRefused { host: String, reason: String },
    /// The server does not satisfy `target_session_attrs` (a standby where a primary is
    /// wanted, ...). Transient: a failover may change it.
    #[error("PostgreSQL at {host} is {found}, and target_session_attrs={wanted} needs {needs}")]
    SessionAttrs { host: String, wanted: &'static str, found: &'static str, needs: &'static str },
    /// No host of a multi-host connection string could be used; one entry per host tried.
    #[error("{}", describe_hosts(failures, not_tried))]
    NoUsableHost { failures: Vec<HostFailure>, not_tried: Vec<String> },
    /// A name walpost was asked to put in a command is not a usable identifier.
    #[error("{0}")]
    Name(#[from] crate::sql::InvalidName),
    #[error("PostgreSQL: {0}")]
    Server(ServerMessage),
    #[error("PostgreSQL protocol violation: {0}")]
    Protocol(String),
    /// A statement walpost will not send as asked (a NUL byte in its text, more
    /// parameters or bytes than a statement takes): nothing was sent, the connection is
    /// as it was.
    #[error("cannot send the statement to PostgreSQL: {0}")]
    Unsendable(String),
    /// A replication message larger than the stream's limit (see
    /// [`ReplicationStream::set_max_message_len`](crate::ReplicationStream::set_max_message_len)):
    /// read and dropped without being buffered whole. The stream goes on after it.
    #[error("a replication message of {} bytes is over the limit of {} bytes", .0.len, .0.limit)]
    MessageTooLarge(Box<Oversized>),
}

/// What is known of a message dropped for its size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Oversized {
    /// The CopyData body's length.
    pub len: usize,
    pub limit: usize,
    /// Its first bytes (at most 64 KiB): the XLogData header and
    /// the start of the pgoutput message.
    pub prefix: bytes::Bytes,
}

/// Why one host of a multi-host connection string was not used.
#[derive(Debug)]
pub struct HostFailure {
    /// `host:port` (see `HostSpec::label`).
    pub host: String,
    pub error: Error,
}

fn describe_hosts(failures: &[HostFailure], not_tried: &[String]) -> String {
    let mut text = format!("no usable PostgreSQL host among the {} given:", failures.len() + not_tried.len());
    for f in failures {
        text.push_str(&format!(" [{}] {};", f.host, f.error));
    }
    if !not_tried.is_empty() {
        text.push_str(&format!(" not tried after that authentication failure (as libpq): {};", not_tried.join(", ")));
    }
    text.pop();
    text
}

impl From<FrameError> for Error {
    fn from(e: FrameError) -> Self {
        Error::Protocol(e.to_string())
    }
}

impl From<pgoutput::DecodeError> for Error {
    fn from(e: pgoutput::DecodeError) -> Self {
        Error::Protocol(e.to_string())
    }
}

impl Error {
    pub(crate) fn auth(message: impl Into<String>) -> Self {
        Error::Auth { message: message.into(), source: None }
    }

    pub(crate) fn tls(message: impl Into<String>) -> Self {
        Error::Tls { message: message.into(), source: None }
    }

    /// The SQLSTATE the server sent, if this is a server error (for several hosts: the
    /// code every host answered, if they all answered the same).
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            Error::Server(m) => Some(m.code.as_str()),
            Error::NoUsableHost { failures, .. } => {
                let first = failures.first()?.error.sqlstate()?;
                failures.iter().all(|f| f.error.sqlstate() == Some(first)).then_some(first)
            }
            _ => None,
        }
    }

    /// Whether retrying the same thing later can succeed without an operator.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Connect { .. } | Error::ConnectTimeout { .. } | Error::Io(_) | Error::SessionAttrs { .. } => true,
            Error::Server(m) => {
                let code = m.code.as_str();
                in_class(code, sqlstate::CLASS_CONNECTION_EXCEPTION)
                    || in_class(code, sqlstate::CLASS_INSUFFICIENT_RESOURCES)
                    || in_class(code, sqlstate::CLASS_OPERATOR_INTERVENTION)
                    // The slot is held by another process.
                    || code == sqlstate::OBJECT_IN_USE
                    || code == sqlstate::SERIALIZATION_FAILURE
                    || code == sqlstate::DEADLOCK_DETECTED
            }
            // Transient when some host may come back (down, starting, a standby for now)
            // and no host ended the search with an authentication failure.
            Error::NoUsableHost { failures, not_tried } => {
                not_tried.is_empty()
                    && failures.iter().all(|f| !f.error.ends_host_search())
                    && failures.iter().any(|f| f.error.is_transient())
            }
            Error::TlsRefused(_)
            | Error::Tls { .. }
            | Error::Auth { .. }
            | Error::AuthRefused { .. }
            | Error::Name(_)
            | Error::Protocol(_)
            | Error::Unsendable(_)
            | Error::MessageTooLarge(_) => false,
        }
    }

    /// Whether a multi-host connection attempt stops at this error instead of trying
    /// the next host. As in libpq: once a server has been reached and authentication
    /// failed (server SQLSTATE class 28, or walpost refused to authenticate), the
    /// remaining hosts are not tried.
    pub fn ends_host_search(&self) -> bool {
        match self {
            Error::Auth { .. } | Error::AuthRefused { .. } => true,
            Error::Server(m) => in_class(&m.code, sqlstate::CLASS_INVALID_AUTHORIZATION),
            _ => false,
        }
    }
}
