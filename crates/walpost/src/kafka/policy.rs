//! The one permanent-error policy, shared by the stream and the snapshot: a record
//! Kafka will never take, or a row that cannot be routed, either halts walpost or goes
//! to the dead-letter topic, by configuration (`on_permanent_error`). Nothing is ever
//! dropped silently.

use std::sync::Arc;

use bytes::Bytes;
use pgoutput::Lsn;
use router::Record;

use super::sink::Original;
use super::Rejection;
use crate::error::{ErrorKind, PipelineError};
use crate::settings::{KafkaSettings, OnPermanentError};

/// Headers walpost adds to a dead letter.
pub(crate) mod headers {
    pub(crate) const CLASS: &str = "walpost.error.class";
    pub(crate) const MESSAGE: &str = "walpost.error.message";
    pub(crate) const ORIGINAL_TOPIC: &str = "walpost.original.topic";
    pub(crate) const EVENT_ID: &str = "walpost.event.id";
    pub(crate) const LSN: &str = "walpost.lsn";
    pub(crate) const VALUE_DROPPED: &str = "walpost.value.dropped";
}

/// Why a record cannot be published, and what is known of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// Stable class: a rejection code or a routing error class.
    pub class: String,
    /// What went wrong; never holds a column value (the router's and Kafka's texts do not).
    pub message: String,
    /// The topic the record was meant for ("" when it could not be routed).
    pub original_topic: String,
    pub event_id: Bytes,
    /// The commit LSN of the record's own transaction.
    pub lsn: Lsn,
    /// Whether the value is too large to be sent anywhere.
    pub too_large: bool,
}

impl Failure {
    /// A record Kafka refused.
    pub fn rejected(rejection: &Rejection, lsn: Lsn) -> Failure {
        Failure {
            class: rejection.code.clone(),
            message: format!("{}: {}", rejection.error, rejection.fix),
            original_topic: rejection.topic.clone(),
            event_id: Bytes::from(rejection.event_id.clone()),
            lsn,
            too_large: rejection.is_size(),
        }
    }
}

/// See the module docs.
#[derive(Debug, Clone)]
pub(crate) struct PermanentErrorPolicy {
    mode: OnPermanentError,
    topic: Arc<str>,
}

impl PermanentErrorPolicy {
    pub(crate) fn new(kafka: &KafkaSettings) -> PermanentErrorPolicy {
        PermanentErrorPolicy { mode: kafka.on_permanent_error, topic: Arc::from(kafka.dead_letter_topic.as_str()) }
    }

    /// Whether failures go to the dead-letter topic.
    pub(crate) fn dead_letters(&self) -> bool {
        self.mode == OnPermanentError::DeadLetter
    }

    /// The dead letter for `failure`: the original key, value (dropped when its size is
    /// the cause) and headers, plus headers saying what went wrong and where the event
    /// came from. `None` in halt mode.
    pub(crate) fn dead_letter(&self, failure: &Failure, original: Original) -> Option<Record> {
        if !self.dead_letters() {
            return None;
        }
        tracing::warn!(
            event_id = %String::from_utf8_lossy(&failure.event_id),
            class = %failure.class,
            lsn = %failure.lsn,
            dead_letter_topic = %self.topic,
            "sending an event that can never be published to the dead-letter topic"
        );
        let h = |k: &str, v: String| (Arc::from(k), Bytes::from(v));
        let mut headers: Vec<(Arc<str>, Bytes)> = original
            .headers
            .into_iter()
            .filter(|(k, _)| !k.starts_with("walpost.error."))
            .map(|(k, v)| (Arc::from(k.as_str()), Bytes::from(v)))
            .collect();
        // A record refused for its size would be refused again on the dead-letter topic:
        // send it without its value; the event id and LSN find it in the outbox.
        let value = if failure.too_large {
            headers.push(h(headers::VALUE_DROPPED, "too large for Kafka; read it from the outbox by event id".into()));
            None
        } else {
            original.value.map(Bytes::from)
        };
        headers.push(h(headers::CLASS, failure.class.clone()));
        headers.push(h(headers::MESSAGE, failure.message.clone()));
        headers.push(h(headers::ORIGINAL_TOPIC, failure.original_topic.clone()));
        headers.push(h(headers::EVENT_ID, String::from_utf8_lossy(&failure.event_id).into_owned()));
        headers.push(h(headers::LSN, failure.lsn.to_string()));
        Some(Record {
            topic: self.topic.clone(),
            key: original.key.map(Bytes::from).unwrap_or_default(),
            value,
            headers,
            event_id: failure.event_id.clone(),
            timestamp_ms: None,
            partition: None,
            trace: router::TraceOutcome::default(),
        })
    }

    /// The error walpost halts with for a record Kafka refused.
    pub(crate) fn halt_rejected(&self, rejection: &Rejection) -> PipelineError {
        PipelineError::definite(ErrorKind::Kafka, rejection.operator_message())
    }

    /// The error walpost halts with when a dead letter itself is refused.
    pub(crate) fn dead_letter_refused(&self, rejection: &Rejection) -> PipelineError {
        PipelineError::definite(
            ErrorKind::Kafka,
            format!("the dead-letter topic {} refused a dead letter too: {}", self.topic, rejection.operator_message()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(mode: OnPermanentError) -> PermanentErrorPolicy {
        PermanentErrorPolicy { mode, topic: Arc::from("dlq") }
    }

    fn failure(too_large: bool) -> Failure {
        Failure {
            class: "message_size_too_large".into(),
            message: "too large: raise it".into(),
            original_topic: "outbox.event.order".into(),
            event_id: Bytes::from_static(b"42"),
            lsn: Lsn(0x16_0000_0100),
            too_large,
        }
    }

    #[test]
    fn halt_mode_makes_no_dead_letter() {
        assert!(policy(OnPermanentError::Halt).dead_letter(&failure(false), Original::default()).is_none());
    }

    #[test]
    fn dead_letter_keeps_key_headers_and_says_what_went_wrong() {
        let original = Original {
            key: Some(b"agg-1".to_vec()),
            value: Some(b"{\"a\":1}".to_vec()),
            headers: vec![("id".into(), b"42".to_vec()), ("walpost.error.class".into(), b"stale".to_vec())],
        };
        let r = policy(OnPermanentError::DeadLetter).dead_letter(&failure(true), original).unwrap();
        assert_eq!(&*r.topic, "dlq");
        assert_eq!(r.key, Bytes::from_static(b"agg-1"));
        assert_eq!(r.value, None, "a value refused for its size is dropped");
        let get = |k: &str| r.headers.iter().filter(|(n, _)| &**n == k).map(|(_, v)| v.clone()).collect::<Vec<_>>();
        assert_eq!(get("id"), vec![Bytes::from_static(b"42")]);
        assert_eq!(get(headers::CLASS), vec![Bytes::from_static(b"message_size_too_large")], "old error headers go");
        assert_eq!(get(headers::LSN), vec![Bytes::from("16/100")]);
        assert_eq!(get(headers::VALUE_DROPPED).len(), 1);
    }
}
