//! The whole design under faults: outbox -> `walpost run` -> Kafka -> `walpost
//! inbox` -> handler workers that call only the SQL API and write one effect per message
//! in the transaction of its receipt. Two handlers' workers complete message by message
//! (`inbox.complete`); a third, ordered handler's workers complete a batch of up to 20
//! (`inbox.complete_many`) and write the effects of exactly the ids it returns, in one
//! transaction held open a moment after the writes. kill -9 of `walpost run`, of `walpost
//! inbox` and of workers (12 kills), kill -9 of batched workers while their transaction
//! holds a batch's effects and receipts uncommitted (at least 3 of 6 tries land there:
//! the server rolls the batch back), one Kafka restart and one restart of the inbox's
//! PostgreSQL: every outbox event has exactly one effect per handler, none is lost, and
//! the ordered handlers acted on each aggregate's events in commit order. Once with
//! `walpost run` at least once, once exactly once.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use testkit::{PgOptions, Postgres, StopMode};

use crate::inbox_ingest::{count, inbox_args, inbox_schema_complete, start_inbox};
use crate::support::{own_kafka, Walpost, World};

const WAIT: Duration = Duration::from_secs(240);
const EVENTS: u32 = 2_000;
/// Name, ordered, batched: the batched handler is ordered so that the batch path is held
/// to commit order per aggregate too.
const HANDLERS: [(&str, bool, bool); 3] = [("audit", false, false), ("ledger", true, false), ("billing", true, true)];
/// Messages a batched worker claims and completes in one transaction.
const BATCH: u32 = 20;
/// How long a batched worker's transaction stays open after its writes: most of a busy
/// worker's time, so that a kill -9 lands there often.
const BATCH_PAUSE: &str = "0.2";

/// A worker process and what the kills need to know of it.
struct Worker {
    handler: &'static str,
    batched: bool,
    /// Its psql sessions' application_name: how the server's view of a batch in flight
    /// (pg_stat_activity) is found.
    session: String,
    process: Walpost,
}

impl Worker {
    fn start(pg: &Postgres, url: &str, handler: &'static str, batched: bool, session: String) -> Worker {
        let process =
            if batched { batched_worker(pg, url, handler, &session) } else { worker(pg, url, handler, &session) };
        Worker { handler, batched, session, process }
    }

    fn restart(&mut self, pg: &Postgres, url: &str) {
        kill9_worker(&mut self.process);
        *self = Worker::start(pg, url, self.handler, self.batched, self.session.clone());
    }
}

/// A handler worker: a shell loop of two psql calls per batch. The claim (a short
/// transaction of its own), then one session that runs, for each message, the effect and
/// the receipt in one statement, so in one transaction. A lease of 3 s: a worker killed
/// between its claim and its completes delays its messages by 3 s. Two processes per
/// batch rather than one per message: on a loaded 2-core CI machine the per-message form
/// managed 14 effects/s and the test's wait ran out (CI stop 36).
fn worker(pg: &Postgres, url: &str, handler: &str, session: &str) -> Walpost {
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
    shell_worker(script, session)
}

/// A batched worker: a shell loop of two psql calls per batch. The claim of up to
/// [`BATCH`] messages, as two arrays in claim order; then one transaction, its statements
/// sent one by one (psql reads them from stdin), so that a kill between them leaves it
/// open and the server rolls it back: one statement writes the receipts
/// (`inbox.complete_many`) and the effects of exactly the ids it returns, in claim order
/// (the ordered handler's per-aggregate order), then a pause of [`BATCH_PAUSE`] s, then
/// COMMIT.
fn batched_worker(pg: &Postgres, url: &str, handler: &str, session: &str) -> Walpost {
    let psql = pg.psql_path().display().to_string();
    let script = format!(
        r#"while true; do
  batch=$("{psql}" -XAtq "{url}" -F ' ' -c "SELECT array_agg(c.event_id ORDER BY c.ordinality), array_agg(c.lease_token ORDER BY c.ordinality) FROM inbox.claim('{handler}', {BATCH}, '3 seconds') WITH ORDINALITY AS c HAVING count(*) > 0" 2>/dev/null)
  if [ -z "$batch" ]; then sleep 0.2; continue; fi
  set -- $batch
  printf '%s\n' "BEGIN;" \
    "INSERT INTO effects (handler, event_id) SELECT '{handler}', d.id FROM unnest(inbox.complete_many('{handler}', '$1', '$2')) WITH ORDINALITY AS d (id, n) ORDER BY d.n;" \
    "SELECT pg_sleep({BATCH_PAUSE});" "COMMIT;" | "{psql}" -XAtq "{url}" >/dev/null 2>&1
done"#
    );
    shell_worker(script, session)
}

fn shell_worker(script: String, session: &str) -> Walpost {
    let mut cmd = Command::new("sh");
    // A group of its own, so that a kill takes its psql processes too, mid-transaction.
    cmd.arg("-c").arg(script).env("PGAPPNAME", session).process_group(0);
    Walpost::spawn(cmd)
}

