use std::time::Duration;

use super::*;
use crate::settings::{RetentionFile, RetentionSettings, TableName};

fn file(text: &str) -> FileConfig {
    FileConfig::parse(text).unwrap()
}

fn base() -> Overrides {
    Overrides { postgres: Some("postgres://u@h/d".into()), kafka_brokers: Some("k:1".into()), ..Overrides::default() }
}

#[test]
fn flag_beats_file_beats_default() {
    let f = file(
        r#"
        postgres = "postgres://u:p@h/db"
        slot = "from_file"
        [kafka]
        brokers = "k:9092"
        [kafka.properties]
        "compression.type" = "zstd"
        [router]
        "route.by.field" = "kind"
        "#,
    );
    let o = Overrides {
        slot: Some("from_flag".into()),
        kafka_properties: vec!["linger.ms=20".into()],
        ..Overrides::default()
    };
    let s = Settings::resolve(&o, f).unwrap();
    assert_eq!(s.source.slot, "from_flag");
    let kafka = s.kafka.as_ref().unwrap();
    assert_eq!(kafka.brokers, "k:9092");
    assert_eq!(s.source.router().route_by_field, "kind");
    assert_eq!(s.source.router().key_field, "aggregate_id");
    assert_eq!(*s.source.table(), TableName { schema: "events".into(), name: "outbox".into() });
    assert_eq!(s.source.publication, "walpost_outbox");
    assert_eq!(kafka.properties["compression.type"], "zstd");
    assert_eq!(kafka.properties["linger.ms"], "20");
}

/// The produce window's defaults: 8 MiB of payloads (librdkafka keeps a copy of each
/// unacknowledged one, so this is most of a drain's memory; 16 MiB peaked at 57-62 MB
/// RSS, 8 MiB at 41.5 MB: bench/results/analysis.md) and 50,000 records.
#[test]
fn the_produce_window_defaults_to_8_mib_and_50000_records() {
    let s = Settings::resolve(&base(), FileConfig::default()).unwrap();
    assert_eq!(s.stream.max_in_flight_bytes, 8 * 1024 * 1024);
    assert_eq!(s.stream.max_in_flight_records, 50_000);
}

#[test]
fn walpost_connects_to_a_primary_whatever_the_host_order() {
    use replication::TargetSessionAttrs as T;
    let with = |url: &str| Overrides { postgres: Some(url.into()), ..base() };
    let s = Settings::resolve(&with("postgres://u@a:5432,b:5433/d"), FileConfig::default()).unwrap();
    assert_eq!(s.postgres.server.target_session_attrs, T::Primary, "no target_session_attrs: primary");
    assert_eq!(s.postgres.server.hosts.len(), 2);
    for (given, expected) in [("read-write", T::ReadWrite), ("primary", T::Primary)] {
        let url = format!("postgres://u@a,b/d?target_session_attrs={given}");
        assert_eq!(
            Settings::resolve(&with(&url), FileConfig::default()).unwrap().postgres.server.target_session_attrs,
            expected
        );
    }
    assert!(
        s.postgres.primary.is_none() && !s.postgres.standby_decoding(),
        "on a primary walpost writes where it reads"
    );
    assert_eq!(s.postgres.writer(), &s.postgres.server);
    for refused in ["any", "read-only"] {
        let url = format!("host=a,b dbname=d user=u target_session_attrs={refused}");
        let err = Settings::resolve(&with(&url), FileConfig::default()).unwrap_err().to_string();
        assert!(err.contains(refused) && err.contains("decode on a standby, PostgreSQL 16+"), "{err}");
    }
}

