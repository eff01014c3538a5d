"""torch on oxccl with a GPU: `init_process_group("cpu:oxccl,cuda:nccl")` on 2 ranks of one GPU,
CPU tensors through oxccl's torch backend and CUDA tensors through torch's own NCCL backend,
with oxccl's libnccl.so.2 preloaded in NVIDIA's place (NVIDIA's refuses two ranks on one GPU).
Every step prints its result or its error, so one run on a lent GPU shows how far it gets.

Run from the repository root on the GPU machine, after `cargo build --release -p oxccl-ffi
-p oxccl-nccl` here (carry target/release/liboxccl.so and libnccl.so.2, or a copy of them):

    OXCCL_LIBRARY=$PWD/target/release/liboxccl.so LD_PRELOAD=$PWD/target/release/libnccl.so.2 \\
        python3 tools/nccl-tests/torch_mixed.py [WORLD]

WORLD (default 2) ranks share GPU 0. With WORLD 1 and no preload, CUDA tensors go through
NVIDIA's own NCCL (which refuses two ranks on one GPU), so the mixing itself is shown against
the real library too.

Not yet run to the end: on 2026-11-27 (torch 2.11 there) it stopped at `import torch` (libnccl
lacked NCCL 2.28+ symbols, now exported as "not implemented") and, without the preload, at our
backend's use of `split_from` (now optional); on 2026-11-28 at `init_process_group`, since torch
2.11 lets Python subclass no c10d Backend. Since 2026-11-29 oxccl's group there is a
ProcessGroup subclass that makes torch's NCCL backend on its first CUDA call (python/oxccl/
torch_backend.py, `_route_by_device`). `tools/gpu-check` runs this script (both ways) after its
checks when python3 there imports torch.
"""
import datetime
import os
import sys
import time

sys.path.insert(0, "python")
import torch, torch.distributed as dist, torch.multiprocessing as mp


def nccl_lib():
    with open("/proc/self/maps") as f:
        return sorted({l.split()[-1] for l in f if "nccl" in l.split()[-1]})


def run(rank, world):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    out = []
    def step(name, f):
        try:
            t0 = time.perf_counter()
            r = f()
            out.append((name, r, round((time.perf_counter() - t0) * 1e3, 2)))
        except Exception as e:
            out.append((name, "ERROR " + repr(e)[:400]))
    import oxccl.torch_backend as tb
    step("register", tb.register)
    step("init", lambda: dist.init_process_group("cpu:oxccl,cuda:nccl", rank=rank, world_size=world,
                                                 timeout=datetime.timedelta(seconds=30)))
    step("set_device", lambda: torch.cuda.set_device(0))
    want = float(sum(range(1, world + 1)))
    def cpu_ar():
        t = torch.full((1001,), float(rank + 1)); dist.all_reduce(t); return bool((t == want).all())
    def cuda_ar():
        g = torch.full((1 << 20,), float(rank + 1), device="cuda"); dist.all_reduce(g)
        torch.cuda.synchronize(); return bool((g == want).all().item())
    def cuda_bc():
        b = torch.arange(4096, device="cuda", dtype=torch.float32) * (rank + 1); dist.broadcast(b, src=0)
        return bool((b == torch.arange(4096, device="cuda", dtype=torch.float32)).all().item())
    def cuda_ag():
        ag = torch.empty(world * 1000, device="cuda")
        dist.all_gather_into_tensor(ag, torch.full((1000,), float(rank), device="cuda"))
        return bool((ag.view(world, 1000) == torch.arange(world, device="cuda").float()[:, None]).all().item())
    def cuda_rs():
        rs = torch.empty(1000, device="cuda")
        dist.reduce_scatter_tensor(rs, torch.ones(world * 1000, device="cuda") * (rank + 1))
        return bool((rs == want).all().item())
    def cuda_time():
        g = torch.ones(16 << 20, device="cuda")
        dist.all_reduce(g); torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(10):
            dist.all_reduce(g)
        torch.cuda.synchronize()
        return f"64 MiB all_reduce {1e3 * (time.perf_counter() - t0) / 10:.2f} ms"
    for name, f in [("cpu all_reduce (oxccl)", cpu_ar), ("cuda all_reduce", cuda_ar),
                    ("cuda broadcast", cuda_bc), ("cuda all_gather_into_tensor", cuda_ag),
                    ("cuda reduce_scatter_tensor", cuda_rs), ("cuda timing", cuda_time)]:
        step(name, f)
    step("nccl version", lambda: torch.cuda.nccl.version())
    step("libnccl loaded", nccl_lib)
    step("destroy", dist.destroy_process_group)
    for o in out:
        print(f"rank {rank}:", *o, flush=True)


if __name__ == "__main__":
    world = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    print("torch", torch.__version__, "world", world, "LD_PRELOAD", os.environ.get("LD_PRELOAD"), flush=True)
    mp.spawn(run, args=(world,), nprocs=world)
