#!/bin/sh
# Runs inside the Soft-RoCE VM, chrooted into the host's / (read-only): the RDMA test binaries
# built on the host, then the performance rows (ib_write_bw against allreduce-perf over rdma and
# over tcp, 2 ranks). Prints "RESULT <name> PASS|FAIL(...)" lines that run-rxe-vm.sh and
# tools/rxe-vm/ci.sh check, and "PERF ..." lines that ci.sh turns into the table.
# Usage: in-vm.sh REPO ALLREDUCE_PERF TEST_BINARY...
repo=$1; perf=$2; shift 2
cd "$repo" || exit 1
export OXCCL_REQUIRE_RDMA=1 RUST_BACKTRACE=1
# The host built the rank programs just before (ci.sh); the tests must not try to rebuild them
# on this read-only view of its disk.
export OXCCL_EXAMPLES_CURRENT=1
TMPDIR=${TMPDIR:-/run/tmp}
# "TIME <what> <seconds>": where the step's minutes go (its budget is five).
now() { cut -d' ' -f1 /proc/uptime; }
took() { awk -v s="$1" -v e="$(now)" 'BEGIN{printf "%.1f", e-s}'; }
for t in "$@"; do
  name=$(basename "$t" | sed 's/-[0-9a-f]*$//')
  start=$(cut -d' ' -f1 /proc/uptime)
  timeout 300 "$t" --test-threads 1 --nocapture 2>&1
  rc=$?
  took=$(awk -v s="$start" -v e="$(cut -d' ' -f1 /proc/uptime)" 'BEGIN{printf "%.1f", e-s}')
  if [ $rc = 0 ]; then echo "RESULT rdma-test-$name PASS ($took s)"; else echo "RESULT rdma-test-$name FAIL(rc=$rc, $took s)"; fi
done

# ib_write_bw: one RC QP, RDMA WRITE of SIZE bytes, N times, on rxe0 to itself; with -b both
# ways at once (its figure is the sum of the two directions).
bw() {
  size=$1; n=$2; shift 2
  t0=$(now)
  timeout 120 ib_write_bw -d rxe0 -x 1 -F "$@" -s "$size" -n "$n" > $TMPDIR/bw.s 2>&1 & p=$!
  sleep 1
  timeout 120 ib_write_bw -d rxe0 -x 1 -F "$@" -s "$size" -n "$n" 127.0.0.1 > $TMPDIR/bw.c 2>&1; c=$?
  wait $p
  # The result row: bytes, iterations, peak MB/s, average MB/s, msg rate.
  mbs=$(awk -v s="$size" '$1==s && NF>=4 {print $4}' $TMPDIR/bw.c | tail -1)
  if [ $c = 0 ] && [ -n "$mbs" ]; then
    echo "PERF ib_write_bw$* $size $mbs"
  else
    cat $TMPDIR/bw.c; echo "RESULT ib_write_bw$*-$size FAIL(rc=$c)"
  fi
  echo "TIME ib_write_bw$* $size $(took "$t0")"
}
# allreduce-perf, 2 ranks, 1 MiB and 16 MiB, out-of-place bus bandwidth (MB/s; 2 ranks: bus
# bandwidth = size / time) over TRANSPORT, with more flags after it (--register).
ar() {
  tr=$1; shift
  name=allreduce-$tr$(echo "$*" | tr -d ' -')
  t0=$(now)
  timeout 300 "$perf" --ranks 2 -b 1M -e 16M -f 16 -w 1 -n 3 --transport "$tr" "$@" > $TMPDIR/ar 2>&1
  rc=$?
  cat $TMPDIR/ar
  if [ $rc = 0 ]; then
    # Rows: size count type redop root time(us) algbw busbw #wrong ...
    awk -v n="$name" '$1 ~ /^[0-9]+$/ && NF >= 9 {printf "PERF %s %s %.1f\n", n, $1, $1 / $6}' $TMPDIR/ar
  else
    echo "RESULT $name FAIL(rc=$rc)"
  fi
  echo "TIME $name $(took "$t0")"
}
# Three rounds, each measuring everything once, so that the emulated device's swings (its
# speed changes from minute to minute) fall on every column alike; ci.sh takes the medians.
# The step's budget is five minutes: each round takes about a minute (an ib_write_bw of 8 x 16
# MiB 11-14 s, of which moving the bytes is 5-10 at this device's 13-27 MB/s; an all-reduce run
# over rdma 15-18 s), so only the fair ceiling (both ways at once) is measured, 8 x 16 MiB and
# 30 x 1 MiB, and the all-reduce runs 3 timed calls of each size.
for run in 1 2 3; do
  bw 1048576 30 -b
  bw 16777216 8 -b
  ar rdma
  ar rdma --register
  ar tcp
done

# The tuner prices rdma links once a calibration measured them.
t0=$(now)
OXCCL_TUNE_FILE=$TMPDIR/costs.txt timeout 300 "$perf" --ranks 2 --calibrate --transport rdma \
  -b 8 -e 8 -w 1 -n 5 > $TMPDIR/cal 2>&1
rc=$?
if [ $rc = 0 ] && grep -q '^link rdma alpha=' $TMPDIR/costs.txt; then
  echo "CALIBRATED $(grep '^link rdma' $TMPDIR/costs.txt)"
  echo "RESULT calibrate-rdma PASS"
else
  cat $TMPDIR/cal $TMPDIR/costs.txt; echo "RESULT calibrate-rdma FAIL(rc=$rc)"
fi
echo "TIME calibrate-rdma $(took "$t0")"
