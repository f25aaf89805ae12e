//! Whether PostgreSQL answers again, asked cheaply while the stream waits to reconnect.
//!
//! The reconnect backoff grows to `max_backoff_secs` (30 s) during an outage, so a
//! session would start up to that long after the server is back. When the session ended
//! because no host answered ([`no_answer`]), the wait asks them every [`PROBE_EVERY`]
//! and ends as soon as one answers ([`wait_to_retry`]); the backoff then starts short
//! again.
//!
//! Invariants:
//! - Only an outage ends a wait early: a server that answered (and refused the session
//!   for another reason: starting up, the slot in use, ...) is not asked, and gets the
//!   whole wait, so such errors keep their backoff.
//! - The probe sends an SSLRequest and reads the one-byte reply; it sends no startup
//!   packet, credentials or query, and hangs up. It is sent only during an outage, and
//!   stops at the first reply.

use std::future::Future;
use std::time::Duration;

use backoff::sleep_or_shutdown;
use replication::{Config, Host, HostSpec};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::error::PipelineError;

/// While PostgreSQL does not answer, how often a wait to reconnect asks it.
pub(crate) const PROBE_EVERY: Duration = Duration::from_secs(1);
/// Time one host has to answer a probe (connect and reply).
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// An SSLRequest: length 8, then the code 1234.5679.
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

/// How a wait to reconnect ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waited {
    /// The whole wait passed.
    Elapsed,
    /// PostgreSQL, which did not answer, answers now.
    Answered,
    /// A signal asked walpost to stop.
    Shutdown,
}

/// Whether the session ended because no PostgreSQL host answered at all (refused,
/// unreachable, cut off), as opposed to a server that answered with an error.
pub(crate) fn no_answer(e: &PipelineError) -> bool {
    use replication::Error as E;
    let silent = |e: &E| matches!(e, E::Connect { .. } | E::ConnectTimeout { .. } | E::Io(_));
    match std::error::Error::source(e).and_then(|c| c.downcast_ref::<E>()) {
        Some(E::NoUsableHost { failures, not_tried }) => {
            not_tried.is_empty() && failures.iter().all(|f| silent(&f.error))
        }
        Some(cause) => silent(cause),
        None => false,
    }
}

/// Waits `wait`, or less: with `every` (no PostgreSQL host answered), `answers` is asked
/// every `every` and the wait ends once it says yes.
pub(crate) async fn wait_to_retry<F, Fut>(
    wait: Duration,
    every: Option<Duration>,
    mut answers: F,
    shutdown: &mut watch::Receiver<bool>,
) -> Waited
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + wait;
    let probing = every.filter(|every| wait > *every);
    loop {
        let next = probing.map_or(deadline, |every| (Instant::now() + every).min(deadline));
        if sleep_or_shutdown(next.saturating_duration_since(Instant::now()), shutdown).await {
            return Waited::Shutdown;
        }
        if Instant::now() >= deadline {
            return Waited::Elapsed;
        }
        if probing.is_some() {
            tokio::select! {
                answered = answers() => if answered {
                    return Waited::Answered;
                },
                _ = shutdown.changed() => return Waited::Shutdown,
            }
        }
    }
}

/// Whether a PostgreSQL server answers on one of `config`'s hosts.
pub(crate) async fn postgres_answers(config: &Config) -> bool {
    for host in &config.hosts {
        if tokio::time::timeout(PROBE_TIMEOUT, host_answers(host)).await.unwrap_or(false) {
            return true;
        }
    }
    false
}

async fn host_answers(host: &HostSpec) -> bool {
    match (&host.host, host.hostaddr) {
        (_, Some(addr)) => match tokio::net::TcpStream::connect((addr, host.port)).await {
            Ok(s) => replies(s).await,
            Err(_) => false,
        },
        (Host::Tcp(name), None) => match tokio::net::TcpStream::connect((name.as_str(), host.port)).await {
            Ok(s) => replies(s).await,
            Err(_) => false,
        },
        (Host::Unix(dir), None) => {
            match tokio::net::UnixStream::connect(dir.join(format!(".s.PGSQL.{}", host.port))).await {
                Ok(s) => replies(s).await,
                Err(_) => false,
            }
        }
    }
}

