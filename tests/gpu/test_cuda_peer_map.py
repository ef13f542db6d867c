"""The peer-mapped all_reduce of two ranks (``device_peer_map``; docs/algorithms.md) on GPU 0.

With ``UCXBACKEND_DEVICE_PEER_MAP=on`` every 2-rank all_reduce of CUDA tensors maps the peer's
buffer through UCX's cuda_ipc and folds half of the vector straight out of the peer's memory,
whatever its size; a rank that cannot map fails the op (``on`` never falls back), so a passing
item is one the peer map computed.

* The reductions' matrix (``gpu/cuda_matrix.py``: every dtype x reduce op, 0, 1 and 1023
  elements, strided views) in that world, against numpy.
* 64 MiB all_reduces of float32 and int64 (SUM, and MAX for float32), four times in a row on
  one tensor (the later ones hit UCX's IPC cache) and on new tensors, against references
  computed on the device, identical on both ranks.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpu import cuda_matrix
from gpu.cuda_harness import Outcomes, WorldCache, cuda_world, evaluate, use_gpu0

ENV = {"UCXBACKEND_DEVICE_PEER_MAP": "on"}
FAMILIES = ("all_reduce", "all_reduce_coalesced")
LARGE_BYTES = 64 << 20
LARGE_CHECKS = (
    "64 MiB float32 SUM",
    "64 MiB float32 MAX",
    "64 MiB int64 SUM",
    "64 MiB float32 SUM, a fresh tensor",
    "the ranks' results are identical",
)

_matrix = WorldCache(
    lambda: cuda_world(cuda_matrix.matrix_main, args=(FAMILIES, "cuda:0"), env=ENV)
)


def large_main(rank: int, ws: int) -> dict[str, Any]:
    """64 MiB all_reduces through the peer map; checks against on-device references."""
    import torch
    import torch.distributed as dist

    out = Outcomes(rank)
    dev = use_gpu0()
    digests: list[float] = []

    def one(name: str, dtype: Any, op: Any, repeats: int) -> None:
        count = LARGE_BYTES // torch.empty((), dtype=dtype).element_size()
        index = torch.arange(count, device=dev, dtype=torch.int64)
        # Distinct per rank and element, exact in both dtypes (below 2^24 for float32).
        inputs = [((index * 7 + r * 3) % 1001).to(dtype) for r in range(ws)]
        if op == dist.ReduceOp.SUM:
            want = sum(inputs[1:], inputs[0].clone())
        else:
            want = torch.stack(inputs).amax(dim=0)
        tensor = inputs[rank].clone()
        for k in range(repeats):
            if k > 0:
                tensor.copy_(inputs[rank])
            dist.all_reduce(tensor, op=op)
            torch.cuda.synchronize()
            ok = torch.equal(tensor, want)
            out.check(name, ok, f"round {k}: {int((tensor != want).sum().item())} elements differ")
            if not ok:
                return
        digests.append(float(tensor.double().sum().item()))

    out.run(LARGE_CHECKS[0], lambda: one(LARGE_CHECKS[0], torch.float32, dist.ReduceOp.SUM, 4))
    out.run(LARGE_CHECKS[1], lambda: one(LARGE_CHECKS[1], torch.float32, dist.ReduceOp.MAX, 1))
    out.run(LARGE_CHECKS[2], lambda: one(LARGE_CHECKS[2], torch.int64, dist.ReduceOp.SUM, 4))
    out.run(LARGE_CHECKS[3], lambda: one(LARGE_CHECKS[3], torch.float32, dist.ReduceOp.SUM, 1))

    def same_on_both() -> None:
        mine = torch.tensor(digests, dtype=torch.float64, device=dev)
        peer = mine.clone()
        dist.broadcast(peer, src=1 - rank)
        out.check(LARGE_CHECKS[4], torch.equal(mine, peer), f"{mine.tolist()} vs {peer.tolist()}")

    out.run(LARGE_CHECKS[4], same_on_both)
    return out.results


_large = WorldCache(lambda: cuda_world(large_main, env=ENV))


def test_the_peer_mapped_world_takes_cuda_tensors() -> None:
    cuda_matrix.check_facts(_matrix.get(), "cuda:0", "ucx")


@pytest.mark.slow
@pytest.mark.parametrize(("family", "case"), list(cuda_matrix.params(FAMILIES)))
def test_cuda_matrix_through_the_peer_map(family: str, case: str) -> None:
    cuda_matrix.check_case(_matrix.get(), family, case)


@pytest.mark.parametrize("name", LARGE_CHECKS)
def test_64mib_all_reduce_through_the_peer_map(name: str) -> None:
    evaluate(_large.get(), name)
