//! Failovers, the PostgreSQL side: a primary and a physical standby started by the harness;
//! walpost given both hosts. A promotion with a synchronized failover slot (17, 18) is
//! streamed through; without one (16) walpost stops with the runbook's error and the
//! runbook's recovery delivers every event. Multi-host strings settle on the primary.
//!
//! Every test here is named `failover_...`: scripts/test.sh runs them in a step of their
//! own (they start their own clusters, of the majors they need), not in every pass.

use std::time::Duration;

use testkit::{PgOptions, Postgres, StandbyOptions, StopMode};

use crate::drills::{
    assert_clean, assert_gap_from_snapshot, recover_and_stream, service, service_config, sh_ok, Runbook,
};
use crate::support::*;

const WAIT: Duration = Duration::from_secs(120);

pub(crate) fn cluster(major: Option<u32>) -> &'static Postgres {
    let bin_dir = major.map(|m| testkit::pg_bin_dir_for_major(m).expect("PostgreSQL binaries"));
    Box::leak(Box::new(Postgres::start(PgOptions { bin_dir, ..PgOptions::default() }).expect("start postgres")))
}

fn standby_of(primary: &Postgres) -> &'static Postgres {
    Box::leak(Box::new(Postgres::start_standby(primary, StandbyOptions::default()).expect("start standby")))
}

/// `w` seen through another server of the same cluster (a promoted standby).
pub(crate) fn view_on(w: &World, pg: &'static Postgres) -> World {
    World {
        pg,
        kafka_bootstrap: w.kafka_bootstrap.clone(),
        db: w.db.clone(),
        url: w.url.clone(),
        superuser_url: w.superuser_url.clone(),
        role: w.role.clone(),
        slot: w.slot.clone(),
        topic_prefix: w.topic_prefix.clone(),
    }
}

/// walpost's URL listing `ports` in order (as the least-privileged role).
fn multi_host_url(w: &World, ports: &[u16]) -> String {
    let hosts: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    format!("postgres://{}:{APP_PASSWORD}@{}/{}", w.role, hosts.join(","), w.db)
}

/// `w`'s walpost arguments with another `--postgres`.
fn args_with_postgres(w: &World, postgres: &str) -> Vec<String> {
    with_flag(w.args(), "--postgres", postgres)
}

/// `walpost check` with `args` (those of `run`): (exit code, output).
pub(crate) fn check(args: &[String], env: &[(&str, &str)]) -> (i32, String) {
    let mut args = args.to_vec();
    if let Some(run) = args.iter().position(|a| a == "run") {
        args[run] = "check".into();
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_walpost"))
        .args(&args)
        .envs(env.iter().copied())
        .output()
        .expect("run walpost check");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text)
}

/// Promotion with a synchronized failover slot: walpost streams through it.
fn promote_with_failover_slot(major: u32) {
    let primary = cluster(Some(major));
    let w = World::on(primary, &testkit::shared_kafka().bootstrap(), &format!("fo-{major}"));
    let standby = standby_of(primary);
    let mut args = args_with_postgres(&w, &multi_host_url(&w, &[primary.port(), standby.port()]));
    args.push("--slot-failover".into());
    let mut p = Walpost::start(&args, &[]);
    assert!(w.wait_for_slot(WAIT), "{}", p.log_text());
    insert_batches(&w, 0, 20, 50, 20, &["order", "payment"]);
    wait_for_every_committed(&w, WAIT);
    primary.log_standby_snapshot().expect("log a standby snapshot");
    standby.wait_slot_synced(&w.slot, primary).expect("the slot is synchronized to the standby");
    let (code, report) = check(&args, &[]);
    let failover_lines: Vec<&str> = report.lines().filter(|l| l.contains("failover:")).collect();
    assert!(
        failover_lines.iter().all(|l| l.starts_with("ok ")) && failover_lines.len() >= 3,
        "walpost check must find the pair ready (exit {code}):\n{report}"
    );
    // Load in flight, then the primary crashes and the standby is promoted.
    insert_batches(&w, 20, 20, 50, 20, &["order", "payment"]);
    primary.stop(StopMode::Immediate).expect("stop the primary");
    standby.promote().expect("promote");
    let nw = view_on(&w, standby);
    insert_batches(&nw, 40, 20, 50, 20, &["order", "payment"]);
    let records = consume_every_committed(&nw, WAIT);
    let a = audit(&nw, &records);
    assert!(
        a.lost.is_empty(),
        "lost {} events, e.g. {:?}\n{}",
        a.lost.len(),
        &a.lost[..a.lost.len().min(10)],
        p.log_text()
    );
    assert!(a.reordered.is_empty(), "{:?}", a.reordered);
    assert!(
        a.phantoms.is_empty(),
        "events published that the promoted server does not have (synchronized_standby_slots must prevent it): {:?}",
        a.phantoms
    );
    assert!(a.wrong_content.is_empty(), "{:?}", a.wrong_content);
    eprintln!("failover PostgreSQL {major}: {} rows, {} duplicates after the promotion", records.len(), a.duplicates);
    assert!(p.is_running(), "walpost exited:\n{}", p.log_text());
    assert!(p.log_text().contains("the slot is on a promoted server now"), "no promotion noted:\n{}", p.log_text());
    assert!(p.terminate(Duration::from_secs(30)).unwrap().success(), "{}", p.log_text());
}

