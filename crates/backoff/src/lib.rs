//! Waiting between attempts, and between rounds of a periodic loop.
//!
//! - [`Backoff`]: a capped exponential backoff (initial delay, cap, multiplier) that a
//!   success resets. Every retry loop in walpost (reconnecting the stream, the inbox's
//!   database, OTLP exports, the metrics server's accept loop) uses it, so their delays
//!   follow one rule. No jitter: each loop has one peer per walpost instance, and a
//!   fleet of instances does not restart in lockstep.
//! - [`sleep_or_shutdown`]: a sleep that ends early when walpost is asked to stop, for
//!   loops that run every interval until shutdown.
//!
//! Shutdown is a `tokio::sync::watch::Receiver<bool>` that turns `true` once (the value
//! walpost's signal handler sends); a dropped sender counts as a shutdown, since nobody
//! is left to ask for one.

use std::time::Duration;

use tokio::sync::watch;

/// Capped exponential backoff: `initial`, `initial * multiplier`, ... up to `max`, then
/// `max` until [`reset`](Backoff::reset).
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    multiplier: u32,
    next: Duration,
}

impl Backoff {
    /// Doubles from `initial` up to `max` (a `max` below `initial` caps `initial` too).
    pub fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff { initial, max, multiplier: 2, next: initial }
    }

    /// Grows by `multiplier` instead of 2 (1 keeps the delay constant; 0 counts as 1).
    pub fn with_multiplier(mut self, multiplier: u32) -> Backoff {
        self.multiplier = multiplier.max(1);
        self
    }

    /// The delay to wait now; the one after it is longer, up to the cap.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next.min(self.max);
        self.next = self.next.saturating_mul(self.multiplier).min(self.max);
        delay
    }

    /// After a success: the next delay is `initial` again.
    pub fn reset(&mut self) {
        self.next = self.initial;
    }
}

/// Sleeps `duration` unless `shutdown` asks to stop first; `true` when it did (also when
/// it already had before the call, or its sender is gone), `false` when the whole
/// duration passed.
pub async fn sleep_or_shutdown(duration: Duration, shutdown: &mut watch::Receiver<bool>) -> bool {
    // Within the duration, `wait_for` ends with Ok (it is or turned true) or Err (the
    // sender is gone): both a shutdown.
    tokio::time::timeout(duration, shutdown.wait_for(|stop| *stop)).await.is_ok()
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    fn millis(b: &mut Backoff, n: usize) -> Vec<u128> {
        (0..n).map(|_| b.next_delay().as_millis()).collect()
    }

    #[test]
    fn doubles_up_to_the_cap_then_stays_there() {
        let mut b = Backoff::new(Duration::from_millis(250), Duration::from_secs(2));
        assert_eq!(millis(&mut b, 6), vec![250, 500, 1000, 2000, 2000, 2000]);
    }

    #[test]
    fn reset_starts_again_from_the_initial_delay() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(10));
        assert_eq!(millis(&mut b, 3), vec![100, 200, 400]);
        b.reset();
        assert_eq!(millis(&mut b, 2), vec![100, 200]);
    }

    #[test]
    fn a_cap_that_is_not_a_power_of_two_of_the_initial_delay_is_reached_exactly() {
        let mut b = Backoff::new(Duration::from_millis(300), Duration::from_secs(1));
        assert_eq!(millis(&mut b, 4), vec![300, 600, 1000, 1000]);
    }

    #[test]
    fn a_cap_below_the_initial_delay_caps_the_first_delay_too() {
        let mut b = Backoff::new(Duration::from_secs(5), Duration::from_secs(1));
        assert_eq!(millis(&mut b, 2), vec![1000, 1000]);
    }

    #[test]
    fn the_multiplier_sets_the_growth() {
        let mut b = Backoff::new(Duration::from_millis(10), Duration::from_secs(1)).with_multiplier(3);
        assert_eq!(millis(&mut b, 6), vec![10, 30, 90, 270, 810, 1000]);
        let mut constant = Backoff::new(Duration::from_millis(10), Duration::from_secs(1)).with_multiplier(0);
        assert_eq!(millis(&mut constant, 3), vec![10, 10, 10]);
    }

    #[test]
    fn a_long_outage_never_overflows() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::MAX).with_multiplier(u32::MAX);
        for _ in 0..100 {
            b.next_delay();
        }
        assert_eq!(b.next_delay(), Duration::MAX);
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime")
    }

    #[test]
    fn sleep_or_shutdown_sleeps_the_whole_duration_without_a_shutdown() {
        let (_tx, mut rx) = watch::channel(false);
        let started = Instant::now();
        let stopped = runtime().block_on(sleep_or_shutdown(Duration::from_millis(100), &mut rx));
        assert!(!stopped);
        assert!(started.elapsed() >= Duration::from_millis(100), "{:?}", started.elapsed());
    }

    #[test]
    fn sleep_or_shutdown_ends_at_the_shutdown() {
        let (tx, mut rx) = watch::channel(false);
        let started = Instant::now();
        let stopped = runtime().block_on(async {
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                let _ = tx.send(true);
                // Held until the sleep has seen the value, so a dropped sender is not
                // what ended it.
                tokio::time::sleep(Duration::from_secs(60)).await;
            });
            sleep_or_shutdown(Duration::from_secs(30), &mut rx).await
        });
        assert!(stopped);
        assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    }

    #[test]
    fn sleep_or_shutdown_returns_at_once_after_an_earlier_shutdown() {
        let (tx, mut rx) = watch::channel(false);
        tx.send(true).expect("receiver alive");
        // Seen already: a loop that slept before, woke for other work, and sleeps again.
        assert!(*rx.borrow_and_update());
        let started = Instant::now();
        assert!(runtime().block_on(sleep_or_shutdown(Duration::from_secs(30), &mut rx)));
        assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    }

    #[test]
    fn sleep_or_shutdown_ignores_a_change_that_is_not_a_stop() {
        let (tx, mut rx) = watch::channel(false);
        let stopped = runtime().block_on(async {
            tokio::spawn(async move {
                let _ = tx.send(false);
                tokio::time::sleep(Duration::from_secs(60)).await;
            });
            sleep_or_shutdown(Duration::from_millis(100), &mut rx).await
        });
        assert!(!stopped);
    }

    #[test]
    fn a_dropped_sender_counts_as_a_shutdown() {
        let (tx, mut rx) = watch::channel(false);
        drop(tx);
        let started = Instant::now();
        assert!(runtime().block_on(sleep_or_shutdown(Duration::from_secs(30), &mut rx)));
        assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    }
}
