"""A rank SIGKILLed while a group is created (the test-only hook UCXBACKEND_TEST_KILL_AT,
docs/testing.md#test-only-hooks), at each stage from its joining the creation on: every
survivor raises within a few seconds naming the dead rank, instead of at the Store's timeout.
A rank killed before it joins (rank 0: before it opens the creation) has no card to look at:
the survivors raise at the Store's timeout, or when the Store dies with rank 0, naming it.

The reference is what the survivors did before (docs/failure-model.md, "A rank that fails or
dies while a group is created"): they waited for the Store's timeout, PG_TIMEOUT here, and
then failed without naming the rank for every stage. Gloo's survivors wait for as long (its
creation has no liveness check either).

The worlds in which a rank never joins wait out the Store's timeout: they run side by side
(``@pooled``, tests/world_pool.py), each checked by its own test (the bound, SLACK past the
timeout, is loose enough for it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import torch.distributed as dist
from conftest import is_ucx, skip_unless_ucx
from dist_harness import free_port, run_world, timed_failure
from world_pool import pooled

PG_TIMEOUT = 20.0  # the Store's timeout: how long the survivors waited before
FAST = 8.0  # found in well under a second (kWatchAfter + kLivenessSlice): a bound, not a speed
VICTIM_ENV = "UCXBACKEND_TEST_KILL_AT"
# The Store's timeout for a creation that a rank never joins: the survivors wait for it.
NEVER_JOINED_TIMEOUT = 2.0
# What the survivors may take beyond it on this loaded 2-core machine: a bound, not a speed.
SLACK = 8.0


def _create_while_one_dies(rank: int, ws: int, backend: str, victim: int, point: str) -> Any:
    if rank == victim:
        os.environ[VICTIM_ENV] = point
    return timed_failure(lambda: dist.new_group(backend=backend))


# (backend, killed rank, where, environment of every rank, Store): where the survivors were
# then waiting is in the comments. A FileStore (file) outlives any rank; a TCPStore (tcp) is
# rank 0's, and a survivor's look at the creation goes through a clone of it.
CASES = [
    # before its transport and record exist: the others wait for every rank's record
    ("ucx", 2, "joined", {}, "file"),
    ("udp", 2, "joined", {}, "file"),
    # rank 0 itself (it opened the creation)
    ("ucx", 0, "joined", {}, "file"),
    # after its record, before its shared-memory answer: the others wait for the answer
    ("ucx", 2, "shm_offered", {}, "file"),
    ("ucx", 2, "shm_offered", {}, "tcp"),
    # between the two rounds of addresses (a one-host guess proven wrong): the others wait
    # for every rank's second record
    ("ucx", 2, "between_rounds", {"UCXBACKEND_TEST_ANY_HOST": "round"}, "file"),
    # after everything else, before it said it finished: rank 0 waits for every rank
    ("ucx", 2, "before_complete", {}, "file"),
    # the same where every rank's launcher hosts the Store (torchrun's agent): rank 0 waits
    # for nobody, and the survivors' creation succeeds (the dead peer fails their first op)
    ("ucx", 2, "before_complete", {"TORCHELASTIC_USE_AGENT_STORE": "True"}, "file"),
]


@pytest.mark.parametrize(
    ("backend", "victim", "point", "env", "init"),
    CASES,
    ids=[f"{b}-rank{v}-{p}-{i}" for b, v, p, _, i in CASES],
)
def test_survivors_name_the_killed_rank_at_once(
    backend: str, victim: int, point: str, env: dict[str, str], init: str
) -> None:
    skip_unless_ucx("the group's creation is the extension's")
    res = run_world(
        _create_while_one_dies,
        3,
        args=(backend, victim, point),
        env=env,
        init=init,
        pg_timeout=PG_TIMEOUT,
        expect_fail_ranks={victim},
        timeout=120,
    )
    assert res[victim] is None, res  # it died
    survivors = [r for r in range(3) if r != victim]
    failed = {r: res[r] for r in survivors if res[r][1] is not None}
    if point == "before_complete" and env:
        assert failed == {}, res  # nobody waits for the others once its own part is done
    elif point == "before_complete":
        # Only rank 0 waits for the others once its own part is done; rank 1 may have
        # finished its part (and holds a group whose first op will fail on the dead peer).
        assert 0 in failed, res
    else:
        assert set(failed) == set(survivors), res
    for r, (elapsed, msg) in failed.items():
        assert f"rank {victim} (pid " in msg and "died during this creation" in msg, (r, msg)
        assert elapsed < FAST, (r, elapsed, msg)


def _create_over_rank0s_store_while_one_dies(rank: int, ws: int, victim: int) -> Any:
    # The default group's Store is a TCPStore in rank 0's process (init "tcp"); the launcher's
    # flag is set only now, as in a program under torchrun that makes a group over a Store of
    # its own, hosted by its rank 0.
    os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"
    if rank == victim:
        os.environ[VICTIM_ENV] = "before_complete"
    return timed_failure(lambda: dist.new_group(backend="ucx"))


def test_rank0_waits_for_the_others_on_a_store_of_its_own_under_a_launcher() -> None:
    """TORCHELASTIC_USE_AGENT_STORE=True says that torchrun's agent hosts the Store that torch's
    rendezvous makes, not every Store: over a TCPStore that rank 0 hosts itself, rank 0 still
    waits for every rank to finish the creation (its exit would take the Store from a slower
    rank), and so names a rank that died before it finished, as where no launcher hosts one."""
    skip_unless_ucx("the group's creation is the extension's")
    res = run_world(
        _create_over_rank0s_store_while_one_dies,
        3,
        args=(2,),
        init="tcp",
        pg_timeout=PG_TIMEOUT,
        expect_fail_ranks={2},
        timeout=120,
    )
    assert res[2] is None, res  # it died
    elapsed, msg = res[0]
    assert msg is not None, res  # rank 0 returned without waiting for rank 2
    assert "rank 2 (pid " in msg and "died during this creation" in msg, msg
    assert elapsed < FAST, (elapsed, msg)


# A rank of a job whose launcher hosts the Store, as torchrun's agent does: torch's rendezvous
# connects to it at MASTER_ADDR:MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True). Prints what
# creating a ucx group raised, or "created".
_AGENT_RANK = """
import os, sys
from datetime import timedelta
import torch.distributed as dist
import ucxbackend  # noqa: F401
dist.init_process_group("gloo", timeout=timedelta(seconds=20))
if dist.get_rank() == 2:
    os.environ["UCXBACKEND_TEST_KILL_AT"] = "before_complete"
