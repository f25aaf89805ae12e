#!/usr/bin/env bash
# Snapshot throughput and memory: `walpost run --snapshot initial_only` (read every row in
# one REPEATABLE READ snapshot, publish to Kafka with acks=all, wait for every ack, exit)
# over ROWS existing outbox rows (default 1,000,000, bench/workload.py's ~1 KB payloads over
# 1,000 aggregates, in transactions of 10,000 rows).
# Prints rows/s and peak RSS (from /usr/bin/time -v). Not part of the test suite.
#
#   bash bench/snapshot.sh             # ROWS=1000000
#   ROWS=100000 bash bench/snapshot.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROWS="${ROWS:-1000000}"

cargo build --release --locked -q -p walpost -p testkit --bin walpost --bin walpost-devservers
work="$(mktemp -d /tmp/walpost-snapshot-bench.XXXXXX)"
chmod 755 "$work"
trap 'exec 3>&- 2>/dev/null || true' EXIT
# shellcheck disable=SC1091
source scripts/devservers.sh
start_devservers target/release "$work"
psql() { "$PG_BINDIR/psql" -X -q -At -v ON_ERROR_STOP=1 "$POSTGRES_URL" "$@"; }

psql -f migrations/outbox/0001_events_outbox.sql >/dev/null
echo "inserting $ROWS rows..."
python3 bench/workload.py --events "$ROWS" --tx-rows 10000 | psql >/dev/null
psql -c "VACUUM ANALYZE events.outbox"

/usr/bin/time -v target/release/walpost run --postgres "$POSTGRES_URL" --kafka-brokers "$KAFKA_BROKERS" \
    --snapshot initial_only 2> "$work/walpost.log"
secs=$(grep -o 'secs=[0-9.]*' "$work/walpost.log" | tail -1 | cut -d= -f2)
rss_kb=$(grep 'Maximum resident set size' "$work/walpost.log" | awk '{print $NF}')
published=$(grep -o 'rows=[0-9]*' "$work/walpost.log" | tail -1 | cut -d= -f2)
echo "snapshot: $published rows in ${secs} s = $(awk -v r="$published" -v s="$secs" 'BEGIN{printf "%.0f", r/s}') rows/s; peak RSS $((rss_kb / 1024)) MB"
echo "machine: $(nproc) cores, $(uptime | sed 's/.*load/load/')"
