#!/usr/bin/env bash
# Liveness under load (issue 18): 4 ranks on this machine's cores run 64 MiB all-reduces for
# SECONDS (default 60) with a 1 s heartbeat (OXCCL_HEARTBEAT=1). Any spurious "no heartbeat"
# failure fails the job; the script checks that every rank ran to the end and prints how many
# all-reduces that was. Usage: tools/ci/liveness-load.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
secs="${1:-60}"
# The build `cargo test --workspace` makes (nothing to do after it, as in CI): `cargo build -p`
# unifies features differently and rebuilt the library and its dependencies, 6 minutes of CI.
cargo test -q --workspace --no-run
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
start=$SECONDS
status=0
OXCCL_HEARTBEAT=1 FAULT_WORKER_SECONDS="$secs" OXCCL_TIMEOUT=120 \
  target/debug/oxrun -n 4 --timeout $((secs + 120)) -- \
  target/debug/examples/fault_worker 16777216 1 >"$log" 2>&1 || status=$?
done_lines="$(grep -c '] done ' "$log" || true)"
if [ "$status" -ne 0 ] || [ "$done_lines" -ne 4 ] || grep -q 'error after' "$log"; then
  echo "liveness-load: FAILED (oxrun status $status, $done_lines of 4 ranks done)"
  grep -v '\] iter ' "$log" | tail -40
  exit 1
fi
iters="$(grep '\[0\] done ' "$log" | awk '{print $3}')"
echo "liveness-load: 4 ranks, 64 MiB all-reduces, heartbeat 1 s: $iters all-reduces in $((SECONDS - start)) s, no failure"
