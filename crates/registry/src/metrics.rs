//! `walpost_contract_checks_total{event_type, result}`: the contracts' checks, counted
//! by a wrapper around the configured [`PayloadContract`]; and the schema registry's
//! requests, their latency and the schema cache's lookups (`walpost_registry_*`).
//!
//! The `event_type` label takes only the event types that have a schema (names the
//! operator configured); every other type, and events without one, count as `(other)`.
//! So the series are bounded by the schema files, never by row values. A schema
//! registry's event types are not known in advance: a type becomes a label once a
//! subject named after it (`record_name`, `topic_record_name`) accepted an event, at most
//! [`MAX_LEARNED_TYPES`] of them. The counters of file contracts are resolved once,
//! when the wrapper is made: a check costs one hash lookup on the event type's bytes and
//! one atomic increment (a registry's, a read lock more).

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};

use prometheus::{IntCounter, IntCounterVec};
use router::{Checked, ContractError, ContractRef, Event, PayloadContract};

use service::telemetry::exposition::OTHER_TOPICS;

/// The contracts' counters (the binary registers them with its other series).
#[derive(Debug, Clone)]
pub struct ContractMetrics {
    /// By event type and result: `valid`, `breach`.
    pub checks: IntCounterVec,
    /// By result: `found`, `missing`, `error`.
    pub registry_requests: IntCounterVec,
    pub registry_seconds: prometheus::Histogram,
    /// By result: `hit`, `miss`.
    pub registry_cache: IntCounterVec,
}

/// Valid, then breach.
type Pair = [IntCounter; 2];

/// The most event types a registry's checks label, beside `(other)`.
const MAX_LEARNED_TYPES: usize = 100;

struct Metered {
    inner: Arc<dyn PayloadContract>,
    by_type: HashMap<Box<[u8]>, Pair>,
    /// Types learned from accepted events (see the module docs); `None`: learns none.
    learned: Option<RwLock<HashMap<Box<[u8]>, Pair>>>,
    checks: IntCounterVec,
    other: Pair,
}

impl ContractMetrics {
    /// `contract`, counting each check it makes.
    pub fn meter(&self, contract: &ContractRef) -> ContractRef {
        let by_type = contract
            .0
            .event_types()
            .into_iter()
            .map(|t| (t.as_bytes().into(), pair(&self.checks, &t)))
            .collect::<HashMap<_, _>>();
        let learned = contract.0.accepted_types_are_configured().then(RwLock::default);
        ContractRef(Arc::new(Metered {
            inner: contract.0.clone(),
            by_type,
            learned,
            checks: self.checks.clone(),
            other: pair(&self.checks, OTHER_TOPICS),
        }))
    }
}

fn pair(checks: &IntCounterVec, event_type: &str) -> Pair {
    [checks.with_label_values(&[event_type, "valid"]), checks.with_label_values(&[event_type, "breach"])]
}

impl Metered {
    /// The counters of `event_type`; an accepted event's type is learned (see the module
    /// docs) while there is room.
    fn pair(&self, event_type: Option<&[u8]>, accepted: bool) -> Pair {
        let Some(t) = event_type else { return self.other.clone() };
        if let Some(p) = self.by_type.get(t) {
            return p.clone();
        }
        let Some(learned) = &self.learned else { return self.other.clone() };
        if let Some(p) = learned.read().unwrap_or_else(PoisonError::into_inner).get(t) {
            return p.clone();
        }
        let Some(name) = std::str::from_utf8(t).ok().filter(|_| accepted) else { return self.other.clone() };
        let mut learned = learned.write().unwrap_or_else(PoisonError::into_inner);
        if learned.len() >= MAX_LEARNED_TYPES {
            return self.other.clone();
        }
        learned.entry(t.into()).or_insert_with(|| pair(&self.checks, name)).clone()
    }
}

