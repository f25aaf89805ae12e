//! Every action leaves a trace: one log line here, and through a mode's [`Audit`] a row
//! in the audit table of the database it acted on (`events.walpost_admin_audit` for
//! `walpost run`, migrations/outbox/0004_admin_audit.sql).
//!
//! A record holds the token's name and role, the action, its target and the result;
//! never a token, a hash or a request body (a body may carry a payload).

use std::future::Future;

use crate::Role;

/// The log target of audit lines, so a log pipeline can route them apart.
pub const LOG_TARGET: &str = "walpost::admin::audit";

/// One action, as audited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRecord {
    pub token_name: String,
    pub role: Role,
    /// `METHOD /pattern` of the route.
    pub action: String,
    /// What it acted on (a route's parameters or the handler's own word); may be empty.
    pub target: String,
    /// `ok`, `forbidden`, `refused (4xx)` or `failed (5xx)`.
    pub result: String,
}

/// Where a mode keeps its audit rows. Called once per action, after it was answered
/// (or refused); an error is logged, the answer stands.
pub trait Audit: Send + Sync + 'static {
    fn record(&self, record: &AuditRecord) -> impl Future<Output = Result<(), String>> + Send;
}

/// Log lines only: a mode with no action routes yet, and tests.
#[derive(Debug, Clone, Copy, Default)]
pub struct LogOnly;

impl Audit for LogOnly {
    async fn record(&self, _record: &AuditRecord) -> Result<(), String> {
        Ok(())
    }
}

/// The audit log line of `record`.
pub fn log(record: &AuditRecord) {
    tracing::info!(
        target: LOG_TARGET,
        token_name = %record.token_name,
        role = record.role.as_str(),
        action = %record.action,
        target = %record.target,
        result = %record.result,
        "admin action"
    );
}

/// The result word of an answer's status.
pub fn result_of(status: hyper::StatusCode) -> String {
    if status.is_success() {
        "ok".to_owned()
    } else if status == hyper::StatusCode::FORBIDDEN {
        "forbidden".to_owned()
    } else if status.is_client_error() {
        format!("refused ({})", status.as_u16())
    } else {
        format!("failed ({})", status.as_u16())
    }
}
