//! `walpost migrate` against a real PostgreSQL (no Kafka): a fresh database twice, a
//! database migrated by hand with the files as they were before the runner existed
//! (fixtures/hand-migrated/), an applied file that changed, two runners at once, the
//! inbox in a schema of another name, `--dry-run` and `status`.

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use sha2::{Digest, Sha256};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/e2e/fixtures/hand-migrated");
const MIGRATIONS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../migrations");

/// A database of its own on the shared PostgreSQL, and the superuser's URL of it.
struct Db {
    pg: &'static testkit::Postgres,
    name: String,
    url: String,
}

impl Db {
    fn new(name: &str) -> Db {
        let pg = testkit::shared_postgres();
        let name = testkit::unique_name(name);
        let url = pg.create_database(&name).expect("create database");
        Db { pg, name, url }
    }

    fn sql(&self, sql: &str) -> String {
        self.pg.psql_db(&self.name, sql).unwrap_or_else(|e| panic!("SQL failed: {e}\n{sql}"))
    }

    /// `walpost migrate <args> --postgres <url>`, run to its end.
    fn migrate(&self, args: &[&str]) -> Ran {
        self.migrate_with(args, &[])
    }

    fn migrate_with(&self, args: &[&str], env: &[(&str, &str)]) -> Ran {
        let out = self.command(args, env).output().expect("run walpost migrate");
        Ran::of(out)
    }

    fn command(&self, args: &[&str], env: &[(&str, &str)]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_walpost"));
        cmd.args(["--log-color", "never", "migrate"]).args(args).args(["--postgres", &self.url]);
        cmd.env_remove("WALPOST_POSTGRES").envs(env.iter().copied());
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        cmd
    }

    /// `version|name|checksum` of each recorded migration, in order.
    fn recorded(&self, schema: &str) -> Vec<String> {
        self.sql(&format!(
            "SELECT version || '|' || name || '|' || checksum FROM {schema}.walpost_migrations ORDER BY 1"
        ))
        .lines()
        .map(str::to_owned)
        .collect()
    }
}

struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Ran {
    fn of(out: Output) -> Ran {
        Ran {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    fn ok(self) -> Ran {
        assert_eq!(self.code, Some(0), "stdout:\n{}\nstderr:\n{}", self.stdout, self.stderr);
        self
    }
}

/// `version|name|sha256` of each file of `migrations/<set>/`, as the record must hold them.
fn files(set: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(format!("{MIGRATIONS}/{set}"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
        .iter()
        .map(|name| {
            let text = std::fs::read(format!("{MIGRATIONS}/{set}/{name}")).unwrap();
            let sum: String = Sha256::digest(&text).iter().map(|b| format!("{b:02x}")).collect();
            format!("{}|{name}|{sum}", name[..4].parse::<u32>().unwrap())
        })
        .collect()
}

/// The files as a database migrated by hand before `walpost migrate` got them.
fn apply_by_hand(db: &Db, files: &[&str]) {
    for f in files {
        let sql = std::fs::read_to_string(format!("{FIXTURES}/{f}")).unwrap();
        db.pg.psql_db(&db.name, &sql).unwrap_or_else(|e| panic!("{f} by hand: {e}"));
    }
}

#[test]
fn migrate_a_fresh_database_applies_everything_once() {
    let db = Db::new("migrate-fresh");
    let first = db.migrate(&[]).ok();
    for f in [
        "0001_events_outbox.sql",
        "0002_outbox_partitioned.sql",
        "0003_walpost_slots.sql",
        "0004_admin_audit.sql",
        "0005_pause.sql",
        "0006_redrives.sql",
    ] {
        assert!(first.stdout.contains(&format!("applied      {f}")), "{}", first.stdout);
    }
    assert!(first.stdout.contains("6 applied, 0 recorded: schema events is up to date"), "{}", first.stdout);
    assert_eq!(db.recorded("events"), files("outbox"));
    assert_eq!(db.sql("SELECT relkind FROM pg_class WHERE oid = 'events.outbox'::regclass"), "p");
    assert_eq!(db.sql("SELECT to_regclass('events.walpost_slots') IS NOT NULL"), "t");
    let applied_at = db.sql("SELECT string_agg(applied_at::text, ',' ORDER BY version) FROM events.walpost_migrations");

    let second = db.migrate(&[]).ok();
    assert!(
        second.stdout.contains("nothing to apply: schema events is up to date (6 migrations)"),
        "{}",
        second.stdout
    );
    assert_eq!(db.recorded("events"), files("outbox"));
    assert_eq!(
        db.sql("SELECT string_agg(applied_at::text, ',' ORDER BY version) FROM events.walpost_migrations"),
        applied_at
    );

    let status = db.migrate(&["status"]).ok();
    assert!(status.stdout.starts_with("schema events (migrations/outbox), recorded in events.walpost_migrations:"));
    assert!(status.stdout.contains("applied  0002_outbox_partitioned.sql  "), "{}", status.stdout);
    assert!(status.stdout.contains("6 applied, 0 pending, 0 found in place, 0 changed"), "{}", status.stdout);
}

/// Old 0001-0005 applied with psql (outbox and inbox in one database, as the old
/// docker-compose did), with data in them: every migration they hold is recorded, none
/// runs again (the inbox's functions keep the search_path the old file gave them); the
/// inbox's 0003 and 0004, which came after them, are applied.
#[test]
fn migrate_records_a_database_migrated_by_hand_without_running_anything() {
    let db = Db::new("migrate-by-hand");
    apply_by_hand(
        &db,
        &[
            "0001_events_outbox.sql",
            "0002_outbox_partitioned.sql",
            "0003_walpost_slots.sql",
            "0004_inbox.sql",
            "0005_inbox_hardening.sql",
        ],
    );
    db.sql(
        "INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload)
         VALUES ('order', gen_random_uuid(), 'OrderPlaced', '{}');
         SELECT inbox.register_handler('h', '{}', '{}', 3, '1 second', '1 minute', false);",
    );
    // inbox.fail: a function the later files (0003, 0004) leave as it is.
    let fail_config = "SELECT array_to_string(proconfig, ';') FROM pg_proc WHERE oid = 'inbox.fail(text,text,uuid,text)'::regprocedure";
    assert_eq!(db.sql(fail_config), "search_path=pg_catalog, pg_temp");

    let status = db.migrate(&["status"]).ok();
    assert!(status.stdout.contains("no events.walpost_migrations yet"), "{}", status.stdout);
    assert!(status.stdout.contains("0 applied, 3 pending, 3 found in place, 0 changed"), "{}", status.stdout);

    let outbox = db.migrate(&[]).ok();
    assert!(outbox.stdout.contains("3 applied, 3 recorded"), "{}", outbox.stdout);
    assert!(outbox.stdout.contains("applied      0004_admin_audit.sql"), "{}", outbox.stdout);
    assert!(
        outbox.stdout.contains("recorded     0002_outbox_partitioned.sql  (its objects are there"),
        "{}",
        outbox.stdout
    );
    assert_eq!(db.recorded("events"), files("outbox"));

    let inbox = db.migrate(&["--inbox"]).ok();
    assert!(inbox.stdout.contains("3 applied, 2 recorded: schema inbox is up to date"), "{}", inbox.stdout);
    assert!(inbox.stdout.contains("applied      0003_inbox_batches.sql"), "{}", inbox.stdout);
    assert!(inbox.stdout.contains("applied      0004_inbox_heads.sql"), "{}", inbox.stdout);
    assert!(inbox.stdout.contains("applied      0005_inbox_control.sql"), "{}", inbox.stdout);
    assert_eq!(db.recorded("inbox"), files("inbox"));
    assert_eq!(db.sql(fail_config), "search_path=pg_catalog, pg_temp", "0002_inbox_hardening.sql ran again");
    assert_eq!(db.sql("SELECT count(*) FROM events.outbox"), "1");
    assert_eq!(db.sql("SELECT name FROM inbox.handlers"), "h");

    let again = db.migrate(&["--inbox"]).ok();
    assert!(again.stdout.contains("nothing to apply"), "{}", again.stdout);
}

/// A database that applied 0001 by hand (an outbox that is not partitioned) and whose
/// walpost created walpost_slots without the progress_key column (an older 0003): 0001
/// is recorded, 0002 and 0003 run.
#[test]
fn migrate_runs_what_a_database_migrated_by_hand_lacks() {
    let db = Db::new("migrate-partly");
    apply_by_hand(&db, &["0001_events_outbox.sql"]);
    db.sql(
        "CREATE TABLE events.walpost_slots (slot text PRIMARY KEY, system_identifier text NOT NULL,
                                            timeline integer NOT NULL, created_at timestamptz NOT NULL)",
    );
    let ran = db.migrate(&[]).ok();
    assert!(ran.stdout.contains("recorded     0001_events_outbox.sql"), "{}", ran.stdout);
    assert!(ran.stdout.contains("applied      0002_outbox_partitioned.sql"), "{}", ran.stdout);
    assert!(ran.stdout.contains("applied      0003_walpost_slots.sql"), "{}", ran.stdout);
    assert_eq!(db.recorded("events"), files("outbox"));
    assert_eq!(
        db.sql("SELECT count(*) FROM pg_attribute WHERE attrelid = 'events.walpost_slots'::regclass AND attname = 'progress_key'"),
        "1"
    );
}

/// The record says 0002 was applied with other text (as if the file was edited since):
/// exit 1 naming the file, and the pending 0003 is not applied.
#[test]
fn migrate_stops_on_an_applied_file_that_changed() {
    let db = Db::new("migrate-changed");
    db.migrate(&[]).ok();
    db.sql(
        "UPDATE events.walpost_migrations SET checksum = repeat('0', 64) WHERE version = 2;
         DELETE FROM events.walpost_migrations WHERE version >= 3;",
    );
    let ran = db.migrate(&[]);
    assert_eq!(ran.code, Some(1), "stdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
    assert!(ran.stderr.contains("migrations/outbox/0002_outbox_partitioned.sql (recorded as"), "{}", ran.stderr);
    assert!(ran.stderr.contains("nothing was applied"), "{}", ran.stderr);
    assert_eq!(db.sql("SELECT string_agg(version::text, ',' ORDER BY version) FROM events.walpost_migrations"), "1,2");

    let dry = db.migrate(&["--dry-run"]);
    assert_eq!(dry.code, Some(1), "{}", dry.stderr);
    let status = db.migrate(&["status"]);
    assert_eq!(status.code, Some(1), "{}", status.stderr);
    assert!(status.stdout.contains("CHANGED  0002_outbox_partitioned.sql"), "{}", status.stdout);
    assert!(status.stdout.contains("pending  0003_walpost_slots.sql"), "{}", status.stdout);
}

/// Two runners at once: the first holds each migration's transaction open a while (a
/// failpoint), the second waits for the lock, then finds everything applied. Both exit 0
/// and each migration is recorded once.
#[test]
fn two_migrate_at_once_one_waits_and_each_migration_runs_once() {
    let db = Db::new("migrate-race");
    let slow = [("FAILPOINTS", "migrate::before_commit=sleep(1500)")];
    let first = db.command(&["--inbox"], &slow).spawn().unwrap();
    // The first has the lock once its first migration's row is in (uncommitted).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while db.sql(
        "SELECT count(*) FROM pg_locks
         WHERE locktype = 'advisory' AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    ) == "0" {
        assert!(std::time::Instant::now() < deadline, "the first walpost migrate never took its lock");
        std::thread::sleep(Duration::from_millis(50));
    }
    let second = db.migrate(&["--inbox"]).ok();
    let first = Ran::of(first.wait_with_output().unwrap()).ok();
    assert!(first.stdout.contains("5 applied, 0 recorded"), "{}", first.stdout);
    assert!(second.stderr.contains("waiting for its lock"), "{}", second.stderr);
    assert!(second.stdout.contains("nothing to apply: schema inbox is up to date"), "{}", second.stdout);
    assert_eq!(db.recorded("inbox"), files("inbox"));
}

/// The inbox in a schema whose name needs quoting: its tables and functions are there,
/// nothing in `inbox`, and the SQL API works (register, store, claim, complete). The
/// functions' search_path is the schema's; their error texts are the files'.
#[test]
fn migrate_puts_the_inbox_in_a_schema_of_another_name() {
    let db = Db::new("migrate-schema");
    let ran = db.migrate(&["--inbox", "--schema", "Billing Inbox"]).ok();
    assert!(ran.stdout.contains("5 applied, 0 recorded: schema Billing Inbox is up to date"), "{}", ran.stdout);
    assert_eq!(db.recorded("\"Billing Inbox\""), files("inbox"));
    assert_eq!(db.sql("SELECT to_regnamespace('inbox') IS NULL"), "t");
    assert_eq!(
        db.sql("SELECT array_to_string(proconfig, ';') FROM pg_proc WHERE oid = '\"Billing Inbox\".claim(text,integer,interval)'::regprocedure"),
        "search_path=\"Billing Inbox\", pg_temp"
    );
    let s = "\"Billing Inbox\"";
    db.sql(&format!(
        "SELECT {s}.register_handler('h', '{{t}}', '{{}}', 3, '1 second', '1 minute', false);
         INSERT INTO {s}.messages (event_id, topic, \"partition\", \"offset\", headers, payload, event_type, aggregate_id)
         VALUES ('e1', 't', 0, 0, '{{}}', 'x', 'T', 'a'), ('e2', 't', 0, 1, '{{}}', 'y', 'T', 'b');"
    ));
    let claimed = db.sql(&format!("SELECT event_id || '|' || lease_token FROM {s}.claim('h', 10, '1 hour')"));
    let claimed: Vec<(&str, &str)> = claimed.lines().map(|l| l.split_once('|').unwrap()).collect();
    assert_eq!(claimed.iter().map(|c| c.0).collect::<Vec<_>>(), ["e1", "e2"]);
    let (id, token) = claimed[0];
    assert_eq!(db.sql(&format!("SELECT {s}.complete('h', '{id}', '{token}')")), "t");
    let (id, token) = claimed[1];
    assert_eq!(db.sql(&format!("SELECT {s}.complete_many('h', ARRAY['{id}'], ARRAY['{token}'::uuid])")), "{e2}");
    assert_eq!(db.sql(&format!("SELECT backlog FROM {s}.handler_stats")), "0");
    assert_eq!(db.sql(&format!("SELECT count(*) FROM {s}.receipts")), "2");
    let e =
        db.pg.psql_db(&db.name, &format!("SELECT * FROM {s}.claim('nobody', 1, '1 hour')")).unwrap_err().to_string();
    assert!(e.contains("inbox handler \"nobody\" is not registered: call inbox.register_handler first"), "{e}");
}

/// --dry-run lists and changes nothing, on a fresh database and on one migrated by hand;
/// without --inbox, --schema is refused.
#[test]
fn migrate_dry_run_changes_nothing() {
    let db = Db::new("migrate-dry");
    let dry = db.migrate(&["--inbox", "--dry-run"]).ok();
    assert!(dry.stdout.contains("would create inbox.walpost_migrations"), "{}", dry.stdout);
    assert!(dry.stdout.contains("would apply  0001_inbox.sql"), "{}", dry.stdout);
    assert!(dry.stdout.contains("dry run: 5 to apply, 0 to record; nothing changed"), "{}", dry.stdout);
    assert_eq!(db.sql("SELECT to_regnamespace('inbox') IS NULL"), "t");

    apply_by_hand(&db, &["0001_events_outbox.sql"]);
    let dry = db.migrate(&["--dry-run"]).ok();
    assert!(dry.stdout.contains("would record 0001_events_outbox.sql"), "{}", dry.stdout);
    assert!(dry.stdout.contains("would apply  0002_outbox_partitioned.sql"), "{}", dry.stdout);
    assert_eq!(db.sql("SELECT to_regclass('events.walpost_migrations') IS NULL"), "t");
    assert_eq!(db.sql("SELECT relkind FROM pg_class WHERE oid = 'events.outbox'::regclass"), "r");

    let status = db.migrate(&["status", "--inbox"]).ok();
    assert!(status.stdout.contains("pending  0001_inbox.sql"), "{}", status.stdout);
    assert!(status.stdout.contains("0 applied, 5 pending, 0 found in place, 0 changed"), "{}", status.stdout);

    let refused = db.migrate(&["--schema", "other"]);
    assert_eq!(refused.code, Some(2), "{}", refused.stderr);
    assert!(refused.stderr.contains("--inbox"), "{}", refused.stderr);
}
