#!/usr/bin/env bash
# Takes the OpenTelemetry chapter's trace screenshot (docs/images/trace-zipkin.png): an outbox event's
# trace as a trace backend's own UI shows it, rendered by headless Chromium.
#
#   1. starts PostgreSQL and Kafka (walpost-devservers), a Zipkin server (the exec jar from
#      Maven Central, in-memory storage, UI on :9411) and walpost-otelcol (OTLP in, Zipkin
#      out; tools/otelcol),
#   2. runs `walpost run` with OTEL_EXPORTER_OTLP_ENDPOINT pointing at the collector,
#   3. commits an outbox row whose headers column carries the traceparent of a service span
#      "place order" (orders-service), and exports that span as an instrumented service
#      would,
#   4. waits until Zipkin's API holds walpost's span as a child of the service span (the
#      script fails otherwise), then opens /zipkin/traces/<trace id> in headless Chromium
#      (driven by playwright-core from npm), selects walpost's span and takes the picture.
#
# Not part of CI (it needs Chromium, a Debian package this script installs if missing,
# playwright-core and the 130 MB Zipkin jar). Run from anywhere:  bash scripts/trace-screenshot.sh [OUT.png]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
out="${1:-docs/images/trace-zipkin.png}"
zipkin_version=3.5.1
cache="${WALPOST_TOOLS_CACHE:-${HOME:-/root}/.cache/walpost/tools}"

say "fetching tools (Chromium, Zipkin $zipkin_version, walpost-otelcol)"
if ! command -v chromium >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium fonts-dejavu-core >/dev/null
fi
zipkin_jar="$cache/zipkin/zipkin-server-$zipkin_version-exec.jar"
if [[ ! -s "$zipkin_jar" ]]; then
    mvn -q dependency:copy -Dartifact="io.zipkin:zipkin-server:$zipkin_version:jar:exec" \
        -DoutputDirectory="$cache/zipkin"
fi
eval "$(bash scripts/fetch-test-tools.sh | grep '^WALPOST_OTELCOL=')"
if [[ ! -d "$cache/playwright/node_modules/playwright-core" ]]; then
    mkdir -p "$cache/playwright"
    npm install --silent --prefix "$cache/playwright" playwright-core@1.64.1
fi
cargo build --release --locked -p walpost -p testkit --bin walpost --bin walpost-devservers

work="$(mktemp -d /tmp/walpost-trace.XXXXXX)"
chmod 755 "$work"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    exec 3>&- 2>/dev/null || true
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() { for _ in $(seq 1 120); do curl -fs "$1" >/dev/null 2>&1 && return 0; sleep 0.5; done; echo "no answer from $1" >&2; return 1; }

say "starting PostgreSQL, Kafka, Zipkin and the collector"
# shellcheck disable=SC1091
source scripts/devservers.sh
start_devservers target/release "$work"
psql() { "$PG_BINDIR/psql" -X -q -v ON_ERROR_STOP=1 "$POSTGRES_URL" "$@"; }
zipkin_port=$(free_port)
java -Xmx512m -jar "$zipkin_jar" --server.port="$zipkin_port" >"$work/zipkin.log" 2>&1 &
pids+=($!)
otlp_port=$(free_port)
cat >"$work/otelcol.yaml" <<YAML
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:$otlp_port
exporters:
  zipkin:
    endpoint: http://127.0.0.1:$zipkin_port/api/v2/spans
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [zipkin]
YAML
"$WALPOST_OTELCOL" --config "$work/otelcol.yaml" >"$work/otelcol.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:$zipkin_port/health"

say "migrations, and a headers column for the trace context"
target/release/walpost migrate --postgres "$POSTGRES_URL"
psql -c "ALTER TABLE events.outbox ADD COLUMN IF NOT EXISTS headers jsonb"

