"""The correctness matrix of ``tests/test_collectives.py`` on CUDA tensors.

The ranks run that file's op families unchanged with its ``DEVICE`` set to ``cuda:0``: every
input and output tensor the backend sees is on GPU 0 (copied there from numpy on the current
stream, so each op must also be ordered after that copy), while the references stay numpy
arrays computed on the host. Inputs are small integers, so every result is compared bit for
bit in every dtype; AVG and PREMUL_SUM on floating dtypes use test_collectives' tolerances.
Combinations the CPU path rejects (bitwise ops on floats, MIN/MAX on complex, ...) must raise
an error naming the op and the dtype on CUDA too.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import test_collectives as tc

from gpu.cuda_harness import use_gpu0

WS = 2
REDUCTIONS = tc.REDUCTION_FAMILIES
MOVEMENT = tuple(f for f in tc.FAMILIES if f not in tc.REDUCTION_FAMILIES)


def matrix_main(
    rank: int, ws: int, families: tuple[str, ...], device: str, backend: str = "ucx"
) -> dict[str, Any]:
    """Rank entry point: test_collectives' families on ``device``; results and facts."""
    import torch
    import torch.distributed as dist

    tc.DEVICE = device
    # The backend under test here is the world's (ucx or udp), whatever UCXB_TEST_BACKEND says.
    tc.BACKEND, tc.UCX, tc.GLOO = backend, True, False
    if device.startswith("cuda"):
        use_gpu0()
    facts: dict[str, Any] = {
        "device": str(tc.to_torch(np.arange(3), "int64").device),
        "filled_device": str(tc.filled(3, "float32").device),
        "backend": dist.group.WORLD._get_backend(torch.device(device)).name(),
    }
    start = time.monotonic()
    results = tc.family_main(rank, ws, families, False)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    facts["seconds"] = round(time.monotonic() - start, 2)
    return {"facts": facts, "results": results}


def merge(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """Every rank's outcome per (family, case), summed as test_collectives does."""
    return tc.merge_outcomes([rank_out["results"] for rank_out in per_rank])


def params(families: tuple[str, ...]) -> Iterator[Any]:
    for family in families:
        for case in tc.family_cases(family, WS):
            yield pytest.param(family, case, id=f"{family}-{case}")


def check_facts(per_rank: list[dict[str, Any]], device: str, backend: str) -> None:
    for rank, out in enumerate(per_rank):
        facts = out["facts"]
        assert facts["device"] == device and facts["filled_device"] == device, (rank, facts)
        assert facts["backend"] == backend, (rank, facts)


def check_case(per_rank: list[dict[str, Any]], family: str, case: str) -> None:
    if tc.GLOO:  # a Gloo reference run of the suite: this matrix is the CUDA backend's
        pytest.skip("UCXB_TEST_BACKEND=gloo: the CUDA matrix runs the ucx/udp backends only")
    tc.evaluate(family, case, merge(per_rank).get(family, {}).get(case))
