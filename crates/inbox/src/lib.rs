//! `walpost inbox`: Kafka records into a consuming service's PostgreSQL inbox, exactly
//! once, next to the SQL API its handlers call (migrations/inbox/, docs/inbox.md).
//! The walpost binary wires it ([`run`], [`check::check`] for `walpost check inbox`); it
//! knows nothing of the relay (`walpost run`), and the relay nothing of it.
//!
//! Also here: its settings ([`settings`], resolved from the command line and the file by
//! the binary), its metrics ([`metrics`], on a registry of its own), its operator texts
//! ([`messages`]) and its retention of day partitions ([`retention`], on `daypart`).
//! What an operator does to its handlers ([`control`]: pause, resume, the review queue,
//! retry and dismiss in bulk) is the SQL API's, called for the admin API.
//!
//! Wiring: [`pipeline`] connects the consumer thread ([`consumer`]), the pure ingest
//! ([`ingest`]), the writer task ([`writer`]) and the store ([`store`]).
//!
//! Invariants (the ones that make "a crash at any point neither loses nor duplicates a
//! row"):
//! - a record's row and its partition's next offset commit in one PostgreSQL
//!   transaction; a partition is read again from the offset stored there;
//! - a batch that failed to commit is written again, unchanged, until it commits or the
//!   process stops (then it was never stored, and its records are read again): a retry of
//!   a batch that did commit stores nothing twice (`store.rs`);
//! - a record that cannot be stored is either a rejected row (with the reason) or a halt
//!   at it: never skipped, and no offset passes it.

mod budget;
pub mod check;
pub(crate) mod consumer;
pub mod control;
pub(crate) mod copy;
pub(crate) mod ingest;
pub mod messages;
pub mod metrics;
mod pipeline;
mod readiness;
pub(crate) mod record;
pub(crate) mod retention;
pub mod settings;
pub(crate) mod store;
mod writer;

pub use pipeline::run;

/// A crash seam for tests: with the `failpoints` feature and
/// `FAILPOINTS=<name>=return`, the process aborts there (as a `kill -9` would stop it).
/// Without the feature it compiles to nothing.
macro_rules! crash_seam {
    ($name:literal) => {
        #[cfg(feature = "failpoints")]
        fail::fail_point!($name, |_| {
            eprintln!("walpost: failpoint {} reached, aborting", $name);
            std::process::abort()
        });
    };
}
pub(crate) use crash_seam;
