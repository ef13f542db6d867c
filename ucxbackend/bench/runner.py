"""One rank of a bench job, under torchrun or under :mod:`.launcher`: the measurement loop.

Call order (:func:`run_rank`): rank, world and local rank from the environment; the
environment checked (:func:`.options.validate_environment`); the ``--timeout`` watchdog
started; a Gloo default group (the control group); the ranks' hosts and devices gathered
(which also decides whether nccl can run: :func:`nccl_skip_reason`) and one ``new_group`` per
column that can (the udp variants, then ``--backends``); rank 0 starts the mpi job
(:mod:`.mpi`), whose column, like the others, is then prepared, timed round by round in turn
with them and finished at every all_reduce size, the other ranks waiting on the control group
during its turns; then for every collective and size, each column is prepared, timed round
by round in turn with the others and finished (:mod:`.timing`), and
with ``--device cuda`` the d2d copy limit timed; rank 0 prints the table as it goes
(:mod:`.report`) and writes ``--json`` / ``--plot`` at the end. :func:`run_rank_reporting`
turns failures into the bench's exit statuses.

``--device cuda``: rank r uses ``cuda:(LOCAL_RANK % GPUs)`` (:func:`cuda_index`; ranks may
share a GPU).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import platform
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any, Final, TextIO

import torch
import torch.distributed as dist

from .. import mps as mps_service
from .cases import make_case_data
from .common import (
    ARGV_ENV,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    EXIT_WRONG,
    FAKE,
    FAKE_MODULE,
    LAUNCH_ENV,
    MPI,
    NCCL,
    BenchError,
    UsageError,
)
from .launcher import recorded_command, start_watchdog
from .mpi import MpiOutcome, MpiSession, MpiTimed, start_mpi_session
from .ops import column_label
from .options import BenchOptions, validate_environment
from .plot import write_plot
from .progress import Progress
from .report import (
    Row,
    build_report,
    format_footer,
    format_header,
    format_row,
    format_transport_block,
    format_wait_block,
    header_lines,
    row_for,
)
from .sizes import Layout, format_size, layouts_for
from .timing import (
    Measurement,
    RankContext,
    Timed,
    finish,
    measure_d2d_copy,
    prepare,
    round_lengths,
    time_round,
)
from .trace import TraceWriter, traced_pg_options, write_trace_plots
from .udp import UDP

logger = logging.getLogger(__name__)
# Every module's logger is a child of the package's: init_logging() configures that one.
_PACKAGE_LOGGER: Final = logging.getLogger(__name__.rpartition(".")[0])


def _versions(mpi: MpiOutcome) -> dict[str, Any]:
    import ucxbackend

    native = ucxbackend._C
    ucx_version = None
    if native is not None:
        try:
            ucx_version = native.ucx_version()
        except Exception as exc:
            logger.debug("ucx_version() failed: %s", exc)
    return {
        "ucxbackend": ucxbackend.__version__,
        "torch": torch.__version__,
        "ucx": ucx_version,
        "python": platform.python_version(),
        "mpi": mpi.library,
        "mpi4py": mpi.mpi4py,
    }


def init_logging(who: str, verbose: bool) -> None:
    """Log messages of every bench module on stderr as ``[bench WHO] LEVEL: ...`` (INFO with
    --verbose); nothing when logging is configured already."""
    if _PACKAGE_LOGGER.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(f"[bench {who}] %(levelname)s: %(message)s"))
    _PACKAGE_LOGGER.addHandler(handler)
    _PACKAGE_LOGGER.setLevel(logging.INFO if verbose else logging.WARNING)


def _rank_env() -> tuple[int, int, int]:
    env = os.environ
    missing = [k for k in LAUNCH_ENV if k not in env]
    if missing:
        raise UsageError(f"RANK is set but {', '.join(missing)} are not (launch with torchrun)")
    try:
        return int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", env["RANK"]))
    except ValueError as exc:
        raise UsageError(f"bad RANK/WORLD_SIZE/LOCAL_RANK in the environment: {exc}") from None


def cuda_index(local_rank: int, count: int) -> int:
    """The GPU of a local rank: ``local_rank % count``, so more ranks than GPUs share them."""
    if count < 1:
        raise UsageError("--device cuda: this host has no GPU (torch.cuda.device_count() 0)")
    return local_rank % count


def _device(opts: BenchOptions, local_rank: int) -> tuple[torch.device, Callable[[], None]]:
    if opts.device == "cpu":
        return torch.device("cpu"), lambda: None
    device = torch.device("cuda", cuda_index(local_rank, torch.cuda.device_count()))
    torch.cuda.set_device(device)
    # Every stream of the device: the backends' own streams too, so that an op counts as
    # done only when the GPU has finished it.
    return device, lambda: torch.cuda.synchronize(device)


def _gpu_id(device: torch.device) -> str | None:
    """What names this rank's GPU across processes (its UUID), None off CUDA."""
    if device.type != "cuda":
        return None
    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    return str(uuid) if uuid is not None else str(device)


