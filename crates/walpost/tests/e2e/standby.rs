//! Decoding on a physical standby (PostgreSQL 16+). The harness starts a
//! primary and a streaming standby (hot_standby_feedback, a physical slot); walpost reads
//! its slot on the standby (`target_session_attrs=standby` or `prefer-standby`) and writes
//! on the primary (`--postgres-primary`). Every test is audited against the committed
//! rows: nothing lost, per-aggregate order kept.
//!
//! Every test here is named `failover_standby_...`: scripts/test.sh runs them in its
//! failover step (they start clusters of their own), not in every pass.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use testkit::{Postgres, StandbyOptions, StopMode};

use crate::drills::{
    assert_clean, assert_gap_from_snapshot, recover_and_stream, service, service_config, sh_ok, Runbook,
};
use crate::failover::{check, cluster, view_on as on};
use crate::support::*;

const WAIT: Duration = Duration::from_secs(120);

/// A standby of `primary` for decoding: no failover-slot synchronization (a standby's
/// own slot is not a failover slot), `extra` settings last.
fn decoding_standby(primary: &Postgres, extra: &[(&str, &str)]) -> &'static Postgres {
    let opts = StandbyOptions {
        no_slot_sync: true,
        extra_conf: extra.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
        ..StandbyOptions::default()
    };
    Box::leak(Box::new(Postgres::start_standby(primary, opts).expect("start standby")))
}

/// A world on `primary` whose role may ask it for running-transactions records.
fn world(primary: &'static Postgres, name: &str) -> World {
    let w = World::on(primary, &testkit::shared_kafka().bootstrap(), name);
    w.sql(&format!("GRANT EXECUTE ON FUNCTION pg_log_standby_snapshot() TO {}", w.role));
    w
}

/// The least-privileged role's URL over `ports`, with `target_session_attrs`.
fn url(w: &World, ports: &[u16], attrs: &str) -> String {
    let hosts: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    format!("postgres://{}:{APP_PASSWORD}@{}/{}?target_session_attrs={attrs}", w.role, hosts.join(","), w.db)
}

/// walpost's arguments: the slot on `standbys` (in order), writes on `primary`.
fn args(w: &World, standbys: &[u16], attrs: &str, primary: Option<&Postgres>) -> Vec<String> {
    let mut args = with_flag(w.args(), "--postgres", &url(w, standbys, attrs));
    if let Some(p) = primary {
        args.extend(["--postgres-primary".into(), url(w, &[p.port()], "read-write")]);
    }
    args
}

/// Rows inserted on the primary by a background writer: batches of 20 over 20
/// aggregates, one transaction each, until stopped; returns the next batch number.
fn load(w: &World, from: u32) -> (Arc<AtomicBool>, std::thread::JoinHandle<u32>) {
    let stop = Arc::new(AtomicBool::new(false));
    let (pg, db, flag) = (w.pg, w.db.clone(), stop.clone());
    let handle = std::thread::spawn(move || {
        let mut batch = from;
        while !flag.load(Ordering::SeqCst) {
            insert_batches_in(pg, &db, batch, 2, 20, 20, &["order", "payment"]);
            batch += 2;
            std::thread::sleep(Duration::from_millis(50));
        }
        batch
    });
    (stop, handle)
}

fn stop_load(load: (Arc<AtomicBool>, std::thread::JoinHandle<u32>)) -> u32 {
    load.0.store(true, Ordering::SeqCst);
    load.1.join().expect("the load thread")
}

/// Every committed row (read on `w`'s server) is in Kafka, in per-aggregate order.
fn assert_all_delivered(w: &World, p: &Walpost) -> Audit {
    let records = consume_every_committed(w, WAIT);
    let a = audit(w, &records);
    assert!(a.lost.is_empty(), "lost {:?}\n{}", &a.lost[..a.lost.len().min(10)], p.log_text());
    assert!(a.reordered.is_empty() && a.phantoms.is_empty() && a.wrong_content.is_empty(), "{a:?}");
    a
}

