//! Shared pieces of the end-to-end suite: a database per test, the walpost process,
//! a Kafka reader built on a real client (rdkafka), and the checks every test makes.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use testkit::{Kafka, Postgres};

pub(crate) const MIGRATION_0001: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../../migrations/outbox/0001_events_outbox.sql");

/// One test's world: its own database (with the outbox migration applied), slot,
/// publication and topic prefix on the shared PostgreSQL and Kafka.
///
/// walpost connects as the least-privileged role of docs/least-privilege.md, not as
/// a superuser: `wp_<slot>` with LOGIN REPLICATION, owner of events.outbox (so it
/// can put the table in the publication it creates), CREATE on the database (for
/// CREATE PUBLICATION) and USAGE + CREATE on schema events (snapshot state table,
/// retention partitions). [`World::url`] is that role's URL; the test's own SQL
/// ([`World::sql`]) runs as the superuser `walpost`, whose URL is
/// [`World::superuser_url`].
pub(crate) struct World {
    pub pg: &'static Postgres,
    pub kafka_bootstrap: String,
    pub db: String,
    /// walpost's connection: the least-privileged role [`World::role`].
    pub url: String,
    /// The superuser `walpost`, for tests about something other than privileges that
    /// need rights the role lacks.
    pub superuser_url: String,
    /// `wp_<slot>`: LOGIN REPLICATION, password [`APP_PASSWORD`].
    pub role: String,
    pub slot: String,
    pub topic_prefix: String,
}

/// The broker address of [`World::postgres_only`]: port 1, where nothing listens.
const NO_KAFKA: &str = "127.0.0.1:1";

/// Password of every test's least-privileged role.
pub(crate) const APP_PASSWORD: &str = "app-pw";

impl World {
    pub(crate) fn new(name: &str) -> World {
        Self::on(testkit::shared_postgres(), &testkit::shared_kafka().bootstrap(), name)
    }

    /// A world on PostgreSQL alone, for tests of SQL that needs no broker (the inbox's
    /// SQL API): they run where Kafka cannot, and start none. Its broker address is a
    /// port nothing listens on, so a test that reaches for Kafka fails at once.
    pub(crate) fn postgres_only(name: &str) -> World {
        Self::on(testkit::shared_postgres(), NO_KAFKA, name)
    }

    pub(crate) fn on(pg: &'static Postgres, kafka_bootstrap: &str, name: &str) -> World {
        let db = testkit::unique_name(name);
        let superuser_url = pg.create_database(&db).expect("create database");
        pg.psql_db(&db, &std::fs::read_to_string(MIGRATION_0001).expect("read migration"))
            .expect("apply migration 0001");
        let slot = db.replace('-', "_");
        let role = format!("wp_{slot}");
        pg.psql_db(
            &db,
            &format!(
                "CREATE ROLE {role} LOGIN REPLICATION PASSWORD '{APP_PASSWORD}';
                 GRANT CREATE ON DATABASE \"{db}\" TO {role};
                 GRANT USAGE, CREATE ON SCHEMA events TO {role};
                 ALTER TABLE events.outbox OWNER TO {role};"
            ),
        )
        .expect("create the least-privileged role");
        World {
            pg,
            kafka_bootstrap: kafka_bootstrap.to_owned(),
            topic_prefix: format!("{db}."),
            url: pg.url_for(&role, APP_PASSWORD, &db),
            superuser_url,
            role,
            slot,
            db,
        }
    }

    /// [`World::args`] with walpost connecting as the superuser instead of
    /// [`World::role`].
    #[allow(dead_code)] // see `superuser_url`
    pub(crate) fn superuser_args(&self) -> Vec<String> {
        self.args().into_iter().map(|a| if a == self.url { self.superuser_url.clone() } else { a }).collect()
    }

    pub(crate) fn sql(&self, sql: &str) -> String {
        self.pg.psql_db(&self.db, sql).unwrap_or_else(|e| panic!("SQL failed: {e}\n{sql}"))
    }

    pub(crate) fn try_sql(&self, sql: &str) -> Result<String, String> {
        self.pg.psql_db(&self.db, sql).map_err(|e| e.to_string())
    }