/// A PostgreSQL server replies to an SSLRequest with one byte (`S`, `N`, or `E` for an
/// error); a listener that closes at once (a proxy in front of a server that is down)
/// replies nothing.
async fn replies(mut s: impl AsyncRead + AsyncWrite + Unpin) -> bool {
    if s.write_all(&SSL_REQUEST).await.is_err() {
        return false;
    }
    let mut byte = [0u8; 1];
    matches!(s.read(&mut byte).await, Ok(1))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
    }

    /// Regression: after a 20 s outage the next session came up to 30 s (the grown
    /// backoff) after the server was back. A wait after a session no host answered ends
    /// at the first probe answered.
    #[test]
    fn regression_a_wait_ends_once_postgres_answers_again() {
        let asked = Arc::new(AtomicUsize::new(0));
        let (_tx, mut shutdown) = watch::channel(false);
        let started = std::time::Instant::now();
        let waited = runtime().block_on(wait_to_retry(
            Duration::from_secs(30),
            Some(Duration::from_millis(50)),
            || {
                let asked = asked.clone();
                // Down for the first 3 questions.
                async move { asked.fetch_add(1, Ordering::SeqCst) >= 3 }
            },
            &mut shutdown,
        ));
        assert_eq!(waited, Waited::Answered);
        assert_eq!(asked.load(Ordering::SeqCst), 4);
        assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    }

    /// A server that answered (with an error), or Kafka: nothing is asked and the whole
    /// wait passes; so does a wait no longer than one probe interval.
    #[test]
    fn a_wait_is_whole_without_an_outage() {
        let asked = Arc::new(AtomicUsize::new(0));
        let (_tx, mut shutdown) = watch::channel(false);
        let rt = runtime();
        let counting = || {
            let asked = asked.clone();
            async move {
                asked.fetch_add(1, Ordering::SeqCst);
                true
            }
        };
        let started = std::time::Instant::now();
        let waited = rt.block_on(wait_to_retry(Duration::from_millis(300), None, counting, &mut shutdown));
        assert_eq!(waited, Waited::Elapsed);
        assert!(started.elapsed() >= Duration::from_millis(300));
        let short = Some(Duration::from_millis(200));
        let waited = rt.block_on(wait_to_retry(Duration::from_millis(150), short, counting, &mut shutdown));
        assert_eq!(waited, Waited::Elapsed);
        assert_eq!(asked.load(Ordering::SeqCst), 0);
    }

    /// Only a session no host answered is an outage worth probing for.
    #[test]
    fn no_answer_is_every_host_silent() {
        use replication::{Error as E, HostFailure};
        let refused =
            || E::Connect { target: "a".into(), source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused) };
        let starting = || E::Protocol("the database system is starting up".into());
        let hosts = |errors: Vec<E>| {
            let failures = errors.into_iter().map(|error| HostFailure { host: "h".into(), error }).collect();
            PipelineError::from(E::NoUsableHost { failures, not_tried: Vec::new() })
        };
        assert!(no_answer(&PipelineError::from(refused())));
        assert!(no_answer(&PipelineError::from(E::ConnectTimeout { target: "a".into(), secs: 10 })));
        assert!(no_answer(&PipelineError::from(refused()).context("connecting")));
        assert!(no_answer(&hosts(vec![refused(), refused()])));
        assert!(!no_answer(&hosts(vec![refused(), starting()])), "one host answered");
        assert!(!no_answer(&PipelineError::from(starting())));
        assert!(!no_answer(&PipelineError::transient(crate::error::ErrorKind::Kafka, "kafka")));
    }

    #[test]
    fn a_signal_ends_the_wait() {
        let (tx, mut shutdown) = watch::channel(false);
        let rt = runtime();
        let waited = rt.block_on(async {
            let stop = tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                let _ = tx.send(true);
            });
            let waited = wait_to_retry(
                Duration::from_secs(30),
                Some(Duration::from_millis(10)),
                || async { false },
                &mut shutdown,
            )
            .await;
            let _ = stop.await;
            waited
        });
        assert_eq!(waited, Waited::Shutdown);
    }

    /// The probe itself: a PostgreSQL-like listener that replies `N` answers; one that
    /// closes at once, or nothing listening, does not.
    #[test]
    fn the_probe_needs_a_reply() {
        let rt = runtime();
        rt.block_on(async {
            let replying = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = replying.local_addr().unwrap().port();
            tokio::spawn(async move {
                let (mut s, _) = replying.accept().await.unwrap();
                let mut request = [0u8; 8];
                s.read_exact(&mut request).await.unwrap();
                assert_eq!(request, SSL_REQUEST);
                s.write_all(b"N").await.unwrap();
            });
            let config = |port: u16| Config::parse(&format!("postgres://u@127.0.0.1:{port}/db")).unwrap();
            assert!(postgres_answers(&config(port)).await);

            let closing = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = closing.local_addr().unwrap().port();
            tokio::spawn(async move {
                let (s, _) = closing.accept().await.unwrap();
                drop(s);
            });
            assert!(!postgres_answers(&config(port)).await);
            let nothing = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let port = nothing.local_addr().unwrap().port();
            drop(nothing);
            assert!(!postgres_answers(&config(port)).await);
        });
    }
}
