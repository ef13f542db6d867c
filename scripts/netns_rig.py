"""Two "hosts" on one machine: a pair of network namespaces joined by a veth pair.

Each namespace gets one end of the veth pair with its own IPv4 address in a private /24 picked
at random (10.x.y.0/24 or 192.168.x.0/24, avoiding every subnet the root namespace routes),
and its own ``lo`` brought up. Nothing is routed out of the namespaces: traffic sent to the rig
addresses stays on the veth pair, never on the machine's real interfaces.

Names carry the creating process's pid (``ucxb<pid>a``/``ucxb<pid>b`` for the namespaces and
their veth ends), so concurrent rigs do not collide and stale ones can be found: a rig whose
pid no longer exists was left by a killed process (``cleanup --dead``, :func:`cleanup_dead`),
while the rig of a live process is never touched by that sweep. ``create`` below makes a rig
meant to outlive its creator: it is tagged ``<pid>k`` (``ucxb<pid>ka``), which the sweep
leaves alone too.

As a context manager (tests)::

    with NetnsRig.create() as rig:
        rig.run("a", ["ip", "-br", "addr"])
        rig.popen("b", ["python", "worker.py"], env=...)

The rig is removed on leaving the block (normally or by an exception), at interpreter exit
(atexit) and by ``python scripts/netns_rig.py cleanup`` (every ``ucxb*`` namespace and stray
veth). A SIGKILLed process runs none of that: ``cleanup --dead`` removes what it left.

As a script (needs root and iproute2)::

    python scripts/netns_rig.py create            # prints the rig as JSON, leaves it in place
    python scripts/netns_rig.py exec a -- CMD...  # run CMD in host a of the rig that `run`
                                                  # exported (RIG_*), else of the newest rig
                                                  # (own IPC/UTS namespace, hostname = ns)
    python scripts/netns_rig.py destroy [TAG]     # remove the rig with TAG (or all)
    python scripts/netns_rig.py cleanup           # remove every rig namespace and veth
    python scripts/netns_rig.py cleanup --dead    # only those of processes that no longer exist
    python scripts/netns_rig.py run -- CMD...     # create, run CMD with RIG_* env, destroy
                                                  # (exits with CMD's status)

``run`` exports ``RIG_NS_A``, ``RIG_NS_B``, ``RIG_ADDR_A``, ``RIG_ADDR_B``, ``RIG_IF_A``,
``RIG_IF_B`` to CMD.
"""

from __future__ import annotations

import argparse
import atexit
import ipaddress
import json
import logging
import os
import random
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Final, Literal

__all__ = [
    "PREFIX",
    "NetnsRig",
    "RigError",
    "add_udp_drop",
    "available",
    "cleanup_dead",
    "cleanup_stale",
    "newest_name",
]

log = logging.getLogger("ucxbackend.netns_rig")

PREFIX: Final = "ucxb"
Host = Literal["a", "b"]


