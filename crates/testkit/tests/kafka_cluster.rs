//! Smoke tests of the 3-node Kafka cluster harness: real brokers, a real leader loss, a
//! real rolling restart. Each test starts its own cluster (~10 s) and takes 30-50 s on
//! the shared 2-core machine.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use testkit::{KafkaCluster, KafkaClusterOptions};

/// One cluster at a time: `cargo test` runs a binary's tests in parallel, and two
/// clusters (six JVMs) on two shared cores only make each test slower.
static ONE_CLUSTER: Mutex<()> = Mutex::new(());

/// Produces `n` records of 100 bytes with acks=all (ProducerPerformance, one JVM).
fn produce(c: &KafkaCluster, topic: &str, n: u32, extra: &[&str]) -> String {
    let bootstrap = format!("bootstrap.servers={}", c.bootstrap());
    let n_s = n.to_string();
    let mut args = vec![
        "--topic",
        topic,
        "--num-records",
        &n_s,
        "--record-size",
        "100",
        "--throughput",
        "-1",
        "--producer-props",
        &bootstrap,
        "acks=all",
        "retries=2147483647",
        "delivery.timeout.ms=60000",
    ];
    args.extend_from_slice(extra);
    let out = c.run_tool("org.apache.kafka.tools.ProducerPerformance", &args).expect("ProducerPerformance");
    assert!(out.contains(&format!("{n} records sent")), "{out}");
    out
}

/// Sum of the partitions' end offsets (GetOffsetShell): the number of records, since
/// nothing is deleted or compacted here.
fn count(c: &KafkaCluster, topic: &str) -> u64 {
    let out = c
        .run_tool("org.apache.kafka.tools.GetOffsetShell", &["--bootstrap-server", &c.bootstrap(), "--topic", topic])
        .expect("GetOffsetShell");
    out.lines().filter_map(|l| l.rsplit(':').next()?.trim().parse::<u64>().ok()).sum()
}

fn leaders(c: &KafkaCluster, topic: &str, partitions: i32) -> Vec<i32> {
    (0..partitions).map(|p| c.leader_of(topic, p).expect("leader")).collect()
}

fn assert_fully_replicated(c: &KafkaCluster) {
    for id in c.started_ids() {
        let m = c.metadata_from(id, None).expect("metadata");
        assert_eq!(m.broker_ids(), c.node_ids(), "node {id}");
        assert!(m.under_replicated().is_empty(), "node {id}: under-replicated {:?}", m.under_replicated());
    }
}

#[test]
fn kafka_cluster_leader_kill_moves_leadership_and_keeps_serving() {
    let _one = ONE_CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    let t0 = Instant::now();
    let mut c = KafkaCluster::start(KafkaClusterOptions::default()).expect("start cluster");
    eprintln!("cluster of 3 started in {:?}", t0.elapsed());
    assert_eq!(c.node_ids(), vec![1, 2, 3]);
    assert_eq!(c.bootstrap().split(',').count(), 3);
    assert_eq!(c.metadata(None).expect("metadata").broker_ids(), vec![1, 2, 3]);

    let topic = "rf3";
    c.create_topic(topic, 3, 3).expect("create topic");
    let m = c.metadata(Some(&[topic])).expect("metadata");
    let t = m.topic(topic).expect("topic");
    assert_eq!(t.partitions.len(), 3);
    for p in &t.partitions {
        assert_eq!(p.replicas.len(), 3, "{p:?}");
        assert_eq!(p.isr.len(), 3, "{p:?}");
    }
    let before = leaders(&c, topic, 3);
    let spread: BTreeSet<i32> = before.iter().copied().collect();
    assert_eq!(spread.len(), 3, "leaders not spread over the brokers: {before:?}");

    // Broker defaults really are the cluster ones.
    let cfg = c
        .run_tool(
            "kafka.admin.ConfigCommand",
            &[
                "--bootstrap-server",
                &c.bootstrap(),
                "--entity-type",
                "brokers",
                "--entity-name",
                "1",
                "--describe",
                "--all",
            ],
        )
        .expect("ConfigCommand");
    for want in ["min.insync.replicas=2", "default.replication.factor=3", "transaction.state.log.min.isr=2"] {
        assert!(cfg.contains(want), "{want} missing in:\n{cfg}");
    }

    produce(&c, topic, 1000, &[]);
    assert_eq!(count(&c, topic), 1000);

    let victim = c.leader_of(topic, 0).expect("leader");
    let t1 = Instant::now();
    c.kill(victim).expect("kill");
    let new_leader = c.wait_for_leader(topic, 0, Duration::from_secs(30), |l| l != victim).expect("leadership moves");
    eprintln!("leader of {topic}/0 moved from {victim} to {new_leader} in {:?} after SIGKILL", t1.elapsed());
    c.wait_healthy(Duration::from_secs(30)).expect("2-node cluster settles");
    let m = c.metadata(Some(&[topic])).expect("metadata");
    assert!(!m.broker_ids().contains(&victim), "{:?}", m.broker_ids());
    for p in &m.topic(topic).expect("topic").partitions {
        assert_ne!(p.leader, Some(victim), "{p:?}");
        assert!(!p.isr.contains(&victim), "{p:?}");
        assert_eq!(p.isr.len(), 2, "{p:?}");
    }

    // Still serving with acks=all (2 in-sync replicas >= min.insync.replicas), and
    // nothing acknowledged before the kill is lost.
    produce(&c, topic, 1000, &[]);
    assert_eq!(count(&c, topic), 2000);
    // Transactions work on the 2 remaining nodes (transaction state log: RF 3, min ISR 2).
    let out = produce(&c, "rf3-tx", 200, &["--transactional-id", "smoke-tx", "--transaction-duration-ms", "100"]);
    assert!(out.contains("200 records sent"), "{out}");

    let t2 = Instant::now();
    c.start_again(victim).expect("start again");
    eprintln!("node {victim} back and in every ISR {:?} after start_again", t2.elapsed());
    assert_fully_replicated(&c);
    assert_eq!(count(&c, topic), 2000);
}

#[test]
fn kafka_cluster_rolling_restart_returns_to_full_isr() {
    let _one = ONE_CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    let t0 = Instant::now();
    let mut c = KafkaCluster::start(KafkaClusterOptions::default()).expect("start cluster");
    eprintln!("cluster of 3 started in {:?}", t0.elapsed());
    let topic = "rolling";
    c.create_topic(topic, 3, 3).expect("create topic");
    produce(&c, topic, 500, &[]);
    let mut expected = 500;

    for id in c.node_ids() {
        let t1 = Instant::now();
        c.stop(id).expect("stop");
        let stop_time = t1.elapsed();
        // Controlled shutdown moved every leadership away before the JVM exited.
        for p in 0..3 {
            let l = c.wait_for_leader(topic, p, Duration::from_secs(20), |l| l != id).expect("leader");
            assert_ne!(l, id);
        }
        produce(&c, topic, 200, &[]);
        expected += 200;
        let t2 = Instant::now();
        c.start_again(id).expect("start again");
        eprintln!("node {id}: clean stop {stop_time:?}, back in every ISR {:?} after start_again", t2.elapsed());
        assert_fully_replicated(&c);
    }
    assert_eq!(count(&c, topic), expected);
    assert_eq!(c.started_ids(), vec![1, 2, 3]);

    let dir = c.dir().to_path_buf();
    drop(c);
    if std::env::var_os("WALPOST_KEEP_TEST_DIRS").is_none() {
        assert!(!dir.exists(), "temp dir not removed: {}", dir.display());
    }
}
