"""ucx's folding receives (Transport::recvFolded, transports/ucx/fold_receive.h) through UCX
itself, on one host over TCP loopback (`UCX_TLS=tcp,self`: ucx folds only for peers it
reaches over TCP alone) with the backend's staging off, so that every reduced chunk goes
through UCX's generic-datatype unpack: elements of 2, 4 and 8 bytes, several reduce ops,
checked bit for bit against numpy; and ranks that pass different sizes get an error, not a
hang. (Skipping the fold of whole elements fails every case here; UCX's TCP pieces did not
split elements, so the elements two pieces share are checked by algorithms_test's folded
worlds, tests/test_algorithms_inproc.py, whose transport cuts inside elements and hands the
pieces over last first. Across hosts: tests/test_multinode_chunks.py.) The same pieces,
copied into place with non-temporal stores, carry a large all-gather half (Comm::recvStreamed):
checked against numpy too. A group whose transport is wrapped for fault injection
(UCXBACKEND_TEST_FAULT_INJECTION=1) folds too, and a fault injected while its folding receives
are posted fails the op with that fault. And FoldTarget on its own under
UndefinedBehaviorSanitizer (tests/cpp/fold_target_test.cpp): UCX's buffer may hold a piece at
an address not aligned to the element, and no kernel may be handed such an element."""

from __future__ import annotations

import os
import subprocess
import time
from datetime import timedelta
from typing import Any

import cpp_build
import numpy as np
import pytest
import torch
import torch.distributed as dist
from conftest import skip_unless_ucx
from dist_harness import run_world, timed_failure

# Through UCX over TCP (loopback), the only medium ucx folds on, not the backend's slots;
# 256 KiB chunks: several per block, each cut by UCX into pieces of its own.
ENV = {
    "UCX_TLS": "tcp,self",
    "UCXBACKEND_SHARED_MEMORY": "off",
    "UCXBACKEND_CHUNK_BYTES": "256K",
    # UCX's, whatever the environment asks: the one-host transport (shm) has no TCP to fold on.
    "UCXBACKEND_ONE_HOST_TRANSPORT": "ucx",
}
COUNT = 1_000_003  # odd: blocks of different lengths, a ragged last chunk


# int64 elements whose two all-gather blocks are both just over 16 MiB: received in place
# through non-temporal stores (Comm::recvStreamed, building_blocks.cpp's kStreamedRecvMinBytes).
STREAMED_COUNT = 2 * (16 << 20) // 8 + 3


def _rank_values(rank: int, dtype: torch.dtype, count: int = COUNT) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + rank)
    if dtype.is_floating_point:
        return torch.randn(count, generator=g, dtype=torch.float64).to(dtype)
    return torch.randint(-1000, 1000, (count,), generator=g, dtype=torch.int64).to(dtype)


def _reduced(
    rank: int, dtype: torch.dtype, op: str, count: int = COUNT, group: Any = None
) -> bytes:
    t = _rank_values(rank, dtype, count)
    dist.all_reduce(t, op=getattr(dist.ReduceOp, op), group=group)
    return t.numpy().tobytes()


EXACT_CASES = [
    (torch.int64, "SUM"),
    (torch.int64, "MAX"),
    (torch.int16, "PRODUCT"),
    (torch.float64, "SUM"),
    (torch.float32, "MIN"),
]
# The timeout of the groups whose ops are meant to fail: a hang shows as a timeout this soon.
FAILING_PG_TIMEOUT = 5.0


def _short_group(**env: str) -> Any:
    """A new group on every rank with FAILING_PG_TIMEOUT, created with ``env`` set (test hooks
    are read once per group, at its creation)."""
    os.environ.update(env)
    try:
        return dist.new_group(timeout=timedelta(seconds=FAILING_PG_TIMEOUT))
    finally:
        for name in env:
            del os.environ[name]


def _fold_world(rank: int, ws: int) -> dict[str, Any]:
    """Every check of this file in one world, each in a group or an op of its own, one after
    another: starting a world costs more than these checks (a world per check, spawned while
    UCX_TLS was taken for an import-time variable, cost sixteen torch imports)."""
    out: dict[str, Any] = {}
    for dtype, op in EXACT_CASES:
        out[f"exact-{dtype}-{op}"] = _reduced(rank, dtype, op)
    out["streamed"] = _reduced(rank, torch.int64, "SUM", STREAMED_COUNT)
    out["mismatched"] = _mismatched(rank, _short_group())
    out["fault"] = _fault_injected(rank, _short_group(UCXBACKEND_TEST_FAULT_INJECTION="1"))
    return out


@pytest.fixture(scope="module")
def fold_world() -> list[dict[str, Any]]:
    skip_unless_ucx("folding receives are the ucx transport's")
    return run_world(_fold_world, 2, env=ENV, timeout=240)


