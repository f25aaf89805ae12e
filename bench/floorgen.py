"""Kafka latency floor: the live workload's record bursts produced straight to the broker.

No PostgreSQL, no CDC: every 100 / rate seconds, 100 records of ~1 KB (the shape of one
outbox transaction, keys over 1,000 aggregates, 5 topics) are produced by librdkafka with
an ordinary durable producer's settings (acks=all, idempotence, lz4, linger.ms=5 (walpost's
default until it began to send live transactions at once), murmur2_random). The
wall clock just before the burst stands in for the commit time. The same latency consumer
measures it, so this row shows what the broker (and the measurement) add on this machine
whatever the system in front of it. run.py runs the PostgreSQL insert load of the same rate
beside it (livegen.py, no replication slot), so the floor shares the cores as walpost does. Output (--out): "t send_ns" lines; a JSON summary on stdout.
"""

import argparse
import json
import random
import sys
import time

from confluent_kafka import Producer

import workload


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kafka-brokers", required=True)
    ap.add_argument("--topic-prefix", required=True)
    ap.add_argument("--rate", type=float, required=True)
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--t-base", type=int, required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    p = Producer(
        {
            "bootstrap.servers": args.kafka_brokers,
            "acks": "all",
            "enable.idempotence": True,
            "compression.type": "lz4",
            "linger.ms": 5,
            "partitioner": "murmur2_random",
        }
    )
    # incompressible like the workload's payloads (hex noise): lz4 must not make the
    # floor's records cheaper for the broker than walpost's
    rng = random.Random(42)
    fillers = ["%0768x" % rng.getrandbits(768 * 4) for _ in range(64)]
    ntx = max(1, int(args.rate * args.seconds / 100))
    period = 100 / args.rate
    sent = {}
    start = time.monotonic() + 0.05
    for k in range(ntx):
        at = start + k * period
        now = time.monotonic()
        if at > now:
            time.sleep(at - now)
        t = args.t_base + k
        sent[t] = time.time_ns()
        for i in range(100):
            g = t * 100 + i
            agg = (g * 7919) % 1000
            value = ('{"t": %d, "seq": %d, "data": {"trace": "%s"}, "version": 1}' % (t, g, fillers[g % 64])).encode()
            while True:
                try:
                    p.produce(args.topic_prefix + workload.TYPES[agg % 5], value, key=str(agg))
                    break
                except BufferError:
                    p.poll(0.01)
        p.poll(0)
    p.flush(60)
    # a schedule that kept up took (ntx - 1) periods plus the last transaction; count ntx periods
    elapsed = max(time.monotonic() - start, ntx * period)
    with open(args.out, "w") as f:
        for t, ns in sent.items():
            f.write(f"{t} {ns}\n")
    events = len(sent) * 100
    print(json.dumps({"events": events, "transactions": len(sent), "seconds": elapsed,
                      "achieved_rate": events / elapsed, "max_late_ms": 0}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
