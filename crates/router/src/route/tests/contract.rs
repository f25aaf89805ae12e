//! The contract hook: every path into a record asks the contract, with the payload bytes
//! before any envelope and the record's topic; a breach is a `ContractBroken` error
//! naming the event, an unreadable contract a `ContractUnavailable` one, and bytes the
//! contract encodes become the record's value.

use std::sync::{Arc, Mutex};

use super::*;
use crate::cloudevents::{CloudEventsConfig, CloudEventsMode};
use crate::{Breach, BreachReason, Checked, ContractError, ContractRef, Event, PayloadContract};

/// One question: the event type and the payload.
type Asked = (Option<Vec<u8>>, Vec<u8>);

/// Frames payloads as a registry would (a 0 byte, then the payload), or says it cannot.
struct Framing {
    available: bool,
    topics: Mutex<Vec<String>>,
}

impl PayloadContract for Framing {
    fn check(&self, event: Event<'_>, payload: &[u8]) -> Result<Checked, ContractError> {
        self.topics.lock().unwrap().push(event.topic.to_owned());
        if !self.available {
            return Err(ContractError::Unavailable("the registry at r does not answer".into()));
        }
        Ok(Checked::Encoded([&[0u8][..], payload].concat().into()))
    }

    fn describe(&self) -> String {
        "framing".into()
    }
}

/// Records what it was asked, and refuses payloads containing `"bad"`.
#[derive(Default)]
struct Recorder {
    asked: Mutex<Vec<Asked>>,
}

impl PayloadContract for Recorder {
    fn check(&self, event: Event<'_>, payload: &[u8]) -> Result<Checked, ContractError> {
        self.asked.lock().unwrap().push((event.event_type.map(<[u8]>::to_vec), payload.to_vec()));
        if payload.windows(5).any(|w| w == b"\"bad\"") {
            return Err(ContractError::Breach(Breach {
                schema: Some(Arc::from("OrderPlaced.json")),
                reason: BreachReason::Invalid {
                    pointer: "/state".into(),
                    keyword: "enum".into(),
                    schema_path: "/properties/state/enum".into(),
                },
            }));
        }
        Ok(Checked::Unchanged)
    }

    fn describe(&self) -> String {
        "a recorder".into()
    }
}

