"""``abort()`` and ``getError()`` on both backends (docs/failure-model.md#abort-and-geterror).

* ``abort()`` fails every pending Work of the group at once (a running collective, one queued
  behind it, a posted ``irecv``), each ``wait()`` on another thread returning the "aborted"
  error, and does not wait for the group's progress thread, even one stuck in a Future
  callback. Aborting twice, or from two threads at once, is harmless; later ops are refused
  naming the abort.
* ``getError()`` (``ucxbackend.get_error``: torch has no Python binding for it) is SUCCESS
  while the group is healthy, then the kind of its first failure: TIMEOUT after an op timed
  out (an abort after that keeps it), REMOTE_ERROR after a peer was killed, COMM_ERROR after
  an abort.
* A ucx peer killed before this rank ever reached it (endpoints are made on first use): a
  receive from it fails naming rank 1, well before the op's timeout, as for a connected one.

The bounds are loose (1 s) for a loaded 2-core machine; the latencies measured are in the
docs. One world serves each fixture: starting ranks is what costs here.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
from dist_harness import BACKEND, run_world, timed_failure
from world_pool import module_worlds

OURS = ["ucx", "udp"]
BOUND_S = 1.0  # what a test checks; the target is 100 ms (docs/failure-model.md)
WORLD_TIMEOUT = 150.0


def _skip_unless_ours() -> None:
    if BACKEND not in OURS:
        pytest.skip(f"ucx/udp behaviour ({BACKEND} under test)")


def _error_name(group: Any) -> str:
    """The group's getError() as a name; what went wrong if it could not be asked."""
    import ucxbackend

    try:
        return str(ucxbackend.get_error(group).name)
    except Exception as exc:  # reported, so that the world's other results still come back
        return f"get_error failed: {exc!r}"


def _ones() -> torch.Tensor:
    return torch.ones(4, dtype=torch.int64)


def _waiters(works: dict[str, Any]) -> tuple[dict[str, tuple[float, str | None]], list[Any]]:
    """One thread per Work, each in wait(); returns (results by name, threads)."""
    results: dict[str, tuple[float, str | None]] = {}

    def wait(name: str, work: Any) -> None:
        try:
            work.wait(timeout=timedelta(seconds=30))
            results[name] = (time.monotonic(), None)
        except RuntimeError as exc:
            results[name] = (time.monotonic(), str(exc))

    threads = [threading.Thread(target=wait, args=item, daemon=True) for item in works.items()]
    for t in threads:
        t.start()
    return results, threads


def _abort_pending(rank: int, backend: str) -> dict[str, Any]:
    """Rank 0 aborts while three threads wait: on a running all_reduce that rank 1 never
    joins, on one queued behind it and on an irecv nobody sends to."""
    sub = dist.new_group(backend=backend, timeout=timedelta(seconds=60))
    t = _ones()
    dist.all_reduce(t, group=sub)
    out: dict[str, Any] = {"healthy": _error_name(sub)}
    if rank == 0:
        works = {
            "running": dist.all_reduce(_ones(), group=sub, async_op=True),
            "queued": dist.all_reduce(_ones(), group=sub, async_op=True),
            "irecv": dist.irecv(torch.zeros(4, dtype=torch.int64), src=1, group=sub, tag=7),
        }
        results, threads = _waiters(works)
        time.sleep(0.5)  # every thread is in wait(), the all_reduce waits on rank 1
        start = time.monotonic()
        sub.abort()
        out["abort_s"] = time.monotonic() - start
        for th in threads:
            th.join(40)
        out["waits"] = {n: (end - start, msg) for n, (end, msg) in results.items()}

        # Twice more, two threads at once.
        start = time.monotonic()
        again = [threading.Thread(target=sub.abort) for _ in range(2)]
        for th in again:
            th.start()
        for th in again:
            th.join(10)
        out["abort_again_s"] = time.monotonic() - start
        out["later"] = timed_failure(lambda: dist.all_reduce(_ones(), group=sub))
        out["later_recv"] = timed_failure(
            lambda: dist.recv(torch.zeros(4, dtype=torch.int64), src=1, group=sub)
        )
        out["aborted"] = _error_name(sub)
    dist.barrier()
    # An abort on another thread while this one destroys the group.
    racer = threading.Thread(target=sub.abort)
    racer.start()
    dist.destroy_process_group(sub)
    racer.join(10)
    out["racer_done"] = not racer.is_alive()
    return out


