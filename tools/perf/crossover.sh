#!/usr/bin/env bash
# Measures the two large all-reduce ways between ranks of one host against each other, to place
# OXCCL_DIRECT_MIN / OXCCL_DIRECT_MAX: "direct" (every size past one-shot reaches peers' memory
# by process_vm_readv/writev) and "area" (two-shot through the shared group area), both
# placements, 2 ranks, float32 sum, sizes 32 KiB .. 64 MiB doubling. The two are interleaved
# round by round; prints the median over rounds of each run's time per operation.
#
# usage: tools/perf/crossover.sh [ROUNDS=3]
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${1:-3}
OUT=$PWD/target/perf/crossover-$(date +%Y%m%d-%H%M%S)
mkdir -p "$OUT"
cargo build --release -q -p allreduce-perf
for r in $(seq 1 "$ROUNDS"); do
  for way in direct area; do
    if [ "$way" = direct ]; then
      vars="OXCCL_DIRECT_MIN=0 OXCCL_DIRECT_MAX=18446744073709551615"
    else
      vars="OXCCL_DIRECT_MIN=off"
    fi
    env $vars target/release/allreduce-perf --ranks 2 -b 32K -e 64M -f 2 -w 5 -R 5 \
      --min-time 0.15 > "$OUT/${way}_r$r.txt"
  done
done
python3 - "$OUT" <<'PY'
import collections, glob, os, statistics, sys
runs = collections.defaultdict(lambda: ([], []))
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*_r*.txt"))):
    way = os.path.basename(path).split("_r")[0]
    for line in open(path):
        f = line.split()
        if not f or f[0].startswith("#") or not f[0].isdigit():
            continue
        runs[(int(f[0]), way)][0].append(float(f[5]))
        runs[(int(f[0]), way)][1].append(float(f[9]))
print("| bytes | direct out of place | area out of place | direct in place | area in place |")
print("|---|---|---|---|---|")
for size in sorted({s for s, _ in runs}):
    d, a = runs[(size, "direct")], runs[(size, "area")]
    m = lambda xs: f"{statistics.median(xs):.1f} µs" if xs else "-"
    print(f"| {size} | {m(d[0])} | {m(a[0])} | {m(d[1])} | {m(a[1])} |")
PY
