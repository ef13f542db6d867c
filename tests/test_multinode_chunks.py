"""Messages of more than one 4 MiB chunk across two hosts of the namespace rig
(tests/multinode_harness.py), over ucx and udp, every collective against Gloo and a local
reference; ucx's send lane between hosts, taken by default (auto) and off when forced off."""

from __future__ import annotations

import pytest
from multinode_harness import (
    BACKENDS,
    SLOW_SIZES,
    check_job,
    group_threads,
    lane_messages,
    needs_rig,
    rig_fixture,  # noqa: F401  (the fixture rig: this file's rig)
    run_job,
    start_jobs,
)
from rig_harness import HostResult, NetnsRig

pytestmark = needs_rig


@pytest.fixture(scope="module")
def multi_chunk_jobs(rig: NetnsRig) -> dict[str, dict[str, HostResult]]:
    """The multi-chunk job, once run, both backends' checks in the same ranks one after the
    other (multinode_harness.start_jobs: one torch import, not one per backend), each
    backend's part judged by its own test; the ucx part is also the one whose send-lane
    counters test_ucx_send_lane_carries_every_collective_across_hosts reads (default
    settings: the same run serves both)."""
    return start_jobs(rig, BACKENDS, 1, sizes=SLOW_SIZES, timeout=240)


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_one_rank_per_host_multi_chunk(
    rig: NetnsRig, multi_chunk_jobs: dict[str, dict[str, HostResult]], backend: str
) -> None:
    check_job(rig, backend, 1, multi_chunk_jobs[backend])


@pytest.mark.slow
def test_ucx_send_lane_carries_every_collective_across_hosts(
    rig: NetnsRig, multi_chunk_jobs: dict[str, dict[str, HostResult]]
) -> None:
    """send_lane=auto (the default) between hosts over TCP: large sends take the lane (the
    counters say so on both hosts) and every collective still matches numpy and Gloo."""
    out = check_job(rig, "ucx", 1, multi_chunk_jobs["ucx"])
    for host in ("a", "b"):
        counts = lane_messages(out[host])
        assert len(counts) == 1 and counts[0] != "none" and int(counts[0]) > 0, (host, counts)
        # The lane's thread is the rank's own: a lost yield does not count it as an outsider.
        assert group_threads(out[host]) == [3], (host, group_threads(out[host]))


def test_ucx_send_lane_off_across_hosts(rig: NetnsRig) -> None:
    """send_lane=off: no lane between hosts either (the forced-off half of the knob)."""
    out = run_job(rig, "ucx", 1, extra_env={"UCXBACKEND_SEND_LANE": "off"})
    for host in ("a", "b"):
        assert lane_messages(out[host]) == ["none"], (host, lane_messages(out[host]))
        assert group_threads(out[host]) == [2], (host, group_threads(out[host]))
