"""Reductions larger than one pipeline chunk (4 MB): several chunks per ring step and per
tree level, with a ragged last chunk, checked bit-exactly against numpy."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from conftest import skip_unless_ucx
from dist_harness import run_world, timed_failure

# 5.2M int32 = 20.8 MB: 2 ranks -> 10.4 MB blocks (3 chunks), 3 ranks -> 6.9 MB (2 chunks).
COUNT = 5_200_003


def _inputs(rank: int) -> np.ndarray:
    return (np.arange(COUNT, dtype=np.int64) * (rank + 3) % 1000 - 500).astype(np.int32)


def _large_reductions(rank: int, ws: int) -> Any:
    expected = sum(_inputs(r).astype(np.int64) for r in range(ws)).astype(np.int32)
    failures = []
    t = torch.from_numpy(_inputs(rank))
    dist.all_reduce(t)
    if not np.array_equal(t.numpy(), expected):
        failures.append(f"all_reduce: first bad index {int(np.argmax(t.numpy() != expected))}")
    for root in range(ws):
        t = torch.from_numpy(_inputs(rank))
        dist.reduce(t, dst=root)
        if rank == root and not np.array_equal(t.numpy(), expected):
            failures.append(f"reduce to {root}: first bad index "
                            f"{int(np.argmax(t.numpy() != expected))}")
    out = torch.empty(COUNT // ws, dtype=torch.int32)
    full = torch.from_numpy(_inputs(rank)[: out.numel() * ws].copy())
    dist.reduce_scatter_tensor(out, full)
    mine = expected[rank * out.numel() : (rank + 1) * out.numel()]
    if not np.array_equal(out.numpy(), mine):
        failures.append("reduce_scatter_tensor")
    return failures


@pytest.mark.parametrize("ws", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_reductions_across_several_chunks(ws: int) -> None:
    results = run_world(_large_reductions, ws, timeout=240)
    assert results == [[]] * ws, results


def _mismatched_whole_chunks(rank: int, ws: int) -> Any:
    # 1M float32 is one 4 MB chunk: the ranks agree on every chunk but disagree on how many.
    t = torch.ones((2 if rank == 0 else 3) * (1 << 20))
    return timed_failure(lambda: dist.reduce(t, dst=0))


def test_sizes_differing_by_whole_chunks_fail() -> None:
    skip_unless_ucx("checks the ucx chunked data path")
    pg_timeout = 5.0
    res = run_world(_mismatched_whole_chunks, 2, pg_timeout=pg_timeout, timeout=90)
    for rank, (elapsed, msg) in enumerate(res):
        assert msg is not None, f"rank {rank}: reduce of mismatched sizes succeeded"
        assert elapsed < pg_timeout + 10, (rank, elapsed, msg)
