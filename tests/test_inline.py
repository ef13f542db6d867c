"""The inline path (docs/architecture.md#inline-ops): a small all_reduce on an idle group runs
on the caller's thread instead of hopping to the progress thread and back.

Every scenario counts the path its ops took (``ucxbackend.inline_stats``), so a test passes
only where the path under test really ran:

* results of every dtype and reduce op (2 ranks) equal a reference computed from the inputs
  that Gloo gathered, bit for bit for integers and bool, on ucx and on udp, and both ranks
  end with the same bits (float inputs hold zeros of opposite signs on the two ranks);
* a rank 200 ms late: the early rank's ``async_op=True`` op starts inline, is handed over to
  the progress thread and returns at once; a blocking one (and a 2-rank blocking op through the
  shared-memory slots, waiting for the peer's notices) is driven to its end on the caller's
  thread, sleeping while it waits; each is still right;
* two threads issuing ops on one group at once (some inline, some queued behind a lease);
* ``abort()`` from another thread while an op is inline (``spin_us`` long, the peer absent);
* ``inline_bytes=0`` and a message above the threshold never go inline;
* two ranks on one core: the higher rank moves itself off it (``core_moves``), gets its
  affinity mask back, and each op still equals the numpy sum of both ranks' inputs, bit for
  bit;
* a 2-rank all_reduce through the shared-memory slots, inline on one rank and queued on the
  other (``inline_bytes=0`` there), gives the reference bit for bit.

* in a group of MULTI_WS ranks (not a power of two: the first two ranks fold), every dtype x
  op through recursive doubling inline (one level after another on the caller's thread; an
  async op of a late peer handed over between levels), also with some ranks queuing every op.

A 2-rank world runs the other scenarios: starting ranks is what costs here.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
from dist_harness import BACKEND, run_world

OURS = ("ucx", "udp")
LATE_S = 0.2
OPS_PER_THREAD = 100
WORLD_TIMEOUT = 150.0

INT_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
OPS = ("SUM", "PRODUCT", "MIN", "MAX", "AVG")
# Elements. Up to 1000: one exchange through the transport for every dtype (within 32 KiB).
# 40000 (40 KB of int8 to 320 KB of float64, one or two 256 KiB pieces): one exchange through
# the shared-memory slots, inline too (ucx; udp has no slots and queues the ring).
COUNTS = (1, 7, 1000, 40000)
# The multi-rank world: 5 = 4 + 1, so ranks 0 and 1 fold and the other ranks run two levels.
MULTI_WS = 5
# Within one chunk of recursive doubling for every dtype (kAllreduceRecursiveDoublingMax).
MULTI_COUNTS = (1, 7, 1000)
# Ranks whose mixed group queues every op (inline_bytes=0): a folded rank, a participant.
MULTI_QUEUED = (0, 3)
STAGED_COUNT = 100_000  # int64: 800 KB, four pieces, what the slots hold at once


def _inline_stats(group: Any) -> dict[str, int]:
    import ucxbackend

    return ucxbackend.inline_stats(group)


def _inputs(rank: int, n: int, dtype: torch.dtype, salt: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(7919 * salt + 31 * rank + n)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if dtype.is_floating_point:
        x = torch.randn(n, generator=g, dtype=torch.float32).to(dtype)
        # Zeros of opposite signs on the two ranks: MIN and MAX must give both the same bits.
        x[::5] = -0.0 if rank == 0 else 0.0
        return x
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, (n,), generator=g, dtype=torch.int64).to(dtype)


# How two ranks' values combine, per reduce op; bool's sum and max are "or", its product and
# min "and" (torch's and Gloo's convention).
_COMBINE: dict[str, Any] = {
    "SUM": torch.add,
    "AVG": torch.add,
    "PRODUCT": torch.mul,
    "MIN": torch.minimum,
    "MAX": torch.maximum,
}
_BOOL_COMBINE: dict[str, Any] = {
    "SUM": torch.logical_or,
    "MAX": torch.logical_or,
    "PRODUCT": torch.logical_and,
    "MIN": torch.logical_and,
}


def _reference(xs: list[torch.Tensor], op: str) -> torch.Tensor:
    """The reduction of the ranks' inputs, in rank order, in their dtype."""
    table = _BOOL_COMBINE if xs[0].dtype == torch.bool else _COMBINE
    acc = functools.reduce(table[op], xs)
    return acc / len(xs) if op == "AVG" else acc


