"""Two hosts for real: torchrun --nnodes 2 across the namespace rig (scripts/netns_rig.py),
shared by the tests/test_multinode_*.py files (one topic each, so that ``make test``'s two
workers can share the rig jobs: each file is one worker's).

One torchrun per host (``ip netns exec``, own IPC/UTS namespaces), static rendezvous on host
a's veth address and a port picked at run time; each rank runs every collective on the backend
under test and on Gloo with the same inputs (tests/multinode_worker.py) and checks both against
a local reference. Traffic stays on the rig's veth pair.

``start_jobs`` runs one job for several backends: each rank runs every backend's checks in
turn (the worker's phases), so torch, most of a job's cost, is imported once; each backend's
test judges its own part. Jobs that differ per backend in a setting read at import or group
creation (an environment variable such as ``UCX_*``), or that fail on purpose, stay one per
backend.

A test file takes ``needs_rig`` as its ``pytestmark`` (skipped, with the reason, where
namespaces cannot be created: not root, no iproute2/unshare) and imports ``rig_fixture``, the
fixture ``rig``: one rig per file, created after removing rigs left by killed earlier runs
(``fresh_rig``).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from dist_harness import free_port
from multinode_phases import PHASE_BEGIN, PHASE_END
from rig_harness import HostResult, NetnsRig, available, fresh_rig, run_on_hosts

_OK, _WHY = available()
needs_rig = pytest.mark.skipif(not _OK, reason=f"namespace rig unavailable: {_WHY}")

QUICK_SIZES = "1,1000,300000"
SLOW_SIZES = "1,1000,300000,1500000"  # 6 MB: more than one 4 MiB chunk


@pytest.fixture(scope="module", name="rig")
def rig_fixture() -> Iterator[NetnsRig]:
    """The fixture ``rig``: the test file's own rig (import rig_fixture into the file)."""
    with fresh_rig() as r:
        yield r


def _torchrun(rig: NetnsRig, node_rank: int, nproc: int, port: int, args: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "2",
        "--node-rank",
        str(node_rank),
        "--nproc-per-node",
        str(nproc),
        "--master-addr",
        rig.addr_a,
        "--master-port",
        str(port),
        "--max-restarts",
        "0",
        *args,
    ]


def start_job(
    rig: NetnsRig,
    backend: str,
    nproc: int,
    *,
    sizes: str = QUICK_SIZES,
    net_devices: bool = True,
    extra_env: dict[str, str] | None = None,
    timeout: float = 90.0,
) -> dict[str, HostResult]:
    """Run the worker on both hosts; return each host's exit status and output."""
    # The namespaces are fresh, so a port free here is free on host a too.
    port = free_port()
    worker = [
        "tests/multinode_worker.py",
        "--backend",
        backend,
        "--sizes",
        sizes,
        "--timeout",
        "60",
    ]
    env = {}
    for host in ("a", "b"):
        e = {"GLOO_SOCKET_IFNAME": rig.ifname(host), **(extra_env or {})}  # type: ignore[arg-type]
        if net_devices:
            e["UCX_NET_DEVICES"] = rig.ifname(host)  # type: ignore[arg-type]
        env[host] = e
    return run_on_hosts(
        rig,
        {"a": _torchrun(rig, 0, nproc, port, worker), "b": _torchrun(rig, 1, nproc, port, worker)},
        env=env,
        timeout=timeout,
    )


BACKENDS = ("ucx", "udp")


def start_jobs(
    rig: NetnsRig, backends: tuple[str, ...], nproc: int, **job: Any
) -> dict[str, dict[str, HostResult]]:
    """One job (start_job's keywords) whose ranks run every backend's checks in turn, in one
    process each (the worker's phases: torch imported once, not once per backend); return
    each backend's part of it as start_job would have for that backend alone.

    A backend's part is its phase's output on each host, with the phase's own exit status;
    where the job's status is not explained by the phases' (killed at the deadline, a crash,
    an exception outside a phase's checks) every backend gets the job's status instead."""
    results = start_job(rig, ",".join(backends), nproc, **job)
    split: dict[str, dict[str, HostResult]] = {b: {} for b in backends}
    for host, res in results.items():
        phases = {b: _phase(res.output, b) for b in backends}
        failed = [rc for _, rc in phases.values() if rc not in (None, 0)]
        ended = all(rc is not None for _, rc in phases.values())
        explained = ended and ((res.rc == 0 and not failed) or (res.rc == 1 and bool(failed)))
        for b, (text, rc) in phases.items():
            job_rc = 1 if res.rc == 0 else res.rc  # rc 0 with a phase that never ended: failed
            split[b][host] = HostResult(rc if explained else job_rc, text)
    return split


