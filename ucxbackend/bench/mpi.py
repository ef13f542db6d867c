"""The ``mpi`` column: an mpi4py ``Allreduce`` reference for ``all_reduce``, as rank 0 sees it,
timed in the same rounds as the torch columns.

Call order: before the torch sweep rank 0 calls :func:`start_mpi_session`: if
:func:`mpi_skip_reason` finds mpirun and mpi4py, it starts :func:`mpi_command` (``mpirun ...
python -m`` :data:`WORKER_MODULE`, the program in :mod:`.mpi_worker`), whose ranks connect
back to a Unix socket of rank 0's (:class:`MpiSession`) and wait there for commands, asleep in
``recv``: an MPI rank that waited in an MPI call between rounds would busy-poll a core away
from the torch columns. Then, at each all_reduce size, the runner calls
:meth:`MpiSession.prepare` (check once, warm up) with the other columns, and
:meth:`MpiSession.round` in every round in its column's turn (so a slow spell of the host
lands on MPI as on the others), and :meth:`MpiSession.finish` gives the size's
:class:`.timing.Measurement`. :meth:`MpiSession.close` ends the job. A missing MPI, or one that
fails to start, only skips the column; one that fails later fails its cells.

The protocol: one JSON object per line each way. Every worker sends a hello (``rank``,
``pid``, ``library``, ``mpi4py``); then each command goes to every worker, and each answers
it (``error``: a failure, with its reason) before the next one is sent:

- ``{"cmd": "prepare", "bytes": N}``: lay out, check once (``wrong``: this rank's count,
  null unchecked), warm up; ``supported`` false with ``error`` for a case MPI cannot run;
- ``{"cmd": "round", "iters": n, "rewarm": bool}``: one untimed call if ``rewarm``, a
  barrier, ``n`` timed calls: ``times`` (seconds each);
- ``{"cmd": "exit"}``: the worker ends (so does one whose socket closes: a bench that died).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import IO, Any, Final

from .common import ARGV_ENV, LAUNCH_ENV
from .options import BenchOptions
from .sizes import Layout
from .timing import Measurement, time_stats

logger = logging.getLogger(__name__)

# The program mpirun starts (``python -m``): :mod:`.mpi_worker`.
WORKER_MODULE: Final = "ucxbackend.bench.mpi_worker"
# How long mpirun's ranks may take to start and connect (MPI_Init, importing torch and numpy
# on an oversubscribed host).
_CONNECT_S: Final = 120.0
# How long close() waits for mpirun to end after the workers were told to exit.
_EXIT_S: Final = 10.0


class MpiError(RuntimeError):
    """The MPI job failed, or broke the protocol (the reason says which rank and command)."""


def mpi_skip_reason() -> str | None:
    """Why the mpi column cannot be measured here (None when it can)."""
    if shutil.which("mpirun") is None:
        return "mpirun not found on PATH (e.g. apt-get install openmpi-bin)"
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py is not installed (pip install mpi4py)"
    return None


def mpi_command(opts: BenchOptions, world: int, control: str) -> list[str]:
    """mpirun starting ``world`` workers that take their commands from the socket ``control``."""
    return [
        "mpirun",
        "--allow-run-as-root",
        "--oversubscribe",
        "-n",
        str(world),
        "--mca",
        "btl",
        "self,vader",
        sys.executable,
        "-m",
        WORKER_MODULE,
        f"--control={control}",
        f"--warmup_iters={opts.warmup_iters}",
        f"--datatype={opts.datatype}",
        f"--op={opts.op}",
        f"--check={int(opts.check)}",
    ]


def _mpi_env() -> dict[str, str]:
    """The environment without torchrun's rendezvous variables (they mean nothing to MPI)."""
    drop = (*LAUNCH_ENV, "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", ARGV_ENV)
    return {
        k: v for k, v in os.environ.items() if k not in drop and not k.startswith("TORCHELASTIC")
    }


@dataclass
class MpiOutcome:
    status: str  # "ok", "skipped", "failed", "not requested"
    reason: str | None = None
    library: str | None = None
    mpi4py: str | None = None

    def describe(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "reason": self.reason,
            "library": self.library,
            "mpi4py": self.mpi4py,
        }


