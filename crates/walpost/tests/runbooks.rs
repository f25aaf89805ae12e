//! Every operator-facing fatal error names a runbook that exists and quotes the error
//! verbatim; every metric is documented in docs/metrics.md and nothing undocumented is there.
// Test crates: helpers outside #[test] functions may fail loudly too.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}

#[test]
fn every_runbook_named_in_the_code_exists() {
    let mut named = Vec::new();
    let files = [rust_files(&repo().join("crates/walpost/src")), rust_files(&repo().join("crates/texts/src"))];
    for path in files.into_iter().flatten() {
        let text = std::fs::read_to_string(path).unwrap();
        for (i, _) in text.match_indices("runbooks/") {
            let name: String =
                text[i..].chars().take_while(|c| c.is_ascii_alphanumeric() || "/-_.".contains(*c)).collect();
            named.push(name.trim_end_matches('.').to_owned());
        }
    }
    assert!(named.len() >= 3, "{named:?}");
    for n in named {
        assert!(repo().join(&n).is_file(), "{n} is named in the code but does not exist");
    }
}

/// `walpost inbox`'s fatal errors, with placeholders for what differs.
#[test]
fn inbox_errors_are_quoted_verbatim_in_the_inbox_backlog_runbook() {
    let runbook = read("runbooks/inbox-backlog.md");
    let refused =
        inbox::messages::inbox_record_refused("<topic>", 7, 9, "<reason>").replace("/7@9", "/<partition>@<offset>");
    let schema = inbox::messages::inbox_schema_incomplete("<schema>", "<what>");
    let migration = inbox::messages::inbox_migration_failed("<schema>");
    let partition = inbox::messages::inbox_partition_missing("<schema>");
    let lock = inbox::messages::inbox_write_lock_waited("<schema>", 10_000);
    for message in [refused, schema, migration, partition, lock] {
        assert!(message.contains("runbooks/inbox-backlog.md"), "{message}");
        assert!(runbook.contains(&message), "runbooks/inbox-backlog.md must quote:\n{message}");
    }
}

#[test]
fn slot_lost_error_is_quoted_verbatim_in_its_runbook() {
    let message = texts::slot::lost("walpost");
    assert!(message.contains("runbooks/slot-lost.md"));
    assert!(read("runbooks/slot-lost.md").contains(&message), "runbooks/slot-lost.md must quote:\n{message}");
}

#[test]
fn outbox_changed_errors_are_quoted_verbatim_in_their_runbook() {
    let table = walpost::settings::TableName { schema: "events".into(), name: "outbox".into() };
    let runbook = read("runbooks/outbox-recreated.md");
    let publication = replication::quote_ident("walpost_outbox");
    for why in [
        texts::outbox::dropped(&table),
        texts::outbox::publication_lacks_table("walpost_outbox", &table, &publication, &table.quoted()),
    ] {
        let message = texts::outbox::changed(&why);
        assert!(message.contains("runbooks/outbox-recreated.md"));
        assert!(runbook.contains(&message), "runbooks/outbox-recreated.md must quote:\n{message}");
    }
}

#[test]
fn poison_record_error_is_quoted_verbatim_in_its_runbook() {
    let r = walpost::kafka::Rejection {
        event_id: "4711".into(),
        topic: "outbox.event.order".into(),
        code: "message_size_too_large".into(),
        error: "Message production error: MessageSizeTooLarge (Broker: Message size too large)".into(),
        fix: "raise the topic's max.message.bytes and the producer's message.max.bytes, or make the payload smaller",
    };
    let message = r.operator_message();
    assert!(read("runbooks/poison-record.md").contains(&message), "runbooks/poison-record.md must quote:\n{message}");
    // The fix text is the one classify() gives for that code.
    let e = rdkafka::error::KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::MessageSizeTooLarge);
    assert_eq!(walpost::kafka::classify(&e), Some(("message_size_too_large", r.fix)));
}

