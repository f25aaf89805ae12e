//! `events_per_second` of `GET /api/v1/status`: the records Kafka acknowledged over the
//! last minute, from samples of the published counter every [`SAMPLE_EVERY`] taken by a
//! task of their own, so that a status request costs no wait and the stream no work.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::telemetry::Metrics;

/// How often the counter is read.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// The span the rate is taken over.
const WINDOW: Duration = Duration::from_secs(60);

/// The last minute of samples of the published counter.
#[derive(Debug, Default)]
pub(crate) struct Samples {
    kept: VecDeque<(Instant, u64)>,
}

impl Samples {
    /// Adds a sample, forgetting those older than the window (one older stays: it spans it).
    pub(crate) fn push(&mut self, at: Instant, published: u64) {
        self.kept.push_back((at, published));
        while self.kept.len() > 2 && at.duration_since(self.kept[1].0) >= WINDOW {
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

/// The samples, shared with the API.
pub(crate) type Shared = Arc<Mutex<Samples>>;

/// Samples `metrics` every [`SAMPLE_EVERY`] until `shutdown`.
pub(crate) fn spawn(metrics: Metrics, mut shutdown: watch::Receiver<bool>) -> Shared {
    let shared: Shared = Arc::default();
    let samples = shared.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(SAMPLE_EVERY);
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tick.tick() => {}
            }
            let published = metrics.kafka.published_total();
            if let Ok(mut s) = samples.lock() {
                s.push(Instant::now(), published);
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
}