/// `standby` and `prefer-standby` decode on a standby and write on the primary:
/// `postgres_primary` when given (always `read-write`), else the same hosts `read-write`.
#[test]
fn a_standby_target_decodes_there_and_writes_on_the_primary() {
    use replication::TargetSessionAttrs as T;
    for attrs in ["standby", "prefer-standby"] {
        let url = format!("postgres://u@a:5432,b:5433/d?target_session_attrs={attrs}");
        let s = Settings::resolve(&Overrides { postgres: Some(url), ..base() }, FileConfig::default()).unwrap();
        assert!(s.postgres.standby_decoding());
        assert_eq!(s.postgres.server.target_session_attrs.as_str(), attrs);
        let primary = s.postgres.primary.as_ref().unwrap();
        assert_eq!(primary.target_session_attrs, T::ReadWrite);
        assert_eq!(primary.hosts, s.postgres.server.hosts, "the same hosts, read-write");
        assert_eq!(s.postgres.writer(), primary);
    }
    let o = Overrides {
        postgres: Some("postgres://u@standby/d?target_session_attrs=standby".into()),
        postgres_primary: Some("postgres://u@primary:6543/d".into()),
        ..base()
    };
    let s = Settings::resolve(&o, FileConfig::default()).unwrap();
    let primary = s.postgres.primary.unwrap();
    assert_eq!(primary.hosts.len(), 1);
    assert_eq!(primary.hosts[0].label(), "primary:6543");
    assert_eq!(primary.target_session_attrs, T::ReadWrite);

    let on_primary = Overrides { postgres_primary: Some("postgres://u@p/d".into()), ..base() };
    let err = Settings::resolve(&on_primary, FileConfig::default()).unwrap_err().to_string();
    assert!(err.contains("postgres_primary") && err.contains("unless postgres settles on a standby"), "{err}");
    let failover = Overrides {
        postgres: Some("postgres://u@s/d?target_session_attrs=standby".into()),
        slot_failover: true,
        ..base()
    };
    let err = Settings::resolve(&failover, FileConfig::default()).unwrap_err().to_string();
    assert!(err.contains("failover slots on a primary only"), "{err}");
}

#[test]
fn unknown_keys_are_errors_naming_them() {
    let err = FileConfig::parse("postgress = 'x'").unwrap_err();
    assert!(err.contains("postgress"), "{err}");
    let err = FileConfig::parse("[router]\n\"route.by.feild\" = 'x'").unwrap_err();
    assert!(err.contains("route.by.feild"), "{err}");
}

#[test]
fn missing_required_settings_say_how_to_set_them() {
    let err = Settings::resolve(&Overrides::default(), FileConfig::default()).unwrap_err().to_string();
    assert!(err.contains("--postgres") && err.contains("WALPOST_POSTGRES"), "{err}");
    let o = Overrides { postgres: Some("postgres://u@h/d".into()), ..Overrides::default() };
    let err = Settings::resolve(&o, FileConfig::default()).unwrap_err().to_string();
    assert!(err.contains("--kafka-brokers"), "{err}");
}

#[test]
fn invalid_values_are_named() {
    let with = |f: fn(&mut Overrides)| {
        let mut o = base();
        f(&mut o);
        Settings::resolve(&o, FileConfig::default()).unwrap_err().to_string()
    };
    assert!(with(|o| o.slot = Some("Bad-Slot".into())).contains("slot"));
    assert!(with(|o| o.table = Some("a.b.c".into())).contains("table"));
    assert!(with(|o| o.metrics_addr = Some("localhost".into())).contains("metrics_addr"));
    assert!(with(|o| o.kafka_properties = vec!["novalue".into()]).contains("KEY=VALUE"));
}

/// Regression: a publication or table name with a quote or backslash reached SQL
/// through quote-doubling alone, which `standard_conforming_strings = off` breaks.
#[test]
fn regression_names_that_need_escaping_are_refused() {
    for bad in ["pub'; DROP TABLE x; --", "a\\b", "x\"y", "1abc", ""] {
        let mut o = base();
        o.publication = Some(bad.into());
        let err = Settings::resolve(&o, FileConfig::default()).unwrap_err().to_string();
        assert!(err.contains("publication"), "{bad}: {err}");
        let mut o = base();
        o.table = Some(format!("events.{bad}"));
        assert!(Settings::resolve(&o, FileConfig::default()).is_err(), "{bad}");
    }
    for good in ["walpost_outbox", "Pub$1", "_x"] {
        assert_eq!(validate_identifier(good), Ok(()), "{good}");
    }
}

#[test]
fn empty_event_type_field_disables_the_header() {
    let mut o = base();
    o.event_type_field = Some(String::new());
    let s = Settings::resolve(&o, FileConfig::default()).unwrap();
    assert_eq!(s.source.router().event_type_header_field, None);
    // The deprecated Debezium spelling still works.
    let f = file("[router]\n\"table.field.event.type\" = \"kind\"");
    let s = Settings::resolve(&base(), f).unwrap();
    assert_eq!(s.source.router().event_type_header_field.as_deref(), Some("kind"));
}

