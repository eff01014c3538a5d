"""Helpers shared by the torch backend's tests: which interpreter and which oxccl the ranks
run, launching N ranks under torchrun, and skipping when torch or liboxccl is missing.

- The ranks run this interpreter (``sys.executable``, the one with torch and pytest); torchrun
  is ``python -m torch.distributed.run``, so no script has to be found on PATH.
- ``checkout_env()``: the environment for ranks that import oxccl from this checkout's
  ``python/`` (PYTHONPATH) with a library: ``OXCCL_LIBRARY`` if set, else
  ``target/release/liboxccl.so`` (``cargo build --release -p oxccl-ffi``), else the one an
  installed oxccl package carries. Such ranks call ``oxccl.register()`` themselves.
  Tests of the installed package (its ``torch.distributed.backends`` entry point) launch
  without it.
- Missing torch or library: the tests skip, or fail when ``OXCCL_REQUIRE_TORCH`` is set (CI
  sets it, so that a broken setup cannot pass as "skipped").
"""

import glob
import importlib.util
import os
import signal
import subprocess
import sys

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(TESTS)
REPO = os.path.dirname(PYTHON_DIR)
RELEASE_LIBRARY = os.path.join(REPO, "target", "release", "liboxccl.so")


def unavailable(why):
    """Skips the calling test (or module), or fails it when OXCCL_REQUIRE_TORCH is set."""
    if os.environ.get("OXCCL_REQUIRE_TORCH"):
        pytest.fail(f"{why} (OXCCL_REQUIRE_TORCH is set)", pytrace=False)
    pytest.skip(why, allow_module_level=True)


def require_torch():
    """The torch module, or skip (fail under OXCCL_REQUIRE_TORCH)."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        unavailable(f"torch is not importable: {e}")
    if not dist.is_available() or not dist.is_gloo_available():
        unavailable("this torch has no torch.distributed with Gloo")
    return torch


def checkout_library():
    """The liboxccl.so for ranks that use this checkout's python/: OXCCL_LIBRARY, else the
    release build in target/, else the one inside an installed oxccl package (``pip install
    ./python`` builds it from this checkout), else None."""
    path = os.environ.get("OXCCL_LIBRARY")
    if path:
        return path if os.path.isfile(path) else None
    if os.path.isfile(RELEASE_LIBRARY):
        return RELEASE_LIBRARY
    spec = importlib.util.find_spec("oxccl")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        found = sorted(glob.glob(os.path.join(folder, "_liboxccl*.so")))
        if found:
            return found[0]
    return None


def checkout_env(extra=None):
    """Environment for ranks that import oxccl from this checkout's python/ (skips, or fails
    under OXCCL_REQUIRE_TORCH, when no library is found)."""
    library = checkout_library()
    if library is None:
        unavailable(
            f"no liboxccl.so: set OXCCL_LIBRARY (to a file), build {RELEASE_LIBRARY} "
            "(cargo build --release -p oxccl-ffi) or pip install ./python"
        )
    env = dict(os.environ, OMP_NUM_THREADS="1", OXCCL_LIBRARY=library)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PYTHON_DIR, env.get("PYTHONPATH")) if p)
    env.update(extra or {})
    return env


class Launch:
    """What a torchrun launch left: its exit status, output, and whether it timed out."""

    def __init__(self, cmd, returncode, stdout, stderr, timed_out):
        self.cmd = cmd
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        self.timed_out = timed_out

    def tail(self, chars=6000):
        status = "timed out" if self.timed_out else f"exit status {self.returncode}"
        return (
            f"$ {' '.join(self.cmd)}\n({status})\n--- stdout (end) ---\n{self.stdout[-chars:]}\n"
            f"--- stderr (end) ---\n{self.stderr[-chars:]}"
        )


def torchrun(nproc, script, *args, env=None, timeout=300):
    """Runs ``script args`` on ``nproc`` ranks under torchrun (standalone: a free port, so runs
    beside others do not collide). Never raises for the ranks' failures: look at the Launch.
    On timeout, the whole process group (torchrun and its ranks) is killed."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        "--nproc-per-node", str(nproc), script, *map(str, args),
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1") if env is None else env
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        return Launch(cmd, proc.returncode, out, err, False)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return Launch(cmd, proc.returncode, out, err, True)
