#!/usr/bin/env bash
# Checks the Prometheus alerting rules and the PostgreSQL-side slot check in deploy/prometheus:
#
#   1. `promtool check rules deploy/prometheus/alerts.yml`
#   2. `promtool test rules` of deploy/prometheus/alerts_test.yml (the relay's rules) and
#      deploy/prometheus/inbox_alerts_test.yml (walpost inbox's): unit tests of every rule
#   3. every rule has a severity label, summary/description/runbook_url annotations, and
#      at least one firing and one not-firing test case; every runbook_url points to a file
#      (and heading) of this repository
#   4. every walpost_* metric the rules use is exported (telemetry::metrics::names in
#      crates/walpost/src/telemetry/metrics.rs), except the ones listed in PENDING_METRICS below
#   5. deploy/prometheus/slot-check.sql against a throwaway PostgreSQL 15 cluster (wal_level =
#      logical, 1 MB WAL segments, max_slot_wal_keep_size = 4MB): a slot goes from ok through
#      the byte and budget thresholds to unreserved and lost, an active slot is ok, bad input
#      stops psql. WALPOST_CHECK_ALERTS_SKIP_SQL=1 skips this part.
#
# promtool: $PROMTOOL, else `promtool` on PATH, else the copy cached by an earlier run, else
# it is extracted from Debian's `prometheus` package (`apt-get download`, nothing installed
# system-wide, no service started; a few seconds). Cache: ${WALPOST_TOOLS_CACHE:-~/.cache/walpost/tools}.
# PostgreSQL: Debian's postgresql-15 (scripts/setup-deps.sh installs it when missing), run
# as an ordinary OS user when this runs as root (initdb refuses root).
#
# Exits non-zero on any failure. Messages go to stderr.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Metrics the rules use before walpost exports them (e.g. once the slot monitor's confirm
# stall and the Kafka acknowledgement gauge). Remove a name once metrics::METRICS has it.
PENDING_METRICS=()

rules=deploy/prometheus/alerts.yml
tests=(deploy/prometheus/alerts_test.yml deploy/prometheus/inbox_alerts_test.yml)
slot_sql=deploy/prometheus/slot-check.sql
repo_url="https://github.com/walpost/walpost/blob/main/"

say() { echo "check-alerts: $*" >&2; }
failures=0
fail() { say "FAIL: $*"; failures=$((failures + 1)); }
die() { say "FAIL: $*"; exit 1; }
in_list() { # NEEDLE ITEM...: is NEEDLE one of the ITEMs?
    local needle="$1" item
    shift
    for item in "$@"; do [[ "$item" == "$needle" ]] && return 0; done
    return 1
}
started=$SECONDS

# ------------------------------------------------------------------ promtool
cache="${WALPOST_TOOLS_CACHE:-${HOME:-/root}/.cache/walpost/tools}"

find_promtool() {
    if [[ -n "${PROMTOOL:-}" ]]; then
        echo "$PROMTOOL"
        return
    fi
    if command -v promtool >/dev/null 2>&1; then
        command -v promtool
        return
    fi
    if [[ -x "$cache/promtool/promtool" ]] && "$cache/promtool/promtool" --version >/dev/null 2>&1; then
        echo "$cache/promtool/promtool"
        return
    fi
    command -v apt-get >/dev/null 2>&1 || die "promtool not found and apt-get is missing (set PROMTOOL=/path/to/promtool)"
    mkdir -p "$cache"
    # One installer at a time; a run that waited finds the copy the other one made.
    exec 9>"$cache/promtool.lock"
    flock 9
    if [[ -x "$cache/promtool/promtool" ]] && "$cache/promtool/promtool" --version >/dev/null 2>&1; then
        echo "$cache/promtool/promtool"
        return
    fi
    local work
    work="$(mktemp -d "$cache/.promtool-XXXXXX")"
    # Only the .deb is downloaded (no root needed for that); promtool is a static Go binary
    # apart from libc, so it runs from anywhere.
    if ! (cd "$work" && apt-get download prometheus >/dev/null 2>&1); then
        if [[ $(id -u) -eq 0 ]]; then
            say "apt-get download prometheus failed; running apt-get update once"
            apt-get update -qq >/dev/null
            (cd "$work" && apt-get download prometheus >/dev/null) || die "apt-get download prometheus failed"
        else
            die "apt-get download prometheus failed (run apt-get update as root, or set PROMTOOL)"
        fi
    fi
    dpkg-deb -x "$work"/prometheus_*.deb "$work/x"
    [[ -x "$work/x/usr/bin/promtool" ]] || die "Debian's prometheus package has no usr/bin/promtool"
    rm -rf "$cache/promtool"
    mkdir -p "$cache/promtool"
    mv "$work/x/usr/bin/promtool" "$cache/promtool/promtool"
    basename "$work"/prometheus_*.deb >"$cache/promtool/FROM"
    rm -rf "$work"
    say "promtool extracted from $(cat "$cache/promtool/FROM") into $cache/promtool"
    echo "$cache/promtool/promtool"
}

