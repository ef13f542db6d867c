"""Interface selection (ucxbackend.netif) with injected interface lists, and a ucx group's
interface error with this host's own list: no traffic."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ucxbackend import netif
from ucxbackend.netif import Interface

LO = Interface("lo", ("127.0.0.1",), 65536, up=True, loopback=True)
ETH0 = Interface("eth0", ("192.168.1.2",), 1500, up=True, loopback=False)
ETH1 = Interface("eth1", ("10.0.0.5", "10.0.1.5"), 9000, up=True, loopback=False)
DOCKER = Interface("docker0", ("172.17.0.1",), 1500, up=True, loopback=False)
DOWN = Interface("eth2", ("10.9.9.9",), 1500, up=False, loopback=False)
NOADDR = Interface("ib0", (), 2044, up=True, loopback=False)
ALL = [LO, ETH0, ETH1, DOCKER, DOWN, NOADDR]

ROUTES = {"192.168.1.77": "192.168.1.2", "10.0.0.9": "10.0.0.5", "172.17.0.3": "172.17.0.1"}
HOSTS = {"node0": "192.168.1.77", "localhost": "127.0.0.1", "myhost": "127.0.1.1"}


def resolve(host: str) -> str:
    return HOSTS.get(host, host)


def route(ip: str) -> str:
    return ROUTES[ip]


def select(spec: str | None, host: str | None) -> netif.Selection:
    return netif.select_interface(spec, host, interfaces=ALL, resolve=resolve, route_source=route)


@pytest.mark.parametrize(
    ("spec", "names", "exclude", "exact"),
    [
        ("eth0", ("eth0",), False, False),
        ("eth,ib", ("eth", "ib"), False, False),
        ("^docker,lo", ("docker", "lo"), True, False),
        ("=eth0", ("eth0",), False, True),
        ("^=eth0, eth1", ("eth0", "eth1"), True, True),
    ],
)
def test_parse(spec: str, names: tuple[str, ...], exclude: bool, exact: bool) -> None:
    assert netif.parse_ifname_spec(spec) == netif.IfnameSpec(names, exclude, exact)


@pytest.mark.parametrize("spec", ["", "^", "=", "^=", "eth0,", ",eth0", "a,,b"])
def test_parse_rejects_empty_entries(spec: str) -> None:
    with pytest.raises(ValueError, match="UCXBACKEND_IFNAME"):
        netif.parse_ifname_spec(spec)


def test_prefix_exact_and_exclude_matching() -> None:
    spec = netif.parse_ifname_spec("eth")
    assert [i.name for i in ALL if spec.matches(i.name)] == ["eth0", "eth1", "eth2"]
    exact = netif.parse_ifname_spec("=eth")
    assert not any(exact.matches(i.name) for i in ALL)
    excl = netif.parse_ifname_spec("^docker,lo")
    assert [i.name for i in ALL if excl.matches(i.name)] == ["eth0", "eth1", "eth2", "ib0"]


def test_spec_selects_matching_usable_interfaces() -> None:
    sel = select("eth", None)
    # eth2 is down: never matches.
    assert (sel.name, sel.address, sel.mtu, sel.names) == (
        "eth0",
        "192.168.1.2",
        1500,
        ("eth0", "eth1"),
    )
    assert "UCXBACKEND_IFNAME" in sel.reason


def test_spec_puts_the_routed_interface_first() -> None:
    sel = select("eth", "10.0.0.9")
    assert sel.name == "eth1" and sel.names == ("eth1", "eth0")
    assert sel.address == "10.0.0.5"


def test_exclude_spec_drops_loopback_for_a_remote_host() -> None:
    sel = select("^docker", "node0")
    assert sel.names == ("eth0", "eth1") and not sel.loopback
    # with a loopback host, an exclusion keeps lo (all ranks are local)
    assert select("^docker", "localhost").names == ("lo", "eth0", "eth1")


@pytest.mark.parametrize("spec", ["wlan0", "=eth", "eth2", "ib0", "^lo,eth,docker,ib"])
def test_spec_matching_nothing_lists_the_interfaces(spec: str) -> None:
    with pytest.raises(ValueError) as info:
        select(spec, "node0")
    msg = str(info.value)
    assert f"UCXBACKEND_IFNAME={spec!r}" in msg
    for name in ("lo (127.0.0.1", "eth0 (192.168.1.2", "eth2 (10.9.9.9; down", "ib0 (no IPv4"):
        assert name in msg


def test_explicit_loopback_for_remote_host_is_honoured_with_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="ucxbackend.netif"):
        sel = select("lo", "node0")
    assert sel.name == "lo" and sel.loopback
    assert "remote" in caplog.text


def test_auto_picks_the_interface_routing_to_the_rendezvous_host(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="ucxbackend.netif"):
        sel = select(None, "node0")
    assert (sel.name, sel.address, sel.names) == ("eth0", "192.168.1.2", ("eth0",))
    assert "node0" in sel.reason and "192.168.1.77" in sel.reason
    assert "network interface eth0" in caplog.text
    assert select("", "172.17.0.3").name == "docker0"  # empty spec counts as unset
    assert select(None, "10.0.0.9").name == "eth1"


def test_auto_own_address_maps_to_its_interface_not_lo() -> None:
    # The rendezvous host is this machine's own address: the kernel routes it over lo but the
    # source address belongs to eth1.
    routes = {"10.0.1.5": "10.0.1.5"}
    sel = netif.select_interface(
        None, "10.0.1.5", interfaces=ALL, resolve=resolve, route_source=routes.__getitem__
    )
    assert sel.name == "eth1" and not sel.loopback


def test_auto_loopback_host(caplog: pytest.LogCaptureFixture) -> None:
    sel = select(None, "localhost")
    assert sel.name == "lo" and sel.loopback
    with caplog.at_level(logging.WARNING, logger="ucxbackend.netif"):
        sel = select(None, "myhost")  # Debian's 127.0.1.1 for the own hostname
    assert sel.name == "lo"
    assert "127.0.1.1" in caplog.text and "UCXBACKEND_IFNAME" in caplog.text


def test_auto_without_host_takes_first_non_loopback() -> None:
    assert select(None, None).name == "eth0"
    with pytest.raises(ValueError, match="no usable non-loopback"):
        netif.select_interface(None, None, interfaces=[LO, DOWN])


def test_route_through_an_unknown_address_is_an_error() -> None:
    with pytest.raises(ValueError, match="which no interface here owns"):
        netif.select_interface(
            None, "8.8.8.8", interfaces=ALL, resolve=resolve, route_source=lambda ip: "10.200.0.1"
        )


def test_default_resolver_and_route_stay_on_loopback() -> None:
    # Only loopback lookups: /etc/hosts and a route to 127.0.0.1 (no packet is sent).
    assert netif._resolve("localhost") == "127.0.0.1"
    assert netif._route_source("127.0.0.1") == "127.0.0.1"
    sel = netif.select_interface(None, "localhost")
    assert sel.loopback


def test_an_ipv4_literal_needs_no_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    # getaddrinfo imports the idna codec on its first call in a process (about 1.3 ms of each
    # rank's first group creation with MASTER_ADDR=127.0.0.1); a literal is parsed instead.
    def no_lookup(*args: object, **kwargs: object) -> object:
        raise AssertionError(f"getaddrinfo{args} called for a literal")

    monkeypatch.setattr(netif.socket, "getaddrinfo", no_lookup)
    assert netif._resolve("127.0.0.1") == "127.0.0.1"
    assert netif._resolve("10.1.2.3") == "10.1.2.3"
    with pytest.raises(AssertionError, match="getaddrinfo"):
        netif._resolve("localhost")  # a name still goes to the resolver


def _env(spec: str | None, host: str | None, environ: dict[str, str], **kw: object) -> dict:
    return netif.ucx_net_devices_env(
        spec, host, environ, interfaces=ALL, resolve=resolve, route_source=route, **kw
    )


def test_ucx_env_from_spec_and_route(tmp_path: Path) -> None:
    assert _env("eth", "node0", {}, ib_root=tmp_path) == {"UCX_NET_DEVICES": "eth0,eth1"}
    assert _env("^eth,lo", "node0", {}, ib_root=tmp_path) == {"UCX_NET_DEVICES": "docker0"}
    assert _env(None, "node0", {}, ib_root=tmp_path) == {"UCX_NET_DEVICES": "eth0"}


def test_ucx_env_leaves_single_host_jobs_alone(tmp_path: Path) -> None:
    assert _env(None, "localhost", {}, ib_root=tmp_path) == {}
    assert _env(None, None, {}, ib_root=tmp_path) == {}
    # an explicit spec is applied even for a loopback host
    assert _env("lo", "localhost", {}, ib_root=tmp_path) == {"UCX_NET_DEVICES": "lo"}


def test_ucx_env_lists_no_interface_for_a_loopback_host(monkeypatch: pytest.MonkeyPatch) -> None:
    # Listing the interfaces (getifaddrs, an MTU ioctl each) was about 1.3 ms of CPU of each
    # rank's first ucx group on one host, for an answer the loopback host alone gives.
    def no_listing(*, mtu: bool = True) -> list[netif.Interface]:
        raise AssertionError("list_interfaces called for a loopback rendezvous host")

    monkeypatch.setattr(netif, "list_interfaces", no_listing)
    assert netif.ucx_net_devices_env(None, "127.0.0.1", {}) == {}
    assert netif.ucx_net_devices_env("", "127.0.0.2", {}) == {}
    # an explicit spec, or a remote host, still needs them
    with pytest.raises(AssertionError, match="list_interfaces"):
        netif.ucx_net_devices_env("lo", "127.0.0.1", {})
    with pytest.raises(AssertionError, match="list_interfaces"):
        netif.ucx_net_devices_env(None, "10.1.2.3", {}, route_source=lambda ip: "10.9.9.9")


def test_ucx_env_takes_the_loopback_literal_as_it_is() -> None:
    # MASTER_ADDR=127.0.0.1 (torchrun's standalone default, bench's) is loopback without a
    # parse: in a forked rank's first group the parse and the loopback test were 0.2-0.3 ms of
    # CPU. Any other spelling still goes through the resolver.
    def no_resolve(host: str) -> str:
        raise AssertionError(f"resolve called for {host!r}")

    assert netif.ucx_net_devices_env(None, "127.0.0.1", {}, resolve=no_resolve) == {}
    with pytest.raises(AssertionError, match="resolve called"):
        netif.ucx_net_devices_env(None, "127.0.0.2", {}, resolve=no_resolve)
    assert netif.ucx_net_devices_env(None, "localhost", {}, resolve=lambda h: "127.0.0.1") == {}


def test_ucx_env_passes_user_settings_through(caplog: pytest.LogCaptureFixture) -> None:
    user = {"UCX_NET_DEVICES": "mlx5_0:1", "UCX_TLS": "rc,sm,self"}
    assert _env(None, "node0", user) == {}
    with caplog.at_level(logging.WARNING, logger="ucxbackend.netif"):
        assert _env("eth1", "node0", user) == {}
    assert "wins over" in caplog.text
    # UCX_TLS alone does not stop the device selection, and is never returned
    out = _env(None, "node0", {"UCX_TLS": "tcp"}, ib_root=Path("/nonexistent"))
    assert out == {"UCX_NET_DEVICES": "eth0"}


def test_ucx_env_bad_spec_raises(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="interfaces here"):
        _env("bond", "node0", {}, ib_root=tmp_path)


def test_ucx_env_adds_the_rdma_ports_behind_the_netdev(tmp_path: Path) -> None:
    # mlx5_0 port 1 is RoCE on eth0 (through a GID's ndev); mlx5_1 shares eth1's PCI function.
    port = tmp_path / "mlx5_0" / "ports" / "1"
    (port / "gids").mkdir(parents=True)
    (port / "gid_attrs" / "ndevs").mkdir(parents=True)
    (port / "gids" / "0").write_text("fe80:0000:0000:0000:0000:0000:0000:0001\n")
    (port / "gid_attrs" / "ndevs" / "0").write_text("eth0\n")
    (tmp_path / "mlx5_1" / "ports" / "1").mkdir(parents=True)
    (tmp_path / "mlx5_1" / "device" / "net" / "eth1").mkdir(parents=True)
    assert _env(None, "node0", {}, ib_root=tmp_path) == {"UCX_NET_DEVICES": "eth0,mlx5_0:1"}
    assert _env("eth", "10.0.0.9", {}, ib_root=tmp_path) == {
        "UCX_NET_DEVICES": "eth1,eth0,mlx5_1:1,mlx5_0:1"
    }


def test_list_interfaces_sees_loopback() -> None:
    ifaces = netif.list_interfaces()
    lo = [i for i in ifaces if i.loopback]
    assert lo and lo[0].up and "127.0.0.1" in lo[0].addresses and lo[0].mtu > 0
    assert len({i.name for i in ifaces}) == len(ifaces)


def test_ucx_group_options_for_a_spec_matching_nothing_list_this_hosts_interfaces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The ucx path (UCX_NET_DEVICES from UCXBACKEND_IFNAME) with the real interface list."""
    import ucxbackend
    from ucxbackend import _transport_options, get_config

    if not ucxbackend.is_available():  # the knobs' schema lives in _C
        pytest.skip(f"native extension not built: {ucxbackend.load_error()}")
    for var in ("UCX_NET_DEVICES", "MASTER_ADDR"):
        monkeypatch.delenv(var, raising=False)
    config = get_config({"ifname": "nosuchif"}, env={})
    with pytest.raises(ValueError) as info:
        _transport_options.ucx_net_devices(config, None)
    msg = str(info.value)
    assert "UCXBACKEND_IFNAME='nosuchif' matches no usable interface" in msg
    ifaces = netif.list_interfaces()
    assert any(i.loopback for i in ifaces)
    for iface in ifaces:
        assert iface.describe() in msg, (iface, msg)


