//! The slot alarm's reasons that tell the operator what to do, and `[monitor]`
//! thresholds that cannot fire.

use crate::runbook::{KAFKA_OUTAGE, LONG_TRANSACTION, SLOT_WAL_BUILDUP};

/// A byte threshold (`key = value`) at or above `max_slot_wal_keep_size` (`keep`).
pub fn threshold_unreachable(key: &str, value: u64, keep: u64) -> String {
    format!(
        "[monitor] {key} = {value} is at or above max_slot_wal_keep_size ({keep} bytes): PostgreSQL invalidates the slot before this alarm can fire; remove it (walpost then uses fractions of max_slot_wal_keep_size) or lower it"
    )
}

/// `wal_status = unreserved`.
pub const UNRESERVED: &str = "wal_status is unreserved: the next checkpoint may remove WAL the slot needs; do not run CHECKPOINT, raise max_slot_wal_keep_size first";

/// Nobody streams from the slot. Quoted in runbooks/slot-wal-buildup.md.
pub fn no_process_streams() -> String {
    format!("no process streams from the slot: it keeps WAL until walpost runs again (see {SLOT_WAL_BUILDUP})")
}

/// Why the confirmed position is stalled: Kafka acknowledged nothing for `secs`.
/// Quoted in runbooks/kafka-outage.md.
pub fn kafka_silent(secs: f64) -> String {
    format!("Kafka has acknowledged nothing for {secs:.0} s while records wait (see {KAFKA_OUTAGE})")
}

/// A transaction upstream that logical decoding cannot pass. Quoted in
/// runbooks/long-transaction.md.
pub fn long_transaction(pid: i64, application_name: &str, client: &str, age_secs: f64) -> String {
    format!(
        "transaction of server pid {pid} (application_name '{application_name}', client {client}) has been open for {age_secs:.0} s and has written WAL: logical decoding cannot pass it (see {LONG_TRANSACTION})"
    )
}

/// The runbook appended to an alarm line whose reasons name none.
pub fn see_wal_buildup() -> String {
    format!(" (see {SLOT_WAL_BUILDUP})")
}
