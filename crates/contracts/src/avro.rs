//! A JSON payload written as Avro binary by a registry subject's Avro schema.
//!
//! The payload is plain JSON, as outbox rows hold it (not Avro's JSON encoding, where a
//! union's value is wrapped in its branch name): a union takes the first branch the value
//! fits, a missing record field takes the field's default, and a field the record does
//! not declare is refused, since Avro would drop it without a word.
//!
//! Invariants:
//! - A mismatch names the JSON pointer of the value and what it lacks, never the value
//!   (nor the names of undeclared fields, which may be data).
//! - Depth is bounded by [`Limits::max_depth`]: every record, array and map entered
//!   counts a level, those of a field's default too (a record whose default holds
//!   itself would recurse for ever).
//! - Work is bounded: a union's branch is chosen by whether the value fits it, and that
//!   answer is remembered per (schema, value), so unions of recursive records cost
//!   what the value's size does, not 2^depth; every step counts against the check's
//!   budget ([`crate::Limits::steps_for`]), and a check past it is [`Stop::Costly`].
//! - Logical types that need arithmetic on arbitrary precision (`big-decimal`) and
//!   `duration` are refused when the schema is loaded, not at the first event.

use std::collections::HashMap;

use apache_avro::schema::{Name, Namespace, Schema};
use serde_json::Value;

use crate::Limits;

/// Why a value does not fit: the pointer and the reason ("is not an int").
pub(crate) type Mismatch = (String, &'static str);

/// What a value that was not written met.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Failure {
    /// It does not fit the schema (depth past the limit included).
    Mismatch(Mismatch),
    /// Writing it took more than this many steps.
    Costly(u64),
}

/// The reason a value (or a default) nested past the depth limit gets.
pub(crate) const TOO_DEEP: &str =
    "nests deeper than contracts.max_depth allows (so does a record whose field's default holds that record)";

/// Why writing stopped, inside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Mismatch(&'static str),
    /// Past the depth limit: the whole write stops (a union does not try its next branch).
    Deep,
    /// Past the step budget: the whole write stops.
    Costly,
}

impl From<&'static str> for Stop {
    fn from(reason: &'static str) -> Stop {
        Stop::Mismatch(reason)
    }
}

/// One write's state: its budget, and which (schema, value) pairs fit.
struct Run {
    budget: u64,
    left: u64,
    max_depth: usize,
    /// (schema address, value address) -> fits. Both live as long as the write.
    fits: HashMap<(usize, usize), bool>,
}

impl Run {
    fn step(&mut self) -> Result<(), Stop> {
        self.left = self.left.checked_sub(1).ok_or(Stop::Costly)?;
        Ok(())
    }

    fn enter(&self, depth: usize) -> Result<usize, Stop> {
        if depth >= self.max_depth {
            return Err(Stop::Deep);
        }
        Ok(depth + 1)
    }
}

/// A parsed Avro schema with its named types, ready to write values.
#[derive(Debug)]
pub(crate) struct AvroWriter {
    schema: Schema,
    names: HashMap<Name, Schema>,
}

impl AvroWriter {
    /// Parses `text`; the error says why it is not a schema walpost can write.
    pub(crate) fn new(text: &str) -> Result<AvroWriter, String> {
        let schema = Schema::parse_str(text).map_err(|e| format!("not an Avro schema: {e}"))?;
        let names = apache_avro::schema::ResolvedSchema::try_from(&schema)
            .map_err(|e| format!("not an Avro schema: {e}"))?
            .get_names()
            .iter()
            .map(|(name, schema)| (name.clone(), (*schema).clone()))
            .collect();
        let writer = AvroWriter { schema, names };
        writer.supported(&writer.schema, 0)?;
        Ok(writer)
    }

