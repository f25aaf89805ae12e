//! `walpost check`'s warnings about the server's settings.

/// `max_slot_wal_keep_size = -1`.
pub const UNLIMITED_WAL_KEEP: &str = "max_slot_wal_keep_size = -1 (unlimited): a stalled slot can fill the disk; set a finite value (see runbooks/slot-wal-buildup.md)";

/// `idle_in_transaction_session_timeout = 0`.
pub const NO_IDLE_TRANSACTION_TIMEOUT: &str = "idle_in_transaction_session_timeout = 0: a forgotten open transaction stalls logical decoding forever (see runbooks/long-transaction.md)";

/// The role cannot see other roles' open transactions.
pub const SESSIONS_HIDDEN: &str = "the role cannot see other roles' open transactions (pg_stat_activity.xact_start): the long-transaction alarm stays silent for them; GRANT pg_read_all_stats TO the role (see docs/least-privilege.md, runbooks/long-transaction.md)";
