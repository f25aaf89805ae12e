//! A bounds-checked cursor over a `Bytes` buffer.
//!
//! Every read names the message and field it is for, so a short buffer turns
//! into a [`DecodeError::Truncated`] that says exactly what was missing. All
//! byte strings are handed out as `Bytes` slices sharing the input's
//! allocation (zero-copy).

use bytes::{Buf, Bytes};

use crate::{DecodeError, Lsn};

#[derive(Debug, Clone)]
pub(crate) struct Reader {
    buf: Bytes,
    message: &'static str,
}

impl Reader {
    pub(crate) fn new(buf: Bytes, message: &'static str) -> Self {
        Reader { buf, message }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len()
    }

    /// The unread bytes, without consuming them.
    pub(crate) fn rest(&self) -> &Bytes {
        &self.buf
    }

    pub(crate) fn truncated(&self, field: &'static str, needed: usize) -> DecodeError {
        DecodeError::Truncated { message: self.message, field, needed, remaining: self.buf.len() }
    }

    pub(crate) fn invalid(&self, field: &'static str, reason: String) -> DecodeError {
        DecodeError::Invalid { message: self.message, field, reason }
    }

    /// Takes the next `len` bytes as a zero-copy slice.
    pub(crate) fn bytes(&mut self, len: usize, field: &'static str) -> Result<Bytes, DecodeError> {
        if len > self.buf.len() {
            return Err(self.truncated(field, len));
        }
        // Cannot panic: `len <= self.buf.len()` was checked just above.
        Ok(self.buf.split_to(len))
    }

    /// Takes everything that is left.
    pub(crate) fn rest_bytes(&mut self) -> Bytes {
        std::mem::take(&mut self.buf)
    }

    /// Skips the next `len` bytes (a value only validated, not kept).
    pub(crate) fn skip(&mut self, len: usize, field: &'static str) -> Result<(), DecodeError> {
        if len > self.buf.len() {
            return Err(self.truncated(field, len));
        }
        // Cannot panic: `len <= self.buf.len()` was checked just above.
        self.buf.advance(len);
        Ok(())
    }

    /// The next `N` bytes as an array. Read from the slice, not through a `Bytes`
    /// slice: a shared `Bytes` costs a reference-count increment and decrement, which
    /// for a 1-byte field is most of the work.
    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], DecodeError> {
        let Some(head) = self.buf.get(..N) else {
            return Err(self.truncated(field, N));
        };
        // `head` has exactly N bytes, so the conversion cannot fail; the error arm only
        // exists to stay panic-free without an `expect`.
        let array = <[u8; N]>::try_from(head).map_err(|_| self.truncated(field, N))?;
        self.buf.advance(N);
        Ok(array)
    }

    pub(crate) fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        let [byte] = self.array::<1>(field)?;
        Ok(byte)
    }

    pub(crate) fn i16(&mut self, field: &'static str) -> Result<i16, DecodeError> {
        Ok(i16::from_be_bytes(self.array(field)?))
    }

    pub(crate) fn u32(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array(field)?))
    }

    pub(crate) fn i32(&mut self, field: &'static str) -> Result<i32, DecodeError> {
        Ok(i32::from_be_bytes(self.array(field)?))
    }

    pub(crate) fn i64(&mut self, field: &'static str) -> Result<i64, DecodeError> {
        Ok(i64::from_be_bytes(self.array(field)?))
    }

    pub(crate) fn lsn(&mut self, field: &'static str) -> Result<Lsn, DecodeError> {
        Ok(Lsn(u64::from_be_bytes(self.array(field)?)))
    }

    /// A byte that must be 0 or 1.
    pub(crate) fn bool(&mut self, field: &'static str) -> Result<bool, DecodeError> {
        match self.u8(field)? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(self.invalid(field, format!("expected 0 or 1, got {other}"))),
        }
    }

    /// A NUL-terminated string, returned without its NUL.
    ///
    /// A missing NUL can only mean the input ended inside the string, so it is
    /// reported as truncation.
    pub(crate) fn cstr(&mut self, field: &'static str) -> Result<Bytes, DecodeError> {
        let Some(nul_at) = self.buf.iter().position(|&byte| byte == 0) else {
            return Err(self.truncated(field, self.buf.len().saturating_add(1)));
        };
        // Cannot panic: `nul_at` is an index into `buf`, so `nul_at < len`,
        // and after the split the NUL itself is left to advance over.
        let text = self.buf.split_to(nul_at);
        self.buf.advance(1);
        Ok(text)
    }

    /// A length or count that the protocol sends as a signed integer but that
    /// must not be negative.
    pub(crate) fn non_negative_i32(&mut self, field: &'static str) -> Result<usize, DecodeError> {
        let value = self.i32(field)?;
        usize::try_from(value).map_err(|_| self.invalid(field, format!("negative value {value}")))
    }

    pub(crate) fn non_negative_i16(&mut self, field: &'static str) -> Result<u16, DecodeError> {
        let value = self.i16(field)?;
        u16::try_from(value).map_err(|_| self.invalid(field, format!("negative value {value}")))
    }

    /// Refuses a count whose items cannot possibly fit in what is left, before
    /// anything is allocated for them: a hostile count must not make us
    /// reserve memory the input does not back.
    pub(crate) fn check_room_for(
        &self,
        count: usize,
        min_item_size: usize,
        field: &'static str,
    ) -> Result<(), DecodeError> {
        let needed = count.saturating_mul(min_item_size);
        if needed > self.buf.len() {
            return Err(self.truncated(field, needed));
        }
        Ok(())
    }

    /// Ends a message: anything left over is an error.
    pub(crate) fn finish(self) -> Result<(), DecodeError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes { message: self.message, extra: self.buf.len() })
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)] // tests may fail loudly
mod tests {
    use super::*;

