"""The Docker rig (docker/) without a Docker engine: the files parse and agree with each other,
and the entrypoint runs on two "hosts" of the namespace rig with the in-tree build.

What this cannot show (no Docker engine here): that the image builds and that compose starts
the containers; see README, Multi-node.
"""

from __future__ import annotations

import ipaddress
import math
import re
from typing import Any

import pytest
from dist_harness import free_port
from rig_harness import REPO, NetnsRig, available, run_on_hosts

DOCKER = REPO / "docker"
yaml = pytest.importorskip("yaml", reason="PyYAML not installed: compose files not parsed")

_VAR = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}")


def interpolate(value: Any, env: dict[str, str] | None = None) -> Any:
    """Resolve ``${VAR:-default}`` as compose does (``env`` first, then the default)."""
    env = env or {}
    if isinstance(value, str):
        return _VAR.sub(lambda m: env.get(m.group(1), m.group(2) or ""), value)
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    return value


def load(name: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    data = yaml.safe_load((DOCKER / name).read_text())
    assert isinstance(data, dict) and "services" in data, f"{name}: no services"
    return interpolate(data, env)


def merge(base: Any, over: Any) -> Any:
    """Compose's merge of an override file: mappings merge key by key, the rest is replaced."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            out[k] = merge(base[k], v) if k in base else v
        return out
    return over


def check_nodes(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert sorted(services) == ["node0", "node1"]
    envs = {name: svc["environment"] for name, svc in services.items()}
    addrs = {name: svc["networks"]["ucxnet"]["ipv4_address"] for name, svc in services.items()}
    subnet = ipaddress.ip_network(compose["networks"]["ucxnet"]["ipam"]["config"][0]["subnet"])
    assert len(set(addrs.values())) == 2, addrs
    for name, addr in addrs.items():
        assert ipaddress.ip_address(addr) in subnet, f"{name}: {addr} not in {subnet}"
    # every node agrees on the job and on where node 0 is
    shared = ("NNODES", "MASTER_ADDR", "MASTER_PORT", "BACKEND", "UCX_TLS", "UCX_NET_DEVICES")
    for key in shared:
        assert len({str(e.get(key)) for e in envs.values()}) == 1, f"{key} differs: {envs}"
    env0 = envs["node0"]
    assert int(env0["NNODES"]) == len(services)
    assert env0["MASTER_ADDR"] == addrs["node0"]
    assert 0 < int(env0["MASTER_PORT"]) < 65536
    assert sorted(int(e["NODE_RANK"]) for e in envs.values()) == list(range(len(services)))
    assert services["node0"]["image"] == services["node1"]["image"]


def test_compose_nodes_agree() -> None:
    compose = load("compose.yaml")
    check_nodes(compose)
    env = compose["services"]["node0"]["environment"]
    assert env["UCX_TLS"].split(",")[0] == "tcp" and env["GLOO_SOCKET_IFNAME"] == "eth0"
    assert compose["networks"]["ucxnet"]["driver"] == "bridge"


def test_compose_variables_move_every_address_together() -> None:
    env = {"NODE0_ADDR": "10.5.0.2", "NODE1_ADDR": "10.5.0.3", "SUBNET": "10.5.0.0/24"}
    compose = load("compose.yaml", env)
    check_nodes(compose)
    assert compose["services"]["node0"]["environment"]["MASTER_ADDR"] == "10.5.0.2"


def test_roce_overlay() -> None:
    compose = merge(load("compose.yaml"), load("compose.roce.yaml"))
    check_nodes(compose)
    assert compose["networks"]["ucxnet"]["driver"] == "macvlan"
    assert compose["networks"]["ucxnet"]["driver_opts"]["parent"]
    for name, svc in compose["services"].items():
        assert "/dev/infiniband:/dev/infiniband" in svc["devices"], name
        assert "IPC_LOCK" in svc["cap_add"], name
        assert svc["ulimits"]["memlock"] == {"soft": -1, "hard": -1}, name
        env = svc["environment"]
        assert re.fullmatch(r"\w+:\d+", env["UCX_NET_DEVICES"]), env["UCX_NET_DEVICES"]
        assert env["UCX_IB_GID_INDEX"].isdigit()
        assert "rc" in env["UCX_TLS"].split(",")
        assert env["NODE_RANK"] in {"0", "1"}  # kept from the base file


def test_dockerfile_builds_against_system_ucx() -> None:
    text = (DOCKER / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim-bookworm", text, re.M)
    for pkg in ("rdma-core", "libucx-dev", "ibverbs-utils"):
        assert pkg in text
    assert re.search(r"UCX_HOME=/usr\b.*pip install[^\n]*--no-build-isolation", text)
    assert "download.pytorch.org/whl/cpu" in text
    entry = re.search(r'^ENTRYPOINT \["([^"]+)"\]', text, re.M)
    assert entry and entry.group(1) == "/opt/ucxbackend/docker/entrypoint.sh"
    assert (DOCKER / "entrypoint.sh").stat().st_mode & 0o111, "entrypoint.sh not executable"


def test_soft_roce_recipe_is_there() -> None:
    text = (DOCKER / "rxe.md").read_text()
    assert "rdma link add rxe0 type rxe netdev" in text and "UCX_IB_GID_INDEX" in text


_OK, _WHY = available()


def _result(out: str) -> dict[str, str]:
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert lines, "no RESULT line:\n" + out[-3000:]
    return dict(kv.split("=", 1) for kv in lines[-1].split()[1:])


@pytest.mark.skipif(not _OK, reason=f"namespace rig unavailable: {_WHY}")
def test_entrypoint_runs_across_the_namespace_rig() -> None:
    """docker/entrypoint.sh on two rig hosts (the in-tree build, not an image): ucx then gloo,
    with the environment compose.yaml gives, and the two trained models compared."""
    compose = load("compose.yaml")
    results = {}
    with NetnsRig.create() as rig:
        for backend in ("ucx", "gloo"):
            port = str(free_port())
            env = {}
            for rank, host in enumerate(("a", "b")):
                e = {
                    str(k): str(v)
                    for k, v in compose["services"][f"node{rank}"]["environment"].items()
                }
                iface = rig.ifname(host)  # type: ignore[arg-type]
                e.update(
                    MASTER_ADDR=rig.addr_a,
                    MASTER_PORT=port,
                    BACKEND=backend,
                    APP_DIR=str(REPO),
                    UCX_NET_DEVICES=iface,
                    UCXBACKEND_IFNAME=iface,
                    GLOO_SOCKET_IFNAME=iface,
                    UCXBACKEND_LOG_LEVEL="WARNING",
                )
                env[host] = e
            argv = ["bash", str(DOCKER / "entrypoint.sh")]
            out = run_on_hosts(rig, {"a": argv, "b": argv}, env=env, timeout=90)
            for host, res in out.items():
                assert res.rc == 0, f"{backend} host {host}: exit {res.rc}\n{res.output[-3000:]}"
            assert "[OK  ] interface" in out["a"].output, out["a"].output[-2000:]
            results[backend] = _result(out["a"].output)
    ucx, gloo = results["ucx"], results["gloo"]
    assert ucx["world_size"] == gloo["world_size"] == "2" and ucx["in_sync"] == "1"
    for key in ("final_loss", "param_checksum"):
        assert math.isclose(float(ucx[key]), float(gloo[key]), rel_tol=1e-6), (key, ucx, gloo)
