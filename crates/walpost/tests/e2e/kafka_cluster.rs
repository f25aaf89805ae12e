//! Failovers, the Kafka half: walpost against a 3-broker KRaft cluster (every node a
//! broker and a controller; outbox topics with replication factor 3 and
//! `min.insync.replicas=2`) while a partition leader is killed, every broker is restarted
//! in turn (runbooks/kafka-maintenance.md), or too few brokers remain for `acks=all`.
//!
//! What the tests hold, against real brokers:
//! - nothing committed is lost, nothing is reordered per aggregate, and (one producer
//!   session, idempotent) nothing is duplicated;
//! - a leader election or a broker restart is absorbed inside the producer: walpost's
//!   session never restarts (`walpost_reconnects_total` stays 0, no record fails, no
//!   "restarting the producer" line), so the longest gap between acknowledgements is the
//!   cluster's election time, not the 60 s delivery watchdog. The gap is measured from the
//!   brokers' append timestamps (`message.timestamp.type=LogAppendTime`);
//! - `NOT_ENOUGH_REPLICAS` is waited out, never dead-lettered.
//!
//! walpost runs with its production producer settings: the suite's
//! `topic.metadata.refresh.interval.ms=1000` (see [`World::args`]) is taken out, so leader
//! changes are found the way they are in production (librdkafka's leader query on
//! NOT_LEADER / a lost connection), not by polling every second.
//!
//! The tests share one cluster (three JVMs) and take turns ([`cluster`]); each leaves it
//! healthy (every node running, every replica in sync) for the next. They take about
//! 2.5 min together, so scripts/test.sh runs them once, in a step of their own (step 3,
//! with the failover tests; the other passes `--skip kafka_cluster::`):
//! `cargo test -p walpost --test e2e --features walpost/failpoints -- kafka_cluster::`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::ClientConfig;
use testkit::{KafkaCluster, KafkaClusterOptions};

use crate::support::*;

const WAIT: Duration = Duration::from_secs(120);
/// Aggregate types: one topic each.
const TYPES: &[&str] = &["order", "payment", "invoice"];
/// Events of the load: at least this many.
const LOAD_EVENTS: u32 = 20_000;
/// One round of the load: transactions x rows.
const ROUND_TXNS: u32 = 5;
const ROUND_ROWS: u32 = 50;
/// Distinct aggregate ids (keys) in the load.
const AGGREGATES: u32 = 300;
/// The longest gap between acknowledgements a broker failure may cause. A Kafka election
/// here takes `broker.session.timeout.ms` (4 s, testkit) plus the controller's reaction;
/// the bound leaves room for a loaded 2-core machine while staying far below walpost's
/// 60 s delivery watchdog, so passing proves the producer recovered by itself.
const MAX_ACK_GAP: Duration = Duration::from_secs(20);

static CLUSTER: Mutex<Option<KafkaCluster>> = Mutex::new(None);

/// The shared 3-node cluster, started on first use; healed (stopped nodes started again,
/// full ISR) when a test before failed half-way.
fn cluster() -> MutexGuard<'static, Option<KafkaCluster>> {
    let mut guard = CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    match guard.as_mut() {
        None => {
            let opts = KafkaClusterOptions { heap_mb: 256, ..KafkaClusterOptions::default() };
            *guard = Some(KafkaCluster::start(opts).expect("start the 3-node Kafka cluster"));
        }
        Some(c) => {
            for id in c.node_ids() {
                if !c.is_running(id) {
                    c.start_again(id).expect("heal the cluster");
                }
            }
            c.wait_healthy(Duration::from_secs(60)).expect("cluster healthy");
        }
    }
    guard
}

/// Creates the world's outbox topics: 3 partitions, replicas as `assignment` says (the
/// first replica of each partition is its preferred leader), `min.insync.replicas=2`, and
/// append-time timestamps so the records show when the brokers took them.
fn create_topics(c: &KafkaCluster, w: &World, assignment: &[&[i32]]) {
    create_topics_on(&c.bootstrap(), w, assignment, 2);
    c.wait_healthy(WAIT).expect("topics settled");
    for t in TYPES {
        for p in 0..assignment.len() as i32 {
            c.wait_for_leader(&w.topic(t), p, WAIT, |_| true).expect("topic has leaders");
        }
    }
}

