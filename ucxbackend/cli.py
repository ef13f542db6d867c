"""Command line: ``python -m ucxbackend <command>``.

Commands:

``info``
    Versions (ucxbackend, torch, Python, UCX), the UCX library actually loaded, build info,
    the transports/devices UCX sees, which of UCX's CUDA transports (``cuda_copy``,
    ``cuda_ipc``, ``gdr_copy``) it has and whether GPUDirect RDMA is possible here, the
    ``UCX_*`` variables set and the configuration in force with where each value came from,
    and that ``udp`` stages CUDA tensors through pinned host memory. ``--json`` for
    machine-readable output. Exits 1 when the native extension cannot be loaded or the
    configuration is invalid.

``bench``
    nccl-tests-style benchmark of collectives on several backends side by side (``ucx``,
    ``gloo``, an optional mpi4py reference): time, algbw, busbw, #wrong per size; ``--json``,
    ``--plot``; ``bench startup`` times ``init_process_group`` and the first all_reduce at
    growing world sizes. Implemented in :mod:`ucxbackend.bench`, whose docstring has examples.

``soak``
    A long run of mixed ops, sizes, subgroups and create/destroy cycles on ``ucx`` and/or
    ``udp``, every result checked against numpy, printing each rank's fds, threads, RSS and
    ``/dev/shm`` segments over time, and a verdict: flat or growing (exit 1). Implemented in
    :mod:`ucxbackend.soak`.

``config``
    The reference of every knob, as Markdown, from the schema the backend parses with;
    ``--write PATH`` replaces the generated block of ``docs/configuration.md`` instead.

``doctor``
    Preflight for multi-node runs: the interface chosen and its MTU, UCX built with verbs when
    RDMA devices exist, the RoCE v2 GID index (``UCX_IB_GID_INDEX``), the memlock limit,
    GPUDirect RDMA; a one-line fix for each problem. Exits 1 when a check fails. Implemented
    in :mod:`ucxbackend.doctor`.

New commands plug in by adding a ``_Command`` to ``COMMANDS``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from . import doctor

__all__ = ["COMMANDS", "CUDA_TRANSPORTS", "build_parser", "collect_info", "format_info", "main"]

_MAKE_BUILD_HINT = "run `make build` (or `pip install --no-build-isolation .`)"

# UCX's transports for GPU memory: copies to and from the host, between processes on one node
# (CUDA IPC), and GDRCopy's CPU mappings of GPU memory for small messages.
CUDA_TRANSPORTS = ("cuda_copy", "cuda_ipc", "gdr_copy")
UDP_CUDA = "stages CUDA tensors through pinned host memory (no GPUDirect)"


def _call(fn: Callable[[], Any], errors: list[str], what: str) -> Any:
    try:
        return fn()
    except Exception as exc:
        errors.append(f"{what} failed: {type(exc).__name__}: {exc}")
        return None


def _group_transports(pairs: Sequence[Sequence[str]]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for transport, device in pairs:
        devices = grouped.setdefault(str(transport), [])
        if str(device) not in devices:
            devices.append(str(device))
    return {t: sorted(grouped[t]) for t in sorted(grouped)}


def collect_info(
    env: Mapping[str, str] | None = None, *, doctor_inputs: doctor.Inputs | None = None
) -> dict[str, Any]:
    """Everything ``info`` reports, as a JSON-serialisable dict.

    ``ok`` is False (and ``errors`` says why) when the native extension is missing, a native
    query fails or the configuration is invalid. ``doctor_inputs`` replaces the system paths
    (``/sys/class/infiniband``, ``/sys/module``, the NVIDIA driver files), the kernel release
    and the CUDA probe behind the GPUDirect RDMA line, for tests.
    """
    import torch
    import torch.distributed as dist

    import ucxbackend
    from ucxbackend import config as cfg

    env = os.environ if env is None else env
    errors: list[str] = []
    native = ucxbackend._C

    info: dict[str, Any] = {
        "ucxbackend": {
            "version": ucxbackend.__version__,
            "package_dir": os.path.dirname(os.path.abspath(ucxbackend.__file__)),
            "native_loaded": native is not None,
            "native_module": getattr(native, "__file__", None),
            "native_error": ucxbackend.load_error(),
        },
        "torch": {
            "version": torch.__version__,
            "cuda": torch.version.cuda,
            "cuda_available": torch.cuda.is_available(),
            "distributed_available": dist.is_available(),
            "ucx_registered": dist.is_available()
            and ucxbackend.BACKEND_NAME.upper() in getattr(dist.Backend, "_plugins", {}),
        },
        "python": {
            "version": platform.python_version(),
            "executable": sys.executable,
        },
        "platform": platform.platform(),
        "ucx": None,
        "build": None,
        "env": {k: env[k] for k in sorted(env) if k.startswith("UCX_")},
        "config": None,
        "unknown_config_env": [],
    }

    if native is None:
        errors.append(
            f"the native extension ucxbackend._C could not be loaded "
            f"({ucxbackend.load_error()}); {_MAKE_BUILD_HINT}"
        )
    else:
        pairs = _call(native.ucx_transports, errors, "_C.ucx_transports()")
        info["ucx"] = {
            "version": _call(native.ucx_version, errors, "_C.ucx_version()"),
            "library_path": _call(native.ucx_library_path, errors, "_C.ucx_library_path()"),
            "transports": None if pairs is None else _group_transports(pairs),
        }
        info["ucx"]["defaults"] = _ucx_defaults(native, errors, env, info["ucx"]["version"])
        build = _call(native.build_info, errors, "_C.build_info()")
        info["build"] = None if build is None else {str(k): str(v) for k, v in build.items()}

    info["cuda"] = _cuda_info(
        None if info["ucx"] is None else info["ucx"]["transports"],
        bool(info["torch"]["cuda_available"]),
        doctor_inputs,
    )

    info["one_host"] = None
    if native is not None:  # the knobs are declared there
        info["unknown_config_env"] = cfg.unknown_env_vars(env)
        try:
            config = cfg.Config.from_env(env)
            info["config"] = config.describe()
            # The choice reads this process's UCX_TLS, as a group's creation does.
            choice = _call(
                lambda: native.one_host_transport(config.to_native()),
                errors,
                "_C.one_host_transport()",
            )
            if choice is not None:
                info["one_host"] = {"transport": choice[0], "why": choice[1]}
        except ValueError as exc:
            errors.append(f"invalid configuration: {exc}")

    info["ok"] = not errors
    info["errors"] = errors
    return info


def _cuda_info(
    transports: Mapping[str, list[str]] | None,
    cuda_available: bool,
    inputs: doctor.Inputs | None,
) -> dict[str, Any]:
    """UCX's CUDA transports (None: unknown, the extension is not loaded), GPUDirect RDMA (the
    facts ``doctor`` checks) and how udp carries CUDA tensors."""
    inp = inputs or doctor.Inputs()
    rdma = doctor.rdma_present(inp.paths)
    facts = doctor.gpudirect_facts(
        inp.paths,
        rdma,
        inp.kernel_release or platform.release(),
        cuda_available if inp.cuda_available is None else inp.cuda_available,
    )
    return {
        "ucx_transports": None
        if transports is None
        else {t: list(transports[t]) for t in CUDA_TRANSPORTS if t in transports},
        "ucx_missing": None
        if transports is None
        else [t for t in CUDA_TRANSPORTS if t not in transports],
        "gpudirect_rdma": {
            "possible": facts.possible,
            "applicable": facts.applicable,
            "gpu": facts.gpu,
            "rdma_devices": facts.rdma,
            "nvidia_peermem": facts.peermem,
            "dmabuf": facts.dmabuf,
            "summary": facts.describe(),
        },
        "udp": UDP_CUDA,
    }


def _cuda_rows(cuda: Mapping[str, Any]) -> list[tuple[str, str]]:
    present, missing = cuda["ucx_transports"], cuda["ucx_missing"]
    if present is None:
        ucx = "unknown (the native extension is not loaded)"
    elif not present:
        ucx = f"none ({', '.join(missing)} absent: this UCX has no CUDA support, or sees no GPU)"
    else:
        ucx = ", ".join(f"{t} ({', '.join(devs)})" for t, devs in present.items())
        if missing:
            ucx += f"; absent: {', '.join(missing)}"
    return [
        ("UCX CUDA transports", ucx),
        ("GPUDirect RDMA", cuda["gpudirect_rdma"]["summary"]),
        ("udp", cuda["udp"]),
    ]


def _version_tuple(version: object) -> tuple[int, ...]:
    """``"1.22.0"`` -> ``(1, 22, 0)``; the leading numeric parts only."""
    parts: list[int] = []
    for part in str(version).split("."):
        if not part.isdigit():
            break
        parts.append(int(part))
    return tuple(parts)


def _ucx_defaults(
    native: Any, errors: list[str], env: Mapping[str, str], ucx_version: object
) -> list[dict[str, Any]] | None:
    """The UCX settings the backend chooses (transports/ucx/ucx_context.cpp), one row per
    variable, each with whether it is in force for ``env``. The rule is the C++ one: a group of
    variables applies when this UCX is new enough and ``env`` sets none of them."""
    rows = _call(lambda: native.ucx_defaults(), errors, "_C.ucx_defaults()")
    if rows is None:
        return None
    have = _version_tuple(ucx_version)
    out: list[dict[str, Any]] = []
    for variables, value, min_version in rows:
        group = [str(v) for v in variables]
        mine = [v for v in group if v in env]
        if mine:
            why = f"not applied: you set {', '.join(mine)}"
        elif have < _version_tuple(min_version):
            why = f"not applied: needs UCX >= {min_version} (set it yourself)"
        else:
            why = "applied"
        out += [
            {"variable": v, "value": str(value), "applied": why == "applied", "status": why}
            for v in group
        ]
    return out


def _rows(rows: Sequence[tuple[str, str]], indent: str = "") -> list[str]:
    width = max((len(k) for k, _ in rows), default=0)
    return [f"{indent}{k.ljust(width)}  {v}".rstrip() for k, v in rows]


def format_info(info: Mapping[str, Any]) -> str:
    """Human-readable rendering of :func:`collect_info`'s result."""
    ub, th, py, ucx = info["ucxbackend"], info["torch"], info["python"], info["ucx"]
    cuda = th["cuda"] or "none"
    cuda_available = "yes" if th["cuda_available"] else "no"
    head: list[tuple[str, str]] = [
        ("ucxbackend version", f"{ub['version']} ({ub['package_dir']})"),
        ("native module", ub["native_module"] or "NOT LOADED"),
        (
            "torch version",
            f"{th['version']} (CUDA {cuda}, cuda available: {cuda_available})",
        ),
        ("Python version", f"{py['version']} ({py['executable']})"),
        ("platform", info["platform"]),
    ]
    if ucx is not None:
        head += [
            ("UCX version", str(ucx["version"])),
            ("UCX library", str(ucx["library_path"])),
        ]
    lines = _rows(head)

    if info["build"] is not None:
        lines += ["", "Build", *_rows(sorted(info["build"].items()), "  ")]

    if ucx is not None and ucx["transports"] is not None:
        transports = [(t, ", ".join(devs)) for t, devs in ucx["transports"].items()]
        lines += ["", "Transports UCX sees (transport: devices)"]
        lines += _rows(transports, "  ") if transports else ["  (none)"]

    if info.get("one_host") is not None:
        one_host = info["one_host"]
        lines += ["", "Between the ranks of one host (docs/architecture.md#one-host-transport)"]
        carrier = "the backend's shared-memory rings" if one_host["transport"] == "shm" else "UCX"
        lines += _rows([("ucx groups", f"{carrier} ({one_host['why']})")], "  ")

    if info.get("cuda") is not None:
        lines += ["", "CUDA", *_rows(_cuda_rows(info["cuda"]), "  ")]

    if ucx is not None and ucx.get("defaults"):
        lines += ["", "UCX settings ucxbackend chooses (set any of a group yourself to keep UCX's)"]
        chosen = [(d["variable"], f"{d['value']:<6} {d['status']}") for d in ucx["defaults"]]
        lines += _rows(chosen, "  ")

    lines += ["", "UCX_* environment variables"]
    lines += _rows(sorted(info["env"].items()), "  ") if info["env"] else ["  (none set)"]

    if info["config"] is not None:
        lines += ["", "Configuration in force"]
        table = [("knob", "value", "source", "variable")] + [
            (row["name"], str(row["value"]), row["source"], row["env_var"])
            for row in info["config"]
        ]
        widths = [max(len(r[i]) for r in table) for i in range(3)]
        lines += [
            "  " + "  ".join(c.ljust(w) for c, w in zip(r[:3], widths, strict=True)) + "  " + r[3]
            for r in table
        ]
    if info["unknown_config_env"]:
        lines += ["", "Unknown UCXBACKEND_* variables (ignored; typos?)"]
        lines += [f"  {name}" for name in info["unknown_config_env"]]
    return "\n".join(lines) + "\n"


