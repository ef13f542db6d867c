"""``python -m ucxbackend doctor`` against fake sysfs trees built in tmp_path."""

from __future__ import annotations

import io
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from ucxbackend import doctor, mps, rdma_sysfs
from ucxbackend.netif import Interface

LO = Interface("lo", ("127.0.0.1",), 65536, up=True, loopback=True)
ETH0 = Interface("eth0", ("192.168.1.2",), 9000, up=True, loopback=False)
ENS = Interface("ens1f0", ("10.1.0.7",), 1400, up=True, loopback=False)
IFACES = [LO, ETH0, ENS]
ROUTES = {"192.168.1.10": "192.168.1.2", "10.1.0.1": "10.1.0.7"}
UNLIMITED = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)

V4_GID = "0000:0000:0000:0000:0000:ffff:c0a8:0102"  # ::ffff:192.168.1.2
LINK_LOCAL = "fe80:0000:0000:0000:0202:c9ff:fe00:0001"
OTHER_V4 = "0000:0000:0000:0000:0000:ffff:0a01:0007"  # ::ffff:10.1.0.7


@pytest.fixture(autouse=True)
def _no_real_cuda_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    # The fake hosts have no GPU unless a test says so: doctor must not ask this machine's
    # torch (which would also initialise CUDA in the pytest process on a GPU machine).
    monkeypatch.setattr(doctor, "_torch_cuda_available", lambda: False)


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def add_port(
    root: Path,
    dev: str,
    port: int,
    gids: list[tuple[str, str, str]],
    *,
    link_layer: str = "Ethernet",
    state: str = "4: ACTIVE",
) -> None:
    """A port with GID table entries (gid, type, ndev); index = position in the list."""
    pdir = root / "sys/class/infiniband" / dev / "ports" / str(port)
    write(pdir / "link_layer", link_layer)
    write(pdir / "state", state)
    for i, (gid, typ, ndev) in enumerate(gids):
        write(pdir / "gids" / str(i), gid)
        if typ:
            write(pdir / "gid_attrs/types" / str(i), typ)
        if ndev:
            write(pdir / "gid_attrs/ndevs" / str(i), ndev)
    # an unused entry: zeros, no attributes (reads EINVAL on a real system)
    write(pdir / "gids" / str(len(gids)), "0000:0000:0000:0000:0000:0000:0000:0000")


def paths(root: Path) -> doctor.Paths:
    p = doctor.Paths.under(root)
    assert p.nvidia_version == root / "proc/driver/nvidia/version"
    return p


def roce_host(root: Path, *, ucx_ib: bool = True) -> doctor.Inputs:
    """A RoCE host: mlx5_0 port 1 on eth0 with v1/v2 link-local and IPv4-mapped GIDs."""
    add_port(
        root,
        "mlx5_0",
        1,
        [
            (LINK_LOCAL, "IB/RoCE v1", "eth0"),
            (LINK_LOCAL, "RoCE v2", "eth0"),
            (V4_GID, "IB/RoCE v1", "eth0"),
            (V4_GID, "RoCE v2", "eth0"),
        ],
    )
    write(root / "sys/class/net/eth0/mtu", "9000")
    (root / "dev/infiniband").mkdir(parents=True)
    (root / "dev/infiniband/uverbs0").touch()
    write(root / "proc/modules", "mlx5_ib 1 0 - Live 0x0\nib_core 1 0 - Live 0x0")
    moddir = root / "ucx"
    moddir.mkdir()
    (moddir / "libuct_cma.so.0").touch()
    if ucx_ib:
        (moddir / "libuct_ib.so.0").touch()
        (moddir / "libuct_rdmacm.so.0").touch()
    return doctor.Inputs(
        paths=paths(root),
        environ={"MASTER_ADDR": "192.168.1.10"},
        memlock=UNLIMITED,
        ucx_transports=["rc_mlx5", "ud_verbs", "tcp", "self"] if ucx_ib else ["tcp", "self"],
        ucx_module_dir=moddir,
        interfaces=IFACES,
        route_source=ROUTES.__getitem__,
        kernel_release="6.1.0",
    )


def by_name(checks: list[doctor.Check]) -> dict[str, doctor.Check]:
    return {c.name: c for c in checks}


def test_healthy_roce_host(tmp_path: Path) -> None:
    inp = roce_host(tmp_path)
    inp.environ = {"MASTER_ADDR": "192.168.1.10", "UCX_IB_GID_INDEX": "3"}
    checks = by_name(doctor.run_checks(inp))
    assert {c.status for c in checks.values()} == {"ok"}, checks
    assert "eth0 192.168.1.2" in checks["interface"].found
    assert "UCX_NET_DEVICES: eth0,mlx5_0:1" in checks["interface"].found
    assert checks["mtu"].found == "eth0 mtu 9000; eth0 (RoCE mlx5_0:1) mtu 9000"
    gid = checks["roce_gid mlx5_0:1"]
    assert "GID index 3" in gid.found and "192.168.1.2" in gid.found


