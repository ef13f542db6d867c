"""ucx's send lane (transports/ucx/send_lane.h) on one host: forced on, every collective still
matches its references exactly; left on auto, a group on one host never gets a lane.

Across hosts, where auto picks the lane, tests/test_multinode_chunks.py checks the same
worker's results and that the lane carried them (test_ucx_send_lane_*).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from dist_harness import run_world

import ucxbackend

# 300000 int64 elements (2.4 MB) and 1.5M (12 MB, several 4 MiB chunks): sends of 256 KiB and
# up take the lane; the small sizes keep the main worker's path in the same ops.
SIZES = [1, 1000, 300000, 1500000]
# The lane is a UCX worker's: over UCX whatever the environment asks (a one-host group with
# one_host_transport=shm has no UCX worker, hence no lane).
UCX_ONE_HOST = {"UCXBACKEND_ONE_HOST_TRANSPORT": "ucx"}


def _every_collective(rank: int, world: int) -> tuple[int, dict[str, Any]]:
    import multinode_worker  # the multi-node test's checks: every op against numpy and Gloo

    gloo = dist.new_group(backend="gloo")
    checks = multinode_worker.run_all(rank, world, SIZES, gloo)
    dist.barrier()  # the last op's counters are published (see _lane_counters)
    return checks, ucxbackend.stats()["transport"]


def _lane_counters(rank: int, world: int) -> dict[str, Any]:
    t = torch.ones(1 << 20)  # 4 MB: a lane would carry it
    dist.all_reduce(t)
    assert float(t[0]) == world
    # The counters are published after each op, by the progress thread, possibly after the
    # caller saw the op complete: once the barrier (the next op) is done, they are.
    dist.barrier()
    return ucxbackend.stats()["transport"]


def _idle_after_lane(rank: int, world: int) -> tuple[float, dict[str, Any]]:
    from test_progress import idle_fractions

    transport = _lane_counters(rank, world)  # the lane's worker and thread are started
    cpu, _ = idle_fractions(rank, world)
    return cpu, transport


def test_idle_group_with_a_lane_sleeps() -> None:
    """Once its lane thread has run, an idle group still burns < 2% of a core (CPU time,
    which load cannot inflate; test_progress.py measures the group without a lane)."""
    results = run_world(
        _idle_after_lane,
        2,
        env={**UCX_ONE_HOST, "UCXBACKEND_SEND_LANE": "on", "UCXBACKEND_SHARED_MEMORY": "off"},
        timeout=120,
    )
    for rank, (cpu, transport) in enumerate(results):
        assert transport["send_lane_messages"] > 0, (rank, transport)
        assert cpu < 0.02, f"rank {rank}: idle CPU {cpu:.3f} of a core"


def _peer_killed_during_lane_sends(rank: int, world: int) -> tuple[float, str | None, str]:
    import os
    import signal
    import time

    from dist_harness import timed_failure

    _lane_counters(rank, world)  # both lanes are up and connected
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.2)
    big = torch.ones(16 << 20)  # 64 MB: 4 MiB chunks through the lane to a dead peer
    seconds, msg = timed_failure(lambda: dist.all_reduce(big))
    return seconds, msg, ucxbackend.get_error().name


def test_peer_killed_during_lane_sends_fails_the_op_naming_it() -> None:
    """A peer that dies while this rank's sends go through the lane fails the op with the
    peer's error well before the op timeout (30 s here), and the group reports REMOTE_ERROR:
    the lane's failed sends reach the progress thread instead of hanging it."""
    results = run_world(
        _peer_killed_during_lane_sends,
        2,
        env={**UCX_ONE_HOST, "UCXBACKEND_SEND_LANE": "on", "UCXBACKEND_SHARED_MEMORY": "off"},
        expect_fail_ranks={1},
        pg_timeout=30,
        timeout=120,
    )
    seconds, msg, error = results[0]
    assert msg is not None, "all_reduce with a killed peer returned"
    assert "rank 1" in msg, msg
    assert seconds < 15, (seconds, msg)
    assert error == "REMOTE_ERROR", (error, msg)


def _lane_worker_cannot_be_made(rank: int, world: int) -> tuple[str | None, float]:
    import os
    import resource
    import time

    from dist_harness import timed_failure

    small = torch.ones(10)
    dist.all_reduce(small)  # connected; no lane thread yet (it starts with the first large send)
    if rank == 1:
        # Room for one more fd: the lane thread's epoll set, not its UCX worker.
        open_fds = {int(fd) for fd in os.listdir("/proc/self/fd")}
        lowest_free = next(fd for fd in range(1 << 16) if fd not in open_fds)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free + 1, hard))
    _, msg = timed_failure(lambda: dist.all_reduce(torch.ones(1 << 20)))
    if rank == 1:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    start = time.monotonic()
    dist.destroy_process_group()
    destroy_seconds = time.monotonic() - start
    # The harness destroys a default group after fn: give it one of this rank alone.
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    return msg, destroy_seconds


def test_lane_worker_that_cannot_be_made_fails_the_op_and_destroy_returns() -> None:
    """Out of fds when the lane thread starts: its UCX worker cannot be made. The op fails
    naming it, and destroying the group returns: the lane thread still wakes for stop()
    (it used to sleep on an epoll set without its command fd, and destroy joined it forever)."""
    results = run_world(
        _lane_worker_cannot_be_made,
        2,
        env={**UCX_ONE_HOST, "UCXBACKEND_SEND_LANE": "on", "UCXBACKEND_SHARED_MEMORY": "off"},
        pg_timeout=5,
        timeout=90,
    )
    msg, destroy_seconds = results[1]
    assert msg is not None and "send lane" in msg and "rank 1" in msg, msg
    assert destroy_seconds < 5, destroy_seconds


@pytest.mark.slow
def test_forced_lane_carries_every_collective_exactly() -> None:
    """send_lane=on (shared-memory staging off, so that UCX carries every byte): every op the
    multi-node worker covers matches numpy and Gloo bit for bit, and the lane carried sends."""
    results = run_world(
        _every_collective,
        2,
        env={**UCX_ONE_HOST, "UCXBACKEND_SEND_LANE": "on", "UCXBACKEND_SHARED_MEMORY": "off"},
        timeout=240,
        pg_timeout=120,
    )
    for rank, (checks, transport) in enumerate(results):
        assert checks > 0
        assert transport["send_lane_messages"] > 0, (rank, transport)
        assert transport["send_lane_peers"] == 1, (rank, transport)


@pytest.mark.parametrize("shared_memory", ["auto", "off"])
def test_auto_never_picks_the_lane_on_one_host(shared_memory: str) -> None:
    """Both ranks on this host: no lane is made (no counters), staging or not."""
    results = run_world(
        _lane_counters,
        2,
        env={**UCX_ONE_HOST, "UCXBACKEND_SHARED_MEMORY": shared_memory},
        timeout=120,
    )
    for rank, transport in enumerate(results):
        assert "send_lane_messages" not in transport, (rank, transport)


def test_forced_lane_is_used_on_one_host() -> None:
    """The counterpart of the test above, so that it cannot pass by never counting."""
    results = run_world(
        _lane_counters,
        2,
        env={**UCX_ONE_HOST, "UCXBACKEND_SEND_LANE": "on", "UCXBACKEND_SHARED_MEMORY": "off"},
        timeout=120,
    )
    for rank, transport in enumerate(results):
        assert transport["send_lane_messages"] > 0, (rank, transport)
