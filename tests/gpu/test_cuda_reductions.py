"""all_reduce, all_reduce_coalesced, reduce, reduce_scatter and reduce_scatter_tensor on CUDA
tensors: every dtype x reduce op (SUM, PRODUCT, MIN, MAX, AVG, BAND, BOR, BXOR, PREMUL_SUM), 0,
1 and 1023 elements, strided views, 2 ranks on GPU 0 over ucx (cuda_ipc), against numpy.

One world runs the lot; each (family, case) is an item (``gpu/cuda_matrix.py``).
"""

from __future__ import annotations

import pytest

from gpu import cuda_matrix
from gpu.cuda_harness import WorldCache, cuda_world

FAMILIES = cuda_matrix.REDUCTIONS
_world = WorldCache(lambda: cuda_world(cuda_matrix.matrix_main, args=(FAMILIES, "cuda:0")))


def test_the_ucx_backend_takes_cuda_tensors() -> None:
    cuda_matrix.check_facts(_world.get(), "cuda:0", "ucx")


@pytest.mark.slow
@pytest.mark.parametrize(("family", "case"), list(cuda_matrix.params(FAMILIES)))
def test_cuda_matrix(family: str, case: str) -> None:
    cuda_matrix.check_case(_world.get(), family, case)
