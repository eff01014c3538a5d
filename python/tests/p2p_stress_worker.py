"""One rank of random point-to-point traffic mixed with all-reduces, launched by torchrun, for
test_p2p_stress.py.

    torchrun --nproc-per-node N p2p_stress_worker.py ROUNDS BACKEND

Per round every rank draws the same plan from the round's seed: up to 8 messages between
random pairs of ranks, of 0 to 300,000 float32 elements, and where among them the all-reduce
comes and whether it is async. Each rank starts its own sends and receives (isend / irecv)
interleaved at random across peers (in plan order per peer and direction), the all-reduce at
its place, then waits for them in random order, and checks every received element and the
all-reduce's result. Every 25 rounds the group is destroyed and made anew, so pairs'
communicators are made (and torn down) again and again, by ranks that reach them in different
orders. Rank 0 prints "ok ROUNDS" at the end; any wrong byte raises.
"""

import datetime
import random
import sys

import torch
import torch.distributed as dist


def main():
    rounds, backend = int(sys.argv[1]), sys.argv[2]
    timeout = datetime.timedelta(seconds=60)
    dist.init_process_group("gloo", timeout=timeout)
    r, n = dist.get_rank(), dist.get_world_size()
    g = dist.new_group(backend=backend, timeout=timeout)
    for rnd in range(rounds):
        if rnd % 25 == 24:
            dist.destroy_process_group(g)
            g = dist.new_group(backend=backend, timeout=timeout)
        plan_rng = random.Random(rnd)
        plan = []
        for _ in range(plan_rng.randint(0, 8)):
            src, dst = plan_rng.sample(range(n), 2)
            plan.append((src, dst, plan_rng.choice([0, 1, 7, 1024, 65536, 300000])))
        collective_at = plan_rng.randint(0, 10)
        collective_async = plan_rng.random() < 0.5
        queues = {}
        for k, (src, dst, elems) in enumerate(plan):
            if src == r:
                queues.setdefault(("send", dst), []).append((elems, k))
            if dst == r:
                queues.setdefault(("recv", src), []).append((elems, k))
        mine = random.Random(rnd * 1000 + r)
        order = []
        while queues:
            key = mine.choice(sorted(queues))
            order.append((*key, *queues[key].pop(0)))
            if not queues[key]:
                del queues[key]
        works, received = [], []
        z = torch.full((100,), float(r + rnd))
        collective = None
        called = False
        for i, step in enumerate(order + [None]):
            if i == min(collective_at, len(order)) and not called:
                collective = dist.all_reduce(z, group=g, async_op=collective_async)
                called = True
            if step is None:
                break
            kind, peer, elems, k = step
            if kind == "send":
                x = torch.full((elems,), float(k * 10 + r))
                works.append((dist.isend(x, group_dst=peer, group=g), x))
            else:
                y = torch.empty(elems)
                works.append((dist.irecv(y, group_src=peer, group=g), y))
                received.append((y, float(k * 10 + peer), k, peer))
        mine.shuffle(works)
        for w, _ in works:
            w.wait()
        if collective_async:
            collective.wait()
        want = n * (n - 1) / 2 + n * rnd
        if not torch.all(z == want):
            raise AssertionError(f"round {rnd}, rank {r}: all_reduce gave {z[:3]}, not {want}")
        for y, value, k, peer in received:
            if not torch.all(y == value):
                raise AssertionError(
                    f"round {rnd}, rank {r}: message #{k} from {peer} holds {y[:3]}, not {value}"
                )
    dist.barrier()
    if r == 0:
        print(f"ok {rounds}", flush=True)
    dist.destroy_process_group(g)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
