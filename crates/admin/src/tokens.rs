//! The tokens file and what a bearer token is worth.
//!
//! One token a line, `NAME ROLE SHA256`: SHA256 is the lowercase hex sha256 of the token,
//! so the file never holds a token in clear (a leaked file does not let anyone in). `#`
//! starts a comment, blank lines are skipped. Errors name the line and what is wrong,
//! never its hash (a hash of a short token is guessable offline) nor any token.
//!
//! A presented token is hashed and compared with every entry in constant time, all of
//! them every time, so neither the time taken nor an early exit tells how much of a
//! hash matched or which entry did.

use std::fmt;
use std::path::Path;

use sha2::{Digest, Sha256};

/// A tokens file larger than this is refused (a path mistyped as a large file).
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;
/// A name longer than this is refused: names appear in every audit line.
pub const MAX_NAME_CHARS: usize = 64;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads (GET).
    Viewer,
    /// Reads and actions (POST, DELETE).
    Operator,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
        }
    }

    /// Whether this role may take actions (anything but a read).
    pub fn may_act(self) -> bool {
        self == Role::Operator
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who a request comes from: a token's name and role (never the token).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Identity {
    pub name: String,
    pub role: Role,
}

/// One line of the tokens file.
struct Entry {
    identity: Identity,
    hash: [u8; 32],
}

impl fmt::Debug for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The hash stays out of every debug print.
        f.debug_struct("Entry").field("identity", &self.identity).finish_non_exhaustive()
    }
}

/// The parsed tokens file.
#[derive(Debug)]
pub struct Tokens {
    entries: Vec<Entry>,
}

/// Why a tokens file is refused. The texts name the line and the field, never a hash.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokensError {
    #[error("cannot read the tokens file {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("the tokens file {path} is {bytes} bytes, more than {MAX_FILE_BYTES}: is it the right file?")]
    TooLarge { path: String, bytes: u64 },
    #[error("tokens file line {line}: {what}; each line is NAME ROLE SHA256 (ROLE viewer or operator, SHA256 the lowercase hex sha256 of the token: printf %s \"$TOKEN\" | sha256sum)")]
    Line { line: usize, what: String },
    #[error("tokens file line {line}: the name {name} is already on line {first}; names must be unique (they say who acted in the audit)")]
    Duplicate { line: usize, name: String, first: usize },
    #[error("the tokens file has no token: add one line NAME ROLE SHA256")]
    Empty,
}

impl Tokens {
    /// Reads and parses `path` (at most [`MAX_FILE_BYTES`]).
    pub fn load(path: &Path) -> Result<Tokens, TokensError> {
        let shown = path.display().to_string();
        let read = |e: std::io::Error| TokensError::Read { path: shown.clone(), reason: e.to_string() };
        let bytes = std::fs::metadata(path).map_err(read)?.len();
        if bytes > MAX_FILE_BYTES {
            return Err(TokensError::TooLarge { path: shown, bytes });
        }
        let text = std::fs::read(path).map_err(read)?;
        let text = String::from_utf8(text)
            .map_err(|_| TokensError::Read { path: shown.clone(), reason: "it is not UTF-8 text".into() })?;
        Tokens::parse(&text)
    }

    /// Parses the text of a tokens file.
    pub fn parse(text: &str) -> Result<Tokens, TokensError> {
        let mut entries: Vec<(usize, Entry)> = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let content = raw.split_once('#').map_or(raw, |(before, _)| before).trim();
            if content.is_empty() {
                continue;
            }
            let bad = |what: String| TokensError::Line { line, what };
            let fields: Vec<&str> = content.split_whitespace().collect();
            let [name, role, hash] = fields[..] else {
                return Err(bad(format!("{} fields, expected 3", fields.len())));
            };
            if name.chars().count() > MAX_NAME_CHARS {
                return Err(bad(format!("the name is longer than {MAX_NAME_CHARS} characters")));
            }
            if !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c)) {
                return Err(bad("the name may hold only letters, digits and - _ . @".into()));
            }
            let role = match role {
                "viewer" => Role::Viewer,
                "operator" => Role::Operator,
                // A role is not secret: naming it helps find the typo.
                other => return Err(bad(format!("role {other:?} is neither viewer nor operator"))),
            };
            let hash = parse_hash(hash).map_err(|what| bad(what.into()))?;
            if let Some((first, _)) = entries.iter().find(|(_, e)| e.identity.name == name) {
                return Err(TokensError::Duplicate { line, name: name.to_owned(), first: *first });
            }
            entries.push((line, Entry { identity: Identity { name: name.to_owned(), role }, hash }));
        }
        if entries.is_empty() {
            return Err(TokensError::Empty);
        }
        Ok(Tokens { entries: entries.into_iter().map(|(_, e)| e).collect() })
    }

    /// The identity `token` belongs to, if any. Every entry is compared, in constant time.
    pub fn authenticate(&self, token: &str) -> Option<Identity> {
        let presented = sha256(token.as_bytes());
        let mut found = None;
        for entry in &self.entries {
            if openssl::memcmp::eq(&entry.hash, &presented) && found.is_none() {
                found = Some(&entry.identity);
            }
        }
        found.cloned()
    }

    /// How many tokens the file holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Never true for a parsed file (an empty one is refused); for clippy's sake.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The sha256 of `bytes`.
pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    let digest = Sha256::digest(bytes);
    let mut out = [0u8; 32];
    out.copy_from_slice(digest.as_slice());
    out
}

/// The lowercase hex form the tokens file holds (`printf %s "$TOKEN" | sha256sum`).
pub fn sha256_hex(bytes: &[u8]) -> String {
    sha256(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// 64 lowercase hex digits. The error says what is wrong without showing the text.
fn parse_hash(text: &str) -> Result<[u8; 32], &'static str> {
    if text.len() != 64 {
        return Err("the SHA256 field is not 64 hex digits (is it the token itself rather than its sha256?)");
    }
    if !text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return Err("the SHA256 field holds characters other than 0-9 and a-f (lowercase hex)");
    }
    let mut out = [0u8; 32];
    for (i, pair) in text.as_bytes().chunks(2).enumerate() {
        let digit = |b: u8| if b.is_ascii_digit() { b - b'0' } else { b - b'a' + 10 };
        out[i] = digit(pair[0]) << 4 | digit(pair[1]);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn line(name: &str, role: &str, token: &str) -> String {
        format!("{name} {role} {}\n", sha256_hex(token.as_bytes()))
    }

    #[test]
    fn the_hash_is_sha256sums() {
        // printf %s secret | sha256sum
        assert_eq!(sha256_hex(b"secret"), "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b");
    }

    #[test]
    fn parses_names_roles_comments_and_blank_lines() {
        let text = format!(
            "# admin tokens\n\n{}\t{} # the on-call rota\n",
            line("grafana", "viewer", "t-view"),
            line("oncall", "operator", "t-op").trim_end()
        );
        let tokens = Tokens::parse(&text).unwrap();
        assert_eq!(tokens.len(), 2);
        assert_eq!(tokens.authenticate("t-view"), Some(Identity { name: "grafana".into(), role: Role::Viewer }));
        assert_eq!(tokens.authenticate("t-op"), Some(Identity { name: "oncall".into(), role: Role::Operator }));
        assert_eq!(tokens.authenticate("t-nope"), None);
        assert_eq!(tokens.authenticate(""), None);
    }

    #[test]
    fn errors_name_the_line_and_never_the_hash() {
        let good = line("a", "viewer", "x");
        let hash = sha256_hex(b"y");
        let cases = [
            (format!("{good}b viewer\n"), "line 2", "2 fields"),
            (format!("{good}b admin {hash}\n"), "line 2", "neither viewer nor operator"),
            (format!("b viewer {}\n", hash.to_uppercase()), "line 1", "lowercase hex"),
            ("b viewer my-secret-token\n".to_owned(), "line 1", "not 64 hex digits"),
            (format!("{good}\n\na operator {hash}\n"), "line 4", "already on line 1"),
            (format!("b/c viewer {hash}\n"), "line 1", "only letters"),
            ("# nothing\n\n".to_owned(), "no token", "no token"),
        ];
        for (text, at, what) in cases {
            let e = Tokens::parse(&text).unwrap_err().to_string();
            assert!(e.contains(at) && e.contains(what), "{text:?}: {e}");
            assert!(!e.contains(&hash) && !e.contains(&sha256_hex(b"x")), "{e}");
            assert!(!e.contains("my-secret-token"), "{e}");
        }
    }

    #[test]
    fn a_large_file_is_refused_before_it_is_read() {
        let dir = std::env::temp_dir().join(format!("walpost-admin-tokens-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tokens");
        std::fs::write(&path, vec![b'#'; MAX_FILE_BYTES as usize + 1]).unwrap();
        assert!(matches!(Tokens::load(&path), Err(TokensError::TooLarge { .. })));
        std::fs::write(&path, line("a", "viewer", "x")).unwrap();
        assert_eq!(Tokens::load(&path).unwrap().len(), 1);
        let missing = Tokens::load(&dir.join("missing")).unwrap_err().to_string();
        assert!(missing.contains("cannot read the tokens file"), "{missing}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn debug_output_holds_no_hash() {
        let tokens = Tokens::parse(&line("a", "viewer", "x")).unwrap();
        let shown = format!("{tokens:?}");
        assert!(!shown.contains(&sha256_hex(b"x")) && shown.contains("\"a\""), "{shown}");
    }

    proptest! {
        /// No token but the right one gets in, whatever it is.
        #[test]
        fn only_the_right_token_authenticates(right in ".{1,40}", other in ".{0,40}", role in prop::bool::ANY) {
            let role_text = if role { "operator" } else { "viewer" };
            let tokens = Tokens::parse(&line("svc", role_text, &right)).unwrap();
            prop_assert_eq!(tokens.authenticate(&right).map(|i| i.name), Some("svc".to_owned()));
            if other != right {
                prop_assert_eq!(tokens.authenticate(&other), None);
            }
        }
    }
}