#[test]
fn failover_slot_survives_promotion_pg17() {
    promote_with_failover_slot(17);
}

#[test]
fn failover_slot_survives_promotion_pg18() {
    promote_with_failover_slot(18);
}

/// Multi-host strings (URL, key/value, PG* variables) skip a host that is down and a
/// standby and settle on the primary; with no primary among them, `walpost check` names
/// each host and why.
#[test]
fn failover_multi_host_strings_settle_on_the_primary() {
    let primary = cluster(None);
    let w = World::on(primary, &testkit::shared_kafka().bootstrap(), "fo-hosts");
    let standby = standby_of(primary);
    let down = testkit::free_port();
    let ports = [down, standby.port(), primary.port()];

    let url = multi_host_url(&w, &ports);
    let mut p = Walpost::start(&args_with_postgres(&w, &url), &[]);
    assert!(w.wait_for_slot(WAIT), "{}", p.log_text());
    insert_batches(&w, 0, 1, 10, 5, &["order"]);
    consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 10, WAIT);
    assert!(p.terminate(Duration::from_secs(30)).unwrap().success(), "{}", p.log_text());

    let key_value = format!(
        "host=127.0.0.1,127.0.0.1,127.0.0.1 port={},{},{} dbname={} user={} password={APP_PASSWORD}",
        ports[0], ports[1], ports[2], w.db, w.role
    );
    let mut p = Walpost::start(&args_with_postgres(&w, &key_value), &[]);
    insert_batches(&w, 1, 1, 10, 5, &["order"]);
    consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 20, WAIT);
    assert!(p.terminate(Duration::from_secs(30)).unwrap().success(), "{}", p.log_text());

    let port_list = format!("{},{},{}", ports[0], ports[1], ports[2]);
    let env = [
        ("PGHOST", "127.0.0.1,127.0.0.1,127.0.0.1"),
        ("PGPORT", port_list.as_str()),
        ("PGUSER", w.role.as_str()),
        ("PGPASSWORD", APP_PASSWORD),
    ];
    let mut p = Walpost::start(&args_with_postgres(&w, &format!("dbname={}", w.db)), &env);
    insert_batches(&w, 2, 1, 10, 5, &["order"]);
    let records = consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 30, WAIT);
    let a = audit(&w, &records);
    assert!(a.lost.is_empty() && a.reordered.is_empty(), "{a:?}");
    assert!(p.terminate(Duration::from_secs(30)).unwrap().success(), "{}", p.log_text());

    let no_primary = multi_host_url(&w, &[down, standby.port()]);
    let (code, report) = check(&args_with_postgres(&w, &no_primary), &[]);
    assert_ne!(code, 0, "{report}");
    let connect =
        report.lines().find(|l| l.contains("no usable PostgreSQL host")).unwrap_or_else(|| panic!("{report}"));
    assert!(connect.contains(&format!("[127.0.0.1:{down}]")), "{connect}");
    assert!(
        connect.contains(&format!("[127.0.0.1:{}]", standby.port())) && connect.contains("a standby (in recovery)"),
        "{connect}"
    );
}