def _phase(output: str, backend: str) -> tuple[str, int | None]:
    """``backend``'s part of a host's output: from its ranks' first BEGIN line to their last
    END line, or to the end where some rank did not end the phase (the whole output where it
    never began); and its status: the worst rank's, None when some rank did not end it."""
    begin = output.find(f"{PHASE_BEGIN}{backend}\n")
    if begin < 0:
        return output, None
    ends = list(re.finditer(re.escape(PHASE_END + backend) + r" rc=(\d+)\n", output))
    if not ends or len(ends) != output.count(f"{PHASE_BEGIN}{backend}\n"):
        return output[begin:], None
    return output[begin : ends[-1].end()], max(int(m[1]) for m in ends)


def run_job(rig: NetnsRig, backend: str, nproc: int, **job: Any) -> dict[str, str]:
    """start_job (same keywords), then assert every rank reported OK; return the outputs."""
    return check_job(rig, backend, nproc, start_job(rig, backend, nproc, **job))


def check_job(
    rig: NetnsRig, backend: str, nproc: int, results: dict[str, HostResult]
) -> dict[str, str]:
    """Assert that every host exited 0 and every rank reported OK; return the outputs."""
    outputs = {h: r.output for h, r in results.items()}
    problems = [
        f"host {h}: exit {r.rc}" + (" (killed at the deadline)" if r.rc is None else "")
        for h, r in results.items()
        if r.rc != 0
    ]
    world = 2 * nproc
    ranks = sorted(
        int(m)
        for out in outputs.values()
        for m in re.findall(r"MULTINODE_OK rank=(\d+) world=" + str(world), out)
    )
    if ranks != list(range(world)):
        problems.append(f"ranks reporting OK: {ranks}, expected 0..{world - 1}")
    if problems:
        tails = "\n".join(f"--- host {h} ---\n{out[-4000:]}" for h, out in outputs.items())
        raise AssertionError("; ".join(problems) + "\n" + tails)
    for host, out in outputs.items():
        hostname = rig.ns(host)  # type: ignore[arg-type]
        assert f"host={hostname}" in out, f"ranks of host {host} did not run in {hostname}"
        # A world spanning both hosts never stages through shared memory; a ucx group of the
        # ranks on one host does (udp never does).
        assert out.count("staged=False host_group") == nproc, out[-2000:]
        host_staged = "True" if backend == "ucx" and nproc > 1 else "False" if nproc > 1 else "None"
        assert out.count(f"host_group_staged={host_staged}") == nproc, out[-2000:]
        # A ucx world that spans hosts keeps TCP, whether or not it first guessed one host.
        if backend == "ucx":
            kept = re.findall(r"MULTINODE_OK .* transports=(\S+)", out)
            assert len(kept) == nproc and all("tcp" in t.split(",") for t in kept), kept
    return outputs


def any_host_rounds(out: str) -> list[str]:
    """Whether each rank of a host's output needed the second round of addresses."""
    return re.findall(r"MULTINODE_OK .* any_host=(\S+)", out)


def group_threads(out: str) -> list[int]:
    """The threads each rank of a host's output counts as its groups' own on that host."""
    return [int(t) for t in re.findall(r"MULTINODE_OK .* group_threads=(\d+)", out)]


def lane_messages(out: str) -> list[str]:
    """The send-lane message counts each rank of a host's output reported."""
    return re.findall(r"MULTINODE_OK .* send_lane_messages=(\S+)", out)
