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
//! - Depth is bounded by the payload's: serde_json stops at 128 levels, and every step
//!   into the schema but a union's branch is a step into the value.
//! - Logical types that need arithmetic on arbitrary precision (`big-decimal`) and
//!   `duration` are refused when the schema is loaded, not at the first event.

use std::collections::HashMap;

use apache_avro::schema::{Name, Namespace, Schema};
use serde_json::Value;

/// Why a value does not fit: the pointer and the reason ("is not an int").
pub(crate) type Mismatch = (String, &'static str);

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

    /// Appends the Avro binary of `value` to `out`.
    pub(crate) fn write(&self, value: &Value, out: &mut Vec<u8>) -> Result<(), Mismatch> {
        let mut pointer = String::new();
        self.put(&self.schema, value, &mut pointer, out).map_err(|reason| (pointer, reason))
    }

    /// On error, `pointer` is left at the failing value.
    fn put(&self, schema: &Schema, value: &Value, pointer: &mut String, out: &mut Vec<u8>) -> Result<(), &'static str> {
        match schema {
            Schema::Null => value.is_null().then_some(()).ok_or("is not null"),
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
                    return Err("does not have the fixed type's size");
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
                if !items.is_empty() {
                    put_long(i64::try_from(items.len()).unwrap_or(i64::MAX), out);
                    let at = pointer.len();
                    for (i, item) in items.iter().enumerate() {
                        pointer.push('/');
                        pointer.push_str(&i.to_string());
                        self.put(&a.items, item, pointer, out)?;
                        pointer.truncate(at);
                    }
                }
                out.push(0);
                Ok(())
            }
            Schema::Map(m) => {
                let entries = value.as_object().ok_or("is not an object")?;
                if !entries.is_empty() {
                    put_long(i64::try_from(entries.len()).unwrap_or(i64::MAX), out);
                    let at = pointer.len();
                    for (key, item) in entries {
                        put_bytes(key.as_bytes(), out);
                        push_token(pointer, key);
                        self.put(&m.types, item, pointer, out)?;
                        pointer.truncate(at);
                    }
                }
                out.push(0);
                Ok(())
            }
            Schema::Union(u) => {
                let at = out.len();
                for (index, branch) in u.variants().iter().enumerate() {
                    put_long(i64::try_from(index).unwrap_or(i64::MAX), out);
                    let p = pointer.len();
                    if self.put(branch, value, pointer, out).is_ok() {
                        return Ok(());
                    }
                    pointer.truncate(p);
                    out.truncate(at);
                }
                Err("fits no branch of its union")
            }
            Schema::Record(r) => {
                let fields = value.as_object().ok_or("is not an object")?;
                if fields.keys().any(|k| !r.lookup.contains_key(k)) {
                    return Err("has a field its record does not declare");
                }
                let at = pointer.len();
                for field in &r.fields {
                    push_token(pointer, &field.name);
                    match fields.get(&field.name).or(field.default.as_ref()) {
                        Some(v) => self.put(&field.schema, v, pointer, out)?,
                        None => return Err("is missing, and its field has no default"),
                    }
                    pointer.truncate(at);
                }
                Ok(())
            }
            Schema::Ref { name } => {
                let named = self.names.get(name).or_else(|| self.names.get(&qualified(name, &None)));
                self.put(named.ok_or("has a type the schema does not define")?, value, pointer, out)
            }
            Schema::BigDecimal | Schema::Duration => Err("has a logical type walpost does not write"),
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
        AvroWriter::new(schema).unwrap().write(json, &mut out).map(|()| out)
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
}
