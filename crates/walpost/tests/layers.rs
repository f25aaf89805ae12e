//! The dependency rule inside crates/walpost (see its `lib.rs`): a module uses only
//! modules of lower layers, never a sibling of its own layer nor anything above it. And
//! no module import circle anywhere in the workspace. Between crates Cargo holds the
//! rule (the inbox, daypart, kafka-common, service, otlp, registry, http-client,
//! condition and slot-alarm crates cannot use the relay's modules; the texts crate, below them all,
//! cannot use anything), so only the binary's own modules are listed here.
//!
//! A module is a top-level module of a crate (`src/stream/session.rs` belongs to
//! `stream`; `src/app.rs` is `app`; `src/lib.rs` is the crate root, `lib`). Its
//! imports are the `crate::<module>` paths in its code (comments aside).
// Test crates: helpers outside #[test] functions may fail loudly too.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Layers of crates/walpost, bottom first (the table in its lib.rs).
const LAYERS: &[&[&str]] = &[
    &["error"],
    &["settings", "telemetry"],
    &["postgres", "kafka"],
    &["snapshot"],
    &["stream", "monitor", "retention"],
    &["ops"],
    &["cli", "control"],
    &["app"],
];

/// Items of a crate root that any module may use (macros, constants).
const ROOT_ITEMS: &[&str] = &["crash_seam", "VERSION"];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// The top-level module a file of `src` belongs to.
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel.components().next().unwrap().as_os_str().to_string_lossy().into_owned();
    first.trim_end_matches(".rs").to_owned()
}

/// `crate::<name>` references in code (not in comments), with the line they are on.
fn crate_references(text: &str) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or_default();
        for (i, _) in code.match_indices("crate::") {
            // `walpost::` paths of other crates end in `crate::` too: only a bare `crate`.
            let before = code[..i].chars().last();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let name: String = code[i + 7..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            if !name.is_empty() {
                out.push((name, number + 1));
            }
        }
        // `use crate::{a, b}` groups.
        if let Some(rest) = code.trim_start().strip_prefix("use crate::{") {
            for part in rest.split([',', '}']) {
                let name: String = part.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                if !name.is_empty() {
                    out.push((name, number + 1));
                }
            }
        }
    }
    out
}

/// Module -> modules it uses, for one crate's `src`; also where each edge is.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut graph: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for file in rust_files(src) {
        let module = module_of(src, &file);
        let text = std::fs::read_to_string(&file).unwrap();
        let edges = graph.entry(module.clone()).or_default();
        let mut references = crate_references(&text);
        if module == "lib" {
            // The root names its modules without `crate::`.
            references.extend(root_references(src, &text));
        }
        for (used, line) in references {
            let used = if src.join(format!("{used}.rs")).is_file() || src.join(&used).is_dir() {
                used
            } else {
                // An item of the crate root.
                "lib".to_owned()
            };
            if used != module {
                edges.entry(used).or_insert_with(|| format!("{}:{line}", file.display()));
            }
        }
    }
    graph
}

/// `<module>::` paths in the crate root's code (not its `mod` and `use` lines), for
/// modules of `src`.
fn root_references(src: &Path, text: &str) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or_default();
        // Module declarations and re-exports make the root a facade; they use nothing.
        let t = code.trim_start();
        if ["pub mod ", "mod ", "pub use "].iter().any(|p| t.starts_with(p)) {
            continue;
        }
        for (i, _) in code.match_indices("::") {
            let name: String = code[..i].chars().rev().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            let name: String = name.chars().rev().collect();
            let start = i - name.len();
            let qualified = code[..start].ends_with("::");
            if !qualified && (src.join(format!("{name}.rs")).is_file() || src.join(&name).is_dir()) {
                out.push((name, number + 1));
            }
        }
    }
    out
}

#[test]
fn walpost_modules_use_only_lower_layers() {
    let src = repo().join("crates/walpost/src");
    let mut violations = Vec::new();
    for file in rust_files(&src) {
        let module = module_of(&src, &file);
        if module == "lib" || module == "main" {
            continue;
        }
        let own = layer_of(&module).unwrap_or_else(|| panic!("module {module} is in no layer of LAYERS"));
        let text = std::fs::read_to_string(&file).unwrap();
        for (used, line) in crate_references(&text) {
            if used == module || ROOT_ITEMS.contains(&used.as_str()) {
                continue;
            }
            match layer_of(&used) {
                Some(l) if l < own => {}
                Some(l) => violations.push(format!(
                    "{}:{line}: {module} (layer {own}) uses {used} (layer {l}){}",
                    file.display(),
                    if l == own { ": siblings never import each other" } else { "" }
                )),
                None => violations
                    .push(format!("{}:{line}: {module} uses crate::{used}, which is no module", file.display())),
            }
        }
        // settings derives clap's `ValueEnum` on its enumerations (one list of spellings
        // for a flag, its variable and its key) and uses nothing else of clap.
        let clap_allowed = |l: &str| match module.as_str() {
            "cli" | "app" => true,
            "settings" => l == "use clap::ValueEnum;",
            _ => false,
        };
        if text.lines().map(str::trim).any(|l| l.starts_with("use clap") && !clap_allowed(l)) {
            violations.push(format!("{}: only cli and app see clap (settings: its ValueEnum derive)", file.display()));
        }
    }
    assert!(violations.is_empty(), "layer rule broken:\n{}", violations.join("\n"));
}

