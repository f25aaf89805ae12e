"""Latency receiver for the live pg_recvlogical row: commit -> walsender output, no Kafka.

Runs pg_recvlogical (pgoutput proto_version 1, walpost's publication) on its own slot with
its output on a pipe, prints READY once the slot is active, then reads the pipe and notes
the wall clock (time.time_ns()) at which each outbox row's bytes arrived, with the
transaction number "t" read from the row's JSON payload. This is what any pgoutput client
could see at the earliest: the difference between it and walpost's commit -> append is
walpost plus Kafka, and what it shares with walpost is PostgreSQL (commit, decoding,
walsender) on the same machine.

Writes "t recv_ns recv_ms" lines to --out (the third column stands in for latency.py's
broker append time, so run.py reads both files alike). Only rows with t >= --t-min count
(a restarted pg_recvlogical replays up to one status interval of the previous rate).
Stops after --expect rows, or on SIGTERM.
"""

import argparse
import re
import signal
import subprocess
import sys
import time

import psycopg

# A digit run is only complete when a non-digit follows it, so a number cut by a read
# boundary is never taken for a shorter one.
T_RE = re.compile(rb'"t": ?(\d+)\D')


class Stop(Exception):
    pass


def on_signal(_sig, _frm):
    raise Stop  # also ends a read blocked on an idle pipe


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pg-recvlogical", required=True)
    ap.add_argument("--postgres", required=True)
    ap.add_argument("--slot", required=True)
    ap.add_argument("--t-min", type=int, required=True)
    ap.add_argument("--expect", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    p = subprocess.Popen(
        [args.pg_recvlogical, "-d", args.postgres, "--slot", args.slot, "--start",
         "-o", "proto_version=1", "-o", "publication_names=walpost_outbox",
         "-s", "1", "-F", "0", "-f", "-"],
        stdout=subprocess.PIPE, bufsize=0)
    assert p.stdout is not None
    with psycopg.connect(args.postgres, autocommit=True) as conn:
        deadline = time.monotonic() + 30
        while conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s",
                           (args.slot,)).fetchone() != (True,):
            if time.monotonic() > deadline or p.poll() is not None:
                print(f"recvlat: slot {args.slot} never became active", file=sys.stderr)
                return 1
            time.sleep(0.05)
    print("READY", flush=True)

    seen = []
    carry = b""
    try:
        while args.expect == 0 or len(seen) < args.expect:
            chunk = p.stdout.read(1 << 16)
            if not chunk:
                break
            now = time.time_ns()
            buf = carry + chunk
            end = 0
            for m in T_RE.finditer(buf):
                t = int(m.group(1))
                if t >= args.t_min:
                    seen.append((t, now))
                end = m.end(1)
            # keep a tail that may hold a cut "t": N, never bytes of a match already taken
            carry = buf[max(end, len(buf) - 64):]
    except Stop:
        pass
    p.terminate()
    p.wait(10)
    with open(args.out, "w") as f:
        for t, ns in seen:
            f.write(f"{t} {ns} {ns / 1e6:.3f}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