def _abort_stuck_thread(rank: int, backend: str) -> dict[str, Any]:
    """Rank 0's progress thread is stuck in a Future callback (for up to 5 s) when a thread
    waits on an op queued behind it and another aborts the group."""
    sub = dist.new_group(backend=backend, timeout=timedelta(seconds=60))
    out: dict[str, Any] = {}
    entered, release = threading.Event(), threading.Event()
    if rank == 0:

        def stuck(fut: Any) -> None:
            entered.set()
            release.wait(5)

        work = dist.all_reduce(_ones(), group=sub, async_op=True)
        work.get_future().then(stuck)  # before rank 1 joins: it runs on the progress thread
        dist.barrier()
        assert entered.wait(10), "the callback never ran"
        queued = dist.all_reduce(_ones(), group=sub, async_op=True)
        results, threads = _waiters({"queued": queued})
        time.sleep(0.3)
        start = time.monotonic()
        sub.abort()
        out["abort_s"] = time.monotonic() - start
        threads[0].join(40)
        end, msg = results["queued"]
        out["wait"] = (end - start, msg)
        release.set()
    else:
        dist.barrier()
        dist.all_reduce(_ones(), group=sub)
    dist.barrier()
    dist.destroy_process_group(sub)
    return out


def _get_error_timeout(rank: int, backend: str) -> dict[str, Any]:
    """Rank 0's all_reduce times out (rank 1 never joins it), then rank 0 aborts."""
    sub = dist.new_group(backend=backend, timeout=timedelta(seconds=1))
    t = _ones()
    dist.all_reduce(t, group=sub)
    out: dict[str, Any] = {}
    if rank == 0:
        out["op"] = timed_failure(lambda: dist.all_reduce(_ones(), group=sub))
        # wait() may give up a moment before the op itself times out on the progress thread:
        # the next op, queued behind it, is refused only once it has.
        out["later"] = timed_failure(lambda: dist.all_reduce(_ones(), group=sub))
        out["after_timeout"] = _error_name(sub)
        sub.abort()
        out["after_abort"] = _error_name(sub)
    dist.barrier()
    if rank == 1:
        # An aborted group closes at once. (Closing the udp group lingered its longest,
        # lingerMaxUs, 5 s, over rank 0's timed-out all_reduce until 2026-11-28:
        # tests/test_group_lifecycle.py.) Rank 0 is done with the group.
        sub.abort()
    dist.destroy_process_group(sub)
    return out


FAILING_TIMEOUT_S = 0.5  # the op timeout of the groups that _error_at_once fails
LATE_START_S = 0.25  # how long rank 1 holds up the op ahead of the one that times out
SEND_TRIES = 3  # sends whose wait() gives up, each failing a group of its own
BIG = 300_000  # float32: 1.2 MB, a rendezvous send on both transports
BUSY_S = 3.0  # how long rank 1 keeps rank 0's progress thread in an all_reduce (_busy_send)


def _error_at_once(rank: int, backend: str) -> dict[str, Any]:
    """Rank 0's wait() gives up where that fails the group, and rank 0 reads getError() right
    after it raised: a collective whose wait began LATE_START_S before the op did (queued
    behind one that rank 1 joins late), and SEND_TRIES large sends that rank 1 never receives
    (a wait(timeout) of 0.1 s; they cannot be withdrawn)."""
    out: dict[str, Any] = {"collective": None, "sends": []}

    def close(sub: Any) -> None:
        dist.barrier()
        # An aborted group closes at once (udp lingered over rank 0's unacknowledged send
        # until 2026-11-28: tests/test_group_lifecycle.py).
        sub.abort()
        dist.destroy_process_group(sub)

    sub = dist.new_group(backend=backend, timeout=timedelta(seconds=FAILING_TIMEOUT_S))
    if rank == 0:
        dist.all_reduce(_ones(), group=sub, async_op=True)
        second = dist.all_reduce(_ones(), group=sub, async_op=True)
        _, msg = timed_failure(second.wait)
        out["collective"] = (msg, _error_name(sub))
    else:
        time.sleep(LATE_START_S)
        dist.all_reduce(_ones(), group=sub)
    close(sub)
    for _ in range(SEND_TRIES):
        sub = dist.new_group(backend=backend, timeout=timedelta(seconds=30))
        if rank == 0:
            work = dist.isend(torch.ones(BIG), dst=1, group=sub, tag=3)
            _, msg = timed_failure(lambda work=work: work.wait(timeout=timedelta(seconds=0.1)))
            out["sends"].append((msg, _error_name(sub)))
        close(sub)
    if backend == "ucx":  # the cap is the backend's, not the transport's: one is enough
        out["busy_send"] = _busy_send(rank, backend, close)
    return out