try:
    dist.new_group(backend="ucx")
    print("created", flush=True)
except RuntimeError as e:
    print(str(e), flush=True)
os._exit(0)
"""


def test_rank0_does_not_wait_on_the_launchers_store() -> None:
    """The counterpart of the test above: over the Store that the launcher hosts (torch's
    rendezvous connected to it), rank 0 waits for nobody, and a rank that dies before it
    finished the creation fails no survivor's creation."""
    skip_unless_ucx("the group's creation is the extension's")
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, 3, is_master=True, wait_for_workers=False)
    procs = []
    try:
        for rank in range(3):
            env = {
                **os.environ,
                "OMP_NUM_THREADS": "1",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "RANK": str(rank),
                "WORLD_SIZE": "3",
                "TORCHELASTIC_USE_AGENT_STORE": "True",
                "TORCHELASTIC_RESTART_COUNT": "0",
            }
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", _AGENT_RANK],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        deadline = time.monotonic() + 60
        outs = []
        for p in procs:
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            outs.append((p.returncode, out.strip(), err[-2000:]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        del store
    assert outs[2][0] == -signal.SIGKILL, outs  # it died
    assert outs[0][1] == "created" and outs[1][1] == "created", outs


def _create_without_one(rank: int, ws: int, backend: str, victim: int) -> Any:
    # The default group exists; the victim dies before it reaches the next creation, and the
    # survivors wait for it at most NEVER_JOINED_TIMEOUT (the Store's timeout, which new_group
    # takes over).
    if rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.distributed_c10d._get_default_store().set_timeout(timedelta(seconds=NEVER_JOINED_TIMEOUT))
    return timed_failure(lambda: dist.new_group(backend=backend))


# (killed rank, Store, what every survivor's error must say). Rank 0 opens the creation (the
# others wait for it to); a TCPStore is rank 0's and dies with it: when rank 0 has failed and
# exited first, rank 1 finds the Store gone and cannot tell which rank never came (rank 0
# always names it, below).
NEVER_JOINED = [
    (2, "file", "rank 2 never joined this creation of the group"),
    (2, "tcp", "never joined this creation of the group"),
    (0, "file", "rank 0 did not start this creation of the group"),
    (0, "tcp", "rank 0"),
]


def _never_joined_world(victim: int, init: str, said: str) -> list[Any] | None:
    if not is_ucx():
        return None
    return run_world(
        _create_without_one,
        3,
        args=("ucx", victim),
        init=init,
        pg_timeout=60.0,
        expect_fail_ranks={victim},
        timeout=90,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("victim", "init", "said"), NEVER_JOINED, ids=[f"rank{v}-{i}" for v, i, _ in NEVER_JOINED]
)
@pooled(_never_joined_world)
def test_survivors_of_a_rank_that_never_joined_fail_in_bounded_time(
    victim: int, init: str, said: str, pooled_result: Callable[[], Any]
) -> None:
    skip_unless_ucx("the group's creation is the extension's")
    res = pooled_result()
    assert res[victim] is None, res  # it died
    for r in (r for r in range(3) if r != victim):
        elapsed, msg = res[r]
        assert msg is not None, (r, res)  # a group without rank `victim` was never created
        assert "setting up group" in msg and f"on rank {r} failed" in msg, (r, msg)
        assert said in msg, (r, msg)
        assert elapsed < NEVER_JOINED_TIMEOUT + SLACK, (r, elapsed, msg)
    if victim != 0:
        assert f"rank {victim} never joined" in res[0][1], res
