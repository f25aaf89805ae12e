//! The chaos run. Several writers insert outbox events (transactions of 1 to
//! 50 rows, about one in seven rolled back, each writer on its own aggregates) while
//! faults are injected one after the other, in random order, after random pauses:
//!
//! - `kill -9` of walpost, then a restart;
//! - Kafka broker stop/start, graceful (SIGTERM) and `kill -9`;
//! - PostgreSQL restart, `fast` and `immediate` shutdown;
//! - network cuts (every connection dropped, new ones refused for a moment) and stalls
//!   (nothing forwarded for N seconds, then the held bytes flow again) between walpost
//!   and PostgreSQL and between walpost and Kafka, through [`testkit::Proxy`]: walpost's
//!   `--postgres` URL points at one proxy; the private Kafka broker *advertises* the
//!   other proxy's address, so every Kafka connection (bootstrap and the reconnections
//!   to the advertised listener) goes through it.
//!
//! At the end every topic is read with a real Kafka client (rdkafka) and compared with
//! the committed outbox rows: `lost`, `reordered` (per aggregate, first copies),
//! `phantoms` (published, never committed) must be 0, and every duplicate must be a
//! transaction that was not confirmed when a fault happened: for each fault the test
//! records the slot's confirmed LSN (after the fault where that is exact: walpost
//! killed, or PostgreSQL unreachable and the old walsender gone; just before it
//! otherwise; the lower of both across a PostgreSQL restart, which may move
//! `confirmed_flush_lsn` back) and the topics' high watermarks just before it. A copy
//! of an event is explained by fault k if the previous copy was written before the
//! fault after k, this copy after fault k began, and the transaction's exact commit end
//! LSN (from a second, never-consumed `test_decoding` slot, matched by `xmin`) is past
//! the recorded LSN. A fault is injected only once walpost has confirmed something new
//! since the previous one (recovery, bounded at 120 s), so each hits a working pipeline.
//!
//! Profiles: `CHAOS_PROFILE=ci` (default: 30 faults, 20 of them kills, every kind at
//! least once, pauses under 1 s, writers at least 60 s; about 3 minutes in all on an
//! idle 2-core machine) and `CHAOS_PROFILE=long` (152 faults, 100 kills, stalls up to
//! 40 s, writers at least 10 minutes). `CHAOS_SEED` (or `E2E_SEED`) replays a run's
//! random choices; `CHAOS_KEEP_LOGS=1` keeps every walpost log. The run prints a
//! `chaos:` summary line with the fault counts and the figures.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;
use testkit::{Kafka, KafkaOptions, PgOptions, Postgres, Proxy, StopMode};

use crate::support::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    Kill,
    KafkaStop,
    KafkaKill,
    PgFast,
    PgImmediate,
    PgCut,
    KafkaCut,
    PgStall,
    KafkaStall,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill -9 walpost",
            Fault::KafkaStop => "kafka stop/start",
            Fault::KafkaKill => "kafka kill -9/start",
            Fault::PgFast => "postgres restart fast",
            Fault::PgImmediate => "postgres restart immediate",
            Fault::PgCut => "cut walpost-postgres",
            Fault::KafkaCut => "cut walpost-kafka",
            Fault::PgStall => "stall walpost-postgres",
            Fault::KafkaStall => "stall walpost-kafka",
        }
    }
}

struct Profile {
    name: &'static str,
    /// Writers run at least this long (and until every fault is done).
    write_secs: u64,
    writers: u32,
    /// Pause before each fault: random in [0, max_gap_ms).
    max_gap_ms: u64,
    plan: Vec<(Fault, u32)>,
    stall_secs: (u64, u64),
}

