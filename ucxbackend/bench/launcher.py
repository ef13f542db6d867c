"""The launcher: without torchrun, ``python -m ucxbackend bench`` starts ``--nproc`` ranks on
this host itself and supervises them.

Call order (:func:`launch`): the environment checked, a free port picked
(:func:`free_port`), each rank forked (:class:`ForkedRank`) to run ``ucxbackend bench`` with
the options (:meth:`.options.BenchOptions.to_argv`) in torchrun's environment
(:func:`child_env`, which also hands down the user's command line, read back by
:func:`recorded_command` for the report); then :func:`supervise` waits, kills every rank past
the deadline or once one failed, and turns the ranks' exit statuses into the bench's.
:func:`under_launcher` tells a rank from the command the user typed.

Ranks are forked rather than started as new interpreters: this process has imported torch
(~2 s of CPU per interpreter) and created no process group, thread pool or device context, so
a forked rank starts in a fraction of a second in the same state a fresh one would reach. Its
environment differs from this process's only in torchrun's variables, which nothing reads at
import time.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final, Protocol, TextIO

from .. import mps
from .common import (
    ARGV_ENV,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    EXIT_WRONG,
    BenchError,
    UsageError,
)
from .options import BenchOptions, validate_environment

logger = logging.getLogger(__name__)

# After one rank fails, how long the others get to exit on their own before they are killed.
_FAIL_GRACE_S: Final = 10.0


def recorded_command() -> list[str]:
    raw = os.environ.get(ARGV_ENV)
    if raw:
        try:
            return [str(x) for x in json.loads(raw)]
        except ValueError:
            pass
    return invocation()


def invocation() -> list[str]:
    argv = list(sys.argv)
    if argv and os.path.basename(argv[0]) == "__main__.py":
        return ["python", "-m", "ucxbackend", *argv[1:]]
    return argv


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env(base: Mapping[str, str], rank: int, world: int, port: int) -> dict[str, str]:
    """The environment of rank ``rank`` as torchrun would set it, plus OMP_NUM_THREADS=1
    unless set, and the path this ucxbackend was imported from."""
    env = dict(base)
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    env.setdefault("OMP_NUM_THREADS", "1")
    root = str(Path(__file__).resolve().parents[2])  # the directory holding ucxbackend/
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = root if not old else f"{root}{os.pathsep}{old}"
    env.setdefault(ARGV_ENV, json.dumps(invocation()))
    return env


class RankProcess(Protocol):
    """What supervision needs of a rank: a ``subprocess.Popen`` has it, and so has ForkedRank."""

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def kill(self) -> None: ...

    def wait(self) -> int: ...


class ForkedRank:
    """A rank forked from this process, running ``ucxbackend <command>`` (``bench``, ``soak``)
    with ``argv`` in ``env``; polled, killed and reaped like a ``subprocess.Popen``."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], command: str = "bench") -> None:
        self.returncode: int | None = None
        sys.stdout.flush()  # or the child would write this process's buffered output again
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            self._run_rank(command, argv, env)  # never returns
        self.pid = pid

    @staticmethod
    def _run_rank(command: str, argv: Sequence[str], env: Mapping[str, str]) -> None:
        code = EXIT_FAILED
        try:
            # A rank ends at SIGTERM, whatever handler the launcher set for itself (--mps:
            # mps.terminate_raises), which a rank blocked in a native wait would never run.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.environ.clear()
            os.environ.update(env)
            import torch

            # torch was imported before OMP_NUM_THREADS was set for the rank: apply it.
            torch.set_num_threads(int(env.get("OMP_NUM_THREADS", "1")))
            from ucxbackend.cli import main

            code = main([command, *argv])  # a rank leaves by os._exit() itself
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else EXIT_FAILED
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    def _reaped(self, status: int) -> int:
        self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == self.pid:
                self._reaped(status)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def wait(self) -> int:
        if self.returncode is None:
            self._reaped(os.waitpid(self.pid, 0)[1])
        assert self.returncode is not None
        return self.returncode


