"""NVIDIA's Multi-Process Service (MPS) for ranks that share a GPU (docs/cuda.md, "Ranks
sharing a GPU: run MPS").

Two processes on one GPU each hold a CUDA context, and the GPU time-slices between contexts:
on an H200 every device wait of one rank cost about 0.25 ms of the other's slice, and a
64 MiB all_reduce of two ranks ran at 16 GB/s busbw. Under an MPS server both ranks' work
shares one context: 125 GB/s. This module is the one place that knows how to find and run
one:

* :func:`control_pipe` / :func:`server_running`: where a server's control pipe is
  (``$CUDA_MPS_PIPE_DIRECTORY/control``, by default ``/tmp/nvidia-mps/control``) and whether
  it is there: what ``bench``'s note and header and ``doctor``'s line go by;
* :func:`ranks_share_a_gpu` and :func:`sharing_note`: the bench's note, pure;
* :class:`PrivateMps`: a control daemon of its own, its pipe and log directories in a
  temporary directory that only the environment it hands out (:attr:`PrivateMps.env`) names,
  so that no other process on the machine becomes its client; stopped
  (``echo quit | nvidia-cuda-mps-control`` with the same environment) by :meth:`stop`, which
  its ``with`` block calls on every way out;
* ``python -m ucxbackend.mps [--] COMMAND...``: COMMAND under a private server, which is
  stopped after it (``scripts/gpu_session.sh``'s timeline ``mps`` run). Exit status:
  COMMAND's, or 2 when the server could not be started.

``bench --mps`` (:mod:`ucxbackend.bench.launcher`) starts a :class:`PrivateMps` before it
forks the ranks and stops it after them.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType, TracebackType
from typing import Final

__all__ = [
    "CONTROL",
    "DOCS",
    "MpsError",
    "MpsStartFailed",
    "MpsUnavailable",
    "PrivateMps",
    "control_pipe",
    "ranks_share_a_gpu",
    "server_running",
    "sharing_note",
    "terminate_raises",
]

CONTROL: Final = "nvidia-cuda-mps-control"
PIPE_ENV: Final = "CUDA_MPS_PIPE_DIRECTORY"
LOG_ENV: Final = "CUDA_MPS_LOG_DIRECTORY"
# Where the driver and nvidia-cuda-mps-control look when CUDA_MPS_PIPE_DIRECTORY is unset.
DEFAULT_PIPE_DIRECTORY: Final = "/tmp/nvidia-mps"
DOCS: Final = "docs/cuda.md#ranks-sharing-a-gpu-run-mps"
# The daemon makes its control pipe within milliseconds of `-d`; this long is a failure.
START_TIMEOUT_S: Final = 5.0
# `quit` waits for the server's clients: ours are gone by then, so this is a hang.
QUIT_TIMEOUT_S: Final = 10.0
_POLL_S: Final = 0.02
_LOG_LINES: Final = 5


class MpsError(RuntimeError):
    """A private MPS server could not be had; the message names the caller (``--mps``)."""


class MpsUnavailable(MpsError):
    """No ``nvidia-cuda-mps-control`` on PATH."""


class MpsStartFailed(MpsError):
    """The control daemon refused to start, or made no control pipe in time."""


def control_pipe(env: Mapping[str, str] | None = None) -> Path:
    """The control pipe a CUDA process of environment ``env`` (``os.environ``) would use."""
    env = os.environ if env is None else env
    return Path(env.get(PIPE_ENV) or DEFAULT_PIPE_DIRECTORY) / "control"


def server_running(env: Mapping[str, str] | None = None) -> bool:
    """Whether an MPS control daemon appears to run for ``env``: its control pipe exists."""
    return control_pipe(env).exists()


def ranks_share_a_gpu(ranks_on_host: int, gpus: int) -> bool:
    """Whether ranks on one host share a GPU: more of them than GPUs they can see (each rank
    takes ``cuda:(local rank % GPUs)``)."""
    return gpus > 0 and ranks_on_host > gpus


def sharing_note(ranks_on_host: int, gpus: int, mps_on: bool) -> str | None:
    """The bench's one note line (``--device cuda``) when its ranks share a GPU without an MPS
    server; None otherwise."""
    if mps_on or not ranks_share_a_gpu(ranks_on_host, gpus):
        return None
    return (
        f"note: {ranks_on_host} ranks share {gpus} GPU{'s' if gpus > 1 else ''} without an MPS "
        "server: the GPU switches between their CUDA contexts, which costs about 0.25 ms per "
        "device wait (a 64 MiB all_reduce 8x slower on an H200); --mps starts one for the run "
        f"({DOCS})"
    )


def _tail(path: Path, lines: int = _LOG_LINES) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])


class PrivateMps:
    """An MPS control daemon for one run: :meth:`start` (or ``with``) starts it, its
    environment (:attr:`env`) goes to the ranks, :meth:`stop` quits it and removes its
    directory. ``what`` names the caller in errors (``--mps``); ``base_env`` is the
    environment the daemon and ``nvidia-cuda-mps-control`` run in (``os.environ``)."""

    def __init__(
        self,
        what: str,
        base_env: Mapping[str, str] | None = None,
        start_timeout: float = START_TIMEOUT_S,
    ) -> None:
        self.what = what
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.start_timeout = start_timeout
        self.env: dict[str, str] = {}
        self.directory: Path | None = None
        self._control: str | None = None

    @property
    def pipe(self) -> Path:
        """The daemon's control pipe."""
        return control_pipe(self.env)

    def _run_env(self) -> dict[str, str]:
        return {**self.base_env, **self.env}

    def start(self) -> dict[str, str]:
        """Start the daemon and wait for its control pipe; returns :attr:`env`. Raises
        :class:`MpsUnavailable` or :class:`MpsStartFailed`, having cleaned up."""
        if self.directory is not None:
            raise RuntimeError(f"{self.what}: the MPS server was started already")
        control = shutil.which(CONTROL, path=self.base_env.get("PATH", os.defpath))
        if control is None:
            raise MpsUnavailable(
                f"{self.what}: {CONTROL} is not on PATH: it starts NVIDIA's MPS server "
                "(installed with the NVIDIA driver's utilities); put it on PATH or run "
                f"without {self.what} ({DOCS})"
            )
        self._control = control
        self.directory = Path(tempfile.mkdtemp(prefix="ucxb-mps-"))
        pipe_dir, log_dir = self.directory / "pipe", self.directory / "log"
        pipe_dir.mkdir()
        log_dir.mkdir()
        self.env = {PIPE_ENV: str(pipe_dir), LOG_ENV: str(log_dir)}
        started = self.directory / "start.out"
        try:
            # Its output to a file, not a pipe: a daemon that kept the pipe open would make
            # us wait for its end.
            with started.open("wb") as out:
                done = subprocess.run(
                    [control, "-d"],
                    env=self._run_env(),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=self.start_timeout,
                    check=False,
                )
            if done.returncode != 0:
                raise MpsStartFailed(
                    f"{self.what}: `{CONTROL} -d` exited with status {done.returncode}: "
                    f"{_tail(started) or 'no output'}"
                    + self._log_hint()
                )
            deadline = time.monotonic() + self.start_timeout
            while not self.pipe.exists():
                if time.monotonic() >= deadline:
                    raise MpsStartFailed(
                        f"{self.what}: the MPS control daemon did not come up within "
                        f"{self.start_timeout:g} s (no control pipe at {self.pipe})"
                        + self._log_hint()
                    )
                time.sleep(_POLL_S)
        except subprocess.TimeoutExpired:
            self._abandon()
            raise MpsStartFailed(
                f"{self.what}: `{CONTROL} -d` did not return within {self.start_timeout:g} s"
            ) from None
        except BaseException:
            self._abandon()
            raise
        return self.env

    def _abandon(self) -> None:
        """After a failed start: a quit for a daemon that came up late, and the directory
        removed whether or not there was one to quit."""
        directory = self.directory
        self.stop()
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)

    def _log_hint(self) -> str:
        log = _tail(Path(self.env[LOG_ENV]) / "control.log") if self.env else ""
        return f"; its control.log: {log}" if log else ""

    def stop(self) -> str | None:
        """Quit the daemon (``echo quit | nvidia-cuda-mps-control`` in its environment) and
        remove its directory; what went wrong, or None. Never raises: it runs on the way out
        of failures it must not hide. The directory stays where the quit failed (a daemon may
        still use it)."""
        if self.directory is None or self._control is None:
            return None
        problem = None
        try:
            done = subprocess.run(
                [self._control],
                input="quit\n",
                env=self._run_env(),
                capture_output=True,
                text=True,
                timeout=QUIT_TIMEOUT_S,
                check=False,
            )
            if done.returncode != 0:
                problem = (
                    f"`echo quit | {CONTROL}` exited with status {done.returncode}: "
                    f"{(done.stdout + done.stderr).strip() or 'no output'}"
                )
        except (OSError, subprocess.TimeoutExpired) as exc:
            problem = f"`echo quit | {CONTROL}` failed: {exc}"
        if problem is None:
            shutil.rmtree(self.directory, ignore_errors=True)
        else:
            problem = (
                f"{self.what}: the MPS control daemon did not quit ({problem}); "
                f"{PIPE_ENV}={self.env.get(PIPE_ENV)}" + self._log_hint()
            )
        self.directory = None
        return problem

    def __enter__(self) -> PrivateMps:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        problem = self.stop()
        if problem is not None:
            sys.stderr.write(f"warning: {problem}\n")