/// Every Debezium option walpost does not implement is refused by name, with why.
#[test]
fn unimplemented_debezium_options_are_refused_by_name() {
    for (key, _) in router::DEBEZIUM_OPTIONS_NOT_IMPLEMENTED {
        for section in ["[router]", "[[outbox]]\ntable = \"a.b\"\n[outbox.router]", "[messages.router]"] {
            let err = FileConfig::parse(&format!("{section}\n\"{key}\" = \"x\"\n")).unwrap_err();
            assert!(err.contains(key) && err.contains("does not implement"), "{section} {key}: {err}");
        }
    }
}

/// A TOML parse error names the position, never the line's text (a secret may be on it).
#[test]
fn parse_errors_do_not_echo_the_file() {
    let dir = std::env::temp_dir().join(testkit_free_name());
    std::fs::write(&dir, "[kafka.properties]\n\"sasl.password\" = \"hunter2-canary\" junk\n").unwrap();
    let err = FileConfig::load(&dir).unwrap_err().to_string();
    let _ = std::fs::remove_file(&dir);
    assert!(!err.contains("hunter2-canary"), "{err}");
    assert!(err.contains("not valid"), "{err}");
}

fn testkit_free_name() -> String {
    format!("walpost-parse-{}-{:?}.toml", std::process::id(), std::thread::current().id()).replace(['(', ')'], "")
}

#[test]
fn retention_defaults_and_validation() {
    let c = resolve_retention(&RetentionFile::default()).unwrap();
    assert_eq!(c, RetentionSettings::default());
    assert_eq!((c.keep_days, c.days_ahead, c.interval.as_secs(), c.enabled), (7, 3, 3600, None));
    let f: RetentionFile = toml::from_str("enabled = true\nkeep_days = 30\ndays_ahead = 5").unwrap();
    let c = resolve_retention(&f).unwrap();
    assert_eq!((c.enabled, c.keep_days, c.days_ahead), (Some(true), 30, 5));
    // --keep-days over the file's keep_days, through the one merge.
    let o = Overrides { retention_keep_days: Some(2), ..base() };
    let s = Settings::resolve(&o, file("[retention]\nenabled = true\nkeep_days = 30\ndays_ahead = 5")).unwrap();
    assert_eq!((s.retention.keep_days, s.retention.days_ahead), (2, 5));
    let bad: RetentionFile = toml::from_str("days_ahead = 0").unwrap();
    assert!(resolve_retention(&bad).unwrap_err().to_string().contains("retention.days_ahead"));
    let err = toml::from_str::<RetentionFile>("keep_dayz = 3").unwrap_err().to_string();
    assert!(err.contains("keep_dayz"), "{err}");
}

#[test]
fn cloudevents_envelope_resolves_per_table() {
    assert!(Settings::resolve(&base(), FileConfig::default()).unwrap().source.router().cloudevents.is_none());
    let f = file(
        "envelope = \"cloudevents\"\n[[outbox]]\ntable = \"billing.outbox\"\n[messages]\n\"prefix.include\" = [\"outbox\"]",
    );
    let s = Settings::resolve(&base(), f).unwrap();
    let ce = |i: usize| s.source.outboxes[i].router.cloudevents.clone().unwrap();
    assert_eq!(ce(0).mode, router::CloudEventsMode::Binary);
    assert_eq!(ce(0).source, "/walpost/d/events.outbox", "database d of postgres://u@h/d");
    assert_eq!(ce(1).source, "/walpost/d/billing.outbox");
    assert_eq!(s.source.messages.as_ref().unwrap().router.cloudevents.as_ref().unwrap().source, "/walpost/d/messages");
    let f = file("envelope = \"cloudevents\"\n[cloudevents]\nmode = \"structured\"\nsource = \"urn:shop\"");
    let o = Overrides { envelope: Some(Envelope::Plain), ..base() };
    let err = Settings::resolve(&o, f).unwrap_err().to_string();
    assert!(err.contains("cloudevents"), "the flag turned the envelope off while [cloudevents] is set: {err}");
    let f = file("envelope = \"cloudevents\"\n[cloudevents]\nmode = \"structured\"\nsource = \"urn:shop\"");
    let ce = Settings::resolve(&base(), f).unwrap().source.router().cloudevents.clone().unwrap();
    assert_eq!((ce.mode, ce.source.as_str()), (router::CloudEventsMode::Structured, "urn:shop"));
    let o = Overrides { envelope: Some(Envelope::CloudEvents), ..base() };
    assert!(Settings::resolve(&o, FileConfig::default()).unwrap().source.router().cloudevents.is_some(), "--envelope");
    let e = FileConfig::parse("envelope = \"xml\"").unwrap_err();
    assert!(e.contains("(envelope)") && e.contains("`none` or `cloudevents`"), "{e}");
    for (text, key) in [
        ("envelope = \"cloudevents\"\n[cloudevents]\nmode = \"batch\"", "cloudevents.mode"),
        ("envelope = \"cloudevents\"\n[cloudevents]\nsource = \"\"", "cloudevents.source"),
        (
            "envelope = \"cloudevents\"\n[router]\n\"table.fields.additional.placement\" = \"event_type:header:ce_type\"",
            "collide",
        ),
        ("envelope = \"cloudevents\"\n[router]\n\"table.field.event.type.header\" = \"\"", "event type column"),
    ] {
        let err = Settings::resolve(&base(), file(text)).unwrap_err().to_string();
        assert!(err.contains(key), "{text}: {err}");
    }
    assert!(FileConfig::parse("[cloudevents]\nmodes = \"binary\"").unwrap_err().contains("modes"));
}

