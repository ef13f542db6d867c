"""Multipath spraying over real sockets (udp_config ``paths``, ``path_policy``): two ranks on
127.0.0.1, each with one socket per path, one path losing 10% (its own fault section,
``UCXBACKEND_UDP_FAULTS="...;drop=0.1"``), Ethernet-sized datagrams (loopback's 64 KiB ones
would make too few packets for a path to lose any). all_reduce results are compared with numpy, and
the per-path statistics must show every path in use and the losses on the lossy one.
The policies' behaviour in detail (shares, retransmission paths, the fault matrix) is checked
in the simulator: tests/cpp/udp_endpoint_test.cpp multipath_*."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from dist_harness import run_world

import ucxbackend

pytestmark = pytest.mark.skipif(
    not ucxbackend.is_available(), reason=f"native extension not loaded: {ucxbackend.load_error()}"
)

SIZES = (1, 5000, 300_000)  # one datagram, several, a rendezvous message


def _input(rank: int, n: int) -> np.ndarray:
    return np.random.default_rng(1000 * rank + n).integers(-(2**40), 2**40, n, dtype=np.int64)


def _all_reduce_against_numpy(rank: int, ws: int) -> dict[str, Any]:
    bad = []
    for n in SIZES:
        x = torch.from_numpy(_input(rank, n))
        dist.all_reduce(x)
        want = sum(_input(r, n) for r in range(ws))
        if not np.array_equal(x.numpy(), want):
            bad.append(f"rank {rank}: all_reduce of {n} int64 differs from numpy")
    dist.barrier()
    s = ucxbackend.stats()
    return {"bad": bad, "total": s["total"], "transport": s["transport"]}


@pytest.mark.parametrize(("paths", "policy"), [(2, "spray"), (4, "adaptive")])
def test_two_ranks_spray_over_paths_one_lossy(paths: int, policy: str) -> None:
    env = {
        "UCXBACKEND_UDP_CONFIG": f"paths={paths},path_policy={policy},mtu_payload=1472",
        "UCXBACKEND_UDP_FAULTS": "seed=5;drop=0.1",
    }
    res = run_world(_all_reduce_against_numpy, 2, backend="udp", env=env, timeout=120,
                    pg_timeout=60)
    for r in res:
        assert r["bad"] == [], r["bad"]
        assert r["transport"]["paths"] == paths
        assert r["transport"]["faults_path0_dropped"] == 0
        for p in range(paths):
            assert r["total"][f"path{p}_sent"] > 0, (p, r["total"])
            assert r["total"][f"path{p}_rtt_us"] > 0, (p, r["total"])
    assert sum(r["transport"]["faults_path1_dropped"] for r in res) > 0
    # The injected losses are found on the lossy path. (Not "only there": a retransmission
    # timeout on a loaded host declares every path's packets in flight lost, spuriously.)
    assert sum(r["total"]["path1_lost"] for r in res) > 0