/// PostgreSQL 16 (no failover slots): after a promotion the slot is missing; walpost
/// stops with the runbook's error instead of creating a new slot that would skip the
/// gap; runbooks/upgrade-and-failover.md's recovery (slot-lost.md's steps 3 to 5, run
/// from the runbook's own blocks) publishes every event, those of the gap included.
#[test]
fn failover_without_a_synchronized_slot_stops_and_the_runbook_recovers_pg16() {
    let primary = cluster(Some(16));
    let w = World::on(primary, &testkit::shared_kafka().bootstrap(), "fo-16");
    let standby = standby_of(primary);
    let mut nw = view_on(&w, standby);
    nw.url = multi_host_url(&w, &[primary.port(), standby.port()]);
    let config = service_config(&nw, "");
    let mut p = service(&config, &[]);
    assert!(w.wait_for_slot(WAIT), "{}", p.log_text());
    insert_batches(&w, 0, 10, 20, 20, &["order", "payment"]);
    wait_for_every_committed(&w, WAIT);
    insert_batches(&w, 10, 10, 20, 20, &["order", "payment"]);
    // Asynchronous replication may lose the primary's last transactions in a crash; that
    // is PostgreSQL's promise, not walpost's: let the standby have them.
    standby.wait_caught_up(primary).expect("the standby catches up");
    primary.stop(StopMode::Immediate).expect("stop the primary");
    standby.promote().expect("promote");

    let status = p.wait_exit(WAIT).expect("walpost must stop when its slot is missing after the promotion");
    assert_eq!(status.code(), Some(1), "{}", p.log_text());
    let log = p.log_text();
    let error = log.lines().find(|l| l.contains("but walpost streamed from it")).unwrap_or_else(|| panic!("{log}"));
    assert!(error.contains(&format!("does not exist on 127.0.0.1:{}", standby.port())), "{error}");
    assert!(error.contains("timeline 1; the server is on timeline 2 now"), "{error}");
    assert!(error.contains(texts::runbook::SLOT_LOST), "{error}");
    // The gap: events committed on the promoted server while walpost is stopped.
    let max_id = || nw.sql("SELECT coalesce(max(id), 0) FROM events.outbox").parse::<i64>().unwrap();
    let before_gap = max_id();
    insert_batches(&nw, 20, 10, 20, 20, &["order", "payment"]);
    // (Sequences skip ahead after a crash: take the ids the rows got.)
    let gap: Vec<i64> = nw
        .sql(&format!("SELECT id FROM events.outbox WHERE id > {before_gap} ORDER BY id"))
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    assert_eq!(gap.len(), 200);

    // upgrade-and-failover.md: steps 2 and 3 are slot-lost.md's steps 3 to 5.
    let failover = Runbook::open("upgrade-and-failover");
    assert!(
        failover.text().contains("steps 3 and 4 of\n   [slot-lost.md](slot-lost.md)"),
        "the runbook changed: update this drill"
    );
    let rb = Runbook::open("slot-lost");
    let topics = format!("{} {}", w.topic("order"), w.topic("payment"));
    let newest = sh_ok(&rb.block("newest").fill(&[("topics", &topics), ("brokers", &w.kafka_bootstrap)]));
    let vars = [("config", config.as_str()), ("newest-ms", newest.trim()), ("margin", "1 minute")];
    let mut recover = recover_and_stream(&rb.block("recover").fill(&vars), WAIT);
    insert_batches(&nw, 30, 5, 20, 20, &["order", "payment"]);
    let records = consume_every_committed(&nw, WAIT);
    let a = audit(&nw, &records);
    assert_clean(&a);
    assert_gap_from_snapshot(&records, &gap);
    eprintln!(
        "failover PostgreSQL 16: {} rows, {} records, {} duplicates",
        nw.committed_rows().len(),
        records.len(),
        a.duplicates
    );
    assert!(recover.terminate(Duration::from_secs(30)).unwrap().success(), "{}", recover.log_text());
}
