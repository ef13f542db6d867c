"""Run one command per "host" of the namespace rig (scripts/netns_rig.py), with a deadline.

``run_on_hosts(rig, {"a": argv_a, "b": argv_b}, env={...})`` starts both commands at once, each
in its host's namespace (own IPC/UTS namespaces, see ``NetnsRig.wrap``), waits for both, and
returns ``{host: HostResult(rc, output)}``. Past ``timeout`` (or once one host failed and the
other has had ``fail_grace`` seconds), every process still inside the rig's namespaces is
killed by pid: torchrun starts its workers in sessions of their own, so killing the launcher's
process group alone would leave them running.

``fresh_rig()`` creates a rig after removing those left by killed earlier runs (their pid no
longer exists; rigs of live processes, e.g. a test session running next to this one, stay).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

from netns_rig import NetnsRig, available, cleanup_dead, cleanup_stale  # noqa: E402

__all__ = [
    "REPO",
    "HostResult",
    "NetnsRig",
    "available",
    "cleanup_dead",
    "cleanup_stale",
    "fresh_rig",
    "kill_rig_processes",
    "run_on_hosts",
]


def fresh_rig(**kwargs: object) -> NetnsRig:
    """``NetnsRig.create(**kwargs)``, after removing the rigs of processes that are gone."""
    removed = cleanup_dead()
    if removed:
        print(f"rig_harness: removed rigs left by dead processes: {removed}", file=sys.stderr)
    return NetnsRig.create(**kwargs)  # type: ignore[arg-type]


@dataclass(frozen=True)
class HostResult:
    rc: int | None  # None: killed at the deadline
    output: str


def _ns_pids(ns: str) -> list[int]:
    proc = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=10)
    return [int(p) for p in proc.stdout.split() if p.isdigit()]


def kill_rig_processes(rig: NetnsRig) -> None:
    """SIGKILL every process inside the rig's two namespaces (all started by the tests)."""
    for ns in (rig.ns_a, rig.ns_b):
        for pid in _ns_pids(ns):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def base_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The parent's environment with the in-tree build importable and one thread per rank."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UCX_", "UCXBACKEND_"))}
    env["PYTHONPATH"] = str(REPO) + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
    )
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra or {})
    return env


def run_on_hosts(
    rig: NetnsRig,
    commands: Mapping[str, Sequence[str]],
    *,
    env: Mapping[str, Mapping[str, str]] | None = None,
    timeout: float = 90.0,
    fail_grace: float = 10.0,
    cwd: str | os.PathLike[str] = REPO,
) -> dict[str, HostResult]:
    env = env or {}
    procs: dict[str, subprocess.Popen[str]] = {}
    with tempfile.TemporaryDirectory(prefix="ucxb_rig_") as tmp:
        logs = {h: Path(tmp) / f"{h}.log" for h in commands}
        try:
            for host, argv in commands.items():
                with open(logs[host], "w") as log:
                    procs[host] = rig.popen(
                        host,
                        list(argv),
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        # TMPDIR: what the commands leave in temp (torchrun's torchelastic_*
                        # log dirs) goes with this run's directory.
                        env={**base_env(env.get(host)), "TMPDIR": tmp},
                        cwd=str(cwd),
                    )  # type: ignore[arg-type]
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                codes = {h: p.poll() for h, p in procs.items()}
                if all(c is not None for c in codes.values()):
                    break
                if any(c not in (None, 0) for c in codes.values()):
                    deadline = min(deadline, time.monotonic() + fail_grace)
                time.sleep(0.1)
        finally:
            kill_rig_processes(rig)
            for p in procs.values():
                if p.poll() is None:
                    p.kill()
                p.wait(timeout=10)
        timed_out = {h for h, p in procs.items() if p.returncode is not None and p.returncode < 0}
        return {
            h: HostResult(
                None if h in timed_out else p.returncode, logs[h].read_text(errors="replace")
            )
            for h, p in procs.items()
        }
