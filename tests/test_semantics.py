"""Semantics beyond single-op correctness: async overlap and futures, process-group
isolation, timeouts, a killed peer, bad input, and world size 1.

Checks run inside the ranks and raise AssertionError there (the failing rank's traceback
comes back through the harness), except where the parent has to compare ranks or timings.
Error-message contents are checked for the ucx backend only (Gloo's messages do not
name the op, rank or peer).

The worlds of the timeout and killed-peer tests mostly wait out their timeouts: they run side by
side (``@pooled``, tests/world_pool.py), each checked by its own test, whose bounds on the
elapsed time are loose enough for it (at least 0.8 of the timeout, at most 10 s more).
"""

from __future__ import annotations

import os
import re
import signal
import tempfile
import time
import warnings
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from dist_harness import BACKEND, run_world
from world_pool import pooled

UCX = "ucx" in BACKEND
WORLD_TIMEOUT = 120.0

# What a ucx error message must contain (case-insensitive).
OP_ALL_REDUCE = r"all_?reduce"
OP_ALL_GATHER = r"all_?gather"


def names_rank(text: str, rank: int) -> bool:
    return re.search(rf"\brank\W{{0,3}}{rank}\b", text, re.IGNORECASE) is not None


def names_peer(text: str, peer: int) -> bool:
    pattern = rf"\b(peer|rank|from|to)\W{{0,3}}(rank\W{{0,3}})?{peer}\b"
    return re.search(pattern, text, re.IGNORECASE) is not None


def names(text: str, pattern: str) -> bool:
    return re.search(pattern, text, re.IGNORECASE) is not None


def same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """assert torch.equal, with a short message (first differing element)."""
    if got.shape != want.shape or got.dtype != want.dtype:
        raise AssertionError(
            f"{what}: got {tuple(got.shape)} {got.dtype}, want {tuple(want.shape)} {want.dtype}"
        )
    if not torch.equal(got, want):
        i = int((got != want).reshape(-1).nonzero()[0])
        g, w = got.reshape(-1)[i].item(), want.reshape(-1)[i].item()
        raise AssertionError(f"{what}: first diff at flat index {i}: got {g!r}, want {w!r}")


