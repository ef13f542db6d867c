"""What a failure does to a group (docs/failure-model.md), on both backends.

* ``TORCH_DISTRIBUTED_DEBUG=DETAIL``: torch wraps the group in its ``ProcessGroupWrapper``,
  which needs the backend's sequence number; collectives then still give exact results, and a
  shape that differs across ranks is the wrapper's clear error instead of a hang.

Every collective result is compared with numpy, bit-exact (int64). Each world runs both
backends (the default group is the backend under test, subgroups the other one) and serves
several tests through a module-scoped fixture: starting ranks is what costs here.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from dist_harness import BACKEND, run_world

# Both of our backends; the tests are about them, not about Gloo.
OURS = ["ucx", "udp"]
WORLD_TIMEOUT = 120.0
# torch 2.13 renamed reduce_scatter_tensor (the old name warns).
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _skip_unless_ours() -> None:
    if BACKEND not in OURS:
        pytest.skip(f"ucx/udp behaviour ({BACKEND} under test)")


def _data(op: int, rank: int, n: int = 4) -> np.ndarray:
    """Rank `rank`'s input to collective `op`: distinct per op and rank, so a message of
    another op or rank gives a different result."""
    return (np.arange(n, dtype=np.int64) + 1) * 1000 * (op + 1) + 7 * (rank + 1)


# --------------------------------------------------------------------------
# TORCH_DISTRIBUTED_DEBUG=DETAIL
# --------------------------------------------------------------------------


def _detail_collectives(rank: int, ws: int, group: Any) -> tuple[int, int]:
    """A few collectives on `group`, each against numpy; the wrapper's sequence numbers
    before and after."""
    wrapper = group._get_backend(torch.device("cpu"))
    seq_before = wrapper._get_sequence_number_for_group()
    inputs = [_data(0, r, 6) for r in range(ws)]
    t = torch.from_numpy(inputs[rank].copy())
    dist.all_reduce(t, group=group)
    np.testing.assert_array_equal(t.numpy(), np.sum(inputs, axis=0))

    t = torch.from_numpy(inputs[rank].copy())
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    np.testing.assert_array_equal(t.numpy(), np.max(inputs, axis=0))

    out = [torch.empty(6, dtype=torch.int64) for _ in range(ws)]
    dist.all_gather(out, torch.from_numpy(inputs[rank].copy()), group=group)
    for r in range(ws):
        np.testing.assert_array_equal(out[r].numpy(), inputs[r])

    t = torch.from_numpy(inputs[rank].copy())
    dist.broadcast(t, src=ws - 1, group=group)
    np.testing.assert_array_equal(t.numpy(), inputs[ws - 1])

    full = [_data(1, r, 2 * ws) for r in range(ws)]
    mine = torch.empty(2, dtype=torch.int64)
    reduce_scatter_single(mine, torch.from_numpy(full[rank].copy()), group=group)
    np.testing.assert_array_equal(mine.numpy(), np.sum(full, axis=0)[2 * rank : 2 * rank + 2])

    dist.barrier(group=group)
    return seq_before, wrapper._get_sequence_number_for_group()


def _detail_world(rank: int, ws: int) -> dict[str, Any]:
    import ucxbackend

    # TORCH_DISTRIBUTED_DEBUG was in the environment before torch was imported.
    assert dist.get_debug_level() == dist.DebugLevel.DETAIL, dist.get_debug_level()
    default = dist.distributed_c10d._get_default_group()
    other = "udp" if BACKEND == "ucx" else "ucx"
    groups = {BACKEND: default, other: dist.new_group(backend=other)}
    out: dict[str, Any] = {"seq": {}, "wrapped": {}}
    for name, group in groups.items():
        wrapper = group._get_backend(torch.device("cpu"))
        out["wrapped"][name] = (type(wrapper).__name__, wrapper.wrapped_pg.name())
        out["seq"][name] = _detail_collectives(rank, ws, group)
        # ucxbackend's helpers see through the wrapper.
        out.setdefault("stats_backend", {})[name] = ucxbackend.stats(group)["backend"]

    # Shapes that differ across ranks: the wrapper compares fingerprints before the op runs.
    t = torch.ones(4 if rank == 0 else 8, dtype=torch.int64)
    start = time.monotonic()
    try:
        dist.all_reduce(t)
        out["mismatch"] = None
    except RuntimeError as exc:
        out["mismatch"] = str(exc)
    out["mismatch_s"] = time.monotonic() - start
    # The op never reached the backend: the group still works.
    ok = torch.full((3,), rank + 1, dtype=torch.int64)
    dist.all_reduce(ok)
    out["after_mismatch"] = ok.tolist()
    dist.destroy_process_group(groups[other])
    return out


DETAIL_PG_TIMEOUT = 30.0


@pytest.fixture(scope="module")
def detail_world() -> list[dict[str, Any]]:
    _skip_unless_ours()
    return run_world(
        _detail_world,
        2,
        env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
        pg_timeout=DETAIL_PG_TIMEOUT,
        timeout=WORLD_TIMEOUT,
    )


@pytest.mark.parametrize("backend", OURS)
def test_detail_wraps_the_group_and_collectives_stay_exact(
    detail_world: list[dict[str, Any]], backend: str
) -> None:
    # (the results themselves were compared with numpy in the ranks)
    for out in detail_world:
        assert out["wrapped"][backend] == ("_ProcessGroupWrapper", backend), out["wrapped"]
        assert out["stats_backend"][backend] == backend, out["stats_backend"]
    seqs = [out["seq"][backend] for out in detail_world]
    # The same on every rank (the wrapper checks that), and one per collective.
    assert seqs[0] == seqs[1], seqs
    assert seqs[0][1] - seqs[0][0] == 6, seqs


def test_detail_turns_a_shape_mismatch_into_an_error(detail_world: list[dict[str, Any]]) -> None:
    for rank, out in enumerate(detail_world):
        msg = out["mismatch"]
        assert msg is not None, f"rank {rank}: all_reduce of differing shapes returned"
        assert "mismatch" in msg and "TensorShape" in msg and "ALLREDUCE" in msg, msg
        assert out["mismatch_s"] < DETAIL_PG_TIMEOUT / 2, (rank, out["mismatch_s"], msg)
        assert out["after_mismatch"] == [3, 3, 3], out["after_mismatch"]
