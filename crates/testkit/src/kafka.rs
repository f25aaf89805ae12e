//! Throwaway Apache Kafka (KRaft) servers: the single-node [`Kafka`], and the pieces
//! shared with [`crate::KafkaCluster`] (one broker+controller JVM = one [`Node`]).
//!
//! Why one file over 600 lines: a broker's whole life (jars, KRaft format, start,
//! readiness, kill, restart on the same data, stop), metadata and topic calls and the
//! Kafka tools the tests run are one type the tests drive; this is test harness, not
//! walpost.

use std::fmt::Write as _;
use std::fs;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::kafka_meta::{self, Metadata};
use crate::util::{self, err, Watchdog};
use crate::Result;

pub(crate) const KAFKA_VERSION: &str = "4.1.1";
const READY_LINE: &str = "Kafka Server started";
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(90);
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// Timeout of one Metadata request made by the harness.
pub(crate) const METADATA_TIMEOUT: Duration = Duration::from_secs(5);
/// Flags for the short-lived tool JVMs (format, TopicCommand): faster start-up.
const TOOL_JVM_FLAGS: &[&str] = &[
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-Xshare:auto",
    "-Xms64m",
    "-Xmx256m",
    "-Djava.awt.headless=true",
    // JVM (unified) logging: only errors, to stderr — CDS warnings would otherwise land
    // on stdout, i.e. in tool output.
    "-Xlog:disable",
    "-Xlog:all=error:stderr",
];

/// Options for [`Kafka::start`].
#[derive(Debug, Clone, Default)]
pub struct KafkaOptions {
    /// Extra broker properties, written after (and so overriding) the harness's own;
    /// `{port}` and `{controller_port}` in values are replaced by the chosen ports.
    pub extra_props: Vec<(String, String)>,
}

/// A single-node Kafka 4.1.1 broker+controller (KRaft, `node.id=1`) in a temporary
/// directory, on free 127.0.0.1 ports (PLAINTEXT). Killed and deleted on drop.
///
/// Layout of [`Kafka::dir`]: `server.properties`, `log4j2.properties`, `data/`
/// (`log.dirs`, also the metadata log), `kafka.log` (broker log + JVM stdout/stderr,
/// appended across restarts), `kafka.pid`.
#[derive(Debug)]
pub struct Kafka {
    node: Node,
    watchdog: Option<Watchdog>,
    extra_props: Vec<(String, String)>,
}

impl Kafka {
    /// Formats storage (`kafka.tools.StorageTool format`, static quorum
    /// `controller.quorum.voters=1@127.0.0.1:CPORT`) and starts the broker; returns once
    /// the log says "Kafka Server started" and the port accepts connections.
    ///
    /// Broker settings: `auto.create.topics.enable=true`, `num.partitions=3`,
    /// `default.replication.factor=1`, all internal topics (offsets, transaction state,
    /// share-group state) with replication factor 1 / min ISR 1, `min.insync.replicas=1`,
    /// `group.initial.rebalance.delay.ms=0`; additionally, for speed:
    /// `offsets.topic.num.partitions=5` and `transaction.state.log.num.partitions=5`
    /// (faster first consumer group / transactional producer),
    /// `broker.session.timeout.ms=4000` + `broker.heartbeat.interval.ms=1000` (a restart
    /// after [`Kafka::kill`] otherwise waits ~9 s for the old registration to expire),
    /// `num.network.threads=2`, `num.io.threads=4`,
    /// `log.cleaner.dedupe.buffer.size=16 MiB` (default 128 MiB of heap); then
    /// `opts.extra_props`. JVM: `-Xms256m -Xmx512m`, G1, with an AppCDS archive when
    /// available.
    ///
    /// Typical time: ~3-5 s on an idle 2-core machine (format ~1.3 s + broker ~2.5 s).
    pub fn start(opts: KafkaOptions) -> Result<Kafka> {
        let t0 = Instant::now();
        let libs = kafka_libs()?;
        java_version()?;
        let dir = util::make_temp_dir("kafka")?;
        let node = Node::new(1, dir.clone(), libs, (256, 512));
        // From here on, Drop cleans up on error.
        let mut kafka = Kafka { node, watchdog: None, extra_props: opts.extra_props };
        // Watchdog: kills the JVM whose pid is in kafka.pid if this process dies.
        kafka.watchdog = Some(Watchdog::spawn(&kafka.node.pid_path(), &kafka.node.marker(), "KILL", &dir)?);
        write_tool_log_config(&dir)?;

        let mut last_err = None;
        for _attempt in 0..4 {
            kafka.node.port = util::free_port();
            kafka.node.controller_port = util::free_port();
            let voters = format!("1@127.0.0.1:{}", kafka.node.controller_port);
            kafka.node.write_properties(&voters, Replication::SINGLE, &kafka.extra_props)?;
            let tf = Instant::now();
            kafka.node.format_storage(&random_cluster_id(), &dir)?;
            let format_ms = tf.elapsed().as_millis();
            let log_before = kafka.node.spawn()?;
            match kafka.node.wait_ready(log_before, Instant::now() + READY_TIMEOUT) {
                Ok(()) => {
                    eprintln!(
                        "testkit: Kafka {KAFKA_VERSION} on {} ready in {} ms (format {} ms) — {}",
                        kafka.bootstrap(),
                        t0.elapsed().as_millis(),
                        format_ms,
                        dir.display()
                    );
                    return Ok(kafka);
                }
                Err(e) => {
                    if is_bind_error(&util::read_from(&kafka.log_path(), log_before)) {
                        last_err = Some(e);
                        continue;
                    }
                    return Err(e);
                }
            }
        }
        Err(last_err.unwrap_or_else(|| err("Kafka: no free ports")))
    }

