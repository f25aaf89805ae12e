//! Smoke test of the harness itself: real PostgreSQL and real Kafka, start/stop/restart.

use std::process::Command;
use std::time::Instant;

use testkit::{Kafka, KafkaOptions, PgOptions, Postgres, StopMode};

/// A SCRAM login over TCP (not the trusted Unix socket) with psql and PGPASSWORD.
fn tcp_query(pg: &Postgres, password: &str, sql: &str) -> Result<String, String> {
    let out = Command::new(pg.psql_path())
        .args(["-X", "-At", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p"])
        .arg(pg.port().to_string())
        .args(["-U", "walpost", "-d", "walpost", "-c", sql])
        .env("PGPASSWORD", password)
        .env("PGSSLMODE", "disable")
        .env("PGCONNECT_TIMEOUT", "10")
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

fn check_pg(pg: &Postgres) {
    assert_eq!(pg.psql("SHOW wal_level").expect("psql"), "logical");
    assert_eq!(pg.psql("SHOW listen_addresses").expect("psql"), "127.0.0.1");
    assert_eq!(pg.psql("SHOW fsync").expect("psql"), "off");
    assert_eq!(pg.psql("SHOW synchronous_commit").expect("psql"), "on");
    assert_eq!(
        pg.psql("SELECT rolsuper, rolreplication FROM pg_roles WHERE rolname = 'walpost'").expect("psql"),
        "t|t"
    );
    // SCRAM over TCP as walpost.
    let who = tcp_query(pg, "walpost", "SELECT current_user || ' ' || current_database()").expect("scram login");
    assert_eq!(who, "walpost walpost");
    let auth =
        tcp_query(pg, "walpost", "SELECT rolpassword LIKE 'SCRAM-SHA-256$%' FROM pg_authid WHERE rolname = 'walpost'")
            .expect("scram login");
    assert_eq!(auth, "t");
    // Wrong password must be refused (so it really is password auth, not trust).
    let e = tcp_query(pg, "wrong", "SELECT 1").expect_err("wrong password accepted");
    assert!(e.contains("password authentication failed"), "{e}");
}

#[test]
fn postgres_start_query_restart() {
    let t0 = Instant::now();
    let pg = Postgres::start(PgOptions { extra_conf: vec![("work_mem".into(), "7MB".into())], ..Default::default() })
        .expect("start postgres");
    eprintln!("postgres started in {:?}", t0.elapsed());
    assert!(pg.major_version() >= 14, "{}", pg.major_version());
    assert_eq!(pg.url(), format!("postgres://walpost:walpost@127.0.0.1:{}/walpost", pg.port()));
    assert_eq!(pg.psql("SHOW work_mem").expect("psql"), "7MB");
    check_pg(&pg);

    // Multi-statement scripts, CREATE DATABASE, errors.
    pg.psql("CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t VALUES (1, 'a'), (2, 'b');").expect("script");
    assert_eq!(pg.psql("SELECT id, v FROM t ORDER BY id").expect("select"), "1|a\n2|b");
    let e = pg.psql("SELECT * FROM no_such_table").expect_err("error expected");
    assert!(e.to_string().contains("no_such_table"), "{e}");
    let url = pg.create_database("other_db").expect("create database");
    assert!(url.ends_with("/other_db"), "{url}");
    assert_eq!(pg.psql_db("other_db", "SELECT current_database()").expect("psql_db"), "other_db");
    // Logical decoding works (wal_level=logical, slots available).
    pg.psql("SELECT pg_create_logical_replication_slot('smoke_slot', 'pgoutput')").expect("slot");

    let t1 = Instant::now();
    pg.restart(StopMode::Fast).expect("restart fast");
    eprintln!("postgres fast restart in {:?}", t1.elapsed());
    check_pg(&pg);
    assert_eq!(pg.psql("SELECT count(*) FROM t").expect("data survives"), "2");
    assert_eq!(pg.psql("SELECT slot_name FROM pg_replication_slots").expect("slots"), "smoke_slot");

    pg.restart(StopMode::Immediate).expect("restart immediate");
    assert_eq!(pg.psql("SELECT count(*) FROM t").expect("after crash recovery"), "2");
    assert!(pg.log_tail(200).contains("database system is ready to accept connections"));

    let dir = pg.dir().to_path_buf();
    drop(pg);
    if std::env::var_os("WALPOST_KEEP_TEST_DIRS").is_none() {
        assert!(!dir.exists(), "temp dir not removed: {}", dir.display());
    }
}

#[test]
fn postgres_tls_and_extra_hba() {
    let pg = Postgres::start(PgOptions {
        tls: true,
        superuser_password: Some("s3cr:et/@".into()),
        extra_hba: vec!["host all md5er 127.0.0.1/32 md5".into()],
        ..Default::default()
    })
    .expect("start postgres");
    assert_eq!(pg.psql("SHOW ssl").expect("psql"), "on");
    assert!(pg.url().contains(":s3cr%3Aet%2F%40@"), "{}", pg.url());
    let tls = pg.tls_dir().expect("tls dir");
    for f in ["ca.crt", "server.crt", "server.key", "client.crt", "client.key"] {
        assert!(tls.join(f).is_file(), "{f}");
    }
    // Verify-full TLS login with the generated CA.
    let out = Command::new(pg.psql_path())
        .arg(format!(
            "host=127.0.0.1 port={} user=walpost dbname=walpost sslmode=verify-full sslrootcert={}",
            pg.port(),
            tls.join("ca.crt").display()
        ))
        .args(["-X", "-At", "-c", "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"])
        .env("PGPASSWORD", "s3cr:et/@")
        .output()
        .expect("psql");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "t");
    assert!(pg.psql("SHOW hba_file").is_ok());
    let rules = pg.psql("SELECT auth_method FROM pg_hba_file_rules ORDER BY line_number LIMIT 1").expect("hba rules");
    assert_eq!(rules, "md5");
}

#[test]
fn kafka_start_topic_restart() {
    let t0 = Instant::now();
    let mut kafka = Kafka::start(KafkaOptions { extra_props: vec![("log.retention.hours".into(), "1".into())] })
        .expect("start kafka");
    eprintln!("kafka started in {:?}", t0.elapsed());
    let bootstrap = kafka.bootstrap();
    assert_eq!(bootstrap, format!("127.0.0.1:{}", kafka.port()));
    assert!(std::net::TcpStream::connect(&bootstrap).is_ok());

    kafka.create_topic("smoke-one", 2).expect("create topic");

    let t1 = Instant::now();
    kafka.stop().expect("stop");
    eprintln!("kafka stopped in {:?}", t1.elapsed());
    assert!(!kafka.is_running());
    assert!(std::net::TcpStream::connect(&bootstrap).is_err(), "port still open after stop");
    let log = kafka.log_tail(400);
    assert!(
        log.contains("Transition from SHUTTING_DOWN to SHUTDOWN"),
        "not a graceful shutdown:\n{}",
        kafka.log_tail(20)
    );

    let t2 = Instant::now();
    kafka.start_again().expect("start again");
    eprintln!("kafka restarted in {:?}", t2.elapsed());
    assert_eq!(kafka.bootstrap(), bootstrap, "same port after restart");
    kafka.create_topic("smoke-two", 1).expect("create second topic");
    // The first topic survived the restart: creating it again must fail.
    let e = kafka.create_topic("smoke-one", 2).expect_err("duplicate topic must fail");
    assert!(e.to_string().contains("already exists"), "{e}");

    // kill -9 and come back.
    kafka.kill().expect("kill");
    assert!(!kafka.is_running());
    let t3 = Instant::now();
    kafka.start_again().expect("start after kill");
    eprintln!("kafka restarted after kill -9 in {:?}", t3.elapsed());
    assert!(kafka.is_running());
    assert!(std::net::TcpStream::connect(&bootstrap).is_ok());

    let dir = kafka.dir().to_path_buf();
    drop(kafka);
    if std::env::var_os("WALPOST_KEEP_TEST_DIRS").is_none() {
        assert!(!dir.exists(), "temp dir not removed: {}", dir.display());
    }
}

#[test]
fn shared_postgres_gives_databases() {
    let pg = testkit::shared_postgres();
    assert!(std::ptr::eq(pg, testkit::shared_postgres()));
    let name = testkit::unique_name("db");
    let url = pg.create_database(&name).expect("create db");
    assert_eq!(url, pg.url_for("walpost", "walpost", &name));
    assert_eq!(pg.psql_db(&name, "SELECT current_database()").expect("psql"), name);
    assert_eq!(pg.psql("SHOW max_replication_slots").expect("psql"), "64");
}

const ORPHAN_ENV: &str = "TESTKIT_SMOKE_ORPHAN_CHILD";

/// Child half of `orphaned_servers_are_cleaned_up`; a no-op in a normal run. Starts the
/// shared servers, reports them, then SIGKILLs its own process (no Drop, no atexit).
#[test]
fn orphan_child_helper() {
    if std::env::var_os(ORPHAN_ENV).is_none() {
        return;
    }
    let pg = testkit::shared_postgres();
    let kafka = testkit::shared_kafka();
    println!("\nORPHAN {} {} {} {}", pg.port(), pg.dir().display(), kafka.port(), kafka.dir().display());
    std::io::Write::flush(&mut std::io::stdout()).expect("flush");
    let _ = Command::new("kill").args(["-KILL", &std::process::id().to_string()]).status();
    std::thread::sleep(std::time::Duration::from_secs(30));
    unreachable!("still alive after SIGKILL");
}

#[test]
fn orphaned_servers_are_cleaned_up() {
    let exe = std::env::current_exe().expect("current_exe");
    let out = Command::new(exe)
        .args(["--exact", "orphan_child_helper", "--nocapture", "--test-threads=1"])
        .env(ORPHAN_ENV, "1")
        .env_remove("WALPOST_KEEP_TEST_DIRS")
        .output()
        .expect("run child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "child was not killed: {stdout}");
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("ORPHAN ").map(|(_, rest)| rest))
        .unwrap_or_else(|| panic!("no report from child:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr)));
    let f: Vec<&str> = line.split(' ').collect();
    let (pg_port, pg_dir, kafka_port, kafka_dir) =
        (f[0], std::path::PathBuf::from(f[1]), f[2], std::path::PathBuf::from(f[3]));
    let closed = |port: &str| std::net::TcpStream::connect(format!("127.0.0.1:{port}")).is_err();
    let pg_gone = testkit::wait_until(std::time::Duration::from_secs(20), || closed(pg_port) && !pg_dir.exists());
    assert!(pg_gone, "orphaned postgres still up or dir left: {}", pg_dir.display());
    let kafka_gone =
        testkit::wait_until(std::time::Duration::from_secs(20), || closed(kafka_port) && !kafka_dir.exists());
    assert!(kafka_gone, "orphaned kafka still up or dir left: {}", kafka_dir.display());
    // And no process still mentions those directories.
    let ps = Command::new("ps").args(["-eo", "args"]).output().expect("ps");
    let ps = String::from_utf8_lossy(&ps.stdout);
    assert!(!ps.contains(&*pg_dir.to_string_lossy()), "{ps}");
    assert!(!ps.contains(&*kafka_dir.to_string_lossy()), "{ps}");
}

/// The single-node broker supports transactions (transaction state log RF 1, min ISR 1):
/// a transactional producer commits, the coordinator reports the transactional id, and
/// a read_committed consumer sees every record while commit markers take offsets.
#[test]
fn kafka_transactional_producer_works() {
    let kafka = testkit::shared_kafka();
    let topic = testkit::unique_name("tx");
    let txid = testkit::unique_name("smoke_txid");
    let bootstrap = kafka.bootstrap();
    let out = kafka
        .run_tool(
            "org.apache.kafka.tools.ProducerPerformance",
            &[
                "--topic",
                &topic,
                "--num-records",
                "300",
                "--record-size",
                "50",
                "--throughput",
                "-1",
                "--transactional-id",
                &txid,
                "--transaction-duration-ms",
                "50",
                "--producer-props",
                &format!("bootstrap.servers={bootstrap}"),
            ],
        )
        .expect("transactional ProducerPerformance");
    assert!(out.contains("300 records sent"), "{out}");

    // The transaction coordinator knows the id and its last transaction committed.
    let described = kafka
        .run_tool(
            "org.apache.kafka.tools.TransactionsCommand",
            &["--bootstrap-server", &bootstrap, "describe", "--transactional-id", &txid],
        )
        .expect("TransactionsCommand describe");
    assert!(described.contains(&txid) && described.contains("CompleteCommit"), "{described}");
    let m = kafka.metadata(Some(&["__transaction_state"])).expect("metadata");
    let tx_log = m.topic("__transaction_state").expect("__transaction_state exists");
    assert!(tx_log.internal);
    assert!(tx_log.partitions.iter().all(|p| p.replicas == vec![1] && p.isr == vec![1]), "{tx_log:?}");

    // read_committed consumer: all 300 records.
    let consumed = kafka
        .run_tool(
            "org.apache.kafka.tools.consumer.ConsoleConsumer",
            &[
                "--bootstrap-server",
                &bootstrap,
                "--topic",
                &topic,
                "--from-beginning",
                "--max-messages",
                "300",
                "--timeout-ms",
                "30000",
                "--isolation-level",
                "read_committed",
            ],
        )
        .expect("ConsoleConsumer");
    assert_eq!(consumed.lines().count(), 300);
    // Commit markers occupy offsets: end offsets add up to more than the records.
    let offsets = kafka
        .run_tool("org.apache.kafka.tools.GetOffsetShell", &["--bootstrap-server", &bootstrap, "--topic", &topic])
        .expect("GetOffsetShell");
    let end: u64 = offsets.lines().filter_map(|l| l.rsplit(':').next()?.trim().parse::<u64>().ok()).sum();
    assert!(end > 300, "no transaction markers? end offsets {offsets}");
    eprintln!("transactional produce: 300 records, end offsets sum {end} (commit markers)");
}
