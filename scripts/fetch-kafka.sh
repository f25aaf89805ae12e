#!/usr/bin/env bash
# Fetches the Apache Kafka 4.1.1 broker (KRaft) class path for the test harness
# (crates/testkit) and the local demo: the jars of kafka_2.13, kafka-tools and a
# log4j2 binding, resolved by Maven from tools/kafka/pom.xml.
#
# Idempotent: when the target directory already holds the jars (the marker file
# `.walpost-complete` is written last) nothing is done. Concurrent runs are
# serialised with flock, and the jars are copied into a scratch directory that is
# renamed into place, so a half-filled directory is never seen.
#
# Target: ${WALPOST_KAFKA_LIBS:-$HOME/.cache/walpost/kafka-4.1.1/libs}
# Needs:  Java 17+ and Maven (mvn) on PATH, access to Maven Central.
# Prints: the library directory (last line of stdout).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pom="$repo_root/tools/kafka/pom.xml"
libs="${WALPOST_KAFKA_LIBS:-${HOME:-/root}/.cache/walpost/kafka-4.1.1/libs}"
marker="$libs/.walpost-complete"

if [[ -f "$marker" ]]; then
    echo "fetch-kafka: jars already present" >&2
    echo "$libs"
    exit 0
fi

command -v mvn >/dev/null 2>&1 || { echo "fetch-kafka: mvn (Maven) not found on PATH" >&2; exit 1; }
command -v java >/dev/null 2>&1 || { echo "fetch-kafka: java not found on PATH" >&2; exit 1; }

parent="$(dirname "$libs")"
mkdir -p "$parent"
lock="$parent/.$(basename "$libs").lock"
exec 9>"$lock"
if command -v flock >/dev/null 2>&1; then
    flock 9
fi

# Someone else may have finished while we waited for the lock.
if [[ -f "$marker" ]]; then
    echo "fetch-kafka: jars already present" >&2
    echo "$libs"
    exit 0
fi

scratch="$(mktemp -d "$parent/.libs-tmp.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT

echo "fetch-kafka: resolving Kafka jars from $pom into $libs (takes ~30 s)" >&2
mvn -q -B -Dstyle.color=never -f "$pom" dependency:copy-dependencies \
    -DoutputDirectory="$scratch" -DincludeScope=runtime >&2

count=$(find "$scratch" -maxdepth 1 -name '*.jar' | wc -l)
for required in kafka_2.13-*.jar kafka-tools-*.jar kafka-clients-*.jar log4j-core-*.jar; do
    if ! compgen -G "$scratch/$required" >/dev/null; then
        echo "fetch-kafka: $required missing after mvn run" >&2
        exit 1
    fi
done

rm -rf "$libs"
mv "$scratch" "$libs"
trap - EXIT
chmod 755 "$libs"
date -u +%Y-%m-%dT%H:%M:%SZ > "$libs/.walpost-complete"
echo "fetch-kafka: $count jars in $libs" >&2
echo "$libs"
