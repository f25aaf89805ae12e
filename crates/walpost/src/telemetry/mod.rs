//! What walpost tells the outside world about itself: Prometheus metrics
//! ([`metrics`]), the health state shared between tasks ([`health`]) and the HTTP
//! endpoints that serve both ([`http`]). Logs go through `tracing`, set up by the
//! binary.

pub(crate) mod health;
pub(crate) mod http;
pub mod metrics;

pub(crate) use health::{AlarmLevel, Health};
pub(crate) use metrics::{now_ms, Metrics};