    /// Refuses what [`Self::write`] cannot write, at load time.
    fn supported(&self, schema: &Schema, depth: usize) -> Result<(), String> {
        if depth > 64 {
            return Ok(()); // A recursive type: its parts were seen above.
        }
        match schema {
            Schema::BigDecimal => Err("the big-decimal logical type is not supported".into()),
            Schema::Duration => Err("the duration logical type is not supported".into()),
            Schema::Array(a) => self.supported(&a.items, depth + 1),
            Schema::Map(m) => self.supported(&m.types, depth + 1),
            Schema::Union(u) => u.variants().iter().try_for_each(|v| self.supported(v, depth + 1)),
            Schema::Record(r) => r.fields.iter().try_for_each(|f| self.supported(&f.schema, depth + 1)),
            _ => Ok(()),
        }
    }

    /// Appends the Avro binary of `value` to `out`, in at most `budget` steps and
    /// `limits.max_depth` levels.
    pub(crate) fn write(&self, value: &Value, out: &mut Vec<u8>, limits: Limits, budget: u64) -> Result<(), Failure> {
        let mut pointer = String::new();
        let mut run = Run { budget, left: budget, max_depth: limits.max_depth, fits: HashMap::new() };
        let at = out.len();
        let written = self.put(&self.schema, value, 0, &mut pointer, out, &mut run);
        written.map_err(|stop| {
            out.truncate(at);
            match stop {
                Stop::Mismatch(reason) => Failure::Mismatch((pointer, reason)),
                Stop::Deep => Failure::Mismatch((pointer, TOO_DEEP)),
                Stop::Costly => Failure::Costly(run.budget),
            }
        })
    }

    /// Whether `value` fits `schema` (written aside, then dropped), remembered per pair so
    /// that nested unions do not try the same branch on the same value again.
    fn fits(&self, schema: &Schema, value: &Value, depth: usize, run: &mut Run) -> Result<bool, Stop> {
        let key = (std::ptr::from_ref(schema) as usize, std::ptr::from_ref(value) as usize);
        if let Some(&fits) = run.fits.get(&key) {
            return Ok(fits);
        }
        let mut aside = Vec::new();
        let fits = match self.put(schema, value, depth, &mut String::new(), &mut aside, run) {
            Ok(()) => true,
            Err(Stop::Mismatch(_)) => false,
            Err(stop) => return Err(stop),
        };
        run.fits.insert(key, fits);
        Ok(fits)
    }

