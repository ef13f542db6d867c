"""ucx's one-host guess (transports/ucx/ucx_context.h, csrc/launcher_hosts.hpp): a group whose
ranks share this host makes its UCP worker without TCP, which only a peer on another host
needs; the user's UCX_TLS and a launcher that says the job spans hosts keep TCP in. What the
worker may use is read back from UCX itself (ucp_context_print_info, through
ucxbackend.startup_profile). A group that guessed wrong is covered on the namespace rig
(tests/test_multinode_collectives.py::test_spanning_group_without_launcher_hint)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from conftest import skip_unless_ucx
from dist_harness import run_world

import ucxbackend

pytestmark = pytest.mark.skipif(
    not ucxbackend.is_available(), reason="ucxbackend's native module is not built"
)


def _reach(rank: int, ws: int) -> dict[str, Any]:
    """This rank's profile of the world's creation and an all_reduce checked against numpy
    (int64, bit-exact)."""
    profile = ucxbackend.startup_profile()
    inputs = [np.arange(1000, dtype=np.int64) * (r + 3) - r for r in range(ws)]
    got = torch.from_numpy(inputs[rank].copy())
    dist.all_reduce(got)
    np.testing.assert_array_equal(got.numpy(), np.sum(inputs, axis=0))
    return {"transports": profile["transports"], "phases": list(profile["phases"])}


def _no_launcher() -> dict[str, str]:
    # LOCAL_WORLD_SIZE and the like from a launcher that ran pytest must not decide the test.
    return {"LOCAL_WORLD_SIZE": "", "OMPI_COMM_WORLD_LOCAL_SIZE": ""}


def test_one_host_group_leaves_tcp_out() -> None:
    """3 ranks on this host, no launcher: no tcp, shared memory kept, one exchange round."""
    skip_unless_ucx("the guess is ucx's")
    for r in run_world(_reach, 3, init="tcp", env=_no_launcher(), timeout=90):
        assert "tcp" not in r["transports"], r
        assert {"posix", "sysv"} <= set(r["transports"]), r
        assert "any_host" not in r["phases"], r


def test_launcher_spanning_hosts_keeps_tcp() -> None:
    """torchrun's LOCAL_WORLD_SIZE below WORLD_SIZE says the job spans hosts: TCP stays in
    from the start (no second round), though these ranks happen to share a host."""
    skip_unless_ucx("the guess is ucx's")
    env = {**_no_launcher(), "LOCAL_WORLD_SIZE": "1", "WORLD_SIZE": "2"}
    for r in run_world(_reach, 2, init="tcp", env=env, timeout=90):
        assert "tcp" in r["transports"], r
        assert "any_host" not in r["phases"], r


def test_user_tls_wins_over_the_guess() -> None:
    """A UCX_TLS of the user's that names TCP is kept on one host (ranks spawned: UCX reads
    its variables at import)."""
    skip_unless_ucx("the guess is ucx's")
    env = {**_no_launcher(), "UCX_TLS": "^cma"}
    for r in run_world(_reach, 2, init="tcp", env=env, timeout=120):
        assert "tcp" in r["transports"] and "cma" not in r["transports"], r
