"""Every collective torch.distributed exposes, on CPU tensors, through oxccl against Gloo on
the same inputs in the same processes, with 1, 2, 3 and 4 ranks.

collectives_worker.py does the work (its docstring says how results are made exact and
compared bit for bit); this file launches it once per setup and reports each of its cases as
a test of its own, named after the setup, the world size and the case:

- ``gloo-default``: ``init_process_group("cpu:gloo")``, oxccl through
  ``new_group(backend="oxccl")``, at 1, 2, 3 and 4 ranks;
- ``oxccl-default``: ``init_process_group("cpu:oxccl", device_id=cpu:0)`` (so subgroups and
  a DeviceMesh's dimensions are split from it), Gloo through ``new_group(backend="gloo")``,
  at 4 ranks. Under torch 2.11, which takes only an accelerator as device_id, without it
  (and without the cases of splits and meshes; see collectives_worker.LEGACY).

The ranks import oxccl from this checkout (python/, with OXCCL_LIBRARY or
target/release/liboxccl.so; see conftest.py) and register the backend themselves. With more
ranks than cores the ranks are oversubscribed: slower, still exact.
"""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # any --import-mode
from conftest import checkout_env, require_torch, torchrun  # noqa: E402

require_torch()

import collectives_worker as worker  # noqa: E402 - needs torch, checked just above

WORKER = worker.__file__
SETUPS = [("gloo", 1), ("gloo", 2), ("gloo", 3), ("gloo", 4), ("oxccl", 4)]
EXIT = "clean_exit"  # a last check per launch: every rank finished and exited 0

_launches = {}


def launch(mode, world, tmp_path_factory):
    """The setup's one launch (made on first use): its Launch and each rank's records."""
    key = (mode, world)
    if key not in _launches:
        out = str(tmp_path_factory.mktemp(f"collectives-{mode}-{world}"))
        run = torchrun(world, WORKER, out, mode, env=checkout_env(), timeout=420)
        records = {}
        for rank in range(world):
            path = os.path.join(out, f"rank{rank}.jsonl")
            lines = open(path).read().splitlines() if os.path.exists(path) else []
            records[rank] = {r["case"]: r for r in map(json.loads, lines)}
        _launches[key] = run, records
    return _launches[key]


def params():
    for mode, world in SETUPS:
        for name in worker.cases_for(mode, world) + [EXIT]:
            yield pytest.param(mode, world, name, id=f"{mode}-default-{world}ranks-{name}")


@pytest.mark.parametrize("mode,world,name", list(params()))
def test_collectives(mode, world, name, tmp_path_factory):
    run, records = launch(mode, world, tmp_path_factory)
    where = f"{mode}-default setup, {world} rank(s)"
    if name == EXIT:
        unfinished = [r for r in range(world) if "__end__" not in records[r]]
        assert (
            not unfinished and run.returncode == 0 and not run.timed_out
        ), f"{where}: rank(s) {unfinished} did not finish all cases\n{run.tail()}"
        return
    missing = [r for r in range(world) if name not in records[r]]
    assert not missing, (
        f"{where}: rank(s) {missing} never reported case {name} (a crash or hang in it or "
        f"before it)\n{run.tail()}"
    )
    errors = [e for r in range(world) for e in records[r][name]["errors"]]
    assert not errors, f"{where}, case {name}:\n" + "\n".join(errors)
