//! One function per section of [`Settings`](super::Settings): its part of the file (the
//! flags already layered on) over the defaults, validated. The sections of the top-level
//! keys (`postgres*`, the source's, the Kafka section's, `snapshot*`, `metrics_addr`)
//! take them out of [`FileConfig`]; the others take their table.

use std::collections::BTreeMap;
use std::time::Duration;

use super::super::duration::Seconds;
use super::super::{
    secrets, ConfigError, Delivery, DeliveryMode, ExactlyOnce, ExactlyOnceFile, FileConfig, KafkaSettings, Messages,
    MonitorFile, MonitorSettings, OnPermanentError, Outbox, Overrides, PipelineFile, PostgresSettings, RetentionFile,
    RetentionSettings, SnapshotMode, SnapshotSettings, SourceSettings, StreamSettings, TableName, TelemetrySettings,
    Thresholds,
};
use super::{
    decoding_server, postgres_config, resolve_envelope, resolve_kafka_properties, resolve_metrics_addr, resolve_router,
    validate_identifier, validate_slot_name,
};

/// `postgres`, `postgres_primary`, `postgres_password_file`: where the slot is read, and
/// where walpost writes when that is a standby.
pub(super) fn resolve_postgres(o: &Overrides, file: &mut FileConfig) -> Result<PostgresSettings, ConfigError> {
    let text =
        file.postgres.take().ok_or(ConfigError::Missing { key: "postgres", flag: "postgres", env: "POSTGRES" })?;
    let password_file = file.postgres_password_file.take();
    let on_argv = o.postgres_on_argv.then_some(secrets::POSTGRES_PASSWORD_ON_ARGV);
    let config = postgres_config(on_argv, password_file.as_deref(), &text)?;
    let (server, primary) = decoding_server(config, &text)?;
    let primary = match (primary, file.postgres_primary.take()) {
        (None, Some(text)) => {
            return Err(ConfigError::Invalid {
                key: "postgres_primary",
                value: replication::Config::parse_with_env(&text, &|_| None).map_or_else(|_| "(set)".into(), |c| c.redacted()),
                expected: "no primary connection unless postgres settles on a standby (target_session_attrs=standby or prefer-standby): on a primary walpost writes where it reads",
            })
        }
        (None, None) => None,
        (Some(derived), None) => Some(derived),
        (Some(_), Some(text)) => {
            let on_argv = o.postgres_primary_on_argv.then_some(secrets::POSTGRES_PRIMARY_PASSWORD_ON_ARGV);
            let mut config = postgres_config(on_argv, password_file.as_deref(), &text)?;
            config.target_session_attrs = replication::TargetSessionAttrs::ReadWrite;
            Some(config)
        }
    };
    Ok(PostgresSettings { server, primary })
}

/// The slot, the publication, `table` and `[[outbox]]`, `[messages]`, the heartbeat and the
/// signal table, with their routers (`[router]`, `envelope`, `[cloudevents]`, `log_values`).
/// `dbname` names the default CloudEvents source.
pub(super) fn resolve_source(file: &mut FileConfig, dbname: &str) -> Result<SourceSettings, ConfigError> {
    let table = TableName::parse(&file.table.take().unwrap_or_else(|| "events.outbox".into()))?;
    let slot = file.slot.take().unwrap_or_else(|| "walpost".into());
    validate_slot_name(&slot)?;
    let publication = file.publication.take().unwrap_or_else(|| "walpost_outbox".into());
    validate_identifier(&publication).map_err(|expected| ConfigError::Invalid {
        key: "publication",
        value: publication.clone(),
        expected,
    })?;
    let base = &file.router;
    let log_values = file.log_values.unwrap_or(false);
    let envelope = resolve_envelope(file.envelope.take(), &file.cloudevents)?;
    let ce_for = |what: &str| envelope.as_ref().map(|e| e.for_source(dbname, what));
    let (router, op_invalid) = resolve_router(base, log_values, ce_for(&table.to_string()))?;
    let mut outboxes = vec![Outbox { table, router, op_invalid }];
    for extra in &file.outbox {
        let t = TableName::parse(&extra.table)?;
        let (r, op) = resolve_router(&extra.router.or(base), log_values, ce_for(&t.to_string()))?;
        if outboxes.iter().any(|o| o.table == t) {
            return Err(ConfigError::Invalid {
                key: "outbox.table",
                value: extra.table.clone(),
                expected: "each outbox table once",
            });
        }
        outboxes.push(Outbox { table: t, router: r, op_invalid: op });
    }
    let messages = if file.messages.prefix_include.is_empty() {
        None
    } else {
        let (r, op) = resolve_router(&file.messages.router.or(base), log_values, ce_for("messages"))?;
        Some(Messages {
            prefixes: file.messages.prefix_include.clone(),
            allow_non_transactional: file.messages.allow_non_transactional,
            allowed_roles: file.messages.allowed_roles.clone(),
            trust_all_roles: file.messages.trust_all_roles,
            router: r,
            op_invalid: op,
        })
    };
    // Optional (unset: no heartbeat), but never zero.
    let heartbeat_interval =
        file.heartbeat_interval_secs.map(|s| positive_duration("heartbeat_interval", Some(s.0), s.0)).transpose()?;
    let signal_table = match file.signal_table.take() {
        None => None,
        Some(text) => {
            let t = TableName::parse(&text)?;
            if outboxes.iter().any(|o| o.table == t) {
                return Err(ConfigError::Invalid {
                    key: "signal_table",
                    value: text,
                    expected: "a table of its own, not an outbox table",
                });
            }
            Some(t)
        }
    };
    Ok(SourceSettings {
        slot,
        publication,
        slot_failover: file.slot_failover.unwrap_or(false),
        outboxes,
        messages,
        heartbeat_interval,
        signal_table,
        signal_allowed_roles: file.signal.allowed_roles.clone(),
        signal_trust_all_roles: file.signal.trust_all_roles,
    })
}