@pytest.mark.parametrize(("dtype", "op"), EXACT_CASES)
def test_folded_all_reduce_matches_numpy(
    dtype: torch.dtype, op: str, fold_world: list[dict[str, Any]]
) -> None:
    a, b = (_rank_values(r, dtype).numpy() for r in range(2))
    if op == "SUM" and dtype.is_floating_point:
        want = a + b  # one addition per element: the same bits whatever the order
    else:
        want = {"SUM": np.add, "MAX": np.maximum, "MIN": np.minimum, "PRODUCT": np.multiply}[op](
            a, b
        )
    for rank, out in enumerate(fold_world):
        assert out[f"exact-{dtype}-{op}"] == want.astype(a.dtype).tobytes(), (rank, dtype, op)


def test_streamed_all_gather_matches_numpy(fold_world: list[dict[str, Any]]) -> None:
    """The all-gather half of a 2-rank all_reduce, received into place piece by piece with
    non-temporal stores: every byte of both blocks, ragged ends included."""
    want = sum(_rank_values(r, torch.int64, STREAMED_COUNT).numpy() for r in range(2))
    for rank, out in enumerate(fold_world):
        assert out["streamed"] == want.tobytes(), rank


def _mismatched(rank: int, group: Any) -> tuple[float, str | None]:
    t = torch.ones(COUNT + (0 if rank == 0 else 4096), dtype=torch.int64)
    return timed_failure(lambda: dist.all_reduce(t, group=group))


def test_folded_sizes_that_differ_fail(fold_world: list[dict[str, Any]]) -> None:
    res = [out["mismatched"] for out in fold_world]
    messages = [msg for _, msg in res]
    assert all(msg is not None for msg in messages), messages
    for rank, (elapsed, msg) in enumerate(res):
        assert elapsed < FAILING_PG_TIMEOUT + 10, (rank, elapsed, msg)


def _fault_injected(rank: int, group: Any) -> dict[str, object]:
    from ucxbackend import _C

    native = group._get_backend(torch.device("cpu"))
    store = dist.distributed_c10d._get_default_store()
    t = _rank_values(rank, torch.int64)
    dist.all_reduce(t, group=group)
    out: dict[str, object] = {
        "bytes": t.numpy().tobytes(),
        "folds": _C._transport_fault_counts(native)["folded_receives"],
    }
    pending = _rank_values(rank, torch.int64)
    if rank == 0:
        # Posted (folding receives included) while rank 1 is away; then progress() throws.
        work = dist.all_reduce(pending, group=group, async_op=True)
        time.sleep(0.5)
        _C._inject_transport_fault(native, "progress")
        out["fault"] = timed_failure(work.wait)
        # Rank 1's op then finds this end of the group gone.
        dist.destroy_process_group(group)
        store.set("fold_fault_group_gone", "1")
    else:
        store.wait(["fold_fault_group_gone"])
        out["fault"] = timed_failure(lambda: dist.all_reduce(pending, group=group))
    return out


def test_fault_injected_group_folds_and_reports_faults(
    fold_world: list[dict[str, Any]],
) -> None:
    res = [out["fault"] for out in fold_world]
    want = (_rank_values(0, torch.int64) + _rank_values(1, torch.int64)).numpy().tobytes()
    for rank, out in enumerate(res):
        assert out["bytes"] == want, rank
        assert out["folds"] > 0, f"rank {rank}: the wrapped transport never folded"
    elapsed, msg = res[0]["fault"]
    assert msg is not None, "the op survived an injected transport fault"
    assert "injected transport fault" in msg and "allreduce" in msg and "rank 0 of 2" in msg, msg
    assert elapsed < FAILING_PG_TIMEOUT, (elapsed, msg)
    assert res[1]["fault"][0] < FAILING_PG_TIMEOUT + 10, res[1]["fault"]


# The shipped kernels and FoldTarget under UBSan (and ASan): -fsanitize=undefined checks the
# alignment of every typed load, which x86 would otherwise do without complaint.
FOLD_TARGET_TEST = cpp_build.Program(
    "fold_target_test_ubsan",
    "tests/cpp/fold_target_test.cpp",
    groups=["reduce_kernels"],
    flags=[*cpp_build.ASAN_UBSAN, "-Werror"],
    extra_sources=["transports/fold_target.cpp"],
)


def test_fold_target_hands_kernels_aligned_elements_only() -> None:
    run = subprocess.run(
        [FOLD_TARGET_TEST.build()],
        capture_output=True,
        text=True,
        timeout=300,
        env={"UBSAN_OPTIONS": "print_stacktrace=1", "ASAN_OPTIONS": "detect_leaks=1"},
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-6000:]
    assert " 0 failed" in run.stdout, output[-6000:]
