#!/usr/bin/env bash
# The A/B drain (bench/ab-drain.sh) against a second Kafka-protocol broker: Tansu
# (https://tansu.io, Apache-2.0, a Kafka-compatible broker written in Rust, from crates.io),
# with its in-memory storage engine. pg_recvlogical drains the same backlog beside it, so
# the table shows walpost's rate against the walsender's on this broker too.
#
#   bash bench/tansu.sh [ab-drain options] BIN [BIN...]     (BINs as for ab-drain.sh; add recv)
#
# Tansu is built once with `cargo install tansu --version 0.6.0 --locked --features dynostore`
# (the memory and S3 storage engines; the default build has none) into
# $WALPOST_TOOLS_CACHE/tansu (default ~/.cache/walpost/tools/tansu; ~500 crates, 30-40 min on
# two cores). It listens on 127.0.0.1:$TANSU_PORT (default 19092). Tansu does not create
# topics on first use: the ones ab-drain.sh's slots produce to are created here first, with
# 3 partitions.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

tools=${WALPOST_TOOLS_CACHE:-$HOME/.cache/walpost/tools}/tansu
port=${TANSU_PORT:-19092}
if [[ ! -x $tools/bin/tansu ]]; then
    echo "building tansu 0.6.0 into $tools (once)" >&2
    cargo install tansu --version 0.6.0 --locked --features dynostore --root "$tools"
fi

# ab-drain.sh's slots: ab<bin>r<round>, and `warm` for its warm-up drain.
rounds=3 bins=0
args=("$@")
while getopts "n:t:r:s:pck:" o; do
    [[ $o == r ]] && rounds=$OPTARG
done
bins=$(($# - OPTIND + 1))

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
prefixes=(warm)
for i in $(seq 0 $((bins - 1))); do
    for r in $(seq 1 "$rounds"); do prefixes+=("ab${i}r${r}"); done
done
for p in "${prefixes[@]}"; do
    for t in order payment shipment; do
        "$tools/bin/tansu" topic create --broker "tcp://127.0.0.1:$port" --partitions 3 "$p.$t" >/dev/null
    done
done
echo "tansu on 127.0.0.1:$port (log $log), ${#prefixes[@]} x 3 topics created" >&2
bash bench/ab-drain.sh -k "127.0.0.1:$port" "${args[@]}"
