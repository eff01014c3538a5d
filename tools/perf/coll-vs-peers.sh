#!/usr/bin/env bash
# Any collective, oxccl beside the MPI peers in the same run, interleaved: each round runs
# ../shared/tools/peer-bench/coll.sh (nccl-tests' sizes and bus-bandwidth factors) for every
# listed collective and then allreduce-perf --op COLL at the same sizes (float32, sum, both
# placements). Prints, per collective, the median over rounds and oxccl's ratio to the best peer.
#
# usage: tools/perf/coll-vs-peers.sh [-r ROUNDS] [-p "PEERS"] [-n NRANKS] [-c "COLLS"] [-s "SIZES"] [-g]
#   e.g. tools/perf/coll-vs-peers.sh -r 3 -p "ompi_shm mpich impi" -c "allgather reducescatter"
# -g: before every run, wait (up to 20 s) for a near phase of the machine (a cache line's round
# trip between CPUs 0 and 1 under 200 ns, tools/perf/c2c_latency.c); the summary lists every
# run's phase before and after either way.
# COLLS: allgather reducescatter broadcast reduce alltoall allreduce (default: the first four).
# Results land in target/perf/coll-<time>/ (peer CSVs, our CSVs, summary.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=3
PEERS="ompi_shm mpich impi"
NRANKS=2
COLLS="allgather reducescatter broadcast reduce"
SIZES="8 1024 65536 1048576 16777216 67108864"
GATE=0
while [ $# -gt 0 ]; do
  case "$1" in
    -r) ROUNDS=$2; shift 2 ;;
    -p) PEERS=$2; shift 2 ;;
    -n) NRANKS=$2; shift 2 ;;
    -c) COLLS=$2; shift 2 ;;
    -s) SIZES=$2; shift 2 ;;
    -g) GATE=1; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
PEER_BENCH=${PEER_BENCH:-$(cd ../shared/tools/peer-bench 2>/dev/null && pwd || true)}
[ -n "$PEER_BENCH" ] && [ -x "$PEER_BENCH/coll.sh" ] || { echo "peer-bench not found (set PEER_BENCH)" >&2; exit 2; }
OUT=$PWD/target/perf/coll-$(date +%Y%m%d-%H%M%S)
mkdir -p "$OUT"
cargo build --release -q -p allreduce-perf
# The machine's phase before every run: one cache line's round trip between CPUs 0 and 1, in ns
# (tools/perf/c2c_latency.c); a row measured in a far phase is not comparable with a near one.
cc -O2 -pthread -o "$OUT/c2c_latency" tools/perf/c2c_latency.c
near() {
  [ "$GATE" = 1 ] || return 0
  local end=$((SECONDS + 20))
  while [ "$("$OUT/c2c_latency")" -ge 200 ] && [ $SECONDS -lt $end ]; do sleep 0.2; done
}
# round, collective, who, size, round trip before, after: `phase ... before` then `phase after`.
phase() {
  if [ "$1" = after ]; then echo ",$("$OUT/c2c_latency")" >> "$OUT/phase.csv"
  else near; echo -n "$1,$2,$3,$4,$("$OUT/c2c_latency")" >> "$OUT/phase.csv"; fi
}
MAX=$(echo "$SIZES" | tr ' ' '\n' | sort -n | tail -1)
for r in $(seq 1 "$ROUNDS"); do
  for c in $COLLS; do
    echo "== round $r: $c: peers ($PEERS)"
    phase "$r" "$c" peers 0
    (cd "$PEER_BENCH" && ./coll.sh "$c" "$PEERS" "$NRANKS" 3 "$MAX") > "$OUT/peer_r${r}_$c.csv" 2>/dev/null || true
    phase after
    echo "== round $r: $c: oxccl"
    for s in $SIZES; do
      phase "$r" "$c" oxccl "$s"
      target/release/allreduce-perf --ranks "$NRANKS" -o "$c" -b "$s" -e "$s" -w 5 -R 3 \
        --min-time 0.2 --csv "$OUT/oxccl_r${r}_${c}_$s.csv" > /dev/null
      phase after
    done
  done
done
python3 tools/perf/coll_compare.py "$OUT" "$SIZES" | tee "$OUT/summary.md"