def nccl_skip_reason(nccl_available: bool, ranks: Sequence[Mapping[str, Any]]) -> str | None:
    """Why the nccl column cannot run (None when it can): torch without NCCL, or ranks on
    the same GPU (same ``host`` and ``gpu``), which NCCL refuses (it cannot put two ranks
    of one communicator on one device: ``ncclInvalidUsage``, or a hang)."""
    if not nccl_available:
        return "torch was built without NCCL (torch.distributed.is_nccl_available() False)"
    seen: dict[tuple[Any, Any], Mapping[str, Any]] = {}
    for r in ranks:
        key = (r["host"], r["gpu"])
        other = seen.setdefault(key, r)
        if other is not r:
            return (
                f"ranks {other['rank']} and {r['rank']} share {r['device']} on {r['host']}, "
                "and NCCL cannot run two ranks on one GPU"
            )
    return None


def mps_state(
    opts: BenchOptions, env: Mapping[str, str], ranks_on_host: int, gpus: int
) -> dict[str, Any] | None:
    """``--device cuda``: whether the ranks run under an MPS server (``on``: its control pipe
    exists for this rank's environment; ``private``: the launcher's ``--mps`` started it), and
    the note when ranks share a GPU without one (:func:`..mps.sharing_note`); None off CUDA.
    The header and the JSON's ``mps`` say it."""
    if opts.device != "cuda":
        return None
    on = mps_service.server_running(env)
    return {
        "on": on,
        "private": opts.mps,
        "control_pipe": str(mps_service.control_pipe(env)),
        "note": mps_service.sharing_note(ranks_on_host, gpus, on or opts.mps),
    }


