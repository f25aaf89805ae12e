//! Durations as people write them in flags and files: `30s`, `500ms`, `5min`, `2h`,
//! `1d`, or a bare number in the key's own unit (the older forms: a `*_secs` key's
//! number is seconds, a `*_ms` key's milliseconds; a flag's bare number is seconds).
//!
//! In the file, [`Seconds`] and [`Millis`] are those keys' types: `status_interval_secs
//! = 10` and `status_interval_secs = "10s"` are the same setting, and so are
//! `lock_timeout_ms = 1500` and `lock_timeout_ms = "1500ms"`.

use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// Parses `text` (a bare number is seconds); the error says what is accepted.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    parse_in(text, 1_000)
}

/// Parses `text`, a bare number being `bare_ms` milliseconds each.
fn parse_in(text: &str, bare_ms: u64) -> Result<Duration, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let bad = || {
        format!(
            "'{text}' is not a duration: write a number with a unit (500ms, 30s, 5min, 2h, 1d) or a number of seconds"
        )
    };
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let ms = match unit.trim() {
        "" => n.checked_mul(bare_ms),
        "s" | "sec" | "secs" => n.checked_mul(1_000),
        "ms" => Some(n),
        "m" | "min" | "mins" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        "d" => n.checked_mul(86_400_000),
        _ => None,
    };
    ms.map(Duration::from_millis).ok_or_else(bad)
}

/// The value of a `*_secs` key: a number of seconds (`10`, `0.5`) or a duration with a
/// unit (`"10s"`, `"500ms"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seconds(pub Duration);

/// The value of a `*_ms` key: a number of milliseconds (`1500`) or a duration with a
/// unit (`"1500ms"`, `"2s"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Millis(pub Duration);

/// Reads a number in `unit_ms` milliseconds or a string with a unit.
struct InUnit {
    unit_ms: u64,
    unit: &'static str,
}

impl InUnit {
    fn number<E: de::Error>(&self, n: f64) -> Result<Duration, E> {
        let ms = n * self.unit_ms as f64;
        if n.is_finite() && n >= 0.0 && ms < u64::MAX as f64 {
            Ok(Duration::from_secs_f64(ms / 1_000.0))
        } else {
            Err(E::custom(format!("{n} is not a duration: write a number of {} that is not negative", self.unit)))
        }
    }
}

impl Visitor<'_> for InUnit {
    type Value = Duration;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a number of {} or a duration with a unit (\"500ms\", \"30s\", \"5min\")", self.unit)
    }

    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Duration, E> {
        n.checked_mul(self.unit_ms)
            .map(Duration::from_millis)
            .ok_or_else(|| E::custom(format!("{n} {} is too long a duration", self.unit)))
    }

    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Duration, E> {
        match u64::try_from(n) {
            Ok(n) => self.visit_u64(n),
            Err(_) => self.number(n as f64),
        }
    }

    fn visit_f64<E: de::Error>(self, n: f64) -> Result<Duration, E> {
        self.number(n)
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Duration, E> {
        // The value is not quoted: a file's error never shows a value (it may be a
        // secret in the wrong key).
        parse_in(text, self.unit_ms).map_err(|_| {
            E::custom(format!(
                "the string is not a duration: write a number of {} or one with a unit (500ms, 30s, 5min, 2h, 1d)",
                self.unit
            ))
        })
    }
}

impl<'de> Deserialize<'de> for Seconds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(InUnit { unit_ms: 1_000, unit: "seconds" }).map(Seconds)
    }
}

impl<'de> Deserialize<'de> for Millis {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(InUnit { unit_ms: 1, unit: "milliseconds" }).map(Millis)
    }
}

/// Written back (`walpost import-debezium`) as the key's number when it is a whole one,
/// else with a unit.
impl Serialize for Seconds {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0.subsec_nanos() {
            0 => s.serialize_u64(self.0.as_secs()),
            _ => s.serialize_str(&format!("{}ms", self.0.as_millis())),
        }
    }
}

impl Serialize for Millis {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(self.0.as_millis()).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_and_bare_seconds() {
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("5min"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration(" 1d "), Ok(Duration::from_secs(86_400)));
        for bad in ["", "s", "5 parsecs", "-1s", "1.5s", "99999999999999999999s"] {
            assert!(parse_duration(bad).unwrap_err().contains("is not a duration"), "{bad}");
        }
    }

    #[derive(Debug, Deserialize, Serialize)]
    struct Keys {
        a_secs: Option<Seconds>,
        b_ms: Option<Millis>,
    }

    fn keys(toml_text: &str) -> Result<Keys, String> {
        toml::from_str(toml_text).map_err(|e| e.to_string())
    }

    #[test]
    fn file_keys_take_their_unit_or_a_string_with_one() {
        let k = keys("a_secs = 10\nb_ms = 1500").unwrap();
        assert_eq!(
            (k.a_secs, k.b_ms),
            (Some(Seconds(Duration::from_secs(10))), Some(Millis(Duration::from_millis(1500))))
        );
        let k = keys("a_secs = \"500ms\"\nb_ms = \"2s\"").unwrap();
        assert_eq!(
            (k.a_secs, k.b_ms),
            (Some(Seconds(Duration::from_millis(500))), Some(Millis(Duration::from_secs(2))))
        );
        let k = keys("a_secs = 0.25\nb_ms = \"40\"").unwrap();
        assert_eq!(
            (k.a_secs, k.b_ms),
            (Some(Seconds(Duration::from_millis(250))), Some(Millis(Duration::from_millis(40))))
        );
        for bad in ["a_secs = -1", "a_secs = \"5 parsecs\"", "a_secs = true", "b_ms = 1.5e300", "a_secs = nan"] {
            let e = keys(bad).unwrap_err();
            assert!(e.contains("duration") || e.contains("a number of"), "{bad}: {e}");
        }
    }

    #[test]
    fn written_back_as_the_number_when_whole() {
        let k = Keys { a_secs: Some(Seconds(Duration::from_secs(30))), b_ms: Some(Millis(Duration::from_millis(250))) };
        assert_eq!(toml::to_string(&k).unwrap(), "a_secs = 30\nb_ms = 250\n");
        let k = Keys { a_secs: Some(Seconds(Duration::from_millis(1500))), b_ms: None };
        let text = toml::to_string(&k).unwrap();
        assert_eq!(keys(&text).unwrap().a_secs, k.a_secs, "{text}");
    }
}