fn create_topics_on(bootstrap: &str, w: &World, assignment: &[&[i32]], min_insync: u32) {
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", bootstrap).create().expect("admin client");
    let min_insync = min_insync.to_string();
    let names: Vec<String> = TYPES.iter().map(|t| w.topic(t)).collect();
    let topics: Vec<NewTopic<'_>> = names
        .iter()
        .map(|n| {
            NewTopic::new(n, assignment.len() as i32, TopicReplication::Variable(assignment))
                .set("min.insync.replicas", &min_insync)
                .set("message.timestamp.type", "LogAppendTime")
        })
        .collect();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let results = rt.block_on(admin.create_topics(&topics, &AdminOptions::new())).expect("create topics");
    for r in results {
        r.unwrap_or_else(|(t, e)| panic!("create topic {t}: {e}"));
    }
}

/// walpost's arguments for `w` with production producer settings (see the module docs),
/// `toml` as its config file and metrics on `metrics_port`.
fn walpost_args(w: &World, toml: &str, metrics_port: u16) -> Vec<String> {
    let path = std::env::temp_dir().join(format!("{}-{}.toml", w.db, testkit::unique_name("kc")));
    std::fs::write(&path, toml).unwrap();
    let mut args = vec!["--config".to_string(), path.display().to_string()];
    let mut suite = w.args().into_iter().peekable();
    while let Some(a) = suite.next() {
        if a == "--kafka-property" && suite.peek().is_some_and(|v| v.starts_with("topic.metadata.refresh.interval.ms"))
        {
            suite.next();
            continue;
        }
        args.push(a);
    }
    args.extend(["--metrics-addr".to_string(), format!("127.0.0.1:{metrics_port}")]);
    args
}

/// Inserts rounds of `ROUND_TXNS` x `ROUND_ROWS` events, `pause` apart, until `stop` is
/// set and at least `min_events` are in; returns how many.
fn write_load(w: &World, stop: &AtomicBool, min_events: u32, pause: Duration) -> u32 {
    let (mut batch, mut events) = (0, 0);
    while events < min_events || !stop.load(Ordering::Relaxed) {
        insert_batches(w, batch, ROUND_TXNS, ROUND_ROWS, AGGREGATES, TYPES);
        batch += ROUND_TXNS;
        events += ROUND_TXNS * ROUND_ROWS;
        std::thread::sleep(pause);
    }
    events
}

fn acknowledged(w: &World) -> i64 {
    high_watermarks(&w.kafka_bootstrap, &w.topic_prefix).values().sum()
}

/// Waits until Kafka holds at least `n` of the world's records (the load is under way).
fn wait_acknowledged(w: &World, n: i64) {
    assert!(testkit::wait_until(WAIT, || acknowledged(w) >= n), "fewer than {n} records reached Kafka");
}

