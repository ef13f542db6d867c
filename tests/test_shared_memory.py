"""Shared-memory staging (csrc/engine/staging_area.h, collectives/staged_exchange.h,
transports/shm/).

When every rank of a ucx group runs on one host, the ring all_reduce, the ring all_gather, and
the binomial broadcast and pairwise all_to_all (messages from 64 KiB) move their bytes through
shared-memory slots instead of UCX. These tests check when a group
stages (``ucxbackend.shared_memory``), that results through the slots match numpy bit for bit
(many pieces, ragged last pieces, pieces smaller than a slot, world sizes 2 and 3), that the
same ops with staging off agree, that ranks passing different sizes get an error naming both
sizes, and that no segment name is left in /dev/shm once the groups exist.
"""

from __future__ import annotations

import glob
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from conftest import skip_unless_ucx
from dist_harness import run_world, timed_failure

import ucxbackend
from ucxbackend import _transport_options

REPO = Path(__file__).resolve().parent.parent
# int64 / float32 elements: blocks of ~1.2 MB (several 256 KiB pieces, the last one ragged).
COUNT = 300_007
# chunk_bytes caps the slot: 40-byte slots hold 5 int64 or 10 float32 per piece.
TINY_SLOT_OPTIONS = {"chunk_bytes": 40}
TINY_COUNT = 1003
# int64: 80 KB, above the staged broadcast's 64 KiB floor; 2000 pieces in 40-byte slots.
BROADCAST_COUNT = 10_001


def _input(rank: int, count: int, dtype: type) -> np.ndarray:
    # Small integers: float32 sums are exact in any order, so every rank must agree bitwise.
    return ((np.arange(count, dtype=np.int64) * (rank + 7)) % 201 - 100).astype(dtype)


def _check_group(rank: int, ws: int, group: Any, count: int, label: str) -> list[str]:
    failures = []
    for dtype in (np.int64, np.float32):
        inputs = [_input(r, count, dtype) for r in range(ws)]
        t = torch.from_numpy(inputs[rank].copy())
        dist.all_reduce(t, group=group)
        expected = np.sum(np.stack(inputs), axis=0, dtype=dtype)
        if not np.array_equal(t.numpy(), expected):
            bad = int(np.argmax(t.numpy() != expected))
            failures.append(f"{label} all_reduce {dtype.__name__}: first bad index {bad}")
        out = torch.empty(count * ws, dtype=t.dtype)
        dist.all_gather_into_tensor(out, torch.from_numpy(inputs[rank].copy()), group=group)
        if not np.array_equal(out.numpy(), np.concatenate(inputs)):
            failures.append(f"{label} all_gather_into_tensor {dtype.__name__}")
    failures += _check_all_to_all(rank, ws, group, label)
    # Broadcast stages from 64 KiB (kStagedMessageMin): every root, one size above it.
    for root in range(ws):
        data = _input(root, BROADCAST_COUNT, np.int64)
        t = torch.from_numpy(data.copy() if rank == root else np.zeros_like(data))
        dist.broadcast(t, src=root, group=group)
        if not np.array_equal(t.numpy(), data):
            failures.append(f"{label} broadcast from {root}")
    return failures


def _a2a_split(src: int, ws: int) -> list[int]:
    # int64 elements rank src sends to each rank: rank 0 sends 32 KB blocks (below the 64 KiB
    # floor: through UCX), the others 160 KB ones (staged), so pairs mix both paths.
    return [(4000 if src == 0 else 20000) + 7 * src + dst for dst in range(ws)]


def _check_all_to_all(rank: int, ws: int, group: Any, label: str) -> list[str]:
    inputs = [_input(src, sum(_a2a_split(src, ws)), np.int64) for src in range(ws)]
    blocks = [np.split(x, np.cumsum(_a2a_split(src, ws))[:-1]) for src, x in enumerate(inputs)]
    expected = np.concatenate([blocks[src][rank] for src in range(ws)])
    out = torch.empty(expected.size, dtype=torch.int64)
    dist.all_to_all_single(
        out,
        torch.from_numpy(inputs[rank].copy()),
        output_split_sizes=[_a2a_split(src, ws)[rank] for src in range(ws)],
        input_split_sizes=_a2a_split(rank, ws),
        group=group,
    )
    return [] if np.array_equal(out.numpy(), expected) else [f"{label} all_to_all_single"]