/// The metrics of `walpost run`, of `walpost inbox` and those both export.
fn every_mode_metrics() -> impl Iterator<Item = &'static (&'static str, &'static str, &'static str)> {
    walpost::telemetry::metrics::METRICS
        .iter()
        .chain(inbox::metrics::METRICS)
        .chain(service::telemetry::exposition::METRICS)
}

#[test]
fn the_metrics_chapter_documents_exactly_the_exported_metrics() {
    let readme = read("docs/metrics.md");
    let documented: std::collections::BTreeSet<String> = readme
        .lines()
        .filter_map(|l| l.strip_prefix("| `walpost_"))
        .map(|rest| format!("walpost_{}", rest.split(['`', '{']).next().unwrap()))
        .collect();
    let exported: std::collections::BTreeSet<String> = every_mode_metrics().map(|(n, _, _)| n.to_string()).collect();
    assert_eq!(documented, exported, "docs/metrics.md and the modes' METRICS differ");
}

#[test]
fn grafana_dashboard_uses_only_exported_metrics() {
    let dashboard = read("deploy/grafana/walpost-dashboard.json");
    let _: serde_json::Value = serde_json::from_str(&dashboard).expect("dashboard is JSON");
    let exported: Vec<&str> = every_mode_metrics().map(|(n, _, _)| *n).collect();
    let mut used = 0;
    for (i, _) in dashboard.match_indices("walpost_") {
        let name: String = dashboard[i..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        let base = name.trim_end_matches("_bucket").trim_end_matches("_sum").trim_end_matches("_count");
        assert!(exported.contains(&base), "dashboard uses {name}, which walpost does not export");
        used += 1;
    }
    assert!(used >= 8, "the dashboard should chart the main metrics");
}

/// Who may write the signal table; the texts are in the replay runbook.
#[test]
fn signal_table_rights_errors_are_quoted_verbatim_in_the_replay_runbook() {
    let table = walpost::settings::TableName { schema: "events".into(), name: "debezium_signal".into() };
    let runbook = read("runbooks/replay.md");
    for message in [
        texts::replay::signal_table_public(&table, &table.quoted()),
        texts::replay::signal_table_roles(
            &table,
            &table.quoted(),
            &["reporting"],
            &[replication::quote_ident("reporting")],
        ),
    ] {
        assert!(message.contains("runbooks/replay.md"), "{message}");
        assert!(runbook.contains(&message), "runbooks/replay.md must quote:\n{message}");
    }
}

/// The error for a slot that was dropped or lost in a failover points to
/// slot-lost.md (it pointed to upgrade-and-failover.md, whose steps fail for a dropped
/// slot), which quotes it and the other missing-slot texts verbatim.
#[test]
fn slot_missing_errors_are_quoted_verbatim_in_slot_lost() {
    let origin = walpost::postgres::lineage::Origin {
        system_id: "7401234567890123456".into(),
        timeline: 1,
        created_at: Some("2026-11-30 09:12:44.193+00".into()),
    };
    let table = "events.walpost_slots";
    let missing = texts::slot::missing("walpost", &"pg-b:5432", origin.as_text(), 2, table);
    assert!(missing.contains("runbooks/slot-lost.md") && missing.contains("--snapshot when_needed"), "{missing}");
    assert!(missing.contains("DELETE FROM events.walpost_slots WHERE slot = 'walpost'"), "{missing}");
    let runbook = read("runbooks/slot-lost.md");
    for message in [
        missing,
        texts::slot::never_streamed("walpost", table),
        texts::slot::lineage_unknown("walpost", table, "does not exist"),
    ] {
        assert!(runbook.contains(&message), "runbooks/slot-lost.md must quote:\n{message}");
    }
    assert!(read("runbooks/upgrade-and-failover.md").contains("slot-lost.md"));
}

#[test]
fn exactly_once_errors_are_quoted_verbatim_in_their_runbook() {
    let runbook = read("runbooks/exactly-once.md");
    let forged = texts::exactly_once::forged("walpost.progress", "app/walpost", texts::exactly_once::FORGED_UNSIGNED);
    assert!(runbook.contains(&forged), "runbooks/exactly-once.md must quote:\n{forged}");
    let fenced = walpost::kafka::exactly_once::transaction::fenced_message();
    assert_eq!(fenced, texts::exactly_once::FENCED);
    assert!(runbook.contains(&fenced), "runbooks/exactly-once.md must quote:\n{fenced}");
    let refused = texts::exactly_once::brokers_refuse_transactions(&"<the client's error>");
    assert!(runbook.contains(&refused), "runbooks/exactly-once.md must quote:\n{refused}");
    let id = walpost::kafka::exactly_once::progress::SlotIdentity {
        system_id: "7409876543210987654".into(),
        database: "app".into(),
        slot: "walpost".into(),
    };
    let foreign = walpost::kafka::exactly_once::progress::Progress {
        system_id: "7301234567890123456".into(),
        database: "app".into(),
        slot: "walpost".into(),
        lsn: "0/1".into(),
        partial: None,
        mac: None,
    };
    let message = foreign.position_for(&id, "walpost.progress").unwrap_err().to_string();
    assert_eq!(
        message,
        texts::exactly_once::another_cluster(
            "walpost.progress",
            "app/walpost",
            "7301234567890123456",
            "7409876543210987654"
        )
    );
    assert!(runbook.contains(&message), "runbooks/exactly-once.md must quote:\n{message}");
    let behind = texts::exactly_once::PROGRESS_BEHIND_THE_SLOT;
    assert!(runbook.contains(behind), "runbooks/exactly-once.md must quote:\n{behind}");
}

#[test]
fn backfill_resume_hint_is_quoted_in_the_replay_runbook() {
    let hint = texts::replay::backfill_resume_hint("<resume-id>", "<resume-filter>");
    assert!(hint.contains("runbooks/replay.md"));
    let runbook = read("runbooks/replay.md");
    assert!(runbook.contains(&hint), "runbooks/replay.md must quote:\n{hint}");
    // A backfill's halt on a poison row: the rejection, then the hint (`snapshot` joins them).
    let rejected = texts::replay::snapshot_rejected("<event-id>", "<topic>", "<code>", "<error>", "<fix>", "");
    let halt = format!("{rejected}; {hint}");
    assert!(runbook.contains(&halt), "runbooks/replay.md must quote:\n{halt}");
}

/// The slot alarm's reasons that name what to do, as the WAL build-up and the
/// long-transaction runbooks show them (`<...>` for what differs).
#[test]
fn slot_alarm_reasons_are_quoted_verbatim_in_their_runbooks() {
    let buildup = read("runbooks/slot-wal-buildup.md");
    let see = texts::alarm::see_wal_buildup();
    for reason in [
        format!("{}{see}", texts::alarm::UNRESERVED),
        texts::alarm::no_process_streams(),
        format!(
            "the slot's confirmed position has not moved for 312 s while WAL was written: {}",
            texts::alarm::kafka_silent(305.0)
        ),
    ] {
        assert!(buildup.contains(&reason), "runbooks/slot-wal-buildup.md must quote:\n{reason}");
    }
    let long = texts::alarm::long_transaction(4242, "<application>", "<client>", 61.0)
        .replace("pid 4242", "pid <pid>")
        .replace("for 61 s", "for <seconds> s");
    assert!(read("runbooks/long-transaction.md").contains(&long), "runbooks/long-transaction.md must quote:\n{long}");
}

#[test]
fn tracing_and_cloudevents_refusals_are_quoted_verbatim_in_their_runbook() {
    use walpost::settings::{FileConfig, Overrides, Settings};
    let runbook = read("runbooks/otel-and-cloudevents.md");
    let otel = |vars: &[(&str, &str)]| {
        let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        walpost::settings::otel::OtelSettings::from_env(&|k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
            .unwrap_err()
            .to_string()
    };
    let base = Overrides {
        postgres: Some("postgres://u@h/d".into()),
        kafka_brokers: Some("k:1".into()),
        ..Overrides::default()
    };
    let config = |text: &str| Settings::resolve(&base, FileConfig::parse(text).unwrap()).unwrap_err().to_string();
    for message in [
        otel(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]),
        otel(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")]),
        otel(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"), ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=k")]),
        otel(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/etc/walpost/ca.crt"),
        ]),
        otel(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4318"),
            ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "/etc/walpost/client.crt"),
        ]),
        otel(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4318"), ("OTEL_EXPORTER_OTLP_COMPRESSION", "zstd")]),
        otel(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"), ("OTEL_TRACES_SAMPLER", "sometimes")]),
        config("envelope = \"cloudevents\"\n[router]\n\"table.fields.additional.placement\" = \"event_type:header:ce_type\""),
        config("envelope = \"cloudevents\"\n[router]\n\"table.field.event.type.header\" = \"\""),
    ] {
        assert!(runbook.contains(&message), "runbooks/otel-and-cloudevents.md must quote:\n{message}");
    }
}

