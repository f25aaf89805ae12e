//! walpost: transactional-outbox events from PostgreSQL's WAL to Kafka.
//!
//! The protocol work lives in the `pgoutput`, `replication` and `router` crates; what
//! both halves stand on in `service`, `daypart` and `kafka-common`; `walpost inbox` is
//! the `inbox` crate and `walpost migrate` the `migrate` crate; span export is `otlp`,
//! the schema registry `registry` (both on `http-client`), row conditions `condition`. This crate is the relay
//! (`walpost run`) and the wiring. Its modules, bottom to top:
//!
//! | layer | modules | what |
//! |---|---|---|
//! | 0 | [`error`] | the service crate's error kind, with the relay's routing helpers |
//! | 1 | [`settings`], [`telemetry`] | configuration (`walpost inbox`'s too); `walpost run`'s metrics |
//! | 2 | [`postgres`], [`kafka`] | catalog queries and checks; producer, produce window, permanent-error policy, exactly-once |
//! | 3 | [`snapshot`] | the initial snapshot |
//! | 4 | [`stream`], [`monitor`], [`retention`] | THE DATA PATH; slot alarms; partition retention |
//! | 5 | [`ops`] | `check`, `slot`, `import-debezium`, `replay`, `migrate`, `ctl` |
//! | 6 | [`cli`], [`control`] | clap types only; the admin API's routes (`[admin]`) |
//! | 7 | [`app`] | the composition root (`main.rs` calls it) |
//!
//! The rule, held by `tests/layers.rs` (Cargo holds the layering between crates): a
//! module imports (`use crate::...`) only modules of lower layers, never a sibling of its
//! own layer nor anything above it; only [`cli`] and [`app`] see clap. See ARCHITECTURE.md for the data path.
//!
//! The public surface is what `main.rs` and the integration tests (`tests/`) use: the
//! modules `settings`, `telemetry`, `kafka`, `postgres`, `snapshot`, `ops`, `cli` and
//! `app`, and in them only the submodules those callers name; every other module is
//! `pub(crate)`, and so is every item in it (`unreachable_pub` keeps it so). The docs are read with `cargo doc --document-private-items`: this is a
//! service, not a library, and its modules' docs link to crate-private items.

#![allow(rustdoc::private_intra_doc_links)]

pub(crate) mod error;

pub mod settings;
pub mod telemetry;

pub mod kafka;
pub mod postgres;

pub mod snapshot;

pub(crate) mod monitor;
pub(crate) mod retention;
pub(crate) mod stream;

pub mod ops;

pub mod cli;
pub(crate) mod control;

pub mod app;

/// Version and the git commit it was built from.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("WALPOST_GIT_COMMIT"), ")");

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
