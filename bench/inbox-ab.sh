#!/usr/bin/env bash
# A/B inbox ingest: several `walpost` binaries drain the same kind of backlog (RECORDS
# records of ~1 KB in a 3-partition topic) into a fresh database each, one after the
# other and alternating, on one PostgreSQL and one Kafka broker (scripts/devservers.sh).
# For each drain: records/s from process start (group join included) and from the first
# to the last record stored, CPU µs per record and peak RSS; then the plain COPY floor of
# the same rows (bench/inbox.py with ONLY_INGEST). What the before/after table of a change
# to the inbox's write path uses; bench/inbox.sh is the whole inbox benchmark.
#
#   RECORDS=200000 ROUNDS=2 bash bench/inbox-ab.sh BIN [BIN...]
#
# A binary without `walpost migrate` (older than it) gets its schema from the last BIN
# that has it, then applies its own with `walpost inbox --create-schema`. BIN_DIR (default target/release) must hold
# walpost-devservers. Raw logs: bench/out/inbox-ab-<date>/.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
(($# > 0)) || { sed -n '2,14p' "$0" >&2; exit 2; }
bins=()
for b in "$@"; do bins+=("$(realpath "$b")"); done
rounds="${ROUNDS:-2}"
export RECORDS="${RECORDS:-200000}" ONLY_INGEST=1
out="bench/out/inbox-ab-$(date +%Y%m%d-%H%M%S)"
mkdir -p "$out"
if [[ ! -x bench/.venv/bin/python ]]; then
    python3 -m venv bench/.venv
fi
bench/.venv/bin/pip install -q -r bench/requirements.txt
work="$(mktemp -d /tmp/walpost-inbox-ab.XXXXXX)"
chmod 755 "$work"
# shellcheck source=scripts/devservers.sh
source scripts/devservers.sh
start_devservers "${BIN_DIR:-target/release}" "$work"
export KAFKA_BROKERS PG_BINDIR
base_url="$POSTGRES_URL"
migrator=""
for b in "${bins[@]}"; do "$b" migrate --help >/dev/null 2>&1 && migrator="$b"; done
table="| binary | round | records/s from start | records/s first to last | CPU µs/record | peak RSS MB | COPY floor records/s |"
rows=()
for r in $(seq 1 "$rounds"); do
    for i in "${!bins[@]}"; do
        bin="${bins[$i]}"
        db="inbox_ab_${i}_${r}"
        "$PG_BINDIR/psql" -X -q "$base_url" -c "CREATE DATABASE $db" >/dev/null
        url="${base_url%/*}/$db"
        # The base URL may carry parameters after the database name.
        [[ "$base_url" == *\?* ]] && url="${base_url%/*}/$db?${base_url#*\?}"
        no_migrate=""
        if ! "$bin" migrate --help >/dev/null 2>&1; then
            [[ -n "$migrator" ]] || { echo "no BIN has walpost migrate: give one that does" >&2; exit 2; }
            "$migrator" migrate --inbox --postgres "$url" >/dev/null
            no_migrate=1
        fi
        log="$out/$i-$r.log"
        POSTGRES_URL="$url" WALPOST="$bin" TOPIC="ab.$i.$r" GROUP="ab-$i-$r" NO_MIGRATE="$no_migrate" \
            RESULTS="$out/$i-$r.md" bench/.venv/bin/python bench/inbox.py >"$log" 2>&1 \
            || { cat "$log" >&2; exit 1; }
        read -r _ rate steady us rss < <(grep '^ingest: ' "$log" | tail -n 1)
        floor="$(sed -n 's/^| plain `COPY` of the same rows (floor) | [0-9]* | [0-9.]* | \([0-9]*\) |.*/\1/p' "$log" | tail -n 1)"
        rows+=("| $bin | $r | $rate | $steady | $us | $rss | $floor |")
        echo "${rows[-1]}"
    done
done
{
    echo "# inbox ingest A/B, $(date -u +%Y-%m-%dT%H:%MZ), $RECORDS records of ~1 KB, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
    echo
    echo "$table"
    echo "|---|---|---|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
} | tee "$out/summary.md"
