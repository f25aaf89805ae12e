//! `walpost check`'s failover findings: whether a promotion keeps the slot.

use crate::runbook::UPGRADE_AND_FAILOVER;

/// A host of the connection string did not answer (`error`).
pub fn host_unreachable(host: &str, error: &str) -> String {
    format!("failover: host {host} is not reachable ({error})")
}

/// `--slot-failover` with one host in the connection string.
pub fn one_host(host: &str) -> String {
    format!(
        "failover: the connection string names one host ({host}): after a promotion walpost reaches the new primary only if that name moves to it (DNS, a proxy); otherwise list every host (postgres://primary:5432,standby:5432/db)"
    )
}

/// The primary (`host`) runs PostgreSQL `major`, before failover slots.
pub fn primary_too_old(host: &str, major: u32, slot: &str) -> String {
    format!(
        "failover: the primary {host} runs PostgreSQL {major} (before 17, no failover slots): promoting a standby loses slot \"{slot}\", and walpost then stops; see {UPGRADE_AND_FAILOVER}"
    )
}

/// The slot exists and is not a failover slot.
pub fn not_a_failover_slot(slot: &str) -> String {
    format!(
        "failover: slot \"{slot}\" is not a failover slot, so no standby gets a copy and a promotion loses it: run ALTER_REPLICATION_SLOT {slot} (FAILOVER true) on a replication connection (psql \"dbname=<db> replication=database\") and pass --slot-failover; see {UPGRADE_AND_FAILOVER}"
    )
}

/// Standbys exist, the slot does not yet, and `--slot-failover` is not given.
pub fn pass_slot_failover() -> String {
    format!(
        "failover: pass --slot-failover so that the slot walpost creates is synchronized to the standbys; see {UPGRADE_AND_FAILOVER}"
    )
}

/// The primary does not wait for `standby`'s physical slot before walpost sees a commit.
pub fn standby_not_waited_for(standby: &str, primary_slot_name: &str) -> String {
    format!(
        "failover: the primary's synchronized_standby_slots does not list {primary_slot_name} (standby {standby}): walpost may confirm events that standby has not received, and after promoting it they are gone; on the primary: ALTER SYSTEM SET synchronized_standby_slots = '{primary_slot_name}'; SELECT pg_reload_conf()"
    )
}

/// A standby (`major`) before failover slots.
pub fn standby_too_old(standby: &str, major: u32, slot: &str) -> String {
    format!(
        "failover: standby {standby} runs PostgreSQL {major} (before 17): it cannot keep a copy of slot \"{slot}\"; promoting it loses the slot and walpost then stops; see {UPGRADE_AND_FAILOVER}"
    )
}

/// A standby lacks the settings of slot synchronization (`missing`, joined).
pub fn standby_not_synchronizing(standby: &str, missing: &str) -> String {
    format!(
        "failover: standby {standby} does not synchronize slots: set {missing} (and a dbname in primary_conninfo), then SELECT pg_reload_conf(); see {UPGRADE_AND_FAILOVER}"
    )
}

/// A standby has a slot of that name of its own.
pub fn standby_slot_not_synchronized(standby: &str, slot: &str) -> String {
    format!(
        "failover: standby {standby} has a slot \"{slot}\" that is not synchronized from the primary (created on the standby?): drop it there"
    )
}

/// A standby has no copy of the slot yet.
pub fn standby_has_no_copy(standby: &str, slot: &str) -> String {
    format!(
        "failover: standby {standby} has no copy of slot \"{slot}\" yet: the slot must be a failover slot, primary_conninfo must name a dbname, and the copy appears once the standby caught up with the slot's position"
    )
}
