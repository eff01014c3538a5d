"""One rank of the collectives suite (test_collectives.py), launched by torchrun:

    torchrun --nproc-per-node N collectives_worker.py OUT_DIR MODE [CASE,CASE...]

It checks every collective torch.distributed exposes, on CPU tensors, through oxccl against
Gloo run on the same inputs in the same processes. MODE picks how the groups are made:

- ``gloo``: ``init_process_group("cpu:gloo")``; the oxccl group is
  ``new_group(backend="oxccl")`` over the same ranks (a fresh communicator, rendezvous
  through the subgroup's store).
- ``oxccl``: ``init_process_group("cpu:oxccl", device_id=torch.device("cpu", 0))``; the Gloo
  reference is ``new_group(backend="gloo")``. Here subgroups (``new_group``, a DeviceMesh's
  dimensions) are split from the default communicator.

Every case runs on every rank; each rank appends one JSON line per case to
``OUT_DIR/rank<R>.jsonl`` (``{"case", "ok", "errors", "seconds"}``) and ``{"case": "__end__"}``
when it is done, so a crash or a hang is pinned to the case that was running. Failure
messages name the rank, the world size, the mode, the case, the operation, the dtype and
async_op.

Exactness: every rank's inputs are a deterministic function of (rank, salt), so any rank can
make any rank's inputs. They are chosen so that every partial result of a reduction is exact
(integer-valued floats, products of ±1 and ±2, min/max): the reduction order cannot change a
bit, so oxccl must match Gloo bit for bit. Where Gloo lacks something (PREMUL_SUM, AVG on
integers, float8, uint32/uint64) the expected result is computed here from every rank's
inputs. Data movement of a dtype Gloo lacks is compared against Gloo moving the same bytes (a
view as an integer type of the same size).
"""

import datetime
import json
import os
import sys
import time
import traceback
import warnings

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _coalescing_manager


def _legacy_torch():
    """Whether this torch lacks a Python-constructible c10d Backend (torch 2.11): oxccl's
    group is then a ProcessGroup subclass standing for the whole group, and torch itself
    offers less on CPU (no CPU device_id, so no split_group; monitored_barrier on Gloo only;
    Gloo without all_to_all)."""
    from torch._C._distributed_c10d import Backend

    class Probe(Backend):
        pass

    try:
        Probe(0, 1)
        return False
    except TypeError:
        return True


LEGACY = _legacy_torch()

RO = dist.ReduceOp
TIMEOUT = datetime.timedelta(seconds=60)

F8 = [torch.float8_e4m3fn, torch.float8_e5m2]
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INTS = [torch.int8, torch.uint8, torch.int32, torch.int64]
UINTS = [torch.uint32, torch.uint64]
# Every dtype oxccl moves: what the data-movement collectives are checked on.
ALL = FLOATS + INTS + [torch.bool, torch.complex64] + F8 + UINTS
# Gloo rejects these ("Invalid scalar type"); it moves their bytes as these types instead.
GLOO_CARRIER = {
    torch.float8_e4m3fn: torch.uint8,
    torch.float8_e5m2: torch.uint8,
    torch.uint32: torch.int32,
    torch.uint64: torch.int64,
}
# Gloo's gather lacks complex64 too.
CARRY_COMPLEX = {torch.complex64: torch.int64}

SHAPE = (3, 5)
SHAPES3 = [(4,), (2, 3), (5,)]

CASES = {"gloo": [], "oxccl": []}


def case(modes=("gloo",), worlds=(1, 2, 3, 4)):
    """Registers a case for the given modes and world sizes."""

    def register(fn):
        for m in modes:
            CASES[m].append((fn.__name__, fn, tuple(worlds)))
        return fn

    return register


def cases_for(mode, world):
    return [name for name, _, worlds in CASES[mode] if world in worlds]


# -- inputs --


def values(dtype, shape, rank, salt, kind="any"):
    """Rank ``rank``'s input: deterministic in (dtype, shape, rank, salt, kind), chosen so that
    the reduction ``kind`` stays exact (see the module docstring)."""
    key = f"{dtype}|{tuple(shape)}|{salt}|{kind}|{rank}"
    seed = sum((i + 1) * ord(c) for i, c in enumerate(key)) % (2**31)  # stable across runs
    g = torch.Generator().manual_seed(seed)

    def ints(lo, hi):
        return torch.randint(lo, hi + 1, tuple(shape), generator=g, dtype=torch.int64)

    if dtype == torch.bool:
        return ints(0, 1).bool()
    if dtype.is_complex:
        pairs = values(torch.float32, tuple(shape) + (2,), rank, salt, kind)
        return torch.view_as_complex(pairs).to(dtype)
    if dtype.is_floating_point:
        if kind == "prod":
            # Products of ±1, ±2 over at most 4 ranks: at most 16, exact even in float8.
            return (ints(1, 2) * (ints(0, 1) * 2 - 1)).to(dtype)
        if kind == "minmax":
            return (torch.randn(tuple(shape), generator=g) * 4).to(dtype)
        # sum, avg, premul, any: small integers whose partial sums stay exact. float8 has 3
        # (e4m3) or 2 (e5m2) mantissa bits: it holds every integer up to 16 resp. 8 in
        # magnitude, so inputs within ±3 resp. ±2 keep sums of four ranks exact.
        bound = {torch.float8_e4m3fn: 3, torch.float8_e5m2: 2}.get(dtype, 8)
        return ints(-bound, bound).to(dtype)
    info = torch.iinfo(dtype)
    if kind == "prod":
        return ints(0 if info.min == 0 else -3, 3).to(dtype)
    if kind == "avg":
        # No overflow: the average of a wrapped sum is not what anyone means.
        return ints(0 if info.min == 0 else -20, 40).to(dtype)
    if dtype in UINTS:
        # Sums of four stay below 2**62, so int64 arithmetic computes the reference.
        return ints(0, 2**31 if dtype.itemsize == 4 else 2**60).to(dtype)
    if dtype.itemsize == 1:
        # The whole range: sums and products wrap, and wrapping arithmetic is exact and
        # associative, so any order gives the same bits (Gloo's too).
        return ints(info.min, info.max).to(dtype)
    return ints(-(2**20), 2**20).to(dtype)


SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(t):
    """A tensor's bytes, to compare bit for bit (NaN payloads, -0.0 and bool bytes other than
    0 and 1 included: the bytes are reinterpreted as integers before anything copies them)."""
    t = real(t.detach())
    t = t.view(SAME_SIZE_INT[t.element_size()])  # a same-size view takes any strides
    t = torch.empty(t.shape, dtype=t.dtype).copy_(t)  # contiguous, unit strides
    return t.reshape(-1).view(torch.uint8)


def real(t):
    return torch.view_as_real(t) if t.is_complex() else t


def strided(t, fill=0):
    """A non-contiguous tensor equal to ``t``: every other column of a wider buffer."""
    shape = tuple(t.shape)
    base = torch.full(shape[:-1] + (2 * shape[-1],), fill, dtype=torch.float32).to(t.dtype)
    view = base[..., ::2]
    view.copy_(t)
    assert t.numel() < 2 or not view.is_contiguous()
    return view


def transposed(t):
    """A non-contiguous (but dense) 2-D tensor equal to ``t``."""
    v = t.t().contiguous().t()
    assert not v.is_contiguous() and torch.equal(bits(v), bits(t))
    return v


def canonical_bools(x):
    """Gloo's SUM on bool adds the bytes: a True may come out as byte 2 (and 256 Trues as
    False). oxccl, like NCCL, computes an or there (MAX on the bytes), whose bytes are 0 or
    1. Gloo's results are compared as the bools they mean."""
    if isinstance(x, (list, tuple)):
        return [canonical_bools(i) for i in x]
    if isinstance(x, torch.Tensor) and x.dtype == torch.bool:
        return x.view(torch.uint8) != 0
    return x


def is_oxccl(group):
    from oxccl.torch_backend import OxcclBackend

    return isinstance(group._get_backend(torch.device("cpu")), OxcclBackend)


def gloo_has(dtype):
    return dtype not in GLOO_CARRIER


class Dt:
    """How a run makes its tensors: ``d(t)`` is ``t`` itself, or (for Gloo on a dtype it
    lacks) ``t``'s bytes viewed as an integer type; ``d.out`` is the dtype outputs take;
    ``d.nc`` says whether to use the non-contiguous layout under test (oxccl only: Gloo gets
    contiguous tensors, so the reference does not depend on how Gloo handles strides)."""

    def __init__(self, dtype, carry, oxccl):
        self.dtype = dtype
        self.carry = carry
        self.nc = oxccl
        self.out = self(torch.zeros(1, dtype=dtype)).dtype

    def __call__(self, t):
        if not self.carry:
            return t
        return t.view(GLOO_CARRIER.get(t.dtype) or CARRY_COMPLEX[t.dtype])


# -- the context a case runs in --


class Ctx:
    def __init__(self, mode, rank, world, gloo, ox):
        self.mode = mode
        self.rank = rank
        self.world = world
        self.gloo = gloo  # the Gloo group (all ranks)
        self.ox = ox  # the oxccl group (all ranks)
        self.case = None
        self.errors = []

    def fail(self, what, detail):
        self.errors.append(
            f"rank {self.rank} of {self.world} ({self.mode} mode), {self.case}: {what}: {detail}"
        )

    def check(self, cond, what, detail="check failed"):
        if not cond:
            self.fail(what, detail)
        return bool(cond)

    def same(self, actual, expected, what):
        """Bit-for-bit equality of tensors (or nested lists of them)."""
        if isinstance(expected, (list, tuple)):
            if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
                return self.fail(what, f"expected {len(expected)} items, got {_show(actual)}")
            for i, (a, e) in enumerate(zip(actual, expected)):
                self.same(a, e, f"{what} [{i}]")
            return
        if not isinstance(actual, torch.Tensor):
            return self.fail(what, f"expected a tensor, got {_show(actual)}")
        if actual.shape != expected.shape:
            return self.fail(what, f"shape {tuple(actual.shape)}, expected {tuple(expected.shape)}")
        if actual.element_size() != expected.element_size():
            return self.fail(what, f"dtype {actual.dtype}, expected {expected.dtype}")
        if not torch.equal(bits(actual), bits(expected)):
            bad = (bits(actual) != bits(expected)).nonzero().reshape(-1)
            self.fail(
                what,
                f"not bit-identical ({bad.numel()} bytes differ, the first at byte "
                f"{bad[0].item()}): got {_head(actual)}, expected {_head(expected)}",
            )

    def expect_error(self, what, fn, *needles, types=(Exception,)):
        """``fn()`` must raise one of ``types`` whose message contains every needle; returns
        the message."""
        try:
            fn()
        except types as e:
            msg = f"{type(e).__name__}: {e}"
            for n in needles:
                self.check(n in msg, what, f"the error does not mention {n!r}: {msg[:500]}")
            return msg
        except Exception as e:  # noqa: BLE001 - reported
            self.fail(what, f"raised {type(e).__name__} ({str(e)[:300]}), expected {types}")
            return None
        self.fail(what, "no error raised")
        return None

    def where(self, op, group=None):
        """The prefix the backend's errors carry for ``op`` on the oxccl group."""
        group = group or self.ox
        return f"oxccl {op} on rank {group.rank()} of {group.size()}"


def _head(t):
    t = real(t.detach()).reshape(-1)
    if t.dtype in F8:
        t = t.float()
    elif t.dtype == torch.bool:
        t = t.view(torch.uint8)  # the bytes: a True may be stored as 2
    return str(t[:8].tolist()) + ("..." if t.numel() > 8 else "")


