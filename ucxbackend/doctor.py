"""``python -m ucxbackend doctor``: a preflight for multi-node runs.

Each check returns a :class:`Check`: a status (``ok``, ``warn``, ``fail``), what was found,
and for anything not ok a one-line fix. The checks:

``interface``
    the interface ``UCXBACKEND_IFNAME`` / the route to ``MASTER_ADDR`` selects
    (:mod:`ucxbackend.netif`), its address, and the ``UCX_NET_DEVICES`` it implies.
``mtu``
    the MTU of that interface (and of the netdevs under RoCE ports): below 1500 warns.
``ucx_verbs``
    when RDMA devices exist (``/dev/infiniband``, ``/sys/class/infiniband``): whether the UCX
    the extension loads has the verbs (``libuct_ib``) and rdmacm (``libuct_rdmacm``) modules
    and lists an InfiniBand transport.
``roce_gid``
    per RoCE port (``link_layer`` Ethernet): the RoCE v2 GID of the chosen netdev, preferably
    its IPv4-mapped one, from ``gids``, ``gid_attrs/types`` and ``gid_attrs/ndevs``; the
    ``UCX_IB_GID_INDEX`` to use, and whether the one set agrees.
``memlock``
    ``RLIMIT_MEMLOCK``: RDMA registers (pins) memory, so a small limit fails with RDMA devices.
``gpudirect``
    only where a GPU (the NVIDIA driver's ``/proc/driver/nvidia``, or
    ``torch.cuda.is_available()``) and RDMA devices are both present, else "not applicable":
    ``nvidia_peermem`` loaded (``/sys/module/nvidia_peermem``, ``/proc/modules``), or the
    driver's dma-buf path (kernel >= 5.12 and the open NVIDIA kernel modules), for GPUDirect
    RDMA. :func:`gpudirect_facts` is also what ``python -m ucxbackend info`` reports.
``mps``
    only where a GPU is visible (the NVIDIA driver's files, as for ``gpudirect``),
    and never more than ``info``: whether an MPS server appears to run (its control pipe,
    ``$CUDA_MPS_PIPE_DIRECTORY/control``), and that ranks sharing a GPU should run under one
    (:mod:`ucxbackend.mps`; docs/cuda.md, "Ranks sharing a GPU: run MPS").

Every path (``/sys/class/infiniband``, ``/sys/class/net``, ``/dev/infiniband``,
``/proc/modules``, ``/sys/module``, the NVIDIA driver files) and every other input
(environment, memlock limit, UCX transports and module directory, interfaces, whether torch
sees a CUDA device) is injectable through :class:`Inputs`, so the tests run the checks against
fake trees. Exit status of the command: 1 when a check fails.
"""

from __future__ import annotations

import json
import os
import platform
import resource
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, TextIO

from . import mps, netif, rdma_sysfs

__all__ = [
    "Check",
    "GpuDirect",
    "Inputs",
    "Paths",
    "check_mps",
    "format_checks",
    "gpu_visible",
    "gpudirect_facts",
    "main",
    "rdma_present",
    "run_checks",
]

# "info": a fact worth knowing that is neither good nor bad here (it never fails the run).
Status = Literal["ok", "info", "warn", "fail"]

_IB_TRANSPORT_PREFIXES = ("rc", "ud", "dc")
_REBUILD_FIX = (
    "rebuild against a verbs-capable UCX: apt-get install rdma-core libucx-dev && "
    "make build UCX_HOME=/usr (or UCX_HOME=/usr pip install --no-build-isolation .)"
)
_MEMLOCK_MIN = 64 << 20  # below this, pinning a few chunk buffers already fails


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    found: str
    fix: str | None = None


@dataclass(frozen=True)
class Paths:
    infiniband: Path = Path("/sys/class/infiniband")
    net: Path = Path("/sys/class/net")
    dev_infiniband: Path = Path("/dev/infiniband")
    proc_modules: Path = Path("/proc/modules")
    nvidia_version: Path = Path("/proc/driver/nvidia/version")
    nvidia_params: Path = Path("/proc/driver/nvidia/params")
    nvidia_driver: Path = Path("/proc/driver/nvidia")
    sys_module: Path = Path("/sys/module")

    @classmethod
    def under(cls, root: Path) -> Paths:
        """The same paths below ``root`` (a container's or a test's fake root)."""
        return cls(**{f.name: root / getattr(cls(), f.name).relative_to("/") for f in fields(cls)})


