"""What keeps ``cuda_wait=stream`` from hanging (csrc/device_holds.hpp), without a GPU.

``tests/cpp/device_holds_test.cpp``: which ops a ``wait()`` may hold the caller's stream
behind (marks by the progress thread's order), and that what the progress thread held of an
op is let go on the pruning thread once nothing else holds it, its mark with it. The rest of
the mechanism needs a GPU: ``tests/gpu/test_cuda_stream_hold.py``.
"""

from __future__ import annotations

from typing import Any

import cpp_build
from dist_harness import run_world

WORLD_TIMEOUT = 120.0


def test_device_holds_unit() -> None:
    cpp_build.check_unit("device_holds_test", extra_sources=["csrc/device_holds.cpp"])


def _cpu_ops_main(rank: int, ws: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    peer = 1 - rank
    out: dict[str, Any] = {}
    # A collective whose Future is taken and chained (marked in a stream-mode group).
    t = torch.arange(8, dtype=torch.int64) * (rank + 1)
    fut = dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    out["all_reduce then x2"] = fut.wait().tolist()
    # Point-to-point to the peer and to itself (issued under the group's order).
    got = torch.zeros(5, dtype=torch.int32)
    if rank == 0:
        dist.send(torch.arange(5, dtype=torch.int32) + 10, dst=peer)
    else:
        dist.recv(got, src=peer)
    out["send/recv"] = got.tolist()
    mine = torch.full((3,), 7 + rank, dtype=torch.int64)
    back = torch.zeros(3, dtype=torch.int64)
    works = dist.batch_isend_irecv(
        [dist.P2POp(dist.isend, mine, rank), dist.P2POp(dist.irecv, back, rank)]
    )
    for w in works:
        w.wait()
    out["isend/irecv to self"] = back.tolist()
    b = torch.full((4,), float(rank), dtype=torch.float32)
    dist.broadcast(b, src=1)
    out["broadcast"] = b.tolist()
    return out


def test_a_stream_mode_group_runs_cpu_ops() -> None:
    """cuda_wait=stream numbers and marks CPU ops too (their Futures' callbacks run on the
    progress thread): they must run as in any group. Until 2026-11-28 a CPU send or receive
    there dereferenced the device it does not have and failed ("Backend doesn't support
    acquiring a stream from pool")."""
    per_rank = run_world(
        _cpu_ops_main, 2, env={"UCXBACKEND_CUDA_WAIT": "stream"}, timeout=WORLD_TIMEOUT
    )
    for rank, out in enumerate(per_rank):
        assert out["all_reduce then x2"] == [i * 3 * 2 for i in range(8)], (rank, out)
        assert out["send/recv"] == ([0] * 5 if rank == 0 else [10, 11, 12, 13, 14]), (rank, out)
        assert out["isend/irecv to self"] == [7 + rank] * 3, (rank, out)
        assert out["broadcast"] == [1.0] * 4, (rank, out)
