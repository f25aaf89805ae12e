//! What walpost asks PostgreSQL on ordinary SQL connections, and what it tells the
//! operator about the answers: catalog queries ([`catalog`]), start-up checks and the
//! idempotent setup of the publication ([`preflight`]), the primary connection when
//! decoding on a standby ([`topology`]), and the operator-facing texts
//! the runbooks quote ([`messages`]).
//!
//! Every name that reaches SQL is escaped by [`sql`] (`replication::quote_ident`),
//! and the settings layer has already checked it is an identifier.

pub(crate) mod catalog;
pub mod lineage;
pub mod messages;
pub(crate) mod preflight;
pub(crate) mod sql;
pub(crate) mod topology;
