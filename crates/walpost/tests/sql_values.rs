//! Values reach SQL as bind parameters (`ReplicationClient::query`), never spliced into
//! the text through a literal-quoting helper: no source outside `crates/replication`
//! calls `quote_literal`, `escape_literal` or a `literal(...)` helper. `crates/replication`
//! keeps the quoting its replication commands need (the walsender takes no parameters).
//! See docs/decisions/0006-sql-bind-parameters.md.

// Test crates: helpers outside #[test] functions may fail loudly too.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Sources that quote values for good, each with how many quoting calls it may hold.
///
/// The resume hint of a halted backfill prints a filter for the operator to pass to
/// `--snapshot-filter`, which is SQL by contract; walpost never sends it itself.
const FOR_GOOD: &[(&str, usize)] = &[("crates/walpost/src/snapshot/mod.rs", 2)];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "target") {
                rust_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The lines of `text` (1-based) that quote a value for SQL text; comments aside.
fn quoting_lines(text: &str) -> Vec<usize> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or_default();
        let calls_literal = code.match_indices("literal").any(|(at, _)| {
            let before = code[..at].chars().next_back();
            let after = code[at + "literal".len()..].trim_start();
            // `literal(` as a word: not `replication_literal(`, not `literal_ts(`.
            before.is_none_or(|c| !(c.is_alphanumeric() || c == '_')) && after.starts_with('(')
        });
        if calls_literal || code.contains("quote_literal") || code.contains("escape_literal") {
            out.push(i + 1);
        }
    }
    out
}

#[test]
fn the_scanner_finds_quoting_and_passes_parameters() {
    let text = "let a = literal(&x);\nuse replication::quote_literal;\nlet b = sql::literal (y);\n\
                // literal(z) in a comment\nlet c = literal_ts(t);\nsql.query(\"SELECT $1\", &[Some(x)]);\n\
                let d = postgres_protocol::escape::escape_literal(v);";
    assert_eq!(quoting_lines(text), [1, 2, 3, 7]);
}

#[test]
fn no_value_is_quoted_into_sql_outside_the_replication_crate() {
    let root = repo();
    let mut files = Vec::new();
    rust_files(&root.join("crates"), &mut files);
    let this = Path::new(file!()).file_name().unwrap();
    let mut found = Vec::new();
    let mut for_good_seen = vec![0; FOR_GOOD.len()];
    for file in &files {
        let rel = file.strip_prefix(&root).unwrap().to_string_lossy().replace('\\', "/");
        if rel.starts_with("crates/replication/") || file.file_name() == Some(this) {
            continue;
        }
        let lines = quoting_lines(&std::fs::read_to_string(file).unwrap());
        if lines.is_empty() {
            continue;
        }
        if let Some(i) = FOR_GOOD.iter().position(|(p, _)| *p == rel) {
            for_good_seen[i] = lines.len();
            continue;
        }
        found.push(format!("{rel}: lines {lines:?}"));
    }
    assert!(
        found.is_empty(),
        "values quoted into SQL text (bind them: ReplicationClient::query(sql, &[Some(value)]) with $1, $2, ...):\n{}",
        found.join("\n")
    );
    for ((path, allowed), seen) in FOR_GOOD.iter().zip(for_good_seen) {
        assert_eq!(seen, *allowed, "{path}: quoting calls, {allowed} expected (a new one must be a parameter)");
    }
}
