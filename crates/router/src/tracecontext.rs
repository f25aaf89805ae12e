//! W3C Trace Context (`traceparent`, `tracestate`) carried by an outbox row.
//!
//! A row carries its writer's trace context in one of two places: a `traceparent` (and
//! `tracestate`) key of its JSON headers column (`table.field.event.headers`) or a
//! `:header` placement named so, or a dedicated column (`table.field.event.tracing`,
//! Debezium's `tracing.span.context.field`) holding Debezium's serialised
//! `java.util.Properties` text (`traceparent=00-...`, one `key=value` per line, `#`
//! comments, `\`-escapes). The dedicated column wins over headers.
//!
//! Invariants:
//! - A record carries at most one `traceparent` and one `tracestate` header, and only
//!   values that pass [`TraceParent::parse`] / [`valid_tracestate`]; a `tracestate`
//!   never travels without a valid `traceparent` (W3C: it is meaningless alone).
//! - A value that fails is dropped (never the row): [`TraceOutcome::invalid`] says so,
//!   for the caller to count and log, without the value.

use bytes::Bytes;

/// The W3C header names.
pub const TRACEPARENT: &str = "traceparent";
pub const TRACESTATE: &str = "tracestate";

/// A valid `traceparent`: the writer's trace and span (the parent of walpost's span).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    pub parent_id: [u8; 8],
    pub flags: u8,
}

impl TraceParent {
    /// The `sampled` flag: the writer recorded its span.
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }

    /// Parses a `traceparent` value (W3C Trace Context level 1, section 3.2): version 00
    /// is exactly `00-<32 hex>-<16 hex>-<2 hex>` in lower case; a higher version (not
    /// `ff`) is read by its first 55 characters, which a `-` must end if more follow.
    /// All-zero trace or parent ids are invalid.
    pub fn parse(value: &[u8]) -> Option<TraceParent> {
        let value = trim_ows(value);
        if value.len() < 55 {
            return None;
        }
        let version = hex_byte(value.get(0..2)?)?;
        if version == 0xff || (version == 0 && value.len() != 55) || (value.len() > 55 && value[55] != b'-') {
            return None;
        }
        if value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
            return None;
        }
        let mut trace_id = [0u8; 16];
        for (i, b) in trace_id.iter_mut().enumerate() {
            *b = hex_byte(value.get(3 + 2 * i..5 + 2 * i)?)?;
        }
        let mut parent_id = [0u8; 8];
        for (i, b) in parent_id.iter_mut().enumerate() {
            *b = hex_byte(value.get(36 + 2 * i..38 + 2 * i)?)?;
        }
        let flags = hex_byte(value.get(53..55)?)?;
        if trace_id == [0; 16] || parent_id == [0; 8] {
            return None;
        }
        Some(TraceParent { trace_id, parent_id, flags })
    }

    /// The version-00 text of this context with `span_id` as the parent: what a record's
    /// `traceparent` header says when walpost's own span is the parent of its consumers.
    pub fn header_with_span(&self, span_id: [u8; 8]) -> String {
        let mut out = String::with_capacity(55);
        out.push_str("00-");
        push_hex(&mut out, &self.trace_id);
        out.push('-');
        push_hex(&mut out, &span_id);
        out.push('-');
        push_hex(&mut out, &[self.flags]);
        out
    }
}

/// What a row's trace context came to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceOutcome {
    /// The valid `traceparent`, if any.
    pub parent: Option<TraceParent>,
    /// The valid `tracestate` that goes with it, if any.
    pub state: Option<Bytes>,
    /// A `traceparent` or `tracestate` was found and dropped as invalid.
    pub invalid: bool,
}

/// Lower-case hex of `bytes` appended to `out`.
pub fn push_hex(out: &mut String, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0xf)]));
    }
}

fn hex_byte(two: &[u8]) -> Option<u8> {
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    match two {
        [hi, lo] => Some(nibble(*hi)? << 4 | nibble(*lo)?),
        _ => None,
    }
}