def _busy_send(rank: int, backend: str, close: Any) -> float | None:
    """How long rank 0's send wait(timeout=0.1 s) takes while its progress thread is held
    BUSY_S in an all_reduce that rank 1 joins late: the send's withdrawal waits behind it."""
    sub = dist.new_group(backend=backend, timeout=timedelta(seconds=30))
    took = None
    if rank == 0:
        held = dist.all_reduce(_ones(), group=sub, async_op=True)
        work = dist.isend(torch.ones(BIG), dst=1, group=sub, tag=4)
        start = time.monotonic()
        _, msg = timed_failure(lambda: work.wait(timeout=timedelta(seconds=0.1)))
        took = time.monotonic() - start
        assert msg is not None and "timed out" in msg, msg
        held.wait()
    else:
        time.sleep(BUSY_S)
        dist.all_reduce(_ones(), group=sub)
    close(sub)
    return took


@pytest.fixture(scope="module")
def error_at_once_world(_worlds: dict[str, Future[Any]]) -> list[Any]:
    _skip_unless_ours()
    result: list[Any] = _worlds["error_at_once_world"].result()
    return result


def _error_at_once_both(rank: int, ws: int) -> dict[str, Any]:
    return {backend: _error_at_once(rank, backend) for backend in OURS}


@pytest.mark.parametrize("backend", OURS)
def test_get_error_is_timeout_as_soon_as_a_wait_that_failed_the_group_raised(
    error_at_once_world: list[Any], backend: str
) -> None:
    # The group recorded its failure after the Work's waiter had been told: getError() read
    # SUCCESS for a moment after wait() raised (a collective's wait ending before the op's
    # own deadline: for the LATE_START_S it was queued; a send withdrawn on the progress
    # thread after the wait raised). Now the failure is recorded first.
    out = error_at_once_world[0][backend]
    msg, error = out["collective"]
    assert msg is not None and "timed out" in msg, msg
    assert error == "TIMEOUT", out["collective"]
    assert len(out["sends"]) == SEND_TRIES, out
    for msg, error in out["sends"]:
        assert msg is not None and "timed out" in msg, msg
        assert error == "TIMEOUT", out["sends"]


def test_a_send_wait_behind_a_busy_thread_raises_within_its_cap(
    error_at_once_world: list[Any],
) -> None:
    # A send's timed-out wait() waits for its withdrawal on the progress thread, which comes
    # only after the op that thread runs; at most kWithdrawWaitCap (1 s,
    # csrc/p2p_withdraw.hpp), not that op's BUSY_S.
    took = error_at_once_world[0]["ucx"]["busy_send"]
    assert took is not None and took < BUSY_S - 0.6, took


