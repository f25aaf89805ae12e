//! The replication slot: lost, dropped, conflicted, held by another process.

use crate::runbook::{SLOT_LOST, STANDBY};

/// Where walpost first streamed from a slot (its lineage record).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Origin<'a> {
    /// The server's system identifier.
    pub system_id: &'a str,
    pub timeline: u32,
    /// When the slot was created, as PostgreSQL prints it; `None` when only the
    /// running process remembers.
    pub created_at: Option<&'a str>,
}

/// The fatal error for a slot walpost streamed from that no longer exists.
/// `table`: where the lineage is recorded. Quoted in runbooks/slot-lost.md.
pub fn missing(
    slot: &str,
    host: &impl std::fmt::Display,
    origin: Origin<'_>,
    timeline_now: u32,
    table: &str,
) -> String {
    let since = origin.created_at.map(|t| format!(" since {t}")).unwrap_or_default();
    format!(
        "replication slot \"{slot}\" does not exist on {host}, but walpost streamed from it{since} (system {}, timeline {}; the server is on timeline {timeline_now} now): it was dropped, or lost in a failover to a server that did not have it (PostgreSQL before 17, or a standby without slot synchronization); a new slot would silently skip every event committed since the old one's confirmed position, so walpost does not create one: follow {SLOT_LOST} (republish the gap: walpost run --snapshot when_needed with a --snapshot-filter covering it; or accept the gap: DELETE FROM {table} WHERE slot = '{slot}')",
        origin.system_id, origin.timeline
    )
}

/// `walpost slot status` for a slot that does not exist and that walpost has no record
/// of streaming from. Quoted in runbooks/slot-lost.md.
pub fn never_streamed(slot: &str, table: &str) -> String {
    format!(
        "replication slot \"{slot}\" does not exist, and {table} has no record of walpost streaming from it: walpost run creates it (--snapshot initial also publishes the rows already in the outbox), or walpost slot create"
    )
}

/// `walpost slot status` for a slot that does not exist when the lineage table is
/// missing or unreadable (`why`). Quoted in runbooks/slot-lost.md.
pub fn lineage_unknown(slot: &str, table: &str, why: &str) -> String {
    format!(
        "replication slot \"{slot}\" does not exist, and whether walpost streamed from it is unknown ({table} {why}): if it did, events committed since its confirmed position are not in Kafka and a new slot would skip them (follow {SLOT_LOST}); if it never did, walpost run or walpost slot create makes it"
    )
}

/// The fatal error for an invalidated slot. Quoted in runbooks/slot-lost.md.
pub fn lost(slot: &str) -> String {
    format!(
        "replication slot \"{slot}\" was invalidated (wal_status = lost): PostgreSQL removed WAL it still needed, so events committed since its confirmed position may never reach Kafka; follow {SLOT_LOST}"
    )
}

/// The fatal error for a slot on a standby that a recovery conflict invalidated
/// (`reason`: `invalidation_reason` on PostgreSQL 17+, else what `conflicting` means).
/// Quoted in runbooks/standby-decoding.md.
pub fn conflicted(slot: &str, reason: Option<&str>) -> String {
    let why = match reason {
        Some("wal_level_insufficient") => {
            "the primary's wal_level is no longer logical (invalidation_reason = wal_level_insufficient)".to_owned()
        }
        Some(r) => format!("the primary removed catalog rows the slot still needed (invalidation_reason = {r})"),
        None => "the primary removed catalog rows the slot still needed (conflicting = true)".to_owned(),
    };
    format!(
        "replication slot \"{slot}\" on this standby was invalidated by a recovery conflict: {why}, so events committed since its confirmed position can no longer be decoded from it; keep hot_standby_feedback = on with a physical slot (primary_slot_name) between the standby and the primary, and follow {STANDBY} (its step 3 republishes the gap with the service's configuration: walpost run --config <config> --snapshot when_needed with a --snapshot-filter covering it)"
    )
}

/// The transient error for a slot another process streams from (a hot standby waits).
pub fn in_use(slot: &str, pid: i32) -> String {
    format!(
        "replication slot \"{slot}\" is in use by server process {pid} (another walpost instance?); waiting for it to be released"
    )
}

/// Logged once per holder by a hot standby (`client`: the holder's address, if the
/// server shows it). Quoted in docs/kubernetes.md and runbooks/slot-wal-buildup.md.
pub fn held_by(slot: &str, pid: i32, client: Option<&str>) -> String {
    let from = client.map(|c| format!(" for a client at {c}")).unwrap_or_default();
    format!(
        "replication slot \"{slot}\" is in use by server process {pid}{from} (another walpost instance?): this instance is a hot standby and takes over when the slot is released"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_slot_says_since_when_only_when_known() {
        let origin = Origin { system_id: "74", timeline: 1, created_at: Some("2026-11-30 09:12:44+00") };
        let known = missing("walpost", &"pg-b:5432", origin, 2, "events.walpost_slots");
        assert!(known.contains("streamed from it since 2026-11-30 09:12:44+00 (system 74, timeline 1;"), "{known}");
        let unknown = missing("walpost", &"pg-b:5432", Origin { created_at: None, ..origin }, 2, "t");
        assert!(unknown.contains("streamed from it (system 74, timeline 1; the server is on timeline 2 now)"));
    }

    #[test]
    fn a_conflict_names_its_reason() {
        assert!(conflicted("s", Some("rows_removed")).contains("(invalidation_reason = rows_removed)"));
        assert!(conflicted("s", None).contains("(conflicting = true)"));
        assert!(conflicted("s", Some("wal_level_insufficient")).contains("wal_level is no longer logical"));
    }
}
