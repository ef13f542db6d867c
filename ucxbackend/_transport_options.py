"""The options each transport takes from the network: the udp address and datagram size, and
UCX's device list.

The native side binds one UDP socket per group to ``udp_host`` (a free port) and publishes it
through the Store. The host is the address of the interface :mod:`ucxbackend.netif` selects
(``UCXBACKEND_IFNAME``, else the one that routes to the rendezvous host), so that peers on
other hosts can reach it. ``mtu_payload``, unless set in ``udp_config``, is that interface's
MTU less the IPv4 and UDP headers: 1472 on 1500-byte Ethernet, 8972 on jumbo frames, 65507 on
loopback.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from . import netif
from .config import Config

logger = logging.getLogger(__name__)

MAX_UDP_PAYLOAD = 65507  # the largest datagram IPv4 can carry
IPV4_UDP_HEADERS = 28  # IPv4 (20) + UDP (8)
MIN_MTU_PAYLOAD = 256  # the core's floor (transports/udp/udp_config.cpp)


def rendezvous_host(store: Any) -> str | None:
    """The host of the TCPStore under ``store`` (through PrefixStores), else ``MASTER_ADDR``."""
    for _ in range(16):
        if store is None:
            break
        host = getattr(store, "host", None)
        if isinstance(host, str) and host:
            return host
        store = getattr(store, "underlying_store", None)
    return os.environ.get("MASTER_ADDR") or None


def mtu_payload(mtu: int) -> int:
    """The largest UDP payload an IPv4 datagram fits in one ``mtu``-byte frame."""
    return max(MIN_MTU_PAYLOAD, min(MAX_UDP_PAYLOAD, mtu - IPV4_UDP_HEADERS))


def native_options(config: Config, store: Any) -> dict[str, str]:
    """The udp_* entries of the options handed to ``_C.create_backend``."""
    host = rendezvous_host(store)
    if host is None and not config.ifname:
        # A FileStore (or HashStore) and no MASTER_ADDR: nothing says where the peers are.
        host = "127.0.0.1"
        logger.info(
            "udp: no rendezvous host known; assuming one host (set %s otherwise)", netif.ENV_VAR
        )
    selection = netif.select_interface(config.ifname or None, host)
    if selection.address is None:
        raise ValueError(f"udp: interface {selection.name} has no IPv4 address to bind")
    udp_config = config.udp_config
    if "mtu_payload=" not in udp_config:
        payload = f"mtu_payload={mtu_payload(selection.mtu)}"
        udp_config = ",".join(filter(None, [payload, udp_config]))
    return {
        "udp_config": udp_config,
        "udp_faults": config.udp_faults,
        "udp_host": selection.address,
    }


def socket_buffer_warning(
    receive_buffer: int, requested: int, send_window: int, peers: int
) -> str | None:
    """Why a udp socket's receive buffer is too small for what its peers may send, or None.

    Each peer may have ``send_window`` bytes in flight towards this rank at once; a burst that
    does not fit the kernel's buffer is dropped there and sent again after a loss timeout
    (on the namespace rig, with a 416 KiB buffer, a 64 MB all_reduce sent nearly every packet
    twice and ran at about half speed: docs/performance.md). ``requested`` is the group's
    ``socket_buffer_bytes``. ``net.core.rmem_max`` is read-only inside a network namespace
    other than the host's first one, so the fix is named for that one.
    """
    need = send_window * peers
    if peers < 1 or receive_buffer >= need:
        return None
    said = (
        f"udp: the kernel gave this rank's socket a {receive_buffer}-byte receive buffer, less "
        f"than the {need} bytes its {peers} peer(s) may have in flight "
        f"(send_window_bytes={send_window}): bursts will be dropped and resent, and large "
        "messages will move at about half speed. "
    )
    if receive_buffer >= requested:
        # The kernel granted what the group asked for (Linux reports twice the request): the
        # request itself is short of the peers' windows, so no privilege or sysctl helps.
        return said + (
            f"This rank got the socket_buffer_bytes={requested} it asked for: raise "
            f"socket_buffer_bytes in udp_config to {need} or more, or lower send_window_bytes"
        )
    short = (
        f", and socket_buffer_bytes in udp_config to {need} or more" if requested < need else ""
    )
    return said + (
        f"Give the ranks CAP_NET_ADMIN (run as root: the backend then forces "
        f"socket_buffer_bytes={requested}), raise the cap in the host's initial network "
        f"namespace (sysctl -w net.core.rmem_max={max(requested, need)}; it is read-only inside "
        f"other network namespaces and containers){short}, or lower send_window_bytes in "
        "udp_config"
    )


def ucx_net_devices(config: Config, store: Any) -> str:
    """The devices for a ucx group's UCX context, in ``UCX_NET_DEVICES``' syntax ("" when UCX
    should keep every device, or when the user set ``UCX_NET_DEVICES`` and UCX reads it)."""
    chosen = netif.ucx_net_devices_env(config.ifname or None, rendezvous_host(store), os.environ)
    return chosen.get("UCX_NET_DEVICES", "")
