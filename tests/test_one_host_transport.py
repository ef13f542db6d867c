"""The one-host transport (``one_host_transport=shm``, transports/shm/): a ucx group whose ranks
all run on one host carries its messages through the backend's own shared-memory rings instead
of UCX (docs/architecture.md#one-host-transport).

* Every collective and point-to-point op, with integer dtypes and integer-valued floats, at
  sizes on both sides of the 64 KiB ring (and staging floor) and above 1 MiB, is bit-exact
  against Gloo run on the same inputs in the same world, and against numpy: with staging on
  (the large all_reduce, all_gather, broadcast and all_to_all go through the staging slots,
  the rest through the rings) and off (every byte through the rings). 2 ranks in the quick
  set, 4 in the slow one.
* Each group checks ``startup_profile(group)["transports"] == ["shm"]``, so that no check here
  can pass over UCX; a group whose pg_options ask for ``ucx`` gets UCX's transports.
* A peer SIGKILLed during an op fails it on the survivor with a Python exception naming the
  op and the peer, well before the group's timeout: an all_reduce whose messages stream
  through the rings, a receive, and an any-source receive (naming "any rank" and the peer,
  as over ucx). A peer that destroys the group (and lives on) fails a receive waiting for it
  as fast.
* A send longer than the ring completes only once a receive takes it, as ucx's rendezvous:
  ranks whose tensors differ by whole chunks both fail (none returns having sent a chunk
  nobody asked for: test_chunking's world), and a send nobody receives times out, cannot be
  withdrawn, and the receiver never takes it (test_lifecycle's world), over shm.
* Ranks that disagree on ``one_host_transport`` fail the group's creation on every rank,
  naming the setting and both values; ranks that agree on ``auto`` but choose differently
  (``UCX_TLS`` set on one of them) build UCX for any host, and compute exactly.
* On a host without a GPU, ``auto`` keeps the rings whatever ``cuda`` says (no CUDA tensor can
  reach the group); tests/gpu/test_cuda_routing.py checks that a GPU host takes UCX.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
import test_chunking
import test_lifecycle
import torch
import torch.distributed as dist
from dist_harness import BACKEND, error_of, run_world, timed_failure

pytestmark = pytest.mark.skipif(BACKEND != "ucx", reason=f"ucx option ({BACKEND} under test)")

ENV = {"UCXBACKEND_ONE_HOST_TRANSPORT": "shm"}
DTYPES = (torch.float32, torch.int64, torch.int32, torch.uint8)
# Bytes of each rank's input: below and either side of the 64 KiB staging floor, and over 1 MiB,
# which is longer than a ring (ringBytesFor, transports/shm/inbox.h: 256 KiB at 2 and 4 ranks),
# so it goes by reference, or streams where the receiver cannot read the sender.
SIZES = (4 << 10, (64 << 10) - 64, (64 << 10) + 64, (1 << 20) + (4 << 10))
OPS = (
    "all_reduce",
    "all_reduce_max",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "all_to_all",
    "send_recv",
    "barrier",
)
# Group options: staging on (the default) and off, both over shm.
GROUPS = {"staged": {}, "rings": {"shared_memory": "off"}}
WORLD_TIMEOUT = 240.0


def _input(dtype: torch.dtype, n: int, rank: int, salt: int) -> torch.Tensor:
    """Rank `rank`'s input: distinct per rank and op; floats hold small integers, so that
    every sum is exact whatever order a reduction takes."""
    base = np.arange(n, dtype=np.int64) * (rank + 3) + 7 * rank + 11 * salt
    if dtype == torch.uint8:
        return torch.from_numpy((base % 251).astype(np.uint8))
    if dtype == torch.float32:
        return torch.from_numpy((base % 4093).astype(np.float32))
    if dtype == torch.int32:
        return torch.from_numpy((base * 40_503 - (1 << 30)).astype(np.int32))
    return torch.from_numpy(base * 2_654_435_761 - (1 << 62))


def _run_op(op: str, group: Any, dtype: torch.dtype, n: int, rank: int, ws: int) -> torch.Tensor:
    """Runs `op` on `group` with this rank's input; returns what this rank ended with."""
    salt = OPS.index(op)
    x = _input(dtype, n, rank, salt)
    if op in ("all_reduce", "all_reduce_max"):
        red = dist.ReduceOp.MAX if op == "all_reduce_max" else dist.ReduceOp.SUM
        dist.all_reduce(x, op=red, group=group)
        return x
    if op == "all_gather":
        out = [torch.empty_like(x) for _ in range(ws)]
        dist.all_gather(out, x, group=group)
        return torch.cat(out)
    if op == "reduce_scatter":
        out = torch.empty(n // ws, dtype=dtype)
        dist.reduce_scatter_tensor(out, x, group=group)
        return out
    if op == "broadcast":
        roots = []
        for root in (0, ws - 1):
            y = x.clone()
            dist.broadcast(y, src=dist.get_global_rank(group, root), group=group)
            roots.append(y)
        return torch.cat(roots)
    if op == "all_to_all":
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x, group=group)
        return out
    if op == "send_recv":
        # A ring: each rank sends to the next and receives from the one before.
        got = torch.empty_like(x)
        to = dist.get_global_rank(group, (rank + 1) % ws)
        frm = dist.get_global_rank(group, (rank - 1) % ws)
        works = dist.batch_isend_irecv(
            [dist.P2POp(dist.isend, x, to, group), dist.P2POp(dist.irecv, got, frm, group)]
        )
        for w in works:
            w.wait()
        return got
    assert op == "barrier", op
    dist.barrier(group=group)
    return torch.zeros(1, dtype=dtype)