def _show(x):
    if isinstance(x, torch.Tensor):
        return f"tensor {tuple(x.shape)} {x.dtype}"
    if isinstance(x, (list, tuple)):
        return f"{type(x).__name__} of {len(x)}: [" + ", ".join(_show(i) for i in x[:4]) + "]"
    return repr(x)[:80]


def settle(ctx, what, work, async_op, outputs):
    """Checks what a collective call returned: None when sync; when async a Work whose wait()
    is True, is_completed() True after it, and whose future's value is ``outputs`` (the same
    tensors, or their real views where torch passed those: same memory, same bits)."""
    if not async_op:
        ctx.check(work is None, what, f"a sync call returned {work!r}, not None")
        return
    if isinstance(work, torch._C.Future):  # all_reduce_coalesced, all_gather_coalesced
        value = work.wait()
        ctx.check(work.done(), what, "future not done after wait()")
    else:
        if not ctx.check(isinstance(work, dist.Work), what, f"async call returned {work!r}"):
            return
        ctx.check(work.wait() is True, what, "Work.wait() did not return True")
        ctx.check(work.is_completed(), what, "Work.is_completed() is False after wait()")
        value = work.get_future().wait()
    if not isinstance(value, list) or len(value) != len(outputs):
        return ctx.fail(what, f"future value {_show(value)}, expected the {len(outputs)} outputs")
    for i, (v, o) in enumerate(zip(value, outputs)):
        if not isinstance(v, torch.Tensor):
            ctx.fail(what, f"future value [{i}] is {type(v).__name__}")
            continue
        v, o = real(v), real(o)
        ctx.check(v.data_ptr() == o.data_ptr(), what, f"future value [{i}] is other memory")
        ctx.same(v, o, f"{what}: future value [{i}]")


def compare(ctx, what, run, dtype, asyncs=(False, True), expected=None, carry=()):
    """The pattern of most cases. ``run(group, async_op, d) -> (work, outputs, result)``
    issues one collective on this rank's deterministic inputs, making its tensors through
    ``d`` (a ``Dt``). The expected ``result`` is Gloo's (sync, contiguous tensors) on the same
    inputs (moved as a carrier type when Gloo lacks ``dtype`` or it is in ``carry``), or
    ``expected`` when given. Then oxccl runs once per async flag and must match bit for bit;
    its Work is checked by ``settle``.
    """
    label0 = f"{what} {str(dtype).replace('torch.', '')}"
    if expected is None:
        try:
            d = Dt(dtype, not gloo_has(dtype) or dtype in carry, False)
            _, _, expected = run(ctx.gloo, False, d)
        except Exception as e:  # noqa: BLE001 - a broken reference is the test's fault: say so
            return ctx.fail(label0, f"the Gloo reference failed: {type(e).__name__}: {e}")
        expected = canonical_bools(expected)
    for async_op in asyncs:
        label = f"{label0} async_op={async_op}"
        try:
            work, outputs, result = run(ctx.ox, async_op, Dt(dtype, False, True))
            settle(ctx, label, work, async_op, outputs)
            if result is not None:
                ctx.same(result, expected, label)
        except Exception as e:  # noqa: BLE001 - reported, the next variant still runs
            ctx.fail(label, f"{type(e).__name__}: {e}")


# -- reductions --

OPS_FLOAT = [RO.SUM, RO.PRODUCT, RO.MIN, RO.MAX, RO.AVG]
OPS_INT = [RO.SUM, RO.PRODUCT, RO.MIN, RO.MAX, RO.BAND, RO.BOR, RO.BXOR]
KIND = {RO.PRODUCT: "prod", RO.MIN: "minmax", RO.MAX: "minmax", RO.AVG: "avg"}
PREMUL = "PREMUL_SUM"  # in the op lists below: PREMUL_SUM with premul_factor(dtype)


def kind_of(op):
    return KIND.get(op, "bits" if op in (RO.BAND, RO.BOR, RO.BXOR) else "sum")


def premul_factor(dtype):
    # 2 in float8 (sums of 2x, x in ±3 resp. ±2, stay exact there), 0.5 elsewhere: both exact.
    return 2.0 if dtype in F8 else 0.5


def torch_op(op, dtype):
    """torch's ReduceOp for ``op`` (PREMUL: a fresh PREMUL_SUM with premul_factor)."""
    return dist._make_nccl_premul_sum(premul_factor(dtype)) if op == PREMUL else op


def op_name(op):
    return op if isinstance(op, str) else op.name


def reference(op, xs, dtype, factor=None):
    """The reduction of ``xs`` (every rank's input, in rank order) that oxccl must produce,
    for what Gloo lacks. The inputs are exact (see ``values``), so computing in a wide type
    and rounding once equals rounding after every step, in any order."""
    n = len(xs)
    if op == PREMUL:
        op, factor = RO.SUM, premul_factor(dtype)
    if dtype.is_complex:
        pairs = reference(op, [torch.view_as_real(x) for x in xs], torch.float32, factor)
        return torch.view_as_complex(pairs)
    if dtype.is_floating_point:
        w = [x.double() for x in xs]
        if factor is not None:
            f = torch.tensor(factor, dtype=dtype).double()  # the factor as the dtype holds it
            return sum(f * x for x in w).to(dtype)
        if op == RO.SUM:
            return sum(w).to(dtype)
        if op == RO.AVG:
            return (sum(w) / n).to(dtype)
        fold = {RO.PRODUCT: torch.mul, RO.MIN: torch.minimum, RO.MAX: torch.maximum}[op]
    else:
        # Integers: in int64 (uint64 inputs are below 2**62), wrapped to the dtype's width.
        w = [x.to(torch.int64) for x in xs]
        if op == RO.AVG:
            return torch.div(sum(w), n, rounding_mode="trunc").to(dtype)
        fold = {
            RO.SUM: torch.add,
            RO.PRODUCT: torch.mul,
            RO.MIN: torch.minimum,
            RO.MAX: torch.maximum,
            RO.BAND: torch.bitwise_and,
            RO.BOR: torch.bitwise_or,
            RO.BXOR: torch.bitwise_xor,
        }[op]
    out = w[0]
    for x in w[1:]:
        out = fold(out, x)
    if not dtype.is_floating_point and dtype.itemsize < 8:
        width = 8 * dtype.itemsize
        out = out & ((1 << width) - 1)
        if dtype.is_signed:
            out = torch.where(out >= (1 << (width - 1)), out - (1 << width), out)
    return out.to(dtype)


def needs_reference(op, dtype):
    """Whether Gloo cannot compute ``op`` on ``dtype`` (so ``reference`` does)."""
    if op == PREMUL or not gloo_has(dtype):
        return True  # Gloo: "Cannot use ReduceOp.PREMUL_SUM with Gloo", "Invalid scalar type"
    # Gloo: "result type Float can't be cast to the desired output type"
    return op == RO.AVG and not (dtype.is_floating_point or dtype.is_complex)


def expected_for(ctx, op, dtype, shape, salt, pick=None):
    """``reference`` on every rank's inputs where Gloo lacks ``op`` on ``dtype``, else None
    (Gloo computes it). ``pick`` narrows the result (reduce-scatter's slice)."""
    if not needs_reference(op, dtype):
        return None
    xs = [values(dtype, shape, r, salt, kind_of(op)) for r in range(ctx.world)]
    out = reference(op, xs, dtype)
    return pick(out) if pick else out


def check_all_reduce(ctx, dtype, op, layout=None):
    salt = f"ar-{layout}"

    def run(group, async_op, d):
        x = d(values(dtype, SHAPE, group.rank(), salt, kind_of(op)))
        base = None
        if layout == "strided" and d.nc:
            base = torch.full((SHAPE[0], 2 * SHAPE[1]), 3, dtype=torch.float32).to(x.dtype)
            x = base[:, ::2]
            x.copy_(d(values(dtype, SHAPE, group.rank(), salt, kind_of(op))))
        elif layout == "transposed" and d.nc:
            x = transposed(x)
        w = dist.all_reduce(x, op=torch_op(op, dtype), group=group, async_op=async_op)
        if base is not None and async_op:
            w.wait()
        if base is not None:
            gaps = base[:, 1::2]
            if not torch.equal(bits(gaps), bits(torch.full_like(gaps, 3))):
                raise AssertionError("all_reduce wrote outside the strided view")
        return w, [x], x

    what = f"all_reduce {op_name(op)}" + (f" ({layout})" if layout else "")
    compare(ctx, what, run, dtype, expected=expected_for(ctx, op, dtype, SHAPE, salt))


@case()
def all_reduce_float(ctx):
    # Integer-valued inputs (products of ±1, ±2): every partial sum and product is exact in
    # each dtype, so Gloo's order and oxccl's give the same bits. AVG is Gloo's (the exact sum,
    # then one division) and oxccl's (the same, by contract) alike.
    for dtype in FLOATS:
        for op in OPS_FLOAT:
            check_all_reduce(ctx, dtype, op)


@case()
def all_reduce_int(ctx):
    # int8/uint8 inputs span the whole range, so sums and products wrap: wrapping arithmetic
    # is associative, so the bits match whatever the order. AVG on integers is not in Gloo:
    # the reference is the sum truncated-divided by the world size (oxccl's contract).
    for dtype in INTS:
        for op in OPS_INT + [RO.AVG]:
            check_all_reduce(ctx, dtype, op)


@case()
def all_reduce_bool(ctx):
    # On bool, Gloo's SUM is an or and its PRODUCT an and; oxccl must agree.
    for op in OPS_INT:
        check_all_reduce(ctx, torch.bool, op)


@case()
def all_reduce_complex(ctx):
    # torch reduces complex tensors as their real view (SUM, AVG and PREMUL_SUM only).
    for op in (RO.SUM, RO.AVG, PREMUL):
        check_all_reduce(ctx, torch.complex64, op)


@case()
def all_reduce_float8(ctx):
    # Gloo has no float8: the reference is computed in float64 from every rank's inputs and
    # rounded once. The inputs keep every partial result exact in float8 (|sums| <= 12 in
    # e4m3, <= 8 in e5m2; products of ±1, ±2), so rounding after each step (oxccl) equals it.
    for dtype in F8:
        for op in OPS_FLOAT + [PREMUL]:
            check_all_reduce(ctx, dtype, op)
    if ctx.world == 2:
        # Two ranks: one addition, so a single rounding of the exact sum, whatever the inputs.
        for dtype in F8:
            g = torch.Generator().manual_seed(5)
            xs = [(torch.randn(64, generator=g) * 3).to(dtype) for _ in range(2)]
            expected = (xs[0].double() + xs[1].double()).to(dtype)
            t = xs[ctx.rank].clone()
            dist.all_reduce(t, group=ctx.ox)
            ctx.same(t, expected, f"all_reduce SUM {dtype}, random inputs (one rounding)")


@case()
def all_reduce_uint32_uint64(ctx):
    # Gloo rejects uint32/uint64 ("Invalid scalar type"); the reference is int64 arithmetic.
    for dtype in UINTS:
        for op in (RO.SUM, RO.MIN, RO.MAX, RO.BAND, RO.BOR, RO.BXOR):
            check_all_reduce(ctx, dtype, op)


