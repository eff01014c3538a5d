"""torch.distributed's send/recv on oxccl against Gloo, in the same run on the same 2 ranks.

    torchrun --nproc-per-node 2 python/benchmarks/bench_p2p.py

Per size (float32 tensors of 8 B, 64 KiB, 1 MiB), on rank 0, the median of 5 timed batches:

- one way: a ping-pong of blocking ``dist.send`` / ``dist.recv`` (rank 0 sends then receives,
  rank 1 the reverse), half the round trip;
- exchange: both ranks ``isend`` to each other, then ``irecv``, then wait for both (the order
  torch's tutorials write; on oxccl before 2026-12-05 it failed with "does not match").

Gloo is the default group (init_process_group("cpu:gloo")); oxccl is a group over the same
ranks (new_group(backend="oxccl")), alternately per row. Rank 0 prints a Markdown table, and
before it the time of the first 8-byte exchange on a fresh group of each backend (on oxccl it
makes the two ranks' point-to-point communicator; Gloo connects its pairs when the group is
made), the median of 3 fresh groups.
"""

import statistics
import time

import torch
import torch.distributed as dist

SIZES = [(8, "8 B"), (64 << 10, "64 KiB"), (1 << 20, "1 MiB")]
BATCHES = 5


def one_way(x, y, peer, me, group, iters):
    for _ in range(iters):
        if me == 0:
            dist.send(x, group_dst=peer, group=group)
            dist.recv(y, group_src=peer, group=group)
        else:
            dist.recv(y, group_src=peer, group=group)
            dist.send(x, group_dst=peer, group=group)


def exchange(x, y, peer, _me, group, iters):
    for _ in range(iters):
        s = dist.isend(x, group_dst=peer, group=group)
        r = dist.irecv(y, group_src=peer, group=group)
        s.wait()
        r.wait()


def timed(fn, x, y, peer, me, group, iters, per):
    fn(x, y, peer, me, group, max(3, iters // 10))
    times = []
    for _ in range(BATCHES):
        dist.barrier(group=group)
        start = time.perf_counter()
        fn(x, y, peer, me, group, iters)
        times.append((time.perf_counter() - start) / iters / per)
    return statistics.median(times)


def main():
    dist.init_process_group("cpu:gloo")
    me, world = dist.get_rank(), dist.get_world_size()
    if world != 2:
        raise SystemExit("bench_p2p.py runs on 2 ranks")
    gloo = dist.group.WORLD
    first = {}
    for backend in ("gloo", "oxccl"):
        times = []
        for _ in range(3):
            g = dist.new_group(backend=backend)
            dist.barrier(group=gloo)
            start = time.perf_counter()
            exchange(torch.ones(2), torch.zeros(2), 1 - me, me, g, 1)
            times.append(time.perf_counter() - start)
            dist.destroy_process_group(g)
        first[backend] = statistics.median(times) * 1e6
    ox = dist.new_group(backend="oxccl")
    rows = []
    for nbytes, label in SIZES:
        x, y = torch.ones(nbytes // 4), torch.zeros(nbytes // 4)
        iters = 2000 if nbytes <= 64 << 10 else 300
        row = [label]
        for fn, per in ((one_way, 2), (exchange, 1)):
            for group in (gloo, ox):
                row.append(timed(fn, x, y, 1 - me, me, group, iters, per) * 1e6)
        rows.append(row)
    if me == 0:
        print(f"first 8-byte exchange on a fresh group: Gloo {first['gloo']:.0f} µs, "
              f"oxccl {first['oxccl']:.0f} µs")
        print("| size | one way, Gloo | one way, oxccl | Gloo / oxccl | exchange, Gloo "
              "| exchange, oxccl | Gloo / oxccl |")
        print("|---|---|---|---|---|---|---|")
        for label, og, oo, eg, eo in rows:
            print(f"| {label} | {og:.1f} µs | {oo:.1f} µs | {og / oo:.1f}× | {eg:.1f} µs "
                  f"| {eo:.1f} µs | {eg / eo:.1f}× |")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