/// runbooks/kafka-maintenance.md quotes `walpost check`'s durability warnings
/// and the watchdog's line as walpost writes them.
#[test]
fn kafka_maintenance_runbook_quotes_the_durability_warnings_and_the_watchdog() {
    let runbook = read("runbooks/kafka-maintenance.md");
    let topic = "outbox.event.order";
    for line in [
        texts::kafka::durability_warning(topic, "replication factor 1 and min.insync.replicas 1"),
        texts::kafka::defaults_warning("replication factor 1 and min.insync.replicas 1"),
    ] {
        assert!(line.contains("runbooks/kafka-maintenance.md"));
        assert!(runbook.contains(&format!("warn  {line}")), "runbooks/kafka-maintenance.md must quote:\n{line}");
    }
    // The watchdog line is put together in three places; each literal part is quoted.
    let window = read("crates/walpost/src/kafka/window.rs");
    let session = read("crates/walpost/src/stream/session.rs");
    let stream = read("crates/walpost/src/stream/mod.rs");
    for (source, part) in [
        (&window, "Kafka acknowledged no record for {} s while {} records waited; restarting the producer"),
        (&session, "{e} from the last confirmed position {}"),
        (&stream, "\"{e}; reconnecting\""),
    ] {
        assert!(source.contains(part), "the code no longer says {part:?}");
    }
    assert!(window.contains(
        "Kafka acknowledged nothing while records waited; the producer was given the bootstrap servers again (repeated every 5 s until Kafka acknowledges)"
    ));
    assert!(runbook.contains(
        "Kafka acknowledged nothing while records waited; the producer was given the bootstrap servers again (repeated every 5 s until Kafka acknowledges)"
    ));
    assert!(runbook.contains(
        "Kafka acknowledged no record for 60 s while 1873 records waited; restarting the producer from the last confirmed position 0/1A2B3C4; reconnecting"
    ));
    assert!(read("docs/runbooks.md").contains("[runbooks/kafka-maintenance.md](../runbooks/kafka-maintenance.md)"));
}

