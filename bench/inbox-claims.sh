#!/usr/bin/env bash
# The inbox's claims and handlers before and after migrations/inbox/0004_inbox_heads.sql,
# in one run, each figure beside its floor. Not part of the test suite.
#
#   bash bench/inbox-claims.sh [ROUNDS]          # default 3; medians over the rounds
#
# It starts its own scratch PostgreSQL (the harness's settings: fsync and full_page_writes
# off) from PG_BINDIR (default: WALPOST_PG_BINDIR, else the highest
# /usr/lib/postgresql/*/bin), and per round and variant ("before": 0001-0003, "after":
# 0001-0004) a fresh database:
#   1. MESSAGES (1,000,000) messages of AGGREGATES (10,000) aggregates (each message's
#      aggregate a hash of its number), stored as the ingest stores them (statements of
#      2,000 rows, one session) for a plain and an ordered handler: "store" is that time;
#   2. EXPLAIN (ANALYZE, BUFFERS) of one claim of 50 of each handler (auto_explain, the
#      function's own statements), into $RAW_DIR;
#   3. claim latency: CLAIMS (300) claims of 50 per handler (a minute of them at most),
#      each in its own transaction and completed with complete_many right after (so the
#      backlog stays ~1M and the heads move on); p50 and p99 of the claim alone;
#   4. the worst case of the ordered claim: every aggregate's head leased (one claim of
#      AGGREGATES rows), then up to 5 claims of 50 (30 s at most) that find nothing
#      (p50); then the leases are let go;
#   5. handlers: pgbench with 1, 4 and 16 clients for SECONDS (8) each, one message per
#      transaction (claim of 1 in its own transaction; then BEGIN, the effect row,
#      inbox.complete, COMMIT) and batches of 50 (claim of 50; then BEGIN, complete_many
#      and the effect rows of the ids it returned, COMMIT), for each handler: completes/s
#      counted from the receipts written.
# The floor, once per round: the same writes on plain tables by pgbench with the same
# clients (one UPDATE of a pending row by its key, one receipt INSERT, one effect INSERT
# per message; 50 of each in one transaction for batches).
#
# Writes the raw figures to $RAW_DIR/claims.tsv and prints the tables of medians (pasted
# into bench/results/inbox-sql.md).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
rounds="${1:-3}"
MESSAGES="${MESSAGES:-1000000}"
AGGREGATES="${AGGREGATES:-10000}"
CLAIMS="${CLAIMS:-300}"
SECONDS_PER_RUN="${SECONDS_PER_RUN:-8}"
WORKERS="${WORKERS:-1 4 16}"
if [[ -z "${PG_BINDIR:-}" ]]; then
    PG_BINDIR="${WALPOST_PG_BINDIR:-$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)}"
fi
psql_bin="$PG_BINDIR/psql"
[[ -x "$psql_bin" ]] || psql_bin="$(command -v psql)"
pgbench_bin="$PG_BINDIR/pgbench"
[[ -x "$pgbench_bin" ]] || pgbench_bin="$(command -v pgbench)"

