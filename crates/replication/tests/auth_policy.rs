//! No password to an unverified server: a fake PostgreSQL server asks for a
//! cleartext password, an MD5 hash or SCRAM, with no TLS, with a self-signed certificate
//! or with a certificate from a CA the test made, and reports what the client sent.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)] // tests fail loudly

mod support;

use replication::{Config, Error, ReplicationClient};
use support::{Ask, Ca, FakeServer, Identity, Script};

/// The password every test uses, with URL delimiters in it: it must never show up in an
/// error text, and reach the server only when the policy allows.
const CANARY: &str = "Can4ry/Pa55@Wq?Zx#Kj";

fn config(port: u16, params: &str) -> Config {
    let text = format!("postgres://app:{CANARY}@127.0.0.1:{port}/shop?connect_timeout=10{params}");
    Config::parse_with_env(&text, &|_| None).unwrap()
}

fn assert_no_canary(e: &Error) {
    let shown = format!("{e} | {e:?}");
    assert!(!shown.contains(CANARY), "{shown}");
    assert!(!shown.contains("Can4ry"), "{shown}");
}

async fn connect(config: &Config) -> Result<ReplicationClient, Error> {
    ReplicationClient::connect(config).await
}

/// Connects, expecting walpost's refusal; returns its text.
async fn refused(config: &Config) -> String {
    let e = connect(config).await.expect_err("the connection must be refused");
    assert_no_canary(&e);
    assert!(matches!(e, Error::AuthRefused { .. }), "{e:?}");
    assert!(!e.is_transient(), "a refusal is definite: {e}");
    e.to_string()
}

/// Connects, expecting success, and closes.
async fn accepted(config: &Config) {
    let client = connect(config).await.unwrap_or_else(|e| panic!("{e}"));
    client.close().await;
}

fn md5_of_canary() -> Vec<u8> {
    postgres_protocol::authentication::md5_hash(b"app", CANARY.as_bytes(), *b"salt").into_bytes()
}

#[tokio::test]
async fn regression_default_sslmode_server_declines_tls_cleartext_password_not_sent() {
    let server = FakeServer::start(Script::new(Ask::Cleartext));
    let text = refused(&config(server.port, "")).await;
    let seen = server.seen();
    assert!(seen.ssl_requested && !seen.tls);
    assert_eq!(seen.password, None, "the password went to a server that declined TLS");
    assert!(text.contains("cleartext password") && text.contains("server declined TLS"), "{text}");
    assert!(text.contains("require_auth=password") && text.contains("verify-full"), "{text}");
    assert!(text.contains(&format!("127.0.0.1:{}", server.port)), "{text}");
}

#[tokio::test]
async fn regression_default_policy_refuses_md5_without_tls_and_names_require_auth_md5() {
    let server = FakeServer::start(Script::new(Ask::Md5));
    let text = refused(&config(server.port, "&sslmode=disable")).await;
    assert_eq!(server.seen().password, None);
    assert!(text.contains("MD5") && text.contains("sslmode=disable") && text.contains("require_auth=md5"), "{text}");
}

#[tokio::test]
async fn regression_sslmode_require_self_signed_certificate_cleartext_not_sent() {
    let identity = Identity::self_signed("anyone");
    for ask in [Ask::Cleartext, Ask::Md5] {
        let server = FakeServer::start(Script::new(ask).with_tls(&identity));
        let text = refused(&config(server.port, "&sslmode=require")).await;
        let seen = server.seen();
        assert!(seen.tls, "TLS was used");
        assert_eq!(seen.password, None, "the password went to a server whose certificate nobody checked");
        assert!(text.contains("not verified"), "{text}");
    }
}

#[tokio::test]
async fn regression_require_auth_password_sends_it() {
    let server = FakeServer::start(Script::new(Ask::Cleartext));
    accepted(&config(server.port, "&require_auth=password")).await;
    assert_eq!(server.seen().password.as_deref(), Some(CANARY.as_bytes()));

    // The same through PGREQUIREAUTH.
    let server = FakeServer::start(Script::new(Ask::Md5));
    let text = format!("postgres://app:{CANARY}@127.0.0.1:{}/shop", server.port);
    let c = Config::parse_with_env(&text, &|k| (k == "PGREQUIREAUTH").then(|| "md5".to_owned())).unwrap();
    accepted(&c).await;
    assert_eq!(server.seen().password, Some(md5_of_canary()));
}