/// W3C allows optional white space (space, tab) around a header value.
fn trim_ows(v: &[u8]) -> &[u8] {
    let start = v.iter().position(|b| *b != b' ' && *b != b'\t').unwrap_or(v.len());
    let end = v.iter().rposition(|b| *b != b' ' && *b != b'\t').map_or(start, |e| e + 1);
    v.get(start..end).unwrap_or_default()
}

/// A `tracestate` value (W3C section 3.3): at most 32 comma-separated `key=value`
/// members (empty members allowed), keys of `[a-z0-9_\-*/@]` starting with a letter or
/// digit (at most 256 characters; `tenant@system` with a system of at most 14), values
/// of printable ASCII without `,` and `=`, at most 256 characters, not ending in a space;
/// the whole at most 512 bytes (what propagators are asked to keep). Duplicate keys are
/// invalid.
pub fn valid_tracestate(value: &[u8]) -> bool {
    if value.len() > 512 {
        return false;
    }
    let Ok(text) = std::str::from_utf8(value) else { return false };
    let mut keys: Vec<&str> = Vec::new();
    for member in text.split(',') {
        let member = member.trim_matches([' ', '\t']);
        if member.is_empty() {
            continue;
        }
        let Some((key, val)) = member.split_once('=') else { return false };
        if !valid_key(key) || !valid_value(val) || keys.contains(&key) {
            return false;
        }
        keys.push(key);
    }
    keys.len() <= 32
}

fn valid_key(key: &str) -> bool {
    let simple = |k: &str, max: usize| {
        let mut bytes = k.bytes();
        k.len() <= max
            && bytes.next().is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_-*/".contains(&b))
    };
    match key.split_once('@') {
        None => simple(key, 256),
        Some((tenant, system)) => simple(tenant, 241) && simple(system, 14),
    }
}

fn valid_value(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= 256
        && !v.ends_with(' ')
        && v.bytes().all(|b| (0x20..=0x7e).contains(&b) && b != b',' && b != b'=')
}

/// The `traceparent` and `tracestate` entries of Debezium's serialised
/// `java.util.Properties` text (`Properties.store`: `#` or `!` comment lines, `key=value`,
/// `key:value` or `key value`, backslash escapes such as `\=` and `\:`, `\uXXXX`).
/// Continuation lines are not needed for these keys and are not read.
pub fn from_properties(text: &[u8]) -> (Option<Vec<u8>>, Option<Vec<u8>>) {
    let mut parent = None;
    let mut state = None;
    for line in text.split(|b| *b == b'\n' || *b == b'\r') {
        let line = trim_start(line);
        if line.is_empty() || line[0] == b'#' || line[0] == b'!' {
            continue;
        }
        let (key, value) = split_property(line);
        match key.as_slice() {
            b"traceparent" => parent = Some(value),
            b"tracestate" => state = Some(value),
            _ => {}
        }
    }
    (parent, state)
}

fn trim_start(line: &[u8]) -> &[u8] {
    let start = line.iter().position(|b| !matches!(b, b' ' | b'\t' | b'\x0c')).unwrap_or(line.len());
    line.get(start..).unwrap_or_default()
}

/// One logical line into its unescaped key and value.
fn split_property(line: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let mut key = Vec::new();
    let mut i = 0;
    while let Some(&c) = line.get(i) {
        match c {
            b'\\' => {
                i += unescape(line, i, &mut key);
                continue;
            }
            b'=' | b':' | b' ' | b'\t' | b'\x0c' => break,
            _ => key.push(c),
        }
        i += 1;
    }
    // The separator: white space, then at most one `=` or `:`, then white space.
    let rest = trim_start(line.get(i..).unwrap_or_default());
    let rest = match rest.first() {
        Some(b'=' | b':') => trim_start(rest.get(1..).unwrap_or_default()),
        _ => rest,
    };
    let mut value = Vec::new();
    let mut j = 0;
    while let Some(&c) = rest.get(j) {
        if c == b'\\' {
            j += unescape(rest, j, &mut value);
        } else {
            value.push(c);
            j += 1;
        }
    }
    (key, value)
}