impl PayloadContract for Metered {
    fn check(&self, event: Event<'_>, payload: &[u8]) -> Result<Checked, ContractError> {
        let outcome = self.inner.check(event, payload);
        let [valid, breach] = self.pair(event.event_type, outcome.is_ok());
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

    fn accepted_types_are_configured(&self) -> bool {
        self.inner.accepted_types_are_configured()
    }

    fn key(&self, topic: &str, key: &[u8]) -> Result<Option<bytes::Bytes>, ContractError> {
        self.inner.key(topic, key)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use service::telemetry::{Exposition, Health};

    use super::*;

    /// The contracts' series on an exposition of their own, as `walpost run` registers them.
    pub(super) fn metrics() -> (Exposition, ContractMetrics) {
        const TABLE: service::telemetry::MetricTable = &[
            ("walpost_contract_checks_total", "counter", "checks"),
            ("walpost_registry_requests_total", "counter", "requests"),
            ("walpost_registry_request_seconds", "histogram", "seconds"),
            ("walpost_registry_cache_lookups_total", "counter", "lookups"),
        ];
        let e =
            Exposition::new(Arc::new(Health::new(std::time::Duration::MAX, std::time::Duration::MAX)), TABLE).unwrap();
        let m = ContractMetrics {
            checks: e.counters("walpost_contract_checks_total", &["event_type", "result"]).unwrap(),
            registry_requests: e.counters("walpost_registry_requests_total", &["result"]).unwrap(),
            registry_seconds: e.latency_histogram("walpost_registry_request_seconds").unwrap(),
            registry_cache: e.counters("walpost_registry_cache_lookups_total", &["result"]).unwrap(),
        };
        (e, m)
    }

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
        let (exposition, metrics) = metrics();
        let metered = metrics.meter(&ContractRef(Arc::new(OnlyEmpty)));
        let event = |t: Option<&'static [u8]>| Event { event_type: t, topic: "t" };
        assert!(metered.0.check(event(Some(b"OrderPlaced")), b"{}").is_ok());
        assert!(metered.0.check(event(Some(b"OrderPlaced")), b"[]").is_err());
        assert!(metered.0.check(event(Some(b"OrderPlaced")), b"down").is_err(), "not counted: not checked");
        assert!(metered.0.check(event(Some(b"secret@example.com")), b"{}").is_ok());
        assert!(metered.0.check(event(None), b"[]").is_err());
        let text = exposition.encode();
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

#[cfg(test)]
mod learned_tests {
    #![allow(clippy::unwrap_used)]

    use super::tests::metrics;
    use super::*;

    /// A registry by event type: accepts `{}`, refuses the rest.
    struct ByEventType;
    impl PayloadContract for ByEventType {
        fn check(&self, _: Event<'_>, payload: &[u8]) -> Result<Checked, ContractError> {
            match payload {
                b"{}" => Ok(Checked::Encoded(bytes::Bytes::from_static(b"\0\0\0\0\x01{}"))),
                _ => {
                    Err(ContractError::Breach(router::Breach { schema: None, reason: router::BreachReason::NoSubject }))
                }
            }
        }
        fn describe(&self) -> String {
            "registry".into()
        }
        fn accepted_types_are_configured(&self) -> bool {
            true
        }
    }

    #[test]
    fn a_registrys_event_types_become_labels_once_accepted_and_at_most_the_limit() {
        let (exposition, metrics) = metrics();
        let metered = metrics.meter(&ContractRef(Arc::new(ByEventType)));
        let event = |t: &'static [u8]| Event { event_type: Some(t), topic: "t" };
        assert!(metered.0.check(event(b"Unregistered"), b"[]").is_err(), "refused before it was ever accepted");
        assert!(metered.0.check(event(b"OrderPlaced"), b"{}").is_ok());
        assert!(metered.0.check(event(b"OrderPlaced"), b"[]").is_err());
        let names: Vec<String> = (0..MAX_LEARNED_TYPES + 5).map(|i| format!("T{i}")).collect();
        for n in &names {
            let t: &'static [u8] = Box::leak(n.clone().into_bytes().into_boxed_slice());
            assert!(metered.0.check(event(t), b"{}").is_ok());
        }
        let text = exposition.encode();
        for line in [
            "walpost_contract_checks_total{event_type=\"OrderPlaced\",result=\"valid\"} 1",
            "walpost_contract_checks_total{event_type=\"OrderPlaced\",result=\"breach\"} 1",
            "walpost_contract_checks_total{event_type=\"(other)\",result=\"breach\"} 1",
            "walpost_contract_checks_total{event_type=\"(other)\",result=\"valid\"} 6",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
        assert!(!text.contains("Unregistered"), "a type no subject accepted is no label");
        let series = text.lines().filter(|l| l.starts_with("walpost_contract_checks_total{")).count();
        assert_eq!(series, 2 * (MAX_LEARNED_TYPES + 1), "OrderPlaced, 99 more and (other), valid and breach each");
    }
}
