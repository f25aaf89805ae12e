//! Operations: slot alarms, lost slot, bounded retained WAL, walpost check,
//! metrics scrape, slot CLI, and the runbooks' SQL against a real server.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use testkit::{PgOptions, Postgres};

use crate::support::*;

const WAIT: Duration = Duration::from_secs(120);

fn own_pg(extra: &[(&str, &str)]) -> &'static Postgres {
    let opts = PgOptions {
        extra_conf: extra.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        ..PgOptions::default()
    };
    Box::leak(Box::new(Postgres::start(opts).expect("start postgres")))
}

fn http_get(port: u16, path: &str) -> (u16, String) {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new());
    };
    let _ = s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes());
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let code = out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, out)
}

fn config_file(w: &World, text: &str) -> String {
    let path = std::env::temp_dir().join(format!("{}-{}.toml", w.db, testkit::unique_name("cfg")));
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

fn with_config(w: &World, config: &str, extra: &[&str]) -> Vec<String> {
    let mut args = vec!["--config".to_string(), config.to_owned()];
    args.extend(w.args());
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn walpost_cmd(args: &[String]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_walpost")).args(args).output().expect("run walpost");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

fn sub_args(w: &World, sub: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = sub.iter().map(|s| s.to_string()).collect();
    args.extend(w.args().into_iter().skip(1));
    args
}

fn write_wal(w: &World, megabytes: u32) {
    w.sql(&format!(
        "CREATE TABLE IF NOT EXISTS public.noise (v text);
         INSERT INTO public.noise SELECT repeat('w', 1000) FROM generate_series(1, {megabytes} * 1000)"
    ));
}

/// walpost paused (SIGSTOP) while writes continue: retained bytes grow,
/// the warning then the critical alarm fire (log, metric; `slot status` agrees), and
/// resuming clears them; /readyz is 200 again once streaming and clear.
#[test]
fn paused_walpost_raises_warning_then_critical_and_resume_clears() {
    let pg = own_pg(&[]);
    let w = World::on(pg, &testkit::shared_kafka().bootstrap(), "ops-alarm");
    let cfg = config_file(
        &w,
        "[monitor]\ninterval_secs = 1\nwarning_bytes = 8000000\ncritical_bytes = 30000000\nreminder_secs = 3600\n",
    );
    let (pa, pb) = (testkit::free_port(), testkit::free_port());
    let active = Walpost::start(&with_config(&w, &cfg, &["--metrics-addr", &format!("127.0.0.1:{pa}")]), &[]);
    assert!(w.wait_for_slot(WAIT));
    assert!(testkit::wait_until(Duration::from_secs(30), || http_get(pa, "/readyz").0 == 200));
    // A hot standby on the same slot: its monitor watches while the active one is frozen.
    let standby = Walpost::start(&with_config(&w, &cfg, &["--metrics-addr", &format!("127.0.0.1:{pb}")]), &[]);
    assert!(testkit::wait_until(Duration::from_secs(30), || standby.log_text().contains("in use by server process")));
    active.signal("-STOP");
    write_wal(&w, 12);
    assert!(
        testkit::wait_until(Duration::from_secs(30), || standby.log_text().contains("slot alarm warning")),
        "{}",
        standby.log_text()
    );
    assert!(http_get(pb, "/metrics").1.contains("walpost_slot_alarm{level=\"warning\"} 1"));
    write_wal(&w, 30);
    assert!(
        testkit::wait_until(Duration::from_secs(30), || standby.log_text().contains("slot alarm critical")),
        "{}",
        standby.log_text()
    );
    let metrics = http_get(pb, "/metrics").1;
    assert!(metrics.contains("walpost_slot_alarm{level=\"critical\"} 1"), "{metrics}");
    let mut status_args = vec!["--config".to_string(), cfg.clone()];
    status_args.extend(sub_args(&w, &["slot", "status", "--json"]));
    let out = Command::new(env!("CARGO_BIN_EXE_walpost")).args(&status_args).output().unwrap();
    let status = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(3), "slot status exits 3 for a critical slot: {status}");
    let json: serde_json::Value = serde_json::from_str(&status).expect("slot status --json");
    assert_eq!(json["alarm"], "critical", "{status}");
    assert!(json["retained_bytes"].as_u64().unwrap() >= 30_000_000);

    active.signal("-CONT");
    // The slot's restart_lsn moves at the next running-xacts record: checkpoints force one.
    let cleared = testkit::wait_until(Duration::from_secs(90), || {
        w.sql("CHECKPOINT");
        standby.log_text().contains("slot alarm cleared")
    });
    assert!(cleared, "standby:\n{}\nactive:\n{}", standby.log_text(), active.log_text());
    assert!(testkit::wait_until(Duration::from_secs(30), || http_get(pa, "/readyz").0 == 200));
}

/// A small max_slot_wal_keep_size and a stopped walpost invalidate the
/// slot; walpost then exits with the slot-lost error naming the runbook, and following
/// the runbook (drop the slot, start with `--snapshot when_needed`) recovers.
#[test]
fn lost_slot_is_fatal_with_the_runbook_and_the_runbook_recovers() {
    let pg = own_pg(&[("max_slot_wal_keep_size", "1MB"), ("max_wal_size", "32MB"), ("min_wal_size", "32MB")]);
    let w = World::on(pg, &testkit::shared_kafka().bootstrap(), "ops-lost");
    let mut first = w.start_walpost();
    assert!(w.wait_for_slot(WAIT));
    assert!(first.terminate(Duration::from_secs(30)).unwrap().success());
    let lost = testkit::wait_until(Duration::from_secs(60), || {
        w.sql("CREATE TABLE IF NOT EXISTS public.noise (v text); INSERT INTO public.noise VALUES ('x'); SELECT pg_switch_wal(); CHECKPOINT;");
        w.sql(&format!("SELECT wal_status FROM pg_replication_slots WHERE slot_name = '{}'", w.slot)) == "lost"
    });
    assert!(lost, "the slot was not invalidated");
    let mut p = w.start_walpost();
    let status = p.wait_exit(Duration::from_secs(60)).expect("walpost must stop on a lost slot");
    assert!(!status.success());
    let expected = texts::slot::lost(&w.slot);
    assert!(p.log_text().contains(&expected), "{}", p.log_text());
    assert!(expected.contains("runbooks/slot-lost.md"));
    // Dropping the slot is not enough: a slot walpost streamed from is not re-created
    // by a plain start (it would skip what the lost slot never published).
    w.sql(&format!("SELECT pg_drop_replication_slot('{}')", w.slot));
    let mut plain = w.start_walpost();
    assert!(!plain.wait_exit(Duration::from_secs(60)).expect("a plain start must stop").success());
    assert!(plain.log_text().contains("but walpost streamed from it"), "{}", plain.log_text());
    // The runbook (slot-lost.md step 5, no insert-time filter): re-create it with a snapshot.
    let _again = Walpost::start(&with_flag(w.args(), "--snapshot", "when_needed"), &[]);
    assert!(w.wait_for_slot(WAIT));
    insert_batches(&w, 0, 1, 10, 5, &["order"]);
    consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 10, WAIT);
}

/// The outbox is idle and another table busy: retained WAL stays bounded.
#[test]
fn idle_outbox_busy_database_keeps_retained_wal_bounded() {
    let pg = own_pg(&[]);
    let w = World::on(pg, &testkit::shared_kafka().bootstrap(), "ops-bounded");
    let _p = w.start_walpost();
    assert!(w.wait_for_slot(WAIT));
    for _ in 0..6 {
        write_wal(&w, 10);
        w.sql("CHECKPOINT");
    }
    let retained = || {
        w.sql(&format!(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint FROM pg_replication_slots WHERE slot_name = '{}'",
            w.slot
        ))
        .parse::<i64>()
        .unwrap()
    };
    let bounded = testkit::wait_until(Duration::from_secs(60), || {
        w.sql("CHECKPOINT");
        retained() < 8_000_000
    });
    assert!(bounded, "after ~60 MB of other writes the slot still retains {} bytes", retained());
}

/// `walpost check` passes on a good server and names each problem on
/// misconfigured ones (wal_level=replica, role without REPLICATION, missing table).
#[test]
fn check_passes_on_a_good_server_and_names_each_problem() {
    let w = World::new("ops-check");
    let (ok, out) = walpost_cmd(&sub_args(&w, &["check"]));
    assert!(ok, "{out}");
    for expected in ["ok    wal_level = logical", "ok    role has REPLICATION", "ok    Kafka at", "publication"] {
        assert!(out.contains(expected), "missing {expected:?} in:\n{out}");
    }
    assert!(!out.contains("FAIL"), "{out}");
    assert!(!out.contains(":walpost@"), "password printed:\n{out}");

    let (ok, out) = walpost_cmd(&{
        let mut a = sub_args(&w, &["check"]);
        a.extend(["--table".to_string(), "events.missing".to_string()]);
        a
    });
    assert!(!ok);
    assert!(out.contains("FAIL  table events.missing does not exist"), "{out}");

    w.sql(&format!("CREATE ROLE plain_{s} LOGIN PASSWORD 'pw'", s = w.slot));
    let mut a = sub_args(&w, &["check"]);
    let i = a.iter().position(|x| x == "--postgres").unwrap();
    a[i + 1] = w.pg.url_for(&format!("plain_{}", w.slot), "pw", &w.db);
    let (ok, out) = walpost_cmd(&a);
    assert!(!ok);
    assert!(out.contains("lacks the REPLICATION attribute"), "{out}");
    assert!(out.contains("FAIL  the role cannot SELECT from events.outbox"), "{out}");

    let replica = own_pg(&[("wal_level", "replica")]);
    let w2 = World::on(replica, &testkit::shared_kafka().bootstrap(), "ops-check-replica");
    let (ok, out) = walpost_cmd(&sub_args(&w2, &["check"]));
    assert!(!ok);
    assert!(out.contains("FAIL  wal_level is 'replica' but walpost needs 'logical'"), "{out}");
    assert!(!out.contains("managed PostgreSQL"), "a self-run server is no service:\n{out}");
    // A server with a service's own setting (here as a database's placeholder)
    // is told the service's way to turn logical decoding on, not ALTER SYSTEM.
    w2.sql(&format!("ALTER DATABASE \"{}\" SET cloudsql.logical_decoding = 'off'", w2.db));
    let (ok, out) = walpost_cmd(&sub_args(&w2, &["check"]));
    assert!(!ok);
    assert!(out.contains("ok    managed PostgreSQL: this looks like Google Cloud SQL for PostgreSQL"), "{out}");
    assert!(
        out.contains("FAIL  managed PostgreSQL: logical decoding is off on Google Cloud SQL for PostgreSQL (wal_level = replica): set the database flag cloudsql.logical_decoding = on"),
        "{out}"
    );
}

/// Every documented metric of `walpost run` is exported and well formed (Prometheus text
/// format), and none of `walpost inbox`'s: the inbox backlog drill checks those on its
/// endpoint, and that it exports none of `walpost run`'s.
#[test]
fn metrics_endpoint_exports_every_documented_metric() {
    let w = World::new("ops-metrics");
    let port = testkit::free_port();
    let cfg = config_file(&w, "[monitor]\ninterval_secs = 1\n");
    let _p = Walpost::start(&with_config(&w, &cfg, &["--metrics-addr", &format!("127.0.0.1:{port}")]), &[]);
    assert!(w.wait_for_slot(WAIT));
    insert_batches(&w, 0, 2, 10, 5, &["order"]);
    consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 20, WAIT);
    let mut body = String::new();
    assert!(testkit::wait_until(Duration::from_secs(20), || {
        body = http_get(port, "/metrics").1;
        body.contains("walpost_slot_retained_bytes ")
    }));
    assert_eq!(http_get(port, "/healthz").0, 200);
    assert_eq!(http_get(port, "/readyz").0, 200);
    let text = body.split("\r\n\r\n").nth(1).unwrap();
    // The inbox's come from `walpost inbox`; the contracts' only with [contracts]
    // (contracts::contracts_dead_letter_each_breach_once_keep_order_and_check_the_snapshot),
    // the registry's only with [registry] (registry::registry_json_schema_waits_...).
    let missing = missing_metrics(RELAY_METRICS, text, |name| {
        !name.starts_with("walpost_contract_") && !name.starts_with("walpost_registry_")
    });
    assert!(missing.is_empty(), "missing: {missing:?}");
    let foreign = foreign_metrics(RELAY_METRICS, text);
    assert!(foreign.is_empty(), "walpost run exports series that are not its own: {foreign:?}");
    assert!(text.lines().all(|l| !l.starts_with("walpost_inbox_")), "walpost run exports inbox series:\n{text}");
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("malformed: {line}"));
        assert!(value.parse::<f64>().is_ok(), "value of {line}");
        assert!(series.starts_with("walpost_"), "{line}");
        assert!(!series.contains(' '), "{line}");
    }
    let topic = w.topic("order");
    assert!(text.contains(&format!("walpost_events_published_total{{topic=\"{topic}\"}} 20")), "{text}");
    assert!(text.contains("walpost_end_to_end_latency_seconds_count 20"), "{text}");
}

