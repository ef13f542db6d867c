"""Every collective across two hosts of the namespace rig (tests/multinode_harness.py): one and
(slow) two ranks per host, over ucx and udp, against Gloo in the same job and a local reference;
and a run in which every comparison must reject a corrupted copy of its result."""

from __future__ import annotations

import re

import pytest
from multinode_harness import (
    BACKENDS,
    SLOW_SIZES,
    any_host_rounds,
    check_job,
    needs_rig,
    rig_fixture,  # noqa: F401  (the fixture rig: this file's rig)
    start_job,
    start_jobs,
)
from rig_harness import HostResult, NetnsRig

pytestmark = needs_rig

# Each host layout's job runs both backends' checks, one after the other in the same ranks
# (multinode_harness.start_jobs): torch is imported once per layout, not once per backend,
# and each backend's test still judges its own part of the job.


# The ucx world of test_spanning_group_without_launcher_hint: LOCAL_WORLD_SIZE hidden.
HIDDEN = "ucx+hide_launcher"


@pytest.fixture(scope="module")
def one_rank_jobs(rig: NetnsRig) -> dict[str, dict[str, HostResult]]:
    # The hidden phase last: the phases before it run with torchrun's environment intact.
    return start_jobs(rig, (*BACKENDS, HIDDEN), 1, timeout=200)


@pytest.fixture(scope="module")
def two_rank_jobs(rig: NetnsRig) -> dict[str, dict[str, HostResult]]:
    # UCX_PROTO_INFO: read by UCX alone, so the udp phase runs as it would without it.
    return start_jobs(
        rig, BACKENDS, 2, sizes=SLOW_SIZES, timeout=240, extra_env={"UCX_PROTO_INFO": "y"}
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_rank_per_host(
    rig: NetnsRig, one_rank_jobs: dict[str, dict[str, HostResult]], backend: str
) -> None:
    out = check_job(rig, backend, 1, one_rank_jobs[backend])
    if backend == "ucx":
        # torchrun's LOCAL_WORLD_SIZE < WORLD_SIZE: no one-host guess, no second round
        assert [any_host_rounds(out[h]) for h in ("a", "b")] == [["False"], ["False"]], out


def test_spanning_group_without_launcher_hint(
    rig: NetnsRig, one_rank_jobs: dict[str, dict[str, HostResult]]
) -> None:
    """Without torchrun's LOCAL_WORLD_SIZE each ucx rank guesses that the world shares its
    host and leaves TCP out; the addresses name two hosts, so every rank makes a worker with
    TCP and exchanges again (the any_host phase), and every collective still matches Gloo and
    the reference (check_job also asserts that TCP is in the world's transports). The last
    phase of the one-rank-per-host job: a world created after the others were destroyed, so
    the any_host round asserted here is its own."""
    out = check_job(rig, "ucx", 1, one_rank_jobs[HIDDEN])
    assert [any_host_rounds(out[h]) for h in ("a", "b")] == [["True"], ["True"]], out


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_two_ranks_per_host(
    rig: NetnsRig, two_rank_jobs: dict[str, dict[str, HostResult]], backend: str
) -> None:
    out = check_job(rig, backend, 2, two_rank_jobs[backend])
    if backend == "ucx":
        # shared memory within a host, TCP on the veth across hosts
        for host in ("a", "b"):
            assert re.search(r"\|\s*(sysv|posix)/memory", out[host]), f"host {host}: no shm"
            assert f"tcp/{rig.ifname(host)}" in out[host], f"host {host}: no tcp lane"  # type: ignore[arg-type]


# A kind of check for each op the worker covers (the ones run_more added included).
WORKER_CHECKS = {
    "all_reduce",
    "all_reduce MAX",
    "all_reduce MIN",
    "all_reduce PRODUCT",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter list",
    "broadcast",
    "reduce",
    "gather",
    "scatter",
    "all_to_all",
    "all_to_all list",
    "all_to_all uneven",
    "all_to_all_single uneven",
    "send/recv",
    "batch_isend_irecv",
    "recv any source",
}


# Sizes of the corrupting run: every kind of check runs at every size (the smallest included),
# and whether a comparison rejects a corrupted copy does not depend on the size; a single
# element and a thousand need none of QUICK_SIZES' 300,000, which cost this job 1-3 s.
CORRUPT_SIZES = "1,1000"


def test_worker_detects_wrong_results(rig: NetnsRig) -> None:
    """The checks can fail: with the corrupting hook every comparison, of every kind, must
    reject a corrupted copy of its result, and the worker must not report OK."""
    results = start_job(
        rig, "ucx", 1, sizes=CORRUPT_SIZES, extra_env={"MULTINODE_CORRUPT": "1"}, timeout=60
    )
    with pytest.raises(AssertionError, match="ranks reporting OK: \\[\\]"):
        check_job(rig, "ucx", 1, results)
    output = "".join(r.output for r in results.values())
    reports = re.findall(
        r"MULTINODE_FAIL rank=(\d+): corrupted results caught: (\d+) of (\d+); kinds: ([^;]*);",
        output,
    )
    assert sorted(int(r[0]) for r in reports) == [0, 1], output[-3000:]
    kinds: set[str] = set()
    for _, caught, total, seen in reports:
        assert int(caught) == int(total) > 0, reports
        kinds.update(seen.split(","))
    assert kinds == WORKER_CHECKS, kinds ^ WORKER_CHECKS
