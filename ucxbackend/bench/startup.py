"""``python -m ucxbackend bench startup``: how long a job waits for its process group.

What is timed is what a user waits for at every (re)start: each rank's
``init_process_group`` plus its first 8-byte ``all_reduce``, from a synchronized start. For
each world size, repeat and backend (in turn, so that a slow spell of the machine hits them
alike) the launcher forks the ranks (:class:`.launcher.ForkedRank`: torch and ucxbackend are
imported already, as in a job whose ranks have finished importing); each rank waits at a
file barrier until every rank is there, then times its own start; the figure of a start is
the max over ranks. The table shows the median over the repeats with min and max, and each
backend's time over Gloo's. For ``ucx`` and ``udp`` the breakdown shows where the slowest
rank's time went: torch's own part of ``init_process_group`` (Store connection, rendezvous),
the phases of the group's creation as the backend timed them
(:func:`ucxbackend.startup_profile`), the first op, and the Store calls the rank made.

Call order: :func:`run` (the launcher's side: :func:`launch` forks every start through
:func:`start_once`, :func:`summarize`, :func:`format_table`, :func:`build_report`, the plot)
or, in a forked rank, :func:`run_rank`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import platform
import resource
import shutil
import socket
import statistics
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TextIO

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import TCPStore  # torch.distributed.TCPStore, typed

from .common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, BenchError, UsageError
from .launcher import ForkedRank, RankProcess, child_env, free_port, recorded_command, supervise
from .options import backend_problem
from .startup_options import STARTUP, StartupOptions

logger = logging.getLogger(__name__)

REFERENCE: Final = "gloo"  # the ratio columns' denominator, when measured
# Where a forked rank finds the barrier directory (also where it writes its result).
DIR_ENV: Final = "_UCXBENCH_STARTUP_DIR"
BACKEND_ENV: Final = "_UCXBENCH_STARTUP_BACKEND"
TIMEOUT_ENV: Final = "_UCXBENCH_STARTUP_TIMEOUT"
# torch's own switch (torch.distributed.rendezvous): every rank connects to a Store its
# launcher hosts, as under torchrun, instead of rank 0 starting one.
AGENT_STORE_ENV: Final = "TORCHELASTIC_USE_AGENT_STORE"
_BARRIER_POLL_S: Final = 0.002
# The launcher's entry in the barrier directory once it hosts the Store (--store-host agent).
STORE_READY: Final = "ready.store"
# Torch's part of init_process_group: what the backend's own phases do not account for.
TORCH_PHASE: Final = "torch"
FIRST_OP_PHASE: Final = "first_op"


# --- a rank ---------------------------------------------------------------------------------


def _file_barrier(directory: Path, rank: int, arrivals: int, deadline: float) -> None:
    """Returns once ``arrivals`` files ``ready.*`` are there: every rank leaves its own
    (``ready.<rank>``), and a launcher that hosts the Store leaves :data:`STORE_READY`."""
    (directory / f"ready.{rank}").touch()
    while sum(1 for p in directory.iterdir() if p.name.startswith("ready.")) < arrivals:
        if time.monotonic() > deadline:
            raise BenchError(f"rank {rank}: not every rank reached the start in time")
        time.sleep(_BARRIER_POLL_S)


def _cpu_seconds() -> float:
    """CPU time of this process, every thread (the Store server, progress threads) included."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_rank() -> int:
    """One rank of one start: barrier, then init_process_group + first all_reduce, timed;
    writes ``result.<rank>.json`` into the start's directory."""
    import ucxbackend

    env = os.environ
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    backend = env[BACKEND_ENV]
    timeout = float(env[TIMEOUT_ENV])
    directory = Path(env[DIR_ENV])
    agent_store = env.get(AGENT_STORE_ENV) == str(True)
    _file_barrier(directory, rank, world + agent_store, time.monotonic() + timeout)
    cpu_start = _cpu_seconds()
    start = time.perf_counter()
    dist.init_process_group(
        backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout)
    )
    initialized = time.perf_counter()
    x = torch.ones(2, dtype=torch.float32)  # 8 bytes
    dist.all_reduce(x)
    done = time.perf_counter()
    cpu = _cpu_seconds() - cpu_start
    profile = ucxbackend.startup_profile() if backend in ucxbackend.BACKEND_NAMES else None
    result = {
        "rank": rank,
        "init_s": initialized - start,
        "first_op_s": done - initialized,
        "cpu_s": cpu,
        "ok": bool((x == world).all()),
        "profile": profile,
    }
    partial = directory / f".result.{rank}.json"
    partial.write_text(json.dumps(result))
    partial.rename(directory / f"result.{rank}.json")
    dist.destroy_process_group()
    return EXIT_OK if result["ok"] else EXIT_FAILED