    /// `127.0.0.1:PORT` — the PLAINTEXT listener.
    pub fn bootstrap(&self) -> String {
        self.node.bootstrap()
    }

    /// Broker (PLAINTEXT) port.
    pub fn port(&self) -> u16 {
        self.node.port
    }

    /// KRaft controller port.
    pub fn controller_port(&self) -> u16 {
        self.node.controller_port
    }

    /// Temporary root directory.
    pub fn dir(&self) -> &Path {
        &self.node.dir
    }

    /// `log.dirs` (topic data and metadata log).
    pub fn data_dir(&self) -> PathBuf {
        self.node.data_dir()
    }

    /// Broker log (log4j output plus JVM stdout/stderr), appended across restarts.
    pub fn log_path(&self) -> PathBuf {
        self.node.log_path()
    }

    /// Last `n` lines of the broker log.
    pub fn log_tail(&self, n: usize) -> String {
        self.node.log_tail(n)
    }

    /// Directory of the Kafka jars used.
    pub fn libs_dir(&self) -> &Path {
        &self.node.libs
    }

    /// Whether the broker JVM is running (started and not yet exited).
    pub fn is_running(&mut self) -> bool {
        self.node.is_running()
    }

    /// Graceful stop: SIGTERM (controlled shutdown), wait for the JVM to exit (up to
    /// 30 s, then SIGKILL). No-op if not running.
    pub fn stop(&mut self) -> Result<()> {
        self.node.stop()
    }

    /// SIGKILL the broker JVM and reap it. No-op if not running.
    pub fn kill(&mut self) -> Result<()> {
        self.node.kill()
    }

    /// Starts the stopped/killed broker again: same ports, same data; waits until ready.
    /// Err if it is still running.
    pub fn start_again(&mut self) -> Result<()> {
        let t0 = Instant::now();
        self.node.restart()?;
        eprintln!("testkit: Kafka on {} restarted in {} ms", self.bootstrap(), t0.elapsed().as_millis());
        Ok(())
    }

    /// The broker's metadata (live brokers, topics, leaders, ISR) from one `Metadata`
    /// request (no JVM; a few ms). `topics`: `None` for all topics.
    pub fn metadata(&self, topics: Option<&[&str]>) -> Result<Metadata> {
        kafka_meta::fetch_metadata(&self.bootstrap(), topics, METADATA_TIMEOUT)
    }

    /// Creates a topic (replication factor 1) with `org.apache.kafka.tools.TopicCommand`.
    /// Takes ~1.5 s (a JVM start). Err if it already exists.
    pub fn create_topic(&self, name: &str, partitions: u32) -> Result<()> {
        create_topic_with_tool(&self.node.libs, &self.node.dir, &self.bootstrap(), name, partitions, 1)
    }