/// `walpost slot create`, `slot status`, `slot drop` (refuses without confirmation).
#[test]
fn slot_cli_creates_reports_and_drops() {
    let w = World::new("ops-slotcli");
    let (ok, out) = walpost_cmd(&sub_args(&w, &["slot", "create"]));
    assert!(ok, "{out}");
    assert!(w.confirmed_flush_lsn().is_some());
    // Nothing streams from the new slot: a warning (exit 2), with the figures.
    let (ok, out) = walpost_cmd(&sub_args(&w, &["slot", "status"]));
    assert!(!ok && out.contains("wal_status") && out.contains("retained WAL"), "{out}");
    assert!(out.contains("warning: no process streams from the slot"), "{out}");
    let (ok, out) = walpost_cmd(&sub_args(&w, &["slot", "drop"]));
    assert!(!ok && out.contains("pass --yes"), "{out}");
    assert!(w.confirmed_flush_lsn().is_some(), "dropped without confirmation");
    let (ok, out) = walpost_cmd(&sub_args(&w, &["slot", "drop", "--yes"]));
    assert!(ok, "{out}");
    assert!(w.confirmed_flush_lsn().is_none());
}

/// The runbooks' SQL blocks run against a real server (slot "walpost" and an empty
/// publication "walpost_outbox" present). Blocks with `<placeholders>` are steps of an
/// incident: the drills (`drills.rs`) run them with values, against the incident.
#[test]
fn runbook_sql_runs_against_a_real_server() {
    let pg = own_pg(&[]);
    let w = World::on(pg, &testkit::shared_kafka().bootstrap(), "ops-runbooks");
    // The inbox runbooks query the inbox's tables.
    w.sql(&inbox_migrations());
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../runbooks");
    let mut ran = 0;
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        w.sql("SELECT pg_create_logical_replication_slot('walpost', 'pgoutput') WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = 'walpost')");
        // The default publication, without the table (as after a re-created outbox).
        w.sql("DROP PUBLICATION IF EXISTS walpost_outbox; CREATE PUBLICATION walpost_outbox;");
        let mut in_block = false;
        let mut block = String::new();
        for line in text.lines() {
            let trimmed = line.trim_start();
            if !in_block && trimmed.starts_with("```sql") {
                // A block tagged `pg17` needs PostgreSQL 17 or later: skipped on older servers.
                in_block = !trimmed.contains("pg17") || pg.major_version() >= 17;
                block.clear();
                continue;
            }
            if in_block && trimmed.starts_with("```") {
                if crate::drills::placeholders(&block).is_empty() {
                    w.try_sql(&block).unwrap_or_else(|e| panic!("{}: SQL failed: {e}\n{block}", file.display()));
                    ran += 1;
                }
                in_block = false;
                continue;
            }
            if in_block {
                block.push_str(line);
                block.push('\n');
            }
        }
    }
    assert!(ran >= 10, "only {ran} SQL blocks ran");
}

