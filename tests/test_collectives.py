"""Correctness matrix: op family x dtype x reduce op x world size x size.

One world is spawned per world size; inside it every rank runs every op family
in turn, loops over every dtype, reduce op and size, and compares each result
with a reference it computes locally with numpy (never with the backend under
test): every rank can rebuild any rank's inputs from (family, dtype, size, op,
rank).
Inputs are small integers, so every result is exact in every dtype and is
compared bit for bit; only AVG and PREMUL_SUM on floating dtypes use a
tolerance.

Each pytest item is one "case" (a dtype, or a named scenario such as
``noncontig``) of one (family, world size); the world runs once and its
per-case results are cached for all the items that share it.  Every case is
caught and recorded on its own (``Recorder.attempt``), so a family that fails
fails only its own items; a world that crashes or hangs fails every item of
its world size.  Under Gloo,
a combination that Gloo rejects with an exception is skipped (the ucx
backend must support it); under ucx nothing is skipped.
"""

from __future__ import annotations

import os
import time
import warnings
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from dist_harness import BACKEND, run_world

GLOO = BACKEND == "gloo"
UCX = "ucx" in BACKEND

DTYPES: dict[str, torch.dtype] = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "bool": torch.bool,
    "complex64": torch.complex64,
    "complex128": torch.complex128,
}
FLOATS = ("float16", "bfloat16", "float32", "float64")
COMPLEX = ("complex64", "complex128")
INTS = ("int8", "uint8", "int16", "int32", "int64")
REDOPS = ("SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR", "PREMUL_SUM")
BITWISE = ("BAND", "BOR", "BXOR")
PREMUL_FACTOR = 0.5

SMALL_SIZES = (0, 1, 1023)
# Just over the default 4 MiB chunk in float32/int32 (a second, ragged chunk of 205,700 bytes);
# bfloat16 (2.2 MB) still passes the 1 MiB that 2-rank all_reduces hold in their slots, and at 4
# ranks every ring block (1.1 MB) too. Odd, so no world size splits it evenly.
LARGE_N = 1_100_001
LARGE_PLAN: dict[str, tuple[str, ...]] = {
    "float32": ("SUM", "MAX", "AVG"),
    "bfloat16": ("SUM",),
    "int32": ("BXOR",),
}
NC_SHAPE = (7, 5)  # logical shape of the non-contiguous views
NC_DTYPES = ("float32", "bfloat16", "int8", "int64")
STACKED_DTYPES = ("float32", "int8", "complex64", "bool")

# (rtol, atol) for AVG / PREMUL_SUM; everything else is compared exactly.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float16": (2e-3, 1e-3),
    "bfloat16": (1.6e-2, 1e-2),
    "float32": (1e-5, 1e-5),
    "float64": (1e-12, 1e-12),
    "complex64": (1e-5, 1e-5),
    "complex128": (1e-12, 1e-12),
}
# Cases in which Gloo is known to return wrong data *without raising*: strided
# views are read/written as if contiguous.  Under Gloo they xfail; ucx must pass.
GLOO_SILENTLY_WRONG = {
    ("all_reduce", "noncontig"),
    ("broadcast", "noncontig"),
    ("reduce_scatter", "noncontig"),
    ("reduce_scatter_tensor", "noncontig"),
}

WORLD_TIMEOUT = 240.0
PG_TIMEOUT = 60.0

# Where the tensors handed to the backend live. The CUDA tests (tests/gpu/) set it to "cuda:0"
# in their ranks and run these same families; the references stay numpy either way.
DEVICE = "cpu"

# --------------------------------------------------------------------------
# Inputs and references (numpy only)
# --------------------------------------------------------------------------


def gen(dname: str, n: int, redop: str | None, *key: Any) -> np.ndarray:
    """Deterministic small-integer data: int64, or complex128 for complex dtypes."""
    rng = np.random.default_rng(zlib.crc32(repr((dname, n, redop, *key)).encode()))
    if dname == "bool":
        domain = [0, 1]
    elif redop == "PRODUCT":
        domain = [1, 2] if dname == "uint8" else [-1, 0, 1] if dname in COMPLEX else [-1, 1, 2]
    elif dname == "uint8":
        domain = [0, 1, 2, 3]
    else:
        domain = list(range(-3, 4))
    values = _draw(rng, domain, n)
    if dname in COMPLEX:
        return values + 1j * _draw(rng, domain, n)
    return values


def _draw(rng: np.random.Generator, domain: list[int], n: int) -> np.ndarray:
    """``n`` values drawn uniformly from ``domain``, as int64.

    Drawn as int8 indices and looked up in an int8 table: every rank rebuilds every rank's
    inputs for its references, and at multi-MB sizes ``rng.choice`` on int64 (9 ms per 1.1M
    values) was most of each rank's CPU in the large matrix; this costs a third of that.
    """
    lo, hi = min(domain), max(domain)
    if sorted(domain) == list(range(lo, hi + 1)):  # a range: draw the values themselves
        return rng.integers(lo, hi + 1, size=n, dtype=np.int8).astype(np.int64)
    table = np.array(domain, dtype=np.int8)
    return table.take(rng.integers(0, len(domain), size=n, dtype=np.int8)).astype(np.int64)


def to_torch(a: np.ndarray, dname: str) -> torch.Tensor:
    dtype = DTYPES[dname]
    if dname == "bool":
        t = torch.from_numpy(np.asarray(a) != 0)
    elif dname in COMPLEX:
        t = torch.from_numpy(np.asarray(a, dtype=np.complex128)).to(dtype)
    elif dname in FLOATS:
        t = torch.from_numpy(np.asarray(a, dtype=np.float64)).to(dtype)
    else:
        t = torch.from_numpy(np.asarray(a, dtype=np.int64)).to(dtype)
    return t.to(DEVICE)


# The element-wise fold of each reduce op; AVG and PREMUL_SUM fold as SUM and scale afterwards.
FOLDS: dict[str, np.ufunc] = {
    "SUM": np.add,
    "PRODUCT": np.multiply,
    "MIN": np.minimum,
    "MAX": np.maximum,
    "AVG": np.add,
    "PREMUL_SUM": np.add,
    "BAND": np.bitwise_and,
    "BOR": np.bitwise_or,
    "BXOR": np.bitwise_xor,
}
BOOL_FOLDS: dict[str, np.ufunc] = {
    "SUM": np.logical_or,
    "MAX": np.logical_or,
    "BOR": np.logical_or,
    "PRODUCT": np.logical_and,
    "MIN": np.logical_and,
    "BAND": np.logical_and,
    "BXOR": np.logical_xor,
}


