"""Polling outbox relays, implemented as the seeds describe them (the baseline walpost replaces).

--seed 002 (NestJS OutboxRelay, @Interval(500)):
    every 500 ms, in ONE transaction:
        SELECT * FROM events.outbox WHERE published_at IS NULL
        ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED
        for each row: emit to Kafka and AWAIT its acknowledgement (lastValueFrom(emit)),
                      value = JSON.stringify({eventId, type, occurredAt, data: payload}),
                      then UPDATE events.outbox SET published_at = now() WHERE id = $1
        (on a send error: stop the batch so later events of an aggregate do not overtake)
    COMMIT
--seed 001 (Go worker poller, 2 s ticker, batch 50, single poller, no FOR UPDATE):
    every 2 s:
        SELECT * FROM events.outbox WHERE published_at IS NULL
          AND (next_retry_at IS NULL OR next_retry_at <= NOW()) ORDER BY id ASC LIMIT 50
        for each row: dispatch (here: publish the payload's raw JSON bytes to Kafka and wait
                      for the acknowledgement), then UPDATE ... SET published_at = NOW()
                      WHERE id = $1 (autocommit, one statement per row); on failure
                      UPDATE retry_count/last_error/next_retry_at.

Differences from the seeds, on purpose: the seeds order by created_at / use the partial index
on created_at; this table (migrations/outbox/0001) has the partial index on id, so both order by id.
The topic is <prefix><aggregate_type> (like the other systems) instead of
"<aggregate_type>.events". The producer is confluent-kafka (librdkafka) with acks=all,
enable.idempotence=true and linger.ms=0 (KafkaJS and a per-event awaited send transmit at
once). A tick that finds the previous batch still running starts right after it (the relay
never runs two batches at once; with SKIP LOCKED several could, which changes nothing here:
a batch takes far less than the interval).

Runs until SIGTERM/SIGINT (finishes the current batch), or until --max-seconds.
"""

import argparse
import json
import signal
import sys
import time

import psycopg
from confluent_kafka import KafkaException, Producer

stop = False


def on_signal(_sig, _frm):
    global stop
    stop = True


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", choices=["001", "002"], required=True)
    ap.add_argument("--postgres", required=True)
    ap.add_argument("--kafka-brokers", required=True)
    ap.add_argument("--topic-prefix", required=True)
    ap.add_argument("--max-seconds", type=float, default=0)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    interval, batch = (0.5, 100) if args.seed == "002" else (2.0, 50)
    producer = Producer(
        {
            "bootstrap.servers": args.kafka_brokers,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 0,
            "partitioner": "murmur2_random",
        }
    )
    conn = psycopg.connect(args.postgres, autocommit=args.seed == "001")
    t_end = time.monotonic() + args.max_seconds if args.max_seconds else None
    published = 0
    next_tick = time.monotonic() + interval  # a ticker's first tick is one interval away

    def send_and_wait(topic, key, value, headers):
        """Produce one record and block until Kafka acknowledged it (or raise)."""
        result = {}

        def cb(err, _msg):
            result["err"] = err

        producer.produce(topic, value=value, key=key, headers=headers, on_delivery=cb)
        while "err" not in result:
            producer.poll(0.05)
        if result["err"] is not None:
            raise KafkaException(result["err"])

    while not stop and (t_end is None or time.monotonic() < t_end):
        now = time.monotonic()
        if now < next_tick:
            time.sleep(min(next_tick - now, 0.05))
            continue
        next_tick += interval
        if next_tick < time.monotonic():  # a slow batch: ticks are not queued up
            next_tick = time.monotonic() + interval

        if args.seed == "002":
            with conn.transaction():
                rows = conn.execute(
                    "SELECT id, aggregate_type, aggregate_id, event_type, payload, occurred_at"
                    " FROM events.outbox WHERE published_at IS NULL"
                    " ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED",
                    (batch,),
                ).fetchall()
                for rid, atype, agg, etype, payload, occurred in rows:
                    value = json.dumps(
                        {
                            "eventId": rid,
                            "type": etype,
                            "occurredAt": occurred.isoformat(),
                            "data": payload,
                        }
                    )
                    try:
                        send_and_wait(
                            args.topic_prefix + atype,
                            str(agg),
                            value,
                            [("id", str(rid)), ("eventType", etype)],
                        )
                    except KafkaException as e:
                        print(f"relay 002: outbox {rid} failed, retry next tick: {e}", file=sys.stderr)
                        break
                    conn.execute("UPDATE events.outbox SET published_at = now() WHERE id = %s", (rid,))
                    published += 1
        else:
            rows = conn.execute(
                "SELECT id, aggregate_type, aggregate_id, event_type, payload::text"
                " FROM events.outbox WHERE published_at IS NULL"
                " AND (next_retry_at IS NULL OR next_retry_at <= NOW())"
                " ORDER BY id ASC LIMIT %s",
                (batch,),
            ).fetchall()
            for rid, atype, agg, etype, payload in rows:
                try:
                    send_and_wait(
                        args.topic_prefix + atype,
                        str(agg),
                        payload,
                        [("id", str(rid)), ("eventType", etype)],
                    )
                except KafkaException as e:
                    conn.execute(
                        "UPDATE events.outbox SET retry_count = retry_count + 1, last_error = %s,"
                        " next_retry_at = now() + interval '1 minute' WHERE id = %s",
                        (str(e), rid),
                    )
                    continue
                conn.execute("UPDATE events.outbox SET published_at = NOW() WHERE id = %s", (rid,))
                published += 1
    producer.flush(30)
    conn.close()
    print(f"relay {args.seed}: published {published}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