impl Profile {
    fn from_env() -> Profile {
        match std::env::var("CHAOS_PROFILE").as_deref() {
            Ok("long") => Profile {
                name: "long",
                write_secs: 600,
                writers: 4,
                max_gap_ms: 6000,
                plan: vec![
                    (Fault::Kill, 100),
                    (Fault::KafkaStop, 5),
                    (Fault::KafkaKill, 5),
                    (Fault::PgFast, 5),
                    (Fault::PgImmediate, 5),
                    (Fault::PgCut, 10),
                    (Fault::KafkaCut, 10),
                    (Fault::PgStall, 6),
                    (Fault::KafkaStall, 6),
                ],
                // Up to 40 s: past librdkafka's 30 s request timeout.
                stall_secs: (2, 40),
            },
            Ok("ci") | Err(_) => Profile {
                name: "ci",
                write_secs: 60,
                writers: 3,
                max_gap_ms: 1000,
                plan: vec![
                    (Fault::Kill, 20),
                    (Fault::KafkaStop, 1),
                    (Fault::KafkaKill, 1),
                    (Fault::PgFast, 1),
                    (Fault::PgImmediate, 1),
                    (Fault::PgCut, 2),
                    (Fault::KafkaCut, 2),
                    (Fault::PgStall, 1),
                    (Fault::KafkaStall, 1),
                ],
                stall_secs: (2, 6),
            },
            Ok(other) => panic!("CHAOS_PROFILE={other}: use ci or long"),
        }
    }
}

/// A small replayable random source.
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n.max(1)
    }

    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
}

/// What the test knew at one fault.
struct Boundary {
    fault: Fault,
    /// High watermarks just before the fault.
    before: Highs,
    /// The slot's confirmed LSN that a restart after this fault resumes from, or a
    /// lower bound of it.
    confirmed: u64,
    /// The slot's confirmed LSN just before the fault.
    pre: u64,
}

#[derive(Default)]
struct WriterStats {
    committed_txns: AtomicU64,
    rolled_back_txns: AtomicU64,
    retries: AtomicU64,
}

/// One writer: transactions of 1..50 rows on its own 20 aggregates (so each
/// aggregate's ids grow in commit order), tagged `w<writer>t<n>`; about one in seven
/// is rolled back. A failed commit is retried unless its marker row shows it committed.
fn writer(pg: &'static Postgres, db: String, w: u32, mut rng: Rng, stop: Arc<AtomicBool>, stats: Arc<WriterStats>) {
    const SIZES: [u32; 12] = [1, 1, 1, 1, 2, 2, 3, 5, 8, 10, 20, 50];
    let mut n = 0u32;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let size = SIZES[rng.below(SIZES.len() as u64) as usize];
        let rollback = rng.below(7) == 0;
        let tag = format!("w{w}t{n}");
        let sql = format!(
            "BEGIN;
             INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload)
             SELECT (ARRAY['order','payment','shipment'])[1 + (g + {n}) % 3],
                    ('00000000-0000-4000-8000-' || lpad('{w}', 4, '0') || lpad(((g * 7 + {n}) % 20)::text, 8, '0'))::uuid,
                    '{tag}', jsonb_build_object('w', {w}, 't', {n}, 'g', g, 'pad', repeat('x', (g * 13) % 200))
             FROM generate_series(1, {size}) g;
             INSERT INTO public.chaos_tx (tag) VALUES ('{tag}');
             {};",
            if rollback { "ROLLBACK" } else { "COMMIT" }
        );
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            match pg.psql_db(&db, &sql) {
                Ok(_) => break,
                Err(e) if rollback => {
                    let _ = e;
                    break;
                }
                Err(e) => {
                    // Committed before the failure? Ask until the server answers.
                    let committed = loop {
                        match pg.psql_db(&db, &format!("SELECT count(*) FROM public.chaos_tx WHERE tag = '{tag}'")) {
                            Ok(c) => break c.trim() == "1",
                            Err(_) => {
                                assert!(Instant::now() < deadline, "writer {w}: server unreachable too long: {e}");
                                std::thread::sleep(Duration::from_millis(200));
                            }
                        }
                    };
                    if committed {
                        break;
                    }
                    assert!(Instant::now() < deadline, "writer {w} gave up on {tag}: {e}");
                    stats.retries.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
        if rollback {
            stats.rolled_back_txns.fetch_add(1, Ordering::Relaxed);
        } else {
            stats.committed_txns.fetch_add(1, Ordering::Relaxed);
        }
        std::thread::sleep(Duration::from_millis(rng.below(60)));
    }
}

