//! The one error type every decoding function in this crate returns.

/// Why a byte string could not be decoded.
///
/// The variants separate two situations that look alike but mean different
/// things to an operator:
///
/// * [`DecodeError::Truncated`]: the input *ran out* before the message was
///   complete — a field, a string's NUL terminator, or the items a count
///   promised were missing. Every strict prefix of a valid message decodes to
///   this variant (a property the tests check). The decoder is always given a
///   whole CopyData payload, so this is not a "read more and retry" signal: it
///   means the payload itself was cut short.
/// * [`DecodeError::Invalid`]: a byte that *is* present holds a value the
///   protocol does not allow (a negative length, an unknown tuple column kind,
///   an old-tuple marker other than `'K'`/`'O'`, ...).
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// The message ended before a field it must contain. Not recoverable for a
    /// complete CopyData payload — named so because the payload was cut short.
    #[error("pgoutput {message} message truncated: needed {needed} more bytes for {field}, {remaining} left")]
    Truncated {
        /// Message type being decoded, e.g. `"Insert"` or `"XLogData"`.
        message: &'static str,
        /// Field that could not be read, e.g. `"commit_lsn"`.
        field: &'static str,
        /// Bytes the field needs at least (for a NUL-terminated string without
        /// its NUL: one more than was left).
        needed: usize,
        /// Bytes that were left in the message.
        remaining: usize,
    },
    /// The first byte of the message is not a message type this crate knows.
    #[error(
        "pgoutput message tag {tag:#04x} ('{}') is not a known message type",
        printable_tag(*.tag)
    )]
    UnknownTag {
        /// The unknown tag byte.
        tag: u8,
    },
    /// A field is present but holds a value the protocol does not allow.
    #[error("pgoutput {message} message: invalid {field}: {reason}")]
    Invalid {
        /// Message type being decoded.
        message: &'static str,
        /// Field holding the bad value.
        field: &'static str,
        /// What is wrong with it, naming the offending value.
        reason: String,
    },
    /// Bytes follow the last field of a message whose length is fully
    /// determined by its fields; a sign the message was misparsed or the
    /// protocol version is not the one expected.
    #[error("pgoutput {message} message has {extra} trailing bytes after its last field")]
    TrailingBytes {
        /// Message type being decoded.
        message: &'static str,
        /// Number of unexpected bytes at the end.
        extra: usize,
    },
}

impl DecodeError {
    /// True for [`DecodeError::Truncated`]: the input ended early, as opposed
    /// to containing a bad value.
    pub fn is_truncated(&self) -> bool {
        matches!(self, DecodeError::Truncated { .. })
    }
}

/// Renders a tag byte for an error message without letting control
/// characters or non-ASCII bytes garble the log line.
fn printable_tag(tag: u8) -> String {
    char::from(tag).escape_default().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_read_well() {
        let truncated = DecodeError::Truncated { message: "Begin", field: "xid", needed: 4, remaining: 1 };
        assert_eq!(truncated.to_string(), "pgoutput Begin message truncated: needed 4 more bytes for xid, 1 left");
        assert!(truncated.is_truncated());

        let unknown = DecodeError::UnknownTag { tag: b'Z' };
        assert_eq!(unknown.to_string(), "pgoutput message tag 0x5a ('Z') is not a known message type");
        assert!(!unknown.is_truncated());
        let control = DecodeError::UnknownTag { tag: 0 };
        assert_eq!(control.to_string(), "pgoutput message tag 0x00 ('\\u{0}') is not a known message type");

        let trailing = DecodeError::TrailingBytes { message: "Commit", extra: 3 };
        assert_eq!(trailing.to_string(), "pgoutput Commit message has 3 trailing bytes after its last field");
    }
}
