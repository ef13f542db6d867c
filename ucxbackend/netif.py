"""Choose the network interface a rank talks to other hosts through.

Two inputs decide it:

``UCXBACKEND_IFNAME`` (the ``spec``), with NCCL_SOCKET_IFNAME's conventions:

* a comma-separated list of names: ``eth0,ens1f0``;
* each entry is a **prefix**: ``eth`` matches ``eth0`` and ``eth1``;
* a leading ``=`` makes every entry an **exact** name: ``=eth0`` matches ``eth0`` only;
* a leading ``^`` **excludes** the listed interfaces and keeps all others: ``^docker,lo``;
  ``^=`` excludes exact names;
* interfaces that are down or have no IPv4 address never match.

A spec that matches nothing raises :class:`ValueError` listing the interfaces that exist.
The same spec means the same for both transports: ucx gets the matching names in
``UCX_NET_DEVICES`` (see :func:`ucx_net_devices_env`), udp binds to :attr:`Selection.address`.

The rendezvous host (``MASTER_ADDR``), when no spec is given: the interface whose address the
kernel would send from to reach that host (a UDP socket ``connect()``, which sends nothing,
then ``getsockname()``). Never loopback for a host that is not a loopback address. A loopback
rendezvous host means a single-host job: the loopback interface is chosen, and UCX is left
unrestricted (its shared memory carries local traffic).

Interfaces are listed with ``getifaddrs(3)`` and ``ioctl(SIOCGIFMTU)``: no external commands.
Every function takes the interface list (and the resolver/route lookup) as optional arguments,
so tests inject them.

``UCX_NET_DEVICES`` is, in UCX (1.13 to 1.22), a plain list of exact device names or ``all``:
unlike ``UCX_TLS`` it has no ``^`` negation and no prefix matching. A spec is therefore always
resolved here to the explicit names it matches before it reaches UCX. RDMA ports (``mlx5_0:1``)
are named separately from their netdevs in that list, so the ports behind a chosen netdev are
added too; otherwise restricting UCX to ``eth0`` would turn RoCE off.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import ipaddress
import logging
import socket
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

from . import rdma_sysfs

__all__ = [
    "ENV_VAR",
    "IfnameSpec",
    "Interface",
    "Selection",
    "list_interfaces",
    "parse_ifname_spec",
    "select_interface",
    "ucx_net_devices_env",
]

log = logging.getLogger("ucxbackend.netif")

ENV_VAR: Final = "UCXBACKEND_IFNAME"
_IFF_UP: Final = 0x1
_IFF_LOOPBACK: Final = 0x8
_SIOCGIFMTU: Final = 0x8921
_SIOCGIFFLAGS: Final = 0x8913
_SIOCGIFADDR: Final = 0x8915
_IFREQ_SIZE: Final = 40  # struct ifreq: the name (16 bytes), then a 24-byte union
# The name Linux gives the loopback device of every network namespace.
_LOOPBACK_NAME: Final = "lo"
# The rendezvous host as one-host launchers spell it (torchrun's default MASTER_ADDR for a
# standalone job, `bench`'s): known to be loopback without parsing it. In a forked rank the
# parse (ipaddress) and the loopback test cost about 0.2-0.3 ms of CPU, almost all of it
# copy-on-write faults on the code and objects that a first run writes to
# (docs/performance.md#start-up).
_LOOPBACK_LITERAL: Final = "127.0.0.1"


@dataclass(frozen=True)
class Interface:
    """A network interface: its IPv4 addresses, MTU (0: not asked) and flags."""

    name: str
    addresses: tuple[str, ...]
    mtu: int
    up: bool
    loopback: bool

    def describe(self) -> str:
        flags = [] if self.up else ["down"]
        if self.loopback:
            flags.append("loopback")
        addrs = ", ".join(self.addresses) or "no IPv4"
        mtu = f"; mtu {self.mtu}" if self.mtu > 0 else ""  # 0: not asked (list_interfaces)
        return f"{self.name} ({addrs}{'; ' + ', '.join(flags) if flags else ''}{mtu})"


@dataclass(frozen=True)
class Selection:
    """The chosen interface. ``names`` lists every interface the spec matched (``name`` first)."""

    name: str
    address: str | None
    mtu: int
    reason: str
    names: tuple[str, ...]
    loopback: bool = False


@dataclass(frozen=True)
class IfnameSpec:
    """A parsed ``UCXBACKEND_IFNAME``: ``names`` are prefixes unless ``exact``."""

    names: tuple[str, ...]
    exclude: bool = False
    exact: bool = False

    def matches(self, ifname: str) -> bool:
        hit = any(ifname == n if self.exact else ifname.startswith(n) for n in self.names)
        return hit != self.exclude


def parse_ifname_spec(spec: str) -> IfnameSpec:
    """Parse ``[^][=]name[,name...]``; raise ValueError for an empty list or an empty entry."""
    text = spec.strip()
    exclude = text.startswith("^")
    text = text[1:] if exclude else text
    exact = text.startswith("=")
    text = text[1:] if exact else text
    names = tuple(n.strip() for n in text.split(","))
    if not text.strip() or any(not n for n in names):
        raise ValueError(
            f"{ENV_VAR}={spec!r}: expected a comma-separated list of interface names, "
            f"optionally after '^' (exclude) and/or '=' (exact names), e.g. 'eth0', '^docker,lo'"
        )
    return IfnameSpec(names=names, exclude=exclude, exact=exact)


# -- enumeration ------------------------------------------------------------------------------


class _Sockaddr(ctypes.Structure):
    _fields_ = [("sa_family", ctypes.c_ushort), ("sa_data", ctypes.c_ubyte * 14)]


class _Ifaddrs(ctypes.Structure):
    pass


_Ifaddrs._fields_ = [
    ("ifa_next", ctypes.POINTER(_Ifaddrs)),
    ("ifa_name", ctypes.c_char_p),
    ("ifa_flags", ctypes.c_uint),
    ("ifa_addr", ctypes.POINTER(_Sockaddr)),
    ("ifa_netmask", ctypes.POINTER(_Sockaddr)),
    ("ifa_ifu", ctypes.POINTER(_Sockaddr)),
    ("ifa_data", ctypes.c_void_p),
]


def _mtu(name: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16si", name.encode()[:15], 0)
        try:
            out = fcntl.ioctl(s.fileno(), _SIOCGIFMTU, req)
        except OSError:
            return 0
    return int(struct.unpack("16si", out)[1])


@functools.cache
def _libc() -> ctypes.CDLL:
    # The C library this process has loaded already: ctypes.util.find_library would run
    # `ldconfig -p` in a child process, milliseconds of every group's creation.
    return ctypes.CDLL(None, use_errno=True)


def _loopback_device() -> Interface | None:
    """The loopback device, asked by its name (three ioctls on one socket), where it is up,
    is the loopback and has an IPv4 address; else None (renamed, down: list them instead)."""
    name = _LOOPBACK_NAME.encode()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            raw = fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, name.ljust(_IFREQ_SIZE, b"\0"))
            flags = struct.unpack_from("H", raw, 16)[0]
            raw = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, name.ljust(_IFREQ_SIZE, b"\0"))
        except OSError:  # no such device, or no IPv4 address
            return None
    up, loopback = bool(flags & _IFF_UP), bool(flags & _IFF_LOOPBACK)
    if not (up and loopback):
        return None
    address = socket.inet_ntoa(raw[20:24])  # sockaddr_in at 16: family, port, address
    return Interface(_LOOPBACK_NAME, (address,), _mtu(_LOOPBACK_NAME), up, loopback)


def list_interfaces(*, mtu: bool = True) -> list[Interface]:
    """Every interface of this network namespace, in kernel order, with its IPv4 addresses.

    ``mtu=False`` leaves every ``mtu`` 0 instead of asking the kernel (a socket and an ioctl
    per interface), for a caller that needs the MTU of the one it picks only."""
    libc = _libc()
    head = ctypes.POINTER(_Ifaddrs)()
    if libc.getifaddrs(ctypes.byref(head)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"getifaddrs failed: {socket.errno.errorcode.get(err, err)}")  # type: ignore[attr-defined]
    order: list[str] = []
    flags: dict[str, int] = {}
    addrs: dict[str, list[str]] = {}
    try:
        node = head
        while node:
            entry = node.contents
            name = (entry.ifa_name or b"").decode(errors="replace")
            if name not in flags:
                order.append(name)
                addrs[name] = []
            flags[name] = entry.ifa_flags
            if entry.ifa_addr and entry.ifa_addr.contents.sa_family == socket.AF_INET:
                raw = bytes(entry.ifa_addr.contents.sa_data[2:6])
                addrs[name].append(socket.inet_ntoa(raw))
            node = entry.ifa_next
    finally:
        libc.freeifaddrs(head)
    return [
        Interface(
            name=n,
            addresses=tuple(addrs[n]),
            mtu=_mtu(n) if mtu else 0,
            up=bool(flags[n] & _IFF_UP),
            loopback=bool(flags[n] & _IFF_LOOPBACK),
        )
        for n in order
    ]


# -- selection --------------------------------------------------------------------------------


def _resolve(host: str) -> str:
    # A dotted-quad literal (MASTER_ADDR=127.0.0.1, as launchers on one host set it) needs no
    # lookup: getaddrinfo would first encode the name with the idna codec, whose import is
    # about 1.3 ms of each rank's first group creation.
    try:
        return str(ipaddress.IPv4Address(host))
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_DGRAM)
    except socket.gaierror as exc:
        raise ValueError(f"cannot resolve rendezvous host {host!r} to IPv4: {exc}") from None
    return str(infos[0][4][0])


def _route_source(ip: str) -> str:
    """The local address the kernel would send from to reach ``ip``. Sends no packet."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((ip, 9))  # connect() on a UDP socket only looks the route up
        except OSError as exc:
            raise ValueError(f"no route to rendezvous host {ip}: {exc}") from None
        return str(s.getsockname()[0])


