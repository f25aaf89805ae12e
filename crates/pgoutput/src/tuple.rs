//! Row images (`TupleData`): validated once, then read lazily and zero-copy.

use std::fmt;
use std::iter::FusedIterator;

use bytes::{BufMut, Bytes, BytesMut};

use crate::reader::Reader;
use crate::DecodeError;

/// Smallest encoding of one column: a kind byte alone (`'n'` or `'u'`).
const MIN_COLUMN_SIZE: usize = 1;

/// One column of a row image.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ColumnValue {
    /// SQL NULL (`'n'`).
    Null,
    /// A TOASTed value that did not change and that PostgreSQL therefore did
    /// not send (`'u'`, only in the new tuple of an Update).
    UnchangedToast,
    /// The value in PostgreSQL's text output format (`'t'`).
    Text(Bytes),
    /// The value in the type's binary send format (`'b'`, only when the
    /// subscription asked for `binary`).
    Binary(Bytes),
}

/// A row image as PostgreSQL sent it (the `TupleData` of Insert, Update and
/// Delete).
///
/// It is validated completely when the message is decoded, so iterating can
/// not fail. It keeps the raw column bytes (a slice of the input) and the
/// column count: there is no allocation per column, and every
/// [`ColumnValue::Text`]/[`ColumnValue::Binary`] it yields is a slice of the
/// same buffer.
///
/// Two tuples are equal exactly when they hold the same column values, since
/// each list of values has only one encoding.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct TupleData {
    /// The column entries, after the Int16 column count.
    columns: Bytes,
    column_count: u16,
}

impl TupleData {
    /// Number of columns.
    pub fn len(&self) -> usize {
        usize::from(self.column_count)
    }

    /// True when the tuple has no columns.
    pub fn is_empty(&self) -> bool {
        self.column_count == 0
    }

    /// The columns in order, decoded lazily.
    pub fn iter(&self) -> TupleIter<'_> {
        TupleIter { tuple: self, spans: self.spans() }
    }

    /// The columns in order as [`ColumnSpan`]s: a walk that makes no `Bytes` (and so
    /// no reference-count traffic) for columns the caller never reads. For wide rows of
    /// which a few columns are used, such as an outbox row; [`TupleData::value`] turns a
    /// span into its value.
    pub fn spans(&self) -> Spans<'_> {
        Spans { columns: &self.columns, at: 0, columns_left: self.column_count }
    }

    /// The value `span` stands for; `None` when the span does not lie within this
    /// tuple (one taken from another tuple).
    pub fn value(&self, span: ColumnSpan) -> Option<ColumnValue> {
        let slice = |offset: usize, len: usize| {
            let end = offset.checked_add(len)?;
            // Cannot panic: `offset <= end <= len` is checked first.
            (end <= self.columns.len()).then(|| self.columns.slice(offset..end))
        };
        Some(match span {
            ColumnSpan::Null => ColumnValue::Null,
            ColumnSpan::UnchangedToast => ColumnValue::UnchangedToast,
            ColumnSpan::Text { offset, len } => ColumnValue::Text(slice(offset, len)?),
            ColumnSpan::Binary { offset, len } => ColumnValue::Binary(slice(offset, len)?),
        })
    }

    /// The column at `index` (0-based), found by walking the columns before it.
    pub fn get(&self, index: usize) -> Option<ColumnValue> {
        self.iter().nth(index)
    }

    /// Builds a tuple from values, e.g. for tests or the encoder.
    ///
    /// The wire format limits a tuple to `i16::MAX` (32767) columns and a
    /// value to `i32::MAX` bytes; PostgreSQL itself never comes close (1664
    /// columns, 1 GB values). Beyond those limits this function cannot fail or
    /// panic, so it keeps the first 32767 values and the first `i32::MAX`
    /// bytes of a value.
    pub fn from_values(values: &[ColumnValue]) -> TupleData {
        let column_count = u16::try_from(values.len()).unwrap_or(u16::MAX).min(i16::MAX.unsigned_abs());
        let mut columns = BytesMut::new();
        for value in values.iter().take(usize::from(column_count)) {
            match value {
                ColumnValue::Null => columns.put_u8(b'n'),
                ColumnValue::UnchangedToast => columns.put_u8(b'u'),
                ColumnValue::Text(bytes) => put_counted(&mut columns, b't', bytes),
                ColumnValue::Binary(bytes) => put_counted(&mut columns, b'b', bytes),
            }
        }
        TupleData { columns: columns.freeze(), column_count }
    }

    /// Reads and validates a `TupleData` (Int16 count, then the columns),
    /// leaving the reader just after it.
    pub(crate) fn decode(reader: &mut Reader) -> Result<TupleData, DecodeError> {
        let column_count = reader.non_negative_i16("tuple column count")?;
        reader.check_room_for(usize::from(column_count), MIN_COLUMN_SIZE, "tuple columns")?;
        let mut columns = reader.rest().clone();
        let before = reader.remaining();
        for _ in 0..column_count {
            skip_column(reader)?;
        }
        // The walk only ever shrinks the reader, so this never saturates.
        let consumed = before.saturating_sub(reader.remaining());
        columns.truncate(consumed);
        Ok(TupleData { columns, column_count })
    }

    /// Moves `reader` past one column if it holds it whole (the reader may have moved
    /// into a column it does not hold whole: callers stop then).
    pub(crate) fn skip_one(reader: &mut Reader) -> Result<(), DecodeError> {
        skip_column(reader)
    }

    /// A tuple of `column_count` columns whose bytes `skip_one` walked.
    pub(crate) fn from_validated(columns: Bytes, column_count: u16) -> TupleData {
        TupleData { columns, column_count }
    }

    /// Writes the wire form (Int16 count, then the columns).
    pub(crate) fn encode(&self, out: &mut BytesMut) {
        // `column_count` never exceeds i16::MAX: `decode` rejects negative
        // counts and `from_values` caps it.
        out.put_i16(i16::try_from(self.column_count).unwrap_or(i16::MAX));
        out.put_slice(&self.columns);
    }
}