/// Decoding on the standby under a continuous load on the primary, with a kill -9 of
/// walpost: the slot is created on an idle primary within seconds, the primary has no
/// logical walsender and no logical slot, nothing is confirmed past a batch that is not
/// in Kafka, and every event arrives in order.
fn decode_on_a_standby_under_load(major: u32) {
    let primary = cluster(Some(major));
    let w = world(primary, &format!("sb-{major}"));
    let standby = decoding_standby(primary, &[]);
    let sw = on(&w, standby);
    let args = args(&w, &[standby.port()], "standby", Some(primary));

    // An idle primary: the slot's creation asks it for a running-transactions record.
    let started = Instant::now();
    let mut p = Walpost::start(&args, &[]);
    // The slot shows in pg_replication_slots before CREATE_REPLICATION_SLOT returns (it
    // waits there for a consistent point), so creation is timed by walpost's own line.
    let created = testkit::wait_until(WAIT, || p.log_text().contains("created replication slot"));
    let created_in = started.elapsed();
    assert!(created, "{}", p.log_text());
    assert!(created_in < Duration::from_secs(15), "slot creation on an idle primary took {created_in:?}");
    assert!(sw.wait_for_slot(WAIT), "{}", p.log_text());
    assert!(p.log_text().contains("on_standby=true"), "{}", p.log_text());
    assert_eq!(w.sql("SELECT count(*) FROM pg_replication_slots WHERE slot_type = 'logical'"), "0");
    let lineage = w.sql(&format!("SELECT count(*) FROM events.walpost_slots WHERE slot = '{}'", w.slot));
    assert_eq!(lineage, "1", "the slot's lineage is written on the primary");

    let (code, report) = check(&args, &[]);
    let lines: Vec<&str> = report.lines().filter(|l| l.contains("standby decoding:")).collect();
    assert!(lines.len() >= 4 && lines.iter().all(|l| l.starts_with("ok ")), "exit {code}:\n{report}");

    let running = load(&w, 0);
    std::thread::sleep(Duration::from_secs(4));
    p.kill9();
    // Nothing confirmed past a batch that is not in Kafka: every batch committed at or
    // before the standby's confirmed position is there whole.
    let confirmed = sw.confirmed_flush_lsn().expect("the slot");
    let records = read_all(&w.kafka_bootstrap, &w.topic_prefix);
    let covered: Vec<String> = w
        .sql(&format!("SELECT batch FROM public.txlog WHERE lsn_after <= '{}'::pg_lsn", lsn_text(confirmed)))
        .lines()
        .map(str::to_owned)
        .collect();
    for batch in &covered {
        let rows: usize =
            w.sql(&format!("SELECT count(*) FROM events.outbox WHERE event_type = 'b{batch}'")).parse().unwrap();
        let delivered =
            records.iter().filter(|r| r.header("eventType") == Some(format!("b{batch}").as_bytes())).count();
        assert!(
            delivered >= rows,
            "batch {batch} is confirmed by the slot but only {delivered} of {rows} are in Kafka"
        );
    }
    let mut p = Walpost::start(&args, &[]);
    std::thread::sleep(Duration::from_secs(3));
    stop_load(running);
    let a = assert_all_delivered(&w, &p);
    let walsenders = w.sql("SELECT count(*) FROM pg_stat_replication");
    assert_eq!(walsenders, "1", "the primary serves only the physical standby");
    eprintln!(
        "standby decoding PostgreSQL {major}: slot in {created_in:?}, {} batches confirmed at the kill, {} duplicates",
        covered.len(),
        a.duplicates
    );
    assert!(p.terminate(Duration::from_secs(30)).unwrap().success(), "{}", p.log_text());
}

#[test]
fn failover_standby_decoding_under_load_and_kill9_pg16() {
    decode_on_a_standby_under_load(16);
}

#[test]
fn failover_standby_decoding_under_load_and_kill9_pg17() {
    decode_on_a_standby_under_load(17);
}

#[test]
fn failover_standby_decoding_under_load_and_kill9_pg18() {
    decode_on_a_standby_under_load(18);
}

