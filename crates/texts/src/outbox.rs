//! The outbox table and its publication.

use std::fmt::Display;

use crate::runbook::OUTBOX_CHANGED;

/// The fatal error for an outbox table that stopped being streamed while walpost ran;
/// `why` is what the check found ([`dropped`], [`publication_lacks_table`], or the
/// publication check's own error). Quoted in runbooks/outbox-recreated.md.
pub fn changed(why: &str) -> String {
    format!(
        "{why}; this changed while walpost was streaming, and rows written since then are not in the replication stream (the slot may be confirmed past them), so walpost stopped: put the table back in the publication, backfill its rows with `walpost run --snapshot initial_only`, then restart walpost; follow {OUTBOX_CHANGED}"
    )
}

/// The `why` of [`changed`] for a dropped table (`schema.name`).
pub fn dropped(table: &impl Display) -> String {
    format!("outbox table {table} no longer exists")
}

/// The error for a publication that exists without the outbox table in it: `table` as
/// `schema.name`, and the statement's identifiers quoted (`publication_ident`,
/// `table_quoted`).
pub fn publication_lacks_table(
    publication: &str,
    table: &impl Display,
    publication_ident: &str,
    table_quoted: &str,
) -> String {
    format!(
        "publication \"{publication}\" exists but does not include {table}: run ALTER PUBLICATION {publication_ident} ADD TABLE {table_quoted}, or choose another --publication"
    )
}

/// A warning: an outbox table was replaced and published again while walpost streamed.
pub const RECREATED: &str = "an outbox table was re-created while walpost was streaming and is in the publication again; rows written to it before it joined the publication were not streamed (see runbooks/outbox-recreated.md)";
