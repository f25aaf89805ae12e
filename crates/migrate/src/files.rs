//! The migration files, embedded at build time, and what each leaves in its schema (by
//! which a database migrated by hand, before `walpost migrate`, is recognised).
//!
//! Invariants:
//! - append-only: a file, once shipped, is never edited (its sha256 is recorded where it
//!   was applied, and a difference stops the runner); a change is a new, higher number;
//! - versions are 1, 2, 3, ... in file order, each file's name starts with its version
//!   (a unit test holds both).

use sha2::{Digest, Sha256};

/// Which database's migrations: the producer's outbox or the consumer's inbox (two
/// different databases, each with its own record).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Set {
    /// `migrations/outbox/`: the outbox table (schema `events`), its partitioning by day,
    /// the slots' lineage table, the admin API's audit table.
    Outbox,
    /// `migrations/inbox/`: the inbox's tables and SQL functions, in any schema.
    Inbox,
}

impl Set {
    /// The schema the migrations and their record go into unless told otherwise.
    pub fn default_schema(self) -> &'static str {
        match self {
            Set::Outbox => "events",
            Set::Inbox => "inbox",
        }
    }

    /// Whether the files follow `search_path` to their schema (the inbox's), rather than
    /// naming it (the outbox's `events.outbox`).
    pub fn schema_is_chosen(self) -> bool {
        matches!(self, Set::Inbox)
    }

    /// The set's migrations, in the order they are applied.
    pub fn migrations(self) -> &'static [Migration] {
        match self {
            Set::Outbox => OUTBOX,
            Set::Inbox => INBOX,
        }
    }

    /// The repository folder of the files, for messages.
    pub fn folder(self) -> &'static str {
        match self {
            Set::Outbox => "migrations/outbox",
            Set::Inbox => "migrations/inbox",
        }
    }
}

/// One migration file.
#[derive(Debug)]
pub struct Migration {
    pub version: u32,
    /// The file name, e.g. `0001_inbox.sql`.
    pub name: &'static str,
    pub sql: &'static str,
    pub(crate) leaves: Leaves,
}

impl Migration {
    /// The sha256 of the file, lowercase hex: what `walpost_migrations.checksum` holds.
    pub fn checksum(&self) -> String {
        Sha256::digest(self.sql.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// What a migration leaves in its schema: every table (with these columns), every
/// partitioned table and every function listed. All present: it was applied, by hand or
/// by a tool, before its schema had a `walpost_migrations` table.
#[derive(Debug)]
pub(crate) struct Leaves {
    pub(crate) tables: &'static [(&'static str, &'static [&'static str])],
    pub(crate) partitioned: &'static [&'static str],
    pub(crate) functions: &'static [&'static str],
}

/// The index in [`OUTBOX`] of `0003_walpost_slots.sql` (a unit test holds it).
pub(crate) const WALPOST_SLOTS: usize = 2;

/// The outbox's tables are in schema `events`, which 0001 and 0002 name themselves; 0003's
/// table goes where `search_path` says (walpost also keeps it beside an outbox of another
/// schema, see `create_walpost_slots`).
static OUTBOX: &[Migration] = &[
    Migration {
        version: 1,
        name: "0001_events_outbox.sql",
        sql: include_str!("../../../migrations/outbox/0001_events_outbox.sql"),
        leaves: Leaves {
            tables: &[("outbox", &["id", "aggregate_type", "aggregate_id", "event_type", "payload", "occurred_at"])],
            partitioned: &[],
            functions: &[],
        },
    },
    Migration {
        version: 2,
        name: "0002_outbox_partitioned.sql",
        sql: include_str!("../../../migrations/outbox/0002_outbox_partitioned.sql"),
        leaves: Leaves { tables: &[], partitioned: &["outbox"], functions: &[] },
    },
    Migration {
        version: 3,
        name: "0003_walpost_slots.sql",
        sql: include_str!("../../../migrations/outbox/0003_walpost_slots.sql"),
        // The column came with an edit of the file in place: a table without it is from
        // before, and the file (idempotent) runs to add it.
        leaves: Leaves {
            tables: &[("walpost_slots", &["slot", "system_identifier", "timeline", "created_at", "progress_key"])],
            partitioned: &[],
            functions: &[],
        },
    },
    Migration {
        version: 4,
        name: "0004_admin_audit.sql",
        sql: include_str!("../../../migrations/outbox/0004_admin_audit.sql"),
        leaves: Leaves {
            tables: &[("walpost_admin_audit", &["at", "token_name", "role", "action", "target", "result"])],
            partitioned: &[],
            functions: &[],
        },
    },
    Migration {
        version: 5,
        name: "0005_pause.sql",
        sql: include_str!("../../../migrations/outbox/0005_pause.sql"),
        leaves: Leaves {
            tables: &[("walpost_pauses", &["slot", "paused_at", "paused_by"])],
            partitioned: &[],
            functions: &[],
        },
    },
    Migration {
        version: 6,
        name: "0006_redrives.sql",
        sql: include_str!("../../../migrations/outbox/0006_redrives.sql"),
        leaves: Leaves {
            tables: &[(
                "walpost_redrives",
                &["event_id", "outbox_table", "at", "by_token", "result", "topic", "partition", "offset", "reason"],
            )],
            partitioned: &[],
            functions: &[],
        },
    },
];