    /// Runs a Kafka command-line tool class (e.g. `org.apache.kafka.tools.TopicCommand`,
    /// `org.apache.kafka.tools.consumer.ConsoleConsumer`,
    /// `org.apache.kafka.tools.GetOffsetShell`) from the broker's class path. Returns
    /// stdout; Err (with stdout and stderr) on a non-zero exit status or when the output
    /// contains "Error while executing". Tools get `--bootstrap-server` only if you pass
    /// it (see [`Kafka::bootstrap`]).
    pub fn run_tool(&self, main_class: &str, args: &[&str]) -> Result<String> {
        run_tool(&self.node.libs, &self.node.dir, main_class, args)
    }
}

impl Drop for Kafka {
    fn drop(&mut self) {
        drop(self.watchdog.take());
        if self.node.dumps_cds_archive() {
            // No AppCDS archive yet: a graceful stop (~1 s) writes one for later starts.
            let _ = self.node.stop();
        }
        let _ = self.node.kill();
        util::remove_dir(&self.node.dir);
    }
}

/// Replication settings written into `server.properties`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Replication {
    /// `default.replication.factor` and the internal topics' replication factor.
    pub(crate) factor: u32,
    /// `min.insync.replicas` and the internal topics' min ISR.
    pub(crate) min_isr: u32,
}

impl Replication {
    const SINGLE: Replication = Replication { factor: 1, min_isr: 1 };
}

/// One Kafka broker+controller JVM (combined KRaft mode) with its own directory:
/// `server.properties`, `log4j2.properties`, `data/`, `kafka.log`, `kafka.pid`.
#[derive(Debug)]
pub(crate) struct Node {
    pub(crate) id: u32,
    pub(crate) dir: PathBuf,
    pub(crate) libs: PathBuf,
    pub(crate) port: u16,
    pub(crate) controller_port: u16,
    /// -Xms / -Xmx in MiB.
    heap_mb: (u32, u32),
    /// Extra JVM flags, after the harness's.
    pub(crate) jvm_args: Vec<String>,
    child: Option<Child>,
    /// CDS settings of the running JVM.
    cds: Option<Cds>,
}

impl Node {
    pub(crate) fn new(id: u32, dir: PathBuf, libs: PathBuf, heap_mb: (u32, u32)) -> Node {
        Node { id, dir, libs, port: 0, controller_port: 0, heap_mb, jvm_args: Vec::new(), child: None, cds: None }
    }