    #[test]
    fn reads_big_endian_fields_and_reports_truncation() {
        let mut reader = Reader::new(Bytes::from_static(b"\x01\x00\x02\xff\xff\xff\xfeab\0rest"), "Test");
        assert!(reader.bool("flag").unwrap());
        assert_eq!(reader.i16("count").unwrap(), 2);
        assert_eq!(reader.i32("len").unwrap(), -2);
        assert_eq!(reader.cstr("name").unwrap(), Bytes::from_static(b"ab"));
        assert_eq!(
            reader.i64("time"),
            Err(DecodeError::Truncated { message: "Test", field: "time", needed: 8, remaining: 4 })
        );
        // A failed read consumes nothing.
        assert_eq!(reader.remaining(), 4);
        assert_eq!(
            reader.cstr("tail"),
            Err(DecodeError::Truncated { message: "Test", field: "tail", needed: 5, remaining: 4 })
        );
        assert_eq!(reader.clone().finish(), Err(DecodeError::TrailingBytes { message: "Test", extra: 4 }));
        assert_eq!(reader.rest_bytes(), Bytes::from_static(b"rest"));
        reader.finish().unwrap();
    }

    #[test]
    fn rejects_negative_lengths_and_non_boolean_flags() {
        let mut reader = Reader::new(Bytes::from_static(b"\xff\xff\xff\xff\x80\x00\x02"), "Test");
        match reader.non_negative_i32("len") {
            Err(DecodeError::Invalid { field, reason, .. }) => {
                assert_eq!(field, "len");
                assert!(reason.contains("-1"), "{reason}");
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(matches!(reader.non_negative_i16("count"), Err(DecodeError::Invalid { .. })));
        assert!(matches!(reader.bool("flag"), Err(DecodeError::Invalid { .. })));
    }

    #[test]
    fn refuses_counts_the_remaining_bytes_cannot_hold() {
        let reader = Reader::new(Bytes::from_static(&[0; 10]), "Test");
        assert!(reader.check_room_for(1, 10, "columns").is_ok());
        assert_eq!(
            reader.check_room_for(usize::MAX, 10, "columns"),
            Err(DecodeError::Truncated { message: "Test", field: "columns", needed: usize::MAX, remaining: 10 })
        );
    }
}