@case()
def all_reduce_premul_sum(ctx):
    # PREMUL_SUM is NCCL's (Gloo refuses it): the sum of factor * x. The factor 0.5 and the
    # integer inputs keep every product and partial sum exact.
    for dtype in FLOATS:
        check_all_reduce(ctx, dtype, PREMUL)
    # The factor may be a tensor (as FSDP passes it).
    x = torch.full((4,), float(ctx.rank + 1))
    dist.all_reduce(x, op=dist._make_nccl_premul_sum(torch.tensor(3.0)), group=ctx.ox)
    n = ctx.world
    ctx.same(x, torch.full((4,), 3.0 * n * (n + 1) / 2), "all_reduce PREMUL_SUM, tensor factor")
    # On integers it is refused, clearly.
    for async_op in (False, True):
        ctx.expect_error(
            f"all_reduce PREMUL_SUM int32 async_op={async_op}",
            lambda a=async_op: dist.all_reduce(
                torch.ones(4, dtype=torch.int32),
                op=dist._make_nccl_premul_sum(2.0),
                group=ctx.ox,
                async_op=a,
            ),
            ctx.where("all_reduce"),
            "PREMUL_SUM",
            "torch.int32",
            types=(ValueError,),
        )


@case()
def all_reduce_noncontiguous(ctx):
    # A strided view (every other column) and a transposed one: the backend copies in and
    # out, and leaves the gaps between the strided view's columns alone.
    for dtype in (torch.float32, torch.int64, torch.bfloat16, torch.bool, torch.complex64):
        for layout in ("strided", "transposed"):
            check_all_reduce(ctx, dtype, RO.SUM, layout=layout)
            if dtype != torch.complex64:
                check_all_reduce(ctx, dtype, RO.MAX, layout=layout)


@case()
def all_reduce_coalesced(ctx):
    for dtype, op in [
        (torch.float32, RO.SUM),
        (torch.float64, RO.MAX),
        (torch.int32, RO.BXOR),
        (torch.bfloat16, RO.PRODUCT),
        (torch.float32, RO.AVG),
        (torch.complex64, RO.SUM),
    ]:

        def run(group, async_op, d, dtype=dtype, op=op):
            xs = [d(values(dtype, s, group.rank(), ("arc", s), kind_of(op))) for s in SHAPES3]
            if d.nc:
                xs[1] = strided(xs[1])  # one of them non-contiguous
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                w = dist.all_reduce_coalesced(xs, op=op, group=group, async_op=async_op)
            return w, xs, xs

        compare(ctx, f"all_reduce_coalesced {op_name(op)}", run, dtype)
    # The coalescing manager (as DDP-like code uses it): several all_reduces, one call.
    for async_op in (False, True):

        def run_cm(group, _async, d, async_op=async_op):
            xs = [values(torch.float32, s, group.rank(), ("cm", s), "sum") for s in SHAPES3]
            with _coalescing_manager(group=group, async_ops=async_op) as cm:
                for x in xs:
                    dist.all_reduce(x, group=group)
            if async_op:
                cm.wait()
            return None, [], xs

        compare(
            ctx,
            f"_coalescing_manager all_reduce async_ops={async_op}",
            run_cm,
            torch.float32,
            asyncs=(False,),
        )


def reduce_ops():
    return [(d, RO.SUM) for d in ALL] + [
        (torch.float32, RO.PRODUCT),
        (torch.float32, RO.MIN),
        (torch.float64, RO.MAX),
        (torch.float32, RO.AVG),
        (torch.bfloat16, RO.AVG),
        (torch.int64, RO.AVG),
        (torch.int32, RO.BAND),
        (torch.uint8, RO.BOR),
        (torch.int64, RO.BXOR),
        (torch.bool, RO.PRODUCT),
        (torch.float8_e4m3fn, RO.MAX),
        (torch.float32, PREMUL),
        (torch.float16, PREMUL),
    ]


@case()
def reduce(ctx):
    # Only the destination's tensor is defined afterwards (torch's documentation), so only
    # its result is compared.
    n = ctx.world
    for dst in sorted({0, n - 1}):
        for dtype, op in reduce_ops():

            def run(group, async_op, d, dtype=dtype, op=op, dst=dst):
                x = d(values(dtype, SHAPE, group.rank(), "red", kind_of(op)))
                if d.nc and dtype == torch.float32:
                    x = transposed(x)
                red = torch_op(op, dtype)
                w = dist.reduce(x, group_dst=dst, op=red, group=group, async_op=async_op)
                return w, [x], x if group.rank() == dst else None

            expected = expected_for(ctx, op, dtype, SHAPE, "red")
            compare(ctx, f"reduce {op_name(op)} dst={dst}", run, dtype, expected=expected)


@case()
def reduce_scatter(ctx):
    n = ctx.world
    for dtype, op in reduce_ops():
        for layout in (None, "strided"):

            def run(group, async_op, d, dtype=dtype, op=op, layout=layout):
                r, k = group.rank(), kind_of(op)
                ins = [d(values(dtype, SHAPE, r, ("rs", i), k)) for i in range(n)]
                out = torch.zeros(SHAPE, dtype=d.out)
                if layout and d.nc:
                    ins, out = [strided(x) for x in ins], strided(out)
                red = torch_op(op, dtype)
                w = dist.reduce_scatter(out, ins, op=red, group=group, async_op=async_op)
                return w, [out], out

            expected = expected_for(ctx, op, dtype, SHAPE, ("rs", ctx.rank))
            label = f"reduce_scatter {op_name(op)}" + (f" ({layout})" if layout else "")
            compare(ctx, label, run, dtype, expected=expected)


@case(worlds=(2, 3))
def overlapping_tensors(ctx):
    # A tensor whose elements share memory (expand()): read, it works as on Gloo; written,
    # it is refused before anything runs, naming the call (its results could not be written
    # back: torch's copy_ refused, after the collective had run), and the group goes on.
    r, n = ctx.rank, ctx.world
    t = torch.full((1,), float(r + 1)).expand(4)
    for what, call in (
        ("all_reduce", lambda: dist.all_reduce(t, group=ctx.ox)),
        ("all_gather", lambda: dist.all_gather([t] * n, torch.ones(4), group=ctx.ox)),
        ("recv from 0" if r else "send to 1",
         (lambda: dist.recv(t, src=0, group=ctx.ox)) if r else (lambda: None)),
    ):
        if r == 0 and what.startswith("send"):
            continue
        ctx.expect_error(
            f"{what} into an expanded tensor",
            call,
            ctx.where(what),
            "share memory",
            types=(ValueError,),
        )
    out = [torch.zeros(4) for _ in range(n)]
    dist.all_gather(out, t, group=ctx.ox)
    ctx.same(out, [torch.full((4,), float(i + 1)) for i in range(n)], "all_gather of it")
    x = t if r == 0 else torch.zeros(4)
    dist.broadcast(x, src=0, group=ctx.ox)  # the root only reads it
    if r:
        ctx.same(x, torch.ones(4), "broadcast of it")
    y = torch.ones(4)
    dist.all_reduce(y, group=ctx.ox)
    ctx.same(y, torch.full((4,), float(n)), "all_reduce after the refused calls")


@case(worlds=(2, 3, 4))
def reduce_scatter_uneven(ctx):
    # List tensors of different sizes (rank i's output as large as every rank's tensor i),
    # which Gloo takes: oxccl all-reduces the concatenation and keeps its part.
    n = ctx.world
    for dtype, op in ((torch.float32, RO.SUM), (torch.int64, RO.MAX), (torch.float64, RO.PRODUCT)):

        def run(group, async_op, d, dtype=dtype, op=op):
            r, k = group.rank(), kind_of(op)
            ins = [d(values(dtype, (i + 1, 3), r, ("rsu", i), k)) for i in range(n)]
            out = torch.zeros((r + 1, 3), dtype=d.out)
            w = dist.reduce_scatter(out, ins, op=torch_op(op, dtype), group=group,
                                    async_op=async_op)
            return w, [out], out

        compare(ctx, f"reduce_scatter uneven {op_name(op)}", run, dtype)
    if ctx.rank == 0:
        ctx.expect_error(
            "reduce_scatter uneven, output not this rank's size",
            lambda: dist.reduce_scatter(
                torch.zeros(5), [torch.ones(i + 1) for i in range(n)], group=ctx.ox
            ),
            "list tensor 0 (this rank's part) has 1",
            types=(ValueError,),
        )


@case()
def reduce_scatter_tensor(ctx):
    # Also reduce_scatter_single (its 2.15 name, here with the stacked layout) and the
    # coalescing manager's reduce_scatter_tensor_coalesced.
    n = ctx.world
    shape = (n * 4, 3)
    for dtype, op in reduce_ops():
        for layout in (None, "stacked", "transposed"):

            def run(group, async_op, d, dtype=dtype, op=op, layout=layout):
                x = d(values(dtype, shape, group.rank(), "rst", kind_of(op)))
                out = torch.zeros((4, 3), dtype=d.out)
                fn = dist.reduce_scatter_tensor
                if layout == "stacked" and d.nc:  # Gloo takes the flat layout only
                    # torch 2.11 has no reduce_scatter_single: the same call by its old name.
                    x = x.reshape(n, 4, 3)
                    fn = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
                elif layout == "transposed" and d.nc:
                    x, out = transposed(x), transposed(out)
                w = fn(out, x, op=torch_op(op, dtype), group=group, async_op=async_op)
                return w, [out], out

            me = ctx.rank
            expected = expected_for(ctx, op, dtype, shape, "rst", lambda t: t[4 * me : 4 * me + 4])
            label = f"reduce_scatter_tensor {op_name(op)}" + (f" ({layout})" if layout else "")
            compare(ctx, label, run, dtype, expected=expected)
    for async_op in (False, True):

        def run_cm(group, _async, d, async_op=async_op):
            xs = [values(torch.float32, (n * k,), group.rank(), ("rstc", k), "sum") for k in (1, 3)]
            outs = [torch.zeros(k) for k in (1, 3)]
            with _coalescing_manager(group=group, async_ops=async_op) as cm:
                for o, x in zip(outs, xs):
                    dist.reduce_scatter_tensor(o, x, group=group)
            if async_op:
                cm.wait()
            return None, [], outs

        compare(
            ctx,
            f"_coalescing_manager reduce_scatter_tensor async_ops={async_op}",
            run_cm,
            torch.float32,
            asyncs=(False,),
        )


# -- data movement --


@case()
def broadcast(ctx):
    n = ctx.world
    for src in sorted({0, n - 1}):
        for dtype in ALL:
            for layout in (None, "strided"):

                def run(group, async_op, d, dtype=dtype, src=src, layout=layout):
                    x = d(values(dtype, SHAPE, group.rank(), "bc"))
                    if layout and d.nc:
                        x = strided(x)
                    w = dist.broadcast(x, group_src=src, group=group, async_op=async_op)
                    return w, [x], x

                label = f"broadcast src={src}" + (f" ({layout})" if layout else "")
                compare(ctx, label, run, dtype)


@case()
def all_gather(ctx):
    n = ctx.world
    for dtype in ALL:
        for layout in (None, "strided"):

            def run(group, async_op, d, dtype=dtype, layout=layout):
                x = d(values(dtype, SHAPE, group.rank(), "ag"))
                outs = [torch.zeros(SHAPE, dtype=d.out) for _ in range(n)]
                if layout and d.nc:
                    x, outs = strided(x), [strided(o) for o in outs]
                w = dist.all_gather(outs, x, group=group, async_op=async_op)
                return w, outs, outs

            compare(ctx, "all_gather" + (f" ({layout})" if layout else ""), run, dtype)