/// kill -9 of a worker's whole process group: the loop and the psql it is running.
fn kill9_worker(w: &mut Walpost) {
    let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", w.pid())]).status();
    w.kill9();
}

/// kill -9 of a batched worker while its transaction has written (a transaction id is
/// assigned) and not committed, until one kill lands there, i.e. the server rolled that
/// transaction back, for up to 8 s: a kill can come just after the COMMIT, and a worker
/// can be idle. Returns what happened, for the log; `Ok` when a kill landed mid-batch.
fn kill9_mid_batch(inbox: &World, pg: &Postgres, w: &mut Worker) -> Result<String, String> {
    let in_flight = format!(
        "SELECT backend_xid FROM pg_stat_activity WHERE application_name = '{}' AND backend_xid IS NOT NULL",
        w.session
    );
    let deadline = Instant::now() + Duration::from_secs(8);
    let mut committed_first = 0;
    while Instant::now() < deadline {
        let Some(xid) = inbox.try_sql(&in_flight).ok().and_then(|out| out.lines().next().map(str::to_owned)) else {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        };
        w.restart(pg, &inbox.superuser_url);
        // backend_xid is a 32-bit xid; this cluster is fresh, so its epoch is 0 and the
        // xid8 is the same number.
        let status = format!("SELECT pg_xact_status('{xid}'::xid8)");
        let mut outcome = String::new();
        testkit::wait_until(Duration::from_secs(10), || {
            outcome = inbox.try_sql(&status).unwrap_or_default().trim().to_owned();
            outcome == "committed" || outcome == "aborted"
        });
        if outcome == "aborted" {
            return Ok(format!(
                "mid-batch: its transaction rolled back ({committed_first} kills after a COMMIT first)"
            ));
        }
        committed_first += 1;
    }
    Err(format!("never mid-batch in 8 s ({committed_first} kills after a COMMIT)"))
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
    assert!(testkit::wait_until(WAIT, || inbox_schema_complete(&inbox)), "{}", ingest.log_text());
    for (handler, ordered, _) in HANDLERS {
        inbox.sql(&format!(
            "SELECT inbox.register_handler('{handler}', '{{}}', '{{}}', 1000, '100 milliseconds', '1 second', {ordered})"
        ));
    }
    inbox.sql("CREATE TABLE effects (n bigserial PRIMARY KEY, handler text NOT NULL, event_id text NOT NULL)");
    let mut workers: Vec<Worker> = Vec::new();
    for (handler, _, batched) in HANDLERS {
        for i in 0..2 {
            let session = format!("inbox-chaos-{handler}-{i}");
            workers.push(Worker::start(inbox_pg, &inbox.superuser_url, handler, batched, session));
        }
    }
    let batched: Vec<usize> = (0..workers.len()).filter(|&i| workers[i].batched).collect();

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
    let (mut mid_batch_tries, mut mid_batch_kills) = (0, 0);
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
                        eprintln!("[inbox-chaos] step {step}: kill -9 worker {i} ({})", workers[i].handler);
                        workers[i].restart(inbox_pg, &inbox.superuser_url);
                    }
                }
            }
        }
        if step % 2 == 1 && step != 9 {
            let i = batched[rng.below(batched.len() as u64) as usize];
            mid_batch_tries += 1;
            let outcome = kill9_mid_batch(&inbox, inbox_pg, &mut workers[i]);
            mid_batch_kills += usize::from(outcome.is_ok());
            let outcome = outcome.unwrap_or_else(|e| e);
            eprintln!(
                "[inbox-chaos] {name} step {step}: kill -9 batched worker {i} ({}) {outcome}",
                workers[i].handler
            );
        }
    }
    assert!(kills >= 12, "{kills} kills");
    // Fewer would leave the batch path's atomicity (the effects and receipts of a batch
    // commit together or not at all) untested.
    assert!(mid_batch_kills >= 3, "{mid_batch_kills} of {mid_batch_tries} tries killed a batched worker mid-batch");
    writer.join().unwrap();
    assert!(!writing.load(Ordering::SeqCst));
    let committed: BTreeSet<i64> = outbox.committed_rows().keys().copied().collect();
    assert_eq!(committed.len(), EVENTS as usize);
    let expected = HANDLERS.len() as i64 * committed.len() as i64;
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
    for (handler, ordered, _) in HANDLERS {
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
    eprintln!(
        "[inbox-chaos] {name}: {kills} kills, {mid_batch_kills} of {mid_batch_tries} tries killed a batched worker mid-batch, {expected} effects in {:?}",
        started.elapsed()
    );
}

#[test]
fn inbox_chaos_at_least_once_every_effect_once_per_handler() {
    end_to_end_under_faults("inbox-chaos-alo", false, 0x9e37_79b9_7f4a_7c15);
}

#[test]
fn inbox_chaos_exactly_once_every_effect_once_per_handler() {
    end_to_end_under_faults("inbox-chaos-eos", true, 0x2545_f491_4f6c_dd1d);
}
