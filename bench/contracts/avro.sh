#!/usr/bin/env bash
# A BIN for bench/ab-drain.sh -g bench/contracts: walpost (WALPOST, default
# target/release/walpost) writing Avro values by the subject <topic>-value in -g's
# registry (topic_name: the record_name subject Created holds the JSON Schema).
config=$(mktemp /tmp/walpost-avro.XXXX.toml)
printf '[registry]\nsubject_strategy = "topic_name"\n' > "$config"
cmd=$1
shift
exec env WALPOST_CONTRACTS_VALUE_FORMAT=avro WALPOST_REGISTRY_URL="$REGISTRY_URL" \
    "${WALPOST:-target/release/walpost}" "$cmd" --config "$config" "$@"
