#!/usr/bin/env bash
# The whole job end to end on this machine, without Docker:
#   1. installs what is missing (PostgreSQL 15, librdkafka build deps, Kafka jars),
#   2. builds walpost (release),
#   3. starts a local PostgreSQL (wal_level=logical) and an Apache Kafka broker (KRaft),
#   4. applies the outbox's migrations with `walpost migrate`, starts `walpost run`,
#   5. inserts sample outbox events in business transactions (one rolled back),
#   6. consumes them from Kafka with Kafka's own console consumer and shows the slot,
#   7. stops walpost with SIGTERM (flush, confirm, exit 0) and the servers.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "installing dependencies (if missing)"
# The demo runs no test tool (CloudEvents SDK, OpenTelemetry Collector): none is fetched.
bash scripts/setup-deps.sh --no-test-tools

say "building walpost (release)"
cargo build --release --locked -p walpost -p testkit --bin walpost --bin walpost-devservers

work="$(mktemp -d /tmp/walpost-demo.XXXXXX)"
chmod 755 "$work"
walpost_pid=""
cleanup() {
    [[ -n "$walpost_pid" ]] && kill "$walpost_pid" 2>/dev/null || true
    exec 3>&- 2>/dev/null || true
}
trap cleanup EXIT

say "starting PostgreSQL and Kafka"
# shellcheck disable=SC1091
source scripts/devservers.sh
start_devservers target/release "$work"
echo "PostgreSQL: ${POSTGRES_URL//:walpost@/:****@}   Kafka: $KAFKA_BROKERS"
psql() { "$PG_BINDIR/psql" -X -q -v ON_ERROR_STOP=1 "$POSTGRES_URL" "$@"; }

say "applying the outbox's migrations (walpost migrate)"
target/release/walpost migrate --postgres "$POSTGRES_URL"

say "starting walpost"
set -a
# shellcheck disable=SC1091
source deploy/walpost.env
set +a
export WALPOST_POSTGRES="$POSTGRES_URL" WALPOST_KAFKA_BROKERS="$KAFKA_BROKERS"
target/release/walpost run 2> "$work/walpost.log" &
walpost_pid=$!
for _ in $(seq 1 50); do grep -q "streaming" "$work/walpost.log" && break; sleep 0.2; done
cat "$work/walpost.log"

say "a service writes business rows and outbox rows in one transaction"
psql <<'SQL'
CREATE TABLE IF NOT EXISTS public.orders (id uuid PRIMARY KEY, total int);
BEGIN;
INSERT INTO public.orders VALUES ('5f0c6b1e-0000-4000-8000-000000000001', 19900);
INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload)
VALUES ('order', '5f0c6b1e-0000-4000-8000-000000000001', 'OrderPlaced', '{"orderId": "o-1", "amount": 19900}');
COMMIT;
BEGIN;
INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload)
VALUES ('order', '5f0c6b1e-0000-4000-8000-000000000002', 'OrderPlaced', '{"orderId": "o-2", "note": "rolled back: never published"}');
ROLLBACK;
INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload)
VALUES ('order', '5f0c6b1e-0000-4000-8000-000000000001', 'OrderPaid', '{"orderId": "o-1", "paid": true}'),
       ('payment', '7a1d0000-0000-4000-8000-000000000009', 'PaymentCaptured', '{"paymentId": "p-9", "amount": 19900}');
SQL
echo "3 events committed, 1 rolled back"

say "consuming from Kafka (console consumer: key, headers, value)"
# Exactly the records each topic gets (2 and 1): the consumer exits as soon as it has
# them, with nothing alarming on the screen (--timeout-ms is only a safety net).
for pair in outbox.event.order:2 outbox.event.payment:1; do
    topic="${pair%%:*}"
    echo "-- $topic"
    java -cp "$KAFKA_LIBS/*" org.apache.kafka.tools.consumer.ConsoleConsumer \
        --bootstrap-server "$KAFKA_BROKERS" --topic "$topic" --from-beginning \
        --max-messages "${pair##*:}" --timeout-ms 60000 \
        --property print.key=true --property print.headers=true 2>/dev/null || true
done

say "slot status: confirmed only after Kafka acknowledged"
psql -c "SELECT slot_name, active, confirmed_flush_lsn, pg_size_pretty(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)) AS retained FROM pg_replication_slots"

say "metrics (http://${WALPOST_METRICS_ADDR/0.0.0.0/127.0.0.1}/metrics)"
if command -v curl >/dev/null 2>&1; then
    curl -s "http://${WALPOST_METRICS_ADDR/0.0.0.0/127.0.0.1}/metrics" | grep -E '^walpost_(events_published|confirmed_lsn|transactions)' || true
fi

say "stopping walpost (SIGTERM: stop reading, flush, confirm, exit 0)"
kill -TERM "$walpost_pid"
wait "$walpost_pid" && echo "walpost exited 0"
walpost_pid=""
tail -n 3 "$work/walpost.log"
say "done; logs in $work"
