#!/usr/bin/env bash
# Two builds (or two settings) of allreduce-perf against each other, for a noisy machine:
# runs A and B back to back N times, alternating which goes first, and reports per size the
# median over pairs of B's time / A's time (and the quartiles), out of place and in place.
# Each pair runs within a second or two, so the machine's slow and fast streaks (which flip
# several times a minute on the 2-core VM) hit both sides of a pair alike; a ratio between
# medians taken apart would mix them.
#
# usage: tools/perf/ab.sh [-n PAIRS=30] A B -- ALLREDUCE-PERF-ARGS...
#   A, B: an allreduce-perf binary, or a command line to run it in quotes
#         (e.g. "env OXCCL_TRACE_ENTRIES=0 target/release/allreduce-perf")
# e.g.    cp target/release/allreduce-perf /tmp/arp-old   # before the change, then rebuild
#         tools/perf/ab.sh /tmp/arp-old target/release/allreduce-perf -- \
#             --ranks 2 -o broadcast -b 8 -e 8 -n 10000 -w 1000 -R 1 --min-time 0.05 -c 0
# Ratios below 1 mean B is faster. Keep runs short (-R 1, --min-time 0.05) and pairs many.
# -g: only near phases of the machine (tools/perf/c2c_latency.c: a cache line's round trip
#     between CPUs 0 and 1 under 200 ns): each run waits up to 20 s for one, and a pair where
#     either run ended in a far phase is left out (the VM of 2026-11-29 spent about half its
#     time in far phases, where small collectives take 2-3x as long).
set -euo pipefail
pairs=30
gate=0
while getopts "n:g" o; do
  case $o in
    n) pairs=$OPTARG ;;
    g) gate=1 ;;
    *) sed -n '2,16p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -ge 3 ] && [ "$3" = "--" ] || { sed -n '2,16p' "$0"; exit 2; }
a=$1 b=$2
shift 3
out=$(mktemp) csv=$(mktemp -u --suffix .csv)
trap 'rm -f "$out" "$csv"' EXIT
if ((gate)); then
  c2c=$(mktemp)
  trap 'rm -f "$out" "$csv" "$c2c"' EXIT
  cc -O2 -pthread -o "$c2c" "$(dirname "$0")/c2c_latency.c"
fi
run() { # label command...
  local label=$1
  shift
  if ((gate)); then
    local end=$((SECONDS + 20))
    while [ "$("$c2c")" -ge 200 ] && [ $SECONDS -lt $end ]; do sleep 0.2; done
  fi
  # Times from the CSV (the table rounds them to 0.01 us, a tenth of an 8-byte call here):
  # collective,size,count,type,redop,root,algorithm,placement,time_us,...
  rm -f "$csv"
  "$@" --csv "$csv" >/dev/null 2>&1 || true
  [ -s "$csv" ] && awk -F, -v l="$label" -v p="$pair" '
    NR > 1 { t[$2 "," $8] = $9; s[$2] = 1 }
    END { for (z in s) print p, l, z, t[z ",out-of-place"], t[z ",in-place"] }' "$csv" >>"$out"
  if ((gate)) && [ "$("$c2c")" -ge 200 ]; then echo "$pair far" >>"$out"; fi
}
for pair in $(seq "$pairs"); do
  if ((pair % 2)); then
    run A $a "$@"
    run B $b "$@"
  else
    run B $b "$@"
    run A $a "$@"
  fi
done
python3 - "$out" <<'EOF'
import collections, statistics, sys
runs = collections.defaultdict(dict)  # (size, pair) -> label -> (out of place, in place)
far = {line.split()[0] for line in open(sys.argv[1]) if line.split()[1:] == ["far"]}
for line in open(sys.argv[1]):
    if line.split()[1:] == ["far"] or line.split()[0] in far:
        continue
    pair, label, size, oop, inp = line.split()
    try:
        runs[(int(size), int(pair))][label] = (float(oop), float(inp))
    except ValueError:
        pass
def quartiles(v):
    v = sorted(v)
    return v[len(v) // 4], statistics.median(v), v[(3 * len(v)) // 4]
print("size        B/A out of place (q25 median q75)   B/A in place (q25 median q75)   A, B median us (oop)  pairs")
for size in sorted({s for s, _ in runs}):
    both = [v for (s, _), v in runs.items() if s == size and "A" in v and "B" in v]
    if not both:
        continue
    o = quartiles([v["B"][0] / v["A"][0] for v in both if v["A"][0] > 0])
    i = quartiles([v["B"][1] / v["A"][1] for v in both if v["A"][1] > 0])
    a = statistics.median(v["A"][0] for v in both)
    b = statistics.median(v["B"][0] for v in both)
    print(f"{size:<11} {o[0]:.3f} {o[1]:.3f} {o[2]:.3f}                   "
          f"{i[0]:.3f} {i[1]:.3f} {i[2]:.3f}                 {a:.4g}, {b:.4g}          {len(both)}")
EOF