def _expected(op: str, dtype: torch.dtype, n: int, rank: int, ws: int) -> np.ndarray:
    """numpy's answer to `op` on every rank's input (integer sums wrap as torch's do)."""
    salt = OPS.index(op)
    inputs = [_input(dtype, n, r, salt).numpy() for r in range(ws)]
    np_dtype = inputs[0].dtype
    if op == "all_reduce":
        return np.sum(inputs, axis=0, dtype=np_dtype)
    if op == "all_reduce_max":
        return np.max(inputs, axis=0)
    if op == "all_gather":
        return np.concatenate(inputs)
    if op == "reduce_scatter":
        block = n // ws
        return np.sum(inputs, axis=0, dtype=np_dtype)[rank * block : (rank + 1) * block]
    if op == "broadcast":
        return np.concatenate([inputs[0], inputs[ws - 1]])
    if op == "all_to_all":
        block = n // ws
        return np.concatenate([inputs[r][rank * block : (rank + 1) * block] for r in range(ws)])
    if op == "send_recv":
        return inputs[(rank - 1) % ws]
    return np.zeros(1, dtype=np_dtype)


def _bits(t: torch.Tensor | np.ndarray) -> bytes:
    return (t.numpy() if isinstance(t, torch.Tensor) else t).tobytes()