/// The `/metrics` text of walpost on `port`.
fn scrape(port: u16) -> String {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else { return String::new() };
    let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// The value of one series (`name{labels}` exactly as exported); `None` if absent.
fn series(metrics: &str, name: &str) -> Option<f64> {
    metrics.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Asserts that walpost's session never restarted (the producer absorbed every broker
/// failure) and that no record failed.
fn assert_no_session_restart(p: &Walpost, metrics_port: u16) {
    let m = scrape(metrics_port);
    for (s, want) in [
        ("walpost_reconnects_total{cause=\"kafka\"}", 0.0),
        ("walpost_reconnects_total{cause=\"postgres\"}", 0.0),
        ("walpost_produce_errors_total{class=\"retryable\"}", 0.0),
        ("walpost_produce_errors_total{class=\"rejected\"}", 0.0),
    ] {
        assert_eq!(series(&m, s), Some(want), "{s} in:\n{m}\n--- walpost log ---\n{}", p.log_text());
    }
    let log = p.log_text();
    for line in ["restarting the producer", "restarting from the last confirmed position", "; reconnecting"] {
        assert!(!log.contains(line), "walpost restarted its session ({line:?}):\n{log}");
    }
}

/// The longest time without an acknowledged record: over all partitions (nothing
/// acknowledged at all) and within one partition (that partition stalled), from the
/// brokers' append timestamps.
#[derive(Debug)]
struct AckGaps {
    overall_ms: i64,
    partition_ms: i64,
    partition: String,
}

fn ack_gaps(records: &[Consumed]) -> AckGaps {
    let mut all: Vec<i64> = records.iter().filter_map(|r| r.timestamp).collect();
    all.sort_unstable();
    let overall_ms = all.windows(2).map(|p| p[1] - p[0]).max().unwrap_or(0);
    let (mut partition_ms, mut partition) = (0, String::new());
    // `records` is sorted by topic, partition, offset.
    for pair in records.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        if a.topic != b.topic || a.partition != b.partition {
            continue;
        }
        let gap = b.timestamp.unwrap_or(0) - a.timestamp.unwrap_or(0);
        if gap > partition_ms {
            partition_ms = gap;
            partition = format!("{}/{} offsets {}..{}", b.topic, b.partition, a.offset, b.offset);
        }
    }
    AckGaps { overall_ms, partition_ms, partition }
}

fn assert_all_delivered_once(w: &World, records: &[Consumed]) {
    let a = audit(w, records);
    assert!(a.lost.is_empty(), "lost {} events, first: {:?}", a.lost.len(), &a.lost[..a.lost.len().min(10)]);
    assert!(a.reordered.is_empty(), "reordered: {:?}", &a.reordered[..a.reordered.len().min(10)]);
    assert!(a.phantoms.is_empty() && a.wrong_content.is_empty(), "{a:?}");
    assert_eq!(a.duplicates, 0, "duplicates within one producer session (idempotent producer)");
}

fn assert_gaps_bounded(test: &str, records: &[Consumed]) -> AckGaps {
    assert!(records.iter().all(|r| r.timestamp.is_some()), "records without a timestamp");
    let gaps = ack_gaps(records);
    eprintln!(
        "{test}: longest gap between acknowledgements {} ms over all partitions, {} ms within one ({})",
        gaps.overall_ms, gaps.partition_ms, gaps.partition
    );
    assert!(
        gaps.partition_ms < MAX_ACK_GAP.as_millis() as i64,
        "{test}: a partition acknowledged nothing for {} ms ({}): longer than an election",
        gaps.partition_ms,
        gaps.partition
    );
    gaps
}

/// Every outbox partition led by broker 1 (its preferred leader), replicas on all three.
const LED_BY_1: &[&[i32]] = &[&[1, 2, 3], &[1, 3, 2], &[1, 2, 3]];
/// Leaders spread over the brokers.
const SPREAD: &[&[i32]] = &[&[1, 2, 3], &[2, 3, 1], &[3, 1, 2]];

/// kill -9 of the broker leading every outbox partition during a 20k-event load: the
/// producer follows the new leaders by itself; nothing lost, reordered or duplicated.
#[test]
fn kafka_leader_kill_during_load_loses_nothing() {
    let mut guard = cluster();
    let c = guard.as_mut().unwrap();
    let t0 = Instant::now();
    let w = World::on(testkit::shared_postgres(), &c.bootstrap(), "kc-leader-kill");
    create_topics(c, &w, LED_BY_1);
    let victim = c.leader_of(&w.topic("order"), 0).unwrap();
    for t in TYPES {
        for p in 0..3 {
            assert_eq!(c.leader_of(&w.topic(t), p).unwrap(), victim, "{t}/{p} is not led by broker {victim}");
        }
    }
    let port = testkit::free_port();
    let walpost = Walpost::start(&walpost_args(&w, "", port), &[]);
    assert!(w.wait_for_slot(WAIT), "slot not created:\n{}", walpost.log_text());

    let stop = AtomicBool::new(false);
    let events = std::thread::scope(|s| {
        let writer = s.spawn(|| write_load(&w, &stop, LOAD_EVENTS, Duration::from_millis(100)));
        wait_acknowledged(&w, 3_000);
        c.kill(victim).unwrap();
        let killed = Instant::now();
        let new_leader = c.wait_for_leader(&w.topic("order"), 0, WAIT, |l| l != victim).unwrap();
        eprintln!(
            "kafka_leader_kill: broker {victim} killed with {} records acknowledged; broker {new_leader} leads order/0 after {} ms",
            acknowledged(&w),
            killed.elapsed().as_millis()
        );
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap()
    });
    let records = consume_every_committed(&w, WAIT);
    assert_eq!(w.committed_rows().len(), events as usize);
    assert_all_delivered_once(&w, &records);
    assert_no_session_restart(&walpost, port);
    assert_gaps_bounded("kafka_leader_kill", &records);
    c.start_again(victim).unwrap();
    eprintln!("kafka_leader_kill: {events} events, {} s", t0.elapsed().as_secs());
}

/// The rolling restart of runbooks/kafka-maintenance.md, step by step, during a 20k-event
/// load: one broker at a time, graceful stop (controlled shutdown moves its leaderships
/// away first), start, and the next broker only once no partition is under-replicated.
#[test]
fn kafka_rolling_restart_during_load_loses_nothing() {
    let mut guard = cluster();
    let c = guard.as_mut().unwrap();
    let t0 = Instant::now();
    let w = World::on(testkit::shared_postgres(), &c.bootstrap(), "kc-rolling");
    create_topics(c, &w, SPREAD);
    let port = testkit::free_port();
    let walpost = Walpost::start(&walpost_args(&w, "", port), &[]);
    assert!(w.wait_for_slot(WAIT), "slot not created:\n{}", walpost.log_text());
    let runbook = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../runbooks/kafka-maintenance.md"))
        .expect("runbooks/kafka-maintenance.md");
    assert!(runbook.contains(UNDER_REPLICATED_CHECK), "the runbook's check is {UNDER_REPLICATED_CHECK:?}");

    let stop = AtomicBool::new(false);
    let events = std::thread::scope(|s| {
        let writer = s.spawn(|| write_load(&w, &stop, LOAD_EVENTS, Duration::from_millis(400)));
        for id in c.node_ids() {
            let before = acknowledged(&w);
            wait_acknowledged(&w, before + 500);
            c.stop(id).unwrap();
            // While it is down, the load goes on through the other two (ISR 2 = min ISR).
            let during = acknowledged(&w);
            wait_acknowledged(&w, during + 500);
            c.start_again(id).unwrap();
            // The runbook's gate before the next broker: nothing under-replicated.
            let out = c
                .run_tool(
                    "org.apache.kafka.tools.TopicCommand",
                    &["--bootstrap-server", &c.bootstrap(), "--describe", "--under-replicated-partitions"],
                )
                .unwrap();
            assert!(out.trim().is_empty(), "under-replicated partitions after restarting broker {id}:\n{out}");
            eprintln!("kafka_rolling_restart: broker {id} restarted, {} records acknowledged", acknowledged(&w));
        }
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap()
    });
    let records = consume_every_committed(&w, WAIT);
    assert_eq!(w.committed_rows().len(), events as usize);
    assert_all_delivered_once(&w, &records);
    assert_no_session_restart(&walpost, port);
    assert_gaps_bounded("kafka_rolling_restart", &records);
    eprintln!("kafka_rolling_restart: {events} events, {} s", t0.elapsed().as_secs());
}

/// The check the runbook runs between two brokers of a rolling restart.
const UNDER_REPLICATED_CHECK: &str = "--describe --under-replicated-partitions";

/// Two of three brokers down: `min.insync.replicas=2` cannot be met, the remaining leader
/// answers `NOT_ENOUGH_REPLICAS` and acknowledges nothing (acks=all). walpost waits, with
/// dead letters configured, sends none, and delivers everything once a broker is back.
#[test]
fn kafka_not_enough_replicas_is_waited_out_never_dead_lettered() {
    let mut guard = cluster();
    let c = guard.as_mut().unwrap();
    let t0 = Instant::now();
    let w = World::on(testkit::shared_postgres(), &c.bootstrap(), "kc-min-isr");
    create_topics(c, &w, SPREAD);
    let dead = format!("{}dead", w.topic_prefix);
    let toml = format!("on_permanent_error = \"dead_letter\"\ndead_letter_topic = \"{dead}\"\n");
    let port = testkit::free_port();
    // librdkafka's message debug lines show the error code each retry got.
    let mut args = walpost_args(&w, &toml, port);
    args.extend(["--kafka-property".to_string(), "debug=msg".to_string()]);
    let walpost = Walpost::start(&args, &[]);
    assert!(w.wait_for_slot(WAIT), "slot not created:\n{}", walpost.log_text());
    insert_batches(&w, 0, 2, 50, AGGREGATES, TYPES);
    wait_acknowledged(&w, 100);

    let survivor = 1;
    for id in c.node_ids().into_iter().filter(|&id| id != survivor) {
        c.stop(id).unwrap();
    }
    let held = acknowledged(&w);
    insert_batches(&w, 2, 10, 50, AGGREGATES, TYPES);
    // Long enough for many retries, well short of the 60 s delivery watchdog.
    std::thread::sleep(Duration::from_secs(10));
    assert_eq!(acknowledged(&w), held, "acks=all with one in-sync replica of 3 (min 2) must acknowledge nothing");
    let log = walpost.log_text();
    assert!(log.contains("Not enough in-sync replicas"), "the producer never saw NOT_ENOUGH_REPLICAS:\n{log}");
    assert!(
        std::fs::read_to_string(c.log_path(survivor).unwrap()).unwrap().contains("NotEnoughReplicasException"),
        "broker {survivor} never refused an append for lack of in-sync replicas"
    );
    assert!(!log.contains("dead-letter topic"), "a record went to the dead-letter topic:\n{log}");
    let down: Vec<i32> = c.node_ids().into_iter().filter(|&id| id != survivor).collect();
    for id in down {
        c.start_again(id).unwrap();
    }
    let records = consume_every_committed(&w, WAIT);
    assert!(
        records.iter().all(|r| r.topic != dead),
        "dead letters: {:?}",
        records.iter().filter(|r| r.topic == dead).count()
    );
    assert!(
        !topics_with_prefix(&w.kafka_bootstrap, &w.topic_prefix).contains(&dead),
        "the dead-letter topic was created"
    );
    assert_eq!(w.committed_rows().len(), 600);
    assert_all_delivered_once(&w, &records);
    let m = scrape(port);
    assert!(
        !m.lines().any(|l| l.starts_with("walpost_dead_letters_total{") && !l.ends_with(" 0")),
        "dead letters counted:\n{m}"
    );
    assert_no_session_restart(&walpost, port);
    eprintln!("kafka_not_enough_replicas: {} s", t0.elapsed().as_secs());
}

/// The leader kill with `--delivery exactly-once`: a read_committed consumer sees every
/// event exactly once.
#[test]
fn kafka_leader_kill_exactly_once_no_duplicates() {
    let mut guard = cluster();
    let c = guard.as_mut().unwrap();
    let t0 = Instant::now();
    let w = World::on(testkit::shared_postgres(), &c.bootstrap(), "kc-eos-kill");
    create_topics(c, &w, LED_BY_1);
    let victim = c.leader_of(&w.topic("order"), 0).unwrap();
    let progress = format!("{}-progress", w.db);
    let toml = format!("delivery = \"exactly-once\"\n[exactly_once]\nprogress_topic = \"{progress}\"\n");
    let port = testkit::free_port();
    let walpost = Walpost::start(&walpost_args(&w, &toml, port), &[]);
    assert!(w.wait_for_slot(WAIT), "slot not created:\n{}", walpost.log_text());
    let stop = AtomicBool::new(false);
    let events = std::thread::scope(|s| {
        let writer = s.spawn(|| write_load(&w, &stop, LOAD_EVENTS, Duration::from_millis(100)));
        wait_acknowledged(&w, 3_000);
        c.kill(victim).unwrap();
        c.wait_for_leader(&w.topic("order"), 0, WAIT, |l| l != victim).unwrap();
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap()
    });
    let deadline = Instant::now() + WAIT;
    let records = loop {
        let records = read_all_committed(&w.kafka_bootstrap, &w.topic_prefix);
        if records.len() >= events as usize || Instant::now() > deadline {
            break records;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(w.committed_rows().len(), events as usize);
    assert_all_delivered_once(&w, &records);
    let m = scrape(port);
    eprintln!(
        "kafka_leader_kill_exactly_once: {events} events, session restarts caused by Kafka: {:?}, {} s",
        series(&m, "walpost_reconnects_total{cause=\"kafka\"}"),
        t0.elapsed().as_secs()
    );
    assert_gaps_bounded("kafka_leader_kill_exactly_once", &records);
    c.start_again(victim).unwrap();
}

/// `walpost check` with `w`'s settings plus `toml`: (exit status 0, output).
fn walpost_check(w: &World, toml: &str) -> (bool, String) {
    let path = std::env::temp_dir().join(format!("{}-{}.toml", w.db, testkit::unique_name("check")));
    std::fs::write(&path, toml).unwrap();
    let mut args = vec!["check".to_string(), "--config".to_string(), path.display().to_string()];
    args.extend(w.args().into_iter().skip(1));
    let out =
        std::process::Command::new(env!("CARGO_BIN_EXE_walpost")).args(&args).output().expect("run walpost check");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// `walpost check` judges durability (acks=all): RF 3 / min.insync.replicas 2 on the
/// cluster is fine; the single test broker's RF 1 / min.insync.replicas 1 is a warning,
/// for an existing topic and for topics created on first use (the brokers' defaults).
#[test]
fn walpost_check_warns_about_weak_topic_durability() {
    {
        let mut guard = cluster();
        let c = guard.as_mut().unwrap();
        let w = World::on(testkit::shared_postgres(), &c.bootstrap(), "kc-check");
        create_topics(c, &w, SPREAD);
        let (ok, out) = walpost_check(&w, "on_permanent_error = \"dead_letter\"\n");
        assert!(ok, "{out}");
        assert!(
            out.contains("ok    durability: 3 topic(s) with replication factor >= 2 and min.insync.replicas >= 2"),
            "{out}"
        );
        // The dead-letter topic does not exist yet: the cluster's defaults (3 / 2) decide.
        assert!(
            out.contains("ok    durability: topics created on first use get default.replication.factor >= 2"),
            "{out}"
        );
        assert!(!out.contains("warn  durability"), "{out}");
    }
    let w = World::new("kc-check-single");
    let (ok, out) = walpost_check(&w, "");
    assert!(ok, "a durability warning must not fail the check:\n{out}");
    assert!(
        out.contains("warn  durability: topics created on first use get the brokers' defaults, replication factor 1 and min.insync.replicas 1"),
        "{out}"
    );
    let topic = w.topic("order");
    testkit::shared_kafka().create_topic(&topic, 3).unwrap();
    let (ok, out) = walpost_check(&w, "");
    assert!(ok, "{out}");
    let expected = texts::kafka::durability_warning(&topic, "replication factor 1 and min.insync.replicas 1");
    assert!(out.contains(&format!("warn  {expected}")), "{out}");
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

/// The silent producer after a single-broker restart: once the broker is back,
/// the producer resumes within librdkafka's reconnect backoff (walpost caps it at 1 s,
/// `reconnect.backoff.max.ms`; librdkafka's own cap of 10 s left the producer waiting up to
/// 10 s after the broker was back), without a session restart and far from the 60 s
/// delivery watchdog.
#[test]
fn regression_producer_resumes_within_the_reconnect_backoff_after_a_broker_restart() {
    let mut kafka = own_kafka();
    let w = World::on(testkit::shared_postgres(), &kafka.bootstrap(), "kc-single-restart");
    create_topics_on(&kafka.bootstrap(), &w, &[&[1], &[1], &[1]], 1);
    let port = testkit::free_port();
    let walpost = Walpost::start(&walpost_args(&w, "", port), &[]);
    assert!(w.wait_for_slot(WAIT), "slot not created:\n{}", walpost.log_text());
    let stop = AtomicBool::new(false);
    let back_at = std::thread::scope(|s| {
        let writer = s.spawn(|| write_load(&w, &stop, 0, Duration::from_millis(100)));
        wait_acknowledged(&w, 1_000);
        kafka.stop().unwrap();
        // Down long enough for the client's reconnect backoff to reach its cap.
        std::thread::sleep(Duration::from_secs(15));
        kafka.start_again().unwrap();
        let back_at = now_ms();
        std::thread::sleep(Duration::from_secs(5));
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap();
        back_at
    });
    let records = consume_every_committed(&w, WAIT);
    assert_all_delivered_once(&w, &records);
    assert_no_session_restart(&walpost, port);
    let first_after = records.iter().filter_map(|r| r.timestamp).filter(|&t| t >= back_at - 2_000).min().unwrap();
    let resumed_ms = first_after - back_at;
    eprintln!("single broker restart: first record appended {resumed_ms} ms after the broker was ready again");
    assert!(
        resumed_ms < RESUME_BOUND.as_millis() as i64,
        "the producer resumed {resumed_ms} ms after the broker was back (reconnect backoff not capped?)"
    );
}

/// How soon after a restarted broker accepts connections the producer must have written
/// again: the 1 s reconnect backoff cap plus a metadata round trip, with room for a loaded
/// machine; librdkafka's default cap (10 s) does not fit.
const RESUME_BOUND: Duration = Duration::from_secs(4);