    /// On error, `pointer` is left at the failing value.
    fn put(
        &self,
        schema: &Schema,
        value: &Value,
        depth: usize,
        pointer: &mut String,
        out: &mut Vec<u8>,
        run: &mut Run,
    ) -> Result<(), Stop> {
        run.step()?;
        match schema {
            Schema::Null => Ok(value.is_null().then_some(()).ok_or("is not null")?),
            Schema::Boolean => {
                let b = value.as_bool().ok_or("is not a boolean")?;
                out.push(u8::from(b));
                Ok(())
            }
            Schema::Int | Schema::Date | Schema::TimeMillis => {
                let n = value.as_i64().ok_or("is not an int")?;
                let n = i32::try_from(n).map_err(|_| "is out of the int range")?;
                put_long(i64::from(n), out);
                Ok(())
            }
            Schema::Long
            | Schema::TimeMicros
            | Schema::TimestampMillis
            | Schema::TimestampMicros
            | Schema::TimestampNanos
            | Schema::LocalTimestampMillis
            | Schema::LocalTimestampMicros
            | Schema::LocalTimestampNanos => {
                put_long(value.as_i64().ok_or("is not a long")?, out);
                Ok(())
            }
            Schema::Float => {
                #[allow(clippy::cast_possible_truncation)] // Avro float is 32 bits.
                let f = value.as_f64().ok_or("is not a number")? as f32;
                out.extend_from_slice(&f.to_le_bytes());
                Ok(())
            }
            Schema::Double => {
                out.extend_from_slice(&value.as_f64().ok_or("is not a number")?.to_le_bytes());
                Ok(())
            }
            Schema::String | Schema::Uuid => {
                let s = value.as_str().ok_or("is not a string")?;
                put_bytes(s.as_bytes(), out);
                Ok(())
            }
            Schema::Bytes => {
                let bytes = latin1(value.as_str().ok_or("is not a string of bytes")?)?;
                put_bytes(&bytes, out);
                Ok(())
            }
            Schema::Fixed(f) => {
                let bytes = latin1(value.as_str().ok_or("is not a string of bytes")?)?;
                if bytes.len() != f.size {
                    return Err("does not have the fixed type's size".into());
                }
                out.extend_from_slice(&bytes);
                Ok(())
            }
            Schema::Decimal(d) => {
                let unscaled = unscaled(value, d.scale)?;
                let digits = two_complement(unscaled);
                match d.inner.as_ref() {
                    Schema::Fixed(f) => {
                        let pad =
                            f.size.checked_sub(digits.len()).ok_or("has more digits than its fixed size holds")?;
                        let fill = if unscaled < 0 { 0xff } else { 0 };
                        out.extend(std::iter::repeat_n(fill, pad));
                        out.extend_from_slice(&digits);
                    }
                    _ => put_bytes(&digits, out),
                }
                Ok(())
            }
            Schema::Enum(e) => {
                let s = value.as_str().ok_or("is not a string")?;
                let index = e.symbols.iter().position(|sym| sym == s).ok_or("is not a symbol of its enum")?;
                put_long(i64::try_from(index).unwrap_or(i64::MAX), out);
                Ok(())
            }
            Schema::Array(a) => {
                let items = value.as_array().ok_or("is not an array")?;
                let depth = run.enter(depth)?;
                if !items.is_empty() {
                    put_long(i64::try_from(items.len()).unwrap_or(i64::MAX), out);
                    let at = pointer.len();
                    for (i, item) in items.iter().enumerate() {
                        pointer.push('/');
                        pointer.push_str(&i.to_string());
                        self.put(&a.items, item, depth, pointer, out, run)?;
                        pointer.truncate(at);
                    }
                }
                out.push(0);
                Ok(())
            }
            Schema::Map(m) => {
                let entries = value.as_object().ok_or("is not an object")?;
                let depth = run.enter(depth)?;
                if !entries.is_empty() {
                    put_long(i64::try_from(entries.len()).unwrap_or(i64::MAX), out);
                    let at = pointer.len();
                    for (key, item) in entries {
                        put_bytes(key.as_bytes(), out);
                        push_token(pointer, key);
                        self.put(&m.types, item, depth, pointer, out, run)?;
                        pointer.truncate(at);
                    }
                }
                out.push(0);
                Ok(())
            }
            Schema::Union(u) => {
                // The first branch the value fits, asked without writing: no branch is
                // written and then undone, and a branch tried on a value is not tried on
                // it again deeper down.
                for (index, branch) in u.variants().iter().enumerate() {
                    if self.fits(branch, value, depth, run)? {
                        put_long(i64::try_from(index).unwrap_or(i64::MAX), out);
                        return self.put(branch, value, depth, pointer, out, run);
                    }
                }
                Err("fits no branch of its union".into())
            }
            Schema::Record(r) => {
                let fields = value.as_object().ok_or("is not an object")?;
                if fields.keys().any(|k| !r.lookup.contains_key(k)) {
                    return Err("has a field its record does not declare".into());
                }
                let depth = run.enter(depth)?;
                let at = pointer.len();
                for field in &r.fields {
                    push_token(pointer, &field.name);
                    match fields.get(&field.name).or(field.default.as_ref()) {
                        Some(v) => self.put(&field.schema, v, depth, pointer, out, run)?,
                        None => return Err("is missing, and its field has no default".into()),
                    }
                    pointer.truncate(at);
                }
                Ok(())
            }
            Schema::Ref { name } => {
                let named = self.names.get(name).or_else(|| self.names.get(&qualified(name, &None)));
                self.put(named.ok_or("has a type the schema does not define")?, value, depth, pointer, out, run)
            }
            Schema::BigDecimal | Schema::Duration => Err("has a logical type walpost does not write".into()),
        }
    }
}

fn qualified(name: &Name, namespace: &Namespace) -> Name {
    Name { name: name.name.clone(), namespace: name.namespace.clone().or_else(|| namespace.clone()) }
}

