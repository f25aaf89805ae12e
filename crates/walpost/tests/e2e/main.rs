//! End-to-end suite: the walpost binary against a real PostgreSQL (wal_level=logical)
//! and a real Apache Kafka broker, both started by `testkit`.
//!
//! Each test gets its own database, slot, publication and topic prefix on a shared
//! cluster and broker; tests that stop a server start their own.
// Test crates: helpers outside #[test] functions may fail loudly too.
#![allow(clippy::unwrap_used)]

mod admin;
mod admin_dead_letters;
mod admin_pause;
mod admin_replays;
mod bad_inputs;
mod chaos;
mod cloudevents;
mod conformance;
mod console;
mod contracts;
mod core;
mod ctl;
mod drills;
mod errors;
mod exactly_once;
mod failover;
mod ha;
mod hardening;
mod inbox;
mod inbox_admin;
mod inbox_batches;
mod inbox_chaos;
mod inbox_control;
mod inbox_drills;
mod inbox_hardening;
mod inbox_hostile;
mod inbox_ingest;
mod inbox_refusals;
mod inbox_retention;
mod kafka_cluster;
mod migrate;
mod ops;
mod otel;
mod registry;
mod replay;
mod retention;
mod router;
mod security;
mod snapshot;
mod standby;
mod support;