@case()
def all_gather_into_tensor(ctx):
    # Also all_gather_single (its 2.15 name, here with the stacked output layout) and the
    # coalescing manager's all_gather_into_tensor_coalesced.
    n = ctx.world
    for dtype in ALL:
        for layout in (None, "stacked", "transposed"):

            def run(group, async_op, d, dtype=dtype, layout=layout):
                x = d(values(dtype, (4, 3), group.rank(), "agt"))
                out = torch.zeros((n * 4, 3), dtype=d.out)
                fn, result = dist.all_gather_into_tensor, out
                if layout == "stacked" and d.nc:  # Gloo takes the flat layout only
                    out = out.reshape(n, 4, 3)
                    fn = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
                elif layout == "transposed" and d.nc:
                    x, out = transposed(x), transposed(out)
                    result = out
                w = fn(out, x, group=group, async_op=async_op)
                return w, [out], result

            compare(ctx, "all_gather_into_tensor" + (f" ({layout})" if layout else ""), run, dtype)
    for async_op in (False, True):

        def run_cm(group, _async, d, async_op=async_op):
            xs = [values(torch.int32, (k,), group.rank(), ("agc", k)) for k in (1, 3)]
            outs = [torch.zeros(n * k, dtype=torch.int32) for k in (1, 3)]
            with _coalescing_manager(group=group, async_ops=async_op) as cm:
                for o, x in zip(outs, xs):
                    dist.all_gather_into_tensor(o, x, group=group)
            if async_op:
                cm.wait()
            return None, [], outs

        compare(
            ctx,
            f"_coalescing_manager all_gather_into_tensor async_ops={async_op}",
            run_cm,
            torch.int32,
            asyncs=(False,),
        )


@case()
def all_gather_coalesced(ctx):
    # torch's layout: output_tensor_lists[r][i] receives rank r's input_tensor_list[i].
    n = ctx.world
    for dtype in (torch.float32, torch.int8, torch.complex64, torch.bfloat16, torch.float8_e5m2):

        def run(group, async_op, d, dtype=dtype):
            ins = [d(values(dtype, s, group.rank(), ("agco", s))) for s in SHAPES3]
            outs = [[torch.zeros(s, dtype=d.out) for s in SHAPES3] for _ in range(n)]
            if d.nc:
                outs[0][1] = strided(outs[0][1])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                w = dist.all_gather_coalesced(outs, ins, group=group, async_op=async_op)
            return w, [o for row in outs for o in row], outs

        compare(ctx, "all_gather_coalesced", run, dtype)


@case()
def gather(ctx):
    # The future's value on the destination is its gather_list, elsewhere [] (as Gloo's).
    n = ctx.world
    for dst in sorted({0, n - 1}):
        for dtype in ALL:

            def run(group, async_op, d, dtype=dtype, dst=dst):
                x = d(values(dtype, SHAPE, group.rank(), "ga"))
                outs = None
                if group.rank() == dst:
                    outs = [torch.zeros(SHAPE, dtype=d.out) for _ in range(n)]
                    if d.nc:
                        outs[-1] = strided(outs[-1])
                w = dist.gather(x, outs, group_dst=dst, group=group, async_op=async_op)
                return w, outs or [], outs

            compare(ctx, f"gather dst={dst}", run, dtype, carry=CARRY_COMPLEX)


@case(modes=("oxccl",) if LEGACY else (), worlds=(4,))
def legacy_device_backends(ctx):
    # torch 2.11: the oxccl group stands for the whole group, so it is its own CPU backend and
    # names the backend it would hand other devices' tensors to (none in "cpu:oxccl").
    world = dist.group.WORLD
    if world._get_backend(torch.device("cpu")) is not world:
        ctx.fail("_get_backend(cpu)", "is not the group itself")
    # The configuration comes from torch's making of the group (it needs it before torch
    # records it, for a CUDA device_id).
    if world._config != "cpu:oxccl":
        ctx.fail("the group's configuration", f"{world._config!r}, not 'cpu:oxccl'")
    ctx.expect_error(
        "_get_backend(cuda) under cpu:oxccl",
        lambda: world._get_backend(torch.device("cuda")),
        "No backend type associated with device type cuda",
        '"cpu:oxccl,cuda:nccl"',
        types=(RuntimeError,),
    )


# torch 2.11 has neither name (nor the op), so there is nothing to ask of it there.
@case(modes=("gloo",) if hasattr(dist, "gather_single") else ())
def gather_single(ctx):
    # LIMITATION: torch 2.15's gather_single (and its alias gather_into_tensor) calls the
    # backend's gather_single, which torch's Python-backend trampoline does not forward to
    # Python (Gloo lacks it too): torch raises "Backend oxccl does not support gather_single"
    # on every rank, before anything is sent. Asserted as it is; gather() does the job.
    n = ctx.world
    out = torch.zeros(n * 2) if ctx.rank == 0 else None
    for fn in (dist.gather_single, dist.gather_into_tensor):
        ctx.expect_error(
            f"{fn.__name__} (not forwarded by torch)",
            lambda fn=fn: fn(torch.ones(2), out, group_dst=0, group=ctx.ox),
            "Backend oxccl does not support gather_single",
        )


@case()
def scatter(ctx):
    n = ctx.world
    for src in sorted({0, n - 1}):
        for dtype in ALL:
            for layout in (None, "strided"):

                def run(group, async_op, d, dtype=dtype, src=src, layout=layout):
                    ins = None
                    if group.rank() == src:
                        ins = [d(values(dtype, SHAPE, i, ("sc", src))) for i in range(n)]
                    out = torch.zeros(SHAPE, dtype=d.out)
                    if layout and d.nc:
                        out, ins = strided(out), [strided(x) for x in ins] if ins else None
                    w = dist.scatter(out, ins, group_src=src, group=group, async_op=async_op)
                    return w, [out], out

                label = f"scatter src={src}" + (f" ({layout})" if layout else "")
                compare(ctx, label, run, dtype)


@case()
def all_to_all(ctx):
    # Even sizes against Gloo; uneven ones (rank r sends i + r + 1 elements to rank i), which
    # Gloo refuses ("invalid tensor size"), against the known answer.
    n, me = ctx.world, ctx.rank
    for dtype in ALL:
        for uneven in (False, True):

            def run(group, async_op, d, dtype=dtype, uneven=uneven):
                r = group.rank()
                size = (lambda i: i + r + 1) if uneven else (lambda i: 3)
                ins = [d(values(dtype, (size(i),), r, ("a2a", i))) for i in range(n)]
                outs = [torch.zeros(size(i), dtype=d.out) for i in range(n)]
                if d.nc:
                    outs[-1] = strided(outs[-1])
                    ins[0] = strided(ins[0])
                w = dist.all_to_all(outs, ins, group=group, async_op=async_op)
                return w, outs, outs

            expected = None
            if uneven:
                expected = [values(dtype, (me + i + 1,), i, ("a2a", me)) for i in range(n)]
            elif LEGACY:  # torch 2.11's Gloo has no all_to_all: the known answer
                expected = [values(dtype, (3,), i, ("a2a", me)) for i in range(n)]
            label = "all_to_all" + (" uneven" if uneven else "")
            compare(ctx, label, run, dtype, expected=expected)


@case()
def all_to_all_single(ctx):
    n = ctx.world
    for dtype in ALL:
        for layout in ("even", "even-transposed", "uneven", "uneven-strided", "input-splits"):

            def run(group, async_op, d, dtype=dtype, layout=layout):
                r = group.rank()
                splits = {}
                if layout.startswith("even"):
                    x = d(values(dtype, (2 * n, 3), r, "a2as"))
                    out = torch.zeros_like(x)
                    if layout == "even-transposed" and d.nc:
                        x, out = transposed(x), transposed(out)
                elif layout == "input-splits":
                    # Only the input splits given (the output is then split evenly).
                    x = d(values(dtype, (2 * n, 2), r, "a2ai"))
                    out = torch.zeros_like(x)
                    splits = {"input_split_sizes": [2] * n}
                else:
                    # Rank r sends (i + r) % 3 rows of 2 to rank i; some are empty.
                    ins = [(i + r) % 3 for i in range(n)]
                    outs = [(r + i) % 3 for i in range(n)]
                    x = d(values(dtype, (sum(ins), 2), r, "a2au"))
                    out = torch.zeros((sum(outs), 2), dtype=d.out)
                    if layout == "uneven-strided" and d.nc and x.numel() and out.numel():
                        x, out = strided(x), strided(out)
                    splits = {"output_split_sizes": outs, "input_split_sizes": ins}
                w = dist.all_to_all_single(out, x, group=group, async_op=async_op, **splits)
                return w, [out], out

            compare(ctx, f"all_to_all_single {layout}", run, dtype)


@case(worlds=(2, 3, 4))
def send_recv(ctx):
    # A ring: every rank sends to rank + 1 and receives from rank - 1, sync and with
    # isend/irecv. Sync, even ranks send first and odd ranks receive first (blocking sends of
    # this size would do on both backends either way; a blocking send first on every rank is
    # p2p_orders' case for isend). Gloo's send/recv Works have no future ("Work::getFuture
    # not implemented"), oxccl's do: settle() checks them.
    n, r = ctx.world, ctx.rank
    nxt, prv = (r + 1) % n, (r - 1) % n
    for dtype in ALL:
        for how in ("sync", "async", "strided"):

            def run(group, async_op, d, dtype=dtype, how=how):
                x = d(values(dtype, SHAPE, r, "sr"))
                y = torch.zeros(SHAPE, dtype=d.out)
                if how == "strided" and d.nc:
                    x, y = strided(x), strided(y)
                if how == "async":
                    ws = dist.isend(x, group_dst=nxt, group=group)
                    wr = dist.irecv(y, group_src=prv, group=group)
                    if is_oxccl(group):
                        settle(ctx, f"isend {dtype}", ws, True, [x])
                        settle(ctx, f"irecv {dtype}", wr, True, [y])
                    else:
                        ws.wait()
                        wr.wait()
                    return None, [], y
                for step in (0, 1):
                    if (r % 2 == 0) == (step == 0):
                        dist.send(x, group_dst=nxt, group=group)
                    else:
                        got = dist.recv(y, group_src=prv, group=group)
                        want = dist.get_global_rank(group, prv)
                        if got != want:
                            raise AssertionError(f"recv returned {got}, expected {want}")
                return None, [], y

            compare(ctx, f"send/recv {how}", run, dtype, asyncs=(False,))


# Elements of the large messages of p2p_orders: 16 MiB of float32, more than any link buffers,
# so a send completes only once its peer receives it.
P2P_LARGE = 4 << 20


@case(worlds=(2, 3, 4))
def p2p_orders(ctx):
    # Sends and receives in the orders Gloo users write, which need the send to run while the
    # same rank's later receive does: every rank isends to rank + 1 and then irecvs from rank -
    # 1 (two ranks both send first); the ring all-reduce of torch's "Writing Distributed
    # Applications" tutorial (isend right, blocking recv left, then wait for the send); and
    # a receive posted before a send whose wait() comes before the next send, which the peer
    # needs before it answers. Small and large (P2P_LARGE) messages, against Gloo.
    n, r = ctx.world, ctx.rank
    nxt, prv = (r + 1) % n, (r - 1) % n
    for elems in (4, P2P_LARGE):

        def d_values(d, salt, elems=elems):
            return d(values(torch.float32, (elems,), r, salt, kind="int"))

        def both_send_first(group, _async, d):
            x = d_values(d, "p2po")
            y = torch.zeros_like(x)
            ws = dist.isend(x, group_dst=nxt, group=group)
            wr = dist.irecv(y, group_src=prv, group=group)
            wr.wait()
            ws.wait()
            return None, [], y

        def tutorial_ring(group, _async, d):
            acc = d_values(d, "ring")
            send_buff, recv_buff = acc.clone(), torch.zeros_like(acc)
            for _ in range(n - 1):
                req = dist.isend(send_buff, group_dst=nxt, group=group)
                dist.recv(recv_buff, group_src=prv, group=group)
                acc += recv_buff
                req.wait()
                send_buff, recv_buff = recv_buff, send_buff
            return None, [], acc

        def answer_after_wait(group, _async, d):
            a, b = d_values(d, "a"), d_values(d, "b")
            got = torch.zeros_like(a)
            if r == 0:
                wr = dist.irecv(got, group_src=1, group=group)
                ws = dist.isend(a, group_dst=1, group=group)
                ws.wait()
                dist.send(b, group_dst=1, group=group)
                wr.wait()
            elif r == 1:
                ga, gb = torch.zeros_like(a), torch.zeros_like(b)
                dist.recv(ga, group_src=0, group=group)
                dist.recv(gb, group_src=0, group=group)
                dist.send(ga + gb, group_dst=0, group=group)
                got = ga - gb
            return None, [], got

        for what, run in (
            ("isend then irecv", both_send_first),
            ("tutorial ring all-reduce", tutorial_ring),
            ("answer after a send's wait", answer_after_wait),
        ):
            compare(ctx, f"{what} of {elems * 4} B", run, torch.float32, asyncs=(False,))