/// A contract breach's texts, with placeholders, are quoted in the poison-record
/// runbook (the halt line around them is the one every unroutable row has).
#[test]
fn contract_breaches_are_quoted_verbatim_in_the_poison_record_runbook() {
    use router::{Breach, BreachReason, RouteError};
    let runbook = read("runbooks/poison-record.md");
    let schema = Some(std::sync::Arc::from("<schema>"));
    let reasons = [
        BreachReason::Invalid {
            pointer: "<pointer>".into(),
            keyword: "<keyword>".into(),
            schema_path: "<schema-path>".into(),
        },
        BreachReason::NotJson { line: 1, column: 2 },
        BreachReason::NoContract,
        BreachReason::NoEventType,
        BreachReason::NotAvro { pointer: "<pointer>".into(), reason: "<reason>" },
        BreachReason::NoSubject,
        BreachReason::WrongSchemaType { found: "<found>".into(), wanted: "<wanted>", setting: "<setting>" },
        BreachReason::Unusable { reason: "<reason>".into() },
        BreachReason::BadKey { reason: "<reason>".into() },
        BreachReason::TooDeep { limit: 7 },
        BreachReason::TooCostly { steps: 7 },
    ];
    for reason in reasons {
        let invalid = matches!(reason, BreachReason::Invalid { .. });
        let breach = Breach { schema: schema.clone(), reason };
        let text = breach
            .to_string()
            .replace("line 1, column 2", "line <line>, column <column>")
            .replace("than 7 levels", "than <limit> levels")
            .replace("than 7 steps", "than <steps> steps");
        assert!(runbook.contains(&format!("- `{text}`")), "runbooks/poison-record.md must quote:\n{text}");
        let error = RouteError::ContractBroken {
            table: "<table>".into(),
            event_id: Some("<event-id>".into()),
            event_type: Some("<event-type>".into()),
            breach: Box::new(breach),
        };
        assert_eq!(error.class(), "contract_broken");
        if invalid {
            let text = error.to_string();
            assert!(runbook.contains(&text), "runbooks/poison-record.md must quote:\n{text}");
        }
    }
    // A registry that cannot answer: the transient line the stream logs.
    let waiting = RouteError::ContractUnavailable {
        table: "<table>".into(),
        event_id: Some("<event-id>".into()),
        reason: "the schema registry at <url> did not answer within <timeout>".into(),
    };
    let text = format!("{waiting}; the stream waits for it");
    assert!(runbook.contains(&text), "runbooks/poison-record.md must quote:\n{text}");
}

