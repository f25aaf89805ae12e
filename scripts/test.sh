#!/usr/bin/env bash
# Runs the whole walpost test suite: unit and property tests of every crate, and the
# end-to-end suite against a real PostgreSQL (wal_level=logical) and a real Apache
# Kafka 4.x broker, which the test harness (crates/testkit) starts on free ports.
#
# Installs what is missing first (scripts/setup-deps.sh: PostgreSQL 15, librdkafka's
# build dependencies, the Kafka jars). Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup-deps.sh
cargo test --workspace --locked "$@"