/// A JSON pointer reference token for `key` (RFC 6901: `~` and `/` escaped).
fn push_token(pointer: &mut String, key: &str) {
    pointer.push('/');
    for c in key.chars() {
        match c {
            '~' => pointer.push_str("~0"),
            '/' => pointer.push_str("~1"),
            c => pointer.push(c),
        }
    }
}

/// Avro's zig-zag variable-length long.
fn put_long(n: i64, out: &mut Vec<u8>) {
    #[allow(clippy::cast_sign_loss)] // The zig-zag mapping is defined on the bits.
    let mut z = ((n << 1) ^ (n >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

fn put_bytes(bytes: &[u8], out: &mut Vec<u8>) {
    put_long(i64::try_from(bytes.len()).unwrap_or(i64::MAX), out);
    out.extend_from_slice(bytes);
}

/// Bytes as Avro's JSON form gives them: one character per byte (U+0000 to U+00FF).
fn latin1(s: &str) -> Result<Vec<u8>, &'static str> {
    s.chars().map(|c| u8::try_from(u32::from(c)).map_err(|_| "has a character that is not a byte")).collect()
}

/// A decimal (JSON number or string) as its unscaled integer at `scale`.
fn unscaled(value: &Value, scale: usize) -> Result<i128, &'static str> {
    let text = match value {
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        _ => return Err("is not a decimal"),
    };
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.as_str()),
    };
    let (whole, fraction) = digits.split_once('.').unwrap_or((digits, ""));
    let fraction = fraction.trim_end_matches('0');
    if whole.is_empty() || !whole.bytes().chain(fraction.bytes()).all(|b| b.is_ascii_digit()) {
        return Err("is not a decimal");
    }
    if fraction.len() > scale {
        return Err("has more decimal places than its scale");
    }
    let mut n: i128 = 0;
    let padding = std::iter::repeat_n(b'0', scale - fraction.len());
    for b in whole.bytes().chain(fraction.bytes()).chain(padding) {
        n = n.checked_mul(10).and_then(|n| n.checked_add(i128::from(b - b'0'))).ok_or("has too many digits")?;
    }
    Ok(if negative { -n } else { n })
}