#[tokio::test]
async fn regression_verify_full_with_a_ca_the_test_made_sends_the_password() {
    let dir = support::temp_dir("verify-full");
    let ca = Ca::new("walpost test CA");
    let root = ca.write_pem(&dir, "ca.pem");
    let identity = ca.issue("db");
    for (ask, expected) in [(Ask::Cleartext, CANARY.as_bytes().to_vec()), (Ask::Md5, md5_of_canary())] {
        let server = FakeServer::start(Script::new(ask).with_tls(&identity));
        accepted(&config(server.port, &format!("&sslmode=verify-full&sslrootcert={}", root.display()))).await;
        let seen = server.seen();
        assert!(seen.tls);
        assert_eq!(seen.password, Some(expected));
    }
    // verify-ca, and require with a root file (libpq: then the same as verify-ca).
    for mode in ["verify-ca", "require", "prefer"] {
        let server = FakeServer::start(Script::new(Ask::Cleartext).with_tls(&identity));
        accepted(&config(server.port, &format!("&sslmode={mode}&sslrootcert={}", root.display()))).await;
        assert_eq!(server.seen().password.as_deref(), Some(CANARY.as_bytes()), "{mode}");
    }
}

/// `sslrootcert` alone decides trust: a certificate from another CA is refused, in
/// every mode that checks certificates (require included, as libpq does with a root file).
#[tokio::test]
async fn regression_certificate_from_a_ca_outside_sslrootcert_is_refused() {
    let dir = support::temp_dir("two-cas");
    let trusted = Ca::new("trusted CA");
    let other = Ca::new("other CA");
    let root = trusted.write_pem(&dir, "trusted.pem");
    let identity = other.issue("db");
    for mode in ["verify-full", "verify-ca", "require"] {
        let server = FakeServer::start(Script::new(Ask::Cleartext).with_tls(&identity));
        let e = connect(&config(server.port, &format!("&sslmode={mode}&sslrootcert={}", root.display())))
            .await
            .expect_err("a certificate from another CA");
        assert_no_canary(&e);
        let text = e.to_string();
        assert!(text.starts_with("TLS to PostgreSQL failed") && text.contains("certificate check"), "{mode}: {text}");
        assert_eq!(server.seen().password, None, "{mode}");
    }
}

#[tokio::test]
async fn verify_full_checks_the_host_name() {
    let dir = support::temp_dir("hostname");
    let ca = Ca::new("CA");
    let root = ca.write_pem(&dir, "ca.pem");
    let server = FakeServer::start(Script::new(Ask::Cleartext).with_tls(&ca.issue("db")));
    // The certificate names 127.0.0.1 and localhost, not 127.0.0.2 (hostaddr keeps the
    // TCP address while the name checked is the host's).
    let text = format!(
        "host=127.0.0.2 hostaddr=127.0.0.1 port={} user=app password={CANARY} sslmode=verify-full sslrootcert={}",
        server.port,
        root.display()
    );
    let e = connect(&Config::parse_with_env(&text, &|_| None).unwrap()).await.expect_err("name mismatch");
    assert!(e.to_string().contains("IP address mismatch"), "{e}");
    assert_eq!(server.seen().password, None);
    let text = text.replace("host=127.0.0.2", "host=localhost");
    accepted(&Config::parse_with_env(&text, &|_| None).unwrap()).await;
    assert_eq!(server.seen().password.as_deref(), Some(CANARY.as_bytes()));
}