struct Chaos {
    pg: &'static Postgres,
    pg_proxy: Proxy,
    kafka: Kafka,
    kafka_proxy: Proxy,
    w: World,
    args: Vec<String>,
    env: Vec<(String, String)>,
    walpost: Walpost,
    old_logs: Vec<PathBuf>,
    boundaries: Vec<Boundary>,
    counts: BTreeMap<Fault, u32>,
    /// Bytes by which a PostgreSQL restart moved confirmed_flush_lsn back.
    regressions: Vec<u64>,
    /// A Kafka client kept for reading high watermarks (re-created after a failure).
    reader: Mutex<Option<BaseConsumer>>,
}

impl Chaos {
    fn slot_state(&self) -> Option<(u64, bool)> {
        let out = self
            .w
            .try_sql(&format!(
                "SELECT confirmed_flush_lsn, active FROM pg_replication_slots WHERE slot_name = '{}'",
                self.w.slot
            ))
            .ok()?;
        let (lsn, active) = out.trim().split_once('|')?;
        Some((parse_lsn(lsn)?, active == "t"))
    }

    /// The slot's confirmed LSN (waits while PostgreSQL is unreachable).
    fn confirmed(&self) -> u64 {
        let mut v = None;
        assert!(
            testkit::wait_until(Duration::from_secs(60), || {
                v = self.slot_state().map(|s| s.0);
                v.is_some()
            }),
            "cannot read the slot"
        );
        v.unwrap_or_default()
    }

    /// Waits until no walsender uses the slot, then returns its confirmed LSN.
    fn confirmed_when_inactive(&self) -> u64 {
        let mut v = None;
        let ok = testkit::wait_until(Duration::from_secs(30), || match self.slot_state() {
            Some((lsn, false)) => {
                v = Some(lsn);
                true
            }
            _ => false,
        });
        assert!(ok, "the slot stayed active after walpost lost its connection");
        v.unwrap_or_default()
    }

    fn highs(&self) -> Highs {
        let bootstrap = self.w.kafka_bootstrap.clone();
        let mut out = None;
        let mut cached = self.reader.lock().unwrap_or_else(|e| e.into_inner());
        let ok = testkit::wait_until(Duration::from_secs(60), || {
            if cached.is_none() {
                *cached = ClientConfig::new()
                    .set("bootstrap.servers", &bootstrap)
                    .set("group.id", testkit::unique_name("chaos-highs"))
                    .set("enable.auto.commit", "false")
                    .create()
                    .ok();
            }
            out = cached.as_ref().and_then(|c| try_highs(c, &self.w.topic_prefix));
            if out.is_none() {
                *cached = None;
            }
            out.is_some()
        });
        assert!(ok, "cannot read high watermarks through {bootstrap}");
        out.unwrap_or_default()
    }

    fn start_walpost(&mut self) {
        let env: Vec<(&str, &str)> = self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let new = Walpost::start(&self.args, &env);
        let old = std::mem::replace(&mut self.walpost, new);
        self.old_logs.push(old.log.clone());
        drop(old);
    }

    /// walpost must never exit by itself: every fault here is transient.
    fn assert_walpost_alive(&mut self) {
        if let Some(status) = self.walpost.wait_exit(Duration::ZERO) {
            panic!("walpost exited by itself ({status}):\n{}", tail(&self.walpost.log_text(), 60));
        }
    }

