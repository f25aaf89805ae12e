//! A throwaway schema registry: Apicurio Registry 2.4.2.Final (in-memory storage, no
//! authentication) serving the Confluent Schema Registry API at `/apis/ccompat/v7`,
//! run from the Quarkus application `scripts/fetch-test-tools.sh` builds from
//! `tools/apicurio/pom.xml`; and the Python of the same script's venv, whose
//! `confluent-kafka[avro,json,schemaregistry]` holds Confluent's own serializers.

use std::fs;
use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::kafka::{is_bind_error, java, java_version, Cds};
use crate::util::{self, err, Watchdog};
use crate::Result;

/// The Apicurio Registry release `scripts/fetch-test-tools.sh` builds.
pub const APICURIO_VERSION: &str = "2.4.2.Final";
/// Path of the Confluent-compatible API under the server root.
const API: &str = "/apis/ccompat/v7";
const READY_TIMEOUT: Duration = Duration::from_secs(60);
const STOP_TIMEOUT: Duration = Duration::from_secs(20);
/// Timeout of one HTTP request made by the harness.
const HTTP_TIMEOUT: Duration = Duration::from_secs(5);
/// The global compatibility level set after every (re)start: Confluent's default
/// (Apicurio's own default is `NONE`).
pub const DEFAULT_COMPATIBILITY: &str = "BACKWARD";
/// JVM flags: C1 only and a small serial-GC heap start it ~30-40 % faster and with ~25 MB
/// less RSS than the defaults on a 2-core machine; nothing a test does needs C2.
const JVM_FLAGS: &[&str] = &[
    "-Xmx256m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:+ExitOnOutOfMemoryError",
    "-Xshare:auto",
    // JVM (unified) logging: only errors (CDS dump warnings would fill the log).
    "-Xlog:disable",
    "-Xlog:all=error:stderr",
    "-Djava.awt.headless=true",
    // One H2 connection to begin with instead of 20.
    "-Dquarkus.datasource.jdbc.initial-size=1",
    "-Dquarkus.datasource.jdbc.min-size=1",
];

/// `$WALPOST_TOOLS_CACHE`, default `$HOME/.cache/walpost/tools`: where
/// `scripts/fetch-test-tools.sh` puts what it fetches and builds.
pub fn tools_cache_dir() -> PathBuf {
    match std::env::var_os("WALPOST_TOOLS_CACHE") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cache/walpost/tools"),
    }
}

/// The Python of the test-tools venv (`$WALPOST_CE_PYTHON`, default
/// `<tools cache>/ce-venv/bin/python`; the same lookup as the CloudEvents tests). It has
/// `cloudevents` and `confluent-kafka[avro,json,schemaregistry]` (so
/// `confluent_kafka.schema_registry`, its Avro and JSON Schema serializers).
///
/// # Panics
/// If it does not exist: run `scripts/fetch-test-tools.sh`.
pub fn python() -> PathBuf {
    let python = std::env::var_os("WALPOST_CE_PYTHON")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| tools_cache_dir().join("ce-venv/bin/python"));
    assert!(
        python.exists(),
        "testkit: {} is missing: run scripts/fetch-test-tools.sh (scripts/setup-deps.sh does)",
        python.display()
    );
    python
}

/// The built registry (the `quarkus-app` directory, holding `quarkus-run.jar`):
/// `$WALPOST_APICURIO_DIR`, default `<tools cache>/apicurio-2.4.2` (complete when it holds
/// `.walpost-complete`, written last by `scripts/fetch-test-tools.sh`).
pub fn apicurio_dir() -> Result<PathBuf> {
    let (dir, marker_needed) = match std::env::var_os("WALPOST_APICURIO_DIR") {
        Some(d) if !d.is_empty() => (PathBuf::from(d), false),
        _ => (tools_cache_dir().join("apicurio-2.4.2"), true),
    };
    let jar = dir.join("quarkus-run.jar");
    if !jar.is_file() || (marker_needed && !dir.join(".walpost-complete").is_file()) {
        return Err(err(format!(
            "Apicurio Registry {APICURIO_VERSION} is not built in {}: run scripts/fetch-test-tools.sh \
             (builds it once from tools/apicurio with Maven, a few minutes), or set WALPOST_APICURIO_DIR \
             to a directory holding quarkus-run.jar",
            dir.display()
        )));
    }
    Ok(dir)
}

