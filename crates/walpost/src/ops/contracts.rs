//! `walpost contracts check|push`: a directory of schemas against a schema registry, for
//! a producing service's CI. Each `<event type>.json` (JSON Schema) or `.avsc` (Avro)
//! file is one subject's next version; its subject is named by the same strategy as
//! `walpost run` uses, so what CI checks is what the relay will look up.
//!
//! `check` registers nothing; `push` registers (walpost never registers implicitly).

use std::path::{Path, PathBuf};

use contracts::registry::{Format, SubjectStrategy};
use registry::{Compatibility, RegistryClient};

use crate::error::{ErrorKind, PipelineError};
use crate::settings::contracts::registry_settings;
use crate::settings::RegistryFile;

/// One schema file and the subject it is a version of.
#[derive(Debug)]
struct Local {
    path: PathBuf,
    subject: String,
    schema_type: &'static str,
    text: String,
}

/// What `walpost contracts` is asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Check,
    Push,
}

/// Runs `check` or `push`; `Err` when a schema is incompatible, or cannot be checked.
pub async fn command(
    action: Action,
    file: &RegistryFile,
    dir: &Path,
    strategy: Option<&str>,
    topic: Option<&str>,
) -> Result<(), PipelineError> {
    let config = |e| PipelineError::definite(ErrorKind::Config, e);
    let settings = registry_settings(file, strategy, Format::JsonSchema, &|k| std::env::var(k).ok()).map_err(config)?;
    let locals = read_dir(dir, settings.options.strategy, topic)?;
    let client = RegistryClient::new(&settings).map_err(|e| PipelineError::definite(ErrorKind::Config, e))?;
    let registry = |e| PipelineError::definite(ErrorKind::Registry, e);
    let mut incompatible = Vec::new();
    for l in &locals {
        let name = l.path.display();
        match action {
            Action::Check => match client.compatible(&l.subject, l.schema_type, &l.text).await.map_err(registry)? {
                Compatibility::Compatible => println!("compatible    {} ({name})", l.subject),
                Compatibility::NewSubject => println!("new subject   {} ({name})", l.subject),
                Compatibility::Incompatible => {
                    println!("INCOMPATIBLE  {} ({name})", l.subject);
                    incompatible.push(l.subject.clone());
                }
            },
            Action::Push => {
                let id = client.register(&l.subject, l.schema_type, &l.text).await.map_err(registry)?;
                println!("registered    {} id {id} ({name})", l.subject);
            }
        }
    }
    if !incompatible.is_empty() {
        return Err(PipelineError::definite(
            ErrorKind::Registry,
            format!(
                "walpost contracts check: {} of {} schemas are not compatible with their subject's latest version ({}): keep the change compatible (add optional fields, do not remove or retype one), or agree a new subject with the consumers",
                incompatible.len(),
                locals.len(),
                incompatible.join(", ")
            ),
        ));
    }
    Ok(())
}

/// The directory's schema files, sorted, each with its subject.
fn read_dir(dir: &Path, strategy: SubjectStrategy, topic: Option<&str>) -> Result<Vec<Local>, PipelineError> {
    let config = |m: String| PipelineError::definite(ErrorKind::Config, m);
    if strategy != SubjectStrategy::RecordName && topic.is_none() {
        return Err(config("walpost contracts: the topic_name and topic_record_name strategies name subjects after a topic: pass --topic".into()));
    }
    let entries =
        std::fs::read_dir(dir).map_err(|e| config(format!("walpost contracts: cannot read {}: {e}", dir.display())))?;
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    let mut locals = Vec::new();
    for path in paths {
        let schema_type = match path.extension().and_then(|e| e.to_str()) {
            Some("json") => "JSON",
            Some("avsc") => "AVRO",
            _ => continue,
        };
        let event_type = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let text = std::fs::read_to_string(&path)
            .map_err(|e| config(format!("walpost contracts: cannot read {}: {e}", path.display())))?;
        let subject = strategy.subject(topic.unwrap_or_default(), Some(event_type.as_bytes())).unwrap_or_default();
        locals.push(Local { path, subject, schema_type, text });
    }
    if locals.is_empty() {
        return Err(config(format!("walpost contracts: {} holds no <event type>.json or .avsc schema", dir.display())));
    }
    Ok(locals)
}