def _same(got: torch.Tensor, want: torch.Tensor) -> bool:
    if got.dtype.is_floating_point:
        tol = 1e-2 if got.element_size() == 2 else 1e-6
        return bool(torch.allclose(got.double(), want.double(), rtol=tol, atol=tol))
    return bool(torch.equal(got, want))


def _bits(x: torch.Tensor) -> torch.Tensor:
    """`x`'s bytes: torch.equal holds -0.0 equal to +0.0."""
    return x.to(torch.uint8) if x.dtype == torch.bool else x.view(torch.uint8)


def _gathered(x: torch.Tensor, ws: int, gloo: Any) -> list[torch.Tensor]:
    """Every rank's `x`, gathered by Gloo as raw bytes (Gloo lacks some dtypes)."""
    raw = _bits(x)
    parts = [torch.empty_like(raw) for _ in range(ws)]
    dist.all_gather(parts, raw, group=gloo)
    return [p.bool() if x.dtype == torch.bool else p.view(x.dtype) for p in parts]


def _matrix(
    rank: int,
    ws: int,
    group: Any,
    gloo: Any,
    counts: tuple[int, ...] = COUNTS,
    async_op: bool = False,
) -> dict[str, Any]:
    """Every dtype x op x count on `group`; mismatches and how many ops went inline."""
    bad: list[str] = []
    before = _inline_stats(group)
    ops = 0
    salt = 0
    for dtype in (*INT_DTYPES, *FLOAT_DTYPES, torch.bool):
        for op in OPS:
            if op == "AVG" and not dtype.is_floating_point:
                continue
            for n in counts:
                salt += 1
                x = _inputs(rank, n, dtype, salt)
                xs = _gathered(x, ws, gloo)
                got = x.clone()
                work = dist.all_reduce(
                    got, op=getattr(dist.ReduceOp, op), group=group, async_op=async_op
                )
                if work is not None:
                    work.wait()
                ops += 1
                want = _reference(xs, op)
                if not _same(got, want):
                    bad.append(f"{op} {dtype} n={n}: {got[:4].tolist()} != {want[:4].tolist()}")
                # Every rank must hold the same bits.
                theirs = [_bits(t) for t in _gathered(got, ws, gloo)]
                if not all(torch.equal(t, theirs[0]) for t in theirs):
                    bad.append(f"{op} {dtype} n={n}: the ranks' results differ")
    after = _inline_stats(group)
    return {
        "bad": bad,
        "ops": ops,
        "inline": after["inline"] - before["inline"],
        "handed_over": after["handed_over"] - before["handed_over"],
    }


def _late_peer(rank: int, group: Any, gloo: Any, async_op: bool, n: int = 8) -> dict[str, Any]:
    """Rank 1 joins LATE_S after rank 0 issued the op (`n` int64s: 8 through the transport,
    STAGED_COUNT through the shared-memory slots)."""
    dist.barrier(group=gloo)
    before = _inline_stats(group)
    t = torch.full((n,), rank + 1, dtype=torch.int64)
    out: dict[str, Any] = {}
    if rank == 1:
        time.sleep(LATE_S)
        dist.all_reduce(t, group=group)
    else:
        start = time.monotonic()
        work = dist.all_reduce(t, group=group, async_op=async_op)
        out["issue_s"] = time.monotonic() - start
        if async_op:
            assert work is not None
            work.wait()
        out["op_s"] = time.monotonic() - start
    out["result"] = t[:8].tolist()
    out["all_three"] = bool(torch.all(t == 3))
    after = _inline_stats(group)
    out["inline"] = after["inline"] - before["inline"]
    out["handed_over"] = after["handed_over"] - before["handed_over"]
    return out