    pub(crate) fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Whether the running JVM writes a new AppCDS archive at a clean exit (there was
    /// none yet): worth a graceful stop instead of a kill when dropping.
    pub(crate) fn dumps_cds_archive(&self) -> bool {
        self.child.is_some() && self.cds.as_ref().is_some_and(|c| c.tmp.is_some())
    }

    pub(crate) fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    pub(crate) fn log_path(&self) -> PathBuf {
        self.dir.join("kafka.log")
    }

    pub(crate) fn pid_path(&self) -> PathBuf {
        self.dir.join("kafka.pid")
    }

    fn props_path(&self) -> PathBuf {
        self.dir.join("server.properties")
    }

    /// What the watchdog looks for in the JVM's command line (unique per node).
    pub(crate) fn marker(&self) -> String {
        self.props_path().to_string_lossy().into_owned()
    }

    pub(crate) fn log_tail(&self, n: usize) -> String {
        util::tail_file(&self.log_path(), n)
    }

    /// Writes `server.properties` (and `log4j2.properties`) for the current ports.
    /// `voters`: `controller.quorum.voters`. `extra` overrides the harness's settings;
    /// `{port}` and `{controller_port}` in its values stand for this node's ports.
    pub(crate) fn write_properties(&self, voters: &str, r: Replication, extra: &[(String, String)]) -> Result<()> {
        let (p, c) = (self.port, self.controller_port);
        let (rf, isr) = (r.factor.to_string(), r.min_isr.to_string());
        let mut props: Vec<(String, String)> = vec![
            ("process.roles".into(), "broker,controller".into()),
            ("node.id".into(), self.id.to_string()),
            ("controller.quorum.voters".into(), voters.to_string()),
            ("listeners".into(), format!("PLAINTEXT://127.0.0.1:{p},CONTROLLER://127.0.0.1:{c}")),
            ("advertised.listeners".into(), format!("PLAINTEXT://127.0.0.1:{p}")),
            ("controller.listener.names".into(), "CONTROLLER".into()),
            ("inter.broker.listener.name".into(), "PLAINTEXT".into()),
            ("listener.security.protocol.map".into(), "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT".into()),
            ("log.dirs".into(), self.data_dir().to_string_lossy().into_owned()),
            ("auto.create.topics.enable".into(), "true".into()),
            ("num.partitions".into(), "3".into()),
            ("default.replication.factor".into(), rf.clone()),
            ("offsets.topic.replication.factor".into(), rf.clone()),
            ("offsets.topic.num.partitions".into(), "5".into()),
            ("transaction.state.log.replication.factor".into(), rf.clone()),
            ("transaction.state.log.min.isr".into(), isr.clone()),
            ("transaction.state.log.num.partitions".into(), "5".into()),
            ("share.coordinator.state.topic.replication.factor".into(), rf),
            ("share.coordinator.state.topic.min.isr".into(), isr.clone()),
            ("min.insync.replicas".into(), isr),
            ("group.initial.rebalance.delay.ms".into(), "0".into()),
            // After a kill -9 the restarted controller waits for the old broker
            // registration's session to expire (default 9 s) before the broker can
            // register again; in a cluster this is also how long a killed broker stays
            // leader of its partitions.
            ("broker.session.timeout.ms".into(), "4000".into()),
            ("broker.heartbeat.interval.ms".into(), "1000".into()),
            ("num.network.threads".into(), "2".into()),
            ("num.io.threads".into(), "4".into()),
            // The log cleaner (compacted internal topics) allocates this on the heap.
            ("log.cleaner.dedupe.buffer.size".into(), (16u32 << 20).to_string()),
        ];
        props.extend(extra.iter().map(|(k, v)| {
            (k.clone(), v.replace("{port}", &p.to_string()).replace("{controller_port}", &c.to_string()))
        }));
        let mut text = String::from("# written by testkit\n");
        for (k, v) in &props {
            let _ = writeln!(text, "{k}={}", escape_prop(v));
        }
        fs::write(self.props_path(), text)?;
        fs::write(self.dir.join("log4j2.properties"), log4j_config("INFO", "SYSTEM_OUT"))?;
        Ok(())
    }

    /// `kafka-storage format` of a fresh `data/` (removed first if present).
    pub(crate) fn format_storage(&self, cluster_id: &str, tools_dir: &Path) -> Result<()> {
        let data = self.data_dir();
        if data.exists() {
            fs::remove_dir_all(&data)?;
        }
        let props = self.props_path();
        // One `--cluster-id=<id>` argument: a base64url id may start with '-', which the
        // tool's parser would take for an option if it were a separate argument.
        let id = format!("--cluster-id={cluster_id}");
        let args = ["format", "--ignore-formatted", &id, "-c", &*props.to_string_lossy()];
        run_tool_raw(&self.libs, tools_dir, "kafka.tools.StorageTool", &args, "kafka-storage format")?;
        Ok(())
    }

    /// Starts the JVM (not waiting); returns the log length before it, for
    /// [`Node::wait_ready`].
    pub(crate) fn spawn(&mut self) -> Result<u64> {
        let log_path = self.log_path();
        let log_before = util::file_len(&log_path);
        let log = fs::OpenOptions::new().create(true).append(true).open(&log_path)?;
        let log2 = log.try_clone()?;
        let mut cmd = Command::new(java());
        cmd.arg(format!("-Xms{}m", self.heap_mb.0))
            .arg(format!("-Xmx{}m", self.heap_mb.1))
            .args(["-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:+ExitOnOutOfMemoryError"])
            .args(["-Xshare:auto", "-Xlog:disable", "-Xlog:all=error:stderr"]);
        if let Some(cds) = self.cds.take() {
            cds.discard();
        }
        self.cds = Cds::new(&self.libs, "broker");
        if let Some(cds) = &self.cds {
            cmd.arg(cds.jvm_arg());
        }
        cmd.args(&self.jvm_args);
        cmd.arg("-Djava.awt.headless=true")
            .arg(format!("-Dlog4j2.configurationFile={}", self.dir.join("log4j2.properties").display()))
            .arg("-cp")
            .arg(classpath(&self.libs))
            .arg("kafka.Kafka")
            .arg(self.props_path())
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2);
        let child = cmd.spawn().map_err(|e| err(format!("cannot start java: {e}")))?;
        fs::write(self.pid_path(), format!("{}\n", child.id()))?;
        self.child = Some(child);
        Ok(log_before)
    }

