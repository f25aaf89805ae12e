//! Multi-host connection strings against fake servers: hosts tried in order,
//! `target_session_attrs`, one error naming every host, `PG*` defaults and the password
//! file, and SQL connections pinned to the host a replication connection chose.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)] // tests fail loudly

mod support;

use std::collections::HashMap;
use std::time::Duration;

use replication::{Config, Error, ReplicationClient};
use support::{closed_port, silent_port, Ask, FakeServer, Script};

fn parse(text: &str) -> Config {
    parse_env(text, &[])
}

fn parse_env(text: &str, vars: &[(&str, String)]) -> Config {
    let map: HashMap<String, String> = vars.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect();
    Config::parse_with_env(text, &|k| map.get(k).cloned()).unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn trust() -> Script {
    Script::new(Ask::Trust)
}

/// A server in recovery, known only by asking (as before PostgreSQL 14).
fn standby_by_query() -> Script {
    trust().answer("SELECT pg_catalog.pg_is_in_recovery()", "t").answer("SHOW transaction_read_only", "on")
}

fn primary_by_query() -> Script {
    trust().answer("SELECT pg_catalog.pg_is_in_recovery()", "f").answer("SHOW transaction_read_only", "off")
}

async fn connected_port(config: &Config) -> u16 {
    let client = ReplicationClient::connect(config).await.unwrap_or_else(|e| panic!("{e}"));
    let port = client.connected_host().port;
    client.close().await;
    port
}

#[tokio::test]
async fn first_host_down_second_used_in_url_and_key_value_forms() {
    let down = closed_port();
    let up = FakeServer::start(trust());
    let url = parse(&format!("postgres://app@127.0.0.1:{down},127.0.0.1:{}/shop?sslmode=disable", up.port));
    assert_eq!(connected_port(&url).await, up.port);
    let kv = parse(&format!("host=127.0.0.1,localhost port={down},{} user=app dbname=shop sslmode=disable", up.port));
    assert_eq!(connected_port(&kv).await, up.port);
    assert_eq!(up.seen().startup.get("replication").map(String::as_str), Some("database"));
}

#[tokio::test]
async fn first_host_a_standby_is_skipped_for_primary_and_read_write() {
    let standby = FakeServer::start(standby_by_query());
    let primary = FakeServer::start(primary_by_query());
    for attrs in ["primary", "read-write"] {
        let c = parse(&format!(
            "host=127.0.0.1,127.0.0.1 port={},{} user=app sslmode=disable target_session_attrs={attrs}",
            standby.port, primary.port
        ));
        assert_eq!(connected_port(&c).await, primary.port, "{attrs}");
        let asked = standby.seen().queries;
        let expected =
            if attrs == "primary" { "SELECT pg_catalog.pg_is_in_recovery()" } else { "SHOW transaction_read_only" };
        assert_eq!(asked, vec![expected.to_owned()], "{attrs}");
        assert_eq!(primary.seen().queries, vec![expected.to_owned()], "{attrs}");
    }
}

/// PostgreSQL 14+ reports `in_hot_standby` and `default_transaction_read_only` at
/// startup: no query is needed.
#[tokio::test]
async fn reported_parameters_decide_without_a_query() {
    let standby =
        FakeServer::start(trust().param("in_hot_standby", "on").param("default_transaction_read_only", "off"));
    let primary =
        FakeServer::start(trust().param("in_hot_standby", "off").param("default_transaction_read_only", "off"));
    let c = parse(&format!(
        "postgres://app@127.0.0.1:{},127.0.0.1:{}/shop?sslmode=disable&target_session_attrs=read-write",
        standby.port, primary.port
    ));
    assert_eq!(connected_port(&c).await, primary.port);
    assert!(standby.seen().queries.is_empty());
    assert!(primary.seen().queries.is_empty());
}

#[tokio::test]
async fn standby_read_only_and_prefer_standby() {
    let primary = FakeServer::start(primary_by_query());
    let standby = FakeServer::start(standby_by_query());
    let hosts = |a: u16, b: u16, attrs: &str| {
        parse(&format!("host=127.0.0.1,127.0.0.1 port={a},{b} user=app sslmode=disable target_session_attrs={attrs}"))
    };
    assert_eq!(connected_port(&hosts(primary.port, standby.port, "standby")).await, standby.port);
    assert_eq!(connected_port(&hosts(primary.port, standby.port, "read-only")).await, standby.port);
    assert_eq!(connected_port(&hosts(primary.port, standby.port, "prefer-standby")).await, standby.port);
    assert_eq!(connected_port(&hosts(standby.port, primary.port, "any")).await, standby.port);
    // No standby at all: prefer-standby settles on the first primary.
    let other_primary = FakeServer::start(primary_by_query());
    assert_eq!(connected_port(&hosts(primary.port, other_primary.port, "prefer-standby")).await, primary.port);
}

#[tokio::test]
async fn all_hosts_unusable_is_one_error_naming_each_host_and_why() {
    let down = closed_port();
    let standby = FakeServer::start(standby_by_query());
    let (silent, _listener) = silent_port();
    let c = parse(&format!(
        "postgres://app:Secr3tPw@127.0.0.1:{down},127.0.0.1:{},127.0.0.1:{silent}/shop?target_session_attrs=primary&connect_timeout=2&sslmode=disable",
        standby.port
    ));
    let started = std::time::Instant::now();
    let e = ReplicationClient::connect(&c).await.expect_err("no host qualifies");
    assert!(started.elapsed() < Duration::from_secs(8), "each host has its own timeout: {:?}", started.elapsed());
    let text = e.to_string();
    assert!(text.starts_with("no usable PostgreSQL host among the 3 given:"), "{text}");
    assert!(
        text.contains(&format!(
            "[127.0.0.1:{down}] cannot connect to PostgreSQL at postgres://app:****@127.0.0.1:{down}/shop"
        )),
        "{text}"
    );
    assert!(text.contains("Connection refused"), "{text}");
    assert!(
        text.contains(&format!("[127.0.0.1:{}] PostgreSQL at 127.0.0.1:{} is a standby (in recovery), and target_session_attrs=primary needs a primary", standby.port, standby.port)),
        "{text}"
    );
    assert!(text.contains(&format!("[127.0.0.1:{silent}] timed out after 2 s")), "{text}");
    assert!(!text.contains("Secr3tPw") && !format!("{e:?}").contains("Secr3tPw"), "{text}");
    assert!(e.is_transient(), "hosts may come back: {text}");
    let Error::NoUsableHost { failures, not_tried } = e else { panic!() };
    assert_eq!(failures.len(), 3);
    assert!(not_tried.is_empty());
}

#[tokio::test]
async fn one_host_keeps_its_own_error() {
    let down = closed_port();
    let c = parse(&format!("postgres://app:pw@127.0.0.1:{down}/shop"));
    let e = ReplicationClient::connect(&c).await.expect_err("down");
    assert!(matches!(e, Error::Connect { .. }), "{e:?}");
    assert_eq!(
        e.to_string().split(": ").next().unwrap(),
        format!("cannot connect to PostgreSQL at postgres://app:****@127.0.0.1:{down}/shop")
    );
    assert!(e.is_transient());
}

/// As in libpq: once a server was reached and authentication failed, later hosts are
/// not tried (the password is not offered to every host in turn), and the error is
/// definite.
#[tokio::test]
async fn authentication_failure_ends_the_search() {
    let down = closed_port();
    let rejecting =
        FakeServer::start(Script::new(Ask::Fail("28P01", "password authentication failed for user \"app\"")));
    let never = FakeServer::start(trust());
    let c = parse(&format!(
        "host=127.0.0.1,127.0.0.1,127.0.0.1 port={down},{},{} user=app password=pw sslmode=disable",
        rejecting.port, never.port
    ));
    let e = ReplicationClient::connect(&c).await.expect_err("bad password");
    let text = e.to_string();
    assert!(text.contains("password authentication failed"), "{text}");
    assert!(
        text.contains(&format!("not tried after that authentication failure (as libpq): 127.0.0.1:{}", never.port)),
        "{text}"
    );
    assert!(!e.is_transient(), "{text}");
    assert!(!never.saw_any(Duration::from_millis(300)), "the host after an authentication failure was tried");

    // A server error that is not about authentication (starting up) moves on.
    let starting = FakeServer::start(Script::new(Ask::Fail("57P03", "the database system is starting up")));
    let c = parse(&format!("host=127.0.0.1,127.0.0.1 port={},{} user=app sslmode=disable", starting.port, never.port));
    assert_eq!(connected_port(&c).await, never.port);
}

#[tokio::test]
async fn pg_environment_defaults_and_password_file_reach_the_right_host() {
    let down = closed_port();
    let password = "from-the-file";
    let server = FakeServer::start(Script::new(Ask::Scram {
        password: password.into(),
        mechanisms: vec!["SCRAM-SHA-256"],
        skip_final: false,
    }));
    let dir = support::temp_dir("pgpass");
    let file = dir.join("pgpass");
    std::fs::write(&file, format!("127.0.0.1:{down}:shop:app:wrong\n127.0.0.1:{}:shop:app:{password}\n", server.port))
        .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let env = [
        ("PGHOST", "127.0.0.1,127.0.0.1".to_owned()),
        ("PGPORT", format!("{down},{}", server.port)),
        ("PGUSER", "app".to_owned()),
        ("PGDATABASE", "shop".to_owned()),
        ("PGPASSFILE", file.display().to_string()),
        ("PGSSLMODE", "disable".to_owned()),
        ("PGAPPNAME", "env-app".to_owned()),
        ("PGTARGETSESSIONATTRS", "any".to_owned()),
        ("PGCONNECT_TIMEOUT", "5".to_owned()),
    ];
    let c = parse_env("", &env);
    assert_eq!(connected_port(&c).await, server.port);
    let seen = server.seen();
    assert!(seen.scram_verified, "the password file's line for this host was used");
    assert_eq!(seen.startup.get("application_name").map(String::as_str), Some("env-app"));
    assert_eq!(seen.startup.get("database").map(String::as_str), Some("shop"));
}

#[tokio::test]
async fn sql_connections_pinned_to_the_replication_host() {
    let standby = FakeServer::start(standby_by_query());
    let primary = FakeServer::start(primary_by_query());
    let c = parse(&format!(
        "host=127.0.0.1,127.0.0.1 port={},{} user=app sslmode=disable target_session_attrs=primary",
        standby.port, primary.port
    ));
    let repl = ReplicationClient::connect(&c).await.unwrap();
    let pinned = c.pinned_to(repl.connected_host());
    assert_eq!(pinned.hosts.len(), 1);
    let sql = ReplicationClient::connect_sql(&pinned).await.unwrap();
    assert_eq!(sql.connected_host(), repl.connected_host());
    sql.close().await;
    repl.close().await;
    let _ = standby.seen();
    let first = primary.seen();
    let second = primary.seen();
    let modes: Vec<bool> = [first, second].iter().map(|s| s.startup.contains_key("replication")).collect();
    assert!(modes.contains(&true) && modes.contains(&false), "{modes:?}");
}
