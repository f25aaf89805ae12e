//! docs/configuration.md against the code (`on_permanent_error` and
//! `dead_letter_topic` were missing from the README's table). Every key the file takes
//! (read off the file's types by `settings::keys`) is on the page; every key the page's
//! tables name is one the file takes; every flag and variable of `walpost run` is there.
// Test crates: helpers outside #[test] functions may fail loudly too.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::PathBuf;

use clap::CommandFactory;

fn page() -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/configuration.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The keys in the first column of the page's tables.
fn keys_on_the_page(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|rest| rest.split('`').next())
        .map(str::to_owned)
        .collect()
}

/// Keys of `[[outbox]]`'s router and `[messages.router]`: the page documents them once,
/// as `<section>.router.*` over `[router]`'s table.
fn covered_by_router(key: &str) -> Option<&str> {
    ["outbox.router.", "messages.router."].into_iter().find_map(|p| key.strip_prefix(p))
}

#[test]
fn every_key_of_the_file_is_on_the_page_and_nothing_else() {
    let text = page();
    let on_page = keys_on_the_page(&text);
    let in_code: BTreeSet<String> = walpost::settings::keys::file_keys().into_iter().collect();
    let missing: Vec<&String> = in_code
        .iter()
        .filter(|k| match covered_by_router(k) {
            Some(router_key) => !on_page.contains(&format!("router.{router_key}")),
            None => !on_page.contains(*k),
        })
        .collect();
    assert!(missing.is_empty(), "keys the code reads that docs/configuration.md does not list: {missing:?}");
    let unknown: Vec<&String> = on_page
        .iter()
        .filter(|k| !in_code.contains(*k) && !["outbox.router.*", "messages.router.*"].contains(&k.as_str()))
        .collect();
    assert!(unknown.is_empty(), "keys docs/configuration.md lists that the code does not read: {unknown:?}");
    assert!(in_code.len() > 60, "the walker found too few keys: {in_code:?}");
}

#[test]
fn every_flag_and_variable_of_run_is_on_the_page() {
    let text = page();
    let cli = walpost::cli::Cli::command();
    let run = cli.find_subcommand("run").expect("walpost run");
    let mut missing = Vec::new();
    for arg in run.get_arguments().chain(cli.get_arguments()) {
        if let Some(long) = arg.get_long() {
            if !["help", "version"].contains(&long) && !text.contains(&format!("`--{long}")) {
                missing.push(format!("--{long}"));
            }
        }
        if let Some(env) = arg.get_env() {
            let env = env.to_string_lossy();
            if !text.contains(&format!("`{env}`")) {
                missing.push(env.into_owned());
            }
        }
    }
    assert!(missing.is_empty(), "flags or variables of walpost run missing from docs/configuration.md: {missing:?}");
}

