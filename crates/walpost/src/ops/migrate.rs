//! `walpost migrate` and `walpost migrate status`: the versioned migrations of the
//! `migrate` crate, applied to (or read from) one schema of one database, with a line per
//! migration on stdout.

use std::fmt::Write as _;

use migrate::{Entry, Plan, Set, State};
use replication::ReplicationClient;

use crate::error::{ErrorKind, PipelineError};

/// The database, the set of migrations and the schema they go into.
#[derive(Debug)]
pub(crate) struct Target {
    pub(crate) postgres: replication::Config,
    pub(crate) set: Set,
    pub(crate) schema: String,
}

/// `walpost migrate [--dry-run]`: applies (or, dry, lists) what is pending, records what
/// a database migrated by hand holds already.
pub(crate) async fn command(t: &Target, dry_run: bool) -> Result<(), PipelineError> {
    let mut sql = ReplicationClient::connect_sql(&t.postgres).await?;
    let result = migrate::migrate(&mut sql, t.set, &t.schema, dry_run).await;
    sql.close().await;
    let plan = result.map_err(failed)?;
    print!("{}", report(t, &plan, dry_run));
    Ok(())
}

/// `walpost migrate status`: every migration, applied or pending; exit 1 when an applied
/// one's file changed since.
pub(crate) async fn status(t: &Target) -> Result<(), PipelineError> {
    let mut sql = ReplicationClient::connect_sql(&t.postgres).await?;
    let result = migrate::status(&mut sql, t.set, &t.schema).await;
    sql.close().await;
    let plan = result.map_err(failed)?;
    print!("{}", status_text(t, &plan));
    if plan.changed().next().is_some() {
        return Err(PipelineError::definite(
            ErrorKind::Config,
            format!(
                "walpost migrate status: applied migrations changed since (CHANGED above): restore the files of {}",
                t.set.folder()
            ),
        ));
    }
    Ok(())
}

fn failed(e: migrate::Error) -> PipelineError {
    let kind = match e {
        migrate::Error::Schema(_) | migrate::Error::Changed { .. } => ErrorKind::Config,
        _ => ErrorKind::Postgres,
    };
    if e.is_transient() {
        PipelineError::transient(kind, format!("walpost migrate: {e}"))
    } else {
        PipelineError::definite(kind, format!("walpost migrate: {e}"))
    }
}

/// What `walpost migrate` did (or would do).
fn report(t: &Target, plan: &Plan, dry_run: bool) -> String {
    let (apply, record) = if dry_run { ("would apply", "would record") } else { ("applied", "recorded") };
    let mut out = String::new();
    let _ = writeln!(out, "schema {} ({}):", t.schema, t.set.folder());
    if !plan.recorded {
        let make = if dry_run { "would create" } else { "created" };
        let _ = writeln!(out, "  {make:<12} {}.{}", t.schema, migrate::RECORD_TABLE);
    }
    for e in &plan.entries {
        match e.state {
            State::Pending => {
                let _ = writeln!(out, "  {apply:<12} {}", e.name);
            }
            State::FoundInPlace => {
                let _ =
                    writeln!(out, "  {record:<12} {}  (its objects are there: applied before walpost migrate)", e.name);
            }
            State::Applied { .. } | State::Changed { .. } => {}
        }
    }
    let applied = plan.pending().count();
    let found = plan.found_in_place().count();
    let total = plan.entries.len();
    let _ = match (applied + found, dry_run) {
        (0, _) => writeln!(out, "nothing to apply: schema {} is up to date ({total} migrations)", t.schema),
        (_, true) => writeln!(out, "dry run: {applied} to apply, {found} to record; nothing changed"),
        (_, false) => {
            writeln!(out, "{applied} applied, {found} recorded: schema {} is up to date ({total} migrations)", t.schema)
        }
    };
    out
}

