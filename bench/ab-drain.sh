#!/usr/bin/env bash
# A/B drain: the same backlog drained by several walpost binaries, one after the other,
# on one PostgreSQL and one Kafka broker (scripts/devservers.sh). For each binary: wall
# time until its slot confirmed the backlog's end, its CPU time (user + system, from
# /proc), CPU per event, events per second and peak RSS (VmHWM), and the CPU per event of
# the walsender decoding for it and of the broker's process (wsnd_us, brkr_us). A BIN may be a wrapper
# script that execs walpost with other settings (environment, --config). What the before/after tables of
# bench/results/analysis.md use; bench/run.sh is the full benchmark against pg_recvlogical and Debezium.
#
#   bash bench/ab-drain.sh [-n EVENTS] [-t TXN_SIZE] [-r ROUNDS] [-s PAD] [-p] [-c] [-k BROKERS [-x CMD]] [-g DIR] [-y] BIN [BIN...]
#
#   -n  events in the backlog (default 200000), in transactions of -t rows (default 100)
#   -r  drains per binary, alternating the binaries (default 3; the table shows each)
#   -s  hex characters in each payload (0 to 768; default 0: ~300-byte payloads; 768 gives
#       the ~1.1 KB payloads of bench/run.sh)
#   -p  record each binary's first drain with `perf record -g` (perf.<i>.data in the work
#       directory; `perf report -i ...` or inferno-flamegraph make the flame graph)
#   -c  run every drain under valgrind's callgrind and report instructions per event
#       (Ir/event) beside the CPU time: a count that does not move with the machine's
#       speed, which on shared cores swings CPU time by +-20 % between rounds. ~50 x
#       slower: use -n 20000 to 50000. (perf has no hardware counters on this VM.)
#   -k  produce to this Kafka-protocol broker (bootstrap list) instead of the devservers'
#       Apache Kafka, e.g. another broker implementation
#   -x  run `CMD PREFIX` before each walpost drain (and the warm-up), PREFIX being the
#       drain's topic prefix: for a broker that does not create topics on first use
#       (walpost's are PREFIX.order, PREFIX.payment, PREFIX.shipment); bench/tansu.sh
#   -g  start a schema registry beside the servers (REGISTRY_URL, exported to the BINs)
#       and register DIR's schemas before the drains: DIR/<event type>.json as a JSON
#       Schema under the subject <event type> (record_name), DIR/<event type>.avsc as an
#       Avro schema under every drain topic's <topic>-value (topic_name), so that one
#       registry serves both formats. bench/contracts/ holds the backlog's schemas and
#       the BIN wrappers json-schema.sh and avro.sh.
#   -y  decode on a standby (PostgreSQL 16+): a streaming standby of the devservers'
#       PostgreSQL holds every slot; walpost reads there (target_session_attrs=standby,
#       --postgres-primary the primary) and `recv` drains there. Adds the column prim_us:
#       the CPU per event of the primary's processes during the drain (its physical
#       walsender included; connections that open and close within a drain are not seen).
#
# A BIN named `recv` is pg_recvlogical draining the same slot to /dev/null (pgoutput,
# walpost's publication): the walsender's own pace, the ceiling for any pgoutput client.
#
# Each binary gets its own slot, created before the backlog is written, so every drain
# reads the same WAL. The backlog is bench/workload.py's (run.py's rows, JSON payloads of
# ~300 bytes by default), 3 aggregate types; CPU and memory are read by bench/procstat.py.
# BIN_DIR (default target/release) must hold walpost-devservers.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

events=200000 txn=100 rounds=3 perf=0 pad=0 cg=0 brokers="" before="" schemas="" standby=0
while getopts "n:t:r:s:pck:x:g:y" o; do
    case "$o" in
        n) events=$OPTARG ;;
        t) txn=$OPTARG ;;
        r) rounds=$OPTARG ;;
        s) pad=$OPTARG ;;
        p) perf=1 ;;
        c) cg=1 ;;
        k) brokers=$OPTARG ;;
        x) before=$OPTARG ;;
        g) schemas=$OPTARG ;;
        y) standby=1 ;;
        *) exit 2 ;;
    esac