@case(worlds=(2, 3, 4))
def p2p_around_collectives(ctx):
    # Sends and receives that a collective overtakes on one rank and not on the other, which
    # Gloo runs because it keeps point-to-point traffic apart from collectives: rank 0 starts
    # a receive (or a send larger than any link buffer), then joins an all-reduce, then waits
    # for it, while rank 1 joins the all-reduce first and sends (or receives) after it; and an
    # async all-reduce still queued when rank 0 receives what rank 1 sends before joining it.
    n, r = ctx.world, ctx.rank
    for elems in (4, P2P_LARGE):

        def d_values(d, salt, elems=elems):
            return d(values(torch.float32, (elems,), r, salt, kind="int"))

        def recv_before_collective(group, _async, d):
            x, y, z = d_values(d, "rbc-x"), torch.zeros(elems), d_values(d, "rbc-z")
            if r == 0:
                w = dist.irecv(y, group_src=1, group=group)
                dist.all_reduce(z, group=group)
                w.wait()
            else:
                dist.all_reduce(z, group=group)
                if r == 1:
                    dist.send(x, group_dst=0, group=group)
            return None, [], [y, z]

        def send_before_collective(group, _async, d):
            x, y, z = d_values(d, "sbc-x"), torch.zeros(elems), d_values(d, "sbc-z")
            if r == 0:
                w = dist.isend(x, group_dst=1, group=group)
                dist.all_reduce(z, group=group)
                w.wait()
            else:
                dist.all_reduce(z, group=group)
                if r == 1:
                    dist.recv(y, group_src=0, group=group)
            return None, [], [y, z]

        def recv_behind_async_collective(group, _async, d):
            x, y, z = d_values(d, "rba-x"), torch.zeros(elems), d_values(d, "rba-z")
            if r == 0:
                w = dist.all_reduce(z, group=group, async_op=True)
                dist.recv(y, group_src=1, group=group)
                w.wait()
            else:
                if r == 1:
                    dist.send(x, group_dst=0, group=group)
                dist.all_reduce(z, group=group)
            return None, [], [y, z]

        for what, run in (
            ("irecv, all_reduce, wait against all_reduce, send", recv_before_collective),
            ("isend, all_reduce, wait against all_reduce, recv", send_before_collective),
            ("async all_reduce, recv against send, all_reduce", recv_behind_async_collective),
        ):
            compare(ctx, f"{what} of {elems * 4} B", run, torch.float32, asyncs=(False,))


@case(worlds=(2, 3))
def collectives_in_callbacks(ctx):
    # A future's callback that makes calls on the group and waits for them, as DDP's PowerSGD
    # and quantization hooks do: oxccl's group hung for good (the callback ran on the group's
    # worker, and its calls queued behind it). Async and sync calls, a barrier, and a nested
    # callback; then the group goes on. Bounded: the outer future must be done within 30 s.
    r, n = ctx.rank, ctx.world
    total = n * (n + 1) / 2
    seen = {}

    def inner(f):
        seen["nested"] = f.value()[0].clone()
        return f.value()

    def callback(f):
        a = torch.full((4,), float(r + 1))
        dist.all_reduce(a, group=ctx.ox, async_op=True).get_future().wait()
        b = torch.full((4,), float(r + 1))
        dist.all_reduce(b, group=ctx.ox)
        dist.barrier(group=ctx.ox)
        c = torch.full((4,), float(r + 1))
        dist.all_reduce(c, group=ctx.ox, async_op=True).get_future().then(inner).wait()
        return [f.value()[0], a, b, c]

    if r == 1:
        time.sleep(0.3)  # rank 0's future completes after its callback is attached
    x = torch.full((4,), float(r + 1))
    fut = dist.all_reduce(x, group=ctx.ox, async_op=True).get_future().then(callback)
    deadline = time.monotonic() + 30
    while not fut.done() and time.monotonic() < deadline:
        time.sleep(0.01)
    if not ctx.check(fut.done(), "collectives in a callback", "not done within 30 s"):
        os._exit(3)  # the group's worker is stuck: nothing more can run
    for i, t in enumerate(fut.value()):
        ctx.same(t, torch.full((4,), total), f"collectives in a callback: result {i}")
    ctx.same(seen.get("nested"), torch.full((4,), total), "nested callback")
    y = torch.ones(4)
    dist.all_reduce(y, group=ctx.ox)
    ctx.same(y, torch.full((4,), float(n)), "all_reduce after the callbacks")


@case(worlds=(2, 3))
def is_completed_after_wait(ctx):
    # Poll, then wait: is_completed() must be True once wait() returned (oxccl's said False
    # in about two runs of three: torch wakes a future's waiters before its chained
    # callbacks run, and is_completed asks the chained future).
    late = 0
    for i in range(200):
        for size in (4, 1 << 18):
            x = torch.full((size,), float(ctx.rank + i))
            w = dist.all_reduce(x, group=ctx.ox, async_op=True)
            w.is_completed()
            w.wait()
            late += not w.is_completed()
    ctx.check(late == 0, "is_completed() after wait()", f"False in {late} of 400 calls")


@case(worlds=(2, 3, 4))
def work_wait_timeout(ctx):
    # Work.wait(timeout): raises once the timeout passes with the operation unfinished (rank 1
    # joins 0.8 s late), as Gloo's does; the operation goes on, and a later wait() completes
    # it with the right result. On a finished work it returns True at once.
    r, n = ctx.rank, ctx.world
    short = datetime.timedelta(seconds=0.1)
    for kind in ("all_reduce", "irecv"):
        x = torch.full((4,), float(r + 1))
        dist.barrier(group=ctx.gloo)
        if r == 1:
            time.sleep(0.8)
        if kind == "all_reduce":
            w = dist.all_reduce(x, group=ctx.ox, async_op=True)
            want = torch.full((4,), n * (n + 1) / 2)
        elif r == 0:
            w = dist.irecv(x, group_src=1, group=ctx.ox)
            want = torch.full((4,), 2.0)
        elif r == 1:
            w = dist.isend(x, group_dst=0, group=ctx.ox)
            want = torch.full((4,), 2.0)
        else:
            continue
        if r == 0:
            ctx.expect_error(
                f"{kind}: wait(timeout) before the peer came",
                lambda w=w: w.wait(timeout=short),
                "not completed within",
                types=(dist.DistBackendError,),
            )
        ctx.check(w.wait() is True, f"{kind}: wait() after a timed-out wait()", "not True")
        ctx.same(x, want, f"{kind}: result after a timed-out wait()")
        start = time.monotonic()
        ctx.check(w.wait(timeout=short) is True, f"{kind}: wait(timeout) when done", "not True")
        took = time.monotonic() - start
        ctx.check(took < 0.1, f"{kind}: wait(timeout) when done", f"took {took:.3f} s")


@case(worlds=(3, 4))
def p2p_pairs_on_first_use(ctx):
    # A pair's communicator is made when the first message between its two ranks starts, in
    # whatever order the ranks reach their pairs; on fresh groups of each backend, so that
    # every pair is new: a monitored_barrier while rank 1's receive waits for the pair whose
    # other rank sends only after the barrier, and a ring where each rank's first message
    # goes to a different pair (rank 0 receives from 2 before it sends to 1; rank 1 starts a
    # receive from 0, then a send to 2; rank 2 receives from 1, then sends to 0).
    # (torch 2.11 has monitored_barrier on Gloo only: there the ring alone.)
    r = ctx.rank
    timeout = datetime.timedelta(seconds=60)
    for backend in ("gloo", "oxccl"):
        if not LEGACY:
            g = dist.new_group(backend=backend, timeout=timeout)
            y = torch.zeros(4)
            if r == 1:
                w = dist.irecv(y, group_src=0, group=g)
                dist.monitored_barrier(group=g, timeout=timeout)
                w.wait()
            else:
                dist.monitored_barrier(group=g, timeout=timeout)
                if r == 0:
                    dist.send(torch.full((4,), 7.0), group_dst=1, group=g)
            want = torch.full((4,), 7.0 if r == 1 else 0.0)
            ctx.same(y, want, f"{backend}: receive across a barrier")
            dist.destroy_process_group(g)
        g = dist.new_group(backend=backend, timeout=timeout)
        x = torch.zeros(4)
        if r == 0:
            dist.recv(x, group_src=2, group=g)
            dist.send(x + 1, group_dst=1, group=g)
        elif r == 1:
            a = dist.irecv(x, group_src=0, group=g)
            b = dist.isend(torch.ones(4), group_dst=2, group=g)
            b.wait()
            a.wait()
        elif r == 2:
            dist.recv(x, group_src=1, group=g)
            dist.send(x + 1, group_dst=0, group=g)
        want = {0: 2.0, 1: 3.0, 2: 1.0}.get(r, 0.0)
        ctx.same(x, torch.full((4,), want), f"{backend}: ring of pairs made on first use")
        dist.destroy_process_group(g)