#[tokio::test]
async fn scram_is_allowed_by_default_even_without_tls() {
    let server = FakeServer::start(Script::new(Ask::Scram {
        password: CANARY.into(),
        mechanisms: vec!["SCRAM-SHA-256"],
        skip_final: false,
    }));
    accepted(&config(server.port, "")).await;
    let seen = server.seen();
    assert!(!seen.tls && seen.scram_verified && seen.authenticated);
    assert_eq!(seen.sasl, Some(("SCRAM-SHA-256".into(), "n,,".into())));
    assert_eq!(seen.password, None);
}

#[tokio::test]
async fn scram_wrong_password_is_a_definite_server_error_without_the_password() {
    let server = FakeServer::start(Script::new(Ask::Scram {
        password: "the-real-one".into(),
        mechanisms: vec!["SCRAM-SHA-256"],
        skip_final: false,
    }));
    let e = connect(&config(server.port, "")).await.expect_err("wrong password");
    assert_no_canary(&e);
    assert_eq!(e.sqlstate(), Some("28P01"));
    assert!(!e.is_transient());
}

#[tokio::test]
async fn scram_ending_without_the_server_proof_is_refused() {
    let server = FakeServer::start(Script::new(Ask::Scram {
        password: CANARY.into(),
        mechanisms: vec!["SCRAM-SHA-256"],
        skip_final: true,
    }));
    let text = refused(&config(server.port, "")).await;
    assert!(text.contains("without proving it knows the password"), "{text}");
}

#[tokio::test]
async fn channel_binding_require() {
    let identity = Identity::self_signed("db");
    let scram = |mechanisms| Ask::Scram { password: CANARY.into(), mechanisms, skip_final: false };

    // Over TLS, with -PLUS offered: bound to the certificate and verified by the server.
    let server = FakeServer::start(Script::new(scram(vec!["SCRAM-SHA-256-PLUS", "SCRAM-SHA-256"])).with_tls(&identity));
    accepted(&config(server.port, "&sslmode=require&channel_binding=require")).await;
    let seen = server.seen();
    assert!(seen.scram_verified, "{seen:?}");
    assert_eq!(seen.sasl.unwrap().0, "SCRAM-SHA-256-PLUS");

    // -PLUS not offered (stripped): refused before any SCRAM message.
    let server = FakeServer::start(Script::new(scram(vec!["SCRAM-SHA-256"])).with_tls(&identity));
    let text = refused(&config(server.port, "&sslmode=require&channel_binding=require")).await;
    assert!(text.contains("SCRAM-SHA-256-PLUS"), "{text}");
    assert_eq!(server.seen().sasl, None);

    // No TLS.
    let server = FakeServer::start(Script::new(scram(vec!["SCRAM-SHA-256-PLUS", "SCRAM-SHA-256"])));
    let text = refused(&config(server.port, "&channel_binding=require")).await;
    assert!(text.contains("needs TLS"), "{text}");
    assert_eq!(server.seen().sasl, None);

    // A cleartext request, even over verified TLS, and trust.
    let dir = support::temp_dir("cb");
    let ca = Ca::new("CA");
    let root = ca.write_pem(&dir, "ca.pem");
    let verified = format!("&sslmode=verify-full&sslrootcert={}&channel_binding=require", root.display());
    let server = FakeServer::start(Script::new(Ask::Cleartext).with_tls(&ca.issue("db")));
    assert!(refused(&config(server.port, &verified)).await.contains("channel_binding=require"));
    assert_eq!(server.seen().password, None);
    let server = FakeServer::start(Script::new(Ask::Trust).with_tls(&ca.issue("db")));
    assert!(refused(&config(server.port, &verified)).await.contains("channel_binding=require"));

    // Default (prefer) over TLS uses -PLUS when offered.
    let server = FakeServer::start(Script::new(scram(vec!["SCRAM-SHA-256-PLUS", "SCRAM-SHA-256"])).with_tls(&identity));
    accepted(&config(server.port, "&sslmode=require")).await;
    assert_eq!(server.seen().sasl.unwrap().0, "SCRAM-SHA-256-PLUS");
    // disable: never -PLUS, and says it does not bind ('n').
    let server = FakeServer::start(Script::new(scram(vec!["SCRAM-SHA-256-PLUS", "SCRAM-SHA-256"])).with_tls(&identity));
    accepted(&config(server.port, "&sslmode=require&channel_binding=disable")).await;
    assert_eq!(server.seen().sasl, Some(("SCRAM-SHA-256".into(), "n,,".into())));
}

