"""Group teardown and recovery: what happens to requests still posted when a group is
destroyed or aborted, or when a caller stops waiting. Each case once crashed, hung or
misdelivered data; the tests pin the fixed behaviour.

The worlds that mostly wait out a timeout (a wait's, a Store's) run side by side
(``@pooled``, tests/world_pool.py), each checked by its own test.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
from conftest import is_ucx, skip_unless_ucx
from dist_harness import run_world
from world_pool import pooled

import ucxbackend


def _destroy_with_unmatched_irecv(rank: int, ws: int) -> Any:
    sub = dist.new_group(backend="ucx")
    t = torch.zeros(8)
    work = dist.irecv(t, src=1, group=sub) if rank == 0 else None
    dist.barrier()
    dist.destroy_process_group(sub)  # rank 0 still has the receive posted
    if work is None:
        return "sender"
    start = time.monotonic()
    try:
        work.wait(timeout=timedelta(seconds=10))
    except RuntimeError as exc:
        return (time.monotonic() - start, str(exc))
    return (time.monotonic() - start, None)


def test_destroy_group_with_unmatched_irecv() -> None:
    skip_unless_ucx("tests the ucx transport's teardown")
    res = run_world(_destroy_with_unmatched_irecv, 2, timeout=90)
    elapsed, msg = res[0]
    assert msg is not None, "the orphaned irecv completed successfully"
    # Either this rank's destroy withdrew the receive ("shut down"), or, where the progress
    # thread posted it only after rank 1 had destroyed its group, making the endpoint to rank 1
    # failed first (its shared memory is gone), or the one-host transport learnt first that
    # rank 1 had left ("left the group"): all name why, none waits for a timeout.
    assert "shut down" in msg or "to rank 1" in msg or "rank 1 left the group" in msg, msg
    assert elapsed < 5, elapsed


def _abort_stuck_collective(rank: int, ws: int) -> Any:
    sub = dist.new_group(backend="ucx", timeout=timedelta(seconds=60))
    if rank == 1:
        dist.barrier()  # never joins the all_reduce on `sub`
        return None
    t = torch.ones(4)
    work = dist.all_reduce(t, group=sub, async_op=True)
    time.sleep(0.5)  # the op is now waiting on rank 1
    start = time.monotonic()
    sub.abort()
    try:
        work.wait(timeout=timedelta(seconds=30))
    except RuntimeError as exc:
        result = (time.monotonic() - start, str(exc))
    else:
        result = (time.monotonic() - start, None)
    dist.barrier()
    return result


def test_abort_interrupts_a_stuck_collective() -> None:
    skip_unless_ucx("tests the ucx progress engine")
    res = run_world(_abort_stuck_collective, 2, timeout=120)
    elapsed, msg = res[0]
    assert msg is not None, "all_reduce on an aborted group succeeded"
    assert elapsed < 5, f"abort took {elapsed:.1f}s to end the op (group timeout is 60s)"


def _retry_after_wait_timeout(rank: int, ws: int) -> Any:
    if rank == 0:
        stale = torch.zeros(3)
        work = dist.irecv(stale, src=1, tag=5)
        try:
            work.wait(timeout=timedelta(seconds=1))
            timed_out = False
        except RuntimeError:
            timed_out = True
        dist.barrier()  # only now does rank 1 send
        fresh = torch.zeros(3)
        dist.recv(fresh, src=1, tag=5)
        return timed_out, fresh.tolist(), stale.tolist()
    dist.barrier()
    dist.send(torch.tensor([1.0, 2.0, 3.0]), dst=0, tag=5)
    return None


@pooled(lambda: run_world(_retry_after_wait_timeout, 2, timeout=90) if is_ucx() else None)
def test_retried_recv_gets_the_message_after_a_wait_timeout(
    pooled_result: Callable[[], Any]
) -> None:
    skip_unless_ucx("tests the ucx point-to-point path")
    timed_out, fresh, stale = pooled_result()[0]
    assert timed_out
    assert fresh == [1.0, 2.0, 3.0], f"the abandoned irecv took the message: {stale}"


def _retry_after_send_wait_timeout(rank: int, ws: int, backend: str, n: int, gave_up: str) -> Any:
    if rank == 0:
        withdrawn = torch.full((n,), 1.0)
        work = dist.isend(withdrawn, dst=1, tag=5)
        try:
            work.wait(timeout=timedelta(seconds=1))
            first = None
        except RuntimeError as exc:
            first = str(exc)
        # Its wait gave up: the caller takes the buffer back and sends again.
        withdrawn.fill_(-1.0)
        open(gave_up, "w").close()
        try:
            dist.send(torch.full((n,), 2.0), dst=1, tag=5)
            retry = None
        except RuntimeError as exc:
            retry = str(exc)
        return first, retry, str(ucxbackend.get_error(dist.group.WORLD))
    while not os.path.exists(gave_up):
        time.sleep(0.02)
    got = torch.zeros(n)
    try:
        dist.recv(got, src=0, tag=5)
        error = None
    except RuntimeError as exc:
        error = str(exc)
    return error, sorted(set(got.tolist()))


@pytest.mark.parametrize("backend", ["ucx", "udp"])
def test_send_that_cannot_be_withdrawn_fails_the_group(backend: str, tmp_path: Any) -> None:
    # A rendezvous send (1.2 MB) whose wait() gives up before the peer receives cannot be
    # taken back on either transport: the peer holds its announcement. Left posted, the
    # peer's receive took it, with the bytes the caller wrote into the buffer after giving it
    # up ([-1.0]), and the retry stayed behind for a later receive: wrong data, no error.
    # Now the group fails and the peer is cut off instead (docs/failure-model.md).
    n = 300_000
    res = run_world(
        _retry_after_send_wait_timeout, 2, backend=backend, pg_timeout=10, timeout=90,
        args=(backend, n, str(tmp_path / "gave_up")),
    )
    (first, retry, error_type), (recv_error, received) = res
    assert -1.0 not in received, f"rank 1 received the withdrawn send's buffer: {received}"
    assert first is not None and "timed out" in first, first
    assert retry is not None and "could not be withdrawn" in retry, retry
    assert f"{backend} send (op #1) on rank 0 of 2 [Float[{n}]]" in retry, retry
    assert "send to rank 1" in retry, retry
    assert error_type == "ErrorType.TIMEOUT", error_type
    assert recv_error is not None or received == [2.0], (recv_error, received)


def _retry_after_partial_recv(rank: int, ws: int, n: int) -> Any:
    """Rank 1 sends two messages of `n` floats (all 1.0, then all 2.0); rank 0's irecv gives up
    once the first has begun to arrive, and rank 0 receives again."""
    if rank == 1:
        works = [dist.isend(torch.full((n,), v), dst=0, tag=7) for v in (1.0, 2.0)]
        errors = []
        for w in works:
            try:
                w.wait()
            except RuntimeError as exc:
                errors.append(str(exc))
        return errors
    first = torch.full((n,), -5.0)
    work = dist.irecv(first, src=1, tag=7)
    deadline = time.monotonic() + 20
    while first[0].item() == -5.0 and not work.is_completed() and time.monotonic() < deadline:
        time.sleep(0.0002)  # until its first bytes are in
    try:
        work.wait(timeout=timedelta(milliseconds=1))
        gave_up = None
    except RuntimeError as exc:
        gave_up = str(exc)
    retry = torch.full((n,), -5.0)
    try:
        dist.recv(retry, src=1, tag=7)
        retry_error = None
    except RuntimeError as exc:
        retry_error = str(exc)
    return gave_up, retry_error, sorted(set(first.tolist())), sorted(set(retry.tolist()))


@pytest.mark.parametrize("backend", ["ucx", "udp"])
def test_recv_that_has_begun_to_arrive_is_not_withdrawn(backend: str) -> None:
    """A receive whose wait() gives up after its message began to arrive cannot be withdrawn:
    its sender counts the message as received. Until 2026-11-28 udp (and the one-host
    transport, where a message streams through the ring) dropped the rest, and the retried
    recv took the sender's next message ([2.0]) in its place, with no error anywhere. Now
    either the wait ended with the whole message, or the group failed naming the receive;
    never the next message in the first one's place (docs/failure-model.md)."""
    n = 8 << 20  # 32 MiB: tens of milliseconds through udp on loopback
    res = run_world(
        _retry_after_partial_recv, 2, backend=backend, pg_timeout=10, timeout=120, args=(n,)
    )
    (gave_up, retry_error, first, retry), _sender_errors = res
    if gave_up is None:  # the whole message came within the wait
        assert first == [1.0], first
        assert retry_error is None and retry == [2.0], (retry_error, retry)
        return
    assert "timed out" in gave_up or "gave up" in gave_up, gave_up
    assert retry != [2.0], "the retried recv took the next message in the first one's place"
    if retry_error is None:  # withdrawn before any byte came: the retry takes the first
        assert retry == [1.0], retry
    else:
        assert "could not be withdrawn" in retry_error, retry_error
        assert "receive from rank 1" in retry_error, retry_error