    /// The walpost arguments for this world; topics are `<prefix><aggregate_type>`.
    pub(crate) fn args(&self) -> Vec<String> {
        vec![
            "run".into(),
            "--postgres".into(),
            self.url.clone(),
            "--kafka-brokers".into(),
            self.kafka_bootstrap.clone(),
            "--slot".into(),
            self.slot.clone(),
            "--publication".into(),
            format!("{}_pub", self.slot),
            "--topic".into(),
            format!("{}${{routedByValue}}", self.topic_prefix),
            "--kafka-property".into(),
            "topic.metadata.refresh.interval.ms=1000".into(),
        ]
    }

    pub(crate) fn start_walpost(&self) -> Walpost {
        Walpost::start(&self.args(), &[])
    }

    /// walpost started and known to stream: its slot exists and one transaction of
    /// `events` rows (aggregate type "order") has reached Kafka.
    pub(crate) fn streaming_walpost(&self, events: u32, timeout: Duration) -> Walpost {
        let p = self.start_walpost();
        assert!(self.wait_for_slot(timeout), "slot not created:\n{}", p.log_text());
        insert_batches(self, 0, 1, events, events, &["order"]);
        consume_at_least(&self.kafka_bootstrap, &self.topic_prefix, events as usize, timeout);
        p
    }

    pub(crate) fn topic(&self, aggregate_type: &str) -> String {
        format!("{}{}", self.topic_prefix, aggregate_type)
    }

    pub(crate) fn confirmed_flush_lsn(&self) -> Option<u64> {
        let text = self
            .sql(&format!("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = '{}'", self.slot));
        parse_lsn(&text)
    }

    pub(crate) fn wait_for_slot(&self, timeout: Duration) -> bool {
        testkit::wait_until(timeout, || self.confirmed_flush_lsn().is_some())
    }

    /// Every committed outbox row: id -> (aggregate_type, aggregate_id, event_type, payload text).
    pub(crate) fn committed_rows(&self) -> BTreeMap<i64, Row> {
        let out = self
            .sql("SELECT id, aggregate_type, aggregate_id, event_type, payload::text FROM events.outbox ORDER BY id");
        out.lines()
            .filter(|l| !l.is_empty())
            .map(|l| {
                let mut f = l.splitn(5, '|');
                let id: i64 = f.next().unwrap().parse().unwrap();
                let row = Row {
                    aggregate_type: f.next().unwrap().to_owned(),
                    aggregate_id: f.next().unwrap().to_owned(),
                    event_type: f.next().unwrap().to_owned(),
                    payload: f.next().unwrap().to_owned(),
                };
                (id, row)
            })
            .collect()
    }

    /// Drops the slot as `walpost slot drop` does: with its lineage row, so the next
    /// walpost creates a new slot instead of stopping on a slot lost in a failover.
    pub(crate) fn drop_slot(&self) {
        let _ = self.try_sql(&format!(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '{}' AND NOT active",
            self.slot
        ));
        let _ = self.try_sql(&format!("DELETE FROM events.walpost_slots WHERE slot = '{}'", self.slot));
    }
}

