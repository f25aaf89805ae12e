//! Percent-decoding for connection URLs and `OTEL_*` header lists: the `percent-encoding`
//! crate decodes, after a strict check it does not make (that every `%` starts an escape
//! of two hex digits: the crate passes a malformed one through as text, libpq refuses it).

/// Why a text could not be percent-decoded. Neither case quotes the text (it may hold a
/// password).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PercentError {
    /// A `%` not followed by two hex digits.
    BadEscape,
    /// The decoded bytes are not UTF-8.
    NotUtf8,
}

/// Decodes every `%xx` escape of `text`.
pub fn percent_decode(text: &str) -> Result<String, PercentError> {
    let bytes = text.as_bytes();
    for (i, b) in bytes.iter().enumerate() {
        if *b == b'%' {
            let escape = bytes.get(i + 1..i + 3).ok_or(PercentError::BadEscape)?;
            if !escape.iter().all(u8::is_ascii_hexdigit) {
                return Err(PercentError::BadEscape);
            }
        }
    }
    percent_encoding::percent_decode_str(text).decode_utf8().map(|s| s.into_owned()).map_err(|_| PercentError::NotUtf8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_decode_and_malformed_ones_are_errors() {
        assert_eq!(percent_decode("p%40ss%2Fw%25rd").as_deref(), Ok("p@ss/w%rd"));
        assert_eq!(percent_decode("plain").as_deref(), Ok("plain"));
        assert_eq!(percent_decode("caf%C3%A9").as_deref(), Ok("café"));
        for bad in ["%", "%4", "%zz", "a%4g"] {
            assert_eq!(percent_decode(bad), Err(PercentError::BadEscape), "{bad}");
        }
        assert_eq!(percent_decode("%FF"), Err(PercentError::NotUtf8));
    }
}