def _staging_world(rank: int, ws: int) -> dict[str, Any]:
    off = dist.new_group(backend="ucx", pg_options={"shared_memory": "off"})
    tiny = dist.new_group(backend="ucx", pg_options=TINY_SLOT_OPTIONS)
    groups = (("default", None, COUNT), ("off", off, COUNT), ("tiny", tiny, TINY_COUNT))
    failures: list[str] = []
    for label, group, count in groups:
        failures += _check_group(rank, ws, group, count, label)
    return {
        "staged": {label: ucxbackend.shared_memory(group) for label, group, _ in groups},
        "failures": failures,
        "left_in_dev_shm": sorted(glob.glob("/dev/shm/ucxb-*")),
    }


@pytest.mark.parametrize("ws", [2, 3])
def test_staged_results_match_numpy(ws: int) -> None:
    skip_unless_ucx("shared-memory staging is part of the ucx backend")
    results = run_world(_staging_world, ws, timeout=240)
    for rank, res in enumerate(results):
        assert res["staged"] == {"default": True, "off": False, "tiny": True}, (rank, res)
        assert res["failures"] == [], (rank, res["failures"])
        assert res["left_in_dev_shm"] == [], (rank, res["left_in_dev_shm"])


def _staged_and_sum(rank: int, ws: int) -> tuple[bool, list[str]]:
    return ucxbackend.shared_memory(), _check_group(rank, ws, None, COUNT, "world")


def test_ucx_tls_without_shared_memory_turns_staging_off() -> None:
    skip_unless_ucx("UCX_TLS steers the ucx backend")
    results = run_world(_staged_and_sum, 2, env={"UCX_TLS": "tcp,self"}, timeout=180)
    assert results == [(False, [])] * 2, results


def test_udp_never_stages() -> None:
    results = run_world(_staged_and_sum, 2, backend="udp", timeout=180)
    assert results == [(False, [])] * 2, results


def _mismatched_sizes(rank: int, ws: int) -> tuple[float, str | None]:
    # Both fit the staged ring; the ranks disagree on every block's length.
    t = torch.ones((2 if rank == 0 else 3) * (1 << 20))
    return timed_failure(lambda: dist.all_reduce(t))


def test_staged_sizes_that_differ_fail_with_both_sizes() -> None:
    skip_unless_ucx("shared-memory staging is part of the ucx backend")
    pg_timeout = 5.0
    res = run_world(_mismatched_sizes, 2, pg_timeout=pg_timeout, timeout=90)
    messages = [msg for _, msg in res]
    assert all(msg is not None for msg in messages), messages
    assert any("different sizes" in msg for msg in messages if msg), messages
    for rank, (elapsed, msg) in enumerate(res):
        assert elapsed < pg_timeout + 10, (rank, elapsed, msg)


@pytest.mark.parametrize(
    ("tls", "expected"),
    [
        ("", "auto"),
        ("all", "auto"),
        ("tcp", "off"),
        ("tcp,self", "off"),
        ("sm,tcp", "auto"),
        ("posix,self", "auto"),
        ("^sm", "off"),
        ("^posix", "off"),
        ("^cma", "auto"),
        ("cma,tcp", "off"),
        ("^ib", "auto"),
    ],
)
def test_ucx_tls_rule(tls: str, expected: str) -> None:
    config = ucxbackend.Config()
    assert _transport_options.shared_memory(config, {"UCX_TLS": tls}) == expected
    off = ucxbackend.Config(shared_memory="off")
    assert _transport_options.shared_memory(off, {"UCX_TLS": tls}) == "off"


def test_shared_segment_unit(tmp_path: Path) -> None:
    """The torch-free segment class on its own (tests/cpp/shared_segment_test.cpp)."""
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("g++ not found")
    exe = tmp_path / "shared_segment_test"
    sources = ["transports/shm/shared_segment.cpp", "tests/cpp/shared_segment_test.cpp"]
    subprocess.run(
        [compiler, "-std=c++20", "-O1", "-Wall", "-Wextra", "-Werror", "-I.", *sources, "-o", exe],
        cwd=REPO,
        check=True,
        timeout=300,
    )
    run = subprocess.run([exe], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "OK", run.stdout + run.stderr