/// The shortest big-endian two's complement of `n`.
fn two_complement(n: i128) -> Vec<u8> {
    let bytes = n.to_be_bytes();
    let fill = if n < 0 { 0xff } else { 0 };
    let mut start = 0;
    // Drop a leading fill byte while the next byte still carries the sign.
    while start + 1 < bytes.len()
        && bytes.get(start) == Some(&fill)
        && bytes.get(start + 1).is_some_and(|b| (b & 0x80 != 0) == (n < 0))
    {
        start += 1;
    }
    bytes.get(start..).unwrap_or_default().to_vec()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// What the Avro library itself writes for `json` as a value of `schema` (the
    /// reference this writer must match).
    fn reference(schema: &str, json: Value) -> Vec<u8> {
        let schema = Schema::parse_str(schema).unwrap();
        let value = apache_avro::types::Value::from(json).resolve(&schema).unwrap();
        apache_avro::to_avro_datum(&schema, value).unwrap()
    }

    fn ours(schema: &str, json: &Value) -> Result<Vec<u8>, Mismatch> {
        let mut out = Vec::new();
        let written = AvroWriter::new(schema).unwrap().write(json, &mut out, Limits::default(), 1_000_000);
        written.map(|()| out).map_err(|f| match f {
            Failure::Mismatch(m) => m,
            Failure::Costly(_) => panic!("over budget"),
        })
    }

    const ORDER: &str = r#"{"type": "record", "name": "OrderPlaced", "namespace": "shop",
        "fields": [
            {"name": "order_id", "type": "string"},
            {"name": "amount", "type": "long"},
            {"name": "ratio", "type": "double"},
            {"name": "paid", "type": "boolean"},
            {"name": "note", "type": ["null", "string"], "default": null},
            {"name": "state", "type": {"type": "enum", "name": "State", "symbols": ["NEW", "PAID"]}},
            {"name": "lines", "type": {"type": "array", "items": {"type": "record", "name": "Line",
                "fields": [{"name": "sku", "type": "string"}, {"name": "qty", "type": "int"}]}}},
            {"name": "tags", "type": {"type": "map", "values": "string"}},
            {"name": "first", "type": ["null", "Line"], "default": null}
        ]}"#;

    #[test]
    fn it_writes_what_the_avro_library_writes() {
        let json = serde_json::json!({
            "order_id": "o-1", "amount": -1234567890123_i64, "ratio": 0.25, "paid": true,
            "note": "gift", "state": "PAID",
            "lines": [{"sku": "A", "qty": 2}, {"sku": "B", "qty": -3}],
            "tags": {"k": "v"}, "first": {"sku": "A", "qty": 2}
        });
        assert_eq!(ours(ORDER, &json).unwrap(), reference(ORDER, json.clone()));
    }

    #[test]
    fn missing_fields_take_their_defaults_and_mismatches_name_the_pointer_only() {
        let json = serde_json::json!({"order_id": "o", "amount": 1, "ratio": 1, "paid": false, "state": "NEW",
            "lines": [], "tags": {}});
        let bytes = ours(ORDER, &json).unwrap();
        let mut full = json.clone();
        full["note"] = Value::Null;
        full["first"] = Value::Null;
        assert_eq!(bytes, ours(ORDER, &full).unwrap(), "null defaults");
        let cases = [
            (serde_json::json!({"amount": "SECRET"}), "/amount", "is not a long"),
            (serde_json::json!({"state": "SECRET"}), "/state", "is not a symbol of its enum"),
            (
                serde_json::json!({"lines": [{"sku": "a", "qty": 1}, {"sku": 5, "qty": 1}]}),
                "/lines/1/sku",
                "is not a string",
            ),
            (
                serde_json::json!({"lines": [{"sku": "a", "qty": 3_000_000_000_i64}]}),
                "/lines/0/qty",
                "is out of the int range",
            ),
            (serde_json::json!({"note": 7}), "/note", "fits no branch of its union"),
            (serde_json::json!({"SECRET_NAME": 1}), "", "has a field its record does not declare"),
        ];
        for (patch, pointer, reason) in cases {
            let mut v = json.clone();
            for (k, x) in patch.as_object().unwrap() {
                v[k] = x.clone();
            }
            assert_eq!(ours(ORDER, &v), Err((pointer.to_owned(), reason)), "{patch}");
        }
        let mut lacking = json.clone();
        lacking.as_object_mut().unwrap().remove("amount");
        assert_eq!(ours(ORDER, &lacking), Err(("/amount".into(), "is missing, and its field has no default")));
    }

    #[test]
    fn decimals_and_bytes_are_written_as_avro_defines_them() {
        let dec = r#"{"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}"#;
        assert_eq!(ours(dec, &serde_json::json!("12.3")).unwrap(), vec![4, 0x04, 0xce], "1230 in 2 bytes");
        assert_eq!(ours(dec, &serde_json::json!(-1)).unwrap(), vec![2, 0x9c], "-100 in one byte");
        assert_eq!(
            ours(dec, &serde_json::json!("1.234")),
            Err((String::new(), "has more decimal places than its scale"))
        );
        let fixed =
            r#"{"type": "fixed", "name": "D", "size": 4, "logicalType": "decimal", "precision": 9, "scale": 0}"#;
        assert_eq!(ours(fixed, &serde_json::json!(-2)).unwrap(), vec![0xff, 0xff, 0xff, 0xfe]);
        assert_eq!(ours(r#""bytes""#, &serde_json::json!("\u{00ff}a")).unwrap(), vec![4, 0xff, b'a']);
        assert!(AvroWriter::new(r#"{"type": "fixed", "name": "x", "size": 12, "logicalType": "duration"}"#).is_err());
        assert!(
            AvroWriter::new(r#"{"type": "record", "name": "R", "fields": [{"name": "a", "type": "nope"}]}"#).is_err()
        );
    }

    #[test]
    fn a_recursive_type_writes_as_deep_as_the_value_goes() {
        let list = r#"{"type": "record", "name": "Node", "fields": [
            {"name": "v", "type": "int"}, {"name": "next", "type": ["null", "Node"], "default": null}]}"#;
        let json = serde_json::json!({"v": 1, "next": {"v": 2, "next": null}});
        let expected = reference(list, serde_json::json!({"v": 1, "next": {"v": 2, "next": null}}));
        assert_eq!(ours(list, &json).unwrap(), expected);
    }

    /// Two records, each with a field that is either of them (or null).
    const TWO_KINDS: &str = r#"{"type": "record", "name": "A", "fields": [{"name": "c", "type": ["null", "A",
        {"type": "record", "name": "B", "fields": [{"name": "c", "type": ["null", "A", "B"]}]}]}]}"#;

    fn nested_c(depth: usize, bottom: &str) -> Value {
        serde_json::from_str(&format!("{}{bottom}{}", r#"{"c":"#.repeat(depth), "}".repeat(depth))).unwrap()
    }

    #[test]
    fn unions_of_recursive_records_do_not_backtrack_exponentially() {
        // Depth 28 took 35 s of CPU when each union wrote a branch and undid it.
        let started = std::time::Instant::now();
        assert_eq!(ours(TWO_KINDS, &nested_c(28, "1")), Err(("/c".into(), "fits no branch of its union")));
        assert!(started.elapsed() < std::time::Duration::from_secs(2), "{:?}", started.elapsed());
        let started = std::time::Instant::now();
        let fine = ours(TWO_KINDS, &nested_c(28, "null")).unwrap();
        assert!(started.elapsed() < std::time::Duration::from_secs(2), "{:?}", started.elapsed());
        // The root is an A; each c below it: branch 1 (A), the last one branch 0 (null).
        assert_eq!(fine, [vec![2; 27], vec![0]].concat());
        // The Avro library's own writer agrees where it is fast enough to ask.
        let shallow = nested_c(6, "null");
        assert_eq!(ours(TWO_KINDS, &shallow).unwrap(), reference(TWO_KINDS, shallow.clone()));
    }

    #[test]
    fn a_default_that_holds_its_own_record_is_a_mismatch_not_a_stack_overflow() {
        // It overflowed the stack (abort, exit 134) before the writer counted levels.
        let cyclic = r#"{"type":"record","name":"R","fields":[{"name":"f","type":["R",{"type":"map","values":"int"}],"default":{}}]}"#;
        let (pointer, reason) = ours(cyclic, &serde_json::json!({})).unwrap_err();
        assert_eq!(reason, TOO_DEEP);
        assert_eq!(pointer, "/f", "the field whose default holds its record");
        let deep = r#"{"type": "array", "items": {"type": "array", "items": "int"}}"#;
        let mut out = Vec::new();
        let writer = AvroWriter::new(deep).unwrap();
        let two_levels = serde_json::json!([[1]]);
        assert!(writer.write(&two_levels, &mut out, Limits { max_depth: 2 }, 100).is_ok());
        let one_level = writer.write(&two_levels, &mut out, Limits { max_depth: 1 }, 100);
        assert_eq!(one_level, Err(Failure::Mismatch(("/0".into(), TOO_DEEP))));
    }

    #[test]
    fn defaults_that_fan_out_spend_the_step_budget() {
        // T0 has two fields of T1, each defaulting to {}, ... to T19: 2^20 records from {}.
        let mut schema = r#""int""#.to_owned();
        for i in (0..20).rev() {
            let default = if i == 19 { "0" } else { "{}" };
            schema = format!(
                r#"{{"type": "record", "name": "T{i}", "fields": [{{"name": "a", "type": {schema}, "default": {default}}}, {{"name": "b", "type": {}, "default": {default}}}]}}"#,
                if i == 19 { r#""int""#.to_owned() } else { format!(r#""T{}""#, i + 1) }
            );
        }
        let writer = AvroWriter::new(&schema).unwrap();
        let mut out = Vec::new();
        let started = std::time::Instant::now();
        assert_eq!(
            writer.write(&serde_json::json!({}), &mut out, Limits::default(), 100_000),
            Err(Failure::Costly(100_000))
        );
        assert!(out.is_empty(), "nothing half-written is left");
        assert!(started.elapsed() < std::time::Duration::from_secs(2), "{:?}", started.elapsed());
    }
}