class RigError(RuntimeError):
    """Creating, using or removing the rig failed; the message names the command and its output."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = ["ip", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RigError(f"`{' '.join(cmd)}` failed (exit {proc.returncode}): {proc.stderr.strip()}")
    return proc


def available() -> tuple[bool, str]:
    """Whether namespaces can be created here; when not, the reason (for pytest.skip)."""
    if sys.platform != "linux":
        return False, f"network namespaces need Linux (this is {sys.platform})"
    for tool, package in (("ip", "iproute2"), ("unshare", "util-linux")):
        if shutil.which(tool) is None:
            return False, f"`{tool}` ({package}) is not installed"
    if os.geteuid() != 0:
        return False, "creating network namespaces needs root"
    probe = f"{PREFIX}{os.getpid()}probe"
    proc = _ip("netns", "add", probe, check=False)
    if proc.returncode != 0:
        return False, f"`ip netns add` failed: {proc.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return True, ""


def _subnets_in_use() -> list[ipaddress.IPv4Network]:
    """Subnets routed in the root namespace and in other rigs (to stay clear of them)."""
    used: list[ipaddress.IPv4Network] = []
    tables = [["-4", "route", "show", "table", "all"]]
    tables += [["-n", ns, "-4", "route"] for ns in _rig_namespaces()]
    for args in tables:
        proc = _ip(*args, check=False)
        for line in proc.stdout.splitlines():
            words = line.split()
            if not words:
                continue
            dest = words[1] if words[0] in {"local", "broadcast", "unicast"} else words[0]
            if dest == "default":
                continue
            try:
                used.append(ipaddress.IPv4Network(dest, strict=False))
            except ValueError:
                continue
    return used


def _pick_subnet(rng: random.Random) -> ipaddress.IPv4Network:
    used = _subnets_in_use()
    for _ in range(1000):
        if rng.random() < 0.5:
            net = ipaddress.IPv4Network(f"10.{rng.randrange(1, 255)}.{rng.randrange(0, 256)}.0/24")
        else:
            net = ipaddress.IPv4Network(f"192.168.{rng.randrange(100, 255)}.0/24")
        if not any(net.overlaps(u) for u in used):
            return net
    raise RigError("no free private /24 found (every candidate overlaps a route)")


def _rig_namespaces() -> list[str]:
    proc = _ip("netns", "list", check=False)
    names = [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]
    return [n for n in names if n.startswith(PREFIX)]


def _rig_links() -> list[str]:
    """Interfaces of the root namespace with a rig name (a veth pair left by a failure)."""
    names = []
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        parts = line.split(":", 2)
        if len(parts) < 2:
            continue
        name = parts[1].strip().split("@", 1)[0]
        if name.startswith(PREFIX):
            names.append(name)
    return names


# The names a rig of tag <pid> (the default tag) gives its namespaces and veth ends, and the
# namespace available() probes with: ucxb<pid>a, ucxb<pid>b, ucxb<pid>probe.
_PID_NAME: Final = re.compile(rf"^{PREFIX}(\d+)(?:a|b|probe)$")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


@dataclass(frozen=True)
class NetnsRig:
    """Two namespaces ``ns_a``/``ns_b``, veth ends ``if_a``/``if_b``, addresses ``addr_a/b``."""

    tag: str
    ns_a: str
    ns_b: str
    if_a: str
    if_b: str
    addr_a: str
    addr_b: str
    prefixlen: int = 24
    mtu: int = 1500

    # -- creation and removal -------------------------------------------------------------

    @classmethod
    def create(
        cls, tag: str | None = None, *, mtu: int = 1500, seed: int | None = None
    ) -> NetnsRig:
        """Create the rig. On any failure, whatever was created is removed before raising."""
        tag = tag or str(os.getpid())
        name = f"{PREFIX}{tag}"
        if len(name) + 1 > 15:  # interface names are at most 15 bytes
            raise RigError(f"rig tag {tag!r} too long for an interface name")
        net = _pick_subnet(random.Random(seed))
        hosts = list(net.hosts())
        rig = cls(
            tag=tag,
            ns_a=f"{name}a",
            ns_b=f"{name}b",
            if_a=f"{name}a",
            if_b=f"{name}b",
            addr_a=str(hosts[0]),
            addr_b=str(hosts[1]),
            prefixlen=net.prefixlen,
            mtu=mtu,
        )
        atexit.register(rig.destroy)
        try:
            rig._build()
        except BaseException:
            rig.destroy()
            raise
        log.info("netns rig %s: %s=%s, %s=%s", tag, rig.ns_a, rig.addr_a, rig.ns_b, rig.addr_b)
        return rig

    def _build(self) -> None:
        for ns in (self.ns_a, self.ns_b):
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        # Create the pair in namespace a directly and move the b end: nothing ever sits in the
        # root namespace except for the instant between the two commands.
        _ip(
            "-n",
            self.ns_a,
            "link",
            "add",
            self.if_a,
            "mtu",
            str(self.mtu),
            "type",
            "veth",
            "peer",
            "name",
            self.if_b,
            "netns",
            self.ns_b,
        )
        for ns, ifname, addr in (
            (self.ns_a, self.if_a, self.addr_a),
            (self.ns_b, self.if_b, self.addr_b),
        ):
            _ip("-n", ns, "addr", "add", f"{addr}/{self.prefixlen}", "dev", ifname)
            _ip("-n", ns, "link", "set", ifname, "mtu", str(self.mtu), "up")
        self._wait_running()

    def _wait_running(self, timeout: float = 10.0) -> None:
        """Wait for carrier on both ends: UCX ignores an interface that is not yet RUNNING."""
        deadline = time.monotonic() + timeout
        while True:
            states = [
                _ip("-n", ns, "-o", "link", "show", "dev", ifname).stdout
                for ns, ifname in ((self.ns_a, self.if_a), (self.ns_b, self.if_b))
            ]
            if all("LOWER_UP" in s and "state UP" in s for s in states):
                return
            if time.monotonic() > deadline:
                raise RigError(f"veth pair not up after {timeout:.0f}s: {states}")
            time.sleep(0.05)

    def destroy(self) -> None:
        """Remove both namespaces (their veth ends go with them). Idempotent, never raises."""
        for ns in (self.ns_a, self.ns_b):
            _ip("netns", "del", ns, check=False)
        for ifname in (self.if_a, self.if_b):  # a pair left in the root namespace by a failure
            _ip("link", "del", ifname, check=False)

    def __enter__(self) -> NetnsRig:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    # -- using it -------------------------------------------------------------------------

    def ns(self, host: Host) -> str:
        return {"a": self.ns_a, "b": self.ns_b}[host]

    def ifname(self, host: Host) -> str:
        return {"a": self.if_a, "b": self.if_b}[host]

    def addr(self, host: Host) -> str:
        return {"a": self.addr_a, "b": self.addr_b}[host]

    def wrap(self, host: Host, argv: Sequence[str], *, isolate: bool = True) -> list[str]:
        """``argv`` prefixed so that it runs in the namespace of ``host``.

        With ``isolate`` (the default) the command also gets its own IPC and UTS namespaces,
        with the hostname set to the namespace's name. Without its own IPC namespace a "host"
        is not a separate machine to UCX: it sees the same System V shared memory as the other
        one and connects the two over ``sysv`` instead of TCP (measured with
        ``UCX_PROTO_INFO=y``). Every process of one host must therefore descend from a single
        wrapped command (one torchrun per host), since each wrap makes a fresh IPC namespace.
        """
        prefix = ["ip", "netns", "exec", self.ns(host)]
        if not isolate:
            return [*prefix, *argv]
        # hostname runs inside the new UTS namespace only: never without --uts.
        script = 'hostname "$0" && exec "$@"'
        return [
            *prefix,
            "unshare",
            "--uts",
            "--ipc",
            "--",
            "sh",
            "-c",
            script,
            self.ns(host),
            *argv,
        ]

    def run(
        self,
        host: Host,
        argv: Sequence[str],
        *,
        timeout: float = 60.0,
        check: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            self.wrap(host, argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=None if env is None else dict(env),
        )
        if check and proc.returncode != 0:
            raise RigError(
                f"{' '.join(argv)} in {self.ns(host)} failed (exit {proc.returncode}):\n"
                f"{proc.stdout}{proc.stderr}"
            )
        return proc

    def udp_counters(self, host: Host) -> dict[str, int]:
        """``host``'s kernel UDP counters (the ``Udp:`` rows of /proc/net/snmp, which is per
        network namespace): ``RcvbufErrors`` is what the kernel dropped for a full buffer."""
        text = self.run(host, ["cat", "/proc/net/snmp"]).stdout
        names, values = [line.split()[1:] for line in text.splitlines() if line.startswith("Udp:")]
        return {n: int(v) for n, v in zip(names, values, strict=True)}

    def popen(self, host: Host, argv: Sequence[str], **kwargs: object) -> subprocess.Popen[str]:
        """Start ``argv`` in ``host``'s namespace in a new session (kill it with killpg)."""
        kwargs.setdefault("start_new_session", True)
        kwargs.setdefault("text", True)
        return subprocess.Popen(self.wrap(host, argv), **kwargs)  # type: ignore[call-overload,no-any-return]

    def env(self) -> dict[str, str]:
        """The ``RIG_*`` variables ``run`` exports."""
        return {
            "RIG_NS_A": self.ns_a,
            "RIG_NS_B": self.ns_b,
            "RIG_IF_A": self.if_a,
            "RIG_IF_B": self.if_b,
            "RIG_ADDR_A": self.addr_a,
            "RIG_ADDR_B": self.addr_b,
        }