promtool="$(find_promtool)"
say "using $promtool ($("$promtool" --version 2>&1 | head -n1))"

# ------------------------------------------------------------------ 1, 2: promtool
"$promtool" check rules "$rules" >&2 || fail "promtool check rules $rules"
for t in "${tests[@]}"; do
    "$promtool" test rules "$t" >&2 || fail "promtool test rules $t"
done

# ------------------------------------------------------------------ 3: structure, coverage, links
mapfile -t alerts < <(sed -n 's/^ *- alert: *\([A-Za-z0-9_]*\).*/\1/p' "$rules")
((${#alerts[@]} > 0)) || die "no alert rule found in $rules"
for key in 'severity:' 'summary:' 'description:' 'runbook_url:'; do
    n=$(grep -cE "^ +$key" "$rules" || true)
    ((n == ${#alerts[@]})) || fail "$rules: ${#alerts[@]} rules but $n '$key' lines (each rule needs one)"
done
# A case is "firing" when its exp_alerts is not `[]`.
cases="$(awk '
    /^ *(- )?alertname:/ { name = $NF; next }
    /^ *exp_alerts:/ && name != "" { print name, ($2 == "[]" ? "silent" : "firing"); name = "" }
 ' "${tests[@]}")"
for a in "${alerts[@]}"; do
    grep -qx "$a firing" <<<"$cases" || fail "${tests[*]}: no test case in which $a fires"
    grep -qx "$a silent" <<<"$cases" || fail "${tests[*]}: no test case in which $a stays silent"
done
while read -r name _; do
    in_list "$name" "${alerts[@]}" || fail "${tests[*]} test $name, which $rules does not define"
done <<<"$cases"

# GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens.
anchors_of() { sed -n 's/^#\{1,6\} \(.*\)/\1/p' "$1" | tr '[:upper:]' '[:lower:]' | sed 's/[^a-z0-9 _-]//g; s/ /-/g'; }
while read -r url; do
    [[ "$url" == "$repo_url"* ]] || { fail "runbook_url $url is not under $repo_url"; continue; }
    rel="${url#"$repo_url"}"
    file="${rel%%#*}"
    [[ -f "$file" ]] || { fail "runbook_url $url: $file does not exist"; continue; }
    if [[ "$rel" == *"#"* ]]; then
        grep -qx "${rel#*#}" <<<"$(anchors_of "$file")" || fail "runbook_url $url: $file has no heading #${rel#*#}"
    fi
done < <(sed -n 's/^ *runbook_url: *"\(.*\)"$/\1/p' "$rules" | sort -u)

# ------------------------------------------------------------------ 4: metric names
# Each mode's names: the relay's, the inbox's and the series both export.
metrics_rs=(crates/walpost/src/telemetry/metrics.rs crates/inbox/src/metrics.rs crates/service/src/telemetry/exposition.rs)
exported=()
for f in "${metrics_rs[@]}"; do
    mapfile -t names < <(sed -n '/^pub mod names/,/^}/p' "$f" | grep -o '"walpost_[a-z0-9_]*"' | tr -d '"')
    ((${#names[@]} > 1)) || die "could not read the metric names (pub mod names) from $f"
    exported+=("${names[@]}")
done
mapfile -t used < <(grep -v '^ *#' "$rules" | grep -o 'walpost_[a-z0-9_]*' | sed -E 's/_(bucket|sum|count)$//' | sort -u)
for m in "${used[@]}"; do
    if in_list "$m" "${exported[@]}"; then
        if in_list "$m" "${PENDING_METRICS[@]}"; then
            say "note: $m is exported now; remove it from PENDING_METRICS in $0"
        fi
    elif in_list "$m" "${PENDING_METRICS[@]}"; then
        say "note: $rules uses $m, which walpost does not export yet (PENDING_METRICS)"
    else
        fail "$rules uses $m, which walpost does not export (pub mod names in ${metrics_rs[*]})"
    fi
done
say "rules, unit tests, coverage of ${#alerts[@]} alerts, runbook links and metric names checked"

# ------------------------------------------------------------------ 5: slot-check.sql
sql_check() {
    local bindir="${WALPOST_PG_BINDIR:-/usr/lib/postgresql/15/bin}"
    if [[ ! -x "$bindir/initdb" ]]; then
        say "no PostgreSQL in $bindir: installing it with scripts/setup-deps.sh"
        WALPOST_SETUP_SKIP_KAFKA=1 bash scripts/setup-deps.sh >&2
    fi
    [[ -x "$bindir/initdb" ]] || die "no initdb in $bindir (set WALPOST_PG_BINDIR)"
    local psql_bin="$bindir/psql"
    [[ -x "$psql_bin" ]] || psql_bin="$(command -v psql)" || die "psql not found"

    local user=""
    if [[ $(id -u) -eq 0 ]]; then
        user="${WALPOST_PG_OS_USER:-}"
        if [[ -z "$user" ]]; then
            if id -u postgres >/dev/null 2>&1; then user=postgres; else user=walpost-pg; fi
        fi
        id -u "$user" >/dev/null 2>&1 || WALPOST_SETUP_SKIP_KAFKA=1 bash scripts/setup-deps.sh >&2
    fi
    as_user() { if [[ -n "$user" ]]; then runuser -u "$user" -- "$@"; else "$@"; fi; }

    dir="$(mktemp -d /tmp/walpost-slot-check.XXXXXX)"
    chmod 755 "$dir"
    [[ -n "$user" ]] && chown "$user" "$dir"
    recv_pid=""
    # shellcheck disable=SC2317 # called by the trap
    cleanup_pg() {
        [[ -n "$recv_pid" ]] && kill "$recv_pid" 2>/dev/null
        as_user "$bindir/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true
        rm -rf "$dir"
    }
    trap cleanup_pg EXIT

    as_user "$bindir/initdb" -D "$dir/data" -U postgres -A trust --no-sync --wal-segsize=1 >"$dir/initdb.log" 2>&1 \
        || { cat "$dir/initdb.log" >&2; die "initdb failed"; }
    # Unix socket in the private directory only: no TCP port to collide with.
    as_user "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 30 \
        -o "-c listen_addresses='' -k $dir -p 5432 -c wal_level=logical -c max_slot_wal_keep_size=4MB -c min_wal_size=2MB -c max_wal_size=256MB -c checkpoint_timeout=1h -c fsync=off" \
        start >/dev/null || { cat "$dir/server.log" >&2; die "PostgreSQL did not start"; }

    local conn=(-X -h "$dir" -p 5432 -U postgres -d postgres)
    sql() { "$psql_bin" "${conn[@]}" -qAt -v ON_ERROR_STOP=1 -c "$1" >/dev/null; }
    check() { "$psql_bin" "${conn[@]}" -At -F '|' "$@" -f "$slot_sql"; }
    row() { # SLOT [psql -v args...]: the slot's row of the check
        local slot="$1"
        shift
        check "$@" | grep "^$slot|" || true
    }
    field() { cut -d'|' -f"$1" <<<"$2"; } # N ROW (1 slot_name, 2 status, 6 wal_status, 10 reasons)
    expect() { # WHAT ROW FIELD VALUE
        local got
        got="$(field "$3" "$2")"
        [[ "$got" == "$4" ]] || fail "slot-check.sql, $1: column $3 is '$got', expected '$4' (row: $2)"
    }

    sql "SELECT pg_create_logical_replication_slot('walpost', 'pgoutput')"
    sql "SELECT pg_create_physical_replication_slot('physical', true)"
    sql "CREATE TABLE t (x int)"

    local r
    [[ "$(check | wc -l)" -eq 1 ]] || fail "slot-check.sql: expected one row (the logical slot only), got: $(check)"
    r="$(row walpost)"
    expect "a new slot nothing streams from (default inactive_status)" "$r" 2 warning
    expect "a new slot" "$r" 6 reserved
    [[ "$(field 10 "$r")" == "warning: no process streams from the slot"* ]] || fail "slot-check.sql: reason of an inactive slot: $r"
    r="$(row walpost -v inactive_status=ok)"
    expect "a new slot, inactive_status=ok" "$r" 2 ok
    expect "a new slot, inactive_status=ok" "$r" 10 ""
    (($(field 9 "$r") > 4000000)) || fail "slot-check.sql: safe_wal_size of a new slot with a 4MB budget: $r"
    r="$(row walpost -v inactive_status=critical)"
    expect "a new slot, inactive_status=critical" "$r" 2 critical

    # An active slot: pg_recvlogical streams from it (and confirms), so it is ok.
    sql "SELECT pg_create_logical_replication_slot('streamed', 'test_decoding')"
    "$bindir/pg_recvlogical" "${conn[@]:1}" -S streamed --start -f /dev/null -s 1 2>"$dir/recv.log" &
    recv_pid=$!
    for _ in $(seq 50); do
        [[ "$(field 4 "$(row streamed)")" == t ]] && break
        sleep 0.1
    done
    r="$(row streamed)"
    expect "a slot pg_recvlogical streams from" "$r" 4 t
    expect "a slot pg_recvlogical streams from" "$r" 2 ok
    kill "$recv_pid"
    wait "$recv_pid" 2>/dev/null || true
    recv_pid=""

    # The documented cron one-liner: exit 0 when every slot is ok, 1 otherwise.
    cron() { "$psql_bin" "${conn[@]}" -At -F '|' "$@" -f "$slot_sql" | awk -F'|' '{ print } $2 != "ok" { bad = 1 } END { exit bad }' >/dev/null; }
    cron -v inactive_status=ok || fail "slot-check.sql: the cron one-liner failed while every slot is ok"
    if cron; then fail "slot-check.sql: the cron one-liner passed with an inactive slot (warning)"; fi

    # Retained bytes: each pg_switch_wal() after a write moves the position to the next 1 MB segment.
    sql "INSERT INTO t VALUES (1); SELECT pg_switch_wal()"
    sql "INSERT INTO t VALUES (2); SELECT pg_switch_wal()"
    r="$(row walpost -v inactive_status=ok -v warning_bytes=1500000)"
    expect "2 MB retained, warning_bytes=1500000" "$r" 2 warning
    [[ "$(field 10 "$r")" == "warning: retains "*" of WAL (warning at 1465 kB)" ]] || fail "slot-check.sql: retained-bytes reason: $r"
    r="$(row walpost -v inactive_status=ok -v warning_bytes=1000000 -v critical_bytes=1800000)"
    expect "2 MB retained, critical_bytes=1800000" "$r" 2 critical

    # The budget (max_slot_wal_keep_size = 4MB): warning under 50% left, then unreserved
    # (critical), then lost after a checkpoint.
    local seen_budget_warning=0 unreserved=0
    for _ in $(seq 8); do
        sql "INSERT INTO t VALUES (3); SELECT pg_switch_wal()"
        r="$(row walpost -v inactive_status=ok)"
        if [[ "$(field 6 "$r")" == unreserved ]]; then
            expect "unreserved" "$r" 2 critical
            [[ "$(field 10 "$r")" == *"critical: wal_status is unreserved"* ]] || fail "slot-check.sql: unreserved reason: $r"
            unreserved=1
            break
        fi
        if [[ "$(field 10 "$r")" == "warning: "*"% of the WAL budget left (warning under 50.0%)" ]]; then
            expect "under 50% of the budget left" "$r" 2 warning
            seen_budget_warning=1
        fi
    done
    ((seen_budget_warning)) || fail "slot-check.sql: no budget warning before the slot became unreserved"
    ((unreserved)) || fail "slot-check.sql: the slot never became unreserved: $r"
    sql "CHECKPOINT"
    r="$(row walpost -v inactive_status=ok)"
    expect "after a checkpoint" "$r" 6 lost
    expect "lost" "$r" 2 critical

    # A bad threshold stops psql (exit 3) instead of reporting ok.
    local rc=0
    check -v inactive_status=sometimes >/dev/null 2>&1 || rc=$?
    ((rc == 3)) || fail "slot-check.sql with inactive_status=sometimes: exit $rc, expected 3"
    rc=0
    check -v warning_bytes=lots >/dev/null 2>&1 || rc=$?
    ((rc == 3)) || fail "slot-check.sql with warning_bytes=lots: exit $rc, expected 3"

    cleanup_pg
    trap - EXIT
    say "slot-check.sql checked against $("$bindir/postgres" --version)"
}

if [[ -n "${WALPOST_CHECK_ALERTS_SKIP_SQL:-}" ]]; then
    say "WALPOST_CHECK_ALERTS_SKIP_SQL set: slot-check.sql not run"
else
    sql_check
fi

if ((failures)); then
    say "$failures check(s) failed ($((SECONDS - started)) s)"
    exit 1
fi
say "all checks passed ($((SECONDS - started)) s)"
