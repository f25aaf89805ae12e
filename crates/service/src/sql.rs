//! SQL on ordinary connections: values travel as bind parameters
//! (`ReplicationClient::query`, the extended query protocol), never in the text;
//! identifiers are quoted by the one helper of the workspace, `replication::quote_ident`
//! (`postgres_protocol::escape`).
//!
//! Two shapes of value need a helper here:
//! - a list of values is one parameter, an array in PostgreSQL's text input syntax
//!   ([`array`]), cast in the statement (`= ANY ($1::text[])`, or
//!   `ROWS FROM (pg_catalog.unnest($1::text[]), pg_catalog.unnest($2::int[]))` for the
//!   rows of a multi-row insert, one array per column): one statement, one round trip,
//!   however many rows;
//! - DDL takes no parameters: PostgreSQL builds its text from bound values
//!   (`pg_catalog.format`, [`run_formatted`]) and walpost runs what came back.

use std::fmt::{self, Display, Write as _};

use replication::{QueryResult, ReplicationClient};

use crate::error::PipelineError;

/// A quoted identifier.
pub fn ident(name: &str) -> String {
    replication::quote_ident(name)
}

/// Runs one statement without values (simple query protocol: several statements may
/// share the text); a server error becomes a [`PipelineError`] with its class.
pub async fn query(sql: &mut ReplicationClient, text: &str) -> Result<QueryResult, PipelineError> {
    Ok(sql.simple_query(text).await?)
}

/// `current_setting(name)`, or `None` when it cannot be read.
pub async fn setting(sql: &mut ReplicationClient, name: &str) -> Option<String> {
    sql.query("SELECT pg_catalog.current_setting($1) AS v", &[Some(name)])
        .await
        .ok()
        .and_then(|r| r.first("v").map(str::to_owned))
}

/// `items` as one array parameter: the text input syntax of a one-dimensional array, for
/// a parameter the statement casts (`$1::text[]`, `$2::bigint[]`). See [`array_of`].
pub fn array<T: Display>(items: impl IntoIterator<Item = T>) -> String {
    array_of(items.into_iter().map(Some))
}

/// `items` as one array parameter, `None` being NULL: `{"a","b \"c\"",NULL}`.
///
/// Every element is double-quoted, with `"` and `\` escaped by a backslash, so no element
/// is read as anything but its own text: not a delimiter (`,`), not a nested array or
/// its end (`{`, `}`), not NULL (the word, quoted, is the text "NULL"), and its blanks
/// are kept. The element's type reads the text (`"42"` is 42 in an `int[]`).
pub fn array_of<T: Display>(items: impl IntoIterator<Item = Option<T>>) -> String {
    let mut out = String::from("{");
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        match item {
            None => out.push_str("NULL"),
            Some(value) => {
                out.push('"');
                // Writing into a String cannot fail.
                let _ = write!(ArrayElement(&mut out), "{value}");
                out.push('"');
            }
        }
    }
    out.push('}');
    out
}

/// Writes text into a double-quoted array element, escaping as it goes.
struct ArrayElement<'a>(&'a mut String);

impl fmt::Write for ArrayElement<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for c in s.chars() {
            if c == '"' || c == '\\' {
                self.0.push('\\');
            }
            self.0.push(c);
        }
        Ok(())
    }
}

/// Runs a statement that takes no parameters (DDL: `ATTACH PARTITION ... FOR VALUES`,
/// `COMMENT ON ... IS`) with values in it. PostgreSQL builds the text:
/// `pg_catalog.format(template, args...)` with `template` and `args` bound as parameters,
/// `%L` quoting a value as a literal, `%I` an identifier, `%s` putting in text as it is
/// (an identifier walpost quoted with [`ident`]); walpost then runs the one statement it
/// returns. Two round trips; no value passes through text walpost builds.
pub async fn run_formatted(
    sql: &mut ReplicationClient,
    template: &str,
    args: &[Option<&str>],
) -> Result<QueryResult, replication::Error> {
    let mut build = String::from("SELECT pg_catalog.format($1");
    for i in 0..args.len() {
        // format() takes "any": each value says it is text.
        let _ = write!(build, ", ${}::text", i + 2);
    }
    build.push_str(") AS statement");
    let params: Vec<Option<&str>> = std::iter::once(Some(template)).chain(args.iter().copied()).collect();
    let built = sql.query(&build, &params).await?;
    let statement = built
        .first("statement")
        .ok_or_else(|| replication::Error::Protocol("pg_catalog.format() returned no statement".into()))?
        .to_owned();
    sql.simple_query(&statement).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_quoted() {
        assert_eq!(ident("plain"), "\"plain\"");
        assert_eq!(ident("we\"ird"), "\"we\"\"ird\"");
    }

    #[test]
    fn array_elements_are_quoted_per_the_array_input_syntax() {
        assert_eq!(array(["plain", "two words"]), r#"{"plain","two words"}"#);
        assert_eq!(array([r#"say "hi""#]), r#"{"say \"hi\""}"#);
        assert_eq!(array([r"back\slash", r"\"]), r#"{"back\\slash","\\"}"#);
        assert_eq!(array(["a,b", "{c}", "}", "{"]), r#"{"a,b","{c}","}","{"}"#);
        assert_eq!(array(["o'brien"]), r#"{"o'brien"}"#, "a single quote is no special character here");
        assert_eq!(array(["", " padded "]), r#"{""," padded "}"#, "empty and blank-edged text is kept");
        assert_eq!(array(["NULL", "null"]), r#"{"NULL","null"}"#, "the word NULL, quoted, is text");
        assert_eq!(array_of([Some("x"), None, Some("NULL")]), r#"{"x",NULL,"NULL"}"#);
        assert_eq!(array(["é", "日本"]), r#"{"é","日本"}"#);
    }

    #[test]
    fn arrays_of_numbers_and_empty_arrays() {
        assert_eq!(array([1_i32, -2, 3]), r#"{"1","-2","3"}"#);
        assert_eq!(array([i64::MAX]), r#"{"9223372036854775807"}"#);
        assert_eq!(array(Vec::<&str>::new()), "{}");
        assert_eq!(array_of(Vec::<Option<i64>>::new()), "{}");
        assert_eq!(array_of([None::<i64>]), "{NULL}");
    }

    /// Reads an array text back as PostgreSQL's array_in does for a one-dimensional
    /// array, to check that every element comes back as it went in.
    fn read_back(text: &str) -> Vec<Option<String>> {
        let inner = text.strip_prefix('{').and_then(|t| t.strip_suffix('}')).unwrap();
        let mut out = Vec::new();
        let mut chars = inner.chars().peekable();
        while chars.peek().is_some() {
            if chars.peek() == Some(&'"') {
                chars.next();
                let mut s = String::new();
                loop {
                    match chars.next().unwrap() {
                        '\\' => s.push(chars.next().unwrap()),
                        '"' => break,
                        c => s.push(c),
                    }
                }
                out.push(Some(s));
            } else {
                let word: String = chars.by_ref().take_while(|c| *c != ',').collect();
                assert_eq!(word, "NULL");
                out.push(None);
                continue;
            }
            match chars.next() {
                None | Some(',') => {}
                Some(c) => panic!("unexpected {c:?} after an element"),
            }
        }
        out
    }

    #[test]
    fn every_element_reads_back_as_it_went_in() {
        let items = [Some(r#"a"b\c,d{e}f g"#), None, Some(""), Some("NULL"), Some(r"\\"), Some(r#"""#)];
        let back = read_back(&array_of(items));
        assert_eq!(back, items.iter().map(|i| i.map(str::to_owned)).collect::<Vec<_>>());
    }
}
