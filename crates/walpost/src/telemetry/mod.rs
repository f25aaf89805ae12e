//! What walpost tells the outside world about itself: Prometheus metrics
//! ([`metrics`]), the health state shared between tasks ([`health`]) and the HTTP
//! endpoints that serve both ([`http`]). Logs go through `tracing`, set up by the
//! binary.

pub mod health;
pub mod http;
pub mod metrics;

pub use health::{AlarmLevel, Health};
pub use metrics::{now_ms, Metrics};