/// Writes a kind byte, an Int32 length and the value (at most `i32::MAX`
/// bytes of it, see [`TupleData::from_values`]).
fn put_counted(out: &mut BytesMut, kind: u8, value: &Bytes) {
    let max_len = usize::try_from(i32::MAX).unwrap_or(usize::MAX);
    // `get` yields None when the value is shorter than the cap: keep it whole.
    let value: &[u8] = value.get(..max_len).unwrap_or(value.as_ref());
    out.put_u8(kind);
    out.put_i32(i32::try_from(value.len()).unwrap_or(i32::MAX));
    out.put_slice(value);
}

/// Validates one column and moves past it. Once validated, a tuple is read by
/// [`Spans`], which therefore cannot fail.
fn skip_column(reader: &mut Reader) -> Result<(), DecodeError> {
    match reader.u8("tuple column kind")? {
        b'n' | b'u' => Ok(()),
        b't' | b'b' => {
            let len = reader.non_negative_i32("tuple column length")?;
            reader.skip(len, "tuple column value")
        }
        other => Err(bad_kind(reader, other)),
    }
}

fn bad_kind(reader: &Reader, kind: u8) -> DecodeError {
    reader.invalid(
        "tuple column kind",
        format!("byte {kind:#04x} ('{}') is none of 'n', 'u', 't', 'b'", char::from(kind).escape_default()),
    )
}

impl fmt::Debug for TupleData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<'a> IntoIterator for &'a TupleData {
    type Item = ColumnValue;
    type IntoIter = TupleIter<'a>;

    fn into_iter(self) -> TupleIter<'a> {
        self.iter()
    }
}

/// Iterator over the columns of a [`TupleData`], see [`TupleData::iter`]: its
/// [`Spans`], each made a value.
#[derive(Debug, Clone)]
pub struct TupleIter<'a> {
    tuple: &'a TupleData,
    spans: Spans<'a>,
}

impl Iterator for TupleIter<'_> {
    type Item = ColumnValue;

    fn next(&mut self) -> Option<ColumnValue> {
        // A span of this tuple always lies within it; if one somehow did not, ending
        // the iteration is the panic-free answer.
        let value = self.tuple.value(self.spans.next()?);
        if value.is_none() {
            self.spans.columns_left = 0;
        }
        value
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.spans.size_hint()
    }
}

impl ExactSizeIterator for TupleIter<'_> {}
impl FusedIterator for TupleIter<'_> {}

/// Where one column's value lies in its [`TupleData`] (see [`TupleData::spans`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ColumnSpan {
    Null,
    UnchangedToast,
    /// `len` bytes from `offset` of the tuple's column bytes.
    Text {
        offset: usize,
        len: usize,
    },
    Binary {
        offset: usize,
        len: usize,
    },
}

/// Iterator over the [`ColumnSpan`]s of a [`TupleData`], see [`TupleData::spans`].
#[derive(Debug, Clone)]
pub struct Spans<'a> {
    columns: &'a [u8],
    at: usize,
    columns_left: u16,
}

impl Spans<'_> {
    /// The span at `self.at`, moving past it; `None` if the bytes do not hold one
    /// (they were validated when the tuple was built, so only as a panic-free answer).
    fn read(&mut self) -> Option<ColumnSpan> {
        let kind = *self.columns.get(self.at)?;
        let after_kind = self.at.checked_add(1)?;
        let span = match kind {
            b'n' | b'u' => {
                self.at = after_kind;
                return Some(if kind == b'n' { ColumnSpan::Null } else { ColumnSpan::UnchangedToast });
            }
            b't' | b'b' => {
                let offset = after_kind.checked_add(4)?;
                let len_bytes = <[u8; 4]>::try_from(self.columns.get(after_kind..offset)?).ok()?;
                let len = usize::try_from(i32::from_be_bytes(len_bytes)).ok()?;
                let end = offset.checked_add(len)?;
                if end > self.columns.len() {
                    return None;
                }
                self.at = end;
                if kind == b't' {
                    ColumnSpan::Text { offset, len }
                } else {
                    ColumnSpan::Binary { offset, len }
                }
            }
            _ => return None,
        };
        Some(span)
    }
}