@dataclass
class MpiTimed:
    """One size's MPI column between prepare and finish: every round's times, per MPI rank."""

    nbytes: int
    wrong: int | None
    times: list[list[float]]  # per MPI rank, seconds, every round in turn
    spans: list[tuple[float, float]] = field(default_factory=list)  # this clock, per round
    error: str | None = None  # a round failed: the column's cell says why


class _Worker:
    """One MPI rank's end of the control socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.file: IO[str] = sock.makefile("rw", encoding="utf-8", newline="\n")
        self.rank = -1  # MPI rank and pid: from the worker's hello
        self.pid = -1
        self.hello: dict[str, Any] = {}

    def send(self, msg: dict[str, Any]) -> None:
        self.file.write(json.dumps(msg) + "\n")
        self.file.flush()

    def receive(self, what: str, timeout: float) -> dict[str, Any]:
        self.sock.settimeout(timeout)
        try:
            line = self.file.readline()
        except TimeoutError as exc:
            raise MpiError(
                f"mpi rank {self.rank}: no answer to {what} within {timeout:.0f}s"
            ) from exc
        except OSError as exc:
            raise MpiError(f"mpi rank {self.rank}: reading the answer to {what}: {exc}") from exc
        if not line:
            raise MpiError(f"mpi rank {self.rank} closed its socket before answering {what}")
        try:
            msg = json.loads(line)
        except ValueError as exc:
            raise MpiError(f"mpi rank {self.rank}: answer to {what} is not JSON: {line!r}") from exc
        if not isinstance(msg, dict):
            raise MpiError(f"mpi rank {self.rank}: answer to {what} is not an object: {line!r}")
        if msg.get("failed"):
            raise MpiError(f"mpi rank {self.rank} failed {what}: {msg['failed']}")
        return msg

    def close(self) -> None:
        for closer in (self.file.close, self.sock.close):
            try:
                closer()
            except OSError as exc:
                logger.debug("closing mpi rank %d's socket: %s", self.rank, exc)


def _log_tail(log: IO[bytes]) -> str:
    """The last lines mpirun and its ranks wrote (why the job failed)."""
    log.flush()
    log.seek(0)
    lines = log.read().decode(errors="replace").strip().splitlines()
    return " | ".join(lines[-3:])


class MpiSession:
    """The running MPI job on rank 0: its workers' sockets, in MPI rank order."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        workers: list[_Worker],
        log: IO[bytes],
        tmp: tempfile.TemporaryDirectory[str],
        timeout: float,
    ) -> None:
        self.proc = proc
        self.workers = workers
        self.log = log
        self.tmp = tmp
        self.timeout = timeout
        self.pids = [w.pid for w in workers]
        self.failed: str | None = None  # why the job failed, once it has

    def _command(self, msg: dict[str, Any], what: str) -> list[dict[str, Any]]:
        """Send ``msg`` to every worker and read every answer; the first failure ends the
        session (a job that failed once answers nothing later)."""
        if self.failed is not None:
            raise MpiError(f"the mpi job failed earlier: {self.failed}")
        try:
            if self.proc.poll() is not None:
                raise MpiError(f"mpirun exited with status {self.proc.returncode} before {what}")
            try:
                for w in self.workers:
                    w.send(msg)
            except OSError as exc:
                raise MpiError(f"sending {what} to the mpi ranks: {exc}") from exc
            return [w.receive(what, self.timeout) for w in self.workers]
        except MpiError as exc:
            tail = _log_tail(self.log)
            self.failed = f"{exc}" + (f" (mpirun: {tail})" if tail else "")
            raise MpiError(self.failed) from exc

    def prepare(self, layout: Layout) -> Measurement | MpiTimed:
        """Check once and warm up at ``layout``'s size (all_reduce): an MpiTimed ready for
        its rounds, or the Measurement of a case MPI cannot run."""
        what = f"prepare {layout.nbytes} B"
        try:
            answers = self._command({"cmd": "prepare", "bytes": layout.nbytes}, what)
        except MpiError as exc:
            return Measurement(False, str(exc))
        first = answers[0]
        if not first["supported"]:
            return Measurement(False, first.get("error"))
        wrong = None if first["wrong"] is None else sum(int(a["wrong"]) for a in answers)
        return MpiTimed(layout.nbytes, wrong, [[] for _ in answers])

    def round(self, timed: MpiTimed, iters: int, rewarm: bool) -> None:
        """One round of ``iters`` timed calls; a failure is kept in ``timed.error``."""
        if timed.error is not None:
            return
        what = f"round of {iters} at {timed.nbytes} B"
        start = time.monotonic()
        try:
            answers = self._command({"cmd": "round", "iters": iters, "rewarm": rewarm}, what)
        except MpiError as exc:
            timed.error = str(exc)
            return
        timed.spans.append((start, time.monotonic()))
        for per_rank, a in zip(timed.times, answers, strict=True):
            per_rank += [float(t) for t in a["times"]]

    @staticmethod
    def finish(timed: MpiTimed) -> Measurement:
        """Every round together: each MPI rank's mean/median/min/max, max over ranks (as the
        torch columns are reduced)."""
        if timed.error is not None:
            return Measurement(False, timed.error)
        stats = [time_stats(t) for t in timed.times]
        keys = ("mean", "median", "min", "max")
        time_us = {k: max(s[i] for s in stats) * 1e6 for i, k in enumerate(keys)}
        return Measurement(True, None, time_us, timed.wrong, spans=list(timed.spans))

    def close(self) -> None:
        """Tell the workers to exit and wait for mpirun (killing it if it lingers)."""
        for w in self.workers:
            try:
                w.send({"cmd": "exit"})
            except OSError as exc:
                logger.debug("telling mpi rank %d to exit: %s", w.rank, exc)
            w.close()
        try:
            self.proc.wait(timeout=_EXIT_S)
        except subprocess.TimeoutExpired:
            logger.warning("mpirun did not exit within %.0fs of the exit command: killed", _EXIT_S)
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        self.tmp.cleanup()


