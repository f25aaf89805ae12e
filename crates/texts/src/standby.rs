//! Decoding on a standby: the primary out of reach, a promoted standby, and what
//! `walpost check` finds missing in the topology.

use crate::runbook::STANDBY;

/// Decoding on a standby, at start, when the primary cannot be reached (`error`).
/// Quoted in runbooks/standby-decoding.md, as are the other texts of this module that
/// the stream logs.
pub fn without_primary(error: &str) -> String {
    format!(
        "decoding on a standby without a reachable primary ({error}): the slot's lineage record and the exactly-once progress key are not written, so a slot lost with this standby is detected only while this process runs ({STANDBY})"
    )
}

/// The fatal error when `target_session_attrs=standby` has found no standby for `secs`
/// seconds (`pipeline.no_standby_timeout_secs`): `hosts` answered as primaries or not
/// at all, so the decoding standby was most likely promoted.
pub fn no_standby_found(hosts: &str, secs: u64) -> String {
    format!(
        "target_session_attrs=standby has found no standby for {secs} s ({hosts}: a primary, or no answer): the standby walpost decodes on was most likely promoted; walpost stops instead of waiting for a standby that will not come. To go on decoding on the promoted server, set target_session_attrs=prefer-standby in --postgres (a standby when one answers, else the primary) and list the new primary in --postgres-primary, then start walpost again (see {STANDBY})"
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

/// A missing publication, decoding on a standby without a reachable primary (`create`:
/// the statement that makes it).
pub fn publication_needs_the_primary(publication: &str, error: &str, create: &str) -> String {
    format!(
        "publication \"{publication}\" does not exist, and decoding on a standby walpost creates it on the primary, which cannot be reached ({error}); or create it there yourself: {create}"
    )
}

// `walpost check`'s findings, decoding on a standby.

/// `target_session_attrs` reached a primary.
pub const CHECK_ON_A_PRIMARY: &str = "standby decoding: target_session_attrs settled on a primary (prefer-standby finds no standby, or the standby was promoted): walpost decodes there";

/// The standby's PostgreSQL (`major`) cannot decode.
pub fn check_too_old(major: u32) -> String {
    format!(
        "standby decoding: the standby runs PostgreSQL {major}, and logical decoding on a standby needs 16 or later: upgrade it, or decode on the primary (target_session_attrs=primary)"
    )
}

/// `hot_standby_feedback` is off.
pub fn check_feedback_off() -> String {
    format!(
        "standby decoding: hot_standby_feedback is off, so VACUUM on the primary removes catalog rows the standby's slot needs and a recovery conflict invalidates it: ALTER SYSTEM SET hot_standby_feedback = on on the standby, then SELECT pg_reload_conf(); see {STANDBY}"
    )
}

/// The standby streams without a physical slot.
pub fn check_no_physical_slot() -> String {
    format!(
        "standby decoding: the standby streams without a physical slot (primary_slot_name is empty), so its feedback is forgotten whenever it disconnects and the primary may remove rows its logical slot needs: on the primary SELECT pg_create_physical_replication_slot('<name>', true), then on the standby ALTER SYSTEM SET primary_slot_name = '<name>' and SELECT pg_reload_conf(); see {STANDBY}"
    )
}

/// `max_standby_streaming_delay = -1`.
pub const CHECK_UNBOUNDED_DELAY: &str = "standby decoding: max_standby_streaming_delay = -1, so a query on the standby may hold replay back for ever, and walpost sees only replayed WAL: its events wait as long (set a bound, e.g. 30s, or keep long reports off this standby)";

/// The primary cannot be reached (`error`).
pub fn check_primary_unreachable(error: &str) -> String {
    format!(
        "standby decoding: the primary cannot be reached ({error}): the heartbeat, the slot's lineage record, retention and snapshot progress are off until it can; set --postgres-primary; see {STANDBY}"
    )
}

/// The primary (`host`) has a `wal_level` other than logical.
pub fn check_primary_wal_level(host: &str, wal_level: &str) -> String {
    format!(
        "standby decoding: the primary {host} has wal_level = {wal_level}, and a standby's logical slots need logical on the primary (they are invalidated otherwise): ALTER SYSTEM SET wal_level = logical on the primary and restart it"
    )
}

/// The standby's `primary_slot_name` names no physical slot on the primary (`host`).
pub fn check_primary_lacks_physical_slot(primary_slot_name: &str, host: &str) -> String {
    format!(
        "standby decoding: primary_slot_name is '{primary_slot_name}', but the primary {host} has no such physical slot, so the standby's feedback does not hold rows back: SELECT pg_create_physical_replication_slot('{primary_slot_name}', true) on the primary"
    )
}

/// walpost's role may not call `pg_log_standby_snapshot()` on the primary.
pub const CHECK_MAY_NOT_LOG_STANDBY_SNAPSHOT: &str = "standby decoding: walpost's role may not call pg_log_standby_snapshot() on the primary, so creating a slot on the standby waits for the primary's own running-transactions record (up to minutes on a quiet primary): GRANT EXECUTE ON FUNCTION pg_log_standby_snapshot() TO <walpost's role> on the primary";
