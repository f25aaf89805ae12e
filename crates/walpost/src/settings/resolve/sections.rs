//! One function per section of the file: its table over the defaults, validated.

use std::collections::BTreeMap;
use std::time::Duration;

use super::super::duration::Seconds;
use super::super::{
    ConfigError, Delivery, DeliveryMode, ExactlyOnce, ExactlyOnceFile, MonitorFile, MonitorSettings, PipelineFile,
    RetentionFile, RetentionSettings, StreamSettings, Thresholds,
};

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
    kafka_properties: &BTreeMap<String, String>,
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
                .get("message.max.bytes")
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

pub(super) fn resolve_delivery(mode: Option<DeliveryMode>, f: &ExactlyOnceFile) -> Result<Delivery, ConfigError> {
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
                transaction_timeout: positive_duration(
                    "exactly_once.transaction_timeout_ms",
                    f.transaction_timeout_ms.map(|m| m.0),
                    d.transaction_timeout,
                )?,
            };
            if e.max_transaction_interval * 4 > e.transaction_timeout {
                return Err(ConfigError::Invalid {
                    key: "exactly_once.max_transaction_ms",
                    value: e.max_transaction_interval.as_millis().to_string(),
                    expected: "at most a quarter of exactly_once.transaction_timeout_ms",
                });
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