def reduce_ref(arrays: list[np.ndarray], dname: str, redop: str) -> np.ndarray:
    """The reduction of the ranks' arrays, in int64 / float64 / complex128 / bool.

    Folded array by array in place rather than over a stacked copy: at multi-MB sizes the
    stack and its axis reductions cost every rank more than the collective under test.
    The inputs are small integers, so folding in int64 and converting to float64 afterwards
    gives exactly what a float64 fold would.
    """
    if dname == "bool":
        if redop not in BOOL_FOLDS:
            raise AssertionError(f"no reference for bool {redop}")
        acc = arrays[0] != 0
        for a in arrays[1:]:
            BOOL_FOLDS[redop](acc, a != 0, out=acc)
        return acc
    if redop in BITWISE and dname not in INTS:
        raise AssertionError(f"no reference for {dname} {redop}")
    fold = FOLDS[redop]
    acc = np.array(arrays[0], copy=True)
    for a in arrays[1:]:
        fold(acc, a, out=acc)
    if dname in FLOATS:
        acc = acc.astype(np.float64)
    if redop == "AVG":
        return acc / len(arrays)
    if redop == "PREMUL_SUM":
        return PREMUL_FACTOR * acc
    return acc


def expectation(dname: str, redop: str, family: str) -> str:
    """What the backend must do: "value", "error", "either" (error or right value), "skip"."""
    if redop in BITWISE:
        return "value" if dname in INTS or dname == "bool" else "error"
    if redop in ("MIN", "MAX"):
        return "error" if dname in COMPLEX else "value"
    if redop == "AVG":
        return "value" if dname in FLOATS or dname in COMPLEX else "error"
    if redop == "PREMUL_SUM":
        return "value" if dname in FLOATS or dname in COMPLEX else "skip"
    if redop == "PRODUCT" and dname in COMPLEX:
        # torch's Python layer rejects it for all_reduce; elsewhere the backend decides.
        return "error" if family in ("all_reduce", "all_reduce_coalesced") else "either"
    return "value"


def make_op(redop: str) -> Any:
    if redop == "PREMUL_SUM":
        return dist._make_nccl_premul_sum(PREMUL_FACTOR)
    return getattr(dist.ReduceOp, redop)


def approx(dname: str, redop: str | None) -> bool:
    return redop in ("AVG", "PREMUL_SUM") and dname in TOLERANCES


def sentinel(dname: str) -> Any:
    return True if dname == "bool" else (5 + 5j if dname in COMPLEX else 5)


def filled(shape: int | tuple[int, ...], dname: str) -> torch.Tensor:
    return torch.full(
        (shape,) if isinstance(shape, int) else shape,
        sentinel(dname),
        dtype=DTYPES[dname],
        device=DEVICE,
    )


def nc_view(shape: tuple[int, int], dname: str, layout: int) -> tuple[torch.Tensor, list[Check]]:
    """A non-contiguous view of ``shape`` filled with the sentinel, and the checks that
    the memory around it is left alone.  Even layouts leave gaps between columns,
    odd layouts are a transposed buffer (no gaps)."""
    a, b = shape
    if layout % 2 == 0:
        base = filled((a, 2 * b), dname)
        gaps = base[:, 1::2]
        return base[:, ::2], [("untouched gaps", gaps, filled((a, b), dname), False)]
    return filled((b, a), dname).t(), []


# (label, got, want, approximate?)
Check = tuple[str, torch.Tensor, torch.Tensor, bool]
Plan = Iterator[tuple[str, str, tuple[str | None, ...], tuple[int, ...]]]

# --------------------------------------------------------------------------
# Child side: recording results
# --------------------------------------------------------------------------

_DTYPE_WORDS = {
    "float16": ("float16", "half"),
    "bfloat16": ("bfloat16",),
    "float32": ("float32", "float"),
    "float64": ("float64", "double"),
    "int8": ("int8", "char"),
    "uint8": ("uint8", "byte"),
    "int16": ("int16", "short"),
    "int32": ("int32", "int"),
    "int64": ("int64", "long"),
    "bool": ("bool",),
    "complex64": ("complex",),
    "complex128": ("complex",),
}
_MAX_REPORTS = 25
_DIST_DIR = os.path.join("torch", "distributed", "")


def names_op_and_dtype(exc: BaseException, redop: str, dname: str) -> bool:
    text = str(exc).lower()
    return redop.lower() in text and any(w in text for w in _DTYPE_WORDS[dname])


def first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0][:300] if lines else ""


def raised_by_dist(e: BaseException) -> bool:
    """Whether the exception came out of a torch.distributed call (not the test's own code)."""
    tb = e.__traceback__
    while tb is not None:
        if _DIST_DIR in tb.tb_frame.f_code.co_filename:
            return True
        tb = tb.tb_next
    return False


