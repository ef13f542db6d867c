"""Read RDMA (InfiniBand / RoCE) ports and their GID tables from sysfs.

Layout read (every root is injectable, so tests build fake trees)::

    <infiniband>/<dev>/ports/<port>/link_layer          "Ethernet" (RoCE) or "InfiniBand"
    <infiniband>/<dev>/ports/<port>/state               "4: ACTIVE"
    <infiniband>/<dev>/ports/<port>/gids/<i>            "fe80:0000:...", all zeros when unused
    <infiniband>/<dev>/ports/<port>/gid_attrs/types/<i> "RoCE v2" or "IB/RoCE v1"
    <infiniband>/<dev>/ports/<port>/gid_attrs/ndevs/<i> the netdev behind a RoCE GID ("eth0")
    <infiniband>/<dev>/device/net/<netdev>              netdevs of the same PCI function

An unused GID entry reads as zeros, and its ``types``/``ndevs`` files fail with EINVAL: both
count as absent. UCX names a port ``<dev>:<port>`` (``mlx5_0:1``), which is what
``UCX_NET_DEVICES`` takes; the GID index is what ``UCX_IB_GID_INDEX`` takes.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = [
    "IB_ROOT",
    "Gid",
    "RdmaPort",
    "best_roce_v2_gid",
    "gid_ipv4",
    "ports_for_netdev",
    "read_ports",
]

IB_ROOT: Final = Path("/sys/class/infiniband")
_ZERO_GID: Final = "0000:0000:0000:0000:0000:0000:0000:0000"


@dataclass(frozen=True)
class Gid:
    index: int
    gid: str
    type: str | None  # "RoCE v2", "IB/RoCE v1", None when unreadable (InfiniBand)
    ndev: str | None  # the netdev of a RoCE GID

    @property
    def roce_v2(self) -> bool:
        return (self.type or "").strip().lower() == "roce v2"

    @property
    def ipv4(self) -> str | None:
        return gid_ipv4(self.gid)


@dataclass(frozen=True)
class RdmaPort:
    device: str
    port: int
    link_layer: str
    state: str
    gids: tuple[Gid, ...]
    netdevs: tuple[str, ...]  # from device/net (same PCI function) and the GIDs' ndevs

    @property
    def ucx_name(self) -> str:
        return f"{self.device}:{self.port}"

    @property
    def active(self) -> bool:
        return "ACTIVE" in self.state.upper()

    @property
    def is_roce(self) -> bool:
        return self.link_layer.strip().lower() == "ethernet"


def gid_ipv4(gid: str) -> str | None:
    """The IPv4 address of an IPv4-mapped GID (``::ffff:a.b.c.d``), else None."""
    try:
        addr = ipaddress.IPv6Address(gid.strip())
    except ValueError:
        return None
    mapped = addr.ipv4_mapped
    return None if mapped is None else str(mapped)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:  # missing, or EINVAL for an unused GID's attributes
        return None


def _sorted_numeric(directory: Path) -> list[int]:
    try:
        return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())
    except OSError:
        return []


def read_ports(root: Path = IB_ROOT) -> list[RdmaPort]:
    """Every port of every RDMA device under ``root``; [] when there is none."""
    ports: list[RdmaPort] = []
    try:
        devices = sorted(p for p in root.iterdir())
    except OSError:
        return ports
    for dev in devices:
        try:
            pci_netdevs = sorted(p.name for p in (dev / "device" / "net").iterdir())
        except OSError:
            pci_netdevs = []
        for num in _sorted_numeric(dev / "ports"):
            pdir = dev / "ports" / str(num)
            gids: list[Gid] = []
            for idx in _sorted_numeric(pdir / "gids"):
                value = _read(pdir / "gids" / str(idx))
                if not value or value == _ZERO_GID:
                    continue
                gids.append(
                    Gid(
                        index=idx,
                        gid=value,
                        type=_read(pdir / "gid_attrs" / "types" / str(idx)),
                        ndev=_read(pdir / "gid_attrs" / "ndevs" / str(idx)) or None,
                    )
                )
            netdevs = list(pci_netdevs)
            for gid in gids:
                if gid.ndev and gid.ndev not in netdevs:
                    netdevs.append(gid.ndev)
            ports.append(
                RdmaPort(
                    device=dev.name,
                    port=num,
                    link_layer=_read(pdir / "link_layer") or "unknown",
                    state=_read(pdir / "state") or "unknown",
                    gids=tuple(gids),
                    netdevs=tuple(netdevs),
                )
            )
    return ports


def ports_for_netdev(netdev: str, root: Path = IB_ROOT) -> list[RdmaPort]:
    """The RDMA ports behind ``netdev`` (a RoCE netdev, or the netdev of the same device)."""
    return [p for p in read_ports(root) if netdev in p.netdevs]


def best_roce_v2_gid(port: RdmaPort, netdev: str | None, ipv4: str | None) -> Gid | None:
    """The GID index UCX should use on ``port`` (``UCX_IB_GID_INDEX``), or None.

    Preference: RoCE v2 GID of ``netdev`` mapping ``ipv4`` exactly; then any IPv4-mapped RoCE v2
    GID of ``netdev`` (routable across subnets); then any RoCE v2 GID of ``netdev`` that is not
    link-local; then the same without the netdev condition.
    """
    v2 = [g for g in port.gids if g.roce_v2]
    for pool in ([g for g in v2 if netdev is None or g.ndev == netdev], v2):
        if ipv4 is not None:
            exact = [g for g in pool if g.ipv4 == ipv4]
            if exact:
                return exact[0]
        mapped = [g for g in pool if g.ipv4 is not None]
        if mapped:
            return mapped[0]
        global_ = [g for g in pool if not g.gid.lower().startswith("fe80")]
        if global_:
            return global_[0]
    return None