@dataclass
class Inputs:
    """Everything the checks read. ``None`` fields are filled from the real system."""

    paths: Paths = field(default_factory=Paths)
    environ: Mapping[str, str] | None = None
    memlock: tuple[int, int] | None = None  # (soft, hard); resource.RLIM_INFINITY = unlimited
    ucx_transports: Sequence[str] | None = None
    ucx_module_dir: Path | None = None
    interfaces: Sequence[netif.Interface] | None = None
    resolve: Callable[[str], str] | None = None
    route_source: Callable[[str], str] | None = None
    kernel_release: str | None = None
    cuda_available: bool | None = None  # None: asks torch.cuda.is_available() when it matters


def _ucx_facts() -> tuple[list[str] | None, Path | None, str | None]:
    """Transports and module directory of the UCX the extension loads (or why unknown)."""
    import ucxbackend

    native = ucxbackend._C
    if native is None:
        return None, None, f"native extension not loadable ({ucxbackend.load_error()})"
    transports = sorted({str(t) for t, _ in native.ucx_transports()})
    lib = Path(str(native.ucx_library_path()))
    return transports, lib.resolve().parent / "ucx", None


def _fmt_limit(value: int) -> str:
    return "unlimited" if value == resource.RLIM_INFINITY else f"{value // 1024} KiB"


def _has_module(modules: Path, name: str) -> bool | None:
    try:
        text = modules.read_text()
    except OSError:
        return None
    return any(line.split(" ", 1)[0] == name for line in text.splitlines())


def _rdma_present(paths: Paths) -> bool:
    # A verbs device node, not the folder: a host with the RDMA core modules but no RDMA NIC
    # (the GPU machines here) has /dev/infiniband holding only rdma_cm.
    try:
        verbs = any(p.name.startswith("uverbs") for p in paths.dev_infiniband.iterdir())
    except OSError:
        verbs = False
    return verbs or bool(rdma_sysfs.read_ports(paths.infiniband))


def check_interface(inp: Inputs, env: Mapping[str, str]) -> tuple[Check, netif.Selection | None]:
    spec = env.get(netif.ENV_VAR) or None
    host = env.get("MASTER_ADDR") or None
    kw: dict[str, Any] = {"interfaces": inp.interfaces}
    if inp.resolve is not None:
        kw["resolve"] = inp.resolve
    if inp.route_source is not None:
        kw["route_source"] = inp.route_source
    try:
        sel = netif.select_interface(spec, host, **kw)
        devices = netif.ucx_net_devices_env(spec, host, env, ib_root=inp.paths.infiniband, **kw)
    except (ValueError, OSError) as exc:
        fix = f"set {netif.ENV_VAR} to one of the interfaces listed (prefix, '=' exact, '^' excl.)"
        return Check("interface", "fail", str(exc), fix), None
    ucx = devices.get("UCX_NET_DEVICES") or (
        f"{env['UCX_NET_DEVICES']} (set by you)" if env.get("UCX_NET_DEVICES") else "not set"
    )
    found = f"{sel.name} {sel.address} ({sel.reason}); UCX_NET_DEVICES: {ucx}"
    if host is None and spec is None:
        return Check(
            "interface",
            "warn",
            found + "; MASTER_ADDR not set",
            f"set MASTER_ADDR (or {netif.ENV_VAR}) as the job will",
        ), sel
    return Check("interface", "ok", found), sel


def check_mtu(
    sel: netif.Selection | None, ports: Sequence[rdma_sysfs.RdmaPort], net_root: Path
) -> Check:
    if sel is None:
        return Check("mtu", "warn", "no interface selected", "fix the interface check first")
    problems = []
    if not sel.loopback and sel.mtu < 1500:
        problems.append(f"{sel.name} mtu {sel.mtu} < 1500")
    found = [f"{sel.name} mtu {sel.mtu}"]
    for port in ports:
        for ndev in port.netdevs if port.is_roce else ():
            try:
                mtu = int((net_root / ndev / "mtu").read_text().strip())
            except (OSError, ValueError):
                continue
            found.append(f"{ndev} (RoCE {port.ucx_name}) mtu {mtu}")
            if mtu < 1500:
                problems.append(f"{ndev} mtu {mtu} < 1500")
    if problems:
        return Check(
            "mtu",
            "warn",
            "; ".join(found),
            "use the same MTU >= 1500 on every host and switch port "
            "(RoCE: 9000, `ip link set DEV mtu 9000`)",
        )
    return Check("mtu", "ok", "; ".join(found))


