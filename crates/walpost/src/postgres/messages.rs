//! Operator-facing texts about PostgreSQL state. Each is quoted verbatim in the runbook
//! it names (checked by `tests/runbooks.rs`), so change both together.

use super::lineage::Origin;
use super::sql::ident;
use crate::settings::TableName;

/// The runbook a lost slot points to.
pub const SLOT_LOST_RUNBOOK: &str = "runbooks/slot-lost.md";
/// The runbook of decoding on a standby: a slot a recovery conflict invalidated.
pub const STANDBY_RUNBOOK: &str = "runbooks/standby-decoding.md";
/// The runbook an outbox table that stopped being streamed points to.
pub const OUTBOX_CHANGED_RUNBOOK: &str = "runbooks/outbox-recreated.md";

/// The fatal error for a slot walpost streamed from that no longer exists (see
/// `postgres::lineage`). `table`: where the lineage is recorded.
pub fn slot_missing_message(
    slot: &str,
    host: &impl std::fmt::Display,
    origin: &Origin,
    timeline_now: u32,
    table: &str,
) -> String {
    let since = origin.created_at.as_deref().map(|t| format!(" since {t}")).unwrap_or_default();
    format!(
        "replication slot \"{slot}\" does not exist on {host}, but walpost streamed from it{since} (system {}, timeline {}; the server is on timeline {timeline_now} now): it was dropped, or lost in a failover to a server that did not have it (PostgreSQL before 17, or a standby without slot synchronization); a new slot would silently skip every event committed since the old one's confirmed position, so walpost does not create one: follow {SLOT_LOST_RUNBOOK} (republish the gap: walpost run --snapshot when_needed with a --snapshot-filter covering it; or accept the gap: DELETE FROM {table} WHERE slot = '{slot}')",
        origin.system_id, origin.timeline
    )
}

/// `walpost slot status` for a slot that does not exist and that walpost has no record
/// of streaming from.
pub fn slot_never_streamed(slot: &str, table: &str) -> String {
    format!(
        "replication slot \"{slot}\" does not exist, and {table} has no record of walpost streaming from it: walpost run creates it (--snapshot initial also publishes the rows already in the outbox), or walpost slot create"
    )
}

/// `walpost slot status` for a slot that does not exist when the lineage table is
/// missing or unreadable (`why`).
pub fn slot_lineage_unknown(slot: &str, table: &str, why: &str) -> String {
    format!(
        "replication slot \"{slot}\" does not exist, and whether walpost streamed from it is unknown ({table} {why}): if it did, events committed since its confirmed position are not in Kafka and a new slot would skip them (follow {SLOT_LOST_RUNBOOK}); if it never did, walpost run or walpost slot create makes it"
    )
}

/// The fatal error for an invalidated slot.
pub fn slot_lost_message(slot: &str) -> String {
    format!(
        "replication slot \"{slot}\" was invalidated (wal_status = lost): PostgreSQL removed WAL it still needed, so events committed since its confirmed position may never reach Kafka; follow {SLOT_LOST_RUNBOOK}"
    )
}

/// The fatal error for a slot on a standby that a recovery conflict invalidated
/// (`reason`: `invalidation_reason` on PostgreSQL 17+, else what `conflicting` means).
pub fn slot_conflicted_message(slot: &str, reason: Option<&str>) -> String {
    let why = match reason {
        Some("wal_level_insufficient") => {
            "the primary's wal_level is no longer logical (invalidation_reason = wal_level_insufficient)".to_owned()
        }
        Some(r) => format!("the primary removed catalog rows the slot still needed (invalidation_reason = {r})"),
        None => "the primary removed catalog rows the slot still needed (conflicting = true)".to_owned(),
    };
    format!(
        "replication slot \"{slot}\" on this standby was invalidated by a recovery conflict: {why}, so events committed since its confirmed position can no longer be decoded from it; keep hot_standby_feedback = on with a physical slot (primary_slot_name) between the standby and the primary, and follow {STANDBY_RUNBOOK} (its step 3 republishes the gap with the service's configuration: walpost run --config <config> --snapshot when_needed with a --snapshot-filter covering it)"
    )
}

/// The fatal error for an outbox table that stopped being streamed while walpost ran;
/// `why` is what the check found (the table is gone, or the publication check's own
/// error).
pub fn outbox_changed_message(why: &str) -> String {
    format!(
        "{why}; this changed while walpost was streaming, and rows written since then are not in the replication stream (the slot may be confirmed past them), so walpost stopped: put the table back in the publication, backfill its rows with `walpost run --snapshot initial_only`, then restart walpost; follow {OUTBOX_CHANGED_RUNBOOK}"
    )
}

/// The `why` of [`outbox_changed_message`] for a dropped table.
pub fn outbox_dropped(table: &TableName) -> String {
    format!("outbox table {table} no longer exists")
}

/// The error for a publication that exists without the outbox table in it.
pub fn publication_lacks_table(publication: &str, table: &TableName) -> String {
    format!(
        "publication \"{publication}\" exists but does not include {table}: run ALTER PUBLICATION {} ADD TABLE {}, or choose another --publication",
        ident(publication),
        table.quoted()
    )
}

/// The runbook about replays (and who may ask for one with a signal row).
pub const REPLAY_RUNBOOK: &str = "runbooks/replay.md";

/// `walpost replay --where` outside the condition grammar.
pub fn replay_where_refused(e: &condition::ConditionError) -> String {
    format!(
        "replay: --where is not a condition walpost runs ({e}); nothing was published: compare columns with constants (=, <>, <, >, IN, BETWEEN, IS NULL, LIKE, AND, OR, NOT), or pass --unsafe-where to run any SQL expression as walpost's role"
    )
}