    /// Waits until the log (after offset `log_before`) says "Kafka Server started" and
    /// the PLAINTEXT port accepts connections. Kills the JVM on timeout.
    pub(crate) fn wait_ready(&mut self, log_before: u64, deadline: Instant) -> Result<()> {
        let log_path = self.log_path();
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        let mut scanned = log_before;
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    let _ = fs::remove_file(self.pid_path());
                    return Err(err(format!(
                        "Kafka node {} exited during start-up ({status}); log tail:\n{}",
                        self.id,
                        self.log_tail(40)
                    )));
                }
            } else {
                return Err(err(format!("Kafka node {} is not running", self.id)));
            }
            let new = util::read_from(&log_path, scanned);
            if new.contains(READY_LINE) {
                // Only whole lines are scanned next time; the ready line may be split.
                if TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok() {
                    return Ok(());
                }
            } else if let Some(pos) = new.rfind('\n') {
                scanned += pos as u64;
            }
            if Instant::now() >= deadline {
                let _ = self.kill();
                return Err(err(format!(
                    "Kafka node {} not ready within {READY_TIMEOUT:?}; log tail:\n{}",
                    self.id,
                    self.log_tail(40)
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Started by the harness and not stopped or killed since.
    pub(crate) fn started(&self) -> bool {
        self.child.is_some()
    }

    pub(crate) fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// SIGTERM, wait up to 30 s, then SIGKILL. No-op if not running.
    pub(crate) fn stop(&mut self) -> Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        if matches!(child.try_wait(), Ok(None)) {
            util::signal(child.id(), "TERM");
            let deadline = Instant::now() + STOP_TIMEOUT;
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            if matches!(child.try_wait(), Ok(None)) {
                eprintln!("testkit: Kafka node {} did not stop within {STOP_TIMEOUT:?}; killing it", self.id);
                let _ = child.kill();
            }
        }
        let status = child.wait()?;
        let _ = fs::remove_file(self.pid_path());
        if let Some(cds) = self.cds.take() {
            // The JVM exits with 143 on SIGTERM after a clean shutdown.
            if status.success() || status.code() == Some(143) {
                cds.commit();
            } else {
                cds.discard();
            }
        }
        Ok(())
    }

    /// SIGKILL and reap. No-op if not running.
    pub(crate) fn kill(&mut self) -> Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let _ = child.kill();
        child.wait()?;
        let _ = fs::remove_file(self.pid_path());
        if let Some(cds) = self.cds.take() {
            cds.discard();
        }
        Ok(())
    }

    /// Starts the stopped/killed node again (same ports and data) and waits until its
    /// log says it started. Err if it is still running.
    pub(crate) fn restart(&mut self) -> Result<()> {
        if self.is_running() {
            return Err(err(format!("Kafka node {} is still running", self.id)));
        }
        // It may have exited on its own (crash): reap it.
        if let Some(mut old) = self.child.take() {
            let _ = old.wait();
        }
        let mut last_err = None;
        // The old sockets are gone by now, but allow for a slow port release.
        for _ in 0..3 {
            let log_before = self.spawn()?;
            match self.wait_ready(log_before, Instant::now() + READY_TIMEOUT) {
                Ok(()) => return Ok(()),
                Err(e) if is_bind_error(&util::read_from(&self.log_path(), log_before)) => {
                    last_err = Some(e);
                    std::thread::sleep(Duration::from_secs(1));
                }
                Err(e) => return Err(e),
            }
        }
        Err(last_err.unwrap_or_else(|| err("Kafka: ports in use")))
    }
}

pub(crate) fn write_tool_log_config(dir: &Path) -> Result<()> {
    fs::write(dir.join("log4j2-tools.properties"), log4j_config("WARN", "SYSTEM_ERR"))?;
    Ok(())
}

/// `TopicCommand --create`; Err unless it says "Created topic".
pub(crate) fn create_topic_with_tool(
    libs: &Path,
    dir: &Path,
    bootstrap: &str,
    name: &str,
    partitions: u32,
    replication_factor: u32,
) -> Result<()> {
    let out = run_tool(
        libs,
        dir,
        "org.apache.kafka.tools.TopicCommand",
        &[
            "--bootstrap-server",
            bootstrap,
            "--create",
            "--topic",
            name,
            "--partitions",
            &partitions.to_string(),
            "--replication-factor",
            &replication_factor.to_string(),
        ],
    )?;
    if out.contains("Created topic") {
        Ok(())
    } else {
        Err(err(format!("create_topic {name}: unexpected output: {out}")))
    }
}

/// See [`Kafka::run_tool`]. `dir` holds `log4j2-tools.properties` and is the working
/// directory.
pub(crate) fn run_tool(libs: &Path, dir: &Path, main_class: &str, args: &[&str]) -> Result<String> {
    let out = run_tool_raw(libs, dir, main_class, args, main_class)?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stdout.contains("Error while executing") || stderr.contains("Error while executing") {
        return Err(err(format!("{main_class} failed:\n{stdout}\n{stderr}")));
    }
    Ok(stdout)
}

/// Runs a tool JVM (fast-start flags, WARN logging to stderr, CDS archive "tools").
fn run_tool_raw(libs: &Path, dir: &Path, main_class: &str, args: &[&str], what: &str) -> Result<std::process::Output> {
    let cds = Cds::new(libs, "tools");
    let mut cmd = Command::new(java());
    cmd.args(TOOL_JVM_FLAGS);
    if let Some(cds) = &cds {
        cmd.arg(cds.jvm_arg());
    }
    cmd.arg(format!("-Dlog4j2.configurationFile={}", dir.join("log4j2-tools.properties").display()))
        .arg("-cp")
        .arg(classpath(libs))
        .arg(main_class)
        .args(args)
        .current_dir(dir);
    let out = util::run(&mut cmd, what);
    if let Some(cds) = &cds {
        if out.is_ok() {
            cds.commit();
        } else {
            cds.discard();
        }
    }
    out
}

pub(crate) fn is_bind_error(log: &str) -> bool {
    log.contains("BindException") || log.contains("Address already in use")
}

fn escape_prop(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

fn log4j_config(level: &str, target: &str) -> String {
    format!(
        "status = error\n\
         appender.out.type = Console\n\
         appender.out.name = OUT\n\
         appender.out.target = {target}\n\
         appender.out.layout.type = PatternLayout\n\
         appender.out.layout.pattern = [%d] %p %m (%c)%n\n\
         rootLogger.level = {level}\n\
         rootLogger.appenderRef.out.ref = OUT\n\
         logger.request.name = kafka.request.logger\n\
         logger.request.level = WARN\n"
    )
}

fn classpath(libs: &Path) -> String {
    format!("{}/*", libs.display())
}

pub(crate) fn java() -> PathBuf {
    if let Some(home) = std::env::var_os("JAVA_HOME") {
        let p = Path::new(&home).join("bin/java");
        if p.is_file() {
            return p;
        }
    }
    PathBuf::from("java")
}

/// `java -version` output (checked once per process).
pub(crate) fn java_version() -> Result<String> {
    static VERSION: OnceLock<std::result::Result<String, String>> = OnceLock::new();
    VERSION
        .get_or_init(|| match Command::new(java()).arg("-version").stdin(Stdio::null()).output() {
            Ok(o) if o.status.success() => {
                Ok(format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
            }
            _ => Err("java not found (install Java 17+ or set JAVA_HOME)".to_string()),
        })
        .clone()
        .map_err(err)
}

/// AppCDS (class-data sharing) archives cut JVM start-up roughly in half (broker ~5 s ->
/// ~2.7 s). They live next to the jars, in `<libs>/../cds/`, one per role and JDK. If an
/// archive is missing, the JVM is started with `-XX:ArchiveClassesAtExit=<tmp>` and the
/// file is renamed into place after a clean exit (a graceful [`Kafka::stop`] for the
/// broker, any successful run for the tools). A stale or foreign archive only makes the
/// JVM print a warning and start without it. Delete the `cds` directory to reset. The
/// schema registry ([`crate::SchemaRegistry`]) uses the same mechanism, its archive in
/// `<apicurio dir>/cds/`.
#[derive(Debug, Clone)]
pub(crate) struct Cds {
    archive: PathBuf,
    tmp: Option<PathBuf>,
}

impl Cds {
    pub(crate) fn new(libs: &Path, role: &str) -> Option<Cds> {
        if std::env::var_os("WALPOST_KAFKA_NO_CDS").is_some() {
            return None;
        }
        let version = java_version().ok()?;
        let mut h = std::collections::hash_map::DefaultHasher::new();
        std::hash::Hash::hash(&version, &mut h);
        std::hash::Hash::hash(&java(), &mut h);
        let tag = std::hash::Hasher::finish(&h);
        let dir = libs.parent()?.join("cds");
        let archive = dir.join(format!("{role}-{tag:016x}.jsa"));
        if archive.is_file() {
            return Some(Cds { archive, tmp: None });
        }
        fs::create_dir_all(&dir).ok()?;
        remove_stale_tmp_archives(&dir);
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let tmp = dir.join(format!(
            ".{role}-{tag:016x}.{}.{}.{}.tmp",
            std::process::id(),
            SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        Some(Cds { archive, tmp: Some(tmp) })
    }

    /// Whether the JVM started with [`Cds::jvm_arg`] writes a new archive at a clean exit
    /// (there was none yet).
    pub(crate) fn dumps_at_exit(&self) -> bool {
        self.tmp.is_some()
    }

    pub(crate) fn jvm_arg(&self) -> String {
        match &self.tmp {
            Some(tmp) => format!("-XX:ArchiveClassesAtExit={}", tmp.display()),
            None => format!("-XX:SharedArchiveFile={}", self.archive.display()),
        }
    }

    /// After a clean JVM exit: move the freshly dumped archive into place.
    pub(crate) fn commit(&self) {
        if let Some(tmp) = &self.tmp {
            if tmp.is_file() && !self.archive.exists() {
                let _ = fs::rename(tmp, &self.archive);
            }
            let _ = fs::remove_file(tmp);
        }
    }

    pub(crate) fn discard(&self) {
        if let Some(tmp) = &self.tmp {
            let _ = fs::remove_file(tmp);
        }
    }
}

/// 16 pseudo-random bytes, URL-safe base64 without padding (Kafka's Uuid format).
pub(crate) fn random_cluster_id() -> String {
    let mut bytes = [0u8; 16];
    let filled = fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes)).is_ok();
    if !filled {
        let n = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(1)
            ^ u128::from(std::process::id());
        bytes = n.to_le_bytes();
    }
    // Kafka rejects the all-zero and "metadata topic" UUIDs; make sure it is non-zero.
    bytes[0] |= 1;
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    let mut acc: u32 = 0;
    let mut bits = 0;
    for b in bytes {
        acc = (acc << 8) | u32::from(b);
        bits += 8;
        while bits >= 6 {
            bits -= 6;
            out.push(ALPHABET[((acc >> bits) & 63) as usize] as char);
        }
    }
    if bits > 0 {
        out.push(ALPHABET[((acc << (6 - bits)) & 63) as usize] as char);
    }
    out
}

/// Removes half-written archives (JVM killed while dumping) older than 10 minutes.
fn remove_stale_tmp_archives(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') && name.ends_with(".tmp") {
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > Duration::from_secs(600));
            if old {
                let _ = fs::remove_file(e.path());
            }
        }
    }
}

