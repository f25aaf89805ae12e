//! Reading one row's cells for the router: each mapped column in the form its use needs
//! (a header's text, a value's bytes, a timestamp), with errors that name the column and
//! the event and show a value only when `log_values` allows.

use super::*;

/// A non-NULL column value as pgoutput sent it.
#[derive(Debug, Clone, Copy)]
pub(super) enum Cell<'a> {
    Text(&'a Bytes),
    Binary(&'a Bytes),
}

/// Which bytes a value becomes: [`value::plain`] or [`value::header`].
#[derive(Debug, Clone, Copy)]
pub(super) enum Form {
    Plain,
    Header,
}

impl Form {
    pub(super) fn render(self, kind: Kind, text: &Bytes) -> Result<Bytes, &'static str> {
        match self {
            Form::Plain => value::plain(kind, text),
            Form::Header => value::header(kind, text),
        }
    }
}

/// Reads one row's columns and words its errors (never with a value unless `log_values`).
pub(super) struct RowReader<'a> {
    pub(super) cells: &'a [ColumnValue],
    pub(super) table: &'a str,
    pub(super) log_values: bool,
    /// The row's event id once read (shown in errors, rendered only for one).
    pub(super) event_id: Option<Bytes>,
}

impl<'a> RowReader<'a> {
    /// The event id as errors show it.
    pub(super) fn shown_id(&self) -> Option<Box<str>> {
        self.event_id.as_deref().map(display_text)
    }