/// The checker catches what it should: a sibling import and an upward import.
#[test]
fn the_rule_checker_finds_violations() {
    let refs = crate_references("use crate::stream::session::Tag;\nlet x = crate::monitor::run; // crate::app\n");
    let names: Vec<&str> = refs.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, vec!["stream", "monitor"]);
    let grouped = crate_references("use crate::{kafka, settings::Settings};");
    assert!(grouped.iter().any(|(n, _)| n == "kafka") && grouped.iter().any(|(n, _)| n == "settings"));
    assert!(layer_of("monitor") == layer_of("stream"), "siblings share a layer");
    assert!(layer_of("kafka") < layer_of("snapshot"));
}

#[test]
fn no_module_import_circle_in_the_workspace() {
    let mut circles = Vec::new();
    for krate in std::fs::read_dir(repo().join("crates")).unwrap() {
        let src = krate.unwrap().path().join("src");
        if !src.is_dir() {
            continue;
        }
        let graph = module_graph(&src);
        // Depth-first search for a back edge.
        fn visit(
            node: &str,
            graph: &BTreeMap<String, BTreeMap<String, String>>,
            path: &mut Vec<String>,
            done: &mut BTreeSet<String>,
            found: &mut Vec<String>,
        ) {
            if done.contains(node) {
                return;
            }
            if let Some(start) = path.iter().position(|p| p == node) {
                let cycle: Vec<&str> = path[start..].iter().map(String::as_str).collect();
                found.push(format!("{} -> {node}", cycle.join(" -> ")));
                return;
            }
            path.push(node.to_owned());
            for next in graph.get(node).map(|e| e.keys().cloned().collect::<Vec<_>>()).unwrap_or_default() {
                visit(&next, graph, path, done, found);
            }
            path.pop();
            done.insert(node.to_owned());
        }
        let mut done = BTreeSet::new();
        for node in graph.keys() {
            let mut found = Vec::new();
            visit(node, &graph, &mut Vec::new(), &mut done, &mut found);
            for cycle in found {
                circles.push(format!("{}: {cycle}", src.display()));
            }
        }
    }
    assert!(circles.is_empty(), "import circles:\n{}", circles.join("\n"));
}

/// `walpost slot create` made a new slot without the lineage check
/// `walpost run` applies, and 10 events were lost. Every slot walpost makes goes through
/// `postgres::lineage::Lineage::create_slot`, the one caller of `create_logical_slot`.
#[test]
fn only_the_lineage_rule_creates_slots() {
    let src = repo().join("crates/walpost/src");
    let callers: Vec<String> = rust_files(&src)
        .into_iter()
        .filter(|f| std::fs::read_to_string(f).unwrap().contains(".create_logical_slot("))
        .map(|f| f.strip_prefix(&src).unwrap().display().to_string())
        .collect();
    assert_eq!(callers, vec!["postgres/lineage.rs".to_owned()], "slots are created only by Lineage::create_slot");
}

/// A source file over 600 lines says in its doc comment why it is one file.
#[test]
fn a_file_over_600_lines_says_why() {
    let mut checked = 0;
    for krate in std::fs::read_dir(repo().join("crates")).unwrap() {
        let src = krate.unwrap().path().join("src");
        if !src.is_dir() {
            continue;
        }
        for file in rust_files(&src) {
            let text = std::fs::read_to_string(&file).unwrap();
            checked += 1;
            let lines = text.lines().count();
            assert!(
                lines <= 600 || text.to_lowercase().contains("why one file over 600 lines"),
                "{} has {lines} lines: split it, or say in its doc comment why it is one file (\"Why one file over 600 lines: ...\")",
                file.display()
            );
        }
    }
    assert!(checked > 100, "only {checked} files found under crates/*/src");
}

/// The relay's operator texts are in one place, the texts crate, which every layer may
/// use: it depends on nothing and does no I/O (a text is a constant or a function that
/// formats one), and the binary's code names a runbook only through it.
#[test]
fn operator_texts_live_in_the_texts_crate() {
    let manifest = std::fs::read_to_string(repo().join("crates/texts/Cargo.toml")).unwrap();
    let dependencies = manifest.split("[dependencies]").nth(1).unwrap_or_default();
    assert!(
        dependencies.lines().all(|l| l.trim().is_empty() || l.trim_start().starts_with('#')),
        "crates/texts depends on nothing:\n{dependencies}"
    );
    for file in rust_files(&repo().join("crates/texts/src")) {
        let text = std::fs::read_to_string(&file).unwrap();
        for io in ["std::fs", "std::io", "std::net", "std::env", "std::process", "print!", "println!", "eprint"] {
            assert!(!text.contains(io), "{} does I/O ({io}): texts are only formatted here", file.display());
        }
    }
    let src = repo().join("crates/walpost/src");
    let mut scattered = Vec::new();
    for file in rust_files(&src) {
        let text = std::fs::read_to_string(&file).unwrap();
        // Unit tests may look for a runbook's name in what the code said.
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        for (number, line) in code.lines().enumerate() {
            let line = line.split("//").next().unwrap_or_default();
            if line.contains("runbooks/") || line.contains("_RUNBOOK") || line.contains("const RUNBOOK") {
                scattered.push(format!("{}:{}: {}", file.display(), number + 1, line.trim()));
            }
        }
    }
    assert!(
        scattered.is_empty(),
        "a text that names a runbook belongs in crates/texts (texts::runbook):\n{}",
        scattered.join("\n")
    );
}