def add_udp_drop(rig: NetnsRig, host: Host, port: int, probability: float) -> None:
    """Drop incoming UDP datagrams to ``port`` on ``host``'s veth at random (``probability``).

    The rule goes on the receiver's INPUT chain (an OUTPUT drop surfaces at the sender as EPERM)
    and disappears with the namespace. Needs ``iptables`` with the ``statistic`` match.
    """
    if not 0.0 <= probability <= 1.0:
        raise ValueError(f"probability must be in [0, 1], got {probability}")
    if shutil.which("iptables") is None:
        raise RigError("iptables is not installed (apt-get install iptables)")
    rig.run(
        host,
        [
            "iptables",
            "-A",
            "INPUT",
            "-i",
            rig.ifname(host),
            "-p",
            "udp",
            "--dport",
            str(port),
            "-m",
            "statistic",
            "--mode",
            "random",
            "--probability",
            f"{probability:.6f}",
            "-j",
            "DROP",
        ],
    )


def _remove(select: Callable[[str], bool]) -> list[str]:
    removed = []
    for ns in _rig_namespaces():
        if select(ns):
            _ip("netns", "del", ns, check=False)
            removed.append(ns)
    for name in _rig_links():  # listed after the namespaces went, with their veth ends
        if select(name):
            _ip("link", "del", name, check=False)
            removed.append(name)
    return removed


def cleanup_stale(tag: int | str | None = None) -> list[str]:
    """Remove the namespaces (and root-namespace veths) of the rig tagged ``tag`` (the creating
    pid by default), or of every rig, live or not; return their names."""
    if tag is None:
        return _remove(lambda name: True)
    own = {f"{PREFIX}{tag}{suffix}" for suffix in ("a", "b", "probe")}
    return _remove(own.__contains__)


