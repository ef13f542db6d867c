"""Cases: each rank's input data and the expected output of a collective, and the check.

Call order: :func:`make_case_data` (once per collective and size) builds a :class:`CaseData`
from :func:`input_values` and, independently of any backend, the exact expected result
(:func:`reduce_values`); after the checked iteration :func:`count_wrong` compares the output
with it. Inputs are small integers chosen so that every reduction is exact in every dtype
and in every order of the additions (:func:`sum_modulus`); :func:`poison_value` fills
outputs beforehand so that an element never written counts as wrong.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

import torch

from .common import REDUCING, BenchError
from .sizes import Layout

# Largest integer every value of a reduction must stay below, so that sums are exact whatever
# the order of the additions (bf16 has 8 significant bits, half 11; int8/uint8 must not wrap).
_EXACT_LIMIT: Final[Mapping[torch.dtype, int]] = {
    torch.int8: 127,
    torch.uint8: 255,
    torch.bfloat16: 256,
    torch.float16: 2048,
}
_DATA_MODULUS: Final = 101  # non-reducing collectives and min/max: values 0..100 (or -50..50)
_AVG_TOLERANCE: Final[Mapping[torch.dtype, float]] = {
    torch.float16: 2e-3,
    torch.bfloat16: 1.6e-2,
    torch.float32: 1e-6,
    torch.float64: 1e-12,
}


def sum_modulus(dtype: torch.dtype, world: int) -> int:
    """Inputs of sum/avg are in ``[0, m)`` with ``world * (m - 1)`` below the exact limit."""
    limit = _EXACT_LIMIT.get(dtype, 1 << 24)
    return max(2, min(_DATA_MODULUS, (limit - 1) // world + 1))


def input_values(
    kind: str, dtype: torch.dtype, rank: int, world: int, start: int, count: int
) -> torch.Tensor:
    """Rank ``rank``'s input elements ``start .. start+count`` as int64 (small integers, exact
    in every dtype). ``kind`` is the reduce op, or ``data`` for collectives that only move data.

    prod: 1 or 2 (a 2 for at most every third rank per element; negated here and there for
    signed dtypes), so products stay exact powers of two; sum/avg: ``[0, sum_modulus)``;
    min/max and data: 0..100 (-50..50 for signed dtypes under min/max).
    """
    idx = torch.arange(start, start + count, dtype=torch.int64)
    if kind == "prod":
        values = torch.where((idx + rank) % 3 == 0, 2, 1)
        if dtype.is_signed:
            values = torch.where((idx + 2 * rank) % 5 == 0, -values, values)
        return values
    if kind in ("sum", "avg"):
        return (idx + 37 * rank) % sum_modulus(dtype, world)
    values = (idx + 37 * rank) % _DATA_MODULUS
    if kind in ("min", "max") and dtype.is_signed:
        values -= _DATA_MODULUS // 2
    return values


def reduce_values(op: str, parts: Iterable[torch.Tensor], world: int) -> torch.Tensor:
    """The exact reduction of int64 inputs (float64 for avg)."""
    acc: torch.Tensor | None = None
    for part in parts:
        if acc is None:
            acc = part.clone()
        elif op in ("sum", "avg"):
            acc += part
        elif op == "prod":
            acc *= part
        elif op == "min":
            torch.minimum(acc, part, out=acc)
        elif op == "max":
            torch.maximum(acc, part, out=acc)
        else:
            raise ValueError(f"unknown reduce op {op!r}")
    if acc is None:
        raise ValueError("nothing to reduce")
    return acc.to(torch.float64) / world if op == "avg" else acc


@dataclass
class CaseData:
    """One rank's input and expected output for one collective and size, on the CPU."""

    send: torch.Tensor | None  # the input (the in/out tensor of in-place collectives)
    recv_numel: int  # elements of a separate output tensor; 0: the output is ``send``
    expected: torch.Tensor | None  # None: nothing to check on this rank


def make_case_data(
    collective: str,
    layout: Layout,
    dtype: torch.dtype,
    op: str,
    rank: int,
    world: int,
    root: int,
    *,
    with_expected: bool = True,
) -> CaseData:
    """Inputs from :func:`input_values` and the expected result, computed independently."""
    c = layout.count
    kind = op if collective in REDUCING else "data"

    def vals(q: int, start: int, n: int) -> torch.Tensor:
        return input_values(kind, dtype, q, world, start, n)

    def reduced(start: int) -> torch.Tensor:
        return reduce_values(op, (vals(q, start, c) for q in range(world)), world)

    if collective == "barrier":
        return CaseData(None, 0, None)
    if collective in ("all_reduce", "reduce", "broadcast", "sendrecv", "all_gather", "gather"):
        send = vals(rank, 0, c)
    else:  # reduce_scatter, all_to_all: one chunk per rank
        send = vals(rank, 0, c * world)
    recv_numel = {"all_gather": c * world, "reduce_scatter": c, "all_to_all": c * world}.get(
        collective, c if collective == "sendrecv" else 0
    )
    if collective == "gather" and rank == root:  # only the root has an output
        recv_numel = c * world
    expected: torch.Tensor | None = None
    if with_expected:
        if collective == "all_reduce" or (collective == "reduce" and rank == root):
            expected = reduced(0)
        elif collective == "broadcast":
            expected = vals(root, 0, c)
        elif collective == "all_gather" or (collective == "gather" and rank == root):
            expected = torch.cat([vals(q, 0, c) for q in range(world)])
        elif collective == "reduce_scatter":
            expected = reduced(rank * c)
        elif collective == "all_to_all":
            expected = torch.cat([vals(q, rank * c, c) for q in range(world)])
        elif collective == "sendrecv":
            expected = vals((rank - 1) % world, 0, c)
    return CaseData(
        send.to(dtype),
        recv_numel,
        None if expected is None else expected.to(dtype),
    )


def poison_value(dtype: torch.dtype) -> float | int:
    """A value no correct output holds: NaN, or the dtype's maximum (inputs stay below it)."""
    return math.nan if dtype.is_floating_point else torch.iinfo(dtype).max


def count_wrong(output: torch.Tensor, expected: torch.Tensor, op: str) -> int:
    """Elements of ``output`` that differ from ``expected`` (within a tolerance for avg)."""
    out = output.detach().to("cpu").reshape(-1)
    exp = expected.reshape(-1)
    if out.numel() != exp.numel():
        raise BenchError(f"output has {out.numel()} elements, expected {exp.numel()}")
    wide = torch.float64 if exp.dtype.is_floating_point else torch.int64
    a, b = out.to(wide), exp.to(wide)
    if op == "avg" and exp.dtype.is_floating_point:
        tol = _AVG_TOLERANCE[exp.dtype]
        return int((~torch.isclose(a, b, rtol=tol, atol=tol)).sum().item())
    return int((a != b).sum().item())