#[test]
fn debeziums_tracing_option_names_the_trace_column() {
    for key in ["tracing.span.context.field", "table.field.event.tracing"] {
        let s = Settings::resolve(&base(), file(&format!("[router]\n\"{key}\" = \"trace\""))).unwrap();
        assert_eq!(s.source.router().tracing_field.as_deref(), Some("trace"), "{key}");
    }
}

#[test]
fn readiness_drops_before_the_producer_restarts() {
    let s = Settings::resolve(&base(), FileConfig::default()).unwrap();
    assert_eq!(s.stream.unready_after, Duration::from_secs(30));
    assert!(s.stream.unready_after < s.stream.delivery_timeout);
    let f = file("[pipeline]\ndelivery_timeout_secs = 10");
    let s = Settings::resolve(&base(), f).unwrap();
    assert_eq!(s.stream.unready_after, Duration::from_secs(5));
}

/// Every duration key takes a string with a unit beside its old number.
#[test]
fn a_backlog_transaction_longer_than_a_quarter_of_the_timeout_is_refused() {
    let text =
        "delivery = \"exactly-once\"\n[exactly_once]\nbacklog_transaction_ms = 20000\ntransaction_timeout_ms = 60000";
    let err = Settings::resolve(&base(), file(text)).unwrap_err().to_string();
    assert!(err.contains("exactly_once.backlog_transaction_ms") && err.contains("a quarter"), "{err}");
}

