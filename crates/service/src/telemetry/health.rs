//! State shared between tasks that is not a metric: whether walpost streams or waits as a
//! hot standby, the slot alarm level, how long records have waited for Kafka, whether the pipeline's runtime
//! still runs, and a mode's own [`Condition`] (`walpost inbox`: its PostgreSQL answers and
//! the group gave it partitions). `/readyz` and `/healthz` answer from it; a few gauges are
//! computed from it at scrape time (they are ages, which only grow while nothing
//! updates them, as they should when the pipeline is stuck).
//!
//! Times are milliseconds on a monotonic clock that starts with the process; `0`
//! means "not set".

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

pub use slot_alarm::AlarmLevel;

/// A mode's own condition for `/readyz`, asked after the common ones (not halted, streaming)
/// and before Kafka's acknowledgements and the slot alarm.
pub trait Condition: Send + Sync + std::fmt::Debug {
    /// `Err`: why this mode is not ready.
    fn check(&self) -> Result<(), String>;
}

/// See the module docs.
#[derive(Debug)]
pub struct Health {
    epoch: Instant,
    streaming: AtomicBool,
    alarm: AtomicU8,
    /// When the oldest unacknowledged record started waiting with no acknowledgement
    /// since (0: nothing waits).
    unacked_since: AtomicU64,
    /// The last beat of the pipeline runtime's liveness task.
    beat: AtomicU64,
    unready_after: Duration,
    dead_after: Duration,
    /// The error walpost stopped on, while it serves its metrics a last time.
    halted: OnceLock<String>,
    /// The mode's own readiness condition, if it has one.
    condition: OnceLock<Arc<dyn Condition>>,
    /// While this instance waits for another process to release the slot: who holds it.
    standby: Mutex<Option<String>>,
    /// While an operator paused the stream: by whom and since when. A channel, so the
    /// stream wakes at once when it changes.
    paused: tokio::sync::watch::Sender<Option<String>>,
}

impl Health {
    /// `unready_after`: records waiting this long without an acknowledgement make
    /// `/readyz` fail; `dead_after`: no beat for this long makes `/healthz` fail.
    pub fn new(unready_after: Duration, dead_after: Duration) -> Health {
        let h = Health {
            epoch: Instant::now(),
            streaming: AtomicBool::new(false),
            alarm: AtomicU8::new(0),
            unacked_since: AtomicU64::new(0),
            beat: AtomicU64::new(0),
            unready_after,
            dead_after,
            halted: OnceLock::new(),
            condition: OnceLock::new(),
            standby: Mutex::new(None),
            paused: tokio::sync::watch::Sender::new(None),
        };
        h.beat();
        h
    }

