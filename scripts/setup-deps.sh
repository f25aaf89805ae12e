#!/usr/bin/env bash
# Installs what the walpost build and its integration tests need on Debian 12:
#   * PostgreSQL 15 server + client (initdb, pg_ctl, postgres, psql, pg_recvlogical)
#   * cmake, pkg-config, libssl-dev, zlib1g-dev, libcurl4-openssl-dev, build-essential (the rdkafka
#     crate builds its bundled librdkafka with these)
#   * openssl (CLI; the test harness uses it to make TLS certificates)
#   * kcat, curl, iproute2 (ss): the runbooks' commands, which the drills
#     (crates/walpost/tests/e2e/drills.rs) run as written
#   * chromium, chromium-driver: the web console's browser tests
#     (crates/walpost/tests/e2e/console.rs), headless
#   * an ordinary OS user to run test clusters (initdb refuses to run as root):
#     `postgres` when it exists, else `walpost-pg` (or $WALPOST_PG_OS_USER)
#   * the Apache Kafka 4.1.1 jars (scripts/fetch-kafka.sh)
#   * the CloudEvents SDK and Confluent's schema-registry client (PyPI, in a venv), the
#     OpenTelemetry Collector built from tools/otelcol (Go module proxy) and Apicurio
#     Registry built from tools/apicurio (Maven Central), for the CloudEvents, tracing and
#     schema-registry end-to-end tests (scripts/fetch-test-tools.sh); `--no-test-tools`
#     skips them (the demo runs none of them)
# Rust, Java 17 and Maven are expected to be installed already.
#
# Idempotent: packages are installed (and `apt-get update` run) only when missing.
# Runs as root, or re-executes itself through sudo.
set -euo pipefail

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
say() { echo "setup-deps: $*"; }
test_tools=1
if [[ "${1:-}" == --no-test-tools ]]; then
    test_tools=0
fi

if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1; then
        say "not root; re-running the system part through sudo"
        sudo --preserve-env=WALPOST_PG_OS_USER WALPOST_SETUP_SKIP_KAFKA=1 "$0" "$@"
        # Fetch Kafka and the test tools as the invoking user so they land in *their* cache.
        if [[ $test_tools == 1 ]]; then
            "$script_dir/fetch-test-tools.sh" >&2
        fi
        exec "$script_dir/fetch-kafka.sh"
    fi
    say "must run as root (and sudo is not available)" >&2
    exit 1
fi

packages=(postgresql-15 postgresql-client-15 cmake pkg-config libssl-dev zlib1g-dev libcurl4-openssl-dev build-essential openssl kcat curl iproute2 chromium chromium-driver)
missing=()
for p in "${packages[@]}"; do
    if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        :
    else
        missing+=("$p")
    fi
done

if ((${#missing[@]})); then
    say "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    apt-get install -y --no-install-recommends "${missing[@]}"
else
    say "packages already installed: ${packages[*]}"
fi

# Debian's postgresql-common creates and starts a default "main" cluster on port
# 5432. The tests never use it; it is left alone.

pg_user="${WALPOST_PG_OS_USER:-}"
if [[ -z "$pg_user" ]]; then
    if id -u postgres >/dev/null 2>&1; then pg_user=postgres; else pg_user=walpost-pg; fi
fi
if id -u "$pg_user" >/dev/null 2>&1; then
    say "OS user for test clusters: $pg_user (exists)"
else
    useradd --system --user-group --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin "$pg_user"
    say "OS user for test clusters: $pg_user (created)"
fi

bindir=""
if command -v pg_config >/dev/null 2>&1 && [[ -x "$(pg_config --bindir)/initdb" ]]; then
    bindir="$(pg_config --bindir)"
else
    bindir="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1 || true)"
fi
say "PostgreSQL binaries: ${bindir:-NOT FOUND}"
command -v java >/dev/null 2>&1 || say "WARNING: java not on PATH (Java 17+ needed for Kafka)"
command -v mvn >/dev/null 2>&1 || say "WARNING: mvn not on PATH (needed by fetch-kafka.sh and fetch-test-tools.sh)"

if [[ -n "${WALPOST_SETUP_SKIP_KAFKA:-}" ]]; then
    exit 0
fi
libs="$("$script_dir/fetch-kafka.sh")"
say "Kafka jars: $libs"
if [[ $test_tools == 1 ]]; then
    "$script_dir/fetch-test-tools.sh" >&2
fi
