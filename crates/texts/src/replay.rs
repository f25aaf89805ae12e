//! Replays and backfills: the `--where` grammar, who may ask for a replay with a signal
//! row, and where a halted backfill resumes.

use std::fmt::Display;

use crate::runbook::REPLAY;

/// `walpost replay --where` outside the condition grammar (`error`: where and why).
pub fn where_refused(error: &impl Display) -> String {
    format!(
        "replay: --where is not a condition walpost runs ({error}); nothing was published: compare columns with constants (=, <>, <, >, IN, BETWEEN, IS NULL, LIKE, AND, OR, NOT), or pass --unsafe-where to run any SQL expression as walpost's role"
    )
}

/// The fatal error for a signal table PUBLIC may write: `table` as `schema.name`, and
/// quoted for the statements. Quoted in runbooks/replay.md.
pub fn signal_table_public(table: &impl Display, table_quoted: &str) -> String {
    let t = table_quoted;
    format!(
        "signal table {table} can be written by PUBLIC (INSERT), so any role that can log in can make walpost replay outbox rows: as its owner run REVOKE INSERT ON {t} FROM PUBLIC; GRANT INSERT ON {t} TO <operator role>; and list that role in [signal] allowed_roles (or set [signal] trust_all_roles = true to accept every role); see {REPLAY}"
    )
}

/// The fatal error for roles outside `[signal] allowed_roles` that may write the signal
/// table: `roles` as names, `role_idents` the same roles quoted for the statement.
/// Quoted in runbooks/replay.md.
pub fn signal_table_roles(table: &impl Display, table_quoted: &str, roles: &[&str], role_idents: &[String]) -> String {
    let t = table_quoted;
    format!(
        "roles {} can INSERT into signal table {table} and so make walpost replay outbox rows, but are not in [signal] allowed_roles: add them there if they may, or run REVOKE INSERT ON {t} FROM {}; see {REPLAY}",
        roles.join(", "),
        role_idents.join(", ")
    )
}

/// The text appended to a backfill's halt: where to resume. `id` is the lowest row
/// (in the cursor's id order) Kafka has not acknowledged; `filter` selects it and every
/// row after it. Quoted in runbooks/replay.md.
pub fn backfill_resume_hint(id: &str, filter: &str) -> String {
    format!(
        "every row before id={id} is in Kafka: once fixed, run the same backfill with --snapshot-filter \"{filter}\" to resume instead of starting over (see {REPLAY})"
    )
}

/// The text appended to a replay's halt (its filter holds bind parameters, not text to
/// paste): `condition` selects the row `id` and every row after it.
pub fn replay_resume_hint(id: &str, condition: &str) -> String {
    format!(
        "every row before id={id} is in Kafka: once fixed, run the same replay with {condition} joined to its --where by AND to resume instead of starting over (see {REPLAY})"
    )
}

/// A snapshot's halt on a record Kafka will never take (without dead letters): the
/// rejection's parts, then `then` ([`SNAPSHOT_STARTS_OVER`], or nothing for a backfill,
/// whose halt goes on with [`backfill_resume_hint`]). Quoted in runbooks/replay.md.
pub fn snapshot_rejected(event_id: &str, topic: &str, code: &str, error: &str, fix: &str, then: &str) -> String {
    format!("Kafka rejected snapshot event id={event_id} for topic {topic} permanently ({code}: {error}): {fix}{then}")
}

/// The `then` of [`snapshot_rejected`] for a snapshot that streaming follows.
pub const SNAPSHOT_STARTS_OVER: &str = ", then restart walpost; the snapshot starts over";

/// `POST /api/v1/replays` with a `where` outside the condition grammar (`error`: where
/// and why); [`API_WHERE_HINT`] says what to do.
pub fn api_where_refused(error: &impl Display) -> String {
    format!("where is not a condition walpost runs ({error}); no replay was started")
}

/// The hint of [`api_where_refused`].
pub const API_WHERE_HINT: &str = "compare columns with constants (=, <>, <, >, IN, BETWEEN, IS NULL, LIKE, AND, OR, NOT), e.g. {\"where\": \"aggregate_type = 'order'\"}; any SQL expression runs only from a shell, with walpost replay --unsafe-where";

/// `POST /api/v1/replays` with `unsafe_where`.
pub const API_UNSAFE_WHERE: &str =
    "unsafe_where is not offered over the admin API: a token must not run SQL as walpost's role";

/// The hint of [`API_UNSAFE_WHERE`].
pub const API_UNSAFE_WHERE_HINT: &str = "write where in the condition grammar (columns compared with constants), or run walpost replay --unsafe-where from a shell that holds the database's credentials";
