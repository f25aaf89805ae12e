//! `walpost inbox`'s own condition for `/readyz`, beside the common ones of
//! [`service::telemetry::Health`]: its PostgreSQL answers, and it holds partitions when
//! its group has any (a group whose offsets are stored for none is still empty).

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Mutex;

use service::telemetry::Condition;

/// Fed by the inbox's metrics (librdkafka's statistics, the handler statistics' reader).
#[derive(Debug)]
pub(crate) struct Readiness {
    /// Why the inbox's PostgreSQL could not be read at the last try (`None`: it answered,
    /// or it was not tried yet).
    postgres_error: Mutex<Option<String>>,
    /// Partitions the group assigned to this instance (-1: not known yet).
    assigned: AtomicI64,
    /// Partitions the group has stored offsets for (-1: not known yet).
    group_partitions: AtomicI64,
}

impl Default for Readiness {
    fn default() -> Readiness {
        Readiness {
            postgres_error: Mutex::new(None),
            assigned: AtomicI64::new(-1),
            group_partitions: AtomicI64::new(-1),
        }
    }
}

impl Readiness {
    /// The group assigned `n` partitions to this instance.
    pub(crate) fn set_assigned(&self, n: i64) {
        self.assigned.store(n, Ordering::Relaxed);
    }

    /// The inbox's PostgreSQL answered (`Ok`: the partitions its group has stored offsets
    /// for) or did not (`Err`: why).
    pub(crate) fn set_postgres_probe(&self, probe: Result<i64, String>) {
        let error = match probe {
            Ok(n) => {
                self.group_partitions.store(n, Ordering::Relaxed);
                None
            }
            Err(e) => Some(e),
        };
        if let Ok(mut slot) = self.postgres_error.lock() {
            *slot = error;
        }
    }
}

impl Condition for Readiness {
    fn check(&self) -> Result<(), String> {
        if let Some(e) = self.postgres_error.lock().ok().and_then(|e| e.clone()) {
            return Err(format!("cannot read the inbox's PostgreSQL: {e}"));
        }
        let group = self.group_partitions.load(Ordering::Relaxed);
        if group > 0 && self.assigned.load(Ordering::Relaxed) <= 0 {
            return Err(format!(
                "holds no partition: the consumer group has stored offsets for {group} partitions and assigned none to this instance (yet)"
            ));
        }
        Ok(())
    }
}