def _two_threads(rank: int, group: Any) -> dict[str, Any]:
    """Two threads issue OPS_PER_THREAD small all_reduces each on one group at once. Every op
    has the same shape and inputs, so whichever ops the ranks pair, each sums to 1 + 2."""
    before = _inline_stats(group)
    wrong: list[Any] = []

    def run() -> None:
        for _ in range(OPS_PER_THREAD):
            t = torch.full((16,), rank + 1, dtype=torch.int64)
            dist.all_reduce(t, group=group)
            if t.tolist() != [3] * 16:
                wrong.append(t.tolist())

    threads = [threading.Thread(target=run) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    after = _inline_stats(group)
    return {
        "alive": sum(th.is_alive() for th in threads),
        "wrong": wrong[:3],
        "inline": after["inline"] - before["inline"],
        "handed_over": after["handed_over"] - before["handed_over"],
    }


def _abort_inline(rank: int, backend: str, gloo: Any) -> dict[str, Any]:
    """Rank 0's op waits inline (spin_us 5 s) for rank 1, which never joins; another thread
    aborts the group after 0.5 s."""
    sub = dist.new_group(
        backend=backend, timeout=timedelta(seconds=30), pg_options={"spin_us": 5_000_000}
    )
    t = torch.ones(4)
    dist.all_reduce(t, group=sub)  # connected
    out: dict[str, Any] = {}
    if rank == 0:
        before = _inline_stats(sub)
        aborter = threading.Timer(0.5, sub.abort)
        aborter.start()
        start = time.monotonic()
        try:
            dist.all_reduce(torch.ones(4), group=sub)
            out["error"] = None
        except RuntimeError as exc:
            out["error"] = str(exc)
        out["op_s"] = time.monotonic() - start
        aborter.join(10)
        after = _inline_stats(sub)
        out["inline"] = after["inline"] - before["inline"]
        out["handed_over"] = after["handed_over"] - before["handed_over"]
    dist.barrier(group=gloo)
    dist.destroy_process_group(sub)
    return out


def _never_inline(rank: int, backend: str, gloo: Any) -> dict[str, Any]:
    """inline_bytes=0 on one group; a message over the threshold on another."""
    off = dist.new_group(backend=backend, pg_options={"inline_bytes": 0})
    on = dist.new_group(backend=backend)
    for g in (off, on):
        dist.all_reduce(torch.ones(4), group=g)
    counts = {}
    for name, g, n in (("off", off, 4), ("large", on, 512 << 10)):
        before = _inline_stats(g)
        t = torch.full((n,), rank + 1, dtype=torch.int32)
        for _ in range(5):
            dist.all_reduce(t, group=g)
        after = _inline_stats(g)
        counts[name] = (after["inline"] - before["inline"], t[:2].tolist())
    dist.barrier(group=gloo)
    for g in (off, on):
        dist.destroy_process_group(g)
    return counts


def _staged_mixed(rank: int, gloo: Any) -> dict[str, Any]:
    """An all_reduce that stages through the slots at once, inline on rank 1 and queued on rank
    0 (inline_bytes=0 there: the knob may differ per rank), so the two paths must exchange the
    same messages; checked bit for bit against the inputs that Gloo gathered. Rank 1 waits up
    to 2 s on its own thread before handing an op over (spin_us): on a loaded host the queued
    rank, which goes through its progress thread, is often later than the default 250 us."""
    sub = dist.new_group(
        backend="ucx",
        pg_options={"inline_bytes": 0} if rank == 0 else {"spin_us": 2_000_000},
    )
    dist.all_reduce(torch.ones(4), group=sub)  # connected
    before = _inline_stats(sub)
    bad: list[str] = []
    for salt in range(5):
        x = _inputs(rank, STAGED_COUNT, torch.int64, 1000 + salt)
        want = _reference(_gathered(x, 2, gloo), "SUM")
        got = x.clone()
        dist.all_reduce(got, group=sub)
        if not torch.equal(got, want):
            diff = int((got != want).sum())
            bad.append(f"salt {salt}: {diff} of {STAGED_COUNT} elements differ")
    after = _inline_stats(sub)
    dist.barrier(group=gloo)
    dist.destroy_process_group(sub)
    return {
        "bad": bad,
        "inline": after["inline"] - before["inline"],
        "handed_over": after["handed_over"] - before["handed_over"],
    }


SHARED_CORE_OPS = 300
SHARED_CORE_ROUNDS = 3


def _shared_core(rank: int, group: Any, gloo: Any) -> dict[str, Any]:
    """Both ranks start on one core: rank 0 stays pinned there, rank 1 may run on every core
    it had. Rank 1's inline ops must move it off that core (core_moves), restore its affinity
    mask, and give the numpy sum of both ranks' inputs bit for bit, op after op.

    The kernel may itself put rank 1 on the other core as soon as its mask allows it; then no
    yield is lost to rank 0 and no move is due. So a round of ops that made no move is tried
    again, each from both ranks on one core, up to SHARED_CORE_ROUNDS: a build that never
    moves fails every round."""
    import numpy as np

    import ucxbackend

    mask = os.sched_getaffinity(0)
    if len(mask) < 2 or not ucxbackend.shared_memory(group):
        return {"skip": f"needs 2 cores and staging slots (cores {sorted(mask)})"}
    before = _inline_stats(group)
    bad: list[str] = []
    kept: set[int] = set(mask)
    rounds = 0
    while rounds < SHARED_CORE_ROUNDS:
        rounds += 1
        os.sched_setaffinity(0, {min(mask)})
        dist.barrier(group=gloo)  # rank 1 sleeps here and wakes on rank 0's core
        if rank == 1:
            os.sched_setaffinity(0, mask)  # free to move; still on rank 0's core
        for i in range(SHARED_CORE_OPS):
            x = _inputs(rank, 16, torch.int64, 5000 + i)
            want = (
                _inputs(0, 16, torch.int64, 5000 + i).numpy()
                + _inputs(1, 16, torch.int64, 5000 + i).numpy()
            )
            dist.all_reduce(x, group=group)
            if not np.array_equal(x.numpy(), want):
                bad.append(f"round {rounds} op {i}: {x.tolist()} != {want.tolist()}")
        kept = os.sched_getaffinity(0)
        os.sched_setaffinity(0, mask)
        # Both ranks run the same number of rounds: rank 1 says whether it has moved yet.
        moved = torch.tensor([_inline_stats(group)["core_moves"] - before["core_moves"]])
        dist.all_reduce(moved, group=gloo)
        if moved.item() > 0:
            break
    after = _inline_stats(group)
    dist.barrier(group=gloo)
    return {
        "bad": bad,
        "rounds": rounds,
        "mask": sorted(mask),
        "mask_after": sorted(kept),
        **{k: after[k] - before[k] for k in ("inline", "handed_over", "core_moves")},
    }


def _inline_world(rank: int, ws: int) -> dict[str, Any]:
    gloo = dist.new_group(backend="gloo")
    out: dict[str, Any] = {}
    for backend in OURS:
        group = dist.new_group(backend=backend, timeout=timedelta(seconds=30))
        dist.all_reduce(torch.ones(1), group=group)  # connected
        out[f"matrix/{backend}"] = _matrix(rank, ws, group, gloo)
        dist.destroy_process_group(group)
    world = dist.group.WORLD
    out["late/blocking"] = _late_peer(rank, world, gloo, async_op=False)
    out["late/async"] = _late_peer(rank, world, gloo, async_op=True)
    out["late/staged"] = _late_peer(rank, world, gloo, async_op=False, n=STAGED_COUNT)
    out["threads"] = _two_threads(rank, world)
    out["abort"] = _abort_inline(rank, "ucx", gloo)
    out["never"] = _never_inline(rank, "ucx", gloo)
    out["staged"] = _staged_mixed(rank, gloo)
    out["shared_core"] = _shared_core(rank, world, gloo)
    return out


@pytest.fixture(scope="module")
def inline_world() -> list[dict[str, Any]]:
    if BACKEND != "ucx":
        pytest.skip(f"the inline path of ucx/udp ({BACKEND} under test)")
    return run_world(_inline_world, 2, timeout=WORLD_TIMEOUT)


@pytest.mark.parametrize("backend", OURS)
def test_inline_results_match_reference(inline_world: list[dict[str, Any]], backend: str) -> None:
    for rank, out in enumerate(inline_world):
        m = out[f"matrix/{backend}"]
        assert not m["bad"], f"rank {rank}: {m['bad'][:5]}"
        # On a loaded machine some ops are handed over (a peer descheduled for longer than
        # spin_us), and the op after one may find the thread still finishing it and queue;
        # so only "some finished inline" is certain.
        assert m["inline"] + m["handed_over"] <= m["ops"], (rank, m)
        assert m["inline"] > 0, (rank, m)


@pytest.mark.parametrize("mode", ["blocking", "async", "staged"])
def test_late_peer_hands_over(inline_world: list[dict[str, Any]], mode: str) -> None:
    early, late = inline_world[0][f"late/{mode}"], inline_world[1][f"late/{mode}"]
    assert early["result"] == late["result"] == [3] * 8, (early, late)
    assert early["all_three"] and late["all_three"], (early, late)
    assert early["op_s"] >= LATE_S / 2, early  # it took the late rank's time
    if mode == "async":
        # The early rank's op started inline and was handed over: the caller was held no
        # longer than spin_us (250 us), not until the peer came.
        assert early["handed_over"] == 1 and early["inline"] == 0, early
        assert early["issue_s"] < LATE_S / 2, early
    else:
        # A blocking caller (async_op=False) drove its op to the end, sleeping while it waited.
        assert early["inline"] == 1 and early["handed_over"] == 0, early


def test_two_threads_on_one_group(inline_world: list[dict[str, Any]]) -> None:
    for rank, out in enumerate(inline_world):
        t = out["threads"]
        assert t["alive"] == 0 and not t["wrong"], (rank, t)
        assert t["inline"] > 0, (rank, t)


def test_abort_during_inline_op(inline_world: list[dict[str, Any]]) -> None:
    out = inline_world[0]["abort"]
    assert out["error"] is not None and "was aborted" in out["error"], out
    assert "ucx allreduce (op #" in out["error"], out
    assert out["op_s"] < 3.0, out  # the abort ended it, not spin_us (5 s) or the timeout
    # The abort met the op on the caller's thread, before any hand-over.
    assert out["inline"] == 1 and out["handed_over"] == 0, out


def test_off_switch_and_threshold(inline_world: list[dict[str, Any]]) -> None:
    for rank, out in enumerate(inline_world):
        for name in ("off", "large"):
            count, head = out["never"][name]
            assert count == 0, (rank, name, count)
            assert head == [3 * 2**4] * 2, (rank, name, head)  # five sums of 1 + 2, doubling


def test_staged_inline_meets_queued(inline_world: list[dict[str, Any]]) -> None:
    queued, inline = inline_world[0]["staged"], inline_world[1]["staged"]
    for rank, out in enumerate((queued, inline)):
        assert not out["bad"], (rank, out)
    assert queued["inline"] == 0 and queued["handed_over"] == 0, queued
    assert inline["inline"] + inline["handed_over"] == 5 and inline["inline"] > 0, inline


def test_shared_core_moves_higher_rank(inline_world: list[dict[str, Any]]) -> None:
    low, high = inline_world[0]["shared_core"], inline_world[1]["shared_core"]
    if "skip" in low:
        pytest.skip(low["skip"])
    for rank, out in enumerate((low, high)):
        assert not out["bad"], (rank, out["bad"][:3])
        assert out["inline"] > 0, (rank, out)
    # The lower rank never moves (it is pinned anyway); the higher one leaves the shared core
    # and gets back the mask it had (moving narrows it only for a moment).
    assert low["core_moves"] == 0, low
    assert high["core_moves"] >= 1, high
    assert high["mask_after"] == high["mask"], high


def _multi_world(rank: int, ws: int) -> dict[str, Any]:
    gloo = dist.new_group(backend="gloo")
    out: dict[str, Any] = {}
    groups = {
        # Blocking: each rank drives every level itself, sleeping while a peer is late.
        "ucx": ("ucx", {}, False),
        # async_op=True: an op not done within spin_us is handed over between two levels
        # (on a loaded host, most are).
        "udp": ("udp", {}, True),
        "mixed": ("ucx", {"inline_bytes": 0} if rank in MULTI_QUEUED else {}, False),
    }
    for name, (backend, options, async_op) in groups.items():
        group = dist.new_group(backend=backend, pg_options=options, timeout=timedelta(seconds=30))
        out[name] = _matrix(rank, ws, group, gloo, MULTI_COUNTS, async_op)
        dist.destroy_process_group(group)
    return out


@pytest.fixture(scope="module")
def multi_world() -> list[dict[str, Any]]:
    if BACKEND != "ucx":
        pytest.skip(f"the inline path of ucx/udp ({BACKEND} under test)")
    return run_world(_multi_world, MULTI_WS, timeout=WORLD_TIMEOUT)


@pytest.mark.parametrize("name", ["ucx", "udp", "mixed"])
def test_multi_rank_inline_matches_reference(multi_world: list[dict[str, Any]], name: str) -> None:
    for rank, out in enumerate(multi_world):
        m = out[name]
        assert not m["bad"], f"rank {rank}: {m['bad'][:5]}"
        assert m["inline"] + m["handed_over"] <= m["ops"], (rank, m)
        if name == "mixed" and rank in MULTI_QUEUED:
            assert m["inline"] == 0 and m["handed_over"] == 0, (rank, m)
        elif name == "udp":
            assert m["inline"] + m["handed_over"] > 0, (rank, m)
        else:
            # The first op after the group's creation included; a few may still queue (the
            # progress thread in an idle pass for longer than lend() waits). A blocking
            # caller never hands its op over.
            assert m["inline"] > 0 and m["handed_over"] == 0, (rank, m)
