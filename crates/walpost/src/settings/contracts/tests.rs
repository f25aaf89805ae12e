#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

fn dir_with(files: &[(&str, &str)]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("walpost-contracts-{}-{}", std::process::id(), files.len()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
    }
    dir
}

#[test]
fn a_directory_and_a_mapping_become_one_set_of_contracts() {
    let dir = dir_with(&[
        ("OrderPlaced.json", r#"{"type": "object"}"#),
        ("README.md", "not a schema"),
        ("v2.json", r#"{"required": ["a"]}"#),
    ]);
    let f = ContractsFile {
        dir: Some(dir.clone()),
        unknown: Some(UnknownEventType::Refuse),
        schemas: BTreeMap::from([("order.shipped".to_owned(), PathBuf::from("v2.json"))]),
        value_format: None,
        key_format: None,
        max_depth: None,
    };
    let c = resolve_contracts(&f).unwrap().expect("contracts");
    let check = |t: &'static [u8]| c.0.check(router::Event { event_type: Some(t), topic: "t" }, b"{}");
    assert_eq!(check(b"OrderPlaced"), Ok(router::Checked::Unchanged));
    assert!(check(b"order.shipped").is_err(), "the mapped file, relative to dir");
    let Err(router::ContractError::Breach(v2)) = check(b"v2") else { panic!("a breach") };
    assert!(v2.schema.is_some_and(|s| s.ends_with("v2.json")), "the file is also v2's by its name");
    assert!(check(b"Other").is_err(), "unknown = refuse");
    assert!(c.0.describe().contains("3 event types"), "{}", c.0.describe());
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn every_router_gets_the_contracts_and_each_needs_an_event_type() {
    use crate::settings::{FileConfig, Overrides, Settings};
    let dir = dir_with(&[("A.json", "{}"), ("B.json", "{}")]);
    let o = Overrides {
        postgres: Some("postgres://u@h/d".into()),
        kafka_brokers: Some("k:1".into()),
        contracts_dir: Some(dir.clone()),
        ..Overrides::default()
    };
    let two = "[[outbox]]\ntable = \"events.more\"\n";
    let s = Settings::resolve(&o, FileConfig::parse(two).unwrap()).unwrap();
    assert!(s.source.outboxes.iter().all(|o| o.router.contract.is_some()), "{:?}", s.source.outboxes);
    assert_eq!(s.source.outboxes.len(), 2);
    let untyped = "[router]\n\"table.field.event.type.header\" = \"\"\n";
    let e = Settings::resolve(&o, FileConfig::parse(untyped).unwrap()).unwrap_err().to_string();
    assert_eq!(
        e,
        "[contracts] needs each event's type, but events.outbox has none: set table.field.event.type.header to its event type column"
    );
    let none = Overrides { contracts_dir: None, ..o };
    let s = Settings::resolve(&none, FileConfig::parse(untyped).unwrap()).unwrap();
    assert!(s.source.router().contract.is_none());
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn nothing_configured_is_no_contract_and_mistakes_name_the_key_or_file() {
    assert!(resolve_contracts(&ContractsFile::default()).unwrap().is_none());
    let lonely = ContractsFile { unknown: Some(UnknownEventType::Refuse), ..ContractsFile::default() };
    assert!(resolve_contracts(&lonely).unwrap_err().to_string().contains("contracts.unknown"));
    let missing = ContractsFile { dir: Some("/nonexistent/contracts".into()), ..Default::default() };
    let e = resolve_contracts(&missing).unwrap_err().to_string();
    assert!(e.starts_with("contracts: cannot read /nonexistent/contracts: "), "{e}");
    let dir = dir_with(&[("Bad.json", r#"{"type": 7}"#)]);
    let bad = ContractsFile { dir: Some(dir.clone()), ..Default::default() };
    let e = resolve_contracts(&bad).unwrap_err().to_string();
    assert!(e.contains("Bad.json: not a valid JSON Schema"), "{e}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_registry_format_needs_a_url_and_refuses_what_cannot_be_framed() {
    use crate::settings::{FileConfig, Overrides, Settings};
    let o = Overrides {
        postgres: Some("postgres://u@h/d".into()),
        kafka_brokers: Some("k:1".into()),
        ..Overrides::default()
    };
    let resolve = |text: &str| Settings::resolve(&o, FileConfig::parse(text).unwrap()).map_err(|e| e.to_string());
    let ok = resolve(
        "[contracts]\nvalue_format = \"avro\"\n[registry]\nurl = \"http://r:8081/apis/ccompat/v7/\"\ncache_ttl = \"2s\"\nsubject_strategy = \"topic_record_name\"\n[registry.versions]\n\"A\" = 3\n",
    )
    .unwrap();
    let r = ok.registry.expect("registry settings");
    assert_eq!(r.url, "http://r:8081/apis/ccompat/v7");
    assert_eq!(r.options.ttl, Duration::from_secs(2));
    assert_eq!(r.options.strategy, SubjectStrategy::TopicRecordName);
    assert_eq!(r.options.pinned.get("A"), Some(&3));
    assert_eq!(r.auth, RegistryAuth::None);
    assert!(resolve("").unwrap().registry.is_none(), "json by default: no registry");
    assert_eq!(r.options.key_format, None, "string keys by default");
    let keyed =
        resolve("[contracts]\nvalue_format = \"json-schema\"\nkey_format = \"avro\"\n[registry]\nurl = \"http://r\"\n");
    assert_eq!(keyed.unwrap().registry.unwrap().options.key_format, Some(Format::Avro));
    let refused = [
        ("[contracts]\nkey_format = \"avro\"\n[registry]\nurl = \"http://r\"\n", "string unless contracts.value_format is json-schema or avro"),
        ("[contracts]\nvalue_format = \"avro\"\n", "json unless [registry] url"),
        ("[registry]\nurl = \"http://r\"\n", "a registry only with contracts.value_format"),
        ("[contracts]\nvalue_format = \"avro\"\ndir = \"/x\"\n[registry]\nurl = \"http://r\"\n", "not both"),
        ("envelope = \"cloudevents\"\n[contracts]\nvalue_format = \"avro\"\n[registry]\nurl = \"http://r\"\n", "a registry's record is the payload alone"),
        ("[contracts]\nvalue_format = \"avro\"\n[registry]\nurl = \"http://u:pw@r\"\n", "registry.url holds credentials"),
        ("[contracts]\nvalue_format = \"avro\"\n[registry]\nurl = \"http://r\"\nusername = \"u\"\n", "without a password"),
        ("[contracts]\nvalue_format = \"avro\"\n[registry]\nurl = \"http://r\"\nsubject_strategy = \"x\"\n", "record_name, topic_name or topic_record_name"),
        ("[router]\n\"table.field.event.type.header\" = \"\"\n[contracts]\nvalue_format = \"avro\"\n[registry]\nurl = \"http://r\"\n", "or use topic_name"),
    ];
    for (text, expected) in refused {
        let e = resolve(text).unwrap_err();
        assert!(e.contains(expected), "{text}: {e}");
        assert!(!e.contains("pw@"), "{e}");
    }
    let basic = RegistryAuth::Basic { username: "u".into(), password: "s3cret".into() };
    assert_eq!(format!("{basic:?}"), "Basic(u, ***)");
}

#[test]
fn regression_credentials_over_plain_http_to_another_host_are_refused_unless_allowed() {
    let env = |k: &str| (k == REGISTRY_PASSWORD_ENV).then(|| "s3cret".to_owned());
    let file = |url: &str, allow: Option<bool>| RegistryFile {
        url: Some(url.into()),
        username: Some("walpost".into()),
        allow_plaintext_credentials: allow,
        ..RegistryFile::default()
    };
    let e = registry_settings(&file("http://registry.internal:8081", None), None, Format::Avro, &env)
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "[registry] has credentials (username or token), but registry.url is plain http:// to registry.internal:8081, where anyone on the network path could read them: use an https:// registry URL (registry.ca for its CA), or set registry.allow_plaintext_credentials = true to send them anyway"
    );
    let token = |k: &str| (k == REGISTRY_TOKEN_ENV).then(|| "t0ken".to_owned());
    let bearer = RegistryFile { url: Some("http://10.0.0.7".into()), ..RegistryFile::default() };
    assert!(registry_settings(&bearer, None, Format::Avro, &token).is_err(), "a token too");
    // Allowed explicitly, or this machine (a warning), or https, or no credentials.
    for (url, allow) in [
        ("http://registry.internal:8081", Some(true)),
        ("http://127.0.0.1:8081", None),
        ("http://localhost/apis/ccompat/v7", None),
        ("http://[::1]:8081", None),
        ("https://registry.internal", None),
    ] {
        let s = registry_settings(&file(url, allow), None, Format::Avro, &env).unwrap();
        assert!(matches!(s.auth, RegistryAuth::Basic { .. }), "{url}");
    }
    let anonymous = RegistryFile { url: Some("http://registry.internal".into()), ..RegistryFile::default() };
    assert!(registry_settings(&anonymous, None, Format::Avro, &env).is_ok());
    let refused = registry_settings(&file("http://registry.internal", Some(false)), None, Format::Avro, &env);
    assert!(refused.is_err());
}

#[test]
fn max_depth_and_max_response_bytes_have_defaults_and_bounds() {
    let env = |_: &str| None;
    let r = RegistryFile { url: Some("http://r".into()), ..RegistryFile::default() };
    assert_eq!(registry_settings(&r, None, Format::Avro, &env).unwrap().max_response_bytes, 8 << 20);
    let small = RegistryFile { max_response_bytes: Some(65_536), ..r.clone() };
    assert_eq!(registry_settings(&small, None, Format::Avro, &env).unwrap().max_response_bytes, 65_536);
    let tiny = RegistryFile { max_response_bytes: Some(10), ..r };
    let e = registry_settings(&tiny, None, Format::Avro, &env).unwrap_err().to_string();
    assert!(e.contains("registry.max_response_bytes") && e.contains("at least 1024"), "{e}");
    assert_eq!(ContractsFile::default().limits().unwrap(), Limits { max_depth: 32 });
    let deeper = ContractsFile { max_depth: Some(64), ..ContractsFile::default() };
    assert_eq!(deeper.limits().unwrap(), Limits { max_depth: 64 });
    for bad in [0, 129] {
        let f = ContractsFile { max_depth: Some(bad), ..ContractsFile::default() };
        assert!(f.limits().unwrap_err().to_string().contains("from 1 to 128"), "{bad}");
    }
    let dir = dir_with(&[("T.json", "{}"), ("a.txt", "x"), ("b.txt", "x"), ("c.txt", "x")]); // Four: a name of its own.
    let shallow = ContractsFile { dir: Some(dir.clone()), max_depth: Some(2), ..ContractsFile::default() };
    let c = resolve_contracts(&shallow).unwrap().unwrap();
    let check = |p: &[u8]| c.0.check(router::Event { event_type: Some(b"T"), topic: "t" }, p);
    assert!(check(br#"{"a": {}}"#).is_ok());
    let Err(router::ContractError::Breach(b)) = check(br#"{"a": {"b": []}}"#) else { panic!("a breach") };
    assert_eq!(b.reason, router::BreachReason::TooDeep { limit: 2 });
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn contracts_max_depth_comes_from_the_flag_over_the_file() {
    use crate::settings::{FileConfig, Overrides, Settings};
    let dir = dir_with(&[("T.json", "{}"), ("a.txt", ""), ("b.txt", ""), ("c.txt", ""), ("d.txt", "")]);
    let o = Overrides {
        postgres: Some("postgres://u@h/d".into()),
        kafka_brokers: Some("k:1".into()),
        contracts_dir: Some(dir.clone()),
        contracts_max_depth: Some(3),
        ..Overrides::default()
    };
    let s = Settings::resolve(&o, FileConfig::parse("[contracts]\nmax_depth = 1\n").unwrap()).unwrap();
    let c = s.source.router().contract.clone().unwrap();
    let check = |p: &[u8]| c.0.check(router::Event { event_type: Some(b"T"), topic: "t" }, p);
    assert!(check(br#"{"a": {"b": {}}}"#).is_ok(), "3 levels: the flag's 3, not the file's 1");
    assert!(check(br#"{"a": {"b": {"c": []}}}"#).is_err());
    let zero = Overrides { contracts_max_depth: Some(0), ..o };
    let e = Settings::resolve(&zero, FileConfig::default()).unwrap_err().to_string();
    assert!(e.contains("contracts.max_depth") && e.contains("from 1 to 128"), "{e}");
    std::fs::remove_dir_all(dir).unwrap();
}
