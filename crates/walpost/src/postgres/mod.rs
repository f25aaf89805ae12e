//! What walpost asks PostgreSQL on ordinary SQL connections: catalog queries
//! ([`catalog`]), start-up checks and the idempotent setup of the publication
//! ([`preflight`]), and the primary connection when decoding on a standby
//! ([`topology`]). What it tells the operator about the answers is in the `texts` crate.
//!
//! Every name that reaches SQL is escaped by [`sql`] (`replication::quote_ident`),
//! and the settings layer has already checked it is an identifier.

pub(crate) mod catalog;
pub mod lineage;
pub mod pause;
pub(crate) mod preflight;
pub(crate) mod sql;
pub(crate) mod topology;