def check_ucx_verbs(inp: Inputs, rdma: bool) -> Check:
    if not rdma:
        return Check(
            "ucx_verbs",
            "ok",
            "no RDMA devices (/dev/infiniband absent): TCP and shared memory only",
        )
    if inp.ucx_transports is None and inp.ucx_module_dir is None:
        transports, module_dir, why = _ucx_facts()
        if why:
            return Check("ucx_verbs", "fail", why, "run `make build`")
    else:
        transports, module_dir = list(inp.ucx_transports or []), inp.ucx_module_dir
    ib_tls = [t for t in transports or [] if t.split("_")[0] in _IB_TRANSPORT_PREFIXES]
    libs = {
        name: module_dir is not None and any(module_dir.glob(f"libuct_{name}.so*"))
        for name in ("ib", "rdmacm")
    }
    found = (
        f"RDMA devices present; UCX modules in {module_dir}: "
        f"libuct_ib {'yes' if libs['ib'] else 'no'}, "
        f"libuct_rdmacm {'yes' if libs['rdmacm'] else 'no'}; "
        f"IB transports: {', '.join(ib_tls) or 'none'}"
    )
    if not libs["ib"]:
        return Check("ucx_verbs", "fail", found, _REBUILD_FIX)
    if not ib_tls:
        return Check(
            "ucx_verbs",
            "fail",
            found,
            "UCX has verbs but opens no IB device: check `ibv_devinfo` and "
            "that rdma-core's provider (libibverbs-providers) is installed",
        )
    if not libs["rdmacm"]:
        return Check(
            "ucx_verbs",
            "warn",
            found,
            "install librdmacm (rdma-core) for rdmacm connection setup, then rebuild with UCX_HOME",
        )
    return Check("ucx_verbs", "ok", found)


def check_roce_gids(
    ports: Sequence[rdma_sysfs.RdmaPort], sel: netif.Selection | None, env: Mapping[str, str]
) -> list[Check]:
    roce = [p for p in ports if p.is_roce]
    if not roce:
        return [Check("roce_gid", "ok", "no RoCE ports")]
    chosen = sel.name if sel is not None else None
    # ports behind the chosen netdev first; if none is, every RoCE port
    relevant = [p for p in roce if chosen in p.netdevs] or roce
    user = env.get("UCX_IB_GID_INDEX", "").strip()
    checks = []
    for port in relevant:
        ndev = chosen if chosen in port.netdevs else (port.netdevs[0] if port.netdevs else None)
        ipv4 = sel.address if sel is not None and ndev == chosen else None
        gid = rdma_sysfs.best_roce_v2_gid(port, ndev, ipv4)
        name = f"roce_gid {port.ucx_name}"
        state = "" if port.active else f" (port state {port.state})"
        if gid is None:
            types = sorted({g.type or "?" for g in port.gids}) or ["none"]
            checks.append(
                Check(
                    name,
                    "fail",
                    f"no RoCE v2 GID on {port.ucx_name} "
                    f"(netdev {ndev}; GID types: {', '.join(types)}){state}",
                    f"give {ndev} an IPv4 address (RoCE v2 GIDs follow the "
                    "netdev's addresses) and check `rdma link`",
                )
            )
            continue
        found = (
            f"{port.ucx_name} RoCE v2 GID index {gid.index} = {gid.gid}"
            f"{f' ({gid.ipv4})' if gid.ipv4 else ''} on {gid.ndev or ndev}{state}"
        )
        if user and user != "auto" and user != str(gid.index):
            checks.append(
                Check(
                    name,
                    "warn",
                    f"{found}; but UCX_IB_GID_INDEX={user}",
                    f"export UCX_IB_GID_INDEX={gid.index}",
                )
            )
        elif not port.active:
            checks.append(
                Check(
                    name,
                    "warn",
                    found,
                    f"bring the port up: `ip link set {ndev} up`"
                    " and check the cable/switch (`rdma link`)",
                )
            )
        elif user == str(gid.index):
            checks.append(Check(name, "ok", f"{found}; UCX_IB_GID_INDEX={user}"))
        else:
            checks.append(
                Check(
                    name,
                    "warn",
                    f"{found}; UCX_IB_GID_INDEX not set (UCX picks)",
                    f"export UCX_IB_GID_INDEX={gid.index}",
                )
            )
    return checks