/// `--heartbeat-interval`: with no writes at all, the heartbeat's own WAL lets the slot's
/// confirmed position advance (the multi-database case, where this database is quiet).
#[test]
fn heartbeat_advances_the_slot_of_a_quiet_database() {
    let pg = own_pg(&[]);
    let w = World::on(pg, &testkit::shared_kafka().bootstrap(), "ops-heartbeat");
    let mut args = w.args();
    args.extend(["--heartbeat-interval".to_string(), "1".to_string()]);
    let _p = Walpost::start(&args, &[]);
    assert!(w.wait_for_slot(WAIT));
    std::thread::sleep(Duration::from_secs(2));
    let start = w.confirmed_flush_lsn().unwrap();
    let advanced = testkit::wait_until(Duration::from_secs(30), || w.confirmed_flush_lsn().unwrap() > start + 100);
    assert!(advanced, "confirmed_flush_lsn stayed at {start:X} with heartbeats every second");
}

/// A mode's own metrics (name, type, help).
pub(crate) type MetricTable = &'static [(&'static str, &'static str, &'static str)];

/// `walpost run`'s own metrics.
pub(crate) const RELAY_METRICS: MetricTable = walpost::telemetry::metrics::METRICS;

/// The metrics of `table` (or of every mode's common ones) that `wanted` selects and
/// `text` (a `/metrics` body) has no `# TYPE` line for.
pub(crate) fn missing_metrics(table: MetricTable, text: &str, wanted: impl Fn(&str) -> bool) -> Vec<&'static str> {
    table
        .iter()
        .chain(service::telemetry::exposition::METRICS)
        .filter(|(name, _, _)| wanted(name))
        .filter(|(name, kind, _)| !text.contains(&format!("# TYPE {name} {kind}\n")))
        .map(|(name, _, _)| *name)
        .collect()
}

/// The metrics `text` (a `/metrics` body) has a `# TYPE` line for that are neither of
/// `table` nor common to every mode.
pub(crate) fn foreign_metrics(table: MetricTable, text: &str) -> Vec<String> {
    let own = |name: &str| table.iter().chain(service::telemetry::exposition::METRICS).any(|(n, _, _)| *n == name);
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .filter(|name| !own(name))
        .map(str::to_owned)
        .collect()
}
