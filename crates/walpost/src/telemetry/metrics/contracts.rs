//! `walpost_contract_checks_total{event_type, result}`: the contracts' checks, counted
//! by a wrapper around the configured [`PayloadContract`]; and the schema registry's
//! requests, their latency and the schema cache's lookups (`walpost_registry_*`).
//!
//! The `event_type` label takes only the event types that have a schema (names the
//! operator configured); every other type, and events without one, count as `(other)`.
//! So the series are bounded by the schema files, never by row values. The counters are
//! resolved once, when the wrapper is made: a check costs one hash lookup on the event
//! type's bytes and one atomic increment.

use std::collections::HashMap;
use std::sync::Arc;

use prometheus::{IntCounter, IntCounterVec};
use router::{Checked, ContractError, ContractRef, Event, PayloadContract};

use super::OTHER_TOPICS;

/// The contracts' counters (registered with the others in [`super::Metrics::new`]).
#[derive(Debug, Clone)]
pub struct ContractMetrics {
    pub(super) checks: IntCounterVec,
    /// By result: `found`, `missing`, `error`.
    pub registry_requests: IntCounterVec,
    pub registry_seconds: prometheus::Histogram,
    /// By result: `hit`, `miss`.
    pub registry_cache: IntCounterVec,
}

/// Valid, then breach.
type Pair = [IntCounter; 2];

struct Metered {
    inner: Arc<dyn PayloadContract>,
    by_type: HashMap<Box<[u8]>, Pair>,
    other: Pair,
}

impl ContractMetrics {
    /// `contract`, counting each check it makes.
    pub fn meter(&self, contract: &ContractRef) -> ContractRef {
        let pair = |event_type: &str| {
            [
                self.checks.with_label_values(&[event_type, "valid"]),
                self.checks.with_label_values(&[event_type, "breach"]),
            ]
        };
        let by_type =
            contract.0.event_types().into_iter().map(|t| (t.as_bytes().into(), pair(&t))).collect::<HashMap<_, _>>();
        ContractRef(Arc::new(Metered { inner: contract.0.clone(), by_type, other: pair(OTHER_TOPICS) }))
    }
}

impl PayloadContract for Metered {
    fn check(&self, event: Event<'_>, payload: &[u8]) -> Result<Checked, ContractError> {
        let outcome = self.inner.check(event, payload);
        let pair = event.event_type.and_then(|t| self.by_type.get(t)).unwrap_or(&self.other);
        let [valid, breach] = pair;
        match &outcome {
            Ok(_) => valid.inc(),
            Err(ContractError::Breach(_)) => breach.inc(),
            // Not checked yet: counted when it is.
            Err(ContractError::Unavailable(_)) => {}
        }
        outcome
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn event_types(&self) -> Vec<String> {
        self.inner.event_types()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::telemetry::health::Health;
    use crate::telemetry::metrics::Metrics;

    struct OnlyEmpty;
    impl PayloadContract for OnlyEmpty {
        fn check(&self, _: Event<'_>, payload: &[u8]) -> Result<Checked, ContractError> {
            match payload {
                b"{}" => Ok(Checked::Unchanged),
                b"down" => Err(ContractError::Unavailable("down".into())),
                _ => Err(ContractError::Breach(router::Breach {
                    schema: None,
                    reason: router::BreachReason::NoContract,
                })),
            }
        }
        fn describe(&self) -> String {
            "test".into()
        }
        fn event_types(&self) -> Vec<String> {
            vec!["OrderPlaced".into()]
        }
    }

    #[test]
    fn checks_are_counted_by_known_event_type_and_result_others_as_other() {
        let metrics = Metrics::new(Arc::new(Health::new(std::time::Duration::MAX, std::time::Duration::MAX))).unwrap();
        let metered = metrics.contracts.meter(&ContractRef(Arc::new(OnlyEmpty)));
        let event = |t: Option<&'static [u8]>| Event { event_type: t, topic: "t" };
        assert!(metered.0.check(event(Some(b"OrderPlaced")), b"{}").is_ok());
        assert!(metered.0.check(event(Some(b"OrderPlaced")), b"[]").is_err());
        assert!(metered.0.check(event(Some(b"OrderPlaced")), b"down").is_err(), "not counted: not checked");
        assert!(metered.0.check(event(Some(b"secret@example.com")), b"{}").is_ok());
        assert!(metered.0.check(event(None), b"[]").is_err());
        let text = metrics.encode();
        for line in [
            "walpost_contract_checks_total{event_type=\"OrderPlaced\",result=\"valid\"} 1",
            "walpost_contract_checks_total{event_type=\"OrderPlaced\",result=\"breach\"} 1",
            "walpost_contract_checks_total{event_type=\"(other)\",result=\"valid\"} 1",
            "walpost_contract_checks_total{event_type=\"(other)\",result=\"breach\"} 1",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
        assert!(!text.contains("secret"), "a row's event type is never a label");
        assert_eq!(metered.0.event_types(), vec!["OrderPlaced".to_owned()]);
    }
}
