#!/bin/sh
# Runs inside the Soft-RoCE VM: where the rdma all-reduce's gap to ib_write_bw comes from.
# Per round: ib_write_bw both ways at once (16 MiB and 1 MiB; its figure is the sum of the two
# directions), then 2-rank all-reduce and all-gather over rdma with slices of 256 KiB, 1 MiB and
# 4 MiB (OXCCL_SLICE_BYTES). Prints "XPERF <what> <bytes> ... <MB/s per direction>" lines
# (all-reduce: bus bandwidth; all-gather: half the bytes over the time).
# From the host, after `cargo build -p allreduce-perf`:
#   WORK=~/.cache/oxccl/rxe-vm tools/rxe-vm/run-rxe-vm.sh --no-install --test extra --hostroot \
#     --cmd "sh $PWD/tools/rxe-vm/slices.sh $PWD $PWD/target/debug/allreduce-perf [ROUNDS]"
repo=$1; perf=$2; rounds=${3:-2}
cd "$repo" || exit 1
export OXCCL_REQUIRE_RDMA=1
TMPDIR=${TMPDIR:-/run/tmp}
bw() {
  size=$1; n=$2
  timeout 120 ib_write_bw -d rxe0 -x 1 -F -b -s "$size" -n "$n" > "$TMPDIR/bw.s" 2>&1 & p=$!
  sleep 1
  timeout 120 ib_write_bw -d rxe0 -x 1 -F -b -s "$size" -n "$n" 127.0.0.1 > "$TMPDIR/bw.c" 2>&1
  wait $p
  awk -v s="$size" '$1==s && NF>=4 {v=$4} END {printf "XPERF ib_write_bw-b %s %.1f\n", s, v/2}' "$TMPDIR/bw.c"
}
run() {
  name=$1; shift
  timeout 300 env "$@" > "$TMPDIR/ar" 2>&1 || { tail -5 "$TMPDIR/ar"; echo "XFAIL $name"; }
  awk -v n="$name" '$1 ~ /^[0-9]+$/ && NF >= 9 {printf "XPERF %s %s %.1f\n", n, $1, (n ~ /^allgather/ ? $1/2/$6 : $1/$6)}' "$TMPDIR/ar"
}
r=0
while [ $r -lt "$rounds" ]; do
  r=$((r + 1))
  bw 16777216 8
  bw 1048576 30
  for s in 262144 1048576 4194304; do
    run allreduce-slice$s OXCCL_SLICE_BYTES=$s "$perf" --ranks 2 -b 1M -e 16M -f 16 -w 1 -n 3 -c 0 --transport rdma
    run allgather-slice$s OXCCL_SLICE_BYTES=$s "$perf" --ranks 2 -b 16M -e 16M -w 1 -n 3 -c 0 --transport rdma -o allgather
  done
done
