//! The pure part: from the files, the schema's record (if it has one) and its catalog,
//! which migrations are applied, which are pending, which were applied by hand before the
//! record existed, and which were edited after they were applied.

use std::collections::{BTreeMap, BTreeSet};

use crate::files::{Leaves, Migration};

/// A row of `<schema>.walpost_migrations`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    pub version: u32,
    pub name: String,
    pub checksum: String,
    /// As PostgreSQL prints it.
    pub applied_at: String,
}

/// What a schema holds, as far as [`Leaves`] asks: each relation with its kind
/// (`pg_class.relkind`) and columns, and the names of its functions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Catalog {
    pub(crate) relations: BTreeMap<String, (char, BTreeSet<String>)>,
    pub(crate) functions: BTreeSet<String>,
}

impl Catalog {
    /// Every table of `leaves` with its columns, every partitioned one partitioned, and
    /// every function, in this schema.
    pub(crate) fn holds(&self, leaves: &Leaves) -> bool {
        let tables = leaves.tables.iter().all(|(table, columns)| {
            self.relations.get(*table).is_some_and(|(_, have)| columns.iter().all(|c| have.contains(*c)))
        });
        let partitioned =
            leaves.partitioned.iter().all(|t| self.relations.get(*t).is_some_and(|(kind, _)| *kind == 'p'));
        let functions = leaves.functions.iter().all(|f| self.functions.contains(*f));
        tables && partitioned && functions
    }
}

/// Where one migration stands in a schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// Recorded, with the file's checksum.
    Applied { applied_at: String },
    /// Not recorded (the schema has no record yet) but what it creates is there: it was
    /// applied by hand before `walpost migrate`. Recorded without running it.
    FoundInPlace,
    /// To be applied.
    Pending,
    /// Recorded with another checksum, or under another file name: the file was edited
    /// (or renamed) after it was applied. Nothing is applied while one is.
    Changed { recorded_name: String, recorded_checksum: String },
}

/// One migration and its state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub version: u32,
    pub name: &'static str,
    pub checksum: String,
    pub state: State,
}

/// Every migration of a set in one schema, in order, and the record's rows no file has
/// (applied by a newer walpost).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub entries: Vec<Entry>,
    pub unknown: Vec<Recorded>,
    /// The schema has its `walpost_migrations` table already.
    pub recorded: bool,
}

impl Plan {
    /// The migrations to run, in order.
    pub fn pending(&self) -> impl Iterator<Item = &Entry> {
        self.entries.iter().filter(|e| e.state == State::Pending)
    }

    /// The migrations to record without running them.
    pub fn found_in_place(&self) -> impl Iterator<Item = &Entry> {
        self.entries.iter().filter(|e| e.state == State::FoundInPlace)
    }

    /// The migrations edited after they were applied.
    pub fn changed(&self) -> impl Iterator<Item = &Entry> {
        self.entries.iter().filter(|e| matches!(e.state, State::Changed { .. }))
    }

    /// Nothing to run and nothing to record.
    pub fn is_current(&self) -> bool {
        self.entries.iter().all(|e| matches!(e.state, State::Applied { .. }))
    }
}