/// An Apicurio Registry 2.4.2.Final JVM on a free `127.0.0.1` port, speaking the
/// Confluent Schema Registry REST API at [`SchemaRegistry::url`]; killed (and its
/// temporary directory deleted) on drop, or by a watchdog if the test process dies.
///
/// Storage is **in memory**: schemas live as long as the JVM ([`SchemaRegistry::restart`]
/// starts empty; [`SchemaRegistry::pause`] keeps them). After every (re)start the global
/// compatibility level is set to `BACKWARD` ([`DEFAULT_COMPATIBILITY`], Confluent's
/// default; Apicurio's is `NONE`).
///
/// How it differs from Confluent's registry (seen with it, and what clients must accept):
/// * schema ids are Apicurio content ids: the same schema text registered under two
///   subjects gets the same id; a text differing only in whitespace gets a new one
///   (`?normalize=true` is ignored);
/// * error codes: unknown subject `40401`, unknown version (also `versions/latest` of an
///   unknown subject, where Confluent says `40401`) `40402`, unknown schema id `40403`,
///   invalid schema `42201` (HTTP 422), but an incompatible registration is HTTP 409 with
///   `error_code` `0`; malformed JSON bodies and unknown compatibility levels are HTTP 500
///   with `error_code` `0`;
/// * compatibility answers are `{"is_compatible":B,"reason":null}`; `?verbose=true` puts
///   one text in `reason` (no `messages` array);
/// * an unknown `schemaType` (e.g. `XML`) is accepted and stored;
/// * `GET /mode` is 404 ("Operation not supported"); no authentication at all.
///
/// Start-up: ~4-6 s on an idle 2-core machine with the AppCDS archive (made by the first
/// run that is stopped cleanly, in `<apicurio dir>/cds/`), ~6-8 s without; ~185-200 MB RSS.
///
/// Layout of [`SchemaRegistry::dir`]: `registry.log` (Quarkus log + JVM output, appended
/// across restarts), `registry.pid`.
#[derive(Debug)]
pub struct SchemaRegistry {
    app: PathBuf,
    dir: PathBuf,
    port: u16,
    child: Option<Child>,
    /// CDS settings of the running JVM.
    cds: Option<Cds>,
    paused: bool,
    watchdog: Option<Watchdog>,
}

impl SchemaRegistry {
    /// Starts a registry (see [`SchemaRegistry::try_start`]).
    ///
    /// # Panics
    /// If the application is not built (the message names `scripts/fetch-test-tools.sh`),
    /// or the registry does not answer `GET /apis/ccompat/v7/subjects` with 200 within
    /// 60 s (the message holds the tail of its log).
    pub fn start() -> SchemaRegistry {
        match SchemaRegistry::try_start() {
            Ok(r) => r,
            Err(e) => panic!("testkit: the schema registry failed to start: {e}"),
        }
    }

    /// Finds the built application ([`apicurio_dir`]), starts `java -jar quarkus-run.jar`
    /// on a free port (another one if that port was taken meanwhile) with its log in a
    /// temporary directory, waits until `GET /apis/ccompat/v7/subjects` answers 200 (at
    /// most 60 s) and sets the global compatibility to [`DEFAULT_COMPATIBILITY`].
    pub fn try_start() -> Result<SchemaRegistry> {
        let t0 = Instant::now();
        let app = apicurio_dir()?;
        java_version()?;
        let dir = util::make_temp_dir("registry")?;
        // From here on, Drop cleans up on error.
        let mut r =
            SchemaRegistry { app, dir: dir.clone(), port: 0, child: None, cds: None, paused: false, watchdog: None };
        r.watchdog = Some(Watchdog::spawn(&r.pid_path(), &r.marker(), "KILL", &dir)?);
        let mut last_err = None;
        for _attempt in 0..4 {
            r.port = util::free_port();
            match r.spawn_and_wait() {
                Ok(()) => {
                    eprintln!(
                        "testkit: Apicurio Registry {APICURIO_VERSION} on {} ready in {} ms — {}",
                        r.url(),
                        t0.elapsed().as_millis(),
                        dir.display()
                    );
                    return Ok(r);
                }
                Err((e, true)) => last_err = Some(e),
                Err((e, false)) => return Err(e),
            }
        }
        Err(last_err.unwrap_or_else(|| err("schema registry: no free port")))
    }

