#!/usr/bin/env bash
# The inbox's SQL side alone, before and after a change of its migrations, in one run:
# messages stored as the ingest stores them (100 statements of 2,000 rows, one session,
# so the deliveries trigger's cached plans are what a long-running `walpost inbox` gets),
# then claims over the 200k backlog of a plain and an ordered handler (50 of 10 rows: the
# 1,000 aggregates' heads; past them an ordered claim scans the whole backlog, before
# and after this change alike). Not part of the
# test suite.
#
#   PGHOST=/tmp PGPORT=5432 PGUSER=postgres bash bench/inbox-sql.sh [BEFORE_REV] [ROUNDS]
#
# BEFORE_REV (default HEAD~1) gives the "before" migrations (git show
# REV:migrations/inbox/..., or the files' names before migrations/inbox/ existed); "after"
# is the work tree's. Both are applied as psql users do: search_path set to the schema. Each round runs both, alternating, on fresh databases.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
: "${PGHOST:?set PGHOST (and PGPORT, PGUSER) to a server where the role may create databases}"
before_rev="${1:-HEAD~1}"
rounds="${2:-3}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
for pair in 0001_inbox.sql:0004_inbox.sql 0002_inbox_hardening.sql:0005_inbox_hardening.sql; do
    f="${pair%%:*}" old="${pair##*:}"
    git show "$before_rev:migrations/inbox/$f" > "$tmp/before-$f" 2>/dev/null \
        || git show "$before_rev:migrations/$old" > "$tmp/before-$f" 2>/dev/null || : > "$tmp/before-$f"
    cp "migrations/inbox/$f" "$tmp/after-$f"
done

psql_db() { psql -X -q -At -v ON_ERROR_STOP=1 -d "$1" "${@:2}"; }
now() { date +%s.%N; }

one() { # name, then migration files
    local db="walpost_bench_$1"; shift
    psql_db postgres -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db" >/dev/null 2>&1
    local files=()
    for f in "$@"; do files+=(-f "$f"); done
    psql_db "$db" -c "CREATE SCHEMA IF NOT EXISTS inbox" -c "SET search_path = inbox, pg_temp" "${files[@]}" >/dev/null 2>&1
    psql_db "$db" -c "SELECT inbox.register_handler('plain', '{}', '{}', 5, '1 second', '1 minute', false)" \
        -c "SELECT inbox.register_handler('ordered', '{}', '{}', 5, '1 second', '1 minute', true)" >/dev/null
    local t0 t1 t2 t3
    t0=$(now)
    for b in $(seq 0 99); do
        echo "INSERT INTO inbox.messages (event_id, topic, \"partition\", \"offset\", payload, aggregate_id, event_type) SELECT 'e'||g, 'orders', 0, g, convert_to('{\"a\":1}','UTF8'), 'agg'||(g%1000), 'T' FROM generate_series($((b * 2000)),$((b * 2000 + 1999))) g;"
    done | psql_db "$db" -f - >/dev/null
    t1=$(now)
    psql_db "$db" -c "ANALYZE" >/dev/null
    for _ in $(seq 1 300); do echo "SELECT count(*) FROM inbox.claim('plain', 10, '1 hour');"; done | psql_db "$db" -f - >/dev/null
    t2=$(now)
    for _ in $(seq 1 50); do echo "SELECT count(*) FROM inbox.claim('ordered', 10, '1 hour');"; done | psql_db "$db" -f - >/dev/null
    t3=$(now)
    psql_db postgres -c "DROP DATABASE $db" >/dev/null
    printf '%s\t%.2f\t%.2f\t%.2f\n' "$db" "$(echo "$t1 - $t0" | bc)" "$(echo "$t2 - $t1" | bc)" "$(echo "$t3 - $t2" | bc)"
}

printf 'what\tstore 200k (s)\t300 claims of 10 (s)\t50 ordered claims of 10 (s)\n'
for _ in $(seq 1 "$rounds"); do
    one before "$tmp/before-0001_inbox.sql" "$tmp/before-0002_inbox_hardening.sql"
    one after "$tmp/after-0001_inbox.sql" "$tmp/after-0002_inbox_hardening.sql"
done
