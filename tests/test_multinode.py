"""Two hosts for real: torchrun --nnodes 2 across the namespace rig (scripts/netns_rig.py).

One torchrun per host (``ip netns exec``, own IPC/UTS namespaces), static rendezvous on host
a's veth address and a port picked at run time; each rank runs every collective on the backend
under test and on Gloo with the same inputs (tests/multinode_worker.py) and checks both against
a local reference. Traffic stays on the rig's veth pair.

Skipped, with the reason, where namespaces cannot be created (not root, no iproute2/unshare).
The module's rig is created after removing rigs left by killed earlier runs (``fresh_rig``).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from dist_harness import free_port
from rig_harness import HostResult, NetnsRig, available, fresh_rig, run_on_hosts

_OK, _WHY = available()
pytestmark = pytest.mark.skipif(not _OK, reason=f"namespace rig unavailable: {_WHY}")

QUICK_SIZES = "1,1000,300000"
SLOW_SIZES = "1,1000,300000,1500000"  # 6 MB: more than one 4 MiB chunk


@pytest.fixture(scope="module")
def rig() -> Iterator[NetnsRig]:
    with fresh_rig() as r:
        yield r


def _torchrun(rig: NetnsRig, node_rank: int, nproc: int, port: int, args: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "2",
        "--node-rank",
        str(node_rank),
        "--nproc-per-node",
        str(nproc),
        "--master-addr",
        rig.addr_a,
        "--master-port",
        str(port),
        "--max-restarts",
        "0",
        *args,
    ]


def start_job(
    rig: NetnsRig,
    backend: str,
    nproc: int,
    *,
    sizes: str = QUICK_SIZES,
    net_devices: bool = True,
    extra_env: dict[str, str] | None = None,
    timeout: float = 90.0,
) -> dict[str, HostResult]:
    """Run the worker on both hosts; return each host's exit status and output."""
    # The namespaces are fresh, so a port free here is free on host a too.
    port = free_port()
    worker = [
        "tests/multinode_worker.py",
        "--backend",
        backend,
        "--sizes",
        sizes,
        "--timeout",
        "60",
    ]
    env = {}
    for host in ("a", "b"):
        e = {"GLOO_SOCKET_IFNAME": rig.ifname(host), **(extra_env or {})}  # type: ignore[arg-type]
        if net_devices:
            e["UCX_NET_DEVICES"] = rig.ifname(host)  # type: ignore[arg-type]
        env[host] = e
    return run_on_hosts(
        rig,
        {"a": _torchrun(rig, 0, nproc, port, worker), "b": _torchrun(rig, 1, nproc, port, worker)},
        env=env,
        timeout=timeout,
    )


def run_job(rig: NetnsRig, backend: str, nproc: int, **job: Any) -> dict[str, str]:
    """start_job (same keywords), then assert every rank reported OK; return the outputs."""
    return check_job(rig, backend, nproc, start_job(rig, backend, nproc, **job))


def check_job(
    rig: NetnsRig, backend: str, nproc: int, results: dict[str, HostResult]
) -> dict[str, str]:
    """Assert that every host exited 0 and every rank reported OK; return the outputs."""
    outputs = {h: r.output for h, r in results.items()}
    problems = [
        f"host {h}: exit {r.rc}" + (" (killed at the deadline)" if r.rc is None else "")
        for h, r in results.items()
        if r.rc != 0
    ]
    world = 2 * nproc
    ranks = sorted(
        int(m)
        for out in outputs.values()
        for m in re.findall(r"MULTINODE_OK rank=(\d+) world=" + str(world), out)
    )
    if ranks != list(range(world)):
        problems.append(f"ranks reporting OK: {ranks}, expected 0..{world - 1}")
    if problems:
        tails = "\n".join(f"--- host {h} ---\n{out[-4000:]}" for h, out in outputs.items())
        raise AssertionError("; ".join(problems) + "\n" + tails)
    for host, out in outputs.items():
        hostname = rig.ns(host)  # type: ignore[arg-type]
        assert f"host={hostname}" in out, f"ranks of host {host} did not run in {hostname}"
        # A world spanning both hosts never stages through shared memory; a ucx group of the
        # ranks on one host does (udp never does).
        assert out.count("staged=False host_group") == nproc, out[-2000:]
        host_staged = "True" if backend == "ucx" and nproc > 1 else "False" if nproc > 1 else "None"
        assert out.count(f"host_group_staged={host_staged}") == nproc, out[-2000:]
    return outputs


@pytest.mark.parametrize("backend", ["ucx", "udp"])
def test_one_rank_per_host(rig: NetnsRig, backend: str) -> None:
    run_job(rig, backend, 1)


def test_ucx_without_net_devices_uses_tcp_on_the_veth(rig: NetnsRig) -> None:
    """No UCX_NET_DEVICES: UCX still connects the hosts over TCP on the veth, never lo/sysv."""
    out = run_job(rig, "ucx", 1, net_devices=False, extra_env={"UCX_PROTO_INFO": "y"})
    for host in ("a", "b"):
        text = out[host]
        assert "inter-node" in text, f"host {host}: UCX found no inter-node path"
        lanes = set(re.findall(r"\|\s*(tcp/\S+)", text))
        assert lanes == {f"tcp/{rig.ifname(host)}"}, f"host {host}: tcp lanes {lanes}"  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", ["ucx", "udp"])
