#!/usr/bin/env bash
# Checks the Helm chart deploy/helm/walpost without a cluster, with deploy/helm/check (a Go
# program on Helm's own packages, helm.sh/helm/v4, and the Kubernetes API types; versions
# pinned by its go.mod and go.sum):
#
#   1. the chart's copies of deploy/prometheus/alerts.yml and
#      deploy/grafana/walpost-dashboard.json are byte-for-byte the originals (their one
#      source; Helm reads no file outside a chart);
#   2. `helm lint --strict` with the default values and with deploy/helm/walpost/ci/*-values.yaml
#      (all-on-values.yaml: every option on);
#   3. `helm template` of the same values (merging, values.schema.json, the engine, as
#      `helm install` does), every object decoded strictly into its Kubernetes API type
#      (prometheus-operator's for ServiceMonitor and PrometheusRule): an unknown, duplicate
#      or misspelt field fails;
#   4. non-root, read-only root filesystem, no privilege escalation, capabilities dropped,
#      seccomp RuntimeDefault in every container; probes, selectors, volumes, ports and
#      service accounts that point at something; no Secret and no secret value rendered;
#      the grace period above the shutdown timeout of docs/configuration.md;
#   5. each deploy/helm/check/testdata/refused/*.yaml is refused with the message its
#      `# expect:` line names, and no output shows the sentinel password it carries.
#
# Needs Go (the version of deploy/helm/check/go.mod or newer); modules come from the Go
# module proxy on the first run (GOPROXY), then from Go's module cache. The program is built
# into ${WALPOST_TOOLS_CACHE:-~/.cache/walpost/tools}/helm-check/, keyed by its sources and
# Go's version, so a warm run only runs it. Nothing is written into the repository.
#
# Exits non-zero on any failure. Messages go to stderr.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { echo "check-chart: $*" >&2; }
started=$SECONDS

command -v go >/dev/null 2>&1 || { say "FAIL: go is not on PATH (Go builds deploy/helm/check)"; exit 1; }

src=deploy/helm/check
cache="${WALPOST_TOOLS_CACHE:-${HOME:-/root}/.cache/walpost/tools}/helm-check"
key="$( { go version; cat "$src/go.mod" "$src/go.sum" "$src"/*.go; } | sha256sum | cut -c1-16)"
bin="$cache/check-$key"

if [[ ! -x "$bin" ]]; then
    say "building $src (first run: modules from the Go module proxy)"
    mkdir -p "$cache"
    # -mod=readonly: go.sum pins every module, nothing is resolved anew. GOTOOLCHAIN=local:
    # the installed Go builds it, no toolchain is downloaded.
    (cd "$src" && GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" go build -trimpath -o "$bin.tmp" .)
    mv "$bin.tmp" "$bin"
    # Older builds of the program, from earlier sources.
    find "$cache" -maxdepth 1 -name 'check-*' ! -name "check-$key" -delete
    say "built in $((SECONDS - started)) s"
fi

"$bin" \
    -chart deploy/helm/walpost \
    -alerts deploy/prometheus/alerts.yml \
    -dashboard deploy/grafana/walpost-dashboard.json \
    -configuration docs/configuration.md \
    -refused "$src/testdata/refused"
say "done in $((SECONDS - started)) s"
