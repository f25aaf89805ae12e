//! `[contracts]`: a JSON Schema per event type, checked on every payload before it
//! reaches Kafka (issue 31; the checking is the `contracts` crate's, run by the router).
//!
//! ```toml
//! [contracts]
//! dir = "/etc/walpost/contracts"   # <event type>.json, one per event type
//! unknown = "allow"                # or "refuse": an event type without a schema
//! [contracts.schemas]              # beside the directory's: event type = file
//! "order.placed" = "orders/placed-v2.json"   # relative to dir, or absolute
//! ```
//!
//! Invariants: the schemas are read and built once, when the settings are resolved, so
//! a file that is not a schema stops walpost (and `walpost check`) before any event is
//! read; every outbox table and the table-less outbox share one set of contracts, keyed
//! by the event type (`table.field.event.type.header`'s column), which they must have.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use contracts::{Contracts, SchemaText, Unknown};
use router::ContractRef;
use serde::{Deserialize, Serialize};

use super::{ConfigError, SourceSettings};

/// `[contracts]` as the file (and `--contracts-dir`, `--contracts-unknown`) give it.
#[derive(Debug, Default, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ContractsFile {
    /// A directory of `<event type>.json` files.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dir: Option<PathBuf>,
    /// `allow` (default) or `refuse` an event whose type has no schema.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unknown: Option<String>,
    /// Event type -> schema file, beside (or instead of) the directory's files.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub schemas: BTreeMap<String, PathBuf>,
}

impl ContractsFile {
    pub(crate) fn is_empty(&self) -> bool {
        self.dir.is_none() && self.unknown.is_none() && self.schemas.is_empty()
    }
}

/// Gives every router of `source` the contracts of `f`, if any; each must have an event
/// type column, since the event type picks the schema.
pub(crate) fn attach(f: &ContractsFile, source: &mut SourceSettings) -> Result<(), ConfigError> {
    let Some(contract) = resolve_contracts(f)? else {
        return Ok(());
    };
    let untyped =
        source.outboxes.iter().find(|o| o.router.event_type_header_field.is_none()).map(|o| o.table.to_string());
    let untyped = untyped.or_else(|| {
        source.messages.as_ref().filter(|m| m.router.event_type_header_field.is_none()).map(|_| "[messages]".to_owned())
    });
    if let Some(table) = untyped {
        return Err(ConfigError::Option(format!(
            "[contracts] needs each event's type, but {table} has none: set {} to its event type column",
            router::EVENT_TYPE_HEADER_OPTION
        )));
    }
    for router in source.routers_mut() {
        router.contract = Some(contract.clone());
    }
    Ok(())
}

/// Reads and builds the contracts; `None` when none are configured.
pub(crate) fn resolve_contracts(f: &ContractsFile) -> Result<Option<ContractRef>, ConfigError> {
    let unknown = match f.unknown.as_deref() {
        None | Some("allow") => Unknown::Allow,
        Some("refuse") => Unknown::Refuse,
        Some(other) => {
            return Err(ConfigError::Invalid {
                key: "contracts.unknown",
                value: other.into(),
                expected: "allow or refuse",
            })
        }
    };
    if f.dir.is_none() && f.schemas.is_empty() {
        if f.unknown.is_some() {
            return Err(ConfigError::Invalid {
                key: "contracts.unknown",
                value: f.unknown.clone().unwrap_or_default(),
                expected: "a setting beside contracts.dir or [contracts.schemas], which hold the schemas",
            });
        }
        return Ok(None);
    }
    let mut texts = Vec::new();
    let mut origin = Vec::new();
    if let Some(dir) = &f.dir {
        origin.push(dir.display().to_string());
        let entries = std::fs::read_dir(dir).map_err(|e| contract_error(dir, &e.to_string()))?;
        let mut files: Vec<PathBuf> = Vec::new();
        for entry in entries {
            let path = entry.map_err(|e| contract_error(dir, &e.to_string()))?.path();
            if path.extension().is_some_and(|e| e == "json") && path.is_file() {
                files.push(path);
            }
        }
        files.sort();
        for path in files {
            let event_type = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            if f.schemas.contains_key(&event_type) {
                continue; // [contracts.schemas] names this event type's file itself.
            }
            texts.push(read_schema(event_type, &path)?);
        }
    }
    for (event_type, file) in &f.schemas {
        let path = match &f.dir {
            Some(dir) if file.is_relative() => dir.join(file),
            _ => file.clone(),
        };
        texts.push(read_schema(event_type.clone(), &path)?);
    }
    if !f.schemas.is_empty() {
        origin.push("[contracts.schemas]".into());
    }
    let built = Contracts::new(texts, unknown, origin.join(" and "))
        .map_err(|e| ConfigError::Option(format!("{e} (see docs/contracts.md)")))?;
    Ok(Some(ContractRef(Arc::new(built))))
}

fn read_schema(event_type: String, path: &Path) -> Result<SchemaText, ConfigError> {
    let text = std::fs::read(path).map_err(|e| contract_error(path, &e.to_string()))?;
    Ok(SchemaText { event_type, name: path.display().to_string(), text })
}

fn contract_error(path: &Path, reason: &str) -> ConfigError {
    ConfigError::Option(format!("contracts: cannot read {}: {reason} (see docs/contracts.md)", path.display()))
}

#[cfg(test)]
mod tests {
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
            unknown: Some("refuse".into()),
            schemas: BTreeMap::from([("order.shipped".to_owned(), PathBuf::from("v2.json"))]),
        };
        let c = resolve_contracts(&f).unwrap().expect("contracts");
        assert_eq!(c.0.check(Some(b"OrderPlaced"), b"{}"), Ok(()));
        assert!(c.0.check(Some(b"order.shipped"), b"{}").is_err(), "the mapped file, relative to dir");
        let v2 = c.0.check(Some(b"v2"), b"{}").unwrap_err();
        assert!(v2.schema.is_some_and(|s| s.ends_with("v2.json")), "the file is also v2's by its name");
        assert!(c.0.check(Some(b"Other"), b"{}").is_err(), "unknown = refuse");
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
        assert!(s.router().contract.is_none());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn nothing_configured_is_no_contract_and_mistakes_name_the_key_or_file() {
        assert!(resolve_contracts(&ContractsFile::default()).unwrap().is_none());
        let lonely = ContractsFile { unknown: Some("refuse".into()), ..ContractsFile::default() };
        assert!(resolve_contracts(&lonely).unwrap_err().to_string().contains("contracts.unknown"));
        let typo =
            ContractsFile { dir: Some("/nonexistent".into()), unknown: Some("deny".into()), ..Default::default() };
        assert!(resolve_contracts(&typo).unwrap_err().to_string().contains("expected allow or refuse"));
        let missing = ContractsFile { dir: Some("/nonexistent/contracts".into()), ..Default::default() };
        let e = resolve_contracts(&missing).unwrap_err().to_string();
        assert!(e.starts_with("contracts: cannot read /nonexistent/contracts: "), "{e}");
        let dir = dir_with(&[("Bad.json", r#"{"type": 7}"#)]);
        let bad = ContractsFile { dir: Some(dir.clone()), ..Default::default() };
        let e = resolve_contracts(&bad).unwrap_err().to_string();
        assert!(e.contains("Bad.json: not a valid JSON Schema"), "{e}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