def test_ifname_selects_the_veth(rig: NetnsRig, backend: str) -> None:
    """UCXBACKEND_IFNAME alone (a prefix both veth ends share; no UCX_NET_DEVICES) puts the
    traffic between hosts on the veth: UCX gets UCX_NET_DEVICES from it, udp binds its address."""
    a, b = rig.ifname("a"), rig.ifname("b")  # type: ignore[arg-type]
    prefix = a[:-1]  # ucxb<pid>a / ucxb<pid>b
    assert b.startswith(prefix), (a, b)
    extra = {"UCXBACKEND_IFNAME": prefix, "UCXBACKEND_LOG_LEVEL": "INFO"}
    if backend == "ucx":
        extra["UCX_PROTO_INFO"] = "y"
    out = run_job(rig, backend, 1, net_devices=False, extra_env=extra)
    for host in ("a", "b"):
        name = rig.ifname(host)  # type: ignore[arg-type]
        assert f"network interface {name}" in out[host], out[host][-2000:]
        if backend == "ucx":
            assert f"UCX_NET_DEVICES={name}" in out[host], out[host][-2000:]
            lanes = set(re.findall(r"\|\s*(tcp/\S+)", out[host]))
            assert lanes == {f"tcp/{name}"}, f"host {host}: tcp lanes {lanes}"


def test_ucx_keeps_the_users_tcp_segment_size(rig: NetnsRig) -> None:
    """The backend sets both TCP segment sizes to 512k unless the user sets one: forcing TX to
    512k next to a user's RX of 64k would make UCX refuse to open the interface."""
    run_job(rig, "ucx", 1, extra_env={"UCX_TCP_RX_SEG_SIZE": "64k"})


@pytest.mark.parametrize("backend", ["ucx", "udp"])
def test_ifname_naming_nothing_is_a_clear_error(rig: NetnsRig, backend: str) -> None:
    """A name that matches no interface fails group creation on every host, and the error
    lists the interfaces that host has (its veth end and lo, with their addresses)."""
    results = start_job(
        rig, backend, 1, net_devices=False, extra_env={"UCXBACKEND_IFNAME": "nosuchif"}, timeout=60
    )
    for host, res in results.items():
        name, addr = rig.ifname(host), rig.addr(host)  # type: ignore[arg-type]
        assert res.rc not in (0, None), f"host {host}: exit {res.rc}\n{res.output[-3000:]}"
        assert "MULTINODE_OK" not in res.output
        errors = [
            line
            for line in res.output.splitlines()
            if "ValueError" in line and "UCXBACKEND_IFNAME='nosuchif' matches no usable" in line
        ]
        assert errors, f"host {host}: no interface error\n{res.output[-3000:]}"
        listed = errors[0].split("interfaces here:", 1)[-1]
        assert f"{name} ({addr};" in listed, (host, listed)
        assert "lo (127.0.0.1;" in listed, (host, listed)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["ucx", "udp"])
def test_two_ranks_per_host(rig: NetnsRig, backend: str) -> None:
    out = run_job(
        rig,
        backend,
        2,
        sizes=SLOW_SIZES,
        timeout=150,
        extra_env={"UCX_PROTO_INFO": "y"} if backend == "ucx" else None,
    )
    if backend == "ucx":
        # shared memory within a host, TCP on the veth across hosts
        for host in ("a", "b"):
            assert re.search(r"\|\s*(sysv|posix)/memory", out[host]), f"host {host}: no shm"
            assert f"tcp/{rig.ifname(host)}" in out[host], f"host {host}: no tcp lane"  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["ucx", "udp"])
def test_one_rank_per_host_multi_chunk(rig: NetnsRig, backend: str) -> None:
    run_job(rig, backend, 1, sizes=SLOW_SIZES, timeout=120)


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


def test_worker_detects_wrong_results(rig: NetnsRig) -> None:
    """The checks can fail: with the corrupting hook every comparison, of every kind, must
    reject a corrupted copy of its result, and the worker must not report OK."""
    results = start_job(rig, "ucx", 1, extra_env={"MULTINODE_CORRUPT": "1"}, timeout=60)
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


def _lane_messages(out: str) -> list[str]:
    return re.findall(r"MULTINODE_OK .* send_lane_messages=(\S+)", out)


@pytest.mark.slow
def test_ucx_send_lane_carries_every_collective_across_hosts(rig: NetnsRig) -> None:
    """send_lane=auto (the default) between hosts over TCP: large sends take the lane (the
    counters say so on both hosts) and every collective still matches numpy and Gloo."""
    out = run_job(rig, "ucx", 1, sizes=SLOW_SIZES, timeout=150)
    for host in ("a", "b"):
        counts = _lane_messages(out[host])
        assert len(counts) == 1 and counts[0] != "none" and int(counts[0]) > 0, (host, counts)


def test_ucx_send_lane_off_across_hosts(rig: NetnsRig) -> None:
    """send_lane=off: no lane between hosts either (the forced-off half of the knob)."""
    out = run_job(rig, "ucx", 1, extra_env={"UCXBACKEND_SEND_LANE": "off"})
    for host in ("a", "b"):
        assert _lane_messages(out[host]) == ["none"], (host, _lane_messages(out[host]))
