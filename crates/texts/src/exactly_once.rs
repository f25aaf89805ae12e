//! `--delivery exactly-once`: the progress topic, its signing key, transactions.

use std::fmt::Display;

use crate::runbook::EXACTLY_ONCE;

/// At start: the last progress record is behind the slot (a warning; the stream resumes
/// from the slot). Quoted in runbooks/exactly-once.md.
pub const PROGRESS_BEHIND_THE_SLOT: &str = "the progress topic is behind the slot's confirmed position (it was deleted, truncated or compacted away); resuming from the slot: events committed to Kafka after the progress position may be published a second time (see runbooks/exactly-once.md)";

/// Decoding on a standby without a reachable primary: the progress key (kept on the
/// primary) cannot be read, so this session's records are not signed.
pub fn progress_unsigned_without_the_primary(slot: &str) -> String {
    format!(
        "decoding on a standby without a reachable primary: exactly-once progress records of slot {slot} are not signed this session ({EXACTLY_ONCE})"
    )
}

/// The progress key kept for `slot` is not a key walpost can use.
pub fn progress_key_unreadable(slot: &str) -> String {
    format!("the progress key kept for slot {slot} is not readable: progress records are not signed ({EXACTLY_ONCE})")
}

/// The progress key cannot be kept in the lineage table `table` (`error`): records are
/// not signed.
pub fn progress_key_not_kept(table: &str, error: &str) -> String {
    format!(
        "cannot keep the exactly-once progress key in {table} ({error}): progress records are not signed, so any client that can write the progress topic can make walpost skip events; apply migrations/outbox/0003_walpost_slots.sql (or grant walpost ownership of {table}) and restrict writes to the progress topic ({EXACTLY_ONCE})"
    )
}

/// The fatal error for a progress record walpost did not write (`why`: one of the
/// `FORGED_*` reasons, or [`forged_ahead_of_wal`]). Quoted in runbooks/exactly-once.md.
pub fn forged(topic: &str, key: &str, why: &str) -> String {
    format!(
        "the progress topic {topic} holds a record for {key} that walpost did not write ({why}): some other client produced to the progress topic, and trusting it would skip events, so walpost stopped; follow {EXACTLY_ONCE} (restrict writes to {topic} with Kafka ACLs, then delete its records and restart: walpost resumes from the slot's confirmed position)"
    )
}

/// Why a record is [`forged`]: its signature is another key's.
pub const FORGED_SIGNATURE_MISMATCH: &str = "its signature does not match the key kept in the slot's lineage table";

/// Why a record is [`forged`]: it is not signed, and a key was kept before it.
pub const FORGED_UNSIGNED: &str = "it carries no signature, and walpost signs every progress record it writes";

/// Why a record is [`forged`]: its position is past the end of the server's WAL.
pub fn forged_ahead_of_wal(position: &impl Display, wal_end: &impl Display) -> String {
    format!("its position {position} is ahead of the server's WAL, which ends at {wal_end}")
}

/// The fatal error for a progress record of the same names from another cluster
/// (`theirs` and `ours`: system identifiers). Quoted in runbooks/exactly-once.md.
pub fn another_cluster(topic: &str, key: &str, theirs: &str, ours: &str) -> String {
    format!(
        "the progress topic {topic} holds a record for {key} from another PostgreSQL cluster (system identifier {theirs}, this one is {ours}): the cluster was restored or replaced, so that position means nothing here; follow {EXACTLY_ONCE} (delete the record, or use another progress_topic)"
    )
}

/// The fatal error for brokers that refuse transactions (`error`: the client's).
/// Quoted in runbooks/exactly-once.md.
pub fn brokers_refuse_transactions(error: &impl Display) -> String {
    format!(
        "the Kafka brokers refuse transactions ({error}): --delivery exactly-once needs Kafka 0.11+ with transactions enabled (transaction.state.log.* set for the cluster) and, with ACLs, WRITE and DESCRIBE on the transactional id walpost-*; or use --delivery at-least-once (see {EXACTLY_ONCE})"
    )
}

/// The fatal error of an instance fenced by another. Quoted in runbooks/exactly-once.md.
pub const FENCED: &str = "another walpost instance took over this slot's Kafka transactional id and fenced this one: this instance stops without committing anything more (see runbooks/exactly-once.md)";

/// `walpost check`: how to keep other clients from writing the progress topic.
pub fn check_progress_acl(topic: &str) -> String {
    format!(
        "allow only walpost's principal to write it: kafka-acls.sh --bootstrap-server <brokers> --add --allow-principal User:<walpost principal> --operation Write --topic {topic} ({EXACTLY_ONCE})"
    )
}

/// `walpost check`: progress records in `topic` are signed with the key kept in
/// `table`; `acl` is [`check_progress_acl`].
pub fn check_progress_signed(topic: &str, table: &str, acl: &str) -> String {
    format!("exactly-once: progress records in {topic} are signed with the key kept in {table}; {acl}")
}

/// `walpost check`: the lineage table cannot keep the key; `acl` is
/// [`check_progress_acl`].
pub fn check_progress_unsignable(topic: &str, table: &str, acl: &str) -> String {
    format!(
        "exactly-once: {table} is missing or not writable, so progress records in {topic} cannot be signed and a record any client produces there could make walpost skip events: apply migrations/outbox/0003_walpost_slots.sql (walpost migrate) and grant walpost SELECT, INSERT, UPDATE, DELETE on it; {acl}"
    )
}
