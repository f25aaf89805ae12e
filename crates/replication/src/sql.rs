//! Quoting and name checks for SQL and replication commands built as text.
//!
//! Invariants:
//! - Every connection sends `standard_conforming_strings=on` at startup, so a quoted
//!   literal means what it says: a backslash inside `'...'` is a backslash.
//! - [`quote_literal`] and [`quote_ident`] are `postgres_protocol::escape`'s (libpq's
//!   `PQescapeLiteral`/`PQescapeIdentifier`): a literal holding a backslash comes out as
//!   ` E'...'` (with a leading space), correct whatever the server's setting.
//! - Replication commands (`CREATE_REPLICATION_SLOT`, `START_REPLICATION`, ...) go through
//!   the walsender's own scanner, which knows `'...'` with `''` and `"..."` with `""` but
//!   not `E'...'`: their literals use [`replication_literal`]; their names are checked with
//!   [`validate_slot_name`] / [`validate_identifier`] before being quoted.
//! - Text with a NUL byte is refused: the protocol's strings end at NUL.

/// A name that cannot be used as asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} {name:?} {reason}")]
pub struct InvalidName {
    what: &'static str,
    name: String,
    reason: &'static str,
}

/// PostgreSQL keeps identifiers to NAMEDATALEN - 1 bytes and silently cuts longer ones.
pub const MAX_IDENTIFIER_BYTES: usize = 63;

/// Quotes a string literal for SQL sent with the simple query protocol.
pub fn quote_literal(text: &str) -> String {
    postgres_protocol::escape::escape_literal(text)
}

/// Double-quotes an identifier (for SQL and replication commands alike).
pub fn quote_ident(name: &str) -> String {
    postgres_protocol::escape::escape_identifier(name)
}

/// Checks that `name` is usable as an identifier: 1 to 63 bytes (PostgreSQL would cut a
/// longer one, silently naming something else), no NUL and no control characters. The
/// name may still need quoting: pass it through [`quote_ident`].
pub fn validate_identifier(what: &'static str, name: &str) -> Result<(), InvalidName> {
    let bad = |reason| Err(InvalidName { what, name: name.to_owned(), reason });
    if name.is_empty() {
        return bad("is empty");
    }
    if name.len() > MAX_IDENTIFIER_BYTES {
        return bad("is longer than 63 bytes (PostgreSQL would truncate it)");
    }
    if name.chars().any(char::is_control) {
        return bad("contains a control character");
    }
    Ok(())
}

/// Checks PostgreSQL's rule for replication slot names: 1 to 63 of `a-z`, `0-9`, `_`.
pub fn validate_slot_name(name: &str) -> Result<(), InvalidName> {
    validate_identifier("replication slot name", name)?;
    if !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_') {
        return Err(InvalidName {
            what: "replication slot name",
            name: name.to_owned(),
            reason: "may only contain lower-case letters, digits and underscores",
        });
    }
    Ok(())
}

/// Single-quotes a literal for a replication command (`''` for `'`, nothing else:
/// the walsender's scanner has no backslash escapes).
pub(crate) fn replication_literal(what: &'static str, text: &str) -> Result<String, InvalidName> {
    if text.contains('\0') {
        return Err(InvalidName { what, name: text.replace('\0', "\\0"), reason: "contains a NUL byte" });
    }
    Ok(format!("'{}'", text.replace('\'', "''")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_and_identifiers_are_quoted_like_libpq() {
        assert_eq!(quote_literal("it's"), "'it''s'");
        assert_eq!(quote_literal(r"a\b"), r" E'a\\b'");
        assert_eq!(quote_ident(r#"we"ird"#), r#""we""ird""#);
        assert_eq!(replication_literal("option", "a'b\\c").unwrap(), r"'a''b\c'");
        assert!(replication_literal("option", "a\0b").is_err());
    }

    #[test]
    fn name_checks() {
        assert!(validate_identifier("table", "Outbox \"x\"").is_ok());
        assert!(validate_identifier("table", "").is_err());
        assert!(validate_identifier("table", &"x".repeat(64)).is_err());
        assert!(validate_identifier("table", &"x".repeat(63)).is_ok());
        let e = validate_identifier("publication", "a\nb").unwrap_err().to_string();
        assert_eq!(e, r#"publication "a\nb" contains a control character"#);
        assert!(validate_slot_name("walpost_1").is_ok());
        for bad in ["Walpost", "wal-post", "wal post", "", "slot\"; DROP"] {
            assert!(validate_slot_name(bad).is_err(), "{bad}");
        }
    }
}
