#!/usr/bin/env bash
# pstackd watch rules: idle cost of every rule kind armed with ~1,000 flows in
# the flight recorder vs no rules (ratio), and fault -> sealed p50/p99 for
# d_state and tcp_reset. Root; builds release binaries unless NO_BUILD=1.
#
# Usage: bench/daemon/watch.sh [IDLE_SECONDS=30] [D_STATE_RUNS=20] [RESETS=100]
set -euo pipefail
cd "$(dirname "$0")/../.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
if [ -z "${NO_BUILD:-}" ]; then
    cargo build --release -q -p pstack-agent --bin pstackd
    cargo build --release -q -p pstack-helper --bin pstack-helper
fi
exec python3 bench/daemon/watch.py "$CARGO_TARGET_DIR/release" "$@"