def diff(got: torch.Tensor, want: torch.Tensor, close: bool, dname: str) -> str | None:
    """None if equal, else a description with the first differing index and values."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"got shape {tuple(got.shape)} {got.dtype}, want {tuple(want.shape)} {want.dtype}"
    if close:
        rtol, atol = TOLERANCES[dname]
        bad = ~torch.isclose(got, want, rtol=rtol, atol=atol)
    else:
        if torch.equal(got, want):
            return None
        bad = got != want
    bad = bad.reshape(-1)
    if not bool(bad.any()):
        return None
    i = int(bad.nonzero()[0])
    g, w = got.reshape(-1)[i].item(), want.reshape(-1)[i].item()
    return f"first diff at flat index {i}: got {g!r}, want {w!r} ({int(bad.sum())}/{bad.numel()})"


class Recorder:
    """Collects per-case outcomes in a child: checks done, mismatches, Gloo rejections."""

    def __init__(self, rank: int, ws: int) -> None:
        self.rank, self.ws = rank, ws
        self.cases: dict[str, dict[str, Any]] = {}

    def _case(self, case: str) -> dict[str, Any]:
        return self.cases.setdefault(case, {"checked": 0, "bad": [], "rejected": []})

    def _bad(self, case: str, msg: str) -> None:
        bad = self._case(case)["bad"]
        if len(bad) < _MAX_REPORTS:
            bad.append(f"[rank {self.rank}/{self.ws}] {msg}")
        elif len(bad) == _MAX_REPORTS:
            bad.append(f"[rank {self.rank}/{self.ws}] ... more mismatches not shown")

    def attempt(
        self,
        case: str,
        what: str,
        fn: Callable[[], list[Check]],
        *,
        expect: str = "value",
        redop: str = "",
        dname: str = "",
    ) -> None:
        """Run ``fn`` (which issues the op and returns checks) and record the outcome."""
        c = self._case(case)
        try:
            checks = fn()
        except Exception as e:
            text = f"{type(e).__name__}: {first_line(e)}"
            if not raised_by_dist(e):
                self._bad(case, f"{what}: test code failed outside torch.distributed: {text}")
            elif expect in ("error", "either"):
                c["checked"] += 1
                if not isinstance(e, (RuntimeError, ValueError)):
                    self._bad(case, f"{what}: want RuntimeError/ValueError, got {text}")
                elif UCX and not names_op_and_dtype(e, redop, dname):
                    self._bad(case, f"{what}: error must name the op and dtype: {text}")
            elif GLOO:
                c["rejected"].append(f"{what}: {text}")
            else:
                self._bad(case, f"{what}: raised {text}")
            return
        if expect == "error":
            c["checked"] += 1
            self._bad(case, f"{what}: want an error naming {redop} and {dname}, got none")
            return
        for label, got, want, close in checks:
            c["checked"] += 1
            d = diff(got, want, close, dname or _dname_of(want))
            if d:
                self._bad(case, f"{what}{' ' + label if label else ''}: {d}")


def _dname_of(t: torch.Tensor) -> str:
    return next(k for k, v in DTYPES.items() if v == t.dtype)


def _plan(large: bool, reduction: bool) -> Plan:
    """(case, dtype, reduce ops, sizes) to run."""
    if large:
        for dname, redops in LARGE_PLAN.items():
            yield f"large-{dname}", dname, redops if reduction else (None,), (LARGE_N,)
        return
    for dname in DTYPES:
        redops = tuple(op for op in REDOPS if op != "PREMUL_SUM") if reduction else (None,)
        yield dname, dname, redops, SMALL_SIZES
    if reduction:
        for dname in FLOATS + COMPLEX:
            yield "PREMUL_SUM", dname, ("PREMUL_SUM",), SMALL_SIZES


def _reductions(
    rec: Recorder, family: str, large: bool, one: Callable[[str, str, int], list[Check]]
) -> None:
    """Run ``one(dtype, redop, n)`` over the reduction plan with the right expectation."""
    for case, dname, redops, sizes in _plan(large, reduction=True):
        for redop in redops:
            assert redop is not None
            expect = expectation(dname, redop, family)
            if expect == "skip":
                continue
            what = f"{family} {redop} {dname}"
            if expect != "value":  # size-independent: one small call is enough
                rec.attempt(
                    case,
                    f"{what} n=3",
                    lambda d=dname, o=redop: one(d, o, 3),
                    expect=expect,
                    redop=redop,
                    dname=dname,
                )
                continue
            for n in sizes:
                rec.attempt(case, f"{what} n={n}", lambda d=dname, o=redop, k=n: one(d, o, k))


# --------------------------------------------------------------------------
# Child side: the op families
# --------------------------------------------------------------------------


def fam_all_reduce(rec: Recorder, large: bool) -> None:
    rank, ws = rec.rank, rec.ws

    def one(dname: str, redop: str, n: int) -> list[Check]:
        t = to_torch(gen(dname, n, redop, "ar", rank), dname)
        dist.all_reduce(t, op=make_op(redop))
        ref = reduce_ref([gen(dname, n, redop, "ar", r) for r in range(ws)], dname, redop)
        return [("", t, to_torch(ref, dname), approx(dname, redop))]

    _reductions(rec, "all_reduce", large, one)
    if large:
        return
    for dname in NC_DTYPES:
        for redop in ("SUM", "MAX"):

            def nc(dname: str = dname, redop: str = redop) -> list[Check]:
                data = [gen(dname, 35, redop, "nc", r) for r in range(ws)]
                view, checks = nc_view(NC_SHAPE, dname, rank)
                view.copy_(to_torch(data[rank], dname).reshape(NC_SHAPE))
                dist.all_reduce(view, op=make_op(redop))
                ref = reduce_ref(data, dname, redop)
                return [("view", view, to_torch(ref, dname).reshape(NC_SHAPE), False), *checks]

            rec.attempt("noncontig", f"all_reduce {redop} {dname} strided/transposed", nc)


def fam_all_reduce_coalesced(rec: Recorder, large: bool) -> None:
    rank, ws = rec.rank, rec.ws

    def inputs(dname: str, redop: str, n: int, r: int) -> list[np.ndarray]:
        # several tensors of different sizes (including 0) in one coalesced call
        return [gen(dname, k, redop, "arc", r, i) for i, k in enumerate((n, 0, 3, 1))]

    def one(dname: str, redop: str, n: int) -> list[Check]:
        checks: list[Check] = []
        ts = [to_torch(a, dname) for a in inputs(dname, redop, n, rank)]
        dist.all_reduce_coalesced(ts, op=make_op(redop))
        refs = [
            reduce_ref(list(arrs), dname, redop)
            for arrs in zip(*(inputs(dname, redop, n, r) for r in range(ws)), strict=True)
        ]
        for i, (t, ref) in enumerate(zip(ts, refs, strict=True)):
            checks.append((f"all_reduce_coalesced[{i}]", t, to_torch(ref, dname), False))
        ts = [to_torch(a, dname) for a in inputs(dname, redop, n, rank)]
        with dist._coalescing_manager():
            for t in ts:
                dist.all_reduce(t, op=make_op(redop))
        for i, (t, ref) in enumerate(zip(ts, refs, strict=True)):
            checks.append((f"_coalescing_manager[{i}]", t, to_torch(ref, dname), False))
        close = approx(dname, redop)
        return [(label, g, w, close) for label, g, w, _ in checks]

    _reductions(rec, "all_reduce_coalesced", large, one)


def fam_reduce(rec: Recorder, large: bool) -> None:
    rank, ws = rec.rank, rec.ws

    def one(dname: str, redop: str, n: int) -> list[Check]:
        checks: list[Check] = []
        for root in range(ws):
            t = to_torch(gen(dname, n, redop, "red", root, rank), dname)
            dist.reduce(t, dst=root, op=make_op(redop))
            if rank == root:
                arrays = [gen(dname, n, redop, "red", root, r) for r in range(ws)]
                ref = to_torch(reduce_ref(arrays, dname, redop), dname)
                checks.append((f"root={root}", t, ref, approx(dname, redop)))
            elif "ucx" in BACKEND:  # ucx never writes a non-root input (Gloo may)
                kept = to_torch(gen(dname, n, redop, "red", root, rank), dname)
                checks.append((f"root={root}, input of rank {rank} kept", t, kept, False))
        return checks

    _reductions(rec, "reduce", large, one)


def fam_reduce_scatter(rec: Recorder, large: bool) -> None:
    rank, ws = rec.rank, rec.ws

    def one(dname: str, redop: str, n: int) -> list[Check]:
        ins = [to_torch(gen(dname, n, redop, "rs", rank, j), dname) for j in range(ws)]
        out = filled(n, dname)
        dist.reduce_scatter(out, ins, op=make_op(redop))
        ref = reduce_ref([gen(dname, n, redop, "rs", r, rank) for r in range(ws)], dname, redop)
        return [("", out, to_torch(ref, dname), approx(dname, redop))]

    _reductions(rec, "reduce_scatter", large, one)
    if large:
        return
    for dname in NC_DTYPES:

        def nc(dname: str = dname) -> list[Check]:
            def data(r: int, j: int) -> np.ndarray:
                return gen(dname, 35, "SUM", "rs-nc", r, j).reshape(NC_SHAPE)

            ins = []
            for j in range(ws):
                view, _ = nc_view(NC_SHAPE, dname, rank + j)
                ins.append(view.copy_(to_torch(data(rank, j), dname)))
            out, checks = nc_view(NC_SHAPE, dname, rank)
            dist.reduce_scatter(out, ins, op=dist.ReduceOp.SUM)
            ref = reduce_ref([data(r, rank) for r in range(ws)], dname, "SUM")
            return [("view", out, to_torch(ref, dname), False), *checks]

        rec.attempt("noncontig", f"reduce_scatter SUM {dname} strided/transposed", nc)


def fam_reduce_scatter_tensor(rec: Recorder, large: bool) -> None:
    rank, ws = rec.rank, rec.ws

    def chunks(dname: str, redop: str, n: int, r: int) -> list[np.ndarray]:
        return [gen(dname, n, redop, "rst", r, j) for j in range(ws)]

    def want(dname: str, redop: str, n: int, j: int) -> torch.Tensor:
        ref = reduce_ref([chunks(dname, redop, n, r)[j] for r in range(ws)], dname, redop)
        return to_torch(ref, dname)

    def one(dname: str, redop: str, n: int) -> list[Check]:
        close = approx(dname, redop)
        inp = to_torch(np.concatenate(chunks(dname, redop, n, rank)), dname)
        out = filled(n, dname)
        dist.reduce_scatter_tensor(out, inp, op=make_op(redop))
        return [("", out, want(dname, redop, n, rank), close)]

    _reductions(rec, "reduce_scatter_tensor", large, one)
    if large:
        return
    for dname in STACKED_DTYPES:
        for n in SMALL_SIZES:

            def stacked(dname: str = dname, n: int = n) -> list[Check]:
                # stacked form: input (ws, n) -> output (n,)
                inp = to_torch(np.stack(chunks(dname, "SUM", n, rank)), dname)
                out = filled(n, dname)
                dist.reduce_scatter_tensor(out, inp)
                return [("", out, want(dname, "SUM", n, rank), False)]

            rec.attempt("stacked", f"reduce_scatter_tensor stacked {dname} n={n}", stacked)
    for dname in ("float32", "int64", "bfloat16"):

        def coalesced(dname: str = dname) -> list[Check]:
            sizes = (5, 0, 1023)
            outs = [filled(n, dname) for n in sizes]
            ins = [to_torch(np.concatenate(chunks(dname, "SUM", n, rank)), dname) for n in sizes]
            with dist._coalescing_manager():
                for o, i in zip(outs, ins, strict=True):
                    dist.reduce_scatter_tensor(o, i)
            return [
                (f"[{k}]", o, want(dname, "SUM", n, rank), False)
                for k, (o, n) in enumerate(zip(outs, sizes, strict=True))
            ]

        rec.attempt("coalesced", f"reduce_scatter_tensor coalesced {dname}", coalesced)

    for dname in NC_DTYPES:

        def nc(dname: str = dname) -> list[Check]:
            a, b = NC_SHAPE
            inp, _ = nc_view((ws * a, b), dname, rank)
            inp.copy_(
                to_torch(np.concatenate(chunks(dname, "SUM", a * b, rank)), dname).reshape(
                    ws * a, b
                )
            )
            out, checks = nc_view(NC_SHAPE, dname, rank + 1)
            dist.reduce_scatter_tensor(out, inp)
            return [
                ("view", out, want(dname, "SUM", a * b, rank).reshape(NC_SHAPE), False),
                *checks,
            ]

        rec.attempt("noncontig", f"reduce_scatter_tensor {dname} strided/transposed", nc)


def fam_broadcast(rec: Recorder, large: bool) -> None:
    rank, ws = rec.rank, rec.ws
    for case, dname, _, sizes in _plan(large, reduction=False):
        for n in sizes:

            def one(dname: str = dname, n: int = n) -> list[Check]:
                checks: list[Check] = []
                for root in range(ws):
                    t = to_torch(gen(dname, n, None, "bc", root, rank), dname)
                    dist.broadcast(t, src=root)
                    want = to_torch(gen(dname, n, None, "bc", root, root), dname)
                    checks.append((f"root={root}", t, want, False))
                return checks

            rec.attempt(case, f"broadcast {dname} n={n}", one)
    if large:
        return
    for dname in NC_DTYPES:

        def nc(dname: str = dname) -> list[Check]:
            checks: list[Check] = []
            for root in range(ws):
                view, gaps = nc_view(NC_SHAPE, dname, rank + root)
                if rank == root:
                    view.copy_(
                        to_torch(gen(dname, 35, None, "bc-nc", root), dname).reshape(NC_SHAPE)
                    )
                dist.broadcast(view, src=root)
                want = to_torch(gen(dname, 35, None, "bc-nc", root), dname).reshape(NC_SHAPE)
                checks += [(f"root={root}", view, want, False), *gaps]
            return checks

        rec.attempt("noncontig", f"broadcast {dname} strided/transposed", nc)


def fam_all_gather(rec: Recorder, large: bool) -> None:
    rank, ws = rec.rank, rec.ws
    for case, dname, _, sizes in _plan(large, reduction=False):
        for n in sizes:

            def one(dname: str = dname, n: int = n) -> list[Check]:
                outs = [filled(n, dname) for _ in range(ws)]
                dist.all_gather(outs, to_torch(gen(dname, n, None, "ag", rank), dname))
                return [
                    (
                        f"from rank {j}",
                        outs[j],
                        to_torch(gen(dname, n, None, "ag", j), dname),
                        False,
                    )
                    for j in range(ws)
                ]

            rec.attempt(case, f"all_gather {dname} n={n}", one)
    if large:
        return
    for dname in NC_DTYPES:

        def nc(dname: str = dname) -> list[Check]:
            def data(r: int) -> torch.Tensor:
                return to_torch(gen(dname, 35, None, "ag-nc", r), dname).reshape(NC_SHAPE)

            inp, _ = nc_view(NC_SHAPE, dname, rank + 1)
            inp.copy_(data(rank))
            checks: list[Check] = []
            outs = []
            for j in range(ws):
                view, gaps = nc_view(NC_SHAPE, dname, rank + j)
                outs.append(view)
                checks += [(f"from rank {j}", view, data(j), False), *gaps]
            dist.all_gather(outs, inp)
            return checks

        rec.attempt("noncontig", f"all_gather {dname} strided/transposed", nc)


def fam_all_gather_into_tensor(rec: Recorder, large: bool) -> None:
    rank, ws = rec.rank, rec.ws
    # torch 2.13 deprecates all_gather_into_tensor in favour of all_gather_single;
    # both end in Backend::_allgather_base.  Exercise both names where present.
    ag_single = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)

    def data(dname: str, n: int, r: int) -> torch.Tensor:
        return to_torch(gen(dname, n, None, "agt", r), dname)

    for case, dname, _, sizes in _plan(large, reduction=False):
        for n in sizes:

            def one(dname: str = dname, n: int = n) -> list[Check]:
                out = filled(ws * n, dname)
                dist.all_gather_into_tensor(out, data(dname, n, rank))
                return [("", out, torch.cat([data(dname, n, r) for r in range(ws)]), False)]

            rec.attempt(case, f"all_gather_into_tensor {dname} n={n}", one)
    if large:
        return
    for dname in STACKED_DTYPES:
        for n in SMALL_SIZES:

            def stacked(dname: str = dname, n: int = n) -> list[Check]:
                out = filled((ws, n), dname)  # stacked form: output (ws, n)
                ag_single(out, data(dname, n, rank))
                return [("", out, torch.stack([data(dname, n, r) for r in range(ws)]), False)]

            rec.attempt("stacked", f"all_gather_single stacked {dname} n={n}", stacked)
    for dname in ("float32", "int64", "bfloat16"):

        def coalesced(dname: str = dname) -> list[Check]:
            sizes = (5, 0, 1023)
            outs = [filled(ws * n, dname) for n in sizes]
            with dist._coalescing_manager():
                for o, n in zip(outs, sizes, strict=True):
                    dist.all_gather_into_tensor(o, data(dname, n, rank))
            return [
                (f"[{k}]", o, torch.cat([data(dname, n, r) for r in range(ws)]), False)
                for k, (o, n) in enumerate(zip(outs, sizes, strict=True))
            ]

        rec.attempt("coalesced", f"all_gather_into_tensor coalesced {dname}", coalesced)
    for dname in NC_DTYPES:

        def nc(dname: str = dname) -> list[Check]:
            a, b = NC_SHAPE
            inp, _ = nc_view(NC_SHAPE, dname, rank + 1)
            inp.copy_(data(dname, a * b, rank).reshape(NC_SHAPE))
            out, checks = nc_view((ws * a, b), dname, rank)
            dist.all_gather_into_tensor(out, inp)
            want = torch.cat([data(dname, a * b, r) for r in range(ws)]).reshape(ws * a, b)
            return [("view", out, want, False), *checks]

        rec.attempt("noncontig", f"all_gather_into_tensor {dname} strided/transposed", nc)


def fam_all_gather_coalesced(rec: Recorder, large: bool) -> None:
    rank, ws = rec.rank, rec.ws
    for case, dname, _, sizes in _plan(large, reduction=False):

        def one(dname: str = dname, sizes: tuple[int, ...] = sizes) -> list[Check]:
            def data(r: int) -> list[torch.Tensor]:
                return [
                    to_torch(gen(dname, n, None, "agc", r, i), dname) for i, n in enumerate(sizes)
                ]

            outs = [[filled(n, dname) for n in sizes] for _ in range(ws)]
            dist.all_gather_coalesced(outs, data(rank))
            return [
                (f"from rank {j} [{i}]", outs[j][i], data(j)[i], False)
                for j in range(ws)
                for i in range(len(sizes))
            ]

        rec.attempt(case, f"all_gather_coalesced {dname} sizes={sizes}", one)


def fam_gather(rec: Recorder, large: bool) -> None:
    rank, ws = rec.rank, rec.ws
    for case, dname, _, sizes in _plan(large, reduction=False):
        for n in sizes:

            def one(dname: str = dname, n: int = n) -> list[Check]:
                checks: list[Check] = []
                for root in range(ws):
                    outs = [filled(n, dname) for _ in range(ws)] if rank == root else None
                    t = to_torch(gen(dname, n, None, "ga", root, rank), dname)
                    dist.gather(t, outs, dst=root)
                    for j in range(ws if outs is not None else 0):
                        want = to_torch(gen(dname, n, None, "ga", root, j), dname)
                        checks.append((f"root={root} from rank {j}", outs[j], want, False))
                return checks

            rec.attempt(case, f"gather {dname} n={n}", one)


def fam_scatter(rec: Recorder, large: bool) -> None:
    rank, ws = rec.rank, rec.ws
    for case, dname, _, sizes in _plan(large, reduction=False):
        for n in sizes:

            def one(dname: str = dname, n: int = n) -> list[Check]:
                checks: list[Check] = []
                for root in range(ws):
                    ins = None
                    if rank == root:
                        ins = [
                            to_torch(gen(dname, n, None, "sc", root, j), dname) for j in range(ws)
                        ]
                    out = filled(n, dname)
                    dist.scatter(out, ins, src=root)
                    want = to_torch(gen(dname, n, None, "sc", root, rank), dname)
                    checks.append((f"root={root}", out, want, False))
                return checks

            rec.attempt(case, f"scatter {dname} n={n}", one)


def _split(src: int, dst: int, pattern: int) -> int:
    """Uneven all_to_all split sizes, including zeros."""
    if pattern == 0:
        return (src + 2 * dst) % 3
    return 0 if src == 0 else src + dst  # rank 0 sends nothing at all


def fam_all_to_all(rec: Recorder, large: bool) -> None:
    rank, ws = rec.rank, rec.ws

    def data(dname: str, n: int, src: int, dst: int) -> torch.Tensor:
        return to_torch(gen(dname, n, None, "a2a", src, dst), dname)

    for case, dname, _, sizes in _plan(large, reduction=False):
        for n in sizes:

            def one(dname: str = dname, n: int = n) -> list[Check]:
                outs = [filled(n, dname) for _ in range(ws)]
                dist.all_to_all(outs, [data(dname, n, rank, d) for d in range(ws)])
                return [(f"from {s}", outs[s], data(dname, n, s, rank), False) for s in range(ws)]

            rec.attempt(case, f"all_to_all {dname} n={n}", one)
    if large:
        return
    for dname in ("float32", "int8", "complex128", "bool"):
        for pattern in (0, 1):

            def uneven(dname: str = dname, pattern: int = pattern) -> list[Check]:
                def sz(s: int, d: int) -> int:
                    return _split(s, d, pattern)

                outs = [filled(sz(s, rank), dname) for s in range(ws)]
                ins = [data(dname, sz(rank, d), rank, d) for d in range(ws)]
                dist.all_to_all(outs, ins)
                return [
                    (f"from {s}", outs[s], data(dname, sz(s, rank), s, rank), False)
                    for s in range(ws)
                ]

            rec.attempt("uneven", f"all_to_all uneven#{pattern} {dname}", uneven)
    for dname in NC_DTYPES:

        def nc(dname: str = dname) -> list[Check]:
            checks: list[Check] = []
            ins, outs = [], []
            for j in range(ws):
                inp, _ = nc_view(NC_SHAPE, dname, rank + j + 1)
                ins.append(inp.copy_(data(dname, 35, rank, j).reshape(NC_SHAPE)))
                out, gaps = nc_view(NC_SHAPE, dname, rank + j)
                outs.append(out)
                checks += [(f"from {j}", out, data(dname, 35, j, rank).reshape(NC_SHAPE), False)]
                checks += gaps
            dist.all_to_all(outs, ins)
            return checks

        rec.attempt("noncontig", f"all_to_all {dname} strided/transposed", nc)


def fam_all_to_all_single(rec: Recorder, large: bool) -> None:
    rank, ws = rec.rank, rec.ws

    def data(dname: str, n: int, src: int, dst: int) -> torch.Tensor:
        return to_torch(gen(dname, n, None, "a2as", src, dst), dname)

    for case, dname, _, sizes in _plan(large, reduction=False):
        for n in sizes:

            def one(dname: str = dname, n: int = n) -> list[Check]:
                inp = torch.cat([data(dname, n, rank, d) for d in range(ws)])
                out = filled(ws * n, dname)
                dist.all_to_all_single(out, inp)
                want = torch.cat([data(dname, n, s, rank) for s in range(ws)])
                return [("equal splits", out, want, False)]

            rec.attempt(case, f"all_to_all_single {dname} n={n}", one)
    if large:
        return
    for dname in ("float32", "int8", "complex128", "bool", "int64"):
        for pattern in (0, 1):

            def uneven(dname: str = dname, pattern: int = pattern) -> list[Check]:
                in_splits = [_split(rank, d, pattern) for d in range(ws)]
                out_splits = [_split(s, rank, pattern) for s in range(ws)]
                inp = torch.cat([data(dname, k, rank, d) for d, k in enumerate(in_splits)])
                out = filled(sum(out_splits), dname)
                dist.all_to_all_single(out, inp, out_splits, in_splits)
                want = torch.cat([data(dname, k, s, rank) for s, k in enumerate(out_splits)])
                return [(f"splits in={in_splits} out={out_splits}", out, want, False)]

            rec.attempt("uneven", f"all_to_all_single uneven#{pattern} {dname}", uneven)
    for dname in NC_DTYPES:

        def nc(dname: str = dname) -> list[Check]:
            a, b = NC_SHAPE
            inp, _ = nc_view((ws * a, b), dname, rank + 1)
            inp.copy_(
                torch.cat([data(dname, a * b, rank, d) for d in range(ws)]).reshape(ws * a, b)
            )
            out, checks = nc_view((ws * a, b), dname, rank)
            dist.all_to_all_single(out, inp)
            want = torch.cat([data(dname, a * b, s, rank) for s in range(ws)]).reshape(ws * a, b)
            return [("view", out, want, False), *checks]

        rec.attempt("noncontig", f"all_to_all_single {dname} strided/transposed", nc)


def fam_p2p(rec: Recorder, large: bool) -> None:
    """send/recv, isend/irecv, batch_isend_irecv, any-source recv, tags, self, barrier."""
    rank, ws = rec.rank, rec.ws
    nxt, prv = (rank + 1) % ws, (rank - 1) % ws

    def data(dname: str, n: int, src: int, dst: int, tag: str = "") -> torch.Tensor:
        return to_torch(gen(dname, n, None, "p2p", src, dst, tag), dname)

    for case, dname, _, sizes in _plan(large, reduction=False) if ws > 1 else ():
        for n in sizes:

            def blocking(dname: str = dname, n: int = n) -> list[Check]:
                out = filled(n, dname)
                if rank == 0:
                    dist.send(data(dname, n, rank, nxt), nxt)
                    dist.recv(out, prv)
                else:
                    dist.recv(out, prv)
                    dist.send(data(dname, n, rank, nxt), nxt)
                return [("send/recv ring", out, data(dname, n, prv, rank), False)]

            def nonblocking(dname: str = dname, n: int = n) -> list[Check]:
                out = filled(n, dname)
                works = [
                    dist.irecv(out, prv, tag=3),
                    dist.isend(data(dname, n, rank, nxt), nxt, tag=3),
                ]
                for w in works:
                    w.wait()
                return [("isend/irecv ring", out, data(dname, n, prv, rank), False)]

            def batch(dname: str = dname, n: int = n) -> list[Check]:
                from_prv, from_nxt = filled(n, dname), filled(n, dname)
                ops = [
                    dist.P2POp(dist.isend, data(dname, n, rank, nxt, "fwd"), nxt),
                    dist.P2POp(dist.irecv, from_prv, prv),
                    dist.P2POp(dist.isend, data(dname, n, rank, prv, "bwd"), prv),
                    dist.P2POp(dist.irecv, from_nxt, nxt),
                ]
                for w in dist.batch_isend_irecv(ops):
                    w.wait()
                return [
                    ("batch from prev", from_prv, data(dname, n, prv, rank, "fwd"), False),
                    ("batch from next", from_nxt, data(dname, n, nxt, rank, "bwd"), False),
                ]

            rec.attempt(case, f"send/recv {dname} n={n}", blocking)
            rec.attempt(case, f"isend/irecv {dname} n={n}", nonblocking)
            rec.attempt(case, f"batch_isend_irecv {dname} n={n}", batch)
    if large:
        return

    def anysource() -> list[Check]:
        if rank != 0:
            dist.send(data("float32", 17, rank, 0), 0)
            return []
        checks: list[Check] = []
        senders = []
        for _ in range(ws - 1):
            out = filled(17, "float32")
            src = dist.recv(out)
            senders.append(src)
            want = data("float32", 17, src, 0) if 0 < src < ws else torch.zeros(0)
            checks.append((f"data from reported sender {src}", out, want, False))
        got = torch.tensor(sorted(senders))
        checks.append(("set of senders", got, torch.arange(1, ws), False))
        return checks

    def tags() -> list[Check]:
        a, b = filled(9, "int32"), filled(9, "int32")
        sends = [
            dist.isend(data("int32", 9, rank, nxt, "t11"), nxt, tag=11),
            dist.isend(data("int32", 9, rank, nxt, "t12"), nxt, tag=12),
        ]
        recvs = [dist.irecv(b, prv, tag=12), dist.irecv(a, prv, tag=11)]  # reverse order
        for w in sends + recvs:
            w.wait()
        return [
            ("tag 11", a, data("int32", 9, prv, rank, "t11"), False),
            ("tag 12", b, data("int32", 9, prv, rank, "t12"), False),
        ]

    def self_send() -> list[Check]:
        out = filled(11, "float64")
        works = [
            dist.isend(data("float64", 11, rank, rank), rank, tag=9),
            dist.irecv(out, rank, tag=9),
        ]
        for w in works:
            w.wait()
        return [("self", out, data("float64", 11, rank, rank), False)]

    def noncontig() -> list[Check]:
        checks: list[Check] = []
        for dname in NC_DTYPES:
            send, _ = nc_view(NC_SHAPE, dname, rank + 1)
            send.copy_(data(dname, 35, rank, nxt, "nc").reshape(NC_SHAPE))
            recv, gaps = nc_view(NC_SHAPE, dname, rank)
            works = [dist.irecv(recv, prv, tag=5), dist.isend(send, nxt, tag=5)]
            for w in works:
                w.wait()
            want = data(dname, 35, prv, rank, "nc").reshape(NC_SHAPE)
            checks += [(f"{dname} view", recv, want, False), *gaps]
        return checks

    def barrier() -> list[Check]:
        # Rank 0 enters BARRIER_DELAY late (the sleep is each small world's wall, and this
        # matrix has four); a barrier that does not wait lets the others out at once, far
        # below half of it. test_barrier_waits_for_every_late_rank checks it rank by rank.
        dist.barrier()
        t0 = time.monotonic()
        if rank == 0:
            time.sleep(BARRIER_DELAY)
        dist.barrier()
        waited = time.monotonic() - t0
        return [
            (
                "barrier waits for the slowest rank",
                torch.tensor(waited > BARRIER_DELAY / 2),
                torch.tensor(True),
                False,
            )
        ]

    if ws > 1:
        rec.attempt("anysource", "recv without src", anysource)
        rec.attempt("tags", "irecv matched by tag, posted in reverse order", tags)
        rec.attempt("noncontig", "isend/irecv strided/transposed", noncontig)
    rec.attempt("self", "isend/irecv to self", self_send)
    rec.attempt("barrier", "barrier", barrier)


FAMILIES: dict[str, Callable[[Recorder, bool], None]] = {
    "all_reduce": fam_all_reduce,
    "all_reduce_coalesced": fam_all_reduce_coalesced,
    "reduce": fam_reduce,
    "reduce_scatter": fam_reduce_scatter,
    "reduce_scatter_tensor": fam_reduce_scatter_tensor,
    "broadcast": fam_broadcast,
    "all_gather": fam_all_gather,
    "all_gather_into_tensor": fam_all_gather_into_tensor,
    "all_gather_coalesced": fam_all_gather_coalesced,
    "gather": fam_gather,
    "scatter": fam_scatter,
    "all_to_all": fam_all_to_all,
    "all_to_all_single": fam_all_to_all_single,
    "p2p": fam_p2p,
}
REDUCTION_FAMILIES = (
    "all_reduce",
    "all_reduce_coalesced",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
)
EXTRA_CASES: dict[str, tuple[str, ...]] = {
    "all_reduce": ("noncontig",),
    "reduce_scatter": ("noncontig",),
    "reduce_scatter_tensor": ("stacked", "coalesced", "noncontig"),
    "broadcast": ("noncontig",),
    "all_gather": ("noncontig",),
    "all_gather_into_tensor": ("stacked", "coalesced", "noncontig"),
    "all_to_all": ("uneven", "noncontig"),
    "all_to_all_single": ("uneven", "noncontig"),
    "p2p": ("anysource", "tags", "noncontig", "self", "barrier"),
}


def family_cases(family: str, ws: int) -> list[str]:
    if family == "p2p" and ws == 1:
        return ["self", "barrier"]
    cases = list(DTYPES)
    if family in REDUCTION_FAMILIES:
        cases.append("PREMUL_SUM")
    return cases + list(EXTRA_CASES.get(family, ()))


def family_main(rank: int, ws: int, families: tuple[str, ...], large: bool) -> dict[str, Any]:
    """Child entry point: run the families, return {family: {case: outcome}}."""
    warnings.simplefilter("ignore", FutureWarning)  # deprecated-but-supported APIs
    out: dict[str, Any] = {}
    for family in families:
        rec = Recorder(rank, ws)
        FAMILIES[family](rec, large)
        out[family] = rec.cases
    return out


# --------------------------------------------------------------------------
# Parent side: one world per world size, shared by the items of every family
# --------------------------------------------------------------------------

# One world per world size runs every selected family: starting a world (forking the ranks,
# creating and destroying the process group) cost about as much as a family's checks, and the
# matrix had one world per (family, world size), 56 of them. Each family still gets a fresh
# Recorder, its inputs depend only on (family, dtype, size, op, rank), and every op is waited
# for before the next one starts, so a family sees the same data as in a world of its own.

_WORLDS: dict[tuple[Any, ...], tuple[bool, Any]] = {}


def merge_outcomes(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """Every rank's ``{family: {case: outcome}}`` summed per (family, case)."""
    merged: dict[str, Any] = {}
    for rank_out in per_rank:
        for family, cases in rank_out.items():
            for case, r in cases.items():
                m = merged.setdefault(family, {}).setdefault(
                    case, {"checked": 0, "bad": [], "rejected": []}
                )
                m["checked"] += r["checked"]
                m["bad"] += r["bad"]
                m["rejected"] += r["rejected"]
    return merged