done
shift $((OPTIND - 1))
(($#)) || { echo "usage: $0 [-n EVENTS] [-t TXN] [-r ROUNDS] [-s PAD] [-p] [-c] [-k BROKERS [-x CMD]] [-g DIR] [-y] BIN [BIN...]" >&2; exit 2; }
[[ -z "$schemas" || -d "$schemas" ]] || { echo "-g: not a directory: $schemas" >&2; exit 2; }
bins=("$@")
for b in "${bins[@]}"; do [[ $b == recv || -x "$b" ]] || { echo "not an executable: $b" >&2; exit 2; }; done

work=$(mktemp -d /tmp/ab-drain.XXXX)
chmod 755 "$work"
# shellcheck source=scripts/devservers.sh
source scripts/devservers.sh
servers=()
[[ -n "$schemas" ]] && servers+=(--registry)
((standby)) && servers+=(--standby)
start_devservers "${BIN_DIR:-target/release}" "$work" "${servers[@]}"
[[ -n "$schemas" ]] && export REGISTRY_URL
[[ -n "$brokers" ]] && KAFKA_BROKERS=$brokers
export PGHOST=$PG_SOCKET_DIR PGPORT=$PG_PORT PGUSER=walpost PGDATABASE=walpost
psql() { "$PG_BINDIR/psql" -X -q "$@" 2>/dev/null || command psql -X -q "$@"; }
# The server the slots are on: the standby with -y, else the one server.
slot_url=$POSTGRES_URL slot_port=$PG_PORT slot_socket=$PG_SOCKET_DIR
((standby)) && slot_url=$STANDBY_URL slot_port=$STANDBY_PORT slot_socket=$STANDBY_SOCKET_DIR
spsql() { PGHOST=$slot_socket PGPORT=$slot_port psql "$@"; }
# The npm server builds (WALPOST_PG_BINDIR) have no client programs: Debian's
# pg_recvlogical (15) streams from 16-18 servers too.
recvlogical=$PG_BINDIR/pg_recvlogical
[[ -x $recvlogical ]] || recvlogical=$(command -v pg_recvlogical || echo /usr/lib/postgresql/15/bin/pg_recvlogical)
psql -f migrations/outbox/0001_events_outbox.sql >/dev/null
psql -c "CREATE PUBLICATION walpost_outbox FOR TABLE events.outbox WITH (publish = 'insert')" >/dev/null

args() { # $1: slot and topic prefix
    if ((standby)); then
        echo run --postgres "$STANDBY_URL?target_session_attrs=standby" --postgres-primary "$POSTGRES_URL" \
            --kafka-brokers "$KAFKA_BROKERS" --slot "$1" --publication walpost_outbox --topic "$1.\${routedByValue}"
    else
        echo run --postgres "$POSTGRES_URL" --kafka-brokers "$KAFKA_BROKERS" --slot "$1" \
            --publication walpost_outbox --topic "$1.\${routedByValue}"
    fi
}
# A logical slot on the slots' server; on a standby its creation waits for a
# running-transactions record, which the primary is asked for until it is done.
create_slot() { # $1: slot
    spsql -tAc "SELECT pg_create_logical_replication_slot('$1', 'pgoutput')" >/dev/null &
    local creating=$!
    while ((standby)) && kill -0 "$creating" 2>/dev/null; do
        psql -tAc "SELECT pg_log_standby_snapshot()" >/dev/null
        sleep 0.2
    done
    wait "$creating"
}
slots=()
for i in "${!bins[@]}"; do
    for r in $(seq 1 "$rounds"); do
        slot="ab${i}r${r}"
        slots+=("$slot")
        create_slot "$slot"
    done
done
# register SUBJECT TYPE FILE: the schema in FILE under SUBJECT (TYPE JSON or AVRO).
register() {
    local body
    body=$(python3 -c 'import json, sys; print(json.dumps({"schemaType": sys.argv[1], "schema": open(sys.argv[2]).read()}))' "$2" "$3")
    curl -sf -X POST -H 'Content-Type: application/vnd.schemaregistry.v1+json' \
        --data "$body" "$REGISTRY_URL/subjects/$1/versions" >/dev/null \
        || { echo "the registry refused $3 under $1" >&2; exit 1; }
}
if [[ -n "$schemas" ]]; then
    for f in "$schemas"/*.json; do
        [[ -e $f ]] && register "$(basename "$f" .json)" JSON "$f"
    done
    for f in "$schemas"/*.avsc; do
        [[ -e $f ]] || continue
        for slot in "${slots[@]}"; do
            for agg in order payment shipment; do register "$slot.$agg-value" AVRO "$f"; done
        done
    done
fi
# Warm the broker (a fresh JVM answers slowly at first): one small drain, not reported.
python3 bench/workload.py --events 5000 --types 1 --trace-chars 0 --seed 2 | psql -v ON_ERROR_STOP=1 >/dev/null
create_slot warm || true
[[ -n "$before" ]] && $before warm
# shellcheck disable=SC2046
timeout 60 "$(for b in "${bins[@]}"; do [[ $b != recv ]] && echo "$b"; done | head -1)" $(args warm) 2>"$work/warm.log" &
warm=$!
sleep 15
kill -TERM "$warm" 2>/dev/null || true
wait "$warm" 2>/dev/null || true
spsql -tAc "SELECT pg_drop_replication_slot('warm')" >/dev/null
# Move every reported slot past the warm-up rows (on a standby: what it has replayed).
for slot in "${slots[@]}"; do
    spsql -tAc "SELECT pg_replication_slot_advance('$slot', CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END)" >/dev/null
done

echo "backlog: $events events in transactions of $txn" >&2
python3 bench/workload.py --events "$events" --tx-rows "$txn" --types 3 --trace-chars "$pad" | psql -v ON_ERROR_STOP=1 >/dev/null
end=$(psql -tAc "SELECT pg_current_wal_lsn()")
if ((standby)); then
    until [[ $(spsql -tAc "SELECT pg_last_wal_replay_lsn() >= '$end'") == t ]]; do sleep 0.1; done
fi
# Vacuum the backlog now: otherwise autovacuum does it (insert threshold) ~20-40 s into the
# drains, and whichever drain runs then pays for it (seen as one drain in a run at half
# speed, always the same round).
psql -c "VACUUM (ANALYZE) events.outbox" >/dev/null
psql -c "CHECKPOINT" >/dev/null

# CPU per event by thread: walpost's own (the runtime thread: decode, route, hand over),
# librdkafka's broker threads (requests, compression) and the delivery-report thread.
thread_cpu() { python3 bench/procstat.py threads "$1" "$events"; } # $1: pid
# The other two processes on the cores: the walsender that decodes for the drain, and the
# broker. Their CPU per event is what the drain costs the machine beside the client's own.
# The Kafka-protocol broker's process (Apache Kafka's JVM, or -k's, e.g. bench/tansu.sh's
# tansu): the one listening on the first bootstrap address's port.
broker_port=${KAFKA_BROKERS%%,*}
broker_port=${broker_port##*:}
broker_pid=$(ss -Hltnp "sport = :$broker_port" 2>/dev/null | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2 || true)
[[ -n "$broker_pid" ]] || echo "cannot find the broker's process (port $broker_port): brkr_us is 0" >&2
ticks() { # $@: pids -> TICKS = their utime + stime in clock ticks; fails once all are gone
    TICKS=$(python3 bench/procstat.py ticks "$@") || { TICKS=0; return 1; }
}
broker_ticks() { # TICKS = the broker process's CPU ticks so far (0 when it is unknown)
    TICKS=0
    [[ -z "$broker_pid" ]] || ticks "$broker_pid" || TICKS=0
}
# Follows the walsender serving slot $1 and writes its CPU ticks to $2 every 20 ms until
# it exits (pg_recvlogical ends it at --endpos; walpost's ends when walpost stops), so the
# last value is within 20 ms of its total: one process sampling, not one per sample.
follow_walsender() {
    local pid=""
    for _ in $(seq 1 250); do
        pid=$(spsql -tAc "SELECT active_pid FROM pg_replication_slots WHERE slot_name = '$1' AND active_pid IS NOT NULL")
        [[ -n "$pid" ]] && break
        sleep 0.02
    done
    [[ -n "$pid" ]] || return 0
    python3 bench/procstat.py follow "$pid" "$2" 0.02
}
us_per_event() { # $1: clock ticks
    awk -v t="$1" -v hz="$(getconf CLK_TCK)" -v n="$events" 'BEGIN {printf "%6.2f", t / hz * 1e6 / n}'
}
drain_costs() { # $1 $2: bin index, round -> wsnd, brkr (, prim): us/event
    broker_ticks
    brkr=$(us_per_event $((TICKS - broker0)))
    wsnd=$(us_per_event "$(cat "$work/wsnd.$1.$2" 2>/dev/null || echo 0)")
    prim=""
    if ((standby)); then
        primary_ticks
        prim=$(us_per_event $((TICKS - primary0)))
    fi
}
# -y: the primary's postmaster and its children (the CPU ticks of those alive now).
primary_pid=$(ss -Hltnp "sport = :$PG_PORT" 2>/dev/null | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2 || true)
primary_ticks() { # TICKS = the primary's processes' CPU ticks so far
    # shellcheck disable=SC2046
    ticks $primary_pid $(pgrep -P "$primary_pid" 2>/dev/null) || TICKS=0
}
printf "%-4s %-40s %5s %9s %8s %12s %12s %8s %7s %7s %6s %6s %6s %6s%s%s\n" bin binary round secs cpu_s "events/s" "cpu_us/event" "rss_mb" \
    "wsnd_us" "brkr_us" main broker dr other "$([[ $cg == 1 ]] && printf " %9s" Ir/event)" "$( ((standby)) && printf " %7s" prim_us)"
row() { # index name round secs cpu rss_mb walsender_us broker_us [per-thread and Ir columns]
    printf "%-4s %-40s %5s %9.2f %8.2f %12.0f %12.2f %8s %7s %7s %s\n" "$1" "$2" "$3" "$4" "$5" \
        "$(echo "$events / $4" | bc -l)" "$(echo "$5 * 1000000 / $events" | bc -l)" "$6" "$7" "$8" "${9:-}"
}
for r in $(seq 1 "$rounds"); do
    for i in "${!bins[@]}"; do
        bin=${bins[$i]} slot="ab${i}r${r}"
        [[ $bin != recv && -n "$before" ]] && $before "$slot"
        rm -f "$work/wsnd.$i.$r"
        follow_walsender "$slot" "$work/wsnd.$i.$r" &
        follower=$!
        broker_ticks
        broker0=$TICKS
        if ((standby)); then
            primary_ticks
            primary0=$TICKS
        fi
        start=$(date +%s.%N)
        if [[ $bin == recv ]]; then
            /usr/bin/time -o "$work/time.$i.$r" -f "%U %S %M" "$recvlogical" \
                -d "$slot_url" --slot "$slot" --start -o proto_version=1 \
                -o publication_names=walpost_outbox --endpos "$end" -F 0 --no-loop -f /dev/null \
                2>"$work/drain.$i.$r.log" || true
            secs=$(echo "$(date +%s.%N) - $start" | bc)
            wait "$follower" || true
            drain_costs "$i" "$r"
            read -r u s m < "$work/time.$i.$r"
            cpu=$(echo "$u + $s" | bc -l)
            row "$i" recv "$r" "$secs" "$cpu" "$(printf "%.1f" "$(echo "$m / 1024" | bc -l)")" "$wsnd" "$brkr" \
                "$( ((standby)) && printf "%27s %7s" "" "$prim")"
            spsql -tAc "SELECT pg_drop_replication_slot('$slot')" >/dev/null
            continue
        fi
        if [[ $cg == 1 ]]; then
            # valgrind runs the program in its own process (no fork): $! is walpost.
            # shellcheck disable=SC2046
            valgrind -q --tool=callgrind --trace-children=yes --callgrind-out-file="$work/callgrind.$i.$r" \
                -- "$bin" $(args "$slot") 2>"$work/drain.$i.$r.log" &
        elif [[ $perf == 1 && $r == 1 ]]; then
            # shellcheck disable=SC2046
            perf record -g -o "$work/perf.$i.data" -- "$bin" $(args "$slot") 2>"$work/drain.$i.$r.log" &
        else
            # shellcheck disable=SC2046
            "$bin" $(args "$slot") 2>"$work/drain.$i.$r.log" &
        fi
        pid=$!
        # The walpost process itself (perf forks it; a wrapper script may exec it).
        for _ in $(seq 1 50); do
            [[ $cg == 1 ]] && { wp=$pid; break; }
            wp=$(pgrep -n -f "^[^ ]*walpost[^ ]* (.* )?run .*--slot $slot " || true)
            [[ -n "$wp" ]] && break
            sleep 0.05
        done
        [[ -n "$wp" ]] || { echo "cannot find the walpost process of $bin (slot $slot)" >&2; exit 1; }
        until [[ $(spsql -tAc "SELECT confirmed_flush_lsn >= '$end' FROM pg_replication_slots WHERE slot_name = '$slot'") == t ]]; do
            kill -0 "$wp" 2>/dev/null || { tail -5 "$work/drain.$i.$r.log" >&2; echo "$bin stopped before the end of the backlog" >&2; exit 1; }
            sleep 0.05
        done
        secs=$(echo "$(date +%s.%N) - $start" | bc)
        ticks "$wp"
        cpu=$(echo "$TICKS / $(getconf CLK_TCK)" | bc -l)
        hwm=$(python3 bench/procstat.py hwm-mb "$wp")
        threads=$(thread_cpu "$wp")
        drain_costs "$i" "$r"
        kill -TERM "$wp"
        wait "$pid" || true
        wait "$follower" || true
        ir=""
        if [[ $cg == 1 ]]; then
            ir=$(awk -v n="$events" '/^(summary|totals):/ {t = $2} END {printf " %9.0f", t / n}' "$work/callgrind.$i.$r")
        fi
        row "$i" "$(basename "$(dirname "$bin")")/$(basename "$bin")" "$r" "$secs" "$cpu" "$hwm" "$wsnd" "$brkr" \
            "$threads$ir$( ((standby)) && printf " %7s" "$prim")"
        spsql -tAc "SELECT pg_drop_replication_slot('$slot')" >/dev/null
    done
done
echo "work directory: $work (logs; perf.<bin>.data with -p)" >&2