@contextmanager
def terminate_raises() -> Iterator[None]:
    """Within the block, SIGTERM raises SystemExit(143) (as Ctrl-C raises KeyboardInterrupt),
    so that ``finally`` blocks run: a private server is stopped when ``timeout`` or a job
    scheduler ends the run. Only on the main thread (where signals are handled)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_exit(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    old = signal.signal(signal.SIGTERM, raise_exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _end(command: subprocess.Popen[bytes]) -> None:
    """SIGTERM (which ``timeout`` passes on to what it runs), then SIGKILL after a grace."""
    if command.poll() is None:
        command.terminate()
        try:
            command.wait(QUIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            command.kill()
            command.wait()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ucxbackend.mps [--] COMMAND...``: COMMAND under a private MPS server."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--"]:
        args = args[1:]
    if not args or args[0] in ("-h", "--help"):
        sys.stderr.write(f"usage: python -m ucxbackend.mps [--] COMMAND...\n{__doc__}")
        return 2
    what = "ucxbackend.mps"
    with terminate_raises():
        server = PrivateMps(what)
        try:
            server.start()
        except MpsError as exc:
            sys.stderr.write(f"{what}: error: {str(exc).removeprefix(what + ': ')}\n")
            return 2
        try:
            sys.stderr.write(f"{what}: MPS control daemon up, {PIPE_ENV}={server.env[PIPE_ENV]}\n")
            command = subprocess.Popen(args, env={**os.environ, **server.env})
            try:
                code = command.wait()
            except BaseException:  # Ctrl-C, SIGTERM: COMMAND ends before the server does
                _end(command)
                raise
            return code if code >= 0 else 128 - code  # killed by signal -code: as a shell says
        finally:
            problem = server.stop()
            if problem is not None:
                sys.stderr.write(f"{what}: warning: {problem}\n")


if __name__ == "__main__":
    sys.exit(main())