def _inventory(interfaces: Sequence[Interface]) -> str:
    return "; ".join(i.describe() for i in interfaces) or "(none)"


def _usable(i: Interface) -> bool:
    return i.up and bool(i.addresses)


def _selection(i: Interface, reason: str, names: Sequence[str]) -> Selection:
    return Selection(
        name=i.name,
        address=i.addresses[0] if i.addresses else None,
        mtu=i.mtu,
        reason=reason,
        names=tuple(names),
        loopback=i.loopback,
    )


def select_interface(
    spec: str | None,
    rendezvous_host: str | None,
    *,
    interfaces: Sequence[Interface] | None = None,
    resolve: Callable[[str], str] = _resolve,
    route_source: Callable[[str], str] = _route_source,
) -> Selection:
    """Choose the interface for ``spec`` (``UCXBACKEND_IFNAME``) and ``rendezvous_host``.

    With a spec: the matching usable interfaces (up, with IPv4); the one that routes to the
    rendezvous host comes first when it is among them. A spec that matches nothing raises
    ValueError listing the interfaces. An explicit spec naming only loopback while the
    rendezvous host is remote is honoured, with a warning.

    Without a spec (None or empty): the interface owning the address the kernel sends from to
    reach the rendezvous host; the loopback interface for a loopback host; with no host at
    all, the first usable non-loopback interface. The choice is logged at INFO.
    """
    host_ip = resolve(rendezvous_host) if rendezvous_host else None
    host_is_loopback = host_ip is not None and ipaddress.IPv4Address(host_ip).is_loopback
    if (
        interfaces is None
        and not (spec and spec.strip())
        and host_is_loopback
        and rendezvous_host in {"localhost", host_ip}
    ):
        # One host (a udp group's usual case): the loopback device answers by name. Listing
        # every interface through ctypes' getifaddrs cost a forked rank's first udp group
        # about 1 ms of CPU (docs/performance.md#start-up).
        lo = _loopback_device()
        if lo is not None:
            reason = f"rendezvous host {rendezvous_host} is loopback ({host_ip})"
            return _logged(_selection(lo, reason, [lo.name]))
    # The MTU of the chosen interface only: one socket and ioctl instead of one per interface,
    # about 0.25 ms of a forked rank's first udp group on this host's four interfaces.
    ifaces = list(list_interfaces(mtu=False) if interfaces is None else interfaces)

    def inventory() -> str:  # for an error: every interface with its MTU
        return _inventory(list_interfaces() if interfaces is None else ifaces)

    by_addr = {a: i for i in ifaces for a in i.addresses}

    routed: Interface | None = None
    if host_ip is not None and not host_is_loopback:
        source = route_source(host_ip)
        routed = by_addr.get(source)
        if routed is None:
            raise ValueError(
                f"the route to rendezvous host {rendezvous_host} ({host_ip}) leaves from "
                f"{source}, which no interface here owns; interfaces: {inventory()}"
            )

    if spec is not None and spec.strip():
        parsed = parse_ifname_spec(spec)
        matched = [i for i in ifaces if parsed.matches(i.name) and _usable(i)]
        if parsed.exclude and host_ip is not None and not host_is_loopback:
            matched = [i for i in matched if not i.loopback]
        if not matched:
            raise ValueError(
                f"{ENV_VAR}={spec!r} matches no usable interface (up, with an IPv4 address); "
                f"interfaces here: {inventory()}"
            )
        if routed is not None and routed in matched:
            matched.remove(routed)
            matched.insert(0, routed)
        first = matched[0]
        if first.loopback and host_ip is not None and not host_is_loopback:
            log.warning(
                "%s=%r selects loopback interface %s, but rendezvous host %s is remote",
                ENV_VAR,
                spec,
                first.name,
                rendezvous_host,
            )
        sel = _selection(first, f"{ENV_VAR}={spec!r}", [i.name for i in matched])
    elif routed is not None:
        sel = _selection(
            routed, f"routes to rendezvous host {rendezvous_host} ({host_ip})", [routed.name]
        )
    elif host_is_loopback:
        lo = next((i for i in ifaces if i.loopback and _usable(i)), None)
        if lo is None:
            raise ValueError(
                f"rendezvous host {rendezvous_host} ({host_ip}) is a loopback address but no "
                f"loopback interface is up; interfaces: {inventory()}"
            )
        if rendezvous_host not in {"localhost", host_ip}:
            log.warning(
                "rendezvous host %s resolves to loopback %s: assuming every rank is on this "
                "host; if not, set %s (or fix /etc/hosts)",
                rendezvous_host,
                host_ip,
                ENV_VAR,
            )
        sel = _selection(
            lo, f"rendezvous host {rendezvous_host} is loopback ({host_ip})", [lo.name]
        )
    else:
        candidates = [i for i in ifaces if _usable(i) and not i.loopback]
        if not candidates:
            raise ValueError(
                f"no rendezvous host given and no usable non-loopback interface; "
                f"interfaces: {inventory()}"
            )
        sel = _selection(
            candidates[0],
            "first usable non-loopback interface (no rendezvous host given)",
            [candidates[0].name],
        )
    if sel.mtu == 0 and interfaces is None:
        sel = replace(sel, mtu=_mtu(sel.name))
    return _logged(sel)


