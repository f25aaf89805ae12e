//! librdkafka's log lines and errors, throttled: a failure that lasts (a SASL handshake
//! refused, a broker down) is reported by librdkafka every few hundred milliseconds, each
//! line differing from the last only in numbers (`after 5ms in state AUTH_REQ, 4
//! identical error(s) suppressed`), and several kinds interleaved. Each kind of line is
//! logged at most once per [`WINDOW`]; the next one says how many were left out.
//!
//! A kind is a line with every run of digits as `#`, so one failure's repeats are one
//! kind and different failures are not. At most [`MAX_KINDS`] kinds are remembered.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Lines of one kind are logged at most once per this long.
pub const WINDOW: Duration = Duration::from_secs(30);

/// Kinds remembered at most: past that, kinds seen longer than [`WINDOW`] ago are
/// forgotten (or all, if none is).
const MAX_KINDS: usize = 256;

/// See the module docs.
#[derive(Debug, Default)]
pub struct LogThrottle {
    seen: Mutex<HashMap<String, Seen>>,
}

#[derive(Debug)]
struct Seen {
    logged: Instant,
    left_out: u64,
}

impl LogThrottle {
    /// Whether `line` (of `facility`) is logged now: `Some(n)` with the lines of its kind
    /// left out since it was last logged, `None` to leave it out.
    pub fn admit(&self, facility: &str, line: &str, now: Instant) -> Option<u64> {
        let kind = kind(facility, line);
        let Ok(mut seen) = self.seen.lock() else { return Some(0) };
        if let Some(s) = seen.get_mut(&kind) {
            if now.saturating_duration_since(s.logged) < WINDOW {
                s.left_out += 1;
                return None;
            }
            let left_out = s.left_out;
            *s = Seen { logged: now, left_out: 0 };
            return Some(left_out);
        }
        if seen.len() >= MAX_KINDS {
            seen.retain(|_, s| now.saturating_duration_since(s.logged) < WINDOW);
            if seen.len() >= MAX_KINDS {
                seen.clear();
            }
        }
        seen.insert(kind, Seen { logged: now, left_out: 0 });
        Some(0)
    }
}

/// What a line logged after `left_out` lines of its kind were left out ends with.
pub fn left_out_note(left_out: u64) -> String {
    if left_out == 0 {
        String::new()
    } else {
        format!(" ({left_out} more like it in the last {} s not shown)", WINDOW.as_secs())
    }
}

/// The kind of a line: its facility and text, each run of digits as `#`.
fn kind(facility: &str, line: &str) -> String {
    let mut out = String::with_capacity(facility.len() + line.len() + 1);
    out.push_str(facility);
    out.push(' ');
    let mut in_digits = false;
    for c in line.chars() {
        if c.is_ascii_digit() {
            if !in_digits {
                out.push('#');
            }
            in_digits = true;
        } else {
            out.push(c);
            in_digits = false;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: a refused SASL handshake was logged at ERROR several times a second:
    /// its lines differ in their numbers and alternate with other kinds, so "the same
    /// line as the last one" never matched.
    #[test]
    fn regression_a_failed_sasl_handshake_is_logged_once_per_window() {
        let t = LogThrottle::default();
        let start = Instant::now();
        let sasl = |ms: u32, n: u32| {
            format!("[thrd:sasl_plaintext://127.0.0.1:39093/bootstrap]: sasl_plaintext://127.0.0.1:39093/bootstrap: SASL authentication error: Authentication failed: Invalid username or password (after {ms}ms in state AUTH_REQ, {n} identical error(s) suppressed)")
        };
        let down = "1/1 brokers are down";
        let mut logged = Vec::new();
        // 4 lines a second for 70 s, alternating with the "brokers are down" line.
        for i in 0..280u32 {
            let now = start + Duration::from_millis(250 * u64::from(i));
            let (fac, line) = if i % 2 == 0 { ("FAIL", sasl(i % 7, i)) } else { ("ERROR", down.to_owned()) };
            if let Some(n) = t.admit(fac, &line, now) {
                logged.push((i, fac, n));
            }
        }
        // Each kind at 0 s, 30 s and 60 s; the repeats say how many were left out.
        assert_eq!(
            logged,
            vec![
                (0, "FAIL", 0),
                (1, "ERROR", 0),
                (120, "FAIL", 59),
                (121, "ERROR", 59),
                (240, "FAIL", 59),
                (241, "ERROR", 59)
            ]
        );
        assert_eq!(left_out_note(59), " (59 more like it in the last 30 s not shown)");
        assert_eq!(left_out_note(0), "");
        // Another failure is its own kind, logged at once.
        assert_eq!(t.admit("FAIL", "Connect to ipv4#127.0.0.1:1 failed: Connection refused", start), Some(0));
    }

    #[test]
    fn kinds_are_bounded() {
        let t = LogThrottle::default();
        let now = Instant::now();
        for i in 0..(MAX_KINDS * 3) {
            // Letters, not digits: each its own kind.
            let line: String =
                format!("{i:x}").chars().map(|c| (b'a' + c.to_digit(16).unwrap_or(0) as u8) as char).collect();
            assert_eq!(t.admit("F", &line, now), Some(0));
        }
        assert!(t.seen.lock().unwrap().len() <= MAX_KINDS);
    }
}