/// The standby walpost decodes on is promoted mid-load (its primary crashed): the same
/// walpost process keeps streaming from the same slot on the new primary, without a gap.
#[test]
fn failover_standby_decoding_follows_the_promotion_of_its_standby() {
    let primary = cluster(Some(17));
    let w = world(primary, "sb-promote");
    let standby = decoding_standby(primary, &[]);
    let sw = on(&w, standby);
    let mut p = Walpost::start(&args(&w, &[standby.port()], "prefer-standby", Some(primary)), &[]);
    assert!(sw.wait_for_slot(WAIT), "{}", p.log_text());
    let running = load(&w, 0);
    std::thread::sleep(Duration::from_secs(3));
    let next = stop_load(running);
    standby.wait_caught_up(primary).expect("the standby catches up");
    primary.stop(StopMode::Immediate).expect("stop the primary");
    standby.promote().expect("promote");
    let running = load(&sw, next);
    std::thread::sleep(Duration::from_secs(3));
    stop_load(running);
    assert_all_delivered(&sw, &p);
    assert!(p.is_running(), "walpost exited:\n{}", p.log_text());
    assert!(p.terminate(Duration::from_secs(30)).unwrap().success(), "{}", p.log_text());
}

/// The primary fails over to another standby: the decoding standby follows the new
/// timeline (repointed at the new primary) and walpost keeps streaming through it.
#[test]
fn failover_standby_decoding_follows_a_failover_of_the_primary() {
    let primary = cluster(Some(17));
    let w = world(primary, "sb-follow");
    let decoding = decoding_standby(primary, &[]);
    let other = decoding_standby(primary, &[]);
    let dw = on(&w, decoding);
    let ow = on(&w, other);
    // The primary may be either of the two afterwards.
    let mut a = args(&w, &[decoding.port()], "standby", None);
    a.extend(["--postgres-primary".into(), url(&w, &[primary.port(), other.port()], "read-write")]);
    let mut p = Walpost::start(&a, &[]);
    assert!(dw.wait_for_slot(WAIT), "{}", p.log_text());
    let running = load(&w, 0);
    std::thread::sleep(Duration::from_secs(3));
    let next = stop_load(running);
    other.wait_caught_up(primary).expect("the other standby catches up");
    decoding.wait_caught_up(primary).expect("the decoding standby catches up");
    primary.stop(StopMode::Immediate).expect("stop the primary");
    other.promote().expect("promote the other standby");
    // Repoint the decoding standby: a physical slot on the new primary, then its
    // primary_conninfo (recovery_target_timeline = latest follows the switch).
    let slot = decoding.primary_slot_name().expect("a physical slot").to_owned();
    other.psql(&format!("SELECT pg_create_physical_replication_slot('{slot}', true)")).expect("physical slot");
    let conninfo = decoding.psql("SHOW primary_conninfo").expect("primary_conninfo");
    let repointed = conninfo.replace(&format!("port={}", primary.port()), &format!("port={}", other.port()));
    assert_ne!(conninfo, repointed, "{conninfo}");
    decoding
        .psql_with("ALTER SYSTEM SET primary_conninfo = :'conninfo'", &[("conninfo", &repointed)])
        .expect("repoint");
    decoding.psql("SELECT pg_reload_conf()").expect("reload");
    let running = load(&ow, next);
    std::thread::sleep(Duration::from_secs(3));
    stop_load(running);
    decoding.wait_caught_up(other).expect("the decoding standby follows the new primary");
    assert_all_delivered(&ow, &p);
    assert!(p.is_running(), "walpost exited:\n{}", p.log_text());
    assert!(p.terminate(Duration::from_secs(30)).unwrap().success(), "{}", p.log_text());
}

