//! How librdkafka's log lines reach walpost's log, for every client alike: DEBUG for
//! librdkafka's debug, info and notice lines and for what the client calls quiet; the
//! others throttled by kind ([`crate::throttle`]), ERROR for errors and worse, WARN
//! otherwise, saying how many of their kind were left out.
//!
//! A macro, so that each line keeps the module of the client that logged it as its
//! target (`walpost::kafka::sink`, `inbox::consumer`: the runbooks quote them).

use rdkafka::config::RDKafkaLogLevel;

/// How loud a librdkafka line is logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loudness {
    Debug,
    Warn,
    Error,
}

/// Whether a line of `level` is librdkafka's chatter (debug, info, notice).
pub fn chatter(level: RDKafkaLogLevel) -> bool {
    matches!(level, RDKafkaLogLevel::Debug | RDKafkaLogLevel::Info | RDKafkaLogLevel::Notice)
}

/// How loud a line of `level` is logged once admitted.
pub fn loudness(level: RDKafkaLogLevel) -> Loudness {
    match level {
        RDKafkaLogLevel::Emerg | RDKafkaLogLevel::Alert | RDKafkaLogLevel::Critical | RDKafkaLogLevel::Error => {
            Loudness::Error
        }
        RDKafkaLogLevel::Warning => Loudness::Warn,
        _ => Loudness::Debug,
    }
}

/// Logs librdkafka's line (`ClientContext::log`): `librdkafka_line!(throttle, level,
/// facility, line, quiet)`, `quiet` being what the client itself counts as noise.
#[macro_export]
macro_rules! librdkafka_line {
    ($throttle:expr, $level:expr, $fac:expr, $line:expr, $quiet:expr) => {{
        let (fac, line): (&str, &str) = ($fac, $line);
        let quiet = $quiet || $crate::log::chatter($level);
        let admitted = if quiet { None } else { $throttle.admit(fac, line, ::std::time::Instant::now()) };
        match admitted.map(|n| ($crate::log::loudness($level), n)) {
            None | Some(($crate::log::Loudness::Debug, _)) => {
                ::tracing::debug!(facility = fac, "librdkafka: {line}")
            }
            Some(($crate::log::Loudness::Warn, n)) => {
                ::tracing::warn!(facility = fac, "librdkafka: {line}{}", $crate::throttle::left_out_note(n))
            }
            Some(($crate::log::Loudness::Error, n)) => {
                ::tracing::error!(facility = fac, "librdkafka: {line}{}", $crate::throttle::left_out_note(n))
            }
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_and_worse_are_errors_warnings_warnings_and_the_rest_chatter() {
        assert_eq!(loudness(RDKafkaLogLevel::Critical), Loudness::Error);
        assert_eq!(loudness(RDKafkaLogLevel::Error), Loudness::Error);
        assert_eq!(loudness(RDKafkaLogLevel::Warning), Loudness::Warn);
        assert!(chatter(RDKafkaLogLevel::Notice) && !chatter(RDKafkaLogLevel::Warning));
    }
}