impl Drop for World {
    fn drop(&mut self) {
        // A leftover slot pins WAL for every other test sharing the cluster.
        self.drop_slot();
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Row {
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub event_type: String,
    pub payload: String,
}

pub(crate) fn parse_lsn(text: &str) -> Option<u64> {
    let (hi, lo) = text.trim().split_once('/')?;
    Some((u64::from_str_radix(hi, 16).ok()? << 32) | u64::from_str_radix(lo, 16).ok()?)
}

/// Inserts `txns` transactions of `size` rows; aggregate ids cycle through `aggregates`
/// UUIDs; each row's event_type is `b<batch>` so tests can find its transaction.
pub(crate) fn insert_batches(w: &World, first_batch: u32, txns: u32, size: u32, aggregates: u32, types: &[&str]) {
    insert_batches_in(w.pg, &w.db, first_batch, txns, size, aggregates, types);
}

/// The INSERT of one batch's rows, shared by [`insert_batches_in`] and
/// [`insert_refused_batch`]: `batch` and `aggregate_type` are SQL expressions (the batch
/// number, the row's type; `g` is the row's number in the batch).
fn batch_rows_sql(batch: &str, aggregate_type: &str, size: u32, aggregates: u32) -> String {
    format!(
        "INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload)
         SELECT {aggregate_type},
                ('00000000-0000-4000-8000-' || lpad((({batch} * {size} + g) % {aggregates})::text, 12, '0'))::uuid,
                'b' || {batch},
                jsonb_build_object('batch', {batch}, 'n', g, 'note', repeat('x', 40))
         FROM generate_series(1, {size}) AS g"
    )
}

/// [`insert_batches`] for a writer thread, which has the server and database only.
pub(crate) fn insert_batches_in(
    pg: &Postgres,
    db: &str,
    first_batch: u32,
    txns: u32,
    size: u32,
    aggregates: u32,
    types: &[&str],
) {
    let types_sql = types.iter().map(|t| format!("'{t}'")).collect::<Vec<_>>().join(",");
    let rows = batch_rows_sql("b", "types[1 + (g % array_length(types, 1))]", size, aggregates);
    // One DO block, a COMMIT per transaction (procedural COMMIT, PostgreSQL 11+), and
    // after each commit the WAL insert position, an upper bound of the commit's end LSN.
    let sql = format!(
        "CREATE TABLE IF NOT EXISTS public.txlog (batch int PRIMARY KEY, lsn_after pg_lsn);
         DO $$
         DECLARE b int; types text[] := ARRAY[{types_sql}];
         BEGIN
           FOR b IN {first_batch}..{last} LOOP
             {rows};
             COMMIT;
             INSERT INTO public.txlog VALUES (b, pg_current_wal_insert_lsn());
             COMMIT;
           END LOOP;
         END $$;",
        last = first_batch + txns - 1,
    );
    pg.psql_db(db, &sql).unwrap_or_else(|e| panic!("SQL failed: {e}\n{sql}"));
}

/// [`insert_batches`] for one transaction that walpost is expected to refuse, returning a
/// WAL position taken inside it, before its commit: walpost must never confirm that far
/// (a confirmed position at or past its commit would skip it on restart; one before it,
/// even past a position read before the transaction began, is fine: an idle walpost may
/// confirm WAL other databases of the shared cluster wrote meanwhile).
pub(crate) fn insert_refused_batch(w: &World, batch: u32, size: u32, aggregates: u32, aggregate_type: &str) -> u64 {
    let rows = batch_rows_sql(&batch.to_string(), &format!("'{aggregate_type}'"), size, aggregates);
    let sql = format!(
        "CREATE TABLE IF NOT EXISTS public.txlog (batch int PRIMARY KEY, lsn_after pg_lsn);
         BEGIN;
         {rows};
         SELECT pg_current_wal_insert_lsn();
         COMMIT;
         INSERT INTO public.txlog VALUES ({batch}, pg_current_wal_insert_lsn());"
    );
    let inside = w.sql(&sql);
    parse_lsn(inside.trim()).unwrap_or_else(|| panic!("no LSN in {inside:?}"))
}

/// The walpost binary under test, with its stderr in a file.
pub(crate) struct Walpost {
    child: Option<Child>,
    pub log: PathBuf,
}

impl Walpost {
    pub(crate) fn start(args: &[String], env: &[(&str, &str)]) -> Walpost {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_walpost"));
        cmd.args(args).env("WALPOST_LOG", "info,walpost=debug");
        for (k, v) in env {
            cmd.env(k, v);
        }
        Walpost::spawn(cmd)
    }

    /// Runs `cmd` (walpost itself, or a shell that `exec`s it) with stdout and stderr in
    /// the log file.
    pub(crate) fn spawn(mut cmd: Command) -> Walpost {
        let log = std::env::temp_dir().join(format!("{}.log", testkit::unique_name("walpost")));
        let file = File::create(&log).expect("create log file");
        let out = file.try_clone().expect("clone log file");
        cmd.stdin(Stdio::null()).stdout(out).stderr(file);
        let child = cmd.spawn().expect("spawn walpost");
        Walpost { child: Some(child), log }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    pub(crate) fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub(crate) fn signal(&self, sig: &str) {
        let _ = Command::new("kill").args([sig, &self.pid().to_string()]).status();
    }

    /// SIGKILL, then reap.
    pub(crate) fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait for the exit status.
    pub(crate) fn terminate(&mut self, timeout: Duration) -> Option<ExitStatus> {
        self.signal("-TERM");
        self.wait_exit(timeout)
    }

    /// Whether the process is still running (not exited, not reaped).
    #[allow(dead_code)] // used by some test modules only
    pub(crate) fn is_running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    pub(crate) fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        let child = self.child.as_mut()?;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Walpost {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            eprintln!("---- walpost log {} ----\n{}", self.log.display(), self.log_text());
        }
    }
}

/// One record as a Kafka consumer sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Consumed {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Vec<u8>)>,
    pub timestamp: Option<i64>,
}

impl Consumed {
    /// A copy of what a consumer read.
    pub(crate) fn of(m: &rdkafka::message::BorrowedMessage<'_>) -> Consumed {
        Consumed {
            topic: m.topic().to_owned(),
            partition: m.partition(),
            offset: m.offset(),
            key: m.key().map(<[u8]>::to_vec),
            value: m.payload().map(<[u8]>::to_vec),
            headers: m
                .headers()
                .map(|h| h.iter().map(|h| (h.key.to_owned(), h.value.unwrap_or_default().to_vec())).collect())
                .unwrap_or_default(),
            timestamp: m.timestamp().to_millis(),
        }
    }

