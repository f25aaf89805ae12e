use crate::frame::{FrameError, ServerMessage};

/// Everything that can go wrong on a replication connection.
///
/// [`Error::is_transient`] splits them in two: transient errors (the network, a
/// server restarting, a slot held by another process) are worth a reconnect with
/// backoff; the rest (bad password, missing privilege, malformed bytes) will fail the
/// same way again and need an operator.
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
    #[error("TLS to PostgreSQL failed: {0}")]
    Tls(String),
    #[error("PostgreSQL authentication failed: {0}")]
    Auth(String),
    /// A name walpost was asked to put in a command is not a usable identifier.
    #[error("{0}")]
    Name(#[from] crate::sql::InvalidName),
    #[error("PostgreSQL: {0}")]
    Server(ServerMessage),
    #[error("PostgreSQL protocol violation: {0}")]
    Protocol(String),
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
    /// The SQLSTATE the server sent, if this is a server error.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            Error::Server(m) => Some(m.code.as_str()),
            _ => None,
        }
    }

    /// Whether retrying the same thing later can succeed without an operator.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Connect { .. } | Error::ConnectTimeout { .. } | Error::Io(_) => true,
            Error::Server(m) => {
                let code = m.code.as_str();
                code.starts_with("08") // connection exception
                    || code.starts_with("53") // insufficient resources (too many connections)
                    || code.starts_with("57P") // admin/crash shutdown, cannot connect now
                    || code == "55006" // object in use: the slot is held by another process
                    || code == "40001"
                    || code == "40P01"
            }
            Error::TlsRefused(_) | Error::Tls(_) | Error::Auth(_) | Error::Name(_) | Error::Protocol(_) => false,
        }
    }
}