def test_gid_index_suggested_and_mismatch(tmp_path: Path) -> None:
    inp = roce_host(tmp_path)
    gid = by_name(doctor.run_checks(inp))["roce_gid mlx5_0:1"]
    assert gid.status == "warn" and gid.fix == "export UCX_IB_GID_INDEX=3"
    inp.environ = {"MASTER_ADDR": "192.168.1.10", "UCX_IB_GID_INDEX": "1"}
    gid = by_name(doctor.run_checks(inp))["roce_gid mlx5_0:1"]
    assert gid.status == "warn" and "UCX_IB_GID_INDEX=1" in gid.found
    assert gid.fix == "export UCX_IB_GID_INDEX=3"


def test_gid_follows_the_chosen_netdev(tmp_path: Path) -> None:
    # two netdevs on one port (e.g. a VLAN or macvlan): pick the GID of the chosen one
    add_port(
        tmp_path,
        "rxe0",
        1,
        [
            (LINK_LOCAL, "RoCE v2", "eth0"),
            (V4_GID, "RoCE v2", "eth0"),
            (OTHER_V4, "IB/RoCE v1", "ens1f0"),
            (OTHER_V4, "RoCE v2", "ens1f0"),
        ],
    )
    inp = doctor.Inputs(
        paths=paths(tmp_path),
        environ={"MASTER_ADDR": "10.1.0.1"},
        memlock=UNLIMITED,
        ucx_transports=["rc_verbs"],
        ucx_module_dir=tmp_path,
        interfaces=IFACES,
        route_source=ROUTES.__getitem__,
    )
    (tmp_path / "libuct_ib.so").touch()
    (tmp_path / "libuct_rdmacm.so").touch()
    checks = by_name(doctor.run_checks(inp))
    assert checks["roce_gid rxe0:1"].fix == "export UCX_IB_GID_INDEX=3"
    assert "10.1.0.7" in checks["roce_gid rxe0:1"].found
    # ens1f0's MTU 1400 is flagged
    assert checks["mtu"].status == "warn" and "ens1f0 mtu 1400" in checks["mtu"].found


def test_only_roce_v1_gids_fail(tmp_path: Path) -> None:
    add_port(tmp_path, "mlx5_0", 1, [(LINK_LOCAL, "IB/RoCE v1", "eth0")])
    inp = doctor.Inputs(
        paths=paths(tmp_path),
        environ={"MASTER_ADDR": "192.168.1.10"},
        memlock=UNLIMITED,
        ucx_transports=["rc_verbs"],
        ucx_module_dir=tmp_path,
        interfaces=IFACES,
        route_source=ROUTES.__getitem__,
    )
    check = by_name(doctor.run_checks(inp))["roce_gid mlx5_0:1"]
    assert check.status == "fail" and "IB/RoCE v1" in check.found
    assert "IPv4 address" in (check.fix or "")


def test_ucx_without_verbs_fails_when_rdma_exists(tmp_path: Path) -> None:
    checks = by_name(doctor.run_checks(roce_host(tmp_path, ucx_ib=False)))
    verbs = checks["ucx_verbs"]
    assert verbs.status == "fail" and "libuct_ib no" in verbs.found
    assert "UCX_HOME=/usr" in (verbs.fix or "")


def test_no_rdma_host(tmp_path: Path) -> None:
    inp = doctor.Inputs(
        paths=paths(tmp_path),
        environ={"MASTER_ADDR": "192.168.1.10"},
        memlock=(64 << 10, 64 << 10),
        ucx_transports=["tcp"],
        ucx_module_dir=tmp_path,
        interfaces=IFACES,
        route_source=ROUTES.__getitem__,
    )
    checks = by_name(doctor.run_checks(inp))
    assert checks["ucx_verbs"].status == "ok" and "no RDMA" in checks["ucx_verbs"].found
    assert checks["roce_gid"].status == "ok"
    assert checks["memlock"].status == "ok"  # a small limit only matters with RDMA
    assert checks["gpudirect"].status == "ok"


def test_rdma_cm_alone_is_no_rdma_device(tmp_path: Path) -> None:
    # The GPU machines here: the RDMA core modules loaded (/dev/infiniband/rdma_cm), no NIC.
    (tmp_path / "dev/infiniband").mkdir(parents=True)
    (tmp_path / "dev/infiniband/rdma_cm").touch()
    assert not doctor.rdma_present(paths(tmp_path))
    (tmp_path / "dev/infiniband/uverbs0").touch()
    assert doctor.rdma_present(paths(tmp_path))