/// The decoding standby is lost; the multi-host string lists another standby, which has
/// no such slot. A new slot there would skip every event since the old one's confirmed
/// position, so the lineage record (written on the primary, replicated) stops walpost.
#[test]
fn failover_standby_decoding_on_a_lost_standby_stops_rather_than_skip() {
    let primary = cluster(Some(17));
    let w = world(primary, "sb-lost");
    let first = decoding_standby(primary, &[]);
    let second = decoding_standby(primary, &[]);
    let mut p = Walpost::start(&args(&w, &[first.port(), second.port()], "standby", Some(primary)), &[]);
    assert!(on(&w, first).wait_for_slot(WAIT), "{}", p.log_text());
    insert_batches(&w, 0, 5, 20, 20, &["order"]);
    wait_for_every_committed(&w, WAIT);
    second.wait_caught_up(primary).expect("the second standby has the lineage record");
    first.stop(StopMode::Immediate).expect("lose the decoding standby");
    insert_batches(&w, 5, 5, 20, 20, &["order"]);
    let status = p.wait_exit(WAIT).expect("walpost must stop rather than create a slot that skips");
    assert_eq!(status.code(), Some(1), "{}", p.log_text());
    let log = p.log_text();
    let error = log.lines().find(|l| l.contains("but walpost streamed from it")).unwrap_or_else(|| panic!("{log}"));
    assert!(error.contains(&format!("does not exist on 127.0.0.1:{}", second.port())), "{error}");
    assert_eq!(
        second.psql_db(&w.db, "SELECT count(*) FROM pg_replication_slots WHERE slot_type = 'logical'").unwrap(),
        "0",
        "no slot created on the other standby"
    );
}

/// A recovery conflict invalidates the standby's slot (hot_standby_feedback off, no
/// physical slot, VACUUM of catalog rows on the primary): walpost stops with the error
/// that names runbooks/standby-decoding.md, and the runbook's recovery (its own blocks)
/// publishes every event, those committed after the invalidation included.
#[test]
fn failover_standby_decoding_slot_invalidated_by_a_conflict_and_the_runbook_recovers() {
    let primary = cluster(Some(17));
    let w = world(primary, "sb-conflict");
    let standby = decoding_standby(primary, &[("hot_standby_feedback", "off"), ("primary_slot_name", "")]);
    let mut sw = on(&w, standby);
    sw.url = url(&w, &[standby.port()], "standby");
    let primary_url = url(&w, &[primary.port()], "read-write");
    let config = service_config(&sw, &format!("postgres_primary = \"{primary_url}\""));
    let mut p = service(&config, &[]);
    assert!(sw.wait_for_slot(WAIT), "{}", p.log_text());
    insert_batches(&w, 0, 5, 20, 20, &["order"]);
    wait_for_every_committed(&w, WAIT);
    // Catalog rows the slot needs, removed on the primary.
    for _ in 0..3 {
        w.sql("CREATE TABLE public.churn (a int)");
        w.sql("DROP TABLE public.churn");
        w.sql("VACUUM pg_class");
        if testkit::wait_until(Duration::from_secs(5), || {
            sw.sql(&format!(
                "SELECT coalesce(bool_or(conflicting), false) FROM pg_replication_slots WHERE slot_name = '{}'",
                w.slot
            )) == "t"
        }) {
            break;
        }
    }
    let status = p.wait_exit(WAIT).expect("walpost must stop on an invalidated slot");
    assert_eq!(status.code(), Some(1), "{}", p.log_text());
    let log = p.log_text();
    let error =
        log.lines().find(|l| l.contains("was invalidated by a recovery conflict")).unwrap_or_else(|| panic!("{log}"));
    assert!(error.contains("invalidation_reason = rows_removed"), "{error}");
    assert!(error.contains(texts::runbook::STANDBY), "{error}");
    // The gap: events committed while walpost is stopped.
    let before_gap: i64 = w.sql("SELECT coalesce(max(id), 0) FROM events.outbox").parse().unwrap();
    insert_batches(&w, 5, 5, 20, 20, &["order"]);
    let gap: Vec<i64> = w
        .sql(&format!("SELECT id FROM events.outbox WHERE id > {before_gap}"))
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();

    let rb = Runbook::open("standby-decoding");
    let physical = format!("walpost_{}", w.slot);
    primary.psql(&rb.block("physical-slot").fill(&[("name", &physical)])).expect("the physical slot");
    // As an operator runs it: psql commands, one statement each (ALTER SYSTEM refuses a
    // transaction block, which a psql -c of several statements is).
    sh_ok(&with_psql(standby, &rb.block("feedback").fill(&[("name", &physical), ("standby", &standby.url())])));
    assert_eq!(standby.psql("SHOW hot_standby_feedback").unwrap(), "on");
    assert_eq!(standby.psql("SHOW primary_slot_name").unwrap(), physical);
    // The filter's start, as slot-lost.md finds it: the newest record's time.
    let newest = sh_ok(
        &Runbook::open("slot-lost")
            .block("newest")
            .fill(&[("topics", &w.topic("order")), ("brokers", &w.kafka_bootstrap)]),
    );
    let vars = [("config", config.as_str()), ("newest-ms", newest.trim()), ("margin", "1 minute")];
    let mut recover = recover_and_stream(&rb.block("recover").fill(&vars), WAIT);
    insert_batches(&w, 10, 3, 20, 20, &["order"]);
    let records = consume_every_committed(&w, WAIT);
    let a = audit(&w, &records);
    assert_clean(&a);
    assert_gap_from_snapshot(&records, &gap);
    assert!(recover.terminate(Duration::from_secs(30)).unwrap().success(), "{}", recover.log_text());
}

