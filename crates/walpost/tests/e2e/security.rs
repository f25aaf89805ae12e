//! Transport and authentication: TLS with certificate checks, SCRAM, md5, Unix sockets.

use std::time::Duration;

use testkit::{PgOptions, Postgres};

use crate::support::*;

const WAIT: Duration = Duration::from_secs(120);

fn args_with_url(w: &World, url: &str) -> Vec<String> {
    let mut args = w.args();
    let i = args.iter().position(|a| a == "--postgres").unwrap();
    args[i + 1] = url.to_owned();
    args
}

/// One stream run: start, insert a batch of 10, wait for it, stop cleanly. Returns
/// whether walpost's replication connection used TLS.
fn stream_once(w: &World, url: &str, first_batch: u32, expected_total: usize) -> bool {
    let mut p = Walpost::start(&args_with_url(w, url), &[]);
    // Rows committed before the slot exists are not streamed (no snapshot).
    assert!(w.wait_for_slot(WAIT), "{}", p.log_text());
    insert_batches(w, first_batch, 1, 10, 5, &["order"]);
    consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, expected_total, WAIT);
    let tls = w.sql(
        "SELECT bool_or(s.ssl) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
         WHERE a.application_name = 'walpost' AND a.backend_type = 'walsender'",
    ) == "t";
    let status = p.terminate(Duration::from_secs(30)).expect("stops on SIGTERM");
    assert!(status.success(), "{}", p.log_text());
    assert!(!p.log_text().contains("pw-md5") && !p.log_text().contains(":walpost@"), "password in log");
    tls
}

#[test]
fn tls_verify_full_md5_and_unix_socket_all_stream() {
    let pg: &'static Postgres = Box::leak(Box::new(
        Postgres::start(PgOptions {
            tls: true,
            extra_hba: vec![
                "host all md5user 127.0.0.1/32 md5".into(),
                "host replication md5user 127.0.0.1/32 md5".into(),
            ],
            ..PgOptions::default()
        })
        .expect("start postgres with TLS"),
    ));
    let w = World::on(pg, &testkit::shared_kafka().bootstrap(), "tls");
    let tls = pg.tls_dir().unwrap().to_owned();
    let ca = tls.join("ca.crt").display().to_string();

    // TLS, certificate chain and host name checked; SCRAM-SHA-256 inside.
    let verify_full = format!("{}?sslmode=verify-full&sslrootcert={ca}", pg.url_for("walpost", "walpost", &w.db));
    assert!(stream_once(&w, &verify_full, 0, 10), "verify-full must stream over TLS");

    // md5 authentication (a role whose password is stored as md5).
    w.sql(
        "SET password_encryption = 'md5'; CREATE ROLE md5user LOGIN REPLICATION PASSWORD 'pw-md5';
         GRANT USAGE ON SCHEMA events TO md5user; GRANT SELECT ON events.outbox TO md5user;",
    );
    // Over plain TCP walpost sends an md5 response only when told to (require_auth).
    let md5 = format!("{}?sslmode=disable&require_auth=md5", pg.url_for("md5user", "pw-md5", &w.db));
    assert!(!stream_once(&w, &md5, 1, 20), "sslmode=disable must not use TLS");

    // Unix socket (trust for local connections in the harness's pg_hba.conf).
    let socket = format!("postgres://walpost@/{}?host={}&port={}", w.db, pg.socket_dir().display(), pg.port());
    assert!(!stream_once(&w, &socket, 2, 30));

    // A certificate that does not chain to the given root: refused, nothing streamed.
    let wrong_ca = tls.join("client.crt").display().to_string();
    let url = format!("{}?sslmode=verify-full&sslrootcert={wrong_ca}", pg.url_for("walpost", "walpost", &w.db));
    let mut p = Walpost::start(&args_with_url(&w, &url), &[]);
    let status = p.wait_exit(Duration::from_secs(60)).expect("walpost must stop on a bad certificate");
    assert!(!status.success());
    assert!(p.log_text().contains("TLS to PostgreSQL failed"), "{}", p.log_text());
    assert!(p.log_text().contains("certificate"), "{}", p.log_text());

    let records = read_all(&w.kafka_bootstrap, &w.topic_prefix);
    let a = audit(&w, &records);
    assert!(a.lost.is_empty() && a.phantoms.is_empty() && a.reordered.is_empty() && a.duplicates == 0, "{a:?}");
    assert_eq!(records.len(), 30);
}

