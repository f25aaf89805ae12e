"""Decodes every record of one topic with Confluent's schema-registry deserializers.

A consumer as a user would write it: confluent-kafka reads the records, and
AvroDeserializer or JSONDeserializer (confluent_kafka.schema_registry) decodes each
value by the schema id in its Confluent wire-format header, fetched from the registry.
Prints one JSON line per record: the `id` header, the schema id and the decoded value,
and with a fifth argument `avro-key` the key decoded by AvroDeserializer too (as
KafkaAvroDeserializer would read a key written by the subject <topic>-key).
Run by crates/walpost/tests/e2e/registry.rs with the venv of scripts/fetch-test-tools.sh.

usage: sr_consume.py BOOTSTRAP TOPIC REGISTRY_URL avro|json [avro-key]
"""

import json
import struct
import sys
import time

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext


def main():
    bootstrap, topic, url, kind = sys.argv[1:5]
    avro_key = sys.argv[5:6] == ["avro-key"]
    registry = SchemaRegistryClient({"url": url})
    deserialize_key = AvroDeserializer(registry) if avro_key else None
    if kind == "avro":
        deserialize = AvroDeserializer(registry)
    else:
        deserialize = JSONDeserializer(None, schema_registry_client=registry)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"sr-consume-{time.time_ns()}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    meta = consumer.list_topics(topic, timeout=30).topics[topic]
    assignment = []
    highs = {}
    for p in meta.partitions:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
        if high > 0:
            highs[p] = high
            assignment.append(TopicPartition(topic, p, 0))
    consumer.assign(assignment)
    done = set()
    deadline = time.time() + 60
    while len(done) < len(highs) and time.time() < deadline:
        m = consumer.poll(1.0)
        if m is None:
            continue
        if m.error():
            if m.error().code() == -191:  # _PARTITION_EOF
                done.add(m.partition())
                continue
            raise SystemExit(f"consume error: {m.error()}")
        value = m.value()
        schema_id = struct.unpack(">bI", value[:5])[1]
        decoded = deserialize(value, SerializationContext(topic, MessageField.VALUE))
        headers = {k: v.decode() for k, v in (m.headers() or [])}
        line = {"id": headers.get("id"), "schema_id": schema_id, "value": decoded}
        if deserialize_key:
            line["key"] = deserialize_key(m.key(), SerializationContext(topic, MessageField.KEY))
        print(json.dumps(line))
        if m.offset() + 1 >= highs[m.partition()]:
            done.add(m.partition())
    consumer.close()


if __name__ == "__main__":
    main()