def _cmd_info(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    info = collect_info()
    if args.json:
        json.dump(info, out, indent=2, sort_keys=False)
        out.write("\n")
    else:
        out.write(format_info(info))
    for message in info["errors"]:
        err.write(f"ERROR: {message}\n")
    return 0 if info["ok"] else 1


@dataclass(frozen=True)
class _Command:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, TextIO, TextIO], int]


def _info_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")


def _bench_arguments(parser: argparse.ArgumentParser) -> None:
    from ucxbackend import bench

    bench.add_arguments(parser)


def _cmd_bench(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from ucxbackend import bench

    return bench.run(args, out, err)


def _soak_arguments(parser: argparse.ArgumentParser) -> None:
    from ucxbackend import soak

    soak.add_arguments(parser)


def _cmd_soak(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from ucxbackend import soak

    return soak.run(args, out, err)


def _cmd_doctor(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from ucxbackend import doctor

    return doctor.main(args.json, out)


def _config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--write",
        metavar="PATH",
        help="replace the generated block of PATH (docs/configuration.md) instead of printing",
    )


def _cmd_config(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from pathlib import Path

    from ucxbackend import config_reference

    if args.write is None:
        out.write(config_reference.render())
        return 0
    changed = config_reference.write(Path(args.write))
    out.write(f"{args.write}: {'updated' if changed else 'already up to date'}\n")
    return 0


COMMANDS: tuple[_Command, ...] = (
    _Command(
        name="info",
        help="versions, UCX library, transports, environment and configuration",
        add_arguments=_info_arguments,
        run=_cmd_info,
    ),
    _Command(
        name="bench",
        help="nccl-tests-style benchmark of collectives, ucx and other backends side by side",
        add_arguments=_bench_arguments,
        run=_cmd_bench,
    ),
    _Command(
        name="soak",
        help="long mixed run of ucx/udp that checks every result and watches for leaks",
        add_arguments=_soak_arguments,
        run=_cmd_soak,
    ),
    _Command(
        name="config",
        help="the reference of every knob, as Markdown, from the schema the backend parses with",
        add_arguments=_config_arguments,
        run=_cmd_config,
    ),
    _Command(
        name="doctor",
        help="preflight for multi-node runs: interface, MTU, UCX verbs, RoCE GID, memlock",
        add_arguments=_info_arguments,
        run=_cmd_doctor,
    ),
)


def build_parser() -> argparse.ArgumentParser:
    from ucxbackend import __version__

    parser = argparse.ArgumentParser(
        prog="python -m ucxbackend",
        description="ucxbackend: the 'ucx' torch.distributed backend",
    )
    parser.add_argument("--version", action="version", version=f"ucxbackend {__version__}")
    sub = parser.add_subparsers(dest="command", title="commands", required=True)
    for command in COMMANDS:
        p = sub.add_parser(command.name, help=command.help, description=command.help)
        command.add_arguments(p)
        p.set_defaults(_run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args._run(args, sys.stdout, sys.stderr))


if __name__ == "__main__":
    sys.exit(main())
