//! Active/standby: two `walpost run` on one slot, one streams and the other waits as a
//! hot standby; the standby takes over after a `kill -9` or a SIGTERM of the active one,
//! nothing is lost, order is kept, and in exactly-once nothing is published twice. Two
//! `walpost inbox` of one group share the partitions and a `kill -9` of one stores
//! nothing twice. Take-over times are printed (`[ha] ...`) for bench/results/takeover.md;
//! they are asserted only loosely, as timings on a shared machine are.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::drills::{http_get, metric};
use crate::inbox_ingest::{
    count, create_topic, inbox_args, json_records, produce, start_inbox, stored_offsets, wait_for_messages,
};
use crate::support::*;

const WAIT: Duration = Duration::from_secs(120);
/// A loose bound: the target is 5 s after a kill -9 and 2 s after a SIGTERM;
/// the medians go to bench/results, this only catches a take-over that does not happen
/// in a reasonable time (a backoff grown to its cap, a standby that gave up).
const TAKEOVER_BOUND: Duration = Duration::from_secs(20);

/// One instance of the pair: the process and its metrics port.
struct Instance {
    p: Walpost,
    port: u16,
}

impl Instance {
    fn start(args: &[String]) -> Instance {
        let port = testkit::free_port();
        let mut args = args.to_vec();
        args.extend(["--metrics-addr".into(), format!("127.0.0.1:{port}")]);
        Instance { p: Walpost::start(&args, &[]), port }
    }

    fn active(&self) -> Option<f64> {
        metric(self.port, "walpost_active")
    }

    fn is_standby(&self) -> bool {
        let (code, body) = http_get(self.port, "/readyz");
        code == 200 && body.contains("ready: a hot standby") && self.active() == Some(0.0)
    }
}

