//! Records Kafka will never take: which errors mean "never" (as opposed to "not now"),
//! and the operator's message for them.

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// A record Kafka will never accept, with what an operator needs to act.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub event_id: String,
    pub topic: String,
    /// A stable class name (`message_size_too_large`, ...): metrics label and header.
    pub code: String,
    pub error: String,
    pub fix: &'static str,
}

impl Rejection {
    /// The fatal error walpost stops with; quoted verbatim in runbooks/poison-record.md.
    pub fn operator_message(&self) -> String {
        texts::kafka::poison_record(&self.event_id, &self.topic, &self.code, &self.error, self.fix)
    }

    /// Whether the cause is the record's size (a dead letter then goes without its value).
    pub fn is_size(&self) -> bool {
        matches!(self.code.as_str(), "message_size_too_large" | "invalid_message_size" | "message_batch_too_large")
    }
}

/// Sorts a Kafka error into "never" (`Some((class, fix))`) and "try again later" (`None`).
///
/// Leader elections, `NOT_ENOUGH_REPLICAS` and transport errors are "later".
pub fn classify(error: &KafkaError) -> Option<(&'static str, &'static str)> {
    use RDKafkaErrorCode as C;
    let code = error.rdkafka_error_code()?;
    let fix = match code {
        C::MessageSizeTooLarge | C::InvalidMessageSize | C::MessageBatchTooLarge => texts::kafka::FIX_SIZE,
        C::TopicAuthorizationFailed | C::ClusterAuthorizationFailed => texts::kafka::FIX_AUTHORIZATION,
        C::InvalidTopic => texts::kafka::FIX_TOPIC_NAME,
        C::UnknownTopic | C::UnknownTopicOrPartition => texts::kafka::FIX_UNKNOWN_TOPIC,
        C::InvalidRecord | C::InvalidMessage => texts::kafka::FIX_RECORD_FORMAT,
        C::InvalidTimestamp => texts::kafka::FIX_TIMESTAMP,
        C::PolicyViolation => texts::kafka::FIX_POLICY,
        _ => return None,
    };
    Some((code_name(code), fix))
}

/// Every class [`classify`] gives, for metrics that declare their label values up front.
pub(crate) const CLASSES: &[&str] = &[
    "message_size_too_large",
    "invalid_message_size",
    "message_batch_too_large",
    "topic_authorization_failed",
    "cluster_authorization_failed",
    "invalid_topic",
    "unknown_topic",
    "invalid_record",
    "invalid_timestamp",
    "policy_violation",
];

fn code_name(code: RDKafkaErrorCode) -> &'static str {
    use RDKafkaErrorCode as C;
    match code {
        C::MessageSizeTooLarge => "message_size_too_large",
        C::InvalidMessageSize => "invalid_message_size",
        C::MessageBatchTooLarge => "message_batch_too_large",
        C::TopicAuthorizationFailed => "topic_authorization_failed",
        C::ClusterAuthorizationFailed => "cluster_authorization_failed",
        C::InvalidTopic => "invalid_topic",
        C::UnknownTopic | C::UnknownTopicOrPartition => "unknown_topic",
        C::InvalidRecord | C::InvalidMessage => "invalid_record",
        C::InvalidTimestamp => "invalid_timestamp",
        C::PolicyViolation => "policy_violation",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What brokers answer during elections, restarts, reassignments and while
    /// `min.insync.replicas` cannot be met is "later": retried (inside librdkafka, or by
    /// a new session), never halted on and never dead-lettered.
    #[test]
    fn election_and_replica_shortage_errors_are_retried_never_dead_lettered() {
        use RDKafkaErrorCode as C;
        for code in [
            C::NotEnoughReplicas,
            C::NotEnoughReplicasAfterAppend,
            C::NotLeaderForPartition, // NOT_LEADER_OR_FOLLOWER
            C::LeaderNotAvailable,
            C::PreferredLeaderNotAvailable,
            C::FencedLeaderEpoch,
            C::UnknownLeaderEpoch,
            C::ReplicaNotAvailable,
            C::BrokerNotAvailable,
            C::NotController,
            C::KafkaStorageError,
            C::RequestTimedOut,
            C::NetworkException,
            C::NotCoordinator,
            C::CoordinatorNotAvailable,
            C::CoordinatorLoadInProgress,
            C::BrokerTransportFailure,
            C::AllBrokersDown,
        ] {
            assert_eq!(classify(&KafkaError::MessageProduction(code)), None, "{code:?} must be retried");
        }
    }

    #[test]
    fn permanent_and_transient_errors_are_told_apart() {
        let too_large = KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge);
        assert_eq!(classify(&too_large).map(|c| c.0), Some("message_size_too_large"));
        for later in [
            RDKafkaErrorCode::MessageTimedOut,
            RDKafkaErrorCode::BrokerTransportFailure,
            RDKafkaErrorCode::NotEnoughReplicas,
            RDKafkaErrorCode::NotEnoughReplicasAfterAppend,
            RDKafkaErrorCode::NotLeaderForPartition,
            RDKafkaErrorCode::LeaderNotAvailable,
        ] {
            assert_eq!(classify(&KafkaError::MessageProduction(later)), None, "{later:?} is retried");
        }
        let denied = KafkaError::MessageProduction(RDKafkaErrorCode::TopicAuthorizationFailed);
        assert!(classify(&denied).unwrap().1.contains("WRITE"));
        use RDKafkaErrorCode as C;
        for code in [
            C::MessageSizeTooLarge,
            C::InvalidMessageSize,
            C::MessageBatchTooLarge,
            C::TopicAuthorizationFailed,
            C::ClusterAuthorizationFailed,
            C::InvalidTopic,
            C::UnknownTopic,
            C::UnknownTopicOrPartition,
            C::InvalidRecord,
            C::InvalidMessage,
            C::InvalidTimestamp,
            C::PolicyViolation,
        ] {
            if let Some((class, _)) = classify(&KafkaError::MessageProduction(code)) {
                assert!(CLASSES.contains(&class), "{class} is not in CLASSES");
            }
        }
    }
}
