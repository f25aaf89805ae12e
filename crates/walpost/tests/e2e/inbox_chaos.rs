//! The whole design under faults: outbox -> `walpost run` -> Kafka -> `walpost
//! inbox` -> handler workers that call only the SQL API and write one effect per message
//! in the transaction of `inbox.complete`. kill -9 of `walpost run`, of `walpost inbox`
//! and of workers (12 kills), one Kafka restart and one restart of the inbox's
//! PostgreSQL: every outbox event has exactly one effect per handler, none is lost, and
//! the ordered handler acted on each aggregate's events in commit order. Once with
//! `walpost run` at least once, once exactly once.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use testkit::{PgOptions, Postgres, StopMode};

use crate::inbox_ingest::{count, inbox_args, start_inbox};
use crate::support::{own_kafka, Walpost, World};

const WAIT: Duration = Duration::from_secs(240);
const EVENTS: u32 = 2_000;
const HANDLERS: [(&str, bool); 2] = [("audit", false), ("ledger", true)];

/// A handler worker: a shell loop of two psql calls per batch. The claim (a short
/// transaction of its own), then one session that runs, for each message, the effect and
/// the receipt in one statement, so in one transaction. A lease of 3 s: a worker killed
/// between its claim and its completes delays its messages by 3 s. Two processes per
/// batch rather than one per message: on a loaded 2-core CI machine the per-message form
/// managed 14 effects/s and the test's wait ran out (CI stop 36).
fn worker(pg: &Postgres, url: &str, handler: &str) -> Walpost {
    let psql = pg.psql_path().display().to_string();
    let script = format!(
        r#"while true; do
  rows=$("{psql}" -XAtq "{url}" -F ' ' -c "SELECT event_id, lease_token FROM inbox.claim('{handler}', 10, '3 seconds')" 2>/dev/null)
  if [ -z "$rows" ]; then sleep 0.2; continue; fi
  echo "$rows" | while read id token; do
    echo "WITH c AS (SELECT inbox.complete('{handler}', '$id', '$token') AS ok) INSERT INTO effects (handler, event_id) SELECT '{handler}', '$id' FROM c WHERE ok;"
  done | "{psql}" -XAtq "{url}" >/dev/null 2>&1
done"#
    );
    let mut cmd = Command::new("sh");
    // A group of its own, so that a kill takes its psql processes too, mid-transaction.
    cmd.arg("-c").arg(script).process_group(0);
    Walpost::spawn(cmd)
}

