#!/usr/bin/env bash
# The soak (issue 18): examples/soak.rs on 4 ranks under oxrun — CALLS mixed collectives
# (default 100,000; random collective, size 0-4 MiB, type, operator, root, placement), each
# result checked, and each rank's descriptors, resident memory and mapped shared memory
# compared between the warm-up and the end (the example fails on growth).
# Usage: tools/ci/soak.sh [CALLS]
set -euo pipefail
cd "$(dirname "$0")/../.."
calls="${1:-100000}"
# The build `cargo test --workspace` makes (nothing to do after it, as in CI): `cargo build -p`
# unifies features differently and rebuilt the library and its dependencies, 6 minutes of CI.
cargo test -q --workspace --no-run
start=$SECONDS
target/debug/oxrun -n 4 --timeout 1500 -- target/debug/examples/soak "$calls"
echo "soak: $calls calls on 4 ranks in $((SECONDS - start)) s"