/// A background writer: transactions of 10 rows over 10 aggregates every 50 ms.
fn writer(w: &World) -> (Arc<AtomicBool>, std::thread::JoinHandle<u32>) {
    let stop = Arc::new(AtomicBool::new(false));
    let (pg, db, flag) = (w.pg, w.db.clone(), stop.clone());
    let handle = std::thread::spawn(move || {
        let mut batch = 0;
        while !flag.load(Ordering::SeqCst) {
            insert_batches_in(pg, &db, batch, 1, 10, 10, &["order", "payment"]);
            batch += 1;
            std::thread::sleep(Duration::from_millis(50));
        }
        batch
    });
    (stop, handle)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Stop {
    Kill9,
    Term,
}

/// Runs a pair under load and stops the active instance `rounds` times in turn, starting
/// it again as the new standby each time; returns the take-over times (from the stop to
/// the other instance's `walpost_active 1`).
fn takeovers(w: &World, args: &[String], how: Stop, rounds: usize) -> Vec<Duration> {
    let mut a = Instance::start(args);
    assert!(w.wait_for_slot(WAIT), "{}", a.p.log_text());
    assert!(testkit::wait_until(WAIT, || a.active() == Some(1.0)), "{}", a.p.log_text());
    let mut b = Instance::start(args);
    assert!(
        testkit::wait_until(WAIT, || b.is_standby()),
        "not a standby: {:?}\n{}",
        http_get(b.port, "/readyz"),
        b.p.log_text()
    );
    let readyz = http_get(b.port, "/readyz").1;
    assert!(readyz.contains("is in use by server process"), "the standby names the holder: {readyz}");
    let load = writer(w);
    let mut times = Vec::new();
    for round in 0..rounds {
        std::thread::sleep(Duration::from_millis(1500));
        let stopped = Instant::now();
        match how {
            Stop::Kill9 => a.p.kill9(),
            Stop::Term => {
                let status = a.p.terminate(Duration::from_secs(60));
                assert!(status.is_some_and(|s| s.success()), "round {round}: {}", a.p.log_text());
            }
        }
        let took_over = testkit::wait_until(TAKEOVER_BOUND, || b.active() == Some(1.0));
        let took = stopped.elapsed();
        assert!(took_over, "round {round}: no take-over within {TAKEOVER_BOUND:?}:\n{}", b.p.log_text());
        times.push(took);
        // The holder was logged once while it waited, not once per poll.
        let held = b.p.log_text().matches("this instance is a hot standby").count();
        assert_eq!(held, 1, "round {round}: the standby logged its holder {held} times:\n{}", b.p.log_text());
        // The stopped one comes back as the new standby.
        std::mem::swap(&mut a, &mut b);
        b = Instance::start(args);
        assert!(testkit::wait_until(WAIT, || b.is_standby()), "round {round}: {}", b.p.log_text());
    }
    load.0.store(true, Ordering::SeqCst);
    load.1.join().expect("the writer");
    assert_eq!(a.active(), Some(1.0));
    assert!(b.is_standby());
    assert!(a.p.terminate(Duration::from_secs(60)).is_some_and(|s| s.success()), "{}", a.p.log_text());
    times
}

fn report(what: &str, times: &[Duration]) {
    let ms: Vec<u128> = times.iter().map(Duration::as_millis).collect();
    eprintln!("[ha] {what}: take-over in {ms:?} ms, median {} ms", median(times.to_vec()).as_millis());
}

#[test]
fn ha_pair_takes_over_after_kill9_five_times_in_turn() {
    let w = World::new("ha-kill");
    let times = takeovers(&w, &w.args(), Stop::Kill9, 5);
    report("kill -9, at-least-once", &times);
    let records = consume_every_committed(&w, WAIT);
    let a = audit(&w, &records);
    assert!(a.lost.is_empty(), "lost {:?}", &a.lost[..a.lost.len().min(10)]);
    assert!(a.reordered.is_empty() && a.phantoms.is_empty() && a.wrong_content.is_empty(), "{a:?}");
    eprintln!("[ha] kill -9, at-least-once: {} events, {} duplicates", w.committed_rows().len(), a.duplicates);
}

#[test]
fn ha_pair_hands_over_on_sigterm_five_times_in_turn() {
    let w = World::new("ha-term");
    let times = takeovers(&w, &w.args(), Stop::Term, 5);
    report("SIGTERM, at-least-once", &times);
    let records = consume_every_committed(&w, WAIT);
    let a = audit(&w, &records);
    assert!(a.lost.is_empty(), "lost {:?}", &a.lost[..a.lost.len().min(10)]);
    assert!(a.reordered.is_empty() && a.phantoms.is_empty() && a.wrong_content.is_empty(), "{a:?}");
    eprintln!("[ha] SIGTERM, at-least-once: {} events, {} duplicates", w.committed_rows().len(), a.duplicates);
}

/// In exactly-once the new active instance's transactional id fences the old one: no
/// record is read twice under read_committed across three kills.
#[test]
fn ha_pair_in_exactly_once_takes_over_with_no_duplicate() {
    let w = World::new("ha-eos");
    let path = std::env::temp_dir().join(format!("{}.toml", testkit::unique_name("ha-eos")));
    std::fs::write(
        &path,
        format!("delivery = \"exactly-once\"\n[exactly_once]\nprogress_topic = \"{}-progress\"\n", w.db),
    )
    .unwrap();
    let mut args = vec!["--config".to_string(), path.display().to_string()];
    args.extend(w.args());
    let times = takeovers(&w, &args, Stop::Kill9, 3);
    report("kill -9, exactly-once", &times);
    let deadline = Instant::now() + WAIT;
    let records = loop {
        let records = read_all_committed(&w.kafka_bootstrap, &w.topic_prefix);
        let seen: BTreeSet<i64> = records.iter().map(Consumed::event_id).collect();
        if w.committed_rows().keys().all(|id| seen.contains(id)) || Instant::now() > deadline {
            break records;
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    let a = audit(&w, &records);
    assert!(a.lost.is_empty(), "lost {:?}", &a.lost[..a.lost.len().min(10)]);
    assert_eq!(a.duplicates, 0, "duplicates under read_committed: {a:?}");
    assert!(a.reordered.is_empty() && a.phantoms.is_empty() && a.wrong_content.is_empty(), "{a:?}");
}

/// Two `walpost inbox` of one group share the partitions; a `kill -9` of one moves its
/// partitions to the other (after the session timeout), which starts at the offsets
/// stored with the rows: every record stored once, none lost.
#[test]
fn ha_two_inbox_instances_share_a_group_and_a_kill9_loses_and_doubles_nothing() {
    let inbox = World::new("ha-inbox");
    let topic = format!("{}events", inbox.topic_prefix);
    create_topic(&topic, 4);
    produce(&inbox.kafka_bootstrap, &topic, &json_records("h", 0, 6_000, 31));
    let mut args = inbox_args(&inbox, &topic, "pair", &["--create-schema"]);
    args.extend(["--kafka-property".into(), "session.timeout.ms=6000".into()]);
    let mut a = start_inbox(&args, &[]);
    let b = start_inbox(&args, &[]);
    let both = testkit::wait_until(WAIT, || {
        a.log_text().contains("partitions assigned") && b.log_text().contains("partitions assigned")
    });
    assert!(both, "both instances hold partitions:\n{}\n{}", a.log_text(), b.log_text());
    produce(&inbox.kafka_bootstrap, &topic, &json_records("h", 6_000, 6_000, 31));
    assert!(testkit::wait_until(WAIT, || count(&inbox, "SELECT count(*) FROM inbox.messages") > 7_000));
    a.kill9();
    produce(&inbox.kafka_bootstrap, &topic, &json_records("h", 12_000, 4_000, 31));
    wait_for_messages(&inbox, 16_000, &b);
    let stored = count(&inbox, "SELECT count(*) FROM inbox.messages");
    assert_eq!(stored, 16_000, "one row per event id");
    let ids: BTreeSet<String> =
        inbox.sql("SELECT event_id FROM inbox.messages").lines().filter(|l| !l.is_empty()).map(str::to_owned).collect();
    assert_eq!(ids, (0..16_000).map(|i| format!("h-{i}")).collect::<BTreeSet<_>>());
    let offsets = stored_offsets(&inbox, "pair");
    for ((t, partition), high) in high_watermarks(&inbox.kafka_bootstrap, &topic) {
        assert_eq!(offsets.get(&(t, partition)), Some(&high), "partition {partition}");
    }
}