def _accept_workers(
    listener: socket.socket, proc: subprocess.Popen[bytes], world: int
) -> list[_Worker]:
    """The ``world`` workers' connections and hellos, in MPI rank order."""
    deadline = time.monotonic() + _CONNECT_S
    workers: list[_Worker] = []
    listener.settimeout(0.2)
    while len(workers) < world:
        if proc.poll() is not None:
            raise MpiError(f"mpirun exited with status {proc.returncode} before its ranks met")
        if time.monotonic() > deadline:
            raise MpiError(f"{len(workers)} of {world} mpi ranks connected in {_CONNECT_S:.0f}s")
        try:
            sock, _ = listener.accept()
        except TimeoutError:
            continue
        worker = _Worker(sock)
        workers.append(worker)
        hello = worker.receive("hello", _CONNECT_S)
        worker.rank, worker.pid = int(hello["rank"]), int(hello["pid"])
        worker.hello = hello
    workers.sort(key=lambda w: w.rank)
    if [w.rank for w in workers] != list(range(world)):
        raise MpiError(f"mpi ranks {[w.rank for w in workers]} connected, not 0..{world - 1}")
    return workers


def start_mpi_session(
    opts: BenchOptions, world: int, timeout: float
) -> tuple[MpiOutcome, MpiSession | None]:
    """Start the MPI job (rank 0 only): its outcome, and the session while it runs."""
    reason = mpi_skip_reason()
    if reason is not None:
        return MpiOutcome("skipped", reason), None
    tmp = tempfile.TemporaryDirectory(prefix="ucxbench_mpi_")
    control = os.path.join(tmp.name, "control")
    cmd = mpi_command(opts, world, control)
    logger.info("mpi reference: %s", " ".join(cmd))
    log = tempfile.TemporaryFile()  # mpirun's output: its tail says why it failed
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    proc: subprocess.Popen[bytes] | None = None
    workers: list[_Worker] = []
    try:
        listener.bind(control)
        listener.listen(world)
        proc = subprocess.Popen(
            cmd, env=_mpi_env(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
        )
        workers = _accept_workers(listener, proc, world)
    except (MpiError, OSError) as exc:
        for w in workers:
            w.close()
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        tail = _log_tail(log)
        log.close()
        tmp.cleanup()
        what = "could not be started" if proc is None else "failed"
        return MpiOutcome("failed", f"mpirun {what}: {exc}" + (f" ({tail})" if tail else "")), None
    finally:
        listener.close()
    hello = workers[0].hello
    session = MpiSession(proc, workers, log, tmp, timeout)
    return MpiOutcome("ok", None, hello.get("library"), hello.get("mpi4py")), session
