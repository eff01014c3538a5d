"""One rank of a training loop in which rank VICTIM dies (SIGKILL) at step 20. The others
must raise from their collective within seconds; each survivor prints one JSON line with
how long after the death it raised and the error's text, then tears down. With MODE "p2p"
the survivors' step 20 is a receive from the victim instead, their first message with it
(so the pair's communicator is still being made when the victim dies). VICTIM may list
several ranks ("2,1"): they die in that order, 2 s apart, and the survivors receive from the
last (the deaths are timed from it).

    RANK=.. WORLD_SIZE=.. MASTER_ADDR=.. MASTER_PORT=.. failure_worker.py DEATH_FILE VICTIM [MODE]
"""

import datetime
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist


def main():
    death_file = sys.argv[1]
    victims = [int(v) for v in sys.argv[2].split(",")]
    victim = victims[-1]
    p2p = len(sys.argv) > 3 and sys.argv[3] == "p2p"
    dist.init_process_group("oxccl", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    grad = torch.ones(256 * 1024)
    for step in range(10_000):
        if rank in victims and step == 20:
            time.sleep(2.0 * victims.index(rank))
            with open(death_file + ".tmp", "w") as f:
                f.write(repr(time.time()))
            os.rename(death_file + ".tmp", death_file)
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            if p2p and step == 20:
                dist.recv(grad, src=victim)
            else:
                dist.all_reduce(grad)
        except Exception as e:  # noqa: BLE001 - what we are here to see
            raised = time.time()
            died = float(open(death_file).read()) if os.path.exists(death_file) else None
            print(json.dumps({"rank": rank, "step": step, "type": type(e).__name__,
                              "message": str(e), "after": None if died is None else raised - died}),
                  flush=True)
            t0 = time.time()
            dist.destroy_process_group()
            print(json.dumps({"rank": rank, "destroyed_in": time.time() - t0}), flush=True)
            return
        grad.fill_(1.0)
    print(json.dumps({"rank": rank, "error": "no failure seen"}), flush=True)
    sys.exit(1)


if __name__ == "__main__":
    main()