class _Sweep:
    """The measurement loop of one rank; rank 0 prints."""

    def __init__(
        self,
        ctx: RankContext,
        out: TextIO,
        err: TextIO,
        mpi_on: bool,
        session: MpiSession | None,
    ) -> None:
        self.ctx = ctx
        self.out = out
        self.session = session  # rank 0's, while the mpi column is on
        self.lead = ctx.rank == 0
        self.columns = ctx.opts.columns(mpi_on)
        self.cuda = ctx.opts.device == "cuda"
        self.progress = Progress(err, enabled=self.lead, verbose=ctx.opts.verbose)
        elsize, sizes = ctx.opts.elsize, ctx.opts.sizes()
        self.layouts = {c: layouts_for(c, sizes, elsize, ctx.world) for c in ctx.opts.collectives}
        self.steps = sum(len(v) for v in self.layouts.values()) * len(ctx.opts.measured())
        self.step = 0

    def emit(self, lines: Iterable[str]) -> None:
        if self.lead:
            self.progress.clear()
            for line in lines:
                self.out.write(line + "\n")
            self.out.flush()

    def run(self) -> dict[str, list[Row]]:
        return {coll: self.collective(coll) for coll in self.ctx.opts.collectives}

    def collective(self, coll: str) -> list[Row]:
        opts, cols = self.ctx.opts, self.columns
        labels = {c: column_label(c, coll, opts.device) for c in cols}
        limit = self.cuda and coll != "barrier"
        self.emit(format_header(coll, cols, opts.check, opts.stat, labels, limit))
        rows = [self.size(layout, labels, limit) for layout in self.layouts[coll]]
        self.emit(format_footer(rows, cols, opts.check, opts.stat, self.ctx.world, labels))
        self.emit(format_transport_block(coll, rows, self.columns))
        self.emit(format_wait_block(coll, rows, self.columns))
        return rows

    def size(
        self, layout: Layout, labels: Mapping[str, str] | None = None, limit: bool = False
    ) -> Row:
        ctx, opts = self.ctx, self.ctx.opts
        data = make_case_data(
            layout.collective,
            layout,
            opts.dtype,
            opts.op,
            ctx.rank,
            ctx.world,
            opts.root,
            with_expected=opts.check,
        )
        row = row_for(layout, opts)
        size = format_size(layout.nbytes) if layout.collective != "barrier" else "-"
        timed: list[Timed | MpiTimed] = []
        for backend in self.columns:
            if backend == MPI:
                mpi = self.mpi_prepare(layout)
                if isinstance(mpi, Measurement):
                    row.results[MPI] = mpi
                else:
                    timed.append(mpi)
                continue
            self.step += 1
            self.progress.update(f"{layout.collective} {backend} {size} ({self.step}/{self.steps})")
            ready = prepare(ctx, backend, layout, data)
            if isinstance(ready, Measurement):
                row.results[backend] = ready
            else:
                timed.append(ready)
        # Backends take turns round by round, mpi among them, so that a machine that slows
        # down for a while (a busy host; docs/performance.md) slows every column alike and
        # the ratios hold.
        for n in round_lengths(opts.iters, opts.rounds):
            for t in timed:
                if isinstance(t, MpiTimed):
                    self.mpi_round(t, n, rewarm=opts.rounds > 1)
                else:
                    time_round(ctx, t, n, rewarm=opts.rounds > 1)
        for t in timed:
            if isinstance(t, MpiTimed):
                row.results[MPI] = self.mpi_finish(t)
            else:
                row.results[t.backend] = finish(ctx, t)
        if limit:
            row.limit = measure_d2d_copy(ctx, layout.nbytes)
        line = format_row(row, self.columns, opts.check, opts.stat, ctx.world, labels, limit)
        self.emit([line])
        return row

    def mpi_prepare(self, layout: Layout) -> Measurement | MpiTimed:
        """The mpi column's check and warm-up at this size (rank 0; the others wait on the
        control group): an MpiTimed on every rank, or a Measurement on every rank where MPI
        cannot run it, so that all ranks agree on which rounds mpi takes part in."""
        if layout.collective != "all_reduce":
            return Measurement(False, None)
        ready: Measurement | MpiTimed = MpiTimed(layout.nbytes, None, [])  # a rank's stand-in
        if self.session is not None:
            self.progress.update(f"all_reduce mpi {format_size(layout.nbytes)}")
            ready = self.session.prepare(layout)
        if not self.ctx.all_ok(isinstance(ready, MpiTimed)):
            return ready if isinstance(ready, Measurement) else Measurement(False, "on rank 0")
        return ready

    def mpi_round(self, timed: MpiTimed, iters: int, rewarm: bool) -> None:
        """The mpi column's turn in a round: rank 0 runs it while the others wait (asleep)."""
        if self.session is not None:
            self.session.round(timed, iters, rewarm)
        dist.barrier(group=self.ctx.ctrl)

    def mpi_finish(self, timed: MpiTimed) -> Measurement:
        if self.session is None:
            return Measurement(False, "measured on rank 0")
        return self.session.finish(timed)


def _gather_rank_info(rank: int, world: int, device: torch.device) -> list[dict[str, Any]]:
    """Every rank's pid, host and device (on the default group, the control group)."""
    mine = {"rank": rank, "pid": os.getpid(), "host": socket.gethostname()}
    mine.update(device=str(device), gpu=_gpu_id(device))
    infos: list[Any] = [None] * world
    dist.all_gather_object(infos, mine)
    return [dict(i) for i in infos]


def _mpi_phase(ctx: RankContext, err: TextIO) -> tuple[MpiOutcome, MpiSession | None, bool]:
    """Rank 0 starts the mpi job while the others wait on the control group: its outcome,
    rank 0's session, and (every rank) whether the mpi column is on."""
    opts = ctx.opts
    outcome, session = MpiOutcome("not requested"), None
    if not opts.mpi:
        return outcome, None, False
    if opts.mpi and ctx.rank == 0:
        if "all_reduce" not in opts.collectives:
            outcome = MpiOutcome("skipped", "the mpi reference measures all_reduce only")
        else:
            Progress(err, enabled=True, verbose=opts.verbose).update(
                f"mpi all_reduce reference: starting mpirun -n {ctx.world}"
            )
            outcome, session = start_mpi_session(opts, ctx.world, opts.timeout)
    on = ctx.all_ok(outcome.status == "ok" or ctx.rank != 0)  # rank 0's answer, everywhere
    return outcome, session, on