static INBOX: &[Migration] = &[
    Migration {
        version: 1,
        name: "0001_inbox.sql",
        sql: include_str!("../../../migrations/inbox/0001_inbox.sql"),
        leaves: Leaves {
            tables: &[
                ("messages", &["event_id", "seq", "topic", "payload", "received_at"]),
                ("offsets", &["group_id", "topic", "partition", "next_offset"]),
                ("rejected", &["topic", "partition", "offset", "reason"]),
                ("handlers", &["name", "max_attempts"]),
                ("deliveries", &["handler", "event_id", "state", "lease_token"]),
                ("receipts", &["handler", "event_id", "completed_at"]),
            ],
            partitioned: &["messages", "deliveries", "receipts"],
            functions: &["deliver_new_messages", "register_handler", "claim", "complete", "fail", "retry", "dismiss"],
        },
    },
    Migration {
        version: 2,
        name: "0002_inbox_hardening.sql",
        sql: include_str!("../../../migrations/inbox/0002_inbox_hardening.sql"),
        leaves: Leaves {
            tables: &[
                ("deliveries", &["topic", "isolated", "lease_rows"]),
                ("receipts", &["topic"]),
                ("handlers", &["leases_lost"]),
                ("handler_grants", &["handler", "grantee"]),
            ],
            partitioned: &[],
            functions: &["aggregate_key", "authorize", "authorize_owner", "grant_handler", "revoke_handler", "extend"],
        },
    },
    Migration {
        version: 3,
        name: "0003_inbox_batches.sql",
        sql: include_str!("../../../migrations/inbox/0003_inbox_batches.sql"),
        leaves: Leaves { tables: &[], partitioned: &[], functions: &["check_batch", "complete_many", "fail_many"] },
    },
    Migration {
        version: 4,
        name: "0004_inbox_heads.sql",
        sql: include_str!("../../../migrations/inbox/0004_inbox_heads.sql"),
        leaves: Leaves {
            tables: &[("deliveries", &["head"]), ("heads", &["handler", "aggregate_id", "seq"])],
            partitioned: &[],
            functions: &["advance_heads", "repair_heads"],
        },
    },
    Migration {
        version: 5,
        name: "0005_inbox_control.sql",
        sql: include_str!("../../../migrations/inbox/0005_inbox_control.sql"),
        leaves: Leaves {
            tables: &[
                ("handlers", &["paused"]),
                ("admin_audit", &["at", "token_name", "role", "action", "target", "result"]),
            ],
            partitioned: &[],
            functions: &["pause_handler", "resume_handler", "retry_many", "dismiss_many", "review_groups"],
        },
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_count_up_from_one_and_name_their_files() {
        for set in [Set::Outbox, Set::Inbox] {
            for (i, m) in set.migrations().iter().enumerate() {
                let version = u32::try_from(i + 1).unwrap();
                assert_eq!(m.version, version, "{}/{}", set.folder(), m.name);
                assert!(m.name.starts_with(&format!("{version:04}_")), "{}/{}", set.folder(), m.name);
                assert!(m.name.ends_with(".sql"), "{}", m.name);
            }
        }
    }

    #[test]
    fn the_slots_table_is_where_create_walpost_slots_looks() {
        assert_eq!(Set::Outbox.migrations()[WALPOST_SLOTS].name, "0003_walpost_slots.sql");
    }

    #[test]
    fn every_file_in_the_folders_is_embedded() {
        for set in [Set::Outbox, Set::Inbox] {
            let dir = format!("{}/../../{}", env!("CARGO_MANIFEST_DIR"), set.folder());
            let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            on_disk.sort();
            let embedded: Vec<&str> = set.migrations().iter().map(|m| m.name).collect();
            assert_eq!(on_disk, embedded, "{dir}: a file there is not in files.rs, or the reverse");
        }
    }

    /// The inbox's files name no schema: the one search_path names is theirs.
    #[test]
    fn the_inbox_files_qualify_nothing_with_a_schema_but_pg_catalog() {
        for m in Set::Inbox.migrations() {
            for (n, line) in m.sql.lines().enumerate() {
                let code = line.split("--").next().unwrap_or_default();
                for (i, _) in code.match_indices("inbox.") {
                    let before = code[..i].chars().last();
                    // Error texts and authorize's action names keep the default's name.
                    let quoted = code[..i].matches('\'').count() % 2 == 1;
                    assert!(
                        quoted || before.is_some_and(|c| c.is_alphanumeric() || c == '_'),
                        "{}:{}: {line}",
                        m.name,
                        n + 1
                    );
                }
            }
        }
    }

    #[test]
    fn the_checksum_is_the_sha256_of_the_file() {
        let m = &Set::Outbox.migrations()[0];
        let sum = m.checksum();
        assert_eq!(sum.len(), 64);
        assert!(sum.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()), "{sum}");
        let empty = Migration {
            version: 9,
            name: "0009_x.sql",
            sql: "",
            leaves: Leaves { tables: &[], partitioned: &[], functions: &[] },
        };
        assert_eq!(empty.checksum(), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    }
}
