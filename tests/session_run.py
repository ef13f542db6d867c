"""A command run in a session of its own, with a deadline: past it, the command and every
process it started (torchrun's workers, an example's ranks, a runner's worlds) are killed
together, so that a hung run fails its test and leaves nothing behind."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Finished:
    returncode: int
    out: str
    err: str  # empty with stderr_to_stdout
    timed_out: bool  # killed at the deadline, with everything it started


def run_in_session(
    cmd: Sequence[str],
    *,
    timeout: float,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    stderr_to_stdout: bool = False,
) -> Finished:
    proc = subprocess.Popen(
        list(cmd),
        cwd=cwd,
        env=None if env is None else dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if stderr_to_stdout else subprocess.PIPE,
        text=True,
        start_new_session=True,  # one process group: the command and all it starts
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        timed_out = True
    return Finished(proc.returncode, out, err or "", timed_out)
