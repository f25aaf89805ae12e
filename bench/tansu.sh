#!/usr/bin/env bash
# The A/B drain (bench/ab-drain.sh) against a second Kafka-protocol broker: Tansu
# (https://tansu.io, Apache-2.0, a Kafka-compatible broker written in Rust, from crates.io),
# with its in-memory storage engine. Add `recv` to the BINs and pg_recvlogical drains the
# same backlog beside it, so the table shows walpost's rate against the walsender's on
# this broker too.
#
#   bash bench/tansu.sh [ab-drain options] BIN [BIN...]     (BINs as for ab-drain.sh)
#
# Tansu is built once with `cargo install tansu --version 0.6.0 --locked --features dynostore`
# (the memory and S3 storage engines; the default build has none) into
# $WALPOST_TOOLS_CACHE/tansu (default ~/.cache/walpost/tools/tansu; ~500 crates, ~25 min on
# two cores). It listens on 127.0.0.1:$TANSU_PORT (default 19092). Tansu does not create
# topics on first use: ab-drain.sh calls this script back (`-x`) to create each drain's
# topics, with 3 partitions, before the drain.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

tools=${WALPOST_TOOLS_CACHE:-$HOME/.cache/walpost/tools}/tansu
port=${TANSU_PORT:-19092}

if [[ ${1:-} == --create-topics ]]; then # PREFIX: called back by ab-drain.sh -x
    for t in order payment shipment; do
        "$tools/bin/tansu" topic create --broker "tcp://127.0.0.1:$port" --partitions 3 "$2.$t" >/dev/null
    done
    exit 0
fi

if [[ ! -x $tools/bin/tansu ]]; then
    echo "building tansu 0.6.0 into $tools (once)" >&2
    cargo install tansu --version 0.6.0 --locked --features dynostore --root "$tools"
fi
log=$(mktemp /tmp/tansu.XXXX.log)
"$tools/bin/tansu" broker --listener-url "tcp://127.0.0.1:$port" \
    --advertised-listener-url "tcp://127.0.0.1:$port" --storage-engine memory://tansu/ >"$log" 2>&1 &
broker=$!
trap 'kill $broker 2>/dev/null || true' EXIT
for _ in $(seq 1 50); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    kill -0 $broker 2>/dev/null || { cat "$log" >&2; exit 1; }
    sleep 0.2
done
echo "tansu on 127.0.0.1:$port (log $log)" >&2
bash bench/ab-drain.sh -k "127.0.0.1:$port" -x "bash bench/tansu.sh --create-topics" "$@"
