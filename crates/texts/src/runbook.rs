//! The runbooks the texts point to, by their path from the repository's root.

/// A slot that was invalidated, dropped or lost in a failover.
pub const SLOT_LOST: &str = "runbooks/slot-lost.md";
/// Decoding on a standby: a slot a recovery conflict invalidated, a missing primary.
pub const STANDBY: &str = "runbooks/standby-decoding.md";
/// An outbox table that stopped being streamed.
pub const OUTBOX_CHANGED: &str = "runbooks/outbox-recreated.md";
/// Replays and backfills (and who may ask for one with a signal row).
pub const REPLAY: &str = "runbooks/replay.md";
/// `--delivery exactly-once`.
pub const EXACTLY_ONCE: &str = "runbooks/exactly-once.md";
/// Major upgrades and failovers of PostgreSQL.
pub const UPGRADE_AND_FAILOVER: &str = "runbooks/upgrade-and-failover.md";
/// A record Kafka will never take.
pub const POISON_RECORD: &str = "runbooks/poison-record.md";
/// Kafka's durability and maintenance.
pub const KAFKA_MAINTENANCE: &str = "runbooks/kafka-maintenance.md";
/// Kafka that acknowledges nothing.
pub const KAFKA_OUTAGE: &str = "runbooks/kafka-outage.md";
/// WAL a slot keeps.
pub const SLOT_WAL_BUILDUP: &str = "runbooks/slot-wal-buildup.md";
/// A long transaction upstream that logical decoding cannot pass.
pub const LONG_TRANSACTION: &str = "runbooks/long-transaction.md";
