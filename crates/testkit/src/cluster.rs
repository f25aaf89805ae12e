//! A throwaway multi-node Apache Kafka cluster (KRaft, every node broker+controller).

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::kafka::{self, Node, Replication, KAFKA_VERSION, METADATA_TIMEOUT, READY_TIMEOUT};
use crate::kafka_meta::{self, Metadata};
use crate::util::{self, err, Watchdog};
use crate::Result;

/// How long [`KafkaCluster::start`], [`KafkaCluster::start_again`] and
/// [`KafkaCluster::create_topic`] wait for the cluster to agree on brokers, leaders and
/// in-sync replicas after the JVMs are up.
pub const CLUSTER_SETTLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Options for [`KafkaCluster::start`].
#[derive(Debug, Clone)]
pub struct KafkaClusterOptions {
    /// Number of nodes (each a broker and a KRaft voter); default 3.
    pub nodes: u32,
    /// Maximum heap of each node's JVM in MiB (`-Xmx`; `-Xms` is half of it); default 256.
    pub heap_mb: u32,
    /// Extra broker properties for every node, written after (and so overriding) the
    /// harness's own; `{port}` and `{controller_port}` in values are replaced by each
    /// node's own ports, `{node_id}` by its id.
    pub extra_props: Vec<(String, String)>,
    /// Extra JVM flags for every node, after the harness's own (`-Xms`/`-Xmx` from
    /// `heap_mb`, G1, `-XX:TieredStopAtLevel=1` i.e. C1 JIT only for a faster start —
    /// pass `-XX:TieredStopAtLevel=4` to get C2 back).
    pub jvm_args: Vec<String>,
}

impl Default for KafkaClusterOptions {
    fn default() -> Self {
        KafkaClusterOptions { nodes: 3, heap_mb: 256, extra_props: Vec::new(), jvm_args: Vec::new() }
    }
}

/// N Apache Kafka 4.1.1 nodes on this machine, each a combined broker+controller
/// (KRaft), forming one cluster with a static N-voter controller quorum; node ids are
/// `1..=N`, every node listens on its own free 127.0.0.1 ports (PLAINTEXT).
///
/// With 3 or more nodes: `default.replication.factor=3`, `min.insync.replicas=2`, and
/// the internal topics (`__consumer_offsets`, `__transaction_state`, share-group state)
/// with replication factor 3 / min ISR 2 (fewer nodes: replication factor = N, min ISR
/// 2 if N >= 2). Topics are auto-created with 3 partitions. Other settings as
/// [`crate::Kafka::start`].
///
/// Layout of [`KafkaCluster::dir`]: `node-ID/` per node (as a [`crate::Kafka`]
/// directory: `server.properties`, `data/`, `kafka.log`, `kafka.pid`) and the tools'
/// `log4j2-tools.properties`. All nodes are killed and the directory deleted on drop, or
/// by the watchdog when the test process dies.
#[derive(Debug)]
pub struct KafkaCluster {
    dir: PathBuf,
    nodes: Vec<Node>,
    watchdog: Option<Watchdog>,
    replication: Replication,
    extra_props: Vec<(String, String)>,
}

