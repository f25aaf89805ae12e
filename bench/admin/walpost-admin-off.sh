#!/usr/bin/env bash
# A BIN for bench/ab-drain.sh: walpost (WALPOST, default target/release/walpost) without
# an admin listener, started the same way as walpost-admin-on.sh (a shell that waits for
# it) so that the two differ only by the listener and its client.
set -euo pipefail
"${WALPOST:-target/release/walpost}" "$@"