@pytest.mark.parametrize(
    ("limit", "status"),
    [((64 << 10, 64 << 10), "fail"), ((1 << 30, 1 << 30), "warn"), (UNLIMITED, "ok")],
)
def test_memlock_with_rdma(tmp_path: Path, limit: tuple[int, int], status: str) -> None:
    inp = roce_host(tmp_path)
    inp.memlock = limit
    check = by_name(doctor.run_checks(inp))["memlock"]
    assert check.status == status
    assert (check.fix is None) == (status == "ok")
    if status == "fail":
        assert "memlock=-1" in (check.fix or "") and "64 KiB" in check.found


def test_gpudirect(tmp_path: Path) -> None:
    inp = roce_host(tmp_path)
    write(
        tmp_path / "proc/driver/nvidia/version",
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54",
    )
    check = by_name(doctor.run_checks(inp))["gpudirect"]
    assert check.status == "warn" and "modprobe nvidia_peermem" in (check.fix or "")
    write(tmp_path / "proc/modules", "nvidia_peermem 1 0 - Live 0x0\nnvidia 1 0 - Live 0x0")
    assert by_name(doctor.run_checks(inp))["gpudirect"].status == "ok"
    write(tmp_path / "proc/modules", "nvidia 1 0 - Live 0x0")
    write(
        tmp_path / "proc/driver/nvidia/version",
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54",
    )
    check = by_name(doctor.run_checks(inp))["gpudirect"]
    assert check.status == "ok" and "dma-buf" in check.found
    inp.kernel_release = "5.4.0"
    assert by_name(doctor.run_checks(inp))["gpudirect"].status == "warn"


def test_mps_line_only_where_a_gpu_is_visible(tmp_path: Path) -> None:
    inp = roce_host(tmp_path)
    pipe_dir = tmp_path / "mps-pipe"
    pipe_dir.mkdir()
    inp.environ = {
        "MASTER_ADDR": "192.168.1.10",
        "UCX_IB_GID_INDEX": "3",
        "CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir),
    }
    assert "mps" not in by_name(doctor.run_checks(inp))  # no GPU: nothing about MPS
    write(tmp_path / "proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX Kernel Module 550")
    write(tmp_path / "proc/modules", "nvidia_peermem 1 0 - Live 0x0\nnvidia 1 0 - Live 0x0")
    check = by_name(doctor.run_checks(inp))["mps"]
    assert check.status == "info" and check.fix is None
    assert f"no MPS server (no control pipe at {pipe_dir}/control)" in check.found
    assert "ranks that share a GPU should run under one" in check.found
    assert "`bench --mps`" in check.found and mps.DOCS in check.found
    # Informational: the rest is ok, and so is the verdict.
    out = io.StringIO()
    assert doctor.main(False, out, inp) == 0
    assert "[INFO] mps" in out.getvalue() and out.getvalue().rstrip().endswith("doctor: ok")
    os.mkfifo(pipe_dir / "control")
    check = by_name(doctor.run_checks(inp))["mps"]
    assert check.status == "info"
    assert f"an MPS server appears to run (its control pipe {pipe_dir}/control exists)" in (
        check.found
    )
    # Without the driver's files, the inputs' cuda_available decides (torch is not asked).
    bare = doctor.Inputs(paths=paths(tmp_path / "bare"), environ={}, cuda_available=True)
    assert "/tmp/nvidia-mps/control" in by_name(doctor.run_checks(bare))["mps"].found
    bare.cuda_available = False
    assert "mps" not in by_name(doctor.run_checks(bare))