@case(worlds=(2, 3, 4))
def p2p_mismatch(ctx):
    # A receive that does not match the peer's send (8 elements against 16) fails at the
    # receiver, naming both messages, without writing the data. The two ranks' point-to-point
    # traffic is broken after the mismatch, so this runs on a throwaway group.
    # The two highest ranks: their point-to-point communicator numbers them 0 and 1, and the
    # error must name them as the group does.
    g = dist.new_group(backend="oxccl", timeout=datetime.timedelta(seconds=30))
    r, sender, receiver = ctx.rank, ctx.world - 2, ctx.world - 1
    if r == sender:
        try:
            dist.isend(torch.full((16,), 1.0), group_dst=receiver, group=g).wait()
        except dist.DistBackendError:
            pass  # the receiver's notice may come back first; the receiver's error is checked
    elif r == receiver:
        y = torch.zeros(8)
        w = dist.irecv(y, group_src=sender, group=g)
        ctx.expect_error(
            "a receive of 32 B from a send of 64 B",
            w.wait,
            "does not match",
            f"rank {receiver} called receive #0 of 32 B",
            f"rank {sender} called send #0 of 64 B",
            types=(dist.DistBackendError,),
        )
        ctx.check(torch.equal(y, torch.zeros(8)), "p2p_mismatch", f"the receive wrote {y.tolist()}")
    # The group's collectives go on (they do not share the broken communicator).
    t = torch.full((4,), float(r))
    dist.all_reduce(t, group=g)
    n = ctx.world
    ctx.same(t, torch.full((4,), n * (n - 1) / 2), "all_reduce after a point-to-point mismatch")
    dist.destroy_process_group(g)
    # A batch that failed on one pair does not hold up this rank's next message on another:
    # rank 0's batch receives from 1 (a mismatch) and from 2, which sends only after it has
    # received rank 0's next isend; that isend starts at once (it once waited for the batch's
    # other receive, until the timeout).
    if ctx.world >= 3:
        g = dist.new_group(backend="oxccl", timeout=datetime.timedelta(seconds=30))
        if r == 0:
            a, b = torch.zeros(8), torch.zeros(4)
            ops = [
                dist.P2POp(dist.irecv, a, group=g, group_peer=1),
                dist.P2POp(dist.irecv, b, group=g, group_peer=2),
            ]
            works = dist.batch_isend_irecv(ops)
            time.sleep(1)  # the mismatch's failure arrives meanwhile
            start = time.monotonic()
            w = dist.isend(torch.full((4,), 3.0), group_dst=2, group=g)
            took = time.monotonic() - start
            ctx.check(took < 5, "isend after a failed batch", f"isend took {took:.1f} s")
            w.wait()
            ctx.expect_error(
                "a batch with a mismatched receive",
                lambda: [x.wait() for x in works],
                "does not match",
                types=(dist.DistBackendError,),
            )
            ctx.same(b, torch.full((4,), 3.0), "the batch's other receive")
        elif r == 1:
            try:
                dist.send(torch.ones(16), group_dst=0, group=g)
            except dist.DistBackendError:
                pass
        elif r == 2:
            y = torch.zeros(4)
            dist.recv(y, group_src=0, group=g)
            dist.send(y, group_dst=0, group=g)
        dist.destroy_process_group(g)
    # The same with equal lengths and other tags (Gloo would match the tags out of order;
    # oxccl pairs in order and refuses the tag, writing nothing), after a pair whose tags agree.
    g = dist.new_group(backend="oxccl", timeout=datetime.timedelta(seconds=30))
    if r == 0:
        dist.send(torch.full((4,), 5.0), group_dst=1, group=g, tag=7)
        try:
            dist.isend(torch.full((4,), 1.0), group_dst=1, group=g, tag=1).wait()
        except dist.DistBackendError:
            pass
    elif r == 1:
        y = torch.zeros(4)
        dist.recv(y, group_src=0, group=g, tag=7)
        ctx.check(torch.equal(y, torch.full((4,), 5.0)), "p2p tags", f"received {y.tolist()}")
        y = torch.zeros(4)
        w = dist.irecv(y, group_src=0, group=g, tag=2)
        ctx.expect_error(
            "a receive with tag 2 of a send with tag 1",
            w.wait,
            "does not match",
            "receive #1 of 16 B with tag 2",
            "send #1 of 16 B with tag 1",
            types=(dist.DistBackendError,),
        )
        ctx.check(torch.equal(y, torch.zeros(4)), "p2p tags", f"the receive wrote {y.tolist()}")
    dist.destroy_process_group(g)


@case()
def batch_isend_irecv(ctx):
    # A ring exchange both ways as one batch (a group of sends and receives, in an order that
    # would deadlock unbatched). At world size 1 each rank sends to and receives from itself:
    # Gloo cannot ("Pair is not connected"), so there the expected result is the inputs.
    n, r = ctx.world, ctx.rank
    nxt, prv = (r + 1) % n, (r - 1) % n
    for dtype in ALL:

        def run(group, async_op, d, dtype=dtype):
            a = d(values(dtype, SHAPE, r, "bi-a"))
            b = d(values(dtype, (7,), r, "bi-b"))
            ya, yb = torch.zeros(SHAPE, dtype=d.out), torch.zeros(7, dtype=d.out)
            if d.nc:
                ya = strided(ya)
            ops = [
                dist.P2POp(dist.irecv, ya, group=group, group_peer=prv),
                dist.P2POp(dist.isend, a, group=group, group_peer=nxt),
                dist.P2POp(dist.isend, b, group=group, group_peer=prv),
                dist.P2POp(dist.irecv, yb, group=group, group_peer=nxt),
            ]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
                if d.nc:
                    ctx.check(w.is_completed(), f"batch_isend_irecv {dtype}", "not completed")
            return None, [], [ya, yb]

        expected = None
        if n == 1:
            expected = [values(dtype, SHAPE, 0, "bi-a"), values(dtype, (7,), 0, "bi-b")]
        compare(ctx, "batch_isend_irecv", run, dtype, asyncs=(False,), expected=expected)


@case()
def barrier(ctx):
    for async_op in (False, True):
        w = dist.barrier(group=ctx.ox, async_op=async_op)
        settle(ctx, f"barrier async_op={async_op}", w, async_op, [])
    # A barrier orders: rank 0 sets a key late, then enters; the others look after theirs.
    store = dist.distributed_c10d._get_default_store()
    key = f"oxccl-test-barrier-{ctx.mode}"
    if ctx.rank == 0:
        time.sleep(0.2)
        store.set(key, "1")
    dist.barrier(group=ctx.ox)
    if ctx.rank != 0:
        ctx.check(store.check([key]), "barrier", "returned before rank 0 got there")


@case(modes=("gloo", "oxccl"))
def monitored_barrier(ctx):
    # torch forwards monitored_barrier to a Python backend; oxccl's goes through the group's
    # store. In oxccl mode the oxccl group is the default one (no group argument).
    kw = {} if ctx.mode == "oxccl" else {"group": ctx.ox}
    if LEGACY:
        # torch 2.11 runs monitored_barrier on groups made by "gloo" only (not "cpu:gloo").
        ctx.expect_error(
            "monitored_barrier (torch 2.11: Gloo only)",
            lambda: dist.monitored_barrier(timeout=datetime.timedelta(seconds=30), **kw),
            "only implemented for GLOO",
            types=(ValueError,),
        )
        return
    for wait_all in (False, True):
        dist.monitored_barrier(
            timeout=datetime.timedelta(seconds=30), wait_all_ranks=wait_all, **kw
        )
    dist.monitored_barrier(group=ctx.gloo, timeout=datetime.timedelta(seconds=30))
    n, r = ctx.world, ctx.rank
    if n < 2:
        return
    # Ranks that do not come: rank 0 names them (all of them with wait_all_ranks, else the
    # first), the others hear nothing from rank 0 in time. A throwaway group: its barrier
    # count is off afterwards.
    g = dist.new_group(backend="oxccl")
    absent = [n - 1] if n < 3 else [n - 2, n - 1]
    wait_all = n >= 3
    if r not in absent:
        short = datetime.timedelta(seconds=1)
        if r == 0:
            # (A rank that came more than a second late would be named too: not asserted.)
            named = [f"{a} (global {a})" for a in (absent if wait_all else absent[:1])]
            needles = (ctx.where("monitored_barrier", g), "did not reach the barrier", *named)
        else:
            # Rank 0's word that it gave up, or its silence, whichever comes first.
            needles = (ctx.where("monitored_barrier", g), "rank 0 ")
        ctx.expect_error(
            f"monitored_barrier without rank(s) {absent}, wait_all_ranks={wait_all}",
            lambda: dist.monitored_barrier(group=g, timeout=short, wait_all_ranks=wait_all),
            *needles,
            types=(dist.DistBackendError,),
        )
    else:
        # Late, after rank 0 gave up: told so at once, not after its own 30 s.
        time.sleep(1.5)
        start = time.monotonic()
        ctx.expect_error(
            "monitored_barrier reached after rank 0 gave up",
            lambda: dist.monitored_barrier(group=g, timeout=datetime.timedelta(seconds=30)),
            ctx.where("monitored_barrier", g),
            "rank 0 gave up waiting",
            "did not reach the barrier",
            types=(dist.DistBackendError,),
        )
        took = time.monotonic() - start
        ctx.check(took < 10, "monitored_barrier reached late", f"raised after {took:.1f} s")
    dist.barrier(group=ctx.gloo)
    dist.destroy_process_group(g)


@case()
def async_order(ctx):
    # Many async collectives in flight at once, mixed with a sync one: they run in issue
    # order, and each Work's future holds its own outputs.
    n = ctx.world
    xs = [torch.full((1000,), float(ctx.rank + i)) for i in range(8)]
    works = [dist.all_reduce(x, group=ctx.ox, async_op=True) for x in xs[:4]]
    y = torch.full((3,), float(ctx.rank))
    dist.all_reduce(y, group=ctx.ox)  # sync, behind the queued ones
    works += [dist.all_reduce(x, group=ctx.ox, async_op=True) for x in xs[4:]]
    base = n * (n - 1) / 2
    for i, (w, x) in enumerate(zip(works, xs)):
        settle(ctx, f"async all_reduce #{i}", w, True, [x])
        ctx.same(x, torch.full((1000,), base + n * i), f"async all_reduce #{i}")
    ctx.same(y, torch.full((3,), base), "sync all_reduce behind async ones")


# -- groups --


def split_calls():
    """Every oxcclCommSplit so far: (color, key) (see count_splits)."""
    from oxccl import _lib

    return list(_lib.split.calls)


def subgroup_checks(ctx, sub_ox, sub_gloo, what):
    """A few collectives on a subgroup, oxccl against Gloo over the same ranks."""
    saved = ctx.ox, ctx.gloo
    ctx.ox, ctx.gloo = sub_ox, sub_gloo
    try:
        for dtype, op in ((torch.float32, RO.SUM), (torch.int64, RO.MAX)):
            check_all_reduce(ctx, dtype, op)
        m = sub_ox.size()

        def run_ag(group, async_op, d):
            x = values(torch.float64, (5,), group.rank(), what)
            out = torch.zeros(5 * m, dtype=torch.float64)
            w = dist.all_gather_into_tensor(out, x, group=group, async_op=async_op)
            return w, [out], out

        compare(ctx, f"{what}: all_gather_into_tensor", run_ag, torch.float64)

        def run_bc(group, async_op, d):
            x = values(torch.int32, (6,), group.rank(), what)
            w = dist.broadcast(x, group_src=m - 1, group=group, async_op=async_op)
            return w, [x], x

        compare(ctx, f"{what}: broadcast from its last rank", run_bc, torch.int32)
    finally:
        ctx.ox, ctx.gloo = saved


@case(worlds=(2, 3, 4))
def new_group_subset(ctx):
    # A plain new_group (no device_id at init): only the members take part, and the oxccl
    # group is a fresh communicator made through the subgroup's store: no split.
    n = ctx.world
    ranks = list(range(0, n, 2)) if n > 2 else [1]
    before = len(split_calls())
    sub_ox = dist.new_group(ranks, backend="oxccl")
    sub_gloo = dist.new_group(ranks, backend="gloo")
    ctx.check(len(split_calls()) == before, "new_group", f"splits ran: {split_calls()[before:]}")
    if ctx.rank not in ranks:
        ctx.check(sub_ox == dist.GroupMember.NON_GROUP_MEMBER, "new_group", "non-member got one")
        return
    ctx.check(sub_ox.size() == len(ranks), "new_group", f"size {sub_ox.size()}")
    ctx.check(sub_ox.rank() == ranks.index(ctx.rank), "new_group", f"rank {sub_ox.rank()}")
    ctx.check(is_oxccl(sub_ox), "new_group", dist.get_backend(sub_ox))
    subgroup_checks(ctx, sub_ox, sub_gloo, f"new_group({ranks})")


