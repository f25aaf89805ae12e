#!/usr/bin/env bash
# A BIN for bench/ab-drain.sh -g bench/contracts: walpost (WALPOST, default
# target/release/walpost) writing JSON Schema-framed values, each payload validated
# against the subject Created in -g's registry.
exec env WALPOST_CONTRACTS_VALUE_FORMAT=json-schema WALPOST_REGISTRY_URL="$REGISTRY_URL" \
    "${WALPOST:-target/release/walpost}" "$@"
