"""One rank of a small DDP (and FSDP2, pipeline- and tensor-parallel) training run, launched by torchrun. It does not import
oxccl: ``init_process_group(BACKEND)`` finds the backend through the installed package's
entry point. Rank 0 saves the final parameters and buffers of every variant to OUT (a
torch.save'd dict) for test_ddp.py to compare across backends.

    torchrun --nproc-per-node N ddp_worker.py BACKEND OUT [--fsdp]
"""

import argparse
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 20


class WithBuffer(nn.Module):
    """An MLP with a buffer that forward changes (DDP broadcasts buffers every forward)."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
        self.register_buffer("seen", torch.zeros(16))

    def forward(self, x):
        self.seen += x.detach().mean(0)
        return self.net(x + 0.01 * self.seen)


class WithUnused(nn.Module):
    """A model with a layer that forward never uses (find_unused_parameters=True)."""

    def __init__(self):
        super().__init__()
        self.used = nn.Linear(16, 8)
        self.unused = nn.Linear(16, 8)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(torch.tanh(self.used(x)))


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)


def exact_gradients(model):
    """Rounds every gradient to a multiple of 1/64 below 1 in magnitude, before DDP sees it.
    DDP then divides by the world size (4: exact) and sums four such values, which is exact in
    float32 and, with the fp16 hook, in float16 (|sum| < 1 on a grid of 2^-8): the order of
    reduction cannot change a bit, so any two libraries must agree exactly."""
    for p in model.parameters():
        p.register_hook(lambda g: (g * 64).round().clamp(-63, 63) / 64)


def train_ddp(model_cls, hook, rank, exact=False):
    torch.manual_seed(0)  # the same initial parameters everywhere (DDP broadcasts them anyway)
    model = model_cls()
    if exact:
        exact_gradients(model)
    ddp = DDP(model, find_unused_parameters=model_cls is WithUnused)
    if hook == "powersgd":
        # Its callbacks start all-reduces and wait for them (oxccl's group hung on that).
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

        state = powerSGD_hook.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=1,
            start_powerSGD_iter=2,
            min_compression_rate=0.5,
        )
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    elif hook:
        ddp.register_comm_hook(dist.group.WORLD, default_hooks.fp16_compress_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    for step in range(STEPS):
        x, y = batch(rank, step)
        opt.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def train_fsdp(rank):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(STEPS):
        x, y = batch(rank, step)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return {k: v.full_tensor().detach().clone() for k, v in model.state_dict().items()}


def train_pipeline(rank, world):
    """Pipeline parallelism (torch.distributed.pipelining): four linear layers split evenly
    into one stage per rank, trained with the 1F1B schedule over 4 microbatches, whose
    activations and gradients travel by batch_isend_irecv while the stages compute. Rank 0
    feeds the batch (a different one per world size), the last rank computes the loss. Every
    rank's layers come back (all_gather_object), keyed by their index in the whole model. No
    sum crosses ranks, so any two libraries must agree bit for bit at any world size."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    torch.manual_seed(0)
    layers = [nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 4)]
    per = len(layers) // world
    first = rank * per
    mine = nn.Sequential(*layers[first : first + per])
    stage = PipelineStage(mine, rank, world, torch.device("cpu"))
    schedule = Schedule1F1B(stage, n_microbatches=4, loss_fn=nn.functional.mse_loss)
    opt = torch.optim.SGD(mine.parameters(), lr=0.05)
    for step in range(STEPS):
        x, y = batch(world, step)
        opt.zero_grad()
        if rank == 0:
            schedule.step(x)
        elif rank == world - 1:
            schedule.step(target=y)
        else:
            schedule.step()
        opt.step()
    state = {}
    for k, v in mine.state_dict().items():
        index, name = k.split(".", 1)
        state[f"layer{first + int(index)}.{name}"] = v.detach().clone()
    every = [None] * world
    dist.all_gather_object(every, state)
    return {k: v for part in every for k, v in part.items()}


def train_tensor_parallel(rank, world):
    """Tensor parallelism (DTensor's parallelize_module on a CPU DeviceMesh): an MLP whose
    first layer is split by columns and second by rows (Megatron's split: one all-reduce of
    the partial outputs forward, its mirror backward), 20 SGD steps on the same batches on
    every rank; the full parameters come back."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(STEPS):
        x, y = batch(world, step)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return {k: v.full_tensor().detach().clone() for k, v in model.state_dict().items()}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("backend")
    p.add_argument("out")
    p.add_argument("--fsdp", action="store_true")
    a = p.parse_args()
    dist.init_process_group(a.backend, timeout=datetime.timedelta(seconds=120))
    rank = dist.get_rank()
    results = {}
    for model_cls in (WithBuffer, WithUnused):
        for hook in (False, True):
            for exact in (False, True):
                name = f"ddp/{model_cls.__name__}/hook={hook}" + ("/exact" if exact else "")
                results[name] = train_ddp(model_cls, hook, rank, exact)
    results["ddp/WithBuffer/powersgd"] = train_ddp(WithBuffer, "powersgd", rank)
    if a.fsdp:
        results["fsdp2"] = train_fsdp(rank)
    results["pipeline/1f1b/exact"] = train_pipeline(rank, dist.get_world_size())
    results["tensor-parallel"] = train_tensor_parallel(rank, dist.get_world_size())
    if rank == 0:
        torch.save(results, a.out)
    dist.barrier()
    if a.backend == "gloo":
        # The reference's results are saved: Gloo's teardown after DTensor's collectives
        # aborts now and then ("terminate called without an active exception", one run in
        # two or three of tensor_parallel alone, 2026-12-05), which is not what is tested.
        os._exit(0)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
