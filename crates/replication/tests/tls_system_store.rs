//! `sslrootcert` alone decides trust: with the system store trusting one CA
//! (OpenSSL's `SSL_CERT_FILE`), a certificate from that CA is still refused when
//! `sslrootcert` names another CA's file; `sslrootcert=system` uses the system store.
//!
//! One test in its own binary: it sets `SSL_CERT_FILE`/`SSL_CERT_DIR` for the whole
//! process before anything loads OpenSSL's default paths, with no other test to race.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)] // tests fail loudly

mod support;

use replication::{Config, ReplicationClient};
use support::{Ask, Ca, FakeServer, Script};

#[tokio::test]
async fn regression_sslrootcert_replaces_the_system_store() {
    let dir = support::temp_dir("system-store");
    let system_ca = Ca::new("CA the system trusts");
    let file_ca = Ca::new("CA in sslrootcert");
    let system_pem = system_ca.write_pem(&dir, "system.pem");
    let file_pem = file_ca.write_pem(&dir, "file.pem");
    let empty_dir = dir.join("certs");
    std::fs::create_dir_all(&empty_dir).unwrap();
    std::env::set_var("SSL_CERT_FILE", &system_pem);
    std::env::set_var("SSL_CERT_DIR", &empty_dir);

    let server = FakeServer::start(Script::new(Ask::Cleartext).with_tls(&system_ca.issue("db")));
    let config = |root: &str| {
        let text =
            format!("host=127.0.0.1 port={} user=app password=pw sslmode=verify-full sslrootcert={root}", server.port);
        Config::parse_with_env(&text, &|_| None).unwrap()
    };

    // The system store trusts the server's CA, but sslrootcert names another one.
    let e = ReplicationClient::connect(&config(&file_pem.display().to_string()))
        .await
        .expect_err("a CA outside sslrootcert must not be trusted, whatever the system store holds");
    assert!(e.to_string().contains("certificate check"), "{e}");
    assert_eq!(server.seen().password, None);

    // sslrootcert=system: the system store (here SSL_CERT_FILE) decides.
    let client = ReplicationClient::connect(&config("system")).await.unwrap_or_else(|e| panic!("{e}"));
    client.close().await;
    assert_eq!(server.seen().password.as_deref(), Some(&b"pw"[..]));

    // The server's own CA as sslrootcert.
    let client = ReplicationClient::connect(&config(&system_pem.display().to_string())).await.unwrap();
    client.close().await;
    assert_eq!(server.seen().password.as_deref(), Some(&b"pw"[..]));
}
