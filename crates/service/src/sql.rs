//! SQL on ordinary connections: values travel as bind parameters
//! (`ReplicationClient::query`, the extended query protocol), never in the text;
//! identifiers are quoted by the one helper of the workspace, `replication::quote_ident`
//! (`postgres_protocol::escape`).

use replication::{QueryResult, ReplicationClient};

use crate::error::PipelineError;

/// A string literal: going away. The inbox's, the day partitions' and the outbox
/// retention's SQL still quote values with it until they bind them as parameters, as
/// the rest does (`crates/walpost/tests/sql_values.rs` lists who may call it).
pub fn literal(text: &str) -> String {
    replication::quote_literal(text)
}

/// A quoted identifier.
pub fn ident(name: &str) -> String {
    replication::quote_ident(name)
}

/// Runs one statement without values (simple query protocol: several statements may
/// share the text); a server error becomes a [`PipelineError`] with its class.
pub async fn query(sql: &mut ReplicationClient, text: &str) -> Result<QueryResult, PipelineError> {
    Ok(sql.simple_query(text).await?)
}

/// `current_setting(name)`, or `None` when it cannot be read.
pub async fn setting(sql: &mut ReplicationClient, name: &str) -> Option<String> {
    sql.query("SELECT pg_catalog.current_setting($1) AS v", &[Some(name)])
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
