"""The reductions' matrix on CUDA tensors again, in 1 KiB device chunks.

Ops on CUDA tensors take ``device_chunk_bytes`` (64 MiB by default), so the matrix's sizes (up
to 1023 elements) are one chunk in ``test_cuda_reductions.py``. Here every family, dtype and
reduce op runs with ``UCXBACKEND_DEVICE_CHUNK_BYTES=1K``: up to 16 chunks per exchange,
double-buffered in the group's device scratch, against the same numpy references.
"""

from __future__ import annotations

import pytest

from gpu import cuda_matrix
from gpu.cuda_harness import WorldCache, cuda_world

FAMILIES = cuda_matrix.REDUCTIONS
DEVICE_CHUNK = "1K"
_world = WorldCache(
    lambda: cuda_world(
        cuda_matrix.matrix_main,
        args=(FAMILIES, "cuda:0"),
        env={"UCXBACKEND_DEVICE_CHUNK_BYTES": DEVICE_CHUNK},
    )
)


def test_the_world_takes_cuda_tensors_in_small_chunks() -> None:
    cuda_matrix.check_facts(_world.get(), "cuda:0", "ucx")


@pytest.mark.slow
@pytest.mark.parametrize(("family", "case"), list(cuda_matrix.params(FAMILIES)))
def test_cuda_matrix_in_small_chunks(family: str, case: str) -> None:
    cuda_matrix.check_case(_world.get(), family, case)