def _logged(sel: Selection) -> Selection:
    log.info(
        "network interface %s (address %s, mtu %d): %s",
        sel.name,
        sel.address,
        sel.mtu,
        sel.reason,
    )
    return sel


def ucx_net_devices_env(
    spec: str | None,
    rendezvous_host: str | None,
    environ: Mapping[str, str],
    *,
    interfaces: Sequence[Interface] | None = None,
    ib_root: Path = rdma_sysfs.IB_ROOT,
    resolve: Callable[[str], str] = _resolve,
    route_source: Callable[[str], str] = _route_source,
) -> dict[str, str]:
    """The ``UCX_*`` variables to set before UCX reads its configuration (maybe none).

    * ``UCX_NET_DEVICES`` already set (non-empty) in ``environ``: nothing (pass-through; a spec
      is then ignored, with a warning). ``UCX_TLS`` and every other ``UCX_*`` variable are
      never set here, so the user's values always pass through.
    * a spec, or a remote rendezvous host: ``UCX_NET_DEVICES`` = the selected interfaces, plus
      the RDMA ports (``mlx5_0:1``) behind them, from ``ib_root``.
    * no spec and a loopback (or no) rendezvous host: nothing: UCX keeps all its devices; no
      interface is listed for it.

    Raises ValueError (from :func:`select_interface`) for a spec that matches nothing.
    """
    user = environ.get("UCX_NET_DEVICES", "").strip()
    if user:
        if spec and spec.strip():
            log.warning("UCX_NET_DEVICES=%s is set: it wins over %s=%s", user, ENV_VAR, spec)
        else:
            log.info("UCX_NET_DEVICES=%s set by the user: passed through", user)
        return {}
    explicit = spec is not None and bool(spec.strip())
    if not explicit and not rendezvous_host:
        return {}
    if not explicit and rendezvous_host == _LOOPBACK_LITERAL:
        host_ip: str | None = _LOOPBACK_LITERAL
    else:
        host_ip = resolve(rendezvous_host) if rendezvous_host else None
    if not explicit and host_ip is not None and (
        host_ip == _LOOPBACK_LITERAL or ipaddress.IPv4Address(host_ip).is_loopback
    ):
        # The answer is known before any interface is listed: getifaddrs through ctypes and an
        # MTU ioctl per interface cost each rank's first ucx group about 1.3 ms of CPU.
        log.info(
            "rendezvous host %s is loopback (%s): every rank on this host, UCX keeps its devices",
            rendezvous_host,
            host_ip,
        )
        return {}
    sel = select_interface(
        spec,
        rendezvous_host,
        interfaces=interfaces,
        resolve=lambda _host: host_ip or "",
        route_source=route_source,
    )
    if not explicit and sel.loopback:
        return {}
    devices = list(sel.names)
    for netdev in sel.names:
        for port in rdma_sysfs.ports_for_netdev(netdev, ib_root):
            if port.ucx_name not in devices:
                devices.append(port.ucx_name)
    value = ",".join(devices)
    log.info("UCX_NET_DEVICES=%s (%s)", value, sel.reason)
    return {"UCX_NET_DEVICES": value}
