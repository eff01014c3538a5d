#!/usr/bin/env bash
# tools/nccl-tests/run.sh: nccl-tests (NVIDIA's, built by tools/nccl-tests/build.sh into
# target/nccl-tests, its rank-to-GPU index wrapped onto the GPUs there are) against oxccl's
# libnccl.so.2. Run from the repository root on the GPU machine. Several ranks on ONE GPU: one
# process, one thread per rank ("coll:N" = -t N -g 1), or one thread driving N ranks through
# groups ("coll:gN" = -t 1 -g N). Every run is bounded by `timeout`, and the whole script by a
# time budget (BUDGET_S, default 140 s): runs that would start after it are skipped.
# Exit status: 0 when every run passed (nccl-tests fails a run with a wrong result).
set -u
D=target/nccl-tests
export LD_LIBRARY_PATH="$PWD/$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# -c 1: check results (#wrong column); -T: in-test timeout (s). MINBYTES, MAXBYTES and FACTOR
# change the sizes (default 8 B to 64 MiB, by 8).
ARGS=(-b "${MINBYTES:-8}" -e "${MAXBYTES:-64M}" -f "${FACTOR:-8}" -c 1 -w 2 -n 5 -T 40)
PER_RUN_S="${PER_RUN_S:-60}"
BUDGET_S="${BUDGET_S:-140}"
# order: required tests with 2 ranks first, then 4 ranks, then the optional ones
PLAN="${NCCL_TESTS_PLAN:-all_reduce:2 all_gather:2 reduce_scatter:2 all_reduce:4 all_gather:4 reduce_scatter:4 broadcast:2 alltoall:2 broadcast:4 alltoall:4 all_reduce:g2 alltoall:g4}"
LOG=/dev/null
if [ -n "${OUT:-}" ]; then mkdir -p "$OUT"; LOG="$OUT/nccl-tests.log"; : > "$LOG"; fi

main() {
  echo "== nccl-tests on oxccl: $(date -u +%FT%TZ) host=$(hostname)"
  timeout 10 nvidia-smi -L 2>&1 | head -4
  ldd "$D/all_reduce_perf" 2>&1 | grep -E 'nccl|cuda|verifiable|not found'
  local fails=0 runs=0 item t n rc left lim
  for item in $PLAN; do
    t="${item%%:*}"; n="${item##*:}"; shape=(-t "$n" -g 1)
    case "$n" in g*) n="${n#g}"; shape=(-t 1 -g "$n") ;; esac
    left=$((BUDGET_S - SECONDS))
    if [ "$left" -lt 10 ]; then echo "== skip ${t}_perf ranks=$n (time budget spent)"; continue; fi
    [ -x "$D/${t}_perf" ] || { echo "== skip ${t}_perf (missing)"; continue; }
    lim=$PER_RUN_S; [ "$left" -lt "$lim" ] && lim=$left
    echo "== ${t}_perf ranks=$n: ${shape[*]} ${ARGS[*]} (timeout ${lim}s)"
    timeout -k 5 "$lim" "$D/${t}_perf" "${shape[@]}" "${ARGS[@]}" 2>&1
    rc=$?
    runs=$((runs+1))
    echo "== ${t}_perf ranks=$n exit=$rc$( [ $rc = 124 ] || [ $rc = 137 ] && echo ' (TIMEOUT)') elapsed=${SECONDS}s"
    [ $rc = 0 ] || fails=$((fails+1))
  done
  echo "== done: $runs run(s), $fails failing, ${SECONDS}s"
  [ "$fails" = 0 ]
}
main 2>&1 | tee -a "$LOG"
exit "${PIPESTATUS[0]}"
