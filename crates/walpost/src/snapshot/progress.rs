//! Snapshot progress: rows done, total (estimate), rate and ETA, as log lines every
//! [`LOG_EVERY`], `walpost_snapshot_*` metrics, and a bar when stderr is a terminal;
//! for a replay followed through the admin API, its [`ReplayWatch`] too.

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::replay::ReplayWatch;
use crate::telemetry::metrics::SnapshotMetrics;

/// Seconds between progress log lines.
pub(super) const LOG_EVERY: Duration = Duration::from_secs(5);

/// See the module docs.
#[derive(Debug)]
pub(super) struct Progress {
    started: Instant,
    last_log: Instant,
    estimate: u64,
    done: u64,
    tty: bool,
    metrics: SnapshotMetrics,
    /// "snapshot" or "replay", in the lines printed.
    what: &'static str,
    watch: Option<Arc<ReplayWatch>>,
}

impl Progress {
    /// `replay`: rows count in `walpost_replay_rows_total`, lines say "replay".
    pub(super) fn new(metrics: SnapshotMetrics, replay: bool) -> Progress {
        Progress {
            what: if replay { "replay" } else { "snapshot" },
            started: Instant::now(),
            last_log: Instant::now(),
            estimate: 0,
            done: 0,
            tty: std::io::stderr().is_terminal(),
            metrics,
            watch: None,
        }
    }

    /// Counts into `watch` too, and stops when it asks.
    pub(super) fn watched(mut self, watch: Option<Arc<ReplayWatch>>) -> Progress {
        self.watch = watch;
        self
    }

    /// `rows` more rows fetched.
    pub(super) fn read(&self, rows: usize) {
        if let Some(w) = &self.watch {
            w.read(rows);
        }
    }

    /// At a chunk boundary: whether the replay was asked to stop.
    pub(super) fn stops_here(&self) -> bool {
        self.watch.as_ref().is_some_and(|w| w.stops_here())
    }

    pub(super) fn start(&mut self, estimate: u64) {
        self.estimate = estimate;
        self.started = Instant::now();
        self.metrics.estimate.set(i64::try_from(estimate).unwrap_or(i64::MAX));
        self.metrics.running.set(1);
    }

    /// One row acknowledged by Kafka.
    pub(super) fn acked(&mut self) {
        self.done += 1;
        if let Some(w) = &self.watch {
            w.acked();
        }
        if self.what == "replay" {
            self.metrics.replay_rows.inc();
        } else {
            self.metrics.rows.inc();
        }
    }

    pub(super) fn finish(&mut self) {
        self.tick(true);
        self.metrics.running.set(0);
    }

    pub(super) fn tick(&mut self, last: bool) {
        let elapsed = self.started.elapsed().as_secs_f64().max(0.001);
        let rate = self.done as f64 / elapsed;
        let total = self.estimate.max(self.done);
        let eta = if rate > 0.0 { (total - self.done) as f64 / rate } else { 0.0 };
        if self.tty {
            const WIDTH: u64 = 30;
            let filled = (self.done * WIDTH).checked_div(total).map_or(WIDTH, |f| f.min(WIDTH));
            let bar = format!("{}{}", "#".repeat(filled as usize), ".".repeat((WIDTH - filled) as usize));
            let mut err = std::io::stderr();
            let _ =
                write!(err, "\r{} [{bar}] {}/{} rows {:.0} rows/s ETA {:.0}s ", self.what, self.done, total, rate, eta);
            if last {
                let _ = writeln!(err);
            }
        }
        if last || self.last_log.elapsed() >= LOG_EVERY {
            self.last_log = Instant::now();
            tracing::info!(
                rows_done = self.done,
                rows_total_estimate = total,
                rows_per_sec = rate.round() as u64,
                eta_secs = eta.round() as u64,
                secs = elapsed,
                "{} progress",
                self.what
            );
        }
    }
}
