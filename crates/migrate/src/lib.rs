//! walpost's versioned migrations: the SQL files of `migrations/outbox/` (the producer's
//! database) and `migrations/inbox/` (a consuming service's), embedded in the binary, and
//! the runner behind `walpost migrate` and `walpost inbox --create-schema`.
//!
//! The files stay plain SQL, so teams that run migrations with their own tool (Flyway,
//! Liquibase, sqlx, psql) apply the same files. The runner adds what they lack:
//! - a record per schema, `<schema>.walpost_migrations (version, name, checksum,
//!   applied_at)`, the checksum being the file's sha256;
//! - each pending migration applied in order, in its own transaction with its row;
//! - one runner per schema at a time (an advisory lock: a second one waits, then finds
//!   nothing to do);
//! - a file edited after it was applied stops it, naming the file (a migration is never
//!   edited: a change is a new number);
//! - a database migrated by hand before the record existed is recognised by what each
//!   migration leaves in the catalog, and recorded without running anything.
//!
//! The inbox's files name no schema: the runner sets `search_path = <schema>, pg_temp` for
//! each transaction, they create their objects there, and their functions keep that
//! search_path (`SET search_path FROM CURRENT`), pg_catalog being searched before it.
//!
//! [`plan`](Plan) is pure (unit-tested); [`migrate`] and [`status`] read and write.

mod error;
mod files;
mod plan;
mod run;

pub use error::Error;
pub use files::{Migration, Set};
pub use plan::{Entry, Plan, Recorded, State};
pub use run::{create_walpost_slots, migrate, status, RECORD_TABLE};