    pub(crate) fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_slice())
    }

    pub(crate) fn event_id(&self) -> i64 {
        std::str::from_utf8(self.header("id").expect("id header")).unwrap().parse().unwrap()
    }
}

fn consumer(bootstrap: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", testkit::unique_name("e2e-reader"))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .create()
        .expect("create consumer")
}

/// Topics whose names start with `prefix`, as the broker knows them now.
pub(crate) fn topics_with_prefix(bootstrap: &str, prefix: &str) -> Vec<String> {
    let c = consumer(bootstrap);
    let md = c.fetch_metadata(None, Duration::from_secs(10)).expect("metadata");
    let mut names: Vec<String> =
        md.topics().iter().map(|t| t.name().to_owned()).filter(|n| n.starts_with(prefix)).collect();
    names.sort();
    names
}

/// Sum of high watermarks of every partition of the topics with `prefix`.
/// High watermark per (topic, partition).
pub(crate) type Highs = HashMap<(String, i32), i64>;

pub(crate) fn high_watermarks(bootstrap: &str, prefix: &str) -> Highs {
    let c = consumer(bootstrap);
    let md = c.fetch_metadata(None, Duration::from_secs(10)).expect("metadata");
    let mut out = HashMap::new();
    for t in md.topics().iter().filter(|t| t.name().starts_with(prefix)) {
        for p in t.partitions() {
            if let Ok((_, high)) = c.fetch_watermarks(t.name(), p.id(), Duration::from_secs(10)) {
                out.insert((t.name().to_owned(), p.id()), high);
            }
        }
    }
    out
}

