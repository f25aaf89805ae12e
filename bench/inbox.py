"""walpost inbox benchmark: ingest rate against a plain COPY of the same rows,
claim+complete throughput with 1, 4 and 16 workers, Kafka -> inbox latency at 1,000
records/s, and walpost inbox's peak RSS. Driven by bench/inbox.sh (which starts the
servers and builds walpost); not part of the test suite.

Environment: POSTGRES_URL, KAFKA_BROKERS, PG_BINDIR, WALPOST (the binary), RECORDS
(default 200000), RESULTS (output markdown file), INBOX_CONFIG (a TOML file for walpost
inbox, e.g. other [inbox] batch limits), ONLY_INGEST (stop after the ingest rows), TOPIC
and GROUP (default bench.orders, bench), NO_MIGRATE (leave the schema to `walpost inbox
--create-schema` alone: a binary older than `walpost migrate`; bench/inbox-ab.sh).
With ONLY_INGEST a last line `ingest: <records/s from start> <records/s first to last>
<CPU us/record> <peak RSS MB>` is printed for scripts.
"""

import os
import re
import subprocess
import sys
import time

import psycopg
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

import procstat

PG = os.environ["POSTGRES_URL"]
BROKERS = os.environ["KAFKA_BROKERS"]
PG_BINDIR = os.environ["PG_BINDIR"]
WALPOST = os.environ["WALPOST"]
RECORDS = int(os.environ.get("RECORDS", "200000"))
ONLY_INGEST = bool(os.environ.get("ONLY_INGEST"))
RESULTS = os.environ.get("RESULTS", "bench/results/inbox.md")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sql(text, fetch=True):
    with psycopg.connect(PG, autocommit=True) as c:
        cur = c.execute(text)
        return cur.fetchall() if fetch and cur.description else None


def create_topic(name, partitions=3):
    admin = AdminClient({"bootstrap.servers": BROKERS})
    for f in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        f.result()


def value(i):
    # ~1 KB of mostly-hex JSON, as the outbox bench's payloads.
    return ('{"n": %d, "order": "%032x", "note": "%s"}' % (i, i * 2654435761, ("%064x" % (i * 40503)) * 15)).encode()


def producer():
    return Producer({"bootstrap.servers": BROKERS, "acks": "all", "linger.ms": 5, "enable.idempotence": True})


def produce(topic, first, n, rate=None, p=None):
    p = p or producer()
    started = time.time()
    for i in range(first, first + n):
        while True:
            try:
                p.produce(topic, key=b"agg-%d" % (i % 1000), value=value(i),
                          headers=[("id", b"e-%d" % i), ("eventType", b"OrderPlaced")])
                break
            except BufferError:
                p.poll(0.01)
        if rate:
            due = started + (i - first + 1) / rate
            delay = due - time.time()
            if delay > 0:
                p.poll(delay)
        else:
            p.poll(0)
    p.flush(60)


def stored():
    return sql("SELECT count(*) FROM inbox.messages")[0][0]


METRICS_PORT = int(os.environ.get("METRICS_PORT", "19188"))


def start_inbox(topic, group):
    log = open("/tmp/walpost-inbox-bench-%s.log" % group, "w")
    extra = ["--config", os.environ["INBOX_CONFIG"]] if os.environ.get("INBOX_CONFIG") else []
    return subprocess.Popen(
        [WALPOST, "inbox", "--postgres", PG, "--kafka-brokers", BROKERS, "--topics", topic,
         "--group", group, "--create-schema", "--metrics-addr", "127.0.0.1:%d" % METRICS_PORT] + extra,
        stdout=log, stderr=subprocess.STDOUT)


def scrape(name):
    import urllib.request
    body = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % METRICS_PORT, timeout=5).read().decode()
    for line in body.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def ingest(topic, group, n):
    """Drains n records already in Kafka: (seconds from process start, peak RSS MB)."""
    base = stored()
    started = time.time()
    proc = start_inbox(topic, group)
    peak = 0
    first = None
    while True:
        now_stored = stored() - base
        if first is None and now_stored > 0:
            first = time.time()
        if now_stored >= n:
            break
        peak = max(peak, procstat.hwm_kb(proc.pid) or 0)
        if proc.poll() is not None:
            sys.exit("walpost inbox exited: see /tmp/walpost-inbox-bench-%s.log" % group)
        time.sleep(0.05)
    done = time.time()
    peak = max(peak, procstat.hwm_kb(proc.pid) or 0)
    write = scrape("walpost_inbox_write_seconds_sum")
    print("batches: %d" % scrape("walpost_inbox_batches_total"), flush=True)
    return proc, done - started, done - first, write, peak / 1024