/// Where a value came from is clap's `value_source`: a value of `WALPOST_POSTGRES` is not
/// "on the command line" (no warning about a password in argv, and a backfill's
/// `WALPOST_METRICS_ADDR` is the service's), a flag is, and a flag wins over its variable.
/// One test sets the variables, so no other test of this file sees them.
#[test]
fn a_values_origin_is_claps_value_source_and_a_flag_beats_its_variable() {
    use clap::Parser;
    use walpost::cli::{Cli, Command};
    use walpost::settings::{DeliveryMode, OnPermanentError};

    let run = |argv: &[&str]| {
        let cli = Cli::try_parse_from(["walpost", "run"].iter().chain(argv)).unwrap();
        let Command::Run(args) = cli.command else { panic!("not run") };
        args.overrides()
    };
    std::env::set_var("WALPOST_POSTGRES", "postgres://env@h/d");
    std::env::set_var("WALPOST_METRICS_ADDR", "127.0.0.1:1");
    std::env::set_var("WALPOST_DELIVERY", "exactly-once");
    std::env::set_var("WALPOST_ON_PERMANENT_ERROR", "dead_letter");
    let from_env = run(&[]);
    let from_flags = run(&[
        "--postgres",
        "postgres://flag@h/d",
        "--metrics-addr=127.0.0.1:2",
        "--delivery",
        "at-least-once",
        "--postgres-primary=postgres://p@h/d",
        "--contracts-unknown",
        "refuse",
    ]);
    std::env::set_var("WALPOST_DELIVERY", "twice");
    let bad_env = Cli::try_parse_from(["walpost", "run"]).map(|_| ());
    for k in ["WALPOST_POSTGRES", "WALPOST_METRICS_ADDR", "WALPOST_DELIVERY", "WALPOST_ON_PERMANENT_ERROR"] {
        std::env::remove_var(k);
    }

    assert_eq!(from_env.postgres.as_deref(), Some("postgres://env@h/d"));
    assert!(!from_env.postgres_on_argv && !from_env.metrics_addr_on_argv && !from_env.postgres_primary_on_argv);
    assert_eq!(from_env.delivery, Some(DeliveryMode::ExactlyOnce));
    assert_eq!(from_env.on_permanent_error, Some(OnPermanentError::DeadLetter));

    assert_eq!(from_flags.postgres.as_deref(), Some("postgres://flag@h/d"), "the flag wins");
    assert_eq!(from_flags.metrics_addr.as_deref(), Some("127.0.0.1:2"));
    assert!(from_flags.postgres_on_argv && from_flags.metrics_addr_on_argv && from_flags.postgres_primary_on_argv);
    assert_eq!(from_flags.delivery, Some(DeliveryMode::AtLeastOnce), "the flag wins");
    assert_eq!(from_flags.on_permanent_error, Some(OnPermanentError::DeadLetter), "the variable, no flag");
    assert_eq!(from_flags.contracts_unknown, Some(walpost::settings::UnknownEventType::Refuse));

    let e = bad_env.unwrap_err().to_string();
    assert!(e.contains("twice") && e.contains("at-least-once") && e.contains("exactly-once"), "{e}");
    // Parsed once the variables are gone (the file's other tests parse no `run`).
    let e = Cli::try_parse_from(["walpost", "run", "--contracts-unknown", "deny"]).unwrap_err();
    assert_eq!(e.exit_code(), 2, "a usage error");
    assert!(e.to_string().contains("allow") && e.to_string().contains("refuse"), "{e}");
}

/// A value the file spells wrong is refused naming its key and every allowed value.
#[test]
fn a_wrong_enumeration_in_the_file_names_the_key_and_the_allowed_values() {
    use walpost::settings::FileConfig;
    for (text, key, allowed) in [
        ("delivery = \"twice\"", "(delivery)", &["at-least-once", "exactly-once"][..]),
        ("envelope = \"xml\"", "(envelope)", &["none", "cloudevents"]),
        ("on_permanent_error = \"skip\"", "(on_permanent_error)", &["halt", "dead_letter"]),
        ("snapshot = \"always\"", "(snapshot)", &["never", "initial", "initial_only", "when_needed"]),
        ("[contracts]\nvalue_format = \"protobuf\"", "(value_format)", &["json", "json-schema", "avro"]),
        ("[contracts]\nkey_format = \"int\"", "(key_format)", &["string", "json-schema", "avro"]),
        ("[contracts]\nunknown = \"deny\"", "(unknown)", &["allow", "refuse"]),
        ("[inbox]\non_invalid = \"skip\"", "(on_invalid)", &["halt", "reject"]),
        ("[inbox]\ndedup = \"id\"", "(dedup)", &["topic", "global"]),
        ("[inbox]\nstart_from = \"now\"", "(start_from)", &["earliest", "latest"]),
    ] {
        let e = FileConfig::parse(text).unwrap_err();
        assert!(e.contains(key) && allowed.iter().all(|a| e.contains(a)), "{text}: {e}");
    }
}