# torch 2.11 splits only groups bound to an accelerator: not these cases there.
@case(modes=() if LEGACY else ("gloo", "oxccl"), worlds=(2, 3, 4))
def split_group(ctx):
    # torch.distributed.split_group(parent_pg=<an oxccl group>): OxcclBackend.split ->
    # oxcclCommSplit on every rank of the parent (color -1 on ranks in no split group).
    #
    # LIMITATION (torch's): a rank in none of the split groups (rank 1 at world size 3 here)
    # should get GroupMember.NON_GROUP_MEMBER, but torch 2.15's trampoline for a Python
    # backend's split crashes (null dereference) when the backend answers None. So that rank
    # takes part in the split and then raises a DistBackendError saying so; the members' groups
    # are made and work. Gloo gives such a rank NON_GROUP_MEMBER.
    n = ctx.world
    groups = {2: [[0, 1]], 3: [[0, 2]], 4: [[0, 2], [1, 3]]}[n]
    mine = next((g for g in groups if ctx.rank in g), None)
    before = len(split_calls())
    if mine is None:
        ctx.expect_error(
            "split_group on a rank in none of the groups",
            lambda: dist.split_group(parent_pg=ctx.ox, split_ranks=groups),
            ctx.where("split_group"),
            "this rank is in none of the new groups",
            types=(dist.DistBackendError,),
        )
    else:
        sub_ox = dist.split_group(parent_pg=ctx.ox, split_ranks=groups)
    sub_gloo = dist.split_group(parent_pg=ctx.gloo, split_ranks=groups)
    calls = split_calls()[before:]
    want = [(min(mine), mine.index(ctx.rank))] if mine else [(-1, 0)]
    ctx.check(calls == want, "split_group", f"expected oxcclCommSplit calls {want}, saw {calls}")
    if mine is None:
        ctx.check(sub_gloo == dist.GroupMember.NON_GROUP_MEMBER, "split_group", "gloo: a group")
        dist.barrier(group=ctx.gloo)
        ctx.expect_error(
            "split_group(timeout=1 s) on a rank in none of the groups",
            lambda: dist.split_group(
                parent_pg=ctx.ox, split_ranks=groups, timeout=datetime.timedelta(seconds=1)
            ),
            "this rank is in none of the new groups",
            types=(dist.DistBackendError,),
        )
        return
    ctx.check(is_oxccl(sub_ox), "split_group", dist.get_backend(sub_ox))
    ctx.check(sub_ox.size() == len(mine), "split_group", f"size {sub_ox.size()}")
    ctx.check(sub_ox.rank() == mine.index(ctx.rank), "split_group", f"rank {sub_ox.rank()}")
    subgroup_checks(ctx, sub_ox, sub_gloo, f"split_group({mine})")
    # The split group's own timeout, not the parent's (it kept the parent's before): its
    # second member joins an all_reduce 2.5 s late, the first gives up after 1 s.
    dist.barrier(group=ctx.gloo)
    short = dist.split_group(
        parent_pg=ctx.ox, split_ranks=groups, timeout=datetime.timedelta(seconds=1)
    )
    x = torch.ones(4)
    if mine.index(ctx.rank) == 0:
        start = time.monotonic()
        ctx.expect_error(
            "split_group(timeout=1 s): a member 2.5 s late",
            lambda: dist.all_reduce(x, group=short),
            "timed out after 1.0s",
            types=(dist.DistBackendError,),
        )
        took = time.monotonic() - start
        ctx.check(took < 2.4, "split_group(timeout=1 s)", f"raised after {took:.1f} s")
    else:
        time.sleep(2.5)
        try:  # fails too (its peer gave up): only the first member's error is checked
            dist.all_reduce(x, group=short)
        except dist.DistBackendError:
            pass
    dist.destroy_process_group(short)


@case(modes=() if LEGACY else ("oxccl",), worlds=(4,))
def new_group_after_device_id(ctx):
    # init_process_group(..., device_id=torch.device("cpu", 0)) binds the default group, so a
    # new_group of the same backend is split from it (torch's _get_split_source): members run
    # OxcclBackend.split (color: the group's first rank), the others perform_nocolor_split
    # (color -1), both through oxcclCommSplit.
    ranks = [1, 2, 3]
    before = len(split_calls())
    sub_ox = dist.new_group(ranks)
    sub_gloo = dist.new_group(ranks, backend="gloo")
    calls = split_calls()[before:]
    want = [(1, ranks.index(ctx.rank))] if ctx.rank in ranks else [(-1, 0)]
    ctx.check(calls == want, "new_group", f"expected oxcclCommSplit calls {want}, saw {calls}")
    if ctx.rank in ranks:
        ctx.check(is_oxccl(sub_ox), "new_group", dist.get_backend(sub_ox))
        ctx.check(sub_ox.rank() == ranks.index(ctx.rank), "new_group", f"rank {sub_ox.rank()}")
        subgroup_checks(ctx, sub_ox, sub_gloo, "new_group([1, 2, 3]) after device_id")


