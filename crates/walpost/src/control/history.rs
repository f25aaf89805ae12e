//! What the process remembers of its last hour for the admin API: `events_per_second` of
//! `GET /api/v1/status` (the records Kafka acknowledged over the last minute; for
//! `walpost inbox`, `records_per_second`: the records stored) and the
//! points of `GET /api/v1/status/history` (lag and rate every [`POINT_EVERY`], the last
//! hour), the console's lag chart. One task samples every [`SAMPLE_EVERY`], so that a
//! request costs no wait and the stream no work, and a reloaded console keeps its chart.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tokio::sync::watch;

use crate::monitor::Observation;
use crate::telemetry::Metrics;

/// How often the published counter is read.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// How often a point of the history is kept (every other sample).
pub(crate) const POINT_EVERY: Duration = Duration::from_secs(10);
/// The span the rate is taken over.
const RATE_WINDOW: Duration = Duration::from_secs(60);
/// Points kept: an hour of them.
pub(crate) const POINTS: usize = 360;

/// The last minute of samples of the published counter.
#[derive(Debug, Default)]
pub(crate) struct Samples {
    kept: VecDeque<(Instant, u64)>,
}

impl Samples {
    /// Adds a sample, forgetting those older than the window (one older stays: it spans it).
    pub(crate) fn push(&mut self, at: Instant, published: u64) {
        self.kept.push_back((at, published));
        while self.kept.len() > 2 && at.duration_since(self.kept[1].0) >= RATE_WINDOW {
            self.kept.pop_front();
        }
    }

    /// Records per second between the oldest and the newest sample; `None` before two
    /// samples a second apart, and after a counter that went backwards (it never does).
    pub(crate) fn rate(&self) -> Option<f64> {
        let (&(t0, n0), &(t1, n1)) = (self.kept.front()?, self.kept.back()?);
        let secs = t1.duration_since(t0).as_secs_f64();
        (secs >= 1.0 && n1 >= n0).then(|| ((n1 - n0) as f64 / secs * 10.0).round() / 10.0)
    }
}

/// One point of the history.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub(crate) struct Point {
    /// Milliseconds since the Unix epoch.
    pub(crate) at: u64,
    /// WAL not yet confirmed, at the slot monitor's last poll.
    pub(crate) lag_bytes: Option<u64>,
    /// Seconds since the oldest unconfirmed transaction committed, while this process streams.
    pub(crate) lag_seconds: Option<f64>,
    pub(crate) events_per_second: Option<f64>,
}

/// What the sampler keeps: the rate's samples and the hour's points.
#[derive(Debug, Default)]
pub(crate) struct Memory {
    pub(crate) samples: Samples,
    pub(crate) points: VecDeque<Point>,
}

impl Memory {
    fn keep(&mut self, point: Point) {
        if self.points.len() == POINTS {
            self.points.pop_front();
        }
        self.points.push_back(point);
    }
}

/// The memory, shared with the API.
pub(crate) type Shared = Arc<Mutex<Memory>>;

/// What `GET /api/v1/status/history` answers.
#[derive(Debug, Serialize)]
pub(crate) struct History {
    pub(crate) every_seconds: u64,
    pub(crate) points: Vec<Point>,
}

pub(crate) fn history(shared: &Shared) -> History {
    let points = shared.lock().map(|m| m.points.iter().copied().collect()).unwrap_or_default();
    History { every_seconds: POINT_EVERY.as_secs(), points }
}

/// The rate of one counter alone: `walpost inbox`'s records stored.
pub(crate) type Rate = Arc<Mutex<Samples>>;

/// Samples `read` every [`SAMPLE_EVERY`] until `shutdown`.
pub(crate) fn spawn_rate(read: impl Fn() -> u64 + Send + 'static, mut shutdown: watch::Receiver<bool>) -> Rate {
    let rate: Rate = Arc::default();
    let samples = rate.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(SAMPLE_EVERY);
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tick.tick() => {}
            }
            let Ok(mut s) = samples.lock() else { return };
            s.push(Instant::now(), read());
        }
    });
    rate
}

/// Samples until `shutdown`: the counter every [`SAMPLE_EVERY`], a point every [`POINT_EVERY`].
pub(crate) fn spawn(
    metrics: Metrics,
    seen: watch::Receiver<Option<Observation>>,
    mut shutdown: watch::Receiver<bool>,
) -> Shared {
    let shared: Shared = Arc::default();
    let memory = shared.clone();
    let per_point = (POINT_EVERY.as_secs() / SAMPLE_EVERY.as_secs()).max(1);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(SAMPLE_EVERY);
        for n in 0u64.. {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tick.tick() => {}
            }
            let published = metrics.kafka.published_total();
            let Ok(mut m) = memory.lock() else { return };
            m.samples.push(Instant::now(), published);
            if n % per_point == 0 {
                let lag_bytes =
                    seen.borrow().as_ref().map(|o| &o.status).filter(|s| s.exists).and_then(|s| s.unconfirmed_bytes);
                let streaming = metrics.health().is_streaming();
                let point = Point {
                    at: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
                    lag_bytes,
                    lag_seconds: streaming.then(|| metrics.stream.lag_seconds()),
                    events_per_second: m.samples.rate(),
                };
                m.keep(point);
            }
        }
    });
    shared
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_spans_the_last_minute_of_samples() {
        let t = Instant::now();
        let mut s = Samples::default();
        assert_eq!(s.rate(), None);
        s.push(t, 0);
        assert_eq!(s.rate(), None, "one sample has no rate");
        s.push(t + Duration::from_secs(5), 500);
        assert_eq!(s.rate(), Some(100.0));
        for i in 2..=30u64 {
            s.push(t + Duration::from_secs(5 * i), 500 + (i - 1) * 2000);
        }
        // Only the last minute counts: 400 records/s, not the average since the start.
        assert_eq!(s.rate(), Some(400.0));
        assert!(s.kept.len() <= 14, "{}", s.kept.len());
    }

    #[test]
    fn no_rate_within_a_second_or_from_a_counter_that_went_back() {
        let t = Instant::now();
        let mut s = Samples::default();
        s.push(t, 10);
        s.push(t + Duration::from_millis(500), 20);
        assert_eq!(s.rate(), None);
        let mut s = Samples::default();
        s.push(t, 10);
        s.push(t + Duration::from_secs(5), 5);
        assert_eq!(s.rate(), None);
    }

    #[test]
    fn the_history_keeps_the_last_hour_of_points() {
        let mut m = Memory::default();
        for i in 0..(POINTS as u64 + 25) {
            m.keep(Point { at: i, lag_bytes: Some(i), lag_seconds: None, events_per_second: None });
        }
        assert_eq!(m.points.len(), POINTS);
        assert_eq!(m.points.front().map(|p| p.at), Some(25), "the oldest points go first");
        assert_eq!(m.points.back().map(|p| p.at), Some(POINTS as u64 + 24));
    }
}