def _abort_world(rank: int, ws: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for backend in OURS:
        out[f"pending/{backend}"] = _abort_pending(rank, backend)
        out[f"stuck/{backend}"] = _abort_stuck_thread(rank, backend)
        out[f"timeout/{backend}"] = _get_error_timeout(rank, backend)
    return out


@pytest.fixture(scope="module")
def abort_world(_worlds: dict[str, Future[Any]]) -> list[dict[str, Any]]:
    _skip_unless_ours()
    result: list[dict[str, Any]] = _worlds["abort_world"].result()
    return result


def _is_abort_error(msg: str | None, backend: str, op: str) -> bool:
    return (
        msg is not None
        and "was aborted" in msg
        and f"{backend} {op} (op #" in msg
        and "on rank 0 of 2" in msg
    )


@pytest.mark.parametrize("backend", OURS)
def test_abort_fails_every_pending_wait_at_once(
    abort_world: list[dict[str, Any]], backend: str
) -> None:
    out = abort_world[0][f"pending/{backend}"]
    assert out["healthy"] == "SUCCESS", out
    assert out["abort_s"] < BOUND_S, out
    ops = {"running": "allreduce", "queued": "allreduce", "irecv": "recv"}
    assert sorted(out["waits"]) == sorted(ops), out["waits"]
    for name, (elapsed, msg) in out["waits"].items():
        assert _is_abort_error(msg, backend, ops[name]), (name, msg)
        assert elapsed < BOUND_S, (name, elapsed, msg)


@pytest.mark.parametrize("backend", OURS)
def test_abort_does_not_wait_for_a_stuck_progress_thread(
    abort_world: list[dict[str, Any]], backend: str
) -> None:
    out = abort_world[0][f"stuck/{backend}"]
    assert out["abort_s"] < BOUND_S, out
    elapsed, msg = out["wait"]
    assert _is_abort_error(msg, backend, "allreduce"), msg
    assert elapsed < BOUND_S, out


@pytest.mark.parametrize("backend", OURS)
def test_abort_twice_and_later_ops_are_refused_naming_it(
    abort_world: list[dict[str, Any]], backend: str
) -> None:
    out = abort_world[0][f"pending/{backend}"]
    assert out["abort_again_s"] < BOUND_S, out
    for key, op in (("later", "allreduce"), ("later_recv", "recv")):
        elapsed, msg = out[key]
        assert msg is not None, f"{op} on an aborted group returned"
        assert f"{backend} {op} (op #" in msg and "earlier failure" in msg, msg
        assert f"{backend} rank 0: the process group was aborted" in msg, msg
        assert elapsed < BOUND_S, (key, elapsed)
    assert out["aborted"] == "COMM_ERROR", out
    for rank_out in abort_world:
        assert rank_out[f"pending/{backend}"]["racer_done"], rank_out


@pytest.mark.parametrize("backend", OURS)
def test_get_error_after_a_timeout_stays_timeout_after_abort(
    abort_world: list[dict[str, Any]], backend: str
) -> None:
    out = abort_world[0][f"timeout/{backend}"]
    _, msg = out["op"]
    assert msg is not None and "timed out" in msg, msg
    assert out["after_timeout"] == "TIMEOUT", out
    assert out["after_abort"] == "TIMEOUT", out  # the first failure wins
    _, later = out["later"]
    assert later is not None and "timed out" in later and "earlier failure" in later, later


COLD_TIMEOUT_S = 8  # the never-connected group's op timeout


def _peer_killed(rank: int, ws: int) -> dict[str, Any]:
    subs = {b: dist.new_group(backend=b, timeout=timedelta(seconds=30)) for b in OURS}
    for sub in subs.values():
        dist.all_reduce(_ones(), group=sub)
    # A ucx group that carries nothing before the kill: rank 0 makes its endpoint to rank 1
    # (lazily, on first use) only after rank 1 is dead, for a receive.
    cold = dist.new_group(backend="ucx", timeout=timedelta(seconds=COLD_TIMEOUT_S))
    # Groups whose only op after the kill is an any-source receive: nothing else of rank 0's
    # is pending with rank 1. They carry nothing before it (ucx makes its endpoint to rank 1
    # for the receive, after rank 1 died), but for "ucx-posted", whose receive rank 0 posts
    # before the kill, after an all_reduce: UCX's keepalive finds rank 1 gone while it waits.
    anysrc = {b: dist.new_group(backend=b, timeout=timedelta(seconds=COLD_TIMEOUT_S)) for b in OURS}
    posted_group = dist.new_group(backend="ucx", timeout=timedelta(seconds=COLD_TIMEOUT_S))
    dist.all_reduce(_ones(), group=posted_group)
    out: dict[str, Any] = {b: {"healthy": _error_name(s)} for b, s in subs.items()}
    posted = dist.irecv(_ones(), group=posted_group) if rank == 0 else None  # from any rank
    dist.barrier()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.5)
    assert posted is not None
    out["anysrc/ucx-posted"] = {"recv": timed_failure(posted.wait)}
    out["anysrc/ucx-posted"]["after"] = _error_name(posted_group)
    for backend, sub in subs.items():
        out[backend]["op"] = timed_failure(lambda sub=sub: dist.all_reduce(_ones(), group=sub))
        out[backend]["after"] = _error_name(sub)
    out["cold"] = {"recv": timed_failure(lambda: dist.recv(_ones(), src=1, group=cold))}
    out["cold"]["after"] = _error_name(cold)
    for backend, sub in anysrc.items():
        out[f"anysrc/{backend}"] = {
            "recv": timed_failure(lambda sub=sub: dist.recv(_ones(), group=sub))
        }
        out[f"anysrc/{backend}"]["after"] = _error_name(sub)
    return out


@pytest.fixture(scope="module")
def peer_killed_world(_worlds: dict[str, Future[Any]]) -> list[Any]:
    _skip_unless_ours()
    result: list[Any] = _worlds["peer_killed_world"].result()
    return result


@pytest.mark.parametrize("backend", OURS)
def test_get_error_after_a_peer_was_killed_is_remote_error(
    peer_killed_world: list[Any], backend: str
) -> None:
    out = peer_killed_world[0][backend]
    assert out["healthy"] == "SUCCESS", out
    _, msg = out["op"]
    assert msg is not None, "all_reduce with a killed peer returned"
    assert out["after"] == "REMOTE_ERROR", out


