//! What a walpost process tells the outside world about itself: the health state shared
//! between its tasks ([`health`]), one mode's Prometheus registry with the series every
//! mode exports ([`exposition`]), and the HTTP endpoints that serve both ([`http`]). Each
//! mode (`walpost run`, `walpost inbox`) registers only its own series on its own
//! registry, so neither exports the other's. Logs go through `tracing`, set up by the
//! binary.

pub mod exposition;
pub mod health;
pub mod http;

pub use exposition::{now_ms, Exporter, Exposition, MetricTable};
pub use health::{AlarmLevel, Condition, Health};
