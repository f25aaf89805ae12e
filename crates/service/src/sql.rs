//! SQL text for the simple query protocol.
//!
//! Literals and identifiers are quoted by the one helper of the workspace,
//! `replication::{quote_literal, quote_ident}` (`postgres_protocol::escape`): a literal
//! with a backslash becomes an `E''` string, which means the same whatever
//! `standard_conforming_strings` says.

use replication::{QueryResult, ReplicationClient};

use crate::error::PipelineError;

/// A string literal.
pub fn literal(text: &str) -> String {
    replication::quote_literal(text)
}

/// A quoted identifier.
pub fn ident(name: &str) -> String {
    replication::quote_ident(name)
}

/// Runs one statement; a server error becomes a [`PipelineError`] with its class.
pub async fn query(sql: &mut ReplicationClient, text: &str) -> Result<QueryResult, PipelineError> {
    Ok(sql.simple_query(text).await?)
}

/// `current_setting(name)`, or `None` when it cannot be read.
pub async fn setting(sql: &mut ReplicationClient, name: &str) -> Option<String> {
    sql.simple_query(&format!("SELECT pg_catalog.current_setting({}) AS v", literal(name)))
        .await
        .ok()
        .and_then(|r| r.first("v").map(str::to_owned))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: quote-doubling alone is not safe with standard_conforming_strings off.
    #[test]
    fn regression_backslashes_are_escaped_in_literals() {
        assert_eq!(literal("plain"), "'plain'");
        assert_eq!(literal("o'brien"), "'o''brien'");
        assert_eq!(literal(r"a\'b"), r" E'a\\''b'");
        assert_eq!(ident("we\"ird"), "\"we\"\"ird\"");
    }
}
