//! Starts a throwaway PostgreSQL (wal_level=logical) and Kafka broker for the local
//! demo (scripts/demo.sh), prints how to reach them as shell assignments, and keeps
//! them running until its standard input closes or it is killed; then both stop.
//! With `--registry`, a schema registry too (Apicurio, built by
//! scripts/fetch-test-tools.sh): its Confluent API base URL is `REGISTRY_URL`. With
//! `--standby`, a streaming standby of the PostgreSQL too (hot_standby_feedback, a
//! physical slot; PostgreSQL 16+ decodes there): `STANDBY_URL`, `STANDBY_PORT`,
//! `STANDBY_SOCKET_DIR`.

use std::io::Read;

fn main() -> testkit::Result<()> {
    let pg = testkit::Postgres::start(testkit::PgOptions::default())?;
    let kafka = testkit::Kafka::start(testkit::KafkaOptions::default())?;
    let (mut registry, mut standby) = (None, None);
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--registry" => registry = Some(testkit::SchemaRegistry::try_start()?),
            "--standby" => {
                let opts = testkit::StandbyOptions { no_slot_sync: true, ..testkit::StandbyOptions::default() };
                standby = Some(testkit::Postgres::start_standby(&pg, opts)?);
            }
            other => {
                eprintln!("walpost-devservers: unknown argument {other:?} (the ones it takes: --registry, --standby)");
                std::process::exit(2);
            }
        }
    }
    println!("POSTGRES_URL='{}'", pg.url());
    println!("PG_SOCKET_DIR='{}'", pg.socket_dir().display());
    println!("PG_PORT='{}'", pg.port());
    println!("PG_BINDIR='{}'", pg.bin_dir().display());
    println!("KAFKA_BROKERS='{}'", kafka.bootstrap());
    println!("KAFKA_LIBS='{}'", kafka.libs_dir().display());
    if let Some(r) = &registry {
        println!("REGISTRY_URL='{}'", r.url());
    }
    if let Some(sb) = &standby {
        println!("STANDBY_URL='{}'", sb.url());
        println!("STANDBY_PORT='{}'", sb.port());
        println!("STANDBY_SOCKET_DIR='{}'", sb.socket_dir().display());
    }
    println!("READY=1");
    // Block until the parent closes our stdin (or kills us: the watchdogs clean up).
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    drop(registry);
    drop(standby);
    drop(kafka);
    drop(pg);
    Ok(())
}
