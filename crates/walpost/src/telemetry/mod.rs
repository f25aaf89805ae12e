//! What `walpost run` tells the outside world about itself: its Prometheus metrics
//! ([`metrics`]), on the health state, registry and HTTP server of the `service` crate
//! (re-exported here as [`health`] and [`http`]). Logs go through `tracing`, set up by
//! the binary.

pub mod metrics;

pub(crate) use metrics::{now_ms, Metrics};
pub(crate) use service::telemetry::{health, http};
pub(crate) use service::telemetry::{AlarmLevel, Health};