def test_ucx_group_creation_with_a_spec_matching_nothing_fails_listing_interfaces(
    tmp_path: Path,
) -> None:
    """init_process_group("ucx") in a fresh process (one rank, FileStore: no network) fails
    before UCX starts, naming the spec and the interfaces this host has."""
    import ucxbackend

    if not ucxbackend.is_available():
        pytest.skip(f"native extension not built: {ucxbackend.load_error()}")
    code = (
        "import torch.distributed as dist, ucxbackend\n"
        f"dist.init_process_group('ucx', init_method='file://{tmp_path}/store', "
        "rank=0, world_size=1)\n"
        "print('CREATED')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UCX_", "UCXBACKEND_"))}
    env.pop("MASTER_ADDR", None)
    env.update(UCXBACKEND_IFNAME="nosuchif", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(Path(__file__).resolve().parent.parent), env.get("PYTHONPATH")])
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "CREATED" not in out, out[-3000:]
    line = next((s for s in out.splitlines() if "matches no usable interface" in s), "")
    assert line.startswith("ValueError: UCXBACKEND_IFNAME='nosuchif'"), out[-3000:]
    assert "interfaces here: " in line and "lo (127.0.0.1; loopback; mtu" in line, line


def test_selection_asks_the_mtu_of_the_chosen_interface_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A udp group needs the MTU of the interface it binds to; asking every interface's cost a
    socket and an ioctl each at every creation (docs/performance.md#start-up)."""
    asked: list[str] = []
    real_mtu = netif._mtu

    def counting_mtu(name: str) -> int:
        asked.append(name)
        return real_mtu(name)

    monkeypatch.setattr(netif, "_mtu", counting_mtu)
    sel = netif.select_interface("lo", "127.0.0.1")  # a spec: every interface is listed
    assert asked == [sel.name]
    assert sel.loopback and sel.mtu == real_mtu(sel.name) > 0
    # listing for a person (doctor, errors) still asks every interface
    asked.clear()
    ifaces = netif.list_interfaces()
    assert asked == [i.name for i in ifaces] and all(i.mtu > 0 for i in ifaces if i.up)


def test_a_loopback_host_asks_the_loopback_device_by_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A udp group on one host binds to the loopback device: it is asked by name, not found
    by listing every interface (ctypes' getifaddrs, about 1 ms of a forked rank's CPU)."""
    listed = netif.select_interface(None, "127.0.0.1", interfaces=netif.list_interfaces())

    def no_listing(*, mtu: bool = True) -> list[netif.Interface]:
        raise AssertionError("list_interfaces called for a loopback rendezvous host")

    monkeypatch.setattr(netif, "list_interfaces", no_listing)
    assert netif.select_interface(None, "127.0.0.1") == listed
    assert netif.select_interface("", "localhost", resolve=lambda _h: "127.0.0.1").address == (
        listed.address
    )
    # a spec, or a name that only resolves to loopback (its warning), still lists them
    with pytest.raises(AssertionError, match="list_interfaces"):
        netif.select_interface("lo", "127.0.0.1")
    with pytest.raises(AssertionError, match="list_interfaces"):
        netif.select_interface(None, "myhost", resolve=lambda _h: "127.0.1.1")
    # a loopback device that is not there by that name: the listing decides
    monkeypatch.setattr(netif, "_LOOPBACK_NAME", "nosuchlo")
    with pytest.raises(AssertionError, match="list_interfaces"):
        netif.select_interface(None, "127.0.0.1")