/// Waits until the topics with `prefix` hold at least `expected` records, then reads
/// them all. Panics with what arrived if the count is not reached in time.
pub(crate) fn consume_at_least(bootstrap: &str, prefix: &str, expected: usize, timeout: Duration) -> Vec<Consumed> {
    let deadline = Instant::now() + timeout;
    loop {
        let total: i64 = high_watermarks(bootstrap, prefix).values().sum();
        if total as usize >= expected || Instant::now() > deadline {
            let records = read_all(bootstrap, prefix);
            assert!(
                records.len() >= expected,
                "expected at least {expected} records under {prefix}, found {}",
                records.len()
            );
            return records;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Reads the topics until every committed outbox row is there, or `timeout` passes (the
/// audit then names what is missing). For runs with duplicates: counting records, as
/// [`consume_at_least`] does, can stop before the last unique record has arrived.
pub(crate) fn consume_every_committed(w: &World, timeout: Duration) -> Vec<Consumed> {
    let deadline = Instant::now() + timeout;
    loop {
        let committed = w.committed_rows();
        let records = read_all(&w.kafka_bootstrap, &w.topic_prefix);
        let seen: HashSet<i64> = records.iter().map(Consumed::event_id).collect();
        if committed.keys().all(|id| seen.contains(id)) || Instant::now() > deadline {
            return records;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Reads every committed record (isolation.level=read_committed) in the topics with
/// `prefix`, up to each partition's last stable offset.
pub(crate) fn read_all_committed(bootstrap: &str, prefix: &str) -> Vec<Consumed> {
    read_to_end(bootstrap, prefix, "read_committed")
}

/// Reads every record currently in the topics with `prefix` (aborted ones included),
/// from offset 0 to the high watermark.
pub(crate) fn read_all(bootstrap: &str, prefix: &str) -> Vec<Consumed> {
    read_to_end(bootstrap, prefix, "read_uncommitted")
}

fn read_to_end(bootstrap: &str, prefix: &str, isolation: &str) -> Vec<Consumed> {
    let highs = high_watermarks(bootstrap, prefix);
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", testkit::unique_name("e2e-reader"))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", isolation)
        .create()
        .expect("create consumer");
    let mut tpl = TopicPartitionList::new();
    let mut remaining: HashSet<(String, i32)> = HashSet::new();
    for ((topic, partition), high) in &highs {
        if *high > 0 {
            tpl.add_partition_offset(topic, *partition, Offset::Beginning).unwrap();
            remaining.insert((topic.clone(), *partition));
        }
    }
    if remaining.is_empty() {
        return Vec::new();
    }
    c.assign(&tpl).expect("assign");
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    // Done when every partition's position reached its high watermark: past the last
    // record and any transaction markers after it (which are offsets too).
    let done = |c: &BaseConsumer, remaining: &mut HashSet<(String, i32)>| {
        let positions = c.position().expect("position");
        remaining.retain(|(t, part)| {
            let pos = positions.find_partition(t, *part).and_then(|e| e.offset().to_raw()).unwrap_or(-1);
            pos < *highs.get(&(t.clone(), *part)).unwrap_or(&0)
        });
        remaining.is_empty()
    };
    loop {
        assert!(Instant::now() < deadline, "timed out reading {prefix}: still waiting for {remaining:?}");
        match c.poll(Duration::from_millis(300)) {
            None | Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) => {
                if done(&c, &mut remaining) {
                    break;
                }
            }
            // A broker that is down (a cluster test killed it) is reported, not fatal:
            // the other brokers lead its partitions; the deadline bounds the wait.
            Some(Err(e))
                if matches!(
                    e.rdkafka_error_code(),
                    Some(RDKafkaErrorCode::BrokerTransportFailure | RDKafkaErrorCode::AllBrokersDown)
                ) => {}
            Some(Err(e)) => panic!("consume: {e}"),
            Some(Ok(m)) => out.push(Consumed::of(&m)),
        }
    }
    out.sort_by(|a, b| (&a.topic, a.partition, a.offset).cmp(&(&b.topic, b.partition, b.offset)));
    out
}

/// The delivery figures the chaos and crash tests report and bound.
#[derive(Debug, Default)]
pub(crate) struct Audit {
    pub lost: Vec<i64>,
    pub phantoms: Vec<i64>,
    pub duplicates: usize,
    pub reordered: Vec<String>,
    pub wrong_content: Vec<i64>,
    /// For each lost event: whether the slot's confirmed position is past its commit (a
    /// lost *and confirmed* event is the worst failure: the slot never sends it again).
    pub lost_vs_slot: Vec<String>,
}

/// Compares what Kafka holds with the committed rows: every committed row exactly
/// where the router says (topic, key, value bytes, headers), per-key order by id, and
/// nothing that was never committed.
pub(crate) fn audit(w: &World, records: &[Consumed]) -> Audit {
    let rows = w.committed_rows();
    let mut a = Audit::default();
    let mut seen = HashSet::new();
    // Per key: (id, partition, offset) in partition-offset order, first copies only.
    type IdPartitionOffset = (i64, i32, i64);
    let mut per_key: HashMap<(String, Vec<u8>), Vec<IdPartitionOffset>> = HashMap::new();
    let mut partition_of_key: HashMap<(String, Vec<u8>), i32> = HashMap::new();
    for r in records {
        let id = r.event_id();
        let Some(row) = rows.get(&id) else {
            a.phantoms.push(id);
            continue;
        };
        let content_ok = r.topic == w.topic(&row.aggregate_type)
            && r.key.as_deref() == Some(row.aggregate_id.as_bytes())
            && r.value.as_deref() == Some(row.payload.as_bytes())
            && r.header("eventType") == Some(row.event_type.as_bytes());
        if !content_ok {
            a.wrong_content.push(id);
        }
        let key = (r.topic.clone(), r.key.clone().unwrap_or_default());
        let p = *partition_of_key.entry(key.clone()).or_insert(r.partition);
        if p != r.partition {
            a.reordered.push(format!("key {:?} in partitions {p} and {}", key.1, r.partition));
        }
        if !seen.insert(id) {
            a.duplicates += 1;
            continue;
        }
        per_key.entry(key).or_default().push((id, r.partition, r.offset));
    }
    for (key, ids) in &per_key {
        if let Some(w) = ids.windows(2).find(|w| w[0].0 >= w[1].0) {
            a.reordered.push(format!(
                "key {:?}: ids out of commit order: id {} (partition {} offset {}) before id {} (offset {})",
                String::from_utf8_lossy(&key.1),
                w[0].0,
                w[0].1,
                w[0].2,
                w[1].0,
                w[1].2
            ));
        }
    }
    a.lost = rows.keys().filter(|id| !seen.contains(id)).copied().collect();
    a.lost_vs_slot = a.lost.iter().take(20).map(|id| w.lost_vs_slot(*id)).collect();
    a
}

impl World {
    /// Where lost event `id` stands against the slot: its transaction's commit end (from
    /// the WAL, through pg_walinspect, PostgreSQL 15+) and the slot's confirmed position.
    pub(crate) fn lost_vs_slot(&self, id: i64) -> String {
        let slot = self
            .try_sql(&format!(
                "SELECT confirmed_flush_lsn || ' ' || restart_lsn FROM pg_replication_slots WHERE slot_name = '{}'",
                self.slot
            ))
            .unwrap_or_default();
        let Some((confirmed, restart)) = slot.trim().split_once(' ') else {
            return format!("id {id}: the slot {} is gone, its confirmed position unknown", self.slot);
        };
        let xid = self.try_sql(&format!("SELECT xmin::text FROM events.outbox WHERE id = {id}")).unwrap_or_default();
        let commit = self.try_sql("CREATE EXTENSION IF NOT EXISTS pg_walinspect").and_then(|_| {
            self.try_sql(&format!(
                "SELECT end_lsn FROM pg_get_wal_records_info('{restart}', pg_current_wal_insert_lsn())
                 WHERE xid::text = '{}' AND resource_manager = 'Transaction' AND record_type LIKE 'COMMIT%'",
                xid.trim()
            ))
        });
        match commit.as_deref().map(str::trim) {
            Ok("") => format!(
                "id {id} (xid {}): its commit is before the slot's restart_lsn {restart}, so the slot (confirmed {confirmed}) is CONFIRMED PAST THIS LOST EVENT: the worst failure, walpost will never send it again",
                xid.trim()
            ),
            Ok(end) => {
                let past = parse_lsn(confirmed).zip(parse_lsn(end)).is_some_and(|(c, e)| c >= e);
                if past {
                    format!("id {id}: commit ends at {end}, slot confirmed {confirmed}: CONFIRMED PAST THIS LOST EVENT: the worst failure, walpost will never send it again")
                } else {
                    format!("id {id}: commit ends at {end}, slot confirmed {confirmed}: not confirmed past it (a restart would send it again)")
                }
            }
            Err(e) => format!("id {id}: slot confirmed {confirmed}; its commit position is unknown ({})", e.lines().next().unwrap_or("")),
        }
    }
}

/// [`consume_every_committed`], and fails the test (naming what is missing and where it
/// stands against the slot) when not every committed row arrived in time.
pub(crate) fn wait_for_every_committed(w: &World, timeout: Duration) -> Vec<Consumed> {
    let records = consume_every_committed(w, timeout);
    let a = audit(w, &records);
    assert!(a.lost.is_empty(), "not every committed event reached Kafka within {timeout:?}: {a:?}");
    records
}

/// Kafka's murmur2 (the Java client's default partitioner) and librdkafka's
/// murmur2_random: partition = (murmur2(key) & 0x7fffffff) % partitions.
pub(crate) fn java_partition(key: &[u8], partitions: i32) -> i32 {
    let seed: u32 = 0x9747_b28c;
    let m: u32 = 0x5bd1_e995;
    let r = 24;
    let len = key.len() as u32;
    let mut h: u32 = seed ^ len;
    let chunks = key.chunks_exact(4);
    let tail = chunks.remainder();
    for c in chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(m);
        k ^= k >> r;
        k = k.wrapping_mul(m);
        h = h.wrapping_mul(m);
        h ^= k;
    }
    match tail.len() {
        3 => {
            h ^= u32::from(tail[2]) << 16;
            h ^= u32::from(tail[1]) << 8;
            h ^= u32::from(tail[0]);
            h = h.wrapping_mul(m);
        }
        2 => {
            h ^= u32::from(tail[1]) << 8;
            h ^= u32::from(tail[0]);
            h = h.wrapping_mul(m);
        }
        1 => {
            h ^= u32::from(tail[0]);
            h = h.wrapping_mul(m);
        }
        _ => {}
    }
    h ^= h >> 13;
    h = h.wrapping_mul(m);
    h ^= h >> 15;
    ((h & 0x7fff_ffff) % partitions as u32) as i32
}

/// Starts a dedicated Kafka for tests that stop it.
pub(crate) fn own_kafka() -> Kafka {
    Kafka::start(testkit::KafkaOptions::default()).expect("start kafka")
}

/// `args` with `flag` set to `value` (replaced if present, else appended).
pub(crate) fn with_flag(mut args: Vec<String>, flag: &str, value: &str) -> Vec<String> {
    match args.iter().position(|a| a == flag) {
        Some(i) if flag != "--kafka-property" => args[i + 1] = value.into(),
        _ => {
            args.push(flag.into());
            args.push(value.into());
        }
    }
    args
}

/// Produces one record (acks=all) and waits for the broker's acknowledgement.
#[allow(dead_code)] // used by the exactly-once tests
pub(crate) fn produce_one(bootstrap: &str, topic: &str, key: &str, value: &str) {
    use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
    let p: ThreadedProducer<DefaultProducerContext> =
        ClientConfig::new().set("bootstrap.servers", bootstrap).set("acks", "all").create().expect("create producer");
    p.send(BaseRecord::to(topic).key(key).payload(value)).map_err(|(e, _)| e).expect("enqueue");
    p.flush(Duration::from_secs(30)).expect("flush");
}

/// `text` without ANSI escape sequences (walpost's log may be coloured).
pub(crate) fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The inbox's migrations into schema `inbox`, in the order they are applied, as a team
/// that runs them with psql does (docs/inbox.md): the schema, then search_path, then the
/// files; `walpost migrate --inbox` and `--create-schema` apply the same files.
pub(crate) fn inbox_migrations() -> String {
    let files = [
        "0001_inbox.sql",
        "0002_inbox_hardening.sql",
        "0003_inbox_batches.sql",
        "0004_inbox_heads.sql",
        "0005_inbox_control.sql",
    ]
    .iter()
    .map(|f| std::fs::read_to_string(format!("{}/../../migrations/inbox/{f}", env!("CARGO_MANIFEST_DIR"))).unwrap())
    .collect::<Vec<_>>()
    .join("\n");
    format!("CREATE SCHEMA IF NOT EXISTS inbox;\nSET search_path = inbox, pg_temp;\n{files}\nRESET search_path;")
}