def test_a_killed_peer_never_connected_to_fails_a_receive_naming_it(
    peer_killed_world: list[Any],
) -> None:
    # As for a connected peer: the peer's failure, named, well before the op's timeout (not
    # "timed out ... not yet matched by its peers").
    seconds, msg = peer_killed_world[0]["cold"]["recv"]
    assert msg is not None and "ucx recv" in msg and "rank 1" in msg, msg
    assert seconds < COLD_TIMEOUT_S / 2, (seconds, msg)
    assert peer_killed_world[0]["cold"]["after"] == "REMOTE_ERROR", peer_killed_world[0]["cold"]


@pytest.mark.parametrize("case", ["udp", "ucx", "ucx-posted"])
def test_a_killed_peer_fails_an_any_source_receive_naming_it(
    peer_killed_world: list[Any], case: str
) -> None:
    # udp sends no keepalive for an unmatched any-source receive unless it watches every peer
    # then, and ucx cancelled only the receives directed at a failed peer: either way the
    # receive waited out the group's timeout for a peer long dead. ucx: a receive posted after
    # rank 1 died ("ucx": its endpoint to rank 1 cannot be made, or UCX's keepalive fails it)
    # and one posted before ("ucx-posted": the keepalive fails the endpoint while it waits).
    backend = case.split("-")[0]
    result = peer_killed_world[0][f"anysrc/{case}"]
    seconds, msg = result["recv"]
    assert msg is not None, "an any-source receive from a killed peer returned"
    for part in (f"{backend} recvAnysource", "rank 0 of 2", "Long[4]", "any rank", "rank 1"):
        assert part in msg, (part, msg)
    if backend == "udp":
        assert "connection to rank 1 failed" in msg, msg
    assert seconds < COLD_TIMEOUT_S / 2, (seconds, msg)
    assert result["after"] == "REMOTE_ERROR", result


def _live_peer_sent_first(rank: int, ws: int, done: str) -> dict[str, Any]:
    """In a world of 3, rank 2 sends to rank 0 and rank 1 is killed; then rank 0 receives
    from any rank, knowing rank 1 dead (on ucx its endpoint to rank 1, made for the receive,
    cannot be made)."""
    subs = {b: dist.new_group(backend=b, timeout=timedelta(seconds=COLD_TIMEOUT_S)) for b in OURS}
    if rank == 2:
        for sub in subs.values():
            dist.send(torch.full((4,), 7, dtype=torch.int64), dst=0, group=sub, tag=4)
    dist.barrier()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    out: dict[str, Any] = {}
    if rank == 0:
        time.sleep(0.5)
        for backend, sub in subs.items():
            got = torch.zeros(4, dtype=torch.int64)
            try:
                work = dist.irecv(got, group=sub, tag=4)
                work.wait()
                out[backend] = (work._source_rank(), got.tolist(), None)
            except RuntimeError as exc:
                out[backend] = (None, got.tolist(), str(exc))
        open(done, "w").close()
    else:
        # Alive until rank 0 has received: its endpoint to this rank stays healthy.
        deadline = time.monotonic() + 30
        while not os.path.exists(done) and time.monotonic() < deadline:
            time.sleep(0.02)
    return out


@pytest.fixture(scope="module")
def live_peer_world(_worlds: dict[str, Future[Any]]) -> list[Any]:
    _skip_unless_ours()
    result: list[Any] = _worlds["live_peer_world"].result()
    return result


# The file's four shared worlds, which mostly wait (timeouts, a rank held BUSY_S, killed peers),
# start side by side with its first test (tests/world_pool.py's module_worlds).
@pytest.fixture(scope="module", autouse=True)
def _worlds(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Future[Any]]]:
    if BACKEND not in OURS:
        yield {}
        return
    done = str(tmp_path_factory.mktemp("live_peer") / "done")
    yield from module_worlds(
        request,
        {
            "error_at_once_world": lambda: run_world(_error_at_once_both, 2, timeout=90),
            "abort_world": lambda: run_world(_abort_world, 2, timeout=WORLD_TIMEOUT),
            "peer_killed_world": lambda: run_world(
                _peer_killed, 2, expect_fail_ranks={1}, pg_timeout=30, timeout=90
            ),
            "live_peer_world": lambda: run_world(
                _live_peer_sent_first,
                3,
                expect_fail_ranks={1},
                pg_timeout=30,
                timeout=90,
                args=(done,),
            ),
        },
    )


@pytest.mark.parametrize("backend", OURS)
def test_an_any_source_receive_takes_a_live_peers_message_though_another_peer_died(
    live_peer_world: list[Any], backend: str
) -> None:
    # A dead peer fails an any-source receive only where nothing that already came matches
    # it: the message rank 2 sent before rank 1 died is this receive's.
    assert live_peer_world[0][backend] == (2, [7, 7, 7, 7], None), live_peer_world[0]
