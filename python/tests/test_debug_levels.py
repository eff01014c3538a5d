"""torch's TORCH_DISTRIBUTED_DEBUG levels on an oxccl group. OFF and INFO run it; DETAIL wraps
every backend in torch's ProcessGroupWrapper, which asks the backend its name through a C++
call a Python backend cannot answer (every collective failed with torch's "getBackendName is
not implemented" INTERNAL ASSERT), so oxccl refuses it at init_process_group with a message
that says what to do instead. (Under torch 2.11 oxccl's group is a ProcessGroup, which torch
does not wrap: DETAIL runs it.)"""

import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # any --import-mode
from conftest import checkout_env, require_torch  # noqa: E402

require_torch()

PROGRAM = """
import oxccl, torch, torch.distributed as dist
oxccl.register()
try:
    dist.init_process_group("oxccl", store=dist.HashStore(), rank=0, world_size=1)
    t = torch.ones(2)
    dist.all_reduce(t)
    print("result", t.tolist())
except Exception as e:
    print("raised", type(e).__name__, e)
"""


def _backend_is_python_subclass():
    """Whether oxccl's group is a Python c10d Backend here (torch 2.15), which DETAIL wraps."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__))))
    from oxccl import torch_backend

    return torch_backend._SUBCLASSABLE


@pytest.mark.parametrize("level", ["OFF", "INFO", "DETAIL"])
def test_debug_levels(level):
    env = dict(checkout_env(), TORCH_DISTRIBUTED_DEBUG=level)
    out = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    if level == "DETAIL" and _backend_is_python_subclass():
        assert "raised ValueError oxccl does not run under TORCH_DISTRIBUTED_DEBUG=DETAIL" in (
            out.stdout
        ), out.stdout + out.stderr[-3000:]
        assert "Use INFO or OFF" in out.stdout, out.stdout
    else:
        assert "result [1.0, 1.0]" in out.stdout, out.stdout + out.stderr[-3000:]