# --- the launcher ---------------------------------------------------------------------------


@dataclass
class Start:
    """One start of one backend at one world size: its slowest rank's figures."""

    backend: str
    world: int
    total_s: float  # max over ranks of init + first op
    phases: dict[str, float]  # the slowest rank's time by phase (sums to total_s)
    store_calls: int | None  # max over ranks; None for a backend that does not count
    store_bytes: int | None
    cpu_s: float  # CPU time of all ranks together: on a machine with fewer cores than ranks,
    # what the start costs when the ranks wait for each other's turn

def breakdown(result: Mapping[str, Any]) -> tuple[dict[str, float], int | None, int | None]:
    """One rank's time by phase: torch's part of init_process_group (all of it for a backend
    without a profile), the backend's creation phases, the first op; and its Store calls and
    bytes (None without a profile)."""
    profile = result.get("profile")
    if not profile:
        return {TORCH_PHASE: result["init_s"], FIRST_OP_PHASE: result["first_op_s"]}, None, None
    created = {str(k): float(v) for k, v in profile["phases"].items()}
    phases = {TORCH_PHASE: max(0.0, result["init_s"] - sum(created.values()))}
    phases.update(created)
    phases[FIRST_OP_PHASE] = result["first_op_s"]
    return phases, int(profile["store_calls"]), int(profile["store_bytes"])


def start_from_results(backend: str, world: int, results: Sequence[Mapping[str, Any]]) -> Start:
    bad = [r["rank"] for r in results if not r["ok"]]
    if bad:
        raise BenchError(f"{backend}, {world} ranks: wrong all_reduce result on ranks {bad}")
    slowest = max(results, key=lambda r: r["init_s"] + r["first_op_s"])
    phases, _, _ = breakdown(slowest)
    counts = [breakdown(r)[1:] for r in results]
    calls = [c for c, _ in counts if c is not None]
    sent = [b for _, b in counts if b is not None]
    return Start(
        backend,
        world,
        slowest["init_s"] + slowest["first_op_s"],
        phases,
        max(calls) if calls else None,
        max(sent) if sent else None,
        sum(r["cpu_s"] for r in results),
    )


def _listener() -> socket.socket:
    """The Store's listening socket: IPv4 on 127.0.0.1, bound before the ranks are forked (so
    its port is taken, not guessed). TCPStore's own server listens on every IPv6 and IPv4
    address, where a client on 127.0.0.1 arrives as ::ffff:127.0.0.1; the server asks the
    resolver for that name on its one thread, and a lost DNS answer stalls every rank's
    init_process_group for glibc's 5 s (docs/performance.md, torch's modes). 127.0.0.1 is
    answered from /etc/hosts."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        raise
    return sock


def _host_store(listener: socket.socket, world: int, timeout: float) -> TCPStore:
    """The Store a start's ranks connect to, hosted by this process as torchrun's agent hosts
    it: listening before any rank calls init_process_group, so no rank's connection is refused
    and retried after torch's back-off (about 0.5 s; docs/performance.md, torch's modes). The
    Store takes the listener's descriptor over."""
    host, port = listener.getsockname()
    return TCPStore(
        host,
        port,
        world_size=world,
        is_master=True,
        timeout=datetime.timedelta(seconds=timeout),
        wait_for_workers=False,
        master_listen_fd=listener.detach(),
    )


