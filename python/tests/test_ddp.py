"""DDP and FSDP2 on oxccl against the same runs on Gloo, under torchrun with 2 and 4 ranks.

ddp_worker.py trains each variant for 20 steps (an MLP with a buffer, a model with unused
parameters, each with and without the fp16 compression comm hook; the MLP with PowerSGD's
hook, whose callbacks start all-reduces and wait for them; FSDP2's fully_shard on an
MLP; a pipeline of one stage per rank under torch.distributed.pipelining's 1F1B schedule, whose
traffic is all sends and receives; DTensor tensor parallelism, an MLP split by columns then
rows) and rank 0 saves the final state. The worker never imports oxccl: the installed
package's entry point provides the backend, as for a user.

With 2 ranks every sum has two terms, so the order of reduction cannot matter and the final
parameters must be bit-identical to Gloo's. With 4 ranks Gloo's ring and oxccl's algorithms
add the four gradients in different orders, so float results may differ in the last bits
(seen: at most 4e-8 absolute in fp32, 1e-4 with the fp16 hook): those runs must agree within
such rounding bounds, and the "exact" DDP variants, whose gradients are rounded to a grid on
which every sum is exact (ddp_worker.exact_gradients), must be bit-identical to Gloo's.
"""

import os
import subprocess
import sys
import tempfile

import pytest

torch = pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "ddp_worker.py")


def torchrun(nproc, *args, env=None, timeout=300, tries=1):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
           "--standalone", *args]
    e = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    for attempt in range(tries):
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=e)
        if p.returncode == 0:
            return p
        print(f"attempt {attempt + 1} of {' '.join(cmd)} failed ({p.returncode})")
    assert p.returncode == 0, f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr[-6000:]}"
    return p


def backend_installed():
    from importlib.metadata import entry_points

    return any(ep.name == "oxccl" for ep in entry_points(group="torch.distributed.backends"))


@pytest.fixture(scope="module")
def runs():
    if not backend_installed():
        pytest.fail("the oxccl package is not installed (pip install ./python): no "
                    "torch.distributed.backends entry point named oxccl")
    out = {}
    with tempfile.TemporaryDirectory() as d:
        for n in (2, 4):
            for backend in ("gloo", "oxccl"):
                path = os.path.join(d, f"{backend}-{n}.pt")
                # Gloo is the reference, not what is tested: its 4-rank run on 2 cores has
                # aborted once in teardown ("terminate called without an active exception",
                # 2026-11-25), so it gets a second try. oxccl's runs get one.
                torchrun(n, WORKER, backend, path, "--fsdp", tries=2 if backend == "gloo" else 1)
                out[backend, n] = torch.load(path)
    return out


def diffs(a, b):
    assert a.keys() == b.keys()
    worst = {}
    for variant in a:
        assert a[variant].keys() == b[variant].keys(), variant
        worst[variant] = max(
            (a[variant][k].double() - b[variant][k].double()).abs().max().item() for k in a[variant]
        )
    return worst


def test_two_ranks_bit_identical_to_gloo(runs):
    gloo, ox = runs["gloo", 2], runs["oxccl", 2]
    assert len(gloo) == 12  # 9 DDP variants, FSDP2, the pipeline and tensor parallelism
    for variant in gloo:
        for k in gloo[variant]:
            assert torch.equal(gloo[variant][k], ox[variant][k]), (
                f"{variant} {k}: oxccl differs from Gloo by "
                f"{(gloo[variant][k] - ox[variant][k]).abs().max().item()}"
            )


def test_four_ranks_match_gloo_up_to_summation_order(runs):
    gloo, ox = runs["gloo", 4], runs["oxccl", 4]
    worst = diffs(gloo, ox)
    exact = [v for v in gloo if v.endswith("/exact")]
    assert len(exact) == 5, exact  # 4 DDP variants and the pipeline
    for variant in exact:
        for k in gloo[variant]:
            assert torch.equal(gloo[variant][k], ox[variant][k]), (
                f"{variant} {k}: oxccl differs from Gloo by {worst[variant]} although every "
                "gradient sum is exact"
            )
    for variant, d in worst.items():
        bound = 1e-3 if "hook=True" in variant or "powersgd" in variant else 1e-6
        assert d <= bound, f"{variant}: oxccl and Gloo differ by {d} (bound {bound}); all: {worst}"
    # The runs trained on their ranks' data: 4 ranks end elsewhere than 2 (a run that did
    # nothing would match Gloo too).
    for variant in gloo:
        assert any(
            not torch.equal(gloo[variant][k], runs["gloo", 2][variant][k]) for k in gloo[variant]
        ), variant
