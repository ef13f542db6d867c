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
import time
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
# int64: ~2.4 MB in ten 256 KiB broadcast pieces and ~16.8 MB in seventeen whole 1 MiB
# slots (one-way pieces grow with the message), the last piece ragged, every slot reused;
# only for groups with full-size slots (40-byte ones would need 420,000 pieces).
LARGE_BROADCAST_COUNTS = (300_007, 2_100_007)


def _input(rank: int, count: int, dtype: type) -> np.ndarray:
    # Small integers: float32 sums are exact in any order, so every rank must agree bitwise.
    return ((np.arange(count, dtype=np.int64) * (rank + 7)) % 201 - 100).astype(dtype)


def _check_group(
    rank: int,
    ws: int,
    group: Any,
    count: int,
    label: str,
    broadcast_counts: tuple[int, ...] = (BROADCAST_COUNT, *LARGE_BROADCAST_COUNTS),
) -> list[str]:
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
    # Broadcast stages from 64 KiB (kStagedMessageMin): every root, sizes above it.
    for bcast_count in broadcast_counts:
        for root in range(ws):
            data = _input(root, bcast_count, np.int64)
            t = torch.from_numpy(data.copy() if rank == root else np.zeros_like(data))
            dist.broadcast(t, src=root, group=group)
            if not np.array_equal(t.numpy(), data):
                failures.append(f"{label} broadcast of {bcast_count} from {root}")
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
    streaming = dist.new_group(backend="ucx", pg_options={"staging_stores": "streaming"})
    groups = (
        ("default", None, COUNT),
        ("off", off, COUNT),
        ("tiny", tiny, TINY_COUNT),
        ("streaming", streaming, COUNT),
    )
    failures: list[str] = []
    for label, group, count in groups:
        bcasts = (BROADCAST_COUNT,) if group is tiny else (BROADCAST_COUNT, *LARGE_BROADCAST_COUNTS)
        failures += _check_group(rank, ws, group, count, label, bcasts)
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
        assert res["staged"] == {
            "default": True,
            "off": False,
            "tiny": True,
            "streaming": True,
        }, (rank, res)
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


def _late_receiver(rank: int, ws: int) -> dict[str, Any]:
    # 1 MiB: four staged pieces, so rank 0 puts every piece in a slot and sends every notice
    # before it waits for a credit; rank 1 only arrives after rank 0's op timed out.
    first = np.arange(1 << 17, dtype=np.int64)
    second = -first - 1
    if rank == 0:
        _, timed_out = timed_failure(lambda: dist.broadcast(torch.from_numpy(first.copy()), 0))
        elapsed, refused = timed_failure(lambda: dist.broadcast(torch.from_numpy(second), 0))
        time.sleep(LATE_BY)  # keep this rank's segment mapped while rank 1 reads it
        return {"timed_out": timed_out, "refused": refused, "refused_after": elapsed}
    time.sleep(LATE_BY)
    got = torch.zeros(first.size, dtype=torch.int64)
    _, error = timed_failure(lambda: dist.broadcast(got, 0))
    return {
        "error": error,
        "first": bool(np.array_equal(got.numpy(), first)),
        "second": bool(np.array_equal(got.numpy(), second)),
    }


LATE_PG_TIMEOUT = 2.0
LATE_BY = 4.0


def test_slots_a_late_peer_may_read_are_never_rewritten() -> None:
    """A sender whose op failed before every piece was read must not refill its slots: a peer
    that enters that op late would take the next op's bytes for it."""
    skip_unless_ucx("shared-memory staging is part of the ucx backend")
    res = run_world(_late_receiver, 2, pg_timeout=LATE_PG_TIMEOUT, timeout=120)
    sender, receiver = res
    assert sender["timed_out"] is not None, res
    assert "stopped using its shared-memory slots" in (sender["refused"] or ""), res
    assert sender["refused_after"] < 1.0, res
    assert not receiver["second"], res
    assert receiver["error"] is not None or receiver["first"], res


def _a2a_block_sizes_disagree(rank: int, ws: int) -> tuple[float, str | None]:
    # Rank 1 sends rank 0 an 80 KB block (staged) where rank 0 expects 16 bytes (through
    # UCX): the 16-byte notice must not pass for the data.
    out_splits = [4, 2] if rank == 0 else [4, 4]
    in_splits = [4, 4] if rank == 0 else [10_000, 4]
    out = torch.zeros(sum(out_splits), dtype=torch.int64)
    inp = torch.arange(sum(in_splits), dtype=torch.int64)
    return timed_failure(
        lambda: dist.all_to_all_single(
            out, inp, output_split_sizes=out_splits, input_split_sizes=in_splits
        )
    )


def test_staged_block_never_matches_a_whole_message() -> None:
    skip_unless_ucx("shared-memory staging is part of the ucx backend")
    pg_timeout = 3.0
    res = run_world(_a2a_block_sizes_disagree, 2, pg_timeout=pg_timeout, timeout=90)
    for rank, (elapsed, msg) in enumerate(res):
        assert msg is not None, (rank, res)
        assert elapsed < pg_timeout + 10, (rank, res)


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


@pytest.mark.parametrize("unit", ["shared_segment_test", "staging_area_test"])
def test_torch_free_unit(tmp_path: Path, unit: str) -> None:
    """The segment class, the slot layout and the slots' streaming stores on their own
    (tests/cpp/<unit>.cpp)."""
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("g++ not found")
    exe = tmp_path / unit
    sources = [
        "transports/shm/shared_segment.cpp",
        "csrc/engine/streaming_copy.cpp",
        f"tests/cpp/{unit}.cpp",
    ]
    subprocess.run(
        [compiler, "-std=c++20", "-O1", "-Wall", "-Wextra", "-Werror", "-I.", *sources, "-o", exe],
        cwd=REPO,
        check=True,
        timeout=300,
    )
    run = subprocess.run([exe], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "OK", run.stdout + run.stderr