/// The plan for `files` in a schema whose record holds `recorded` (`None`: it has no
/// `walpost_migrations` table) and whose catalog is `catalog`.
///
/// Without a record, each migration whose objects are all there counts as applied by
/// hand, on its own: a database may hold 0001 and 0003 (which walpost itself creates)
/// without 0002. With a record, only the record counts: a table dropped by hand does not
/// make its migration pending again.
pub(crate) fn plan(files: &'static [Migration], recorded: Option<&[Recorded]>, catalog: &Catalog) -> Plan {
    let entries = files
        .iter()
        .map(|m| {
            let checksum = m.checksum();
            let state = match recorded {
                None if catalog.holds(&m.leaves) => State::FoundInPlace,
                None => State::Pending,
                Some(rows) => match rows.iter().find(|r| r.version == m.version) {
                    None => State::Pending,
                    Some(r) if r.checksum == checksum && r.name == m.name => {
                        State::Applied { applied_at: r.applied_at.clone() }
                    }
                    Some(r) => State::Changed { recorded_name: r.name.clone(), recorded_checksum: r.checksum.clone() },
                },
            };
            Entry { version: m.version, name: m.name, checksum, state }
        })
        .collect();
    let unknown = recorded
        .unwrap_or_default()
        .iter()
        .filter(|r| !files.iter().any(|m| m.version == r.version))
        .cloned()
        .collect();
    Plan { entries, unknown, recorded: recorded.is_some() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::Set;

    fn row(m: &Migration) -> Recorded {
        Recorded {
            version: m.version,
            name: m.name.to_owned(),
            checksum: m.checksum(),
            applied_at: "2026-12-01 10:00:00+00".into(),
        }
    }

    fn catalog(relations: &[(&str, char, &[&str])], functions: &[&str]) -> Catalog {
        Catalog {
            relations: relations
                .iter()
                .map(|(t, kind, cols)| ((*t).to_owned(), (*kind, cols.iter().map(|c| (*c).to_owned()).collect())))
                .collect(),
            functions: functions.iter().map(|f| (*f).to_owned()).collect(),
        }
    }

    fn states(p: &Plan) -> Vec<&State> {
        p.entries.iter().map(|e| &e.state).collect()
    }

    #[test]
    fn an_empty_schema_has_every_migration_pending() {
        let p = plan(Set::Inbox.migrations(), None, &Catalog::default());
        assert_eq!(states(&p), [&State::Pending; 5]);
        assert_eq!(p.pending().count(), 5);
        assert!(!p.recorded && !p.is_current());
    }

    #[test]
    fn a_recorded_schema_has_pending_only_what_it_lacks() {
        let files = Set::Outbox.migrations();
        let rows = [row(&files[0]), row(&files[1])];
        let p = plan(files, Some(&rows), &Catalog::default());
        assert!(
            matches!(p.entries[0].state, State::Applied { ref applied_at } if applied_at.starts_with("2026-12-01"))
        );
        assert!(matches!(p.entries[1].state, State::Applied { .. }));
        assert_eq!(
            p.pending().map(|e| e.name).collect::<Vec<_>>(),
            ["0003_walpost_slots.sql", "0004_admin_audit.sql", "0005_pause.sql", "0006_redrives.sql"]
        );
        let all: Vec<Recorded> = files.iter().map(row).collect();
        assert!(plan(files, Some(&all), &Catalog::default()).is_current());
    }

    #[test]
    fn an_edited_applied_file_is_changed_and_named() {
        let files = Set::Inbox.migrations();
        let mut rows: Vec<Recorded> = files.iter().map(row).collect();
        rows[1].checksum = "0".repeat(64);
        let p = plan(files, Some(&rows), &Catalog::default());
        let changed: Vec<&Entry> = p.changed().collect();
        assert_eq!(changed.len(), 1);
        assert_eq!(changed[0].name, "0002_inbox_hardening.sql");
        assert_eq!(
            changed[0].state,
            State::Changed { recorded_name: "0002_inbox_hardening.sql".into(), recorded_checksum: "0".repeat(64) }
        );
        assert_eq!(p.pending().count(), 0);
    }

    /// Another set's record in the same schema (version 1 of the outbox where the inbox's
    /// is expected) is a change, never "applied".
    #[test]
    fn a_version_recorded_under_another_name_is_changed() {
        let outbox = Set::Outbox.migrations();
        let rows = [row(&outbox[0])];
        let p = plan(Set::Inbox.migrations(), Some(&rows), &Catalog::default());
        assert!(
            matches!(&p.entries[0].state, State::Changed { recorded_name, .. } if recorded_name == "0001_events_outbox.sql")
        );
    }

    #[test]
    fn versions_recorded_without_a_file_are_unknown() {
        let files = Set::Inbox.migrations();
        let mut rows: Vec<Recorded> = files.iter().map(row).collect();
        let next = u32::try_from(files.len() + 1).unwrap();
        rows.push(Recorded {
            version: next,
            name: format!("{next:04}_next.sql"),
            checksum: "ab".into(),
            applied_at: "x".into(),
        });
        let p = plan(files, Some(&rows), &Catalog::default());
        assert!(p.is_current());
        assert_eq!(p.unknown.iter().map(|r| r.version).collect::<Vec<_>>(), [next]);
    }

    /// A database migrated by hand: 0001 and 0003's objects are there, 0002's are not (the
    /// outbox is not partitioned), so 0002 alone runs.
    #[test]
    fn objects_of_a_migration_applied_by_hand_are_found_in_place() {
        let c = catalog(
            &[
                ("outbox", 'r', &["id", "aggregate_type", "aggregate_id", "event_type", "payload", "occurred_at"]),
                ("walpost_slots", 'r', &["slot", "system_identifier", "timeline", "created_at", "progress_key"]),
            ],
            &[],
        );
        let p = plan(Set::Outbox.migrations(), None, &c);
        assert_eq!(
            states(&p),
            [
                &State::FoundInPlace,
                &State::Pending,
                &State::FoundInPlace,
                &State::Pending,
                &State::Pending,
                &State::Pending
            ]
        );
        assert_eq!(p.found_in_place().count(), 2);
    }

    /// 0003 was edited in place to add progress_key: a table from before is not 0003 as it
    /// is now, and the file runs again (it adds the column).
    #[test]
    fn a_table_of_an_older_version_of_a_file_is_not_found_in_place() {
        let c = catalog(&[("walpost_slots", 'r', &["slot", "system_identifier", "timeline", "created_at"])], &[]);
        let p = plan(Set::Outbox.migrations(), None, &c);
        assert_eq!(p.entries[2].state, State::Pending);
    }

    #[test]
    fn a_partitioned_outbox_is_0002_found_in_place() {
        let cols: &[&str] = &["id", "aggregate_type", "aggregate_id", "event_type", "payload", "occurred_at"];
        let plain = plan(Set::Outbox.migrations(), None, &catalog(&[("outbox", 'r', cols)], &[]));
        assert_eq!(plain.entries[1].state, State::Pending);
        let partitioned = plan(Set::Outbox.migrations(), None, &catalog(&[("outbox", 'p', cols)], &[]));
        assert_eq!(states(&partitioned)[..2], [&State::FoundInPlace, &State::FoundInPlace]);
    }

    /// A record makes the catalog irrelevant: what is recorded is applied, the rest
    /// pending, whatever the schema holds.
    #[test]
    fn with_a_record_the_catalog_is_not_read() {
        let c = catalog(
            &[("walpost_slots", 'r', &["slot", "system_identifier", "timeline", "created_at", "progress_key"])],
            &[],
        );
        let files = Set::Outbox.migrations();
        let rows = [row(&files[0])];
        let p = plan(files, Some(&rows), &c);
        assert_eq!(states(&p)[1..], [&State::Pending; 5]);
    }
}