def check_memlock(limit: tuple[int, int], rdma: bool) -> Check:
    soft, hard = limit
    found = f"RLIMIT_MEMLOCK soft {_fmt_limit(soft)}, hard {_fmt_limit(hard)}"
    if soft == resource.RLIM_INFINITY:
        return Check("memlock", "ok", found)
    if not rdma:
        return Check("memlock", "ok", found + " (only RDMA pins memory; none here)")
    fix = (
        "`ulimit -l unlimited` (Docker: --ulimit memlock=-1; systemd: LimitMEMLOCK=infinity; "
        "/etc/security/limits.conf: * - memlock unlimited)"
    )
    return Check("memlock", "fail" if soft < _MEMLOCK_MIN else "warn", found, fix)


@dataclass(frozen=True)
class GpuDirect:
    """What GPUDirect RDMA needs, as found: a GPU, an RDMA device, and a way for the RDMA
    device to reach GPU memory (``nvidia_peermem``, or dma-buf)."""

    gpu: bool
    gpu_how: str  # how the GPU was found ("" when none was)
    rdma: bool
    peermem: bool
    dmabuf_kernel: bool  # kernel >= 5.12
    open_modules: bool  # the open NVIDIA kernel modules (what dma-buf needs from the driver)
    kernel: str

    @property
    def applicable(self) -> bool:
        return self.gpu and self.rdma

    @property
    def dmabuf(self) -> bool:
        return self.dmabuf_kernel and self.open_modules

    @property
    def possible(self) -> bool:
        return self.applicable and (self.peermem or self.dmabuf)

    def describe(self) -> str:
        """One line: whether GPUDirect RDMA is possible here, and why."""
        if not self.rdma:
            gpu = f" ({self.gpu_how})" if self.gpu else " and no NVIDIA GPU"
            return (
                f"not applicable: no RDMA devices{gpu}; CUDA tensors between hosts go through "
                "host memory"
            )
        if not self.gpu:
            return (
                "not applicable: RDMA devices but no NVIDIA GPU (no /proc/driver/nvidia, "
                "torch.cuda.is_available() False)"
            )
        if self.peermem:
            return f"possible: RDMA devices, {self.gpu_how}, nvidia_peermem loaded"
        if self.dmabuf:
            return (
                f"possible: RDMA devices, {self.gpu_how}, dma-buf (kernel {self.kernel} and "
                "the open NVIDIA kernel modules; nvidia_peermem not needed)"
            )
        return (
            f"not possible: RDMA devices and {self.gpu_how}, but nvidia_peermem is not loaded, "
            f"and dma-buf needs kernel >= 5.12 (have {self.kernel}) and the open NVIDIA kernel "
            f"modules ({'loaded' if self.open_modules else 'not loaded'})"
        )


def _torch_cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # no torch, a broken driver: no usable GPU either way
        return False


def _nvidia_driver(paths: Paths) -> str:
    """How the files show an NVIDIA driver; "" when they do not."""
    if paths.nvidia_driver.is_dir() or paths.nvidia_version.exists():
        return "an NVIDIA driver (/proc/driver/nvidia)"
    if _has_module(paths.proc_modules, "nvidia"):
        return "an NVIDIA driver (module nvidia)"
    return ""


def gpudirect_facts(
    paths: Paths, rdma: bool, kernel: str, cuda_available: bool | None = None
) -> GpuDirect:
    """The :class:`GpuDirect` facts. torch is asked about CUDA (``cuda_available`` None) only
    when RDMA devices exist and the driver files show no NVIDIA driver."""
    how = _nvidia_driver(paths)
    if how:
        gpu = True
    elif not rdma:
        gpu, how = False, ""  # not applicable either way: no need to ask torch
    else:
        gpu = _torch_cuda_available() if cuda_available is None else cuda_available
        how = "a CUDA device (torch.cuda.is_available())" if gpu else ""
    peermem = (paths.sys_module / "nvidia_peermem").exists() or bool(
        _has_module(paths.proc_modules, "nvidia_peermem")
    )
    try:
        major, minor = (int(x) for x in kernel.split(".")[:2])
        dmabuf_kernel = (major, minor) >= (5, 12)
    except ValueError:
        dmabuf_kernel = False
    try:
        open_modules = "open kernel module" in paths.nvidia_version.read_text().lower()
    except OSError:
        open_modules = False
    return GpuDirect(gpu, how, rdma, peermem, dmabuf_kernel, open_modules, kernel)


