#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;

/// A registry in memory that can be switched off; counts its fetches.
#[derive(Default)]
struct Memory {
    subjects: Mutex<HashMap<String, Registered>>,
    down: std::sync::atomic::AtomicBool,
    fetches: AtomicUsize,
}

impl Memory {
    fn put(&self, subject: &str, id: u32, schema_type: &str, schema: &str) {
        let r = Registered {
            id,
            version: i32::try_from(id).unwrap(),
            schema_type: schema_type.into(),
            schema: schema.into(),
            references: 0,
        };
        self.subjects.lock().unwrap().insert(subject.into(), r);
    }
}

impl SchemaSource for Arc<Memory> {
    fn fetch(&self, subject: &str, _: Option<i32>) -> Result<Fetched, String> {
        self.fetches.fetch_add(1, Ordering::SeqCst);
        if self.down.load(Ordering::SeqCst) {
            return Err("the registry at mem does not answer".into());
        }
        Ok(self.subjects.lock().unwrap().get(subject).cloned().map_or(Fetched::Missing, Fetched::Found))
    }
    fn describe(&self) -> String {
        "mem".into()
    }
}

fn contracts(memory: &Arc<Memory>, format: Format, strategy: SubjectStrategy, ttl: Duration) -> RegistryContracts {
    let options = RegistryOptions {
        format,
        strategy,
        pinned: HashMap::new(),
        ttl,
        max_subjects: 2,
        key_format: None,
        limits: Limits::default(),
    };
    RegistryContracts::new(Arc::new(memory.clone()), options)
}

fn event<'a>(event_type: &'a str, topic: &'a str) -> Event<'a> {
    Event { event_type: Some(event_type.as_bytes()), topic }
}

const AMOUNT: &str = r#"{"type": "object", "required": ["amount"], "properties": {"amount": {"type": "integer"}}}"#;

#[test]
fn subjects_follow_the_strategies() {
    assert_eq!(SubjectStrategy::TopicName.subject("orders", None).as_deref(), Some("orders-value"));
    assert_eq!(SubjectStrategy::RecordName.subject("orders", Some(b"OrderPlaced")).as_deref(), Some("OrderPlaced"));
    assert_eq!(SubjectStrategy::RecordName.subject("orders", None), None);
    assert_eq!(
        SubjectStrategy::TopicRecordName.subject("orders", Some(b"OrderPlaced")).as_deref(),
        Some("orders-OrderPlaced")
    );
}

