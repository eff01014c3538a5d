"""DDP on oxccl, the way a user writes it: no `import oxccl` (the installed package registers
the backend).

    pip install ./python
    torchrun --nproc-per-node 2 python/examples/ddp_train.py
"""

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("oxccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(rank)
    for step in range(50):
        x = torch.randn(16, 32, generator=data)
        y = x.sum(1, keepdim=True)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if step % 10 == 0 or step == 49:
            avg = loss.detach().clone()
            dist.all_reduce(avg, op=dist.ReduceOp.AVG)
            if rank == 0:
                print(f"step {step:2d}  loss (mean over {world} ranks) {avg.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
