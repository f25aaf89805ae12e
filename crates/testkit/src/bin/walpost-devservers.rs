//! Starts a throwaway PostgreSQL (wal_level=logical) and Kafka broker for the local
//! demo (scripts/demo.sh), prints how to reach them as shell assignments, and keeps
//! them running until its standard input closes or it is killed; then both stop.
//! With `--registry`, a schema registry too (Apicurio, built by
//! scripts/fetch-test-tools.sh): its Confluent API base URL is `REGISTRY_URL`. With
//! `--standby`, a streaming standby of the PostgreSQL too (hot_standby_feedback, a
//! physical slot; PostgreSQL 16+ decodes there): `STANDBY_URL`, `STANDBY_PORT`,
//! `STANDBY_SOCKET_DIR`.
//!
//! `--pg-major N` picks PostgreSQL's major version (binaries found or fetched as
//! `testkit::pg_bin_dir_for_major` does). Without it: the default server
//! (`WALPOST_PG_BINDIR`, `pg_config`, Debian's newest), except that with `--standby` a
//! default older than 16 (which cannot decode on a standby) gives way to 17.

use std::io::Read;
use std::path::PathBuf;

/// The oldest major that decodes on a standby.
const STANDBY_DECODING_SINCE: u32 = 16;
/// The major `--standby` starts when the default server is older than that.
const STANDBY_DEFAULT_MAJOR: u32 = 17;

const USAGE: &str = "the arguments it takes: --registry, --standby, --pg-major N (14 to 18)";

/// The command line.
#[derive(Debug, Default, PartialEq, Eq)]
struct Args {
    registry: bool,
    standby: bool,
    pg_major: Option<u32>,
}

fn parse(args: impl IntoIterator<Item = String>) -> Result<Args, String> {
    let mut out = Args::default();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) => (flag.to_owned(), Some(value.to_owned())),
            None => (arg.clone(), None),
        };
        match flag.as_str() {
            "--registry" if inline.is_none() => out.registry = true,
            "--standby" if inline.is_none() => out.standby = true,
            "--pg-major" => {
                let value = inline.or_else(|| args.next()).ok_or("--pg-major needs a major version, e.g. 17")?;
                let major = value
                    .parse::<u32>()
                    .ok()
                    .filter(|m| (14..=18).contains(m))
                    .ok_or_else(|| format!("--pg-major {value:?}: give a PostgreSQL major version, 14 to 18"))?;
                out.pg_major = Some(major);
            }
            _ => return Err(format!("unknown argument {arg:?} ({USAGE})")),
        }
    }
    Ok(out)
}

/// The major to start, if not the default server: `--pg-major`, else with `--standby`
/// 17 when the default server (`default_major`, if known) cannot decode on a standby.
fn major_to_start(args: &Args, default_major: Option<u32>) -> Option<u32> {
    match (args.pg_major, args.standby) {
        (Some(major), _) => Some(major),
        (None, true) if default_major.is_none_or(|m| m < STANDBY_DECODING_SINCE) => Some(STANDBY_DEFAULT_MAJOR),
        (None, _) => None,
    }
}

fn main() -> testkit::Result<()> {
    let args = match parse(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("walpost-devservers: {e}");
            std::process::exit(2);
        }
    };
    let default_major = testkit::pg_default_bin_dir().ok().and_then(|d| testkit::pg_bin_major(&d));
    let bin_dir: Option<PathBuf> = match major_to_start(&args, default_major) {
        Some(major) => Some(testkit::pg_bin_dir_for_major(major)?),
        None => None,
    };
    if args.standby && args.pg_major.is_some_and(|m| m < STANDBY_DECODING_SINCE) {
        eprintln!(
            "walpost-devservers: PostgreSQL {} cannot decode on a standby (16+ can): the standby starts, but walpost cannot read a slot there",
            args.pg_major.unwrap_or_default()
        );
    }
    let pg = testkit::Postgres::start(testkit::PgOptions { bin_dir, ..testkit::PgOptions::default() })?;
    let kafka = testkit::Kafka::start(testkit::KafkaOptions::default())?;
    let registry = if args.registry { Some(testkit::SchemaRegistry::try_start()?) } else { None };
    let standby = if args.standby {
        let opts = testkit::StandbyOptions { no_slot_sync: true, ..testkit::StandbyOptions::default() };
        Some(testkit::Postgres::start_standby(&pg, opts)?)
    } else {
        None
    };
    println!("POSTGRES_URL='{}'", pg.url());
    println!("PG_SOCKET_DIR='{}'", pg.socket_dir().display());
    println!("PG_PORT='{}'", pg.port());
    println!("PG_BINDIR='{}'", pg.bin_dir().display());
    println!("PG_MAJOR='{}'", pg.major_version());
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

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Result<Args, String> {
        parse(list.iter().map(|s| s.to_string()))
    }

    #[test]
    fn arguments_parse() {
        assert_eq!(args(&[]).unwrap(), Args::default());
        assert_eq!(
            args(&["--standby", "--pg-major", "16", "--registry"]).unwrap(),
            Args { registry: true, standby: true, pg_major: Some(16) }
        );
        assert_eq!(args(&["--pg-major=18"]).unwrap().pg_major, Some(18));
        assert!(args(&["--pg-major"]).unwrap_err().contains("needs a major version"));
        assert!(args(&["--pg-major", "9"]).unwrap_err().contains("14 to 18"));
        assert!(args(&["--pg-major", "x"]).unwrap_err().contains("14 to 18"));
        assert!(args(&["--standbyy"]).unwrap_err().contains("--pg-major N"));
        assert!(args(&["--standby=1"]).is_err());
    }

    /// Regression: `--standby` started the default server, PostgreSQL 15 here, on which
    /// standby decoding cannot run (bench/ab-drain.sh -y failed).
    #[test]
    fn regression_standby_starts_a_major_that_decodes_on_a_standby() {
        let standby = args(&["--standby"]).unwrap();
        assert_eq!(major_to_start(&standby, Some(15)), Some(17));
        assert_eq!(major_to_start(&standby, None), Some(17));
        assert_eq!(major_to_start(&standby, Some(16)), None, "a default of 16+ is kept");
        assert_eq!(major_to_start(&args(&["--standby", "--pg-major", "18"]).unwrap(), Some(15)), Some(18));
        assert_eq!(major_to_start(&args(&[]).unwrap(), Some(15)), None, "without --standby: the default");
        assert_eq!(major_to_start(&args(&["--pg-major", "14"]).unwrap(), Some(17)), Some(14));
    }
}
