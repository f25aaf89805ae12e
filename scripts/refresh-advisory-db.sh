#!/usr/bin/env bash
# Packs a snapshot of the RustSec advisory database for scripts/supply-chain.sh, which
# checks Cargo.lock against it offline (CI cannot clone the database's git repository).
#
#   bash scripts/refresh-advisory-db.sh ADVISORY_DB_GIT_DIR [OUT_DIR]
#
# ADVISORY_DB_GIT_DIR: a clone (bare or not) of the rustsec/advisory-db repository, for
# instance the one a session's `fetch github:rustsec/advisory-db` brings.
# OUT_DIR: where the archive goes; default ${WALPOST_ADVISORY_CACHE:-/var/cache/walpost/advisory-db},
# the machine's cache scripts/supply-chain.sh reads (it also reads ../shared/advisory-db/).
# The archive is data, not code: it is never committed to this repository.
#
# Writes OUT_DIR/advisory-db-<commit date>-<short commit>.tar.xz holding crates/ (every
# advisory), LICENSE.txt (the database's CC0-1.0 licence) and SNAPSHOT (commit and commit
# date: scripts/supply-chain.sh takes the date as the database's age), built reproducibly
# (same commit, same bytes), then removes older advisory-db-*.tar.xz from OUT_DIR.
set -euo pipefail

say() { echo "refresh-advisory-db: $*" >&2; }
die() { say "$*"; exit 1; }

src="${1:-}"
[[ -n "$src" ]] || die "usage: $0 ADVISORY_DB_GIT_DIR [OUT_DIR]"
out="${2:-${WALPOST_ADVISORY_CACHE:-/var/cache/walpost/advisory-db}}"

git -C "$src" rev-parse --verify -q HEAD >/dev/null || die "$src is not a git repository with a HEAD"
commit="$(git -C "$src" rev-parse HEAD)"
date="$(git -C "$src" log -1 --format=%cI HEAD)"
epoch="$(git -C "$src" log -1 --format=%ct HEAD)"
count="$(git -C "$src" ls-tree -r --name-only HEAD crates | grep -c '\.md$' || true)"
((count > 500)) || die "$src has only $count advisories under crates/: not the RustSec advisory database?"
git -C "$src" cat-file -e HEAD:LICENSE.txt 2>/dev/null || die "$src has no LICENSE.txt"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir "$work/db"
git -C "$src" archive --format=tar HEAD crates LICENSE.txt | tar -x -C "$work/db"
printf 'commit=%s\ndate=%s\nadvisories=%s\n' "$commit" "$date" "$count" >"$work/db/SNAPSHOT"

name="advisory-db-$(date -u -d "@$epoch" +%Y%m%d)-${commit:0:12}.tar.xz"
mkdir -p "$out"
tar --sort=name --mtime="@$epoch" --owner=0 --group=0 --numeric-owner -C "$work/db" -cf - . \
    | xz -9 -T1 >"$work/$name"
mv "$work/$name" "$out/$name"
for old in "$out"/advisory-db-*.tar.xz; do
    [[ "$old" == "$out/$name" ]] && continue
    say "removing older snapshot $(basename "$old")"
    rm -f "$old"
done
say "wrote $out/$name: $count advisories, commit $commit of $date ($(du -h "$out/$name" | cut -f1))"