/// The Kafka jar directory; runs scripts/fetch-kafka.sh if it is not complete yet.
pub(crate) fn kafka_libs() -> Result<PathBuf> {
    static FETCH: Mutex<()> = Mutex::new(());
    static LIBS: OnceLock<PathBuf> = OnceLock::new();
    if let Some(l) = LIBS.get() {
        return Ok(l.clone());
    }
    let _guard = FETCH.lock().unwrap_or_else(|e| e.into_inner());
    let libs = match std::env::var_os("WALPOST_KAFKA_LIBS") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => {
            let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
            home.join(format!(".cache/walpost/kafka-{KAFKA_VERSION}/libs"))
        }
    };
    if !libs.join(".walpost-complete").is_file() {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/fetch-kafka.sh");
        eprintln!("testkit: Kafka jars missing in {}; running {}", libs.display(), script.display());
        let mut cmd = Command::new("bash");
        cmd.arg(&script).env("WALPOST_KAFKA_LIBS", &libs);
        util::run(&mut cmd, "scripts/fetch-kafka.sh")?;
        if !libs.join(".walpost-complete").is_file() {
            return Err(err(format!("{} did not fill {}", script.display(), libs.display())));
        }
    }
    let _ = LIBS.set(libs.clone());
    Ok(libs)
}

#[cfg(test)]
mod tests {
    use super::random_cluster_id;

    #[test]
    fn cluster_id_is_22_url_safe_chars() {
        let id = random_cluster_id();
        assert_eq!(id.len(), 22, "{id}");
        assert!(id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'), "{id}");
    }
}
