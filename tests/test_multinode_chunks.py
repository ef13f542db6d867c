"""Messages of more than one 4 MiB chunk across two hosts of the namespace rig
(tests/multinode_harness.py), over ucx and udp, every collective against Gloo and a local
reference; ucx's send lane between hosts, taken by default (auto) and off when forced off."""

from __future__ import annotations

import pytest
from multinode_harness import (
    SLOW_SIZES,
    group_threads,
    lane_messages,
    needs_rig,
    rig_fixture,  # noqa: F401  (the fixture rig: this file's rig)
    run_job,
)
from rig_harness import NetnsRig

pytestmark = needs_rig


@pytest.fixture(scope="module")
def multi_chunk_jobs() -> dict[str, dict[str, str]]:
    """Each backend's multi-chunk job's outputs, once run: the ucx one is also the job whose
    send-lane counters test_ucx_send_lane_carries_every_collective_across_hosts reads (the
    same job, default settings: run once for both)."""
    return {}


def _multi_chunk_job(
    rig: NetnsRig, jobs: dict[str, dict[str, str]], backend: str
) -> dict[str, str]:
    if backend not in jobs:  # run_job raises on a failed job: a later test runs it again
        jobs[backend] = run_job(rig, backend, 1, sizes=SLOW_SIZES, timeout=150)
    return jobs[backend]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["ucx", "udp"])
def test_one_rank_per_host_multi_chunk(
    rig: NetnsRig, multi_chunk_jobs: dict[str, dict[str, str]], backend: str
) -> None:
    _multi_chunk_job(rig, multi_chunk_jobs, backend)


@pytest.mark.slow
def test_ucx_send_lane_carries_every_collective_across_hosts(
    rig: NetnsRig, multi_chunk_jobs: dict[str, dict[str, str]]
) -> None:
    """send_lane=auto (the default) between hosts over TCP: large sends take the lane (the
    counters say so on both hosts) and every collective still matches numpy and Gloo."""
    out = _multi_chunk_job(rig, multi_chunk_jobs, "ucx")
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
