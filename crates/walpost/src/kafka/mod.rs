//! Everything about Kafka: the producer's configuration ([`config`]), the producer and
//! its delivery reports ([`sink`]), the hand-over of each record to librdkafka with its
//! kept topic handles ([`handoff`]), a record's headers read as bytes ([`headers`]; these
//! two are the modules with `unsafe` calls into librdkafka), which errors mean "never"
//! ([`rejection`]), librdkafka's repeated log lines throttled ([`throttle`]), the one
//! produce window the stream and the snapshot share ([`window`]) with its barriers
//! ([`barrier`]: when a record may go), the one
//! permanent-error policy ([`policy`]), what a restarted producer must know of the
//! last one's deliveries ([`memo`]), and `--delivery exactly-once` ([`exactly_once`]:
//! Kafka transactions, progress records, the confirm gate).

pub(crate) mod barrier;
pub(crate) mod config;
pub mod exactly_once;
pub(crate) mod handoff;
pub(crate) use kafka_common::headers;
pub(crate) mod memo;
#[cfg(test)]
pub(crate) mod model_sink;
pub(crate) mod policy;
pub(crate) mod rejection;
pub(crate) mod sink;
pub(crate) use kafka_common::throttle;
pub(crate) mod window;

use std::sync::Arc;

pub(crate) use memo::{DeliveryMemo, Known, RecordId};
pub(crate) use policy::{Failure, PermanentErrorPolicy};
pub use rejection::{classify, Rejection};
pub(crate) use sink::{KafkaSink, Original};
pub(crate) use window::{Event, Outgoing, ProduceWindow, WindowLimits};

use crate::error::{ErrorKind, PipelineError};
use crate::settings::{KafkaSettings, StreamSettings};
use crate::telemetry::Metrics;

/// A new producer and its window, as the settings describe them (`transactional`:
/// `--delivery exactly-once`'s transactional producer).
pub fn open_window<T>(
    kafka: &KafkaSettings,
    stream: &StreamSettings,
    metrics: &Metrics,
    transactional: Option<&config::Transactional>,
) -> Result<ProduceWindow<T>, PipelineError> {
    let (config, user_keys) = config::producer_config(&kafka.brokers, &kafka.properties, transactional)
        .map_err(|e| PipelineError::definite(ErrorKind::Config, e))?;
    let not_events = match &kafka.delivery {
        crate::settings::Delivery::ExactlyOnce(e) => vec![e.progress_topic.clone()],
        crate::settings::Delivery::AtLeastOnce => Vec::new(),
    };
    let (sink, reports) = KafkaSink::new(&config, user_keys, not_events, metrics.kafka.clone())
        .map_err(|e| PipelineError::definite(ErrorKind::Kafka, e))?;
    let limits = WindowLimits {
        max_records: stream.max_in_flight_records,
        max_bytes: stream.max_in_flight_bytes,
        delivery_timeout: stream.delivery_timeout,
    };
    Ok(ProduceWindow::new(sink, reports, limits, metrics.kafka.clone(), Arc::clone(metrics.health())))
}