    fn inject(&mut self, fault: Fault, rng: &mut Rng, stall_secs: (u64, u64)) {
        self.assert_walpost_alive();
        let before = self.highs();
        let pre = self.confirmed();
        let confirmed = match fault {
            Fault::Kill => {
                self.walpost.kill9();
                let c = self.confirmed_when_inactive();
                std::thread::sleep(Duration::from_millis(rng.below(800)));
                self.start_walpost();
                c
            }
            Fault::KafkaStop | Fault::KafkaKill => {
                if fault == Fault::KafkaStop {
                    self.kafka.stop().expect("stop kafka");
                } else {
                    self.kafka.kill().expect("kill kafka");
                }
                std::thread::sleep(Duration::from_millis(rng.between(500, 4000)));
                self.kafka.start_again().expect("start kafka again");
                pre
            }
            Fault::PgFast | Fault::PgImmediate => {
                // walpost may not reconnect before the restarted server's slot position
                // has been read.
                self.pg_proxy.set_refusing(true);
                let mode = if fault == Fault::PgFast { StopMode::Fast } else { StopMode::Immediate };
                self.pg.stop(mode).expect("stop postgres");
                std::thread::sleep(Duration::from_millis(rng.below(2000)));
                self.pg.start_again().expect("start postgres again");
                let post = self.confirmed();
                self.pg_proxy.cut_all();
                self.pg_proxy.set_refusing(false);
                if post < pre {
                    self.regressions.push(pre - post);
                }
                pre.min(post)
            }
            Fault::PgCut => {
                self.pg_proxy.set_refusing(true);
                self.pg_proxy.cut_all();
                let c = self.confirmed_when_inactive();
                std::thread::sleep(Duration::from_millis(rng.below(1500)));
                self.pg_proxy.set_refusing(false);
                c
            }
            Fault::KafkaCut => {
                self.kafka_proxy.set_refusing(true);
                self.kafka_proxy.cut_all();
                std::thread::sleep(Duration::from_millis(rng.below(3000)));
                self.kafka_proxy.set_refusing(false);
                pre
            }
            Fault::PgStall | Fault::KafkaStall => {
                let proxy = if fault == Fault::PgStall { &self.pg_proxy } else { &self.kafka_proxy };
                let d = Duration::from_secs(rng.between(stall_secs.0, stall_secs.1));
                proxy.blackhole(d);
                std::thread::sleep(d);
                pre
            }
        };
        self.boundaries.push(Boundary { fault, before, confirmed, pre });
        *self.counts.entry(fault).or_default() += 1;
    }

    /// What to look at when walpost stops making progress.
    fn diagnostics(&self) -> String {
        format!(
            "open connections through the proxies: postgres {}, kafka {}; high watermarks now {:?}, in 5 s {:?}\n--- kafka log ---\n{}\n--- walpost log ---\n{}",
            self.pg_proxy.open_connections(),
            self.kafka_proxy.open_connections(),
            try_highs_once(&self.w.kafka_bootstrap, &self.w.topic_prefix),
            {
                std::thread::sleep(Duration::from_secs(5));
                try_highs_once(&self.w.kafka_bootstrap, &self.w.topic_prefix)
            },
            self.kafka.log_tail(60),
            tail(&self.walpost.log_text(), 80)
        )
    }

    fn count(&self, pred: impl Fn(Fault) -> bool) -> u32 {
        self.counts.iter().filter(|(f, _)| pred(**f)).map(|(_, n)| n).sum()
    }

    fn all_logs(&self) -> Vec<PathBuf> {
        let mut v = self.old_logs.clone();
        v.push(self.walpost.log.clone());
        v
    }
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// High watermarks of every partition of the topics with `prefix`; None if Kafka does
/// not answer (e.g. while it restarts).
fn try_highs(c: &BaseConsumer, prefix: &str) -> Option<Highs> {
    let md = c.fetch_metadata(None, Duration::from_secs(5)).ok()?;
    let mut out = HashMap::new();
    for t in md.topics().iter().filter(|t| t.name().starts_with(prefix)) {
        for p in t.partitions() {
            let (_, high) = c.fetch_watermarks(t.name(), p.id(), Duration::from_secs(5)).ok()?;
            out.insert((t.name().to_owned(), p.id()), high);
        }
    }
    Some(out)
}

/// [`try_highs`] with a new client (for diagnostics).
fn try_highs_once(bootstrap: &str, prefix: &str) -> Option<Highs> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", testkit::unique_name("chaos-highs"))
        .create()
        .ok()?;
    try_highs(&c, prefix)
}

