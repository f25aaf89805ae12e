//! Debezium's option names: which walpost implements, which it refuses, and the parser of
//! `table.fields.additional.placement`.

/// The `[router]` key of `table.fields.additional.placement`.
pub const ADDITIONAL_PLACEMENT: &str = "table.fields.additional.placement";

/// Options of Debezium's Outbox Event Router (`outbox-event-router.adoc`) that walpost
/// implements with Debezium's meaning. `table.expand.json.payload` is accepted and has no
/// effect: json/jsonb payloads always go out as JSON documents (see CONFORMANCE.md).
pub const DEBEZIUM_OPTIONS_IMPLEMENTED: &[&str] = &[
    "table.op.invalid.behavior",
    "table.field.event.id",
    "table.field.event.key",
    "table.field.event.timestamp",
    "table.field.event.payload",
    "table.expand.json.payload",
    ADDITIONAL_PLACEMENT,
    "table.field.additional.missing",
    "route.by.field",
    "route.topic.regex",
    "route.topic.replacement",
    "route.tombstone.on.empty.payload",
    "tracing.span.context.field",
];

/// Options Debezium documents for the Outbox Event Router that walpost does not
/// implement, with the reason: the binary refuses each by name at start-up.
pub const DEBEZIUM_OPTIONS_NOT_IMPLEMENTED: &[(&str, &str)] = &[
    (
        "table.field.event.schema.version",
        "it sets the Kafka Connect schema version of the value; walpost writes no Connect schemas",
    ),
    (
        "table.json.payload.null.behavior",
        "it tunes the schema table.expand.json.payload infers; walpost copies JSON payloads verbatim and infers no schema",
    ),
    (
        "table.json.payload.empty.array.behavior",
        "it tunes the schema table.expand.json.payload infers; walpost copies JSON payloads verbatim, empty arrays included",
    ),
    (
        "tracing.operation.name",
        "walpost names its spans after OpenTelemetry's messaging conventions (send <topic>)",
    ),
    (
        "tracing.with.context.field.only",
        "walpost's spans follow OTEL_TRACES_SAMPLER; parentbased_always_off traces only rows that carry a sampled trace context",
    ),
];

/// Where an additional column goes (`table.fields.additional.placement`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    Header(String),
    Envelope(String),
    Partition,
}

/// One `col:target[:alias]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdditionalField {
    pub column: String,
    pub placement: Placement,
}

impl AdditionalField {
    /// Parses Debezium's comma-separated `col:header[:alias],col:envelope[:alias],col:partition`.
    ///
    /// As in Debezium, the placement is case-insensitive, parts are trimmed, an empty
    /// alias means the column's name and a partition alias has no effect. An empty value
    /// or an empty entry is refused (Debezium refuses both, except trailing empty entries,
    /// which its Java `split` drops). Errors name the option.
    pub fn parse_list(text: &str) -> Result<Vec<AdditionalField>, String> {
        let bad = |reason: String| Err(format!("{ADDITIONAL_PLACEMENT}: {reason}"));
        if text.trim().is_empty() {
            return bad(
                "the value is empty; list column:header|envelope|partition[:alias] entries, or leave the option out"
                    .into(),
            );
        }
        let mut fields = Vec::new();
        for entry in text.split(',').map(str::trim) {
            if entry.is_empty() {
                return bad(format!("'{text}' has an empty entry"));
            }
            let parts: Vec<&str> = entry.split(':').map(str::trim).collect();
            let (column, target, alias) = match parts.as_slice() {
                [c, t] => (*c, *t, ""),
                [c, t, a] => (*c, *t, *a),
                _ => return bad(format!("'{entry}' is not column:header|envelope|partition[:alias]")),
            };
            if column.is_empty() {
                return bad(format!("'{entry}' has no column name"));
            }
            let alias = if alias.is_empty() { column } else { alias }.to_owned();
            let placement = match target.to_ascii_lowercase().as_str() {
                "header" => Placement::Header(alias),
                "envelope" => Placement::Envelope(alias),
                "partition" => Placement::Partition,
                _ => return bad(format!("'{entry}': placement '{target}' is not header, envelope or partition")),
            };
            fields.push(AdditionalField { column: column.to_owned(), placement });
        }
        Ok(fields)
    }
}