def _kill_all(procs: Sequence[RankProcess]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait()


def supervise(
    procs: Sequence[RankProcess], timeout: float, err: TextIO, command: str = "bench"
) -> int:
    """Wait for the ranks; kill them all past the deadline, or when one failed and the others
    have not exited ``_FAIL_GRACE_S`` later. Returns the command's exit status (a rank's
    exit status is the bench's: :data:`.common.EXIT_OK` ... ``EXIT_FAILED``)."""
    deadline = time.monotonic() + timeout
    grace_end = math.inf  # set once a rank has failed
    timed_out = False
    try:
        while True:
            codes = [p.poll() for p in procs]  # every one: poll() also reaps
            if None not in codes:
                break
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                break
            if now >= grace_end:
                break
            if grace_end == math.inf and any(c not in (None, EXIT_OK, EXIT_WRONG) for c in codes):
                grace_end = now + _FAIL_GRACE_S
            time.sleep(0.05)
    finally:
        alive = [r for r, p in enumerate(procs) if p.poll() is None]
        _kill_all(procs)
    if timed_out:
        err.write(f"{command}: error: timed out after {timeout:g}s; killed ranks {alive}\n")
        return EXIT_FAILED
    codes = [p.returncode for p in procs]
    if all(c == EXIT_OK for c in codes):
        return EXIT_OK
    if all(c in (EXIT_OK, EXIT_WRONG) for c in codes):
        return EXIT_WRONG
    if all(c == EXIT_USAGE for c in codes):
        return EXIT_USAGE
    for rank, code in enumerate(codes):
        if code not in (EXIT_OK, EXIT_WRONG):
            what = "was killed" if rank in alive else f"exited with status {code}"
            err.write(f"{command}: error: rank {rank} {what}\n")
    return EXIT_FAILED


def launch(opts: BenchOptions, err: TextIO) -> int:
    """Start ``--nproc`` ranks on this host (a free port picked now) and supervise them; with
    ``--mps`` under a private MPS server (:class:`..mps.PrivateMps`), started before the
    ranks and stopped after them however the run ends (a failed rank, an exception, Ctrl-C,
    SIGTERM)."""
    world = opts.nproc or 2
    validate_environment(opts, world)
    if not opts.mps:
        return launch_ranks("bench", opts.to_argv(), world, opts.timeout, err)
    with mps.terminate_raises():
        server = mps.PrivateMps("--mps")
        try:
            server.start()
        except mps.MpsUnavailable as exc:
            raise UsageError(str(exc)) from None
        except mps.MpsError as exc:
            raise BenchError(str(exc)) from None
        try:
            logger.info("--mps: MPS control daemon up, %s", server.env)
            return launch_ranks(
                "bench", opts.to_argv(), world, opts.timeout, err, extra_env=server.env
            )
        finally:
            problem = server.stop()
            if problem is not None:
                err.write(f"bench: warning: {problem}\n")


def launch_ranks(
    command: str,
    argv: Sequence[str],
    world: int,
    timeout: float,
    err: TextIO,
    extra_env: Mapping[str, str] | None = None,
) -> int:
    """Fork ``world`` ranks of ``ucxbackend <command> <argv>`` (a free port picked now) and
    supervise them; ``timeout``: the ranks' own deadline, which they stop themselves at;
    ``extra_env``: added to this process's environment for the ranks (--mps's server)."""
    port = free_port()
    logger.info("forking %d ranks: %s %s", world, command, " ".join(argv))
    base = {**os.environ, **(extra_env or {})}
    procs: list[RankProcess] = []
    try:
        for rank in range(world):
            procs.append(ForkedRank(argv, child_env(base, rank, world, port), command))
    except OSError as exc:
        _kill_all(procs)
        raise BenchError(f"could not start rank {len(procs)}: {exc}") from exc
    # The margin lets the ranks say they timed out first.
    return supervise(procs, timeout + 5.0, err, command)


def start_watchdog(
    timeout: float, rank: int, err: TextIO, command: str = "bench"
) -> threading.Timer:
    """Ends this rank (exit status EXIT_FAILED) once ``timeout`` seconds have passed: a rank
    stops itself at ``--timeout``, before its launcher kills it, and says so."""

    def expire() -> None:
        err.write(f"{command}: rank {rank}: timed out after {timeout:g}s (--timeout); exiting\n")
        err.flush()
        os._exit(EXIT_FAILED)

    timer = threading.Timer(timeout, expire)
    timer.daemon = True
    timer.start()
    return timer


def under_launcher(env: Mapping[str, str] | None = None) -> bool:
    """Whether rank and world size come from the environment (torchrun or our own launch)."""
    env = os.environ if env is None else env
    return "RANK" in env