#[test]
fn durations_take_units_and_keep_their_old_numbers() {
    let text = "heartbeat_interval_secs = \"1min\"\ndelivery = \"exactly-once\"\n\
                [pipeline]\nstatus_interval_secs = \"500ms\"\nhalt_linger_secs = 5\n\
                [monitor]\nwarning_lag_secs = \"90s\"\ncritical_lag_secs = 600.5\n\
                [exactly_once]\nmax_transaction_ms = \"2s\"\nbacklog_transaction_ms = \"5s\"\ntransaction_timeout_ms = 60000\n\
                [retention]\ninterval_secs = \"2h\"\nlock_timeout_ms = \"1500ms\"";
    let s = Settings::resolve(&base(), file(text)).unwrap();
    assert_eq!(s.source.heartbeat_interval, Some(Duration::from_secs(60)));
    assert_eq!(s.stream.status_interval, Duration::from_millis(500));
    assert_eq!(s.stream.halt_linger, Duration::from_secs(5));
    assert_eq!((s.monitor.thresholds.warning_lag_secs, s.monitor.thresholds.critical_lag_secs), (90.0, 600.5));
    match &s.kafka().unwrap().delivery {
        Delivery::ExactlyOnce(e) => {
            assert_eq!(e.max_transaction_interval, Duration::from_secs(2));
            assert_eq!(e.backlog_transaction_interval, Duration::from_secs(5));
            assert_eq!(e.transaction_timeout, Duration::from_secs(60));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        (s.retention.interval, s.retention.lock_timeout),
        (Duration::from_secs(7200), Duration::from_millis(1500))
    );
    for zero in [
        "[pipeline]\nmax_backoff_secs = \"0s\"",
        "[retention]\nlock_timeout_ms = 0",
        "heartbeat_interval_secs = \"0ms\"",
    ] {
        let err = Settings::resolve(&base(), file(zero)).unwrap_err().to_string();
        assert!(err.contains("a positive duration"), "{zero}: {err}");
    }
    let err = FileConfig::parse("[pipeline]\nstatus_interval_secs = \"ten seconds\"").unwrap_err();
    assert!(err.contains("(status_interval_secs)") && err.contains("not a duration"), "{err}");
    assert!(!err.contains("ten seconds"), "a file's error shows no value: {err}");
}

/// The command line is layered onto the file once; every flag-backed key then
/// comes from that one layer (flag over file over default).
#[test]
fn the_command_line_is_layered_onto_the_file_once() {
    let text = "slot = \"from_file\"\nmetrics_addr = \"127.0.0.1:9000\"\ndelivery = \"exactly-once\"\n\
                heartbeat_interval_secs = 30\n[router]\n\"route.by.field\" = \"file_col\"\n\
                \"route.topic.replacement\" = \"file.${routedByValue}\"\n\
                [[outbox]]\ntable = \"events.other\"";
    let o = Overrides {
        slot: Some("from_flag".into()),
        topic: Some("flag.${routedByValue}".into()),
        heartbeat_interval: Some(Duration::from_secs(5)),
        ..base()
    };
    let s = Settings::resolve(&o, file(text)).unwrap();
    assert_eq!(s.source.slot, "from_flag", "flag over file");
    assert_eq!(
        s.telemetry.metrics_addr.map(|a| a.to_string()).as_deref(),
        Some("127.0.0.1:9000"),
        "file where no flag"
    );
    assert_eq!(s.source.heartbeat_interval, Some(Duration::from_secs(5)));
    assert!(matches!(s.kafka().unwrap().delivery, Delivery::ExactlyOnce(_)));
    for outbox in &s.source.outboxes {
        assert_eq!(outbox.router.route_by_field, "file_col", "{}: the file's router key", outbox.table);
        assert!(outbox.router.topic_pattern.starts_with("flag."), "{}: the flag, inherited", outbox.table);
    }
    let s = Settings::resolve(&base(), file(text)).unwrap();
    assert_eq!((s.source.slot.as_str(), s.source.heartbeat_interval), ("from_file", Some(Duration::from_secs(30))));
}

/// What `f` logs at WARN and above, as text.
fn warnings_of(f: impl FnOnce()) -> String {
    let buf = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
    let sink = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || Capture(sink.clone()))
        .finish();
    tracing::subscriber::with_default(subscriber, f);
    let text = buf.lock().unwrap().clone();
    String::from_utf8_lossy(&text).into_owned()
}

struct Capture(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Regression: a password in `--postgres-primary` drew the warning for `--postgres`,
/// sending the operator to the wrong flag. The warning names the flag holding it.
#[test]
fn regression_a_password_on_the_command_line_is_warned_about_under_its_own_flag() {
    let standby = "postgres://u@standby/d?target_session_attrs=standby";
    let with_password = "postgres://u:CANARY-pw@primary/d";
    let logs = warnings_of(|| {
        let o = Overrides {
            postgres: Some(standby.into()),
            postgres_primary: Some(with_password.into()),
            postgres_primary_on_argv: true,
            ..base()
        };
        Settings::resolve(&o, FileConfig::default()).unwrap();
    });
    assert!(logs.contains(secrets::POSTGRES_PRIMARY_PASSWORD_ON_ARGV), "{logs}");
    assert!(!logs.contains("given in --postgres,") && !logs.contains("CANARY"), "{logs}");
    // In --postgres: that flag's warning, and only it.
    let logs = warnings_of(|| {
        let o = Overrides {
            postgres: Some(format!("{with_password}?target_session_attrs=standby")),
            postgres_on_argv: true,
            postgres_primary: Some("postgres://u@primary/d".into()),
            postgres_primary_on_argv: true,
            ..base()
        };
        Settings::resolve(&o, FileConfig::default()).unwrap();
    });
    assert!(logs.contains(secrets::POSTGRES_PASSWORD_ON_ARGV), "{logs}");
    assert!(!logs.contains("--postgres-primary,") && !logs.contains("CANARY"), "{logs}");
}