/// The commands that never talk to Kafka (`slot`, `retention`) resolve without brokers and
/// get no Kafka settings at all (not an empty brokers string); the ones that do require them.
#[test]
fn kafka_settings_are_absent_for_commands_without_kafka() {
    use walpost::settings::{FileConfig, Overrides, Settings};
    let o = Overrides { postgres: Some("postgres://u@h/d".into()), ..Overrides::default() };
    let s = Settings::resolve_without_kafka(&o, FileConfig::default()).unwrap();
    assert!(s.kafka.is_none());
    let e = s.kafka().unwrap_err().to_string();
    assert!(e.contains("kafka.brokers is required") && e.contains("--kafka-brokers"), "{e}");
    let e = Settings::resolve(&o, FileConfig::default()).unwrap_err().to_string();
    assert!(e.contains("kafka.brokers is required") && e.contains("WALPOST_KAFKA_BROKERS"), "{e}");
    let with = Overrides { kafka_brokers: Some("k:9092".into()), ..o };
    assert_eq!(Settings::resolve(&with, FileConfig::default()).unwrap().kafka().unwrap().brokers, "k:9092");
    assert!(Settings::resolve_without_kafka(&with, FileConfig::default()).unwrap().kafka.is_none());
}

/// The inbox's enumerations on a flag or variable: the same spellings as the file's, and a
/// wrong one is clap's usage error listing the possible values (`--contracts-unknown`: in
/// the test above, which owns the variables `run` reads).
#[test]
fn inbox_and_contracts_flags_take_the_files_spellings() {
    use clap::Parser;
    use walpost::cli::{Cli, Command};
    use walpost::settings::{InboxDedup, InboxOnInvalid};

    let parse = |argv: &[&str]| Cli::try_parse_from(["walpost"].iter().chain(argv));
    let Command::Inbox(args) = parse(&["inbox", "--on-invalid", "reject", "--dedup", "global"]).unwrap().command else {
        panic!("not inbox")
    };
    let o = args.overrides();
    assert_eq!((o.inbox_on_invalid, o.inbox_dedup), (Some(InboxOnInvalid::Reject), Some(InboxDedup::Global)));
    for (argv, allowed) in [
        (&["inbox", "--on-invalid", "skip"][..], &["halt", "reject"][..]),
        (&["inbox", "--dedup", "id"], &["topic", "global"]),
    ] {
        let e = parse(argv).unwrap_err();
        assert_eq!(e.exit_code(), 2, "a usage error");
        let e = e.to_string();
        assert!(allowed.iter().all(|a| e.contains(a)), "{argv:?}: {e}");
    }
}

/// Every section resolves on its own: the connections in `postgres`, the metrics address in
/// `telemetry`, and a check across sections (a signal table with exactly-once) holds for the
/// commands without Kafka too.
#[test]
fn postgres_and_telemetry_are_sections_and_cross_checks_hold_without_kafka() {
    use walpost::settings::{FileConfig, Overrides, Settings};
    let o = Overrides {
        postgres: Some("postgres://u@h/d?target_session_attrs=standby".into()),
        metrics_addr: Some("127.0.0.1:9187".into()),
        ..Overrides::default()
    };
    let s = Settings::resolve_without_kafka(&o, FileConfig::default()).unwrap();
    assert!(s.postgres.standby_decoding());
    assert_eq!(s.postgres.writer().dbname, "d");
    assert_eq!(s.telemetry.metrics_addr, Some("127.0.0.1:9187".parse().unwrap()));
    assert_eq!(s.source.table().to_string(), "events.outbox");
    let file = FileConfig::parse("signal_table = \"events.signals\"\ndelivery = \"exactly-once\"\n").unwrap();
    let e = Settings::resolve_without_kafka(&o, file).unwrap_err().to_string();
    assert!(e.contains("signal_table") && e.contains("exactly-once"), "{e}");
}
