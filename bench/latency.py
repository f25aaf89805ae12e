"""Latency consumer: records when each outbox record becomes readable in Kafka.

Assigns every partition of the given topics at its current high watermark (so only records
produced from now on are seen), prints READY, then polls one message at a time and notes the
wall clock (time.time_ns()) at which it was received together with the transaction number
"t" read from the value (the first key of the payload JSON). A record is readable only after
the broker committed it (high watermark), i.e. after the acks=all acknowledgement was due, so
receive time minus commit time is an upper bound of commit -> Kafka ack (it adds the
consumer's fetch round trip, the same for every system).

The benchmark's topics use message.timestamp.type=LogAppendTime, so each record also carries
the broker's append time (ms resolution), which is written beside the receive time: commit ->
append leaves out the consumer's hop and is the closest observable point to the producer's
acknowledgement (single replica: the ack follows the append).

Stops after --expect records, or on SIGTERM; writes "t recv_ns append_ms" lines to --out.
"""

import argparse
import re
import signal
import sys
import time

from confluent_kafka import Consumer, TopicPartition

T_RE = re.compile(rb'"t": ?(\d+)')
stop = False


def on_signal(_sig, _frm):
    global stop
    stop = True


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kafka-brokers", required=True)
    ap.add_argument("--topics", required=True, help="comma-separated")
    ap.add_argument("--expect", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    c = Consumer(
        {
            "bootstrap.servers": args.kafka_brokers,
            "group.id": "walpost-bench-latency",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
            "fetch.min.bytes": 1,
            "fetch.queue.backoff.ms": 0,
        }
    )
    md = c.list_topics(timeout=10)
    assignment = []
    for topic in args.topics.split(","):
        for p in md.topics[topic].partitions:
            _lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            assignment.append(TopicPartition(topic, p, hi))
    c.assign(assignment)
    print("READY", flush=True)
    seen = []
    unparsed = 0
    while not stop and (args.expect == 0 or len(seen) < args.expect):
        m = c.poll(0.1)
        if m is None:
            continue
        now = time.time_ns()
        if m.error():
            continue
        v = m.value() or b""
        match = T_RE.search(v)
        if match is None:
            unparsed += 1
            continue
        seen.append((int(match.group(1)), now, m.timestamp()[1]))
    c.close()
    with open(args.out, "w") as f:
        for t, ns, ts in seen:
            f.write(f"{t} {ns} {ts}\n")
    print(f"latency: {len(seen)} records, {unparsed} unparsed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
