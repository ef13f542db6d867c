"""What the ``udp`` backend needs from Python: the address to bind and the datagram size.

The native side binds one UDP socket per group to ``udp_host`` (a free port) and publishes it
through the Store. The host is the address of the interface that routes to the rendezvous
host (the Store's), so that peers on other hosts can reach it; 127.0.0.1 when the rendezvous
is local. ``mtu_payload``, unless set in ``udp_config``, is that interface's MTU less the IP
and UDP headers: 1472 on 1500-byte Ethernet, 8972 on jumbo frames, 65507 on loopback.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from typing import Any

from .config import Config

logger = logging.getLogger(__name__)

MAX_UDP_PAYLOAD = 65507  # the largest datagram IPv4 can carry
IPV4_UDP_HEADERS = 28  # IPv4 (20) + UDP (8)
IPV6_UDP_HEADERS = 48  # IPv6 (40) + UDP (8)
DEFAULT_MTU = 1500


def rendezvous_host(store: Any) -> str | None:
    """The host of the TCPStore under ``store`` (through any PrefixStore), if there is one."""
    seen = 0
    while store is not None and seen < 16:
        host = getattr(store, "host", None)
        if isinstance(host, str) and host:
            return host
        store = getattr(store, "underlying_store", None)
        seen += 1
    return None


def _resolve(host: str) -> tuple[int, str]:
    family, _, _, _, sockaddr = socket.getaddrinfo(host, None, type=socket.SOCK_DGRAM)[0]
    return int(family), str(sockaddr[0])


def _route_source(family: int, address: str) -> str:
    """The local address the kernel would send from to reach ``address`` (sends nothing)."""
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((address, 9))  # UDP connect only picks the route
        return str(probe.getsockname()[0])


def _interface_mtu(address: str) -> int:
    """The MTU of the interface that holds ``address`` (the default when it is not found)."""
    from . import netif

    for interface in netif.list_interfaces():
        if address in interface.addresses:
            return interface.mtu
    return DEFAULT_MTU


def bind_address(store: Any) -> tuple[str, int]:
    """(host to bind, interface MTU) for a group whose Store is ``store``."""
    host = rendezvous_host(store) or "127.0.0.1"
    try:
        family, address = _resolve(host)
    except OSError as exc:
        raise RuntimeError(f"udp: cannot resolve the rendezvous host {host!r}: {exc}") from exc
    if ipaddress.ip_address(address).is_loopback:
        local = "127.0.0.1" if family == socket.AF_INET else "::1"
        mtu = 65536
    else:
        local = _route_source(family, address)
        mtu = _interface_mtu(local)
    logger.info("udp: binding %s (MTU %d), the route to rendezvous host %s", local, mtu, host)
    return local, mtu


def native_options(config: Config, store: Any) -> dict[str, str]:
    """The udp_* entries of the options handed to ``_C.ProcessGroupUCX``."""
    host, mtu = bind_address(store)
    headers = IPV6_UDP_HEADERS if ":" in host else IPV4_UDP_HEADERS
    udp_config = config.udp_config
    if "mtu_payload=" not in udp_config:
        payload = max(256, min(MAX_UDP_PAYLOAD, mtu - headers))
        udp_config = ",".join(filter(None, [f"mtu_payload={payload}", udp_config]))
    return {"udp_config": udp_config, "udp_faults": config.udp_faults, "udp_host": host}
