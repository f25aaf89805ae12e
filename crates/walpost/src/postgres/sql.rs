//! The SQL-text helpers both halves use live in the `service` crate; this keeps the
//! relay's `crate::postgres::sql::...` paths.

pub(crate) use service::sql::{ident, query, run_formatted, setting};