def _no_torch(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Replaces the torch.cuda.is_available() probe; returns the list its calls go to."""
    calls: list[int] = []

    def probe() -> bool:
        calls.append(1)
        return True

    monkeypatch.setattr(doctor, "_torch_cuda_available", probe)
    return calls


def test_gpudirect_applies_only_with_a_gpu_and_rdma(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch_asked = _no_torch(monkeypatch)
    # Neither a GPU nor RDMA: not applicable, and torch is not even asked.
    bare = doctor.Inputs(
        paths=paths(tmp_path / "bare"),
        environ={"MASTER_ADDR": "192.168.1.10"},
        memlock=UNLIMITED,
        ucx_transports=["tcp"],
        ucx_module_dir=tmp_path,
        interfaces=IFACES,
        route_source=ROUTES.__getitem__,
        kernel_release="6.1.0",
    )
    check = by_name(doctor.run_checks(bare))["gpudirect"]
    assert check.status == "ok" and check.found.startswith("not applicable: no RDMA devices")
    assert "no NVIDIA GPU" in check.found and torch_asked == []
    # A GPU (the driver's directory) but no RDMA: still not applicable.
    (tmp_path / "bare/proc/driver/nvidia").mkdir(parents=True)
    check = by_name(doctor.run_checks(bare))["gpudirect"]
    assert check.status == "ok" and check.found.startswith("not applicable: no RDMA devices")
    assert "/proc/driver/nvidia" in check.found and check.fix is None

    # RDMA but no GPU: not applicable.
    inp = roce_host(tmp_path / "roce")
    inp.cuda_available = False
    check = by_name(doctor.run_checks(inp))["gpudirect"]
    assert check.status == "ok"
    assert check.found.startswith("not applicable: RDMA devices but no NVIDIA GPU")
    # RDMA and a GPU that only torch sees (no driver files in this tree): applies.
    inp.cuda_available = True
    check = by_name(doctor.run_checks(inp))["gpudirect"]
    assert check.status == "warn" and "torch.cuda.is_available()" in check.found
    assert check.found.startswith("not possible") and "nvidia_peermem" in check.found
    assert "modprobe nvidia_peermem" in (check.fix or "")
    # nvidia_peermem in /sys/module (also where /proc/modules does not list it): possible.
    (tmp_path / "roce/sys/module/nvidia_peermem").mkdir(parents=True)
    check = by_name(doctor.run_checks(inp))["gpudirect"]
    assert check.status == "ok" and check.found.startswith("possible")
    assert "nvidia_peermem loaded" in check.found and check.fix is None
    # Left to itself (cuda_available None, no driver files), it asks torch.
    (tmp_path / "roce/sys/module/nvidia_peermem").rmdir()
    inp.cuda_available = None
    check = by_name(doctor.run_checks(inp))["gpudirect"]
    assert torch_asked and check.status == "warn"


def test_gpudirect_facts(tmp_path: Path) -> None:
    p = paths(tmp_path)
    write(tmp_path / "proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX Open Kernel Module")
    facts = doctor.gpudirect_facts(p, rdma=True, kernel="6.8.0")
    assert facts.applicable and facts.dmabuf and facts.possible and not facts.peermem
    assert "dma-buf" in facts.describe()
    old = doctor.gpudirect_facts(p, rdma=True, kernel="5.10.0")
    assert old.applicable and not old.dmabuf and not old.possible
    assert "have 5.10.0" in old.describe()
    no_rdma = doctor.gpudirect_facts(p, rdma=False, kernel="6.8.0")
    assert not no_rdma.applicable and not no_rdma.possible
    assert doctor.rdma_present(p) is False
    (tmp_path / "dev/infiniband").mkdir(parents=True)
    (tmp_path / "dev/infiniband/uverbs0").touch()
    assert doctor.rdma_present(p) is True


def test_bad_ifname_fails_with_the_interface_list(tmp_path: Path) -> None:
    inp = roce_host(tmp_path)
    inp.environ = {"MASTER_ADDR": "192.168.1.10", "UCXBACKEND_IFNAME": "bond"}
    check = by_name(doctor.run_checks(inp))["interface"]
    assert check.status == "fail" and "eth0 (192.168.1.2" in check.found
    assert "UCXBACKEND_IFNAME" in (check.fix or "")
    out = io.StringIO()
    assert doctor.main(True, out, inp) == 1
    data = json.loads(out.getvalue())
    assert data["ok"] is False
    assert {"name", "status", "found", "fix"} <= set(data["checks"][0])


def test_text_report_and_exit_status(tmp_path: Path) -> None:
    inp = roce_host(tmp_path)
    out = io.StringIO()
    assert doctor.main(False, out, inp) == 0  # warnings only
    text = out.getvalue()
    assert "[WARN] roce_gid mlx5_0:1" in text and "fix: export UCX_IB_GID_INDEX=3" in text
    assert text.rstrip().endswith("doctor: warn")


def test_rdma_sysfs_parsing(tmp_path: Path) -> None:
    roce_host(tmp_path)
    (port,) = rdma_sysfs.read_ports(tmp_path / "sys/class/infiniband")
    assert port.ucx_name == "mlx5_0:1" and port.is_roce and port.active
    assert port.netdevs == ("eth0",)
    assert [g.index for g in port.gids] == [0, 1, 2, 3]  # the zero GID is skipped
    assert [g.roce_v2 for g in port.gids] == [False, True, False, True]
    assert port.gids[3].ipv4 == "192.168.1.2" and port.gids[1].ipv4 is None
    assert rdma_sysfs.gid_ipv4("garbage") is None


def test_cli_doctor_runs_on_this_machine() -> None:
    # Loopback rendezvous only: nothing leaves this host.
    env = {"MASTER_ADDR": "127.0.0.1", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-m", "ucxbackend", "doctor", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "PYTHONPATH": str(Path(__file__).parent.parent)},
    )
    assert proc.returncode in (0, 1), proc.stderr
    data = json.loads(proc.stdout)
    names = [c["name"] for c in data["checks"]]
    assert names[:3] == ["interface", "mtu", "ucx_verbs"] and "memlock" in names
    assert data["ok"] == (proc.returncode == 0)
