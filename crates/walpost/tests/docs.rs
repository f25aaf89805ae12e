//! The documentation's links hold: every relative link in the README, the book
//! (docs/), the runbooks and the other markdown files points at a file that exists and,
//! with a `#fragment`, at a heading that file has (GitHub's anchors, which mdBook's
//! match for these headings). Every chapter of docs/ is in the book's table of contents.
//! `scripts/book.sh` builds the book itself and checks the rendered pages' links.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("repository root")
}

/// The markdown files the links of which are checked, relative to the root.
fn markdown_files(root: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for dir in ["docs", "runbooks", "deploy", "bench", "crates", "migrations"] {
        collect(&root.join(dir), &mut files);
    }
    for top in ["README.md", "ARCHITECTURE.md"] {
        files.push(root.join(top));
    }
    files.sort();
    files
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        // Benchmark result folders are generated; build output is not documentation.
        if name == "target" || name == "results" || name == "node_modules" {
            continue;
        }
        if path.is_dir() {
            collect(&path, out);
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
}

/// A fenced code block's opening or closing line; not a paragraph that starts with an
/// inline code span of backticks (an info string holds none).
fn is_fence(line: &str) -> bool {
    let stripped = line.trim_start();
    let rest = stripped.trim_start_matches('`');
    stripped.len() - rest.len() >= 3 && !rest.contains('`')
}

/// The text outside fenced code blocks, line by line (code holds no links to check).
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for line in text.lines() {
        if is_fence(line) {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            lines.push(line);
        }
    }
    lines
}

/// The line without its inline code spans.
fn without_code(line: &str) -> String {
    let mut out = String::new();
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
        } else if !in_code {
            out.push(c);
        }
    }
    out
}

/// The targets of the inline links `[text](target)` of a line.
fn links(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else { break };
        let target = after[..end].split_whitespace().next().unwrap_or_default();
        out.push(target.trim_matches(['<', '>']).to_owned());
        rest = &after[end..];
    }
    out
}

/// GitHub's anchor for a heading text: lower case, punctuation dropped, spaces to
/// hyphens; repeated headings get `-1`, `-2`, ...
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for line in prose(text) {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if hashes == 0 || hashes > 6 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let mut heading = line[hashes..].trim().to_owned();
        // A link in a heading counts by its text.
        while let (Some(open), Some(mid)) = (heading.find('['), heading.find("](")) {
            let Some(close) = heading[mid..].find(')') else { break };
            heading = format!("{}{}{}", &heading[..open], &heading[open + 1..mid], &heading[mid + close + 1..]);
        }
        let slug: String = heading
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut unique = slug.clone();
        let mut n = 0;
        while seen.contains(&unique) {
            n += 1;
            unique = format!("{slug}-{n}");
        }
        seen.insert(unique);
    }
    seen
}

#[test]
fn every_relative_link_points_at_a_file_and_heading_that_exist() {
    let root = root();
    let mut broken = Vec::new();
    let mut checked = 0;
    // The table of contents is in the book's coordinates: the next test checks it.
    for file in markdown_files(&root).into_iter().filter(|f| !f.ends_with("docs/SUMMARY.md")) {
        let text = std::fs::read_to_string(&file).expect("markdown file");
        let own = anchors(&text);
        for line in prose(&text) {
            for target in links(&without_code(line)) {
                if target.contains("://") || target.starts_with("mailto:") || target.is_empty() {
                    continue;
                }
                checked += 1;
                let (path, fragment) = match target.split_once('#') {
                    Some((p, f)) => (p, Some(f)),
                    None => (target.as_str(), None),
                };
                let shown = file.strip_prefix(&root).unwrap_or(&file).display().to_string();
                let (exists, heading_set) = if path.is_empty() {
                    (true, Some(own.clone()))
                } else {
                    let resolved = file.parent().expect("a file's folder").join(path);
                    let exists = resolved.exists();
                    let headings = (exists && resolved.extension().is_some_and(|e| e == "md"))
                        .then(|| anchors(&std::fs::read_to_string(&resolved).unwrap_or_default()));
                    (exists, headings)
                };
                if !exists {
                    broken.push(format!("{shown}: {target} (no such file)"));
                    continue;
                }
                if let (Some(fragment), Some(headings)) = (fragment, heading_set) {
                    if !headings.contains(fragment) {
                        broken.push(format!("{shown}: {target} (no such heading)"));
                    }
                }
            }
        }
    }
    assert!(checked > 100, "only {checked} links found: is the link parser broken?");
    assert!(broken.is_empty(), "{} broken links:\n{}", broken.len(), broken.join("\n"));
}

/// Where a table-of-contents entry comes from: a page of docs/, or, staged into the book
/// by `scripts/book.py`, the README (the introduction), ARCHITECTURE.md or a runbook.
fn chapter_source(root: &Path, entry: &str) -> PathBuf {
    if entry == "README.md" || entry == "ARCHITECTURE.md" || entry.starts_with("runbooks/") {
        root.join(entry)
    } else {
        root.join("docs").join(entry)
    }
}

#[test]
fn every_chapter_is_in_the_books_table_of_contents() {
    let root = root();
    let summary = std::fs::read_to_string(root.join("docs/SUMMARY.md")).expect("docs/SUMMARY.md");
    let listed: BTreeSet<String> = prose(&summary).iter().flat_map(|l| links(l)).collect();
    for entry in &listed {
        assert!(chapter_source(&root, entry).exists(), "docs/SUMMARY.md lists {entry}, which does not exist");
    }
    let mut pages = Vec::new();
    collect(&root.join("docs"), &mut pages);
    let mut missing: Vec<String> = pages
        .iter()
        .map(|f| f.strip_prefix(root.join("docs")).expect("under docs").display().to_string())
        .filter(|f| f != "SUMMARY.md" && !listed.contains(f))
        .collect();
    let mut runbooks = Vec::new();
    collect(&root.join("runbooks"), &mut runbooks);
    missing.extend(
        runbooks
            .iter()
            .map(|f| f.strip_prefix(&root).expect("under the root").display().to_string())
            .filter(|f| !listed.contains(f)),
    );
    assert!(missing.is_empty(), "pages missing from docs/SUMMARY.md: {missing:?}");
}

/// The parsers above, on known input (a link checker that finds nothing passes).
#[test]
fn the_link_and_heading_parsers_read_what_github_does() {
    assert_eq!(links("see [a](x.md#y) and [b](<z.md>) `[c](no.md)`"), ["x.md#y", "z.md", "no.md"]);
    assert_eq!(links(&without_code("see [a](x.md) `[c](no.md)`")), ["x.md"]);
    let text =
        "# Records Kafka will never take: halt or dead letter\n## `walpost inbox`\n## A\n## A\n```\n# not\n```\n";
    let found = anchors(text);
    for a in ["records-kafka-will-never-take-halt-or-dead-letter", "walpost-inbox", "a", "a-1"] {
        assert!(found.contains(a), "{a} in {found:?}");
    }
    assert!(!found.contains("not"));
    assert!(!is_fence("```` ```text drill=x ```` block holds"), "a paragraph starting with a code span");
    assert!(is_fence("```sh drill=recover") && is_fence("   ```") && is_fence("````"));
}
