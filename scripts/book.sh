#!/usr/bin/env bash
# Builds walpost's book (docs/, an mdBook) into target/book and fails on a broken link:
# scripts/book.py stages the pages (rewriting the repository's relative links for the
# book), mdbook builds them, scripts/book.py checks the rendered links. Installs mdbook
# (crates.io, MDBOOK_VERSION) into ~/.cargo/bin when it is missing or another version.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

version="${MDBOOK_VERSION:-0.5.4}"
if [[ "$(mdbook --version 2>/dev/null)" != "mdbook v$version" ]]; then
    echo "book: installing mdbook $version (crates.io)"
    cargo install mdbook --version "$version" --locked --no-default-features --features search --quiet
fi
python3 scripts/book.py stage
mdbook build target/book-src
python3 scripts/book.py check
