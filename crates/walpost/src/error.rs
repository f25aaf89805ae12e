//! The two error classes at the pipeline boundary.
//!
//! - [`PipelineError::Transient`]: the network, a restarting server, a slot held by
//!   another instance, a Kafka outage. The pipeline reconnects with capped exponential
//!   backoff and resumes from the slot's confirmed position.
//! - [`PipelineError::Definite`]: retrying cannot help (configuration, privileges, a
//!   lost slot, a record Kafka will never take, malformed protocol bytes). walpost
//!   stops with the message, which says what is wrong and what to do; the runbooks
//!   quote these messages verbatim.
//!
//! Neither class ever confirms an LSN past an unacknowledged record.

use std::fmt;

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error("{0}")]
    Transient(String),
    #[error("{0}")]
    Definite(String),
}

impl PipelineError {
    pub fn definite(message: impl fmt::Display) -> Self {
        PipelineError::Definite(message.to_string())
    }

    pub fn transient(message: impl fmt::Display) -> Self {
        PipelineError::Transient(message.to_string())
    }

    pub fn is_transient(&self) -> bool {
        matches!(self, PipelineError::Transient(_))
    }
}

impl From<replication::Error> for PipelineError {
    fn from(e: replication::Error) -> Self {
        if e.is_transient() {
            PipelineError::Transient(e.to_string())
        } else {
            PipelineError::Definite(explain_server_error(&e))
        }
    }
}

/// Adds the fix to server errors whose cause is a known misconfiguration.
fn explain_server_error(e: &replication::Error) -> String {
    let hint = match e.sqlstate() {
        Some("28P01") | Some("28000") => {
            " (check the user and password in --postgres, and pg_hba.conf allows this host for both the database and 'replication')"
        }
        Some("42501") => " (the role needs the REPLICATION attribute: ALTER ROLE <role> WITH REPLICATION)",
        Some("3D000") => " (the database in --postgres does not exist)",
        _ => "",
    };
    format!("{e}{hint}")
}