def world_results(families: tuple[str, ...], ws: int, large: bool) -> dict[str, Any]:
    key = (families, ws, large)
    if key not in _WORLDS:
        try:
            per_rank = run_world(
                family_main,
                ws,
                args=(families, large),
                timeout=WORLD_TIMEOUT * (2 if large or len(families) > 1 else 1),
                pg_timeout=PG_TIMEOUT,
            )
        except (AssertionError, TimeoutError) as e:
            _WORLDS[key] = (False, f"{type(e).__name__}: {e}")
        else:
            _WORLDS[key] = (True, merge_outcomes(per_rank))
    ok, value = _WORLDS[key]
    if not ok:
        pytest.fail(f"world {families} ws={ws} failed:\n{value}", pytrace=False)
    return value


def evaluate(family: str, case: str, outcome: dict[str, Any] | None) -> None:
    assert outcome is not None and (outcome["checked"] or outcome["bad"] or outcome["rejected"]), (
        f"{family}/{case} was not exercised"
    )
    if outcome["bad"] and GLOO and (family, case) in GLOO_SILENTLY_WRONG:
        pytest.xfail("Gloo silently mishandles strided tensors here (the ucx backend must not)")
    assert not outcome["bad"], f"{len(outcome['bad'])} problem(s):\n" + "\n".join(outcome["bad"])
    if outcome["rejected"]:
        assert GLOO, outcome["rejected"]
        shown = "\n".join(sorted(set(outcome["rejected"]))[:8])
        pytest.skip(
            f"Gloo raised on {len(outcome['rejected'])} call(s) (ucx must support):\n{shown}"
        )


