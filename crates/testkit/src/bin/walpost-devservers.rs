//! Starts a throwaway PostgreSQL (wal_level=logical) and Kafka broker for the local
//! demo (scripts/demo.sh), prints how to reach them as shell assignments, and keeps
//! them running until its standard input closes or it is killed; then both stop.

use std::io::Read;

fn main() -> testkit::Result<()> {
    let pg = testkit::Postgres::start(testkit::PgOptions::default())?;
    let kafka = testkit::Kafka::start(testkit::KafkaOptions::default())?;
    println!("POSTGRES_URL='{}'", pg.url());
    println!("PG_SOCKET_DIR='{}'", pg.socket_dir().display());
    println!("PG_PORT='{}'", pg.port());
    println!("PG_BINDIR='{}'", pg.bin_dir().display());
    println!("KAFKA_BROKERS='{}'", kafka.bootstrap());
    println!("KAFKA_LIBS='{}'", kafka.libs_dir().display());
    println!("READY=1");
    // Block until the parent closes our stdin (or kills us: the watchdogs clean up).
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    drop(kafka);
    drop(pg);
    Ok(())
}
