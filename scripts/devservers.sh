# Sourced by scripts/demo.sh and the bench/ scripts: starts a throwaway PostgreSQL
# (wal_level=logical) and Kafka broker with the test harness's walpost-devservers and
# loads their coordinates (POSTGRES_URL, PG_BINDIR, PG_PORT, PG_SOCKET_DIR, KAFKA_BROKERS,
# KAFKA_LIBS) into the shell. The servers stop when the shell exits (file descriptor 3,
# their standard input, closes). Further arguments go to walpost-devservers: `--registry`
# starts a schema registry too (REGISTRY_URL); `--standby` a streaming standby
# (STANDBY_URL, STANDBY_PORT, STANDBY_SOCKET_DIR; PostgreSQL 17 unless the default server
# is 16+); `--pg-major N` PostgreSQL N (PG_MAJOR says which one runs).
#
#   start_devservers BIN_DIR WORK_DIR [--registry] [--standby] [--pg-major N]
start_devservers() {
    local bin="$1" work="$2"
    shift 2
    mkfifo "$work/servers.in"
    "$bin/walpost-devservers" "$@" < "$work/servers.in" > "$work/servers.env" 2> "$work/servers.log" &
    exec 3> "$work/servers.in"
    for _ in $(seq 1 120); do
        grep -q '^READY=1' "$work/servers.env" 2>/dev/null && break
        sleep 1
    done
    if ! grep -q '^READY=1' "$work/servers.env"; then
        cat "$work/servers.log" >&2
        echo "walpost-devservers did not start" >&2
        return 1
    fi
    # shellcheck disable=SC1091
    source "$work/servers.env"
}
