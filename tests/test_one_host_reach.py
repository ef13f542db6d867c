"""ucx's one-host guess (transports/ucx/ucx_context.h, csrc/launcher_hosts.hpp): a group whose
ranks share this host makes its UCP worker without TCP, which only a peer on another host
needs, and without posix, whose interface UCX set up but never used; the user's UCX_TLS and a
launcher that says the job spans hosts keep TCP in. What the worker may use is read back from
UCX itself (ucp_context_print_info, through ucxbackend.startup_profile). A group that guessed
wrong is covered on the namespace rig
(tests/test_multinode_collectives.py::test_spanning_group_without_launcher_hint)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from conftest import skip_unless_ucx
from dist_harness import error_of, run_world

import ucxbackend

REPO = Path(__file__).resolve().parent.parent

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


# For the checks of the UCP context a one-host group makes: over UCX whatever the environment
# asks (with one_host_transport=shm such a group has no UCP context; the second round, which
# any first transport may need, is checked with whichever the environment picks).
UCX_ONE_HOST = {"UCXBACKEND_ONE_HOST_TRANSPORT": "ucx"}


def test_one_host_group_leaves_tcp_out() -> None:
    """3 ranks on this host, no launcher: no tcp, shared memory kept (sysv, the transport UCX
    puts same-host peers on; posix, which it never used, left out too), one exchange round."""
    skip_unless_ucx("the guess is ucx's")
    if os.environ.get("UCX_TLS"):
        pytest.skip("UCX_TLS is set here, and a user's UCX_TLS always wins over the guess")
    for r in run_world(_reach, 3, init="tcp", env={**_no_launcher(), **UCX_ONE_HOST}, timeout=90):
        assert "tcp" not in r["transports"], r
        assert "sysv" in r["transports"] and "posix" not in r["transports"], r
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
    env = {**_no_launcher(), **UCX_ONE_HOST, "UCX_TLS": "^cma"}
    for r in run_world(_reach, 2, init="tcp", env=env, timeout=120):
        assert "tcp" in r["transports"] and "cma" not in r["transports"], r


_WITHOUT_BOOT_ID = """
import json, sys
sys.path.insert(0, "tests")
import test_one_host_reach as t
import dist_harness
from dist_harness import error_of, run_world
# What _reach's ranks use: the rest of PRELOAD (torch._dynamo, FSDP) would cost this fresh
# interpreter's fork server 2-3 s of CPU for nothing.
dist_harness.PRELOAD = ("torch", "ucxbackend")
print(json.dumps(run_world(t._reach, 2, init="tcp", env=t._no_launcher(), timeout=90)))
"""


def test_no_guess_without_a_boot_id() -> None:
    """Without a readable boot id the host identity is namespace numbers alone, which two
    machines can share (shm::hostIdentityIsUnique): the group must not guess one host, so TCP
    stays in. The boot id is hidden by a bind mount in a private mount namespace."""
    skip_unless_ucx("the guess is ucx's")
    if os.environ.get("UCX_TLS"):
        pytest.skip("UCX_TLS is set here, and a user's UCX_TLS always wins over the guess")
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare(1) to hide the boot id in a mount namespace")
    hide = "mount --bind /dev/null /proc/sys/kernel/random/boot_id"
    cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
           f'{hide} && exec "$0" -c "$1"', sys.executable, _WITHOUT_BOOT_ID]  # fmt: skip
    try:
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=150)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the world without a boot id did not finish in 150 s: {exc}")
    if done.returncode != 0 and "mount" in done.stderr and "ucx" not in done.stderr:
        pytest.skip(f"cannot hide the boot id here: {done.stderr.strip()[:200]}")
    assert done.returncode == 0, done.stderr[-2000:]
    for r in json.loads(done.stdout.strip().splitlines()[-1]):
        assert "tcp" in r["transports"], r
        assert "any_host" not in r["phases"], r


def _second_round(rank: int, ws: int) -> dict[str, Any]:
    """Groups that take the any_host round (UCXBACKEND_TEST_ANY_HOST, docs/testing.md): one
    where it works, then one where rank 1's second-round transport cannot be made, then one
    without the hook. What each did on this rank."""
    out: dict[str, Any] = {}
    os.environ["UCXBACKEND_TEST_ANY_HOST"] = "round"
    group = dist.new_group(list(range(ws)))
    out["round_phases"] = list(ucxbackend.startup_profile(group)["phases"])
    out["round_sum_ok"] = _sum_ok(rank, ws, group)
    os.environ["UCXBACKEND_TEST_ANY_HOST"] = "fail" if rank == 1 else "round"
    start = time.monotonic()
    out["fail_error"] = error_of(lambda: dist.new_group(list(range(ws))))
    out["fail_s"] = time.monotonic() - start
    del os.environ["UCXBACKEND_TEST_ANY_HOST"]
    out["after_sum_ok"] = _sum_ok(rank, ws, dist.new_group(list(range(ws))))
    return out


def _sum_ok(rank: int, ws: int, group: dist.ProcessGroup) -> bool:
    inputs = [np.arange(300, dtype=np.int64) * (r + 5) - r for r in range(ws)]
    got = torch.from_numpy(inputs[rank].copy())
    dist.all_reduce(got, group=group)
    return bool(np.array_equal(got.numpy(), np.sum(inputs, axis=0)))


# The Store's timeout: what the ranks waited for a failed rank's second-round record before
# it published its failure there. The failure must come well within it.
_STORE_TIMEOUT_S = 60.0


def test_a_failed_second_round_fails_every_rank_at_once() -> None:
    """A rank whose transport cannot be made in the second exchange round (the any_host
    phase) publishes why in its record: the other ranks fail at once naming it and the
    reason, not after the Store's timeout; the failed rank names its own reason; and the next
    group is created on every rank."""
    skip_unless_ucx("the second round is ucx's")
    results = run_world(_second_round, 3, init="tcp", env=_no_launcher(),
                        pg_timeout=_STORE_TIMEOUT_S, timeout=_STORE_TIMEOUT_S + 90)
    for rank, r in enumerate(results):
        assert "any_host" in r["round_phases"], (rank, r)
        assert r["round_sum_ok"] and r["after_sum_ok"], (rank, r)
        assert r["fail_s"] < _STORE_TIMEOUT_S / 3, (rank, r)
        assert r["fail_error"].startswith("DistBackendError: ucx: setting up group"), (rank, r)
        assert "UCXBACKEND_TEST_ANY_HOST=fail" in r["fail_error"], (rank, r)
        if rank != 1:
            assert "rank 1 could not make its ucx transport" in r["fail_error"], (rank, r)
