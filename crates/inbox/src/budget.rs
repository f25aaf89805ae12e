//! The byte budget of the channel between the consumer thread and the ingest: records
//! in flight there hold their bytes (key, headers, value) of it, so what the channel
//! holds is bounded in bytes as well as in records, whatever the records' sizes.
//!
//! Invariants: the bytes held never exceed the budget, except by one record larger than
//! the whole budget, which then travels alone; a [`Held`] gives its bytes back when it
//! is dropped (the record was copied into a batch, or dropped), so no path leaks them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

/// How often a waiting [`ByteBudget::acquire`] looks at its stop flag.
const STOP_CHECK: Duration = Duration::from_millis(100);

/// Bytes shared by the records in flight (see the module docs).
#[derive(Debug)]
pub(crate) struct ByteBudget {
    limit: usize,
    used: Mutex<usize>,
    freed: Condvar,
}

/// Bytes taken from a [`ByteBudget`], given back on drop.
#[derive(Debug)]
pub(crate) struct Held {
    budget: Arc<ByteBudget>,
    bytes: usize,
}

impl ByteBudget {
    pub(crate) fn new(limit: usize) -> Arc<ByteBudget> {
        Arc::new(ByteBudget { limit: limit.max(1), used: Mutex::new(0), freed: Condvar::new() })
    }

    /// Takes `bytes`, waiting until they fit (a record larger than the whole budget fits
    /// once nothing else is held). `None`: `stop` was set while waiting.
    pub(crate) fn acquire(self: &Arc<Self>, bytes: usize, stop: &AtomicBool) -> Option<Held> {
        let bytes = bytes.min(self.limit);
        let mut used = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        while *used + bytes > self.limit {
            if stop.load(Ordering::Relaxed) {
                return None;
            }
            used = self.freed.wait_timeout(used, STOP_CHECK).unwrap_or_else(PoisonError::into_inner).0;
        }
        *used += bytes;
        Some(Held { budget: self.clone(), bytes })
    }

    /// Bytes held now.
    #[cfg(test)]
    pub(crate) fn used(&self) -> usize {
        *self.used.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut used = self.budget.used.lock().unwrap_or_else(PoisonError::into_inner);
        *used = used.saturating_sub(self.bytes);
        self.budget.freed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: the channel was bounded by records only, so 2,048 records with large
    /// keys held a gigabyte. Bytes are held until the record is dropped.
    #[test]
    fn regression_bytes_in_flight_never_exceed_the_budget() {
        let budget = ByteBudget::new(1000);
        let stop = AtomicBool::new(false);
        let a = budget.acquire(600, &stop).unwrap();
        assert_eq!(budget.used(), 600);
        // The next 600 do not fit: a thread waits until `a` is dropped.
        let waiter = {
            let budget = budget.clone();
            std::thread::spawn(move || {
                let stop = AtomicBool::new(false);
                let held = budget.acquire(600, &stop).unwrap();
                (budget.used(), held)
            })
        };
        std::thread::sleep(Duration::from_millis(300));
        assert!(!waiter.is_finished(), "600 + 600 bytes over a budget of 1000");
        drop(a);
        let (used, held) = waiter.join().unwrap();
        assert_eq!(used, 600);
        drop(held);
        assert_eq!(budget.used(), 0, "every byte given back");
        // A record larger than the whole budget goes alone.
        let big = budget.acquire(5000, &stop).unwrap();
        assert_eq!(budget.used(), 1000);
        stop.store(true, Ordering::Relaxed);
        assert!(budget.acquire(1, &stop).is_none(), "a stop ends the wait");
        drop(big);
        assert!(budget.acquire(1, &stop).is_some(), "it fits now: no wait, no stop check");
    }
}