/// Commit end LSN of every committed transaction, by xid, from the audit slot.
fn commit_lsns(w: &World, audit_slot: &str) -> HashMap<u64, u64> {
    let out = w.sql(&format!(
        "SELECT xid::text, lsn FROM pg_logical_slot_peek_changes('{audit_slot}', NULL, NULL, 'include-xids', '1', 'skip-empty-xacts', '1')
         WHERE data LIKE 'COMMIT%'"
    ));
    out.lines()
        .filter_map(|l| {
            let (xid, lsn) = l.split_once('|')?;
            Some((xid.parse().ok()?, parse_lsn(lsn)?))
        })
        .collect()
}

#[test]
fn chaos_run() {
    run(false);
}

/// The same faults with `--delivery exactly-once`: a read_committed consumer sees every
/// committed event exactly once.
#[test]
fn chaos_run_exactly_once() {
    run(true);
}

fn run(exactly_once: bool) {
    let profile = Profile::from_env();
    let seed = ["CHAOS_SEED", "E2E_SEED"]
        .iter()
        .find_map(|k| std::env::var(k).ok().and_then(|s| s.parse().ok()))
        .unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_nanos() as u64
        });
    eprintln!("chaos: profile={} CHAOS_SEED={seed} exactly_once={exactly_once}", profile.name);
    let mut rng = Rng(seed);
    let t_start = Instant::now();

    // Servers, each behind its proxy.
    let pg: &'static Postgres = Box::leak(Box::new(Postgres::start(PgOptions::default()).expect("start postgres")));
    let pg_proxy = Proxy::start(SocketAddr::from(([127, 0, 0, 1], pg.port()))).expect("postgres proxy");
    let kafka_proxy = Proxy::bind().expect("kafka proxy");
    let kafka = Kafka::start(KafkaOptions {
        extra_props: vec![("advertised.listeners".into(), format!("PLAINTEXT://127.0.0.1:{}", kafka_proxy.port()))],
    })
    .expect("start kafka");
    kafka_proxy.set_upstream(SocketAddr::from(([127, 0, 0, 1], kafka.port())));
    let bootstrap = format!("127.0.0.1:{}", kafka_proxy.port());
    let w = World::on(pg, &bootstrap, "chaos");
    w.sql("CREATE TABLE public.chaos_tx (tag text PRIMARY KEY)");
    let audit_slot = format!("{}_audit", w.slot);
    w.sql(&format!("SELECT pg_create_logical_replication_slot('{audit_slot}', 'test_decoding')"));

    let mut args = w.args();
    let direct = format!("127.0.0.1:{}/", pg.port());
    let via_proxy = format!("127.0.0.1:{}/", pg_proxy.port());
    for a in &mut args {
        if a == &w.url {
            *a = a.replace(&direct, &via_proxy);
        }
    }
    assert!(args.iter().any(|a| a.contains(&via_proxy)), "{args:?}");
    // CHAOS_KAFKA_DEBUG=broker,topic,eos: librdkafka's debug contexts in walpost's log.
    if let Ok(contexts) = std::env::var("CHAOS_KAFKA_DEBUG") {
        args.extend(["--kafka-property".to_string(), format!("debug={contexts}")]);
    }
    // Faults come every few seconds, so sessions rarely live the 30 s that reset the
    // reconnect backoff: cap it at 2 s (default 30 s) to keep the run short.
    let config = std::env::temp_dir().join(format!("{}.toml", testkit::unique_name("chaos")));
    // A producer silent for 10 s is restarted (default 60 s): Kafka restarts (10-15 s) and
    // long stalls exercise that path too.
    let delivery = if exactly_once { "delivery = \"exactly-once\"\n" } else { "" };
    std::fs::write(&config, format!("{delivery}[pipeline]\nmax_backoff_secs = 2\ndelivery_timeout_secs = 10\n"))
        .expect("write walpost config");
    let env = vec![("WALPOST_CONFIG".to_string(), config.to_string_lossy().into_owned())];
    let env_ref: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let walpost = Walpost::start(&args, &env_ref);
    assert!(w.wait_for_slot(Duration::from_secs(120)), "slot not created:\n{}", walpost.log_text());

    let mut chaos = Chaos {
        pg,
        pg_proxy,
        kafka,
        kafka_proxy,
        w,
        args,
        env,
        walpost,
        old_logs: Vec::new(),
        boundaries: Vec::new(),
        counts: BTreeMap::new(),
        regressions: Vec::new(),
        reader: Mutex::new(None),
    };

    // Writers.
    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(WriterStats::default());
    let writers: Vec<_> = (0..profile.writers)
        .map(|i| {
            let (db, stop, stats) = (chaos.w.db.clone(), stop.clone(), stats.clone());
            let r = Rng(seed ^ (u64::from(i) + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            std::thread::spawn(move || writer(pg, db, i, r, stop, stats))
        })
        .collect();

    // Faults one after the other, in random order, each after a random pause; the next
    // one waits until walpost has recovered from the previous one (the slot's confirmed
    // LSN moved past the fault's), so every fault hits a working pipeline.
    let mut faults: Vec<Fault> = Vec::new();
    for &(fault, n) in &profile.plan {
        faults.extend(std::iter::repeat_n(fault, n as usize));
    }
    for i in (1..faults.len()).rev() {
        faults.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let t_writes = Instant::now();
    let mut recovery: BTreeMap<Fault, Vec<Duration>> = BTreeMap::new();
    std::thread::sleep(Duration::from_millis(rng.between(1000, 3000)));
    for (i, &fault) in faults.iter().enumerate() {
        std::thread::sleep(Duration::from_millis(rng.below(profile.max_gap_ms)));
        let t = Instant::now();
        chaos.inject(fault, &mut rng, profile.stall_secs);
        let injected = t.elapsed();
        let at = chaos.boundaries.last().map_or(0, |b| b.confirmed);
        let t_rec = Instant::now();
        let recovered =
            testkit::wait_until(Duration::from_secs(120), || chaos.slot_state().is_some_and(|(lsn, _)| lsn > at));
        if !recovered {
            chaos.assert_walpost_alive();
            panic!(
                "walpost did not confirm anything within 120 s after {} (confirmed stays {at:X})\n{}",
                fault.name(),
                chaos.diagnostics()
            );
        }
        recovery.entry(fault).or_default().push(t_rec.elapsed());
        eprintln!(
            "chaos: [{:>3}/{}] t={:>6.1}s {:<26} fault {:>5} ms, recovered in {:>5} ms, confirmed at fault {at:X}",
            i + 1,
            faults.len(),
            t_writes.elapsed().as_secs_f64(),
            fault.name(),
            injected.as_millis(),
            t_rec.elapsed().as_millis(),
        );
    }
    if let Some(rest) = Duration::from_secs(profile.write_secs).checked_sub(t_writes.elapsed()) {
        std::thread::sleep(rest);
    }
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    for t in writers {
        t.join().expect("writer panicked");
    }
    let write_time = t_writes.elapsed();

    // Drain: everything committed is confirmed (so acknowledged by Kafka).
    chaos.assert_walpost_alive();
    let target = parse_lsn(&chaos.w.sql("SELECT pg_current_wal_lsn()")).expect("WAL position");
    let t_drain = Instant::now();
    let drained = testkit::wait_until(Duration::from_secs(180), || chaos.slot_state().is_some_and(|s| s.0 >= target));
    assert!(
        drained,
        "walpost did not confirm {target:X} within 180 s (confirmed {:X})\n{}",
        chaos.confirmed(),
        chaos.diagnostics()
    );
    let drain_time = t_drain.elapsed();

    // Audit.
    let w = &chaos.w;
    let records = if exactly_once {
        read_all_committed(&w.kafka_bootstrap, &w.topic_prefix)
    } else {
        read_all(&w.kafka_bootstrap, &w.topic_prefix)
    };
    let a = audit(w, &records);
    let rows = w.committed_rows();
    let xmins: HashMap<i64, u64> = w
        .sql("SELECT id, xmin::text FROM events.outbox")
        .lines()
        .filter_map(|l| l.split_once('|').and_then(|(id, x)| Some((id.parse().ok()?, x.parse().ok()?))))
        .collect();
    let commits = commit_lsns(w, &audit_slot);
    let commit_end = |id: i64| -> u64 {
        let xid = xmins.get(&id).unwrap_or_else(|| panic!("no xmin for event {id}"));
        *commits.get(xid).unwrap_or_else(|| panic!("no commit LSN for xid {xid} (event {id})"))
    };

    // Duplicates: each copy after the first must be explained by a fault.
    let nb = chaos.boundaries.len();
    let mut previous: HashMap<i64, i64> = HashMap::new();
    let mut explained_by: BTreeMap<Fault, usize> = BTreeMap::new();
    let mut unexplained: Vec<String> = Vec::new();
    let mut duplicates = 0usize;
    let mut forgotten = 0usize;
    for r in &records {
        let id = r.event_id();
        let Some(prev) = previous.insert(id, r.offset) else {
            continue;
        };
        duplicates += 1;
        let tp = (r.topic.clone(), r.partition);
        let high = |k: usize| -> i64 {
            if k < nb {
                *chaos.boundaries[k].before.get(&tp).unwrap_or(&0)
            } else {
                i64::MAX
            }
        };
        let end = commit_end(id);
        // The latest fault k with: this copy written after k began, the previous copy
        // before the fault after k, and the transaction unconfirmed at k.
        let by =
            (0..nb).rev().find(|&k| r.offset >= high(k) && prev < high(k + 1) && end > chaos.boundaries[k].confirmed);
        match by {
            Some(k) => {
                let b = &chaos.boundaries[k];
                *explained_by.entry(b.fault).or_default() += 1;
                if end <= b.pre {
                    // Confirmed before a PostgreSQL restart that lost the confirmation.
                    forgotten += 1;
                }
            }
            None => unexplained.push(format!(
                "event {id} at {}[{}]@{} (previous copy @{prev}), commit end {end:X}",
                r.topic, r.partition, r.offset
            )),
        }
    }

    let reconnects: usize = chaos
        .all_logs()
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap_or_default().matches("; reconnecting").count())
        .sum();
    let c = &chaos;
    let summary = format!(
        "chaos: profile={} seed={seed} kills={} kafka_restarts={} (graceful {}, kill -9 {}) pg_restarts={} (fast {}, immediate {}) net_cuts={} (pg {}, kafka {}) stalls={} (pg {}, kafka {}) \
         events={} txns={} rolled_back={} writer_retries={} records={} walpost_reconnects={} \
         lost={} reordered={} phantoms={} wrong_content={} duplicates={} ({}) \
         resent_after_server_forgot_confirmation={forgotten} confirmed_lsn_regressions={:?} write={:.0}s drain={:.1}s total={:.0}s",
        profile.name,
        c.count(|f| f == Fault::Kill),
        c.count(|f| matches!(f, Fault::KafkaStop | Fault::KafkaKill)),
        c.count(|f| f == Fault::KafkaStop),
        c.count(|f| f == Fault::KafkaKill),
        c.count(|f| matches!(f, Fault::PgFast | Fault::PgImmediate)),
        c.count(|f| f == Fault::PgFast),
        c.count(|f| f == Fault::PgImmediate),
        c.count(|f| matches!(f, Fault::PgCut | Fault::KafkaCut)),
        c.count(|f| f == Fault::PgCut),
        c.count(|f| f == Fault::KafkaCut),
        c.count(|f| matches!(f, Fault::PgStall | Fault::KafkaStall)),
        c.count(|f| f == Fault::PgStall),
        c.count(|f| f == Fault::KafkaStall),
        rows.len(),
        stats.committed_txns.load(Ordering::Relaxed),
        stats.rolled_back_txns.load(Ordering::Relaxed),
        stats.retries.load(Ordering::Relaxed),
        records.len(),
        reconnects,
        a.lost.len(),
        a.reordered.len(),
        a.phantoms.len(),
        a.wrong_content.len(),
        duplicates,
        if unexplained.is_empty() {
            let by: Vec<String> = explained_by.iter().map(|(f, n)| format!("{}: {n}", f.name())).collect();
            format!("all after confirmed LSN; {}", by.join(", "))
        } else {
            format!("{} NOT explained by an unconfirmed transaction at a fault", unexplained.len())
        },
        c.regressions,
        write_time.as_secs_f64(),
        drain_time.as_secs_f64(),
        t_start.elapsed().as_secs_f64(),
    );
    eprintln!("{summary}");
    println!("{summary}");
    let kills = c.count(|f| f == Fault::Kill).max(1);
    eprintln!(
        "chaos: duplicates per kill -9: {:.1} (exactly_once={exactly_once})",
        explained_by.get(&Fault::Kill).copied().unwrap_or(0) as f64 / kills as f64
    );
    let rec: Vec<String> = recovery
        .iter()
        .map(|(f, ds)| {
            let max = ds.iter().max().copied().unwrap_or_default();
            let avg = ds.iter().sum::<Duration>() / ds.len().max(1) as u32;
            format!("{}: avg {} ms, max {} ms", f.name(), avg.as_millis(), max.as_millis())
        })
        .collect();
    eprintln!("chaos: time from fault to the next confirmed position: {}", rec.join("; "));
    if std::env::var_os("CHAOS_KEEP_LOGS").is_some() {
        eprintln!("chaos: walpost logs: {:?}", chaos.all_logs());
    }

    assert!(a.lost.is_empty(), "lost {} events, first: {:?}", a.lost.len(), &a.lost[..a.lost.len().min(10)]);
    assert!(a.phantoms.is_empty(), "phantom events: {:?}", &a.phantoms[..a.phantoms.len().min(10)]);
    assert!(a.reordered.is_empty(), "reordered: {:?}", &a.reordered[..a.reordered.len().min(10)]);
    assert!(a.wrong_content.is_empty(), "wrong content: {:?}", &a.wrong_content[..a.wrong_content.len().min(10)]);
    assert!(
        unexplained.is_empty(),
        "duplicates not explained by a fault: {:?}",
        &unexplained[..unexplained.len().min(10)]
    );
    if exactly_once {
        assert_eq!(duplicates, 0, "a read_committed consumer saw duplicates with --delivery exactly-once");
    }
    for &(fault, n) in &profile.plan {
        assert_eq!(chaos.counts.get(&fault).copied().unwrap_or(0), n, "{}", fault.name());
    }
    assert!(rows.len() > 1000, "too few events written: {}", rows.len());

    // A clean stop at the end.
    let status = chaos.walpost.terminate(Duration::from_secs(60)).expect("walpost did not stop on SIGTERM");
    assert!(status.success(), "exit status {status:?}\n{}", tail(&chaos.walpost.log_text(), 40));
    if std::env::var_os("CHAOS_KEEP_LOGS").is_none() {
        for log in chaos.all_logs() {
            let _ = std::fs::remove_file(log);
        }
    }
    let _ = std::fs::remove_file(&config);
}
