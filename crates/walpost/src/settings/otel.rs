//! Span export's settings, from the standard `OTEL_*` environment variables: the `otlp`
//! crate reads them ([`OtelSettings::from_env`]); here they join the other sections.

pub use otlp::settings::{InvalidSetting, OtelSettings};

impl From<InvalidSetting> for super::ConfigError {
    fn from(e: InvalidSetting) -> Self {
        super::ConfigError::Invalid { key: e.key, value: e.value, expected: e.expected }
    }
}
