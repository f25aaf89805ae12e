"""Live load generator: outbox transactions of 100 rows at a fixed event rate.

Transaction k is due at start + k * 100 / rate. A few worker threads (one connection each)
take due transactions in order and run one INSERT ... SELECT of 100 rows (workload.INSERT_TX,
autocommit: one statement = one transaction). Right after the COMMIT returns, the worker
records the wall clock (time.time_ns()) for that transaction number "t", which the rows carry
as the first key of their JSON payload. Output (--out): one line "t commit_ns" per
transaction; a summary line on stderr (achieved rate, how late the schedule ran).
"""

import argparse
import json
import queue
import sys
import threading
import time

import psycopg

import workload


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--postgres", required=True)
    ap.add_argument("--rate", type=float, required=True, help="events per second")
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--t-base", type=int, required=True)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--tx-rows", type=int, default=100)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    ntx = max(1, int(args.rate * args.seconds / args.tx_rows))
    period = args.tx_rows / args.rate
    conns = [psycopg.connect(args.postgres, autocommit=True) for _ in range(args.workers)]
    for c in conns:
        c.execute("SELECT 1")
    due: "queue.Queue[int | None]" = queue.Queue()
    commits: dict[int, int] = {}
    late = [0.0]
    lock = threading.Lock()
    start = time.monotonic() + 0.05

    def worker(conn):
        while True:
            k = due.get()
            if k is None:
                return
            t = args.t_base + k
            conn.execute(
                workload.INSERT_TX,
                dict(seed=args.seed, t=t, g0=t * args.tx_rows + 1, n=args.tx_rows),
                prepare=True,
            )
            now_ns = time.time_ns()
            with lock:
                commits[t] = now_ns

    threads = [threading.Thread(target=worker, args=(c,), daemon=True) for c in conns]
    for th in threads:
        th.start()
    for k in range(ntx):
        at = start + k * period
        now = time.monotonic()
        if at > now:
            time.sleep(at - now)
        else:
            late[0] = max(late[0], now - at)
        # Do not queue more than the workers can run: a saturated generator shows up as a
        # lower achieved rate instead of an ever-growing queue.
        while due.qsize() > args.workers:
            time.sleep(0.0005)
        due.put(k)
    for _ in threads:
        due.put(None)
    for th in threads:
        th.join()
    # a schedule that kept up took (ntx - 1) periods plus the last transaction; count ntx periods
    elapsed = max(time.monotonic() - start, ntx * period)
    with open(args.out, "w") as f:
        for t, ns in sorted(commits.items()):
            f.write(f"{t} {ns}\n")
    events = len(commits) * args.tx_rows
    print(
        f"livegen: {events} events in {len(commits)} transactions, {elapsed:.2f} s, "
        f"achieved {events / elapsed:.0f} events/s (target {args.rate:.0f}), "
        f"schedule max late {late[0] * 1000:.0f} ms",
        file=sys.stderr,
    )
    print(json.dumps({"events": events, "transactions": len(commits), "seconds": elapsed,
                      "achieved_rate": events / elapsed, "max_late_ms": late[0] * 1000}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