def start_once(backend: str, world: int, opts: StartupOptions, err: TextIO) -> Start:
    """Fork ``world`` ranks that start a ``backend`` group together; their slowest's figures."""
    directory = Path(tempfile.mkdtemp(prefix="ucxbench-startup-"))
    store: TCPStore | None = None
    agent = opts.store_host == "agent"
    listener = _listener() if agent else None
    try:
        # The ranks are forked before the launcher's Store exists (a process should not fork
        # while the Store's thread runs); they leave the barrier only once it serves.
        port = listener.getsockname()[1] if listener is not None else free_port()
        procs: list[RankProcess] = []
        try:
            for rank in range(world):
                env = child_env(os.environ, rank, world, port)
                env.update(
                    {
                        DIR_ENV: str(directory),
                        BACKEND_ENV: backend,
                        TIMEOUT_ENV: str(opts.timeout),
                    }
                )
                if agent:
                    env[AGENT_STORE_ENV] = str(True)
                procs.append(ForkedRank([STARTUP], env))
            if listener is not None:
                store = _host_store(listener, world, opts.timeout)
                (directory / STORE_READY).touch()
        except (OSError, RuntimeError) as exc:
            for p in procs:
                p.kill()
                p.wait()
            what = "the Store" if len(procs) == world else f"rank {len(procs)}"
            raise BenchError(f"could not start {what}: {exc}") from exc
        code = supervise(procs, opts.timeout + 5.0, err)
        if code != EXIT_OK:
            raise BenchError(f"{backend}, {world} ranks: the start failed (status {code})")
        results = [json.loads((directory / f"result.{r}.json").read_text()) for r in range(world)]
        return start_from_results(backend, world, results)
    finally:
        del store  # the server stops with its last reference
        if listener is not None:
            listener.close()  # a no-op once the Store took it over
        shutil.rmtree(directory, ignore_errors=True)


