//! What both halves of walpost stand on, once: the relay (`walpost run`, the `walpost`
//! crate) and the inbox (`walpost inbox`, the `inbox` crate) use it, it uses neither.
//!
//! - [`error`]: the transient/definite split and the error kind every halt is sorted by;
//! - [`sql`]: SQL on ordinary (non-replication) connections: names quoted, values as bind
//!   parameters (lists as one array parameter), DDL built by `format()` from bound values;
//! - [`check`]: one line of `walpost check` (either half's);
//! - [`telemetry`]: the health state, one mode's Prometheus registry and the HTTP server
//!   of `/metrics`, `/healthz` and `/readyz`.

pub mod check;
pub mod error;
pub mod sql;
pub mod telemetry;