    fn now(&self) -> u64 {
        // +1: a time taken at the epoch itself must not read as "not set".
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX).saturating_add(1)
    }

    pub fn set_streaming(&self, on: bool) {
        self.streaming.store(on, Ordering::Relaxed);
    }

    pub fn is_streaming(&self) -> bool {
        self.streaming.load(Ordering::Relaxed)
    }

    pub fn set_alarm(&self, level: AlarmLevel) {
        self.alarm.store(level as u8, Ordering::Relaxed);
    }

    pub fn alarm(&self) -> AlarmLevel {
        AlarmLevel::from_u8(self.alarm.load(Ordering::Relaxed))
    }

    /// Records wait for Kafka and none was acknowledged since `since` (`None`: nothing waits).
    pub fn set_waiting_for_acks(&self, since: Option<Instant>) {
        let at = since.map_or(0, |t| {
            let ms = u64::try_from(t.saturating_duration_since(self.epoch).as_millis()).unwrap_or(u64::MAX);
            ms.saturating_add(1)
        });
        self.unacked_since.store(at, Ordering::Relaxed);
    }

    /// Records wait for Kafka: the clock starts now, unless it runs already (a restarted
    /// producer re-sends what its predecessor left: Kafka's silence goes on).
    pub fn waiting_for_acks(&self) {
        let _ = self.unacked_since.compare_exchange(0, self.now(), Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Kafka reported on a record: the clock starts again if records still wait, else
    /// it stops.
    pub fn kafka_progress(&self, still_waiting: bool) {
        self.unacked_since.store(if still_waiting { self.now() } else { 0 }, Ordering::Relaxed);
    }

    /// How long records have waited for an acknowledgement (zero when nothing waits).
    pub fn unacknowledged_for(&self) -> Duration {
        match self.unacked_since.load(Ordering::Relaxed) {
            0 => Duration::ZERO,
            since => Duration::from_millis(self.now().saturating_sub(since)),
        }
    }

    /// Called by a task on the pipeline's runtime at least every second: the runtime runs.
    pub fn beat(&self) {
        self.beat.store(self.now(), Ordering::Relaxed);
    }

    /// walpost stopped on `error` (definite): it is about to exit 1.
    pub fn set_halted(&self, error: String) {
        self.streaming.store(false, Ordering::Relaxed);
        let _ = self.halted.set(error);
    }

    /// The error walpost stopped on, if it did.
    pub fn halted(&self) -> Option<&str> {
        self.halted.get().map(String::as_str)
    }

    /// This instance waits as a hot standby (`Some`: who holds the slot) or no longer does.
    pub fn set_standby(&self, holder: Option<String>) {
        *self.standby.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = holder;
    }

    /// Who holds the slot while this instance waits as a hot standby.
    pub fn standby(&self) -> Option<String> {
        self.standby.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// An operator paused the stream (`Some`: by whom, since when) or resumed it. A paused
    /// relay stays ready: it is healthy and does what it was told.
    pub fn set_paused(&self, by: Option<String>) {
        self.paused.send_if_modified(|now| {
            let changed = *now != by;
            *now = by;
            changed
        });
    }

    pub fn is_paused(&self) -> bool {
        self.paused.borrow().is_some()
    }

    /// Who paused the stream and since when, while it is paused.
    pub fn paused(&self) -> Option<String> {
        self.paused.borrow().clone()
    }

    /// Changes of [`Health::paused`], to wake on.
    pub fn watch_paused(&self) -> tokio::sync::watch::Receiver<Option<String>> {
        self.paused.subscribe()
    }

    /// Adds the mode's own readiness condition; a mode has one (a second is refused).
    pub fn add_condition(&self, condition: Arc<dyn Condition>) -> Result<(), Arc<dyn Condition>> {
        self.condition.set(condition)
    }

    /// `Ok`: ready to be counted on (`/readyz`); `Err`: why not, the most specific cause
    /// first (a Kafka outage also raises the slot alarm: the outage is what to fix). A hot
    /// standby is ready: it is healthy and must not hold up a rolling update
    /// ([`Health::standby`] says it is one).
    pub fn readiness(&self) -> Result<(), String> {
        if let Some(error) = self.halted() {
            return Err(format!("halted: {error}"));
        }
        if self.standby.lock().unwrap_or_else(std::sync::PoisonError::into_inner).is_some() {
            return Ok(());
        }
        if !self.is_streaming() {
            return Err("not streaming".into());
        }
        if let Some(condition) = self.condition.get() {
            condition.check()?;
        }
        let waited = self.unacknowledged_for();
        if waited >= self.unready_after {
            return Err(format!("Kafka has acknowledged nothing for {} s while records wait", waited.as_secs()));
        }
        if self.alarm() == AlarmLevel::Critical {
            return Err(
                "slot alarm critical (its reasons are in the log's slot alarm line and in walpost slot status)".into(),
            );
        }
        Ok(())
    }

    /// `Ok`: the process is alive (`/healthz`); `Err`: its pipeline runtime is stuck.
    pub fn liveness(&self) -> Result<(), String> {
        let since = Duration::from_millis(self.now().saturating_sub(self.beat.load(Ordering::Relaxed)));
        if since >= self.dead_after {
            return Err(format!("the pipeline's runtime has not run for {} s", since.as_secs()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_needs_streaming_no_critical_alarm_and_acknowledgements() {
        let h = Health::new(Duration::from_millis(50), Duration::from_secs(60));
        assert_eq!(h.readiness(), Err("not streaming".into()));
        h.set_streaming(true);
        assert_eq!(h.readiness(), Ok(()));
        h.set_alarm(AlarmLevel::Warning);
        assert_eq!(h.readiness(), Ok(()));
        h.set_alarm(AlarmLevel::Critical);
        assert!(h.readiness().is_err());
        h.set_alarm(AlarmLevel::Ok);
        h.set_waiting_for_acks(Some(Instant::now()));
        assert_eq!(h.readiness(), Ok(()), "waiting, but not long");
        std::thread::sleep(Duration::from_millis(60));
        assert!(h.readiness().unwrap_err().contains("acknowledged nothing"));
        assert!(h.unacknowledged_for() >= Duration::from_millis(50));
        h.set_waiting_for_acks(None);
        assert_eq!(h.readiness(), Ok(()));
        assert_eq!(h.unacknowledged_for(), Duration::ZERO);
    }

    #[test]
    fn a_hot_standby_is_ready_until_halted() {
        let h = Health::new(Duration::from_millis(50), Duration::from_secs(60));
        h.set_standby(Some("server process 42".into()));
        assert_eq!(h.readiness(), Ok(()), "not streaming, but a standby");
        assert_eq!(h.standby().as_deref(), Some("server process 42"));
        h.set_standby(None);
        assert_eq!(h.readiness(), Err("not streaming".into()));
        h.set_standby(Some("server process 42".into()));
        h.set_halted("stopped".into());
        assert!(h.readiness().unwrap_err().starts_with("halted"));
    }

    /// A producer restart during an outage: the new window's records wait on the old
    /// clock, so readiness does not come back while Kafka stays silent.
    #[test]
    fn the_silence_clock_survives_a_producer_restart_and_stops_on_progress() {
        let h = Health::new(Duration::from_millis(50), Duration::from_secs(60));
        h.set_streaming(true);
        h.waiting_for_acks();
        std::thread::sleep(Duration::from_millis(60));
        h.waiting_for_acks();
        assert!(h.readiness().is_err(), "a second window waiting does not restart the clock");
        h.kafka_progress(true);
        assert_eq!(h.readiness(), Ok(()), "an acknowledgement restarts it");
        h.kafka_progress(false);
        assert_eq!(h.unacknowledged_for(), Duration::ZERO);
    }

    #[derive(Debug)]
    struct Refusing;
    impl Condition for Refusing {
        fn check(&self) -> Result<(), String> {
            Err("the mode says no".into())
        }
    }

    #[test]
    fn a_modes_condition_is_asked_after_streaming_and_only_one_is_taken() {
        let h = Health::new(Duration::from_secs(30), Duration::from_secs(60));
        h.set_streaming(true);
        assert_eq!(h.readiness(), Ok(()), "no condition: ready");
        assert!(h.add_condition(Arc::new(Refusing)).is_ok());
        assert_eq!(h.readiness(), Err("the mode says no".into()));
        assert!(h.add_condition(Arc::new(Refusing)).is_err(), "a second condition is refused");
        h.set_streaming(false);
        assert_eq!(h.readiness(), Err("not streaming".into()), "the common conditions come first");
    }

    #[test]
    fn liveness_follows_the_beat() {
        let h = Health::new(Duration::from_secs(30), Duration::from_millis(40));
        assert_eq!(h.liveness(), Ok(()));
        std::thread::sleep(Duration::from_millis(50));
        assert!(h.liveness().is_err());
        h.beat();
        assert_eq!(h.liveness(), Ok(()));
    }
}
