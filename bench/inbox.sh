#!/usr/bin/env bash
# walpost inbox benchmark: ingest records/s against a plain COPY of the same
# rows, claim+complete with 1, 4 and 16 workers (pgbench), Kafka -> inbox latency at
# 1,000 records/s, peak RSS. Writes bench/results/inbox.md. Not part of the test suite.
#
#   bash bench/inbox.sh                 # RECORDS=200000
#   RECORDS=50000 bash bench/inbox.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[[ -n "${BENCH_NO_BUILD:-}" ]] || cargo build --release --locked -q -p walpost -p testkit --bin walpost --bin walpost-devservers
if [[ ! -x bench/.venv/bin/python ]]; then
    python3 -m venv bench/.venv
fi
bench/.venv/bin/pip install -q -r bench/requirements.txt
work="$(mktemp -d /tmp/walpost-inbox-bench.XXXXXX)"
chmod 755 "$work"
# shellcheck disable=SC1091
source scripts/devservers.sh
start_devservers target/release "$work"
export POSTGRES_URL KAFKA_BROKERS PG_BINDIR
WALPOST="$PWD/target/release/walpost" bench/.venv/bin/python bench/inbox.py