/// Decoding on a standby: the conflict's fatal error (each reason) and every
/// warning about the primary are quoted in runbooks/standby-decoding.md.
#[test]
fn standby_decoding_texts_are_quoted_verbatim_in_their_runbook() {
    use texts::standby as m;
    let runbook = read("runbooks/standby-decoding.md");
    let fatal = texts::slot::conflicted("<slot>", Some("rows_removed"));
    assert!(runbook.contains(&fatal), "runbooks/standby-decoding.md must quote:\n{fatal}");
    assert!(fatal.contains(texts::runbook::STANDBY));
    let sixteen = texts::slot::conflicted("<slot>", None);
    assert!(sixteen.contains("(conflicting = true)") && runbook.contains("`(conflicting = true)`"));
    let wal_level = texts::slot::conflicted("<slot>", Some("wal_level_insufficient"));
    let reason = "the primary's wal_level is no longer logical (invalidation_reason = wal_level_insufficient)";
    assert!(wal_level.contains(reason), "{wal_level}");
    let flowed = runbook.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(flowed.contains(reason), "runbooks/standby-decoding.md must quote:\n{reason}");
    for text in [
        m::without_primary("<error>"),
        m::SLOT_CREATION_WAITS_FOR_A_GRANT.to_owned(),
        m::slot_creation_waits_for_the_primary("<error>"),
        m::primary_feature_off(
            "the heartbeat",
            "a quiet outbox may hold WAL on the standby until other tables change",
            "<error>",
        ),
        m::needs_the_primary("the snapshot's progress row", "<error>"),
        m::publication_needs_the_primary("<publication>", "<error>", "<create>"),
        m::no_standby_found("<hosts>", 120),
    ] {
        assert!(runbook.contains(&text), "runbooks/standby-decoding.md must quote:\n{text}");
    }
    assert!(read("docs/runbooks.md").contains("[runbooks/standby-decoding.md](../runbooks/standby-decoding.md)"));
}
