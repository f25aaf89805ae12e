//! walpost: transactional-outbox events from PostgreSQL's WAL to Kafka.
//!
//! This crate is wiring plus the parts that need I/O: configuration, the Kafka sink,
//! the checkpoint that decides which LSN may be confirmed, preflight/setup SQL and the
//! streaming loop. The protocol work lives in the `pgoutput`, `replication` and
//! `router` crates.

pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod debezium;
pub mod error;
pub mod metrics;
pub mod monitor;
pub mod ops;
pub mod pipeline;
pub mod retention;
pub mod setup;
pub mod sink;
pub mod snapshot;

/// Version and the git commit it was built from.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("WALPOST_GIT_COMMIT"), ")");
