//! The admin listener `walpost run` (and later `walpost inbox`) serves beside its
//! metrics port, off unless `[admin] addr` is set (docs/control-plane.md).
//!
//! Pure parts, unit-tested: the tokens file and what a token is worth ([`tokens`]), the
//! route table ([`routes`]), answers and their JSON errors ([`reply`]), audit records
//! ([`audit`]), audit rows in a PostgreSQL table ([`table`]), and the web console's
//! files ([`console`]). The listener ([`server`]) puts them together: every request is
//! authenticated, routed, authorized and bounded (headers, body, time) before a mode's
//! [`Api`] sees it, and every action is audited through the mode's [`Audit`].
//!
//! A mode adds a route by naming it in its [`Routes`] and answering it in
//! [`Api::handle`]; authentication, roles, bounds and audit come with the table.

pub mod audit;
pub mod console;
pub mod reply;
pub mod routes;
pub mod server;
pub mod table;
pub mod tokens;

pub use audit::{Audit, AuditRecord, LogOnly};
pub use reply::{ApiError, Reply};
pub use routes::{Access, Found, Routes};
pub use server::{serve, tls_acceptor, Api, Call, ListenerError, Server, MAX_BODY_BYTES, WHOAMI};
pub use table::TableAudit;
pub use tokens::{sha256_hex, Identity, Role, Tokens, TokensError};
