//! The documentation's links hold: every relative link in the README, the book
//! (docs/), the runbooks and the other markdown files points at a file that exists and,
//! with a `#fragment`, at a heading that file has (GitHub's anchors, which mdBook's
//! match for these headings). Every chapter of docs/ is in the book's table of contents.
//! `scripts/book.sh` builds the book itself and checks the rendered pages' links. And no
//! comment or page cites a tracker the repository does not hold.

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

/// Projects whose public trackers a comment or page may cite by number ("librdkafka issue
/// 4401"): the word before "issue" or "(#N)" names one of them, or is an `owner/repo`.
const OTHER_PROJECTS: &str = "apache apicurio cargo clap confluent debezium github hyper jsonschema kafka kip \
    librdkafka mdbook namastack-outbox opentelemetry postgres postgresql rdkafka rust rust-rdkafka sequin serde tansu tokio";

/// The references in `text` to a tracker that is not in the repository: the word issue
/// or issues, then a number (after a space, a `#`, or a comment's line break), and a
/// number in parentheses after `#`, unless the word before names another project. The
/// word and the number run together (a folder's name in git history) are not one.
fn tracker_references(text: &str) -> Vec<String> {
    let lower = text.to_ascii_lowercase();
    let bytes = lower.as_bytes();
    let word_before = |at: usize| -> String {
        let before = lower[..at].trim_end();
        let word = before.rsplit(|c: char| c.is_whitespace() || c == '(').next().unwrap_or_default();
        let word = word.trim_end_matches("'s");
        word.trim_matches(|c: char| !c.is_ascii_alphanumeric() && c != '/' && c != '-').to_owned()
    };
    // `owner/repo`: a name on each side of the slash (not a comment's `///`).
    let repository = |word: &str| word.split_once('/').is_some_and(|(o, r)| !o.is_empty() && !r.is_empty());
    let other_project = |word: &str| repository(word) || OTHER_PROJECTS.split_whitespace().any(|p| p == word);
    let mut found = Vec::new();
    for (at, _) in lower.match_indices("issue") {
        if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || b"_-/".contains(&bytes[at - 1])) {
            continue;
        }
        let mut i = at + "issue".len();
        if bytes.get(i) == Some(&b's') {
            i += 1;
        }
        let spaced_from = i;
        loop {
            while bytes.get(i).is_some_and(|b| b.is_ascii_whitespace()) {
                i += 1;
            }
            // A comment continued on the next line.
            let rest = &lower[i..];
            let marker = ["//!", "///", "//", "#", "--", "*"].iter().find(|m| rest.starts_with(**m));
            match marker {
                Some(m)
                    if lower[spaced_from..i].contains('\n')
                        && !rest[m.len()..].starts_with(|c: char| c.is_ascii_digit()) =>
                {
                    i += m.len()
                }
                _ => break,
            }
        }
        let spaced = i > spaced_from;
        let hash = bytes.get(i) == Some(&b'#');
        if hash {
            i += 1;
        }
        if (spaced || hash) && bytes.get(i).is_some_and(u8::is_ascii_digit) && !other_project(&word_before(at)) {
            let line_start = lower[..at].rfind('\n').map_or(0, |n| n + 1);
            let line_end = text[at..].find('\n').map_or(text.len(), |n| at + n);
            found.push(text[line_start..line_end].trim().to_owned());
        }
    }
    for (at, _) in lower.match_indices("(#") {
        let digits = lower[at + 2..].chars().take_while(char::is_ascii_digit).count();
        if digits > 0 && bytes.get(at + 2 + digits) == Some(&b')') && !other_project(&word_before(at)) {
            found.push(lower[at..at + 3 + digits].to_owned());
        }
    }
    found
}

/// The repository's own text files: sources, docs, scripts, configuration. Build output,
/// git's files, fetched tools' caches, benchmark output and test fixtures are not ours to
/// word (a fixture may hold any text on purpose).
fn text_files(dir: &Path, out: &mut Vec<PathBuf>) {
    const SKIP_DIRS: &[&str] =
        &["target", ".git", "node_modules", ".venv", ".cache", "out", "fixtures", "corpus", "proptest-regressions"];
    const EXTENSIONS: &[&str] =
        &["rs", "md", "sql", "sh", "py", "toml", "yml", "yaml", "txt", "java", "go", "json", "service", "env"];
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            if !SKIP_DIRS.contains(&name.as_str()) && !name.starts_with(".walpost") {
                text_files(&path, out);
            }
        } else if name == "Dockerfile" || path.extension().is_some_and(|e| EXTENSIONS.iter().any(|x| e == *x)) {
            out.push(path);
        }
    }
}

/// Comments and docs say why, not a number in a tracker the repository does not hold: it
/// tells a reader nothing. History that matters is a record in docs/decisions/.
#[test]
fn no_text_points_at_a_tracker_outside_the_repository() {
    let root = root();
    let mut files = Vec::new();
    text_files(&root, &mut files);
    assert!(files.len() > 100, "found only {} text files under {}", files.len(), root.display());
    let mut found = Vec::new();
    for file in files {
        let Ok(text) = std::fs::read_to_string(&file) else { continue };
        for reference in tracker_references(&text) {
            found.push(format!("{}: {reference}", file.strip_prefix(&root).unwrap_or(&file).display()));
        }
    }
    assert!(
        found.is_empty(),
        "{} references to a tracker outside the repository (say the reason, or write docs/decisions/NNNN-*.md):\n{}",
        found.len(),
        found.join("\n")
    );
}

/// The matcher above, on known input (a scan that finds nothing passes).
#[test]
fn the_tracker_reference_matcher_finds_what_it_should() {
    let word = concat!("Iss", "ue");
    for text in [
        format!("/// {word} 27, M3: the first records"),
        format!("// ---- regressions of {} 18 ----", word.to_lowercase()),
        format!("## Loss paths ({}s 26 and 27)", word.to_lowercase()),
        format!("skip every event ({}\n//! 27, M1)", word.to_lowercase()),
        format!("see {} #581 here", word.to_lowercase()),
        concat!("fixed in (", "#12)").to_owned(),
    ] {
        assert_eq!(tracker_references(&text).len(), 1, "{text:?}");
    }
    for text in [
        format!("sequin {} #581 and librdkafka's {} 4401", word.to_lowercase(), word.to_lowercase()),
        format!("confluentinc/librdkafka {} 1700", word.to_lowercase()),
        "git show f87ff1c:bench/results/issue16-1m/flame.svg, issue16/ and issue32-standby".to_owned(),
        "unable to get local issuer certificate; ca.issue(\"db\"); the issue's setting".to_owned(),
        "confluent-kafka-go#921; ipv4#127.0.0.1; color #999999".to_owned(),
    ] {
        assert_eq!(tracker_references(&text), Vec::<String>::new(), "{text:?}");
    }
}
