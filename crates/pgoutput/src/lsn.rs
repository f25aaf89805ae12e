//! WAL positions and PostgreSQL timestamps.

use std::fmt;
use std::str::FromStr;

/// A WAL position (PostgreSQL's `pg_lsn`, `XLogRecPtr`).
///
/// Displays and parses as PostgreSQL does: two upper-case hexadecimal halves
/// without leading zeros, e.g. `16/B374D848` or `0/0`. Parsing also accepts
/// lower-case digits and leading zeros (up to 8 digits per half), as
/// PostgreSQL's own `pg_lsn` input does.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub struct Lsn(pub u64);

impl Lsn {
    /// `0/0`, PostgreSQL's `InvalidXLogRecPtr`.
    pub const ZERO: Lsn = Lsn(0);
}

impl From<u64> for Lsn {
    fn from(value: u64) -> Self {
        Lsn(value)
    }
}

impl From<Lsn> for u64 {
    fn from(lsn: Lsn) -> Self {
        lsn.0
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let high = self.0 >> 32;
        let low = self.0 & 0xFFFF_FFFF;
        write!(f, "{high:X}/{low:X}")
    }
}

/// Why a string is not an LSN.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error(
    "invalid LSN {input:?}: {reason} (expected two hexadecimal numbers of 1 to 8 digits separated by '/', like \"16/B374D848\")"
)]
pub struct ParseLsnError {
    input: String,
    reason: &'static str,
}

impl ParseLsnError {
    /// The text that failed to parse.
    pub fn input(&self) -> &str {
        &self.input
    }
}

impl FromStr for Lsn {
    type Err = ParseLsnError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let error = |reason| ParseLsnError { input: text.to_owned(), reason };
        let (high, low) = text.split_once('/').ok_or_else(|| error("no '/'"))?;
        let parse_half = |half: &str, which| -> Result<u64, ParseLsnError> {
            if half.is_empty() {
                return Err(error(which));
            }
            if half.len() > 8 {
                return Err(error("a half has more than 8 hexadecimal digits"));
            }
            // `from_str_radix` would also take a leading '+', which PostgreSQL
            // does not, so check the digits ourselves first.
            if !half.bytes().all(|byte| byte.is_ascii_hexdigit()) {
                return Err(error("a half contains a character that is not a hexadecimal digit"));
            }
            u32::from_str_radix(half, 16).map(u64::from).map_err(|_| error("a half is not a hexadecimal number"))
        };
        let high = parse_half(high, "the part before '/' is empty")?;
        let low = parse_half(low, "the part after '/' is empty")?;
        Ok(Lsn((high << 32) | low))
    }
}

/// Microseconds between the Unix epoch (1970-01-01) and PostgreSQL's epoch
/// (2000-01-01), both UTC: 10957 days.
const PG_EPOCH_OFFSET_MICROS: i64 = 946_684_800_000_000;

/// Converts a PostgreSQL timestamp (µs since 2000-01-01 UTC, as sent in
/// Begin/Commit/XLogData/keepalive messages) to µs since the Unix epoch.
///
/// Saturates instead of overflowing, so PostgreSQL's `infinity` timestamps
/// (`i64::MAX` / `i64::MIN`) stay at the ends of the range.
pub fn pg_epoch_micros_to_unix_micros(t: i64) -> i64 {
    t.saturating_add(PG_EPOCH_OFFSET_MICROS)
}

/// Converts µs since the Unix epoch to a PostgreSQL timestamp (µs since
/// 2000-01-01 UTC), saturating at the ends of the range. Use it for the
/// client time in a Standby Status Update.
pub fn unix_micros_to_pg_epoch_micros(t: i64) -> i64 {
    t.saturating_sub(PG_EPOCH_OFFSET_MICROS)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests may fail loudly
mod tests {
    use super::*;

    #[test]
    fn displays_like_postgresql() {
        assert_eq!(Lsn(0).to_string(), "0/0");
        assert_eq!(Lsn::ZERO.to_string(), "0/0");
        assert_eq!(Lsn(0x16_B374_D848).to_string(), "16/B374D848");
        assert_eq!(Lsn(0x1_0000_0000).to_string(), "1/0");
        assert_eq!(Lsn(0xA).to_string(), "0/A");
        assert_eq!(Lsn(u64::MAX).to_string(), "FFFFFFFF/FFFFFFFF");
    }

    #[test]
    fn parses_what_it_displays_and_what_postgresql_accepts() {
        for value in [0, 1, 0xA, 0x16_B374_D848, 0x1_0000_0000, u64::MAX] {
            let lsn = Lsn(value);
            assert_eq!(lsn.to_string().parse::<Lsn>().unwrap(), lsn);
        }
        assert_eq!("16/b374d848".parse::<Lsn>().unwrap(), Lsn(0x16_B374_D848));
        assert_eq!("00000016/0000000A".parse::<Lsn>().unwrap(), Lsn(0x16_0000_000A));
    }

    #[test]
    fn rejects_malformed_text_with_a_clear_message() {
        for bad in [
            "",
            "/",
            "0",
            "0/",
            "/0",
            "G/0",
            "0/G",
            "+1/0",
            "0/-1",
            " 0/0",
            "0/0 ",
            "0/0/0",
            "123456789/0",
            "0/123456789",
            "0x1/0",
        ] {
            let error = bad.parse::<Lsn>().unwrap_err();
            assert_eq!(error.input(), bad);
            let message = error.to_string();
            assert!(message.starts_with("invalid LSN"), "{message}");
            assert!(message.contains("16/B374D848"), "{message}");
        }
        assert_eq!(
            "12".parse::<Lsn>().unwrap_err().to_string(),
            "invalid LSN \"12\": no '/' (expected two hexadecimal numbers of 1 to 8 digits separated by '/', like \"16/B374D848\")"
        );
    }

    #[test]
    fn converts_between_epochs() {
        assert_eq!(pg_epoch_micros_to_unix_micros(0), 946_684_800_000_000);
        assert_eq!(unix_micros_to_pg_epoch_micros(946_684_800_000_000), 0);
        assert_eq!(pg_epoch_micros_to_unix_micros(i64::MAX), i64::MAX);
        assert_eq!(unix_micros_to_pg_epoch_micros(i64::MIN), i64::MIN);
        let t = 1_700_000_000_000_000;
        assert_eq!(pg_epoch_micros_to_unix_micros(unix_micros_to_pg_epoch_micros(t)), t);
    }
}