def _matrix(rank: int, ws: int) -> dict[str, Any]:
    """Every op x dtype x size on each shm group, against Gloo and numpy: the cases that
    differed (by "group op dtype bytes"), and each group's transports and staging."""
    import ucxbackend

    gloo = dist.new_group(backend="gloo")
    groups = {
        name: dist.new_group(backend="ucx", pg_options=opts or None)
        for name, opts in GROUPS.items()
    }
    # One group that keeps UCX: the option is what picks the transport.
    kept = dist.new_group(backend="ucx", pg_options={"one_host_transport": "ucx"})
    out: dict[str, Any] = {
        "transports": {
            name: ucxbackend.startup_profile(g)["transports"] for name, g in groups.items()
        },
        "staging": {name: ucxbackend.shared_memory(g) for name, g in groups.items()},
        "kept": ucxbackend.startup_profile(kept)["transports"],
        "wrong": [],
        "cases": 0,
    }
    for dtype in DTYPES:
        for size in SIZES:
            # A whole number of blocks per rank (reduce_scatter, all_to_all).
            n = max(ws, size // dtype.itemsize // ws * ws)
            for op in OPS:
                want = _bits(_expected(op, dtype, n, rank, ws))
                ref = _bits(_run_op(op, gloo, dtype, n, rank, ws))
                for name, group in groups.items():
                    got = _bits(_run_op(op, group, dtype, n, rank, ws))
                    label = f"{name} {op} {dtype} {n * dtype.itemsize} bytes"
                    if got != ref:
                        out["wrong"].append(f"{label}: differs from gloo")
                    if got != want:
                        out["wrong"].append(f"{label}: differs from numpy")
                    out["cases"] += 1
                if ref != want:
                    out["wrong"].append(f"gloo {op} {dtype} {n}: differs from numpy (test bug)")
    for group in (*groups.values(), kept, gloo):
        dist.destroy_process_group(group)
    return out


@pytest.fixture(
    scope="module", params=[2, pytest.param(4, marks=pytest.mark.slow)], ids=["2ranks", "4ranks"]
)
def matrix(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return run_world(_matrix, request.param, env=ENV, timeout=WORLD_TIMEOUT)


def test_every_group_runs_over_shm(matrix: list[dict[str, Any]]) -> None:
    for rank, out in enumerate(matrix):
        assert out["transports"] == {name: ["shm"] for name in GROUPS}, (rank, out["transports"])
        assert out["staging"] == {"staged": True, "rings": False}, (rank, out["staging"])
        assert out["kept"] and "shm" not in out["kept"], (rank, out["kept"])


def test_every_op_is_bit_exact_against_gloo_and_numpy(matrix: list[dict[str, Any]]) -> None:
    for rank, out in enumerate(matrix):
        assert out["cases"] == len(GROUPS) * len(DTYPES) * len(SIZES) * len(OPS), out["cases"]
        assert out["wrong"] == [], (rank, out["wrong"])


# --------------------------------------------------------------------------
# A peer killed during an op
# --------------------------------------------------------------------------

PG_TIMEOUT_S = 30.0
DEADLINE_S = 5.0  # what a test allows for the survivor to fail (a pidfd wakes it at once)
# An all_reduce long enough (tens of ms) that a kill mostly lands inside one.
BIG = 16 << 20
KILL_AFTER_S = 0.5


def _killed_mid_op(rank: int, ws: int) -> dict[str, Any]:
    """Rank 1 dies by SIGKILL while both ranks loop on all_reduce of BIG bytes (staging off:
    every byte through the rings); rank 0 then receives from it in a second group."""
    import ucxbackend

    opts = {"shared_memory": "off"}
    reduce_group = dist.new_group(
        backend="ucx", pg_options=opts, timeout=timedelta(seconds=PG_TIMEOUT_S)
    )
    recv_group = dist.new_group(
        backend="ucx", pg_options=opts, timeout=timedelta(seconds=PG_TIMEOUT_S)
    )
    any_group = dist.new_group(
        backend="ucx", pg_options=opts, timeout=timedelta(seconds=PG_TIMEOUT_S)
    )
    out: dict[str, Any] = {
        "transports": [
            ucxbackend.startup_profile(g)["transports"]
            for g in (reduce_group, recv_group, any_group)
        ]
    }
    dist.all_reduce(torch.ones(4), group=reduce_group)
    dist.barrier()
    x = torch.ones(BIG // 4)
    if rank == 1:
        # Killed while the ranks loop on all_reduce: almost surely inside one, with its
        # messages half through the rings (at worst between two, where rank 0 waits for it
        # the same way).
        threading.Timer(KILL_AFTER_S, os.kill, (os.getpid(), signal.SIGKILL)).start()
    deadline = time.monotonic() + PG_TIMEOUT_S
    result: tuple[float, str | None] = (0.0, None)
    rounds = 0
    while result[1] is None and time.monotonic() < deadline:
        result = timed_failure(lambda: dist.all_reduce(x, group=reduce_group))
        rounds += 1
    if rank == 1:
        time.sleep(60)  # not reached: the timer has killed this process
    out["all_reduce"] = result
    out["rounds"] = rounds
    out["all_reduce_error"] = ucxbackend.get_error(reduce_group).name
    out["recv"] = timed_failure(lambda: dist.recv(torch.zeros(4), src=1, group=recv_group))
    out["recv_any"] = timed_failure(lambda: dist.recv(torch.zeros(4), group=any_group))
    return out


@pytest.fixture(scope="module")
def killed() -> dict[str, Any]:
    result = run_world(
        _killed_mid_op, 2, env=ENV, expect_fail_ranks={1}, pg_timeout=PG_TIMEOUT_S, timeout=120
    )
    out: dict[str, Any] = result[0]
    return out


def test_killed_peer_groups_ran_over_shm(killed: dict[str, Any]) -> None:
    assert killed["transports"] == [["shm"]] * 3, killed


@pytest.mark.parametrize(
    ("case", "op"),
    [("all_reduce", "allreduce"), ("recv", "recv"), ("recv_any", "recvAnysource")],
)
def test_a_peer_killed_mid_op_fails_it_naming_op_and_peer(
    killed: dict[str, Any], case: str, op: str
) -> None:
    seconds, msg = killed[case]
    assert msg is not None, f"{case} with a killed peer returned"
    assert f"ucx {op}" in msg and "rank 1" in msg, msg
    assert "timed out" not in msg, msg
    assert seconds < DEADLINE_S, (seconds, msg)


def test_a_killed_peer_is_a_remote_error(killed: dict[str, Any]) -> None:
    assert killed["all_reduce_error"] == "REMOTE_ERROR", killed


def test_an_any_source_receive_names_any_rank_and_the_dead_peer(killed: dict[str, Any]) -> None:
    _, msg = killed["recv_any"]
    assert msg is not None and "receive from any rank failed: rank 1 (pid " in msg, msg


def _peer_left(rank: int, ws: int) -> tuple[float, str | None] | None:
    """Rank 0 waits for a message from rank 1, which destroys the group instead and lives on:
    how long rank 0's receive took to fail, and its error."""
    group = dist.new_group(backend="ucx", timeout=timedelta(seconds=PG_TIMEOUT_S))
    dist.all_reduce(torch.ones(4), group=group)
    out = None
    if rank == 0:
        work = dist.irecv(torch.zeros(4), src=1, group=group)
        dist.barrier()  # posted before rank 1 leaves
        # Bounded: before, it waited out the group's timeout (a clear failure here instead).
        out = timed_failure(lambda: work.wait(timeout=timedelta(seconds=2 * DEADLINE_S)))
    else:
        dist.barrier()
        dist.destroy_process_group(group)
    dist.barrier()  # rank 1 lives until rank 0 is done
    return out


def test_a_peer_that_destroyed_the_group_fails_a_receive_naming_it() -> None:
    # Before, only the peer's exit (its pidfd) failed it: the receive waited out the timeout.
    seconds, msg = run_world(_peer_left, 2, env=ENV, pg_timeout=PG_TIMEOUT_S, timeout=90)[0]
    assert msg is not None and "ucx recv" in msg and "rank 1 left the group" in msg, msg
    assert seconds < DEADLINE_S, (seconds, msg)


# --------------------------------------------------------------------------
# A long send is the sender's until a receive takes it
# --------------------------------------------------------------------------


# How many irecvs _receive_after_inline_op posts, and how long rank 0 waits for each.
LATE_ROUNDS = 20
LATE_WAIT_S = 2.0


def _receive_after_inline_op(rank: int, ws: int) -> dict[str, Any]:
    """Rank 0 posts an irecv, lets its progress thread fall asleep, runs an 8-byte all_reduce
    (inline: its own thread drives the transport meanwhile), and then waits for the message,
    which rank 1 sends 10 ms after the all_reduce: only the progress thread completes it. Each
    round's all_reduce also carries whether rank 0's last receive came, so both stop at once
    after one that did not."""
    import ucxbackend

    group = dist.new_group(backend="ucx", timeout=timedelta(seconds=PG_TIMEOUT_S))
    flag = torch.ones(2)
    dist.all_reduce(flag, group=group)
    inline_before = ucxbackend.inline_stats(group)["inline"]
    waits: list[float] = []
    failure = None
    rounds = 0
    for i in range(LATE_ROUNDS):
        buf = torch.full((4,), -1.0)
        work = dist.irecv(buf, src=1, group=group) if rank == 0 else None
        # Rank 1 comes a little later, by steps of 50 us: its bytes reach rank 0 while rank 0's
        # caller drives the transport, within its polling before it would sleep.
        time.sleep(0.02 if rank == 0 else 0.02 + (i % 7) * 50e-6)
        flag.fill_(1.0 if failure is None else 0.0)
        dist.all_reduce(flag, group=group)
        if flag[0].item() != 2.0:
            break
        rounds += 1
        if rank == 1:
            time.sleep(0.01)
            dist.send(torch.full((4,), float(i)), dst=0, group=group)
            continue
        assert work is not None
        start = time.monotonic()
        try:
            work.wait(timeout=timedelta(seconds=LATE_WAIT_S))
        except RuntimeError as exc:
            failure = f"round {i}: {exc}"
            continue
        waits.append(time.monotonic() - start)
        if buf.tolist() != [float(i)] * 4:
            failure = f"round {i}: received {buf.tolist()}"
    inline = ucxbackend.inline_stats(group)["inline"] - inline_before
    return {
        "transports": ucxbackend.startup_profile(group)["transports"],
        "failure": failure,
        "rounds": rounds,
        "inline": inline,
        "worst_wait": max(waits, default=0.0),
    }


def test_a_receive_whose_message_comes_after_an_inline_op_completes() -> None:
    # Before 2026-11-28 the inline op's progress() cleared the transport's `sleeping` word and
    # took its doorbell's rings while the progress thread slept on them: rank 1's send then
    # rang nothing, and the receive waited for the next op (here: its 2 s wait ran out within
    # a few rounds, in every run).
    result = run_world(_receive_after_inline_op, 2, env=ENV, pg_timeout=PG_TIMEOUT_S, timeout=120)
    r0 = result[0]
    assert r0["transports"] == ["shm"], r0
    assert r0["failure"] is None, r0
    assert r0["rounds"] == LATE_ROUNDS, r0
    # Every round's all_reduce ran inline on rank 0 (else the thread was awake anyway).
    assert r0["inline"] == LATE_ROUNDS, r0


def test_sizes_differing_by_whole_chunks_fail_on_both_ranks() -> None:
    # Before the match notice, rank 1 returned: the receiver kept its extra 4 MiB chunk.
    pg_timeout = 2.0
    res = run_world(
        test_chunking._mismatched_whole_chunks, 2, env=ENV, pg_timeout=pg_timeout, timeout=90
    )
    for rank, (elapsed, msg) in enumerate(res):
        assert msg is not None, f"rank {rank}: reduce of mismatched sizes succeeded"
        assert elapsed < pg_timeout + 10, (rank, elapsed, msg)


def test_a_send_nobody_receives_times_out_and_is_never_taken(tmp_path: Any) -> None:
    # Before, the 1.2 MB send completed once in the receiver's memory (no timeout); then a
    # cancel streamed it on from a copy, and the receiver's later receive took it.
    n = 300_000
    res = run_world(
        test_lifecycle._retry_after_send_wait_timeout,
        2,
        env=ENV,
        pg_timeout=10,
        timeout=90,
        args=("ucx", n, str(tmp_path / "gave_up")),
    )
    (first, retry, error_type), (recv_error, received) = res
    assert -1.0 not in received, f"rank 1 received the withdrawn send's buffer: {received}"
    assert first is not None and "timed out" in first, first
    assert retry is not None and "could not be withdrawn" in retry, retry
    assert error_type == "ErrorType.TIMEOUT", error_type
    assert recv_error is not None or received == [2.0], (recv_error, received)


# --------------------------------------------------------------------------
# Ranks that disagree
# --------------------------------------------------------------------------


def _disagree(rank: int, ws: int) -> tuple[float, str]:
    """A group for which rank 0 asks for shm and rank 1 for ucx: what creating it raised here,
    and how long that took."""
    choice = "shm" if rank == 0 else "ucx"
    start = time.monotonic()
    error = error_of(
        lambda: dist.new_group(
            backend="ucx",
            pg_options={"one_host_transport": choice},
            timeout=timedelta(seconds=PG_TIMEOUT_S),
        )
    )
    return time.monotonic() - start, error


def test_ranks_that_disagree_fail_creation_naming_the_setting() -> None:
    results = run_world(_disagree, 2, pg_timeout=PG_TIMEOUT_S, timeout=90)
    for rank, (seconds, msg) in enumerate(results):
        mine, theirs = ("shm", "ucx") if rank == 0 else ("ucx", "shm")
        assert msg.startswith("DistBackendError: ucx: setting up group"), msg
        assert (
            f"one_host_transport is '{mine}' on rank {rank} (this rank) but '{theirs}' on rank "
            f"{1 - rank}"
        ) in msg, msg
        assert seconds < DEADLINE_S, (seconds, msg)


def _auto_chooses_differently(rank: int, ws: int) -> tuple[list[str], list[int]]:
    """A group left at ``auto`` whose rank 1 has UCX_TLS set (so it chooses ucx, rank 0 shm):
    its transports and an int64 all_reduce."""
    if rank == 1:
        os.environ["UCX_TLS"] = "all"  # read when the group's transport is made
    group = dist.new_group(backend="ucx", pg_options={"one_host_transport": "auto"})
    t = torch.arange(1000, dtype=torch.int64) * (rank + 1)
    dist.all_reduce(t, group=group)
    import ucxbackend

    transports = list(ucxbackend.startup_profile(group)["transports"])
    dist.destroy_process_group(group)
    return transports, t.tolist()


def test_ranks_that_choose_differently_under_auto_build_ucx() -> None:
    results = run_world(_auto_chooses_differently, 2, timeout=90)
    expected = (np.arange(1000, dtype=np.int64) * 3).tolist()
    for transports, values in results:
        assert transports and transports != ["shm"], transports  # UCX's own, e.g. "tcp"
        assert values == expected


@pytest.mark.skipif(
    torch.backends.cuda.is_built(), reason="a CUDA torch: tests/gpu/test_cuda_routing.py checks it"
)
def test_auto_keeps_the_rings_where_no_gpu_can_make_cuda_tensors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # cuda=1 (the default) asks for UCX's cuda_ipc only where a GPU is visible: on a host
    # without one no CUDA tensor can reach the group, and the rings start faster.
    from ucxbackend import _C

    monkeypatch.delenv("UCX_TLS", raising=False)
    chosen = {str(o): _C.one_host_transport(o)[0] for o in ({}, {"cuda": "1"}, {"cuda": "0"})}
    assert chosen == dict.fromkeys(chosen, "shm")
    assert _C.one_host_transport({"cuda": "1", "one_host_transport": "ucx"})[0] == "ucx"