def copy_floor():
    """The same rows (as stored) with a plain COPY into a table of the same columns and
    primary key, without the trigger and the other indexes: PostgreSQL's bulk path alone."""
    sql("DROP TABLE IF EXISTS floor; CREATE TABLE floor (LIKE inbox.messages)", False)
    dump = "/tmp/walpost-inbox-floor.bin"
    psql = os.path.join(PG_BINDIR, "psql")
    subprocess.run([psql, "-X", "-q", PG, "-c", "\\copy (SELECT * FROM inbox.messages) TO '%s' (FORMAT binary)" % dump], check=True)
    sql("ALTER TABLE floor ADD PRIMARY KEY (event_id)", False)
    started = time.time()
    subprocess.run([psql, "-X", "-q", PG, "-c", "\\copy floor FROM '%s' (FORMAT binary)" % dump], check=True)
    return time.time() - started


def pgbench(handler, clients, seconds):
    script = "/tmp/walpost-inbox-bench-%s.sql" % handler
    with open(script, "w") as f:
        f.write(
            "SELECT coalesce(min(event_id), '') AS id, coalesce(min(lease_token::text), '00000000-0000-0000-0000-000000000000') AS tok "
            "FROM inbox.claim('%s', 1, '30 seconds') \\gset\n"
            "BEGIN;\n"
            "INSERT INTO effects VALUES ('%s', :id);\n"
            "SELECT inbox.complete('%s', :id, :tok::uuid);\n"
            "COMMIT;\n" % (handler, handler, handler))
    run = subprocess.run(
        [os.path.join(PG_BINDIR, "pgbench"), "-n", "-M", "extended", "-f", script, "-c", str(clients), "-j", str(min(clients, 2)),
         "-T", str(seconds), PG], capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit("pgbench failed:\n" + run.stdout + run.stderr)
    out = run.stdout
    done = sql("SELECT count(*) FROM inbox.receipts WHERE handler = '%s'" % handler)[0][0]
    tps = float(re.search(r"tps = ([0-9.]+)", out).group(1))
    return tps, done / seconds


def main():
    machine = "%d cores, load %s" % (os.cpu_count(), procstat.loadavg())
    lines = ["# walpost inbox benchmark", "", "machine: " + machine, ""]
    topic = os.environ.get("TOPIC", "bench.orders")
    group = os.environ.get("GROUP", "bench")
    if not os.environ.get("NO_MIGRATE"):
        subprocess.run([WALPOST, "migrate", "--inbox", "--postgres", PG], check=True, stdout=subprocess.DEVNULL)
    create_topic(topic)
    print("producing %d records of ~1 KB..." % RECORDS, flush=True)
    produce(topic, 0, RECORDS)

    proc, secs, steady, write, rss = ingest(topic, group, RECORDS)
    cpu = procstat.cpu_s(proc.pid)
    proc.terminate()
    proc.wait(30)
    rate = RECORDS / secs
    steady_rate = RECORDS / steady
    floor = copy_floor()
    floor_rate = RECORDS / floor
    lines += [
        "## Ingest (Kafka -> inbox.messages + inbox.offsets, one transaction per batch)",
        "",
        "| what | records | seconds | records/s | peak RSS MB |",
        "|---|---|---|---|---|",
        "| `walpost inbox`, from process start (includes the group join: the broker's group.initial.rebalance.delay.ms, 3 s) | %d | %.1f | %.0f | %.1f |" % (RECORDS, secs, rate, rss),
        "| `walpost inbox`, first to last record stored | %d | %.1f | %.0f | |" % (RECORDS, steady, steady_rate),
        "| plain `COPY` of the same rows (floor) | %d | %.1f | %.0f | |" % (RECORDS, floor, floor_rate),
        "",
        "ratio walpost (first to last) / COPY floor: %.2f; time in PostgreSQL writes: %.1f s; walpost inbox CPU: %.1f s (%.1f us/record)"
        % (steady_rate / floor_rate, write, cpu, cpu * 1e6 / RECORDS),
        "",
    ]
    print("\n".join(lines[-10:]), flush=True)
    if ONLY_INGEST:
        print("ingest: %.0f %.0f %.1f %.1f" % (rate, steady_rate, cpu * 1e6 / RECORDS, rss), flush=True)
        return

    sql("CREATE TABLE IF NOT EXISTS effects (handler text, event_id text)", False)
    lines += ["## claim + complete (pgbench, one message per claim, effect and receipt in one transaction)", "",
              "| workers | completes/s |", "|---|---|"]
    for clients in (1, 4, 16):
        handler = "h%d" % clients
        sql("SELECT inbox.register_handler('%s', '{}', '{}', 5, '1 second', '1 minute', false)" % handler, False)
        sql("VACUUM ANALYZE inbox.deliveries", False)
        _tps, completes = pgbench(handler, clients, 15)
        lines.append("| %d | %.0f |" % (clients, completes))
        print(lines[-1], flush=True)
    for clients in (1, 4, 16):
        sql("DELETE FROM inbox.handlers WHERE name = 'h%d'" % clients, False)

    # Latency at 1,000 records/s: Kafka timestamp (CreateTime) to the batch's transaction.
    proc = start_inbox(topic, "bench")
    # Measure from a ready producer and an assigned consumer: one record first, through
    # the producer the run uses, stored once the group has joined. The record's timestamp
    # is taken when it is handed to the producer, so a producer's first records wait for
    # its metadata and idempotent producer id (~0.5 s here): with a new producer per run
    # those 300-500 records were over 1 % of the run, and were the p99 (bench/results/
    # analysis.md, the inbox's 1k/s latency tail).
    before = stored()
    p = producer()
    p.produce(topic, key=b"warm", value=b'{"warm": true}', headers=[("id", b"warm-latency"), ("eventType", b"Warm")])
    p.flush(30)
    while stored() == before:
        time.sleep(0.05)
    base = stored()
    peak = 0
    produce(topic, RECORDS, 20000, rate=1000, p=p)
    while stored() - base < 20000:
        peak = max(peak, procstat.hwm_kb(proc.pid) or 0)
        time.sleep(0.1)
    peak = max(peak, procstat.hwm_kb(proc.pid) or 0)
    proc.terminate()
    proc.wait(30)
    p50, p99, pmax = sql(
        "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY d), percentile_cont(0.99) WITHIN GROUP (ORDER BY d), max(d) "
        "FROM (SELECT extract(epoch FROM received_at - occurred_at) * 1000 AS d FROM inbox.messages "
        "WHERE event_id IN (SELECT 'e-' || g FROM generate_series(%d, %d) g)) x" % (RECORDS, RECORDS + 19999))[0]
    # Where the tail is: the seconds (by Kafka timestamp) with the slowest records.
    for second, worst, slow, n in sql(
            "SELECT to_char(date_trunc('second', occurred_at), 'HH24:MI:SS'), max(d), count(*) FILTER (WHERE d > 100), count(*) "
            "FROM (SELECT occurred_at, extract(epoch FROM received_at - occurred_at) * 1000 AS d FROM inbox.messages "
            "WHERE event_id IN (SELECT 'e-' || g FROM generate_series(%d, %d) g)) x "
            "GROUP BY 1 ORDER BY 2 DESC LIMIT 5" % (RECORDS, RECORDS + 19999)):
        print("latency tail: second %s: worst %.0f ms, %d of %d records over 100 ms" % (second, worst, slow, n), flush=True)
    lines += ["", "## Kafka -> inbox latency at 1,000 records/s (20,000 records)", "",
              "| p50 ms | p99 ms | max ms | peak RSS MB |", "|---|---|---|---|",
              "| %.1f | %.1f | %.1f | %.1f |" % (p50, p99, pmax, peak / 1024)]
    print("\n".join(lines[-5:]), flush=True)
    with open(os.path.join(ROOT, RESULTS), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("written to " + RESULTS)


if __name__ == "__main__":
    main()