def check_gpudirect(
    paths: Paths, rdma: bool, kernel: str, cuda_available: bool | None = None
) -> Check:
    facts = gpudirect_facts(paths, rdma, kernel, cuda_available)
    if not facts.applicable or facts.possible:
        return Check("gpudirect", "ok", facts.describe())
    return Check(
        "gpudirect",
        "warn",
        facts.describe(),
        "`modprobe nvidia_peermem` (or use the open NVIDIA kernel modules with "
        "kernel >= 5.12 for dma-buf)",
    )


def gpu_visible(paths: Paths, cuda_available: bool | None = None) -> bool:
    """Whether this host shows a CUDA GPU: the NVIDIA driver's files (a GPU needs the driver
    loaded, and the files show it in a container too), else ``cuda_available`` where given.
    torch is not asked: on a host without the driver it could only say no."""
    return bool(_nvidia_driver(paths)) or bool(cuda_available)


def check_mps(env: Mapping[str, str], gpu: bool) -> Check | None:
    """Informational (never a failure): whether an MPS server appears to run; None where no
    GPU is visible."""
    if not gpu:
        return None
    pipe = mps.control_pipe(env)
    if mps.server_running(env):
        return Check(
            "mps",
            "info",
            f"an MPS server appears to run (its control pipe {pipe} exists): CUDA processes "
            "of this environment share one context on its GPUs",
        )
    return Check(
        "mps",
        "info",
        f"no MPS server (no control pipe at {pipe}); ranks that share a GPU should run under "
        f"one, or the GPU switches between their CUDA contexts at every device wait: "
        f"`{mps.CONTROL} -d` before the job, or `bench --mps` ({mps.DOCS})",
    )


def rdma_present(paths: Paths | None = None) -> bool:
    """Whether RDMA devices exist (``/dev/infiniband``, or ports in ``/sys/class/infiniband``)."""
    return _rdma_present(paths or Paths())


def run_checks(inp: Inputs | None = None) -> list[Check]:
    inp = inp or Inputs()
    env = os.environ if inp.environ is None else inp.environ
    paths = inp.paths
    ports = rdma_sysfs.read_ports(paths.infiniband)
    rdma = _rdma_present(paths)
    iface, sel = check_interface(inp, env)
    memlock = inp.memlock or resource.getrlimit(resource.RLIMIT_MEMLOCK)
    sharing = check_mps(env, gpu_visible(paths, inp.cuda_available))
    return [
        iface,
        check_mtu(sel, ports, paths.net),
        check_ucx_verbs(inp, rdma),
        *check_roce_gids(ports, sel, env),
        check_memlock(memlock, rdma),
        check_gpudirect(
            paths, rdma, inp.kernel_release or platform.release(), inp.cuda_available
        ),
        *([sharing] if sharing is not None else []),
    ]


def format_checks(checks: Sequence[Check]) -> str:
    width = max(len(c.name) for c in checks)
    lines = []
    for c in checks:
        lines.append(f"[{c.status.upper():4}] {c.name.ljust(width)}  {c.found}")
        if c.fix:
            lines.append(f"       {''.ljust(width)}  fix: {c.fix}")
    worst = (
        "fail"
        if any(c.status == "fail" for c in checks)
        else ("warn" if any(c.status == "warn" for c in checks) else "ok")
    )
    lines.append(f"doctor: {worst}")
    return "\n".join(lines) + "\n"


def main(as_json: bool, out: TextIO, inp: Inputs | None = None) -> int:
    checks = run_checks(inp)
    failed = any(c.status == "fail" for c in checks)
    if as_json:
        json.dump({"ok": not failed, "checks": [asdict(c) for c in checks]}, out, indent=2)
        out.write("\n")
    else:
        out.write(format_checks(checks))
    return 1 if failed else 0