def _finish(ctx: RankContext, report: dict[str, Any]) -> None:
    opts = ctx.opts
    if ctx.rank != 0:
        return
    if opts.json:
        with open(opts.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
    if opts.plot:
        write_plot(report, opts.plot)
    if opts.trace:
        for path in write_trace_plots(opts.trace):
            logger.info("bench --trace: wrote %s", path)


def run_rank(opts: BenchOptions, out: TextIO, err: TextIO) -> int:
    """The bench on one rank of a job launched by torchrun (or by :func:`.launcher.launch`)."""
    rank, world, local_rank = _rank_env()
    init_logging(f"rank {rank}", opts.verbose)
    if opts.nproc is not None and opts.nproc != world and ARGV_ENV not in os.environ:
        logger.warning("--nproc %d ignored: the launcher started %d ranks", opts.nproc, world)
    if opts.mps and ARGV_ENV not in os.environ:
        raise UsageError(
            "--mps starts the ranks' MPS server from the bench's own launcher, which torchrun "
            "replaces: start one before torchrun (nvidia-cuda-mps-control -d; "
            f"{mps_service.DOCS}) and leave --mps out"
        )
    validate_environment(opts, world)  # importing this module registered "ucx"
    start_watchdog(opts.timeout, rank, err)
    device, sync = _device(opts, local_rank)
    timeout = timedelta(seconds=opts.timeout)
    dist.init_process_group("gloo", init_method="env://", timeout=timeout)
    try:
        ranks = _gather_rank_info(rank, world, device)
        skipped: dict[str, str] = {}
        if opts.device == "cuda" and NCCL in opts.backends:
            reason = nccl_skip_reason(dist.is_nccl_available(), ranks)
            if reason is not None:
                skipped[NCCL] = reason
        groups = {
            v.label: dist.new_group(
                backend=UDP, timeout=timeout,
                pg_options=traced_pg_options(v.pg_options()) if opts.trace else v.pg_options(),
            )
            for v in opts.udp_variants
        }
        if FAKE in opts.backends:
            importlib.import_module(FAKE_MODULE)  # registers the backend with torch
        groups.update(
            {
                name: dist.new_group(backend=name, timeout=timeout)
                for name in opts.backends
                if name not in skipped
            }
        )
        world_group = dist.group.WORLD
        assert world_group is not None  # init_process_group above made it
        ctx = RankContext(
            opts, rank, world, device, world_group, groups, sync, opts.udp_columns(), skipped,
            TraceWriter(opts.trace, rank) if opts.trace else None,
        )
        mpi, session, mpi_on = _mpi_phase(ctx, err)
        try:
            sweep = _Sweep(ctx, out, err, mpi_on, session)
            versions = _versions(mpi)
            on_host = int(os.environ.get("LOCAL_WORLD_SIZE", world))
            gpus = torch.cuda.device_count() if opts.device == "cuda" else 0
            mps = mps_state(opts, os.environ, on_host, gpus)
            sweep.emit(header_lines(opts, world, versions, ranks, mpi, skipped, mps))
            rows = sweep.run()
        finally:
            if session is not None:
                session.close()
        report = build_report(
            opts=opts,
            world=world,
            rows_by_collective=rows,
            columns=sweep.columns,
            versions=versions,
            command=recorded_command(),
            mpi=mpi.describe(),
            mps=mps,
        )
        _finish(ctx, report)
        dist.barrier(group=ctx.ctrl)
    finally:
        dist.destroy_process_group()
    return EXIT_OK if report["ok"] else EXIT_WRONG


def run_rank_reporting(opts: BenchOptions, out: TextIO, err: TextIO) -> int:
    rank = os.environ.get("RANK", "?")
    try:
        return run_rank(opts, out, err)
    except UsageError as exc:
        if rank == "0":
            err.write(f"bench: error: {exc}\n")
        return EXIT_USAGE
    except BenchError as exc:
        err.write(f"bench: rank {rank}: error: {exc}\n")
        return EXIT_FAILED
    except Exception:
        logger.exception("bench: rank %s failed", rank)
        return EXIT_FAILED