/// A contract that refuses every payload: with a schema (an `Invalid` breach) or
/// without (no schema for the event type).
pub(super) fn refusing(schema: Option<&'static str>) -> ContractRef {
    struct No(Option<&'static str>);
    impl PayloadContract for No {
        fn check(&self, _: Event<'_>, _: &[u8]) -> Result<Checked, ContractError> {
            Err(ContractError::Breach(match self.0 {
                Some(name) => Breach {
                    schema: Some(Arc::from(name)),
                    reason: BreachReason::Invalid {
                        pointer: "/email".into(),
                        keyword: "format".into(),
                        schema_path: "/x".into(),
                    },
                },
                None => Breach { schema: None, reason: BreachReason::NoContract },
            }))
        }
        fn describe(&self) -> String {
            "no".into()
        }
    }
    ContractRef(Arc::new(No(schema)))
}

/// A contract whose registry does not answer.
pub(super) fn unavailable() -> ContractRef {
    ContractRef(Arc::new(Framing { available: false, topics: Mutex::default() }))
}

fn with(recorder: &Arc<Recorder>, config: RouterConfig) -> Router {
    router(RouterConfig { contract: Some(ContractRef(recorder.clone())), ..config })
}

#[test]
fn every_payload_is_asked_with_its_event_type_and_a_breach_names_the_event() {
    let recorder = Arc::new(Recorder::default());
    let mut r = with(&recorder, RouterConfig::default());
    let rel = r.resolve(&relation(SEED_000)).unwrap();
    let good = r.route(&rel, &seed_row(text("order"), text("k"), text(r#"{"state": "new"}"#))).unwrap();
    assert_eq!(good.value.as_deref(), Some(&br#"{"state": "new"}"#[..]), "the payload is unchanged");
    let err = r.route(&rel, &seed_row(text("order"), text("k"), text(r#"{"state": "bad"}"#))).unwrap_err();
    assert_eq!(err.class(), "contract_broken");
    assert_eq!(err.event_id(), Some("42"));
    assert_eq!(
        err.to_string(),
        "event id 42 of events.outbox (event type OrderPlaced) breaks its contract: schema OrderPlaced.json refuses it: the value at /state fails \"enum\" (schema path /properties/state/enum): fix the producing service, or the schema if the event is right"
    );
    let asked = recorder.asked.lock().unwrap();
    assert_eq!(asked.len(), 2);
    assert_eq!(asked[0], (Some(b"OrderPlaced".to_vec()), br#"{"state": "new"}"#.to_vec()));
}

#[test]
fn tombstones_are_not_asked_and_envelopes_are_checked_by_their_payload() {
    let recorder = Arc::new(Recorder::default());
    let mut r = with(&recorder, RouterConfig { tombstone_on_empty_payload: true, ..RouterConfig::default() });
    let rel = r.resolve(&relation(SEED_000)).unwrap();
    let tombstone = r.route(&rel, &seed_row(text("order"), text("k"), ColumnValue::Null)).unwrap();
    assert!(tombstone.value.is_none());
    assert!(recorder.asked.lock().unwrap().is_empty(), "a tombstone has no payload to check");

    let ce = RouterConfig {
        cloudevents: Some(CloudEventsConfig { mode: CloudEventsMode::Structured, source: "/s".into() }),
        ..RouterConfig::default()
    };
    let mut r = with(&recorder, ce);
    let rel = r.resolve(&relation(SEED_000)).unwrap();
    let rec = r.route(&rel, &seed_row(text("order"), text("k"), text(r#"{"state": "new"}"#))).unwrap();
    assert!(rec.value.as_deref().unwrap().starts_with(b"{\"specversion\""), "a structured event");
    assert_eq!(recorder.asked.lock().unwrap()[0].1, br#"{"state": "new"}"#.to_vec(), "its data was checked");
    let err = r.route(&rel, &seed_row(text("order"), text("k"), text(r#"{"state": "bad"}"#))).unwrap_err();
    assert_eq!(err.class(), "contract_broken");
}

#[test]
fn table_less_messages_are_checked_too() {
    let recorder = Arc::new(Recorder::default());
    let mut r =
        with(&recorder, RouterConfig { event_type_header_field: Some("type".into()), ..RouterConfig::default() });
    let ok = Bytes::from_static(
        br#"{"id": 1, "aggregate_type": "order", "aggregate_id": "o", "type": "T", "payload": {"state": "new"}}"#,
    );
    assert!(r.route_json(&ok, "message prefix outbox", None).is_ok());
    let bad = Bytes::from_static(
        br#"{"id": 2, "aggregate_type": "order", "aggregate_id": "o", "type": "T", "payload": {"state": "bad"}}"#,
    );
    let err = r.route_json(&bad, "message prefix outbox", None).unwrap_err();
    assert!(
        err.to_string().starts_with("event id 2 of message prefix outbox (event type T) breaks its contract"),
        "{err}"
    );
    assert_eq!(recorder.asked.lock().unwrap()[0], (Some(b"T".to_vec()), br#"{"state": "new"}"#.to_vec()));
}

#[test]
fn an_encoded_payload_is_the_value_and_an_unreadable_contract_is_unavailable() {
    let framing = Arc::new(Framing { available: true, topics: Mutex::default() });
    let mut r = router(RouterConfig { contract: Some(ContractRef(framing.clone())), ..RouterConfig::default() });
    let rel = r.resolve(&relation(SEED_000)).unwrap();
    let rec = r.route(&rel, &seed_row(text("order"), text("k"), text(r#"{"state": "new"}"#))).unwrap();
    assert_eq!(rec.value.as_deref(), Some(&b"\0{\"state\": \"new\"}"[..]));
    assert_eq!(framing.topics.lock().unwrap().as_slice(), [rec.topic.to_string()], "asked with the record's topic");
    let json = Bytes::from_static(br#"{"id": 1, "aggregate_type": "order", "aggregate_id": "o", "payload": {"a": 1}}"#);
    let message = r.route_json(&json, "message prefix outbox", None).unwrap();
    assert_eq!(message.value.as_deref(), Some(&b"\0{\"a\": 1}"[..]), "a table-less message too");

    let down = Arc::new(Framing { available: false, topics: Mutex::default() });
    let mut r = router(RouterConfig { contract: Some(ContractRef(down)), ..RouterConfig::default() });
    let rel = r.resolve(&relation(SEED_000)).unwrap();
    let err = r.route(&rel, &seed_row(text("order"), text("k"), text("{}"))).unwrap_err();
    assert_eq!(err.class(), "contract_unavailable");
    assert_eq!(err.event_id(), Some("42"));
    assert_eq!(
        err.to_string(),
        "cannot check event id 42 of events.outbox against its contract now: the registry at r does not answer"
    );
}

/// Writes keys as a registry would (a 1 byte, then the key), refuses the key `bad`, and
/// leaves payloads unchanged.
struct KeyFraming;

impl PayloadContract for KeyFraming {
    fn check(&self, _: Event<'_>, _: &[u8]) -> Result<Checked, ContractError> {
        Ok(Checked::Unchanged)
    }

    fn key(&self, topic: &str, key: &[u8]) -> Result<Option<Bytes>, ContractError> {
        if key == b"bad" {
            return Err(ContractError::Breach(Breach {
                schema: Some(Arc::from(format!("subject {topic}-key version 1 (id 9)"))),
                reason: BreachReason::BadKey { reason: "the value at the key itself fails \"pattern\"".into() },
            }));
        }
        Ok(Some([&[1u8][..], key].concat().into()))
    }

    fn describe(&self) -> String {
        "key framing".into()
    }
}

#[test]
fn keys_are_written_by_the_contract_for_every_record_and_a_refused_key_names_its_schema() {
    let config = RouterConfig {
        contract: Some(ContractRef(Arc::new(KeyFraming))),
        tombstone_on_empty_payload: true,
        ..RouterConfig::default()
    };
    let mut r = router(config);
    let rel = r.resolve(&relation(SEED_000)).unwrap();
    let rec = r.route(&rel, &seed_row(text("order"), text("k"), text("{}"))).unwrap();
    assert_eq!(rec.key.as_ref(), b"\x01k");
    assert_eq!(rec.value.as_deref(), Some(&b"{}"[..]), "the payload is left to check()");
    let tombstone = r.route(&rel, &seed_row(text("order"), text("k"), ColumnValue::Null)).unwrap();
    assert_eq!(tombstone.key.as_ref(), b"\x01k", "a tombstone's key has the same form");
    let json = Bytes::from_static(br#"{"id": 1, "aggregate_type": "order", "aggregate_id": "o", "payload": {}}"#);
    assert_eq!(r.route_json(&json, "message prefix outbox", None).unwrap().key.as_ref(), b"\x01o");

    let err = r.route(&rel, &seed_row(text("order"), text("bad"), text("{}"))).unwrap_err();
    assert_eq!(err.class(), "contract_broken");
    assert_eq!(
        err.to_string(),
        format!("event id 42 of events.outbox breaks its contract: the key schema subject {}-key version 1 (id 9) refuses the record's key (the aggregate id): the value at the key itself fails \"pattern\": fix the producing service's aggregate id, or the key schema", rec.topic)
    );
    assert!(!err.to_string().contains("bad\""), "never the key itself");
}

/// Regression: a breach's dead letter had no topic and none of the record's headers
/// (`id`, `eventType`); the record routed without the contract has them all, and the
/// plain payload and key, not a contract's encoding.
#[test]
fn regression_a_breach_routed_unchecked_is_the_record_it_would_have_been() {
    let recorder = Arc::new(Recorder::default());
    let mut r = with(&recorder, RouterConfig::default());
    let rel = r.resolve(&relation(SEED_000)).unwrap();
    let row = seed_row(text("order"), text("k"), text(r#"{"state": "bad"}"#));
    assert_eq!(r.route(&rel, &row).unwrap_err().class(), "contract_broken");
    let original = r.route_unchecked(&rel, &row).unwrap();
    assert_eq!(&*original.topic, "outbox.event.order");
    assert_eq!(original.key, Bytes::from_static(b"k"));
    assert_eq!(header(&original, "id"), Some(&b"42"[..]));
    assert_eq!(header(&original, "eventType"), Some(&b"OrderPlaced"[..]));
    assert_eq!(original.value.as_deref(), Some(&br#"{"state": "bad"}"#[..]));
    assert_eq!(r.route(&rel, &row).unwrap_err().class(), "contract_broken", "the contract is back");

    let mut r = router(RouterConfig { contract: Some(ContractRef(Arc::new(KeyFraming))), ..RouterConfig::default() });
    let rel = r.resolve(&relation(SEED_000)).unwrap();
    let row = seed_row(text("order"), text("bad"), text("{}"));
    assert_eq!(r.route(&rel, &row).unwrap_err().class(), "contract_broken");
    assert_eq!(r.route_unchecked(&rel, &row).unwrap().key, Bytes::from_static(b"bad"), "the key as written");

    let recorder = Arc::new(Recorder::default());
    let mut r =
        with(&recorder, RouterConfig { event_type_header_field: Some("type".into()), ..RouterConfig::default() });
    let bad = Bytes::from_static(
        br#"{"id": 2, "aggregate_type": "order", "aggregate_id": "o", "type": "T", "payload": {"state": "bad"}}"#,
    );
    assert!(r.route_json(&bad, "message prefix outbox", None).is_err());
    let original = r.route_json_unchecked(&bad, "message prefix outbox", None).unwrap();
    assert_eq!(&*original.topic, "outbox.event.order");
    assert_eq!(header(&original, "id"), Some(&b"2"[..]));
    assert_eq!(header(&original, "eventType"), Some(&b"T"[..]));
}