#[tokio::test]
async fn require_auth_refuses_what_it_does_not_list() {
    let server = FakeServer::start(Script::new(Ask::Trust));
    let text = refused(&config(server.port, "&require_auth=scram-sha-256")).await;
    assert!(text.contains("did not ask for any authentication"), "{text}");

    let server = FakeServer::start(Script::new(Ask::Cleartext));
    let text = refused(&config(server.port, "&require_auth=!password")).await;
    assert!(text.contains("require_auth=!password"), "{text}");
    assert_eq!(server.seen().password, None);

    let server = FakeServer::start(Script::new(Ask::Trust));
    accepted(&config(server.port, "&require_auth=none")).await;
}

/// A Unix-domain socket is local: the default policy sends a cleartext password there,
/// as libpq would.
#[tokio::test]
async fn unix_socket_counts_as_local() {
    let dir = support::temp_dir("socket");
    let server = FakeServer::start_unix(Script::new(Ask::Cleartext), &dir, 5499);
    let text = format!("host={} port=5499 user=app password={CANARY} dbname=shop sslmode=require", dir.display());
    let config = Config::parse_with_env(&text, &|_| None).unwrap();
    let client = connect(&config).await.unwrap();
    assert!(client.connected_host().is_unix_socket() && !client.is_tls());
    client.close().await;
    assert_eq!(server.seen().password.as_deref(), Some(CANARY.as_bytes()));
}

#[tokio::test]
async fn regression_startup_packet_asks_for_standard_conforming_strings() {
    for replication in [true, false] {
        let server = FakeServer::start(Script::new(Ask::Trust));
        let c = config(server.port, "");
        let client =
            if replication { ReplicationClient::connect(&c).await } else { ReplicationClient::connect_sql(&c).await }
                .unwrap();
        client.close().await;
        let startup = server.seen().startup;
        assert_eq!(startup.get("standard_conforming_strings").map(String::as_str), Some("on"));
        assert_eq!(startup.contains_key("replication"), replication);
    }
}

/// Both kinds of session carry the fixed search_path after the user's own options, so
/// no function planted in `public` is chosen by walpost's SQL.
#[tokio::test]
async fn regression_startup_packet_fixes_search_path_after_the_users_options() {
    for replication in [true, false] {
        for (params, expected) in [
            ("", "-c search_path=pg_catalog,pg_temp"),
            ("&options=-c%20statement_timeout%3D5s", "-c statement_timeout=5s -c search_path=pg_catalog,pg_temp"),
        ] {
            let server = FakeServer::start(Script::new(Ask::Trust));
            let c = config(server.port, params);
            let client = if replication {
                ReplicationClient::connect(&c).await
            } else {
                ReplicationClient::connect_sql(&c).await
            }
            .unwrap();
            client.close().await;
            let startup = server.seen().startup;
            assert_eq!(startup.get("options").map(String::as_str), Some(expected), "replication={replication}");
        }
    }
}

#[tokio::test]
async fn missing_password_error_names_the_password_file_note() {
    let dir = support::temp_dir("passfile-mode");
    let file = dir.join("pgpass");
    std::fs::write(&file, format!("*:*:*:*:{CANARY}\n")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let server = FakeServer::start(Script::new(Ask::Scram {
        password: CANARY.into(),
        mechanisms: vec!["SCRAM-SHA-256"],
        skip_final: false,
    }));
    let text = format!("host=127.0.0.1 port={} user=app dbname=shop passfile={}", server.port, file.display());
    let e = connect(&Config::parse_with_env(&text, &|_| None).unwrap()).await.expect_err("no usable password");
    assert_no_canary(&e);
    let text = e.to_string();
    assert!(
        text.contains("none was given") && text.contains("group or world access") && text.contains("chmod 0600"),
        "{text}"
    );
}