/// The fatal error for a signal table PUBLIC may write.
pub fn signal_table_public(table: &TableName) -> String {
    let t = table.quoted();
    format!(
        "signal table {table} can be written by PUBLIC (INSERT), so any role that can log in can make walpost replay outbox rows: as its owner run REVOKE INSERT ON {t} FROM PUBLIC; GRANT INSERT ON {t} TO <operator role>; and list that role in [signal] allowed_roles (or set [signal] trust_all_roles = true to accept every role); see {REPLAY_RUNBOOK}"
    )
}

/// The fatal error for roles outside `[signal] allowed_roles` that may write the signal
/// table.
pub fn signal_table_roles(table: &TableName, roles: &[&str]) -> String {
    let t = table.quoted();
    let idents: Vec<String> = roles.iter().map(|r| ident(r)).collect();
    format!(
        "roles {} can INSERT into signal table {table} and so make walpost replay outbox rows, but are not in [signal] allowed_roles: add them there if they may, or run REVOKE INSERT ON {t} FROM {}; see {REPLAY_RUNBOOK}",
        roles.join(", "),
        idents.join(", ")
    )
}

/// The transient error for a slot another process streams from (a hot standby waits).
pub fn slot_in_use(slot: &str, pid: i32) -> String {
    format!(
        "replication slot \"{slot}\" is in use by server process {pid} (another walpost instance?); waiting for it to be released"
    )
}
/// Decoding on a standby, at start, when the primary cannot be reached (`error`).
pub fn standby_without_primary(error: &str) -> String {
    format!(
        "decoding on a standby without a reachable primary ({error}): the slot's lineage record and the exactly-once progress key are not written, so a slot lost with this standby is detected only while this process runs ({STANDBY_RUNBOOK})"
    )
}

/// The fatal error when `target_session_attrs=standby` has found no standby for `secs`
/// seconds (`pipeline.no_standby_timeout_secs`): `hosts` answered as primaries or not
/// at all, so the decoding standby was most likely promoted.
pub fn no_standby_found(hosts: &str, secs: u64) -> String {
    format!(
        "target_session_attrs=standby has found no standby for {secs} s ({hosts}: a primary, or no answer): the standby walpost decodes on was most likely promoted; walpost stops instead of waiting for a standby that will not come. To go on decoding on the promoted server, set target_session_attrs=prefer-standby in --postgres (a standby when one answers, else the primary) and list the new primary in --postgres-primary, then start walpost again (see {STANDBY_RUNBOOK})"
    )
}

/// Slot creation on a standby waits, and walpost may not call `pg_log_standby_snapshot()`.
pub const SLOT_CREATION_WAITS_FOR_A_GRANT: &str = "creating the slot on a standby waits for a running-transactions record from the primary, within 15 s (walpost may not call pg_log_standby_snapshot(): GRANT EXECUTE ON FUNCTION pg_log_standby_snapshot() TO walpost's role to make it immediate)";

/// Slot creation on a standby waits, and the primary cannot be reached (`error`).
pub fn slot_creation_waits_for_the_primary(error: &str) -> String {
    format!(
        "creating the slot on a standby waits for a running-transactions record from the primary, which it writes on its own within 15 s of other WAL or at its next checkpoint; walpost cannot ask for one ({error})"
    )
}

/// A side feature (`feature`) that writes on the primary is off while decoding on a
/// standby without a reachable primary.
pub fn primary_feature_off(feature: &str, consequence: &str, error: &str) -> String {
    format!("decoding on a standby: {feature} is off while the primary cannot be reached ({error}); {consequence}")
}

/// Something the session cannot do without the primary (`what`), decoding on a standby.
pub fn needs_the_primary(what: &str, error: &str) -> String {
    format!("decoding on a standby, {what} is written on the primary, which cannot be reached: {error}")
}

/// A missing publication, decoding on a standby without a reachable primary.
pub fn publication_needs_the_primary(publication: &str, error: &str, create: &str) -> String {
    format!(
        "publication \"{publication}\" does not exist, and decoding on a standby walpost creates it on the primary, which cannot be reached ({error}); or create it there yourself: {create}"
    )
}

/// The runbook of `--delivery exactly-once`.
pub const EXACTLY_ONCE_RUNBOOK: &str = "runbooks/exactly-once.md";

/// Exactly-once, at start: the last progress record is behind the slot (a warning; the
/// stream resumes from the slot).
pub const PROGRESS_BEHIND_THE_SLOT: &str = "the progress topic is behind the slot's confirmed position (it was deleted, truncated or compacted away); resuming from the slot: events committed to Kafka after the progress position may be published a second time (see runbooks/exactly-once.md)";

/// Exactly-once, decoding on a standby without a reachable primary: the progress key
/// (kept on the primary) cannot be read, so this session's records are not signed.
pub fn progress_unsigned_without_the_primary(slot: &str) -> String {
    format!(
        "decoding on a standby without a reachable primary: exactly-once progress records of slot {slot} are not signed this session ({EXACTLY_ONCE_RUNBOOK})"
    )
}

/// Exactly-once: the progress key kept for `slot` is not a key walpost can use.
pub fn progress_key_unreadable(slot: &str) -> String {
    format!(
        "the progress key kept for slot {slot} is not readable: progress records are not signed ({EXACTLY_ONCE_RUNBOOK})"
    )
}