def cleanup_dead() -> list[str]:
    """Remove the rigs whose creating process no longer exists (left by a SIGKILL, which runs
    no cleanup); return their names. Rigs of live processes, rigs with a tag that is not a pid
    and those of ``create`` (``<pid>k``) are kept, so this is safe while other rigs are in use.
    Pids are those of this PID namespace: run it where the rigs were created."""

    def dead(name: str) -> bool:
        m = _PID_NAME.match(name)
        return m is not None and not _pid_alive(int(m.group(1)))

    return _remove(dead)


def _rig_from_env() -> NetnsRig | None:
    """The rig whose ``RIG_*`` variables (``run``'s) are set, else None. Under ``run`` that
    is the rig to use: the newest one may be another session's, running next to this one."""
    keys = ("RIG_NS_A", "RIG_NS_B", "RIG_IF_A", "RIG_IF_B", "RIG_ADDR_A", "RIG_ADDR_B")
    values = [os.environ.get(k, "") for k in keys]
    if not all(values):
        return None
    ns_a, ns_b, if_a, if_b, addr_a, addr_b = values
    return NetnsRig(ns_a[len(PREFIX) : -1], ns_a, ns_b, if_a, if_b, addr_a, addr_b)


def _created_ns(name: str) -> int:
    """When namespace `name` was made (its nsfs inode's mtime under /run/netns), 0 if unknown."""
    try:
        return os.stat(f"/run/netns/{name}").st_mtime_ns
    except OSError:
        return 0


def newest_name(names: Sequence[str], created: Callable[[str], int] = _created_ns) -> str:
    """The name made last. Not the largest name: tags are pids, and `ucxb999a` sorts after
    `ucxb1000a`, which would send `exec` into an older rig, perhaps another session's."""
    return max(names, key=lambda n: (created(n), n))


def _newest_rig() -> NetnsRig:
    names = [n for n in _rig_namespaces() if n.endswith("a")]
    if not names:
        raise RigError("no rig exists (create one with `netns_rig.py create`)")
    ns_a = newest_name(names)
    tag = ns_a[len(PREFIX) : -1]
    addrs = {}
    for host in ("a", "b"):
        out = _ip(
            "-n", f"{PREFIX}{tag}{host}", "-4", "-o", "addr", "show", "dev", f"{PREFIX}{tag}{host}"
        ).stdout.split()
        addrs[host] = out[out.index("inet") + 1].split("/")[0]
    return NetnsRig(tag, ns_a, f"{PREFIX}{tag}b", ns_a, f"{PREFIX}{tag}b", addrs["a"], addrs["b"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("create", help="create a rig and print it as JSON")
    c.add_argument("--mtu", type=int, default=1500)
    d = sub.add_parser("destroy", help="remove the rig with TAG (default: every rig)")
    d.add_argument("tag", nargs="?", help="the rig's tag (create's JSON; the pid for run)")
    cl = sub.add_parser("cleanup", help="remove every rig namespace and stray veth")
    cl.add_argument(
        "--dead",
        action="store_true",
        help="only the rigs of processes that no longer exist (safe next to running rigs)",
    )
    e = sub.add_parser(
        "exec", help="run a command in host a or b of the rig in RIG_* (run's), else the newest"
    )
    e.add_argument("host", choices=["a", "b"])
    e.add_argument(
        "--no-isolate", action="store_true", help="share the IPC and UTS namespaces of the caller"
    )
    e.add_argument("argv", nargs=argparse.REMAINDER)
    r = sub.add_parser("run", help="create a rig, run a command with RIG_* set, destroy the rig")
    r.add_argument("--mtu", type=int, default=1500)
    r.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)

    if args.cmd == "create":
        # "<pid>k": kept on purpose, so `cleanup --dead` must not take it for a killed run's.
        rig = NetnsRig.create(f"{os.getpid()}k", mtu=args.mtu)
        atexit.unregister(rig.destroy)  # the point is to leave it in place
        print(json.dumps(asdict(rig), indent=2))
        return 0
    if args.cmd in {"destroy", "cleanup"}:
        if getattr(args, "dead", False):
            removed = cleanup_dead()
        else:
            removed = cleanup_stale(getattr(args, "tag", None))
        for name in removed:
            print(f"removed {name}")
        return 0
    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not command:
        parser.error("no command given")
    if args.cmd == "exec":
        rig = _rig_from_env() or _newest_rig()
        return subprocess.call(rig.wrap(args.host, command, isolate=not args.no_isolate))
    with NetnsRig.create(mtu=args.mtu) as rig:
        print(json.dumps(asdict(rig)), file=sys.stderr)
        return subprocess.call(command, env={**os.environ, **rig.env()})


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    sys.exit(main())