/// `script` with the harness's psql first in `PATH`.
fn with_psql(pg: &Postgres, script: &str) -> String {
    let psql = pg.psql_path();
    let dir = psql.parent().expect("psql's directory");
    format!("PATH='{}':\"$PATH\"\n{script}", dir.display())
}

/// Regression: walpost restarted with `target_session_attrs=standby` after its
/// standby was promoted retried forever with a warning. Past
/// `pipeline.no_standby_timeout_secs` (5 s here) it exits 1 with the text that says to use
/// `prefer-standby`; following it, walpost streams on from the promoted server.
#[test]
fn failover_standby_decoding_restarted_with_standby_after_a_promotion_stops_and_names_prefer_standby() {
    let primary = cluster(Some(17));
    let w = world(primary, "sb-nostandby");
    let standby = decoding_standby(primary, &[]);
    let sw = on(&w, standby);
    let config = std::env::temp_dir().join(format!("{}.toml", testkit::unique_name("nostandby")));
    std::fs::write(&config, "[pipeline]\nno_standby_timeout_secs = 5\n").unwrap();
    let env = [("WALPOST_CONFIG", config.to_str().unwrap())];
    let standby_args = args(&w, &[standby.port()], "standby", Some(primary));
    let mut p = Walpost::start(&standby_args, &env);
    assert!(sw.wait_for_slot(WAIT), "{}", p.log_text());
    insert_batches(&w, 0, 3, 20, 20, &["order"]);
    wait_for_every_committed(&w, WAIT);
    assert!(p.terminate(Duration::from_secs(30)).unwrap().success(), "{}", p.log_text());
    standby.wait_caught_up(primary).expect("the standby catches up");
    primary.stop(StopMode::Immediate).expect("stop the primary");
    standby.promote().expect("promote");

    // The service restarted as it was configured: only a primary answers.
    let started = Instant::now();
    let mut p = Walpost::start(&standby_args, &env);
    let status = p
        .wait_exit(Duration::from_secs(60))
        .unwrap_or_else(|| panic!("walpost kept waiting for a standby:\n{}", p.log_text()));
    assert_eq!(status.code(), Some(1), "{}", p.log_text());
    assert!(started.elapsed() < Duration::from_secs(30), "{:?}", started.elapsed());
    let expected = texts::standby::no_standby_found(&format!("127.0.0.1:{}", standby.port()), 5);
    assert!(p.log_text().contains(&expected), "{expected}\n{}", p.log_text());
    assert!(expected.contains("target_session_attrs=prefer-standby"), "{expected}");

    // What it says: prefer-standby. The slot kept its position on the promoted server.
    let mut p = Walpost::start(&args(&w, &[standby.port()], "prefer-standby", Some(primary)), &env);
    insert_batches(&sw, 3, 3, 20, 20, &["order"]);
    assert_all_delivered(&sw, &p);
    assert!(p.terminate(Duration::from_secs(30)).unwrap().success(), "{}", p.log_text());
}

/// An LSN in PostgreSQL's text form.
fn lsn_text(lsn: u64) -> String {
    format!("{:X}/{:X}", lsn >> 32, lsn & 0xFFFF_FFFF)
}