/// kill -9 of a worker's whole process group: the loop and the psql it is running.
fn kill9_worker(w: &mut Walpost) {
    let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", w.pid())]).status();
    w.kill9();
}

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn end_to_end_under_faults(name: &str, exactly_once: bool, seed: u64) {
    let mut kafka = own_kafka();
    let bootstrap = kafka.bootstrap();
    let outbox = World::on(testkit::shared_postgres(), &bootstrap, &format!("{name}-out"));
    let inbox_pg: &'static Postgres =
        Box::leak(Box::new(Postgres::start(PgOptions::default()).expect("start postgres")));
    let inbox = World::on(inbox_pg, &bootstrap, &format!("{name}-in"));

    let config = std::env::temp_dir().join(format!("{}.toml", testkit::unique_name("inbox-chaos")));
    let delivery = if exactly_once { "delivery = \"exactly-once\"\n" } else { "" };
    std::fs::write(&config, format!("{delivery}[pipeline]\nmax_backoff_secs = 2\ndelivery_timeout_secs = 10\n"))
        .unwrap();
    let mut run_args = outbox.args();
    run_args.extend(["--config".into(), config.display().to_string()]);
    let topic = outbox.topic("order");
    let mut inbox_args = inbox_args(&inbox, &topic, "svc", &["--create-schema"]);
    inbox_args.extend(["--kafka-property".into(), "session.timeout.ms=6000".into()]);

    let mut run = Walpost::start(&run_args, &[]);
    assert!(outbox.wait_for_slot(WAIT), "{}", run.log_text());
    let mut ingest = start_inbox(&inbox_args, &[]);
    assert!(
        testkit::wait_until(WAIT, || inbox.try_sql("SELECT 1 FROM inbox.handlers").is_ok()),
        "{}",
        ingest.log_text()
    );
    for (handler, ordered) in HANDLERS {
        inbox.sql(&format!(
            "SELECT inbox.register_handler('{handler}', '{{}}', '{{}}', 1000, '100 milliseconds', '1 second', {ordered})"
        ));
    }
    inbox.sql("CREATE TABLE effects (n bigserial PRIMARY KEY, handler text NOT NULL, event_id text NOT NULL)");
    let mut workers: Vec<(String, Walpost)> = Vec::new();
    for (handler, _) in HANDLERS {
        for _ in 0..2 {
            workers.push((handler.to_owned(), worker(inbox_pg, &inbox.superuser_url, handler)));
        }
    }

    // The writer: 20 transactions of 100 events over 40 aggregates, while the faults come.
    let writing = Arc::new(AtomicBool::new(true));
    let writer = {
        let (pg, db, writing) = (outbox.pg, outbox.db.clone(), writing.clone());
        std::thread::spawn(move || {
            for b in 0..EVENTS / 100 {
                crate::support::insert_batches_in(pg, &db, b, 1, 100, 40, &["order"]);
                std::thread::sleep(Duration::from_millis(400));
            }
            writing.store(false, Ordering::SeqCst);
        })
    };

    let mut rng = Rng(seed);
    let mut kills = 0;
    let started = Instant::now();
    for step in 0..14 {
        std::thread::sleep(Duration::from_millis(300 + rng.below(900)));
        match step {
            4 => {
                eprintln!("[inbox-chaos] step {step}: restart Kafka");
                kafka.stop().expect("stop kafka");
                std::thread::sleep(Duration::from_secs(2));
                kafka.start_again().expect("start kafka");
            }
            9 => {
                eprintln!("[inbox-chaos] step {step}: restart the inbox's PostgreSQL");
                inbox_pg.restart(StopMode::Fast).expect("restart postgres");
            }
            _ => {
                kills += 1;
                match rng.below(3) {
                    0 => {
                        eprintln!("[inbox-chaos] step {step}: kill -9 walpost run");
                        run.kill9();
                        run = Walpost::start(&run_args, &[]);
                    }
                    1 => {
                        eprintln!("[inbox-chaos] step {step}: kill -9 walpost inbox");
                        ingest.kill9();
                        ingest = start_inbox(&inbox_args, &[]);
                    }
                    _ => {
                        let i = rng.below(workers.len() as u64) as usize;
                        eprintln!("[inbox-chaos] step {step}: kill -9 worker {i} ({})", workers[i].0);
                        kill9_worker(&mut workers[i].1);
                        let handler = workers[i].0.clone();
                        workers[i].1 = worker(inbox_pg, &inbox.superuser_url, &handler);
                    }
                }
            }
        }
    }
    assert!(kills >= 12, "{kills} kills");
    writer.join().unwrap();
    assert!(!writing.load(Ordering::SeqCst));
    let committed: BTreeSet<i64> = outbox.committed_rows().keys().copied().collect();
    assert_eq!(committed.len(), EVENTS as usize);
    let expected = 2 * committed.len() as i64;
    let done = testkit::wait_until(WAIT, || count(&inbox, "SELECT count(*) FROM effects") >= expected);
    assert!(
        done,
        "effects {} of {expected} after {:?}; messages {}; effects by handler:\n{}deliveries by handler, state, leased:\n{}\nrun:\n{}\ninbox:\n{}",
        count(&inbox, "SELECT count(*) FROM effects"),
        started.elapsed(),
        count(&inbox, "SELECT count(*) FROM inbox.messages"),
        inbox.sql("SELECT handler, count(*) FROM effects GROUP BY 1 ORDER BY 1"),
        inbox.sql(
            "SELECT handler, state, lease_until > now() AS leased, count(*), max(attempts) \
             FROM inbox.deliveries GROUP BY 1, 2, 3 ORDER BY 1, 2, 3"
        ),
        run.log_text(),
        ingest.log_text()
    );
    std::thread::sleep(Duration::from_secs(2));
    for (handler, ordered) in HANDLERS {
        let effects: Vec<i64> = inbox
            .sql(&format!("SELECT event_id FROM effects WHERE handler = '{handler}' ORDER BY n"))
            .lines()
            .filter(|l| !l.is_empty())
            .map(|l| l.parse().unwrap())
            .collect();
        let distinct: BTreeSet<i64> = effects.iter().copied().collect();
        assert_eq!(effects.len(), distinct.len(), "{handler}: an effect happened twice");
        let lost: Vec<&i64> = committed.difference(&distinct).collect();
        assert!(lost.is_empty(), "{handler}: lost {} events: {:?}", lost.len(), &lost[..lost.len().min(20)]);
        assert_eq!(distinct, committed, "{handler}: one effect per outbox event");
        if ordered {
            // Per aggregate, effects in outbox id order (commit order within an aggregate).
            let aggregates: BTreeMap<i64, String> =
                outbox.committed_rows().into_iter().map(|(id, row)| (id, row.aggregate_id)).collect();
            let mut last: BTreeMap<&str, i64> = BTreeMap::new();
            for id in &effects {
                let aggregate = aggregates[id].as_str();
                if let Some(before) = last.insert(aggregate, *id) {
                    assert!(before < *id, "{handler}: aggregate {aggregate}: {id} acted on after {before}");
                }
            }
        }
    }
    let receipts = count(&inbox, "SELECT count(*) FROM inbox.receipts");
    assert_eq!(receipts, expected, "one receipt per handler and event");
    assert_eq!(count(&inbox, "SELECT count(*) FROM inbox.messages"), committed.len() as i64);
    eprintln!("[inbox-chaos] {name}: {kills} kills, {expected} effects in {:?}", started.elapsed());
}

#[test]
fn inbox_chaos_at_least_once_every_effect_once_per_handler() {
    end_to_end_under_faults("inbox-chaos-alo", false, 0x9e37_79b9_7f4a_7c15);
}

#[test]
fn inbox_chaos_exactly_once_every_effect_once_per_handler() {
    end_to_end_under_faults("inbox-chaos-eos", true, 0x2545_f491_4f6c_dd1d);
}
