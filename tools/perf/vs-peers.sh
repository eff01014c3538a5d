#!/usr/bin/env bash
# Measures oxccl beside the peers of ../shared/tools/peer-bench in the same run, interleaved:
# each round runs peer-bench once (every listed peer, its own protocol: 2 ranks, float32 sum,
# out-of-place, ~0.25 s repeats, median of 5) and then allreduce-perf with the same protocol at
# the same sizes. Prints the medians over rounds and oxccl's ratio to the best peer.
#
# usage: tools/perf/vs-peers.sh [-r ROUNDS] [-p "PEERS"] [-n NRANKS] [-- EXTRA allreduce-perf ARGS]
#   e.g. tools/perf/vs-peers.sh -r 3 -p "ompi_tcp" -- --transport tcp
# Results land in target/perf/<time>/ (raw peer CSVs, our JSON, summary.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=3
PEERS="ompi_tcp"
NRANKS=2
while [ $# -gt 0 ]; do
  case "$1" in
    -r) ROUNDS=$2; shift 2 ;;
    -p) PEERS=$2; shift 2 ;;
    -n) NRANKS=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
PEER_BENCH=${PEER_BENCH:-$(cd ../shared/tools/peer-bench 2>/dev/null && pwd || true)}
[ -n "$PEER_BENCH" ] && [ -x "$PEER_BENCH/run_all.sh" ] || { echo "peer-bench not found (set PEER_BENCH)" >&2; exit 2; }
OUT=$PWD/target/perf/$(date +%Y%m%d-%H%M%S)
mkdir -p "$OUT"
cargo build --release -q -p allreduce-perf
SIZES="8 1024 65536 1048576 16777216 67108864 268435456"
for r in $(seq 1 "$ROUNDS"); do
  echo "== round $r: peers ($PEERS)"
  if [ "$PEERS" != "none" ]; then
    before=$(ls -d "$PEER_BENCH"/results/*/ 2>/dev/null | sort | tail -1 || true)
    (cd "$PEER_BENCH" && ./run_all.sh 1 5 "$PEERS" > "$OUT/peer_r$r.log" 2>&1)
    res=$(ls -d "$PEER_BENCH"/results/*/ | sort | tail -1)
    [ "$res" != "$before" ] || { echo "peer-bench wrote no results" >&2; exit 1; }
    mkdir -p "$OUT/peer_r$r" && cp "$res"/*.csv "$OUT/peer_r$r/"
  fi
  echo "== round $r: oxccl"
  for s in $SIZES; do
    target/release/allreduce-perf --ranks "$NRANKS" -b "$s" -e "$s" -w 5 -R 5 --min-time 0.25 \
      -J "$OUT/oxccl_r${r}_$s.json" "$@" > "$OUT/oxccl_r${r}_$s.txt"
  done
done
python3 tools/perf/compare.py "$OUT" | tee "$OUT/summary.md"
