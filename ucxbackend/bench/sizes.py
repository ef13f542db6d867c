"""Sizes and layouts: what the ``size`` and ``count`` columns mean, and the bandwidths.

Call order: :func:`parse_size` reads ``-b``/``-e``; :func:`size_sweep` makes the requested
sizes; :func:`layouts_for` turns them into one :class:`Layout` per row of a collective
(whole elements, whole per-rank chunks); :func:`bandwidths` turns a row's time into
nccl-tests' algbw and busbw (:func:`bus_factor`, as its ``PERFORMANCE.md`` defines it).
:func:`format_size` writes a size back for progress lines.

``parse_size`` is the project's one size parser (:func:`ucxbackend.config.parse_size`, the same
grammar every size knob and udp_config key takes); everything here that reads a byte count
calls it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from ..config import format_size as format_size
from ..config import parse_size as parse_size

# nccl-tests: the size of these is the whole (gathered / scattered / exchanged) buffer.
_TOTAL_BUFFER: Final = frozenset({"all_gather", "reduce_scatter", "all_to_all", "gather"})


def size_sweep(minbytes: int, maxbytes: int, stepfactor: int) -> list[int]:
    """The requested sizes: ``minbytes`` times powers of ``stepfactor`` up to ``maxbytes``."""
    if minbytes < 1:
        raise ValueError(f"minbytes must be at least 1, got {minbytes}")
    if maxbytes < minbytes:
        raise ValueError(f"maxbytes ({maxbytes}) is smaller than minbytes ({minbytes})")
    if stepfactor < 2:
        raise ValueError(f"stepfactor must be at least 2, got {stepfactor}")
    sizes = []
    size = minbytes
    while size <= maxbytes:
        sizes.append(size)
        size *= stepfactor
    return sizes


@dataclass(frozen=True)
class Layout:
    """One row of a sweep, with nccl-tests' meaning of the ``size`` and ``count`` columns.

    ``nbytes``: the whole buffer (the gathered output of all_gather and of gather at its root,
    the input of reduce_scatter, the send buffer of all_to_all; the tensor for the others).
    ``count``: nccl-tests' count column, i.e. elements per rank for all_gather, gather and
    reduce_scatter, per peer for all_to_all, and of the tensor for the others. Barrier has
    neither (0, 0).
    """

    collective: str
    nbytes: int
    count: int


def layout_for(collective: str, nbytes: int, elsize: int, world: int) -> Layout:
    """The layout for a requested size: whole elements (whole per-rank chunks where the size
    is the total buffer), at least one element (per rank)."""
    if collective == "barrier":
        return Layout(collective, 0, 0)
    if collective in _TOTAL_BUFFER:
        per_rank = max(1, nbytes // elsize // world)
        return Layout(collective, per_rank * world * elsize, per_rank)
    count = max(1, nbytes // elsize)
    return Layout(collective, count * elsize, count)


def layouts_for(collective: str, sizes: Sequence[int], elsize: int, world: int) -> list[Layout]:
    """The rows of a sweep; a size that rounds onto an earlier one is measured once."""
    if collective == "barrier":
        return [Layout(collective, 0, 0)]
    seen: set[int] = set()
    out = []
    for size in sizes:
        layout = layout_for(collective, size, elsize, world)
        if layout.nbytes not in seen:
            seen.add(layout.nbytes)
            out.append(layout)
    return out


def bus_factor(collective: str, world: int) -> float:
    """busbw / algbw, as nccl-tests' PERFORMANCE.md defines it."""
    if collective == "all_reduce":
        return 2.0 * (world - 1) / world
    if collective in _TOTAL_BUFFER:
        return (world - 1) / world
    if collective in ("broadcast", "reduce", "sendrecv"):
        return 1.0
    if collective == "barrier":
        return 0.0
    raise ValueError(f"unknown collective {collective!r}")


def bandwidths(collective: str, nbytes: int, seconds: float, world: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes per second): algbw = size / time."""
    if seconds <= 0 or nbytes == 0:
        return 0.0, 0.0
    algbw = nbytes / 1e9 / seconds
    return algbw, algbw * bus_factor(collective, world)
