//! The libpq password file (`~/.pgpass`, `PGPASSFILE`, `passfile=`).
//!
//! Lines are `hostname:port:database:username:password`; each of the first four fields is
//! literal text or `*` (anything); `\` escapes `:` and `\` in any field, the password
//! included. Empty lines and lines starting with `#` are skipped; the first matching line
//! wins (a matching line with an empty password is skipped). A Unix-socket connection matches the host name `localhost` when its directory is
//! one of the usual default socket directories (see [`DEFAULT_SOCKET_DIRS`]), and the
//! directory path otherwise.
//!
//! As libpq does on Unix, a file that is not a plain file, or that the group or others may
//! access at all (any bit of 0o077), is ignored; the reason is kept as a note for the
//! "no password" error, with the `chmod` that fixes it. A missing file is silently ignored.

use std::path::{Path, PathBuf};

/// Socket directories that count as `localhost` for password file matching: libpq's
/// compiled-in default is `/tmp` upstream and `/var/run/postgresql` on Debian and Red Hat.
pub const DEFAULT_SOCKET_DIRS: &[&str] = &["/tmp", "/var/run/postgresql", "/run/postgresql"];

/// A password file as read: its lines if it could be used, or why it was ignored.
#[derive(Debug)]
pub(crate) struct PassFile {
    pub path: PathBuf,
    contents: Option<String>,
    /// Why the file was ignored, when it exists but cannot be used.
    pub note: Option<String>,
}

impl PassFile {
    /// Reads `path`, applying libpq's rules on the file's kind and permissions.
    pub(super) fn load(path: &Path) -> PassFile {
        let ignored = |note: String| PassFile { path: path.to_owned(), contents: None, note: Some(note) };
        let shown = path.display();
        let meta = match std::fs::metadata(path) {
            Ok(m) => m,
            Err(_) => return PassFile { path: path.to_owned(), contents: None, note: None },
        };
        if !meta.is_file() {
            return ignored(format!("the password file {shown} is not a plain file and was ignored"));
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            if meta.permissions().mode() & 0o077 != 0 {
                return ignored(format!(
                    "the password file {shown} was ignored: it has group or world access; permissions should be u=rw (0600) or less (chmod 0600 {shown})"
                ));
            }
        }
        match std::fs::read_to_string(path) {
            Ok(text) => PassFile { path: path.to_owned(), contents: Some(text), note: None },
            Err(e) => ignored(format!("the password file {shown} cannot be read ({})", e.kind())),
        }
    }

    /// The password of the first line matching the connection, if the file is usable.
    pub(super) fn lookup(&self, host: &str, port: u16, dbname: &str, user: &str) -> Option<String> {
        lookup(self.contents.as_deref()?, host, &port.to_string(), dbname, user)
    }
}

/// The password of the first line of `contents` whose four fields match.
pub(crate) fn lookup(contents: &str, host: &str, port: &str, dbname: &str, user: &str) -> Option<String> {
    contents.lines().filter(|line| !line.is_empty() && !line.starts_with('#')).find_map(|line| {
        let mut rest = line;
        let all = [host, port, dbname, user].iter().all(|token| field_matches(&mut rest, token));
        let password = unescape(rest);
        (all && !password.is_empty()).then_some(password)
    })
}

/// Whether the field at the start of `rest` matches `token`; on a match `rest` moves past
/// the field's `:`. A line that ends before the `:` has too few fields: no match.
fn field_matches(rest: &mut &str, token: &str) -> bool {
    if let Some(after) = rest.strip_prefix("*:") {
        *rest = after;
        return true;
    }
    let mut expected = token.chars();
    let mut chars = rest.char_indices();
    while let Some((i, c)) = chars.next() {
        let c = match c {
            ':' => {
                *rest = rest.get(i + 1..).unwrap_or_default();
                return expected.next().is_none();
            }
            '\\' => match chars.next() {
                Some((_, escaped)) => escaped,
                None => return false,
            },
            other => other,
        };
        if expected.next() != Some(c) {
            return false;
        }
    }
    false
}

fn unescape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            out.extend(chars.next());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "# comment\n\
        \n\
        db1:5432:shop:app:first\n\
        db1:*:*:app:second\n\
        *:5433:*:*:wild\\:card\\\\\n\
        we\\:ird:5432:shop:app:escaped-host\n\
        short:5432:shop\n\
        db2:5432:shop:app:\n\
        db2:5432:shop:app:after-empty\r\n";

    #[test]
    fn first_matching_line_wins_with_wildcards_and_escapes() {
        assert_eq!(lookup(FILE, "db1", "5432", "shop", "app").as_deref(), Some("first"));
        assert_eq!(lookup(FILE, "db1", "6000", "other", "app").as_deref(), Some("second"));
        assert_eq!(lookup(FILE, "anything", "5433", "x", "y").as_deref(), Some("wild:card\\"));
        assert_eq!(lookup(FILE, "we:ird", "5432", "shop", "app").as_deref(), Some("escaped-host"));
        assert_eq!(lookup(FILE, "db1", "5432", "shop", "other"), None);
        assert_eq!(lookup(FILE, "short", "5432", "shop", "app"), None, "too few fields");
        assert_eq!(lookup(FILE, "db2", "5432", "shop", "app").as_deref(), Some("after-empty"), "CRLF and empty");
        assert_eq!(lookup(FILE, "db", "5432", "shop", "app"), None, "a prefix is not a match");
        assert_eq!(lookup(FILE, "db1x", "5432", "shop", "app"), None, "a longer name is not a match");
    }
}