/// Unescapes the sequence at `line[at]` (a backslash) into `out`; returns its length.
fn unescape(line: &[u8], at: usize, out: &mut Vec<u8>) -> usize {
    match line.get(at + 1) {
        None => 1,
        Some(b't') => push(out, b'\t', 2),
        Some(b'n') => push(out, b'\n', 2),
        Some(b'r') => push(out, b'\r', 2),
        Some(b'f') => push(out, b'\x0c', 2),
        Some(b'u') => {
            let code = line
                .get(at + 2..at + 6)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u32::from_str_radix(h, 16).ok())
                .and_then(char::from_u32);
            match code {
                Some(c) => {
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                    6
                }
                None => push(out, b'u', 2),
            }
        }
        Some(&c) => push(out, c, 2),
    }
}

fn push(out: &mut Vec<u8>, b: u8, len: usize) -> usize {
    out.push(b);
    len
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn traceparent_table() {
        let cases: &[(&str, bool)] = &[
            (GOOD, true),
            (" 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00\t", true),
            ("00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01", false),
            ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", false),
            ("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", false),
            ("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", false),
            ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", false),
            ("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", true),
            ("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x", false),
            ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7", false),
            ("00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01", false),
            ("00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01", false),
            ("", false),
            ("garbage", false),
        ];
        for (text, ok) in cases {
            assert_eq!(TraceParent::parse(text.as_bytes()).is_some(), *ok, "{text:?}");
        }
        let p = TraceParent::parse(GOOD.as_bytes()).unwrap();
        assert_eq!(p.trace_id[0], 0x4b);
        assert_eq!(p.parent_id[7], 0xb7);
        assert!(p.sampled());
        assert_eq!(p.header_with_span(p.parent_id), GOOD);
        assert_eq!(
            p.header_with_span([1, 2, 3, 4, 5, 6, 7, 0xff]),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-01020304050607ff-01"
        );
    }

    #[test]
    fn tracestate_table() {
        let cases: &[(&str, bool)] = &[
            ("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE", true),
            ("rojo=1, ,congo=2", true),
            ("", true),
            ("tenant@vendor=x", true),
            ("Rojo=1", false),
            ("rojo", false),
            ("rojo=a=b", false),
            ("rojo=1,rojo=2", false),
            ("rojo=\u{e9}", false),
            ("rojo=in side", true),
            ("rojo=tab\there", false),
        ];
        for (text, ok) in cases {
            assert_eq!(valid_tracestate(text.as_bytes()), *ok, "{text:?}");
        }
        let many: Vec<String> = (0..33).map(|i| format!("k{i}=v")).collect();
        assert!(!valid_tracestate(many.join(",").as_bytes()), "more than 32 members");
        assert!(!valid_tracestate(format!("k={}", "v".repeat(600)).as_bytes()));
    }

    /// Debezium's column: `Properties.store` output, with its date comment and escapes.
    #[test]
    fn debezium_properties_text() {
        let text = format!("#Mon Nov 30 10:00:00 UTC 2026\ntraceparent={GOOD}\ntracestate=rojo\\=1,congo\\=t61\n");
        let (parent, state) = from_properties(text.as_bytes());
        assert_eq!(parent.as_deref(), Some(GOOD.as_bytes()));
        assert_eq!(state.as_deref(), Some(&b"rojo=1,congo=t61"[..]));
        let (parent, state) = from_properties(b"! comment\r\n  traceparent : abc\\u0041\r\nother=1");
        assert_eq!(parent.as_deref(), Some(&b"abcA"[..]));
        assert_eq!(state, None);
        assert_eq!(from_properties(b""), (None, None));
        assert_eq!(from_properties(b"traceparent"), (Some(Vec::new()), None));
    }
}
