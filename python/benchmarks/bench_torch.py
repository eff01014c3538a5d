"""torch.distributed on oxccl against Gloo, in the same run on the same ranks.

    torchrun --nproc-per-node 2 python/benchmarks/bench_torch.py [--iters-scale 1.0] [--json F]

1. ``dist.all_reduce`` (float32, sum, sync; in place, as torch always calls it) at 8 B, 64 KiB,
   1 MiB and 64 MiB: the median of several timed batches of back-to-back calls, per call, on
   rank 0 (a barrier starts each batch). Bus bandwidth is nccl-tests' all-reduce formula, 2 (n-1)/n * bytes / time.
2. The step time of DistributedDataParallel on an MLP of about 25 M parameters (forward,
   backward with the gradient all-reduce, SGD step), median over steps after warm-up.

Gloo is the default group (init_process_group("cpu:gloo")); oxccl is a group over the same
ranks (new_group(backend="oxccl")), so both run in the same processes, alternately per row.
Rank 0 prints a Markdown table.
"""

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

SIZES = [(8, "8 B"), (64 << 10, "64 KiB"), (1 << 20, "1 MiB"), (64 << 20, "64 MiB")]


def time_all_reduce(t, group, iters, batches):
    for _ in range(max(3, iters // 10)):
        dist.all_reduce(t, group=group)
    per_call = []
    for _ in range(batches):
        dist.barrier(group=group)
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t, group=group)
        per_call.append((time.perf_counter() - start) / iters)
    return statistics.median(per_call)


def model_25m():
    return nn.Sequential(nn.Linear(2048, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                         nn.Linear(4096, 64))


def ddp_step_time(group, steps, warmup):
    torch.manual_seed(0)
    model = DDP(model_25m(), process_group=group)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 2048), torch.randn(32, 64)
    times = []
    for i in range(warmup + steps):
        dist.barrier(group=group)
        start = time.perf_counter()
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times), sum(p.numel() for p in model.parameters())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--iters-scale", type=float, default=1.0)
    p.add_argument("--ddp-steps", type=int, default=10)
    p.add_argument("--json")
    a = p.parse_args()
    dist.init_process_group("cpu:gloo")
    ox = dist.new_group(backend="oxccl")
    gloo = dist.group.WORLD
    n, rank = dist.get_world_size(), dist.get_rank()
    rows = []
    for nbytes, label in SIZES:
        t = torch.ones(nbytes // 4)
        iters = max(2, int((2000 if nbytes <= 1 << 16 else 200 if nbytes <= 1 << 20 else 6) * a.iters_scale))
        batches = 5
        row = {"size": label, "bytes": nbytes}
        for name, g in (("gloo", gloo), ("oxccl", ox)):
            s = time_all_reduce(t, g, iters, batches)
            row[name + "_us"] = s * 1e6
            row[name + "_busbw"] = 2 * (n - 1) / n * nbytes / s / 1e9
        rows.append(row)
    ddp = {}
    for name, g in (("gloo", gloo), ("oxccl", ox)):
        ddp[name], params = ddp_step_time(g, a.ddp_steps, 3)
    if rank == 0:
        print(f"torch {torch.__version__}, {n} ranks, dist.all_reduce float32 sum (sync, in place):\n")
        print("| size | Gloo µs | oxccl µs | Gloo GB/s | oxccl GB/s | oxccl speed-up |")
        print("|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            print(f"| {r['size']} | {r['gloo_us']:.1f} | {r['oxccl_us']:.1f} | "
                  f"{r['gloo_busbw']:.2f} | {r['oxccl_busbw']:.2f} | "
                  f"{r['gloo_us'] / r['oxccl_us']:.1f}× |")
        print(f"\nDDP step, MLP of {params / 1e6:.1f} M parameters, batch 32 (median of "
              f"{a.ddp_steps} steps):\n")
        print("| Gloo ms | oxccl ms | oxccl speed-up |")
        print("|---:|---:|---:|")
        print(f"| {ddp['gloo'] * 1e3:.0f} | {ddp['oxccl'] * 1e3:.0f} | "
              f"{ddp['gloo'] / ddp['oxccl']:.2f}× |")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"world": n, "torch": torch.__version__, "all_reduce": rows,
                           "ddp_step_s": ddp, "ddp_params": params}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