def _edge_shapes(rank: int, ws: int) -> Any:
    out: dict[str, Any] = {}
    empty_out = torch.zeros(0)
    dist.reduce_scatter_tensor(empty_out, torch.zeros(0))
    out["reduce_scatter_empty"] = empty_out.numel()
    gathered = torch.full((0, 3), -1.0)
    dist.all_gather_into_tensor(gathered, torch.zeros(0, 3))
    out["all_gather_empty"] = tuple(gathered.shape)
    out_splits = [3 if r == rank else 2 for r in range(ws)]
    try:  # this rank sends itself 2 elements but expects 3 back from itself
        dist.all_to_all_single(
            torch.zeros(sum(out_splits)),
            torch.zeros(2 * ws),
            output_split_sizes=out_splits,
            input_split_sizes=[2] * ws,
        )
        out["alltoall_self_mismatch"] = "no error"
    except ValueError as exc:
        out["alltoall_self_mismatch"] = str(exc)
    t = torch.full((2,), float(rank + 1))
    dist.all_reduce(t)  # the group still works after the rejected call
    out["after"] = t.tolist()
    return out


def test_edge_shapes_and_self_mismatch() -> None:
    skip_unless_ucx("checks ucx error messages")
    for ws in (2, 1):
        res = run_world(_edge_shapes, ws, timeout=90)
        for rank, out in enumerate(res):
            assert out["reduce_scatter_empty"] == 0
            assert out["all_gather_empty"] == (0, 3)
            msg = out["alltoall_self_mismatch"]
            assert "alltoall_base" in msg and f"rank {rank}" in msg and "itself" in msg, msg
            total = float(ws * (ws + 1) // 2)
            assert out["after"] == [total, total]


# ------------------------------------------------ the Store keys of a group's creation

# The keys one creation of a group writes under ucxbackend/<group id>/<instance>/
# (csrc/address_exchange.cpp, csrc/staging_setup.cpp), by family; "<p>" is a rank.
_CREATION_KEYS = (
    "token",
    "addr/<p>",
    "records",
    "arrived",
    "all_in",
    "records_2",
    "arrived_2",
    "all_in_2",
    "shm_yes",
    "shm_answer",
    "done",
    "closed",
    "released",
)


def _create(store: Any, rank: int, ws: int, group_id: str, options: dict[str, str]) -> Any:
    from ucxbackend import _C

    return _C.create_backend(
        store, rank, ws, timedelta(seconds=30), group_id, list(range(ws)), options
    )


def _allreduce_ok(backend: Any, ws: int) -> bool:
    t = torch.ones(4)
    backend.allreduce([t]).wait()
    return bool(torch.equal(t, torch.full((4,), float(ws))))


def _leftover_keys(store: Any, group_id: str, ws: int) -> list[str]:
    base = f"ucxbackend/{group_id}/"
    last = int(store.add(base + "instances", 0))
    names = [k.replace("<p>", str(p)) for k in _CREATION_KEYS for p in range(ws)]
    return [
        f"{base}{inst}/{name}"
        for inst in range(last + 2)
        for name in sorted(set(names))
        if store.check([f"{base}{inst}/{name}"])
    ]


def _reuse_after_half_failed_creation(rank: int, ws: int, failing: int) -> dict[str, Any]:
    """A group id whose first creation fails on rank `failing` before it reaches the Store (a
    bad option), then is created again, twice, by every rank, on the same Store."""
    store = dist.PrefixStore("reuse/", dist.distributed_c10d._get_default_store())
    store.set_timeout(timedelta(seconds=2))
    options = {"transport": "ucx"}
    first = None
    try:
        bad = {**options, "chunk_bytes": "bogus"}
        _create(store, rank, ws, "g", bad if rank == failing else options)
    except (RuntimeError, ValueError) as exc:
        first = f"{type(exc).__name__}: {exc}"
    dist.barrier()  # every rank has given up on the first creation
    store.set_timeout(timedelta(seconds=10))
    outcomes: list[bool | str] = []
    for _ in range(2):
        try:
            backend = _create(store, rank, ws, "g", options)
            outcomes.append(_allreduce_ok(backend, ws))
            backend.shutdown()
        except RuntimeError as exc:
            outcomes.append(str(exc)[:300])
        dist.barrier()
    return {"first": first, "again": outcomes, "left": _leftover_keys(store, "g", ws)}


def _reuse_world(failing: int) -> list[dict[str, Any]] | None:
    if not is_ucx():
        return None
    return run_world(_reuse_after_half_failed_creation, 2, args=(failing,), timeout=90)


@pytest.mark.parametrize("failing", [1, 0])
@pooled(_reuse_world)
def test_group_id_reused_after_a_rank_failed_before_the_store(
    failing: int, pooled_result: Callable[[], Any]
) -> None:
    """The instance of a group id stays in step when a creation failed half-way (one rank never
    reached the Store), and a created group leaves none of its creation's keys."""
    skip_unless_ucx("creates ucx backends directly")
    res = pooled_result()
    assert res[failing]["first"].startswith("ValueError"), res
    assert res[1 - failing]["first"] is not None, res
    if failing == 0:  # rank 1 waited for rank 0 to open the creation, and says so
        assert "rank 0 did not start this creation of the group" in res[1]["first"], res
    else:  # rank 0 waited for rank 1's record, and names it (not just a Store key)
        assert "rank 1 never joined this creation of the group" in res[0]["first"], res
    for rank, r in enumerate(res):
        assert r["again"] == [True, True], (rank, r["again"])
        assert r["left"] == [], (rank, r["left"])


def _keys_after_create_and_destroy(rank: int, ws: int, agent_store_on: list[int]) -> list[str]:
    # Set after the default group exists (its Store is rank 0's): what the ranks' cards say.
    if rank in agent_store_on:
        os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"
    sub = dist.new_group(backend="ucx")
    t = torch.ones(2)
    dist.all_reduce(t, group=sub)
    group_id = str(sub.group_name)
    dist.destroy_process_group(sub)
    dist.barrier()
    group_store = dist.PrefixStore(f"{group_id}/", dist.distributed_c10d._get_default_store())
    left = []
    # torch gives the backend the group's store under the device type's prefix.
    for device in ("cpu", "cuda"):
        left += _leftover_keys(dist.PrefixStore(f"{device}/", group_store), group_id, ws)
    return left


@pytest.mark.parametrize("agent_store_on", [[], [0, 1, 2], [2]], ids=["rank0", "agent", "mixed"])
def test_created_group_leaves_no_creation_keys_in_the_store(agent_store_on: list[int]) -> None:
    """Also where every rank's launcher hosts the Store (rank 0 does not wait for the others to
    finish, and the last one does not release it) and where only some say so (rank 0 waits,
    as every rank can tell from the cards): no key left, no rank waiting for a key never set."""
    skip_unless_ucx("reads the ucx backend's Store keys")
    res = run_world(_keys_after_create_and_destroy, 3, args=(agent_store_on,), timeout=90)
    assert res == [[], [], []], res


def _thread_cannot_start(rank: int, ws: int, point: str) -> dict[str, Any]:
    """A 1-rank group over a Store its launcher hosts (so its creation's keys go to a clean-up
    thread) whose thread at `point` cannot be started (UCXBACKEND_TEST_THREAD_FAILS)."""
    os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"
    os.environ["UCXBACKEND_TEST_THREAD_FAILS"] = point
    store = dist.PrefixStore("threads/", dist.distributed_c10d._get_default_store())
    out: dict[str, Any] = {"error": None, "ok": None}
    try:
        backend = _create(store, rank, ws, "t", {"transport": "ucx"})
        out["ok"] = _allreduce_ok(backend, ws)
        backend.shutdown()
    except RuntimeError as exc:
        out["error"] = str(exc)
    finally:
        del os.environ["UCXBACKEND_TEST_THREAD_FAILS"]
    out["left"] = _leftover_keys(store, "t", ws)
    return out


@pytest.mark.parametrize("point", ["progress", "store_cleanup"])
def test_a_thread_that_cannot_start_leaves_no_keys(point: str) -> None:
    """No progress thread: the creation fails naming the thread limit, and deletes the keys it
    would have left to its clean-up thread (they stayed in the Store). No clean-up thread: the
    group works, and its keys are deleted at once."""
    skip_unless_ucx("creates ucx backends directly")
    (res,) = run_world(_thread_cannot_start, 1, args=(point,), timeout=60)
    assert res["left"] == [], res
    if point == "progress":
        assert res["ok"] is None, res
        msg = res["error"]
        assert msg is not None and "could not start the group's progress thread" in msg, res
        assert "thread limit" in msg and "rank 0" in msg, msg
    else:
        assert res == {"error": None, "ok": True, "left": []}, res


def _output_references_after_ops(rank: int, ws: int) -> dict[str, list[int]]:
    """How many references to an op's output tensor remain once the op and its Work are gone,
    per backend, after 1, 2 and 3 ops (with a plain and a gathered output)."""
    out: dict[str, list[int]] = {}
    for backend in ("ucx", "udp"):
        group = dist.new_group(backend=backend)
        t = torch.ones(1024)
        gathered = torch.empty(1024 * ws)
        base = t._use_count() + gathered._use_count()
        counts = []
        for _ in range(3):
            dist.all_reduce(t, group=group)
            dist.all_gather_into_tensor(gathered, t, group=group)
            # The progress thread lets go of an op's task a moment after wait() returns.
            deadline = time.monotonic() + 5.0
            while (extra := t._use_count() + gathered._use_count() - base) and (
                time.monotonic() < deadline
            ):
                time.sleep(0.01)
            counts.append(extra)
        out[backend] = counts
        dist.destroy_process_group(group)
    return out


def test_a_finished_op_keeps_no_reference_to_its_output() -> None:
    """A group's list of Works for abort() holds each weakly until it is pruned, tens of ops
    later; a Work whose last strong reference is gone must not keep its outputs (and the Future
    holding them) alive meanwhile: the soak saw RSS climb by an op's output every step."""
    skip_unless_ucx("tests the ucx/udp Work")
    for rank_counts in run_world(_output_references_after_ops, 2, timeout=90):
        assert rank_counts == {"ucx": [0, 0, 0], "udp": [0, 0, 0]}


def _resize_while_pending(rank: int, ws: int) -> dict[str, Any]:
    """Rank 0 grows the tensors of pending ops with resize_() while rank 1 holds back until
    rank 0 says it has tried (a Store key, not a sleep): of a running all_reduce (handed over
    by the caller's thread: 256 elements; on the progress thread: 1 Mi), of an irecv, and of
    an all_reduce queued behind a running one. Once an op is done, resize_ works again."""
    out: dict[str, Any] = {}
    store = dist.PrefixStore("resize/", dist.distributed_c10d._get_default_store())

    def resized(key: str) -> None:  # rank 0: the resize_ was tried; rank 1 may go on
        store.set(key, "1")

    def after_resize(key: str) -> None:  # rank 1
        store.wait([key], timedelta(seconds=30))

    def resize(key: str, t: torch.Tensor) -> None:
        try:
            t.resize_(4 * t.numel())
            out[key] = "resize_ of a pending op's tensor did not raise"
        except RuntimeError as exc:
            out[key] = str(exc)

    for backend in ("ucx", "udp"):
        # Rank 1's op matching the queued one waits out this timeout: rank 0's fails at its
        # start and sends nothing. No op here waits on a peer for more than rank 0's 0.3 s.
        group = dist.new_group(backend=backend, timeout=timedelta(seconds=2))
        dist.barrier(group=group)
        for n in (256, 1 << 20):
            if rank == 1:
                after_resize(f"{backend}/{n}")
            t = torch.full((n,), float(rank + 1))
            # A view of its own: a resize_ that raised leaves t's sizes at the new ones over
            # the old storage (torch's behaviour for any storage that is not resizable).
            view = t.view(-1)
            work = dist.all_reduce(t, group=group, async_op=True)
            if rank == 0:
                time.sleep(0.3)  # the op runs, waiting for rank 1
                resize(f"{backend}/{n}", t)
                resized(f"{backend}/{n}")
            work.wait()
            out[f"{backend}/{n}/result"] = (view.numel(), view[0].item(), view[-1].item())
            t.resize_(4 * n)  # the op is done: the storage is the caller's again
        if rank == 0:
            got = torch.zeros(1 << 20)
            view = got.view(-1)
            work = dist.irecv(got, src=1, group=group)
            time.sleep(0.3)
            resize(f"{backend}/irecv", got)
            resized(f"{backend}/irecv")
            work.wait()
            out[f"{backend}/irecv/result"] = (view.numel(), view[0].item(), view[-1].item())
            got.resize_(1 << 22)
        else:
            after_resize(f"{backend}/irecv")
            dist.send(torch.full((1 << 20,), 5.0), dst=0, group=group)
        # Queued behind a running op: it must not start on sizes its memory does not hold.
        if rank == 1:
            after_resize(f"{backend}/queued")
        running = dist.all_reduce(torch.ones(1 << 20), group=group, async_op=True)
        queued = torch.ones(1 << 20)
        work = dist.all_reduce(queued, group=group, async_op=True)
        if rank == 0:
            time.sleep(0.3)
            resize(f"{backend}/queued", queued)
            resized(f"{backend}/queued")
        running.wait()
        try:
            work.wait()
            out[f"{backend}/queued/wait"] = "ok"
        except RuntimeError as exc:
            out[f"{backend}/queued/wait"] = str(exc)
        dist.destroy_process_group(group)
    return out


def test_resizing_a_pending_ops_tensor_raises_instead_of_crashing() -> None:
    """Before, resize_() freed the memory the transport was still writing into: rank 0 died
    of SIGSEGV (1 Mi elements, and the irecv) or SIGABRT (glibc's heap check, 256)."""
    skip_unless_ucx("tests the ucx/udp Work")
    res = run_world(_resize_while_pending, 2, timeout=120)
    for backend in ("ucx", "udp"):
        for n in (256, 1 << 20):
            assert "not resizable" in res[0][f"{backend}/{n}"], res[0]
            for rank in (0, 1):
                assert res[rank][f"{backend}/{n}/result"] == (n, 3.0, 3.0), (rank, res[rank])
        assert "not resizable" in res[0][f"{backend}/irecv"], res[0]
        assert res[0][f"{backend}/irecv/result"] == (1 << 20, 5.0, 5.0), res[0]
        assert "not resizable" in res[0][f"{backend}/queued"], res[0]
        msg = res[0][f"{backend}/queued/wait"]
        assert f"{backend} allreduce (op #" in msg and "on rank 0 of 2" in msg, msg
        assert "resized while the op was pending" in msg, msg


def _pins_shared_and_aborted(rank: int, ws: int) -> dict[str, Any]:
    """Rank 0's storage pinned by two pending irecvs (the two halves of one tensor), and by
    an irecv its group aborts: whether it is resizable after each step."""
    out: dict[str, Any] = {}
    for backend in ("ucx", "udp"):
        group = dist.new_group(backend=backend, timeout=timedelta(seconds=30))
        if rank == 0:
            buf = torch.zeros(8)
            first = dist.irecv(buf[:4], src=1, group=group, tag=1)
            second = dist.irecv(buf[4:], src=1, group=group, tag=2)
            dist.barrier()  # rank 1 sends the first half
            first.wait()
            out[f"{backend}/one_pending"] = buf.untyped_storage().resizable()
            dist.barrier()  # and the second
            second.wait()
            out[f"{backend}/none_pending"] = buf.untyped_storage().resizable()
            got = torch.zeros(4)
            work = dist.irecv(got, src=1, group=group, tag=3)  # never sent
            # Posted by now: an irecv still queued is refused by the progress thread once the
            # group has failed, and lets go of its tensor at once (nothing of it was posted).
            time.sleep(0.3)
            group.abort()
            try:
                work.wait()
            except RuntimeError:
                pass
            out[f"{backend}/aborted"] = got.untyped_storage().resizable()
            del work  # the last reference once the progress thread has let go of the irecv
            deadline = time.monotonic() + 3
            while not got.untyped_storage().resizable() and time.monotonic() < deadline:
                time.sleep(0.01)
            out[f"{backend}/dropped"] = got.untyped_storage().resizable()
        else:
            dist.barrier()
            dist.send(torch.ones(4), dst=0, group=group, tag=1)
            dist.barrier()
            dist.send(torch.ones(4), dst=0, group=group, tag=2)
        dist.barrier()
        dist.destroy_process_group(group)
    return out


def test_a_storage_stays_pinned_while_any_op_on_it_may_write() -> None:
    """Two pending ops sharing a storage: the first to end made it resizable under the other;
    abort() made an aborted op's storage resizable while the progress thread could still
    write into it. Now the last op to let go of it does, and an aborted one once its Work is
    gone (docs/failure-model.md#a-pending-ops-tensors)."""
    skip_unless_ucx("tests the ucx/udp Work")
    res = run_world(_pins_shared_and_aborted, 2, timeout=60)
    for backend in ("ucx", "udp"):
        expected = {"one_pending": False, "none_pending": True, "aborted": False, "dropped": True}
        got = {k: res[0][f"{backend}/{k}"] for k in expected}
        assert got == expected, (backend, got)


# Exits without destroy_process_group. Its own atexit handler is registered before ucxbackend
# is imported, so it runs after ucxbackend's (LIFO) and sees what finalization will find.
_EXIT_WITHOUT_DESTROY = """
import atexit, os, sys

def progress_threads():
    names = []
    for t in os.listdir("/proc/self/task"):
        try:
            names.append(open(f"/proc/self/task/{t}/comm").read().strip())
        except OSError:
            pass
    print("progress threads at exit:", names.count("ucxb-progress"), flush=True)

atexit.register(progress_threads)
import torch, torch.distributed as dist, ucxbackend
dist.init_process_group(sys.argv[1], store=dist.HashStore(), rank=0, world_size=1)
dist.new_group([0])
dist.all_reduce(torch.ones(1 << 16))
work = dist.all_reduce(torch.ones(4), async_op=True)
"""


@pytest.mark.parametrize("backend", ["ucx", "udp"])
def test_exit_without_destroy_stops_the_progress_threads_first(backend: str) -> None:
    """A program that exits without destroy_process_group: every group's progress thread has
    ended before Python's finalization, where a thread that takes the GIL is ended with
    pthread_exit (a progress thread dropping an op's tensors there died with "terminate
    called without an active exception", about one exit in ten with a peer that had left)."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": root}
    run = subprocess.run(
        [sys.executable, "-c", _EXIT_WITHOUT_DESTROY, backend],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "progress threads at exit: 0" in run.stdout, run.stdout + run.stderr
    assert "terminate called" not in run.stderr, run.stderr
