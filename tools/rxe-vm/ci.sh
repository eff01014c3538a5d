#!/usr/bin/env bash
# CI's RDMA step: builds the RDMA tests on the host (the dev profile, as `cargo test` builds
# them), boots the Soft-RoCE VM (run-rxe-vm.sh, a copy of ../shared/tools/rxe-vm's) and runs
# them there through in-vm.sh, then prints the performance table from the same run. Exits
# non-zero if any test or measurement failed or the VM did not finish.
# Env: RXE_VM_WORK (the VM's kernel and initramfs; default ~/.cache/oxccl/rxe-vm).
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
export WORK=${RXE_VM_WORK:-$HOME/.cache/oxccl/rxe-vm}
mkdir -p "$(dirname "$WORK")"

# The test executables, the rank programs they start (selftest, fault_worker) and the
# benchmark, as `cargo test --workspace` builds them: nothing to build after CI's tests (`-p`
# unifies features differently and built the library again, minutes of CI). The VM sees the
# host read-only, so they must be current before it boots (a failed build stops here).
cargo test -q --workspace --no-run
mapfile -t exes < <(cargo test --workspace --no-run --message-format=json | python3 -c '
import json, sys
found = {}
for line in sys.stdin:
    m = json.loads(line)
    t = m.get("target", {})
    if m.get("reason") == "compiler-artifact" and m.get("executable") and t.get("kind") == ["test"]:
        found[t["name"]] = m["executable"]
for name in ("rxe", "rdma"):
    print(found.get(name, "no test executable for tests/" + name + ".rs"))
')
for exe in "${exes[@]}"; do
  [ -x "$exe" ] || { echo "$exe"; exit 1; }
done
for exe in target/debug/examples/selftest target/debug/examples/fault_worker target/debug/allreduce-perf; do
  [ -x "$exe" ] || { echo "cargo test --workspace --no-run did not build $exe"; exit 1; }
done

install=()
if command -v qemu-system-x86_64 >/dev/null && command -v ib_write_bw >/dev/null \
  && [ -e /etc/libibverbs.d/rxe.driver ] && command -v busybox >/dev/null; then
  install=(--no-install)
fi
set +e
tools/rxe-vm/run-rxe-vm.sh "${install[@]}" --test extra --hostroot \
  --cmd "sh $repo/tools/rxe-vm/in-vm.sh $repo $repo/target/debug/allreduce-perf ${exes[*]}" \
  > "$WORK.log" 2>&1
rc=$?
set -e
grep -a -E '^(test |RESULT|PERF|TIME|CALIBRATED|rank [0-9]+ (of|noticed)|RDMA selftest|HOST:|skipped)' "$WORK.log" || true
if [ $rc -ne 0 ]; then
  echo "RDMA step failed (run-rxe-vm.sh exit $rc); the VM's console is in $WORK.log; its last lines:"
  tail -60 "$WORK.log"
  exit 1
fi

# The table: ib_write_bw both ways at once (per direction; the all-reduce sends and receives
# the vector at once, so this is its ceiling) against the 2-rank all-reduce's bus bandwidth,
# MB/s; each figure the median of the three rounds. A measurement that failed fails the step.
if grep -a -q '^RESULT .*FAIL' "$WORK.log"; then
  echo "RDMA step failed: a measurement failed"
  exit 1
fi
awk '
  function median(list,    v, n, i, j, t) {
    n = split(list, v, " ")
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (v[j] + 0 < v[i] + 0) { t = v[i]; v[i] = v[j]; v[j] = t }
    return n ? v[int((n + 1) / 2)] : 0
  }
  /^PERF ib_write_bw-b / { bi[$3] = bi[$3] " " $4 / 2; next }
  /^PERF allreduce-rdma / { rd[$3] = rd[$3] " " $4 }
  /^PERF allreduce-rdmaregister / { rg[$3] = rg[$3] " " $4 }
  /^PERF allreduce-tcp / { tc[$3] = tc[$3] " " $4 }
  function r(a, b) { return (b > 0) ? sprintf("%.2f", a / b) : "-" }
  END {
    print "| size | ib_write_bw -b, per direction | oxccl rdma | oxccl rdma, registered | oxccl tcp | rdma / per direction | registered / per direction | rdma / tcp |"
    print "|---|---|---|---|---|---|---|---|"
    n = split("1048576 16777216", s, " ")
    for (i = 1; i <= n; i++) {
      k = s[i]; b = median(bi[k]); d = median(rd[k]); g = median(rg[k]); t = median(tc[k])
      printf "| %d MiB | %.1f MB/s | %.1f MB/s | %.1f MB/s | %.1f MB/s | %s | %s | %s |\n", k / 1048576, b, d, g, t, r(d, b), r(g, b), r(d, t)
    }
    print "(oxccl: 2-rank all-reduce bus bandwidth, out of place; every figure the median of three rounds, each round measuring every column once)"
  }' "$WORK.log"
