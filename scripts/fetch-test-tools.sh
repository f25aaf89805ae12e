#!/usr/bin/env bash
# Fetches the consumers and backends the CloudEvents, tracing and schema-registry
# end-to-end tests run (crates/walpost/tests/e2e/{cloudevents,otel,registry}.rs):
#
#   * a Python venv with the CloudEvents SDK (`cloudevents`) and
#     `confluent-kafka[avro,json,schemaregistry]`, from PyPI at the versions pinned below:
#     the real SDK decodes what walpost wrote, and Confluent's own schema-registry client
#     and Avro / JSON Schema deserializers read walpost's Confluent-framed records;
#   * walpost-otelcol, the OpenTelemetry Collector with only its OTLP receiver and the
#     contrib file and Zipkin exporters (the second for scripts/trace-screenshot.sh), built from tools/otelcol (go.mod/go.sum pin every module)
#     with the Go toolchain and the Go module proxy;
#   * Apicurio Registry 2.4.2.Final (in-memory storage; the Confluent Schema Registry API
#     at /apis/ccompat/v7), the Quarkus application built by Maven from tools/apicurio/pom.xml
#     (Maven Central only; ~5 min and ~275 MB of ~/.m2 the first time), run by
#     crates/testkit (testkit::SchemaRegistry). Needs Java 17+ and mvn.
#
# Idempotent and fast when present: each part is skipped when its marker (written last)
# names the same versions. Concurrent runs are serialised with flock. The registry is
# built in a scratch copy of tools/apicurio and moved into place only when complete.
#
# Target: ${WALPOST_TOOLS_CACHE:-$HOME/.cache/walpost/tools}/{ce-venv,otelcol,apicurio-2.4.2}
# Prints: the three paths the tests read (WALPOST_CE_PYTHON=..., WALPOST_OTELCOL=...,
#         WALPOST_APICURIO_DIR=...).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${WALPOST_TOOLS_CACHE:-${HOME:-/root}/.cache/walpost/tools}"
say() { echo "fetch-test-tools: $*" >&2; }
mkdir -p "$cache"
exec 8>"$cache/.test-tools.lock"
if command -v flock >/dev/null 2>&1; then
    flock 8
fi

# ---- CloudEvents SDK and Confluent's schema-registry client (one venv: no conflicts)
ce_pins=(cloudevents==2.2.0 "confluent-kafka[avro,json,schemaregistry]==2.16.1")
venv="$cache/ce-venv"
if [[ "$(cat "$venv/.walpost-complete" 2>/dev/null)" == "${ce_pins[*]}" ]]; then
    say "Python packages already present (${ce_pins[*]})"
else
    say "installing ${ce_pins[*]} into $venv"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "${ce_pins[@]}"
    "$venv/bin/python" -c "import cloudevents.core.bindings.kafka, confluent_kafka
import confluent_kafka.schema_registry.avro, confluent_kafka.schema_registry.json_schema"
    echo "${ce_pins[*]}" >"$venv/.walpost-complete"
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

# ---- Apicurio Registry (Confluent-compatible schema registry), a Quarkus fast-jar app
apicurio_src="$repo_root/tools/apicurio"
apicurio_stamp="apicurio-registry 2.4.2.Final $(sha256sum <"$apicurio_src/pom.xml" | cut -c1-16)"
apicurio_dir="$cache/apicurio-2.4.2"
if [[ "$(cat "$apicurio_dir/.walpost-complete" 2>/dev/null)" == "$apicurio_stamp" ]]; then
    say "Apicurio Registry already built ($apicurio_stamp)"
else
    command -v mvn >/dev/null 2>&1 || { say "mvn (Maven) not found on PATH (needed to build tools/apicurio)"; exit 1; }
    command -v java >/dev/null 2>&1 || { say "java not found on PATH (needed to build tools/apicurio)"; exit 1; }
    say "building Apicurio Registry 2.4.2.Final from tools/apicurio (a few minutes on a fresh machine)"
    scratch="$(mktemp -d "$cache/.apicurio-build.XXXXXX")"
    trap 'rm -rf "$scratch"' EXIT
    cp "$apicurio_src/pom.xml" "$scratch/"
    (cd "$scratch" && mvn -B -q -Dstyle.color=never package -DskipTests -Dquarkus.package.type=fast-jar >&2)
    [[ -f "$scratch/target/quarkus-app/quarkus-run.jar" ]] || { say "no quarkus-run.jar after the mvn build"; exit 1; }
    echo "$apicurio_stamp" >"$scratch/target/quarkus-app/.walpost-complete"
    rm -rf "$apicurio_dir"
    mv "$scratch/target/quarkus-app" "$apicurio_dir"
    rm -rf "$scratch"
    trap - EXIT
fi

echo "WALPOST_CE_PYTHON=$venv/bin/python"
echo "WALPOST_OTELCOL=$otelcol_dir/walpost-otelcol"
echo "WALPOST_APICURIO_DIR=$apicurio_dir"
