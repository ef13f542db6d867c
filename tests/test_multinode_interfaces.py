"""Which interface carries the traffic between two hosts of the namespace rig
(tests/multinode_harness.py): ucx without UCX_NET_DEVICES (TCP on the veth only, per
UCX_PROTO_INFO) and with the user's own UCX_TCP_RX_SEG_SIZE; UCXBACKEND_IFNAME selecting the
veth, and naming nothing (ucx and udp: the error lists the host's interfaces)."""

from __future__ import annotations

import re

import pytest
from multinode_harness import (
    BACKENDS,
    check_job,
    needs_rig,
    rig_fixture,  # noqa: F401  (the fixture rig: this file's rig)
    run_job,
    start_job,
    start_jobs,
)
from rig_harness import HostResult, NetnsRig

pytestmark = needs_rig


def test_ucx_without_net_devices_uses_tcp_on_the_veth(rig: NetnsRig) -> None:
    """No UCX_NET_DEVICES: UCX still connects the hosts over TCP on the veth, never lo/sysv."""
    out = run_job(rig, "ucx", 1, net_devices=False, extra_env={"UCX_PROTO_INFO": "y"})
    for host in ("a", "b"):
        text = out[host]
        assert "inter-node" in text, f"host {host}: UCX found no inter-node path"
        lanes = set(re.findall(r"\|\s*(tcp/\S+)", text))
        assert lanes == {f"tcp/{rig.ifname(host)}"}, f"host {host}: tcp lanes {lanes}"  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def ifname_prefix_jobs(rig: NetnsRig) -> dict[str, dict[str, HostResult]]:
    """The job of test_ifname_selects_the_veth, both backends' checks in the same ranks one
    after the other (multinode_harness.start_jobs: one torch import, not one per backend).
    UCX_PROTO_INFO is read by UCX alone, so the udp phase runs as it would without it."""
    a, b = rig.ifname("a"), rig.ifname("b")  # type: ignore[arg-type]
    prefix = a[:-1]  # ucxb<pid>a / ucxb<pid>b
    assert b.startswith(prefix), (a, b)
    extra = {"UCXBACKEND_IFNAME": prefix, "UCXBACKEND_LOG_LEVEL": "INFO", "UCX_PROTO_INFO": "y"}
    return start_jobs(rig, BACKENDS, 1, net_devices=False, extra_env=extra, timeout=150)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ifname_selects_the_veth(
    rig: NetnsRig, ifname_prefix_jobs: dict[str, dict[str, HostResult]], backend: str
) -> None:
    """UCXBACKEND_IFNAME alone (a prefix both veth ends share; no UCX_NET_DEVICES) puts the
    traffic between hosts on the veth: UCX gets UCX_NET_DEVICES from it, udp binds its address."""
    out = check_job(rig, backend, 1, ifname_prefix_jobs[backend])
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
