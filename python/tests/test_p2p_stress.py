"""Random point-to-point traffic mixed with all-reduces on oxccl (p2p_stress_worker.py), 3 and
4 ranks, 300 rounds each, every byte checked: orders that Gloo runs, on pairs' communicators
made anew every 25 rounds."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # any --import-mode
from conftest import checkout_env, require_torch, torchrun  # noqa: E402

require_torch()

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "p2p_stress_worker.py")


@pytest.mark.parametrize("world", [3, 4])
def test_random_point_to_point_with_all_reduces(world):
    run = torchrun(world, WORKER, 300, "oxccl", env=checkout_env(), timeout=300)
    assert run.returncode == 0 and not run.timed_out and "ok 300" in run.stdout, run.tail()
