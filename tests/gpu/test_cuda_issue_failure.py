"""A CUDA collective that fails as it is issued fails the group, and its peer hears at once.

A CUDA op's device scratch is allocated at issue, on the caller's thread (docs/cuda.md,
"Stream semantics"). Where the device has no memory left for it, the op fails there; it has
taken its number, so the peer, which issued the same op, would wait for this rank's part until
its timeout. The group fails instead, and its failure notice reaches the peer.

Rank 0 caps its caching allocator and fills the cap with live tensors, so that its all_reduce's
scratch (the peer's whole 16 MiB vector, for recursive doubling at two ranks) cannot be
allocated; rank 1 has no cap. Then:

* rank 0's ``all_reduce`` raises, naming the op, and its group is failed (the next op raises
  too, at once);
* rank 1's ``all_reduce`` raises well before its 30 s timeout (``PG_TIMEOUT``), naming rank 0.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from gpu.cuda_harness import PG_TIMEOUT, Outcomes, WorldCache, cuda_world, evaluate, use_gpu0

CAP_BYTES = 256 << 20
N = 4 << 20  # float32 elements: 16 MiB, the scratch rank 0 cannot get
FILL_BLOCK = 2 << 20
PROMPT_S = 10.0  # "at once": far below PG_TIMEOUT, far above a notice's latency

CHECKS = (
    "rank 0's all_reduce raises, naming the op",
    "rank 0's next op raises: the group failed",
    "rank 1's all_reduce raises before its timeout, naming rank 0",
)


def issue_failure_main(rank: int, ws: int) -> dict[str, dict[str, Any]]:
    import torch
    import torch.distributed as dist

    dev = use_gpu0()
    out = Outcomes(rank)
    x = torch.ones(N, dtype=torch.float32, device=dev)
    keep = []
    if rank == 0:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(CAP_BYTES / total, 0)
        try:  # live blocks up to the cap: nothing cached to free for the scratch
            while True:
                keep.append(torch.empty(FILL_BLOCK, dtype=torch.uint8, device=dev))
        except torch.cuda.OutOfMemoryError:
            pass
    torch.cuda.synchronize()
    began = time.monotonic()
    error = ""
    try:
        dist.all_reduce(x)
        torch.cuda.synchronize()
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    took = time.monotonic() - began
    if rank == 0:
        out.check(
            CHECKS[0],
            bool(error) and "all_reduce" in error,
            f"raised {error!r} after {took:.2f} s ({len(keep)} blocks held)",
        )
        del keep
        later = ""
        again = time.monotonic()
        try:
            dist.all_reduce(torch.ones(4, device=dev))
        except Exception as exc:
            later = f"{type(exc).__name__}: {exc}"
        out.check(
            CHECKS[1],
            bool(later) and time.monotonic() - again < PROMPT_S,
            f"the next all_reduce raised {later!r} after {time.monotonic() - again:.2f} s",
        )
        for name in CHECKS[2:]:
            out.check(name, True, "rank 1's check")
    else:
        out.check(
            CHECKS[2],
            bool(error) and "rank 0" in error and took < PROMPT_S,
            f"raised {error!r} after {took:.2f} s (timeout {PG_TIMEOUT} s)",
        )
        for name in CHECKS[:2]:
            out.check(name, True, "rank 0's check")
    return out.results


_world = WorldCache(lambda: cuda_world(issue_failure_main))


@pytest.mark.parametrize("check", CHECKS)
def test_issue_failure_fails_the_group(check: str) -> None:
    evaluate(_world.get(), check)
