//! The schema registry at walpost's edge: its REST client ([`RegistryClient`]), the
//! [`SchemaSource`] the `contracts` crate's registry contracts ask when a subject is not
//! in their cache, the resolved `[registry]` section ([`settings`]) and the contracts'
//! series ([`metrics`]).
//!
//! Why a thread: a contract's check is synchronous (the router is sans-io), and a
//! cache miss must wait for the registry. [`HttpSource`] hands each fetch to its own
//! thread, which runs the async client on a small runtime of its own, and waits for the
//! answer at most the request timeout (plus a margin). So a miss blocks the routing
//! task for one request, never forever: a registry that does not answer in time is an
//! unavailable contract, which the stream treats as a transient error (it starts again
//! from the confirmed position, with backoff) and never as a pass.
//!
//! Invariant: no log line or error shows a credential; requests are counted in
//! `walpost_registry_requests_total{result}` and timed in
//! `walpost_registry_request_seconds`.

mod client;
pub mod metrics;
pub mod settings;

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use contracts::registry::{Fetched, Lookup, RegistryContracts, SchemaSource};
use router::ContractRef;
use service::error::{ErrorKind, PipelineError};

pub use client::{Compatibility, RegistryClient, RegistryError};
use metrics::ContractMetrics;
use settings::RegistrySettings;

/// The log target of the registry's lines, as when it was a module of the binary
/// (operators filter on it with `WALPOST_LOG`).
const LOG_TARGET: &str = "walpost::registry";

/// How long past the request timeout a fetch is waited for (the thread's own overhead).
const ANSWER_MARGIN: Duration = Duration::from_secs(1);

type Answer = Result<Fetched, String>;

#[derive(Debug)]
struct Job {
    subject: String,
    version: Option<i32>,
    reply: mpsc::Sender<Answer>,
}

/// See the module docs.
#[derive(Debug)]
pub struct HttpSource {
    jobs: Mutex<mpsc::Sender<Job>>,
    url: String,
    wait: Duration,
}

impl HttpSource {
    /// Starts the registry thread.
    pub fn start(client: RegistryClient, metrics: Option<ContractMetrics>) -> Result<HttpSource, PipelineError> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let url = client.url().to_owned();
        let wait = client.timeout() + ANSWER_MARGIN;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| {
            PipelineError::definite(ErrorKind::Host, format!("cannot start the registry thread's runtime: {e}"))
        })?;
        std::thread::Builder::new()
            .name("walpost-registry".into())
            .spawn(move || {
                for job in queue {
                    let started = Instant::now();
                    let answer = runtime.block_on(client.version(&job.subject, job.version));
                    let result = match &answer {
                        Ok(Fetched::Found(_)) => "found",
                        Ok(Fetched::Missing) => "missing",
                        Err(_) => "error",
                    };
                    if let Some(m) = &metrics {
                        m.registry_requests.with_label_values(&[result]).inc();
                        m.registry_seconds.observe(started.elapsed().as_secs_f64());
                    }
                    let answer = answer.map_err(|e| {
                        tracing::warn!(
                            target: LOG_TARGET,
                            kind = "registry",
                            "schema registry request failed: {e}"
                        );
                        e.to_string()
                    });
                    let _ = job.reply.send(answer);
                }
            })
            .map_err(|e| PipelineError::definite(ErrorKind::Host, format!("cannot start the registry thread: {e}")))?;
        Ok(HttpSource { jobs: Mutex::new(jobs), url, wait })
    }
}

impl SchemaSource for HttpSource {
    fn fetch(&self, subject: &str, version: Option<i32>) -> Result<Fetched, String> {
        let (reply, answer) = mpsc::channel();
        let job = Job { subject: subject.to_owned(), version, reply };
        let sent = self.jobs.lock().unwrap_or_else(std::sync::PoisonError::into_inner).send(job);
        if sent.is_err() {
            return Err(format!("the registry thread for {} has stopped", self.url));
        }
        answer.recv_timeout(self.wait).unwrap_or_else(|_| {
            Err(format!("the schema registry at {} did not answer within {:?}", self.url, self.wait))
        })
    }

    fn describe(&self) -> String {
        format!("the schema registry at {}", self.url)
    }
}

/// The registry's contract for every router, counted in `metrics` when given.
pub fn contract(s: &RegistrySettings, metrics: Option<&ContractMetrics>) -> Result<ContractRef, PipelineError> {
    let client = RegistryClient::new(s).map_err(|e| PipelineError::definite(ErrorKind::Config, e))?;
    let source = HttpSource::start(client, metrics.cloned())?;
    let mut contracts = RegistryContracts::new(Arc::new(source), s.options.clone());
    if let Some(m) = metrics {
        let [hit, miss] = ["hit", "miss"].map(|r| m.registry_cache.with_label_values(&[r]));
        contracts = contracts.observed(move |l| match l {
            Lookup::Hit => hit.inc(),
            Lookup::Miss => miss.inc(),
        });
    }
    Ok(ContractRef(Arc::new(contracts)))
}

/// A registry that refuses walpost's credentials or is not a registry stops walpost at
/// start; one that cannot be reached yet is only a warning (it may come up, and events
/// wait for it).
pub async fn probe(s: &RegistrySettings) -> Result<(), PipelineError> {
    match ask(s).await {
        Asked::Answers(n) => {
            tracing::info!(target: LOG_TARGET, subjects = n, "schema registry at {} answers", s.url);
            Ok(())
        }
        Asked::Refuses(e) => Err(e),
        Asked::Unreachable(e) => {
            tracing::warn!(target: LOG_TARGET, "{e}: events wait for it");
            Ok(())
        }
    }
}

/// What the registry said when asked for its subjects.
#[derive(Debug)]
pub enum Asked {
    /// It answers, with this many subjects.
    Answers(usize),
    /// It refuses walpost (credentials), is not a registry, or its TLS cannot be set up:
    /// walpost cannot work with it as configured.
    Refuses(PipelineError),
    /// It does not answer now (down, slow, unreachable): events would wait for it.
    Unreachable(String),
}

/// Asks the registry for its subjects (`walpost run`'s start, `walpost check`).
pub async fn ask(s: &RegistrySettings) -> Asked {
    let client = match RegistryClient::new(s) {
        Ok(c) => c,
        Err(e) => return Asked::Refuses(PipelineError::definite(ErrorKind::Config, e)),
    };
    match client.subjects().await {
        Ok(n) => Asked::Answers(n),
        Err(e @ (RegistryError::Unauthorized(..) | RegistryError::Malformed(..) | RegistryError::TlsSetup(_))) => {
            Asked::Refuses(PipelineError::definite(ErrorKind::Registry, e))
        }
        Err(e) => Asked::Unreachable(e.to_string()),
    }
}