def _matrix_params() -> Iterator[Any]:
    for ws in (1, 2, 3, 4):
        marks = [pytest.mark.slow] if ws >= 3 else []
        for family in FAMILIES:
            for case in family_cases(family, ws):
                yield pytest.param(family, ws, case, marks=marks, id=f"{family}-ws{ws}-{case}")


@pytest.fixture(scope="module")
def selected_families(request: pytest.FixtureRequest) -> dict[int, tuple[str, ...]]:
    """The families test_matrix runs at each world size in this session, in FAMILIES order:
    a run of a few items (``-k``, ``-m``) starts worlds of only the families it checks."""
    wanted: dict[int, set[str]] = {}
    for item in request.session.items:
        spec = getattr(item, "callspec", None)
        # Only this file's test_matrix: the suite has others (tests/gpu) with other params.
        if (
            getattr(item, "module", None) is request.module
            and getattr(item, "originalname", None) == "test_matrix"
            and spec is not None
        ):
            wanted.setdefault(spec.params["ws"], set()).add(spec.params["family"])
    return {ws: tuple(f for f in FAMILIES if f in fams) for ws, fams in wanted.items()}


@pytest.mark.parametrize(("family", "ws", "case"), list(_matrix_params()))
def test_matrix(
    family: str, ws: int, case: str, selected_families: dict[int, tuple[str, ...]]
) -> None:
    results = world_results(selected_families.get(ws, (family,)), ws, large=False)
    evaluate(family, case, results.get(family, {}).get(case))