/// `[kafka]`, `on_permanent_error`, `dead_letter_topic`, `log_values`, `delivery` and
/// `[exactly_once]`. Checked whether or not the command talks to Kafka (`need_kafka`);
/// `None` when it does not: it has no brokers.
pub(super) fn resolve_kafka(
    o: &Overrides,
    file: &mut FileConfig,
    source: &SourceSettings,
    need_kafka: bool,
) -> Result<Option<KafkaSettings>, ConfigError> {
    let brokers = match file.kafka.brokers.take() {
        _ if !need_kafka => None,
        Some(b) => Some(b),
        None => return Err(ConfigError::Missing { key: "kafka.brokers", flag: "kafka-brokers", env: "KAFKA_BROKERS" }),
    };
    let dead_letter_topic = file.dead_letter_topic.take().unwrap_or_else(|| "walpost.dead_letter".into());
    let internal = dead_letter_topic.starts_with(router::INTERNAL_TOPIC_PREFIX);
    if router::validate_topic(&dead_letter_topic).is_err() || internal {
        return Err(ConfigError::Invalid {
            key: "dead_letter_topic",
            value: dead_letter_topic,
            expected: "a valid Kafka topic name not starting with __",
        });
    }
    let properties = resolve_kafka_properties(o, &file.kafka)?;
    let delivery = resolve_delivery(file.delivery.take(), &file.exactly_once)?;
    if let (Some(t), Delivery::ExactlyOnce(_)) = (&source.signal_table, &delivery) {
        return Err(ConfigError::Invalid {
            key: "signal_table",
            value: t.to_string(),
            expected: "no signal table with delivery = exactly-once (a signal's replay is not inside the Kafka transactions): run walpost replay instead",
        });
    }
    Ok(brokers.map(|brokers| KafkaSettings {
        brokers,
        properties,
        on_permanent_error: file.on_permanent_error.unwrap_or(OnPermanentError::Halt),
        dead_letter_topic,
        log_values: file.log_values.unwrap_or(false),
        delivery,
    }))
}

/// `snapshot`, `snapshot_filter`.
pub(super) fn resolve_snapshot(file: &mut FileConfig) -> Result<SnapshotSettings, ConfigError> {
    let mode = file.snapshot.unwrap_or(SnapshotMode::Never);
    let filter = file.snapshot_filter.take().filter(|f| !f.trim().is_empty());
    if filter.is_some() && mode == SnapshotMode::Never {
        return Err(ConfigError::Invalid {
            key: "snapshot_filter",
            value: filter.unwrap_or_default(),
            expected: "no filter unless --snapshot is initial, initial_only or when_needed",
        });
    }
    Ok(SnapshotSettings { mode, filter, replay: None })
}

/// `metrics_addr` and the span exporter's `OTEL_*` variables. A backfill runs beside the
/// service with the service's configuration: the port in it is the service's, so a
/// backfill serves metrics only when its own command line names a port.
pub(super) fn resolve_telemetry(
    o: &Overrides,
    file: &mut FileConfig,
    snapshot: SnapshotMode,
) -> Result<TelemetrySettings, ConfigError> {
    let backfill_without_flag = snapshot == SnapshotMode::InitialOnly && !o.metrics_addr_on_argv;
    let metrics_addr = match file.metrics_addr.take() {
        Some(a) if backfill_without_flag && !a.is_empty() => {
            tracing::info!("a backfill (--snapshot initial_only) serves no metrics unless --metrics-addr is on its own command line: {a} is the service's");
            None
        }
        other => resolve_metrics_addr(other)?,
    };
    Ok(TelemetrySettings {
        metrics_addr,
        otel: super::super::otel::OtelSettings::from_env(&|k| std::env::var(k).ok())?,
    })
}

