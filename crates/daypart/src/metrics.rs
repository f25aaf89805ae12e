//! A retention pass's series, registered by the mode that runs passes under its own
//! names (`walpost_retention_*` for the outbox, `walpost_inbox_retention_*` for the
//! inbox), so neither exports the other's.

use prometheus::{IntCounter, IntCounterVec, IntGauge};
use service::telemetry::{now_ms, Exposition};

/// The names a mode gives its retention series.
#[derive(Debug, Clone, Copy)]
pub struct RetentionNames {
    pub created: &'static str,
    /// `None`: this mode never seals a partition (the inbox drops finished days).
    pub sealed: Option<&'static str>,
    pub dropped: &'static str,
    pub skipped: &'static str,
    pub passes: &'static str,
    pub last_success: &'static str,
}

/// Retention's metrics.
#[derive(Debug, Clone)]
pub struct RetentionMetrics {
    pub created: IntCounter,
    pub sealed: Option<IntCounter>,
    pub dropped: IntCounter,
    skipped: IntCounterVec,
    passes: IntCounterVec,
    pub last_success: IntGauge,
}

impl RetentionMetrics {
    /// Registers the series named by `names` on `e`.
    pub fn register(e: &Exposition, names: &RetentionNames) -> prometheus::Result<RetentionMetrics> {
        let m = RetentionMetrics {
            created: e.counter(names.created)?,
            sealed: names.sealed.map(|name| e.counter(name)).transpose()?,
            dropped: e.counter(names.dropped)?,
            skipped: e.counters(names.skipped, &["reason"])?,
            passes: e.counters(names.passes, &["result"])?,
            last_success: e.gauge(names.last_success)?,
        };
        for result in ["ok", "error"] {
            let _ = m.passes.with_label_values(&[result]);
        }
        Ok(m)
    }

    /// A partition due for an action was left in place for `reason` (a fixed word).
    pub fn skipped(&self, reason: &'static str) {
        self.skipped.with_label_values(&[reason]).inc();
    }

    /// Makes the skip series for `reasons` exist at 0 (so a rate over them works).
    pub fn declare_skip_reasons(&self, reasons: &[&'static str]) {
        for r in reasons {
            let _ = self.skipped.with_label_values(&[r]);
        }
    }

    pub fn pass_finished(&self, ok: bool) {
        self.passes.with_label_values(&[if ok { "ok" } else { "error" }]).inc();
        if ok {
            self.last_success.set(now_ms() / 1000);
        }
    }
}