    /// `None` for NULL.
    pub(super) fn cell(&self, col: Col, column: &str) -> Result<Option<Cell<'a>>, RouteError> {
        match self.cells.get(col.index) {
            None | Some(ColumnValue::Null) => Ok(None),
            Some(ColumnValue::Text(b)) => Ok(Some(Cell::Text(b))),
            Some(ColumnValue::Binary(b)) => Ok(Some(Cell::Binary(b))),
            Some(ColumnValue::UnchangedToast) => Err(RouteError::UnchangedToast {
                table: self.table.to_owned(),
                column: column.to_owned(),
                event_id: self.shown_id(),
            }),
        }
    }

    pub(super) fn render_cell(
        &self,
        cell: Cell<'_>,
        col: Col,
        column: &str,
        config_key: &'static str,
        form: Form,
    ) -> Result<Bytes, RouteError> {
        match cell {
            Cell::Text(text) => {
                form.render(col.kind, text).map_err(|expected| self.bad_value(column, config_key, text, expected))
            }
            Cell::Binary(bytes) => Ok(bytes.clone()),
        }
    }

    pub(super) fn render(
        &self,
        col: Col,
        column: &str,
        config_key: &'static str,
        form: Form,
    ) -> Result<Option<Bytes>, RouteError> {
        match self.cell(col, column)? {
            None => Ok(None),
            Some(cell) => self.render_cell(cell, col, column, config_key, form).map(Some),
        }
    }

    pub(super) fn required(
        &self,
        col: Col,
        column: &str,
        config_key: &'static str,
        form: Form,
    ) -> Result<Bytes, RouteError> {
        self.render(col, column, config_key, form)?.ok_or_else(|| RouteError::NullField {
            table: self.table.to_owned(),
            column: column.to_owned(),
            config_key,
            event_id: self.shown_id(),
        })
    }

    pub(super) fn bad_value(
        &self,
        column: &str,
        config_key: &'static str,
        raw: &[u8],
        expected: &'static str,
    ) -> RouteError {
        RouteError::BadValue {
            table: self.table.to_owned(),
            column: column.to_owned(),
            config_key,
            event_id: self.shown_id(),
            value: self.log_values.then(|| display_text(raw)),
            expected,
        }
    }

    /// `table.field.event.timestamp`: NULL is no timestamp (the caller's commit time).
    pub(super) fn timestamp(&self, col: Col, column: &str) -> Result<Option<jiff::Timestamp>, RouteError> {
        let text = match self.cell(col, column)? {
            None => return Ok(None),
            Some(Cell::Text(text)) => text,
            Some(Cell::Binary(bytes)) => {
                return Err(self.bad_value(column, TIMESTAMP_KEY, bytes, "a timestamp in text format"))
            }
        };
        let ts = parse_timestamp(text).map_err(|expected| self.bad_value(column, TIMESTAMP_KEY, text, expected))?;
        if ts.as_millisecond() < 0 {
            return Err(self.bad_value(
                column,
                TIMESTAMP_KEY,
                text,
                "a timestamp from 1970-01-01 00:00:00 UTC on (Kafka refuses negative record timestamps)",
            ));
        }
        Ok(Some(ts))
    }

    /// A `:partition` placement: NULL is no explicit partition, as in Debezium.
    pub(super) fn partition(&self, col: Col, column: &str) -> Result<Option<i32>, RouteError> {
        const EXPECTED: &str = "a non-negative integer partition number";
        let text = match self.cell(col, column)? {
            None => return Ok(None),
            Some(Cell::Text(text) | Cell::Binary(text)) => text,
        };
        let p = std::str::from_utf8(text).ok().and_then(|t| t.trim().parse::<i32>().ok()).filter(|p| *p >= 0);
        p.map(Some).ok_or_else(|| self.bad_value(column, ADDITIONAL_PLACEMENT, text, EXPECTED))
    }

    /// `{"payload": <payload>, "<alias>": <value>, ...}`; a json/jsonb payload is copied
    /// in verbatim (no re-serialisation).
    pub(super) fn envelope(
        &self,
        payload_col: Col,
        payload_column: &str,
        payload: Cell<'_>,
        fields: &[(&ResolvedExtra, Option<Cell<'_>>)],
    ) -> Result<Bytes, RouteError> {
        let size = match payload {
            Cell::Text(b) | Cell::Binary(b) => b.len(),
        };
        let mut out = Vec::with_capacity(size + 64 * (fields.len() + 1));
        out.extend_from_slice(b"{\"payload\":");
        self.write_json(&mut out, payload_col, payload_column, "table.field.event.payload", Some(payload))?;
        for (field, cell) in fields {
            out.push(b',');
            value::write_json_string(&mut out, field.name.as_bytes())
                .map_err(|expected| self.bad_value(&field.column, ADDITIONAL_PLACEMENT, b"", expected))?;
            out.push(b':');
            self.write_json(&mut out, field.col, &field.column, ADDITIONAL_PLACEMENT, *cell)?;
        }
        out.push(b'}');
        Ok(Bytes::from(out))
    }

    pub(super) fn write_json(
        &self,
        out: &mut Vec<u8>,
        col: Col,
        column: &str,
        config_key: &'static str,
        cell: Option<Cell<'_>>,
    ) -> Result<(), RouteError> {
        match cell {
            None => value::write_json(out, col.kind, None).map_err(|e| self.bad_value(column, config_key, b"", e)),
            Some(Cell::Text(text)) => value::write_json(out, col.kind, Some(text))
                .map_err(|expected| self.bad_value(column, config_key, text, expected)),
            Some(Cell::Binary(bytes)) => {
                value::write_json_binary(out, bytes);
                Ok(())
            }
        }
    }
}

/// One header per key of a JSON object; strings unquoted, other values as JSON text. A
/// `reserved` key (the CloudEvents headers, when that envelope is on) is an error.
pub(super) fn expand_json_headers(
    json: &[u8],
    headers: &mut Vec<(Arc<str>, Bytes)>,
    reserved: fn(&str) -> bool,
) -> Result<(), &'static str> {
    let map: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(json).map_err(|_| "a JSON object")?;
    if map.keys().any(|k| reserved(k)) {
        return Err(
            "a JSON object without ce_* or content-type keys (envelope = \"cloudevents\" writes those headers)",
        );
    }
    if map.keys().any(|k| walpost_header(k)) {
        return Err("a JSON object without id, eventType or walpost.* keys (walpost writes those headers itself)");
    }
    if map.keys().any(|k| k.is_empty() || k.chars().any(char::is_control)) {
        return Err("a JSON object whose keys are non-empty and hold no control characters");
    }
    for (k, v) in map {
        let value = match v {
            serde_json::Value::String(s) => Bytes::from(s),
            other => Bytes::from(other.to_string()),
        };
        if value.iter().any(|b| *b == b'\r' || *b == b'\n') {
            return Err("a JSON object whose values hold no CR or LF (a header value is one line)");
        }
        headers.push((Arc::from(k.as_str()), value));
    }
    Ok(())
}

/// Header names walpost writes itself: a row's headers column may not add a second one.
fn walpost_header(name: &str) -> bool {
    name == HEADER_ID || name == HEADER_EVENT_TYPE || name.starts_with("walpost.")
}