/// One line per migration, then the counts.
fn status_text(t: &Target, plan: &Plan) -> String {
    let mut out = String::new();
    let record = if plan.recorded {
        format!("recorded in {}.{}", t.schema, migrate::RECORD_TABLE)
    } else {
        format!("no {}.{} yet", t.schema, migrate::RECORD_TABLE)
    };
    let _ = writeln!(out, "schema {} ({}), {record}:", t.schema, t.set.folder());
    for e in &plan.entries {
        let _ = writeln!(out, "  {}", line(e));
    }
    for r in &plan.unknown {
        let _ = writeln!(out, "  {:<8} {}  (not in this walpost: applied by a newer one)", "unknown", r.name);
    }
    let count = |f: fn(&State) -> bool| plan.entries.iter().filter(|e| f(&e.state)).count();
    let _ = writeln!(
        out,
        "{} applied, {} pending, {} found in place, {} changed",
        count(|s| matches!(s, State::Applied { .. })),
        count(|s| matches!(s, State::Pending)),
        count(|s| matches!(s, State::FoundInPlace)),
        count(|s| matches!(s, State::Changed { .. })),
    );
    out
}

fn line(e: &Entry) -> String {
    match &e.state {
        State::Applied { applied_at } => format!("{:<8} {}  {applied_at}", "applied", e.name),
        State::Pending => format!("{:<8} {}", "pending", e.name),
        State::FoundInPlace => {
            format!("{:<8} {}  (its objects are there: walpost migrate records it without running it)", "found", e.name)
        }
        State::Changed { recorded_name, recorded_checksum } => format!(
            "{:<8} {}  (recorded as {recorded_name} with sha256 {recorded_checksum}; the file's is {})",
            "CHANGED", e.name, e.checksum
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> Target {
        Target {
            postgres: replication::Config::from_url("postgres://u@h/db").unwrap(),
            set: Set::Inbox,
            schema: "billing".into(),
        }
    }

    fn entry(name: &'static str, state: State) -> Entry {
        Entry { version: 1, name, checksum: "c".repeat(64), state }
    }

    #[test]
    fn the_report_names_each_migration_applied_or_recorded() {
        let plan = Plan {
            entries: vec![
                entry("0001_inbox.sql", State::FoundInPlace),
                entry("0002_inbox_hardening.sql", State::Pending),
            ],
            unknown: vec![],
            recorded: false,
        };
        let text = report(&target(), &plan, false);
        assert!(text.contains("created      billing.walpost_migrations"), "{text}");
        assert!(text.contains("recorded     0001_inbox.sql"), "{text}");
        assert!(text.contains("applied      0002_inbox_hardening.sql"), "{text}");
        assert!(text.ends_with("1 applied, 1 recorded: schema billing is up to date (2 migrations)\n"), "{text}");
        let dry = report(&target(), &plan, true);
        assert!(dry.contains("would apply  0002_inbox_hardening.sql") && dry.contains("nothing changed"), "{dry}");
    }

    #[test]
    fn status_lists_applied_pending_and_changed() {
        let plan = Plan {
            entries: vec![
                entry("0001_inbox.sql", State::Applied { applied_at: "2026-12-04 10:00:00+00".into() }),
                entry(
                    "0002_inbox_hardening.sql",
                    State::Changed {
                        recorded_name: "0002_inbox_hardening.sql".into(),
                        recorded_checksum: "0".repeat(64),
                    },
                ),
            ],
            unknown: vec![],
            recorded: true,
        };
        let text = status_text(&target(), &plan);
        assert!(
            text.starts_with("schema billing (migrations/inbox), recorded in billing.walpost_migrations:\n"),
            "{text}"
        );
        assert!(text.contains("applied  0001_inbox.sql  2026-12-04 10:00:00+00"), "{text}");
        assert!(text.contains("CHANGED  0002_inbox_hardening.sql"), "{text}");
        assert!(text.ends_with("1 applied, 0 pending, 0 found in place, 1 changed\n"), "{text}");
    }
}
