//! What walpost's Kafka clients share, the relay's producer (and its admin clients) and
//! the inbox's consumer alike: one client configuration with one table of refused
//! properties ([`config`]), one way librdkafka's log lines and errors reach the log
//! ([`log`], throttled by [`throttle`]), one reachability check for `walpost check` and
//! `walpost check inbox` ([`reach`]), and a record's headers read as bytes ([`headers`]).
//!
//! Its own crate, not a module of `service`: only the two halves that talk to Kafka
//! build librdkafka (a C build of minutes); what needs the error kind, SQL or the
//! metrics server alone (migrations, say) does not.

pub mod config;
pub mod headers;
pub mod log;
pub mod reach;
pub mod throttle;

pub use config::{client_config, refusal, RefusedProperty, Role};