/// `[monitor]` over the defaults; warning thresholds at or below the critical ones.
pub(super) fn resolve_monitor(m: MonitorFile) -> Result<MonitorSettings, ConfigError> {
    let defaults = Thresholds::default();
    let thresholds = Thresholds {
        warning_bytes: m.warning_bytes,
        critical_bytes: m.critical_bytes,
        warning_lag_secs: m.warning_lag_secs.map_or(defaults.warning_lag_secs, |s| s.0.as_secs_f64()),
        critical_lag_secs: m.critical_lag_secs.map_or(defaults.critical_lag_secs, |s| s.0.as_secs_f64()),
        long_transaction_secs: m.long_transaction_secs.map_or(defaults.long_transaction_secs, |s| s.0.as_secs_f64()),
        confirm_stalled_secs: m.confirm_stalled_secs.map_or(defaults.confirm_stalled_secs, |s| s.0.as_secs_f64()),
    };
    let bytes_out_of_order =
        matches!((thresholds.warning_bytes, thresholds.critical_bytes), (Some(w), Some(c)) if w > c);
    if bytes_out_of_order || thresholds.warning_lag_secs > thresholds.critical_lag_secs {
        return Err(ConfigError::Invalid {
            key: "monitor",
            value: format!("{thresholds:?}"),
            expected: "warning thresholds at or below the critical ones",
        });
    }
    Ok(MonitorSettings {
        interval: secs("monitor.interval_secs", m.interval_secs, 10)?,
        thresholds,
        reminder: secs("monitor.reminder_secs", m.reminder_secs, 300)?,
    })
}

/// `[pipeline]` over the defaults; `kafka_properties` give the producer's
/// `message.max.bytes`, which bounds a row by default.
pub(super) fn resolve_stream(
    p: PipelineFile,
    kafka_properties: Option<&BTreeMap<String, String>>,
) -> Result<StreamSettings, ConfigError> {
    let delivery_timeout = secs("pipeline.delivery_timeout_secs", p.delivery_timeout_secs, 60)?;
    Ok(StreamSettings {
        // 8 MiB: librdkafka holds a copy of every unacknowledged payload, so this bounds
        // walpost's memory in a drain; 16 MiB raised the peak RSS of a 1M-event drain by
        // ~10-20 MB without a measurable gain in rate (bench/results/analysis.md, the 8 MiB window).
        max_in_flight_bytes: positive("pipeline.max_in_flight_bytes", p.max_in_flight_bytes, 8 << 20)?,
        max_in_flight_records: positive("pipeline.max_in_flight_records", p.max_in_flight_records, 50_000)?,
        status_interval: secs("pipeline.status_interval_secs", p.status_interval_secs, 10)?,
        shutdown_timeout: secs("pipeline.shutdown_timeout_secs", p.shutdown_timeout_secs, 30)?,
        max_backoff: secs("pipeline.max_backoff_secs", p.max_backoff_secs, 30)?,
        delivery_timeout,
        // Half the producer restart by default, never more than 30 s: readiness drops first.
        unready_after: positive_duration(
            "pipeline.unready_after_secs",
            p.unready_after_secs.map(|s| s.0),
            (delivery_timeout / 2).clamp(Duration::from_secs(1), Duration::from_secs(30)),
        )?,
        // Kafka refuses a record over the producer's message.max.bytes (librdkafka's
        // default: 1,000,000) anyway; the slack is room for columns that are not in it.
        max_message_bytes: usize::try_from(positive(
            "pipeline.max_message_bytes",
            p.max_message_bytes,
            kafka_properties
                .and_then(|p| p.get("message.max.bytes"))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(1_000_000)
                .saturating_add(MAX_MESSAGE_SLACK),
        )?)
        .unwrap_or(usize::MAX),
        // Two scrapes of a 30 s interval see it.
        halt_linger: p.halt_linger_secs.map_or(Duration::from_secs(60), |s| s.0),
        // Long enough for a standby's restart, short enough that a promotion is noticed.
        no_standby_timeout: positive_duration(
            "pipeline.no_standby_timeout_secs",
            p.no_standby_timeout_secs.map(|s| s.0),
            Duration::from_secs(120),
        )?,
    })
}

