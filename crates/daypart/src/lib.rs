//! Day partitions, as the outbox's retention (`walpost run`, `walpost retention`) and the
//! inbox's (`walpost inbox`) both keep them: tables partitioned BY RANGE on a timestamp,
//! one partition per UTC day, created ahead and dropped whole.
//!
//! - [`time`]: bounds as microseconds since the Unix epoch, partition names, literals;
//! - [`plan`]: what a window of days lacks, cut at midnights;
//! - [`catalog`]: the partitioned table and its partitions as the catalog has them;
//! - [`ddl`]: creating a partition, in a transaction with `lock_timeout`;
//! - [`report`]: one line per partition of a pass, and how it is logged;
//! - [`metrics`]: a pass's series, under the names of the mode that runs it.
//!
//! What to drop and when is each mode's own rule (the outbox's seal and slot, the
//! inbox's finished deliveries): it stays with the mode.

pub mod catalog;
pub mod ddl;
pub mod metrics;
pub mod plan;
pub mod report;
pub mod time;

pub use metrics::{RetentionMetrics, RetentionNames};
pub use report::{log_line, Action, Line, Outcome, Range, Reason};