@dataclass
class Cell:
    """Every start of one backend at one world size."""

    backend: str
    world: int
    starts: list[Start] = field(default_factory=list)

    @property
    def totals(self) -> list[float]:
        return [s.total_s for s in self.starts]

    @property
    def median(self) -> float:
        return statistics.median(self.totals)

    @property
    def typical(self) -> Start:
        """The start whose total is the (lower) median: the one the breakdown shows."""
        ordered = sorted(self.starts, key=lambda s: s.total_s)
        return ordered[(len(ordered) - 1) // 2]


def launch(opts: StartupOptions, err: TextIO) -> list[Cell]:
    cells: list[Cell] = []
    for world in opts.world_sizes:
        row = [Cell(b, world) for b in opts.backends]
        for repeat in range(opts.repeats):
            for cell in row:
                logger.info("%s, %d ranks, start %d/%d", cell.backend, world, repeat + 1,
                            opts.repeats)
                cell.starts.append(start_once(cell.backend, world, opts, err))
        cells += row
    return cells


def ratio(cells: Sequence[Cell], backend: str, world: int) -> float | None:
    """backend's median over the reference's (Gloo) at this world size."""
    by = {(c.backend, c.world): c for c in cells}
    mine, ref = by.get((backend, world)), by.get((REFERENCE, world))
    if mine is None or ref is None or ref.median <= 0:
        return None
    return mine.median / ref.median


def _phase_names(cells: Iterable[Cell]) -> list[str]:
    """Every phase shown, in the order they run: torch's, the backends', the first op."""
    names: dict[str, None] = {TORCH_PHASE: None}
    for cell in cells:
        for start in cell.starts:
            names.update(dict.fromkeys(start.phases))
    del names[FIRST_OP_PHASE]
    return [*names, FIRST_OP_PHASE]


def format_table(cells: Sequence[Cell], opts: StartupOptions) -> list[str]:
    cell_w = 24
    ratios = [b for b in opts.backends if b != REFERENCE] if REFERENCE in opts.backends else []
    lines = [
        "# time (s) from init_process_group to the end of the first 8-byte all_reduce, max "
        f"over ranks, synchronized start; median [min-max] of {opts.repeats} start(s)",
        "# ranks" + "".join(f"{b:>{cell_w}}" for b in opts.backends)
        + "".join(f"{b + '/' + REFERENCE:>12}" for b in ratios),
    ]
    by = {(c.backend, c.world): c for c in cells}
    for world in opts.world_sizes:
        line = f"{world:>7}"
        for backend in opts.backends:
            c = by[(backend, world)]
            text = f"{c.median:.4f} [{min(c.totals):.4f}-{max(c.totals):.4f}]"
            line += f"{text:>{cell_w}}"
        for backend in ratios:
            r = ratio(cells, backend, world)
            line += f"{'n/a' if r is None else f'{r:.2f}':>12}"
        lines.append(line)
    return lines


def format_breakdown(cells: Sequence[Cell]) -> list[str]:
    names = _phase_names(cells)
    width = max(9, *(len(n) + 1 for n in names))
    lines = [
        "#",
        "# where the time goes (s): the slowest rank of the median start, by phase; torch = "
        "init_process_group less the backend's own phases (all of it for a backend that does "
        "not report them); store = that backend's Store calls and KiB (max over ranks); cpu = "
        "CPU seconds of all ranks together",
        "# backend  ranks"
        + "".join(f"{n:>{width}}" for n in names)
        + f"{'total':>{width}}{'store':>12}{'cpu':>8}",
    ]
    for c in cells:
        s = c.typical
        line = f"{c.backend:>9}{c.world:>7}"
        line += "".join(
            f"{s.phases[n]:>{width}.4f}" if n in s.phases else f"{'-':>{width}}" for n in names
        )
        store = "-"
        if s.store_calls is not None:
            store = f"{s.store_calls}/{(s.store_bytes or 0) / 1024:.0f}K"
        line += f"{s.total_s:>{width}.4f}{store:>12}{s.cpu_s:>8.3f}"
        lines.append(line)
    return lines


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def header_lines(opts: StartupOptions) -> list[str]:
    import ucxbackend

    native = ucxbackend._C
    ucx = native.ucx_version() if native is not None else None
    load = _load_average()
    return [
        f"# ucxbackend bench startup {ucxbackend.__version__}: torch {torch.__version__}, "
        f"UCX {ucx}, Python {platform.python_version()}",
        f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
        f"{os.cpu_count()} CPUs, load average {load} at the start",
        f"# world sizes {','.join(map(str, opts.world_sizes))}; backends "
        f"{','.join(opts.backends)}; {opts.repeats} start(s) each, backends in turn; the "
        + ("launcher hosts the Store, as torchrun's agent does" if opts.store_host == "agent"
           else "rank 0 hosts the Store (env:// without torchrun)"),
    ]


def build_report(cells: Sequence[Cell], opts: StartupOptions) -> dict[str, Any]:
    """The ``--json`` document (also what :func:`.plot.write_startup_plot` draws)."""
    return {
        "schema": "ucxbackend-bench-startup/1",
        "command": recorded_command(),
        "load_average": _load_average(),
        "world_sizes": list(opts.world_sizes),
        "backends": list(opts.backends),
        "repeats": opts.repeats,
        "store_host": opts.store_host,
        "results": [
            {
                "backend": c.backend,
                "world_size": c.world,
                "totals_s": c.totals,
                "median_s": c.median,
                "min_s": min(c.totals),
                "max_s": max(c.totals),
                "ratio_vs_gloo": ratio(cells, c.backend, c.world),
                "breakdown_s": c.typical.phases,
                "store_calls": c.typical.store_calls,
                "store_bytes": c.typical.store_bytes,
                "cpu_s": c.typical.cpu_s,
            }
            for c in cells
        ],
    }


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``bench startup``: the launcher's side (a forked rank goes to :func:`run_rank`)."""
    from .plot import write_startup_plot

    try:
        opts = StartupOptions.from_args(args)
        for name in opts.backends:
            problem = backend_problem(name, "cpu")
            if problem:
                raise UsageError(problem)
    except UsageError as exc:
        err.write(f"bench: error: {exc}\n")
        return EXIT_USAGE
    if opts.verbose:
        logging.basicConfig(level=logging.INFO, format="[bench startup] %(message)s")
    for line in header_lines(opts):
        out.write(line + "\n")
    out.flush()
    try:
        cells = launch(opts, err)
    except BenchError as exc:
        err.write(f"bench: error: {exc}\n")
        return EXIT_FAILED
    for line in format_table(cells, opts) + format_breakdown(cells):
        out.write(line + "\n")
    report = build_report(cells, opts)
    if opts.json:
        Path(opts.json).write_text(json.dumps(report, indent=1) + "\n")
    if opts.plot:
        try:
            write_startup_plot(report, opts.plot)
            out.write(f"# plot written to {opts.plot}\n")
        except UsageError as exc:
            out.write(f"# plot skipped: {exc}\n")
    return EXIT_OK