fn resolve_delivery(mode: Option<DeliveryMode>, f: &ExactlyOnceFile) -> Result<Delivery, ConfigError> {
    match mode.unwrap_or(DeliveryMode::AtLeastOnce) {
        DeliveryMode::AtLeastOnce => Ok(Delivery::AtLeastOnce),
        DeliveryMode::ExactlyOnce => {
            let d = ExactlyOnce::default();
            let progress_topic = f.progress_topic.clone().unwrap_or(d.progress_topic);
            if router::validate_topic(&progress_topic).is_err()
                || progress_topic.starts_with(router::INTERNAL_TOPIC_PREFIX)
            {
                return Err(ConfigError::Invalid {
                    key: "exactly_once.progress_topic",
                    value: progress_topic,
                    expected: "a valid Kafka topic name not starting with __",
                });
            }
            let e = ExactlyOnce {
                progress_topic,
                max_transaction_records: positive(
                    "exactly_once.max_transaction_records",
                    f.max_transaction_records,
                    d.max_transaction_records,
                )?,
                max_transaction_bytes: positive(
                    "exactly_once.max_transaction_bytes",
                    f.max_transaction_bytes,
                    d.max_transaction_bytes,
                )?,
                max_transaction_interval: positive_duration(
                    "exactly_once.max_transaction_ms",
                    f.max_transaction_ms.map(|m| m.0),
                    d.max_transaction_interval,
                )?,
                backlog_transaction_interval: positive_duration(
                    "exactly_once.backlog_transaction_ms",
                    f.backlog_transaction_ms.map(|m| m.0),
                    d.backlog_transaction_interval,
                )?,
                transaction_timeout: positive_duration(
                    "exactly_once.transaction_timeout_ms",
                    f.transaction_timeout_ms.map(|m| m.0),
                    d.transaction_timeout,
                )?,
            };
            for (key, interval) in [
                ("exactly_once.max_transaction_ms", e.max_transaction_interval),
                ("exactly_once.backlog_transaction_ms", e.backlog_transaction_interval),
            ] {
                if interval * 4 > e.transaction_timeout {
                    return Err(ConfigError::Invalid {
                        key,
                        value: interval.as_millis().to_string(),
                        expected: "at most a quarter of exactly_once.transaction_timeout_ms",
                    });
                }
            }
            Ok(Delivery::ExactlyOnce(e))
        }
    }
}

pub(super) fn positive(key: &'static str, v: Option<u64>, default: u64) -> Result<u64, ConfigError> {
    match v {
        Some(0) => Err(ConfigError::Invalid { key, value: "0".into(), expected: "a positive number" }),
        Some(n) => Ok(n),
        None => Ok(default),
    }
}

/// A `*_secs` key: `default` seconds when unset; zero is refused.
fn secs(key: &'static str, v: Option<Seconds>, default: u64) -> Result<Duration, ConfigError> {
    positive_duration(key, v.map(|s| s.0), Duration::from_secs(default))
}

pub(in crate::settings) fn positive_duration(
    key: &'static str,
    v: Option<Duration>,
    default: Duration,
) -> Result<Duration, ConfigError> {
    match v {
        Some(d) if d.is_zero() => Err(ConfigError::Invalid {
            key,
            value: "0".into(),
            expected: "a positive duration (a number in the key's unit, or 500ms, 30s, 5min)",
        }),
        Some(d) => Ok(d),
        None => Ok(default),
    }
}

/// What `[pipeline] max_message_bytes` adds to the producer's `message.max.bytes` by
/// default: room for the columns of a row that do not go into its record.
pub(super) const MAX_MESSAGE_SLACK: u64 = 1 << 20;

/// The `[retention]` table (with `--keep-days`/`--days-ahead` layered on) over the defaults.
pub(super) fn resolve_retention(file: &RetentionFile) -> Result<RetentionSettings, ConfigError> {
    let d = RetentionSettings::default();
    let invalid =
        |key: &'static str, value: String, expected: &'static str| ConfigError::Invalid { key, value, expected };
    let interval = positive_duration("retention.interval_secs", file.interval_secs.map(|s| s.0), d.interval)?;
    let keep_days = file.keep_days.unwrap_or(d.keep_days);
    if keep_days > 36_500 {
        return Err(invalid("retention.keep_days", keep_days.to_string(), "a number of days up to 36500"));
    }
    let days_ahead = file.days_ahead.unwrap_or(d.days_ahead);
    if days_ahead == 0 || days_ahead > 366 {
        return Err(invalid("retention.days_ahead", days_ahead.to_string(), "1 to 366 days"));
    }
    // 0 would mean "wait forever" to PostgreSQL, queueing every insert behind us.
    let lock_timeout =
        positive_duration("retention.lock_timeout_ms", file.lock_timeout_ms.map(|m| m.0), Duration::from_secs(1))?;
    Ok(RetentionSettings { enabled: file.enabled, interval, keep_days, days_ahead, lock_timeout })
}
