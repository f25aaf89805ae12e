#!/usr/bin/env bash
# A BIN for bench/ab-drain.sh: walpost (WALPOST, default target/release/walpost) with the
# admin listener on (loopback, a tokens file) and a client asking GET /api/v1/status once
# a second for the whole drain: what a console or a `walpost ctl status` loop costs the
# stream. Its twin walpost-admin-off.sh runs the same binary without the listener.
set -euo pipefail
dir=$(mktemp -d)
token="bench-operator-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
echo "bench operator $(printf %s "$token" | sha256sum | cut -d' ' -f1)" >"$dir/tokens"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
(
    # curl reads the header from a file: the token never reaches a command line.
    printf 'Authorization: Bearer %s\n' "$token" >"$dir/header"
    while sleep 1; do
        curl -sf -m 2 -H "@$dir/header" "http://127.0.0.1:$port/api/v1/status" >/dev/null || true
    done
) &
poller=$!
trap 'kill "$poller" 2>/dev/null; rm -rf "$dir"' EXIT
WALPOST_ADMIN_ADDR="127.0.0.1:$port" WALPOST_ADMIN_TOKENS_FILE="$dir/tokens" \
    "${WALPOST:-target/release/walpost}" "$@"
