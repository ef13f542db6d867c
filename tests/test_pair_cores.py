"""Two ranks on one host whose progress threads share a core (csrc/engine/progress_engine.h).

A 16 MB all_reduce runs on the progress threads, each polling with ``sched_yield`` while it
waits for the other. Put on one core (the kernel does that: a wake-up from the peer places the
woken thread on the waker's core when its own is busy for a moment), they take turns there,
each yield next to the peer that copies costs up to a scheduler tick, and lost yields add up
to crowded spells in which every wait sleeps: the 2-3x slower 16 and 64 MB ops of issue #23
(docs/performance.md#pair-progress-threads-on-one-core-2026-11-27-issue-23). The higher
rank's progress thread now leaves a core the lower rank's driver waits on, at the first yield
that ran another thread, as an inline caller already did.

Here rank 0 is pinned to one core; rank 1's progress thread is put on that core before each
op and set free (its whole mask) once the op is under way, so that it starts the op next to
rank 0's. It must move itself off (``core_moves``), keep its mask, and every op must equal
the numpy sum of both ranks' inputs, bit for bit.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from dist_harness import BACKEND, run_world

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

from stall_probe import progress_tid  # scripts/ is not a package

OPS = 12
ELEMENTS = (16 << 20) // 8  # 16 MB of int64: staged, on the progress thread


def _inputs(rank: int, op: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(7000 + 100 * op + rank)
    return torch.randint(-(1 << 40), 1 << 40, (ELEMENTS,), dtype=torch.int64, generator=gen)


def _stacked_world(rank: int, ws: int) -> dict[str, Any]:
    import numpy as np

    import ucxbackend

    mask = os.sched_getaffinity(0)
    if len(mask) < 2 or not ucxbackend.shared_memory():
        return {"skip": f"needs 2 cores and staging slots (cores {sorted(mask)})"}
    dist.all_reduce(torch.ones(ELEMENTS, dtype=torch.int64))  # slots and endpoints warm
    core, progress = min(mask), progress_tid()
    before = ucxbackend.inline_stats()["core_moves"]
    bad: list[str] = []
    try:
        if rank == 0:  # the lower rank never moves: pinned, it could not anyway
            os.sched_setaffinity(0, {core})
            os.sched_setaffinity(progress, {core})
        for i in range(OPS):
            x = _inputs(rank, i)
            if rank == 1:
                os.sched_setaffinity(progress, {core})  # idle: it wakes on `core` for the op
            dist.barrier()
            work = dist.all_reduce(x, async_op=True)
            if rank == 1:
                os.sched_setaffinity(progress, mask)  # running on `core`: free, not moved
            assert work is not None
            work.wait()
            want = _inputs(0, i).numpy() + _inputs(1, i).numpy()
            if not np.array_equal(x.numpy(), want):
                bad.append(f"op {i}: first elements {x[:4].tolist()} != {want[:4].tolist()}")
        kept = sorted(os.sched_getaffinity(progress))
    finally:
        os.sched_setaffinity(0, mask)
        os.sched_setaffinity(progress, mask)
    return {
        "bad": bad,
        "mask": sorted(mask),
        "progress_mask_after": kept,
        "core_moves": ucxbackend.inline_stats()["core_moves"] - before,
    }


@pytest.fixture(scope="module")
def stacked_world() -> list[dict[str, Any]]:
    if BACKEND != "ucx":
        pytest.skip(f"shared-memory staging of ucx ({BACKEND} under test)")
    return run_world(_stacked_world, 2, timeout=120.0)


def test_higher_progress_thread_leaves_shared_core(stacked_world: list[dict[str, Any]]) -> None:
    low, high = stacked_world
    if "skip" in low:
        pytest.skip(low["skip"])
    for rank, out in enumerate((low, high)):
        assert not out["bad"], (rank, out["bad"][:3])
    assert low["core_moves"] == 0, low
    # Before the change the progress thread never moved (only an inline caller did): 0 here.
    assert high["core_moves"] >= 1, high
    # Moving narrows the mask only for a moment.
    assert high["progress_mask_after"] == high["mask"], high
