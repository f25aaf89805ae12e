//! Every key the TOML file takes, read off the file's own types ([`super::FileConfig`]):
//! the configuration reference (docs/configuration.md) is checked against this list, so
//! a key the code reads cannot be missing from it, nor a key it lists be one the code
//! does not read (`on_permanent_error` and `dead_letter_topic` were once missing from it).
//!
//! How: the types are deserialized from a walker that answers every struct with its
//! field names (serde hands them over), every option with "some", every sequence with
//! one element and every value with an empty one, and records the path of each value it
//! is asked for. Maps with free keys (`[kafka.properties]`) are recorded as `name.*`.

use serde::de::{self, DeserializeSeed, Deserializer, IntoDeserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::file::FileConfig;

/// Every key of the file, TOML-quoted where a part holds a dot (`router."route.by.field"`),
/// `[[outbox]]` entries as `outbox.<key>`.
pub fn file_keys() -> Vec<String> {
    let mut keys = Vec::new();
    // The walker always succeeds; an error would only mean fewer keys, which the
    // reference test would then report.
    let _ = FileConfig::deserialize(Walker { path: String::new(), keys: &mut keys });
    keys.sort();
    keys.dedup();
    keys
}

struct Walker<'k> {
    path: String,
    keys: &'k mut Vec<String>,
}

impl Walker<'_> {
    fn leaf(self) {
        if !self.path.is_empty() {
            self.keys.push(self.path);
        }
    }
}

fn join(path: &str, part: &str) -> String {
    let part = if part.contains('.') { format!("\"{part}\"") } else { part.to_owned() };
    if path.is_empty() {
        part
    } else {
        format!("{path}.{part}")
    }
}

type Error = de::value::Error;

macro_rules! leaf {
    ($($method:ident => $visit:ident($($value:expr)?)),* $(,)?) => {
        $(fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
            self.leaf();
            visitor.$visit($($value)?)
        })*
    };
}

impl<'de> Deserializer<'de> for Walker<'_> {
    type Error = Error;

    leaf! {
        // A number: what the self-describing values of the file (durations) take.
        deserialize_any => visit_u64(0),
        deserialize_bool => visit_bool(false),
        deserialize_i8 => visit_i8(0),
        deserialize_i16 => visit_i16(0),
        deserialize_i32 => visit_i32(0),
        deserialize_i64 => visit_i64(0),
        deserialize_u8 => visit_u8(0),
        deserialize_u16 => visit_u16(0),
        deserialize_u32 => visit_u32(0),
        deserialize_u64 => visit_u64(0),
        deserialize_f32 => visit_f32(0.0),
        deserialize_f64 => visit_f64(0.0),
        deserialize_char => visit_char('x'),
        deserialize_str => visit_str(""),
        deserialize_string => visit_string(String::new()),
        deserialize_bytes => visit_bytes(&[]),
        deserialize_byte_buf => visit_byte_buf(Vec::new()),
        deserialize_unit => visit_unit(),
        deserialize_identifier => visit_str(""),
        deserialize_ignored_any => visit_unit(),
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_some(self)
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(self, _: &'static str, visitor: V) -> Result<V::Value, Error> {
        self.leaf();
        visitor.visit_unit()
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(self, _: &'static str, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_seq(OneElement { walker: Some(self) })
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, _: usize, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: usize,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.keys.push(join(&self.path, "*"));
        visitor.visit_map(Fields { fields: &[], next: 0, path: String::new(), keys: self.keys })
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_map(Fields { fields, next: 0, path: self.path, keys: self.keys })
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.leaf();
        let first: de::value::StrDeserializer<'_, Error> = variants.first().copied().unwrap_or("").into_deserializer();
        visitor.visit_enum(first)
    }
}

struct OneElement<'k> {
    walker: Option<Walker<'k>>,
}

impl<'de> SeqAccess<'de> for OneElement<'_> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, Error> {
        match self.walker.take() {
            Some(w) => seed.deserialize(w).map(Some),
            None => Ok(None),
        }
    }
}

/// serde lists a field's aliases among the field names; giving both would be a
/// duplicate field. These are accepted spellings, not keys of their own.
const ALIASES: &[&str] = &["tracing.span.context.field"];

struct Fields<'k> {
    fields: &'static [&'static str],
    next: usize,
    path: String,
    keys: &'k mut Vec<String>,
}

impl<'de> MapAccess<'de> for Fields<'_> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, Error> {
        while self.fields.get(self.next).is_some_and(|f| ALIASES.contains(f)) {
            self.next += 1;
        }
        let Some(name) = self.fields.get(self.next) else { return Ok(None) };
        let name: de::value::StrDeserializer<'_, Error> = name.into_deserializer();
        seed.deserialize(name).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        let name = self.fields.get(self.next).copied().unwrap_or_default();
        self.next += 1;
        seed.deserialize(Walker { path: join(&self.path, name), keys: self.keys })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_walker_finds_nested_quoted_and_free_keys() {
        let keys = file_keys();
        for key in [
            "postgres",
            "kafka.brokers",
            "kafka.properties.*",
            "router.\"route.by.field\"",
            "router.\"topics.max\"",
            "outbox.table",
            "outbox.router.\"route.by.field\"",
            "pipeline.max_message_bytes",
            "signal.allowed_roles",
            "snapshot",
        ] {
            assert!(keys.iter().any(|k| k == key), "{key} missing from {keys:?}");
        }
        assert!(!keys.iter().any(|k| k == "kafka"), "sections are not keys: {keys:?}");
    }
}