    /// `http://127.0.0.1:PORT/apis/ccompat/v7`: the base URL Confluent clients are given
    /// (`GET {url}/subjects`, `POST {url}/subjects/{subject}/versions`, ...).
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}{API}", self.port)
    }

    /// The HTTP port (the same across [`SchemaRegistry::restart`]).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Temporary directory (log and pid file).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The application directory run (holding `quarkus-run.jar`).
    pub fn app_dir(&self) -> &Path {
        &self.app
    }

    /// The registry's log (Quarkus log and JVM output), appended across restarts.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("registry.log")
    }

    /// The last `n` lines of the log.
    pub fn log_tail(&self, n: usize) -> String {
        util::tail_file(&self.log_path(), n)
    }

    /// Whether the JVM is running (started, not stopped, not exited; a paused one is).
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Whether [`SchemaRegistry::pause`] is in effect.
    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// One HTTP/1.1 request to the Confluent API (`path` relative to
    /// [`SchemaRegistry::url`], e.g. `/subjects/t-value/versions`), the body sent as
    /// `application/vnd.schemaregistry.v1+json`. Returns the status and the body. For
    /// seeding or inspecting the registry from a test without another client.
    pub fn http(&self, method: &str, path: &str, body: Option<&str>) -> Result<(u16, String)> {
        http(self.port, method, &format!("{API}{path}"), body, HTTP_TIMEOUT)
    }

    /// Sets the compatibility level (`BACKWARD`, `FORWARD`, `FULL`, their `_TRANSITIVE`
    /// forms, `NONE`) of one subject, or the global one (`subject = None`). Apicurio keeps
    /// it in memory: a restart resets the global level to [`DEFAULT_COMPATIBILITY`] and
    /// forgets subject levels.
    pub fn set_compatibility(&self, subject: Option<&str>, level: &str) -> Result<()> {
        let path = match subject {
            Some(s) => format!("/config/{s}"),
            None => "/config".to_string(),
        };
        let (status, answer) = self.http("PUT", &path, Some(&format!(r#"{{"compatibility":"{level}"}}"#)))?;
        if status == 200 {
            Ok(())
        } else {
            Err(err(format!("schema registry: PUT {path} {level}: HTTP {status}: {answer}")))
        }
    }

    /// Freezes the JVM (SIGSTOP), keeping every schema: the port still accepts TCP
    /// connections (the kernel's listen backlog) but nothing answers, so clients see
    /// read timeouts — a registry that is down or hung, not one that refuses connections
    /// (for that, [`SchemaRegistry::stop`], which loses the schemas). No-op if not running
    /// or already paused.
    pub fn pause(&mut self) {
        if !self.paused && self.is_running() {
            if let Some(c) = &self.child {
                util::signal(c.id(), "STOP");
            }
            self.paused = true;
        }
    }

    /// Undoes [`SchemaRegistry::pause`] (SIGCONT): requests that waited are then served.
    pub fn resume(&mut self) {
        if self.paused {
            if let Some(c) = &self.child {
                util::signal(c.id(), "CONT");
            }
            self.paused = false;
        }
    }

    /// Graceful stop (SIGTERM, ~1-2 s; SIGKILL after 20 s). Connections are then refused.
    /// **In-memory storage: every schema, subject and configuration is lost**; see
    /// [`SchemaRegistry::pause`] to make it unavailable without that. No-op if not running.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if matches!(child.try_wait(), Ok(None)) {
            util::signal(child.id(), "TERM");
            if self.paused {
                util::signal(child.id(), "CONT");
            }
            let deadline = Instant::now() + STOP_TIMEOUT;
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            if matches!(child.try_wait(), Ok(None)) {
                eprintln!("testkit: the schema registry did not stop within {STOP_TIMEOUT:?}; killing it");
                let _ = child.kill();
            }
        }
        self.paused = false;
        let status = child.wait();
        let _ = fs::remove_file(self.pid_path());
        if let Some(cds) = self.cds.take() {
            // Quarkus exits with 143 on SIGTERM after a clean shutdown.
            match status {
                Ok(s) if s.success() || s.code() == Some(143) => cds.commit(),
                _ => cds.discard(),
            }
        }
    }

    /// SIGKILL (a crash) and reap. Like [`SchemaRegistry::stop`], loses every schema.
    /// No-op if not running.
    pub fn kill(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = child.kill();
        let _ = child.wait();
        self.paused = false;
        let _ = fs::remove_file(self.pid_path());
        if let Some(cds) = self.cds.take() {
            cds.discard();
        }
    }

    /// Stops the registry if it runs ([`SchemaRegistry::stop`]) and starts it again on the
    /// **same port**, waiting until it answers (60 s). **In-memory storage: it comes back
    /// empty** — no subjects, schema ids starting again at 1 — with the global
    /// compatibility set to [`DEFAULT_COMPATIBILITY`] again. To simulate an outage that
    /// keeps the schemas, use [`SchemaRegistry::pause`] / [`SchemaRegistry::resume`].
    ///
    /// # Panics
    /// If it does not come back within 60 s (the message holds the log tail).
    pub fn restart(&mut self) {
        let t0 = Instant::now();
        self.stop();
        let mut last_err = None;
        // The old socket is closed by now, but allow for a slow port release.
        for _ in 0..3 {
            match self.spawn_and_wait() {
                Ok(()) => {
                    eprintln!(
                        "testkit: schema registry on {} restarted in {} ms",
                        self.url(),
                        t0.elapsed().as_millis()
                    );
                    return;
                }
                Err((e, true)) => {
                    last_err = Some(e);
                    std::thread::sleep(Duration::from_secs(1));
                }
                Err((e, false)) => panic!("testkit: the schema registry failed to restart: {e}"),
            }
        }
        panic!(
            "testkit: the schema registry failed to restart: {}",
            last_err.map(|e| e.to_string()).unwrap_or_default()
        );
    }

    fn pid_path(&self) -> PathBuf {
        self.dir.join("registry.pid")
    }

    /// What the watchdog looks for in the JVM's command line (unique per registry).
    fn marker(&self) -> String {
        format!("-Dwalpost.testkit.dir={}", self.dir.display())
    }

    /// Starts the JVM on `self.port`, waits until it answers and sets the default
    /// compatibility. On error the JVM is gone; the flag says whether the port was taken.
    fn spawn_and_wait(&mut self) -> std::result::Result<(), (crate::Error, bool)> {
        let log_before = util::file_len(&self.log_path());
        self.spawn().map_err(|e| (e, false))?;
        if let Err(e) = self.wait_ready() {
            let bind = is_bind_error(&util::read_from(&self.log_path(), log_before));
            self.kill();
            return Err((e, bind));
        }
        if let Err(e) = self.set_compatibility(None, DEFAULT_COMPATIBILITY) {
            self.kill();
            return Err((e, false));
        }
        Ok(())
    }

    fn spawn(&mut self) -> Result<()> {
        let log = fs::OpenOptions::new().create(true).append(true).open(self.log_path())?;
        let log2 = log.try_clone()?;
        if let Some(cds) = self.cds.take() {
            cds.discard();
        }
        self.cds = Cds::new(&self.app.join("lib"), "registry");
        let mut cmd = Command::new(java());
        cmd.args(JVM_FLAGS);
        if let Some(cds) = &self.cds {
            cmd.arg(cds.jvm_arg());
        }
        cmd.arg(self.marker())
            .arg("-Dquarkus.http.host=127.0.0.1")
            .arg(format!("-Dquarkus.http.port={}", self.port))
            .arg("-jar")
            .arg(self.app.join("quarkus-run.jar"))
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2);
        let child = cmd.spawn().map_err(|e| err(format!("cannot start java: {e}")))?;
        fs::write(self.pid_path(), format!("{}\n", child.id()))?;
        self.child = Some(child);
        self.paused = false;
        Ok(())
    }

    /// Waits until `GET /apis/ccompat/v7/subjects` answers 200; kills the JVM on timeout.
    fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            match self.child.as_mut().map(Child::try_wait) {
                None => return Err(err("schema registry is not running")),
                Some(Ok(Some(status))) => {
                    self.child = None;
                    let _ = fs::remove_file(self.pid_path());
                    if let Some(cds) = self.cds.take() {
                        cds.discard();
                    }
                    return Err(err(format!(
                        "the schema registry exited during start-up ({status}); log tail:\n{}",
                        self.log_tail(40)
                    )));
                }
                Some(_) => {}
            }
            if matches!(self.http("GET", "/subjects", None), Ok((200, _))) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                self.kill();
                return Err(err(format!(
                    "the schema registry did not answer GET {API}/subjects with 200 within {READY_TIMEOUT:?}; log tail:\n{}",
                    self.log_tail(40)
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for SchemaRegistry {
    fn drop(&mut self) {
        drop(self.watchdog.take());
        if !self.paused && self.child.is_some() && self.cds.as_ref().is_some_and(Cds::dumps_at_exit) {
            // No AppCDS archive yet: a graceful stop (~2 s) writes one for later starts.
            self.stop();
        }
        self.kill();
        util::remove_dir(&self.dir);
    }
}

/// One HTTP/1.1 request (`Connection: close`) to `127.0.0.1:port`; (status, body).
fn http(port: u16, method: &str, path: &str, body: Option<&str>, timeout: Duration) -> Result<(u16, String)> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\
         Accept: application/vnd.schemaregistry.v1+json, application/json\r\nConnection: close\r\n"
    );
    if let Some(b) = body {
        req.push_str(&format!(
            "Content-Type: application/vnd.schemaregistry.v1+json\r\nContent-Length: {}\r\n",
            b.len()
        ));
    }
    req.push_str("\r\n");
    req.push_str(body.unwrap_or(""));
    s.write_all(req.as_bytes())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n");
    let Some(split) = split else {
        return Err(err(format!("{method} {path}: bad answer {:?}", String::from_utf8_lossy(&raw))));
    };
    let head = String::from_utf8_lossy(&raw[..split]);
    let rest = &raw[split + 4..];
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| err(format!("{method} {path}: bad status line in {head:?}")))?;
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = if chunked { dechunk(rest) } else { rest.to_vec() };
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// The payload of a `Transfer-Encoding: chunked` body (trailers ignored).
fn dechunk(mut rest: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") {
        let size_line = String::from_utf8_lossy(&rest[..eol]);
        let size = usize::from_str_radix(size_line.split(';').next().unwrap_or("").trim(), 16).unwrap_or(0);
        let after = &rest[eol + 2..];
        if size == 0 || after.len() < size {
            break;
        }
        out.extend_from_slice(&after[..size]);
        rest = after[size..].strip_prefix(b"\r\n").unwrap_or(&after[size..]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::dechunk;

    #[test]
    fn dechunks() {
        assert_eq!(dechunk(b"4\r\n[\"a\"\r\n2\r\n,1\r\n0\r\n\r\n"), b"[\"a\",1");
        assert_eq!(dechunk("3\r\n\u{e9}x\r\n0\r\n\r\n".as_bytes()), "\u{e9}x".as_bytes());
        assert!(dechunk(b"0\r\n\r\n").is_empty());
    }
}