work="$(mktemp -d /tmp/walpost-inbox-claims.XXXXXX)"
chmod 755 "$work"
RAW_DIR="${RAW_DIR:-$PWD/bench/out/inbox-claims}"
mkdir -p "$RAW_DIR"
# initdb refuses root: the cluster runs as an ordinary user, as the harness's does.
as_pg() {
    if [[ "$(id -u)" == 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}
[[ "$(id -u)" != 0 ]] || chown postgres "$work"
as_pg "$PG_BINDIR/initdb" -D "$work/data" -U postgres --auth=trust -E UTF8 --locale=C >/dev/null
cat >> "$work/data/postgresql.conf" <<EOF
listen_addresses = ''
unix_socket_directories = '$work'
port = 55433
fsync = off
full_page_writes = off
synchronous_commit = on
shared_buffers = 512MB
max_connections = 60
timezone = 'UTC'
EOF
as_pg "$PG_BINDIR/pg_ctl" -D "$work/data" -l "$work/postgres.log" -w start >/dev/null
stop() {
    as_pg "$PG_BINDIR/pg_ctl" -D "$work/data" -m fast -w stop >/dev/null || true
    if [[ -z "${KEEP_WORK:-}" ]]; then rm -rf "$work/data"; fi
}
trap stop EXIT
export PGHOST="$work" PGPORT=55433 PGUSER=postgres

psql_db() { "$psql_bin" -X -q -At -v ON_ERROR_STOP=1 -d "$1" "${@:2}"; }
now() { date +%s.%N; }
tsv="$RAW_DIR/claims.tsv"
: > "$tsv"
row() { printf '%s\n' "$(IFS=$'\t'; echo "$*")" | tee -a "$tsv"; }

inbox_files() { # variant
    local files=(0001_inbox.sql 0002_inbox_hardening.sql 0003_inbox_batches.sql)
    [[ "$1" == after ]] && files+=(0004_inbox_heads.sql)
    for f in "${files[@]}"; do printf -- '-f\nmigrations/inbox/%s\n' "$f"; done
}

# pgbench scripts: a worker of handler H, one message or 50 per transaction; the floor.
scripts="$work/scripts"
mkdir -p "$scripts"
for h in plain ordered; do
    cat > "$scripts/single-$h.sql" <<EOF
SELECT coalesce(min(event_id), '') AS id, coalesce(min(lease_token::text), '00000000-0000-0000-0000-000000000000') AS tok FROM inbox.claim('$h', 1, '30 seconds') \gset
BEGIN;
INSERT INTO bench_effects VALUES ('$h', :id);
SELECT inbox.complete('$h', :id, :tok::uuid);
COMMIT;
EOF
    cat > "$scripts/batch-$h.sql" <<EOF
SELECT coalesce(array_agg(event_id)::text, '{}') AS ids, coalesce(array_agg(lease_token)::text, '{}') AS toks FROM inbox.claim('$h', 50, '30 seconds') \gset
BEGIN;
INSERT INTO bench_effects SELECT '$h', u.id FROM pg_catalog.unnest(inbox.complete_many('$h', :ids::text[], :toks::uuid[])) AS u (id);
COMMIT;
EOF
done
cat > "$scripts/single-floor.sql" <<EOF
\set id random(1, $MESSAGES)
BEGIN;
UPDATE floor_items SET state = 'done' WHERE id = :id;
INSERT INTO floor_receipts (id) VALUES (:id);
INSERT INTO bench_effects VALUES ('floor', :id);
COMMIT;
EOF
cat > "$scripts/batch-floor.sql" <<EOF
\set id random(1, $((MESSAGES - 49)))
BEGIN;
UPDATE floor_items SET state = 'done' WHERE id BETWEEN :id AND :id + 49;
INSERT INTO floor_receipts (id) SELECT g FROM generate_series(:id, :id + 49) g;
INSERT INTO bench_effects SELECT 'floor', g::text FROM generate_series(:id, :id + 49) g;
COMMIT;
EOF

pgbench_tps() { # db script clients
    local out
    out="$("$pgbench_bin" -n -M prepared -f "$2" -c "$3" -j "$(( $3 < 2 ? $3 : 2 ))" -T "$SECONDS_PER_RUN" "$1" 2>&1)" \
        || { echo "$out" >&2; return 1; }
    sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<< "$out" | head -1
}

receipts() { psql_db "$1" -c "SELECT count(*) FROM inbox.receipts WHERE handler = '$2'"; }

one() { # round variant
    local r="$1" v="$2" db="claims_$2" t0 t1
    psql_db postgres -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db" >/dev/null
    mapfile -t files < <(inbox_files "$v")
    psql_db "$db" -c "CREATE SCHEMA inbox" -c "SET search_path = inbox, pg_temp" "${files[@]}" >/dev/null
    psql_db "$db" -c "SELECT inbox.register_handler('plain', '{}', '{}', 5, '1 second', '1 minute', false)" \
        -c "SELECT inbox.register_handler('ordered', '{}', '{}', 5, '1 second', '1 minute', true)" \
        -c "CREATE TABLE bench_effects (handler text NOT NULL, event_id text NOT NULL)" \
        -c "CREATE TABLE bench_claims (handler text, what text, ms double precision, got integer)" >/dev/null
    t0=$(now)
    for b in $(seq 0 $(( MESSAGES / 2000 - 1 ))); do
        echo "INSERT INTO inbox.messages (event_id, topic, \"partition\", \"offset\", payload, event_type, aggregate_id) SELECT 'e' || g, 'orders', 0, g, convert_to('{\"n\": 1}', 'UTF8'), 'T', 'agg' || (abs(hashint4(g)) % $AGGREGATES) FROM generate_series($((b * 2000)), $((b * 2000 + 1999))) g;"
    done | psql_db "$db" -f - >/dev/null
    t1=$(now)
    row "$r" "$v" store_s - - "$(echo "$t1 - $t0" | bc)"
    psql_db "$db" -c "VACUUM ANALYZE" >/dev/null

    # Where a claim's time goes: the plans of the claim function's statements.
    for h in plain ordered; do
        psql_db "$db" -c "LOAD 'auto_explain'" -c "SET auto_explain.log_min_duration = 0" \
            -c "SET auto_explain.log_analyze = on" -c "SET auto_explain.log_buffers = on" \
            -c "SET auto_explain.log_nested_statements = on" -c "SET auto_explain.log_level = notice" \
            -c "SET client_min_messages = notice" \
            -c "BEGIN" -c "SELECT count(*) FROM inbox.claim('$h', 50, '1 minute')" -c "ROLLBACK" \
            > "$RAW_DIR/explain-$r-$v-$h.txt" 2>&1
    done

    # Claim latency at ~1M pending: each claim its own transaction, completed right after.
    for h in plain ordered; do
        psql_db "$db" -c "
DO \$\$
DECLARE t0 timestamptz; ids text[]; toks uuid[]; started timestamptz := pg_catalog.clock_timestamp();
BEGIN
    FOR i IN 1..$CLAIMS LOOP
        -- A claim that reads the backlog: a minute of them is enough to know.
        EXIT WHEN pg_catalog.clock_timestamp() - started > interval '60 seconds';
        t0 := pg_catalog.clock_timestamp();
        SELECT pg_catalog.array_agg(c.event_id), pg_catalog.array_agg(c.lease_token) INTO ids, toks
        FROM inbox.claim('$h', 50, '1 minute') c;
        INSERT INTO bench_claims VALUES ('$h', 'claim', extract(epoch FROM pg_catalog.clock_timestamp() - t0) * 1000,
                                         coalesce(pg_catalog.cardinality(ids), 0));
        COMMIT;
        PERFORM inbox.complete_many('$h', ids, toks);
        COMMIT;
    END LOOP;
END \$\$" >/dev/null
        read -r p50 p99 got n < <(psql_db "$db" -F ' ' -c "SELECT round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 2),
            round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::numeric, 2), round(avg(got)), count(*) FROM bench_claims WHERE handler = '$h' AND what = 'claim'")
        row "$r" "$v" claims_measured "$h" - "$n"
        row "$r" "$v" claim_p50_ms "$h" - "$p50"
        row "$r" "$v" claim_p99_ms "$h" - "$p99"
        row "$r" "$v" claim_rows "$h" - "$got"
    done
    psql_db "$db" -c "SELECT 'pending', handler, count(*) FROM inbox.deliveries WHERE state = 'pending' GROUP BY handler" >> "$RAW_DIR/explain-$r-$v-plain.txt"

    # The worst case of an ordered claim: every head leased.
    t0=$(now)
    psql_db "$db" -c "SELECT count(*) FROM inbox.claim('ordered', $AGGREGATES, '1 hour')" > "$RAW_DIR/leased-$r-$v.txt"
    t1=$(now)
    row "$r" "$v" lease_all_heads_s ordered - "$(echo "$t1 - $t0" | bc)"
    psql_db "$db" -c "
DO \$\$
DECLARE t0 timestamptz; n integer; started timestamptz := pg_catalog.clock_timestamp();
BEGIN
    FOR i IN 1..5 LOOP
        EXIT WHEN pg_catalog.clock_timestamp() - started > interval '30 seconds';
        t0 := pg_catalog.clock_timestamp();
        SELECT count(*) INTO n FROM inbox.claim('ordered', 50, '1 minute');
        INSERT INTO bench_claims VALUES ('ordered', 'all_leased', extract(epoch FROM pg_catalog.clock_timestamp() - t0) * 1000, n);
        COMMIT;
    END LOOP;
END \$\$" >/dev/null
    row "$r" "$v" all_leased_p50_ms ordered - "$(psql_db "$db" -c "SELECT round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 2) FROM bench_claims WHERE what = 'all_leased'")"
    psql_db "$db" -c "LOAD 'auto_explain'" -c "SET auto_explain.log_min_duration = 0" \
        -c "SET auto_explain.log_analyze = on" -c "SET auto_explain.log_buffers = on" \
        -c "SET auto_explain.log_nested_statements = on" -c "SET auto_explain.log_level = notice" \
        -c "SET client_min_messages = notice" \
        -c "BEGIN" -c "SELECT count(*) FROM inbox.claim('ordered', 50, '1 minute')" -c "ROLLBACK" \
        > "$RAW_DIR/explain-$r-$v-ordered-all-leased.txt" 2>&1
    # The leases let go (by hand: the bench's, not a worker's), uncharged.
    psql_db "$db" -c "UPDATE inbox.deliveries SET lease_token = NULL, lease_until = NULL, lease_rows = NULL
                      WHERE handler = 'ordered' AND state = 'pending' AND lease_until IS NOT NULL" -c "VACUUM ANALYZE inbox.deliveries" >/dev/null

    # Handlers: completes/s from the receipts written.
    for h in plain ordered; do
        for mode in single batch; do
            for c in $WORKERS; do
                local before after
                before=$(receipts "$db" "$h")
                pgbench_tps "$db" "$scripts/$mode-$h.sql" "$c" >/dev/null
                after=$(receipts "$db" "$h")
                row "$r" "$v" completes_s "$h-$mode" "$c" "$(echo "scale=0; ($after - $before) / $SECONDS_PER_RUN" | bc)"
            done
        done
    done
    psql_db postgres -c "DROP DATABASE $db" >/dev/null
}

floor() { # round
    local r="$1" db=claims_floor tps
    psql_db postgres -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db" >/dev/null
    psql_db "$db" -c "CREATE TABLE floor_items (id bigint PRIMARY KEY, state text NOT NULL DEFAULT 'pending')" \
        -c "INSERT INTO floor_items (id) SELECT g FROM generate_series(1, $MESSAGES) g" \
        -c "CREATE TABLE floor_receipts (id bigint NOT NULL, completed_at timestamptz NOT NULL DEFAULT now())" \
        -c "CREATE INDEX ON floor_receipts (id)" \
        -c "CREATE TABLE bench_effects (handler text NOT NULL, event_id text NOT NULL)" \
        -c "VACUUM ANALYZE" >/dev/null
    for mode in single batch; do
        for c in $WORKERS; do
            tps=$(pgbench_tps "$db" "$scripts/$mode-floor.sql" "$c")
            if [[ "$mode" == batch ]]; then tps=$(echo "$tps * 50" | bc); fi
            row "$r" floor completes_s "floor-$mode" "$c" "${tps%.*}"
        done
    done
    psql_db postgres -c "DROP DATABASE $db" >/dev/null
}

echo "PostgreSQL: $("$PG_BINDIR/postgres" --version); $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
printf 'round\tvariant\tmetric\twhat\tworkers\tvalue\n'
for r in $(seq 1 "$rounds"); do
    one "$r" before
    one "$r" after
    floor "$r"
done

python3 - "$tsv" <<'EOF'
import collections, statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
fig = collections.defaultdict(list)
for r, variant, metric, what, workers, value in rows:
    fig[(variant, metric, what, workers)].append(float(value))
def med(variant, metric, what="-", workers="-"):
    v = fig.get((variant, metric, what, workers))
    return statistics.median(v) if v else float("nan")
n = max(len(v) for v in fig.values())
print(f"\nmedians of {n} rounds\n")
print("| what | before (0003) | after (0004) |")
print("|---|---|---|")
print(f"| store the messages for a plain and an ordered handler, 2,000 a statement (s) | {med('before', 'store_s'):.1f} | {med('after', 'store_s'):.1f} |")
for h in ("plain", "ordered"):
    for p in ("p50", "p99"):
        print(f"| claim of 50, {h} handler, {p} (ms) | {med('before', 'claim_' + p + '_ms', h):.2f} | {med('after', 'claim_' + p + '_ms', h):.2f} |")
    print(f"| rows per claim, {h} handler (mean) | {med('before', 'claim_rows', h):.0f} | {med('after', 'claim_rows', h):.0f} |")
    print(f"| claims measured, {h} handler (a minute of them at most) | {med('before', 'claims_measured', h):.0f} | {med('after', 'claims_measured', h):.0f} |")
print(f"| ordered: one claim leasing every aggregate's head (s) | {med('before', 'lease_all_heads_s', 'ordered'):.2f} | {med('after', 'lease_all_heads_s', 'ordered'):.2f} |")
print(f"| ordered: claim of 50 with every head leased, p50 (ms) | {med('before', 'all_leased_p50_ms', 'ordered'):.2f} | {med('after', 'all_leased_p50_ms', 'ordered'):.2f} |")
print("\n| handler, per transaction | workers | before (0003) completes/s | after (0004) completes/s | floor (plain tables) | after / floor |")
print("|---|---|---|---|---|---|")
for h in ("plain", "ordered"):
    for mode, label in (("single", "one message"), ("batch", "batches of 50")):
        for w in sorted({k[3] for k in fig if k[1] == "completes_s" and k[3] != "-"}, key=int):
            b, a, f = med("before", "completes_s", f"{h}-{mode}", w), med("after", "completes_s", f"{h}-{mode}", w), med("floor", "completes_s", f"floor-{mode}", w)
            print(f"| {h}, {label} | {w} | {b:.0f} | {a:.0f} | {f:.0f} | {a / f:.2f} |")
EOF
echo "raw figures and plans: $RAW_DIR"