impl Iterator for Spans<'_> {
    type Item = ColumnSpan;

    fn next(&mut self) -> Option<ColumnSpan> {
        let left = self.columns_left.checked_sub(1)?;
        let span = self.read();
        self.columns_left = if span.is_some() { left } else { 0 };
        span
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = usize::from(self.columns_left);
        (left, Some(left))
    }
}

impl ExactSizeIterator for Spans<'_> {}
impl FusedIterator for Spans<'_> {}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)] // tests may fail loudly
mod tests {
    use super::*;

    fn decode(bytes: &'static [u8]) -> Result<TupleData, DecodeError> {
        let mut reader = Reader::new(Bytes::from_static(bytes), "Insert");
        let tuple = TupleData::decode(&mut reader)?;
        reader.finish()?;
        Ok(tuple)
    }

    #[test]
    fn spans_point_into_the_column_bytes_and_refuse_foreign_ranges() {
        let tuple = decode(b"\x00\x04nut\x00\x00\x00\x0242b\x00\x00\x00\x01\xff").unwrap();
        let spans: Vec<_> = tuple.spans().collect();
        assert_eq!(
            spans,
            vec![
                ColumnSpan::Null,
                ColumnSpan::UnchangedToast,
                ColumnSpan::Text { offset: 7, len: 2 },
                ColumnSpan::Binary { offset: 14, len: 1 },
            ]
        );
        assert_eq!(
            tuple.value(ColumnSpan::Text { offset: 7, len: 2 }),
            Some(ColumnValue::Text(Bytes::from_static(b"42")))
        );
        assert_eq!(tuple.value(ColumnSpan::Text { offset: 14, len: 2 }), None, "ends past the tuple");
        assert_eq!(tuple.value(ColumnSpan::Binary { offset: usize::MAX, len: 1 }), None, "overflows");
    }

    #[test]
    fn decodes_every_column_kind_lazily() {
        let tuple = decode(b"\x00\x04nut\x00\x00\x00\x0242b\x00\x00\x00\x01\xff").unwrap();
        assert_eq!(tuple.len(), 4);
        assert!(!tuple.is_empty());
        let values: Vec<_> = tuple.iter().collect();
        assert_eq!(
            values,
            vec![
                ColumnValue::Null,
                ColumnValue::UnchangedToast,
                ColumnValue::Text(Bytes::from_static(b"42")),
                ColumnValue::Binary(Bytes::from_static(b"\xff")),
            ]
        );
        assert_eq!(tuple.iter().len(), 4);
        assert_eq!(tuple.get(2), Some(ColumnValue::Text(Bytes::from_static(b"42"))));
        assert_eq!(tuple.get(4), None);
        assert_eq!(TupleData::from_values(&values), tuple);
        assert_eq!(format!("{tuple:?}"), "[Null, UnchangedToast, Text(b\"42\"), Binary(b\"\\xff\")]");
    }

    #[test]
    fn empty_tuple_and_empty_values() {
        let tuple = decode(b"\x00\x00").unwrap();
        assert!(tuple.is_empty());
        assert_eq!(tuple.iter().next(), None);
        let tuple = decode(b"\x00\x01t\x00\x00\x00\x00").unwrap();
        assert_eq!(tuple.get(0), Some(ColumnValue::Text(Bytes::new())));
    }

    #[test]
    fn rejects_bad_kinds_and_lengths() {
        match decode(b"\x00\x01x") {
            Err(DecodeError::Invalid { field, reason, .. }) => {
                assert_eq!(field, "tuple column kind");
                assert!(reason.contains("0x78 ('x')"), "{reason}");
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(matches!(
            decode(b"\x00\x01t\xff\xff\xff\xff"),
            Err(DecodeError::Invalid { field: "tuple column length", .. })
        ));
        assert!(matches!(decode(b"\xff\xff"), Err(DecodeError::Invalid { field: "tuple column count", .. })));
        assert_eq!(
            decode(b"\x00\x01t\x00\x00\x00\x05abc"),
            Err(DecodeError::Truncated { message: "Insert", field: "tuple column value", needed: 5, remaining: 3 })
        );
        // A count far beyond what is left fails before any walking.
        assert_eq!(
            decode(b"\x7f\xffnnn"),
            Err(DecodeError::Truncated { message: "Insert", field: "tuple columns", needed: 32767, remaining: 3 })
        );
    }

    #[test]
    fn values_are_slices_of_the_input() {
        let input = Bytes::from_static(b"\x00\x01t\x00\x00\x00\x03abc");
        let mut reader = Reader::new(input.clone(), "Insert");
        let tuple = TupleData::decode(&mut reader).unwrap();
        let Some(ColumnValue::Text(value)) = tuple.get(0) else {
            panic!("expected text");
        };
        assert_eq!(value.as_ptr(), input.as_ptr().wrapping_add(7));
    }
}