impl KafkaCluster {
    /// Formats every node's storage (one cluster id; formats run in parallel), starts
    /// all JVMs, and returns once every node logged "Kafka Server started", accepts
    /// connections, and every node's metadata lists all N brokers (see
    /// [`KafkaCluster::wait_healthy`]).
    ///
    /// Measured on the shared 2-core machine: ~9-12 s for 3 nodes.
    pub fn start(opts: KafkaClusterOptions) -> Result<KafkaCluster> {
        let t0 = Instant::now();
        if opts.nodes == 0 {
            return Err(err("KafkaCluster: nodes must be at least 1"));
        }
        let libs = kafka::kafka_libs()?;
        kafka::java_version()?;
        let dir = util::make_temp_dir("kafka-cluster")?;
        let heap = (opts.heap_mb / 2).max(32);
        let nodes: Vec<Node> = (1..=opts.nodes)
            .map(|id| {
                let mut n = Node::new(id, dir.join(format!("node-{id}")), libs.clone(), (heap, opts.heap_mb.max(64)));
                // C1 only: ~20% faster start-up (6.7 s instead of 8.4 s for 3 nodes,
                // measured), enough speed for tests. Later flags win.
                n.jvm_args = std::iter::once("-XX:TieredStopAtLevel=1".to_string())
                    .chain(opts.jvm_args.iter().cloned())
                    .collect();
                n
            })
            .collect();
        let factor = opts.nodes.min(3);
        let replication = Replication { factor, min_isr: if factor >= 2 { 2 } else { 1 } };
        // From here on, Drop cleans up on error.
        let mut cluster = KafkaCluster { dir, nodes, watchdog: None, replication, extra_props: opts.extra_props };
        let watched: Vec<(PathBuf, String)> = cluster.nodes.iter().map(|n| (n.pid_path(), n.marker())).collect();
        cluster.watchdog = Some(Watchdog::spawn_many(&watched, "KILL", &cluster.dir)?);
        for n in &cluster.nodes {
            fs::create_dir(&n.dir)?;
        }
        kafka::write_tool_log_config(&cluster.dir)?;

        let mut last_err = None;
        let mut format_ms = 0;
        for _attempt in 0..3 {
            for n in &mut cluster.nodes {
                n.port = util::free_port();
                n.controller_port = util::free_port();
            }
            let tf = Instant::now();
            cluster.write_all_properties()?;
            cluster.format_all()?;
            format_ms = tf.elapsed().as_millis();
            match cluster.spawn_all() {
                Ok(()) => {
                    last_err = None;
                    break;
                }
                Err((e, bind_error)) => {
                    for n in &mut cluster.nodes {
                        let _ = n.kill();
                    }
                    if !bind_error {
                        return Err(e);
                    }
                    last_err = Some(e);
                }
            }
        }
        if let Some(e) = last_err {
            return Err(e);
        }
        let jvms_ms = t0.elapsed().as_millis();
        cluster.wait_healthy(CLUSTER_SETTLE_TIMEOUT)?;
        eprintln!(
            "testkit: Kafka {KAFKA_VERSION} cluster of {} nodes on {} ready in {} ms (format {} ms, all JVMs up at {} ms) — {}",
            cluster.nodes.len(),
            cluster.bootstrap(),
            t0.elapsed().as_millis(),
            format_ms,
            jvms_ms,
            cluster.dir.display()
        );
        Ok(cluster)
    }

    fn write_all_properties(&self) -> Result<()> {
        let voters = self
            .nodes
            .iter()
            .map(|n| format!("{}@127.0.0.1:{}", n.id, n.controller_port))
            .collect::<Vec<_>>()
            .join(",");
        for n in &self.nodes {
            let extra: Vec<(String, String)> =
                self.extra_props.iter().map(|(k, v)| (k.clone(), v.replace("{node_id}", &n.id.to_string()))).collect();
            n.write_properties(&voters, self.replication, &extra)?;
        }
        Ok(())
    }