#[test]
fn json_schema_frames_valid_payloads_and_refuses_the_rest_by_pointer() {
    let m = Arc::new(Memory::default());
    m.put("OrderPlaced", 7, "JSON", AMOUNT);
    let c = contracts(&m, Format::JsonSchema, SubjectStrategy::RecordName, Duration::from_secs(60));
    let framed = c.check(event("OrderPlaced", "t"), br#"{"amount": 5}"#).unwrap();
    assert_eq!(framed, Checked::Encoded(Bytes::from_static(b"\0\0\0\0\x07{\"amount\": 5}")));
    let ContractError::Breach(b) = c.check(event("OrderPlaced", "t"), br#"{"amount": "SECRET"}"#).unwrap_err() else {
        panic!("a breach")
    };
    assert_eq!(
        b.to_string(),
        "schema subject OrderPlaced version 7 (id 7) refuses it: the value at /amount fails \"type\" (schema path /properties/amount/type): fix the producing service, or the schema if the event is right"
    );
    let ContractError::Breach(missing) = c.check(event("Other", "t"), b"{}").unwrap_err() else { panic!() };
    assert_eq!(
        missing.to_string(),
        "the schema registry has no subject Other: register the schema (walpost contracts push), or fix the subject strategy"
    );
    let untyped = c.check(Event { event_type: None, topic: "t" }, b"{}").unwrap_err();
    assert!(matches!(untyped, ContractError::Breach(Breach { reason: BreachReason::NoEventType, .. })));
    assert_eq!(m.fetches.load(Ordering::SeqCst), 2, "one fetch per subject, the missing one cached too");
}

#[test]
fn avro_writes_the_binary_after_the_header_and_a_json_subject_is_the_wrong_kind() {
    let m = Arc::new(Memory::default());
    m.put(
        "orders-value",
        3,
        "AVRO",
        r#"{"type": "record", "name": "O", "fields": [{"name": "amount", "type": "int"}]}"#,
    );
    m.put("json-value", 4, "JSON", AMOUNT);
    let c = contracts(&m, Format::Avro, SubjectStrategy::TopicName, Duration::from_secs(60));
    let framed = c.check(event("X", "orders"), br#"{"amount": -3}"#).unwrap();
    assert_eq!(framed, Checked::Encoded(Bytes::from_static(b"\0\0\0\0\x03\x05")));
    let ContractError::Breach(b) = c.check(event("X", "orders"), br#"{"amount": "SECRET"}"#).unwrap_err() else {
        panic!()
    };
    assert_eq!(
        b.to_string(),
        "the Avro schema of subject orders-value version 3 (id 3) cannot hold it: the value at /amount is not an int: fix the producing service, or the schema if the event is right"
    );
    let ContractError::Breach(kind) = c.check(event("X", "json"), b"{}").unwrap_err() else { panic!() };
    assert_eq!(
        kind.to_string(),
        "subject json-value version 4 (id 4) holds a JSON schema, but contracts.value_format needs schemaType AVRO: register such a schema under it, or change the format"
    );
    let ContractError::Breach(json) = c.check(event("X", "orders"), b"{not json").unwrap_err() else { panic!() };
    assert!(matches!(json.reason, BreachReason::NotJson { line: 1, column: 2 }), "{json:?}");
}

#[test]
fn an_outage_stops_new_subjects_only_and_a_new_version_is_used_after_the_ttl() {
    let m = Arc::new(Memory::default());
    m.put("A", 1, "JSON", AMOUNT);
    m.put("B", 2, "JSON", "{}");
    let c = contracts(&m, Format::JsonSchema, SubjectStrategy::RecordName, Duration::from_millis(50));
    assert!(c.check(event("A", "t"), br#"{"amount": 1}"#).is_ok());
    m.down.store(true, Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(60));
    assert!(c.check(event("A", "t"), br#"{"amount": 1}"#).is_ok(), "the stale schema stays in use");
    assert_eq!(
        c.check(event("B", "t"), b"{}").unwrap_err(),
        ContractError::Unavailable("the registry at mem does not answer".into())
    );
    m.down.store(false, Ordering::SeqCst);
    m.put("A", 5, "JSON", "{}");
    std::thread::sleep(Duration::from_millis(60));
    let framed = c.check(event("A", "t"), br#"{"amount": "now free"}"#).unwrap();
    let Checked::Encoded(bytes) = framed else { panic!() };
    assert_eq!(&bytes[..5], b"\0\0\0\0\x05", "the new version's id");
}

#[test]
fn keys_are_written_by_the_topics_key_subject_as_a_string_or_a_number() {
    let m = Arc::new(Memory::default());
    m.put("orders-key", 11, "AVRO", r#""string""#);
    m.put("ids-key", 12, "AVRO", r#""long""#);
    m.put("typed-key", 13, "JSON", r#"{"type": "string", "pattern": "^o-"}"#);
    m.put("numbers-key", 14, "JSON", r#"{"type": "integer"}"#);
    m.put("orders-value", 3, "AVRO", r#""string""#);
    let options = |key_format| RegistryOptions {
        format: Format::Avro,
        strategy: SubjectStrategy::TopicName,
        pinned: HashMap::new(),
        ttl: Duration::from_secs(60),
        max_subjects: 100,
        key_format,
        limits: Limits::default(),
    };
    let plain = RegistryContracts::new(Arc::new(m.clone()), options(None));
    assert_eq!(plain.key("orders", b"o-1").unwrap(), None, "key_format string: the key unchanged");
    let avro = RegistryContracts::new(Arc::new(m.clone()), options(Some(Format::Avro)));
    // Avro string: zig-zag length 3 (6), then the bytes.
    assert_eq!(avro.key("orders", b"o-1").unwrap().unwrap(), Bytes::from_static(b"\0\0\0\0\x0b\x06o-1"));
    assert_eq!(avro.key("ids", b"-2").unwrap().unwrap(), Bytes::from_static(b"\0\0\0\0\x0c\x03"), "a long key");
    let ContractError::Breach(b) = avro.key("ids", b"o-SECRET").unwrap_err() else { panic!() };
    assert_eq!(
        b.to_string(),
        "the key schema subject ids-key version 12 (id 12) refuses the record's key (the aggregate id): it is not a long: fix the producing service's aggregate id, or the key schema"
    );
    let ContractError::Breach(missing) = avro.key("nothing", b"k").unwrap_err() else { panic!() };
    assert!(matches!(missing.reason, BreachReason::NoSubject), "{missing:?}");
    let json = RegistryContracts::new(Arc::new(m.clone()), options(Some(Format::JsonSchema)));
    assert_eq!(json.key("typed", b"o-1").unwrap().unwrap(), Bytes::from_static(b"\0\0\0\0\x0d\"o-1\""));
    assert_eq!(json.key("numbers", b"42").unwrap().unwrap(), Bytes::from_static(b"\0\0\0\0\x0e42"));
    let ContractError::Breach(b) = json.key("typed", b"SECRET").unwrap_err() else { panic!() };
    assert_eq!(
        b.to_string(),
        "the key schema subject typed-key version 13 (id 13) refuses the record's key (the aggregate id): it fails \"pattern\" (schema path /pattern): fix the producing service's aggregate id, or the key schema"
    );
    let ContractError::Breach(kind) = json.key("orders", b"o-1").unwrap_err() else { panic!() };
    assert!(kind.to_string().contains("but contracts.key_format needs schemaType JSON"), "{kind}");
    assert!(avro.check(event("X", "orders"), br#""v""#).is_ok(), "values and keys are cached apart");
}

#[test]
fn the_cache_keeps_at_most_max_subjects() {
    let m = Arc::new(Memory::default());
    for (i, s) in ["A", "B", "C"].into_iter().enumerate() {
        m.put(s, u32::try_from(i).unwrap() + 1, "JSON", "{}");
    }
    let hits = Arc::new(AtomicUsize::new(0));
    let seen = hits.clone();
    let c =
        contracts(&m, Format::JsonSchema, SubjectStrategy::RecordName, Duration::from_secs(60)).observed(move |l| {
            if l == Lookup::Hit {
                seen.fetch_add(1, Ordering::SeqCst);
            }
        });
    for s in ["A", "B", "C", "C", "A"] {
        c.check(event(s, "t"), b"{}").unwrap();
    }
    assert_eq!(c.cache.lock().unwrap().len(), 2);
    assert_eq!(hits.load(Ordering::SeqCst), 1, "C once; A had gone first");
    assert_eq!(m.fetches.load(Ordering::SeqCst), 4);
}

#[test]
fn hostile_schemas_and_payloads_are_breaches_within_the_limits() {
    let m = Arc::new(Memory::default());
    let cyclic = r#"{"type":"record","name":"R","fields":[{"name":"f","type":["R",{"type":"map","values":"int"}],"default":{}}]}"#;
    m.put("cyclic-value", 1, "AVRO", cyclic);
    m.put("any-value", 2, "AVRO", r#"{"type": "map", "values": ["null", "int", {"type": "map", "values": "int"}]}"#);
    let c = contracts(&m, Format::Avro, SubjectStrategy::TopicName, Duration::from_secs(60));
    let ContractError::Breach(b) = c.check(event("X", "cyclic"), b"{}").unwrap_err() else { panic!() };
    assert_eq!(b.reason, BreachReason::NotAvro { pointer: "/f".into(), reason: crate::avro::TOO_DEEP });
    let deep = format!("{}{{}}{}", r#"{"a":"#.repeat(32), "}".repeat(32));
    let ContractError::Breach(b) = c.check(event("X", "any"), deep.as_bytes()).unwrap_err() else { panic!() };
    assert_eq!(b.reason, BreachReason::TooDeep { limit: 32 });
    let json = Arc::new(Memory::default());
    json.put("T", 3, "JSON", crate::tests::TWO_KINDS);
    let c = contracts(&json, Format::JsonSchema, SubjectStrategy::RecordName, Duration::from_secs(60));
    let payload = crate::tests::nested_c(22);
    let ContractError::Breach(b) = c.check(event("T", "t"), payload.as_bytes()).unwrap_err() else { panic!() };
    assert_eq!(b.reason, BreachReason::TooCostly { steps: Limits::steps_for(payload.len()) });
}
