#!/usr/bin/env bash
# Fetches the consumers and backends the CloudEvents and tracing end-to-end tests run
# (crates/walpost/tests/e2e/{cloudevents,otel}.rs):
#
#   * a Python venv with the CloudEvents SDK (`cloudevents`) and `confluent-kafka`, both
#     from PyPI at the versions pinned below: the real SDK decodes what walpost wrote;
#   * walpost-otelcol, the OpenTelemetry Collector with only its OTLP receiver and the
#     contrib file and Zipkin exporters (the second for scripts/trace-screenshot.sh), built from tools/otelcol (go.mod/go.sum pin every module)
#     with the Go toolchain and the Go module proxy.
#
# Idempotent and fast when present: each part is skipped when its marker (written last)
# names the same versions. Concurrent runs are serialised with flock.
#
# Target: ${WALPOST_TOOLS_CACHE:-$HOME/.cache/walpost/tools}/{ce-venv,otelcol}
# Prints: the two paths the tests read (WALPOST_CE_PYTHON=..., WALPOST_OTELCOL=...).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${WALPOST_TOOLS_CACHE:-${HOME:-/root}/.cache/walpost/tools}"
say() { echo "fetch-test-tools: $*" >&2; }
mkdir -p "$cache"
exec 8>"$cache/.test-tools.lock"
if command -v flock >/dev/null 2>&1; then
    flock 8
fi

# ---- CloudEvents SDK
ce_pins="cloudevents==2.2.0 confluent-kafka==2.16.1"
venv="$cache/ce-venv"
if [[ "$(cat "$venv/.walpost-complete" 2>/dev/null)" == "$ce_pins" ]]; then
    say "CloudEvents SDK already present ($ce_pins)"
else
    say "installing $ce_pins into $venv"
    rm -rf "$venv"
    python3 -m venv "$venv"
    # shellcheck disable=SC2086 # a list of pins
    "$venv/bin/pip" install --quiet --disable-pip-version-check $ce_pins
    "$venv/bin/python" -c "import cloudevents.core.bindings.kafka, confluent_kafka"
    echo "$ce_pins" >"$venv/.walpost-complete"
fi

# ---- OpenTelemetry Collector (OTLP receiver; file and Zipkin exporters)
src="$repo_root/tools/otelcol"
stamp="$(cat "$src/go.mod" "$src/go.sum" "$src/main.go" | sha256sum | cut -c1-16)"
otelcol_dir="$cache/otelcol"
if [[ "$(cat "$otelcol_dir/.walpost-complete" 2>/dev/null)" == "$stamp" ]]; then
    say "walpost-otelcol already built ($stamp)"
else
    command -v go >/dev/null 2>&1 || { say "go not found on PATH (needed to build tools/otelcol)"; exit 1; }
    say "building walpost-otelcol from tools/otelcol (a few minutes on a fresh machine)"
    mkdir -p "$otelcol_dir"
    (cd "$src" && GOFLAGS=-mod=readonly go build -trimpath -ldflags=-s -o "$otelcol_dir/walpost-otelcol.tmp" .)
    mv "$otelcol_dir/walpost-otelcol.tmp" "$otelcol_dir/walpost-otelcol"
    echo "$stamp" >"$otelcol_dir/.walpost-complete"
fi

echo "WALPOST_CE_PYTHON=$venv/bin/python"
echo "WALPOST_OTELCOL=$otelcol_dir/walpost-otelcol"