    /// `kafka-storage format` of every node, in parallel, with one cluster id.
    fn format_all(&self) -> Result<()> {
        let cluster_id = kafka::random_cluster_id();
        let results: Vec<Result<()>> = std::thread::scope(|s| {
            let handles: Vec<_> =
                self.nodes.iter().map(|n| s.spawn(|| n.format_storage(&cluster_id, &self.dir))).collect();
            handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(err("format thread panicked")))).collect()
        });
        results.into_iter().collect()
    }

    /// Starts every JVM, then waits for each to be ready. Err carries whether a port
    /// was taken (worth a retry with new ports).
    fn spawn_all(&mut self) -> std::result::Result<(), (crate::Error, bool)> {
        let mut offsets = Vec::new();
        for n in &mut self.nodes {
            offsets.push(n.spawn().map_err(|e| (e, false))?);
        }
        let deadline = Instant::now() + READY_TIMEOUT;
        for (n, &before) in self.nodes.iter_mut().zip(&offsets) {
            if let Err(e) = n.wait_ready(before, deadline) {
                let bind = self_bind_error(n, before);
                return Err((e, bind));
            }
        }
        Ok(())
    }

    /// All nodes' PLAINTEXT listeners, `127.0.0.1:P1,127.0.0.1:P2,...` (stopped ones
    /// included: clients skip them).
    pub fn bootstrap(&self) -> String {
        self.nodes.iter().map(Node::bootstrap).collect::<Vec<_>>().join(",")
    }

    /// `127.0.0.1:PORT` of node `id`.
    pub fn node_bootstrap(&self, id: i32) -> Result<String> {
        Ok(self.node(id)?.bootstrap())
    }

    /// Node ids, `1..=N`.
    pub fn node_ids(&self) -> Vec<i32> {
        self.nodes.iter().map(|n| n.id as i32).collect()
    }

    /// Ids of the nodes the harness has started and not stopped or killed since (a
    /// node that crashed on its own still counts until [`KafkaCluster::is_running`]
    /// is asked).
    pub fn started_ids(&self) -> Vec<i32> {
        self.nodes.iter().filter(|n| n.started()).map(|n| n.id as i32).collect()
    }

    /// PLAINTEXT port of node `id`.
    pub fn port(&self, id: i32) -> Result<u16> {
        Ok(self.node(id)?.port)
    }

    /// KRaft controller port of node `id`.
    pub fn controller_port(&self, id: i32) -> Result<u16> {
        Ok(self.node(id)?.controller_port)
    }

    /// Temporary root directory (one `node-ID/` per node).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Directory of node `id`.
    pub fn node_dir(&self, id: i32) -> Result<&Path> {
        Ok(&self.node(id)?.dir)
    }

    /// Directory of the Kafka jars used.
    pub fn libs_dir(&self) -> &Path {
        self.nodes.first().map(|n| n.libs.as_path()).unwrap_or(Path::new(""))
    }

    /// Log of node `id` (log4j output plus JVM stdout/stderr, appended across restarts).
    pub fn log_path(&self, id: i32) -> Result<PathBuf> {
        Ok(self.node(id)?.log_path())
    }

    /// Last `n` lines of node `id`'s log (empty for an unknown id).
    pub fn log_tail(&self, id: i32, n: usize) -> String {
        self.node(id).map(|node| node.log_tail(n)).unwrap_or_default()
    }

    /// Last `n` lines of every node's log, each under a `--- node ID ---` header: for
    /// failure messages.
    pub fn logs_tail(&self, n: usize) -> String {
        let mut out = String::new();
        for node in &self.nodes {
            let _ = write!(out, "--- node {} ({}) ---\n{}", node.id, node.log_path().display(), node.log_tail(n));
        }
        out
    }

    /// Whether node `id`'s JVM is running (reaps it if it exited).
    pub fn is_running(&mut self, id: i32) -> bool {
        self.node_mut(id).map(Node::is_running).unwrap_or(false)
    }

    /// SIGKILL node `id` and reap it. Returns at once: the controller quorum notices
    /// after `broker.session.timeout.ms` (4 s; then leaders move and the node leaves the
    /// ISRs). No-op if it is not running.
    pub fn kill(&mut self, id: i32) -> Result<()> {
        self.node_mut(id)?.kill()
    }

    /// Graceful stop of node `id` (SIGTERM: controlled shutdown, which moves its
    /// leaderships away first); waits for the JVM to exit (up to 30 s, then SIGKILL).
    /// No-op if it is not running.
    pub fn stop(&mut self, id: i32) -> Result<()> {
        let t0 = Instant::now();
        self.node_mut(id)?.stop()?;
        eprintln!("testkit: Kafka node {id} stopped in {} ms", t0.elapsed().as_millis());
        Ok(())
    }

    /// Starts the stopped/killed node `id` again (same ports, same data) and waits until
    /// its log says it started, then until the cluster is healthy again
    /// ([`KafkaCluster::wait_healthy`]: every running node lists every running broker,
    /// and no partition lacks a leader or an in-sync running replica — the restarted
    /// node has caught up). Err if it is still running.
    pub fn start_again(&mut self, id: i32) -> Result<()> {
        let t0 = Instant::now();
        self.node_mut(id)?.restart()?;
        let up_ms = t0.elapsed().as_millis();
        self.wait_healthy(CLUSTER_SETTLE_TIMEOUT)?;
        eprintln!(
            "testkit: Kafka node {id} restarted in {} ms (JVM ready at {up_ms} ms, then back in every ISR)",
            t0.elapsed().as_millis()
        );
        Ok(())
    }

    /// Metadata as node `id` sees it (one `Metadata` request; no JVM). `topics`: `None`
    /// for all topics.
    pub fn metadata_from(&self, id: i32, topics: Option<&[&str]>) -> Result<Metadata> {
        kafka_meta::fetch_metadata(&self.node(id)?.bootstrap(), topics, METADATA_TIMEOUT)
    }

    /// Metadata from the first started node that answers.
    pub fn metadata(&self, topics: Option<&[&str]>) -> Result<Metadata> {
        let mut last = err("KafkaCluster: no node is running");
        for n in self.nodes.iter().filter(|n| n.started()) {
            match kafka_meta::fetch_metadata(&n.bootstrap(), topics, METADATA_TIMEOUT) {
                Ok(m) => return Ok(m),
                Err(e) => last = err(format!("node {}: {e}", n.id)),
            }
        }
        Err(last)
    }

    /// The node id that leads `topic`/`partition` now: asks every started node and
    /// believes the answer with the highest leader epoch (nodes' metadata caches may lag
    /// by a few ms). Err if the partition is unknown or has no leader.
    pub fn leader_of(&self, topic: &str, partition: i32) -> Result<i32> {
        let mut best: Option<(i32, Option<i32>)> = None;
        let mut errors = String::new();
        for n in self.nodes.iter().filter(|n| n.started()) {
            match kafka_meta::fetch_metadata(&n.bootstrap(), Some(&[topic]), METADATA_TIMEOUT) {
                Ok(m) => {
                    let p = m.topic(topic).and_then(|t| t.partitions.iter().find(|p| p.partition == partition));
                    if let Some(p) = p {
                        if best.is_none_or(|(epoch, _)| p.leader_epoch > epoch) {
                            best = Some((p.leader_epoch, p.leader));
                        }
                    }
                }
                Err(e) => {
                    let _ = write!(errors, " node {}: {e};", n.id);
                }
            }
        }
        match best {
            Some((_, Some(leader))) => Ok(leader),
            Some((epoch, None)) => Err(err(format!("{topic}/{partition}: no leader (epoch {epoch})"))),
            None => Err(err(format!("{topic}/{partition}: unknown to every running node{errors}"))),
        }
    }

    /// Waits until `cond(leader)` holds for the leader of `topic`/`partition` (as
    /// [`KafkaCluster::leader_of`] sees it); returns that leader. Err on timeout.
    pub fn wait_for_leader(
        &self,
        topic: &str,
        partition: i32,
        timeout: Duration,
        mut cond: impl FnMut(i32) -> bool,
    ) -> Result<i32> {
        let deadline = Instant::now() + timeout;
        loop {
            let last = self.leader_of(topic, partition);
            if let Ok(l) = last {
                if cond(l) {
                    return Ok(l);
                }
            }
            if Instant::now() >= deadline {
                return Err(err(format!(
                    "{topic}/{partition}: wanted leader not seen within {timeout:?} (last: {last:?})"
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until every started node (1) lists exactly the started nodes as its live
    /// brokers and (2) sees, for every partition of every topic (internal ones
    /// included) that has a replica on a started node, a leader and every started
    /// replica in the ISR. A node that was killed drops out of the broker list after
    /// `broker.session.timeout.ms` (4 s). Err on timeout, with the last discrepancy and
    /// the nodes' log tails.
    pub fn wait_healthy(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let problem = match self.health_problem(None) {
                None => return Ok(()),
                Some(p) => p,
            };
            if Instant::now() >= deadline {
                return Err(err(format!(
                    "Kafka cluster not healthy within {timeout:?}: {problem}\n{}",
                    self.logs_tail(15)
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The first reason the cluster is not healthy (see [`KafkaCluster::wait_healthy`]),
    /// considering only `topics` if given.
    fn health_problem(&self, topics: Option<&[&str]>) -> Option<String> {
        let started: BTreeSet<i32> = self.started_ids().into_iter().collect();
        if started.is_empty() {
            return Some("no node is running".into());
        }
        for id in &started {
            let m = match self.metadata_from(*id, topics) {
                Ok(m) => m,
                Err(e) => return Some(format!("node {id}: {e}")),
            };
            let brokers: BTreeSet<i32> = m.broker_ids().into_iter().collect();
            if brokers != started {
                return Some(format!("node {id} lists brokers {brokers:?}, running are {started:?}"));
            }
            if let Some(names) = topics {
                for name in names {
                    if m.topic(name).is_none() {
                        return Some(format!("node {id} does not know topic {name} yet"));
                    }
                }
            }
            for t in &m.topics {
                if t.error_code != 0 {
                    return Some(format!("node {id}: topic {} has error code {}", t.name, t.error_code));
                }
                for p in &t.partitions {
                    let live: Vec<i32> = p.replicas.iter().copied().filter(|r| started.contains(r)).collect();
                    if live.is_empty() {
                        continue;
                    }
                    if p.leader.is_none() || !live.iter().all(|r| p.isr.contains(r)) {
                        return Some(format!(
                            "node {id}: {}/{} leader {:?} replicas {:?} isr {:?}",
                            t.name, p.partition, p.leader, p.replicas, p.isr
                        ));
                    }
                }
            }
        }
        None
    }

    /// Creates `name` with `partitions` partitions and replication factor
    /// `replication_factor` (`org.apache.kafka.tools.TopicCommand`, a JVM start, ~1.5 s),
    /// then waits until every started node knows it with a leader and a full ISR for
    /// every partition. Err if it already exists.
    pub fn create_topic(&self, name: &str, partitions: u32, replication_factor: u32) -> Result<()> {
        kafka::create_topic_with_tool(
            self.libs_dir(),
            &self.dir,
            &self.bootstrap(),
            name,
            partitions,
            replication_factor,
        )?;
        let deadline = Instant::now() + CLUSTER_SETTLE_TIMEOUT;
        loop {
            let problem = match self.health_problem(Some(&[name])) {
                None => return Ok(()),
                Some(p) => p,
            };
            if Instant::now() >= deadline {
                return Err(err(format!("topic {name} created but not settled: {problem}")));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Runs a Kafka command-line tool class from the cluster's class path, like
    /// [`crate::Kafka::run_tool`]. Pass `--bootstrap-server` yourself
    /// ([`KafkaCluster::bootstrap`]).
    pub fn run_tool(&self, main_class: &str, args: &[&str]) -> Result<String> {
        kafka::run_tool(self.libs_dir(), &self.dir, main_class, args)
    }

    fn node(&self, id: i32) -> Result<&Node> {
        self.nodes.iter().find(|n| n.id as i32 == id).ok_or_else(|| err(format!("no Kafka node {id}")))
    }

    fn node_mut(&mut self, id: i32) -> Result<&mut Node> {
        self.nodes.iter_mut().find(|n| n.id as i32 == id).ok_or_else(|| err(format!("no Kafka node {id}")))
    }
}

fn self_bind_error(n: &Node, log_before: u64) -> bool {
    kafka::is_bind_error(&util::read_from(&n.log_path(), log_before))
}

impl Drop for KafkaCluster {
    fn drop(&mut self) {
        drop(self.watchdog.take());
        // No AppCDS archive yet: one graceful stop writes it for later starts.
        if let Some(n) = self.nodes.iter_mut().find(|n| n.dumps_cds_archive()) {
            let _ = n.stop();
        }
        for n in &mut self.nodes {
            let _ = n.kill();
        }
        util::remove_dir(&self.dir);
    }
}