/// Kafka SASL/PLAIN through librdkafka properties: walpost streams to a SASL listener
/// with the right credentials, and a wrong password is reported, not silently retried
/// forever without a word.
#[test]
fn kafka_sasl_plain_through_kafka_properties() {
    let sasl_port = testkit::free_port();
    let jaas = "org.apache.kafka.common.security.plain.PlainLoginModule required \
                username=\"admin\" password=\"admin-secret\" user_admin=\"admin-secret\" user_walpost=\"walpost-secret\";";
    let kafka: &'static testkit::Kafka = Box::leak(Box::new(
        testkit::Kafka::start(testkit::KafkaOptions {
            extra_props: vec![
                (
                    "listeners".into(),
                    format!("PLAINTEXT://127.0.0.1:{{port}},CONTROLLER://127.0.0.1:{{controller_port}},SASL_PLAINTEXT://127.0.0.1:{sasl_port}"),
                ),
                (
                    "advertised.listeners".into(),
                    format!("PLAINTEXT://127.0.0.1:{{port}},SASL_PLAINTEXT://127.0.0.1:{sasl_port}"),
                ),
                (
                    "listener.security.protocol.map".into(),
                    "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT".into(),
                ),
                ("sasl.enabled.mechanisms".into(), "PLAIN".into()),
                ("listener.name.sasl_plaintext.plain.sasl.jaas.config".into(), jaas.into()),
            ],
        })
        .expect("start kafka with a SASL listener"),
    ));
    // walpost talks to the SASL listener only; the test reads through the plain one.
    let w = World::on(testkit::shared_postgres(), &kafka.bootstrap(), "sasl");
    let mut args = w.args();
    let i = args.iter().position(|a| a == "--kafka-brokers").unwrap();
    args[i + 1] = format!("127.0.0.1:{sasl_port}");
    for p in ["security.protocol=SASL_PLAINTEXT", "sasl.mechanisms=PLAIN", "sasl.username=walpost"] {
        args.extend(["--kafka-property".to_string(), p.to_string()]);
    }
    let mut good = args.clone();
    good.extend(["--kafka-property".to_string(), "sasl.password=walpost-secret".to_string()]);
    // Regression: `walpost check` built a bare Kafka client without [kafka.properties]
    // and reported a SASL cluster unreachable.
    let mut check = good.clone();
    check[0] = "check".into();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_walpost")).args(&check).output().unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(report.contains(&format!("ok    Kafka at 127.0.0.1:{sasl_port}: 1 broker(s)")), "{report}");
    assert!(!report.contains("not reachable"), "{report}");
    let mut p = Walpost::start(&good, &[]);
    assert!(w.wait_for_slot(WAIT));
    insert_batches(&w, 0, 1, 10, 5, &["order"]);
    let records = consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 10, WAIT);
    assert_eq!(records.len(), 10);
    assert!(p.terminate(Duration::from_secs(30)).unwrap().success());
    assert!(!p.log_text().contains("walpost-secret"), "SASL password in the log");

    let mut bad = args;
    bad.extend(["--kafka-property".to_string(), "sasl.password=wrong".to_string()]);
    let mut p = Walpost::start(&bad, &[]);
    insert_batches(&w, 1, 1, 10, 5, &["order"]);
    assert!(
        testkit::wait_until(Duration::from_secs(60), || p.log_text().contains("Authentication failed")),
        "{}",
        p.log_text()
    );
    assert!(!p.log_text().contains("sasl.password=wrong"));
    assert_eq!(read_all(&w.kafka_bootstrap, &w.topic_prefix).len(), 10, "nothing published without authentication");
    // Nothing of the unauthenticated run was confirmed: with the right password again,
    // every event arrives (a confirmed-but-unpublished event would never be re-sent).
    p.kill9();
    let _fixed = Walpost::start(&good, &[]);
    let records = consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 20, WAIT);
    let a = audit(&w, &records);
    assert!(a.lost.is_empty() && a.phantoms.is_empty() && a.reordered.is_empty(), "{a:?}");
}