def flatten(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    return [t for v in value for t in flatten(v)]


def timed(fn: Callable[[], object]) -> tuple[float, str | None, str]:
    """Run fn; return (seconds, exception type name or None, message)."""
    t0 = time.monotonic()
    try:
        fn()
    except Exception as e:
        return time.monotonic() - t0, type(e).__name__, str(e)
    return time.monotonic() - t0, None, ""


# --------------------------------------------------------------------------
# async overlap, futures
# --------------------------------------------------------------------------


def _async_overlap(rank: int, ws: int) -> None:
    a = torch.full((1000,), float(rank + 1))
    gathered = [torch.full((7,), -1, dtype=torch.int64) for _ in range(ws)]
    b = torch.full((5,), float(rank), dtype=torch.float64)
    c = torch.arange(33, dtype=torch.int32) * (rank + 1)
    many = [torch.full((k * 100 + 1,), float(rank + k)) for k in range(8)]

    seen: dict[str, list[torch.Tensor]] = {}

    def double(fut: torch.futures.Future) -> torch.Tensor:
        seen["value"] = [t.clone() for t in fut.value()]
        return fut.value()[0] * 2

    works = [
        dist.all_reduce(a, async_op=True),
        dist.all_gather(gathered, torch.arange(7) + 100 * rank, async_op=True),
        dist.broadcast(b, src=ws - 1, async_op=True),
        dist.all_reduce(c, op=dist.ReduceOp.MAX, async_op=True),
    ]
    works += [dist.all_reduce(t, async_op=True) for t in many]
    chained = works[0].get_future().then(double)  # chained before anything completed
    for w in reversed(works):
        w.wait()
    assert all(w.is_completed() for w in works)

    want_a = torch.full((1000,), float(ws * (ws + 1) // 2))
    same(a, want_a, "all_reduce SUM")
    for j in range(ws):
        same(gathered[j], torch.arange(7) + 100 * j, f"all_gather output {j}")
    same(b, torch.full((5,), float(ws - 1), dtype=torch.float64), "broadcast")
    same(c, torch.arange(33, dtype=torch.int32) * ws, "all_reduce MAX")
    for k, t in enumerate(many):
        want = torch.full((k * 100 + 1,), float(sum(r + k for r in range(ws))))
        same(t, want, f"all_reduce #{k}")

    # future values are the op's outputs
    same(flatten(works[0].get_future().wait())[0], want_a, "all_reduce future value")
    got = flatten(works[1].get_future().wait())
    assert len(got) == ws, f"all_gather future value has {len(got)} tensors"
    for j in range(ws):
        same(got[j], gathered[j], f"all_gather future value {j}")
    same(flatten(works[2].get_future().wait())[0], b, "broadcast future value")
    same(flatten(works[3].get_future().wait())[0], c, "all_reduce MAX future value")
    # the .then() callback ran and saw the result
    same(chained.wait(), want_a * 2, "future.then() result")
    same(seen["value"][0], want_a, "value seen by the .then() callback")


@pytest.mark.parametrize("ws", [2, 3])
def test_async_overlap(ws: int) -> None:
    run_world(_async_overlap, ws, timeout=WORLD_TIMEOUT)


# --------------------------------------------------------------------------
# group isolation
# --------------------------------------------------------------------------


def _groups(rank: int, ws: int) -> None:
    g_all = dist.new_group(list(range(ws)))
    sub = [0, 2]
    g_sub = dist.new_group(sub)

    x1 = torch.full((10,), float(rank + 1))
    x2 = [torch.full((3,), -1.0) for _ in range(ws)]
    y1 = torch.full((10,), 10.0 * (rank + 1))
    y2 = torch.full((4,), float(rank), dtype=torch.float64)
    w1 = torch.full((6,), float(rank))

    issue = {
        "x1": lambda: dist.all_reduce(x1, group=g_all, async_op=True),
        "x2": lambda: dist.all_gather(
            x2, torch.full((3,), float(rank)), group=g_all, async_op=True
        ),
        "y1": lambda: dist.all_reduce(y1, group=g_sub, async_op=True),
        "y2": lambda: dist.broadcast(y2, src=2, group=g_sub, async_op=True),
        "w1": lambda: dist.all_reduce(w1, op=dist.ReduceOp.MAX, async_op=True),
    }
    # Each group sees its ops in the same order on all its ranks; the interleaving
    # between groups differs from rank to rank.
    order = {
        0: ["y1", "x1", "w1", "y2", "x2"],
        1: ["w1", "x1", "x2"],
        2: ["x1", "x2", "y1", "w1", "y2"],
        3: ["x1", "w1", "x2"],
    }[rank]
    works = [issue[name]() for name in order]
    for w in reversed(works):
        w.wait()

    same(x1, torch.full((10,), float(ws * (ws + 1) // 2)), "g_all all_reduce")
    for j in range(ws):
        same(x2[j], torch.full((3,), float(j)), f"g_all all_gather output {j}")
    same(w1, torch.full((6,), float(ws - 1)), "world all_reduce MAX")
    if rank in sub:
        same(y1, torch.full((10,), 10.0 * sum(r + 1 for r in sub)), "g_sub all_reduce")
        same(y2, torch.full((4,), 2.0, dtype=torch.float64), "g_sub broadcast")
        assert dist.get_rank(g_sub) == sub.index(rank)
        assert dist.get_world_size(g_sub) == len(sub)
    else:
        same(y1, torch.full((10,), 10.0 * (rank + 1)), "g_sub op touched a non-member")

    # new_subgroups: consecutive pairs
    cur, subgroups = dist.new_subgroups(group_size=2)
    assert len(subgroups) == ws // 2
    first = rank - rank % 2
    assert dist.get_rank(cur) == rank % 2 and dist.get_world_size(cur) == 2
    t = torch.full((5,), float(rank + 1))
    dist.all_reduce(t, group=cur)
    same(t, torch.full((5,), float(first + 1 + first + 2)), "subgroup all_reduce")
    u = torch.full((3,), float(rank), dtype=torch.float64)
    dist.broadcast(u, group=cur, group_src=1)
    same(u, torch.full((3,), float(first + 1), dtype=torch.float64), "subgroup broadcast")
    # the world group still works after all of this
    v = torch.ones(2)
    dist.all_reduce(v)
    same(v, torch.full((2,), float(ws)), "world all_reduce afterwards")


def test_group_isolation() -> None:
    run_world(_groups, 4, timeout=WORLD_TIMEOUT)


# --------------------------------------------------------------------------
# timeouts
# --------------------------------------------------------------------------


def _peer_never_joins(rank: int, ws: int, pg_timeout: float, mode: str, gave_up: str) -> Any:
    if rank == 1:
        # Never joins, and stays until rank 0 has given up (it then creates `gave_up`), so that
        # rank 0 meets a silent peer rather than one that left; the cap only bounds a rank 0
        # that never returns (the parent's deadline fails that world anyway).
        deadline = time.monotonic() + pg_timeout + 10
        while not os.path.exists(gave_up) and time.monotonic() < deadline:
            time.sleep(0.05)
        return None
    t = torch.ones(4)
    try:
        if mode == "sync":
            return timed(lambda: dist.all_reduce(t))
        return timed(lambda: dist.all_reduce(t, async_op=True).wait())
    finally:
        open(gave_up, "w").close()


NEVER_JOINS_PG_TIMEOUT = 3.0


def _peer_never_joins_world(mode: str) -> list[Any]:
    with tempfile.TemporaryDirectory(prefix="ucxb_test_") as tmp:
        gave_up = str(Path(tmp) / "rank0_gave_up")
        pg_timeout = NEVER_JOINS_PG_TIMEOUT
        return run_world(
            _peer_never_joins, 2, pg_timeout=pg_timeout, args=(pg_timeout, mode, gave_up),
            timeout=60,
        )


@pytest.mark.parametrize("mode", ["async_wait", "sync"])
@pooled(_peer_never_joins_world)
def test_timeout_peer_never_joins(mode: str, pooled_result: Callable[[], list[Any]]) -> None:
    pg_timeout = NEVER_JOINS_PG_TIMEOUT
    res = pooled_result()
    elapsed, exc, msg = res[0]
    assert exc is not None, f"all_reduce with an absent peer returned after {elapsed:.1f}s"
    assert exc in ("RuntimeError", "DistBackendError", "DistError", "TimeoutError"), (exc, msg)
    assert pg_timeout * 0.8 <= elapsed < pg_timeout + 10, (elapsed, msg)
    if UCX:
        assert names(msg, OP_ALL_REDUCE), f"message must name the op: {msg}"
        assert names_rank(msg, 0), f"message must name this rank (0): {msg}"
        assert names_peer(msg, 1), f"message must name the silent peer (1): {msg}"


def _late_peer(rank: int, ws: int, gave_up: str) -> Any:
    if rank == 1:
        # Joins once rank 0's wait has returned (it creates `gave_up`), or after 2.5 s: a wait
        # that ignores its timeout then gets the op's result, not an error, and fails the test.
        deadline = time.monotonic() + 2.5
        while not os.path.exists(gave_up) and time.monotonic() < deadline:
            time.sleep(0.02)
        t = torch.ones(4)
        timed(lambda: dist.all_reduce(t))  # may complete or fail: rank 0 gave up on it
        return None
    t = torch.ones(4)
    work = dist.all_reduce(t, async_op=True)
    try:
        return timed(lambda: work.wait(timeout=timedelta(seconds=1)))
    finally:
        open(gave_up, "w").close()


def _late_peer_world() -> list[Any]:
    with tempfile.TemporaryDirectory(prefix="ucxb_test_") as tmp:
        gave_up = str(Path(tmp) / "rank0_gave_up")
        return run_world(_late_peer, 2, args=(gave_up,), pg_timeout=5, timeout=60)


@pooled(_late_peer_world)
def test_work_wait_timeout(pooled_result: Callable[[], list[Any]]) -> None:
    res = pooled_result()
    elapsed, exc, msg = res[0]
    assert exc is not None, f"wait(timeout=1s) returned after {elapsed:.1f}s with the peer late"
    assert 0.8 <= elapsed < 6, (elapsed, msg)


def _odd_waits(rank: int, ws: int) -> Any:
    """wait(timedelta(0)) is torch's "no timeout" (up to the op's own); a negative timeout is
    refused, and the op goes on: a later wait gets its result."""
    if rank == 1:
        time.sleep(1.5)  # rank 0 waits on each op while rank 1 has not joined it yet
    out: dict[str, Any] = {}
    t = torch.full((4,), rank + 1, dtype=torch.int64)
    work = dist.all_reduce(t, async_op=True)
    out["zero"] = (*timed(lambda: work.wait(timedelta(0))), t.tolist())
    t = torch.full((4,), rank + 1, dtype=torch.int64)
    work = dist.all_reduce(t, async_op=True)
    out["negative"] = timed(lambda: work.wait(timedelta(seconds=-1)))
    work.wait(timedelta(seconds=20))
    out["after negative"] = t.tolist()
    if rank == 0:
        got = torch.zeros(4, dtype=torch.int64)
        req = dist.irecv(got, src=1)
        out["irecv negative"] = timed(lambda: req.wait(timedelta(seconds=-1)))
        req.wait(timedelta(seconds=20))  # not withdrawn: the message still lands
        out["irecv"] = got.tolist()
    else:
        time.sleep(0.5)
        dist.send(torch.arange(4, dtype=torch.int64), dst=0)
    return out


# A negative wait on a pending op makes Gloo close the group's connections.
ODD_WAITS_RUN = UCX or BACKEND == "udp"


def _odd_waits_world() -> list[Any] | None:
    return run_world(_odd_waits, 2, pg_timeout=30, timeout=90) if ODD_WAITS_RUN else None


@pooled(_odd_waits_world)
def test_odd_wait_timeouts(pooled_result: Callable[[], list[Any] | None]) -> None:
    if not ODD_WAITS_RUN:
        pytest.skip(
            f"ucx/udp only ({BACKEND} under test): a negative wait on a pending op "
            "makes Gloo close the group's connections (\"Application timeout caused "
            'pair closure")'
        )
    res = pooled_result()
    assert res is not None
    total = [3] * 4  # 1 + 2, bit-exact
    for rank, out in enumerate(res):
        elapsed, exc, msg, data = out["zero"]
        assert exc is None and data == total, (rank, out["zero"])
        assert out["after negative"] == total, (rank, out)
    elapsed, exc, msg, _ = res[0]["zero"]
    assert elapsed > 0.5, f"wait(0) returned after {elapsed:.2f} s, before the late peer joined"
    for what in ("negative", "irecv negative"):
        elapsed, exc, msg = res[0][what]
        assert exc == "ValueError" and "negative timeout" in msg, (what, exc, msg)
        assert names_rank(msg, 0), (what, msg)
    assert names(res[0]["negative"][2], OP_ALL_REDUCE), res[0]
    assert res[0]["irecv"] == [0, 1, 2, 3], res[0]


# --------------------------------------------------------------------------
# killed peer
# --------------------------------------------------------------------------


def _killed_peer(rank: int, ws: int) -> Any:
    dist.barrier()  # everyone is connected
    if rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    t = torch.ones(1000)
    return timed(lambda: dist.all_reduce(t))


KILLED_PEER_PG_TIMEOUT = 10.0


@pooled(lambda: run_world(_killed_peer, 3, pg_timeout=KILLED_PEER_PG_TIMEOUT,
                          expect_fail_ranks={2}, timeout=90))
def test_killed_peer(pooled_result: Callable[[], list[Any]]) -> None:
    pg_timeout = KILLED_PEER_PG_TIMEOUT
    res = pooled_result()
    assert res[2] is None
    for rank in (0, 1):
        elapsed, exc, msg = res[rank]
        assert exc is not None, f"rank {rank}: all_reduce with a dead peer returned"
        assert elapsed < pg_timeout + 10, (rank, elapsed, msg)
    if UCX:
        msgs = [res[r][2] for r in (0, 1)]
        assert any(names_peer(m, 2) for m in msgs), f"no error names the dead peer 2: {msgs}"


# --------------------------------------------------------------------------
# bad input
# --------------------------------------------------------------------------


def _mismatched_sizes(rank: int, ws: int) -> Any:
    t = torch.ones(4 if rank == 0 else 8)
    return (*timed(lambda: dist.all_reduce(t)), t.tolist())


def test_bad_input_mismatched_sizes() -> None:
    if not UCX:
        pytest.skip(f"ucx only ({BACKEND} under test): Gloo aborts the process here")
    pg_timeout = 5.0
    res = run_world(_mismatched_sizes, 2, pg_timeout=pg_timeout, timeout=60)
    for rank, (elapsed, exc, msg, data) in enumerate(res):
        assert exc is not None, f"rank {rank}: mismatched all_reduce returned data {data}"
        assert elapsed < pg_timeout + 10, (rank, elapsed, msg)
    assert any(names(r[2], OP_ALL_REDUCE) for r in res), [r[2] for r in res]


def test_bad_input_mismatched_sizes_inline() -> None:
    """The same, with each rank waiting up to 2 s on its own thread (spin_us) before it hands
    the op over: rank 1's op then completes inline, where the size of what arrived must be
    checked as on the progress thread (it was not, and rank 1 returned folded garbage)."""
    if not UCX:
        pytest.skip(f"ucx only ({BACKEND} under test): Gloo aborts the process here")
    pg_timeout = 5.0
    res = run_world(
        _mismatched_sizes,
        2,
        pg_timeout=pg_timeout,
        timeout=60,
        env={"UCXBACKEND_SPIN_US": "2000000"},
    )
    for rank, (elapsed, exc, msg, data) in enumerate(res):
        assert exc is not None, f"rank {rank}: mismatched all_reduce returned data {data}"
        assert elapsed < pg_timeout + 10, (rank, elapsed, msg)
    assert any(names(r[2], OP_ALL_REDUCE) for r in res), [r[2] for r in res]


def _local_validation(rank: int, ws: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    # wrong output-list length
    outs = [torch.empty(2) for _ in range(ws + 1)]
    out["all_gather list length"] = timed(lambda: dist.all_gather(outs, torch.ones(2)))
    # input/output dtype mismatch
    o = torch.empty(2 * ws, dtype=torch.float64)
    out["all_gather_into_tensor dtype"] = timed(
        lambda: dist.all_gather_into_tensor(o, torch.ones(2, dtype=torch.float32))
    )
    if UCX:  # Gloo hangs on this one
        out["send dst out of range"] = timed(lambda: dist.send(torch.ones(2), dst=ws + 3))
        out["isend dst out of range"] = timed(lambda: dist.isend(torch.ones(2), dst=ws + 3).wait())
        # An output list on another device than the inputs (a meta tensor: the device-less
        # stand-in for a CUDA tensor here). allgather_coalesced copies into its lists in the
        # Future's callback; unchecked, the op "succeeded" and the tensors got nothing.
        metas = [[torch.empty(2, device="meta")] for _ in range(ws)]
        out["all_gather_coalesced output on another device"] = timed(
            lambda: dist.all_gather_coalesced(metas, [torch.ones(2)])
        )
    if UCX or BACKEND == "udp":
        # A reduce op the dtype does not have: the error names the tensor's shape too.
        out["all_reduce AVG int8"] = timed(
            lambda: dist.all_reduce(torch.ones(3, 2, dtype=torch.int8), op=dist.ReduceOp.AVG)
        )
        out["reduce_scatter_tensor BAND float32"] = timed(
            lambda: dist.reduce_scatter_tensor(
                torch.empty(3, 2), torch.ones(3 * ws, 2), op=dist.ReduceOp.BAND
            )
        )
    # the group still works afterwards
    good = [torch.empty(2) for _ in range(ws)]
    dist.all_gather(good, torch.full((2,), float(rank)))
    out["still usable"] = all(
        torch.equal(g, torch.full((2,), float(j))) for j, g in enumerate(good)
    )
    return out


def test_bad_input_local_validation() -> None:
    res = run_world(_local_validation, 2, pg_timeout=10, timeout=60)
    for rank, out in enumerate(res):
        assert out.pop("still usable"), f"rank {rank}: group broken after rejected calls"
        for what, (elapsed, exc, msg) in out.items():
            assert exc in ("RuntimeError", "ValueError"), f"rank {rank} {what}: {exc} {msg}"
            assert elapsed < 10, (rank, what, elapsed)
        if UCX:
            assert names(out["all_gather list length"][2], OP_ALL_GATHER), out
            msg = out["all_gather_coalesced output on another device"][2]
            assert "output" in msg and "unsupported device" in msg, msg
        if UCX or BACKEND == "udp":
            for what, words in (
                ("all_reduce AVG int8", ("allreduce", "AVG", "int8", "[3, 2]")),
                # (the input's shape: 2 ranks)
                (
                    "reduce_scatter_tensor BAND float32",
                    ("reduce_scatter", "BAND", "float32", "[6, 2]"),
                ),
            ):
                msg = out[what][2]
                assert all(w in msg for w in words) and names_rank(msg, rank), (what, msg)


def _overlapping_outputs(rank: int, ws: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    expanded = torch.ones(1).expand(4)  # four elements, one memory location
    # Two dimensions: the message names the sizes as c10 writes them ("Float[2, 4]").
    out["all_reduce"] = timed(lambda: dist.all_reduce(torch.ones(1, 1).expand(2, 4)))
    out["broadcast"] = timed(lambda: dist.broadcast(expanded, src=0))
    outs = [torch.empty(4) for _ in range(ws - 1)] + [expanded]
    out["all_gather"] = timed(lambda: dist.all_gather(outs, torch.ones(4)))
    # Read, never written: still fine.
    gathered = [torch.empty(4) for _ in range(ws)]
    dist.all_gather(gathered, torch.full((1,), float(rank)).expand(4))
    out["expanded input"] = all(
        torch.equal(g, torch.full((4,), float(j))) for j, g in enumerate(gathered)
    )
    # reduce_scatter reads its inputs only, as Gloo does: they may be expanded too (they were
    # refused as if written into).
    total = torch.full((2,), float(ws * (ws + 1) // 2))
    single = torch.empty(2)
    listed = torch.empty(2)
    out["expanded reduce_scatter input"] = timed(
        lambda: dist.reduce_scatter_tensor(single, torch.full((1,), rank + 1.0).expand(2 * ws))
    )
    out["expanded reduce_scatter inputs"] = timed(
        lambda: dist.reduce_scatter(listed, [torch.full((1,), rank + 1.0).expand(2)] * ws)
    )
    out["reduce_scattered"] = (single.tolist(), listed.tolist(), total.tolist())
    # Elements that overlap without a zero stride, where torch's own check cannot tell: the
    # op ran and each shared element kept whichever value was copied into it last.
    overlapping = torch.zeros(4).as_strided((3, 2), (1, 1))
    out["all_reduce as_strided"] = timed(lambda: dist.all_reduce(overlapping))
    # A layout made by hand that overlaps nowhere (offsets 0, 3, 2, 5, 4, 7) still runs.
    base = torch.zeros(8)
    apart = base.as_strided((3, 2), (2, 3))
    apart.fill_(rank + 1.0)
    dist.all_reduce(apart)
    out["as_strided apart"] = (base.tolist(), [float(ws * (ws + 1) // 2)] * 8)
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    out["still usable"] = torch.equal(t, torch.full((4,), float(ws * (ws + 1) // 2)))
    return out


def test_overlapping_output_is_refused() -> None:
    """A tensor the op writes into whose elements share memory (an expanded view) is a
    ValueError naming the op, the tensor and the rank before anything is queued, and the group
    stays usable. Before, the op ran, torch refused the copy back on the progress thread, and
    the group failed with torch's bare message."""
    if not UCX and BACKEND != "udp":
        pytest.skip(f"ucx/udp only ({BACKEND} under test): Gloo aborts the process here")
    res = run_world(_overlapping_outputs, 2, pg_timeout=10, timeout=60)
    for rank, out in enumerate(res):
        assert out.pop("still usable"), f"rank {rank}: group broken after rejected calls"
        assert out.pop("expanded input"), f"rank {rank}: expanded input gathered wrong"
        for what in ("expanded reduce_scatter input", "expanded reduce_scatter inputs"):
            _, exc, msg = out.pop(what)
            assert exc is None, (rank, what, exc, msg)
        single, listed, total = out.pop("reduce_scattered")
        assert single == total and listed == total, (rank, single, listed, total)
        got, want = out.pop("as_strided apart")
        want[1] = want[6] = 0.0  # not in the view
        assert got == want, (rank, got, want)
        for what, (elapsed, exc, msg) in out.items():
            assert exc == "ValueError", f"rank {rank} {what}: {exc} {msg}"
            assert elapsed < 10, (rank, what, elapsed)  # refused, not run into a timeout
            shapes = {"all_reduce": "Float[2, 4]", "all_reduce as_strided": "Float[3, 2]"}
            described = shapes.get(what, "Float[4]")
            assert "share memory" in msg and described in msg, (rank, what, msg)
            assert names_rank(msg, rank), (rank, what, msg)
        assert names(out["all_reduce"][2], OP_ALL_REDUCE), out
        assert names(out["all_reduce as_strided"][2], OP_ALL_REDUCE), out


def _outputs_sharing_memory(rank: int, ws: int) -> dict[str, Any]:
    """Output lists whose tensors share memory with each other or with the input: each is
    refused. Before, each ran, and what was left depended on the order messages arrived in,
    which differs across ranks (all_gather([t, t]): rank 0 kept [2, 2, 2, 2], rank 1
    [1, 1, 1, 1] on ucx). Then the cases that share no element must still run exactly."""
    refused: dict[str, Any] = {}
    mine = torch.full((4,), rank + 1, dtype=torch.int64)
    t = torch.zeros(4, dtype=torch.int64)
    refused["all_gather same tensor twice"] = timed(lambda: dist.all_gather([t] * ws, mine))
    buf = torch.zeros(4 * ws - 2, dtype=torch.int64)
    sliding = [buf[2 * j : 2 * j + 4] for j in range(ws)]  # each overlaps the next by 2
    refused["all_gather overlapping slices"] = timed(lambda: dist.all_gather(sliding, mine))
    flat = torch.zeros(4 * ws, dtype=torch.int64)
    slots = list(flat.chunk(ws))
    peer_slot = slots[(rank + 1) % ws]
    refused["all_gather input is a peer's slot"] = timed(lambda: dist.all_gather(slots, peer_slot))
    a2a_buf = torch.zeros(2 * ws - 1, dtype=torch.int64)
    a2a_outs = [a2a_buf[j : j + 2] for j in range(ws)]
    a2a_ins = [torch.full((2,), 10 * rank + j, dtype=torch.int64) for j in range(ws)]
    refused["all_to_all overlapping outputs"] = timed(lambda: dist.all_to_all(a2a_outs, a2a_ins))
    same_list = [torch.full((2,), 10 * rank + j, dtype=torch.int64) for j in range(ws)]
    refused["all_to_all inputs are the outputs"] = timed(
        lambda: dist.all_to_all(same_list, same_list)
    )
    peer_in = [torch.zeros(2, dtype=torch.int64) for _ in range(ws)]
    peer_outs = [torch.zeros(2, dtype=torch.int64) for _ in range(ws)]
    peer_in[rank] = peer_outs[(rank + 1) % ws]  # this rank's own block sent from a peer's slot
    refused["all_to_all input is a peer's output"] = timed(
        lambda: dist.all_to_all(peer_outs, peer_in)
    )
    out: dict[str, Any] = {"refused": refused}
    # all_to_all with this rank's own block in place (input[rank] is output[rank]): exact.
    own_outs = [torch.zeros(2, dtype=torch.int64) for _ in range(ws)]
    own_outs[rank].fill_(10 * rank + rank)
    own_ins = [torch.full((2,), 10 * rank + j, dtype=torch.int64) for j in range(ws)]
    own_ins[rank] = own_outs[rank]
    dist.all_to_all(own_outs, own_ins)
    out["a2a own block in place"] = [o.tolist() for o in own_outs]
    # Columns of one matrix interleave without sharing an element: gathered exactly.
    cols = torch.zeros(4, ws, dtype=torch.int64)
    dist.all_gather(list(cols.unbind(1)), mine)
    out["columns"] = cols.t().tolist()
    # The input as this rank's own slot (in place), also at the root of a gather.
    flat = torch.zeros(4 * ws, dtype=torch.int64)
    slots = list(flat.chunk(ws))
    slots[rank].copy_(mine)
    dist.all_gather(slots, slots[rank])
    out["in place"] = flat.view(ws, 4).tolist()
    # The flat form: its input a peer's block of the output is refused; its own block (in
    # place) gathers exactly. (On a GPU the own-block copy has no overlap rule: copy_ of
    # overlapping device memory is undefined, where the host's is a memmove.)
    gathered = torch.zeros(4 * ws, dtype=torch.int64)
    peer = (rank + 1) % ws
    refused["all_gather_into_tensor input is a peer's block"] = timed(
        lambda: dist.all_gather_into_tensor(gathered, gathered[4 * peer : 4 * peer + 4])
    )
    gathered[4 * rank : 4 * rank + 4].copy_(mine)
    dist.all_gather_into_tensor(gathered, gathered[4 * rank : 4 * rank + 4])
    out["flat in place"] = gathered.view(ws, 4).tolist()
    # scatter with the root's own block in place (its input for itself is its output): exact.
    got = torch.full((4,), 100 + rank, dtype=torch.int64)
    blocks = None
    if rank == 0:
        got.fill_(1)  # the root's own block
        blocks = [got] + [torch.full((4,), j + 1, dtype=torch.int64) for j in range(1, ws)]
    dist.scatter(got, blocks, src=0)
    out["scatter in place"] = got.tolist()
    if rank == 0:  # last, and the root alone: only the root passes outputs (and is refused)
        refused["gather same tensor twice"] = timed(lambda: dist.gather(mine, [t] * ws, dst=0))
        # The root's input for rank 1 is its own output, which its own block overwrites while
        # that input is sent: rank 1 got the old data, the new, or (1 MiB on ucx) some of each.
        # A slice of it too.
        own = torch.zeros(8, dtype=torch.int64)
        for what, peer_block in (("is", own[:4]), ("overlaps", own[2:6])):
            ins = [torch.full((4,), j, dtype=torch.int64) for j in range(ws)]
            ins[1] = peer_block
            refused[f"scatter input for a peer {what} the output"] = timed(
                lambda ins=ins: dist.scatter(own[:4], ins, src=0)
            )
    return out


def test_outputs_sharing_memory_are_refused() -> None:
    if not UCX and BACKEND != "udp":
        pytest.skip(f"ucx/udp only ({BACKEND} under test): Gloo keeps the last write here")
    ws = 3
    res = run_world(_outputs_sharing_memory, ws, pg_timeout=10, timeout=60)
    want = [[r + 1] * 4 for r in range(ws)]  # rank r's input, bit-exact
    for rank, out in enumerate(res):
        assert out["columns"] == want, (rank, out["columns"])
        assert out["in place"] == want, (rank, out["in place"])
        assert out["flat in place"] == want, (rank, out["flat in place"])
        # rank j sent rank `rank` the value 10 * j + rank
        a2a_want = [[10 * j + rank] * 2 for j in range(ws)]
        assert out["a2a own block in place"] == a2a_want, (rank, out["a2a own block in place"])
        assert out["scatter in place"] == want[rank], (rank, out["scatter in place"])
        assert ("gather same tensor twice" in out["refused"]) == (rank == 0), out
        assert ("scatter input for a peer is the output" in out["refused"]) == (rank == 0), out
        for what, (elapsed, exc, msg) in out["refused"].items():
            assert exc == "ValueError", f"rank {rank} {what}: {exc} {msg}"
            assert elapsed < 10, (rank, what, elapsed)
            assert re.search(r"shares? memory", msg) and "Long[" in msg, (rank, what, msg)
            assert names_rank(msg, rank), (rank, what, msg)


# --------------------------------------------------------------------------
# world size 1
# --------------------------------------------------------------------------


def _world_of_one(rank: int, ws: int) -> None:
    assert (rank, ws) == (0, 1)
    warnings.simplefilter("ignore", FutureWarning)  # deprecated-but-supported APIs
    x = torch.tensor([3.0, -1.0, 2.0, 0.5])
    i = torch.tensor([5, -3, 6, 0])
    for op in ("SUM", "PRODUCT", "MIN", "MAX", "AVG"):
        t = x.clone()
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
        same(t, x, f"all_reduce {op}")
        t = x.clone()
        dist.reduce(t, dst=0, op=getattr(dist.ReduceOp, op))
        same(t, x, f"reduce {op}")
    for op in ("BAND", "BOR", "BXOR", "SUM", "MIN"):
        t = i.clone()
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
        same(t, i, f"all_reduce int64 {op}")
    ts = [x.clone(), x[:2] * 2]
    dist.all_reduce_coalesced(ts)
    same(ts[0], x, "all_reduce_coalesced[0]")
    same(ts[1], x[:2] * 2, "all_reduce_coalesced[1]")

    t = x.clone()
    dist.broadcast(t, src=0)
    same(t, x, "broadcast")
    outs = [torch.empty(4)]
    dist.all_gather(outs, x)
    same(outs[0], x, "all_gather")
    o = torch.empty(4)
    dist.all_gather_into_tensor(o, x)
    same(o, x, "all_gather_into_tensor")
    g = [torch.empty(4)]
    dist.gather(x, g, dst=0)
    same(g[0], x, "gather")
    s = torch.empty(4)
    dist.scatter(s, [x], src=0)
    same(s, x, "scatter")
    r = torch.empty(4)
    dist.reduce_scatter(r, [x])
    same(r, x, "reduce_scatter")
    r = torch.empty(4)
    dist.reduce_scatter_tensor(r, x)
    same(r, x, "reduce_scatter_tensor")
    a2a = [torch.empty(4)]
    dist.all_to_all(a2a, [x])
    same(a2a[0], x, "all_to_all")
    a = torch.empty(4)
    dist.all_to_all_single(a, x)
    same(a, x, "all_to_all_single")
    dist.barrier()
    w = dist.all_reduce(t, async_op=True)
    w.wait()
    assert w.is_completed()
    same(t, x, "async all_reduce")
    # inputs of out-of-place ops are left alone
    same(x, torch.tensor([3.0, -1.0, 2.0, 0.5]), "input after all ops")


def test_world_size_one() -> None:
    run_world(_world_of_one, 1, timeout=WORLD_TIMEOUT)


def _failed_batch_then_collectives(rank: int, ws: int) -> None:
    peer = (rank + 1) % ws
    # A receive into an expanded view (its four elements one memory location): refused. (Not
    # a dtype: send and recv take any.)
    bad = torch.zeros(1).expand(4)
    try:
        dist.batch_isend_irecv([dist.P2POp(dist.irecv, bad, peer)])
    except (ValueError, RuntimeError):
        pass
    else:
        raise AssertionError("a batch receiving into an expanded view was accepted")
    # The group must still run every later op, not queue it silently.
    t = torch.full((5,), float(rank + 1))
    dist.all_reduce(t)
    assert t.tolist() == [float(ws * (ws + 1) // 2)] * 5, t
    send = torch.arange(3, dtype=torch.int64) + 10 * rank
    recv = torch.empty(3, dtype=torch.int64)
    reqs = dist.batch_isend_irecv(
        [dist.P2POp(dist.isend, send, peer), dist.P2POp(dist.irecv, recv, (rank - 1) % ws)]
    )
    for r in reqs:
        r.wait()
    assert recv.tolist() == (torch.arange(3) + 10 * ((rank - 1) % ws)).tolist(), recv


@pytest.mark.skipif(not UCX, reason="checks the ucx backend's coalescing support")
def test_failed_batch_leaves_group_usable() -> None:
    """A batch_isend_irecv that raises on bad input must not leave later ops as no-ops."""
    run_world(_failed_batch_then_collectives, 2, timeout=WORLD_TIMEOUT)
