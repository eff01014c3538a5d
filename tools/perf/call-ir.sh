#!/usr/bin/env bash
# Instructions per call of one rank, counted by callgrind: a figure that does not depend on
# the VM's speed of the moment, for changes to the call path of small collectives (which
# timings on the 2-core VM swing by ±30% from one minute to the next).
#
# Runs 2 ranks under oxrun: rank RANK under `valgrind --tool=callgrind`, the other natively.
# The rank under valgrind runs some 50x slower than its peer, so it never waits for it and
# its count has no spinning in it (the spin loop's count is printed as a check).
#
# usage: tools/perf/call-ir.sh [-r RANK=0] [-n CALLS=20000] ALLREDUCE_PERF OP [BYTES=8]
#   e.g. tools/perf/call-ir.sh target/release/allreduce-perf broadcast
#        tools/perf/call-ir.sh -r 1 target/release/allreduce-perf reduce   # a rank that reads nothing
# Prints the instructions per call inside the benchmark's call (Bench::call: argument checks,
# the routing decision, the flight recorder, the area's protocol) and inside the library's
# run_decided (the same without the benchmark's own dispatch and argument checks).
# Needs valgrind (apt-get install valgrind) and a release build of oxrun.
# CALL_IR_KEEP=DIR keeps callgrind's output there (callgrind_annotate DIR/out.* for the split).
set -euo pipefail
rank=0 calls=20000
while getopts "r:n:" o; do
  case $o in
    r) rank=$OPTARG ;;
    n) calls=$OPTARG ;;
    *) sed -n '2,17p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -ge 2 ] || { sed -n '2,17p' "$0"; exit 2; }
arp=$(realpath "$1") op=$2 bytes=${3:-8}
cd "$(dirname "$0")/../.."
command -v valgrind >/dev/null || { echo "valgrind not found" >&2; exit 2; }
oxrun=target/release/oxrun
[ -x "$oxrun" ] || cargo build --release -q -p oxrun
dir=$(mktemp -d)
trap '[ -n "${CALL_IR_KEEP:-}" ] && cp "$dir"/out.* "$CALL_IR_KEEP"/ ; rm -rf "$dir"' EXIT
warm=100
args="-o $op -b $bytes -e $bytes -n $calls -w $warm -R 1 -c 0"
cat >"$dir/rank.sh" <<EOF
#!/bin/sh
if [ "\$OXCCL_RANK" = "$rank" ]; then
  exec valgrind --tool=callgrind --callgrind-out-file=$dir/out.%p $arp $args
fi
exec $arp $args
EOF
chmod +x "$dir/rank.sh"
OXCCL_TIMEOUT=600 timeout 900 "$oxrun" -n 2 "$dir/rank.sh" >"$dir/log" 2>&1 || {
  tail -20 "$dir/log" >&2
  exit 1
}
out=$(ls "$dir"/out.* | head -1)
# Both placements, each with its warm-up calls.
n=$((2 * (calls + warm)))
callgrind_annotate --inclusive=yes "$out" 2>/dev/null | awk -v n="$n" '
  /Bench::call \[/ { gsub(",", "", $1); call = $1 }
  /Communicator::run_decided \[/ { gsub(",", "", $1); run = $1 }
  END { printf "%s per call: benchmark call %.0f, run_decided %.0f instructions\n", "'"$op $bytes B rank $rank"'", call / n, run / n }'
spin=$(callgrind_annotate --auto=yes "$out" 2>/dev/null | grep 'is_multiple_of(self.pace.every)' | awk '{gsub(",", "", $1); s += $1} END {print s + 0}')
echo "spin loop: $spin instructions in all (should be far below the calls)"