@case(modes=() if LEGACY else ("oxccl",), worlds=(4,))
def device_mesh(ctx):
    # A 2 x 2 DeviceMesh on the oxccl default group: on CPU torch makes each dimension's
    # groups with new_group (one call per group, every rank), split from the bound default
    # group. Collectives on each dimension, also through the functional collectives DTensor
    # uses, against the known answer.
    from torch.distributed import _functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh

    r = ctx.rank
    before = len(split_calls())
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    calls = split_calls()[before:]
    # dp groups [0, 2] and [1, 3], then tp groups [0, 1] and [2, 3]: a member's split has
    # the group's first rank as color and the rank's place in it as key, else (-1, 0).
    want = []
    for groups in ([[0, 2], [1, 3]], [[0, 1], [2, 3]]):
        for g in groups:
            want.append((g[0], g.index(r)) if r in g else (-1, 0))
    ctx.check(calls == want, "device_mesh", f"expected oxcclCommSplit calls {want}, saw {calls}")
    grid = mesh.mesh.tolist()  # [[0, 1], [2, 3]]
    for dim, name in enumerate(("dp", "tp")):
        group = mesh.get_group(name)
        what = f"device_mesh dim {name}"
        ctx.check(is_oxccl(group), what, dist.get_backend(group))
        members = [row[r % 2] for row in grid] if dim == 0 else grid[r // 2]
        ranks = dist.get_process_group_ranks(group)
        ctx.check(ranks == members, what, f"ranks {ranks}, expected {members}")
        for async_op in (False, True):
            x = torch.full((4,), float(r + 1))
            w = dist.all_reduce(x, group=group, async_op=async_op)
            settle(ctx, f"{what}: all_reduce", w, async_op, [x])
            want_x = torch.full((4,), float(sum(m + 1 for m in members)))
            ctx.same(x, want_x, f"{what}: all_reduce async_op={async_op}")
        out = torch.zeros(2 * 3, dtype=torch.int64)
        dist.all_gather_into_tensor(out, torch.full((3,), r), group=group)
        ctx.same(out, torch.tensor(members).repeat_interleave(3), f"{what}: all_gather")
        y = funcol.wait_tensor(funcol.all_reduce(torch.full((2,), float(r)), "sum", (mesh, dim)))
        ctx.same(y, torch.full((2,), float(sum(members))), f"{what}: funcol.all_reduce")
        z = funcol.all_gather_tensor(torch.full((1,), float(r)), 0, (mesh, dim))
        z = funcol.wait_tensor(z)
        ctx.same(z, torch.tensor(members, dtype=torch.float32), f"{what}: funcol.all_gather")
        z = funcol.reduce_scatter_tensor(torch.arange(2.0) + r, "sum", 0, (mesh, dim))
        z = funcol.wait_tensor(z)
        i = members.index(r)
        want_z = torch.tensor([float(sum(members)) + 2 * i])
        ctx.same(z, want_z, f"{what}: funcol.reduce_scatter_tensor")


# -- objects --


def obj_of(rank, salt):
    # Of uneven sizes on purpose (the object collectives exchange sizes, then pad).
    return {"rank": rank, "salt": salt, "s": "x" * (3 + 17 * rank), "t": torch.arange(rank + 1)}


def same_obj(ctx, a, b, what):
    ok = (
        isinstance(a, dict)
        and a.keys() == b.keys()
        and all(
            torch.equal(a[k], v) if isinstance(v, torch.Tensor) else a[k] == v for k, v in b.items()
        )
    )
    ctx.check(ok, what, f"got {a!r}, expected {b!r}")


@case(modes=("gloo", "oxccl"))
def object_collectives(ctx):
    # all_gather_object, broadcast_object_list, gather_object, scatter_object_list and
    # send/recv_object_list, on the Gloo group and on the oxccl group, against the known
    # answer. In oxccl mode the oxccl group is the default one: no group argument is passed.
    n, r = ctx.world, ctx.rank
    for group, label in ((ctx.gloo, "gloo"), (ctx.ox, "oxccl")):
        kw = {} if (ctx.mode == "oxccl" and group is ctx.ox) else {"group": group}
        out = [None] * n
        dist.all_gather_object(out, obj_of(r, "ago"), **kw)
        for i in range(n):
            same_obj(ctx, out[i], obj_of(i, "ago"), f"{label} all_gather_object [{i}]")
        src = n - 1
        lst = [obj_of(r, "bol"), r] if r == src else [None, None]
        dist.broadcast_object_list(lst, src=src, **kw)
        same_obj(ctx, lst[0], obj_of(src, "bol"), f"{label} broadcast_object_list")
        ctx.check(lst[1] == src, f"{label} broadcast_object_list", f"got {lst[1]!r}")
        got = [None] * n if r == 0 else None
        dist.gather_object(obj_of(r, "go"), got, dst=0, **kw)
        if r == 0:
            for i in range(n):
                same_obj(ctx, got[i], obj_of(i, "go"), f"{label} gather_object [{i}]")
        out1 = [None]
        ins = [obj_of(i, "sol") for i in range(n)] if r == 0 else None
        dist.scatter_object_list(out1, ins, src=0, **kw)
        same_obj(ctx, out1[0], obj_of(r, "sol"), f"{label} scatter_object_list")
        if n >= 2 and r < 2:
            if r == 0:
                dist.send_object_list([obj_of(0, "p2p"), "end"], dst=1, **kw)
            else:
                lst = [None, None]
                dist.recv_object_list(lst, src=0, **kw)
                same_obj(ctx, lst[0], obj_of(0, "p2p"), f"{label} recv_object_list")
                ctx.check(lst[1] == "end", f"{label} recv_object_list", repr(lst[1]))


# -- errors --


@case(modes=("gloo", "oxccl"))
def errors_unsupported(ctx):
    # Unsupported dtypes and operators: a ValueError naming the backend, the operation, the
    # rank and the dtype, raised on every rank before anything is sent (so no rank hangs).
    n = ctx.world
    calls = [
        ("all_reduce", lambda t, a: dist.all_reduce(t, group=ctx.ox, async_op=a)),
        ("broadcast", lambda t, a: dist.broadcast(t, group_src=0, group=ctx.ox, async_op=a)),
        (
            "all_gather_into_tensor",
            lambda t, a: dist.all_gather_into_tensor(
                torch.zeros(n * 4, dtype=t.dtype), t, group=ctx.ox, async_op=a
            ),
        ),
        ("isend", lambda t, a: dist.isend(t, group_dst=0, group=ctx.ox)),
    ]
    for dtype in (torch.int16, torch.uint16):
        for op, fn in calls:
            for async_op in (False, True):
                ctx.expect_error(
                    f"{op} {dtype} async_op={async_op}",
                    lambda fn=fn, dtype=dtype, a=async_op: fn(torch.ones(4, dtype=dtype), a),
                    ctx.where("send to 0" if op == "isend" else op),
                    "unsupported dtype",
                    str(dtype),
                    types=(ValueError,),
                )
    for dtype, op in ((torch.float32, RO.BAND), (torch.bfloat16, RO.BXOR), (torch.float16, RO.BOR)):
        for async_op in (False, True):
            ctx.expect_error(
                f"all_reduce {op_name(op)} {dtype} async_op={async_op}",
                lambda dtype=dtype, op=op, a=async_op: dist.all_reduce(
                    torch.ones(4, dtype=dtype), op=op, group=ctx.ox, async_op=a
                ),
                ctx.where("all_reduce"),
                op_name(op),
                str(dtype),
                types=(ValueError,),
            )
    # MAX on complex: torch refuses it for all_reduce before the backend sees it (torch's
    # message, which names neither rank nor backend). reduce and reduce_scatter hand complex
    # tensors to the backend as they are, and it refuses.
    ctx.expect_error(
        "all_reduce MAX complex64",
        lambda: dist.all_reduce(torch.ones(4, dtype=torch.complex64), op=RO.MAX, group=ctx.ox),
        "all_reduce does not support RedOpType.MAX on complex tensors",
        types=(ValueError,),
    )
    c = torch.ones(4 * n, dtype=torch.complex64)
    for op, fn in (
        ("reduce", lambda: dist.reduce(c, group_dst=0, op=RO.MAX, group=ctx.ox)),
        (
            "reduce_scatter_tensor",
            lambda: dist.reduce_scatter_tensor(c[:4].clone(), c, op=RO.MIN, group=ctx.ox),
        ),
        (
            "reduce_scatter",
            lambda: dist.reduce_scatter(
                c[:4].clone(), list(c.chunk(n)), op=RO.PRODUCT, group=ctx.ox
            ),
        ),
    ):
        ctx.expect_error(
            f"{op} of complex64 with MAX/MIN/PRODUCT",
            fn,
            ctx.where(op),
            "complex",
            types=(ValueError,),
        )
    # complex128 is moved and summed as float64 pairs.
    x = torch.full((3,), complex(ctx.rank, 1), dtype=torch.complex128)
    dist.all_reduce(x, group=ctx.ox)
    want = torch.full((3,), complex(n * (n - 1) / 2, n), dtype=torch.complex128)
    ctx.same(x, want, "all_reduce SUM complex128")


@case(modes=("gloo", "oxccl"))
def errors_bad_root(ctx):
    # A root or peer outside the group: torch does not check group_src/group_dst; the backend
    # does, on every rank, before anything is sent.
    n = ctx.world
    bad = n
    t = torch.ones(4)
    for op, fn in (
        ("broadcast", lambda: dist.broadcast(t, group_src=bad, group=ctx.ox)),
        ("reduce", lambda: dist.reduce(t, group_dst=bad, group=ctx.ox)),
        ("gather", lambda: dist.gather(t, None, group_dst=bad, group=ctx.ox)),
        ("scatter", lambda: dist.scatter(t, None, group_src=bad, group=ctx.ox)),
    ):
        ctx.expect_error(
            f"{op} with root {bad}", fn, ctx.where(op), f"root {bad} is not a rank of this group"
        )
    ctx.expect_error(
        f"isend to {bad}",
        lambda: dist.isend(t, group_dst=bad, group=ctx.ox),
        ctx.where(f"send to {bad}"),
        "not a rank of this group",
    )
    ctx.expect_error(
        f"irecv from {bad}",
        lambda: dist.irecv(t, group_src=bad, group=ctx.ox),
        ctx.where(f"recv from {bad}"),
        "not a rank of this group",
    )


@case(modes=("gloo", "oxccl"))
def errors_recv_any_source(ctx):
    # recv without a source: oxccl (like NCCL) cannot receive from any source. It must raise
    # at once on the receiving rank (not hang), saying so. In oxccl mode this is the default
    # group: plain dist.recv(t).
    t = torch.zeros(4)
    kw = {} if ctx.mode == "oxccl" else {"group": ctx.ox}
    for fn in (dist.recv, dist.irecv):
        ctx.expect_error(
            f"{fn.__name__} without src",
            lambda fn=fn: fn(t, **kw),
            ctx.where("recv"),
            "receiving from any source is not supported",
            types=(dist.DistBackendError,),
        )


@case()
def errors_sizes(ctx):
    # Local size mismatches torch does not check: the backend says which, naming the
    # operation and the rank, on every rank before anything is sent.
    n = ctx.world
    z, o = torch.zeros, torch.ones
    checks = [
        ("all_gather_into_tensor", lambda: dist.all_gather_into_tensor(z(n * 4 + 1), o(4), ctx.ox)),
        (
            "reduce_scatter_tensor",
            lambda: dist.reduce_scatter_tensor(z(4), o(n * 4 + 1), group=ctx.ox),
        ),
        (
            "all_to_all_single",
            lambda: dist.all_to_all_single(z(n + 1), o(n + 1), [1] * n, [1] * n, group=ctx.ox),
        ),
        (
            "all_to_all_single",
            lambda: dist.all_to_all_single(z(n), o(n), [1] * (n + 1), [1] * n, group=ctx.ox),
        ),
        ("all_gather", lambda: dist.all_gather([z(4) for _ in range(n)], o(5), group=ctx.ox)),
        ("all_gather", lambda: dist.all_gather([z(4) for _ in range(n + 1)], o(4), group=ctx.ox)),
        (
            "all_gather_coalesced",
            lambda: dist.all_gather_coalesced([[z(4)] for _ in range(n + 1)], [o(4)], group=ctx.ox),
        ),
        (
            "all_gather_coalesced",
            lambda: dist.all_gather_coalesced(
                [[z(4), z(2)] for _ in range(n)], [o(4)], group=ctx.ox
            ),
        ),
        ("all_to_all", lambda: dist.all_to_all([z(2)] * (n + 1), [o(2)] * (n + 1), group=ctx.ox)),
        ("reduce_scatter", lambda: dist.reduce_scatter(z(3), [o(4)] * n, group=ctx.ox)),
        ("reduce_scatter", lambda: dist.reduce_scatter(z(4), [o(4)] * (n + 1), group=ctx.ox)),
    ]
    if n > 1:
        checks.append(
            ("all_to_all_single", lambda: dist.all_to_all_single(z(n + 1), o(n + 1), group=ctx.ox))
        )
    if ctx.rank == 0:  # only the root sees the list
        checks.append(
            ("scatter", lambda: dist.scatter(z(4), [o(5)] * n, group_src=0, group=ctx.ox))
        )
        checks.append(
            ("gather", lambda: dist.gather(o(4), [z(4)] * (n + 1), group_dst=0, group=ctx.ox))
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        for i, (op, fn) in enumerate(checks):
            ctx.expect_error(f"{op} size mismatch #{i}", fn, ctx.where(op), types=(ValueError,))


@case(worlds=(2, 3, 4))
def errors_across_ranks(ctx):
    # Ranks that disagree (rank 0 all_reduces 4 elements, the others 8): torch cannot see it;
    # oxccl does, and every rank raises DistBackendError naming the operation and the
    # mismatch. The communicator is then broken for good: later calls fail at once, saying
    # why. (A throwaway group, so the other cases are not affected.)
    g = dist.new_group(backend="oxccl", timeout=datetime.timedelta(seconds=30))
    where = ctx.where("all_reduce", g)
    t0 = time.monotonic()
    ctx.expect_error(
        "all_reduce of different sizes",
        lambda: dist.all_reduce(torch.ones(4 if ctx.rank == 0 else 8), group=g),
        where,
        "does not match",
        types=(dist.DistBackendError,),
    )
    for async_op in (False, True):

        def later(async_op=async_op):
            w = dist.all_reduce(torch.ones(4), group=g, async_op=async_op)
            if w is not None:
                w.wait()

        ctx.expect_error(
            f"all_reduce after the mismatch, async_op={async_op}",
            later,
            where,
            "does not match",
            types=(dist.DistBackendError,),
        )
    elapsed = time.monotonic() - t0
    ctx.check(elapsed < 10, "errors_across_ranks", f"took {elapsed:.1f} s (a timeout?)")
    dist.destroy_process_group(g)


@case(modes=("gloo", "oxccl"))
def errors_after_shutdown(ctx):
    # A group whose backend was shut down: sync calls raise, and async calls hand the error to
    # Work.wait() and the future (the worker thread ran them), naming the rank and operation.
    g = dist.new_group(backend="oxccl")
    backend = g._get_backend(torch.device("cpu"))
    dist.all_reduce(torch.ones(2), group=g)
    backend.shutdown()
    where = ctx.where("all_reduce", g)
    gone = "the communicator was shut down"
    ctx.expect_error(
        "sync all_reduce after shutdown",
        lambda: dist.all_reduce(torch.ones(2), group=g),
        where,
        gone,
        types=(dist.DistBackendError,),
    )
    w = dist.all_reduce(torch.ones(2), group=g, async_op=True)
    ctx.expect_error("async all_reduce after shutdown: Work.wait()", w.wait, where, gone)
    ctx.expect_error(
        "async all_reduce after shutdown: the future", lambda: w.get_future().wait(), where, gone
    )
    dist.destroy_process_group(g)


# -- main --


def init(mode):
    # device_id needs an index: torch 2.15 refuses torch.device("cpu") ("must be a device
    # with a valid index, e.g. cpu:0").
    if mode == "gloo":
        dist.init_process_group("cpu:gloo", timeout=TIMEOUT)
        return dist.group.WORLD, dist.new_group(backend="oxccl", timeout=TIMEOUT)
    # torch 2.11 takes an accelerator as device_id only.
    bound = {} if LEGACY else {"device_id": torch.device("cpu", 0)}
    dist.init_process_group("cpu:oxccl", timeout=TIMEOUT, **bound)
    return dist.new_group(backend="gloo", timeout=TIMEOUT), dist.group.WORLD


def count_splits():
    """Wraps oxccl._lib.split (which OxcclBackend.split and perform_nocolor_split call) to
    record the (color, key) of every oxcclCommSplit."""
    from oxccl import _lib

    original = _lib.split

    def split(comm, color, key, timeout_s=None):
        split.calls.append((color, key))
        return original(comm, color, key, timeout_s)

    split.calls = []
    _lib.split = split


def main():
    out_dir, mode = sys.argv[1], sys.argv[2]
    only = set(sys.argv[3].split(",")) if len(sys.argv) > 3 and sys.argv[3] else None
    import oxccl

    oxccl.register()
    count_splits()
    gloo, ox = init(mode)
    rank, world = dist.get_rank(), dist.get_world_size()
    ctx = Ctx(mode, rank, world, gloo, ox)
    with open(os.path.join(out_dir, f"rank{rank}.jsonl"), "a") as out:
        for name, fn, worlds in CASES[mode]:
            if world not in worlds or (only and name not in only):
                continue
            ctx.case, ctx.errors = name, []
            t0 = time.monotonic()
            try:
                fn(ctx)
            except Exception:  # noqa: BLE001 - reported as the case's failure
                ctx.fail("raised", "\n" + traceback.format_exc())
            errors = ctx.errors
            if len(errors) > 40:
                errors = errors[:40] + [f"... and {len(errors) - 40} more"]
            record = {
                "case": name,
                "ok": not ctx.errors,
                "errors": errors,
                "seconds": round(time.monotonic() - t0, 3),
            }
            out.write(json.dumps(record) + "\n")
            out.flush()
            # Line the ranks up again, so that one case's failure does not shift the next.
            dist.barrier(group=gloo)
        out.write(json.dumps({"case": "__end__"}) + "\n")
        out.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
