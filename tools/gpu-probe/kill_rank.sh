#!/usr/bin/env bash
# A rank process killed in the middle of all-reduces on device memory (2 processes on GPU 0,
# 64 MiB each): the surviving rank must fail within seconds, naming the dead one, and the GPU
# must stay usable (a checked all-reduce right after passes). Prints what happened.
#   tools/gpu-probe/kill_rank.sh [ALLREDUCE_PERF]   (default: target/gpu-check/allreduce-perf)
set -u
P="${1:-target/gpu-check/allreduce-perf}"
log="${OUT:-/tmp}/kill-rank.log"
"$P" --device cuda --ranks 2 -b 64M -e 64M -w 2 -n 100000 -c 0 >"$log" 2>&1 &
job=$!
sleep 5
victim=$(pgrep -n -f "$P --device cuda --ranks 2 -b 64M")
if [ -z "$victim" ] || [ "$victim" = "$job" ]; then
  echo "kill-rank: no rank process found"; kill -9 "$job"; exit 1
fi
t0=$(date +%s%N)
kill -9 "$victim"
timeout 60 tail --pid="$job" -f /dev/null
wait "$job"
rc=$?
t1=$(date +%s%N)
echo "kill-rank: killed rank process $victim; the job exited $rc $(( (t1 - t0) / 1000000 )) ms later"
grep -E 'rror|rank' "$log" | tail -5
echo "kill-rank: the GPU afterwards:"
timeout 60 "$P" --device cuda --ranks 2 -b 1M -e 1M -w 1 -n 5 -c 1 | grep -E 'Out of bounds|rror'
