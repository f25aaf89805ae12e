#!/usr/bin/env bash
# WAL written to remove 1,000,000 outbox rows: DELETE versus dropping their partition the
# way walpost retention does it (seal, then DROP TABLE once the slot confirmed the seal).
#
# Starts a throwaway PostgreSQL (and Kafka, unused) with the test harness's
# walpost-devservers, applies migrations 0001 and 0002, fills two past daily partitions
# with the same 1,000,000 rows each (bench/workload.py's, ~300-byte payloads), and
# measures pg_current_wal_lsn() before and after:
#   - DELETE FROM events.outbox WHERE occurred_at in day A   (and the VACUUM it later needs)
#   - `walpost retention` passes that seal and drop day B's partition
# full_page_writes is turned on (the harness turns it off) and a CHECKPOINT precedes each
# measurement, as in production. Prints the figures and the DELETE/DROP ratio; exits 1 if
# the ratio is below 100.
#
#   bash bench/retention-wal.sh            # ROWS=1000000 by default
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROWS="${ROWS:-1000000}"

cargo build --locked -q -p walpost -p testkit --bin walpost --bin walpost-devservers
target_dir="$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')"
bin="${target_dir:-target}/debug"

work="$(mktemp -d /tmp/walpost-retention-bench.XXXXXX)"
chmod 755 "$work"
cleanup() { exec 3>&- 2>/dev/null || true; }
trap cleanup EXIT
# shellcheck disable=SC1091
source scripts/devservers.sh
start_devservers "$bin" "$work"
psql() { "$PG_BINDIR/psql" -X -q -At -v ON_ERROR_STOP=1 "$POSTGRES_URL" "$@"; }

psql -f migrations/outbox/0001_events_outbox.sql >/dev/null
psql -f migrations/outbox/0002_outbox_partitioned.sql >/dev/null 2>&1
psql -c "ALTER SYSTEM SET full_page_writes = on" -c "SELECT pg_reload_conf()" >/dev/null

# Two past days, A and B, each in its own partition with the same rows; autovacuum off on
# them so nothing but the statement measured writes WAL there.
read -r day_a day_b < <(psql -c "SELECT to_char(now() AT TIME ZONE 'UTC' - interval '30 days', 'YYYY-MM-DD'),
                                        to_char(now() AT TIME ZONE 'UTC' - interval '29 days', 'YYYY-MM-DD')" | tr '|' ' ')
for d in "$day_a" "$day_b"; do
    name="outbox_p${d//-/}"
    psql <<SQL
CREATE TABLE events.$name PARTITION OF events.outbox
    FOR VALUES FROM ('$d 00:00:00+00') TO (('$d 00:00:00+00'::timestamptz + interval '24 hours'))
    WITH (autovacuum_enabled = false);
SQL
    python3 bench/workload.py --events "$ROWS" --tx-rows "$ROWS" --types 3 --trace-chars 0 --day "$d" | psql >/dev/null
done
psql -c "ANALYZE events.outbox" >/dev/null
part_a="outbox_p${day_a//-/}"
part_b="outbox_p${day_b//-/}"
size_a="$(psql -c "SELECT pg_size_pretty(pg_total_relation_size('events.$part_a'))")"

lsn() { psql -c "SELECT pg_current_wal_lsn()"; }
diff_bytes() { psql -c "SELECT pg_wal_lsn_diff('$2', '$1')::bigint"; }

# DELETE, then the VACUUM that has to follow it.
psql -c "CHECKPOINT"
before="$(lsn)"
psql -c "DELETE FROM events.outbox WHERE occurred_at >= '$day_a 00:00:00+00' AND occurred_at < '$day_a 00:00:00+00'::timestamptz + interval '24 hours'"
after_delete="$(lsn)"
psql -c "VACUUM events.$part_a"
after_vacuum="$(lsn)"
delete_bytes="$(diff_bytes "$before" "$after_delete")"
vacuum_bytes="$(diff_bytes "$after_delete" "$after_vacuum")"
psql -c "DROP TABLE events.$part_a"

# walpost retention on day B: a pass seals it, the slot confirms, a pass drops it.
slot=bench_retention
psql -c "SELECT pg_create_logical_replication_slot('$slot', 'pgoutput')" >/dev/null
psql -c "CHECKPOINT"
before="$(lsn)"
"$bin/walpost" retention --postgres "$POSTGRES_URL" --slot "$slot" 2>/dev/null | grep "$part_b"
psql -c "SELECT pg_replication_slot_advance('$slot', pg_current_wal_insert_lsn())" >/dev/null
"$bin/walpost" retention --postgres "$POSTGRES_URL" --slot "$slot" 2>/dev/null | grep "$part_b"
after_drop="$(lsn)"
drop_bytes="$(diff_bytes "$before" "$after_drop")"
psql -c "SELECT pg_drop_replication_slot('$slot')" >/dev/null
gone="$(psql -c "SELECT to_regclass('events.$part_b') IS NULL")"
[[ "$gone" == "t" ]] || { echo "the partition was not dropped" >&2; exit 1; }

ratio="$(awk -v d="$delete_bytes" -v p="$drop_bytes" 'BEGIN { printf "%.0f", d / p }')"
ratio_v="$(awk -v d="$delete_bytes" -v v="$vacuum_bytes" -v p="$drop_bytes" 'BEGIN { printf "%.0f", (d + v) / p }')"
cat <<EOF

WAL written to remove $ROWS outbox rows (one day, $size_a with indexes; PostgreSQL $("$PG_BINDIR/postgres" --version | awk '{print $3}'), full_page_writes=on)
  DELETE                              $(printf '%14d' "$delete_bytes") bytes
  VACUUM after the DELETE             $(printf '%14d' "$vacuum_bytes") bytes
  walpost retention (seal + DROP)     $(printf '%14d' "$drop_bytes") bytes
  ratio DELETE / DROP                 ${ratio}x   (DELETE + VACUUM / DROP: ${ratio_v}x)
EOF
if (( ratio < 100 )); then
    echo "expected a ratio of at least 100x" >&2
    exit 1
fi
