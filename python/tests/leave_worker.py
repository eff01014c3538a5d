"""One rank of a job in which rank 2 leaves (exits without destroying its group) after an
all-reduce; 4 s later (past the 2 s heartbeat period, so the others have seen it go silent)
ranks 0 and 1 exchange their first messages. Prints "rank R ok" with what arrived, or the
error.

    RANK=.. WORLD_SIZE=3 MASTER_ADDR=.. MASTER_PORT=.. leave_worker.py
"""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("oxccl", timeout=datetime.timedelta(seconds=30))
    r = dist.get_rank()
    x = torch.full((4,), float(r + 1))
    dist.all_reduce(x)
    if r == 2:
        sys.exit(0)
    time.sleep(4)
    try:
        if r == 0:
            dist.send(x + 1, 1)
        else:
            dist.recv(x, 0)
        print(f"rank {r} ok {x.tolist()}", flush=True)
    except Exception as e:  # noqa: BLE001 - reported
        print(f"rank {r} failed: {e}", flush=True)
    os._exit(0)  # rank 2 is gone: no teardown with it


if __name__ == "__main__":
    main()
