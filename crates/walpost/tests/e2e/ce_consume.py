"""Decodes every record of the topics starting with a prefix with the CloudEvents SDK.

A consumer as a user would write it: confluent-kafka reads the records, and the
CloudEvents Python SDK's Kafka binding (cloudevents.core.bindings.kafka) decodes each one,
binary or structured mode as the record says (from_kafka: binary when ce_* headers are
present). Prints one JSON line per record: where it is, the attributes, and the data as
the SDK decoded it. Run by crates/walpost/tests/e2e/cloudevents.rs with the venv of
scripts/fetch-test-tools.sh.

usage: ce_consume.py BOOTSTRAP TOPIC_PREFIX
"""

import base64
import datetime
import json
import sys
import time

from cloudevents.core.bindings.kafka import KafkaMessage, from_kafka
from cloudevents.core.formats.json import JSONFormat
from confluent_kafka import Consumer, TopicPartition


def jsonable(value):
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray)):
        return {"base64": base64.b64encode(value).decode()}
    return value


def main():
    bootstrap, prefix = sys.argv[1], sys.argv[2]
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"ce-consume-{time.time_ns()}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    topics = consumer.list_topics(timeout=30).topics
    highs = {}
    assignment = []
    for name, meta in topics.items():
        if not name.startswith(prefix):
            continue
        for p in meta.partitions:
            _, high = consumer.get_watermark_offsets(TopicPartition(name, p), timeout=30)
            if high > 0:
                highs[(name, p)] = high
                assignment.append(TopicPartition(name, p, 0))
    consumer.assign(assignment)
    remaining = set(highs)
    out = []
    deadline = time.monotonic() + 60
    while remaining and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        if msg.error():
            if msg.error().code() == -191:  # _PARTITION_EOF
                remaining.discard((msg.topic(), msg.partition()))
                continue
            raise RuntimeError(str(msg.error()))
        if msg.offset() + 1 >= highs[(msg.topic(), msg.partition())]:
            remaining.discard((msg.topic(), msg.partition()))
        headers = {k: (v or b"") for k, v in (msg.headers() or [])}
        message = KafkaMessage(headers=headers, key=msg.key(), value=msg.value() or b"")
        event = from_kafka(message, JSONFormat())
        out.append(
            {
                "topic": msg.topic(),
                "partition": msg.partition(),
                "offset": msg.offset(),
                "tombstone": msg.value() is None,
                "attributes": {k: jsonable(v) for k, v in event.get_attributes().items()},
                "data": jsonable(event.get_data()),
            }
        )
    consumer.close()
    if remaining:
        raise SystemExit(f"timed out reading {sorted(remaining)}")
    for line in sorted(out, key=lambda r: (r["topic"], r["partition"], r["offset"])):
        print(json.dumps(line, sort_keys=True))


if __name__ == "__main__":
    main()