LARGE_WORLD_SIZES = (2, 3, 4)


@pytest.mark.slow
@pytest.mark.parametrize("ws", LARGE_WORLD_SIZES)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_matrix_large(family: str, ws: int) -> None:
    """Multi-MB tensors; one world per world size runs every family."""
    results = world_results(tuple(FAMILIES), ws, large=True)[family]
    cases = [c for c in results if c.startswith("large-")]
    assert cases, f"{family}: no large case ran"
    bad = [b for c in cases for b in results[c]["bad"]]
    assert not bad, f"{len(bad)} problem(s):\n" + "\n".join(bad)
    rejected = [r for c in cases for r in results[c]["rejected"]]
    if rejected:
        assert GLOO, rejected
        pytest.skip("Gloo raised (ucx must support):\n" + "\n".join(rejected[:8]))


# --------------------------------------------------------------------------
# Barrier: no rank leaves before the last one has entered
# --------------------------------------------------------------------------

BARRIER_DELAY = 0.3  # seconds the late rank sleeps before it enters


def barrier_main(rank: int, ws: int) -> dict[str, Any]:
    """Child entry point: each rank in turn enters the barrier late.

    Returns when the late rank entered (on that rank) and when this rank left, per late
    rank, on CLOCK_MONOTONIC (time.monotonic), which all processes on a host share.
    """
    entered: dict[int, float] = {}
    left: dict[int, float] = {}
    for late in range(ws):
        dist.barrier()  # line up
        if rank == late:
            time.sleep(BARRIER_DELAY)
            entered[late] = time.monotonic()
        dist.barrier()
        left[late] = time.monotonic()
    return {"entered": entered, "left": left}


@pytest.mark.parametrize(
    "ws", [2, 3, pytest.param(5, marks=pytest.mark.slow)], ids=lambda ws: f"ws{ws}"
)
def test_barrier_waits_for_every_late_rank(ws: int) -> None:
    """Every rank leaves the barrier after the late rank entered it, whichever rank is late.

    Dissemination takes ceil(log2 n) rounds; a missing round (or a wrong partner) lets a
    rank out before ranks it hears from only indirectly have arrived: with 5 ranks, rank r
    learns of rank r-4 only in the third round.
    """
    results = run_world(barrier_main, ws, timeout=WORLD_TIMEOUT, pg_timeout=PG_TIMEOUT)
    early = []
    for late in range(ws):
        entered = results[late]["entered"][late]
        for rank, res in enumerate(results):
            left = res["left"][late]
            if left < entered:
                early.append(
                    f"rank {rank} left {entered - left:.3f}s before late rank {late} entered"
                )
    assert not early, "\n".join(early)