say "walpost run, exporting spans to the collector"
set -a
# shellcheck disable=SC1091
source deploy/walpost.env
set +a
printf '[router]\n"table.field.event.headers" = "headers"\n' >"$work/walpost.toml"
metrics_port=$(free_port)
WALPOST_POSTGRES="$POSTGRES_URL" WALPOST_KAFKA_BROKERS="$KAFKA_BROKERS" \
    WALPOST_METRICS_ADDR="127.0.0.1:$metrics_port" \
    OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$otlp_port" OTEL_SERVICE_NAME=walpost \
    target/release/walpost run --config "$work/walpost.toml" 2>"$work/walpost.log" &
pids+=($!)
for _ in $(seq 1 100); do grep -q "streaming" "$work/walpost.log" && break; sleep 0.2; done
# A first event without a trace, so the photographed span is a warm producer's (the first
# record also waits for the idempotent producer's id).
psql -c "INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload)
         VALUES ('order', '5f0c6b1e-0000-4000-8000-000000000002', 'OrderCreated', '{}')"
for _ in $(seq 1 100); do
    curl -fs "http://127.0.0.1:$metrics_port/metrics" | grep -q '^walpost_events_published_total{.*} 1' && break
    sleep 0.2
done

say "a service span and an outbox row carrying its traceparent"
trace=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
service_span=$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')
start=$(date +%s%N)
psql <<SQL
BEGIN;
INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload, headers)
VALUES ('order', '5f0c6b1e-0000-4000-8000-000000000001', 'OrderPlaced', '{"orderId": "o-1", "amount": 19900}',
        '{"traceparent": "00-$trace-$service_span-01"}');
COMMIT;
SQL
end=$(date +%s%N)
for _ in $(seq 1 60); do
    curl -fs -o /dev/null -H 'Content-Type: application/json' "http://127.0.0.1:$otlp_port/v1/traces" --data @- <<JSON && break
{"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "orders-service"}}]},
  "scopeSpans": [{"scope": {"name": "orders"}, "spans": [{"traceId": "$trace", "spanId": "$service_span",
    "name": "place order", "kind": 2, "startTimeUnixNano": "$start", "endTimeUnixNano": "$end"}]}]}]}
JSON
    sleep 0.5
done

say "waiting for Zipkin to hold walpost's span under the service span"
found=""
for _ in $(seq 1 120); do
    if curl -fs "http://127.0.0.1:$zipkin_port/api/v2/trace/$trace" >"$work/trace.json" 2>/dev/null &&
        python3 - "$work/trace.json" "$service_span" <<'PY'
import json, sys
spans = json.load(open(sys.argv[1]))
ok = any(s.get("parentId") == sys.argv[2] and s["localEndpoint"]["serviceName"] == "walpost" for s in spans)
sys.exit(0 if ok else 1)
PY
    then
        found=1
        break
    fi
    sleep 0.5
done
if [[ -z "$found" ]]; then
    cat "$work/walpost.log" "$work/otelcol.log" >&2
    echo "Zipkin never showed walpost's span in trace $trace" >&2
    exit 1
fi
python3 - "$work/trace.json" <<'PY'
import json, sys
for s in json.load(open(sys.argv[1])):
    print(f"  {s['localEndpoint']['serviceName']:15} {s.get('name', ''):28} parent={s.get('parentId', '-')}")
PY

say "photographing http://127.0.0.1:$zipkin_port/zipkin/traces/$trace"
mkdir -p "$(dirname "$out")"
# Playwright (playwright-core from npm, driving Debian's Chromium) opens the trace and
# selects walpost's span, so its messaging attributes show in the side panel.
cat >"$work/shot.cjs" <<'JS'
const { chromium } = require("playwright-core");
(async () => {
  const [url, out] = process.argv.slice(2);
  const browser = await chromium.launch({
    executablePath: "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  const page = await browser.newPage({ viewport: { width: 1400, height: 1180 } });
  await page.goto(url);
  await page.getByText("walpost: send", { exact: false }).first().click();
  await page.getByText("messaging.destination.name").first().waitFor();
  await page.screenshot({ path: out });
  await browser.close();
})().catch((e) => { console.error(e); process.exit(1); });
JS
NODE_PATH="$cache/playwright/node_modules" node "$work/shot.cjs" \
    "http://127.0.0.1:$zipkin_port/zipkin/traces/$trace" "$out"
ls -l "$out"
say "done; logs in $work"
